//! Proves the harness end to end: a short register run against three real
//! `kvnode` processes inside a private network namespace, with the leader
//! partitioned away (iptables) and then a member SIGKILLed and restarted,
//! does enough to count (the ok-write / ok-read minimums and an ok
//! operation after each heal), reads every written key once more after
//! the heal (so no key escapes the lost-write check), records both faults' starts and stops,
//! writes a well-formed history and a summary, and leaves no member
//! process behind. Needs root (CI is root) and a built `kvnode` (`cargo
//! test --workspace` builds it; alone: `cargo build -p kvnode` first).

use std::path::PathBuf;
use std::process::ExitCode;
use std::str::FromStr as _;
use std::time::Duration;

use jepsen::nemesis::{Fault, FaultList};
use jepsen::run::{RunArgs, WorkloadKind, check_minimums};
use jepsen::workload::{Function, Outcome, Phase, Record, check_well_formed, read_history};

/// Ok writes and reads the test run must reach (the run is 20 s at 50
/// ops/s; even with two faults this leaves a wide margin).
const MIN_OK: usize = 30;
/// How long each fault lasts: kvnode's followers elect a new leader about
/// 5 s after losing the old one (election timeout plus the leader lease),
/// so a shorter partition would end before it forced a failover.
const FAULT_HOLD: Duration = Duration::from_secs(6);
/// An operation this slow (or not ok) during the leader's partition shows
/// the partition cut something: unfaulted operations take milliseconds.
const STALLED: Duration = Duration::from_secs(1);

/// Child processes of this test process, by pid (from /proc).
fn children_of_this_process() -> Vec<u32> {
    let me = std::process::id().to_string();
    let mut children = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // pid (comm) state ppid ...: comm may hold spaces; split after ')'.
        let Some((_, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let ppid = rest.split_whitespace().nth(1);
        if ppid == Some(me.as_str())
            && let Ok(pid) = entry.file_name().to_string_lossy().parse()
        {
            children.push(pid);
        }
    }
    children
}

#[tokio::test]
async fn register_run_with_leader_partition_and_kill_does_enough() {
    let _serial = crate::common::RUN_LOCK.lock().await;
    assert!(
        rustix::process::geteuid().is_root(),
        "this test needs root (a private network namespace and iptables; CI runs as root)"
    );
    let out: PathBuf = crate::common::run_dir("harness-register");
    let args = RunArgs {
        workload: WorkloadKind::Register,
        nemesis: FaultList(vec![
            Fault::from_str("partition-leader").expect("known fault"),
            Fault::Kill,
        ]),
        time: Duration::from_secs(20),
        nodes: Some(3),
        out: out.clone(),
        kvnode_bin: std::env::var_os("KVNODE_BIN").map(PathBuf::from),
        concurrency: 4,
        rate: 50,
        seed: Some(7),
        fault_hold: FAULT_HOLD,
        quiet: Duration::from_secs(2),
        min_ok_writes: MIN_OK,
        min_ok_reads: MIN_OK,
        ttl_min: jepsen::workload::ttl::TTL_MIN,
        ttl_max: jepsen::workload::ttl::TTL_MAX,
        idle: jepsen::nemesis::idle::IDLE_DEFAULT,
        session_idle_ms: None,
    };
    let code = jepsen::run::run(args).await.expect("the run ran");
    let summary = std::fs::read_to_string(out.join("summary.txt")).expect("summary.txt");
    let summary = format!(
        "{summary}(run directory, kept on failure: {})",
        out.display()
    );
    assert_eq!(
        code,
        ExitCode::SUCCESS,
        "the run did not do enough:\n{summary}"
    );
    assert!(summary.contains("enough: yes"), "{summary}");

    let history = read_history(&out.join("history.jsonl")).expect("history.jsonl parses");
    assert_eq!(check_well_formed(&history), Vec::<String>::new());
    assert_eq!(
        check_minimums(&history, MIN_OK, MIN_OK),
        Vec::<String>::new()
    );
    let events: Vec<_> = history
        .iter()
        .filter_map(|r| match r {
            Record::Nemesis(e) => Some((e.fault.as_str(), e.phase, e.detail.as_str())),
            _ => None,
        })
        .collect();
    let phases: Vec<_> = events.iter().map(|(f, p, _)| (*f, *p)).collect();
    assert_eq!(
        phases,
        [
            ("partition-leader", Phase::Start),
            ("partition-leader", Phase::Stop),
            ("kill", Phase::Start),
            ("kill", Phase::Stop),
        ],
        "{summary}"
    );
    assert!(
        events[0].2.contains("(leader)"),
        "the partition found no leader: {summary}"
    );
    // Every op completed: ok, fail or unknown, with its completion after its invoke.
    let ops = history
        .iter()
        .filter(|r| matches!(r, Record::Op(_)))
        .count();
    let oks = history
        .iter()
        .filter(|r| matches!(r, Record::Op(op) if op.outcome == Outcome::Ok))
        .count();
    assert!(oks >= 2 * MIN_OK && ops >= oks, "{summary}");
    // The partition bit: some read or plain write overlapping it stalled or
    // did not succeed (a compare-and-set fails on a version mismatch
    // without any fault, so those do not count).
    let (cut, healed) = history
        .iter()
        .filter_map(|r| match r {
            Record::Nemesis(e) if e.fault == "partition-leader" => Some(e.time_ns),
            _ => None,
        })
        .fold((u64::MAX, 0), |(lo, hi), t| (lo.min(t), hi.max(t)));
    let stalled = history.iter().any(|r| {
        matches!(r, Record::Op(op)
            if op.invoke_ns < healed && op.complete_ns > cut && op.f != Function::Cas
                && (op.outcome != Outcome::Ok
                    || op.complete_ns - op.invoke_ns >= STALLED.as_nanos() as u64))
    });
    assert!(
        stalled,
        "no operation was slowed or failed by the leader's partition:\n{summary}"
    );
    // The final reads judged every written key for lost writes.
    assert!(
        summary.contains(" 0 unchecked, 0 lost"),
        "some written key had no final read, or lost a write:\n{summary}"
    );
    // The members are gone (killed by pid, reaped).
    let left = children_of_this_process();
    assert!(left.is_empty(), "child processes left behind: {left:?}");
    for node in 1..=3 {
        assert!(out.join(format!("node{node}/kvnode.log")).is_file());
    }
    let _ = std::fs::remove_dir_all(&out);
}
