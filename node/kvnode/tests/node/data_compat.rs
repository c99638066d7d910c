//! Data written by an older build opens in this one.
//!
//! `tests/fixtures/openraft-0.9/` was written by the openraft 0.9.25 build
//! (main at 0d29bcb) and is checked in, never regenerated: `data/` is the
//! whole data directory of a one-member cluster (bootstrapped, snapshots
//! every 20 entries with 5 entries of log kept, merges off), stopped with
//! SIGTERM after 50 puts of `key1..key50` (value `value-<i>-` followed by
//! `i` times `x`), a delete of `key7` and an overwrite of `key3` with
//! `overwritten`; `backup.rcsnap` is `kvctl snapshot save` of that member
//! at log index 53, after the overwrite. Its files: the identity, the Raft
//! log's segment, vote and purge point, the engine's segment (with an empty
//! hint file left half made), two snapshots and `CURRENT`.
//!
//! These tests are what keeps an upgrade of openraft (or of the codec) from
//! silently misreading an existing directory or archive: the directory must
//! open with every key as written and take new writes; the archive must
//! restore into a new three-member cluster with the same keys.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use kvnode::snapshot::backup::{RestoreOptions, restore};
use kvnode::{NodeInfo, StateMachineOptions};

use crate::backup::{Members, bind_members};

/// Where the fixture lives in the source tree.
fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/openraft-0.9")
}

/// Log index of the fixture's backup (its snapshot's last log id).
const BACKUP_LAST_LOG_INDEX: u64 = 53;

/// What the fixture's member held when it stopped, key by key.
fn expected() -> BTreeMap<Vec<u8>, Option<Vec<u8>>> {
    (1..=50usize)
        .map(|i| {
            let key = format!("key{i}").into_bytes();
            let value = match i {
                7 => None,
                3 => Some(b"overwritten".to_vec()),
                _ => Some(format!("value-{i}-{}", "x".repeat(i)).into_bytes()),
            };
            (key, value)
        })
        .collect()
}

/// Copies a directory tree (files and folders only).
fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("create dir");
    for entry in std::fs::read_dir(from).expect("read fixture dir") {
        let entry = entry.expect("dir entry");
        let target = to.join(entry.file_name());
        if entry.file_type().expect("file type").is_dir() {
            copy_tree(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).expect("copy fixture file");
        }
    }
}

async fn assert_holds_the_fixture_keys(members: &Members) {
    for (key, value) in expected() {
        assert_eq!(
            members.get(&key).await,
            value,
            "key {:?} as the 0.9 build wrote it",
            String::from_utf8_lossy(&key)
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_data_directory_of_the_openraft_0_9_build_opens_with_every_key() {
    let work = tempfile::tempdir().expect("tempdir");
    let dir = work.path().join("member1");
    copy_tree(&fixture().join("data"), &dir);
    let (listeners, initial) = bind_members(1).await;
    let dirs = BTreeMap::from([(1u64, dir)]);
    let members = Members::start(listeners, &initial, &dirs, |_, config| {
        config.state_machine = StateMachineOptions::default();
    })
    .await;
    let leader = members.leader().await;
    assert_eq!(leader, 1);
    assert_holds_the_fixture_keys(&members).await;
    let applied = members.nodes[&1]
        .state_machine()
        .applied()
        .0
        .expect("applied")
        .index;
    assert!(
        applied > BACKUP_LAST_LOG_INDEX,
        "the reopened member applied only up to {applied}"
    );
    members.put(b"after-upgrade", b"works", 0).await;
    assert_eq!(members.get(b"after-upgrade").await, Some(b"works".to_vec()));
    members.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_of_the_openraft_0_9_build_restores_into_a_new_cluster() {
    let work = tempfile::tempdir().expect("tempdir");
    let archive = fixture().join("backup.rcsnap");
    let (listeners, initial): (_, BTreeMap<u64, NodeInfo>) = bind_members(3).await;
    let dirs: BTreeMap<u64, PathBuf> = initial
        .keys()
        .map(|id| (*id, work.path().join(format!("restored{id}"))))
        .collect();
    for (id, dir) in &dirs {
        let restored = restore(RestoreOptions {
            archive: archive.clone(),
            data_dir: dir.clone(),
            member_id: *id,
            initial_cluster: initial.clone(),
            cluster_token: String::new(),
            state_machine: StateMachineOptions::default(),
        })
        .await
        .unwrap_or_else(|err| panic!("restore member {id}: {err}"));
        assert_eq!(restored.snapshot_last_log_id.index, BACKUP_LAST_LOG_INDEX);
    }
    let members = Members::start(listeners, &initial, &dirs, |_, config| {
        config.state_machine = StateMachineOptions::default();
    })
    .await;
    assert_holds_the_fixture_keys(&members).await;
    members.put(b"after-restore", b"works", 0).await;
    assert_eq!(members.get(b"after-restore").await, Some(b"works".to_vec()));
    members.wait_applied_equal().await;
    members.shutdown().await;
}
