//! The peer `Raft` gRPC service: decodes openraft's AppendEntries and Vote
//! and hands them to [`openraft::Raft`]; receives snapshots over the
//! `TransferSnapshot` stream, incrementally: the offer's manifest is matched
//! against this member's files (reused whole by hard link, or as a prefix
//! copy), only the rest is asked for, chunks are checked by crc32, the
//! assembled files against the manifest (a mismatch is fetched again whole),
//! and the sealed snapshot is handed to openraft's `install_full_snapshot`.
//!
//! `ReadIndex` serves followers' linearizable reads from the leader's shared
//! read-index rounds; `Identify` tells any caller who this member is.
//!
//! Every other request's `Identity` is checked (see [`crate::node::identity`]):
//! a wrong member id, an earlier incarnation of this member, a peer's
//! changed incarnation or another cluster's id is refused with
//! FAILED_PRECONDITION naming the mismatch (and logged at warn, at most once
//! per peer per [`MISMATCH_LOG_INTERVAL`]).

use std::collections::{BTreeMap, HashMap};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bitcask::io::VfsFile;
use kvproto::raft::v1::raft_server::{Raft as RaftRpc, RaftServer};
use kvproto::raft::v1::{
    AppendEntriesRequest, AppendEntriesResponse, FileRange, IdentifyRequest, IdentifyResponse,
    Identity as PbIdentity, ReadIndexRequest, ReadIndexResponse, SnapshotChunk, SnapshotInstalled,
    SnapshotNeed, TransferSnapshotRequest, TransferSnapshotResponse, VoteRequest, VoteResponse,
    transfer_snapshot_request, transfer_snapshot_response,
};
use openraft::raft::SnapshotResponse;
use openraft::{Snapshot, SnapshotMeta, Vote};
use tokio::sync::mpsc;
use tokio_stream::Stream;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use crate::codec;
use crate::hooks::Faults;
use crate::hooks::InstallStep;
use crate::node::identity::{Adopt, CheckError, Identity};
use crate::raft::network::PEER_MESSAGE_BYTES_MAX;
use crate::raft::read_index::{ReadIndexError, ReadRounds};
use crate::raft::types::TypeConfig;
use crate::server::metrics::Metrics;
use crate::snapshot::{Manifest, SnapshotHandle};
use crate::state_machine::{NeededRange, StateMachine};

/// How often a refused peer is logged at most (it retries every heartbeat).
pub const MISMATCH_LOG_INTERVAL: Duration = Duration::from_secs(10);
/// How long a receiver waits for the leader's next snapshot message before
/// it abandons the transfer (deletes its staging, drops its pins).
pub const SNAPSHOT_RECEIVE_IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// Rounds of "these staged files do not match, send them again" a receiver
/// asks for before it abandons the transfer.
pub const SNAPSHOT_REFETCH_ROUNDS_MAX: usize = 3;

/// The peer service of one member.
#[derive(Clone)]
pub struct PeerService {
    id: u64,
    raft: openraft::Raft<TypeConfig>,
    state_machine: StateMachine,
    identity: Identity,
    reads: ReadRounds,
    faults: Faults,
    last_logged: Arc<Mutex<HashMap<u64, Instant>>>,
    metrics: Option<Metrics>,
}

impl std::fmt::Debug for PeerService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerService")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

impl PeerService {
    /// The service for member `id`.
    pub fn new(
        raft: openraft::Raft<TypeConfig>,
        state_machine: StateMachine,
        identity: Identity,
        reads: ReadRounds,
        faults: Faults,
    ) -> PeerService {
        PeerService {
            id: identity.member_id(),
            raft,
            state_machine,
            identity,
            reads,
            faults,
            last_logged: Arc::default(),
            metrics: None,
        }
    }

    /// Counts snapshot bytes received into `metrics`.
    pub fn with_metrics(mut self, metrics: Metrics) -> PeerService {
        self.metrics = Some(metrics);
        self
    }

    /// The tonic server, with message limits above the largest entry batch.
    pub fn into_server(self) -> RaftServer<PeerService> {
        RaftServer::new(self)
            .max_decoding_message_size(PEER_MESSAGE_BYTES_MAX)
            .max_encoding_message_size(PEER_MESSAGE_BYTES_MAX)
    }

    #[allow(clippy::result_large_err)]
    fn check_identity(&self, identity: Option<&PbIdentity>, adopt: Adopt) -> Result<(), Status> {
        let Some(identity) = identity else {
            return Err(Status::invalid_argument("the request carries no identity"));
        };
        if self.faults.is_cut(identity.from_id) {
            return Err(Status::unavailable(format!(
                "the link from member {} is cut (test fault)",
                identity.from_id
            )));
        }
        let checked = self.identity.check(
            identity.cluster_id,
            identity.from_id,
            identity.from_incarnation,
            identity.to_id,
            identity.to_incarnation,
            adopt,
        );
        match checked {
            Ok(()) => {
                // The cluster id may just have been learned from a leader.
                self.state_machine
                    .set_cluster_id(self.identity.cluster_id());
                Ok(())
            }
            Err(CheckError::Mismatch(mismatch)) => {
                let now = Instant::now();
                let mut logged = self.last_logged.lock().unwrap_or_else(|p| p.into_inner());
                let due = logged
                    .get(&identity.from_id)
                    .is_none_or(|at| now.duration_since(*at) >= MISMATCH_LOG_INTERVAL);
                if due {
                    logged.insert(identity.from_id, now);
                    tracing::warn!(from = identity.from_id, %mismatch, "refused a peer request");
                }
                Err(Status::failed_precondition(mismatch.to_string()))
            }
            Err(CheckError::Io(err)) => Err(Status::unavailable(err)),
        }
    }
}

fn decode<T: serde::de::DeserializeOwned>(bytes: &[u8], what: &str) -> Result<T, Status> {
    codec::decode(bytes).map_err(|err| Status::invalid_argument(format!("{what} payload: {err}")))
}

type SnapshotStream =
    Pin<Box<dyn Stream<Item = Result<TransferSnapshotResponse, Status>> + Send + 'static>>;

#[tonic::async_trait]
impl RaftRpc for PeerService {
    async fn append_entries(
        &self,
        request: Request<AppendEntriesRequest>,
    ) -> Result<Response<AppendEntriesResponse>, Status> {
        let request = request.into_inner();
        self.check_identity(request.identity.as_ref(), Adopt::FromLeader)?;
        let rpc: openraft::raft::AppendEntriesRequest<TypeConfig> =
            decode(&request.payload, "AppendEntries")?;
        let result = self.raft.append_entries(rpc).await;
        Ok(Response::new(AppendEntriesResponse {
            payload: codec::encode(&result).into(),
        }))
    }

    async fn vote(&self, request: Request<VoteRequest>) -> Result<Response<VoteResponse>, Status> {
        let request = request.into_inner();
        self.check_identity(request.identity.as_ref(), Adopt::Never)?;
        let rpc: openraft::raft::VoteRequest<u64> = decode(&request.payload, "Vote")?;
        let result = self.raft.vote(rpc).await;
        Ok(Response::new(VoteResponse {
            payload: codec::encode(&result).into(),
        }))
    }

    async fn read_index(
        &self,
        request: Request<ReadIndexRequest>,
    ) -> Result<Response<ReadIndexResponse>, Status> {
        let request = request.into_inner();
        self.check_identity(request.identity.as_ref(), Adopt::Never)?;
        match self.reads.serve_follower().await {
            Ok((read_index, term)) => Ok(Response::new(ReadIndexResponse { read_index, term })),
            Err(err @ ReadIndexError::NotLeader { .. }) => {
                Err(Status::failed_precondition(err.to_string()))
            }
            Err(err) => Err(Status::unavailable(err.to_string())),
        }
    }

    async fn identify(
        &self,
        _request: Request<IdentifyRequest>,
    ) -> Result<Response<IdentifyResponse>, Status> {
        Ok(Response::new(IdentifyResponse {
            cluster_id: self.identity.cluster_id(),
            member_id: self.identity.member_id(),
            incarnation: self.identity.incarnation(),
        }))
    }

    type TransferSnapshotStream = SnapshotStream;

    async fn transfer_snapshot(
        &self,
        request: Request<Streaming<TransferSnapshotRequest>>,
    ) -> Result<Response<SnapshotStream>, Status> {
        let mut incoming = request.into_inner();
        let first = incoming
            .message()
            .await?
            .ok_or_else(|| Status::invalid_argument("empty snapshot stream"))?;
        let Some(transfer_snapshot_request::Step::Offer(offer)) = first.step else {
            return Err(Status::invalid_argument(
                "the first message must be an offer",
            ));
        };
        self.check_identity(offer.identity.as_ref(), Adopt::FromLeader)?;
        let failpoints = self.state_machine.failpoints().clone();
        if failpoints.dead() {
            return Err(Status::unavailable(
                "this member crashed at a test crash point",
            ));
        }
        let vote: Vote<u64> = decode(&offer.vote, "snapshot vote")?;
        let manifest_pb = offer
            .manifest
            .ok_or_else(|| Status::invalid_argument("the offer carries no manifest"))?;
        let manifest = Manifest::decode(&manifest_pb.encoded)
            .map_err(|err| Status::invalid_argument(format!("snapshot manifest: {err}")))?;
        // Match the offer against our files (links, prefix copies): off the
        // async threads.
        let sm = self.state_machine.clone();
        let offered = manifest.clone();
        let plan = tokio::task::spawn_blocking(move || sm.plan_receive(&offered))
            .await
            .map_err(|err| Status::internal(format!("snapshot plan task: {err}")))?
            .map_err(|err| Status::internal(format!("begin receiving a snapshot: {err}")))?;
        tracing::info!(
            snapshot = %manifest.snapshot_id,
            files = manifest.files.len(),
            reused = plan.files_reused,
            reused_bytes = plan.bytes_reused,
            needed = plan.needed.len(),
            "snapshot offered"
        );
        if let Some(metrics) = &self.metrics {
            metrics.add_snapshot_files_skipped(plan.files_reused);
        }
        let (tx, rx) = mpsc::channel(2);
        let need = need_message(plan.needed.iter().map(|n| FileRange {
            name: n.name.clone(),
            offset_bytes: n.offset,
            prefix_crc32: n.prefix_crc,
        }));
        let _ = tx.send(Ok(need)).await;
        let raft = self.raft.clone();
        let metrics = self.metrics.clone();
        let sm = self.state_machine.clone();
        tokio::spawn(async move {
            let receiver = Receiver {
                sm: &sm,
                manifest: &manifest,
                staging: &plan.staging,
                metrics: metrics.as_ref(),
                tx: &tx,
            };
            let snap = match receiver.run(&mut incoming, &plan.needed).await {
                Ok(snap) => snap,
                Err(Abandon::Crashed) => return,
                Err(Abandon::Failed(status)) => {
                    tracing::warn!(error = %status.message(), "snapshot transfer abandoned");
                    let doomed = plan.staging.dir().to_path_buf();
                    let _ = tokio::task::spawn_blocking(move || {
                        crate::snapshot::remove_dir_all(&doomed)
                    })
                    .await;
                    let _ = tx.send(Err(status)).await;
                    return;
                }
            };
            let snapshot = Snapshot {
                meta: SnapshotMeta {
                    last_log_id: manifest.last_log_id,
                    last_membership: manifest.membership.clone(),
                    snapshot_id: manifest.snapshot_id.clone(),
                },
                snapshot: Box::new(snap.clone()),
            };
            let installed = raft.install_full_snapshot(vote, snapshot).await;
            if installed.is_ok() {
                // openraft skips a snapshot not newer than its committed
                // index: delete it then.
                let sm = sm.clone();
                let _ = tokio::task::spawn_blocking(move || sm.discard_received(&snap)).await;
            }
            let answer: Result<SnapshotResponse<u64>, String> =
                installed.map_err(|err| err.to_string());
            let _ = tx
                .send(Ok(TransferSnapshotResponse {
                    step: Some(transfer_snapshot_response::Step::Installed(
                        SnapshotInstalled {
                            payload: codec::encode(&answer).into(),
                        },
                    )),
                }))
                .await;
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

fn need_message(ranges: impl Iterator<Item = FileRange>) -> TransferSnapshotResponse {
    TransferSnapshotResponse {
        step: Some(transfer_snapshot_response::Step::Need(SnapshotNeed {
            ranges: ranges.collect(),
        })),
    }
}

/// Why a receive stopped without a sealed snapshot.
enum Abandon {
    /// A test crash point fired: leave everything as a crash would.
    Crashed,
    /// The transfer failed: the staging directory is deleted and the leader
    /// told.
    Failed(Status),
}

impl From<Status> for Abandon {
    fn from(status: Status) -> Abandon {
        Abandon::Failed(status)
    }
}

/// One file being received in the current round.
struct Incoming {
    /// Length the manifest gives.
    len: u64,
    /// Bytes staged so far (a reused prefix counts).
    written: u64,
    /// Whether a chunk of it arrived in this round (the first one may
    /// restart the file at offset 0).
    started: bool,
    /// A chunk failed its crc32: the rest of the file is ignored and it is
    /// fetched again whole.
    bad: bool,
}

/// The receiving side of one transfer.
struct Receiver<'a> {
    sm: &'a StateMachine,
    manifest: &'a Manifest,
    staging: &'a SnapshotHandle,
    metrics: Option<&'a Metrics>,
    tx: &'a mpsc::Sender<Result<TransferSnapshotResponse, Status>>,
}

impl Receiver<'_> {
    /// Receives the needed ranges (and any refetch rounds) until every
    /// staged file matches the manifest, then seals the snapshot.
    async fn run(
        &self,
        incoming: &mut Streaming<TransferSnapshotRequest>,
        needed: &[NeededRange],
    ) -> Result<SnapshotHandle, Abandon> {
        let lens: BTreeMap<&str, u64> = self
            .manifest
            .files
            .iter()
            .map(|f| (f.name.as_str(), f.len))
            .collect();
        let mut files: BTreeMap<String, Incoming> = needed
            .iter()
            .map(|n| {
                let len = lens.get(n.name.as_str()).copied().unwrap_or(0);
                let file = Incoming {
                    len,
                    written: n.offset,
                    started: false,
                    bad: false,
                };
                (n.name.clone(), file)
            })
            .collect();
        let mut open: Option<(String, Arc<dyn VfsFile>)> = None;
        let mut refetches = 0usize;
        let failpoints = self.sm.failpoints().clone();
        loop {
            let message = match tokio::time::timeout(
                SNAPSHOT_RECEIVE_IDLE_TIMEOUT,
                incoming.message(),
            )
            .await
            {
                Err(_) => {
                    return Err(Status::deadline_exceeded(format!(
                        "no snapshot message within SNAPSHOT_RECEIVE_IDLE_TIMEOUT ({SNAPSHOT_RECEIVE_IDLE_TIMEOUT:?})"
                    ))
                    .into());
                }
                Ok(Err(status)) => return Err(status.into()),
                Ok(Ok(None)) => {
                    return Err(
                        Status::cancelled("the leader closed the snapshot stream early").into(),
                    );
                }
                Ok(Ok(Some(message))) => message,
            };
            match message.step {
                Some(transfer_snapshot_request::Step::Chunk(chunk)) => {
                    self.chunk(&mut files, &mut open, chunk).await?;
                    if failpoints.hit(InstallStep::Staging) {
                        return Err(Abandon::Crashed);
                    }
                }
                Some(transfer_snapshot_request::Step::Done(_)) => {
                    // Written with positioned writes: nothing to flush (the
                    // seal fsyncs every file).
                    open = None;
                    let staging = self.staging.clone();
                    let manifest = self.manifest.clone();
                    let mismatched = tokio::task::spawn_blocking(move || {
                        StateMachine::staged_mismatches(&staging, &manifest)
                    })
                    .await
                    .map_err(|err| Status::internal(format!("snapshot check task: {err}")))?;
                    if mismatched.is_empty() {
                        let sm = self.sm.clone();
                        let staging = self.staging.clone();
                        let manifest = self.manifest.clone();
                        return tokio::task::spawn_blocking(move || {
                            sm.seal_received(&staging, &manifest)
                        })
                        .await
                        .map_err(|err| Status::internal(format!("snapshot seal task: {err}")))?
                        .map_err(|err| {
                            Status::internal(format!("seal the received snapshot: {err}")).into()
                        });
                    }
                    refetches += 1;
                    if refetches > SNAPSHOT_REFETCH_ROUNDS_MAX {
                        return Err(Status::data_loss(format!(
                            "snapshot files {mismatched:?} still do not match the manifest after SNAPSHOT_REFETCH_ROUNDS_MAX ({SNAPSHOT_REFETCH_ROUNDS_MAX}) refetch rounds"
                        ))
                        .into());
                    }
                    tracing::warn!(files = ?mismatched, round = refetches, "staged snapshot files do not match the manifest: fetching them again");
                    if let Some(metrics) = self.metrics {
                        metrics.add_snapshot_files_refetched(mismatched.len() as u64);
                    }
                    files.clear();
                    for name in &mismatched {
                        if let Ok(path) = self.staging.file_path(name) {
                            let _ = tokio::task::spawn_blocking(move || {
                                crate::snapshot::node_vfs().remove(&path)
                            })
                            .await;
                        }
                        let len = lens.get(name.as_str()).copied().unwrap_or(0);
                        files.insert(
                            name.clone(),
                            Incoming {
                                len,
                                written: 0,
                                started: false,
                                bad: false,
                            },
                        );
                    }
                    let need = need_message(mismatched.into_iter().map(|name| FileRange {
                        name,
                        offset_bytes: 0,
                        prefix_crc32: 0,
                    }));
                    if self.tx.send(Ok(need)).await.is_err() {
                        return Err(Status::cancelled("the snapshot stream closed").into());
                    }
                }
                _ => return Err(Status::invalid_argument("expected a chunk or done").into()),
            }
        }
    }

    /// Writes one chunk into its staged file (checked: crc32, a file asked
    /// for, the next offset, within the manifest length).
    async fn chunk(
        &self,
        files: &mut BTreeMap<String, Incoming>,
        open: &mut Option<(String, Arc<dyn VfsFile>)>,
        chunk: SnapshotChunk,
    ) -> Result<(), Abandon> {
        let Some(file) = files.get_mut(&chunk.file_name) else {
            return Err(Status::invalid_argument(format!(
                "chunk of file {:?}, which was not asked for",
                chunk.file_name
            ))
            .into());
        };
        if file.bad {
            return Ok(());
        }
        if crc32fast::hash(&chunk.data) != chunk.crc32 {
            tracing::warn!(file = %chunk.file_name, offset = chunk.offset_bytes, "snapshot chunk fails its crc32: the file will be fetched again");
            file.bad = true;
            return Ok(());
        }
        // The first chunk of a file may restart it at 0: the leader found
        // our prefix differs from its own.
        let restart = !file.started && chunk.offset_bytes == 0;
        let at = if restart { 0 } else { file.written };
        let data_len = chunk.data.len() as u64;
        if chunk.offset_bytes != at || at + data_len > file.len {
            return Err(Status::invalid_argument(format!(
                "chunk of {:?} at offset {} ({data_len} bytes) does not follow {} bytes of {}",
                chunk.file_name, chunk.offset_bytes, file.written, file.len
            ))
            .into());
        }
        let reopen = open
            .as_ref()
            .is_none_or(|(name, _)| *name != chunk.file_name);
        if reopen || restart {
            *open = None;
            let path = self
                .staging
                .file_path(&chunk.file_name)
                .map_err(|err| Status::invalid_argument(err.to_string()))?;
            // Through the node's vfs (the lazy disk in a lazy-disk build):
            // the staged prefix copy if there is one, else a new file; cut
            // to where this chunk starts.
            let handle = tokio::task::spawn_blocking(move || {
                let vfs = crate::snapshot::node_vfs();
                let handle = if vfs.file_exists(&path) {
                    vfs.open(&path)
                } else {
                    vfs.create(&path)
                }
                .map_err(|err| Status::internal(format!("open {}: {err}", path.display())))?;
                handle.truncate(at).map_err(|err| {
                    Status::internal(format!("truncate {}: {err}", path.display()))
                })?;
                Ok::<_, Status>(handle)
            })
            .await
            .map_err(|err| Status::internal(format!("snapshot file task: {err}")))??;
            *open = Some((chunk.file_name.clone(), handle));
        }
        let Some((_, handle)) = open.as_ref() else {
            return Err(Status::internal("no open staged file").into());
        };
        let (handle, data) = (handle.clone(), chunk.data);
        tokio::task::spawn_blocking(move || handle.write_all_at(&data, at))
            .await
            .map_err(|err| Status::internal(format!("snapshot write task: {err}")))?
            .map_err(|err| Status::internal(format!("write snapshot file: {err}")))?;
        file.written = at + data_len;
        file.started = true;
        if let Some(metrics) = self.metrics {
            metrics.add_snapshot_bytes_received(data_len);
        }
        Ok(())
    }
}
