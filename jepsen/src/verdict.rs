//! From a run's records to the checkers' verdict: each harness operation
//! becomes an invoke and a completion [`Event`] in the checkers' history
//! format, in monotonic time order, and the workload's checker runs on them.
//!
//! - `register`: reads, writes and version compare-and-sets map one to one
//!   onto the `register` model (linearizability per key, plus the cheap
//!   version checks: stale read, phantom value, duplicate apply; and the
//!   revision checks when the operations carry revisions).
//! - `redis-register`: reads, writes and compare-and-sets by value (the
//!   Redis port returns no versions) map one to one onto the
//!   `cas-register` model: linearizability per key, final reads included.
//! - `etcd-register`: the same by value (etcd's Txn compares the value),
//!   and the completions carry etcd's revisions (a read's header revision
//!   and `mod_revision`, an ok write's applied revision), so the
//!   `cas-register` checks add the revision checks.
//! - `set`: every element is its own key in the cluster, but the checker
//!   sees one set: each add is an `add` of the element to the set, the final
//!   prefix scan (`read-all`) is the set's final read with the elements it
//!   returned. Reads of single elements are left out (the set checker
//!   judges adds against the final read).
//!
//! Ties in time put invocations before completions, which never makes a
//! history stricter than what happened.

use crate::check::{CheckReport, ModelName, check};
use crate::history::{Event, EventType, Function as CheckFunction};
use crate::linearizability::Settings;
use crate::run::WorkloadKind;
use crate::workload::{Function, Op, Outcome, Record};

/// The key the set workload's checker history uses for the whole set.
pub const SET_KEY: &str = "set";

/// The checker's model for a workload.
pub fn model_of(workload: WorkloadKind) -> ModelName {
    match workload {
        WorkloadKind::Register => ModelName::Register,
        WorkloadKind::Set => ModelName::Set,
        // The ttl workload has a checker of its own (`ttl_check`); its
        // reads and writes are still those of a register.
        WorkloadKind::Ttl => ModelName::Register,
        // The exactly-once workload has a checker of its own
        // (`exactly_once`); its adds and final scan are those of a set.
        WorkloadKind::ExactlyOnce => ModelName::Set,
        // The watch workload has a checker of its own (`watch_check`).
        WorkloadKind::Watch => ModelName::Register,
        // The lease workload has a checker of its own (`lease_check`).
        WorkloadKind::Lease => ModelName::Register,
        // No versions on the Redis port: by value (every value is unique).
        WorkloadKind::RedisRegister => ModelName::CasRegister,
        // A cas by value, as Jepsen's etcd test; revisions checked too.
        WorkloadKind::EtcdRegister => ModelName::CasRegister,
    }
}

fn completion_type(outcome: Outcome) -> EventType {
    match outcome {
        Outcome::Ok => EventType::Ok,
        Outcome::Fail => EventType::Fail,
        Outcome::Info => EventType::Info,
    }
}

/// The two events of one operation, or none when the checker does not
/// look at it.
fn events_of(op: &Op, workload: WorkloadKind) -> Option<[(u64, u8, Event); 2]> {
    let (f, key) = match (workload, op.f) {
        (WorkloadKind::Register, Function::Read) => (CheckFunction::Read, op.key.as_str()),
        (WorkloadKind::Register, Function::Write) => (CheckFunction::Write, op.key.as_str()),
        (WorkloadKind::Register, Function::Cas) => (CheckFunction::Cas, op.key.as_str()),
        (WorkloadKind::RedisRegister, Function::Read) => (CheckFunction::Read, op.key.as_str()),
        (WorkloadKind::RedisRegister, Function::Write) => (CheckFunction::Write, op.key.as_str()),
        (WorkloadKind::RedisRegister, Function::Cas) => (CheckFunction::Cas, op.key.as_str()),
        (WorkloadKind::EtcdRegister, Function::Read) => (CheckFunction::Read, op.key.as_str()),
        (WorkloadKind::EtcdRegister, Function::Write) => (CheckFunction::Write, op.key.as_str()),
        (WorkloadKind::EtcdRegister, Function::Cas) => (CheckFunction::Cas, op.key.as_str()),
        (WorkloadKind::Set, Function::Add) => (CheckFunction::Add, SET_KEY),
        (WorkloadKind::Set, Function::ReadAll) => (CheckFunction::Read, SET_KEY),
        _ => return None,
    };
    let mut invoke = Event::new(op.process, EventType::Invoke, f, key);
    invoke.monotonic_ns = Some(op.invoke_ns);
    invoke.wall_time_unix_ms = Some(op.invoke_wall_us / 1000);
    let mut done = Event::new(op.process, completion_type(op.outcome), f, key);
    done.monotonic_ns = Some(op.complete_ns);
    done.wall_time_unix_ms = Some(op.complete_wall_us / 1000);
    done.error = op.error.clone();
    match f {
        CheckFunction::Read if workload == WorkloadKind::Set => {
            done.values = op.values.clone();
        }
        CheckFunction::Read => {
            done.value = op.value.clone();
            done.version = op.version;
            done.index = op.index;
            if op.outcome == Outcome::Ok {
                done.revision = op.revision;
                done.mod_revision = op.mod_revision;
            }
        }
        _ => {
            invoke.value = op.value.clone();
            invoke.expected = op.expected.clone();
            invoke.expected_version = op.expected_version;
            invoke.expected_mod_revision = op.expected_mod_revision;
            done.value = op.value.clone();
            done.expected = op.expected.clone();
            done.expected_version = op.expected_version;
            done.expected_mod_revision = op.expected_mod_revision;
            if op.outcome == Outcome::Ok {
                done.version = op.version;
                done.index = op.index;
                done.revision = op.revision;
            }
        }
    }
    Some([(op.invoke_ns, 0, invoke), (op.complete_ns, 1, done)])
}

/// The checkers' history of a run's records.
pub fn to_events(records: &[Record], workload: WorkloadKind) -> Vec<Event> {
    let mut timeline: Vec<(u64, u8, Event)> = records
        .iter()
        .filter_map(|record| match record {
            Record::Op(op) => events_of(op, workload),
            Record::Nemesis(_) => None,
        })
        .flatten()
        .collect();
    timeline.sort_by_key(|(time, phase, _)| (*time, *phase));
    timeline.into_iter().map(|(_, _, event)| event).collect()
}

/// Runs the workload's checker on a run's records.
pub fn check_run(records: &[Record], workload: WorkloadKind) -> anyhow::Result<CheckReport> {
    let events = to_events(records, workload);
    check(model_of(workload), &events, Settings::default())
        .map_err(|err| anyhow::anyhow!("checking the history: {err}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::revision_checks::RevisionAnomalyKind;

    /// One register operation of its own process, at `at` (invoke) to
    /// `at + 1` (completion), in µs and ns alike.
    fn op(id: u64, f: Function, value: &str, at: u64) -> Op {
        Op {
            id,
            process: id,
            f,
            key: "r/000000".into(),
            value: Some(value.into()),
            expected_version: None,
            values: None,
            outcome: Outcome::Ok,
            version: Some((id + 1) << 16),
            index: Some(id + 1),
            revision: None,
            mod_revision: None,
            expected_mod_revision: None,
            error: None,
            invoke_wall_us: at,
            invoke_ns: at,
            complete_wall_us: at + 1,
            complete_ns: at + 1,
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

    /// A write, then a read of it, filled the way the register workload
    /// will fill them; `read_header` is the read's header revision.
    fn write_then_read(read_header: u64) -> Vec<Record> {
        let mut write = op(0, Function::Write, "p0-1", 10);
        write.record_write_revision(2);
        let mut read = op(1, Function::Read, "p0-1", 20);
        read.version = write.version;
        read.record_read_revisions(read_header, Some(2));
        vec![Record::Op(write), Record::Op(read)]
    }

    #[test]
    fn revisions_recorded_by_the_workload_reach_the_revision_checks() {
        let report = check_run(&write_then_read(2), WorkloadKind::Register).unwrap();
        let revisions = report.revisions.as_ref().expect("revision checks ran");
        assert_eq!(revisions.operations_checked, 2);
        assert!(revisions.valid(), "{}", report.summary());
        assert_eq!(report.exit_code(), crate::check::EXIT_VALID);

        let report = check_run(&write_then_read(1), WorkloadKind::Register).unwrap();
        let revisions = report.revisions.as_ref().expect("revision checks ran");
        assert_eq!(revisions.count(RevisionAnomalyKind::ReadAheadOfHeader), 1);
        assert_eq!(report.exit_code(), crate::check::EXIT_INVALID);
        let json = serde_json::to_value(&report).unwrap();
        assert_eq!(
            json["revisions"]["anomalies_by_kind"]["read-ahead-of-header"],
            1
        );
        assert_eq!(json["revisions"]["examples"][0]["operations"][0]["id"], 1);
    }

    #[test]
    fn records_without_revisions_are_not_revision_checked() {
        let records: Vec<Record> = write_then_read(1)
            .into_iter()
            .map(|record| match record {
                Record::Op(mut op) => {
                    op.revision = None;
                    op.mod_revision = None;
                    Record::Op(op)
                }
                other => other,
            })
            .collect();
        let report = check_run(&records, WorkloadKind::Register).unwrap();
        assert!(report.revisions.is_none());
        assert_eq!(report.exit_code(), crate::check::EXIT_VALID);
    }

    #[test]
    fn an_absent_key_read_at_mod_revision_zero_has_none() {
        let mut read = op(0, Function::Read, "", 0);
        read.record_read_revisions(7, Some(0));
        assert_eq!((read.revision, read.mod_revision), (Some(7), None));
        let mut write = op(1, Function::Cas, "v", 0);
        write.record_write_revision(8);
        assert_eq!((write.revision, write.mod_revision), (Some(8), None));
    }

    /// A redis-register history: a SET, a WATCH/EXEC cas from its value, a
    /// GET of the last value `read_value` — no versions, by value.
    fn redis_history(read_value: &str) -> Vec<Record> {
        let unversioned = |mut op: Op| {
            op.version = None;
            op.index = None;
            Record::Op(op)
        };
        let write = op(0, Function::Write, "p0-1", 10);
        let mut cas = op(1, Function::Cas, "p1-1", 20);
        cas.expected = Some("p0-1".into());
        let read = op(2, Function::Read, read_value, 30);
        vec![unversioned(write), unversioned(cas), unversioned(read)]
    }

    #[test]
    fn redis_register_runs_are_checked_by_value() {
        assert_eq!(
            model_of(WorkloadKind::RedisRegister),
            ModelName::CasRegister
        );
        let events = to_events(&redis_history("p1-1"), WorkloadKind::RedisRegister);
        assert_eq!(events.len(), 6);
        assert_eq!(events[2].expected.as_deref(), Some("p0-1"));
        let report = check_run(&redis_history("p1-1"), WorkloadKind::RedisRegister).unwrap();
        assert_eq!(
            report.exit_code(),
            crate::check::EXIT_VALID,
            "{}",
            report.summary()
        );
        // A GET of the value the cas replaced, after the cas was
        // acknowledged: a stale read.
        let report = check_run(&redis_history("p0-1"), WorkloadKind::RedisRegister).unwrap();
        assert_eq!(
            report.exit_code(),
            crate::check::EXIT_INVALID,
            "{}",
            report.summary()
        );
    }
}
