//! The leader's cluster clock: the time a leader stamps on every proposal
//! (TTL expiry, session eviction), continuing from the applied cluster time
//! in each term it leads (ARCHITECTURE.md, "Cluster time").

use std::sync::Mutex;
use std::time::Instant;

use crate::state_machine::StateMachine;

/// Most that cluster time may advance between two entries beyond the
/// real time between their proposals, from rounding (ARCHITECTURE.md,
/// "Cluster time": the rule and its proof). A leader's monotonic clock may
/// also run fast by its slew rate (at most 500 ppm under NTP).
pub const CLUSTER_TIME_STEP_BOUND_MS: u64 = 1;

/// The leader's cluster clock. In each term this member leads, it starts
/// from the cluster time applied when the term's first proposal is stamped
/// (the leader has then applied every entry of earlier terms, see
/// [`crate::raft::propose::leader_caught_up`]) and advances with this process's monotonic clock.
/// So time between two entries never runs ahead of the real time between
/// their proposals (plus [`CLUSTER_TIME_STEP_BOUND_MS`]); across a
/// leaderless gap it stands still. It never jumps by time this member spent
/// as a follower or idle, which a base taken at process start would carry.
pub(crate) struct ClusterClock {
    /// The cluster time this member has applied.
    applied_ms: Box<dyn Fn() -> u64 + Send + Sync>,
    inner: Mutex<ClockState>,
}

impl std::fmt::Debug for ClusterClock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterClock")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

#[derive(Debug)]
struct ClockState {
    /// The term the base was taken in (`None`: no stamp yet).
    term: Option<u64>,
    /// The cluster time applied when the base was taken.
    base_ms: u64,
    /// When the base was taken.
    at: Instant,
    /// The last stamp given in this term (stamps never decrease).
    last_ms: u64,
}

impl ClusterClock {
    pub(crate) fn new(state_machine: StateMachine) -> ClusterClock {
        ClusterClock::with_source(
            Box::new(move || state_machine.cluster_time_ms()),
            Instant::now(),
        )
    }

    /// A clock over any source of the applied time, created at `now`.
    fn with_source(applied_ms: Box<dyn Fn() -> u64 + Send + Sync>, now: Instant) -> ClusterClock {
        let applied = applied_ms();
        ClusterClock {
            applied_ms,
            inner: Mutex::new(ClockState {
                // NEGATIVE CONTROL (feature nc-old-clock): the base is the
                // time applied at process start, in every term.
                term: cfg!(feature = "nc-old-clock").then_some(0),
                base_ms: applied,
                at: now,
                last_ms: 0,
            }),
        }
    }

    /// The time of a proposal of `term`, by a leader that has applied an
    /// entry of `term` (its blank entry).
    pub(crate) fn stamp(&self, term: u64) -> u64 {
        self.stamp_at(term, Instant::now())
    }

    /// [`ClusterClock::stamp`] at the instant `now`.
    fn stamp_at(&self, term: u64, now_instant: Instant) -> u64 {
        let applied = (self.applied_ms)();
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let term = if cfg!(feature = "nc-old-clock") {
            0
        } else {
            term
        };
        if inner.term != Some(term) {
            *inner = ClockState {
                term: Some(term),
                base_ms: applied,
                at: now_instant,
                last_ms: applied,
            };
        }
        let elapsed = now_instant.saturating_duration_since(inner.at);
        let elapsed_ms = u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX);
        let mut now = inner.base_ms.saturating_add(elapsed_ms);
        if applied > now {
            // Only the old clock gets here (in a term, every applied entry
            // was stamped by this clock or came before its base).
            inner.base_ms = applied;
            inner.at = now_instant;
            now = applied;
        }
        let stamp = now.max(inner.last_ms);
        inner.last_ms = stamp;
        stamp
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::Duration;

    use super::*;

    fn clock(applied: &Arc<AtomicU64>, start: Instant) -> ClusterClock {
        let source = applied.clone();
        ClusterClock::with_source(Box::new(move || source.load(Ordering::SeqCst)), start)
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// Issue 15's first finding, replayed on one member's clock: the member
    /// started when the cluster time was 1 000, then followed through 40 s
    /// in which the cluster time advanced only 5 s (a leaderless gap, and
    /// leaders whose clocks lagged). When it becomes leader, its first stamp
    /// must continue from the applied time, not jump by the 35 s it spent
    /// as a follower. Fails with `nc-old-clock` (which stamps 41 000).
    #[test]
    fn a_new_leader_continues_from_the_applied_time() {
        let start = Instant::now();
        let applied = Arc::new(AtomicU64::new(1_000));
        let clock = clock(&applied, start);
        applied.store(6_000, Ordering::SeqCst);
        let first = clock.stamp_at(7, start + ms(40_000));
        assert_eq!(first, 6_000, "re-based on the applied time at term start");
        // Within the term it advances with real time.
        assert_eq!(clock.stamp_at(7, start + ms(40_250)), 6_250);
        assert_eq!(clock.stamp_at(7, start + ms(41_000)), 7_000);
    }

    /// A member that led term 3, lost leadership while its last stamps were
    /// not committed, and leads term 5 later continues from what was
    /// applied, not from its own old stamps or its old base.
    #[test]
    fn every_term_re_bases() {
        let start = Instant::now();
        let applied = Arc::new(AtomicU64::new(0));
        let clock = clock(&applied, start);
        assert_eq!(clock.stamp_at(3, start), 0);
        assert_eq!(clock.stamp_at(3, start + ms(5_000)), 5_000);
        // Term 4 (another leader) applied up to 2 000 more than what this
        // member saw committed (4 000 of its own), over 30 s.
        applied.store(6_000, Ordering::SeqCst);
        assert_eq!(clock.stamp_at(5, start + ms(35_000)), 6_000);
        assert_eq!(clock.stamp_at(5, start + ms(35_100)), 6_100);
    }

    /// Stamps of one term never decrease, and never run ahead of real time.
    #[test]
    fn stamps_follow_real_time_and_never_decrease() {
        let start = Instant::now();
        let applied = Arc::new(AtomicU64::new(500));
        let clock = clock(&applied, start);
        let mut last = 0;
        for step in 0..100u64 {
            let at = start + ms(step * 7);
            let stamp = clock.stamp_at(2, at);
            assert!(stamp >= last, "stamps decreased: {last} then {stamp}");
            assert!(stamp <= 500 + step * 7, "ran ahead of real time: {stamp}");
            last = stamp;
        }
        // An instant from before the base (two proposals stamped on two
        // threads): no step back.
        assert_eq!(clock.stamp_at(2, start), last);
    }
}
