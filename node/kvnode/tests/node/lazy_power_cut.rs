//! Power cuts on the lazy disk (feature `lazy-disk`; the module is empty
//! without it): a fresh `LazyFs` over the same real files is what a process
//! finds after a power cut (the old one's memory — unsynced bytes and
//! directory changes — is gone), deterministically, in process.
//!
//! - A vote whose `save_vote` returned survives a power cut. With the
//!   negative control `nc-rename-no-dir-fsync` (the metadata rename is not
//!   followed by a directory fsync) the rename is lost and the test fails.
//! - The files the node writes outside the engine and the log — `IDENTITY`,
//!   `CURRENT`, a snapshot's `MANIFEST` and files — are durable on the real
//!   disk once the call that wrote them returned (they go through the vfs
//!   and fsync their directories).
#![cfg(feature = "lazy-disk")]

use kvnode::raft::types::log_id;
use std::path::Path;
use std::sync::Arc;

use kvnode::lazy_disk::LazyFs;
use kvnode::{LogStore, LogStoreOptions, StateMachine, StateMachineOptions};
use openraft::storage::RaftLogStorage;
use openraft::{RaftLogReader, Vote};
use vfs::Vfs;

use crate::common::*;

fn open_lazy(fs: &LazyFs, dir: &Path) -> Store {
    LogStore::open_with(Arc::new(fs.clone()), dir, LogStoreOptions::default())
        .expect("open log store")
}

#[tokio::test]
async fn a_saved_vote_survives_a_power_cut() {
    let dir = tempfile::tempdir().unwrap();
    let log_dir = dir.path().join("raft-log");
    let fs = LazyFs::new();
    let mut store = open_lazy(&fs, &log_dir);
    store.save_vote(&Vote::new(3, 1)).await.unwrap();
    // Replaced: the rename over the old vote file must be durable too.
    store.save_vote(&Vote::new(4, 2)).await.unwrap();
    drop(store);

    // The power cut: a new process's lazy disk over the same real files.
    let after = LazyFs::new();
    let mut store = open_lazy(&after, &log_dir);
    let vote = store.read_vote().await.unwrap();
    assert_eq!(
        vote,
        Some(Vote::new(4, 2)),
        "the vote saved before the power cut is gone"
    );
}

fn real_file_crc(path: &Path) -> (u64, u32) {
    let bytes = std::fs::read(path).unwrap_or_else(|err| panic!("{}: {err}", path.display()));
    (bytes.len() as u64, crc32fast::hash(&bytes))
}

#[tokio::test]
async fn identity_current_and_snapshots_are_durable_when_written() {
    use openraft::EntryPayload;

    let dir = tempfile::tempdir().unwrap();
    kvnode::node::identity::Identity::load_or_create(dir.path(), 1).unwrap();
    let state = dir.path().join("state");
    let sm = StateMachine::open(&state, StateMachineOptions::default()).unwrap();
    let blanks: Vec<kvnode::raft::types::NodeEntry> = (1..=20)
        .map(|index| kvnode::raft::types::NodeEntry {
            log_id: log_id(1, 1, index),
            payload: EntryPayload::Blank,
        })
        .collect();
    sm.apply_entries(blanks).unwrap();
    let built = sm.build().unwrap();

    // What a power cut leaves: the real files, read by a fresh lazy disk
    // and by std::fs.
    let after = LazyFs::new();
    for path in [dir.path().join("IDENTITY"), state.join("CURRENT")] {
        assert!(
            after.file_exists(&path),
            "{} is not durable",
            path.display()
        );
    }
    let manifest = built.snapshot.read_manifest().unwrap();
    assert!(after.file_exists(&built.snapshot.manifest_path()));
    for file in &manifest.files {
        let path = built.snapshot.file_path(&file.name).unwrap();
        assert_eq!(
            real_file_crc(&path),
            (file.len, file.crc),
            "snapshot file {} on the real disk",
            file.name
        );
    }
}
