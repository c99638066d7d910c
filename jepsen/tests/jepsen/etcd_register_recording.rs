//! Proves the etcd-register workload's recording and checks without a
//! cluster: operations recorded the way its client records them (the
//! history's invoke / complete, the answer filled in by
//! `etcd_register::Done::record`) and checked as a run of that workload
//! (`verdict::check_run`) pass when they are a correct register, and a
//! stale read, a compare-and-set applied against another value, or a
//! read whose `mod_revision` is not its write's revision make the verdict
//! not valid, each by the checker that should catch it (linearizability
//! by value, the revision checks).

use std::sync::Arc;

use jepsen::linearizability::Verdict;
use jepsen::revision_checks::RevisionAnomalyKind;
use jepsen::run::WorkloadKind;
use jepsen::verdict::check_run;
use jepsen::workload::etcd_register::{Done, Request};
use jepsen::workload::{History, Outcome, Record};

use crate::common::run_dir;

const KEY: &str = "r/000000";

/// One operation: its process, what it asked, and how it ended.
struct Step {
    process: u64,
    request: Request,
    done: Done,
}

fn write(process: u64, value: &str, revision: u64) -> Step {
    Step {
        process,
        request: Request::Write {
            value: value.to_string(),
        },
        done: Done {
            outcome: Outcome::Ok,
            seen: Some(Some(value.to_string())),
            revision: Some(revision),
            mod_revision: None,
            error: None,
        },
    }
}

fn cas(process: u64, expected: &str, value: &str, revision: u64) -> Step {
    Step {
        process,
        request: Request::Cas {
            expected: expected.to_string(),
            value: value.to_string(),
        },
        ..write(process, value, revision)
    }
}

fn read(process: u64, value: &str, header: u64, mod_revision: u64) -> Step {
    Step {
        process,
        request: Request::Read,
        done: Done {
            outcome: Outcome::Ok,
            seen: Some(Some(value.to_string())),
            revision: Some(header),
            mod_revision: Some(mod_revision),
            error: None,
        },
    }
}

/// Records the steps one after another, as the workload's workers do.
fn record(name: &str, steps: Vec<Step>) -> Vec<Record> {
    let dir = run_dir(name);
    std::fs::create_dir_all(&dir).expect("run dir");
    let history: Arc<History> = History::create(&dir.join("history.jsonl")).expect("history");
    for step in steps {
        let mut pending = step.request.invoke(&history, step.process, KEY, None);
        step.done.record(pending.op_mut());
        history
            .complete(pending, step.done.outcome)
            .expect("complete");
    }
    let records = history.records();
    let _ = std::fs::remove_dir_all(&dir);
    records
}

/// A correct run: a write, a read of it, a cas from it, a write of
/// unknown outcome (a timeout) that a later read shows applied.
fn correct() -> Vec<Step> {
    vec![
        write(0, "p0-1", 2),
        read(1, "p0-1", 2, 2),
        cas(1, "p0-1", "p1-2", 3),
        Step {
            process: 2,
            request: Request::Write {
                value: "p2-1".to_string(),
            },
            done: Done {
                outcome: Outcome::Info,
                seen: None,
                revision: None,
                mod_revision: None,
                error: Some("timed out after 2000 ms".to_string()),
            },
        },
        read(0, "p2-1", 4, 4),
    ]
}

#[test]
fn a_correct_etcd_register_history_passes_with_revisions_checked() {
    let report =
        check_run(&record("etcd-ok", correct()), WorkloadKind::EtcdRegister).expect("checks");
    assert_eq!(
        report.verdict,
        Verdict::Linearizable,
        "{}",
        report.summary()
    );
    let revisions = report.revisions.as_ref().expect("revision checks ran");
    assert_eq!(revisions.anomaly_count(), 0, "{}", report.summary());
    assert_eq!(revisions.operations_checked, 4, "{}", report.summary());
}

#[test]
fn a_stale_read_through_the_etcd_client_is_not_linearizable() {
    let mut steps = correct();
    // After the cas to p1-2 was acknowledged, a read still sees p0-1 (its
    // revisions consistent with itself: only the value gives it away).
    steps.insert(3, read(2, "p0-1", 3, 2));
    let report =
        check_run(&record("etcd-stale", steps), WorkloadKind::EtcdRegister).expect("checks");
    assert_eq!(
        report.verdict,
        Verdict::NotLinearizable,
        "{}",
        report.summary()
    );
    let linearizability = report.linearizability.as_ref().expect("linearizability");
    assert_eq!(linearizability.verdict, Verdict::NotLinearizable);
}

#[test]
fn a_cas_applied_against_another_value_is_not_linearizable() {
    let mut steps = correct();
    // The key holds p0-1, yet a cas expecting a value nobody wrote applied.
    steps[2] = cas(1, "p9-9", "p1-2", 3);
    let report = check_run(&record("etcd-cas", steps), WorkloadKind::EtcdRegister).expect("checks");
    assert_eq!(
        report.verdict,
        Verdict::NotLinearizable,
        "{}",
        report.summary()
    );
}

#[test]
fn a_read_with_the_wrong_mod_revision_fails_the_revision_checks() {
    let mut steps = correct();
    // p0-1 was written at revision 2; a read says it was at 3 (the cas's).
    steps[1] = read(1, "p0-1", 3, 3);
    let report =
        check_run(&record("etcd-modrev", steps), WorkloadKind::EtcdRegister).expect("checks");
    let linearizability = report.linearizability.as_ref().expect("linearizability");
    assert_eq!(
        linearizability.verdict,
        Verdict::Linearizable,
        "by value it is fine"
    );
    let revisions = report.revisions.as_ref().expect("revision checks ran");
    assert!(
        revisions.count(RevisionAnomalyKind::ModRevisionMismatch) > 0,
        "{}",
        report.summary()
    );
    assert_eq!(
        report.verdict,
        Verdict::NotLinearizable,
        "{}",
        report.summary()
    );
}
