//! Membership changes on the leader: add a learner, promote it to voter,
//! remove a member (the leader included), as the `Cluster` service's
//! AddLearner, Promote and RemoveMember handlers run them.
//!
//! Every change goes through openraft (`add_learner` without blocking,
//! `change_membership` with `AddVoterIds` / `RemoveVoters` / `RemoveNodes`,
//! joint consensus for voter changes) and answers once the new membership is
//! committed and applied on the leader. Around that this module adds what
//! openraft leaves to the application:
//!
//! - **Only the leader changes membership.** Any other member answers
//!   FAILED_PRECONDITION with a `NotLeader` detail, like a kv write.
//! - **Inputs are checked first**: id 0, addresses (`NodeInfo::validate`)
//!   and an address another member already uses are INVALID_ARGUMENT naming
//!   the field; an id already in use, promoting a non-member, removing a
//!   non-member or the last voter are FAILED_PRECONDITION.
//! - **A new member must be running** before it is added: the leader asks it
//!   who it is (`Identify`; no answer within [`IDENTIFY_NEW_MEMBER_TIMEOUT`]
//!   is FAILED_PRECONDITION "start the new member"). A process that is another member, belongs to
//!   another cluster, or presents another incarnation than the one this
//!   leader knows for that id (a wiped data directory re-added under its old
//!   id) is refused up front with FAILED_PRECONDITION naming the id — the
//!   peer identity check would otherwise refuse every AppendEntries and the
//!   learner would never catch up. The answered incarnation is recorded, so
//!   the leader addresses the learner's incarnation from the first message.
//! - **Catching up is bounded**: with `wait_caught_up` the leader waits until
//!   the learner holds every entry up to the membership change (by log
//!   replication, or by snapshot when the leader purged that part of its
//!   log), at most [`CATCH_UP_WAIT`]; after that DEADLINE_EXCEEDED says the
//!   learner was added and is still catching up.
//! - **Promotion needs a caught-up learner**: a learner more than
//!   [`PROMOTE_LAG_ENTRIES_MAX`] entries behind is refused, so a voter that
//!   cannot vote on new entries yet is never counted in a quorum.
//! - **One change at a time** per leader (a lock); a change not committed
//!   within [`CHANGE_WAIT`] answers UNAVAILABLE with an `OutcomeUnknown`
//!   detail (it may still commit: check the member list).
//! - **Every member learns every member's incarnation**: a background task
//!   ([`learn_member_incarnations`]) asks each member of the current
//!   membership whose incarnation it does not know yet who it is, so
//!   whichever member leads later still recognizes a wiped member re-added
//!   under its old id (a member that joined before the others asked it, and
//!   was wiped before they could, is not recognized).
//! - Retries are safe: adding a learner that is already a learner with the
//!   same addresses, or promoting a member that is already a voter, answers
//!   the current membership without a new entry.
//!
//! What openraft does to a removed member: a removed leader keeps leading
//! until the membership without it is committed and applied, then steps
//! down to a learner; the others elect a new leader. A removed member gets
//! no more entries; it refuses client writes (openraft refuses a proposal on
//! a non-leader, so the kv service answers NotLeader) and linearizable reads
//! (no leader confirms a read index for it). Its process keeps running until
//! the operator stops it; a removed voter that has not seen its removal may
//! stand for election, and the remaining members refuse its votes while
//! their leader's lease holds. Stop removed members.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use openraft::error::{ClientWriteError, RaftError};
use openraft::{ChangeMembers, ServerState};
use tonic::Status;

use crate::node::identity::Identity;
use crate::raft::network::Network;
use crate::raft::types::{NodeInfo, NodeMetrics, NodeRaft, TypeConfig};
use crate::raft::watch::MetricsWatch;
use crate::server::convert;

/// How long AddLearner with `wait_caught_up` waits for the learner to hold
/// every entry up to the membership change (log or snapshot transfer).
pub const CATCH_UP_WAIT: Duration = Duration::from_secs(120);
/// How long one membership change may take to commit and apply on the
/// leader (both steps of a joint change).
pub const CHANGE_WAIT: Duration = Duration::from_secs(30);
/// How long a new member may take to answer `Identify` before AddLearner.
pub const IDENTIFY_NEW_MEMBER_TIMEOUT: Duration = Duration::from_secs(3);
/// How often a member looks for members of its membership whose
/// incarnation it does not know yet.
pub const LEARN_MEMBERS_INTERVAL: Duration = Duration::from_secs(1);

/// Largest lag, in entries behind the leader's last log index, of a learner
/// that may be promoted.
pub const PROMOTE_LAG_ENTRIES_MAX: u64 = 1000;
/// How long a leadership move may take: the target must catch up with the
/// leader's log, then win an election (one round trip when it is caught
/// up; a few heartbeats when it lags).
pub const MOVE_LEADER_WAIT: Duration = Duration::from_secs(5);

type Metrics = NodeMetrics;
type Raft = NodeRaft;

/// The leader a member may name: the one its vote names, but only while
/// that member is a voter of the membership this member knows. (A removed
/// leader that stepped down keeps its committed vote for itself; it must
/// not send clients back to itself.)
pub fn known_leader(metrics: &Metrics) -> Option<u64> {
    let leader = metrics.current_leader?;
    let membership = metrics.membership_config.membership();
    membership
        .voter_ids()
        .any(|id| id == leader)
        .then_some(leader)
}

/// Member `id`'s addresses in the membership this member knows now.
pub fn node_of(raft: &NodeRaft, id: u64) -> Option<NodeInfo> {
    let receiver = raft.metrics();
    let metrics = receiver.borrow();
    metrics
        .membership_config
        .membership()
        .get_node(&id)
        .cloned()
}

/// Membership changes of one member (only its leader term changes
/// anything).
#[derive(Clone)]
pub struct Membership {
    id: u64,
    raft: Raft,
    identity: Identity,
    network: Network,
    /// One change at a time.
    lock: Arc<tokio::sync::Mutex<()>>,
}

impl std::fmt::Debug for Membership {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Membership")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

/// The membership after a change (or the current one when nothing had to
/// change).
pub type Members = openraft::Membership<u64, NodeInfo>;

impl Membership {
    /// Membership changes for the member with `identity`, asking new members
    /// who they are over `network`.
    pub fn new(raft: Raft, identity: Identity, network: Network) -> Membership {
        Membership {
            id: identity.member_id(),
            raft,
            identity,
            network,
            lock: Arc::default(),
        }
    }

    fn metrics(&self) -> Metrics {
        self.raft.metrics().borrow().clone()
    }

    /// NotLeader unless this member leads now; the current metrics if it does.
    #[allow(clippy::result_large_err)]
    fn require_leader(&self) -> Result<Metrics, Status> {
        let metrics = self.metrics();
        if metrics.state == ServerState::Leader && metrics.current_leader == Some(self.id) {
            return Ok(metrics);
        }
        let leader = known_leader(&metrics).filter(|l| *l != self.id);
        let addr = leader.and_then(|l| {
            metrics
                .membership_config
                .membership()
                .get_node(&l)
                .map(|n| n.client_addr.clone())
        });
        Err(convert::not_leader(leader, addr))
    }

    /// Adds member `id` at `info` as a learner; with `wait_caught_up`,
    /// answers once it holds every entry up to the change (at most
    /// [`CATCH_UP_WAIT`]).
    pub async fn add_learner(
        &self,
        id: u64,
        info: NodeInfo,
        wait_caught_up: bool,
    ) -> Result<Members, Status> {
        if id == 0 {
            return Err(Status::invalid_argument("id: member ids start at 1, got 0"));
        }
        info.validate(id).map_err(Status::invalid_argument)?;
        let _one = self.lock.lock().await;
        let metrics = self.require_leader()?;
        let current = metrics.membership_config.membership().clone();
        let voter = current.voter_ids().any(|v| v == id);
        if let Some(known) = current.get_node(&id) {
            if !voter && *known == info {
                // A retry of an add that went through.
                drop(_one);
                if wait_caught_up {
                    let index = metrics.membership_config.log_id().map(|l| l.index);
                    self.wait_caught_up(id, index.unwrap_or(0)).await?;
                }
                return Ok(self.metrics().membership_config.membership().clone());
            }
            return Err(Status::failed_precondition(format!(
                "id: member {id} is already a {} at {known}; remove it first, or add the new \
                 member under a new id",
                if voter { "voter" } else { "learner" }
            )));
        }
        for (other, node) in current.nodes() {
            for (field, mine, theirs) in [
                ("client_addr", &info.client_addr, &node.client_addr),
                ("peer_addr", &info.peer_addr, &node.peer_addr),
            ] {
                if mine == theirs {
                    return Err(Status::invalid_argument(format!(
                        "{field}: {mine} is already the address of member {other}"
                    )));
                }
            }
        }
        self.check_new_member(id, &info).await?;

        tracing::info!(leader = self.id, id, %info, "adding a learner");
        let added = tokio::time::timeout(CHANGE_WAIT, self.raft.add_learner(id, info, false))
            .await
            .map_err(|_| not_committed_in_time("adding the learner"))?
            .map_err(change_error)?;
        drop(_one);
        if wait_caught_up {
            self.wait_caught_up(id, added.log_id.index).await?;
        }
        Ok(added
            .membership
            .unwrap_or_else(|| self.metrics().membership_config.membership().clone()))
    }

    /// Asks the process at `info` who it is and checks it may join as member
    /// `id`; records its incarnation.
    async fn check_new_member(&self, id: u64, info: &NodeInfo) -> Result<(), Status> {
        let (cluster, member, incarnation) = self
            .network
            .identify(id, info, IDENTIFY_NEW_MEMBER_TIMEOUT)
            .await
            .map_err(|err| {
                Status::failed_precondition(format!(
                    "member {id} at peer_addr {} did not answer who it is ({err}); start the new \
                     member (without --bootstrap) before adding it",
                    info.peer_addr
                ))
            })?;
        if member != id {
            return Err(Status::failed_precondition(format!(
                "id: the process at peer_addr {} is member {member}, not member {id}",
                info.peer_addr
            )));
        }
        let ours = self.identity.cluster_id();
        if cluster != 0 && cluster != ours {
            return Err(Status::failed_precondition(format!(
                "member {id} at {} belongs to cluster {cluster:016x}, not to this cluster \
                 {ours:016x}; give it a fresh data directory",
                info.peer_addr
            )));
        }
        let known = self.identity.peer_incarnation(id);
        if known != 0 && known != incarnation {
            return Err(Status::failed_precondition(format!(
                "id: member {id} was a member of this cluster with incarnation {known:016x}, and \
                 the process at {} is a new incarnation {incarnation:016x} (its data directory \
                 was wiped or replaced); a member id is never reused for new data: add it under \
                 a new id",
                info.peer_addr
            )));
        }
        let identity = self.identity.clone();
        tokio::task::spawn_blocking(move || identity.learn_from_peer(id, incarnation, 0))
            .await
            .map_err(|err| Status::internal(format!("identity task: {err}")))?
            .map_err(|err| Status::failed_precondition(format!("id: member {id}: {err}")))?;
        Ok(())
    }

    /// Waits until the leader's replication to `id` has matched `index`.
    async fn wait_caught_up(&self, id: u64, index: u64) -> Result<(), Status> {
        let mut metrics = self.raft.metrics();
        let waited = tokio::time::timeout(
            CATCH_UP_WAIT,
            metrics.wait_for(|m| {
                m.replication.is_none()
                    || m.membership_config.membership().get_node(&id).is_none()
                    || matched(m, id).is_some_and(|matched| matched >= index)
            }),
        )
        .await;
        let m = match waited {
            Err(_) => {
                return Err(Status::deadline_exceeded(format!(
                    "member {id} was added as a learner but had not caught up to index {index} \
                     within CATCH_UP_WAIT ({CATCH_UP_WAIT:?}); it keeps catching up: watch its \
                     lag in the status"
                )));
            }
            Ok(Err(_)) => return Err(Status::unavailable("the node is stopping")),
            Ok(Ok(m)) => m.clone(),
        };
        if m.replication.is_none() {
            return Err(Status::unavailable(format!(
                "member {id} was added as a learner, but this member lost the leadership while it \
                 caught up; watch its lag in the status on the new leader"
            )));
        }
        if m.membership_config.membership().get_node(&id).is_none() {
            return Err(Status::failed_precondition(format!(
                "member {id} was removed while it caught up"
            )));
        }
        Ok(())
    }

    /// Turns learner `id` into a voter (joint consensus).
    pub async fn promote(&self, id: u64) -> Result<Members, Status> {
        let _one = self.lock.lock().await;
        let metrics = self.require_leader()?;
        let current = metrics.membership_config.membership();
        if current.get_node(&id).is_none() {
            return Err(Status::failed_precondition(format!(
                "id: member {id} is not a member; add it as a learner first"
            )));
        }
        if current.voter_ids().any(|v| v == id) {
            // Already done (a retry of a promotion that went through).
            return Ok(current.clone());
        }
        let last = metrics.last_log_index.unwrap_or(0);
        match matched(&metrics, id) {
            Some(m) if last.saturating_sub(m) <= PROMOTE_LAG_ENTRIES_MAX => {}
            lagging => {
                return Err(Status::failed_precondition(format!(
                    "id: learner {id} is {} behind the leader's last index {last} \
                     (PROMOTE_LAG_ENTRIES_MAX is {PROMOTE_LAG_ENTRIES_MAX}); wait until it \
                     catches up (AddLearner with wait_caught_up), then promote it",
                    match lagging {
                        Some(m) => format!("{} entries", last.saturating_sub(m)),
                        None => "all entries".to_string(),
                    }
                )));
            }
        }
        tracing::info!(leader = self.id, id, "promoting a learner");
        self.change(
            ChangeMembers::AddVoterIds(BTreeSet::from([id])),
            "promoting",
        )
        .await
    }

    /// Hands leadership to voter `id`: openraft's leader transfer (the
    /// leader stops taking writes, the target starts an election as soon as
    /// its log matches the leader's). Answers the new leader's id once this
    /// member sees `id` lead, within [`MOVE_LEADER_WAIT`]. Moving to the
    /// leader itself changes nothing.
    pub async fn move_leader(&self, id: u64) -> Result<u64, Status> {
        let _one = self.lock.lock().await;
        let metrics = self.require_leader()?;
        let is_voter = metrics
            .membership_config
            .membership()
            .voter_ids()
            .any(|voter| voter == id);
        if !is_voter {
            return Err(Status::invalid_argument(format!(
                "id: member {id} is not a voter; leadership can only move to a voter"
            )));
        }
        if id == self.id {
            return Ok(id);
        }
        tracing::info!(leader = self.id, to = id, "moving leadership");
        self.raft
            .trigger()
            .transfer_leader(id)
            .await
            .map_err(|err| Status::unavailable(format!("raft stopped: {err}")))?;
        let mut watch = self.raft.metrics();
        match tokio::time::timeout(
            MOVE_LEADER_WAIT,
            watch.wait_for(move |m| m.current_leader == Some(id)),
        )
        .await
        {
            Ok(Ok(_)) => Ok(id),
            Ok(Err(_)) => Err(Status::unavailable("raft stopped")),
            Err(_) => Err(Status::deadline_exceeded(format!(
                "member {id} did not take over within MOVE_LEADER_WAIT ({MOVE_LEADER_WAIT:?}); \
                 check `kvctl status`: it may be catching up or unreachable"
            ))),
        }
    }

    /// Removes member `id` (voter or learner, the leader included).
    pub async fn remove(&self, id: u64) -> Result<Members, Status> {
        let _one = self.lock.lock().await;
        let metrics = self.require_leader()?;
        let current = metrics.membership_config.membership();
        if current.get_node(&id).is_none() {
            return Err(Status::failed_precondition(format!(
                "id: member {id} is not a member"
            )));
        }
        let voters: BTreeSet<u64> = current.voter_ids().collect();
        let changes = if voters.contains(&id) {
            if voters.len() == 1 {
                return Err(Status::failed_precondition(format!(
                    "id: member {id} is the only voter; a cluster cannot remove its last voter"
                )));
            }
            ChangeMembers::RemoveVoters(BTreeSet::from([id]))
        } else {
            ChangeMembers::RemoveNodes(BTreeSet::from([id]))
        };
        tracing::info!(leader = self.id, id, "removing a member");
        self.change(changes, "removing the member").await
    }

    async fn change(
        &self,
        changes: ChangeMembers<u64, NodeInfo>,
        what: &str,
    ) -> Result<Members, Status> {
        let changed =
            tokio::time::timeout(CHANGE_WAIT, self.raft.change_membership(changes, false))
                .await
                .map_err(|_| not_committed_in_time(what))?
                .map_err(change_error)?;
        Ok(changed
            .membership
            .unwrap_or_else(|| self.metrics().membership_config.membership().clone()))
    }
}

/// Until `stop`, every [`LEARN_MEMBERS_INTERVAL`] asks each member of the
/// current membership whose incarnation this member does not know who it is
/// (`Identify`), and records the incarnation of one that answers as that
/// member of this cluster (or of no cluster yet).
pub async fn learn_member_incarnations(
    raft: Raft,
    identity: Identity,
    network: Network,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let me = identity.member_id();
    loop {
        tokio::select! {
            _ = tokio::time::sleep(LEARN_MEMBERS_INTERVAL) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
        let unknown: Vec<(u64, NodeInfo)> = {
            let metrics = raft.metrics();
            let metrics = metrics.borrow();
            metrics
                .membership_config
                .membership()
                .nodes()
                .filter(|(id, _)| **id != me && identity.peer_incarnation(**id) == 0)
                .map(|(id, node)| (*id, node.clone()))
                .collect()
        };
        for (id, node) in unknown {
            let answer = network
                .identify(id, &node, IDENTIFY_NEW_MEMBER_TIMEOUT)
                .await;
            let Ok((cluster, member, incarnation)) = answer else {
                continue;
            };
            let ours = identity.cluster_id();
            if member != id || incarnation == 0 || (cluster != 0 && cluster != ours) {
                continue;
            }
            let learner = identity.clone();
            let learned =
                tokio::task::spawn_blocking(move || learner.learn_from_peer(id, incarnation, 0))
                    .await;
            if let Ok(Err(err)) = learned {
                tracing::warn!(error = %err, member = id, "learning a member's incarnation");
            }
        }
    }
}

/// The index the leader knows replicated on `id` (None: nothing yet, or not
/// the leader).
fn matched(metrics: &Metrics, id: u64) -> Option<u64> {
    metrics
        .replication
        .as_ref()?
        .get(&id)?
        .as_ref()
        .map(|l| l.index)
}

fn not_committed_in_time(what: &str) -> Status {
    convert::outcome_unknown(format!(
        "{what}: the membership change was not committed within CHANGE_WAIT ({CHANGE_WAIT:?}) \
         (is a quorum of voters up?); it may still commit: check the member list"
    ))
}

fn change_error(err: RaftError<TypeConfig, ClientWriteError<TypeConfig>>) -> Status {
    match err {
        RaftError::APIError(ClientWriteError::ForwardToLeader(forward)) => convert::not_leader(
            forward.leader_id,
            forward.leader_node.map(|n| n.client_addr),
        ),
        RaftError::APIError(ClientWriteError::ChangeMembershipError(err)) => {
            Status::failed_precondition(format!("the membership cannot change now: {err}"))
        }
        // The leader changed after the change was appended: it may still
        // commit through the new leader.
        RaftError::APIError(ClientWriteError::LogEntryDiscarded(forward)) => {
            convert::outcome_unknown(format!(
                "the membership change's outcome is unknown ({forward}); check the member list"
            ))
        }
        RaftError::APIError(ClientWriteError::PreconditionFailed(err)) => {
            Status::failed_precondition(format!("the membership cannot change now: {err}"))
        }
        RaftError::Fatal(fatal) => convert::outcome_unknown(format!(
            "the membership change's outcome is unknown (raft stopped: {fatal}); check the \
             member list"
        )),
    }
}
