//! The checks of store revisions (etcd-style), for histories whose
//! completions carry them: the store revision starts at 1 and grows by
//! exactly one with every applied request that changes something; a
//! response reflects one store revision (`revision`: a read's header
//! revision, an ok write's applied revision) and a key read carries the
//! revision of the write that last changed it (`mod_revision`).
//!
//! Only ok operations are judged; failed and unknown ones carry no
//! revision the store vouched for. The checks are near-linear and name:
//!
//! - **revision-regression**: an ok operation of a process observed a
//!   revision below one the same process observed earlier (a process runs
//!   one operation at a time, so its observations are in real-time order);
//! - **read-ahead-of-header**: a read's header revision is below the
//!   `mod_revision` it returned (the answer reflects a write its store
//!   revision had not reached);
//! - **duplicate-revision**: two ok writes acknowledged with one revision
//!   (one request, one revision: the register workload writes one key per
//!   request, so no two of its writes may share one);
//! - **revision-order**: an ok write acknowledged with a revision not above
//!   that of an ok write that completed before it was invoked;
//! - **mod-revision-mismatch**: a read returned a value with a
//!   `mod_revision` other than the revision the value's one ok write was
//!   acknowledged with (judged for values written by exactly one operation
//!   of the key), or a `mod_revision` that is the acknowledged revision of
//!   a different write (another key or another value).
//!
//! Reads are taken to be linearizable (the register workload's are): a
//! stale read from a lagging member may legitimately regress.
//!
//! The report counts every anomaly by kind and keeps the first
//! [`EXAMPLES_PER_KIND_MAX`] of each kind (in history order) as examples.

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;

use crate::history::{Function, Operation, Outcome};

/// Examples kept per anomaly kind: enough to start from, few enough that a
/// badly broken run still writes a small `checker.json`.
pub const EXAMPLES_PER_KIND_MAX: usize = 5;

/// The anomalies the revision checks name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum RevisionAnomalyKind {
    /// A process observed a revision below one it observed earlier.
    RevisionRegression,
    /// A read's header revision below the `mod_revision` it returned.
    ReadAheadOfHeader,
    /// Two ok writes acknowledged with the same revision.
    DuplicateRevision,
    /// A write acknowledged at a revision not above that of a write that
    /// completed before it was invoked.
    RevisionOrder,
    /// A read's `mod_revision` disagrees with the write that wrote its value.
    ModRevisionMismatch,
}

impl RevisionAnomalyKind {
    /// Every kind, in report order.
    pub const ALL: [RevisionAnomalyKind; 5] = [
        RevisionAnomalyKind::RevisionRegression,
        RevisionAnomalyKind::ReadAheadOfHeader,
        RevisionAnomalyKind::DuplicateRevision,
        RevisionAnomalyKind::RevisionOrder,
        RevisionAnomalyKind::ModRevisionMismatch,
    ];

    /// The kind's stable name (as in `checker.json` and `summary.txt`).
    pub fn name(self) -> &'static str {
        match self {
            RevisionAnomalyKind::RevisionRegression => "revision-regression",
            RevisionAnomalyKind::ReadAheadOfHeader => "read-ahead-of-header",
            RevisionAnomalyKind::DuplicateRevision => "duplicate-revision",
            RevisionAnomalyKind::RevisionOrder => "revision-order",
            RevisionAnomalyKind::ModRevisionMismatch => "mod-revision-mismatch",
        }
    }
}

/// One operation involved in an anomaly, with what it observed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Witness {
    /// The operation's id (its position in invocation order).
    pub id: usize,
    /// The client process.
    pub process: u64,
    /// The function.
    pub f: Function,
    /// The key.
    pub key: String,
    /// The value written or read.
    pub value: Option<String>,
    /// The header revision (read) or applied revision (write).
    pub revision: Option<u64>,
    /// The key's `mod_revision` a read returned.
    pub mod_revision: Option<u64>,
    /// Event position of the invocation.
    pub invoke_position: usize,
    /// Event position of the completion.
    pub complete_position: Option<usize>,
}

impl Witness {
    fn of(operation: &Operation) -> Self {
        Witness {
            id: operation.id,
            process: operation.process,
            f: operation.f,
            key: operation.key.clone(),
            value: operation.value.clone(),
            revision: operation.revision,
            mod_revision: operation.mod_revision,
            invoke_position: operation.invoke_position,
            complete_position: operation.complete_position,
        }
    }
}

/// One anomaly.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RevisionAnomaly {
    /// What it is.
    pub kind: RevisionAnomalyKind,
    /// What was seen, in words.
    pub message: String,
    /// The operations involved, earlier first.
    pub operations: Vec<Witness>,
}

/// What the revision checks found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RevisionReport {
    /// Ok operations that carried a revision or a `mod_revision`.
    pub operations_checked: usize,
    /// Anomalies by kind name; every kind is listed, zeros included.
    pub anomalies_by_kind: BTreeMap<String, usize>,
    /// The first [`EXAMPLES_PER_KIND_MAX`] anomalies of each kind.
    pub examples: Vec<RevisionAnomaly>,
}

impl RevisionReport {
    /// Anomalies of every kind together.
    pub fn anomaly_count(&self) -> usize {
        self.anomalies_by_kind.values().sum()
    }

    /// Anomalies of one kind.
    pub fn count(&self, kind: RevisionAnomalyKind) -> usize {
        self.anomalies_by_kind
            .get(kind.name())
            .copied()
            .unwrap_or(0)
    }

    /// Whether no check found anything.
    pub fn valid(&self) -> bool {
        self.anomaly_count() == 0
    }
}

fn is_write(operation: &Operation) -> bool {
    matches!(operation.f, Function::Write | Function::Cas | Function::Put)
}

fn is_read(operation: &Operation) -> bool {
    matches!(operation.f, Function::Read | Function::Get)
}

/// Whether any operation of the history carries a revision: the checks run
/// only then, so histories recorded before revisions check as they did.
pub fn carries_revisions(operations: &[Operation]) -> bool {
    operations
        .iter()
        .any(|o| o.revision.is_some() || o.mod_revision.is_some())
}

/// Runs every revision check; `None` when the history carries no revision.
pub fn check(operations: &[Operation]) -> Option<RevisionReport> {
    if !carries_revisions(operations) {
        return None;
    }
    let observed: Vec<&Operation> = operations
        .iter()
        .filter(|o| o.outcome == Outcome::Ok && (is_read(o) || is_write(o)))
        .filter(|o| o.revision.is_some() || o.mod_revision.is_some())
        .collect();
    let acked: Vec<&Operation> = observed
        .iter()
        .copied()
        .filter(|o| is_write(o) && o.revision.is_some())
        .collect();
    let mut found: Vec<RevisionAnomaly> = Vec::new();
    check_regressions(&observed, &mut found);
    check_reads_ahead_of_header(&observed, &mut found);
    check_duplicate_revisions(&acked, &mut found);
    check_write_order(&acked, &mut found);
    check_mod_revisions(operations, &observed, &acked, &mut found);
    Some(summarize(observed.len(), found))
}

fn anomaly(kind: RevisionAnomalyKind, message: String, involved: &[&Operation]) -> RevisionAnomaly {
    RevisionAnomaly {
        kind,
        message,
        operations: involved.iter().map(|o| Witness::of(o)).collect(),
    }
}

/// Counts by kind; keeps the first examples of each kind in history order
/// (by the latest operation involved, the one that reveals the anomaly).
fn summarize(operations_checked: usize, mut found: Vec<RevisionAnomaly>) -> RevisionReport {
    let mut anomalies_by_kind: BTreeMap<String, usize> = RevisionAnomalyKind::ALL
        .iter()
        .map(|kind| (kind.name().to_string(), 0))
        .collect();
    for anomaly in &found {
        *anomalies_by_kind
            .entry(anomaly.kind.name().to_string())
            .or_default() += 1;
    }
    let revealed_at = |a: &RevisionAnomaly| a.operations.iter().map(|w| w.id).max();
    found.sort_by_key(|a| (a.kind, revealed_at(a)));
    let mut kept: HashMap<RevisionAnomalyKind, usize> = HashMap::new();
    found.retain(|a| {
        let count = kept.entry(a.kind).or_default();
        *count += 1;
        *count <= EXAMPLES_PER_KIND_MAX
    });
    RevisionReport {
        operations_checked,
        anomalies_by_kind,
        examples: found,
    }
}

/// revision-regression: per process, every ok observation is at least the
/// highest revision the process observed before it.
fn check_regressions(observed: &[&Operation], found: &mut Vec<RevisionAnomaly>) {
    // `observed` is in invocation order, which is each process's order.
    let mut highest: HashMap<u64, (u64, &Operation)> = HashMap::new();
    for &operation in observed {
        let Some(revision) = operation.revision else {
            continue;
        };
        match highest.get(&operation.process) {
            Some(&(before, earlier)) if revision < before => found.push(anomaly(
                RevisionAnomalyKind::RevisionRegression,
                format!(
                    "process {} observed revision {revision} after it had observed revision {before}",
                    operation.process
                ),
                &[earlier, operation],
            )),
            Some(&(before, _)) if revision == before => {}
            _ => {
                highest.insert(operation.process, (revision, operation));
            }
        }
    }
}

/// read-ahead-of-header: a read's header revision is at least the
/// `mod_revision` it returned.
fn check_reads_ahead_of_header(observed: &[&Operation], found: &mut Vec<RevisionAnomaly>) {
    for &read in observed.iter().filter(|o| is_read(o)) {
        if let (Some(header), Some(modified)) = (read.revision, read.mod_revision)
            && header < modified
        {
            found.push(anomaly(
                RevisionAnomalyKind::ReadAheadOfHeader,
                format!("read at header revision {header} returned mod_revision {modified}"),
                &[read],
            ));
        }
    }
}

/// duplicate-revision: no two ok writes share a revision.
fn check_duplicate_revisions(acked: &[&Operation], found: &mut Vec<RevisionAnomaly>) {
    let mut first_at: HashMap<u64, &Operation> = HashMap::new();
    for &write in acked {
        let Some(revision) = write.revision else {
            continue;
        };
        if let Some(&first) = first_at.get(&revision) {
            found.push(anomaly(
                RevisionAnomalyKind::DuplicateRevision,
                format!("two writes acknowledged with revision {revision}"),
                &[first, write],
            ));
        } else {
            first_at.insert(revision, write);
        }
    }
}

/// revision-order: a write invoked after another completed has a higher
/// revision (prefix maxima of revisions in completion order).
fn check_write_order(acked: &[&Operation], found: &mut Vec<RevisionAnomaly>) {
    let mut by_completion: Vec<&Operation> = acked.to_vec();
    by_completion.sort_by_key(|o| o.complete_position);
    // (completion position, the highest-revision write completed by then)
    let mut highest: Vec<(usize, &Operation)> = Vec::with_capacity(by_completion.len());
    for &write in &by_completion {
        let done = write.complete_position.unwrap_or(usize::MAX);
        match highest.last() {
            Some(&(_, best)) if best.revision >= write.revision => highest.push((done, best)),
            _ => highest.push((done, write)),
        }
    }
    for &write in acked {
        let finished = highest.partition_point(|(done, _)| *done < write.invoke_position);
        if finished == 0 {
            continue;
        }
        let (_, earlier) = highest[finished - 1];
        if let (Some(before), Some(revision)) = (earlier.revision, write.revision)
            && before >= revision
        {
            found.push(anomaly(
                RevisionAnomalyKind::RevisionOrder,
                format!(
                    "write acknowledged at revision {revision}, invoked after a write acknowledged at revision {before} completed"
                ),
                &[earlier, write],
            ));
        }
    }
}

/// mod-revision-mismatch: a read's (key, value, `mod_revision`) agrees with
/// the ok write of that value, and with the ok write at that revision.
fn check_mod_revisions(
    operations: &[Operation],
    observed: &[&Operation],
    acked: &[&Operation],
    found: &mut Vec<RevisionAnomaly>,
) {
    // Writers of each (key, value), any outcome: a value written twice
    // cannot name its write.
    let mut writers: HashMap<(&str, &str), usize> = HashMap::new();
    for write in operations.iter().filter(|o| is_write(o)) {
        if let Some(value) = write.value.as_deref() {
            *writers.entry((write.key.as_str(), value)).or_default() += 1;
        }
    }
    let mut ack_of: HashMap<(&str, &str), &Operation> = HashMap::new();
    let mut at_revision: HashMap<u64, &Operation> = HashMap::new();
    for &write in acked {
        if let Some(value) = write.value.as_deref() {
            ack_of.insert((write.key.as_str(), value), write);
        }
        if let Some(revision) = write.revision {
            at_revision.entry(revision).or_insert(write);
        }
    }
    for &read in observed.iter().filter(|o| is_read(o)) {
        let (Some(value), Some(modified)) = (read.value.as_deref(), read.mod_revision) else {
            continue;
        };
        let key = (read.key.as_str(), value);
        if writers.get(&key) == Some(&1)
            && let Some(&write) = ack_of.get(&key)
            && write.revision != Some(modified)
        {
            found.push(anomaly(
                RevisionAnomalyKind::ModRevisionMismatch,
                format!(
                    "read {value:?} at mod_revision {modified}; the write of {value:?} was acknowledged at revision {}",
                    write.revision.unwrap_or_default()
                ),
                &[write, read],
            ));
        } else if let Some(&write) = at_revision.get(&modified)
            && (write.key != read.key || write.value.as_deref() != Some(value))
        {
            found.push(anomaly(
                RevisionAnomalyKind::ModRevisionMismatch,
                format!(
                    "read {value:?} at mod_revision {modified}, the revision of a write of {:?} to {:?}",
                    write.value.as_deref().unwrap_or(""),
                    write.key
                ),
                &[write, read],
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::{Event, EventType, pair};

    /// One event: `revision` and `mod_revision` only on completions.
    fn event(
        process: u64,
        event_type: EventType,
        f: Function,
        key: &str,
        value: Option<&str>,
        revisions: (Option<u64>, Option<u64>),
    ) -> Event {
        let mut event = Event::new(process, event_type, f, key);
        event.value = value.map(str::to_string);
        event.revision = revisions.0;
        event.mod_revision = revisions.1;
        event
    }

    fn invoke(process: u64, f: Function, key: &str, value: Option<&str>) -> Event {
        event(process, EventType::Invoke, f, key, value, (None, None))
    }

    /// An ok write acknowledged at `revision`.
    fn written(process: u64, key: &str, value: &str, revision: u64) -> Event {
        let revisions = (Some(revision), None);
        event(
            process,
            EventType::Ok,
            Function::Write,
            key,
            Some(value),
            revisions,
        )
    }

    /// An ok read at header revision `header`.
    fn read(
        process: u64,
        key: &str,
        value: Option<&str>,
        header: u64,
        modified: Option<u64>,
    ) -> Event {
        let revisions = (Some(header), modified);
        event(
            process,
            EventType::Ok,
            Function::Read,
            key,
            value,
            revisions,
        )
    }

    /// The kinds found, with their counts (zeros left out).
    fn found(events: &[Event]) -> Vec<(String, usize)> {
        let report = check(&pair(events).expect("pairs")).expect("revisions present");
        assert_eq!(
            report.examples.len(),
            report.anomaly_count().min(EXAMPLES_PER_KIND_MAX),
            "every anomaly of a small history is an example"
        );
        report
            .anomalies_by_kind
            .into_iter()
            .filter(|(_, count)| *count > 0)
            .collect()
    }

    fn only(kind: RevisionAnomalyKind) -> Vec<(String, usize)> {
        vec![(kind.name().to_string(), 1)]
    }

    /// Two processes, concurrent and sequential writes, reads of present
    /// and absent keys, a failed and an unknown write.
    fn clean() -> Vec<Event> {
        vec![
            invoke(0, Function::Write, "k", Some("a")),
            invoke(1, Function::Write, "j", Some("b")),
            written(1, "j", "b", 3),
            written(0, "k", "a", 2),
            invoke(1, Function::Read, "k", None),
            read(1, "k", Some("a"), 3, Some(2)),
            invoke(0, Function::Read, "absent", None),
            read(0, "absent", None, 3, None),
            invoke(0, Function::Cas, "k", Some("c")),
            event(
                0,
                EventType::Fail,
                Function::Cas,
                "k",
                Some("c"),
                (None, None),
            ),
            invoke(0, Function::Write, "k", Some("d")),
            event(
                0,
                EventType::Info,
                Function::Write,
                "k",
                Some("d"),
                (None, None),
            ),
            invoke(2, Function::Write, "k", Some("e")),
            written(2, "k", "e", 5),
            invoke(1, Function::Read, "k", None),
            // The unknown write of "d" applied at revision 4.
            read(1, "k", Some("e"), 5, Some(5)),
            invoke(3, Function::Read, "k", None),
            read(3, "k", Some("e"), 6, Some(5)),
        ]
    }

    #[test]
    fn a_clean_history_passes_and_lists_every_kind() {
        let report = check(&pair(&clean()).unwrap()).unwrap();
        assert!(report.valid(), "{report:?}");
        assert_eq!(report.operations_checked, 7);
        let kinds: Vec<&str> = report
            .anomalies_by_kind
            .keys()
            .map(String::as_str)
            .collect();
        let mut names: Vec<&str> = RevisionAnomalyKind::ALL.iter().map(|k| k.name()).collect();
        names.sort();
        assert_eq!(kinds, names);
    }

    #[test]
    fn a_history_without_revisions_is_not_checked() {
        let mut events = clean();
        for event in &mut events {
            event.revision = None;
            event.mod_revision = None;
        }
        assert_eq!(check(&pair(&events).unwrap()), None);
    }

    #[test]
    fn a_process_going_back_in_revisions_is_a_regression() {
        let events = vec![
            invoke(0, Function::Write, "k", Some("a")),
            written(0, "k", "a", 5),
            invoke(0, Function::Read, "j", None),
            read(0, "j", None, 4, None),
            // Another process may be behind: not a regression.
            invoke(1, Function::Read, "j", None),
            read(1, "j", None, 4, None),
        ];
        assert_eq!(
            found(&events),
            only(RevisionAnomalyKind::RevisionRegression)
        );
        let report = check(&pair(&events).unwrap()).unwrap();
        let ids: Vec<usize> = report.examples[0].operations.iter().map(|w| w.id).collect();
        assert_eq!(ids, vec![0, 1]);
        assert_eq!(report.examples[0].operations[1].revision, Some(4));
    }

    #[test]
    fn a_mod_revision_above_the_header_is_a_read_ahead_of_header() {
        let events = vec![
            invoke(0, Function::Write, "k", Some("a")),
            written(0, "k", "a", 3),
            invoke(1, Function::Read, "k", None),
            read(1, "k", Some("a"), 2, Some(3)),
        ];
        assert_eq!(found(&events), only(RevisionAnomalyKind::ReadAheadOfHeader));
    }

    #[test]
    fn two_concurrent_writes_at_one_revision_are_a_duplicate_revision() {
        let events = vec![
            invoke(0, Function::Write, "k", Some("a")),
            invoke(1, Function::Write, "j", Some("b")),
            written(0, "k", "a", 3),
            written(1, "j", "b", 3),
        ];
        assert_eq!(found(&events), only(RevisionAnomalyKind::DuplicateRevision));
    }

    #[test]
    fn a_later_write_at_a_lower_revision_breaks_revision_order() {
        let sequential = vec![
            invoke(0, Function::Write, "k", Some("a")),
            written(0, "k", "a", 4),
            invoke(1, Function::Write, "j", Some("b")),
            written(1, "j", "b", 3),
        ];
        assert_eq!(found(&sequential), only(RevisionAnomalyKind::RevisionOrder));
        // Overlapping writes may apply in either order.
        let concurrent = vec![
            invoke(0, Function::Write, "k", Some("a")),
            invoke(1, Function::Write, "j", Some("b")),
            written(0, "k", "a", 4),
            written(1, "j", "b", 3),
        ];
        assert_eq!(found(&concurrent), vec![]);
    }

    #[test]
    fn a_read_naming_the_wrong_write_is_a_mod_revision_mismatch() {
        // The value's own write was acknowledged at another revision.
        let own = vec![
            invoke(0, Function::Write, "k", Some("a")),
            written(0, "k", "a", 3),
            invoke(1, Function::Read, "k", None),
            read(1, "k", Some("a"), 5, Some(4)),
        ];
        assert_eq!(found(&own), only(RevisionAnomalyKind::ModRevisionMismatch));
        // The revision read is another key's write; the value's own write
        // has an unknown outcome, so only the revision can be judged.
        let other = vec![
            invoke(0, Function::Write, "j", Some("b")),
            written(0, "j", "b", 4),
            invoke(2, Function::Write, "k", Some("c")),
            event(
                2,
                EventType::Info,
                Function::Write,
                "k",
                Some("c"),
                (None, None),
            ),
            invoke(1, Function::Read, "k", None),
            read(1, "k", Some("c"), 5, Some(4)),
        ];
        assert_eq!(
            found(&other),
            only(RevisionAnomalyKind::ModRevisionMismatch)
        );
        // A value written twice does not name its write.
        let twice = vec![
            invoke(0, Function::Write, "k", Some("a")),
            written(0, "k", "a", 3),
            invoke(0, Function::Write, "k", Some("a")),
            written(0, "k", "a", 4),
            invoke(1, Function::Read, "k", None),
            read(1, "k", Some("a"), 5, Some(4)),
        ];
        assert_eq!(found(&twice), vec![]);
    }

    #[test]
    fn every_anomaly_is_counted_and_the_first_few_kept() {
        let mut events = vec![
            invoke(0, Function::Write, "k", Some("a")),
            written(0, "k", "a", 100),
        ];
        for n in 0..(EXAMPLES_PER_KIND_MAX as u64 + 2) {
            events.push(invoke(0, Function::Read, "j", None));
            events.push(read(0, "j", None, 10 + n, None));
        }
        let report = check(&pair(&events).unwrap()).unwrap();
        let regressions = EXAMPLES_PER_KIND_MAX + 2;
        assert_eq!(
            report.count(RevisionAnomalyKind::RevisionRegression),
            regressions
        );
        assert_eq!(report.examples.len(), EXAMPLES_PER_KIND_MAX);
        let first: Vec<usize> = report.examples.iter().map(|a| a.operations[1].id).collect();
        assert_eq!(first, (1..=EXAMPLES_PER_KIND_MAX).collect::<Vec<_>>());
    }
}
