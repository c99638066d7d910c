//! Proves that a failed fsync or write poisons the store: the failure is
//! reported (append's flush callback, save_vote), every later write is
//! refused with a clear "poisoned" error even once the disk works again, the
//! fsync is never retried, reads keep working, and reopening recovers.

use openraft::storage::{RaftLogStorage, RaftLogStorageExt};
use openraft::{RaftLogReader, Vote};
use vfs::sim::SimFs;

use crate::common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_fsync_poisons_the_store() {
    let fs = SimFs::new();
    let mut store = open_sim(&fs, small_segments());
    append(&mut store, entries(1, 0..10)).await;
    store.save_vote(&Vote::new(2, 1)).await.unwrap();

    fs.set_fail_sync(true);
    let err = store.blocking_append(entries(1, 10..12)).await.unwrap_err();
    assert!(err.to_string().contains("fsync"), "{err}");

    // The disk works again, but the store stays poisoned and never retries.
    fs.set_fail_sync(false);
    let syncs = fs.sync_count();
    let err = store.blocking_append(entries(1, 12..13)).await.unwrap_err();
    assert!(err.to_string().contains("poisoned"), "{err}");
    let err = store.save_vote(&Vote::new(3, 1)).await.unwrap_err();
    assert!(err.to_string().contains("poisoned"), "{err}");
    assert!(store.save_committed(Some(log_id(1, 5))).await.is_err());
    assert!(store.truncate_after(Some(log_id(1, 5 - 1))).await.is_err());
    assert!(store.purge(log_id(1, 5)).await.is_err());
    assert_eq!(fs.sync_count(), syncs, "no fsync after poisoning");
    assert_eq!(store.read_vote().await.unwrap(), Some(Vote::new(2, 1)));

    // Reads still work.
    let found = store.try_get_log_entries(0..10).await.unwrap();
    assert_eq!(found.len(), 10);
    drop(store);

    // Reopening recovers the durable state (plus, without a power cut, the
    // bytes the page cache still holds).
    let mut store = open_sim(&fs, small_segments());
    let found = indexes(&mut store).await;
    assert!(found.starts_with(&(0..10).collect::<Vec<_>>()), "{found:?}");
    assert_eq!(store.read_vote().await.unwrap(), Some(Vote::new(2, 1)));
    let next = found.len() as u64;
    append(&mut store, entries(1, next..next + 1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_vote_fsync_poisons_the_store() {
    let fs = SimFs::new();
    let mut store = open_sim(&fs, small_segments());
    append(&mut store, entries(1, 0..3)).await;
    fs.set_fail_sync(true);
    assert!(store.save_vote(&Vote::new(9, 1)).await.is_err());
    assert_eq!(
        store.read_vote().await.unwrap(),
        None,
        "a failed vote is not reported as saved"
    );
    fs.set_fail_sync(false);
    let err = store.blocking_append(entries(1, 3..4)).await.unwrap_err();
    assert!(err.to_string().contains("poisoned"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_write_poisons_the_store() {
    let fs = SimFs::new();
    let mut store = open_sim(&fs, small_segments());
    append(&mut store, entries(1, 0..3)).await;
    fs.fail_writes_after(Some(0));
    let err = store.blocking_append(entries(1, 3..5)).await.unwrap_err();
    assert!(err.to_string().contains("write"), "{err}");
    fs.fail_writes_after(None);
    let err = store.blocking_append(entries(1, 5..6)).await.unwrap_err();
    assert!(err.to_string().contains("poisoned"), "{err}");
}
