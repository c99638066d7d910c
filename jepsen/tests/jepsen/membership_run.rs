//! Proves the membership nemesis against real `kvnode` processes: during a
//! register run, new members (fresh ids, fresh data) are added as learners
//! and promoted, and voters — the leader among them when the seed picks
//! it — are removed and stopped, two rounds at least; the run does enough,
//! the register checker passes, and every member id added is new (an old
//! id is refused by kvnode by design). A removal happens only while the
//! cluster has more than three voters (`VOTERS_MIN`). Needs root and a
//! built `kvnode`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use jepsen::nemesis::{Fault, FaultList};
use jepsen::run::{RunArgs, WorkloadKind};
use jepsen::workload::{Phase, Record, read_history};

#[tokio::test]
async fn membership_changes_keep_three_voters_and_the_register_linearizable() {
    let _serial = crate::common::RUN_LOCK.lock().await;
    assert!(
        rustix::process::geteuid().is_root(),
        "this test needs root (a private network namespace; CI runs as root)"
    );
    let out: PathBuf = crate::common::run_dir("membership");
    let args = RunArgs {
        workload: WorkloadKind::Register,
        nemesis: FaultList(vec![Fault::Membership]),
        // After each removal (it may take the leader) come the quiet
        // period and the next member's add (~2 s), in which an ok read and
        // an ok write must be invoked (the minimum-work rule): an election
        // after removing the leader, and the clients finding the new one,
        // take up to ~5 s on a loaded machine, so 3 s of quiet was not
        // enough (a CI run saw a 5.1 s gap with no ok op). 6 s of quiet
        // gives ~8 s; 52 s fit three rounds and ~8 s after the last
        // removal.
        time: Duration::from_secs(52),
        nodes: Some(3),
        out: out.clone(),
        kvnode_bin: std::env::var_os("KVNODE_BIN").map(PathBuf::from),
        concurrency: 4,
        rate: 60,
        seed: Some(3),
        fault_hold: Duration::from_secs(8),
        quiet: Duration::from_secs(6),
        min_ok_writes: 50,
        min_ok_reads: 50,
        ttl_min: jepsen::workload::ttl::TTL_MIN,
        ttl_max: jepsen::workload::ttl::TTL_MAX,
        idle: jepsen::nemesis::idle::IDLE_DEFAULT,
        session_idle_ms: None,
    };
    let code = jepsen::run::run(args).await.expect("the run ran");
    let summary = std::fs::read_to_string(out.join("summary.txt")).expect("summary.txt");
    let summary = format!("{summary}(run directory: {})", out.display());
    assert_eq!(
        code,
        ExitCode::SUCCESS,
        "the membership run failed:\n{summary}"
    );

    let records = read_history(&out.join("history.jsonl")).expect("history parses");
    let details: Vec<(Phase, &str)> = records
        .iter()
        .filter_map(|r| match r {
            Record::Nemesis(e) if e.fault == "membership" => Some((e.phase, e.detail.as_str())),
            _ => None,
        })
        .collect();
    let promoted = details
        .iter()
        .filter(|(p, d)| *p == Phase::Start && d.contains("promoted") && !d.contains("NOT"))
        .count();
    let removed = details
        .iter()
        .filter(|(p, d)| *p == Phase::Stop && d.contains("removed and stopped"))
        .count();
    assert!(
        promoted >= 2 && removed >= 2,
        "two rounds of add + promote + remove expected:\n{summary}"
    );
    // Every added member has an id no member had before (4 is a slot, ids
    // of added members start above the slots).
    for (phase, detail) in &details {
        if *phase == Phase::Start {
            let id: u64 = detail
                .split_whitespace()
                .nth(1)
                .and_then(|w| w.parse().ok())
                .unwrap_or_else(|| panic!("member id in {detail:?}"));
            assert!(id > 4, "an old member id was reused: {detail}");
        }
    }
    let _ = std::fs::remove_dir_all(&out);
}
