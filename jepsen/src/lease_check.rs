//! The lease checker: judges a `lease` workload history
//! ([`crate::workload::lease`]). Each lease is granted once (a TTL `T`,
//! the one the grant answered), its keys `l/<n>/<k>` are attached by puts
//! of unique values, it is kept alive by keep-alives, and then revoked or
//! left to expire; linearizable range reads over a lease's prefix see its
//! keys at one revision; watchers record every delete.
//!
//! kvnode's promises (`kvproto::LEASE_EARLY_BOUND_MS`,
//! `kvproto::LEASE_LATE_BOUND_MS`, ARCHITECTURE.md "Leases"): a lease
//! never expires before `T − early bound` after its last acknowledged
//! keep-alive (or its grant) was **sent**; once nothing renews it, it
//! expires within `T + late bound` of its last renewal, outside leaderless
//! periods; a new leader renews every lease; revoke and expiry delete all
//! of a lease's keys at one revision. Per lease:
//!
//! - **An observation of expiry**: a keep-alive answered with TTL 0 (the
//!   lease is gone), or a linearizable read of the lease's prefix that
//!   found none of its keys although at least one attach was acknowledged
//!   before the read was invoked; unless a revoke of the lease (not
//!   definitely failed) was invoked before it completed. The lease was
//!   gone at some instant before the observation completed.
//! - **early-expiry**: an observation that completed before `s + T −
//!   early bound − slack`, where `s` is the latest send of an
//!   acknowledged renewal (the grant's invoke, or a keep-alive answered
//!   with a TTL above 0: kvclient's `LeaseRenewal::sent` of the attempt
//!   answered, else its invoke) at or before it. Every measurement errs
//!   in the server's favour: `s` is taken before the request is sent, the observation's
//!   completion after the state it shows was read, and the harness and
//!   every member read one system-wide monotonic clock.
//! - **late-expiry**: a linearizable read invoked at `t` found a key of the
//!   lease present although `t > r + T + late bound + slack`, where `r` is
//!   the latest completion of a renewal that may have applied (the grant,
//!   keep-alives acknowledged with a TTL or of unknown outcome) invoked
//!   before `t` — a renewal still running at `t` puts `r` at `t` — moved
//!   to the end of every leaderless window (fault windows plus
//!   [`crate::ttl_check::ELECTION_ALLOWANCE`], [`leaderless_windows`])
//!   that started before `t` and ended after `r`: a new leader renews every
//!   lease at its first entry, and cluster time stands still until then.
//! - **partial-revoke**: a linearizable read found some keys of the lease
//!   and not another whose attach was acknowledged before the read was
//!   invoked (a revoke or expiry seen half done; the workload never
//!   deletes a lease key otherwise).
//! - **present-after-revoke**: a key read present by a read invoked after
//!   an acknowledged revoke of its lease completed.
//! - **resurrection**: after an observation of expiry completed, a read
//!   invoked later finds a key of the lease, or a keep-alive invoked
//!   later is answered with a TTL above 0.
//! - **unexpected-value**: a read found a key with a value its attach did
//!   not write, or a key whose attach definitely failed or was invoked
//!   after the read completed.
//! - **revoke-split** (watchers): the delete events of one lease's keys,
//!   over every watcher, and the revision an acknowledged revoke that
//!   deleted keys answered, are not all one revision.
//!
//! Leases whose grant is not acknowledged are left unchecked (their id is
//! not known, so nothing was attached). Stale reads are not judged (the
//! workload's reads are all linearizable).

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

pub use crate::ttl_check::leaderless_windows;
use crate::workload::lease::{lease_of_key, lease_prefix};
use crate::workload::{EventKind, Function, Op, Outcome, Record};

/// kvnode's early bound: a lease never expires before its TTL minus this
/// (ms) after its last acknowledged keep-alive was sent.
pub const EARLY_BOUND_MS: u64 = kvclient::kvproto::LEASE_EARLY_BOUND_MS;
/// kvnode's late bound: once nothing renews a lease, it expires within its
/// TTL plus this (ms) of its last renewal, outside leaderless periods.
pub const LATE_BOUND_MS: u64 = kvclient::kvproto::LEASE_LATE_BOUND_MS;
/// The checker's margin on top of both bounds (ms). The early argument
/// needs none — every time it compares errs in the server's favour (a
/// send is stamped before the request leaves, an observation after its
/// answer arrived, on one monotonic clock shared by the harness and the
/// members) — but the two ends are taken in different processes on a
/// loaded two-core host, and TTLs and cluster time are whole
/// milliseconds; this covers that rounding and any cost of the
/// measurement itself the argument missed, and is 2.5 % of the shortest
/// TTL kvnode grants (`LEASE_TTL_MS_MIN`, 2 s), so a lease that loses a
/// renewal (expiring a keep-alive period or more early) is still caught.
pub const MEASUREMENT_SLACK_MS: u64 = 50;
/// Anomalies listed in full in the report (the count is always exact).
pub const ANOMALIES_LISTED_MAX: usize = 50;

const MS: u64 = 1_000_000;

/// The kind of a lease anomaly.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum LeaseAnomalyKind {
    /// Gone before its TTL (less the bounds) after the last acknowledged
    /// renewal was sent.
    EarlyExpiry,
    /// A key read present past TTL + bound after the last renewal, outside
    /// leaderless time.
    LateExpiry,
    /// Some keys of one lease present and others, acknowledged, absent in
    /// one read.
    PartialRevoke,
    /// A key read present after its lease's revoke was acknowledged.
    PresentAfterRevoke,
    /// The lease alive again after it was observed gone.
    Resurrection,
    /// A key read with a value nobody wrote to it.
    UnexpectedValue,
    /// A lease's keys deleted at more than one revision.
    RevokeSplit,
}

impl LeaseAnomalyKind {
    /// Every kind, in report order.
    pub const ALL: [Self; 7] = [
        Self::EarlyExpiry,
        Self::LateExpiry,
        Self::PartialRevoke,
        Self::PresentAfterRevoke,
        Self::Resurrection,
        Self::UnexpectedValue,
        Self::RevokeSplit,
    ];

    /// The kind's name in reports.
    pub fn name(self) -> &'static str {
        match self {
            Self::EarlyExpiry => "early-expiry",
            Self::LateExpiry => "late-expiry",
            Self::PartialRevoke => "partial-revoke",
            Self::PresentAfterRevoke => "present-after-revoke",
            Self::Resurrection => "resurrection",
            Self::UnexpectedValue => "unexpected-value",
            Self::RevokeSplit => "revoke-split",
        }
    }
}

/// One anomaly, with the operations involved.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LeaseAnomaly {
    /// What kind.
    pub kind: LeaseAnomalyKind,
    /// The workload's lease number.
    pub lease: u64,
    /// Ids of the operations involved.
    pub ops: Vec<u64>,
    /// A sentence with the numbers.
    pub detail: String,
}

/// The lease checker's report.
#[derive(Debug, Clone, Default, Serialize)]
pub struct LeaseReport {
    /// `valid` or `not-valid`.
    pub verdict: String,
    /// True when no anomaly was found.
    pub valid: bool,
    /// Grants invoked.
    pub leases: usize,
    /// Leases granted (acknowledged): the checked ones.
    pub leases_checked: usize,
    /// Attaches acknowledged.
    pub keys_attached: usize,
    /// Keep-alives answered with a TTL above 0.
    pub keep_alives_acknowledged: usize,
    /// Keep-alives answered with TTL 0 (the lease was gone).
    pub keep_alives_gone: usize,
    /// Revokes acknowledged.
    pub revokes_acknowledged: usize,
    /// Linearizable range reads judged.
    pub reads_checked: usize,
    /// Observations of expiry (not explained by a revoke).
    pub expiry_observations: usize,
    /// Leases observed expired at least once.
    pub leases_seen_expired: usize,
    /// Leases read present more than their TTL after their grant completed
    /// (kept alive by keep-alives, or by leader changes).
    pub leases_kept_past_ttl: usize,
    /// The closest an observation of expiry came to the early bound: the
    /// smallest (observation's completion − last acknowledged send − TTL),
    /// in ms; an early expiry is below −(EARLY_BOUND_MS +
    /// MEASUREMENT_SLACK_MS). `None` without observations.
    pub closest_expiry_ms: Option<i64>,
    /// The largest lateness of a present read beyond TTL after the last
    /// possible renewal (leaderless windows counted as renewing), in ms;
    /// a late expiry is above LATE_BOUND_MS + MEASUREMENT_SLACK_MS.
    pub lateness_max_ms: Option<i64>,
    /// Delete events of lease keys the watchers received.
    pub watch_delete_events: usize,
    /// Leases whose deletes some watcher received.
    pub leases_deleted_seen_by_watchers: usize,
    /// Whether a final read (of every lease) succeeded.
    pub final_read: bool,
    /// Leaderless windows counted (fault windows plus the allowance).
    pub leaderless_windows: usize,
    /// Their total length, merged, in ms.
    pub leaderless_ms: u64,
    /// Anomalies found, by kind name (every kind, zeros included).
    pub anomalies_by_kind: BTreeMap<String, usize>,
    /// The first [`ANOMALIES_LISTED_MAX`] anomalies.
    pub anomalies: Vec<LeaseAnomaly>,
}

impl LeaseReport {
    /// All anomalies, counted.
    pub fn anomaly_count(&self) -> usize {
        self.anomalies_by_kind.values().sum()
    }

    /// A short human verdict.
    pub fn summary(&self) -> String {
        let ms = |v: Option<i64>| v.map_or("none".to_string(), |ms| format!("{ms} ms"));
        let mut out = format!(
            "lease: {}: {} leases ({} granted), {} keys attached, {} keep-alives acknowledged, \
             {} answered gone, {} revokes; {} reads checked, {} expiry observations ({} leases), \
             {} leases kept past their TTL; closest expiry to TTL after the last acknowledged \
             send {} (early below -{} ms), largest lateness {} (late above {} ms); watchers: {} \
             delete events of {} leases; final read: {}; {} leaderless windows ({:.1} s)\n",
            if self.valid { "VALID" } else { "NOT VALID" },
            self.leases,
            self.leases_checked,
            self.keys_attached,
            self.keep_alives_acknowledged,
            self.keep_alives_gone,
            self.revokes_acknowledged,
            self.reads_checked,
            self.expiry_observations,
            self.leases_seen_expired,
            self.leases_kept_past_ttl,
            ms(self.closest_expiry_ms),
            EARLY_BOUND_MS + MEASUREMENT_SLACK_MS,
            ms(self.lateness_max_ms),
            LATE_BOUND_MS + MEASUREMENT_SLACK_MS,
            self.watch_delete_events,
            self.leases_deleted_seen_by_watchers,
            if self.final_read { "yes" } else { "NONE" },
            self.leaderless_windows,
            self.leaderless_ms as f64 / 1e3
        );
        for (kind, count) in self.anomalies_by_kind.iter().filter(|(_, c)| **c > 0) {
            out.push_str(&format!("  {kind}: {count}\n"));
        }
        for anomaly in self.anomalies.iter().take(10) {
            out.push_str(&format!(
                "  {} lease {}: {} (ops {:?})\n",
                anomaly.kind.name(),
                anomaly.lease,
                anomaly.detail,
                anomaly.ops
            ));
        }
        out
    }
}

/// Everything the history says about one lease.
#[derive(Debug, Default)]
struct Lease<'a> {
    grant: Option<&'a Op>,
    keep_alives: Vec<&'a Op>,
    revokes: Vec<&'a Op>,
    /// Key -> its attaching writes (one by construction).
    attaches: BTreeMap<&'a str, Vec<&'a Op>>,
}

/// The lease record's TTL answer of an op (grant: granted; keep-alive:
/// answered).
fn answered_ttl_ms(op: &Op) -> Option<u64> {
    op.lease.as_ref().and_then(|l| l.ttl_ms)
}

/// When an acknowledged keep-alive's answered request was sent: the
/// recorded send of its last attempt, within [invoke, complete] (the
/// invoke when not recorded).
fn sent_ns(keep_alive: &Op) -> u64 {
    keep_alive
        .lease
        .as_ref()
        .and_then(|l| l.sent_ns)
        .map_or(keep_alive.invoke_ns, |sent| {
            sent.clamp(keep_alive.invoke_ns, keep_alive.complete_ns)
        })
}

/// Whether a keep-alive was acknowledged with a TTL (a renewal).
fn acknowledged(keep_alive: &Op) -> bool {
    keep_alive.outcome == Outcome::Ok && answered_ttl_ms(keep_alive).is_some_and(|ttl| ttl > 0)
}

/// Whether a keep-alive answered that the lease is gone.
fn answered_gone(keep_alive: &Op) -> bool {
    keep_alive.outcome == Outcome::Ok && answered_ttl_ms(keep_alive) == Some(0)
}

/// Checks a `lease` workload history.
pub fn check(records: &[Record]) -> LeaseReport {
    let mut report = LeaseReport::default();
    let mut leases: BTreeMap<u64, Lease<'_>> = BTreeMap::new();
    let mut reads: Vec<&Op> = Vec::new();
    let mut deletes: BTreeMap<u64, BTreeMap<u64, Vec<u64>>> = BTreeMap::new();
    for record in records {
        let Record::Op(op) = record else {
            continue;
        };
        let number = op.lease.as_ref().map(|l| l.lease);
        match (op.f, number) {
            (Function::LeaseGrant, Some(n)) => leases.entry(n).or_default().grant = Some(op),
            (Function::LeaseKeepAlive, Some(n)) => {
                leases.entry(n).or_default().keep_alives.push(op)
            }
            (Function::LeaseRevoke, Some(n)) => leases.entry(n).or_default().revokes.push(op),
            (Function::Write, Some(n)) => leases
                .entry(n)
                .or_default()
                .attaches
                .entry(op.key.as_str())
                .or_default()
                .push(op),
            (Function::LeaseRead, _)
                if op.outcome == Outcome::Ok
                    && op.stale_min_index.is_none()
                    && op.lease.as_ref().is_some_and(|l| l.present.is_some()) =>
            {
                reads.push(op);
                report.final_read |= op.final_read;
            }
            (Function::Watch, _) if op.outcome == Outcome::Ok => {
                for event in op.watch.iter().flat_map(|w| &w.events) {
                    if event.kind != EventKind::Delete {
                        continue;
                    }
                    if let Some(n) = lease_of_key(&event.key) {
                        report.watch_delete_events += 1;
                        deletes
                            .entry(n)
                            .or_default()
                            .entry(event.revision)
                            .or_default()
                            .push(op.id);
                    }
                }
            }
            _ => {}
        }
    }
    report.reads_checked = reads.len();
    report.leases_deleted_seen_by_watchers = deletes.len();
    let windows = leaderless_windows(records);
    report.leaderless_windows = windows.len();
    report.leaderless_ms = windows
        .iter()
        .map(|(start, end)| end.saturating_sub(*start) / MS)
        .sum();
    let mut anomalies = Vec::new();
    for (&n, lease) in &leases {
        if lease.grant.is_some() {
            report.leases += 1;
        }
        count(lease, &mut report);
        if let Some(checked) = Checked::new(n, lease, &windows) {
            report.leases_checked += 1;
            checked.check(&reads, &mut report, &mut anomalies);
        }
        check_revoke_split(
            n,
            lease,
            deletes.remove(&n).unwrap_or_default(),
            &mut anomalies,
        );
    }
    // Deletes of leases the history never granted: only the split check.
    for (n, by_revision) in deletes {
        check_revoke_split(n, &Lease::default(), by_revision, &mut anomalies);
    }
    finish(report, anomalies)
}

fn count(lease: &Lease<'_>, report: &mut LeaseReport) {
    report.keys_attached += lease
        .attaches
        .values()
        .flatten()
        .filter(|op| op.outcome == Outcome::Ok)
        .count();
    report.keep_alives_acknowledged += lease.keep_alives.iter().filter(|k| acknowledged(k)).count();
    report.keep_alives_gone += lease
        .keep_alives
        .iter()
        .filter(|k| answered_gone(k))
        .count();
    report.revokes_acknowledged += lease
        .revokes
        .iter()
        .filter(|r| r.outcome == Outcome::Ok)
        .count();
}

fn finish(mut report: LeaseReport, mut anomalies: Vec<LeaseAnomaly>) -> LeaseReport {
    for kind in LeaseAnomalyKind::ALL {
        report.anomalies_by_kind.insert(kind.name().to_string(), 0);
    }
    for anomaly in &anomalies {
        *report
            .anomalies_by_kind
            .entry(anomaly.kind.name().to_string())
            .or_default() += 1;
    }
    report.valid = anomalies.is_empty();
    report.verdict = if report.valid { "valid" } else { "not-valid" }.to_string();
    anomalies.truncate(ANOMALIES_LISTED_MAX);
    report.anomalies = anomalies;
    report
}

/// revoke-split: every delete of the lease's keys the watchers received,
/// and the revision an acknowledged revoke that deleted keys answered,
/// must be one revision.
fn check_revoke_split(
    n: u64,
    lease: &Lease<'_>,
    mut by_revision: BTreeMap<u64, Vec<u64>>,
    anomalies: &mut Vec<LeaseAnomaly>,
) {
    for revoke in &lease.revokes {
        let deleted = revoke.lease.as_ref().and_then(|l| l.deleted).unwrap_or(0);
        if revoke.outcome == Outcome::Ok
            && deleted > 0
            && let Some(revision) = revoke.revision
        {
            by_revision.entry(revision).or_default().push(revoke.id);
        }
    }
    if by_revision.len() > 1 {
        let revisions: Vec<u64> = by_revision.keys().copied().collect();
        let mut ops: Vec<u64> = by_revision.values().flatten().copied().collect();
        ops.sort_unstable();
        ops.dedup();
        anomalies.push(LeaseAnomaly {
            kind: LeaseAnomalyKind::RevokeSplit,
            lease: n,
            ops,
            detail: format!(
                "the lease's keys were deleted at revisions {revisions:?} (watch events and the \
                 revoke's answer), not at one"
            ),
        });
    }
}

/// One granted lease, ready to judge.
struct Checked<'a> {
    n: u64,
    lease: &'a Lease<'a>,
    grant: &'a Op,
    ttl_ms: u64,
    ttl_ns: u64,
    /// Sends (invokes) of acknowledged renewals, ascending.
    sends: Vec<u64>,
    /// (invoke, complete) of every renewal that may have applied.
    renewals: Vec<(u64, u64)>,
    /// The earliest invoke of a revoke not definitely failed.
    revoke_from: Option<u64>,
    /// The earliest acknowledged revoke (completion, op id).
    revoked: Option<(u64, u64)>,
    windows: &'a [(u64, u64)],
}

/// An observation of expiry: (completion, op id, what).
type Observation = (u64, u64, &'static str);

impl<'a> Checked<'a> {
    fn new(n: u64, lease: &'a Lease<'a>, windows: &'a [(u64, u64)]) -> Option<Self> {
        let grant = lease.grant.filter(|g| g.outcome == Outcome::Ok)?;
        let ttl_ms = answered_ttl_ms(grant).or(grant.ttl_ms)?;
        let mut sends: Vec<u64> = std::iter::once(grant.invoke_ns)
            .chain(
                lease
                    .keep_alives
                    .iter()
                    .filter(|k| acknowledged(k))
                    .map(|k| sent_ns(k)),
            )
            .collect();
        sends.sort_unstable();
        let renewals = std::iter::once((grant.invoke_ns, grant.complete_ns))
            .chain(
                lease
                    .keep_alives
                    .iter()
                    .filter(|k| acknowledged(k) || k.outcome == Outcome::Info)
                    .map(|k| (k.invoke_ns, k.complete_ns)),
            )
            .collect();
        let revoke_from = lease
            .revokes
            .iter()
            .filter(|r| r.outcome != Outcome::Fail)
            .map(|r| r.invoke_ns)
            .min();
        let revoked = lease
            .revokes
            .iter()
            .filter(|r| r.outcome == Outcome::Ok)
            .map(|r| (r.complete_ns, r.id))
            .min();
        Some(Self {
            n,
            lease,
            grant,
            ttl_ms,
            ttl_ns: ttl_ms.saturating_mul(MS),
            sends,
            renewals,
            revoke_from,
            revoked,
            windows,
        })
    }

    fn anomaly(&self, kind: LeaseAnomalyKind, ops: Vec<u64>, detail: String) -> LeaseAnomaly {
        LeaseAnomaly {
            kind,
            lease: self.n,
            ops,
            detail,
        }
    }

    /// Whether a revoke (not definitely failed) was invoked before `at`.
    fn revoke_before(&self, at: u64) -> bool {
        self.revoke_from.is_some_and(|from| from < at)
    }

    fn check(&self, reads: &[&Op], report: &mut LeaseReport, anomalies: &mut Vec<LeaseAnomaly>) {
        let mut observations: Vec<Observation> = self
            .lease
            .keep_alives
            .iter()
            .filter(|k| answered_gone(k) && !self.revoke_before(k.complete_ns))
            .map(|k| (k.complete_ns, k.id, "a keep-alive answered TTL 0"))
            .collect();
        let prefix = lease_prefix(self.n);
        let mut present_reads = Vec::new();
        for read in reads.iter().copied().filter(|r| prefix.starts_with(&r.key)) {
            let present: BTreeMap<&str, &str> = read
                .lease
                .as_ref()
                .and_then(|l| l.present.as_ref())
                .into_iter()
                .flatten()
                .filter(|(key, _)| key.starts_with(&prefix))
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect();
            self.check_values(read, &present, anomalies);
            let acknowledged: BTreeSet<&str> = self
                .lease
                .attaches
                .iter()
                .filter(|(_, ops)| {
                    ops.iter()
                        .any(|a| a.outcome == Outcome::Ok && a.complete_ns <= read.invoke_ns)
                })
                .map(|(key, _)| *key)
                .collect();
            if present.is_empty() {
                if !acknowledged.is_empty() && !self.revoke_before(read.complete_ns) {
                    observations.push((read.complete_ns, read.id, "a read found none of its keys"));
                }
                continue;
            }
            let missing: Vec<&str> = acknowledged
                .iter()
                .copied()
                .filter(|key| !present.contains_key(key))
                .collect();
            if !missing.is_empty() {
                anomalies.push(self.anomaly(
                    LeaseAnomalyKind::PartialRevoke,
                    vec![read.id],
                    format!(
                        "one read found {:?} and not {missing:?}, attached (acknowledged) before \
                         it was invoked",
                        present.keys().collect::<Vec<_>>()
                    ),
                ));
            }
            present_reads.push(read);
        }
        observations.sort_unstable();
        report.expiry_observations += observations.len();
        if !observations.is_empty() {
            report.leases_seen_expired += 1;
        }
        self.check_early(&observations, report, anomalies);
        let mut kept_past_ttl = false;
        for read in &present_reads {
            kept_past_ttl |= read.invoke_ns > self.grant.complete_ns.saturating_add(self.ttl_ns);
            self.check_present(read, &observations, report, anomalies);
        }
        if kept_past_ttl {
            report.leases_kept_past_ttl += 1;
        }
        self.check_keep_alives_after(&observations, anomalies);
    }

    /// unexpected-value: every key found must be one of the lease's
    /// attaches (not definitely failed, invoked before the read completed)
    /// with its value.
    fn check_values(
        &self,
        read: &Op,
        present: &BTreeMap<&str, &str>,
        anomalies: &mut Vec<LeaseAnomaly>,
    ) {
        for (key, value) in present {
            let written = self.lease.attaches.get(key).is_some_and(|ops| {
                ops.iter().any(|a| {
                    a.outcome != Outcome::Fail
                        && a.invoke_ns < read.complete_ns
                        && a.value.as_deref() == Some(*value)
                })
            });
            if !written {
                anomalies.push(self.anomaly(
                    LeaseAnomalyKind::UnexpectedValue,
                    vec![read.id],
                    format!("read {key} = {value:?}, which no attach of the lease wrote"),
                ));
            }
        }
    }

    /// early-expiry: each observation against the last acknowledged send
    /// at or before it.
    fn check_early(
        &self,
        observations: &[Observation],
        report: &mut LeaseReport,
        anomalies: &mut Vec<LeaseAnomaly>,
    ) {
        let allowed_ns = (EARLY_BOUND_MS + MEASUREMENT_SLACK_MS) * MS;
        for &(at, id, what) in observations {
            let Some(&sent) = self.sends.iter().rev().find(|&&s| s <= at) else {
                continue;
            };
            let margin_ns = i128::from(at) - i128::from(sent) - i128::from(self.ttl_ns);
            let margin_ms = i64::try_from(margin_ns / i128::from(MS)).unwrap_or(i64::MIN);
            report.closest_expiry_ms = Some(
                report
                    .closest_expiry_ms
                    .map_or(margin_ms, |m| m.min(margin_ms)),
            );
            if margin_ns < -i128::from(allowed_ns) {
                anomalies.push(self.anomaly(
                    LeaseAnomalyKind::EarlyExpiry,
                    vec![self.grant.id, id],
                    format!(
                        "{what} {:.3} s after the last acknowledged renewal was sent (at +{:.3} \
                         s); TTL {} ms, early bound {EARLY_BOUND_MS} ms + slack \
                         {MEASUREMENT_SLACK_MS} ms",
                        (at - sent) as f64 / 1e9,
                        sent as f64 / 1e9,
                        self.ttl_ms
                    ),
                ));
            }
        }
    }

    /// A read that found keys: present after an acknowledged revoke, after
    /// an observation of expiry, or past the late deadline.
    fn check_present(
        &self,
        read: &Op,
        observations: &[Observation],
        report: &mut LeaseReport,
        anomalies: &mut Vec<LeaseAnomaly>,
    ) {
        let t = read.invoke_ns;
        if let Some((done, revoke)) = self.revoked
            && done < t
        {
            anomalies.push(self.anomaly(
                LeaseAnomalyKind::PresentAfterRevoke,
                vec![revoke, read.id],
                format!(
                    "a read invoked at +{:.3} s found keys of the lease revoked at +{:.3} s",
                    t as f64 / 1e9,
                    done as f64 / 1e9
                ),
            ));
        }
        if let Some(&(seen, id, what)) = observations.iter().find(|(seen, _, _)| *seen < t) {
            anomalies.push(self.anomaly(
                LeaseAnomalyKind::Resurrection,
                vec![id, read.id],
                format!(
                    "a read invoked at +{:.3} s found keys of the lease after {what} at +{:.3} s",
                    t as f64 / 1e9,
                    seen as f64 / 1e9
                ),
            ));
        }
        let Some(renewed) = self.last_renewal_before(t) else {
            return;
        };
        let lateness_ns = i128::from(t) - i128::from(renewed) - i128::from(self.ttl_ns);
        let lateness_ms = i64::try_from(lateness_ns / i128::from(MS)).unwrap_or(i64::MAX);
        report.lateness_max_ms = Some(
            report
                .lateness_max_ms
                .map_or(lateness_ms, |m| m.max(lateness_ms)),
        );
        if lateness_ns > i128::from((LATE_BOUND_MS + MEASUREMENT_SLACK_MS) * MS) {
            anomalies.push(self.anomaly(
                LeaseAnomalyKind::LateExpiry,
                vec![self.grant.id, read.id],
                format!(
                    "a read invoked at +{:.3} s found keys of the lease last renewed by +{:.3} s \
                     (leaderless windows counted as renewals); TTL {} ms, late bound \
                     {LATE_BOUND_MS} ms + slack {MEASUREMENT_SLACK_MS} ms",
                    t as f64 / 1e9,
                    renewed as f64 / 1e9,
                    self.ttl_ms
                ),
            ));
        }
    }

    /// The latest time a renewal may have applied before `t`: completions
    /// of renewals invoked before `t`, moved to the end of each leaderless
    /// window that started before `t` and ended after it. `None` when that
    /// is not before `t` (a renewal or a window still running).
    fn last_renewal_before(&self, t: u64) -> Option<u64> {
        let mut renewed = 0;
        for &(invoke, complete) in &self.renewals {
            if invoke < t {
                renewed = renewed.max(complete);
            }
        }
        for &(start, end) in self.windows {
            if start < t && end > renewed {
                renewed = end;
            }
        }
        (renewed < t).then_some(renewed)
    }

    /// resurrection by keep-alive: answered with a TTL after the lease was
    /// observed gone.
    fn check_keep_alives_after(
        &self,
        observations: &[Observation],
        anomalies: &mut Vec<LeaseAnomaly>,
    ) {
        for keep_alive in self.lease.keep_alives.iter().filter(|k| acknowledged(k)) {
            if let Some(&(seen, id, what)) = observations
                .iter()
                .find(|(seen, _, _)| *seen < keep_alive.invoke_ns)
            {
                anomalies.push(self.anomaly(
                    LeaseAnomalyKind::Resurrection,
                    vec![id, keep_alive.id],
                    format!(
                        "a keep-alive invoked at +{:.3} s was answered TTL {} ms after {what} at \
                         +{:.3} s",
                        keep_alive.invoke_ns as f64 / 1e9,
                        answered_ttl_ms(keep_alive).unwrap_or(0),
                        seen as f64 / 1e9
                    ),
                ));
            }
        }
    }
}

/// What a lease run lacked to count (the checker stays valid): no final
/// read, no acknowledged keep-alive, no lease observed expired, no lease
/// read present past its TTL, no delete seen by the watchers.
pub fn shortfalls(report: &LeaseReport) -> Vec<String> {
    let mut problems = Vec::new();
    if !report.final_read {
        problems.push("no final read of every lease succeeded".to_string());
    }
    if report.keep_alives_acknowledged == 0 {
        problems.push("no keep-alive was acknowledged".to_string());
    }
    if report.leases_seen_expired == 0 {
        problems.push("no lease was observed expired".to_string());
    }
    if report.leases_kept_past_ttl == 0 {
        problems.push("no lease was read present past its TTL".to_string());
    }
    if report.leases_deleted_seen_by_watchers == 0 {
        problems.push("the watchers received no delete of a lease key".to_string());
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::lease::{PREFIX, key_name};
    use crate::workload::{LeaseRecord, NemesisEvent, Phase, WatchEventRecord, WatchRecord};

    fn op(id: u64, f: Function, key: &str, at_ms: (u64, u64)) -> Op {
        Op {
            id,
            process: id,
            f,
            key: key.to_string(),
            value: None,
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
            lease: Some(LeaseRecord {
                lease: 1,
                id: 0x77,
                ..LeaseRecord::default()
            }),
            expected: None,
        }
    }

    /// Lease 1 granted at 0..10 ms with a 3 s TTL.
    fn grant() -> Op {
        let mut g = op(1, Function::LeaseGrant, "", (0, 10));
        g.ttl_ms = Some(3000);
        g.lease.as_mut().unwrap().ttl_ms = Some(3000);
        g
    }

    /// Key `k` of lease 1 attached at `at_ms` (value `v<k>`).
    fn attach(id: u64, k: u64, at_ms: (u64, u64)) -> Op {
        let mut a = op(id, Function::Write, &key_name(1, k), at_ms);
        a.value = Some(format!("v{k}"));
        a
    }

    fn keep_alive(id: u64, at_ms: (u64, u64), ttl_ms: u64) -> Op {
        let mut k = op(id, Function::LeaseKeepAlive, "", at_ms);
        k.lease.as_mut().unwrap().ttl_ms = Some(ttl_ms);
        k
    }

    /// A range read of lease 1's prefix finding keys `present`.
    fn read(id: u64, at_ms: (u64, u64), present: &[u64]) -> Op {
        let mut r = op(id, Function::LeaseRead, &lease_prefix(1), at_ms);
        r.lease.as_mut().unwrap().present = Some(
            present
                .iter()
                .map(|&k| (key_name(1, k), format!("v{k}")))
                .collect(),
        );
        r
    }

    fn revoke(id: u64, at_ms: (u64, u64), outcome: Outcome) -> Op {
        let mut r = op(id, Function::LeaseRevoke, "", at_ms);
        r.outcome = outcome;
        r.revision = Some(50);
        r.lease.as_mut().unwrap().deleted = Some(2);
        r
    }

    fn watch(id: u64, deletes: &[(u64, u64)]) -> Op {
        let mut w = op(id, Function::Watch, PREFIX, (0, 0));
        w.lease = None;
        w.watch = Some(WatchRecord {
            events: deletes
                .iter()
                .map(|&(k, revision)| WatchEventRecord {
                    revision,
                    key: key_name(1, k),
                    kind: EventKind::Delete,
                    value: None,
                    create_revision: None,
                    version: None,
                    prev_value: Some(format!("v{k}")),
                })
                .collect(),
            ..WatchRecord::default()
        });
        w
    }

    fn fault(fault: &str, phase: Phase, at_ms: u64) -> Record {
        Record::Nemesis(NemesisEvent {
            fault: fault.to_string(),
            phase,
            detail: String::new(),
            wall_us: at_ms * 1000,
            time_ns: at_ms * MS,
        })
    }

    /// Granted, two keys attached, kept alive every second until 4 s (the
    /// last renewal sent at 4 s, acknowledged at 4.01 s), read present
    /// past the grant's own TTL.
    fn base() -> Vec<Op> {
        vec![
            grant(),
            attach(2, 0, (20, 30)),
            attach(3, 1, (40, 50)),
            keep_alive(4, (1000, 1010), 3000),
            read(5, (1100, 1110), &[0, 1]),
            keep_alive(6, (2000, 2010), 3000),
            keep_alive(7, (3000, 3010), 3000),
            keep_alive(8, (4000, 4010), 3000),
            read(9, (5000, 5010), &[0, 1]),
        ]
    }

    /// [`base`], then left to expire (3 s TTL): present at 7.5 s (within
    /// the late bound of 7.01 s), gone at 7.9 s; both watchers saw the
    /// deletes at one revision.
    fn kept_then_abandoned() -> Vec<Op> {
        let mut ops = base();
        ops.extend([
            read(10, (7500, 7510), &[0, 1]),
            read(11, (7900, 7910), &[]),
            watch(12, &[(0, 40), (1, 40)]),
            watch(13, &[(1, 40)]),
        ]);
        ops
    }

    fn run(ops: Vec<Op>) -> LeaseReport {
        check(&ops.into_iter().map(Record::Op).collect::<Vec<_>>())
    }

    fn kinds(report: &LeaseReport) -> Vec<LeaseAnomalyKind> {
        report.anomalies.iter().map(|a| a.kind).collect()
    }

    #[test]
    fn a_correct_history_is_valid() {
        let report = run(kept_then_abandoned());
        assert!(report.valid, "{}", report.summary());
        assert_eq!(report.verdict, "valid");
        assert_eq!(report.leases_checked, 1);
        assert_eq!(report.keys_attached, 2);
        assert_eq!(report.keep_alives_acknowledged, 4);
        assert_eq!(report.reads_checked, 4);
        assert_eq!(report.expiry_observations, 1);
        assert_eq!(report.leases_seen_expired, 1);
        assert_eq!(report.leases_kept_past_ttl, 1);
        assert_eq!(report.leases_deleted_seen_by_watchers, 1);
        assert_eq!(report.watch_delete_events, 3);
        // Gone 7.91 s after the grant, 3.91 s after the last send.
        assert_eq!(report.closest_expiry_ms, Some(910));
        assert_eq!(report.lateness_max_ms, Some(490));
        assert_eq!(report.anomalies_by_kind.len(), LeaseAnomalyKind::ALL.len());
        assert_eq!(report.anomaly_count(), 0);
        // Nothing to complain about but the final read.
        assert_eq!(
            shortfalls(&report),
            vec!["no final read of every lease succeeded".to_string()]
        );
    }

    #[test]
    fn an_early_expiry_is_flagged() {
        // Gone 2 s after the keep-alive sent at 4 s (TTL 3 s).
        let mut ops = base();
        ops.push(read(20, (5900, 6000), &[]));
        let report = run(ops);
        assert_eq!(kinds(&report), vec![LeaseAnomalyKind::EarlyExpiry]);
        assert_eq!(report.verdict, "not-valid");
        assert_eq!(report.closest_expiry_ms, Some(-1000));
        // The same seen by a keep-alive answered TTL 0.
        let mut ops = base();
        ops.push(keep_alive(20, (5900, 6000), 0));
        let report = run(ops);
        assert_eq!(kinds(&report), vec![LeaseAnomalyKind::EarlyExpiry]);
        assert_eq!(report.keep_alives_gone, 1);
        // Within the early bound plus the slack: fine.
        let mut ops = base();
        ops.push(read(20, (6900, 6960), &[]));
        let report = run(ops);
        assert!(report.valid, "{}", report.summary());
        assert_eq!(report.closest_expiry_ms, Some(-40));
        // Just past it: flagged.
        let mut ops = base();
        ops.push(read(20, (6900, 6940), &[]));
        assert_eq!(kinds(&run(ops)), vec![LeaseAnomalyKind::EarlyExpiry]);
    }

    #[test]
    fn the_last_acknowledged_send_counts_not_an_unanswered_one() {
        // A keep-alive sent at 4.5 s that timed out does not protect the
        // lease: gone at 6.97 s is 2.97 s after the acknowledged send at
        // 4 s, within the bounds.
        let mut ops = base();
        let mut lost = keep_alive(20, (4500, 9500), 3000);
        lost.outcome = Outcome::Info;
        lost.lease.as_mut().unwrap().ttl_ms = None;
        ops.push(lost);
        ops.push(read(21, (6900, 6970), &[]));
        let report = run(ops);
        assert!(report.valid, "{}", report.summary());
        // An acknowledged one answered long after it was sent protects
        // from its send: 6.97 s is 2.47 s after the send at 4.5 s.
        let mut ops = base();
        ops.push(keep_alive(20, (4500, 6500), 3000));
        ops.push(read(21, (6900, 6970), &[]));
        assert_eq!(kinds(&run(ops)), vec![LeaseAnomalyKind::EarlyExpiry]);
        // A retried keep-alive protects from the send of the attempt that
        // was answered (recorded), not from its invoke.
        let mut retried = base();
        retried[7].complete_ns = 4500 * MS;
        retried[7].lease.as_mut().unwrap().sent_ns = Some(4400 * MS);
        let mut ops = retried.clone();
        ops.push(read(21, (6900, 7000), &[]));
        let report = run(ops);
        assert_eq!(kinds(&report), vec![LeaseAnomalyKind::EarlyExpiry]);
        assert_eq!(report.closest_expiry_ms, Some(-400));
        // A recorded send outside the op's interval is clamped into it.
        retried[7].lease.as_mut().unwrap().sent_ns = Some(9000 * MS);
        let mut ops = retried;
        ops.push(read(21, (7000, 7520), &[]));
        assert_eq!(run(ops).closest_expiry_ms, Some(20));
    }

    #[test]
    fn a_revoke_explains_absence() {
        let mut ops = base();
        ops.push(revoke(20, (5100, 5200), Outcome::Ok));
        ops.push(read(21, (5300, 5310), &[]));
        let report = run(ops);
        assert!(report.valid, "{}", report.summary());
        assert_eq!(report.expiry_observations, 0);
        // A revoke of unknown outcome explains it too.
        let mut ops = base();
        ops.push(revoke(20, (5100, 10_100), Outcome::Info));
        ops.push(read(21, (5300, 5310), &[]));
        assert!(run(ops).valid);
        // A definitely failed one does not.
        let mut ops = base();
        ops.push(revoke(20, (5100, 5200), Outcome::Fail));
        ops.push(read(21, (5300, 5310), &[]));
        assert_eq!(kinds(&run(ops)), vec![LeaseAnomalyKind::EarlyExpiry]);
    }

    #[test]
    fn a_key_read_after_an_acknowledged_revoke_is_flagged() {
        let mut ops = base();
        ops.push(revoke(20, (5100, 5200), Outcome::Ok));
        ops.push(read(21, (5300, 5310), &[0, 1]));
        assert_eq!(kinds(&run(ops)), vec![LeaseAnomalyKind::PresentAfterRevoke]);
        // A read concurrent with the revoke may see the keys.
        let mut ops = base();
        ops.push(revoke(20, (5100, 5200), Outcome::Ok));
        ops.push(read(21, (5150, 5310), &[0, 1]));
        assert!(run(ops).valid);
    }

    #[test]
    fn a_late_expiry_is_flagged_outside_leaderless_time() {
        // Present 4.5 s after the last renewal completed (TTL 3 s, bound
        // 1 s + slack).
        let mut ops = kept_then_abandoned();
        ops.push(read(20, (8510, 8520), &[0, 1]));
        let report = run(ops);
        // The read at 7.9 s found the lease gone, so also a resurrection.
        assert_eq!(
            kinds(&report),
            vec![LeaseAnomalyKind::Resurrection, LeaseAnomalyKind::LateExpiry]
        );
        assert_eq!(report.lateness_max_ms, Some(1500));
        // Without the absent read: only late.
        let mut ops = base();
        ops.push(read(20, (8510, 8520), &[0, 1]));
        assert_eq!(kinds(&run(ops)), vec![LeaseAnomalyKind::LateExpiry]);
        // A keep-alive of unknown outcome may have renewed it when it
        // completed (at 6 s): 8.51 s is within the bound of that.
        let mut ops = base();
        let mut unknown = keep_alive(21, (5000, 6000), 3000);
        unknown.outcome = Outcome::Info;
        ops.push(unknown);
        ops.push(read(20, (8510, 8520), &[0, 1]));
        assert!(run(ops).valid);
        // One still running when the read was invoked: not judged.
        let mut ops = base();
        let mut running = keep_alive(21, (5000, 9000), 3000);
        running.outcome = Outcome::Info;
        ops.push(running);
        ops.push(read(20, (8510, 8520), &[0, 1]));
        assert!(run(ops).valid);
    }

    #[test]
    fn a_leader_change_renews_every_lease() {
        // A leader kill from 4.5 s to 5 s: the window ends at 5 s +
        // ELECTION_ALLOWANCE, when the lease counts as renewed; a read 3.5 s
        // after the window's end is fine, one 4.5 s after it is late.
        let allowance_ms = crate::ttl_check::ELECTION_ALLOWANCE.as_millis() as u64;
        let end = 5000 + allowance_ms;
        let history = |read_at: u64| {
            let mut records: Vec<Record> = base().into_iter().map(Record::Op).collect();
            records.push(fault("kill-leader", Phase::Start, 4500));
            records.push(fault("kill-leader", Phase::Stop, 5000));
            records.push(Record::Op(read(20, (read_at, read_at + 10), &[0, 1])));
            records
        };
        let report = check(&history(end + 3500));
        assert!(report.valid, "{}", report.summary());
        assert_eq!(report.leaderless_windows, 1);
        let report = check(&history(end + 4500));
        assert_eq!(kinds(&report), vec![LeaseAnomalyKind::LateExpiry]);
        // Inside the window nothing is late.
        assert!(check(&history(end - 10)).valid);
    }

    #[test]
    fn a_partial_revoke_is_flagged() {
        let mut ops = kept_then_abandoned();
        ops.push(read(20, (7700, 7710), &[1]));
        let report = run(ops);
        assert_eq!(kinds(&report), vec![LeaseAnomalyKind::PartialRevoke]);
        // A key whose attach was still running may be missing.
        let ops = vec![
            grant(),
            attach(2, 0, (20, 30)),
            attach(3, 1, (40, 500)),
            read(4, (100, 110), &[0]),
        ];
        assert!(run(ops).valid);
    }

    #[test]
    fn a_resurrection_is_flagged() {
        // Seen gone at 7.9 s, present again at 8 s (within the late bound).
        let mut ops = kept_then_abandoned();
        ops.push(read(20, (8000, 8010), &[0, 1]));
        assert_eq!(kinds(&run(ops)), vec![LeaseAnomalyKind::Resurrection]);
        // A keep-alive answered with a TTL after the lease was seen gone.
        let mut ops = kept_then_abandoned();
        ops.push(keep_alive(20, (8000, 8010), 3000));
        assert_eq!(kinds(&run(ops)), vec![LeaseAnomalyKind::Resurrection]);
    }

    #[test]
    fn an_unexpected_value_is_flagged() {
        let mut ops = kept_then_abandoned();
        let mut bad = read(20, (1200, 1210), &[0, 1]);
        bad.lease
            .as_mut()
            .unwrap()
            .present
            .as_mut()
            .unwrap()
            .insert(key_name(1, 1), "other".to_string());
        ops.push(bad);
        assert_eq!(kinds(&run(ops)), vec![LeaseAnomalyKind::UnexpectedValue]);
        // A key no attach wrote.
        let mut ops = kept_then_abandoned();
        ops.push(read(20, (1200, 1210), &[0, 1, 2]));
        assert_eq!(kinds(&run(ops)), vec![LeaseAnomalyKind::UnexpectedValue]);
    }

    #[test]
    fn a_revoke_split_over_revisions_is_flagged() {
        let mut ops = kept_then_abandoned();
        ops.push(watch(20, &[(0, 40), (1, 41)]));
        let report = run(ops);
        assert_eq!(kinds(&report), vec![LeaseAnomalyKind::RevokeSplit]);
        assert!(report.anomalies[0].detail.contains("[40, 41]"));
        // The revoke's answered revision against the watchers' deletes.
        let ops = vec![
            grant(),
            attach(2, 0, (20, 30)),
            attach(3, 1, (40, 50)),
            revoke(4, (100, 110), Outcome::Ok),
            watch(5, &[(0, 49), (1, 49)]),
        ];
        assert_eq!(kinds(&run(ops)), vec![LeaseAnomalyKind::RevokeSplit]);
        let ops = vec![
            grant(),
            attach(2, 0, (20, 30)),
            attach(3, 1, (40, 50)),
            revoke(4, (100, 110), Outcome::Ok),
            watch(5, &[(0, 50), (1, 50)]),
        ];
        assert!(run(ops).valid);
    }

    #[test]
    fn a_final_read_of_every_lease_judges_each() {
        let mut ops = base();
        let mut last = read(20, (12_000, 12_010), &[0]);
        last.key = PREFIX.to_string();
        last.final_read = true;
        last.lease.as_mut().unwrap().lease = 0;
        ops.push(last);
        let report = run(ops);
        assert!(report.final_read);
        // A key of a lease dead for 8 s: late, and half of it: partial.
        assert_eq!(
            kinds(&report),
            vec![
                LeaseAnomalyKind::PartialRevoke,
                LeaseAnomalyKind::LateExpiry
            ]
        );
    }

    #[test]
    fn an_unacknowledged_grant_is_not_checked() {
        let mut g = grant();
        g.outcome = Outcome::Info;
        let report = run(vec![g, read(2, (9000, 9010), &[])]);
        assert!(report.valid);
        assert_eq!(report.leases, 1);
        assert_eq!(report.leases_checked, 0);
        assert_eq!(shortfalls(&report).len(), 5);
    }
}
