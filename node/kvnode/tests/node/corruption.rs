//! Proves recovery tells a torn tail from corruption: a bad record in a
//! sealed segment, or in the middle of the last one, a bad segment header, a
//! missing segment and a damaged vote file are errors naming the file and
//! offset; only a torn tail of the last segment is cut off.

use kvnode::log_store::{SEGMENT_HEADER_BYTES, VOTE_FILE};
use kvnode::{LogError, LogStore, LogStoreOptions};
use openraft::Vote;
use openraft::storage::RaftLogStorage;
use std::sync::Arc;
use vfs::sim::SimFs;

use crate::common::*;

/// A closed store with 60 entries in several segments; returns the segment names.
async fn written(fs: &SimFs) -> Vec<String> {
    let mut store = open_sim(fs, small_segments());
    for start in (0..60).step_by(6) {
        append(&mut store, entries(1, start..start + 6)).await;
    }
    store.save_vote(&Vote::new(4, 1)).await.unwrap();
    drop(store);
    let names = segments(fs, &sim_dir());
    assert!(names.len() >= 3, "{names:?}");
    names
}

fn flip(fs: &SimFs, name: &str, at: u64) {
    let path = sim_dir().join(name);
    let mut bytes = fs.read_file(&path).unwrap();
    bytes[at as usize] ^= 0x40;
    fs.write_file(&path, &bytes);
}

fn open_err(fs: &SimFs) -> LogError {
    LogStore::<TestConfig>::open_with(Arc::new(fs.clone()), sim_dir(), small_segments())
        .map(|_| ())
        .unwrap_err()
}

fn assert_corrupt(err: &LogError, name: &str, offset: u64) {
    match err {
        LogError::Corrupt {
            path, offset: at, ..
        } => {
            assert!(path.ends_with(name), "{err}");
            assert_eq!(*at, offset, "{err}");
        }
        other => panic!("expected corruption, got {other}"),
    }
    let text = err.to_string();
    assert!(
        text.contains(name) && text.contains(&format!("offset {offset}")),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_record_in_a_sealed_segment_is_an_error_naming_file_and_offset() {
    let fs = SimFs::new();
    let names = written(&fs).await;
    // The first record of the first segment starts right after the header.
    flip(&fs, &names[0], SEGMENT_HEADER_BYTES + 20);
    assert_corrupt(&open_err(&fs), &names[0], SEGMENT_HEADER_BYTES);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_record_in_the_middle_of_the_last_segment_is_an_error() {
    let fs = SimFs::new();
    let mut store = open_sim(&fs, LogStoreOptions::default());
    for start in (0..20).step_by(5) {
        append(&mut store, entries(1, start..start + 5)).await;
    }
    drop(store);
    let names = segments(&fs, &sim_dir());
    assert_eq!(names.len(), 1);
    flip(&fs, &names[0], SEGMENT_HEADER_BYTES + 20);
    assert_corrupt(&open_err(&fs), &names[0], SEGMENT_HEADER_BYTES);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_torn_tail_of_the_last_segment_is_cut() {
    let fs = SimFs::new();
    let names = written(&fs).await;
    let last = sim_dir().join(names.last().unwrap());
    let bytes = fs.read_file(&last).unwrap();
    let mut store = open_sim(&fs, small_segments());
    let before = indexes(&mut store).await;
    drop(store);
    for cut in [1usize, 5, 17] {
        fs.write_file(&last, &bytes[..bytes.len() - cut]);
        let mut store = open_sim(&fs, small_segments());
        let found = indexes(&mut store).await;
        assert_eq!(found, before[..before.len() - 1], "cut {cut} bytes");
        drop(store);
    }
    // A flipped byte in the last record, with nothing valid after it, is a torn tail too.
    fs.write_file(&last, &bytes);
    flip(&fs, names.last().unwrap(), bytes.len() as u64 - 3);
    let mut store = open_sim(&fs, small_segments());
    assert_eq!(indexes(&mut store).await, before[..before.len() - 1]);
    append(&mut store, entries(1, 59..61)).await;
    drop(store);
    let mut store = open_sim(&fs, small_segments());
    assert_eq!(indexes(&mut store).await, (0..61).collect::<Vec<_>>());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_segment_header_is_an_error() {
    let fs = SimFs::new();
    let names = written(&fs).await;
    flip(&fs, &names[1], 2);
    assert_corrupt(&open_err(&fs), &names[1], 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_segment_is_an_error() {
    let fs = SimFs::new();
    let names = written(&fs).await;
    vfs::Vfs::remove(&fs, &sim_dir().join(&names[1])).unwrap();
    let err = open_err(&fs);
    assert_corrupt(&err, &names[2], 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_vote_file_is_an_error() {
    let fs = SimFs::new();
    written(&fs).await;
    let path = sim_dir().join(VOTE_FILE);
    let mut bytes = fs.read_file(&path).unwrap();
    let at = bytes.len() - 6;
    bytes[at] ^= 1;
    fs.write_file(&path, &bytes);
    let err = open_err(&fs);
    assert!(matches!(err, LogError::Corrupt { .. }), "{err}");
    assert!(err.to_string().contains(VOTE_FILE), "{err}");
}
