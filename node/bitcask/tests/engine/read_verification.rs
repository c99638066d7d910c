//! What every read verifies: the bytes a read returns are the bytes it
//! checked against the record's CRC. Sealed files are read through a shared
//! memory map, so a byte changed in the file (here with `pwrite` on a second
//! descriptor, as another process or a page read back from a bad disk
//! would) is visible to the map at once, also after the file was read and
//! checked before. These tests change one byte of a record at a time, in
//! its value, key and header, in a sealed file and in the active one, after
//! a first good read, and check that `get`, `scan` and `merge` fail with
//! `Corruption` instead of handing the byte on; restoring the byte makes the
//! read succeed again (the check runs on each read, it is not a remembered
//! failure).

use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::path::Path;

use bitcask::{Engine, Error, Options, Scan, SyncPolicy};

use crate::common::value_for;

const VALUE_LEN: usize = 300;
const KEYS: usize = 40;
/// Record layout (FORMAT.md): crc 4, kind 1, key length 2, value length 4,
/// sequence 8, expiry 8, then key and value.
const RECORD_HEADER_SIZE_BYTES: usize = 27;

fn key(i: usize) -> Vec<u8> {
    format!("key-{i:03}").into_bytes()
}

fn open(dir: &Path, segment_size_bytes: u64) -> Engine {
    Engine::open(
        dir,
        Options {
            sync: SyncPolicy::Never,
            segment_size_bytes,
            auto_merge: None,
            ..Options::default()
        },
    )
    .unwrap()
}

fn fill(engine: &Engine) {
    for i in 0..KEYS {
        engine
            .put(&key(i), &value_for(&key(i), 1, VALUE_LEN))
            .unwrap();
    }
}

/// The data file holding `key`'s record, and the record's offset in it.
fn find_record(dir: &Path, key: &[u8], names: &[String]) -> (std::path::PathBuf, usize) {
    for name in names {
        let path = dir.join(name);
        let bytes = std::fs::read(&path).unwrap();
        if let Some(at) = bytes.windows(key.len()).position(|w| w == key) {
            return (path, at - RECORD_HEADER_SIZE_BYTES);
        }
    }
    panic!("no record of {key:?}");
}

fn flip(path: &Path, offset: usize) {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let mut byte = [0u8];
    file.read_exact_at(&mut byte, offset as u64).unwrap();
    byte[0] ^= 0x20;
    file.write_all_at(&byte, offset as u64).unwrap();
}

/// Offsets inside a record (of `key_len`, `VALUE_LEN`) to damage, by name.
fn damage_points(key_len: usize) -> Vec<(&'static str, usize)> {
    let value_at = RECORD_HEADER_SIZE_BYTES + key_len;
    vec![
        ("value, first byte", value_at),
        ("value, middle byte", value_at + VALUE_LEN / 2),
        ("value, last byte", value_at + VALUE_LEN - 1),
        ("key byte", RECORD_HEADER_SIZE_BYTES + 1),
        ("stored crc", 1),
        ("kind", 4),
        ("value length", 8),
        ("sequence", 12),
        ("expiry", 20),
    ]
}

/// Reads `key` well, then for each damage point: damages the file, checks
/// that get and scan report corruption, repairs it, checks the read is good.
fn check_every_damage_is_caught(engine: &Engine, dir: &Path, names: &[String], index: usize) {
    let k = key(index);
    let expected = value_for(&k, 1, VALUE_LEN);
    let (path, record) = find_record(dir, &k, names);
    assert_eq!(engine.get(&k, 0).unwrap().unwrap().value, expected);
    for (what, at) in damage_points(k.len()) {
        flip(&path, record + at);
        match engine.get(&k, 0) {
            Err(Error::Corruption { file, offset, .. }) => {
                assert_eq!(file, path.file_name().unwrap().to_str().unwrap(), "{what}");
                assert_eq!(offset, record as u64, "{what}");
            }
            other => panic!("{what}: a damaged record was read as {other:?}"),
        }
        let scan = engine.scan(&Scan::prefix(k.clone(), 1), 0);
        assert!(
            matches!(scan, Err(Error::Corruption { .. })),
            "{what}: scan gave {scan:?}"
        );
        flip(&path, record + at);
        assert_eq!(
            engine.get(&k, 0).unwrap().unwrap().value,
            expected,
            "{what}: the repaired record reads again"
        );
    }
}

#[test]
fn a_changed_byte_in_a_sealed_file_is_caught_on_every_read() {
    let dir = tempfile::tempdir().unwrap();
    // 4 KiB segments: about ten records each, so most keys are sealed.
    let engine = open(dir.path(), 4096);
    fill(&engine);
    let sealed = engine.sealed_data_files();
    assert!(sealed.len() >= 3, "{sealed:?}");
    // A key in the first sealed file, one in the middle, one in the last.
    for index in [0, KEYS / 2, 3 * KEYS / 4] {
        let (path, _) = find_record(dir.path(), &key(index), &sealed);
        let name = path.file_name().unwrap().to_str().unwrap().to_string();
        assert!(sealed.contains(&name), "{index} is in a sealed file");
        check_every_damage_is_caught(&engine, dir.path(), &sealed, index);
    }
}

#[test]
fn a_changed_byte_in_the_active_file_is_caught_on_every_read() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(dir.path(), 1 << 20);
    fill(&engine);
    assert!(engine.sealed_data_files().is_empty());
    let active = vec![engine.active_file().unwrap().name];
    for index in [0, KEYS - 1] {
        check_every_damage_is_caught(&engine, dir.path(), &active, index);
    }
}

#[test]
fn a_merge_does_not_copy_a_changed_record() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(dir.path(), 4096);
    fill(&engine);
    let sealed = engine.sealed_data_files();
    let k = key(5);
    assert!(engine.get(&k, 0).unwrap().is_some());
    let (path, record) = find_record(dir.path(), &k, &sealed);
    flip(&path, record + RECORD_HEADER_SIZE_BYTES + k.len() + 7);
    match engine.merge(&sealed, 0) {
        Err(Error::Corruption { file, offset, .. }) => {
            assert_eq!(file, path.file_name().unwrap().to_str().unwrap());
            assert_eq!(offset, record as u64);
        }
        other => panic!("a merge copied a damaged record: {other:?}"),
    }
    // The inputs are still the engine's files, and every other key reads.
    assert_eq!(engine.sealed_data_files(), sealed);
    for i in (0..KEYS).filter(|&i| i != 5) {
        assert_eq!(
            engine.get(&key(i), 0).unwrap().unwrap().value,
            value_for(&key(i), 1, VALUE_LEN)
        );
    }
}
