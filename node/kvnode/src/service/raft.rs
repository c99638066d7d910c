//! The peer `Raft` gRPC service: decodes openraft's AppendEntries and Vote
//! and hands them to [`openraft::Raft`]; receives full snapshots over the
//! `TransferSnapshot` stream (whole files) and installs them.
//!
//! `ReadIndex` serves followers' linearizable reads from the leader's shared
//! read-index rounds; `Identify` tells any caller who this member is.
//!
//! Every other request's `Identity` is checked (see [`crate::identity`]):
//! a wrong member id, an earlier incarnation of this member, a peer's
//! changed incarnation or another cluster's id is refused with
//! FAILED_PRECONDITION naming the mismatch (and logged at warn, at most once
//! per peer per [`MISMATCH_LOG_INTERVAL`]).

use std::collections::{BTreeMap, HashMap};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kvproto::raft::v1::raft_server::{Raft as RaftRpc, RaftServer};
use kvproto::raft::v1::{
    AppendEntriesRequest, AppendEntriesResponse, FileRange, IdentifyRequest, IdentifyResponse,
    Identity as PbIdentity, ReadIndexRequest, ReadIndexResponse, SnapshotInstalled, SnapshotNeed,
    TransferSnapshotRequest, TransferSnapshotResponse, VoteRequest, VoteResponse,
    transfer_snapshot_request, transfer_snapshot_response,
};
use openraft::raft::SnapshotResponse;
use openraft::{Snapshot, SnapshotMeta, Vote};
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;
use tokio_stream::Stream;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use crate::codec;
use crate::faults::Faults;
use crate::identity::{Adopt, CheckError, Identity};
use crate::metrics::Metrics;
use crate::network::PEER_MESSAGE_BYTES_MAX;
use crate::read_index::{ReadIndexError, ReadRounds};
use crate::snapshot::{Manifest, SnapshotHandle};
use crate::state_machine::StateMachine;
use crate::types::TypeConfig;

/// How often a refused peer is logged at most (it retries every heartbeat).
pub const MISMATCH_LOG_INTERVAL: Duration = Duration::from_secs(10);

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
        let vote: Vote<u64> = decode(&offer.vote, "snapshot vote")?;
        let manifest_pb = offer
            .manifest
            .ok_or_else(|| Status::invalid_argument("the offer carries no manifest"))?;
        let manifest = Manifest::decode(&manifest_pb.encoded)
            .map_err(|err| Status::invalid_argument(format!("snapshot manifest: {err}")))?;
        let handle = self
            .state_machine
            .begin_receiving()
            .map_err(|err| Status::internal(format!("begin receiving a snapshot: {err}")))?;
        let (tx, rx) = mpsc::channel(2);
        let need = TransferSnapshotResponse {
            step: Some(transfer_snapshot_response::Step::Need(SnapshotNeed {
                ranges: manifest
                    .files
                    .iter()
                    .map(|f| FileRange {
                        name: f.name.clone(),
                        offset_bytes: 0,
                        prefix_crc32: 0,
                    })
                    .collect(),
            })),
        };
        let _ = tx.send(Ok(need)).await;
        let raft = self.raft.clone();
        let metrics = self.metrics.clone();
        tokio::spawn(async move {
            let result = receive(&mut incoming, &handle, &manifest, metrics.as_ref()).await;
            let answer: Result<SnapshotResponse<u64>, String> = match result {
                Err(status) => {
                    let _ = tokio::fs::remove_dir_all(handle.dir()).await;
                    let _ = tx.send(Err(status)).await;
                    return;
                }
                Ok(()) => {
                    let snapshot = Snapshot {
                        meta: SnapshotMeta {
                            last_log_id: manifest.last_log_id,
                            last_membership: manifest.membership.clone(),
                            snapshot_id: manifest.snapshot_id.clone(),
                        },
                        snapshot: Box::new(handle),
                    };
                    raft.install_full_snapshot(vote, snapshot)
                        .await
                        .map_err(|err| err.to_string())
                }
            };
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

/// Receives whole files into `handle` until `done`, then writes the manifest
/// and checks every file against it.
async fn receive(
    incoming: &mut Streaming<TransferSnapshotRequest>,
    handle: &SnapshotHandle,
    manifest: &Manifest,
    metrics: Option<&Metrics>,
) -> Result<(), Status> {
    let expected: BTreeMap<&str, u64> = manifest
        .files
        .iter()
        .map(|f| (f.name.as_str(), f.len))
        .collect();
    let mut received: BTreeMap<String, (u64, tokio::fs::File)> = BTreeMap::new();
    // Bounded: the leader sends at most one chunk per (file, chunk) pair;
    // the stream ends (or errors) when the leader goes away.
    while let Some(message) = incoming.message().await? {
        match message.step {
            Some(transfer_snapshot_request::Step::Chunk(chunk)) => {
                let Some(&len) = expected.get(chunk.file_name.as_str()) else {
                    return Err(Status::invalid_argument(format!(
                        "chunk of unknown file {:?}",
                        chunk.file_name
                    )));
                };
                if !received.contains_key(&chunk.file_name) {
                    let path = handle
                        .file_path(&chunk.file_name)
                        .map_err(|err| Status::invalid_argument(err.to_string()))?;
                    let file = tokio::fs::File::create(&path).await.map_err(|err| {
                        Status::internal(format!("create {}: {err}", path.display()))
                    })?;
                    received.insert(chunk.file_name.clone(), (0, file));
                }
                let Some((written, file)) = received.get_mut(&chunk.file_name) else {
                    return Err(Status::internal("file vanished"));
                };
                if chunk.offset_bytes != *written || *written + chunk.data.len() as u64 > len {
                    return Err(Status::invalid_argument(format!(
                        "chunk of {:?} at offset {} ({} bytes) does not follow {} bytes of {}",
                        chunk.file_name,
                        chunk.offset_bytes,
                        chunk.data.len(),
                        written,
                        len
                    )));
                }
                file.write_all(&chunk.data)
                    .await
                    .map_err(|err| Status::internal(format!("write snapshot file: {err}")))?;
                *written += chunk.data.len() as u64;
                if let Some(metrics) = metrics {
                    metrics.add_snapshot_bytes_received(chunk.data.len() as u64);
                }
            }
            Some(transfer_snapshot_request::Step::Done(_)) => {
                for (name, (written, file)) in received.iter_mut() {
                    file.sync_all()
                        .await
                        .map_err(|err| Status::internal(format!("fsync {name}: {err}")))?;
                    if expected.get(name.as_str()).copied() != Some(*written) {
                        return Err(Status::invalid_argument(format!("file {name} incomplete")));
                    }
                }
                let handle = handle.clone();
                let manifest = manifest.clone();
                return tokio::task::spawn_blocking(move || {
                    handle.write_manifest(&manifest)?;
                    handle.verify(&manifest)
                })
                .await
                .map_err(|err| Status::internal(format!("snapshot check task: {err}")))?
                .map_err(|err| Status::invalid_argument(format!("received snapshot: {err}")));
            }
            _ => return Err(Status::invalid_argument("expected a chunk or done")),
        }
    }
    Err(Status::cancelled(
        "the leader closed the snapshot stream early",
    ))
}
