//! The cheap checks of raftcask histories, which carry versions (`log index ×
//! 65536 + position`, increasing with every applied write of a key) and
//! applied indexes. They run in near-linear time, so they also cover
//! histories too big for the linearizability search, and they name the
//! anomaly precisely:
//!
//! - **stale read**: an ok read returned a version older than an ok write of
//!   the key that completed before the read was invoked;
//! - **phantom value**: an ok read returned a value that no ok or unknown
//!   write of the key (invoked before the read completed) wrote, or a value
//!   other than the one the ok write with that version wrote, or "absent" at
//!   a non-zero version;
//! - **duplicate apply**: one write observed at two versions (its
//!   acknowledgement and reads together; only values written by exactly one
//!   operation are judged), or two ok writes acknowledged with the same version;
//! - **index behind version**: an ok operation returned an applied index
//!   below the log index its version names.

use std::collections::{BTreeSet, HashMap};

use serde::Serialize;

use crate::history::{Function, Operation, Outcome, by_key};

/// Bits of a version below its log index (`version = index << 16 | position`).
pub const VERSION_INDEX_SHIFT: u32 = 16;

/// The anomalies the cheap checks name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum AnomalyKind {
    /// A read older than a write acknowledged before it started.
    StaleRead,
    /// A value nobody wrote (or not at that version).
    PhantomValue,
    /// A write applied twice, or one version given to two writes.
    DuplicateApply,
    /// An applied index below the index of the version returned.
    IndexBehindVersion,
    /// An acknowledged write missing from the final read (see `lost_writes`).
    LostWrite,
}

/// One anomaly.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Anomaly {
    /// What it is.
    pub kind: AnomalyKind,
    /// The key.
    pub key: String,
    /// What was seen, in words.
    pub message: String,
    /// The operations involved.
    pub operations: Vec<String>,
}

fn is_write(operation: &Operation) -> bool {
    matches!(operation.f, Function::Write | Function::Cas | Function::Put)
}

fn is_read(operation: &Operation) -> bool {
    matches!(operation.f, Function::Read | Function::Get)
}

/// Runs the cheap checks over every key.
pub fn check(operations: &[Operation]) -> Vec<Anomaly> {
    let mut anomalies = Vec::new();
    for (key, operations) in by_key(operations) {
        check_key(&key, &operations, &mut anomalies);
    }
    anomalies
}

/// Reports one key's anomalies into a list.
struct Reporter<'a> {
    key: &'a str,
    anomalies: &'a mut Vec<Anomaly>,
}

impl Reporter<'_> {
    fn report(&mut self, kind: AnomalyKind, message: String, involved: &[&Operation]) {
        self.anomalies.push(Anomaly {
            kind,
            key: self.key.to_string(),
            message,
            operations: involved.iter().map(|o| o.describe()).collect(),
        });
    }
}

fn check_key(key: &str, operations: &[Operation], anomalies: &mut Vec<Anomaly>) {
    let mut r = Reporter { key, anomalies };
    let acked: Vec<&Operation> = operations
        .iter()
        .filter(|o| is_write(o) && o.outcome == Outcome::Ok && o.version.is_some())
        .collect();
    let reads: Vec<&Operation> = operations
        .iter()
        .filter(|o| is_read(o) && o.outcome == Outcome::Ok)
        .collect();
    check_index_behind_version(operations, &mut r);
    check_stale_reads(&acked, &reads, &mut r);
    check_phantom_values(operations, &acked, &reads, &mut r);
    check_duplicate_applies(operations, &acked, &reads, &mut r);
}

/// Index behind version.
fn check_index_behind_version(operations: &[Operation], r: &mut Reporter<'_>) {
    for operation in operations.iter().filter(|o| o.outcome == Outcome::Ok) {
        if let (Some(version), Some(index)) = (operation.version, operation.index)
            && index < version >> VERSION_INDEX_SHIFT
        {
            r.report(
                AnomalyKind::IndexBehindVersion,
                format!(
                    "applied index {index} is below the log index {} of version {version}",
                    version >> VERSION_INDEX_SHIFT
                ),
                &[operation],
            );
        }
    }
}

/// Stale reads: prefix maxima of acknowledged versions in completion order.
fn check_stale_reads(acked: &[&Operation], reads: &[&Operation], r: &mut Reporter<'_>) {
    let mut by_completion: Vec<&Operation> = acked.to_vec();
    by_completion.sort_by_key(|o| o.complete_position);
    let mut newest: Vec<(usize, &Operation)> = Vec::with_capacity(by_completion.len());
    for write in &by_completion {
        let done = write.complete_position.unwrap_or(usize::MAX);
        match newest.last() {
            Some((_, best)) if best.version >= write.version => newest.push((done, best)),
            _ => newest.push((done, write)),
        }
    }
    for read in reads {
        let Some(version) = read.version else {
            continue;
        };
        let finished = newest.partition_point(|(done, _)| *done < read.invoke_position);
        if finished == 0 {
            continue;
        }
        let (_, write) = newest[finished - 1];
        if write.version.is_some_and(|written| written > version) {
            r.report(
                AnomalyKind::StaleRead,
                format!(
                    "read version {version} after a write acknowledged at version {} completed",
                    write.version.unwrap_or_default()
                ),
                &[read, write],
            );
        }
    }
}

/// Phantom values.
fn check_phantom_values(
    operations: &[Operation],
    acked: &[&Operation],
    reads: &[&Operation],
    r: &mut Reporter<'_>,
) {
    let writers_of = |value: &str| -> Vec<&Operation> {
        operations
            .iter()
            .filter(|o| {
                is_write(o) && o.outcome != Outcome::Fail && o.value.as_deref() == Some(value)
            })
            .collect()
    };
    let by_version: HashMap<u64, &Operation> = acked
        .iter()
        .filter_map(|o| Some((o.version?, *o)))
        .collect();
    for read in reads {
        match (&read.value, read.version) {
            (None, Some(version)) if version != 0 => r.report(
                AnomalyKind::PhantomValue,
                format!("read absent at version {version}"),
                &[read],
            ),
            (None, _) => {}
            (Some(value), version) => {
                let possible: Vec<&Operation> = writers_of(value)
                    .into_iter()
                    .filter(|w| {
                        read.complete_position
                            .is_none_or(|done| w.invoke_position < done)
                    })
                    .collect();
                if possible.is_empty() {
                    r.report(
                        AnomalyKind::PhantomValue,
                        format!(
                            "read {value:?}, which no write invoked before the read completed wrote"
                        ),
                        &[read],
                    );
                } else if let Some(write) = version.and_then(|v| by_version.get(&v))
                    && write.value.as_deref() != Some(value.as_str())
                {
                    r.report(
                        AnomalyKind::PhantomValue,
                        format!(
                            "read {value:?} at version {}, which the write acknowledged with that version did not write",
                            write.version.unwrap_or_default()
                        ),
                        &[read, write],
                    );
                }
            }
        }
    }
}

/// Duplicate applies: one version per write.
fn check_duplicate_applies(
    operations: &[Operation],
    acked: &[&Operation],
    reads: &[&Operation],
    r: &mut Reporter<'_>,
) {
    let mut writer_count: HashMap<&str, usize> = HashMap::new();
    for write in operations.iter().filter(|o| is_write(o)) {
        if let Some(value) = write.value.as_deref() {
            *writer_count.entry(value).or_default() += 1;
        }
    }
    let mut seen: HashMap<&str, (BTreeSet<u64>, Vec<&Operation>)> = HashMap::new();
    for operation in acked.iter().chain(reads.iter()) {
        let (Some(value), Some(version)) = (operation.value.as_deref(), operation.version) else {
            continue;
        };
        if writer_count.get(value) != Some(&1) {
            continue;
        }
        let entry = seen.entry(value).or_default();
        if entry.0.insert(version) {
            entry.1.push(operation);
        }
    }
    let mut duplicates: Vec<(&str, Vec<&Operation>, BTreeSet<u64>)> = seen
        .into_iter()
        .filter(|(_, (versions, _))| versions.len() > 1)
        .map(|(value, (versions, ops))| (value, ops, versions))
        .collect();
    duplicates.sort_by_key(|(_, ops, _)| ops.first().map(|o| o.id));
    for (value, involved, versions) in duplicates {
        r.report(
            AnomalyKind::DuplicateApply,
            format!("the one write of {value:?} was seen at versions {versions:?}"),
            &involved,
        );
    }
    let mut versions: HashMap<u64, &Operation> = HashMap::new();
    for write in acked {
        let Some(version) = write.version else {
            continue;
        };
        if let Some(first) = versions.insert(version, write) {
            r.report(
                AnomalyKind::DuplicateApply,
                format!("two writes acknowledged with version {version}"),
                &[first, write],
            );
        }
    }
}
