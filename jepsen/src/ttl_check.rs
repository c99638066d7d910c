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
//!   run's monotonic clock, more than [`TTL_BOUND_MS`] before the write's
//!   invocation plus its TTL: `read.complete_ns < write.invoke_ns + ttl -
//!   TTL_BOUND_MS` is flagged. The write's cluster time is stamped after
//!   its invocation and the expiring state is read before the read
//!   completes, and cluster time never runs ahead of real time (a new
//!   leader re-bases on the applied time at its term start), so a correct
//!   cluster never comes closer than the TTL itself.
//! - **Late expiry**: a linearizable read invoked more than `ttl +
//!   TTL_BOUND_MS` after the write was acknowledged, not counting the
//!   *leaderless time* in between, returns the value. Cluster time stops
//!   while there is no leader (and a new leader re-bases on the applied
//!   time, so that time is never made up), which delays every later
//!   expiry by as much; the harness cannot see leaders come and go, so
//!   every fault window that can cost the cluster its leader counts as
//!   leaderless, from its start to its stop plus [`ELECTION_ALLOWANCE`]
//!   (every fault but [`NOT_LEADERLESS`]). The time of those windows that
//!   overlaps [write invoked, read invoked] is added to the deadline. Past
//!   the deadline, expiry must be visible: kvnode proposes a tick entry
//!   every `TICK_INTERVAL` (250 ms) while a key may still expire, and a
//!   linearizable read sees every entry committed before it started.
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
//! linearizable read invoked more than `TTL + TTL_BOUND_MS` after the write
//! was acknowledged but inside the leaderless allowance is counted as
//! "late" (information only), and the report gives the largest lateness
//! seen outside leaderless time (`lateness_max_ms`, how close the run came
//! to the bound).

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;

use crate::workload::{Function, Op, Outcome, Phase, Record};

/// The TTL bound, both ways: a key must not be observed expired more than
/// this before its write's invocation plus its TTL (early expiry), nor read
/// present more than this after its write's acknowledgement plus its TTL
/// plus the leaderless time in between (late expiry). Four kvnode ticks
/// (`kvnode::node::TICK_INTERVAL`, 250 ms; jepsen does not link kvnode,
/// the value is documented in both places): expiry is applied by the first
/// entry (a write or a tick) stamped at or after the deadline, proposed
/// within a tick, plus commit and apply on a loaded two-core machine.
pub const TTL_BOUND_MS: u64 = 1000;
/// The bound as a duration.
pub const TTL_BOUND: Duration = Duration::from_millis(TTL_BOUND_MS);
/// Time after a fault's stop still counted as leaderless (late expiry):
/// above a kvnode failover (election timeout up to 3 s plus the leader
/// lease, about 5 s), since a healed member may still force an election.
pub const ELECTION_ALLOWANCE: Duration = Duration::from_secs(6);
/// Faults that never cost the cluster its leader: their windows are not
/// leaderless (`clock` moves only the wall clock; `restart-after-idle`
/// is a sequence whose steps — restarts, pauses, leader kills — are
/// recorded as faults of their own).
pub const NOT_LEADERLESS: [&str; 2] = ["clock", "restart-after-idle"];
/// Anomalies listed in full in the report (the count is always exact).
pub const ANOMALIES_LISTED_MAX: usize = 50;

/// The kind of a TTL anomaly.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum TtlAnomalyKind {
    /// The key was observed expired before its TTL (minus the bound) passed.
    EarlyExpiry,
    /// The key was read present after its TTL plus the bound plus the
    /// leaderless time passed.
    LateExpiry,
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
            Self::LateExpiry => "late-expiry",
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
    /// Present linearizable reads past the TTL plus the bound, inside the
    /// leaderless allowance (information only).
    pub late_reads: usize,
    /// The largest lateness of a present linearizable read beyond the TTL
    /// and the leaderless time (ms; late expiry when above
    /// [`TTL_BOUND_MS`]); `None` when no read came past the TTL.
    pub lateness_max_ms: Option<i64>,
    /// Leaderless windows counted (fault windows plus the allowance).
    pub leaderless_windows: usize,
    /// Their total length, merged, in ms.
    pub leaderless_ms: u64,
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
             {} expiry observations, {} late reads in leaderless allowance (info); bound {} ms, \
             largest lateness {}, {} leaderless windows ({:.1} s)\n",
            if self.valid { "VALID" } else { "NOT VALID" },
            self.keys_checked,
            self.keys_unchecked,
            self.keys_seen_expired,
            self.present_reads,
            self.expiry_observations,
            self.late_reads,
            TTL_BOUND_MS,
            self.lateness_max_ms
                .map_or("none".to_string(), |ms| format!("{ms} ms")),
            self.leaderless_windows,
            self.leaderless_ms as f64 / 1e3
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

/// The leaderless windows of a history, merged and sorted: each fault
/// window (not in [`NOT_LEADERLESS`]) from its start to its stop plus
/// [`ELECTION_ALLOWANCE`]; a fault never stopped lasts to the end.
pub fn leaderless_windows(records: &[Record]) -> Vec<(u64, u64)> {
    let allowance = u64::try_from(ELECTION_ALLOWANCE.as_nanos()).unwrap_or(u64::MAX);
    let mut open: BTreeMap<&str, u64> = BTreeMap::new();
    let mut windows = Vec::new();
    for record in records {
        let Record::Nemesis(event) = record else {
            continue;
        };
        if NOT_LEADERLESS.contains(&event.fault.as_str()) {
            continue;
        }
        match event.phase {
            Phase::Start => {
                open.insert(event.fault.as_str(), event.time_ns);
            }
            Phase::Stop => {
                if let Some(start) = open.remove(event.fault.as_str()) {
                    windows.push((start, event.time_ns.saturating_add(allowance)));
                }
            }
        }
    }
    windows.extend(open.into_values().map(|start| (start, u64::MAX)));
    windows.sort_unstable();
    let mut merged: Vec<(u64, u64)> = Vec::new();
    for (start, end) in windows {
        match merged.last_mut() {
            Some(last) if start <= last.1 => last.1 = last.1.max(end),
            _ => merged.push((start, end)),
        }
    }
    merged
}

/// Nanoseconds of the (merged) windows inside `from .. to`.
fn overlap_ns(windows: &[(u64, u64)], from: u64, to: u64) -> u64 {
    windows
        .iter()
        .map(|&(start, end)| end.min(to).saturating_sub(start.max(from)))
        .sum()
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
    let windows = leaderless_windows(records);
    report.leaderless_windows = windows.len();
    report.leaderless_ms = windows
        .iter()
        .map(|(start, end)| end.saturating_sub(*start) / 1_000_000)
        .sum();
    let bound_ns = u64::try_from(TTL_BOUND.as_nanos()).unwrap_or(u64::MAX);
    let mut anomalies = Vec::new();
    for (key, ops) in by_key {
        check_key(key, &ops, &windows, bound_ns, &mut report, &mut anomalies);
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

/// One checked key: its only write, acknowledged with a TTL, and what the
/// checks of its reads need.
struct KeyCheck<'a> {
    key: &'a str,
    write: &'a Op,
    value: &'a String,
    ttl_ms: u64,
    ttl_ns: u64,
    /// The write's log index (`version >> 16`).
    write_index: u64,
    /// The leaderless windows of the history.
    windows: &'a [(u64, u64)],
    /// [`TTL_BOUND`] in nanoseconds.
    bound_ns: u64,
}

/// Checks one key's operations (counts into `report`, anomalies into
/// `anomalies`); a key without exactly one acknowledged TTL write is
/// counted unchecked.
fn check_key<'a>(
    key: &'a str,
    ops: &[&'a Op],
    windows: &'a [(u64, u64)],
    bound_ns: u64,
    report: &mut TtlReport,
    anomalies: &mut Vec<TtlAnomaly>,
) {
    let writes: Vec<&Op> = ops
        .iter()
        .copied()
        .filter(|op| op.f == Function::Write)
        .collect();
    let [write] = writes.as_slice() else {
        report.keys_unchecked += 1;
        return;
    };
    let (Outcome::Ok, Some(ttl_ms), Some(version), Some(value)) = (
        write.outcome,
        write.ttl_ms,
        write.version,
        write.value.as_ref(),
    ) else {
        report.keys_unchecked += 1;
        return;
    };
    report.keys_checked += 1;
    let checked = KeyCheck {
        key,
        write,
        value,
        ttl_ms,
        ttl_ns: ttl_ms.saturating_mul(1_000_000),
        write_index: version >> 16,
        windows,
        bound_ns,
    };
    let reads: Vec<&Op> = ops
        .iter()
        .copied()
        .filter(|op| op.f == Function::Read && op.outcome == Outcome::Ok)
        .collect();
    let (observations, present) = checked.sort_reads(&reads, anomalies);
    report.present_reads += present.len();
    report.expiry_observations += observations.len();
    if !observations.is_empty() {
        report.keys_seen_expired += 1;
    }
    checked.check_early_expiry(&observations, anomalies);
    for read in &present {
        checked.check_late_expiry(read, report, anomalies);
        checked.check_resurrection(read, &observations, anomalies);
    }
}

impl<'a> KeyCheck<'a> {
    /// Splits the ok reads into observations of expiry and present reads
    /// (a read of another value is an unexpected value; an absent read
    /// that does not provably reflect the write is ignored).
    fn sort_reads(
        &self,
        reads: &[&'a Op],
        anomalies: &mut Vec<TtlAnomaly>,
    ) -> (Vec<&'a Op>, Vec<&'a Op>) {
        let (key, write, value) = (self.key, self.write, self.value);
        let mut observations: Vec<&Op> = Vec::new();
        let mut present: Vec<&Op> = Vec::new();
        for read in reads {
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
                        read.stale_min_index.unwrap_or(0) >= self.write_index
                    };
                    if proves {
                        observations.push(read);
                    }
                }
            }
        }
        (observations, present)
    }

    /// Early expiry: an observation completed more than the bound before
    /// the write's invocation plus its TTL.
    fn check_early_expiry(&self, observations: &[&Op], anomalies: &mut Vec<TtlAnomaly>) {
        let (key, write, ttl_ms) = (self.key, self.write, self.ttl_ms);
        let earliest_allowed = write
            .invoke_ns
            .saturating_add(self.ttl_ns)
            .saturating_sub(self.bound_ns);
        for seen in observations {
            if seen.complete_ns < earliest_allowed {
                anomalies.push(TtlAnomaly {
                    kind: TtlAnomalyKind::EarlyExpiry,
                    key: key.to_string(),
                    ops: vec![write.id, seen.id],
                    detail: format!(
                        "observed expired {:.3} s after the write was invoked; TTL {ttl_ms} ms, \
                         bound {TTL_BOUND_MS} ms",
                        (seen.complete_ns.saturating_sub(write.invoke_ns)) as f64 / 1e9,
                    ),
                });
            }
        }
    }

    /// Late expiry of one present read: a linearizable read past the TTL,
    /// the leaderless time and the bound (within the bound but past
    /// TTL + bound: a late read, counted); records the lateness.
    fn check_late_expiry(
        &self,
        read: &Op,
        report: &mut TtlReport,
        anomalies: &mut Vec<TtlAnomaly>,
    ) {
        let (key, write, ttl_ms, bound_ns) = (self.key, self.write, self.ttl_ms, self.bound_ns);
        let due_ns = write.complete_ns.saturating_add(self.ttl_ns);
        if is_linearizable(read) && read.invoke_ns > due_ns {
            let leaderless = overlap_ns(self.windows, write.invoke_ns, read.invoke_ns);
            let lateness_ns =
                i128::from(read.invoke_ns) - i128::from(due_ns) - i128::from(leaderless);
            let lateness_ms = i64::try_from(lateness_ns / 1_000_000).unwrap_or(i64::MAX);
            report.lateness_max_ms = Some(
                report
                    .lateness_max_ms
                    .map_or(lateness_ms, |m| m.max(lateness_ms)),
            );
            if lateness_ns > i128::from(bound_ns) {
                anomalies.push(TtlAnomaly {
                    kind: TtlAnomalyKind::LateExpiry,
                    key: key.to_string(),
                    ops: vec![write.id, read.id],
                    detail: format!(
                        "read present {:.3} s after the write was acknowledged; TTL \
                         {ttl_ms} ms, leaderless time in between {:.3} s, bound \
                         {TTL_BOUND_MS} ms",
                        (read.invoke_ns - write.complete_ns) as f64 / 1e9,
                        leaderless as f64 / 1e9
                    ),
                });
            } else if read.invoke_ns > due_ns.saturating_add(bound_ns) {
                report.late_reads += 1;
            }
        }
    }

    /// Resurrection of one present read: after an observation of expiry
    /// in real time (linearizable reads) or by applied index (stale reads).
    fn check_resurrection(&self, read: &Op, observations: &[&Op], anomalies: &mut Vec<TtlAnomaly>) {
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
                key: self.key.to_string(),
                ops: vec![self.write.id, seen.id, read.id],
                detail: format!("{how} returned the value again"),
            });
        }
    }
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
            revision: None,
            mod_revision: None,
            expected_mod_revision: None,
            error: None,
            invoke_wall_us: at_ms.0 * 1000,
            invoke_ns: at_ms.0 * MS,
            complete_wall_us: at_ms.1 * 1000,
            complete_ns: at_ms.1 * MS,
            ttl_ms: None,
            stale_min_index: None,
            member: None,
            versions: None,
            final_read: false,
            found: None,
            watch: None,
            lease: None,
            expected: None,
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
        // Absent 0.9 s after the write with a 2 s TTL (bound 1 s).
        let report = run(vec![write(), read(2, None, (800, 900), 7)]);
        assert_eq!(kinds(&report), vec![TtlAnomalyKind::EarlyExpiry]);
        // The same by a stale read that had applied the write.
        let report = run(vec![write(), stale(read(2, None, (800, 900), 7), 5)]);
        assert_eq!(kinds(&report), vec![TtlAnomalyKind::EarlyExpiry]);
        // Within the bound: fine.
        let report = run(vec![write(), read(2, None, (1700, 1800), 7)]);
        assert!(report.valid, "{}", report.summary());
    }

    fn fault(fault: &str, phase: Phase, at_ms: u64) -> Record {
        Record::Nemesis(crate::workload::NemesisEvent {
            fault: fault.to_string(),
            phase,
            detail: String::new(),
            wall_us: at_ms * 1000,
            time_ns: at_ms * MS,
        })
    }

    #[test]
    fn a_late_expiry_is_flagged_outside_leaderless_time() {
        // Present 3.5 s after the ack of a 2 s TTL (bound 1 s): late.
        let report = run(vec![write(), read(2, Some("v"), (3510, 3520), 9)]);
        assert_eq!(kinds(&report), vec![TtlAnomalyKind::LateExpiry]);
        assert_eq!(report.lateness_max_ms, Some(1500));
        // Within the bound: fine.
        let report = run(vec![write(), read(2, Some("v"), (2900, 2910), 9)]);
        assert!(report.valid, "{}", report.summary());
        // A stale read may lag: never late.
        let report = run(vec![write(), stale(read(2, Some("v"), (3510, 3520), 9), 0)]);
        assert!(report.valid, "{}", report.summary());
    }

    #[test]
    fn leaderless_time_delays_the_late_deadline() {
        // A kill-leader window from 500 to 1000 ms: leaderless 500 ms +
        // ELECTION_ALLOWANCE, so a read at 3.5 s is not late ...
        let history = vec![
            Record::Op(write()),
            fault("kill-leader", Phase::Start, 500),
            fault("kill-leader", Phase::Stop, 1000),
            Record::Op(read(2, Some("v"), (3510, 3520), 9)),
        ];
        let report = check(&history);
        assert!(report.valid, "{}", report.summary());
        assert_eq!(report.leaderless_windows, 1);
        // ... but one well past the allowance is.
        let mut later = history.clone();
        later.push(Record::Op(read(3, Some("v"), (11_000, 11_010), 9)));
        let report = check(&later);
        assert_eq!(kinds(&report), vec![TtlAnomalyKind::LateExpiry]);
        // A clock window is not leaderless.
        let clock = vec![
            Record::Op(write()),
            fault("clock", Phase::Start, 500),
            fault("clock", Phase::Stop, 1000),
            Record::Op(read(2, Some("v"), (3510, 3520), 9)),
        ];
        assert_eq!(kinds(&check(&clock)), vec![TtlAnomalyKind::LateExpiry]);
    }

    #[test]
    fn leaderless_windows_merge_and_run_to_the_end_when_unhealed() {
        let history = vec![
            fault("kill", Phase::Start, 0),
            fault("restart-after-idle", Phase::Start, 100),
            fault("kill", Phase::Stop, 1000),
            fault("partition-leader", Phase::Start, 2000),
            fault("partition-leader", Phase::Stop, 3000),
            fault("membership", Phase::Start, 20_000),
        ];
        let windows = leaderless_windows(&history);
        let allowance = ELECTION_ALLOWANCE.as_nanos() as u64;
        assert_eq!(
            windows,
            vec![(0, 3000 * MS + allowance), (20_000 * MS, u64::MAX)]
        );
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
