//! Merges decided through Raft, and the snapshot policy.
//!
//! `leader_proposed_merges_keep_replica_files_identical`: a three-node
//! cluster with small segments and a merge policy with low thresholds takes
//! overwrites, deletes and TTL puts that expire. The leader's policy (no
//! test code asks for a merge) proposes merge entries; every member ends up
//! with merge output among its sealed files and at least two merges done
//! (so a later merge took an earlier one's output as input). Once the
//! cluster is quiet, every member's sealed data and hint files — merge
//! output included — have identical names, lengths and CRC-32s, and every
//! member lists the same keys, values and versions (expired keys gone).
//!
//! `snapshots_by_bytes_and_purge`: a single member with the entries trigger
//! off and a bytes trigger of 64 KiB builds a snapshot by itself once its
//! engine holds that much beyond the last one, and with
//! `snapshot_log_keep = 0` purges its log up to it; the same member with
//! both triggers off builds none.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use kvnode::raft::merge_policy::{MergePolicy, SnapshotPolicy, merge_inputs};
use kvnode::raft::watch::MetricsWatch;

use crate::backup::{Members, bind_members, small_segments};
use crate::harness::{DEADLINE, POLL, stale_scan_all};
use crate::replica_files::sealed_files;

/// Distinct keys the overwrites cycle through (most puts overwrite).
const KEYS: usize = 20;
/// Fresh keys written after the merges.
const FRESH_KEYS: usize = 60;
/// Merges every member must have completed.
const MERGES_MIN: u64 = 2;
/// Attempts at reading every member's files while nothing applies and no
/// merge is writing.
const QUIET_READ_ATTEMPTS_MAX: usize = 500;
/// A TTL that runs out during the test.
const TTL_SHORT_MS: u64 = 500;
/// Pages a full scan may take.
/// The bytes trigger of the snapshot test.
const SNAPSHOT_EVERY_BYTES: u64 = 64 * 1024;
/// How long the control waits for a snapshot that must not come.
const NO_SNAPSHOT_WAIT: Duration = Duration::from_secs(3);

/// Revisions of change history the members keep in this test.
const HISTORY_REVISIONS: u64 = 50;

fn merge_policy() -> MergePolicy {
    MergePolicy {
        enabled: true,
        dead_ratio_min: 0.3,
        dead_bytes_min: 16 * 1024,
        check_interval: Duration::from_millis(100),
    }
}

fn value(i: usize) -> Vec<u8> {
    let mut v = format!("value {i} ").into_bytes();
    v.extend((0..400 + (i * 7919) % 600).map(|j| b'a' + ((i + j) % 26) as u8));
    v
}

/// The engine directory a member's state machine uses now.
fn engine_dir(members: &Members, id: u64) -> PathBuf {
    members.nodes[&id]
        .state_machine()
        .engine()
        .dir()
        .to_path_buf()
}

/// Every user key of member `id` as (key, value, version), by stale scans.
async fn listing(members: &Members, id: u64, min_index: u64) -> Vec<(Vec<u8>, Vec<u8>, u64)> {
    let mut kv = members.kv(id).await;
    stale_scan_all(&mut kv, id, min_index)
        .await
        .into_iter()
        .map(|e| (e.key.to_vec(), e.value.to_vec(), e.seq))
        .collect()
}

async fn workload(members: &Members, round: usize) {
    for i in 0..150 {
        let n = round * 1000 + i;
        members
            .put(format!("key{:02}", n % KEYS).as_bytes(), &value(n), 0)
            .await;
        if i % 25 == 0 {
            members
                .put(format!("ttl{n}").as_bytes(), &value(n), TTL_SHORT_MS)
                .await;
        }
        if i % 40 == 0 {
            members
                .delete(format!("key{:02}", (n + 3) % KEYS).as_bytes())
                .await;
        }
    }
}

/// Waits until the leader's policy would propose no merge (its history's
/// bytes aside, as the policy counts them) and every member completed the
/// same number of merges.
async fn wait_merges_settled(members: &Members) {
    let start = Instant::now();
    loop {
        let leader = &members.nodes[&members.leader().await];
        let state_machine = leader.state_machine();
        let kept = state_machine.history().read().unwrap().records().1;
        let wanted = merge_inputs(&state_machine.engine().stats(), &merge_policy(), kept);
        let merges: Vec<u64> = members
            .nodes
            .values()
            .map(|n| n.state_machine().engine().stats().merges)
            .collect();
        if wanted.is_none() && merges.iter().all(|m| *m == merges[0]) {
            return;
        }
        assert!(
            start.elapsed() < DEADLINE,
            "merges did not settle: {merges:?}, the policy would merge {wanted:?}"
        );
        tokio::time::sleep(POLL).await;
    }
}

async fn wait_merges(members: &Members, at_least: u64) {
    let start = Instant::now();
    loop {
        let merges: Vec<u64> = members
            .nodes
            .values()
            .map(|n| n.state_machine().engine().stats().merges)
            .collect();
        if merges.iter().all(|m| *m >= at_least) {
            return;
        }
        assert!(
            start.elapsed() < DEADLINE,
            "members completed {merges:?} merges; {at_least} wanted"
        );
        tokio::time::sleep(POLL).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_proposed_merges_keep_replica_files_identical() {
    let work = tempfile::tempdir().expect("tempdir");
    let (listeners, initial) = bind_members(3).await;
    let dirs: BTreeMap<u64, PathBuf> = (1..=3)
        .map(|id| (id, work.path().join(format!("m{id}"))))
        .collect();
    let members = Members::start(listeners, &initial, &dirs, |id, config| {
        config.bootstrap = id == 1;
        config.state_machine = small_segments();
        config.merge_policy = merge_policy();
        // A short change history: the leader compacts as the workload
        // goes, so merges free what compaction let go (and keep the rest,
        // identically on every member).
        config.history_window = kvstate::history::HistoryWindow {
            revisions: HISTORY_REVISIONS,
            ..Default::default()
        };
    })
    .await;

    workload(&members, 0).await;
    wait_merges(&members, 1).await;
    workload(&members, 1).await;
    wait_merges(&members, MERGES_MIN).await;
    // Fresh keys seal segments after the merge output without adding dead
    // bytes: the comparison covers merge output and later segments.
    for i in 0..FRESH_KEYS {
        members
            .put(format!("fresh{i:03}").as_bytes(), &value(5000 + i), 0)
            .await;
    }
    // Let the TTL keys run out (ticks advance the cluster time).
    tokio::time::sleep(Duration::from_millis(TTL_SHORT_MS * 3)).await;
    members.put(b"last", b"write", 0).await;
    // Compaction keeps freeing the workload's history as the fresh keys
    // move the window, so merges go on for a while: once the policy sees
    // nothing to free and every member finished the same merges, more fresh
    // keys seal segments that no merge takes.
    wait_merges_settled(&members).await;
    for i in 0..FRESH_KEYS {
        members
            .put(format!("fresher{i:03}").as_bytes(), &value(7000 + i), 0)
            .await;
    }

    let mut last_reason = String::new();
    let mut compared = None;
    for _ in 0..QUIET_READ_ATTEMPTS_MAX {
        let index = members.wait_applied_equal().await;
        let mut files = BTreeMap::new();
        let mut reason = None;
        for id in members.nodes.keys() {
            match sealed_files(&engine_dir(&members, *id)) {
                Ok(f) => {
                    files.insert(*id, f);
                }
                Err(why) => reason = Some(format!("member {id}: {why}")),
            }
        }
        let merges: Vec<u64> = members
            .nodes
            .values()
            .map(|n| n.state_machine().engine().stats().merges)
            .collect();
        let still = members
            .nodes
            .values()
            .all(|n| n.state_machine().applied().0.map(|l| l.index) == Some(index));
        match reason {
            None if still && merges.iter().all(|m| *m == merges[0]) => {
                compared = Some((index, files));
                break;
            }
            None => last_reason = format!("an entry applied or a merge ran ({merges:?})"),
            Some(why) => last_reason = why,
        }
        tokio::time::sleep(POLL).await;
    }
    let Some((index, files)) = compared else {
        panic!("no quiet moment in {QUIET_READ_ATTEMPTS_MAX} attempts: {last_reason}");
    };
    let merge_files = files[&1]
        .keys()
        .filter(|n| n.starts_with("merge-") && n.ends_with(".data"))
        .count();
    assert!(
        merge_files > 0,
        "no merge output among {:?}",
        files[&1].keys()
    );
    let segments = files[&1]
        .keys()
        .filter(|n| n.starts_with("seg-") && n.ends_with(".data"))
        .count();
    assert!(
        segments > 0,
        "no sealed segment after the merge output: {:?}",
        files[&1].keys()
    );
    for (id, held) in &files {
        assert!(
            held == &files[&1],
            "member {id}'s sealed files differ from member 1's at index {index}:\n{held:?}\n{:?}",
            files[&1]
        );
    }
    eprintln!(
        "{} sealed files ({merge_files} merge outputs, {segments} segments) identical on every member at index {index}",
        files[&1].len()
    );

    let mut listings = BTreeMap::new();
    for id in members.nodes.keys() {
        listings.insert(*id, listing(&members, *id, index).await);
    }
    assert!(!listings[&1].is_empty());
    assert!(
        listings[&1].iter().all(|(k, _, _)| !k.starts_with(b"ttl")),
        "expired TTL keys are still listed"
    );
    for (id, listed) in &listings {
        assert!(
            listed == &listings[&1],
            "member {id} lists other keys than member 1"
        );
    }
    members.shutdown().await;
}

async fn single_member(dir: &Path, policy: SnapshotPolicy) -> Members {
    let (listeners, initial) = bind_members(1).await;
    let dirs = BTreeMap::from([(1, dir.to_path_buf())]);
    Members::start(listeners, &initial, &dirs, move |_, config| {
        config.bootstrap = true;
        config.state_machine = small_segments();
        config.snapshot_policy = policy;
        config.snapshot_log_keep = 0;
        config.merge_policy.enabled = false;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshots_by_bytes_and_purge() {
    let work = tempfile::tempdir().expect("tempdir");
    // Control: no trigger, no snapshot.
    let off = single_member(
        &work.path().join("off"),
        SnapshotPolicy {
            every_entries: 0,
            every_bytes: 0,
        },
    )
    .await;
    for i in 0..200 {
        off.put(format!("k{i}").as_bytes(), &value(i), 0).await;
    }
    tokio::time::sleep(NO_SNAPSHOT_WAIT).await;
    let metrics = off.nodes[&1].raft().metrics().borrow().clone();
    assert_eq!(metrics.snapshot, None, "a snapshot without any trigger");
    off.shutdown().await;

    let on = single_member(
        &work.path().join("on"),
        SnapshotPolicy {
            every_entries: 0,
            every_bytes: SNAPSHOT_EVERY_BYTES,
        },
    )
    .await;
    for i in 0..200 {
        on.put(format!("k{i}").as_bytes(), &value(i), 0).await;
    }
    let start = Instant::now();
    let mut metrics = on.nodes[&1].raft().metrics();
    let reached = tokio::time::timeout(
        DEADLINE,
        metrics.wait_for(|m| m.snapshot.is_some() && m.purged.is_some()),
    )
    .await
    .expect("a snapshot by bytes and a purge in time")
    .expect("metrics")
    .clone();
    eprintln!(
        "snapshot at {:?}, purged to {:?} after {:?}",
        reached.snapshot,
        reached.purged,
        start.elapsed()
    );
    assert!(reached.purged <= reached.snapshot);
    on.shutdown().await;
}
