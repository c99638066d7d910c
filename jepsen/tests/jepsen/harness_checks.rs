//! Proves the harness's own run checks can fail: item 7's minimums (ok
//! writes, ok reads, an ok operation after every heal) and the history's
//! well-formedness flag the histories that break them, and pass one that
//! keeps them. Pure functions on hand-made histories; no cluster, no root.

use jepsen::run::check_minimums;
use jepsen::workload::{Function, NemesisEvent, Op, Outcome, Phase, Record, check_well_formed};

fn op(
    id: u64,
    process: u64,
    f: Function,
    outcome: Outcome,
    invoke_ns: u64,
    complete_ns: u64,
) -> Record {
    Record::Op(Op {
        id,
        process,
        f,
        key: "r/000000".into(),
        value: Some(format!("v{id}")),
        expected_version: None,
        values: None,
        outcome,
        version: Some(id),
        index: Some(id),
        revision: None,
        mod_revision: None,
        expected_mod_revision: None,
        error: None,
        invoke_wall_us: invoke_ns / 1000,
        invoke_ns,
        complete_wall_us: complete_ns / 1000,
        complete_ns,
        ttl_ms: None,
        stale_min_index: None,
        member: None,
        versions: None,
        final_read: false,
        found: None,
        watch: None,
        lease: None,
        expected: None,
    })
}

fn event(fault: &str, phase: Phase, time_ns: u64) -> Record {
    Record::Nemesis(NemesisEvent {
        fault: fault.into(),
        phase,
        detail: String::new(),
        wall_us: time_ns / 1000,
        time_ns,
    })
}

/// Three ok writes and two ok reads on two processes, a fault healed at
/// 50 with an ok read and an ok write invoked after it.
fn good_history() -> Vec<Record> {
    vec![
        op(0, 0, Function::Write, Outcome::Ok, 0, 10),
        op(1, 1, Function::Read, Outcome::Ok, 5, 15),
        event("kill", Phase::Start, 20),
        op(2, 0, Function::Cas, Outcome::Ok, 30, 40),
        event("kill", Phase::Stop, 50),
        op(3, 1, Function::Read, Outcome::Ok, 60, 70),
        op(4, 0, Function::Write, Outcome::Ok, 62, 72),
    ]
}

/// A final read after the schedule (it does not count as work).
fn final_read(id: u64, process: u64, outcome: Outcome, invoke_ns: u64) -> Record {
    let mut record = op(
        id,
        process,
        Function::Read,
        outcome,
        invoke_ns,
        invoke_ns + 5,
    );
    if let Record::Op(op) = &mut record {
        op.final_read = true;
    }
    record
}

#[test]
fn a_history_that_did_enough_passes() {
    let history = good_history();
    assert_eq!(check_minimums(&history, 2, 2), Vec::<String>::new());
    assert_eq!(check_well_formed(&history), Vec::<String>::new());
}

#[test]
fn too_few_ok_writes_or_reads_fail_the_run() {
    let history = good_history();
    let problems = check_minimums(&history, 4, 2);
    assert!(
        problems.len() == 1 && problems[0].contains("min_ok_writes"),
        "{problems:?}"
    );
    let problems = check_minimums(&history, 2, 3);
    assert!(
        problems.len() == 1 && problems[0].contains("min_ok_reads"),
        "{problems:?}"
    );
}

#[test]
fn no_ok_operation_after_a_heal_fails_the_run() {
    let mut history = good_history();
    // The only read after the heal did not succeed.
    history[5] = op(3, 1, Function::Read, Outcome::Fail, 60, 70);
    let problems = check_minimums(&history, 1, 1);
    assert!(
        problems.len() == 1 && problems[0].contains("no ok read invoked between the heal of kill"),
        "{problems:?}"
    );
    // An ok read after the heal, but no ok write: also short.
    let mut history = good_history();
    history.pop();
    let problems = check_minimums(&history, 1, 1);
    assert!(
        problems.len() == 1 && problems[0].contains("no ok write invoked between the heal of kill"),
        "{problems:?}"
    );
    // The ok read after the heal comes only after the next fault started.
    let mut history = good_history();
    history.insert(5, event("kill", Phase::Start, 55));
    history.push(event("kill", Phase::Stop, 80));
    history.push(op(5, 1, Function::Read, Outcome::Ok, 90, 95));
    history.push(op(6, 0, Function::Write, Outcome::Ok, 91, 96));
    let problems = check_minimums(&history, 1, 1);
    assert!(
        problems.len() == 2 && problems.iter().all(|p| p.contains("+0.00 s")),
        "{problems:?}"
    );
}

#[test]
fn a_stop_inside_an_outer_fault_window_is_not_a_heal() {
    // A sequence fault with steps of its own: the step's stop leaves the
    // outer window open, so no ok op is needed before the next step.
    let history = vec![
        op(0, 0, Function::Write, Outcome::Ok, 0, 10),
        op(1, 1, Function::Read, Outcome::Ok, 5, 15),
        event("restart-after-idle", Phase::Start, 20),
        event("idle-restart", Phase::Start, 30),
        event("idle-restart", Phase::Stop, 40),
        event("idle-restart", Phase::Start, 45),
        event("idle-restart", Phase::Stop, 50),
        event("restart-after-idle", Phase::Stop, 60),
        op(2, 1, Function::Read, Outcome::Ok, 70, 75),
        op(3, 0, Function::Write, Outcome::Ok, 71, 76),
    ];
    assert_eq!(check_minimums(&history, 2, 2), Vec::<String>::new());
}

#[test]
fn final_reads_do_not_count_as_work() {
    // Every read during the schedule failed; only the final healed reads
    // succeeded. The old rule (every ok read counted) passed this run.
    let mut history = vec![
        op(0, 0, Function::Write, Outcome::Ok, 0, 10),
        op(1, 1, Function::Read, Outcome::Fail, 5, 15),
        event("partition-leader", Phase::Start, 20),
        op(2, 0, Function::Write, Outcome::Ok, 30, 40),
        op(3, 1, Function::Read, Outcome::Fail, 31, 41),
        event("partition-leader", Phase::Stop, 50),
        op(4, 0, Function::Write, Outcome::Ok, 60, 70),
        op(5, 1, Function::Read, Outcome::Fail, 61, 71),
    ];
    for id in 6..10 {
        history.push(final_read(id, 2 + id, Outcome::Ok, 100 + id));
    }
    let problems = check_minimums(&history, 3, 2);
    assert!(
        problems
            .iter()
            .any(|p| p.contains("0 ok reads invoked during the schedule")),
        "{problems:?}"
    );
    assert!(
        problems
            .iter()
            .any(|p| p.contains("no ok read invoked between the heal of partition-leader")),
        "{problems:?}"
    );
    // An op invoked after the first final read does not count either.
    let mut late = history.clone();
    late.push(op(10, 1, Function::Read, Outcome::Ok, 200, 210));
    let problems = check_minimums(&late, 3, 2);
    assert!(
        problems
            .iter()
            .any(|p| p.contains("0 ok reads invoked during the schedule")),
        "{problems:?}"
    );
}

#[test]
fn minimums_scale_with_the_schedule() {
    use jepsen::run::minimum_for;
    use std::time::Duration;
    assert_eq!(minimum_for(20, Duration::from_secs(30)), 20);
    assert_eq!(minimum_for(20, Duration::from_secs(10)), 20);
    assert_eq!(minimum_for(20, Duration::from_secs(100)), 67);
    assert_eq!(minimum_for(20, Duration::from_secs(600)), 400);
}

#[test]
fn malformed_histories_are_flagged() {
    // One process with overlapping ops.
    let mut overlapping = good_history();
    overlapping[1] = op(1, 0, Function::Read, Outcome::Ok, 5, 15);
    assert!(!check_well_formed(&overlapping).is_empty());
    // A process continuing after an unknown outcome.
    let mut after_info = good_history();
    after_info[0] = op(0, 0, Function::Write, Outcome::Info, 0, 10);
    assert!(!check_well_formed(&after_info).is_empty());
    // A fault never healed.
    let mut unhealed = good_history();
    unhealed.remove(4);
    assert!(!check_well_formed(&unhealed).is_empty());
    // A duplicate op id.
    let mut duplicate = good_history();
    duplicate.push(op(3, 2, Function::Read, Outcome::Ok, 80, 90));
    assert!(!check_well_formed(&duplicate).is_empty());
}

/// The `jepsen run` flags as the binary will parse them (the lead wires
/// `RunArgs` into the binary's subcommands).
#[derive(Debug, clap::Parser)]
struct RunCli {
    #[command(flatten)]
    run: jepsen::run::RunArgs,
}

#[test]
fn run_flags_parse_and_bad_ones_are_refused() {
    use clap::Parser as _;
    use jepsen::nemesis::Fault;
    let cli = RunCli::try_parse_from([
        "run",
        "--workload",
        "register",
        "--nemesis",
        "partition-leader,kill",
        "--time",
        "30s",
        "--nodes",
        "3",
        "--out",
        "/tmp/x",
    ])
    .expect("the brief's example parses");
    assert_eq!(cli.run.nemesis.0, [Fault::PartitionLeader, Fault::Kill]);
    assert_eq!(cli.run.time, std::time::Duration::from_secs(30));
    assert_eq!(cli.run.nodes, Some(3));
    let err = RunCli::try_parse_from(["run", "--nemesis", "partition-sideways", "--out", "/tmp/x"])
        .expect_err("an unknown nemesis is refused");
    assert!(err.to_string().contains("partition-sideways"), "{err}");
    assert!(RunCli::try_parse_from(["run", "--time", "2d", "--out", "/tmp/x"]).is_err());
    assert!(RunCli::try_parse_from(["run", "--time", "2h", "--out", "/tmp/x"]).is_err());
}
