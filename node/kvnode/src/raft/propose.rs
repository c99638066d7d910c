//! How the leader proposes: the batcher's propose function and the merge
//! proposer. Both wait until the leader has applied an entry of its own
//! term, stamp the entry with the cluster clock, and `client_write` it.

use std::sync::Arc;
use std::time::Duration;

use openraft::error::{ClientWriteError, RaftError};

use crate::node::clock::ClusterClock;
use crate::raft::batcher::{ProposeError, ProposeFn};
use crate::raft::merge_policy::ProposeMerge;
use crate::raft::types::{NodeMetrics, NodeRaft};
use crate::raft::watch::MetricsWatch;
use kvstate::command::{Answer, Command, Proposal, Write};

/// How long a new leader waits to apply its predecessors' entries before
/// it stamps its first proposal.
pub const LEADER_CATCH_UP_WAIT: Duration = Duration::from_secs(5);

/// Waits until this leader has applied an entry of its own term (its blank
/// entry): then every earlier entry is applied, so the cluster time it
/// stamps is never below an entry earlier in the log. Returns that term,
/// which the cluster clock re-bases on when it changes.
///
/// A member that knows another member leads its term answers at once,
/// nothing proposed: it can never apply an entry of that term as leader,
/// and waiting would hold the write for [`LEADER_CATCH_UP_WAIT`] — on a
/// member that just handed its leadership over and is shutting down (its
/// peer port already closed, so the new leader's entries never reach it)
/// that outlived the server's drain and the client saw its write's outcome
/// as unknown instead of a redirect.
pub(crate) async fn leader_caught_up(raft: &NodeRaft) -> Result<u64, ProposeError> {
    let caught_up = |m: &NodeMetrics| {
        m.last_applied
            .is_some_and(|applied| applied.leader_id.term >= m.current_term)
    };
    let led_by_another = |m: &NodeMetrics| m.current_leader.filter(|leader| *leader != m.id);
    let not_leader = |leader: u64, term: u64| {
        ProposeError::NotApplied(format!("member {leader} leads term {term}"))
    };
    {
        // Borrowed, not copied: every proposal asks.
        let metrics = raft.metrics();
        let now = metrics.borrow();
        if caught_up(&now) {
            return Ok(now.current_term);
        }
        if let Some(leader) = led_by_another(&now) {
            return Err(not_leader(leader, now.current_term));
        }
    }
    let mut metrics = raft.metrics();
    let settled = |m: &NodeMetrics| caught_up(m) || led_by_another(m).is_some();
    match tokio::time::timeout(LEADER_CATCH_UP_WAIT, metrics.wait_for(settled)).await {
        Ok(Ok(now)) => match led_by_another(&now) {
            Some(leader) if !caught_up(&now) => Err(not_leader(leader, now.current_term)),
            _ => Ok(now.current_term),
        },
        Ok(Err(_)) => Err(ProposeError::Stopped),
        Err(_) => Err(ProposeError::NotApplied(
            "the leader has not applied its own first entry yet".to_string(),
        )),
    }
}

pub(crate) fn propose_fn(raft: NodeRaft, clock: Arc<ClusterClock>) -> ProposeFn {
    Arc::new(move |writes: Vec<Write>| {
        let raft = raft.clone();
        let clock = clock.clone();
        Box::pin(async move {
            let command = Write::command(writes).ok_or_else(|| {
                ProposeError::NotApplied("requests and transactions in one entry".to_string())
            })?;
            let term = leader_caught_up(&raft).await?;
            let proposal = Proposal {
                time_ms: clock.stamp(term),
                command,
            };
            match raft.client_write(proposal).await {
                Ok(response) => Ok::<Vec<Answer>, ProposeError>(response.data.answers),
                Err(RaftError::APIError(ClientWriteError::ForwardToLeader(forward))) => {
                    Err(ProposeError::NotApplied(forward.to_string()))
                }
                Err(RaftError::APIError(ClientWriteError::ChangeMembershipError(err))) => {
                    Err(ProposeError::NotApplied(err.to_string()))
                }
                Err(RaftError::APIError(ClientWriteError::PreconditionFailed(err))) => {
                    Err(ProposeError::NotApplied(err.to_string()))
                }
                // Appended, then the leader changed: the entry may still
                // commit through the new leader.
                Err(RaftError::APIError(ClientWriteError::LogEntryDiscarded(forward))) => {
                    Err(ProposeError::Unknown(forward.to_string()))
                }
                Err(RaftError::Fatal(fatal)) => Err(ProposeError::Unknown(fatal.to_string())),
            }
        })
    })
}

/// Proposes a merge entry the way writes and ticks are proposed: once the
/// leader has caught up, stamped with its cluster clock, `client_write`.
pub(crate) fn propose_merge_fn(raft: NodeRaft, clock: Arc<ClusterClock>) -> ProposeMerge {
    Arc::new(move |inputs: Vec<String>| {
        let raft = raft.clone();
        let clock = clock.clone();
        Box::pin(async move {
            let term = leader_caught_up(&raft)
                .await
                .map_err(|err| format!("{err:?}"))?;
            let merge = Proposal {
                time_ms: clock.stamp(term),
                command: Command::Merge { inputs },
            };
            raft.client_write(merge)
                .await
                .map(|_| ())
                .map_err(|err| err.to_string())
        })
    })
}

/// Proposes one command outside the batcher (a compaction), once the
/// leader has caught up, stamped with its cluster clock; answers its
/// entry's first answer.
pub type ProposeCommand = Arc<
    dyn Fn(Command) -> std::pin::Pin<Box<dyn Future<Output = Result<Answer, ProposeError>> + Send>>
        + Send
        + Sync,
>;

/// The [`ProposeCommand`] of this member.
pub(crate) fn propose_command_fn(raft: NodeRaft, clock: Arc<ClusterClock>) -> ProposeCommand {
    Arc::new(move |command: Command| {
        let raft = raft.clone();
        let clock = clock.clone();
        Box::pin(async move {
            let term = leader_caught_up(&raft).await?;
            let proposal = Proposal {
                time_ms: clock.stamp(term),
                command,
            };
            match raft.client_write(proposal).await {
                Ok(response) => response.data.answers.into_iter().next().ok_or_else(|| {
                    ProposeError::Unknown("the entry was applied without an answer".to_string())
                }),
                Err(RaftError::APIError(ClientWriteError::LogEntryDiscarded(forward))) => {
                    Err(ProposeError::Unknown(forward.to_string()))
                }
                Err(RaftError::APIError(err)) => Err(ProposeError::NotApplied(err.to_string())),
                Err(RaftError::Fatal(fatal)) => Err(ProposeError::Unknown(fatal.to_string())),
            }
        })
    })
}
