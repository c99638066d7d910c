//! Proves the suite catches the negative control whose detection is certain
//! in a short run: a kvnode built with `nc-local-reads` (linearizable reads
//! answered from local state, no read index), with one follower cut off
//! (`partition-follower`) while the register workload sends reads to every
//! member round robin, must be rejected by the checker — the isolated
//! follower returns versions older than writes acknowledged before the
//! read. Needs root (namespace, iptables) and cargo: it builds the control
//! into `target/jepsen-builds` (`JEPSEN_CARGO` names the cargo command) on
//! the dependencies the workspace's own build left in `target/`, so only
//! the workspace crates compile.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use jepsen::nemesis::{Fault, FaultList};
use jepsen::run::{RunArgs, WorkloadKind};

#[tokio::test]
async fn stale_local_reads_with_a_follower_isolated_are_caught() {
    assert!(
        rustix::process::geteuid().is_root(),
        "this test needs root (a private network namespace and iptables; CI runs as root)"
    );
    // The build (cargo) and the run (the members) are children of this
    // process, and the other run tests check that none of theirs is left:
    // one at a time, the build included.
    let _serial = crate::common::RUN_LOCK.lock().await;
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace")
        .to_path_buf();
    let bin = tokio::task::spawn_blocking(move || {
        jepsen::suite::build_variant(&workspace, &["nc-local-reads"])
    })
    .await
    .expect("the build task")
    .expect("building the nc-local-reads kvnode");
    let out: PathBuf = crate::common::run_dir("control-local-reads");
    let args = RunArgs {
        workload: WorkloadKind::Register,
        nemesis: FaultList(vec![Fault::PartitionFollower]),
        time: Duration::from_secs(20),
        nodes: Some(3),
        out: out.clone(),
        kvnode_bin: Some(bin),
        concurrency: 4,
        rate: 100,
        seed: Some(5),
        fault_hold: Duration::from_secs(6),
        quiet: Duration::from_secs(2),
        min_ok_writes: 20,
        min_ok_reads: 20,
        ttl_min: jepsen::workload::ttl::TTL_MIN,
        ttl_max: jepsen::workload::ttl::TTL_MAX,
        idle: jepsen::nemesis::idle::IDLE_DEFAULT,
        session_idle_ms: None,
    };
    let code = jepsen::run::run(args).await.expect("the run ran");
    let summary = std::fs::read_to_string(out.join("summary.txt")).unwrap_or_default();
    let checker = std::fs::read_to_string(out.join("checker.json")).expect("checker.json");
    let report: serde_json::Value = serde_json::from_str(&checker).expect("checker.json parses");
    assert_eq!(
        report["verdict"],
        "not-linearizable",
        "the control was NOT caught: stale local reads passed the checker\n{summary}\n(run \
         directory kept: {})",
        out.display()
    );
    assert_eq!(code, ExitCode::FAILURE, "{summary}");
    assert!(
        summary.contains("partition-follower"),
        "no follower was isolated: {summary}"
    );
    eprintln!("{summary}");
    let _ = std::fs::remove_dir_all(&out);
}
