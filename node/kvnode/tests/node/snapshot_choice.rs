//! Which snapshot a member takes at startup (issue 15): the one with the
//! highest last log id, never the one with the highest counter.
//!
//! The crash point, reproduced step by step at the storage level (no
//! timing): a follower receives a snapshot and seals it (`snap-<m>`); a
//! snapshot build that started on its old engine finishes after that
//! (`snap-<m+1>`: a higher counter, a lower last log id); openraft purges
//! the log through the received snapshot (it does so without waiting for
//! the install); then the power fails before the engine switches. The
//! member must come back with its state machine at the received snapshot,
//! so that nothing between its applied id and the log's first entry is
//! missing; and the stale build must go when pruning comes round.
//!
//! With the negative control `nc-snapshot-by-counter` the stale build wins
//! at startup, the engine stays below the purged log, and the test fails.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;

use bitcask::{Engine, Options, Scan};
use kvnode::raft::types::{NodeEntry, NodeLogId};
use kvnode::snapshot::SnapshotHandle;
use kvnode::{LogStore, LogStoreOptions, NodeInfo, StateMachine, StateMachineOptions, TypeConfig};
use kvstate::command::{Command, Op, Proposal, Request};
use openraft::storage::{RaftLogStorage, RaftLogStorageExt, RaftStateMachine};
use openraft::{Entry, EntryPayload, Membership, RaftLogReader};
use vfs::RealFs;

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

fn log_id(index: u64) -> NodeLogId {
    kvnode::raft::types::log_id(1, 1, index)
}

fn history(last: u64) -> Vec<NodeEntry> {
    let nodes: BTreeMap<u64, NodeInfo> = [(1u64, NodeInfo::default())].into();
    let mut entries = vec![Entry {
        log_id: log_id(0),
        payload: EntryPayload::Membership(
            Membership::new(vec![BTreeSet::from([1])], nodes).expect("membership"),
        ),
    }];
    for index in 1..=last {
        entries.push(Entry {
            log_id: log_id(index),
            payload: EntryPayload::Normal(Proposal {
                time_ms: index * 10,
                command: Command::Requests(vec![Request {
                    session: None,
                    conditions: Vec::new(),
                    ops: vec![Op::Put {
                        key: format!("key/{:02}", index % 17).into_bytes(),
                        value: vec![index as u8; 200],
                        ttl_ms: 0,
                    }],
                }]),
            }),
        });
    }
    entries
}

fn dump(engine: &Engine) -> Vec<(Vec<u8>, Option<Vec<u8>>, u64)> {
    engine
        .scan(&Scan::all(10_000), 0)
        .expect("scan")
        .into_iter()
        .map(|e| (e.key, e.value, e.seq))
        .collect()
}

/// `(counter, last log index)` of every complete snapshot directory.
fn snapshots(state: &Path) -> Vec<(String, Option<u64>)> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(state.join("snapshots")).unwrap() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        if !name.starts_with("snap-") {
            continue;
        }
        let handle = SnapshotHandle::new(state.join("snapshots").join(&name));
        if let Ok(manifest) = handle.read_manifest() {
            found.push((name, manifest.last_log_id.map(|id| id.index)));
        }
    }
    found.sort();
    found
}

fn open_log(dir: &Path) -> LogStore<TypeConfig> {
    LogStore::open_with(Arc::new(RealFs), dir, LogStoreOptions::default()).expect("open log")
}

#[tokio::test]
async fn a_stale_build_on_the_old_engine_never_wins_over_a_sealed_received_snapshot() {
    // The leader's snapshot at 40.
    let leader_dir = tempfile::tempdir().unwrap();
    let leader = open(leader_dir.path());
    leader.apply_entries(history(40)).unwrap();
    let received = leader.build().expect("leader snapshot");
    let manifest = received.snapshot.read_manifest().unwrap();
    assert_eq!(manifest.last_log_id, Some(log_id(40)));

    // The follower applied up to 5, with those entries in its log.
    let follower_dir = tempfile::tempdir().unwrap();
    let state = follower_dir.path().join("state");
    let log_dir = follower_dir.path().join("raft-log");
    let follower = open(&state);
    let mut log = open_log(&log_dir);
    log.blocking_append(history(5)).await.unwrap();
    follower.apply_entries(history(5)).unwrap();

    // 1. The received snapshot is staged and sealed (snap-<m>).
    let staging = follower.begin_receiving().unwrap();
    for file in &manifest.files {
        std::fs::copy(
            received.snapshot.file_path(&file.name).unwrap(),
            staging.file_path(&file.name).unwrap(),
        )
        .unwrap();
    }
    let sealed = follower.seal_received(&staging, &manifest).unwrap();
    // 2. A build that started on the old engine finishes after it: a
    //    higher counter, a lower last log id.
    let stale = follower.build().expect("stale build");
    assert_eq!(stale.meta.last_log_id, Some(log_id(5)));
    assert!(
        stale.snapshot.dir().file_name() > sealed.dir().file_name(),
        "the stale build has the higher counter: {:?} vs {:?}",
        stale.snapshot.dir(),
        sealed.dir()
    );
    // 3. openraft purges the log through the received snapshot before the
    //    install has switched the engine.
    log.purge(log_id(40)).await.unwrap();
    // 4. Power cut before the switch: nothing more happens; the member's
    //    files are what they are now (real files, everything above was
    //    fsynced).
    drop(follower);
    drop(log);

    // The restart.
    let mut follower = open(&state);
    let mut log = open_log(&log_dir);
    let (applied, _) = follower.applied_state().await.unwrap();
    let log_state = log.get_log_state().await.unwrap();
    assert!(
        applied >= log_state.last_purged_log_id,
        "the state machine restarted at {applied:?}, below the log's purge point {:?}: \
         entries {}..={} are neither applied nor in the log, the member cannot go on",
        log_state.last_purged_log_id,
        applied.map_or(0, |a| a.index + 1),
        log_state.last_purged_log_id.map_or(0, |p| p.index),
    );
    assert_eq!(applied, Some(log_id(40)));
    assert_eq!(dump(&follower.engine()), dump(&leader.engine()));
    // Whatever openraft asks for next is there: the snapshot it reports is
    // the received one, and the log from the purge point on reads (empty).
    let current = follower.get_current_snapshot().await.unwrap().unwrap();
    assert_eq!(current.meta.last_log_id, Some(log_id(40)));
    assert!(log.try_get_log_entries(41..).await.unwrap().is_empty());

    // Pruning: the stale build ranks below the received snapshot; the next
    // snapshot (same log id, later counter) pushes it out.
    assert_eq!(
        snapshots(&state).iter().map(|s| s.1).collect::<Vec<_>>(),
        vec![Some(40), Some(5)],
        "both kept for now (two are kept): {:?}",
        snapshots(&state)
    );
    follower.build().expect("a later build");
    let kept = snapshots(&state);
    assert_eq!(
        kept.iter().map(|s| s.1).collect::<Vec<_>>(),
        vec![Some(40), Some(40)],
        "the stale build is pruned: {kept:?}"
    );
    // And the choice holds across another restart.
    drop(follower);
    let mut follower = open(&state);
    assert_eq!(follower.applied_state().await.unwrap().0, Some(log_id(40)));
}
