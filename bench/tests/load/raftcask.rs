//! Proves the load core against an in-process three-member raftcask
//! cluster (no feature needed): started at a follower, writes follow the
//! NotLeader redirect to the leader and all succeed, every acknowledged
//! write's version names a Raft entry (ops per entry is at least one), and
//! leader reads and spread stale reads finish without errors.

use std::time::Duration;

use kvbench::load::{LoadConfig, OpKind, ReadTarget, run};
use kvnode::testing::LocalCluster;
use kvproto::kv::v1::Consistency;

/// How long the cluster gets to elect a leader.
const READY_DEADLINE: Duration = Duration::from_secs(60);
/// Operations of each run.
const OPS: u64 = 200;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn puts_follow_the_leader_and_reads_finish() {
    let dir = tempfile::tempdir().expect("temp dir");
    let cluster = LocalCluster::start(dir.path(), 3)
        .await
        .expect("raftcask cluster");
    let leader = cluster
        .wait_for_leader(READY_DEADLINE)
        .await
        .expect("raftcask leader");
    // A follower first, so the first writes are redirected.
    let leader_addr = cluster.addr(leader);
    let mut endpoints = cluster.endpoints();
    endpoints.retain(|e| *e != leader_addr);
    endpoints.push(leader_addr);
    let base = LoadConfig {
        endpoints,
        clients: 4,
        connections: 2,
        ops: OPS,
        duration: Duration::from_secs(30),
        key_space: 100,
        ..LoadConfig::default()
    };

    let report = run(base.clone()).await.expect("valid settings");
    assert_eq!(report.ops_ok, OPS, "{report:?}");
    assert_eq!(report.errors_total(), 0, "{report:?}");
    assert!(report.redirects >= 1, "{report:?}");
    assert_eq!(report.writes_acked, OPS, "{report:?}");
    assert!(
        report.ops_per_entry().is_some_and(|v| v >= 1.0),
        "{report:?}"
    );
    assert!(!report.timeline.is_empty(), "{report:?}");

    for (op, consistency, read_target) in [
        (
            OpKind::Mixed { read_percent: 50 },
            Consistency::Linearizable,
            ReadTarget::Leader,
        ),
        (OpKind::Get, Consistency::Stale, ReadTarget::Spread),
    ] {
        let config = LoadConfig {
            op,
            consistency,
            read_target,
            ..base.clone()
        };
        let report = run(config).await.expect("valid settings");
        assert_eq!(report.ops_ok, OPS, "{op:?}: {report:?}");
        assert_eq!(report.errors_total(), 0, "{op:?}: {report:?}");
    }
    cluster.shutdown().await;
}
