//! The TTL checker: judges a `ttl` workload history (keys written once with
//! a time to live, read linearizably and stale from pinned members).
//!
//! kvnode expires a key when the cluster time of the applied state reaches
//! the write's cluster time plus its TTL. The cluster time is stamped by the
//! leader from its monotonic clock, rebased onto the replicated time after
//! a leader change, and never decreases along the log; it never advances
//! faster than the machine's monotonic clock (which libfaketime leaves
//! alone: `DONT_FAKE_MONOTONIC=1`). So, per key:
//!
//! - **An observation of expiry** is an ok read that returned the key
//!   absent while it provably reflected the write: a linearizable read
//!   invoked after the write was acknowledged, or a stale read whose
//!   `min_index` is at or above the write's log index (`version >> 16`).
//!   Other absent reads (a stale read of a member that may not have applied
//!   the write yet) prove nothing and are ignored.
//! - **Early expiry**: an observation of expiry that completed, on the
//!   run's monotonic clock, less than `TTL - TICK_SLACK` after the write
//!   was invoked. Exact bound: `read.complete_ns < write.invoke_ns + ttl -
//!   TICK_SLACK` is flagged, with [`TICK_SLACK`] = kvnode's cluster-time
//!   tick (`kvnode::node::TICK_INTERVAL`, 250 ms). The write's cluster time
//!   is stamped after its invocation and the expiring state is read before
//!   the read completes, so a correct cluster never comes closer than the
//!   TTL itself; the slack only absorbs millisecond rounding and keeps the
//!   check the brief's "never early by more than one tick".
//! - **Resurrection**: once expiry was observed, the key must not be read
//!   back: (a) a linearizable read invoked after an observation of expiry
//!   completed returns the value (real-time order), or (b) a stale read
//!   returns the value although its `min_index` is at or above the applied
//!   index an observation of expiry reported (the member had applied at
//!   least as much as the state that showed the key expired; cluster time
//!   never decreases along the log). The reported index of a read is taken
//!   after the state was read, so it is an upper bound of that state, and
//!   `min_index` is a lower bound of the other read's state: (b) never
//!   flags a correct cluster.
//! - **Unexpected value**: a read returned a value other than the one
//!   written (keys are written once, with unique values).
//!
//! Keys whose write is not acknowledged (fail / unknown) or that were
//! written more than once are left unchecked and counted. A present
//! linearizable read invoked more than `TTL + LATE_NOTE_SLACK` after the
//! write was acknowledged is counted as "late" (information only: a cluster
//! without a leader stops its cluster time, which delays expiry, and that is
//! allowed).

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;

use crate::workload::{Function, Op, Outcome, Record};

/// The slack of the early-expiry check: kvnode's cluster-time tick
/// (`kvnode::node::TICK_INTERVAL`; jepsen does not link kvnode, a unit test
/// of kvnode's crate is not needed: the value is documented in both places).
pub const TICK_SLACK: Duration = Duration::from_millis(250);
/// How long past its TTL a key may still be read before the read counts as
/// "late" in the report (information only, never an anomaly).
pub const LATE_NOTE_SLACK: Duration = Duration::from_secs(2);
/// Anomalies listed in full in the report (the count is always exact).
pub const ANOMALIES_LISTED_MAX: usize = 50;

/// The kind of a TTL anomaly.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum TtlAnomalyKind {
    /// The key was observed expired before its TTL (minus the tick) passed.
    EarlyExpiry,
    /// The key was read back after an observation of its expiry.
    Resurrection,
    /// A read returned a value nobody wrote to this key.
    UnexpectedValue,
}

impl TtlAnomalyKind {
    /// The kind's name in reports.
    pub fn name(self) -> &'static str {
        match self {
            Self::EarlyExpiry => "early-expiry",
            Self::Resurrection => "resurrection",
            Self::UnexpectedValue => "unexpected-value",
        }
    }
}

/// One anomaly, with the operations involved.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TtlAnomaly {
    /// What kind.
    pub kind: TtlAnomalyKind,
    /// The key.
    pub key: String,
    /// Ids of the operations involved (write, observation, offending read).
    pub ops: Vec<u64>,
    /// A sentence with the numbers.
    pub detail: String,
}

/// The TTL checker's report.
#[derive(Debug, Clone, Default, Serialize)]
pub struct TtlReport {
    /// True when no anomaly was found.
    pub valid: bool,
    /// Keys with one acknowledged TTL write (the checked ones).
    pub keys_checked: usize,
    /// Keys left unchecked (write not acknowledged, or written twice).
    pub keys_unchecked: usize,
    /// Checked keys observed expired at least once.
    pub keys_seen_expired: usize,
    /// Ok reads that returned a checked key present.
    pub present_reads: usize,
    /// Ok reads that observed a checked key expired.
    pub expiry_observations: usize,
    /// Present linearizable reads well past the TTL (information only).
    pub late_reads: usize,
    /// Anomalies found, by kind name.
    pub anomalies_by_kind: BTreeMap<String, usize>,
    /// The first [`ANOMALIES_LISTED_MAX`] anomalies.
    pub anomalies: Vec<TtlAnomaly>,
}

impl TtlReport {
    /// Exit code in the `jepsen check` convention: 0 valid, 1 not.
    pub fn exit_code(&self) -> i32 {
        if self.valid { 0 } else { 1 }
    }

    /// All anomalies, counted.
    pub fn anomaly_count(&self) -> usize {
        self.anomalies_by_kind.values().sum()
    }

    /// A short human verdict.
    pub fn summary(&self) -> String {
        let mut out = format!(
            "ttl: {}: {} keys checked ({} unchecked), {} seen expired; {} present reads, \
             {} expiry observations, {} late reads (info)\n",
            if self.valid { "VALID" } else { "NOT VALID" },
            self.keys_checked,
            self.keys_unchecked,
            self.keys_seen_expired,
            self.present_reads,
            self.expiry_observations,
            self.late_reads
        );
        for (kind, count) in &self.anomalies_by_kind {
            out.push_str(&format!("  {kind}: {count}\n"));
        }
        for anomaly in self.anomalies.iter().take(10) {
            out.push_str(&format!(
                "  {} {}: {} (ops {:?})\n",
                anomaly.kind.name(),
                anomaly.key,
                anomaly.detail,
                anomaly.ops
            ));
        }
        out
    }
}

/// Whether a read is linearizable (a stale read carries its `min_index`).
fn is_linearizable(read: &Op) -> bool {
    read.stale_min_index.is_none()
}

/// Checks a `ttl` workload history.
pub fn check(records: &[Record]) -> TtlReport {
    let mut by_key: BTreeMap<&str, Vec<&Op>> = BTreeMap::new();
    for record in records {
        if let Record::Op(op) = record {
            by_key.entry(op.key.as_str()).or_default().push(op);
        }
    }
    let mut report = TtlReport::default();
    let mut anomalies = Vec::new();
    for (key, ops) in by_key {
        let writes: Vec<&Op> = ops
            .iter()
            .copied()
            .filter(|op| op.f == Function::Write)
            .collect();
        let [write] = writes.as_slice() else {
            report.keys_unchecked += 1;
            continue;
        };
        let (Outcome::Ok, Some(ttl_ms), Some(version), Some(value)) = (
            write.outcome,
            write.ttl_ms,
            write.version,
            write.value.as_ref(),
        ) else {
            report.keys_unchecked += 1;
            continue;
        };
        report.keys_checked += 1;
        let write_index = version >> 16;
        let ttl_ns = ttl_ms.saturating_mul(1_000_000);
        let reads: Vec<&Op> = ops
            .iter()
            .copied()
            .filter(|op| op.f == Function::Read && op.outcome == Outcome::Ok)
            .collect();
        let mut observations: Vec<&Op> = Vec::new();
        let mut present: Vec<&Op> = Vec::new();
        for read in &reads {
            match &read.value {
                Some(v) if v == value => present.push(read),
                Some(v) => anomalies.push(TtlAnomaly {
                    kind: TtlAnomalyKind::UnexpectedValue,
                    key: key.to_string(),
                    ops: vec![write.id, read.id],
                    detail: format!("read {v:?}, the only write wrote {value:?}"),
                }),
                None => {
                    let proves = if is_linearizable(read) {
                        read.invoke_ns >= write.complete_ns
                    } else {
                        read.stale_min_index.unwrap_or(0) >= write_index
                    };
                    if proves {
                        observations.push(read);
                    }
                }
            }
        }
        report.present_reads += present.len();
        report.expiry_observations += observations.len();
        if !observations.is_empty() {
            report.keys_seen_expired += 1;
        }
        let slack_ns = u64::try_from(TICK_SLACK.as_nanos()).unwrap_or(u64::MAX);
        let earliest_allowed = write
            .invoke_ns
            .saturating_add(ttl_ns)
            .saturating_sub(slack_ns);
        for seen in &observations {
            if seen.complete_ns < earliest_allowed {
                anomalies.push(TtlAnomaly {
                    kind: TtlAnomalyKind::EarlyExpiry,
                    key: key.to_string(),
                    ops: vec![write.id, seen.id],
                    detail: format!(
                        "observed expired {:.3} s after the write was invoked; TTL {ttl_ms} ms, \
                         slack {} ms",
                        (seen.complete_ns.saturating_sub(write.invoke_ns)) as f64 / 1e9,
                        TICK_SLACK.as_millis()
                    ),
                });
            }
        }
        let late_ns = write
            .complete_ns
            .saturating_add(ttl_ns)
            .saturating_add(u64::try_from(LATE_NOTE_SLACK.as_nanos()).unwrap_or(u64::MAX));
        for read in &present {
            if is_linearizable(read) && read.invoke_ns > late_ns {
                report.late_reads += 1;
            }
            let by_time = if is_linearizable(read) {
                observations
                    .iter()
                    .find(|seen| seen.complete_ns < read.invoke_ns)
            } else {
                None
            };
            let by_index = read.stale_min_index.and_then(|min_index| {
                observations
                    .iter()
                    .find(|seen| seen.index.is_some_and(|i| i <= min_index))
            });
            if let Some(seen) = by_time.or(by_index) {
                let how = if by_time.is_some() {
                    format!(
                        "a linearizable read invoked at +{:.3} s after expiry was observed at \
                         +{:.3} s",
                        read.invoke_ns as f64 / 1e9,
                        seen.complete_ns as f64 / 1e9
                    )
                } else {
                    format!(
                        "a stale read with min_index {} after expiry was observed at applied \
                         index {}",
                        read.stale_min_index.unwrap_or(0),
                        seen.index.unwrap_or(0)
                    )
                };
                anomalies.push(TtlAnomaly {
                    kind: TtlAnomalyKind::Resurrection,
                    key: key.to_string(),
                    ops: vec![write.id, seen.id, read.id],
                    detail: format!("{how} returned the value again"),
                });
            }
        }
    }
    for anomaly in &anomalies {
        *report
            .anomalies_by_kind
            .entry(anomaly.kind.name().to_string())
            .or_default() += 1;
    }
    report.valid = anomalies.is_empty();
    anomalies.truncate(ANOMALIES_LISTED_MAX);
    report.anomalies = anomalies;
    report
}

/// Keys a TTL run must see expired to prove anything.
pub const KEYS_SEEN_EXPIRED_MIN: usize = 1;

/// What a TTL run lacked to count (item 7 of the fault suite): no key
/// observed expired, or no key read present.
pub fn shortfalls(report: &TtlReport) -> Vec<String> {
    let mut problems = Vec::new();
    if report.keys_seen_expired < KEYS_SEEN_EXPIRED_MIN {
        problems.push(format!(
            "{} keys observed expired, fewer than KEYS_SEEN_EXPIRED_MIN ({KEYS_SEEN_EXPIRED_MIN})",
            report.keys_seen_expired
        ));
    }
    if report.present_reads == 0 {
        problems.push("no TTL key was read present".to_string());
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn op(id: u64, f: Function, key: &str, value: Option<&str>, at_ms: (u64, u64)) -> Op {
        Op {
            id,
            process: id,
            f,
            key: key.to_string(),
            value: value.map(str::to_string),
            expected_version: None,
            values: None,
            outcome: Outcome::Ok,
            version: None,
            index: None,
            error: None,
            invoke_wall_us: at_ms.0 * 1000,
            invoke_ns: at_ms.0 * MS,
            complete_wall_us: at_ms.1 * 1000,
            complete_ns: at_ms.1 * MS,
            ttl_ms: None,
            stale_min_index: None,
            member: None,
        }
    }

    /// `k` written at 0..10 ms with a 2 s TTL at log index 5.
    fn write() -> Op {
        let mut w = op(1, Function::Write, "k", Some("v"), (0, 10));
        w.ttl_ms = Some(2000);
        w.version = Some(5 << 16);
        w.index = Some(5);
        w
    }

    fn read(id: u64, value: Option<&str>, at_ms: (u64, u64), index: u64) -> Op {
        let mut r = op(id, Function::Read, "k", value, at_ms);
        r.index = Some(index);
        r
    }

    fn stale(mut r: Op, min_index: u64) -> Op {
        r.stale_min_index = Some(min_index);
        r
    }

    fn run(ops: Vec<Op>) -> TtlReport {
        check(&ops.into_iter().map(Record::Op).collect::<Vec<_>>())
    }

    fn kinds(report: &TtlReport) -> Vec<TtlAnomalyKind> {
        report.anomalies.iter().map(|a| a.kind).collect()
    }

    #[test]
    fn a_correct_history_is_valid() {
        let report = run(vec![
            write(),
            read(2, Some("v"), (100, 110), 6),
            stale(read(3, Some("v"), (1900, 1910), 7), 6),
            read(4, None, (2100, 2110), 9),
            // A stale read of a lagging member (min_index below the
            // observation's index) may still see the key.
            stale(read(5, Some("v"), (2200, 2210), 8), 6),
            // A stale absent read below the write's index proves nothing.
            stale(read(6, None, (50, 60), 4), 0),
        ]);
        assert!(report.valid, "{}", report.summary());
        assert_eq!(report.keys_checked, 1);
        assert_eq!(report.keys_seen_expired, 1);
        assert_eq!(report.expiry_observations, 1);
        assert_eq!(report.present_reads, 3);
    }

    #[test]
    fn an_early_expiry_is_flagged() {
        // Absent 1.5 s after the write with a 2 s TTL (slack 0.25 s).
        let report = run(vec![write(), read(2, None, (1400, 1500), 7)]);
        assert_eq!(kinds(&report), vec![TtlAnomalyKind::EarlyExpiry]);
        // The same by a stale read that had applied the write.
        let report = run(vec![write(), stale(read(2, None, (1400, 1500), 7), 5)]);
        assert_eq!(kinds(&report), vec![TtlAnomalyKind::EarlyExpiry]);
        // Within the slack: fine.
        let report = run(vec![write(), read(2, None, (1700, 1800), 7)]);
        assert!(report.valid, "{}", report.summary());
    }

    #[test]
    fn a_resurrection_in_real_time_is_flagged() {
        let report = run(vec![
            write(),
            stale(read(2, None, (2100, 2110), 9), 5),
            read(3, Some("v"), (2200, 2210), 10),
        ]);
        assert_eq!(kinds(&report), vec![TtlAnomalyKind::Resurrection]);
        // Overlapping reads are not ordered: no anomaly.
        let report = run(vec![
            write(),
            stale(read(2, None, (2100, 2300), 9), 5),
            read(3, Some("v"), (2200, 2210), 10),
        ]);
        assert!(report.valid, "{}", report.summary());
    }

    #[test]
    fn a_resurrection_by_index_is_flagged() {
        // Expired at applied index 9; a stale read that had applied at
        // least index 9 sees it again.
        let report = run(vec![
            write(),
            read(2, None, (2100, 2110), 9),
            stale(read(3, Some("v"), (2200, 2210), 12), 9),
        ]);
        assert_eq!(kinds(&report), vec![TtlAnomalyKind::Resurrection]);
    }

    #[test]
    fn an_unexpected_value_and_unchecked_keys_are_reported() {
        let mut failed = op(7, Function::Write, "j", Some("x"), (0, 10));
        failed.outcome = Outcome::Info;
        let report = run(vec![write(), read(2, Some("w"), (100, 110), 6), failed]);
        assert_eq!(kinds(&report), vec![TtlAnomalyKind::UnexpectedValue]);
        assert_eq!(report.keys_unchecked, 1);
    }
}
