//! Proves appends, truncates, purges, the vote and the committed log id
//! survive closing and reopening the store (on real files and on the
//! simulated disk), that segments rotate by size and purged segments are
//! deleted, that one appended batch costs one fsync, that the zeros kept
//! after the last segment's records are cut at rotation, at close and at
//! recovery, that a second store on a held directory is refused, and that
//! reads work from disk once the in-memory cache has let
//! entries go.

use std::sync::Arc;

use kvnode::log_store::{LOG_ENTRY_SIZE_BYTES_MAX, LOG_FILL_AHEAD_BYTES, segment_name};
use kvnode::{LogStore, LogStoreOptions};
use openraft::storage::{RaftLogStorage, RaftLogStorageExt};
use openraft::{EntryPayload, RaftLogReader, Vote};
use vfs::sim::SimFs;
use vfs::{RealFs, Vfs};

use crate::common::*;

/// The whole lifecycle on one disk, reopening after every step.
async fn lifecycle(vfs: Arc<dyn Vfs>, dir: std::path::PathBuf) {
    let options = LogStoreOptions {
        persist_committed: true,
        ..small_segments()
    };
    let open = || LogStore::<TestConfig>::open_with(vfs.clone(), dir.clone(), options).unwrap();

    // Appends in batches, rotating through several segments.
    let mut store = open();
    assert_eq!(last_log_id(&mut store).await, None);
    assert_eq!(store.read_vote().await.unwrap(), None);
    for start in (0..100).step_by(7) {
        append(&mut store, entries(1, start..(start + 7).min(100))).await;
    }
    let vote = Vote::new(3, 2);
    store.save_vote(&vote).await.unwrap();
    store.save_committed(Some(log_id(1, 60))).await.unwrap();
    drop(store);
    let segment_count = segments(&*vfs, &dir).len();
    assert!(segment_count >= 5, "only {segment_count} segments");

    let mut store = open();
    assert_eq!(indexes(&mut store).await, (0..100).collect::<Vec<_>>());
    assert_payloads(&all(&mut store).await, |_| 1);
    assert_eq!(store.read_vote().await.unwrap(), Some(vote));
    assert_eq!(store.read_committed().await.unwrap(), Some(log_id(1, 60)));
    assert_eq!(last_log_id(&mut store).await, Some(log_id(1, 99)));

    // Truncate inside a segment, then append a new term over the cut.
    store.truncate_after(Some(log_id(1, 80 - 1))).await.unwrap();
    assert_eq!(last_log_id(&mut store).await, Some(log_id(1, 79)));
    drop(store);
    let mut store = open();
    assert_eq!(indexes(&mut store).await, (0..80).collect::<Vec<_>>());
    append(&mut store, entries(2, 80..90)).await;
    drop(store);
    let mut store = open();
    assert_eq!(indexes(&mut store).await, (0..90).collect::<Vec<_>>());
    assert_payloads(&all(&mut store).await, |i| if i < 80 { 1 } else { 2 });

    // Truncate exactly at a segment's first index: the segment goes.
    let names = segments(&*vfs, &dir);
    let boundary: u64 = names[names.len() - 1][4..24].parse().unwrap();
    store
        .truncate_after(Some(log_id(2, boundary - 1)))
        .await
        .unwrap();
    assert!(!segments(&*vfs, &dir).contains(&segment_name(boundary)));
    drop(store);
    let mut store = open();
    assert_eq!(indexes(&mut store).await, (0..boundary).collect::<Vec<_>>());
    append(&mut store, entries(3, boundary..95)).await;

    // Purge: the purge point persists; wholly purged segments are deleted.
    store.purge(log_id(1, 40)).await.unwrap();
    let names = segments(&*vfs, &dir);
    let firsts: Vec<u64> = names.iter().map(|n| n[4..24].parse().unwrap()).collect();
    assert!(
        firsts[0] <= 41 && firsts.get(1).is_none_or(|&second| second > 41),
        "{names:?}"
    );
    drop(store);
    let mut store = open();
    let state = store.get_log_state().await.unwrap();
    assert_eq!(state.last_purged_log_id, Some(log_id(1, 40)));
    assert_eq!(state.last_log_id, Some(log_id(3, 94)));
    assert_eq!(indexes(&mut store).await, (41..95).collect::<Vec<_>>());
    assert!(store.try_get_log_entries(0..41).await.unwrap().is_empty());
    assert_eq!(store.read_vote().await.unwrap(), Some(vote));

    // Purge beyond the last entry: every segment goes; appends continue after it.
    store.purge(log_id(4, 120)).await.unwrap();
    assert!(segments(&*vfs, &dir).is_empty());
    drop(store);
    let mut store = open();
    let state = store.get_log_state().await.unwrap();
    assert_eq!(state.last_purged_log_id, Some(log_id(4, 120)));
    assert_eq!(state.last_log_id, Some(log_id(4, 120)));
    append(&mut store, entries(5, 121..130)).await;
    drop(store);
    let mut store = open();
    assert_eq!(indexes(&mut store).await, (121..130).collect::<Vec<_>>());
    assert_eq!(last_log_id(&mut store).await, Some(log_id(5, 129)));

    // Truncate everything that is left (down to the purge point).
    store
        .truncate_after(Some(log_id(5, 121 - 1)))
        .await
        .unwrap();
    drop(store);
    let mut store = open();
    assert_eq!(last_log_id(&mut store).await, Some(log_id(4, 120)));
    append(&mut store, entries(6, 121..123)).await;
    drop(store);
    let mut store = open();
    assert_eq!(indexes(&mut store).await, vec![121, 122]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lifecycle_on_real_files_survives_reopen() {
    let dir = tempfile::tempdir().unwrap();
    lifecycle(Arc::new(RealFs), dir.path().join("raft-log")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lifecycle_on_simulated_disk_survives_reopen() {
    let fs = SimFs::new();
    lifecycle(Arc::new(fs), sim_dir()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lifecycle_survives_power_cuts_between_steps() {
    // Every step above returns only once durable, so cutting the power
    // right after each close loses nothing.
    let fs = SimFs::new();
    let dir = sim_dir();
    let options = LogStoreOptions {
        persist_committed: true,
        ..small_segments()
    };
    let mut store = open_sim(&fs, options);
    append(&mut store, entries(1, 0..50)).await;
    store.save_vote(&Vote::new(7, 1)).await.unwrap();
    store.truncate_after(Some(log_id(1, 30 - 1))).await.unwrap();
    store.purge(log_id(1, 10)).await.unwrap();
    store.save_committed(Some(log_id(1, 20))).await.unwrap();
    let fs = fs.power_cut(vfs::sim::Torn::Nothing);
    drop(store);
    let mut store = open_sim(&fs, options);
    assert_eq!(indexes(&mut store).await, (11..30).collect::<Vec<_>>());
    assert_eq!(store.read_vote().await.unwrap(), Some(Vote::new(7, 1)));
    assert_eq!(store.read_committed().await.unwrap(), Some(log_id(1, 20)));
    assert!(!segments(&fs, &dir).is_empty());
}

/// Each segment's length, in name order (the names sort by first index).
fn segment_lens(vfs: &dyn Vfs, dir: &std::path::Path) -> Vec<u64> {
    let mut names = segments(vfs, dir);
    names.sort();
    names
        .iter()
        .map(|name| vfs.open(&dir.join(name)).unwrap().len().unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zeros_after_the_last_record_are_cut_at_rotation_close_and_recovery() {
    let fs = SimFs::new();
    let dir = sim_dir();
    let filled = |lens: &[u64]| {
        lens.iter()
            .filter(|&&len| len >= LOG_FILL_AHEAD_BYTES)
            .count()
    };
    let mut store = open_sim(&fs, small_segments());
    for start in (0..60).step_by(6) {
        append(&mut store, entries(1, start..start + 6)).await;
        // Only the last segment holds zeros after its records; every
        // earlier one was cut to its records when the next was created.
        let lens = segment_lens(&fs, &dir);
        assert_eq!(filled(&lens), 1, "{lens:?}");
        assert!(*lens.last().unwrap() >= LOG_FILL_AHEAD_BYTES, "{lens:?}");
    }
    assert!(segment_lens(&fs, &dir).len() >= 5);
    // A power cut with the zeros in place: recovery cuts them, keeps every
    // entry, and appending goes on after the last one.
    let cut = fs.power_cut(vfs::sim::Torn::Nothing);
    drop(store);
    assert_eq!(
        filled(&segment_lens(&cut, &dir)),
        1,
        "the zeros are as durable as the records (one fsync covers both)"
    );
    let mut store = open_sim(&cut, small_segments());
    assert_eq!(filled(&segment_lens(&cut, &dir)), 0);
    assert_eq!(indexes(&mut store).await, (0..60).collect::<Vec<_>>());
    append(&mut store, entries(2, 60..66)).await;
    assert_eq!(filled(&segment_lens(&cut, &dir)), 1);
    // A truncate inside the last segment leaves it ending at the cut (no
    // zeros), and the rotation the next batch causes cuts it at the cut,
    // not where its records ended before: reopening finds no zeros in a
    // segment before the last.
    store.truncate_after(Some(log_id(2, 62))).await.unwrap();
    let before = segment_lens(&cut, &dir);
    assert_eq!(filled(&before), 0, "{before:?}");
    append(&mut store, entries(3, 63..70)).await;
    let after = segment_lens(&cut, &dir);
    assert!(after.len() > before.len(), "the batch rotated: {after:?}");
    assert_eq!(after[before.len() - 1], *before.last().unwrap());
    assert_eq!(filled(&after), 1, "{after:?}");
    // A truncate at a segment's first index removes it; the segment before
    // it is the last again, takes appends and fills ahead.
    let first_of_last = 70 - 7;
    store
        .truncate_after(Some(log_id(3, first_of_last - 1)))
        .await
        .unwrap();
    assert_eq!(segment_lens(&cut, &dir).len(), before.len());
    append(&mut store, entries(4, first_of_last..first_of_last + 1)).await;
    assert_eq!(filled(&segment_lens(&cut, &dir)), 1);
    // Closing cuts them.
    drop(store);
    assert_eq!(filled(&segment_lens(&cut, &dir)), 0);
    let mut store = open_sim(&cut, small_segments());
    assert_eq!(indexes(&mut store).await, (0..64).collect::<Vec<_>>());
    assert_payloads(&all(&mut store).await, |i| match i {
        0..60 => 1,
        60..63 => 2,
        _ => 4,
    });
}

/// A second store on a live log's directory (another kvnode started on
/// the same data directory) is refused before recovery touches anything:
/// it would otherwise cut the live segment's zeros, and with them any batch
/// the live writer acknowledged in between.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_store_on_a_live_directory_is_refused_and_cuts_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("raft-log");
    let vfs: Arc<dyn Vfs> = Arc::new(RealFs);
    let open = || LogStore::<TestConfig>::open_with(vfs.clone(), path.clone(), small_segments());
    let mut store = open().unwrap();
    append(&mut store, entries(1, 0..5)).await;
    let lens = segment_lens(&*vfs, &path);
    assert!(*lens.last().unwrap() >= LOG_FILL_AHEAD_BYTES, "{lens:?}");

    let err = open().expect_err("a second store on a held directory");
    assert!(
        matches!(&err, kvnode::log_store::LogError::DirectoryInUse { path: p } if *p == path),
        "{err}"
    );
    assert!(err.to_string().contains("LOCK"), "{err}");
    assert_eq!(
        segment_lens(&*vfs, &path),
        lens,
        "the refused open cut nothing"
    );
    append(&mut store, entries(1, 5..8)).await;

    // Closing releases it.
    drop(store);
    let mut store = open().unwrap();
    assert_eq!(indexes(&mut store).await, (0..8).collect::<Vec<_>>());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_batch_is_one_fsync() {
    let fs = SimFs::new();
    let mut store = open_sim(&fs, LogStoreOptions::default());
    append(&mut store, entries(1, 0..1)).await; // creates the segment
    let before = fs.sync_count();
    append(&mut store, entries(1, 1..65)).await;
    assert_eq!(
        fs.sync_count() - before,
        1,
        "64 entries in one batch: one fsync"
    );
    let before = fs.sync_count();
    store.save_vote(&Vote::new(1, 1)).await.unwrap();
    assert_eq!(fs.sync_count() - before, 1, "the vote file is fsynced");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_from_disk_when_nothing_is_cached() {
    let fs = SimFs::new();
    let options = LogStoreOptions {
        cache_bytes_max: 0,
        ..small_segments()
    };
    let mut store = open_sim(&fs, options);
    append(&mut store, entries(1, 0..40)).await;
    let mut reader = store.get_log_reader().await;
    let found = reader.try_get_log_entries(5..25).await.unwrap();
    assert_eq!(found.len(), 20);
    assert_eq!(found[0].log_id, log_id(1, 5));
    assert_payloads(&found, |_| 1);
    assert_eq!(reader.try_get_log_entries(38..100).await.unwrap().len(), 2);
    assert!(
        reader
            .try_get_log_entries(40..100)
            .await
            .unwrap()
            .is_empty()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn appends_must_continue_the_log() {
    let fs = SimFs::new();
    let mut store = open_sim(&fs, LogStoreOptions::default());
    append(&mut store, entries(1, 0..5)).await;
    let err = store.blocking_append(entries(1, 6..8)).await.unwrap_err();
    assert!(err.to_string().contains("expected index 5, got 6"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_entry_is_refused_naming_the_limit() {
    let fs = SimFs::new();
    let mut store = open_sim(&fs, LogStoreOptions::default());
    let huge = TestEntry {
        log_id: kvnode::raft::types::log_id(1, 1, 0),
        payload: EntryPayload::Normal("x".repeat(LOG_ENTRY_SIZE_BYTES_MAX)),
    };
    let err = store.blocking_append(vec![huge]).await.unwrap_err();
    assert!(
        err.to_string().contains("LOG_ENTRY_SIZE_BYTES_MAX"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_committed_log_id_stays_in_memory_by_default() {
    let fs = SimFs::new();
    let options = LogStoreOptions::default();
    assert!(!options.persist_committed);
    let mut store = open_sim(&fs, options);
    append(&mut store, entries(1, 0..3)).await;
    let before = fs.sync_count();
    store.save_committed(Some(log_id(1, 2))).await.unwrap();
    assert_eq!(fs.sync_count(), before, "no fsync");
    assert_eq!(store.read_committed().await.unwrap(), Some(log_id(1, 2)));
    drop(store);
    let mut store = open_sim(&fs, options);
    assert_eq!(store.read_committed().await.unwrap(), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_committed_vote_reopens_uncommitted_with_its_term_and_candidate() {
    // A member that led must hold a new election after a restart (its
    // committed index is not durable); it keeps its term and candidate, so
    // it can never vote twice in one term.
    let fs = SimFs::new();
    let mut store = open_sim(&fs, LogStoreOptions::default());
    store.save_vote(&Vote::new_committed(5, 2)).await.unwrap();
    assert_eq!(
        store.read_vote().await.unwrap(),
        Some(Vote::new_committed(5, 2)),
        "unchanged while open"
    );
    drop(store);
    let mut store = open_sim(&fs, LogStoreOptions::default());
    assert_eq!(store.read_vote().await.unwrap(), Some(Vote::new(5, 2)));
}
