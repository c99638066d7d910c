//! etcd's `Maintenance` service.
//!
//! - Status: this member's view — the version it follows
//!   ([`ETCD_COMPATIBLE_VERSION`](super::ETCD_COMPATIBLE_VERSION)), the
//!   engine's bytes (`dbSize` all data files, `dbSizeInUse` the live
//!   bytes), the leader it knows, its last log index and term, its applied
//!   index, and whether it is a learner.
//! - Alarm: raftcask raises no etcd alarms (a low disk refuses writes with
//!   `etcdserver: mvcc: database space exceeded` instead): every action
//!   answers an empty list.
//! - MoveLeader: the native leader transfer (on the leader, as etcd's;
//!   to the current leader it succeeds at once). Its answer carries no
//!   header, as etcd 3.4's does not.
//! - Defragment: a merge of every sealed data file, decided through Raft
//!   as the merge policy's are (the leader proposes `Command::Merge`, every
//!   member merges the same files); a follower asks the leader's etcd port
//!   for it. The answer comes once this member's merge has finished (at
//!   most [`DEFRAGMENT_WAIT_MAX`]) and, as etcd 3.4's, carries no header.
//! - Hash and HashKV: [`state_digest`], a CRC-32 over every key's live
//!   version at one revision (key, value, create and mod revision,
//!   version, lease), read in pages of [`HASH_PAGE_KEYS`] through the
//!   change history: equal on members that applied the same revisions,
//!   independent of file layout and merges; never equal to etcd's numbers.
//! - Snapshot: the native backup archive (`kvarchive`, what `kvctl
//!   snapshot save` writes), built from the `SaveSnapshot` stream as it
//!   comes, zero-padded to a multiple of [`SNAPSHOT_ALIGN_BYTES`] (what
//!   `etcdctl snapshot save` demands), in etcd's chunks
//!   ([`SNAPSHOT_SEND_BYTES`], `remaining_bytes` counting down), then
//!   etcd's last message: the SHA-256 of everything before it, with
//!   `remaining_bytes` 0.

use std::io::Write;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use kvproto::cluster::v1 as native;
use kvproto::cluster::v1::cluster_server::Cluster as NativeCluster;
use kvproto::etcd::etcdserverpb::maintenance_client::MaintenanceClient;
use kvproto::etcd::etcdserverpb::maintenance_server::Maintenance;
use kvproto::etcd::etcdserverpb::{
    AlarmRequest, AlarmResponse, DefragmentRequest, DefragmentResponse, HashKvRequest,
    HashKvResponse, HashRequest, HashResponse, MoveLeaderRequest, MoveLeaderResponse,
    ResponseHeader, SnapshotRequest, SnapshotResponse, StatusRequest, StatusResponse,
};
use kvstate::range::{RangeResult, RangeSpec};
use sha2::Digest as _;
use tokio_stream::{Stream, StreamExt as _};
use tonic::{Request, Response, Status};

use super::cluster::membership_error;
use super::errors::{self, etcd_error, to_etcd};
use super::{EtcdFrontEnd, MergeProposer, revision_i64};
use crate::raft::watch::MetricsWatch as _;
use crate::state_machine::StateMachine;

/// Keys one page of a Hash or HashKV read returns. Each page is one read
/// at the hashed revision under the change history's read lock (the apply
/// waits for it), held for one page at a time. A page visits only its own
/// keys: it reads with expiry not judged, so the range's count (which a
/// hash does not use) comes from the key directory's order without a walk
/// (`kvstate::range::RANGE_COUNT_KEYS_MAX` does not apply), and a store
/// of any size hashes.
pub const HASH_PAGE_KEYS: u64 = 1000;
/// How long Defragment waits, from its start, for this member's merge to
/// finish before it answers `etcdserver: request timed out` (the merge
/// goes on). Below the port's handler deadline, so the answer is this
/// error rather than a cancelled call.
pub const DEFRAGMENT_WAIT_MAX: Duration = Duration::from_secs(240);
const _: () = assert!(
    DEFRAGMENT_WAIT_MAX.as_secs() < crate::server::limits::CLIENT_REQUEST_TIMEOUT.as_secs()
);
/// How often Defragment looks whether this member's merge has finished.
pub const DEFRAGMENT_POLL: Duration = Duration::from_millis(50);
/// How long a follower's Defragment waits to reach the leader's etcd port.
pub const DEFRAGMENT_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Metadata a follower puts on the Defragment it forwards to the leader's
/// etcd port: a member that gets a forwarded Defragment and does not lead
/// (leadership moved meanwhile) refuses it with etcd's "not leader"
/// instead of forwarding it again, so a Defragment makes one hop at most.
pub const DEFRAGMENT_FORWARDED_METADATA: &str = "raftcask-forwarded-defragment";
/// Archive bytes per Snapshot message: etcd's own send buffer
/// (`snapshotSendBufferSize`, 32 KiB). Every message but the last two
/// carries exactly this many.
pub const SNAPSHOT_SEND_BYTES: usize = 32 * 1024;
/// The Snapshot stream's data is padded with zero bytes to a multiple of
/// this: etcd's data is a bolt database, whole 512-byte multiples, and
/// `etcdctl snapshot save` refuses a stream whose length is not such a
/// multiple plus the 32-byte SHA-256 ("sha256 checksum not found").
pub const SNAPSHOT_ALIGN_BYTES: u64 = 512;
/// Snapshot messages built ahead of a slow reader; with the native
/// stream's chunks (`SAVE_CHUNK_BYTES`, 1 MiB) this bounds a Snapshot's
/// memory to a few MiB.
pub const SNAPSHOT_QUEUE_MESSAGES: usize = 16;

/// The response stream of `Maintenance.Snapshot`.
pub type SnapshotStream = Pin<Box<dyn Stream<Item = Result<SnapshotResponse, Status>> + Send>>;

/// Adds one key's live version to a running digest: its key, value,
/// create and mod revision, version and lease, each length-prefixed or
/// fixed-width (little-endian), so no two different states feed the same
/// bytes.
fn digest_key(hasher: &mut crc32fast::Hasher, kv: &kvstate::range::KeyValue) {
    hasher.update(&(kv.key.len() as u64).to_le_bytes());
    hasher.update(&kv.key);
    hasher.update(&(kv.value.len() as u64).to_le_bytes());
    hasher.update(&kv.value);
    for field in [kv.create_revision, kv.mod_revision, kv.version, kv.lease] {
        hasher.update(&field.to_le_bytes());
    }
}

/// The digest of the store's state at `revision` (at or below the store
/// revision, within the change history's window; 0 only for a store that
/// has applied no revision yet): every key's live version there, in key
/// order, fed to a CRC-32 (IEEE). Only the keys' contents count — not the
/// files, merges or the member — and expiry is not judged (a key is there
/// until its expiry delete's revision), so members that applied the same
/// revisions agree. Read in pages of [`HASH_PAGE_KEYS`]; blocking.
pub fn state_digest(state_machine: &StateMachine, revision: u64) -> Result<u32, Status> {
    let mut hasher = crc32fast::Hasher::new();
    let mut start = vec![0u8];
    loop {
        let spec = RangeSpec {
            key: start,
            range_end: vec![0],
            limit: HASH_PAGE_KEYS,
            revision,
            ..RangeSpec::default()
        };
        let page: RangeResult = if revision == 0 {
            let (result, current) =
                state_machine.read_exact(|engine| kvstate::range::range(engine, &spec, 0, 0));
            if current != 0 {
                return Err(Status::unavailable(
                    "the store applied its first revision during the hash: retry",
                ));
            }
            result
        } else {
            state_machine.range_at(&spec, 0)
        }
        .map_err(|err| to_etcd(crate::server::txn::range_error(err)))?;
        for kv in &page.kvs {
            digest_key(&mut hasher, kv);
        }
        match page.kvs.last() {
            Some(last) if page.more => {
                start = last.key.clone();
                start.push(0);
            }
            _ => return Ok(hasher.finalize()),
        }
    }
}

/// The size of the archive `kvarchive::ArchiveWriter` writes for a
/// manifest of `manifest_bytes` bytes listing `files` (the format table in
/// `node/archive/src/lib.rs`): magic, version, manifest length, manifest,
/// file count, each file's header and bytes, end magic and CRC-32.
fn archive_bytes(manifest_bytes: usize, files: &[native::SnapshotFile]) -> u64 {
    let head = 8 + 4 + 4 + manifest_bytes as u64 + 4;
    let files: u64 = files
        .iter()
        .map(|f| 2 + f.name.len() as u64 + 8 + 4 + f.length_bytes)
        .sum();
    head + files + 8 + 4
}

/// `len` rounded up to a multiple of [`SNAPSHOT_ALIGN_BYTES`].
fn aligned(len: u64) -> u64 {
    len.div_ceil(SNAPSHOT_ALIGN_BYTES) * SNAPSHOT_ALIGN_BYTES
}

/// What the archive writer has written and not yet sent (the writer and
/// the sender take turns in one task).
#[derive(Clone, Default)]
struct Pending(Arc<Mutex<Vec<u8>>>);

impl Write for Pending {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Sends archive bytes as etcd's Snapshot messages, counting down.
struct Sender {
    out: tokio::sync::mpsc::Sender<Result<SnapshotResponse, Status>>,
    pending: Pending,
    total: u64,
    sent: u64,
    sha: sha2::Sha256,
}

impl Sender {
    /// Sends [`SNAPSHOT_SEND_BYTES`] messages while the pending bytes fill
    /// one (with `all`, the rest too); false once the reader has gone.
    async fn flush(&mut self, all: bool) -> bool {
        let bytes = std::mem::take(
            &mut *self
                .pending
                .0
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        );
        let mut start = 0;
        while bytes.len() - start >= SNAPSHOT_SEND_BYTES || (all && start < bytes.len()) {
            let end = (start + SNAPSHOT_SEND_BYTES).min(bytes.len());
            let blob = &bytes[start..end];
            start = end;
            self.sent += blob.len() as u64;
            self.sha.update(blob);
            let message = SnapshotResponse {
                header: None,
                remaining_bytes: self.total.saturating_sub(self.sent),
                blob: blob.to_vec().into(),
            };
            if self.out.send(Ok(message)).await.is_err() {
                return false;
            }
        }
        // The writer wrote nothing meanwhile: the rest goes back as it was.
        *self
            .pending
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = bytes[start..].to_vec();
        true
    }
}

/// Turns the native `SaveSnapshot` stream into etcd's Snapshot messages
/// on `out`: the archive as it is written, then its SHA-256.
async fn stream_archive(
    mut native_stream: Pin<
        Box<dyn Stream<Item = Result<native::SaveSnapshotResponse, Status>> + Send>,
    >,
    out: tokio::sync::mpsc::Sender<Result<SnapshotResponse, Status>>,
) {
    use native::save_snapshot_response::Part;
    let fail = |out: &tokio::sync::mpsc::Sender<_>, status: Status| {
        let out = out.clone();
        async move {
            let _ = out.send(Err(status)).await;
        }
    };
    let manifest = match native_stream.next().await {
        Some(Ok(native::SaveSnapshotResponse {
            part: Some(Part::Manifest(manifest)),
        })) => manifest,
        Some(Err(status)) => return fail(&out, status).await,
        _ => {
            return fail(
                &out,
                Status::internal("the snapshot stream did not start with its manifest"),
            )
            .await;
        }
    };
    let files: Vec<kvarchive::ArchiveFile> = manifest
        .files
        .iter()
        .map(|f| kvarchive::ArchiveFile {
            name: f.name.clone(),
            len: f.length_bytes,
            crc: f.crc32,
        })
        .collect();
    let pending = Pending::default();
    let mut writer = match kvarchive::ArchiveWriter::new(pending.clone(), &manifest.encoded, files)
    {
        Ok(writer) => writer,
        Err(err) => {
            return fail(
                &out,
                Status::internal(format!("the snapshot archive: {err}")),
            )
            .await;
        }
    };
    let mut sender = Sender {
        out: out.clone(),
        pending,
        total: aligned(archive_bytes(manifest.encoded.len(), &manifest.files)),
        sent: 0,
        sha: sha2::Sha256::new(),
    };
    while let Some(item) = native_stream.next().await {
        let chunk = match item {
            Ok(native::SaveSnapshotResponse {
                part: Some(Part::Chunk(chunk)),
            }) => chunk,
            Ok(_) => {
                return fail(
                    &out,
                    Status::internal("the snapshot stream sent a second manifest or nothing"),
                )
                .await;
            }
            Err(status) => return fail(&out, status).await,
        };
        if let Err(err) = writer.write_chunk(&chunk.file_name, chunk.offset_bytes, &chunk.data) {
            return fail(
                &out,
                Status::internal(format!("the snapshot archive: {err}")),
            )
            .await;
        }
        if !sender.flush(false).await {
            return;
        }
    }
    let archive = match writer.finish() {
        Ok(pending) => pending,
        Err(err) => {
            return fail(
                &out,
                Status::internal(format!("the snapshot archive: {err}")),
            )
            .await;
        }
    };
    let archive_len = sender.sent
        + archive
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len() as u64;
    let padding = aligned(archive_len) - archive_len;
    archive
        .0
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .resize((archive_len - sender.sent + padding) as usize, 0);
    if !sender.flush(true).await {
        return;
    }
    if sender.sent != sender.total {
        let message = format!(
            "the snapshot archive and its padding have {} bytes, {} were announced",
            sender.sent, sender.total
        );
        return fail(&out, Status::internal(message)).await;
    }
    let sha = std::mem::take(&mut sender.sha).finalize().to_vec();
    let _ = out
        .send(Ok(SnapshotResponse {
            header: None,
            remaining_bytes: 0,
            blob: sha.into(),
        }))
        .await;
}

impl EtcdFrontEnd {
    /// The header of a hash answer at the store revision `revision`.
    fn hash_header(&self, revision: u64) -> ResponseHeader {
        ResponseHeader {
            revision: revision_i64(revision),
            ..self.header()
        }
    }

    /// The digest at `revision` (0: the store revision), read off the
    /// async workers; with the store and compact revisions.
    async fn digest(&self, revision: u64) -> Result<(u32, u64, u64), Status> {
        let state_machine = self.kv.state_machine().clone();
        tokio::task::spawn_blocking(move || {
            let (current, compact) = {
                let history = state_machine
                    .history()
                    .read()
                    .unwrap_or_else(PoisonError::into_inner);
                (history.revision(), history.compact_revision())
            };
            if revision > current {
                return Err(etcd_error(
                    errors::FUTURE_REVISION,
                    &format!("field `revision` is {revision}, the store revision is {current}"),
                ));
            }
            let at = if revision == 0 { current } else { revision };
            let digest = state_digest(&state_machine, at)?;
            Ok((digest, current, compact))
        })
        .await
        .map_err(|err| Status::internal(format!("the hash read failed: {err}")))?
    }

    /// This member's sealed data files and merge count.
    fn merge_state(&self) -> (Vec<String>, u64) {
        let engine = self.kv.state_machine().engine();
        (engine.sealed_data_files(), engine.stats().merges)
    }

    /// Waits until this member has merged away `inputs` (none of them is
    /// sealed any more) or its merge count has passed `merges`.
    async fn merged(
        &self,
        inputs: &[String],
        merges: u64,
        deadline: Instant,
    ) -> Result<(), Status> {
        loop {
            let (sealed, now) = self.merge_state();
            if now > merges || !sealed.iter().any(|f| inputs.contains(f)) {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(etcd_error(
                    errors::TIMEOUT,
                    &format!(
                        "the merge of {} sealed files has not finished on this member within \
                         {DEFRAGMENT_WAIT_MAX:?} of the request (the limit DEFRAGMENT_WAIT_MAX); \
                         it goes on",
                        inputs.len()
                    ),
                ));
            }
            tokio::time::sleep(DEFRAGMENT_POLL).await;
        }
    }

    /// Defragment on a follower: the leader's etcd port proposes the
    /// merge (plain TCP only, with this port's token).
    async fn defragment_on_leader(&self) -> Result<(), Status> {
        let (leader, addr) = self.kv.leader();
        let (Some(leader), Some(addr)) = (leader, addr) else {
            return Err(etcd_error(errors::NO_LEADER, "no leader is known"));
        };
        if self.tls {
            return Err(etcd_error(
                errors::NOT_LEADER,
                &format!(
                    "merges are proposed by the leader (member {leader}); with TLS on this \
                     member does not reach its etcd port: defragment there"
                ),
            ));
        }
        let leader_node = crate::raft::membership::node_of(&self.raft, leader);
        let node = leader_node.unwrap_or(crate::raft::types::NodeInfo {
            client_addr: addr.clone(),
            peer_addr: String::new(),
        });
        let etcd_addr = self
            .etcd_addrs(&[(leader, node)])
            .await
            .remove(&leader)
            .unwrap_or_else(|| self.guessed_etcd_addr(leader, &addr));
        let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{etcd_addr}"))
            .map_err(|err| {
                Status::internal(format!("the leader's etcd address {etcd_addr}: {err}"))
            })?
            .connect_timeout(DEFRAGMENT_CONNECT_TIMEOUT)
            .timeout(DEFRAGMENT_WAIT_MAX);
        let channel = endpoint.connect().await.map_err(|err| {
            etcd_error(
                errors::NO_LEADER,
                &format!("the leader's etcd port {etcd_addr}: {err}"),
            )
        })?;
        let mut request = Request::new(DefragmentRequest {});
        request.metadata_mut().insert(
            DEFRAGMENT_FORWARDED_METADATA,
            tonic::metadata::MetadataValue::from_static("1"),
        );
        if let Some(token) = &self.token
            && let Ok(value) = format!("Bearer {}", token.expose()).parse()
        {
            request.metadata_mut().insert("authorization", value);
        }
        MaintenanceClient::new(channel).defragment(request).await?;
        Ok(())
    }

    /// Defragment on a member that does not lead: a call another member
    /// forwarded is refused with etcd's "not leader" (one hop at most);
    /// any other asks the leader, then waits for this member's own merge
    /// of the files it had sealed.
    async fn defragment_as_follower(
        &self,
        forwarded: bool,
        deadline: Instant,
    ) -> Result<Response<DefragmentResponse>, Status> {
        if forwarded {
            let (leader, _) = self.kv.leader();
            return Err(etcd_error(
                errors::NOT_LEADER,
                &format!(
                    "a Defragment forwarded to member {} as the leader found it no longer \
                     leads (leader now: {}); not forwarded again: retry",
                    self.member_id(),
                    leader.map_or_else(|| "unknown".to_string(), |l| l.to_string())
                ),
            ));
        }
        let (inputs, merges) = self.merge_state();
        self.defragment_on_leader().await?;
        if !inputs.is_empty() {
            self.merged(&inputs, merges, deadline).await?;
        }
        Ok(Response::new(DefragmentResponse { header: None }))
    }
}

#[tonic::async_trait]
impl Maintenance for EtcdFrontEnd {
    async fn alarm(
        &self,
        _request: Request<AlarmRequest>,
    ) -> Result<Response<AlarmResponse>, Status> {
        Ok(Response::new(AlarmResponse {
            header: Some(self.header()),
            alarms: Vec::new(),
        }))
    }

    async fn status(
        &self,
        _request: Request<StatusRequest>,
    ) -> Result<Response<StatusResponse>, Status> {
        let metrics = self.raft.metrics().borrow().clone();
        let stats = self.kv.state_machine().engine().stats();
        let leader = crate::raft::membership::known_leader(&metrics).unwrap_or(0);
        let is_learner = !metrics
            .membership_config
            .membership()
            .voter_ids()
            .any(|voter| voter == metrics.id);
        let bytes = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        Ok(Response::new(StatusResponse {
            header: Some(self.header()),
            version: super::ETCD_COMPATIBLE_VERSION.to_string(),
            db_size: bytes(stats.live_bytes + stats.dead_bytes),
            leader,
            raft_index: metrics.last_log_index.unwrap_or(0),
            raft_term: metrics.current_term,
            raft_applied_index: metrics.last_applied.map(|l| l.index).unwrap_or(0),
            errors: Vec::new(),
            db_size_in_use: bytes(stats.live_bytes),
            is_learner,
        }))
    }

    /// A merge of every sealed data file, proposed by the leader (a
    /// follower asks the leader's etcd port), answered once this member
    /// has merged them. No sealed file: nothing to merge, answered at once.
    async fn defragment(
        &self,
        request: Request<DefragmentRequest>,
    ) -> Result<Response<DefragmentResponse>, Status> {
        let forwarded = request
            .metadata()
            .contains_key(DEFRAGMENT_FORWARDED_METADATA);
        let deadline = Instant::now() + DEFRAGMENT_WAIT_MAX;
        if !self.kv.leads() {
            return self.defragment_as_follower(forwarded, deadline).await;
        }
        // The leader's turn: one Defragment's merge at a time. Held only
        // here, never while asking another member (two members each
        // holding theirs while asking the other would wait on each other).
        let one_at_a_time = self.defragments.clone();
        let turn = tokio::time::timeout_at(deadline.into(), one_at_a_time.lock())
            .await
            .map_err(|_| {
                etcd_error(
                    errors::TIMEOUT,
                    "an earlier Defragment's merge is still running on this member",
                )
            })?;
        if !self.kv.leads() {
            // Leadership moved while this call waited for its turn.
            drop(turn);
            return self.defragment_as_follower(forwarded, deadline).await;
        }
        let (inputs, merges) = self.merge_state();
        if !inputs.is_empty() {
            let Some(MergeProposer(propose)) = &self.merge else {
                return Err(Status::unimplemented(
                    "this member's etcd port was started without a merge proposer",
                ));
            };
            propose(inputs.clone())
                .await
                .map_err(|err| etcd_error(errors::TIMEOUT, &format!("the merge entry: {err}")))?;
            self.merged(&inputs, merges, deadline).await?;
        }
        Ok(Response::new(DefragmentResponse { header: None }))
    }

    /// [`state_digest`] at the store revision.
    async fn hash(&self, _request: Request<HashRequest>) -> Result<Response<HashResponse>, Status> {
        let (hash, revision, _) = self.digest(0).await?;
        Ok(Response::new(HashResponse {
            header: Some(self.hash_header(revision)),
            hash,
        }))
    }

    /// [`state_digest`] at `revision` (0: the store revision).
    async fn hash_kv(
        &self,
        request: Request<HashKvRequest>,
    ) -> Result<Response<HashKvResponse>, Status> {
        let revision = super::non_negative(request.into_inner().revision);
        let (hash, current, compact) = self.digest(revision).await?;
        Ok(Response::new(HashKvResponse {
            header: Some(self.hash_header(current)),
            hash,
            compact_revision: revision_i64(compact),
        }))
    }

    type SnapshotStream = SnapshotStream;

    /// A new native snapshot, streamed as the backup archive `kvctl
    /// snapshot save` writes, then its SHA-256 (etcd's last message).
    async fn snapshot(
        &self,
        _request: Request<SnapshotRequest>,
    ) -> Result<Response<SnapshotStream>, Status> {
        let native_stream = NativeCluster::save_snapshot(
            &self.cluster,
            Request::new(native::SaveSnapshotRequest { build_new: true }),
        )
        .await?
        .into_inner();
        let (out, messages) = tokio::sync::mpsc::channel(SNAPSHOT_QUEUE_MESSAGES);
        tokio::spawn(stream_archive(native_stream, out));
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(messages),
        )))
    }

    async fn move_leader(
        &self,
        request: Request<MoveLeaderRequest>,
    ) -> Result<Response<MoveLeaderResponse>, Status> {
        let target = request.into_inner().target_id;
        let leader = crate::raft::membership::known_leader(&self.raft.metrics().borrow());
        if leader == Some(target) {
            return Ok(Response::new(MoveLeaderResponse { header: None }));
        }
        NativeCluster::move_leader(
            &self.cluster,
            Request::new(native::MoveLeaderRequest { id: target }),
        )
        .await
        .map_err(|status| {
            if status.code() == tonic::Code::InvalidArgument {
                etcd_error(errors::BAD_LEADER_TRANSFEREE, status.message())
            } else {
                membership_error(status)
            }
        })?;
        Ok(Response::new(MoveLeaderResponse { header: None }))
    }
}
