//! Write forwarding: any member takes a front end's write (the Redis port
//! today, the etcd port next) and, when it does not lead, sends it to the
//! leader over the peer `Forward` RPC, which proposes it down the leader's
//! own write path ([`KvService::write_forwarded`]) and answers its outcome.
//! The native `Kv` port does not forward: kvclient routes to the leader.
//!
//! Exactly once: the member puts its own session ([`kvproto::session`], one
//! random client id per member start) on each forwarded write and keeps the
//! sequence for every attempt, so a retry after a lost answer, a timeout or
//! a new leader gets the first application's answer instead of applying
//! twice (the state machine's session table, DESIGN §3).
//!
//! Attempts: while a leader is known, the write goes to it (to this member
//! itself once it leads); a refusal that says nothing was written (not the
//! leader, an identity mismatch during a membership change, the leader's
//! in-flight cap) or a failure that may have applied (transport failure,
//! deadline, outcome unknown) is retried after [`FORWARD_RETRY_PAUSE`],
//! until [`FORWARD_DEADLINE`]. Any other answer is final. Giving up
//! answers outcome unknown if any attempt may have applied, else
//! FAILED_PRECONDITION with a `NotLeader` detail whose message says nothing
//! was written. SESSION_EXPIRED (the member's session was evicted while it
//! forwarded nothing for [`kvstate::command::SESSION_IDLE_MS_MAX`]) when no
//! earlier attempt may have applied runs the write once more under a fresh
//! session; after an attempt that may have applied it is outcome unknown.

use std::sync::Arc;
use std::time::Duration;

use kvproto::kv::v1::NotLeader;
use kvproto::kv::v1::error_detail::Detail;
use kvproto::session::{Sessions, Ticket};
use kvstate::command::{Answer, Write};
use tokio::time::Instant;
use tonic::{Code, Status};

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
/// The `LimitExceeded` name of the leader's in-flight cap
/// ([`crate::server::limits`]): refused before handling, nothing written.
const INFLIGHT_LIMIT: &str = "CLIENT_INFLIGHT_MAX";

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
        (Code::ResourceExhausted, Some(Detail::LimitExceeded(limit)))
            if limit.limit == INFLIGHT_LIMIT =>
        {
            Verdict::NotWritten
        }
        // Transport failures, deadlines, outcome unknown, a stopping
        // leader: the write may have been proposed.
        (
            Code::Unavailable
            | Code::DeadlineExceeded
            | Code::Cancelled
            | Code::Unknown
            | Code::Internal
            | Code::Aborted,
            _,
        ) => Verdict::MaybeApplied,
        _ => Verdict::Final,
    }
}

/// One member's forwarding: its session and the way to its leader.
#[derive(Clone)]
pub struct Forwarder {
    id: u64,
    raft: NodeRaft,
    network: Network,
    sessions: Arc<Sessions>,
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
            sessions: Arc::new(Sessions::new()),
            metrics,
        }
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
        let mut result = Err(Status::internal("no attempt"));
        for _ in 0..FORWARD_SESSION_ROUNDS_MAX {
            let ticket = self.sessions.begin();
            let (outcome, may_have_applied) =
                self.attempts(kv, &ticket, write.clone(), deadline).await;
            result = outcome;
            match &result {
                Err(status) if classify(status) == Verdict::SessionExpired => {
                    ticket.session_expired();
                    if may_have_applied {
                        break;
                    }
                }
                _ => break,
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
                    kv.write_forwarded(write.clone())
                        .await
                        .map(|answer| (answer, kv.applied_index())),
                ),
                (Some(leader), Some(node)) => Some(
                    self.network
                        .forward(leader, &node, &write, remaining.max(FORWARD_RETRY_PAUSE))
                        .await,
                ),
                _ => None,
            };
            match attempt {
                Some(Ok(answer)) => {
                    ticket.answered();
                    return (Ok(answer), may_have_applied);
                }
                Some(Err(status)) => match classify(&status) {
                    Verdict::Final => {
                        ticket.answered();
                        return (Err(status), may_have_applied);
                    }
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
            // Pause, or less if the leader changes meanwhile.
            let mut metrics = self.raft.metrics();
            let _ = tokio::time::timeout(
                FORWARD_RETRY_PAUSE,
                metrics.wait_for(|m| m.current_leader != leader && m.current_leader.is_some()),
            )
            .await;
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
        assert_eq!(
            classify(&convert::limit_exceeded(INFLIGHT_LIMIT, 4, 5)),
            Verdict::Final,
            "a limit on INVALID_ARGUMENT is final whatever its name"
        );
        assert_eq!(classify(&Status::not_found("lease")), Verdict::Final);
        assert_eq!(
            classify(&Status::unimplemented("no Forward")),
            Verdict::Final
        );
    }
}
