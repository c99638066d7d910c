//! The peer `Raft` gRPC service: decodes openraft's AppendEntries and Vote
//! and hands them to [`openraft::Raft`]; receives snapshots over the
//! `TransferSnapshot` stream, incrementally: the offer's manifest is matched
//! against this member's files (reused whole by hard link, or as a prefix
//! copy), only the rest is asked for, chunks are checked by crc32, the
//! assembled files against the manifest (a mismatch is fetched again whole),
//! and the sealed snapshot is handed to openraft's `install_full_snapshot`.
//! The file work of a receive is [`crate::snapshot::receive`]'s; this file
//! does no file I/O.
//!
//! `ReadIndex` serves followers' linearizable reads from the leader's shared
//! read-index rounds; `Forward` proposes a write another member took on a
//! front end (see [`crate::server::forward`]) down this member's own write
//! path; `Identify` tells any caller who this member is.
//!
//! Every other request's `Identity` is checked (see [`crate::node::identity`]):
//! a wrong member id, an earlier incarnation of this member, a peer's
//! changed incarnation or another cluster's id is refused with
//! FAILED_PRECONDITION naming the mismatch (and logged at warn, at most once
//! per peer per [`MISMATCH_LOG_INTERVAL`]).

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kvproto::PEER_PROTOCOL_VERSION;
use kvproto::raft::v1::raft_server::{Raft as RaftRpc, RaftServer};
use kvproto::raft::v1::{
    AppendEntriesRequest, AppendEntriesResponse, ForwardRequest, ForwardResponse, IdentifyRequest,
    IdentifyResponse, Identity as PbIdentity, ReadIndexRequest, ReadIndexResponse,
    SnapshotInstalled, TransferLeaderRequest, TransferLeaderResponse, TransferSnapshotRequest,
    TransferSnapshotResponse, VoteRequest, VoteResponse, transfer_snapshot_request,
    transfer_snapshot_response,
};
use openraft::Snapshot;
use openraft::raft::SnapshotResponse;
use tokio::sync::mpsc;
use tokio_stream::Stream;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use crate::codec;
use crate::hooks::Faults;
use crate::node::identity::{Adopt, CheckError, Identity};
use crate::raft::network::PEER_MESSAGE_BYTES_MAX;
use crate::raft::read_index::{ReadIndexError, ReadRounds};
use crate::raft::types::{NodeRaft, NodeVote, TypeConfig};
use crate::server::metrics::Metrics;
use crate::snapshot::layout::meta_of;
use crate::snapshot::{convert, receive};
use crate::state_machine::StateMachine;

/// How often a refused peer is logged at most (it retries every heartbeat).
pub const MISMATCH_LOG_INTERVAL: Duration = Duration::from_secs(10);

/// The peer service of one member.
#[derive(Clone)]
pub struct PeerService {
    id: u64,
    raft: NodeRaft,
    state_machine: StateMachine,
    identity: Identity,
    reads: ReadRounds,
    faults: Faults,
    last_logged: Arc<Mutex<HashMap<u64, Instant>>>,
    metrics: Option<Metrics>,
    /// The member's write path for forwarded writes; `None`: `Forward` is
    /// answered UNIMPLEMENTED (nothing written).
    writes: Option<crate::server::kv::KvService>,
    /// The member's etcd port as bound, told in `Identify`; `None`: no
    /// etcd port.
    etcd_addr: Option<std::net::SocketAddr>,
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
        raft: NodeRaft,
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
            writes: None,
            etcd_addr: None,
        }
    }

    /// Tells `etcd_addr` (the member's bound etcd port) in `Identify`.
    pub fn with_etcd_addr(mut self, etcd_addr: Option<std::net::SocketAddr>) -> PeerService {
        self.etcd_addr = etcd_addr;
        self
    }

    /// The etcd address this member tells others
    /// ([`crate::server::etcd::peers::advertised`]); empty without one.
    fn advertised_etcd_addr(&self) -> String {
        let Some(listen) = self.etcd_addr else {
            return String::new();
        };
        let client_addr =
            crate::raft::membership::node_of(&self.raft, self.id).map(|node| node.client_addr);
        crate::server::etcd::peers::advertised(listen, client_addr.as_deref()).unwrap_or_default()
    }

    /// Takes writes other members forward (`Forward`) down `writes`.
    pub fn with_forwarding(mut self, writes: crate::server::kv::KvService) -> PeerService {
        self.writes = Some(writes);
        self
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
        // 0: a build before the field existed (protocol 1).
        let theirs = identity.protocol_version.max(1);
        if theirs != PEER_PROTOCOL_VERSION {
            return Err(Status::failed_precondition(format!(
                "peer protocol mismatch: member {} speaks peer protocol {theirs}, this member \
                 speaks {PEER_PROTOCOL_VERSION}; every member of a cluster must run the same \
                 protocol: upgrade by restoring a backup (kvctl snapshot save, kvnode restore) \
                 into a cluster of the new build, or restart every member on the new build \
                 with its data directory",
                identity.from_id
            )));
        }
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

impl PeerService {
    /// A Vote or PreVote request (`what`): identity checked, openraft's
    /// request decoded and handed to `call`, its result encoded.
    async fn ballot<F, Fut>(
        &self,
        request: Request<VoteRequest>,
        what: &str,
        call: F,
    ) -> Result<Response<VoteResponse>, Status>
    where
        F: FnOnce(NodeRaft, openraft::raft::VoteRequest<TypeConfig>) -> Fut,
        Fut: std::future::Future<
                Output = Result<
                    openraft::raft::VoteResponse<TypeConfig>,
                    openraft::errors::RaftError<TypeConfig>,
                >,
            >,
    {
        let request = request.into_inner();
        self.check_identity(request.identity.as_ref(), Adopt::Never)?;
        let rpc = decode(&request.payload, what)?;
        let result = call(self.raft.clone(), rpc).await;
        Ok(Response::new(VoteResponse {
            payload: codec::encode(&result).into(),
        }))
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
        self.ballot(
            request,
            "Vote",
            |raft, rpc| async move { raft.vote(rpc).await },
        )
        .await
    }

    async fn pre_vote(
        &self,
        request: Request<VoteRequest>,
    ) -> Result<Response<VoteResponse>, Status> {
        self.ballot(request, "PreVote", |raft, rpc| async move {
            raft.pre_vote(rpc).await
        })
        .await
    }

    async fn transfer_leader(
        &self,
        request: Request<TransferLeaderRequest>,
    ) -> Result<Response<TransferLeaderResponse>, Status> {
        let request = request.into_inner();
        self.check_identity(request.identity.as_ref(), Adopt::Never)?;
        let rpc: openraft::raft::TransferLeaderRequest<TypeConfig> =
            decode(&request.payload, "TransferLeader")?;
        let result: Result<openraft::raft::TransferLeaderResponse<TypeConfig>, String> = self
            .raft
            .handle_transfer_leader(rpc)
            .await
            .map_err(|fatal| format!("raft stopped: {fatal}"));
        Ok(Response::new(TransferLeaderResponse {
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

    async fn forward(
        &self,
        request: Request<ForwardRequest>,
    ) -> Result<Response<ForwardResponse>, Status> {
        let request = request.into_inner();
        self.check_identity(request.identity.as_ref(), Adopt::Never)?;
        let Some(writes) = &self.writes else {
            return Err(Status::unimplemented(format!(
                "member {} takes no forwarded writes; nothing was written",
                self.id
            )));
        };
        let write: kvstate::command::Write = decode(&request.write, "Forward")?;
        let answer = writes.write_forwarded(write).await?;
        Ok(Response::new(ForwardResponse {
            answer: codec::encode(&answer).into(),
            applied_index: writes.applied_index(),
        }))
    }

    async fn identify(
        &self,
        _request: Request<IdentifyRequest>,
    ) -> Result<Response<IdentifyResponse>, Status> {
        Ok(Response::new(IdentifyResponse {
            cluster_id: self.identity.cluster_id(),
            member_id: self.identity.member_id(),
            incarnation: self.identity.incarnation(),
            etcd_addr: self.advertised_etcd_addr(),
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
        let vote: NodeVote = decode(&offer.vote, "snapshot vote")?;
        let manifest_pb = offer
            .manifest
            .ok_or_else(|| Status::invalid_argument("the offer carries no manifest"))?;
        let manifest = convert::manifest_of_offer(&manifest_pb)
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
        let _ = tx.send(Ok(plan.first_need())).await;
        let raft = self.raft.clone();
        let metrics = self.metrics.clone();
        let sm = self.state_machine.clone();
        tokio::spawn(async move {
            let received =
                receive::receive(&sm, &manifest, &plan, metrics.as_ref(), &tx, &mut incoming);
            let Some(snap) = received.await else {
                return;
            };
            let snapshot = Snapshot {
                meta: meta_of(&manifest),
                snapshot: snap.clone(),
            };
            let installed = raft.install_full_snapshot(vote, snapshot).await;
            if installed.is_ok() {
                // openraft skips a snapshot not newer than its committed
                // index: delete it then.
                let sm = sm.clone();
                let _ = tokio::task::spawn_blocking(move || sm.discard_received(&snap)).await;
            }
            let answer: Result<SnapshotResponse<TypeConfig>, String> =
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
