//! Cluster time across leader changes, on an in-process three-node cluster
//! (ARCHITECTURE.md, "Cluster time"): a member that never restarted, whose
//! process ran through a quiet period, becomes leader after members that
//! restarted; its stamps must continue from the applied cluster time, not
//! from a base taken when its process started. The test measures the
//! advance of cluster time between a TTL put and the new leader's first
//! write against the real time between them. Fails with `nc-old-clock`
//! (the advance then includes the whole quiet period).

use std::time::{Duration, Instant};

use kvnode::StateMachineOptions;
use kvnode::raft::watch::MetricsWatch;
use kvproto::kv::v1::PutRequest;

use crate::harness::{Cluster, DEADLINE, POLL};

/// The quiet period: nothing is proposed while the never-restarted
/// member's process runs on. Long against the slack below, so the old
/// clock's jump cannot hide in it.
const QUIET: Duration = Duration::from_secs(8);
/// The TTL of the key put under a restarted leader.
const TTL: Duration = Duration::from_secs(30);
/// Allowed advance of cluster time beyond real time: the stated rounding
/// bound per leader change and the ms truncation of each measurement.
const SLACK_MS: u64 = 50;
/// Leader changes tried until the never-restarted member leads.
const LEADER_CHANGES_MAX: usize = 10;

fn put(key: &str, ttl_ms: u64) -> PutRequest {
    PutRequest {
        key: key.as_bytes().to_vec().into(),
        value: b"v".to_vec().into(),
        ttl_ms,
        ..PutRequest::default()
    }
}

/// Moves leadership to `target` without restarting it: stops the leader,
/// asks `target` to campaign once the stopped leader's lease has run out
/// (before the other member's own election timeout, most of the time),
/// waits until someone leads, restarts the stopped member; repeats while
/// another member won.
async fn make_leader(cluster: &mut Cluster, target: u64) {
    let lease = Duration::from_millis(kvnode::node::ELECTION_TIMEOUT_MIN_MS + 100);
    for _ in 0..LEADER_CHANGES_MAX {
        let leader = cluster.leader().await;
        if leader == target {
            return;
        }
        cluster.stop(leader).await;
        let start = Instant::now();
        let mut campaigned: Option<Instant> = None;
        loop {
            let now = cluster
                .node(target)
                .raft()
                .metrics()
                .borrow()
                .current_leader;
            if now.is_some_and(|l| l != leader) {
                break;
            }
            // One campaign per election timeout at most: a campaign started
            // again before its votes arrive would never finish.
            if start.elapsed() >= lease
                && campaigned.is_none_or(|at| {
                    at.elapsed() >= Duration::from_millis(kvnode::node::ELECTION_TIMEOUT_MAX_MS)
                })
            {
                let _ = cluster.node(target).raft().trigger().elect(false).await;
                campaigned = Some(Instant::now());
            }
            assert!(
                start.elapsed() < DEADLINE,
                "no new leader after stopping {leader}"
            );
            tokio::time::sleep(POLL).await;
        }
        cluster.restart(leader).await;
    }
    panic!("member {target} did not become leader in {LEADER_CHANGES_MAX} leader changes");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_that_never_restarted_continues_from_the_applied_time() {
    let mut cluster = Cluster::start(|_| StateMachineOptions::default()).await;
    let first = cluster.leader().await;
    cluster
        .write(
            "warm-up",
            |mut kv| async move { kv.put(put("warm", 0)).await },
        )
        .await;
    // The member that never restarts: a follower now.
    let runner = (1..=3).find(|id| *id != first).unwrap();
    let others: Vec<u64> = (1..=3).filter(|id| *id != runner).collect();
    // Quiet: no entry is proposed (no TTL key exists, so no ticks).
    tokio::time::sleep(QUIET).await;
    // Restart the two others while the runner is cut off, so one of them
    // (whose clock starts from the applied time) leads and stamps the put.
    cluster.faults(runner).set_cut_peers(others.clone());
    for id in &others {
        cluster.stop(*id).await;
    }
    for id in &others {
        cluster.restart(*id).await;
    }
    let restarted_leader = cluster.leader_among(&others).await;
    let invoked = Instant::now();
    cluster
        .kv(restarted_leader)
        .await
        .put(put("ttl-key", TTL.as_millis() as u64))
        .await
        .expect("the put under a restarted leader");
    let put_time_ms = cluster
        .node(restarted_leader)
        .state_machine()
        .cluster_time_ms();
    // Heal, and hand leadership to the runner.
    cluster.faults(runner).set_cut_peers([]);
    make_leader(&mut cluster, runner).await;
    cluster
        .write(
            "probe",
            |mut kv| async move { kv.put(put("probe", 0)).await },
        )
        .await;
    let real_ms = invoked.elapsed().as_millis() as u64;
    assert_eq!(
        cluster.leader().await,
        runner,
        "the runner stamped the probe"
    );
    let advance_ms = cluster
        .node(runner)
        .state_machine()
        .cluster_time_ms()
        .saturating_sub(put_time_ms);
    assert!(
        advance_ms <= real_ms + SLACK_MS,
        "cluster time ran ahead of real time: it advanced {advance_ms} ms between the put and the \
         new leader's write, {real_ms} ms apart (the quiet period was {} ms)",
        QUIET.as_millis()
    );
    if real_ms + 1_000 < TTL.as_millis() as u64 {
        let index = cluster.wait_applied_equal().await;
        let got = cluster.stale_get(runner, b"ttl-key", index).await;
        assert!(
            got.found,
            "the TTL key expired early, {real_ms} ms after its put"
        );
    }
    cluster.shutdown().await;
}
