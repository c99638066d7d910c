//! Proves the real state machine (bitcask engine under Raft, on real files):
//! applying entries and reopening recovers `last_applied`, the membership,
//! the cluster time and every key exactly; replaying applied entries after a
//! reopen writes nothing; a snapshot built on one state machine and staged
//! file by file (as the network layer will) installs into a fresh one with
//! the same keys, versions and applied state, also after a merge entry; the
//! current snapshot survives a restart; a staged snapshot with a corrupted
//! file is refused (crc mismatch) and the old state keeps working; a
//! complete snapshot that is ahead of the engine at open (an install
//! interrupted after the snapshot became durable but before the engine
//! switched to it) is switched in before anything else runs.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::{Duration, Instant};

use bitcask::{Engine, Options, Scan};
use kvnode::raft::types::{NodeEntry, NodeLogId, NodeSnapshot};
use kvnode::snapshot::SnapshotHandle;
use kvnode::{NodeInfo, StateMachine, StateMachineOptions};
use kvstate::command::{
    Answer, Command, EntryResponse, Op, Outcome, Proposal, Request, SessionRef,
};
use openraft::storage::RaftStateMachine;
use openraft::{Entry, EntryPayload, Membership, RaftSnapshotBuilder, StoredMembership};

fn options() -> StateMachineOptions {
    StateMachineOptions {
        engine: Options {
            segment_size_bytes: 4096,
            ..Options::default()
        },
        ..StateMachineOptions::default()
    }
}

fn open(dir: &Path) -> StateMachine {
    StateMachine::open(dir, options()).expect("open state machine")
}

fn log_id(term: u64, index: u64) -> NodeLogId {
    kvnode::raft::types::log_id(term, 1, index)
}

fn membership(voters: &[u64]) -> Membership<u64, NodeInfo> {
    let nodes: BTreeMap<u64, NodeInfo> = voters
        .iter()
        .map(|id| {
            (
                *id,
                NodeInfo {
                    client_addr: format!("127.0.0.1:{}", 7000 + id),
                    peer_addr: format!("127.0.0.1:{}", 7100 + id),
                },
            )
        })
        .collect();
    Membership::new(vec![voters.iter().copied().collect::<BTreeSet<_>>()], nodes)
        .expect("membership")
}

fn membership_entry(term: u64, index: u64, voters: &[u64]) -> NodeEntry {
    Entry {
        log_id: log_id(term, index),
        payload: EntryPayload::Membership(membership(voters)),
    }
}

fn blank(term: u64, index: u64) -> NodeEntry {
    Entry {
        log_id: log_id(term, index),
        payload: EntryPayload::Blank,
    }
}

fn normal(term: u64, index: u64, command: Command) -> NodeEntry {
    Entry {
        log_id: log_id(term, index),
        payload: EntryPayload::Normal(Proposal {
            time_ms: index * 10,
            command,
        }),
    }
}

/// A write entry: overwrites, deletes and a TTL put over a few keys, from
/// one of three exactly-once sessions (so session records travel too),
/// sized so that a few dozen entries seal several 4 KiB segments.
fn writes(term: u64, index: u64) -> NodeEntry {
    let ops = vec![
        Op::Put {
            key: format!("key/{:02}", index % 23).into_bytes(),
            value: vec![index as u8; 150],
            ttl_ms: 0,
        },
        Op::Put {
            key: format!("ttl/{:02}", index % 5).into_bytes(),
            value: b"short-lived".to_vec(),
            ttl_ms: 1_000_000,
        },
        Op::Delete {
            key: format!("key/{:02}", (index + 7) % 23).into_bytes(),
        },
    ];
    normal(
        term,
        index,
        Command::Requests(vec![Request {
            session: Some(SessionRef {
                client_id: index % 3,
                sequence: index,
                lowest_unacked: index.saturating_sub(6),
                opens: index < 6,
            }),
            conditions: Vec::new(),
            ops,
        }]),
    )
}

/// Membership at 0, a blank at 1, writes at 2..=last, membership change in the middle.
fn history(last: u64) -> Vec<NodeEntry> {
    let mut entries = vec![membership_entry(1, 0, &[1]), blank(1, 1)];
    for index in 2..=last {
        if index == last / 2 {
            entries.push(membership_entry(1, index, &[1, 2, 3]));
        } else {
            entries.push(writes(1, index));
        }
    }
    entries
}

async fn apply(sm: &mut StateMachine, entries: Vec<NodeEntry>) -> Vec<EntryResponse> {
    sm.apply_entries(entries).expect("apply")
}

type Row = (Vec<u8>, Option<Vec<u8>>, u64, u64);

/// Every key (reserved ones too) with value, version and expiry.
fn dump(engine: &Engine) -> Vec<Row> {
    let mut rows = Vec::new();
    let mut after = None;
    loop {
        let scan = Scan {
            after: after.clone(),
            ..Scan::all(500)
        };
        let page = engine.scan(&scan, 0).expect("scan");
        for entry in &page {
            rows.push((
                entry.key.clone(),
                entry.value.clone(),
                entry.seq,
                entry.expiry_ms,
            ));
        }
        match page.last() {
            Some(last) if page.len() == 500 => after = Some(last.key.clone()),
            _ => break,
        }
    }
    rows
}

/// What the network layer does on the receiving side: copy each file the
/// manifest lists into the staging directory, then write the manifest.
fn stage_copy(from: &SnapshotHandle, to: &SnapshotHandle) {
    let manifest = from.read_manifest().expect("manifest");
    for file in &manifest.files {
        std::fs::copy(
            from.file_path(&file.name).unwrap(),
            to.file_path(&file.name).unwrap(),
        )
        .expect("copy snapshot file");
    }
    to.write_manifest(&manifest).expect("write manifest");
}

/// A state machine that applied `history(last)` and built a snapshot of it.
async fn leader_with_snapshot(last: u64) -> (tempfile::TempDir, StateMachine, NodeSnapshot) {
    let dir = tempfile::tempdir().unwrap();
    let mut leader = open(dir.path());
    apply(&mut leader, history(last)).await;
    let snapshot = leader
        .get_snapshot_builder()
        .await
        .build_snapshot()
        .await
        .unwrap();
    (dir, leader, snapshot)
}

fn files_of(engine: &Engine) -> (Vec<bitcask::FileInfo>, Option<bitcask::FileInfo>) {
    (engine.sealed_files(), engine.active_file())
}

#[tokio::test]
async fn apply_then_reopen_recovers_applied_state_and_data_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let (applied, rows, time) = {
        let mut sm = open(dir.path());
        assert_eq!(
            sm.applied_state().await.unwrap(),
            (None, Default::default())
        );
        let responses = apply(&mut sm, history(60)).await;
        assert_eq!(responses.len(), 60 + 1);
        assert!(matches!(
            responses[2].answers[..],
            [Answer {
                outcome: Outcome::Applied { .. },
                ..
            }]
        ));
        assert!(
            sm.engine().sealed_files().len() >= 4,
            "several segments sealed"
        );
        let applied = sm.applied_state().await.unwrap();
        assert_eq!(applied.0, Some(log_id(1, 60)));
        assert_eq!(
            applied.1,
            StoredMembership::new(Some(log_id(1, 30)), membership(&[1, 2, 3]))
        );
        assert_eq!(sm.cluster_time_ms(), 600);
        // A version names the entry and position.
        let item = sm.engine().get(b"key/14", 0).unwrap().unwrap();
        assert_eq!(item.seq, 60 * 65_536);
        (applied, dump(&sm.engine()), sm.cluster_time_ms())
    };
    let mut sm = open(dir.path());
    assert_eq!(sm.applied_state().await.unwrap(), applied);
    assert_eq!(sm.cluster_time_ms(), time);
    assert_eq!(dump(&sm.engine()), rows);
    // A blank after reopen keeps the time and membership and is recorded too.
    apply(&mut sm, vec![blank(2, 61)]).await;
    drop(sm);
    let mut sm = open(dir.path());
    let (last, members) = sm.applied_state().await.unwrap();
    assert_eq!(last, Some(log_id(2, 61)));
    assert_eq!(members, applied.1);
    assert_eq!(sm.cluster_time_ms(), time);
}

#[tokio::test]
async fn replaying_applied_entries_after_reopen_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    {
        let mut sm = open(dir.path());
        apply(&mut sm, history(40)).await;
    }
    let mut sm = open(dir.path());
    let engine = sm.engine();
    let (seq, files, rows) = (engine.last_seq(), files_of(&engine), dump(&engine));
    let responses = apply(&mut sm, history(40)).await;
    assert_eq!(responses.len(), 41);
    assert!(responses.iter().all(|r| r.answers.is_empty()));
    assert_eq!(engine.last_seq(), seq, "no batch written");
    assert_eq!(
        files_of(&engine),
        files,
        "same files, same lengths and crcs"
    );
    assert_eq!(dump(&engine), rows);
    // The next new entry still applies.
    apply(&mut sm, vec![writes(1, 41)]).await;
    // Three user ops and the session record.
    assert_eq!(engine.last_seq(), 41 * 65_536 + 4);
}

/// Builds a snapshot on a state machine with `last` entries (optionally a
/// merge applied before), installs it into a fresh one, compares.
async fn snapshot_round_trip(last: u64, merge: bool) {
    let leader_dir = tempfile::tempdir().unwrap();
    let follower_dir = tempfile::tempdir().unwrap();
    let mut leader = open(leader_dir.path());
    apply(&mut leader, history(last)).await;
    let mut next = last + 1;
    if merge {
        let sealed = leader.engine().sealed_data_files();
        assert!(sealed.len() >= 3);
        let inputs = sealed[..2].to_vec();
        apply(
            &mut leader,
            vec![normal(1, next, Command::Merge { inputs })],
        )
        .await;
        next += 1;
        let deadline = Instant::now() + Duration::from_secs(30);
        while leader.engine().stats().merges == 0 {
            assert!(Instant::now() < deadline, "the merge entry ran a merge");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        apply(&mut leader, vec![writes(1, next)]).await;
        next += 1;
    }
    let snapshot = leader
        .get_snapshot_builder()
        .await
        .build_snapshot()
        .await
        .unwrap();
    assert_eq!(snapshot.meta.last_log_id, Some(log_id(1, next - 1)));
    // The leader moves on; the snapshot does not.
    apply(&mut leader, vec![writes(1, next)]).await;

    let mut follower = open(follower_dir.path());
    let staging = follower.begin_receiving().unwrap();
    stage_copy(&snapshot.snapshot, &staging);
    follower
        .install_snapshot(&snapshot.meta, staging)
        .await
        .unwrap();
    let (last_applied, members) = follower.applied_state().await.unwrap();
    assert_eq!(last_applied, snapshot.meta.last_log_id);
    assert_eq!(members, snapshot.meta.last_membership);
    // Then the same next entry on both: identical keys.
    apply(&mut follower, vec![writes(1, next)]).await;
    let (leader_rows, follower_rows) = (dump(&leader.engine()), dump(&follower.engine()));
    assert!(leader_rows.len() > 20);
    assert_eq!(follower_rows, leader_rows);
    assert_eq!(follower.cluster_time_ms(), leader.cluster_time_ms());
    // And after a restart of the follower, still.
    drop(follower);
    let mut follower = open(follower_dir.path());
    assert_eq!(
        follower.applied_state().await.unwrap(),
        leader.applied_state().await.unwrap()
    );
    assert_eq!(dump(&follower.engine()), leader_rows);
    let current = follower.get_current_snapshot().await.unwrap().unwrap();
    assert_eq!(current.meta, snapshot.meta);
}

#[tokio::test]
async fn a_snapshot_installs_into_a_fresh_state_machine_with_the_same_data() {
    snapshot_round_trip(80, false).await;
}

#[tokio::test]
async fn a_snapshot_taken_after_a_merge_entry_installs_with_the_same_data() {
    snapshot_round_trip(80, true).await;
}

#[tokio::test]
async fn the_current_snapshot_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let meta = {
        let mut sm = open(dir.path());
        assert!(sm.get_current_snapshot().await.unwrap().is_none());
        apply(&mut sm, history(30)).await;
        let first = sm
            .get_snapshot_builder()
            .await
            .build_snapshot()
            .await
            .unwrap();
        apply(&mut sm, vec![writes(1, 31)]).await;
        let second = sm
            .get_snapshot_builder()
            .await
            .build_snapshot()
            .await
            .unwrap();
        let id_of = |handle: &kvnode::SnapshotHandle| handle.read_manifest().unwrap().snapshot_id;
        assert_ne!(id_of(&first.snapshot), id_of(&second.snapshot));
        assert_eq!(sm.current_snapshot_id(), Some(id_of(&second.snapshot)));
        let current = sm.get_current_snapshot().await.unwrap().unwrap();
        assert_eq!(current.meta, second.meta);
        second.meta
    };
    let mut sm = open(dir.path());
    let current = sm.get_current_snapshot().await.unwrap().unwrap();
    assert_eq!(current.meta, meta);
    let manifest = current.snapshot.read_manifest().unwrap();
    current.snapshot.verify(&manifest).unwrap();
    assert_eq!(manifest.last_log_id, Some(log_id(1, 31)));
    // A third build: the two newest snapshots stay on disk, the oldest goes.
    apply(&mut sm, vec![writes(1, 32)]).await;
    let third = sm
        .get_snapshot_builder()
        .await
        .build_snapshot()
        .await
        .unwrap();
    let mut kept: Vec<String> = std::fs::read_dir(dir.path().join("snapshots"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    kept.sort();
    assert_eq!(kept.len(), 2, "{kept:?}");
    assert_eq!(
        current.snapshot.dir().file_name().unwrap(),
        kept[0].as_str()
    );
    assert_eq!(third.snapshot.dir().file_name().unwrap(), kept[1].as_str());
}

#[tokio::test]
async fn a_corrupted_staged_snapshot_is_refused_and_the_old_state_keeps_working() {
    let (_leader_dir, _leader, snapshot) = leader_with_snapshot(60).await;
    let follower_dir = tempfile::tempdir().unwrap();
    let mut follower = open(follower_dir.path());
    apply(&mut follower, history(10)).await;
    let before = (
        follower.applied_state().await.unwrap(),
        dump(&follower.engine()),
    );
    let staging = follower.begin_receiving().unwrap();
    stage_copy(&snapshot.snapshot, &staging);
    // Flip one byte in the middle of the first sealed file.
    let manifest = staging.read_manifest().unwrap();
    let victim = staging.file_path(&manifest.files[0].name).unwrap();
    let mut bytes = std::fs::read(&victim).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x40;
    std::fs::write(&victim, bytes).unwrap();
    let err = follower
        .install_snapshot(&snapshot.meta, staging)
        .await
        .expect_err("a corrupted snapshot is refused");
    assert!(err.to_string().contains("crc32"), "{err}");
    assert_eq!(follower.applied_state().await.unwrap(), before.0);
    assert_eq!(dump(&follower.engine()), before.1);
    // Still applying, and still there after a restart.
    apply(&mut follower, vec![writes(1, 11)]).await;
    drop(follower);
    let mut follower = open(follower_dir.path());
    assert_eq!(
        follower.applied_state().await.unwrap().0,
        Some(log_id(1, 11))
    );
    // A snapshot with a file missing is refused too.
    let staging = follower.begin_receiving().unwrap();
    stage_copy(&snapshot.snapshot, &staging);
    std::fs::remove_file(staging.file_path(&manifest.files[1].name).unwrap()).unwrap();
    assert!(
        follower
            .install_snapshot(&snapshot.meta, staging)
            .await
            .is_err()
    );
    assert_eq!(
        follower.applied_state().await.unwrap().0,
        Some(log_id(1, 11))
    );
}

#[tokio::test]
async fn a_durable_snapshot_ahead_of_the_engine_is_switched_in_at_open() {
    let (_leader_dir, leader, snapshot) = leader_with_snapshot(30).await;
    let follower_dir = tempfile::tempdir().unwrap();
    // The follower has applied a little of the same history.
    let mut follower = open(follower_dir.path());
    apply(&mut follower, history(5)).await;
    drop(follower);
    // The crash point: the received snapshot is complete (files and
    // manifest) under `snapshots/`, but `CURRENT` still names the old engine.
    let names: Vec<String> = std::fs::read_dir(follower_dir.path().join("snapshots"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert!(names.is_empty(), "{names:?}");
    let landed = SnapshotHandle::new(
        follower_dir
            .path()
            .join("snapshots")
            .join(format!("snap-{:020}", 7)),
    );
    std::fs::create_dir(landed.dir()).unwrap();
    stage_copy(&snapshot.snapshot, &landed);

    let mut follower = open(follower_dir.path());
    let (applied, members) = follower.applied_state().await.unwrap();
    assert_eq!(applied, snapshot.meta.last_log_id);
    assert_eq!(members, snapshot.meta.last_membership);
    assert_eq!(dump(&follower.engine()), dump(&leader.engine()));
    // It stays switched across another restart.
    drop(follower);
    let mut follower = open(follower_dir.path());
    assert_eq!(
        follower.applied_state().await.unwrap().0,
        snapshot.meta.last_log_id
    );
}
