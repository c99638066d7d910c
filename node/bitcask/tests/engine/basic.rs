//! The API on real files: reads, writes, batches, scans, expiry, limits,
//! rotation, the file listing the Raft layer uses, pins, stats, and group
//! commit. Each test states the behaviour it pins down.

use std::ops::Bound;
use std::sync::Arc;
use std::time::Duration;

use bitcask::{Batch, Counted, Engine, Error, KeyRange, Options, Scan, SyncPolicy};
use vfs::sim::SimFs;

use crate::common::{open_sim, value_for};

fn open_real(dir: &std::path::Path, segment_size_bytes: u64) -> Engine {
    let opts = Options {
        segment_size_bytes,
        sync: SyncPolicy::Never,
        auto_merge: None,
        ..Options::default()
    };
    Engine::open(dir, opts).expect("open")
}

#[test]
fn put_get_delete_survive_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open_real(dir.path(), 1 << 20);
    let seq1 = engine.put(b"a", b"1").unwrap();
    let seq2 = engine.put(b"b", b"2").unwrap();
    assert!(seq2 > seq1, "sequence numbers increase");
    assert_eq!(engine.get(b"a", 0).unwrap().unwrap().value, b"1");
    assert_eq!(engine.get(b"a", 0).unwrap().unwrap().seq, seq1);
    engine.delete(b"a").unwrap();
    assert_eq!(engine.get(b"a", 0).unwrap(), None);
    assert_eq!(engine.get(b"missing", 0).unwrap(), None);
    let last = engine.last_seq();
    engine.close().unwrap();

    let engine = open_real(dir.path(), 1 << 20);
    assert_eq!(engine.get(b"a", 0).unwrap(), None);
    assert_eq!(engine.get(b"b", 0).unwrap().unwrap().value, b"2");
    assert_eq!(engine.last_seq(), last);
    let next = engine.put(b"c", b"3").unwrap();
    assert_eq!(
        next,
        last + 1,
        "engine-assigned sequences continue after a restart"
    );
}

#[test]
fn batches_take_caller_sequences_and_report_metadata() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open_real(dir.path(), 1 << 20);
    let written = engine
        .write_batch(
            &Batch::new()
                .put("x", "1")
                .delete("y")
                .put("z", "3")
                .meta("entry 7")
                .seq(7 << 16),
        )
        .unwrap();
    assert_eq!(written.first_seq, 7 << 16);
    assert_eq!(written.commit_seq, (7 << 16) + 3);
    assert_eq!(
        engine.get(b"z", 0).unwrap().unwrap().seq,
        (7 << 16) + 2,
        "op i gets seq + i"
    );
    let stale = engine.write_batch(&Batch::new().put("x", "2").seq(7 << 16));
    assert!(
        matches!(stale, Err(Error::SequenceNotIncreasing { .. })),
        "{stale:?}"
    );
    // An empty batch (a Raft blank entry) still commits its metadata.
    engine
        .write_batch(&Batch::new().meta("blank 8").seq(8 << 16))
        .unwrap();
    assert_eq!(engine.last_seq(), 8 << 16);
    engine.close().unwrap();
    let engine = open_real(dir.path(), 1 << 20);
    assert_eq!(engine.last_commit_meta().unwrap(), b"blank 8");
    assert_eq!(engine.last_seq(), 8 << 16);
}

#[test]
fn limits_are_checked_and_named() {
    let dir = tempfile::tempdir().unwrap();
    let opts = Options {
        sync: SyncPolicy::Never,
        key_size_bytes_max: 8,
        value_size_bytes_max: 16,
        batch_size_bytes_max: 200,
        auto_merge: None,
        ..Options::default()
    };
    let engine = Engine::open(dir.path(), opts).unwrap();
    let err = engine.put(b"123456789", b"v").unwrap_err();
    assert!(matches!(err, Error::KeyTooLarge { len: 9, max: 8 }));
    assert!(err.to_string().contains("key_size_bytes_max"), "{err}");
    let err = engine.put(b"k", &[0u8; 17]).unwrap_err();
    assert!(err.to_string().contains("value_size_bytes_max"), "{err}");
    assert!(matches!(engine.put(b"", b"v"), Err(Error::KeyEmpty)));
    let big = (0..10).fold(Batch::new(), |b, i| b.put(format!("k{i}"), vec![0u8; 16]));
    let err = engine.write_batch(&big).unwrap_err();
    assert!(err.to_string().contains("batch_size_bytes_max"), "{err}");
    let err = engine
        .write_batch(&Batch::new().meta(vec![0u8; bitcask::METADATA_SIZE_BYTES_MAX + 1]))
        .unwrap_err();
    assert!(matches!(err, Error::MetadataTooLarge { .. }));
    // Nothing rejected was written.
    assert_eq!(engine.stats().keys, 0);
    assert_eq!(engine.last_seq(), 0);
    let bad = Engine::open(
        dir.path().join("x"),
        Options {
            segment_size_bytes: 1,
            ..Options::default()
        },
    );
    assert!(matches!(
        bad,
        Err(Error::InvalidOption {
            name: "segment_size_bytes",
            ..
        })
    ));
}

#[test]
fn expiry_is_judged_against_the_callers_clock() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open_real(dir.path(), 1 << 20);
    engine.put_with_expiry(b"session", b"s", 1_000).unwrap();
    engine.put(b"forever", b"f").unwrap();
    assert_eq!(
        engine.get(b"session", 999).unwrap().unwrap().expiry_ms,
        1_000
    );
    assert_eq!(engine.get(b"session", 1_000).unwrap(), None);
    let keys: Vec<Vec<u8>> = engine
        .scan(&Scan::all(10), 5_000)
        .unwrap()
        .into_iter()
        .map(|e| e.key)
        .collect();
    assert_eq!(keys, vec![b"forever".to_vec()]);
    assert_eq!(engine.scan(&Scan::all(10), 0).unwrap().len(), 2);
}

/// A scan of the keys between two bounds.
fn between(start: Bound<&str>, end: Bound<&str>, limit: usize, keys_only: bool) -> Scan {
    Scan {
        range: KeyRange::Range(
            start.map(|k| k.as_bytes().to_vec()),
            end.map(|k| k.as_bytes().to_vec()),
        ),
        after: None,
        limit,
        keys_only,
    }
}

#[test]
fn a_counted_scan_counts_the_whole_range_in_the_same_pass() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open_real(dir.path(), 4096);
    for i in 0..40u32 {
        engine.put(format!("k{i:03}").as_bytes(), b"v").unwrap();
    }
    engine.put(b"other", b"o").unwrap();
    let counted = |keys, walked| Some(Counted { keys, walked });
    let resumed = Scan {
        after: Some(b"k009".to_vec()),
        ..Scan::prefix("k", 0)
    };
    // No key carries an expiry: the count comes from the order, whatever
    // the bound on a walk.
    let (page, count) = engine.scan_counted(&Scan::prefix("k", 3), 0, 1).unwrap();
    assert_eq!(page.len(), 3);
    assert_eq!(count, counted(40, false));
    assert_eq!(
        engine.scan_counted(&resumed, 5_000, 0).unwrap(),
        (Vec::new(), counted(30, false))
    );
    let ten = between(Bound::Included("k010"), Bound::Included("k019"), 0, false);
    assert_eq!(
        engine.scan_counted(&ten, 0, 0).unwrap().1,
        counted(10, false)
    );
    let (page, count) = engine.scan_counted(&Scan::all(100), 0, 5).unwrap();
    assert_eq!((page.len(), count), (41, counted(41, false)));
    // A key with an expiry: counted from the order while the caller's
    // clock is 0 (nothing expires), walked otherwise, expired keys left out.
    engine.put_with_expiry(b"k100", b"v", 1_000).unwrap();
    let (page, count) = engine.scan_counted(&Scan::prefix("k", 3), 0, 1).unwrap();
    assert_eq!((page.len(), count), (3, counted(41, false)));
    assert_eq!(
        engine
            .scan_counted(&Scan::prefix("k", 3), 999, 100)
            .unwrap()
            .1,
        counted(41, true)
    );
    assert_eq!(
        engine
            .scan_counted(&Scan::prefix("k", 3), 1_000, 100)
            .unwrap()
            .1,
        counted(40, true)
    );
    // A walk stops past its bound: at the bound exactly, and one past it.
    assert_eq!(
        engine.scan_counted(&resumed, 1_000, 30).unwrap().1,
        counted(30, true)
    );
    assert_eq!(engine.scan_counted(&resumed, 1_000, 29).unwrap().1, None);
    let inverted = between(Bound::Included("z"), Bound::Included("a"), 10, true);
    assert_eq!(
        engine.scan_counted(&inverted, 1_000, 10).unwrap(),
        (Vec::new(), counted(0, false))
    );
    // Once no key carries an expiry (the one that did is overwritten
    // without, then another is deleted), counts come from the order again.
    engine.put_with_expiry(b"k101", b"v", 2_000).unwrap();
    engine.put(b"k100", b"v").unwrap();
    assert_eq!(
        engine
            .scan_counted(&Scan::prefix("k", 3), 999, 100)
            .unwrap()
            .1,
        counted(42, true)
    );
    engine.delete(b"k101").unwrap();
    assert_eq!(
        engine
            .scan_counted(&Scan::prefix("k", 3), 999, 0)
            .unwrap()
            .1,
        counted(41, false)
    );
}

#[test]
fn scans_by_prefix_range_resume_and_keys_only() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open_real(dir.path(), 4096);
    for i in 0..50u32 {
        engine
            .put(
                format!("k{i:03}").as_bytes(),
                &value_for(format!("k{i:03}").as_bytes(), 1, 100),
            )
            .unwrap();
    }
    engine.put(b"other", b"o").unwrap();
    engine.put(&[0xff, 0xff], b"max").unwrap();
    let page1 = engine.scan(&Scan::prefix("k", 20), 0).unwrap();
    assert_eq!(page1.len(), 20);
    assert_eq!(page1[0].key, b"k000");
    let page2 = engine
        .scan(
            &Scan {
                after: Some(page1[19].key.clone()),
                ..Scan::prefix("k", 100)
            },
            0,
        )
        .unwrap();
    assert_eq!(page2.len(), 30);
    assert_eq!(page2[0].key, b"k020");
    assert!(
        page2
            .iter()
            .all(|e| e.value.as_ref().unwrap().starts_with(&e.key))
    );
    let range = between(Bound::Included("k010"), Bound::Excluded("k013"), 100, true);
    let found = engine.scan(&range, 0).unwrap();
    assert_eq!(
        found.iter().map(|e| e.key.clone()).collect::<Vec<_>>(),
        vec![b"k010".to_vec(), b"k011".to_vec(), b"k012".to_vec()]
    );
    assert!(found.iter().all(|e| e.value.is_none()));
    let inverted = between(Bound::Included("z"), Bound::Included("a"), 10, false);
    assert!(engine.scan(&inverted, 0).unwrap().is_empty());
    assert_eq!(
        engine.scan(&Scan::prefix(vec![0xff], 10), 0).unwrap().len(),
        1
    );
}

#[test]
fn rotation_seals_segments_with_hints_and_lists_checksummed_files() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open_real(dir.path(), 2048);
    for i in 0..40u32 {
        engine
            .put(format!("key{i}").as_bytes(), &[i as u8; 300])
            .unwrap();
    }
    let sealed = engine.sealed_files();
    assert!(
        sealed.iter().filter(|f| f.name.ends_with(".data")).count() >= 4,
        "{sealed:?}"
    );
    assert_eq!(
        sealed.iter().filter(|f| f.name.ends_with(".hint")).count(),
        sealed.iter().filter(|f| f.name.ends_with(".data")).count(),
        "every sealed segment has a hint"
    );
    for file in &sealed {
        let bytes = std::fs::read(dir.path().join(&file.name)).unwrap();
        assert_eq!(bytes.len() as u64, file.len, "{}", file.name);
        assert_eq!(crc32fast::hash(&bytes), file.crc, "{}", file.name);
    }
    let active = engine
        .active_file()
        .expect("the last put left an active segment");
    let bytes = crate::common::active_prefix(
        std::fs::read(dir.path().join(&active.name)).unwrap(),
        active.len,
        &active.name,
    );
    assert_eq!(crc32fast::hash(&bytes), active.crc);
    assert_eq!(
        engine.checksum_prefix(&active.name, 100).unwrap(),
        crc32fast::hash(&bytes[..100])
    );
    assert!(matches!(
        engine.checksum_prefix("nope.data", 1),
        Err(Error::UnknownFile(_))
    ));
    // Files sealed at 2 KiB: each one ends at the first batch boundary past it.
    let stats = engine.stats();
    for file in stats.files.iter().filter(|f| f.sealed) {
        assert!(
            file.total_bytes >= 2048 && file.total_bytes < 2048 + 400,
            "{file:?}"
        );
    }
}

#[test]
fn stats_count_live_and_dead_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open_real(dir.path(), 1 << 20);
    engine.put(b"a", &[1; 100]).unwrap();
    let before = engine.stats();
    assert_eq!(before.keys, 1);
    assert_eq!(before.live_bytes, 27 + 1 + 100);
    engine.put(b"a", &[2; 100]).unwrap();
    engine.delete(b"zz").unwrap();
    let after = engine.stats();
    assert_eq!(after.keys, 1);
    assert_eq!(after.live_bytes, 27 + 1 + 100);
    assert!(
        after.dead_bytes >= before.dead_bytes + 27 + 1 + 100,
        "{before:?} {after:?}"
    );
    assert_eq!(
        after.live_bytes + after.dead_bytes,
        after.files.iter().map(|f| f.total_bytes).sum::<u64>()
    );
}

#[test]
fn pinned_files_outlive_a_merge_until_unpinned() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open_real(dir.path(), 1024);
    for round in 0..3u8 {
        for i in 0..10u32 {
            engine
                .put(format!("k{i}").as_bytes(), &[round; 200])
                .unwrap();
        }
    }
    let names: Vec<String> = engine.sealed_files().into_iter().map(|f| f.name).collect();
    let pin = engine.pin(&names).unwrap();
    assert!(engine.pin(&["not-a-file.data".to_string()]).is_err());
    engine.merge(&engine.sealed_data_files(), 0).unwrap();
    for name in &names {
        assert!(dir.path().join(name).exists(), "pinned {name} was deleted");
    }
    drop(pin);
    for name in &names {
        assert!(
            !dir.path().join(name).exists(),
            "unpinned merged {name} was kept"
        );
    }
    for i in 0..10u32 {
        assert_eq!(
            engine
                .get(format!("k{i}").as_bytes(), 0)
                .unwrap()
                .unwrap()
                .value,
            vec![2u8; 200]
        );
    }
}

#[test]
fn concurrent_writers_share_fsyncs() {
    // A slow disk (2 ms per fsync) and 8 writers with sync=always: each
    // write is acknowledged only after an fsync, and the writers must share
    // fsyncs, so there are far fewer fsyncs than writes.
    let fs = SimFs::new();
    fs.set_sync_delay(Duration::from_millis(2));
    let engine = Arc::new(open_sim(&fs, SyncPolicy::Always, 1 << 20));
    let syncs_before = fs.sync_count();
    const WRITERS: u32 = 8;
    const WRITES_PER_WRITER: u32 = 40;
    std::thread::scope(|scope| {
        for w in 0..WRITERS {
            let engine = engine.clone();
            scope.spawn(move || {
                for i in 0..WRITES_PER_WRITER {
                    engine.put(format!("w{w}-{i}").as_bytes(), b"v").unwrap();
                }
            });
        }
    });
    let syncs = fs.sync_count() - syncs_before;
    let writes = (WRITERS * WRITES_PER_WRITER) as u64;
    assert!(
        syncs < writes / 2,
        "{syncs} fsyncs for {writes} writes: no group commit"
    );
    // Every acknowledged write is durable (cut the power before the engine
    // is dropped: closing would fsync and hide a missing fsync).
    let after = fs.power_cut(vfs::sim::Torn::Nothing);
    drop(engine);
    let engine = open_sim(&after, SyncPolicy::Always, 1 << 20);
    assert_eq!(engine.stats().keys, writes);
}

#[test]
fn reads_work_with_fewer_open_files_than_segments() {
    // "Too many open files" is a classic Bitcask complaint: the engine keeps
    // at most `open_files_max` files open and reopens on demand.
    let dir = tempfile::tempdir().unwrap();
    let opts = Options {
        segment_size_bytes: 512,
        sync: SyncPolicy::Never,
        open_files_max: 2,
        auto_merge: None,
        ..Options::default()
    };
    let engine = Engine::open(dir.path(), opts).unwrap();
    for i in 0..100u32 {
        let key = format!("k{i:03}").into_bytes();
        engine.put(&key, &value_for(&key, 1, 200)).unwrap();
    }
    assert!(engine.sealed_data_files().len() > 20);
    for round in 0..3 {
        for i in (0..100u32).rev() {
            let key = format!("k{i:03}").into_bytes();
            let item = engine
                .get(&key, 0)
                .unwrap()
                .unwrap_or_else(|| panic!("round {round}: k{i:03} missing"));
            assert_eq!(item.value, value_for(&key, 1, 200));
        }
    }
}

#[test]
fn one_engine_per_directory() {
    let dir = tempfile::tempdir().unwrap();
    let first = open_real(dir.path(), 1 << 20);
    let second = Engine::open(dir.path(), Options::default());
    match second {
        Err(err @ Error::DirectoryInUse { .. }) => {
            assert!(err.to_string().contains("in use"), "{err}")
        }
        other => panic!("a second engine opened the same directory: {other:?}"),
    }
    drop(first);
    open_real(dir.path(), 1 << 20);
}
