//! Recovery forgives exactly one thing: a torn or bad tail of the active
//! segment beyond the published prefix. These tests cut and corrupt real
//! engine files byte by byte (on the in-memory SimFs) and check that:
//! - a truncation at every offset of the last batch, and a flipped byte at
//!   every offset of it, recover to exactly the previous batches;
//! - a bad record below the published prefix, or in a sealed file, is an
//!   error naming the file and offset, never a silent skip;
//! - a bad hint falls back to scanning and is rewritten identically;
//! - leftover temp files and a never-synced new segment are cleaned up;
//! - the zeros the write path fills ahead never outlive a close, a seal or
//!   a recovery (after a kill, a power cut or a failed write), and never
//!   reach a sealed file on disk.

use bitcask::{Batch, Engine, Error, FILL_AHEAD_BYTES, Options, PublishedPrefix, SyncPolicy};
use vfs::sim::{SimFs, Torn};

use crate::common::{open_sim, sim_dir, sim_files, sim_options};

/// Writes five batches; returns (files, active name, length after batch 4,
/// length after batch 5).
fn five_batches() -> (Vec<(String, Vec<u8>)>, String, u64, u64) {
    let fs = SimFs::new();
    let engine = open_sim(&fs, SyncPolicy::Never, 1 << 20);
    let mut len_after_four = 0;
    for i in 1..=5u64 {
        let mut batch = Batch::new().meta(format!("batch {i}")).seq(i * 100);
        batch = batch
            .put(format!("k{i}"), format!("v{i}"))
            .put("shared", format!("shared{i}"));
        if i == 5 {
            batch = batch.delete("k1");
        }
        engine.write_batch(&batch).unwrap();
        if i == 4 {
            len_after_four = engine.active_file().unwrap().len;
        }
    }
    let active = engine.active_file().unwrap();
    engine.close().unwrap();
    (
        sim_files(&fs, &sim_dir()),
        active.name,
        len_after_four,
        active.len,
    )
}

fn disk_with(files: &[(String, Vec<u8>)], edit: impl Fn(&str, &mut Vec<u8>)) -> SimFs {
    let fs = SimFs::new();
    for (name, bytes) in files {
        let mut bytes = bytes.clone();
        edit(name, &mut bytes);
        fs.write_file(&sim_dir().join(name), &bytes);
    }
    fs
}

fn assert_exactly_four_batches(engine: &Engine, active: &str, len_after_four: u64, what: &str) {
    assert_eq!(engine.last_commit_meta().unwrap(), b"batch 4", "{what}");
    assert_eq!(engine.last_seq(), 402, "{what}");
    assert_eq!(
        engine.get(b"k5", 0).unwrap(),
        None,
        "{what}: half of batch 5 survived"
    );
    assert_eq!(
        engine.get(b"k1", 0).unwrap().unwrap().value,
        b"v1",
        "{what}: batch 5's delete leaked"
    );
    assert_eq!(
        engine.get(b"shared", 0).unwrap().unwrap().value,
        b"shared4",
        "{what}"
    );
    assert_eq!(
        engine.get(b"k4", 0).unwrap().unwrap().value,
        b"v4",
        "{what}"
    );
    let now = engine.active_file().unwrap();
    assert_eq!(
        (now.name.as_str(), now.len),
        (active, len_after_four),
        "{what}: not cut back to batch 4"
    );
}

#[test]
fn truncation_at_every_offset_of_the_last_batch_recovers_the_previous_batches() {
    let (files, active, len_after_four, full_len) = five_batches();
    for cut in len_after_four..full_len {
        let fs = disk_with(&files, |name, bytes| {
            if name == active {
                bytes.truncate(cut as usize);
            }
        });
        let engine = open_sim(&fs, SyncPolicy::Never, 1 << 20);
        assert_exactly_four_batches(&engine, &active, len_after_four, &format!("cut at {cut}"));
        let on_disk = fs.read_file(&sim_dir().join(&active)).unwrap().len() as u64;
        assert_eq!(
            on_disk, len_after_four,
            "cut at {cut}: the torn tail was left in the file"
        );
        // The repaired engine keeps working from the cut.
        engine
            .write_batch(&Batch::new().put("k5", "again").seq(500))
            .unwrap();
        assert_eq!(engine.get(b"k5", 0).unwrap().unwrap().value, b"again");
    }
    // Without any damage, all five batches are there.
    let engine = open_sim(&disk_with(&files, |_, _| {}), SyncPolicy::Never, 1 << 20);
    assert_eq!(engine.last_commit_meta().unwrap(), b"batch 5");
}

#[test]
fn a_flipped_byte_anywhere_in_the_last_batch_recovers_the_previous_batches() {
    let (files, active, len_after_four, full_len) = five_batches();
    for at in len_after_four..full_len {
        let fs = disk_with(&files, |name, bytes| {
            if name == active {
                bytes[at as usize] ^= 0x5a;
            }
        });
        let engine = open_sim(&fs, SyncPolicy::Never, 1 << 20);
        assert_exactly_four_batches(&engine, &active, len_after_four, &format!("flip at {at}"));
        let on_disk = fs.read_file(&sim_dir().join(&active)).unwrap().len() as u64;
        assert_eq!(
            on_disk, len_after_four,
            "flip at {at}: the bad tail was left in the file"
        );
    }
}

#[test]
fn a_bad_record_below_the_published_prefix_is_corruption() {
    let (files, active, len_after_four, full_len) = five_batches();
    let published = PublishedPrefix {
        file: active.clone(),
        len: full_len,
    };
    for at in [100u64, len_after_four - 3, full_len - 1] {
        let fs = disk_with(&files, |name, bytes| {
            if name == active {
                bytes[at as usize] ^= 0x01;
            }
        });
        let opts = bitcask::Options {
            published_prefix: Some(published.clone()),
            ..sim_options(&fs, SyncPolicy::Never, 1 << 20)
        };
        match Engine::open(sim_dir(), opts) {
            Err(Error::Corruption { file, offset, .. }) => {
                assert_eq!(file, active);
                assert!(offset <= at, "offset {offset} is past the damage at {at}");
            }
            other => panic!("flip at {at} below the published prefix gave {other:?}"),
        }
    }
    // A truncation below the published prefix is corruption too.
    let fs = disk_with(&files, |name, bytes| {
        if name == active {
            bytes.truncate(len_after_four as usize);
        }
    });
    let opts = bitcask::Options {
        published_prefix: Some(published.clone()),
        ..sim_options(&fs, SyncPolicy::Never, 1 << 20)
    };
    assert!(matches!(
        Engine::open(sim_dir(), opts),
        Err(Error::Corruption { .. })
    ));
    // The same damage beyond a shorter published prefix is just a torn tail.
    let fs = disk_with(&files, |name, bytes| {
        if name == active {
            bytes[full_len as usize - 1] ^= 0x01;
        }
    });
    let shorter = PublishedPrefix {
        file: active.clone(),
        len: len_after_four,
    };
    let opts = bitcask::Options {
        published_prefix: Some(shorter),
        ..sim_options(&fs, SyncPolicy::Never, 1 << 20)
    };
    let engine = Engine::open(sim_dir(), opts).unwrap();
    assert_exactly_four_batches(
        &engine,
        &active,
        len_after_four,
        "beyond the published prefix",
    );
}

/// Flips byte 200 of `file`: inside a record of a [`sealed_segments`] file.
fn flip_byte_200(fs: &SimFs, file: &str) {
    let path = sim_dir().join(file);
    let mut bytes = fs.read_file(&path).unwrap();
    bytes[200] ^= 0xff;
    fs.write_file(&path, &bytes);
}

/// Reads `key00`..`key39` (as [`sealed_segments`] wrote them): every value
/// intact but exactly one, in `victim`, which is corruption.
fn assert_exactly_one_damaged_record(engine: &Engine, victim: &str) {
    let mut errors = 0;
    for i in 0..40u32 {
        match engine.get(format!("key{i:02}").as_bytes(), 0) {
            Ok(Some(item)) => assert_eq!(item.value, vec![i as u8; 100]),
            Ok(None) => panic!("key{i:02} vanished"),
            Err(Error::Corruption { file, .. }) => {
                assert_eq!(file, victim);
                errors += 1;
            }
            Err(e) => panic!("unexpected {e}"),
        }
    }
    assert_eq!(errors, 1, "exactly the damaged record fails its checksum");
}

/// A record read (and so checked) before its bytes went bad is checked
/// again by the next process: what a read remembers lives with its map.
#[test]
fn a_record_checked_by_one_process_is_checked_again_by_the_next() {
    let (fs, sealed) = sealed_segments();
    let victim = &sealed[1];
    let engine = open_sim(&fs, SyncPolicy::Never, 512);
    for i in 0..40u32 {
        let item = engine.get(format!("key{i:02}").as_bytes(), 0).unwrap();
        assert_eq!(item.unwrap().value, vec![i as u8; 100]);
    }
    engine.close().unwrap();
    flip_byte_200(&fs, victim);
    let engine = open_sim(&fs, SyncPolicy::Never, 512);
    assert_exactly_one_damaged_record(&engine, victim);
}

/// ... and so is one whose map left the handle cache: the next read maps
/// the file again and checks the record in full, so damage done meanwhile
/// is caught.
#[test]
fn a_record_checked_through_an_evicted_map_is_checked_again() {
    let (fs, sealed) = sealed_segments();
    let victim = &sealed[1];
    let opts = Options {
        open_files_max: 2,
        ..sim_options(&fs, SyncPolicy::Never, 512)
    };
    let engine = Engine::open(sim_dir(), opts).unwrap();
    for i in 0..40u32 {
        let item = engine.get(format!("key{i:02}").as_bytes(), 0).unwrap();
        assert_eq!(item.unwrap().value, vec![i as u8; 100]);
    }
    flip_byte_200(&fs, victim);
    assert_exactly_one_damaged_record(&engine, victim);
}

/// Writes enough to seal several segments; returns the disk and the sealed names.
fn sealed_segments() -> (SimFs, Vec<String>) {
    let fs = SimFs::new();
    let engine = open_sim(&fs, SyncPolicy::Never, 512);
    for i in 0..40u32 {
        engine
            .put(format!("key{i:02}").as_bytes(), &[i as u8; 100])
            .unwrap();
    }
    let sealed = engine.sealed_data_files();
    assert!(sealed.len() >= 3);
    engine.close().unwrap();
    (fs, sealed)
}

#[test]
fn a_bad_record_in_a_sealed_segment_is_corruption_naming_file_and_offset() {
    let (fs, sealed) = sealed_segments();
    let victim = &sealed[1];
    flip_byte_200(&fs, victim);
    // With its hint the engine opens (it never reads values at restart)...
    let engine = open_sim(&fs, SyncPolicy::Never, 512);
    // ...but reading the damaged record reports it; so does every later read
    // of it, while its neighbours in the same map, checked on their first
    // read and remembered, read back intact without their CRC.
    assert_exactly_one_damaged_record(&engine, victim);
    assert_exactly_one_damaged_record(&engine, victim);
    drop(engine);
    // Without its hint, opening scans the segment and refuses it.
    use vfs::Vfs;
    fs.remove(&sim_dir().join(victim.replace(".data", ".hint")))
        .unwrap();
    match Engine::open(sim_dir(), sim_options(&fs, SyncPolicy::Never, 512)) {
        Err(Error::Corruption {
            file,
            offset,
            reason,
        }) => {
            assert_eq!(&file, victim, "{reason}");
            assert!(offset > 0 && offset <= 200, "offset {offset}");
        }
        other => panic!("a damaged sealed segment opened: {other:?}"),
    }
}

#[test]
fn a_bad_hint_falls_back_to_a_scan_and_is_rewritten_identically() {
    let (fs, sealed) = sealed_segments();
    let hint_path = sim_dir().join(sealed[0].replace(".data", ".hint"));
    let original = fs.read_file(&hint_path).unwrap();
    for at in [0usize, 40, original.len() - 1] {
        let mut bad = original.clone();
        bad[at] ^= 0x10;
        fs.write_file(&hint_path, &bad);
        let engine = open_sim(&fs, SyncPolicy::Never, 512);
        for i in 0..40u32 {
            assert_eq!(
                engine
                    .get(format!("key{i:02}").as_bytes(), 0)
                    .unwrap()
                    .unwrap()
                    .value,
                vec![i as u8; 100]
            );
        }
        drop(engine);
        assert_eq!(
            fs.read_file(&hint_path).unwrap(),
            original,
            "hint rebuilt after a flip at {at}"
        );
    }
}

#[test]
fn leftovers_are_cleaned_up_and_strangers_left_alone() {
    let (fs, _) = sealed_segments();
    let dir = sim_dir();
    fs.write_file(
        &dir.join("seg-00000000000000009999.data.tmp"),
        b"half a file",
    );
    fs.write_file(&dir.join("notes.txt"), b"not ours");
    // A new segment whose header never reached the disk.
    fs.write_file(&dir.join("seg-00000000000000009999.data"), b"RCB");
    let engine = open_sim(&fs, SyncPolicy::Never, 512);
    assert!(
        fs.read_file(&dir.join("seg-00000000000000009999.data.tmp"))
            .is_none()
    );
    assert!(
        fs.read_file(&dir.join("seg-00000000000000009999.data"))
            .is_none()
    );
    assert!(fs.read_file(&dir.join("notes.txt")).is_some());
    assert_eq!(engine.stats().keys, 40);
}

#[test]
fn reopening_after_a_kill_makes_the_recovered_state_durable() {
    // A killed process leaves its writes in the page cache. The engine that
    // reopens the directory must fsync them before building on them, or a
    // later power cut takes back state it already served.
    let fs = SimFs::new();
    let engine = open_sim(&fs, SyncPolicy::Never, 1 << 20);
    for i in 0..10u32 {
        engine.put(format!("k{i}").as_bytes(), b"v").unwrap();
    }
    std::mem::forget(engine); // SIGKILL: no close, no fsync
    let reopened = open_sim(&fs, SyncPolicy::Never, 1 << 20);
    assert_eq!(reopened.stats().keys, 10);
    let after = fs.power_cut(vfs::sim::Torn::Nothing);
    drop(reopened);
    let engine = open_sim(&after, SyncPolicy::Never, 1 << 20);
    assert_eq!(
        engine.stats().keys,
        10,
        "the reopened state was not made durable"
    );
}

/// Length of `name` in the data directory of `fs`.
fn file_len(fs: &SimFs, name: &str) -> u64 {
    fs.read_file(&sim_dir().join(name))
        .expect("the file exists")
        .len() as u64
}

#[test]
fn zeros_filled_ahead_are_cut_by_recovery_and_by_close() {
    let fs = SimFs::new();
    let engine = open_sim(&fs, SyncPolicy::Never, 1 << 20);
    for i in 0..10u32 {
        engine.put(format!("k{i}").as_bytes(), b"v").unwrap();
    }
    let active = engine.active_file().expect("an active segment");
    assert_eq!(
        file_len(&fs, &active.name),
        FILL_AHEAD_BYTES,
        "the write path fills the file to the block boundary"
    );
    std::mem::forget(engine); // SIGKILL: the zeros stay
    let reopened = open_sim(&fs, SyncPolicy::Never, 1 << 20);
    assert_eq!(reopened.stats().keys, 10);
    assert_eq!(
        reopened.active_file().expect("still active"),
        active,
        "recovery kept every batch and nothing else"
    );
    assert_eq!(
        file_len(&fs, &active.name),
        active.len,
        "recovery cut the zeros"
    );
    reopened.put(b"k10", b"v").unwrap();
    let before_close = reopened.active_file().expect("an active segment");
    assert!(file_len(&fs, &active.name) > before_close.len);
    reopened.close().unwrap();
    assert_eq!(
        file_len(&fs, &active.name),
        before_close.len,
        "a closed engine leaves no zeros behind"
    );
    let engine = open_sim(&fs, SyncPolicy::Never, 1 << 20);
    assert_eq!(engine.stats().keys, 11);
    assert_eq!(engine.active_file().expect("active"), before_close);
}

#[test]
fn the_file_is_the_data_rounded_up_to_a_block_whatever_the_batch_size() {
    let fs = SimFs::new();
    let engine = open_sim(&fs, SyncPolicy::Never, 4 << 20);
    let big = vec![7u8; 3 * FILL_AHEAD_BYTES as usize];
    for (key, value) in [(&b"small"[..], &b"v"[..]), (b"big", &big), (b"after", b"v")] {
        engine.put(key, value).unwrap();
        let active = engine.active_file().expect("an active segment");
        assert_eq!(
            file_len(&fs, &active.name),
            active.len.next_multiple_of(FILL_AHEAD_BYTES),
            "after {}",
            String::from_utf8_lossy(key)
        );
    }
    let active = engine.active_file().expect("an active segment");
    std::mem::forget(engine);
    let engine = open_sim(&fs, SyncPolicy::Never, 4 << 20);
    assert_eq!(engine.get(b"big", 0).unwrap().unwrap().value, big);
    assert_eq!(engine.get(b"after", 0).unwrap().unwrap().value, b"v");
    assert_eq!(engine.active_file().expect("active"), active);
}

#[test]
fn a_sealed_segment_is_durable_without_the_zeros() {
    let fs = SimFs::new();
    let engine = open_sim(&fs, SyncPolicy::Always, 4096);
    let mut n = 0u32;
    while engine.sealed_data_files().is_empty() {
        engine.put(format!("k{n}").as_bytes(), &[1u8; 300]).unwrap();
        n += 1;
    }
    let sealed = engine.sealed_files();
    // Fails if a seal fsyncs before it cuts the zeros.
    let after = fs.power_cut(Torn::Nothing);
    drop(engine);
    for file in &sealed {
        let bytes = after
            .read_file(&sim_dir().join(&file.name))
            .expect("durable");
        assert_eq!(
            (bytes.len() as u64, crc32fast::hash(&bytes)),
            (file.len, file.crc),
            "{}",
            file.name
        );
    }
    assert_eq!(
        open_sim(&after, SyncPolicy::Always, 4096).stats().keys,
        u64::from(n)
    );
}

#[test]
fn a_failed_fill_poisons_and_reopening_cuts_what_was_written() {
    let fs = SimFs::new();
    let engine = open_sim(&fs, SyncPolicy::Never, 1 << 20);
    engine.put(b"a", b"1").unwrap();
    let before = engine.active_file().expect("an active segment");
    fs.fail_writes_after(Some(0)); // the zeros of the next block fail
    let err = engine
        .put(b"big", &vec![9u8; FILL_AHEAD_BYTES as usize])
        .unwrap_err();
    assert!(matches!(err, Error::Io { .. }), "{err}");
    assert!(matches!(
        engine.put(b"c", b"3"),
        Err(Error::Poisoned { .. })
    ));
    assert_eq!(engine.active_file().unwrap(), before);
    drop(engine); // poisoned: whatever was written stays
    fs.fail_writes_after(None);
    let engine = open_sim(&fs, SyncPolicy::Never, 1 << 20);
    assert_eq!(engine.active_file().unwrap(), before);
    assert_eq!(file_len(&fs, &before.name), before.len);
    assert_eq!(engine.get(b"a", 0).unwrap().unwrap().value, b"1");
    assert_eq!(engine.get(b"big", 0).unwrap(), None);
}

#[test]
fn durable_zeros_past_a_published_prefix_are_cut_after_a_power_cut() {
    let fs = SimFs::new();
    let engine = open_sim(&fs, SyncPolicy::Never, 1 << 20);
    engine.put(b"a", b"1").unwrap();
    engine.sync().unwrap();
    let synced = engine.active_file().expect("an active segment");
    engine.put(b"b", b"2").unwrap();
    let after = fs.power_cut(Torn::Prefix(11));
    drop(engine);
    assert_eq!(file_len(&after, &synced.name), FILL_AHEAD_BYTES);
    let opts = Options {
        published_prefix: Some(PublishedPrefix {
            file: synced.name.clone(),
            len: synced.len,
        }),
        ..sim_options(&after, SyncPolicy::Never, 1 << 20)
    };
    let engine = Engine::open(sim_dir(), opts).unwrap();
    assert_eq!(engine.get(b"a", 0).unwrap().unwrap().value, b"1");
    let active = engine.active_file().expect("an active segment");
    assert_eq!(
        file_len(&after, &active.name),
        active.len,
        "recovery cut the zeros"
    );
}
