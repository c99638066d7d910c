//! Proves that a power cut loses nothing that was acknowledged: no entry
//! whose flush callback fired and no vote whose `save_vote` returned — with
//! the power cut at an arbitrary moment while appends and votes are in
//! flight, and with torn (partially persisted) unsynced tails — and that
//! recovery always returns a prefix of what was written.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use openraft::storage::{RaftLogStorage, RaftLogStorageExt};
use openraft::{RaftLogReader, Vote};
use vfs::sim::{SimFs, Torn};

use crate::common::*;

/// What a reopened store must hold: a gap-free run 0..n of exactly the
/// entries written, with n at least `acked`.
async fn assert_prefix(store: &mut Store, acked: u64, context: &str) -> u64 {
    let found = all(store).await;
    for (i, e) in found.iter().enumerate() {
        assert_eq!(e.log_id.index, i as u64, "{context}: not a prefix");
    }
    assert_payloads(&found, |_| 1);
    let n = found.len() as u64;
    assert!(
        n >= acked,
        "{context}: {acked} entries acknowledged, {n} recovered"
    );
    n
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_entries_and_votes_survive_a_power_cut_at_any_moment() {
    for seed in 0..12u64 {
        let fs = SimFs::new();
        fs.set_sync_delay(Duration::from_micros(200));
        let store = open_sim(&fs, small_segments());
        let acked = Arc::new(AtomicU64::new(0)); // entries acknowledged
        let vote_acked = Arc::new(AtomicU64::new(0)); // highest term whose save_vote returned
        let stop = Arc::new(AtomicBool::new(false));

        let writer = tokio::spawn({
            let (acked, vote_acked, stop) = (acked.clone(), vote_acked.clone(), stop.clone());
            async move {
                let mut store = store;
                let mut next = 0u64;
                let mut round = 1u64;
                while !stop.load(Ordering::SeqCst) {
                    let batch = 1 + (next + seed) % 9;
                    if store
                        .blocking_append(entries(1, next..next + batch))
                        .await
                        .is_err()
                    {
                        break;
                    }
                    next += batch;
                    acked.store(next, Ordering::SeqCst);
                    if round.is_multiple_of(3) {
                        if store.save_vote(&Vote::new(round, 1)).await.is_err() {
                            break;
                        }
                        vote_acked.store(round, Ordering::SeqCst);
                    }
                    round += 1;
                }
                store
            }
        });
        // Let the writer get going (however slow the machine), then cut
        // after a seed-dependent delay.
        while acked.load(Ordering::SeqCst) == 0 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        tokio::time::sleep(Duration::from_millis(1 + seed * 3)).await;
        // Read what was acknowledged before the cut, then cut.
        let acked_before = acked.load(Ordering::SeqCst);
        let vote_before = vote_acked.load(Ordering::SeqCst);
        let after = fs.power_cut(Torn::Prefix(seed * 7919 + 1));
        stop.store(true, Ordering::SeqCst);
        drop(writer.await.unwrap());

        let mut store = open_sim(&after, small_segments());
        let context = format!("seed {seed}");
        let n = assert_prefix(&mut store, acked_before, &context).await;
        assert!(
            acked_before > 0,
            "{context}: the test wrote nothing before the cut"
        );
        let vote = store.read_vote().await.unwrap();
        let term = vote.map_or(0, |v| v.leader_id.term);
        assert!(
            term >= vote_before,
            "{context}: vote {vote_before} acknowledged, {term} recovered"
        );

        // The recovered log takes appends and survives another reopen.
        append(&mut store, entries(1, n..n + 3)).await;
        drop(store);
        let mut store = open_sim(&after, small_segments());
        assert_prefix(&mut store, n + 3, &context).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_torn_unsynced_batch_recovers_to_a_prefix() {
    for seed in 0..40u64 {
        let fs = SimFs::new();
        let mut store = open_sim(&fs, small_segments());
        let acked = 10 + seed % 13;
        for start in (0..acked).step_by(4) {
            append(&mut store, entries(1, start..(start + 4).min(acked))).await;
        }
        store.save_vote(&Vote::new(5, 1)).await.unwrap();
        // The next batch is written but its fsync fails: it is not
        // acknowledged, and a power cut keeps a random prefix of its bytes.
        fs.set_fail_sync(true);
        assert!(
            store
                .blocking_append(entries(1, acked..acked + 1 + seed % 6))
                .await
                .is_err()
        );
        assert!(store.save_vote(&Vote::new(6, 1)).await.is_err());
        let after = fs.power_cut(Torn::Prefix(seed));
        drop(store);

        let mut store = open_sim(&after, small_segments());
        let context = format!("seed {seed}");
        let n = assert_prefix(&mut store, acked, &context).await;
        assert!(n <= acked + 1 + seed % 6, "{context}");
        assert_eq!(
            store.read_vote().await.unwrap(),
            Some(Vote::new(5, 1)),
            "{context}"
        );
        let state = store.get_log_state().await.unwrap();
        assert_eq!(state.last_log_id.map(|l| l.index + 1), Some(n), "{context}");
        assert_eq!(
            store.try_get_log_entries(n..).await.unwrap().len(),
            0,
            "{context}"
        );
        // The torn tail was cut: appending continues cleanly.
        append(&mut store, entries(1, n..n + 2)).await;
        drop(store);
        let mut store = open_sim(&after, small_segments());
        assert_prefix(&mut store, n + 2, &context).await;
    }
}
