//! Linearizable reads (DESIGN §4): a read index confirmed by a quorum, then
//! a wait until the local state machine has applied that far.
//!
//! On the leader a round is openraft's `get_read_log_id` (a heartbeat round
//! to a quorum). On a follower a round is one `ReadIndex` RPC to the leader,
//! which answers from its own rounds. Either way concurrent reads share
//! rounds, but a read joins only a round that *starts after it arrived*:
//! reads that arrive while a round is in flight wait for the next one. So
//! the index a read gets was confirmed after the read began, which is what
//! makes it linearizable.
//!
//! `--read-policy lease` ([`LinearizableReads::Lease`], off by default) lets
//! the leader skip the round while its leader lease holds; see that variant
//! for the clock assumption it adds.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use openraft::ReadPolicy;
use openraft::errors::{LinearizableReadError, RaftError};
use tokio::sync::oneshot;

use crate::raft::network::Network;
use crate::raft::types::NodeRaft;
use crate::raft::watch::MetricsWatch;

/// How long one read-index round may take before the read answers
/// UNAVAILABLE (it spans the leader's quorum round and, on a follower, the
/// RPC to the leader).
pub const READ_INDEX_TIMEOUT: Duration = Duration::from_secs(3);
/// How long a read waits for the local state machine to apply up to the
/// read index.
pub const APPLY_WAIT: Duration = Duration::from_secs(5);

/// Why a read index could not be had; every case means "cannot answer
/// linearizably now" (UNAVAILABLE), never a stale answer.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ReadIndexError {
    /// No leader is known.
    #[error("no leader is known")]
    NoLeader,
    /// The leader could not confirm its leadership, or could not be reached.
    #[error("{0}")]
    Unavailable(String),
    /// This node is not the leader (answer to a follower's RPC).
    #[error("member {me} is not the leader (leader: {leader:?})")]
    NotLeader {
        /// This member.
        me: u64,
        /// The leader it knows.
        leader: Option<u64>,
    },
    /// The node is stopping.
    #[error("the node is shutting down")]
    Stopped,
}

/// How the leader confirms it still leads before it hands out a read index
/// (`kvnode run --read-policy`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LinearizableReads {
    /// A heartbeat round sent after the read arrived and acknowledged by a
    /// quorum (Raft's ReadIndex). Safe under any clock behaviour.
    #[default]
    ReadIndex,
    /// The leader's lease: no round while a quorum acknowledged a heartbeat
    /// *sent* less than one lease (the largest election timeout, 3 s) ago;
    /// a round, as with `ReadIndex`, once the lease has run out. Followers
    /// refuse to vote for another candidate for one lease after they last
    /// heard from the leader, so no other leader can exist meanwhile —
    /// ASSUMING every member's monotonic clock runs at the same rate as the
    /// leader's, within a small drift against 3 s. Clocks need not agree on
    /// the time, but a member whose clock runs fast (a paused VM catching
    /// up, a skewed clock source) can let a new leader be elected while the
    /// old one still serves reads from its lease: stale reads. A member
    /// forgets the lease it granted when it restarts, so with this policy
    /// every member stays out of elections for one lease after it starts
    /// (`node::start`); set it on every member. Off by default; ReadIndex
    /// costs one heartbeat round trip per read batch.
    Lease,
}

type Waiter = oneshot::Sender<Result<u64, ReadIndexError>>;

#[derive(Default)]
struct Queue {
    running: bool,
    waiting: Vec<Waiter>,
}

/// Shared read-index rounds of one member.
#[derive(Clone)]
pub struct ReadRounds {
    id: u64,
    raft: NodeRaft,
    network: Network,
    policy: LinearizableReads,
    queue: Arc<Mutex<Queue>>,
}

impl std::fmt::Debug for ReadRounds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadRounds")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

impl ReadRounds {
    /// Rounds for member `id`.
    pub fn new(id: u64, raft: NodeRaft, network: Network) -> ReadRounds {
        ReadRounds {
            id,
            raft,
            network,
            policy: LinearizableReads::ReadIndex,
            queue: Arc::default(),
        }
    }

    /// Confirms leadership with `policy` (ReadIndex unless set).
    pub fn with_policy(mut self, policy: LinearizableReads) -> ReadRounds {
        self.policy = policy;
        self
    }

    /// A read index confirmed by a round that started after this call.
    pub async fn read_index(&self) -> Result<u64, ReadIndexError> {
        let (tx, rx) = oneshot::channel();
        let start = {
            let mut queue = self.queue.lock().unwrap_or_else(|p| p.into_inner());
            queue.waiting.push(tx);
            !std::mem::replace(&mut queue.running, true)
        };
        if start {
            let rounds = self.clone();
            tokio::spawn(async move { rounds.run().await });
        }
        rx.await.unwrap_or(Err(ReadIndexError::Stopped))
    }

    /// Runs rounds while reads wait; each round serves exactly the reads
    /// that were waiting when it started.
    async fn run(self) {
        loop {
            let waiting = {
                let mut queue = self.queue.lock().unwrap_or_else(|p| p.into_inner());
                if queue.waiting.is_empty() {
                    queue.running = false;
                    return;
                }
                std::mem::take(&mut queue.waiting)
            };
            let result = match tokio::time::timeout(READ_INDEX_TIMEOUT, self.round()).await {
                Ok(result) => result,
                Err(_) => Err(ReadIndexError::Unavailable(format!(
                    "the read index round took longer than {READ_INDEX_TIMEOUT:?}"
                ))),
            };
            for waiter in waiting {
                let _ = waiter.send(result.clone());
            }
        }
    }

    async fn round(&self) -> Result<u64, ReadIndexError> {
        let (leader, leader_node) = {
            let metrics = self.raft.metrics();
            let m = metrics.borrow();
            let leader = m.current_leader;
            let node = leader.and_then(|l| m.membership_config.membership().get_node(&l).cloned());
            (leader, node)
        };
        match leader {
            None => Err(ReadIndexError::NoLeader),
            Some(leader) if leader == self.id => self.leader_round().await,
            Some(leader) => {
                let node = leader_node.ok_or_else(|| {
                    ReadIndexError::Unavailable(format!(
                        "the leader {leader} is not in the membership this member knows"
                    ))
                })?;
                self.network
                    .read_index(leader, &node, READ_INDEX_TIMEOUT)
                    .await
            }
        }
    }

    /// One quorum round on the leader (or, with the lease policy, none
    /// while the lease holds).
    async fn leader_round(&self) -> Result<u64, ReadIndexError> {
        let result = match self.policy {
            LinearizableReads::ReadIndex => self.raft.get_read_log_id(ReadPolicy::ReadIndex).await,
            LinearizableReads::Lease => {
                match self.raft.get_read_log_id(ReadPolicy::LeaseRead).await {
                    // The lease ran out: a ReadIndex round.
                    Err(RaftError::APIError(LinearizableReadError::QuorumNotEnough(_))) => {
                        self.raft.get_read_log_id(ReadPolicy::ReadIndex).await
                    }
                    other => other,
                }
            }
        };
        match result {
            Ok((read_log_id, _applied)) => Ok(read_log_id.index()),
            Err(RaftError::APIError(LinearizableReadError::ForwardToLeader(forward))) => {
                Err(ReadIndexError::NotLeader {
                    me: self.id,
                    leader: forward.leader_id,
                })
            }
            Err(RaftError::APIError(LinearizableReadError::QuorumNotEnough(err))) => Err(
                ReadIndexError::Unavailable(format!("could not confirm leadership: {err}")),
            ),
            Err(RaftError::Fatal(_)) => Err(ReadIndexError::Stopped),
        }
    }

    /// The leader's side of a follower's `ReadIndex` RPC: a round of the
    /// leader's own (shared with its local reads); refused on a non-leader.
    pub async fn serve_follower(&self) -> Result<(u64, u64), ReadIndexError> {
        let (leader, term) = {
            let m = self.raft.metrics();
            let m = m.borrow();
            (m.current_leader, m.current_term)
        };
        if leader != Some(self.id) {
            return Err(ReadIndexError::NotLeader {
                me: self.id,
                leader,
            });
        }
        let index = self.read_index().await?;
        Ok((index, term))
    }

    /// Waits until this member has applied `index`.
    pub async fn wait_applied(&self, index: u64) -> Result<(), ReadIndexError> {
        let mut metrics = self.raft.metrics();
        let reached = tokio::time::timeout(
            APPLY_WAIT,
            metrics.wait_for(|m| m.last_applied.map(|l| l.index).unwrap_or(0) >= index),
        )
        .await;
        match reached {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(_)) => Err(ReadIndexError::Stopped),
            Err(_) => Err(ReadIndexError::Unavailable(format!(
                "this member did not apply up to the read index {index} within {APPLY_WAIT:?}"
            ))),
        }
    }
}
