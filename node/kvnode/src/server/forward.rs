//! Write forwarding: any member takes a front end's write (the Redis port
//! today, the etcd port next) and, when it does not lead, sends it to the
//! leader over the peer `Forward` RPC, which proposes it down the leader's
//! own write path ([`KvService::write_forwarded`]) and answers its outcome.
//! The native `Kv` port does not forward: kvclient routes to the leader.
//!
//! Exactly once: each forwarded write runs under a session of the member's
//! own ([`kvproto::session`]) that carries no other write while it is in
//! flight, and keeps its sequence for every attempt, so a retry after a
//! lost answer, a timeout or a new leader gets the first application's
//! answer instead of applying twice (the state machine's session table,
//! DESIGN §3). One write per session keeps each session's stored answers
//! at one: many concurrent writes under one session would hold its
//! lowest-unacknowledged mark down and push the oldest answers — those of
//! the slowest, most likely retried writes — past `SESSION_ANSWERS_MAX`.
//! A session whose write was answered waits in a pool ([`Forwarder`]) and
//! is reused; one idle longer than [`SESSION_REUSE_IDLE_MAX`] is dropped
//! (the state machine evicts it after `SESSION_IDLE_MS_MAX`), and one
//! whose write was refused or abandoned is not pooled.
//!
//! Attempts: while a leader is known, the write goes to it (to this member
//! itself once it leads). A refusal that says nothing was written (not the
//! leader, an identity mismatch during a membership change) and a failure
//! that may have applied (anything else but the leader's own final
//! refusals: transport failures, deadlines, outcome unknown) are retried
//! after [`FORWARD_RETRY_PAUSE`] or as soon as another leader is known,
//! until [`FORWARD_DEADLINE`]; an attempt still waiting when another
//! leader becomes known is abandoned (it may have applied) and the write
//! goes to the new leader, so a leader that died silently costs an
//! election, not the deadline. The leader's final refusals (INVALID_ARGUMENT
//! naming a limit, NOT_FOUND, ALREADY_EXISTS, RESOURCE_EXHAUSTED naming a
//! limit, UNIMPLEMENTED) are answered as they are, except that a refusal
//! made before the state machine (RESOURCE_EXHAUSTED, UNIMPLEMENTED) after
//! an attempt that may have applied is outcome unknown. A write over
//! `ENTRY_SIZE_BYTES_MAX` is refused here, before any transfer. Giving up answers
//! outcome unknown if any attempt may have applied, else
//! FAILED_PRECONDITION with a `NotLeader` detail whose message says nothing
//! was written. SESSION_EXPIRED (the session was evicted) when no earlier
//! attempt may have applied runs the write once more under a fresh
//! session; after an attempt that may have applied it is outcome unknown.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use kvproto::kv::v1::NotLeader;
use kvproto::kv::v1::error_detail::Detail;
use kvproto::session::{Sessions, Ticket};
use kvstate::command::{Answer, Write};
use tokio::time::Instant;
use tonic::{Code, Status};

use crate::raft::batcher::ENTRY_SIZE_BYTES_MAX;
use crate::raft::network::Network;
use crate::raft::types::NodeRaft;
use crate::raft::watch::MetricsWatch;
use crate::server::convert;
use crate::server::kv::{KvService, WRITE_TIMEOUT};
use crate::server::metrics::Metrics;

/// How long a forwarded write may take in all, attempts and pauses
/// included: one leader's write timeout, plus an election's worth of
/// retries.
pub const FORWARD_DEADLINE: Duration = Duration::from_secs(WRITE_TIMEOUT.as_secs() + 5);
/// Pause between attempts (or until the known leader changes, if sooner).
pub const FORWARD_RETRY_PAUSE: Duration = Duration::from_millis(50);
/// Fresh sessions one write may be run under at most (the second only
/// after SESSION_EXPIRED with no attempt that may have applied).
const FORWARD_SESSION_ROUNDS_MAX: usize = 2;
/// How long a pooled session may have been idle and still be reused: half
/// the state machine's eviction time. Only answered sessions are pooled,
/// so a reused one was in the state machine that recently (a fresh one
/// costs nothing; an evicted one costs a round trip).
pub const SESSION_REUSE_IDLE_MAX: Duration =
    Duration::from_millis(kvstate::command::SESSION_IDLE_MS_MAX / 2);

/// What one attempt's failure says about the write.
#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    /// Nothing was written: try again (the leader may have moved).
    NotWritten,
    /// It may have applied: try again with the same sequence.
    MaybeApplied,
    /// The session was evicted: the state machine applied nothing now.
    SessionExpired,
    /// The leader's final answer (a limit, a lease not found, ...).
    Final,
}

fn classify(status: &Status) -> Verdict {
    match (
        status.code(),
        convert::detail_of(status).and_then(|d| d.detail),
    ) {
        (Code::Aborted, Some(Detail::SessionExpired(_))) => Verdict::SessionExpired,
        // Not the leader, or an identity the leader does not accept yet
        // (a membership change in flight): refused before proposing.
        (Code::FailedPrecondition, _) => Verdict::NotWritten,
        // The leader's own final refusals, each before or without an
        // effect: a limit (request or free disk space), a lease that does
        // not exist or already does, no Forward in the leader's build.
        (Code::InvalidArgument | Code::NotFound | Code::AlreadyExists | Code::Unimplemented, _)
        | (Code::ResourceExhausted, Some(Detail::LimitExceeded(_))) => Verdict::Final,
        // Everything else may come from the transport (tonic maps HTTP/2
        // resets to RESOURCE_EXHAUSTED, PERMISSION_DENIED, INTERNAL, ...)
        // after the leader took the write: it may have applied.
        _ => Verdict::MaybeApplied,
    }
}

/// A session carrying one forwarded write at a time, and when it was last
/// used.
struct Pooled {
    sessions: Arc<Sessions>,
    idle_since: Instant,
}

/// One member's forwarding: its session and the way to its leader.
#[derive(Clone)]
pub struct Forwarder {
    id: u64,
    raft: NodeRaft,
    network: Network,
    /// Idle sessions, most recently used last.
    pool: Arc<Mutex<Vec<Pooled>>>,
    metrics: Option<Metrics>,
}

impl std::fmt::Debug for Forwarder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Forwarder")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

impl Forwarder {
    /// Member `id`'s forwarding over `network`, under a fresh session.
    pub fn new(id: u64, raft: NodeRaft, network: Network, metrics: Option<Metrics>) -> Forwarder {
        Forwarder {
            id,
            raft,
            network,
            pool: Arc::default(),
            metrics,
        }
    }

    /// A session no other write is using (a pooled one if any was used
    /// recently, else a fresh one).
    fn checkout(&self) -> Arc<Sessions> {
        let mut pool = self.pool.lock().unwrap_or_else(PoisonError::into_inner);
        // The oldest are first: drop those idle too long.
        let stale = pool
            .iter()
            .take_while(|p| p.idle_since.elapsed() > SESSION_REUSE_IDLE_MAX)
            .count();
        pool.drain(..stale);
        pool.pop()
            .map_or_else(|| Arc::new(Sessions::new()), |p| p.sessions)
    }

    /// Returns a session whose write is done to the pool.
    fn checkin(&self, sessions: Arc<Sessions>) {
        let mut pool = self.pool.lock().unwrap_or_else(PoisonError::into_inner);
        pool.push(Pooled {
            sessions,
            idle_since: Instant::now(),
        });
    }

    /// Runs `write` on the leader, exactly once, through `kv` when this
    /// member leads and over `Forward` otherwise (see the module doc): its
    /// answer and a log index at or after its entry (the leader's applied
    /// index when it answered).
    pub(crate) async fn write(
        &self,
        kv: &KvService,
        write: Write,
    ) -> Result<(Answer, u64), Status> {
        let deadline = Instant::now() + FORWARD_DEADLINE;
        // The leader would refuse it (the batcher's check): no transfer.
        let size = write.encoded_len();
        if size > ENTRY_SIZE_BYTES_MAX {
            return Err(convert::limit_exceeded(
                "ENTRY_SIZE_BYTES_MAX",
                ENTRY_SIZE_BYTES_MAX as u64,
                size as u64,
            ));
        }
        let mut result = Err(Status::internal("no attempt"));
        for round in 0..FORWARD_SESSION_ROUNDS_MAX {
            // After SESSION_EXPIRED, a fresh session: a pooled one might
            // be as old as the one just found evicted.
            let sessions = if round == 0 {
                self.checkout()
            } else {
                Arc::new(Sessions::new())
            };
            let ticket = sessions.begin();
            let (outcome, may_have_applied) =
                self.attempts(kv, &ticket, write.clone(), deadline).await;
            result = outcome;
            let expired =
                matches!(&result, Err(status) if classify(status) == Verdict::SessionExpired);
            if expired {
                ticket.session_expired();
            }
            drop(ticket);
            // Back to the pool only when done and answered (so its session
            // surely exists, used just now): a write abandoned mid-way (its
            // task dropped) or refused takes its session with it, and a
            // fresh one costs nothing.
            if result.is_ok() {
                self.checkin(sessions);
            }
            if !expired || may_have_applied {
                break;
            }
        }
        if let Some(metrics) = &self.metrics {
            metrics.forwarded_write(match &result {
                Ok(_) => "answered",
                Err(status) => match classify(status) {
                    Verdict::NotWritten => "not_written",
                    Verdict::Final => "refused",
                    Verdict::MaybeApplied | Verdict::SessionExpired => "unknown",
                },
            });
        }
        result.map_err(|status| match classify(&status) {
            Verdict::SessionExpired => convert::outcome_unknown(format!(
                "a forwarded write's answer was forgotten (the forwarding member's session \
                 expired): outcome unknown; {}",
                status.message()
            )),
            _ => status,
        })
    }

    /// The attempts of one write under one ticket, until an answer, a final
    /// refusal, SESSION_EXPIRED or `deadline`; and whether any attempt may
    /// have applied.
    async fn attempts(
        &self,
        kv: &KvService,
        ticket: &Ticket,
        mut write: Write,
        deadline: Instant,
    ) -> (Result<(Answer, u64), Status>, bool) {
        let mut may_have_applied = false;
        let mut last = String::from("no leader was known");
        loop {
            write.set_session(crate::server::kv::session(Some(ticket.session())));
            let (leader, node) = self.leader();
            let remaining = deadline.saturating_duration_since(Instant::now());
            let attempt = match (leader, node) {
                (Some(leader), _) if leader == self.id => Some(
                    match tokio::time::timeout(
                        remaining.max(FORWARD_RETRY_PAUSE),
                        kv.write_forwarded(write.clone()),
                    )
                    .await
                    {
                        Ok(answer) => answer.map(|answer| (answer, kv.applied_index())),
                        Err(_) => Err(convert::outcome_unknown(
                            "the write's outcome was not known before the forwarding deadline",
                        )),
                    },
                ),
                (Some(leader), Some(node)) => {
                    let sent = self.network.forward(
                        leader,
                        &node,
                        &write,
                        remaining.max(FORWARD_RETRY_PAUSE),
                    );
                    let moved = self.leader_other_than(Some(leader));
                    tokio::select! {
                        answer = sent => Some(answer),
                        _ = moved => Some(Err(Status::unavailable(format!(
                            "member {leader} stopped leading before it answered"
                        )))),
                    }
                }
                _ => None,
            };
            match attempt {
                Some(Ok(answer)) => {
                    ticket.answered();
                    return (Ok(answer), may_have_applied);
                }
                Some(Err(status)) => match classify(&status) {
                    // After an attempt that may have applied, a refusal
                    // made before the state machine (the disk watermark, a
                    // leader without Forward) says nothing of that attempt:
                    // outcome unknown. The state machine's own refusals
                    // (INVALID_ARGUMENT, NOT_FOUND, ALREADY_EXISTS) are
                    // the stored answer of the first application.
                    Verdict::Final
                        if may_have_applied
                            && matches!(
                                status.code(),
                                Code::ResourceExhausted | Code::Unimplemented
                            ) =>
                    {
                        return (
                            Err(convert::outcome_unknown(format!(
                                "an earlier attempt of the forwarded write may have applied; \
                                 the retry was refused: {}",
                                status.message()
                            ))),
                            true,
                        );
                    }
                    // Not marked answered: a refusal before the state
                    // machine (a limit, no Forward) created no session.
                    Verdict::Final => return (Err(status), may_have_applied),
                    Verdict::SessionExpired => return (Err(status), may_have_applied),
                    Verdict::MaybeApplied => {
                        may_have_applied = true;
                        last = status.message().to_string();
                    }
                    Verdict::NotWritten => last = status.message().to_string(),
                },
                None => {}
            }
            if let Some(metrics) = &self.metrics {
                metrics.forward_retry();
            }
            if Instant::now() + FORWARD_RETRY_PAUSE >= deadline {
                let status = if may_have_applied {
                    convert::outcome_unknown(format!(
                        "member {} forwarded the write to the leader and got no answer within \
                         {FORWARD_DEADLINE:?}: outcome unknown (last: {last})",
                        self.id
                    ))
                } else {
                    convert::status_with_detail(
                        Code::FailedPrecondition,
                        format!(
                            "member {} could not reach a leader within {FORWARD_DEADLINE:?} \
                             (last: {last}); nothing was written",
                            self.id
                        ),
                        Detail::NotLeader(NotLeader::default()),
                    )
                };
                return (Err(status), may_have_applied);
            }
            // Pause, or less if another leader becomes known meanwhile.
            let _ = tokio::time::timeout(FORWARD_RETRY_PAUSE, self.leader_other_than(leader)).await;
        }
    }

    /// Resolves once a leader other than `leader` is known, on the same
    /// view of the leader as [`Forwarder::leader`]'s (so it cannot hold at
    /// once after a look that found `leader`, and the pause cannot spin);
    /// never once openraft stopped.
    async fn leader_other_than(&self, leader: Option<u64>) {
        let mut metrics = self.raft.metrics();
        let changed = metrics
            .wait_for(|m| {
                let known = crate::raft::membership::known_leader(m);
                known.is_some() && known != leader
            })
            .await;
        if changed.is_err() {
            std::future::pending::<()>().await;
        }
    }

    /// The leader this member knows, and its address when another member.
    fn leader(&self) -> (Option<u64>, Option<crate::raft::types::NodeInfo>) {
        let metrics = self.raft.metrics();
        let m = metrics.borrow();
        let leader = crate::raft::membership::known_leader(&m);
        let node = leader.and_then(|l| m.membership_config.membership().get_node(&l).cloned());
        (leader, node)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_are_told_apart_from_maybe_applied() {
        assert_eq!(
            classify(&convert::not_leader(Some(2), None)),
            Verdict::NotWritten
        );
        assert_eq!(
            classify(&Status::failed_precondition("peer protocol mismatch")),
            Verdict::NotWritten
        );
        assert_eq!(
            classify(&convert::outcome_unknown("timed out")),
            Verdict::MaybeApplied
        );
        assert_eq!(
            classify(&Status::unavailable("connection reset")),
            Verdict::MaybeApplied
        );
        assert_eq!(
            classify(&Status::internal("h2 protocol error")),
            Verdict::MaybeApplied
        );
        assert_eq!(
            classify(&convert::limit_exceeded("ENTRY_SIZE_BYTES_MAX", 4, 5)),
            Verdict::Final
        );
        assert_eq!(classify(&Status::not_found("lease")), Verdict::Final);
        assert_eq!(
            classify(&Status::resource_exhausted("h2 ENHANCE_YOUR_CALM")),
            Verdict::MaybeApplied,
            "a transport's RESOURCE_EXHAUSTED names no limit"
        );
        assert_eq!(
            classify(&Status::permission_denied("h2 INADEQUATE_SECURITY")),
            Verdict::MaybeApplied
        );
        assert_eq!(
            classify(&Status::out_of_range("message too large")),
            Verdict::MaybeApplied
        );
        assert_eq!(
            classify(&Status::unimplemented("no Forward")),
            Verdict::Final
        );
    }
}
