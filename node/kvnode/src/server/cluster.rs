//! The client-port `Cluster` gRPC service: Status, MemberList, the
//! membership changes (AddLearner, Promote, RemoveMember: see
//! [`crate::raft::membership`]) and TriggerSnapshot.
//!
//! Status is the answering member's view (kvctl asks every member for a full
//! table): itself in full, the leader's replication progress for the others
//! when it is the leader. `committed_index` is the quorum-matched index on the
//! leader and the applied index (a lower bound of what it knows committed)
//! on any other member.
//!
//! Status lists voters (LEADER / FOLLOWER / CANDIDATE) and learners
//! (LEARNER); on the leader every row carries the member's matched index and
//! its lag behind the leader's last log index. The leader a member names (in
//! every header and row) is its vote's leader only while that one is a voter
//! of its membership: a removed leader that stepped down names none.
//!
//! SaveSnapshot streams a snapshot (the member's current one, or a new one)
//! for a backup: the manifest, then the files in chunks (bounded memory; the
//! files are held open for the stream's life). The file side is
//! [`crate::snapshot::save`]'s; this file does no file I/O.

use std::pin::Pin;
use std::time::Duration;

use kvproto::cluster::v1::cluster_server::{Cluster, ClusterServer};
use kvproto::cluster::v1::{
    AddLearnerRequest, AddLearnerResponse, Member, MemberListRequest, MemberListResponse,
    MemberStatus, MoveLeaderRequest, MoveLeaderResponse, PromoteRequest, PromoteResponse,
    RemoveMemberRequest, RemoveMemberResponse, Role, SaveSnapshotRequest, SaveSnapshotResponse,
    StatusRequest, StatusResponse, TriggerSnapshotRequest, TriggerSnapshotResponse,
};
use kvproto::kv::v1::Header;
use openraft::ServerState;
use tokio_stream::Stream;
use tonic::{Request, Response, Status};

use crate::node::identity::Identity;
use crate::raft::membership::{Members, Membership, known_leader};
use crate::raft::types::{NodeInfo, NodeMetrics, NodeRaft};
use crate::raft::watch::MetricsWatch;
use crate::snapshot::save;
#[cfg(doc)]
use crate::snapshot::save::{SAVE_CHUNK_BYTES, SAVE_STREAM_BUFFER};
use crate::state_machine::StateMachine;

/// How long TriggerSnapshot waits for the snapshot to be built.
pub const SNAPSHOT_BUILD_WAIT: Duration = Duration::from_secs(60);

/// The cluster service of one member.
#[derive(Clone)]
pub struct ClusterService {
    id: u64,
    raft: NodeRaft,
    state_machine: StateMachine,
    identity: Identity,
    membership: Option<Membership>,
}

impl std::fmt::Debug for ClusterService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterService")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

/// The header every client-port reply carries: who answered, at which
/// applied index, whom it takes for the leader.
pub fn header(identity: &Identity, state_machine: &StateMachine, metrics: &NodeMetrics) -> Header {
    Header {
        cluster_id: identity.cluster_id(),
        member_id: identity.member_id(),
        raft_term: metrics.current_term,
        applied_index: state_machine.applied_index(),
        leader_id: known_leader(metrics).unwrap_or(0),
        revision: state_machine.revision(),
    }
}

fn members(metrics: &NodeMetrics) -> Vec<Member> {
    members_of(metrics.membership_config.membership())
}

/// Voters and learners, ascending by id.
fn members_of(membership: &Members) -> Vec<Member> {
    let voters: std::collections::BTreeSet<u64> = membership.voter_ids().collect();
    membership
        .nodes()
        .map(|(id, node)| Member {
            id: *id,
            client_addr: node.client_addr.clone(),
            peer_addr: node.peer_addr.clone(),
            voter: voters.contains(id),
        })
        .collect()
}

fn role_of(state: ServerState) -> Role {
    match state {
        ServerState::Leader => Role::Leader,
        ServerState::Follower => Role::Follower,
        ServerState::Candidate => Role::Candidate,
        ServerState::Learner => Role::Learner,
        ServerState::Shutdown => Role::Unknown,
    }
}

/// The index a quorum of voters holds, from the leader's replication view.
fn quorum_matched(metrics: &NodeMetrics) -> Option<u64> {
    let replication = metrics.replication.as_ref()?;
    let mut matched: Vec<u64> = metrics
        .membership_config
        .membership()
        .voter_ids()
        .map(|id| {
            if id == metrics.id {
                metrics.last_log_index.unwrap_or(0)
            } else {
                replication
                    .get(&id)
                    .and_then(|m| m.map(|l| l.index))
                    .unwrap_or(0)
            }
        })
        .collect();
    if matched.is_empty() {
        return None;
    }
    matched.sort_unstable_by(|a, b| b.cmp(a));
    Some(matched[matched.len() / 2])
}

impl ClusterService {
    /// The service for the member with `identity`.
    pub fn new(raft: NodeRaft, state_machine: StateMachine, identity: Identity) -> ClusterService {
        ClusterService {
            id: identity.member_id(),
            raft,
            state_machine,
            identity,
            membership: None,
        }
    }

    /// Serves AddLearner, Promote and RemoveMember through `membership`
    /// (without it they answer UNIMPLEMENTED).
    pub fn with_membership(mut self, membership: Membership) -> ClusterService {
        self.membership = Some(membership);
        self
    }

    #[allow(clippy::result_large_err)]
    fn membership(&self) -> Result<&Membership, Status> {
        self.membership
            .as_ref()
            .ok_or_else(|| Status::unimplemented("membership changes are not served here"))
    }

    /// The tonic server.
    pub fn into_server(self) -> ClusterServer<ClusterService> {
        ClusterServer::new(self)
    }

    fn metrics(&self) -> NodeMetrics {
        self.raft.metrics().borrow().clone()
    }

    fn header(&self, metrics: &NodeMetrics) -> Header {
        header(&self.identity, &self.state_machine, metrics)
    }

    fn status(&self) -> StatusResponse {
        let metrics = self.metrics();
        let last_log = metrics.last_log_index.unwrap_or(0);
        let applied = metrics.last_applied.map(|l| l.index).unwrap_or(0);
        let is_leader = metrics.state == ServerState::Leader;
        let leader = known_leader(&metrics);
        let rows = members(&metrics)
            .into_iter()
            .map(|member| {
                let id = member.id;
                if id == self.id {
                    return MemberStatus {
                        member: Some(member),
                        role: role_of(metrics.state) as i32,
                        is_self: true,
                        term: Some(metrics.current_term),
                        last_log_index: Some(last_log),
                        applied_index: Some(applied),
                        matched_index: is_leader.then_some(last_log),
                        lag_entries: is_leader.then_some(0),
                        saved_vote_term: Some(metrics.vote.leader_id().term),
                    };
                }
                let role = if Some(id) == leader {
                    Role::Leader
                } else if member.voter {
                    Role::Follower
                } else {
                    Role::Learner
                };
                let matched = metrics
                    .replication
                    .as_ref()
                    .and_then(|r| r.get(&id))
                    .map(|m| m.map(|l| l.index).unwrap_or(0));
                MemberStatus {
                    member: Some(member),
                    role: role as i32,
                    is_self: false,
                    term: None,
                    last_log_index: None,
                    applied_index: None,
                    matched_index: matched,
                    lag_entries: matched.map(|m| last_log.saturating_sub(m)),
                    saved_vote_term: None,
                }
            })
            .collect();
        StatusResponse {
            header: Some(self.header(&metrics)),
            committed_index: if is_leader {
                quorum_matched(&metrics).unwrap_or(applied).max(applied)
            } else {
                applied
            },
            snapshot_index: metrics.snapshot.map(|l| l.index),
            purged_index: metrics.purged.map(|l| l.index),
            members: rows,
        }
    }
}

type SaveStream = Pin<Box<dyn Stream<Item = Result<SaveSnapshotResponse, Status>> + Send>>;

#[tonic::async_trait]
impl Cluster for ClusterService {
    async fn status(
        &self,
        _request: Request<StatusRequest>,
    ) -> Result<Response<StatusResponse>, Status> {
        Ok(Response::new(ClusterService::status(self)))
    }

    async fn member_list(
        &self,
        _request: Request<MemberListRequest>,
    ) -> Result<Response<MemberListResponse>, Status> {
        let metrics = self.metrics();
        Ok(Response::new(MemberListResponse {
            header: Some(self.header(&metrics)),
            members: members(&metrics),
        }))
    }

    async fn add_learner(
        &self,
        request: Request<AddLearnerRequest>,
    ) -> Result<Response<AddLearnerResponse>, Status> {
        let request = request.into_inner();
        let info = NodeInfo {
            client_addr: request.client_addr,
            peer_addr: request.peer_addr,
        };
        let members = self
            .membership()?
            .add_learner(request.id, info, request.wait_caught_up)
            .await?;
        Ok(Response::new(AddLearnerResponse {
            header: Some(self.header(&self.metrics())),
            members: members_of(&members),
        }))
    }

    async fn promote(
        &self,
        request: Request<PromoteRequest>,
    ) -> Result<Response<PromoteResponse>, Status> {
        let members = self.membership()?.promote(request.into_inner().id).await?;
        Ok(Response::new(PromoteResponse {
            header: Some(self.header(&self.metrics())),
            members: members_of(&members),
        }))
    }

    async fn remove_member(
        &self,
        request: Request<RemoveMemberRequest>,
    ) -> Result<Response<RemoveMemberResponse>, Status> {
        let members = self.membership()?.remove(request.into_inner().id).await?;
        Ok(Response::new(RemoveMemberResponse {
            header: Some(self.header(&self.metrics())),
            members: members_of(&members),
        }))
    }

    async fn move_leader(
        &self,
        request: Request<MoveLeaderRequest>,
    ) -> Result<Response<MoveLeaderResponse>, Status> {
        let leader_id = self
            .membership()?
            .move_leader(request.into_inner().id)
            .await?;
        Ok(Response::new(MoveLeaderResponse {
            header: Some(self.header(&self.metrics())),
            leader_id,
        }))
    }

    async fn trigger_snapshot(
        &self,
        request: Request<TriggerSnapshotRequest>,
    ) -> Result<Response<TriggerSnapshotResponse>, Status> {
        let purge = request.into_inner().purge_log;
        let target = self.metrics().last_applied.map(|l| l.index).unwrap_or(0);
        self.raft
            .trigger()
            .snapshot()
            .await
            .map_err(|err| Status::unavailable(format!("the node is stopping: {err}")))?;
        let mut metrics = self.raft.metrics();
        let built = tokio::time::timeout(
            SNAPSHOT_BUILD_WAIT,
            metrics.wait_for(|m| m.snapshot.map(|l| l.index).unwrap_or(0) >= target),
        )
        .await
        .map(|waited| waited.map(|m| m.snapshot));
        let snapshot = match built {
            Ok(Ok(snapshot)) => snapshot,
            Ok(Err(_)) => return Err(Status::unavailable("the node is stopping")),
            Err(_) => {
                return Err(Status::deadline_exceeded(format!(
                    "the snapshot was not built within {SNAPSHOT_BUILD_WAIT:?}"
                )));
            }
        };
        let Some(snapshot) = snapshot else {
            return Err(Status::failed_precondition(
                "nothing is applied yet, so there is nothing to snapshot",
            ));
        };
        if purge {
            self.raft
                .trigger()
                .purge_log(snapshot.index)
                .await
                .map_err(|err| Status::unavailable(format!("the node is stopping: {err}")))?;
        }
        let snapshot_id = self.state_machine.current_snapshot_id().unwrap_or_default();
        tracing::info!(
            id = self.id,
            index = snapshot.index,
            %snapshot_id,
            purge,
            "snapshot built on request"
        );
        let metrics = self.metrics();
        Ok(Response::new(TriggerSnapshotResponse {
            header: Some(self.header(&metrics)),
            snapshot_id,
            last_log_index: snapshot.index,
            last_log_term: snapshot.leader_id.term,
        }))
    }

    type SaveSnapshotStream = SaveStream;

    /// Streams the member's snapshot: its manifest, then every file in
    /// manifest order in chunks of [`SAVE_CHUNK_BYTES`] (see
    /// [`crate::snapshot::save`]). The files are
    /// opened before the first message goes out, so the snapshot stays
    /// readable for the whole stream even if newer snapshots prune its
    /// directory meanwhile (open descriptors keep unlinked files); at most
    /// [`SAVE_STREAM_BUFFER`] messages are held ahead of the client.
    async fn save_snapshot(
        &self,
        request: Request<SaveSnapshotRequest>,
    ) -> Result<Response<SaveStream>, Status> {
        let build_new = request.into_inner().build_new;
        if build_new || self.state_machine.current_snapshot().is_none() {
            build_snapshot_now(&self.raft).await?;
        }
        let opened = save::open_current(&self.state_machine).await?;
        let metrics = self.metrics();
        let header = self.header(&metrics);
        let manifest = &opened.manifest;
        tracing::info!(
            id = self.id,
            snapshot = %manifest.snapshot_id,
            files = manifest.files.len(),
            bytes = manifest.files.iter().map(|f| f.len).sum::<u64>(),
            "saving a snapshot to a client"
        );
        Ok(Response::new(Box::pin(save::spawn_stream(header, opened))))
    }
}

/// Builds a snapshot through openraft (so it knows of it) and waits for it.
async fn build_snapshot_now(raft: &NodeRaft) -> Result<(), Status> {
    let target = raft.metrics().borrow().last_applied.map(|l| l.index);
    let Some(target) = target else {
        return Err(Status::failed_precondition(
            "nothing is applied yet, so there is nothing to save",
        ));
    };
    raft.trigger()
        .snapshot()
        .await
        .map_err(|err| Status::unavailable(format!("the node is stopping: {err}")))?;
    let mut metrics = raft.metrics();
    match tokio::time::timeout(
        SNAPSHOT_BUILD_WAIT,
        metrics.wait_for(|m| m.snapshot.is_some_and(|l| l.index >= target)),
    )
    .await
    {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(_)) => Err(Status::unavailable("the node is stopping")),
        Err(_) => Err(Status::deadline_exceeded(format!(
            "the snapshot was not built within {SNAPSHOT_BUILD_WAIT:?}"
        ))),
    }
}
