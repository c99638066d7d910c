//! The exactly-once checker (the `exactly-once` workload,
//! [`crate::workload::exactly_once`]): every element is added once, by a
//! put-if-absent of its own key, and read back by a final linearizable
//! scan that returns each key's version. Anomalies:
//!
//! - *duplicate-apply*: an add recorded failed with a revision mismatch
//!   (the only writer of that key found it present: its own earlier
//!   application, so the request applied twice); or an element seen at two
//!   versions (the add's acknowledged version, reads, the final scan);
//! - *failed-but-present*: an add the client reported as definitely not
//!   applied (any other failure) whose element is in the final read;
//! - *lost*: an add acknowledged before the final read was invoked whose
//!   element is missing from it;
//! - *unexpected*: an element in the final read that no add invoked before
//!   the read completed added, or a value that is not the key's element.
//!
//! Adds of unknown outcome may be present or not ("recovered" when
//! present), but never twice: a revision mismatch or a second version is a
//! duplicate whatever the outcome. No final read: not valid.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use crate::workload::{Function, Op, Outcome, Record};

/// Anomalies listed in full in the report (the count is always exact).
pub const ANOMALIES_LISTED_MAX: usize = 50;
/// The start of kvclient's message for a failed condition
/// (`kvclient::Error::VersionMismatch`; a test below holds it to the
/// client's wording).
pub const VERSION_MISMATCH_ERROR: &str = "revision mismatch";

/// One anomaly.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Anomaly {
    /// `duplicate-apply`, `failed-but-present`, `lost` or `unexpected`.
    pub kind: &'static str,
    /// The element's key.
    pub key: String,
    /// Ids of the operations involved.
    pub ops: Vec<u64>,
    /// A sentence with the numbers.
    pub detail: String,
}

/// The exactly-once checker's report.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ExactlyOnceReport {
    /// `valid` or `not-valid`.
    pub verdict: String,
    /// True when a final read exists and no anomaly was found.
    pub valid: bool,
    /// Whether the history has a final read.
    pub final_read: bool,
    /// Adds invoked.
    pub adds: usize,
    /// Adds acknowledged.
    pub acknowledged: usize,
    /// Adds that definitely did not apply.
    pub failed: usize,
    /// Adds of unknown outcome.
    pub unknown: usize,
    /// Unknown adds present in the final read.
    pub recovered: usize,
    /// Elements in the final read.
    pub present: usize,
    /// Anomalies found, by kind.
    pub anomalies_by_kind: BTreeMap<String, usize>,
    /// The first [`ANOMALIES_LISTED_MAX`] anomalies.
    pub anomalies: Vec<Anomaly>,
}

impl ExactlyOnceReport {
    /// A short human verdict.
    pub fn summary(&self) -> String {
        let mut out = format!(
            "exactly-once: {}: {} adds ({} ok, {} failed, {} unknown, {} unknown present), \
             final read: {} ({} elements)\n",
            if self.valid { "VALID" } else { "NOT VALID" },
            self.adds,
            self.acknowledged,
            self.failed,
            self.unknown,
            self.recovered,
            if self.final_read { "yes" } else { "NONE" },
            self.present
        );
        for (kind, count) in &self.anomalies_by_kind {
            out.push_str(&format!("  {kind}: {count}\n"));
        }
        for anomaly in self.anomalies.iter().take(10) {
            out.push_str(&format!(
                "  {} {}: {} (ops {:?})\n",
                anomaly.kind, anomaly.key, anomaly.detail, anomaly.ops
            ));
        }
        out
    }
}

/// Key -> the adds of it (one by construction).
type Adds<'a> = BTreeMap<&'a str, Vec<&'a Op>>;
/// Key -> (version, op id) of every observation.
type Seen<'a> = BTreeMap<&'a str, Vec<(u64, u64)>>;

/// Checks an exactly-once history.
pub fn check(records: &[Record]) -> ExactlyOnceReport {
    let ops: Vec<&Op> = records
        .iter()
        .filter_map(|r| match r {
            Record::Op(op) => Some(op),
            Record::Nemesis(_) => None,
        })
        .collect();
    let mut report = ExactlyOnceReport::default();
    let mut anomalies = Vec::new();
    let final_read = ops
        .iter()
        .copied()
        .filter(|op| op.f == Function::ReadAll && op.outcome == Outcome::Ok && op.values.is_some())
        .max_by_key(|op| op.invoke_ns);
    let adds = count_adds(&ops, &mut report);
    let mut seen = acknowledged_versions(&adds);
    check_reads(&ops, &adds, &mut seen, &mut anomalies);
    let mut present: BTreeSet<String> = BTreeSet::new();
    if let Some(read) = final_read {
        present = check_final_read(read, &adds, &mut seen, &mut anomalies);
        report.final_read = true;
        report.present = present.len();
    }
    check_adds(&adds, &present, final_read, &mut report, &mut anomalies);
    check_versions(&seen, &mut anomalies);
    finish(report, anomalies)
}

/// The adds by key, counted by outcome into `report`.
fn count_adds<'a>(ops: &[&'a Op], report: &mut ExactlyOnceReport) -> Adds<'a> {
    let mut adds: Adds<'a> = BTreeMap::new();
    for op in ops.iter().copied().filter(|op| op.f == Function::Add) {
        report.adds += 1;
        match op.outcome {
            Outcome::Ok => report.acknowledged += 1,
            Outcome::Fail => report.failed += 1,
            Outcome::Info => report.unknown += 1,
        }
        adds.entry(op.key.as_str()).or_default().push(op);
    }
    adds
}

/// The first observations: each acknowledged add's version.
fn acknowledged_versions<'a>(adds: &Adds<'a>) -> Seen<'a> {
    let mut seen: Seen<'a> = BTreeMap::new();
    for add in adds.values().flatten() {
        if add.outcome == Outcome::Ok
            && let Some(version) = add.version
        {
            seen.entry(add.key.as_str())
                .or_default()
                .push((version, add.id));
        }
    }
    seen
}

/// Single-key reads: a value that is not the key's element is unexpected;
/// each read's version is an observation.
fn check_reads<'a>(
    ops: &[&'a Op],
    adds: &Adds<'a>,
    seen: &mut Seen<'a>,
    anomalies: &mut Vec<Anomaly>,
) {
    for read in ops
        .iter()
        .copied()
        .filter(|op| op.f == Function::Read && op.outcome == Outcome::Ok)
    {
        let Some(value) = &read.value else { continue };
        let expected = adds
            .get(read.key.as_str())
            .and_then(|a| a.first())
            .and_then(|a| a.value.as_deref());
        if expected != Some(value.as_str()) {
            anomalies.push(Anomaly {
                kind: "unexpected",
                key: read.key.clone(),
                ops: vec![read.id],
                detail: format!("a read returned {value:?}; the key's add wrote {expected:?}"),
            });
        }
        if let Some(version) = read.version.filter(|v| *v != 0) {
            seen.entry(read.key.as_str())
                .or_default()
                .push((version, read.id));
        }
    }
}

/// The final read: an element no add invoked before it completed is
/// unexpected; each element's version is an observation. Returns the
/// elements' keys.
fn check_final_read<'a>(
    read: &Op,
    adds: &Adds<'a>,
    seen: &mut Seen<'a>,
    anomalies: &mut Vec<Anomaly>,
) -> BTreeSet<String> {
    let mut present: BTreeSet<String> = BTreeSet::new();
    let values = read.values.as_deref().unwrap_or_default();
    let versions = read.versions.as_deref().unwrap_or_default();
    for (at, value) in values.iter().enumerate() {
        let key = value
            .parse::<u64>()
            .map(crate::workload::exactly_once::element_key)
            .unwrap_or_else(|_| format!("?{value}"));
        let known = adds
            .get_key_value(key.as_str())
            .filter(|(_, a)| a.iter().any(|add| add.invoke_ns < read.complete_ns));
        match known {
            None => anomalies.push(Anomaly {
                kind: "unexpected",
                key: key.clone(),
                ops: vec![read.id],
                detail: format!("the final read holds {value:?}, which no add added"),
            }),
            Some((&key_ref, _)) => {
                if let Some(&version) = versions.get(at) {
                    seen.entry(key_ref).or_default().push((version, read.id));
                }
            }
        }
        present.insert(key);
    }
    present
}

/// Each add against the final read: a revision mismatch (duplicate
/// apply), failed but present, acknowledged but lost; counts the
/// recovered unknown adds into `report`.
fn check_adds(
    adds: &Adds<'_>,
    present: &BTreeSet<String>,
    final_read: Option<&Op>,
    report: &mut ExactlyOnceReport,
    anomalies: &mut Vec<Anomaly>,
) {
    for (key, key_adds) in adds {
        for add in key_adds {
            let is_present = present.contains(*key);
            if add.outcome == Outcome::Info && is_present {
                report.recovered += 1;
            }
            let error = add.error.as_deref().unwrap_or("");
            if add.outcome == Outcome::Fail && error.starts_with(VERSION_MISMATCH_ERROR) {
                anomalies.push(Anomaly {
                    kind: "duplicate-apply",
                    key: key.to_string(),
                    ops: vec![add.id],
                    detail: format!(
                        "the add's if-absent condition failed ({error}): only this add writes \
                         the key, so its request applied before and was applied again"
                    ),
                });
            } else if add.outcome == Outcome::Fail && is_present {
                anomalies.push(Anomaly {
                    kind: "failed-but-present",
                    key: key.to_string(),
                    ops: vec![add.id],
                    detail: format!("the add failed ({error}) but the final read holds it"),
                });
            }
            if let Some(read) = final_read
                && add.outcome == Outcome::Ok
                && add.complete_ns < read.invoke_ns
                && !is_present
            {
                anomalies.push(Anomaly {
                    kind: "lost",
                    key: key.to_string(),
                    ops: vec![add.id, read.id],
                    detail: "acknowledged before the final read, missing from it".to_string(),
                });
            }
        }
    }
}

/// An element observed at more than one version was written more than once.
fn check_versions(seen: &Seen<'_>, anomalies: &mut Vec<Anomaly>) {
    for (key, observations) in seen {
        let versions: BTreeSet<u64> = observations.iter().map(|(v, _)| *v).collect();
        if versions.len() > 1 {
            anomalies.push(Anomaly {
                kind: "duplicate-apply",
                key: key.to_string(),
                ops: observations.iter().map(|(_, id)| *id).collect(),
                detail: format!(
                    "the element was seen at {} versions {versions:?}: written more than once",
                    versions.len()
                ),
            });
        }
    }
}

/// The verdict, the counts by kind and the first
/// [`ANOMALIES_LISTED_MAX`] anomalies.
fn finish(mut report: ExactlyOnceReport, mut anomalies: Vec<Anomaly>) -> ExactlyOnceReport {
    for anomaly in &anomalies {
        *report
            .anomalies_by_kind
            .entry(anomaly.kind.to_string())
            .or_default() += 1;
    }
    report.valid = report.final_read && anomalies.is_empty();
    report.verdict = if report.valid { "valid" } else { "not-valid" }.to_string();
    anomalies.truncate(ANOMALIES_LISTED_MAX);
    report.anomalies = anomalies;
    report
}

/// What an exactly-once run lacked to count: no final read.
pub fn shortfalls(report: &ExactlyOnceReport) -> Vec<String> {
    if report.final_read {
        Vec::new()
    } else {
        vec!["the exactly-once final read never succeeded".to_string()]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::exactly_once::element_key;

    fn op(id: u64, f: Function, element: u64, outcome: Outcome, at: (u64, u64)) -> Op {
        Op {
            id,
            process: id,
            f,
            key: element_key(element),
            value: Some(element.to_string()),
            expected_version: None,
            values: None,
            outcome,
            version: None,
            index: None,
            revision: None,
            mod_revision: None,
            expected_mod_revision: None,
            error: None,
            invoke_wall_us: at.0,
            invoke_ns: at.0 * 1000,
            complete_wall_us: at.1,
            complete_ns: at.1 * 1000,
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

    fn add(id: u64, element: u64, outcome: Outcome, version: Option<u64>) -> Op {
        let mut op = op(id, Function::Add, element, outcome, (id * 10, id * 10 + 5));
        op.version = version;
        op
    }

    fn final_read(id: u64, elements: &[(u64, u64)]) -> Op {
        let mut op = op(id, Function::ReadAll, 0, Outcome::Ok, (1000, 1100));
        op.key = crate::workload::exactly_once::PREFIX.to_string();
        op.value = None;
        op.values = Some(elements.iter().map(|(e, _)| e.to_string()).collect());
        op.versions = Some(elements.iter().map(|(_, v)| *v).collect());
        op.final_read = true;
        op
    }

    fn run(ops: Vec<Op>) -> ExactlyOnceReport {
        check(&ops.into_iter().map(Record::Op).collect::<Vec<_>>())
    }

    fn kinds(report: &ExactlyOnceReport) -> Vec<&'static str> {
        report.anomalies.iter().map(|a| a.kind).collect()
    }

    #[test]
    fn a_correct_history_is_valid() {
        let mut unknown = add(3, 3, Outcome::Info, None);
        unknown.error = Some("outcome unknown: session expired".into());
        let report = run(vec![
            add(1, 1, Outcome::Ok, Some(10 << 16)),
            add(2, 2, Outcome::Ok, Some(11 << 16)),
            unknown,
            add(4, 4, Outcome::Info, None),
            final_read(9, &[(1, 10 << 16), (2, 11 << 16), (3, 12 << 16)]),
        ]);
        assert!(report.valid, "{}", report.summary());
        assert_eq!(report.recovered, 1);
        assert_eq!(report.present, 3);
    }

    #[test]
    fn a_failed_condition_is_a_duplicate_apply() {
        let mut retried = add(2, 2, Outcome::Fail, None);
        retried.error = Some(
            kvclient::Error::VersionMismatch {
                condition_index: 0,
                current_mod_revision: 11,
            }
            .to_string(),
        );
        let report = run(vec![
            add(1, 1, Outcome::Ok, Some(10 << 16)),
            retried,
            final_read(9, &[(1, 10 << 16), (2, 11 << 16)]),
        ]);
        assert_eq!(kinds(&report), vec!["duplicate-apply"]);
        assert!(!report.valid);
    }

    #[test]
    fn two_versions_of_one_element_are_a_duplicate_apply() {
        let report = run(vec![
            add(1, 1, Outcome::Ok, Some(10 << 16)),
            final_read(9, &[(1, 14 << 16)]),
        ]);
        assert_eq!(kinds(&report), vec!["duplicate-apply"]);
        // An unknown add seen by a read and by the final read at two
        // versions.
        let mut read = op(2, Function::Read, 1, Outcome::Ok, (30, 40));
        read.version = Some(12 << 16);
        let report = run(vec![
            add(1, 1, Outcome::Info, None),
            read,
            final_read(9, &[(1, 14 << 16)]),
        ]);
        assert_eq!(kinds(&report), vec!["duplicate-apply"]);
    }

    #[test]
    fn lost_unexpected_and_failed_but_present_are_flagged() {
        let mut failed = add(2, 2, Outcome::Fail, None);
        failed.error = Some("unavailable after 3 attempts".into());
        let report = run(vec![
            add(1, 1, Outcome::Ok, Some(10 << 16)),
            failed,
            final_read(9, &[(2, 11 << 16), (7, 12 << 16)]),
        ]);
        let mut got = kinds(&report);
        got.sort_unstable();
        assert_eq!(got, vec!["failed-but-present", "lost", "unexpected"]);
    }

    #[test]
    fn no_final_read_is_not_valid() {
        let report = run(vec![add(1, 1, Outcome::Ok, Some(10 << 16))]);
        assert!(!report.valid);
        assert_eq!(shortfalls(&report).len(), 1);
    }
}
