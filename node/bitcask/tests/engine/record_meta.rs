//! Record metas: the opaque bytes (at most `RECORD_META_BYTES_MAX`) a put or
//! a tombstone carries, stored in record kinds 4 and 5 and hint kinds 4 and
//! 5, kept inline in the key directory.
//!
//! What this proves, and how (all on the in-memory `SimFs`, tiny segments so
//! most records end up in sealed files with hints):
//! - a meta written with a put comes back from `get`, from the
//!   directory-only `meta` and from scans (keys-only too), live, after a
//!   reopen (hints), after a reopen with every hint deleted (scans, which
//!   rewrite the hints byte for byte), after a merge and after reopening the
//!   merge output; tombstone metas are in the hints (kind 5), before and
//!   after the rewrite;
//! - an empty meta writes exactly what the build before metas wrote: the
//!   seed corpus checked in by that build is rebuilt byte for byte;
//! - an over-long meta is refused with an error naming the meta and
//!   `RECORD_META_BYTES_MAX`, and nothing is written;
//! - a flipped byte in the meta of a kind-4 record is caught by the record
//!   checksum before it reaches a caller (a read errs naming file and
//!   offset; a scan at open refuses the sealed file; in the active tail it
//!   is cut off like any torn write), and a meta length beyond the limit is
//!   corruption naming file and offset;
//! - a hint entry whose meta length is out of range (with a correct hint
//!   checksum, so only the entry check can catch it) makes the engine ignore
//!   the hint and scan the data file instead, rewriting the hint.

use std::collections::BTreeMap;

use bitcask::{
    Batch, Engine, Error, ItemMeta, RECORD_META_BYTES_MAX, RecordMeta, Scan, SyncPolicy, format,
};
use vfs::Vfs;
use vfs::sim::SimFs;

use crate::common::{open_sim, sim_dir, sim_files, sim_options};

/// Small segments: a few batches each, so most records are sealed.
const SEGMENT_SIZE_BYTES: u64 = 256;

/// What a live key should hold.
type Expected = BTreeMap<Vec<u8>, (Vec<u8>, RecordMeta)>;

fn meta(bytes: &[u8]) -> RecordMeta {
    RecordMeta::new(bytes).expect("meta within the limit")
}

/// The meta of key `i`: `i % 7` bytes (so some keys have none), and the
/// longest allowed for key 19.
fn meta_of(i: u8) -> RecordMeta {
    let len = if i == 19 {
        RECORD_META_BYTES_MAX
    } else {
        usize::from(i % 7)
    };
    let bytes: Vec<u8> = (0..len)
        .map(|j| i.wrapping_mul(31).wrapping_add(j as u8))
        .collect();
    meta(&bytes)
}

/// Puts 20 keys (one a batch), deletes two with tombstone metas, overwrites
/// one with a new meta, and puts a few more so the deletes get sealed.
/// Returns the live keys and the tombstone metas written.
fn write_history(engine: &Engine) -> (Expected, Vec<(Vec<u8>, RecordMeta)>) {
    let mut expected = Expected::new();
    for i in 0..20u8 {
        let key = format!("key/{i:02}").into_bytes();
        let value = format!("value {i}").into_bytes();
        engine
            .write_batch(&Batch::new().put_with_meta(key.clone(), value.clone(), 0, meta_of(i)))
            .unwrap();
        expected.insert(key, (value, meta_of(i)));
    }
    let tombstones = vec![
        (b"key/05".to_vec(), meta(b"\x05\x01deleted")),
        (b"key/07".to_vec(), meta(&[0xff; RECORD_META_BYTES_MAX])),
    ];
    let mut batch = Batch::new();
    for (key, meta) in &tombstones {
        batch = batch.delete_with_meta(key.clone(), *meta);
        expected.remove(key);
    }
    batch = batch.put_with_meta(
        "key/01",
        "rewritten",
        0,
        meta(b"\x01\x02\x03\x04\x05\x06\x07\x08"),
    );
    expected.insert(
        b"key/01".to_vec(),
        (
            b"rewritten".to_vec(),
            meta(b"\x01\x02\x03\x04\x05\x06\x07\x08"),
        ),
    );
    engine.write_batch(&batch).unwrap();
    for i in 0..6u8 {
        let key = format!("pad/{i}").into_bytes();
        engine
            .write_batch(&Batch::new().put(key.clone(), "p"))
            .unwrap();
        expected.insert(key, (b"p".to_vec(), RecordMeta::EMPTY));
    }
    (expected, tombstones)
}

/// Every read path returns the expected values and metas.
fn check(engine: &Engine, expected: &Expected, when: &str) {
    for (key, (value, meta)) in expected {
        let item = engine
            .get(key, 0)
            .unwrap()
            .unwrap_or_else(|| panic!("{key:?} missing {when}"));
        assert_eq!(
            (&item.value, item.meta),
            (value, *meta),
            "get {key:?} {when}"
        );
        let found = engine.meta(key, 0).unwrap();
        assert_eq!(
            found,
            ItemMeta {
                seq: item.seq,
                expiry_ms: 0,
                value_len: value.len() as u32,
                meta: *meta,
            },
            "meta {key:?} {when}"
        );
    }
    for key in [b"key/05".as_slice(), b"key/07"] {
        assert_eq!(engine.get(key, 0).unwrap(), None, "deleted {key:?} {when}");
        assert_eq!(engine.meta(key, 0), None, "deleted {key:?} {when}");
    }
    let want: Vec<(Vec<u8>, Option<Vec<u8>>, RecordMeta)> = expected
        .iter()
        .map(|(k, (v, m))| (k.clone(), Some(v.clone()), *m))
        .collect();
    let got: Vec<_> = engine
        .scan(&Scan::all(usize::MAX), 0)
        .unwrap()
        .into_iter()
        .map(|e| (e.key, e.value, e.meta))
        .collect();
    assert_eq!(got, want, "scan {when}");
    let keys_only = Scan {
        keys_only: true,
        ..Scan::all(usize::MAX)
    };
    let got: Vec<_> = engine
        .scan(&keys_only, 0)
        .unwrap()
        .into_iter()
        .map(|e| (e.key, e.value, e.meta))
        .collect();
    let want: Vec<_> = want.into_iter().map(|(k, _, m)| (k, None, m)).collect();
    assert_eq!(got, want, "keys-only scan {when}");
}

/// Each entry of a hint file: (kind byte, key, meta).
fn hint_entries(bytes: &[u8]) -> Vec<(u8, Vec<u8>, Vec<u8>)> {
    let mut rest =
        &bytes[format::FILE_HEADER_SIZE_BYTES..bytes.len() - format::HINT_TRAILER_SIZE_BYTES];
    let mut out = Vec::new();
    while !rest.is_empty() {
        let (entry, size) = format::decode_hint_entry(rest).expect("hint entry decodes");
        out.push((
            rest[format::HINT_KIND_OFFSET],
            entry.key.to_vec(),
            entry.meta.to_vec(),
        ));
        rest = &rest[size..];
    }
    out
}

/// The sealed hints of `fs`, by name.
fn hints(fs: &SimFs) -> Vec<(String, Vec<u8>)> {
    sim_files(fs, &sim_dir())
        .into_iter()
        .filter(|(name, _)| name.ends_with(".hint"))
        .collect()
}

fn remove_hints(fs: &SimFs) {
    for (name, _) in hints(fs) {
        fs.remove(&sim_dir().join(name)).unwrap();
    }
}

/// The tombstone entries (kind 5) across the hints.
fn hinted_tombstones(fs: &SimFs) -> Vec<(Vec<u8>, RecordMeta)> {
    hints(fs)
        .iter()
        .flat_map(|(_, bytes)| hint_entries(bytes))
        .filter(|(kind, _, _)| *kind == format::KIND_TOMBSTONE_WITH_META)
        .map(|(_, key, m)| (key, meta(&m)))
        .collect()
}

#[test]
fn metas_round_trip_through_reads_reopen_scan_recovery_and_merge() {
    let fs = SimFs::new();
    let engine = open_sim(&fs, SyncPolicy::Never, SEGMENT_SIZE_BYTES);
    let (expected, tombstones) = write_history(&engine);
    check(&engine, &expected, "as written");
    engine.close().unwrap();
    assert_eq!(
        hinted_tombstones(&fs),
        tombstones,
        "tombstone metas in the hints"
    );
    let written_hints = hints(&fs);
    assert!(
        written_hints.len() >= 4,
        "the history should seal several segments"
    );

    let engine = open_sim(&fs, SyncPolicy::Never, SEGMENT_SIZE_BYTES);
    check(&engine, &expected, "after a reopen from hints");
    engine.close().unwrap();

    remove_hints(&fs);
    let engine = open_sim(&fs, SyncPolicy::Never, SEGMENT_SIZE_BYTES);
    check(&engine, &expected, "after a reopen with every hint deleted");
    engine.close().unwrap();
    assert_eq!(
        hints(&fs),
        written_hints,
        "scans rewrite the hints byte for byte"
    );

    let engine = open_sim(&fs, SyncPolicy::Never, SEGMENT_SIZE_BYTES);
    let report = engine.merge(&engine.sealed_data_files(), 0).unwrap();
    assert!(report.records_kept > 0);
    check(&engine, &expected, "after a merge");
    engine.close().unwrap();
    let merged_kinds: Vec<u8> = hints(&fs)
        .iter()
        .filter(|(name, _)| name.starts_with("merge-"))
        .flat_map(|(_, bytes)| hint_entries(bytes))
        .map(|(kind, _, _)| kind)
        .collect();
    assert!(
        merged_kinds.contains(&format::KIND_PUT_WITH_META),
        "merge output keeps records with meta: {merged_kinds:?}"
    );

    let engine = open_sim(&fs, SyncPolicy::Never, SEGMENT_SIZE_BYTES);
    check(&engine, &expected, "after reopening the merge output");
    engine.close().unwrap();
    remove_hints(&fs);
    let engine = open_sim(&fs, SyncPolicy::Never, SEGMENT_SIZE_BYTES);
    check(&engine, &expected, "after scanning the merge output");
    engine.close().unwrap();
}

#[test]
fn an_empty_meta_writes_exactly_what_the_build_before_metas_wrote() {
    // The checked-in seed corpus was written by a build that had no record
    // metas; its writes (puts, deletes, expiring puts, a merge) all carry
    // an empty meta here.
    let rebuilt = crate::fuzz::build_corpus();
    let checked_in = crate::fuzz::corpus();
    let names =
        |files: &[(String, Vec<u8>)]| files.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>();
    assert_eq!(names(&rebuilt), names(&checked_in));
    for ((name, new), (_, old)) in rebuilt.iter().zip(&checked_in) {
        assert!(
            new == old,
            "{name} differs from the file written before metas existed"
        );
    }
    // And the explicit builders with an empty meta are the plain ones.
    assert_eq!(
        Batch::new()
            .put_with_meta("k", "v", 0, RecordMeta::EMPTY)
            .delete_with_meta("d", RecordMeta::EMPTY),
        Batch::new().put("k", "v").delete("d")
    );
}

#[test]
fn an_over_long_meta_is_refused_and_nothing_is_written() {
    let fs = SimFs::new();
    let engine = open_sim(&fs, SyncPolicy::Always, SEGMENT_SIZE_BYTES);
    engine.put(b"before", b"v").unwrap();
    let files_before = sim_files(&fs, &sim_dir());
    let last_seq = engine.last_seq();

    let too_long = [1u8; RECORD_META_BYTES_MAX + 1];
    let result = RecordMeta::new(&too_long)
        .and_then(|meta| engine.write_batch(&Batch::new().put_with_meta("k", "v", 0, meta)));
    let err = result.unwrap_err();
    assert!(
        matches!(err, Error::RecordMetaTooLarge { len, max } if len == RECORD_META_BYTES_MAX + 1 && max == RECORD_META_BYTES_MAX),
        "{err:?}"
    );
    let message = err.to_string();
    assert!(
        message.contains("meta") && message.contains("RECORD_META_BYTES_MAX"),
        "{message}"
    );
    assert!(
        message.contains(&RECORD_META_BYTES_MAX.to_string()),
        "{message}"
    );
    // Exactly at the limit is fine.
    engine
        .write_batch(&Batch::new().delete_with_meta("k", meta(&too_long[1..])))
        .unwrap();
    engine.close().unwrap();
    let files_after = sim_files(&fs, &sim_dir());
    let grown: Vec<_> = files_before
        .iter()
        .zip(&files_after)
        .filter(|(a, b)| a != b)
        .map(|(a, _)| a.0.clone())
        .collect();
    assert_eq!(
        grown.len(),
        1,
        "only the one accepted delete changed a file: {grown:?}"
    );
    assert_eq!(
        last_seq + 2,
        Engine::open(
            sim_dir(),
            sim_options(&fs, SyncPolicy::Always, SEGMENT_SIZE_BYTES)
        )
        .unwrap()
        .last_seq()
    );
}

/// One put of `key` with `meta` at the start of a segment that then gets
/// sealed; returns the disk and the segment's name.
fn sealed_put_with_meta(key: &[u8], meta: RecordMeta) -> (SimFs, String) {
    let fs = SimFs::new();
    let engine = open_sim(&fs, SyncPolicy::Never, SEGMENT_SIZE_BYTES);
    engine
        .write_batch(&Batch::new().put_with_meta(key, "value", 0, meta))
        .unwrap();
    for i in 0..8 {
        engine
            .put(format!("pad/{i}").as_bytes(), b"padding padding")
            .unwrap();
    }
    let sealed = engine.sealed_data_files();
    engine.close().unwrap();
    (fs, sealed[0].clone())
}

fn edit(fs: &SimFs, name: &str, at: usize, f: impl Fn(u8) -> u8) {
    let path = sim_dir().join(name);
    let mut bytes = fs.read_file(&path).unwrap();
    bytes[at] = f(bytes[at]);
    fs.write_file(&path, &bytes);
}

fn assert_corruption_at(err: &Error, file: &str, at: u64, reason_has: &str) {
    match err {
        Error::Corruption {
            file: found,
            offset,
            reason,
        } => {
            assert_eq!((found.as_str(), *offset), (file, at), "{err}");
            assert!(reason.contains(reason_has), "{err}");
        }
        other => panic!("expected corruption, got {other:?}"),
    }
}

#[test]
fn a_flipped_meta_byte_in_a_record_never_reaches_a_caller() {
    let record_at = format::FILE_HEADER_SIZE_BYTES;
    let meta_byte = record_at + format::RECORD_META_OFFSET + 3;

    // With its hint: the open trusts the hint, the read checks the record.
    let (fs, segment) = sealed_put_with_meta(b"m", meta(b"revision"));
    edit(&fs, &segment, meta_byte, |b| b ^ 0x10);
    let engine = open_sim(&fs, SyncPolicy::Never, SEGMENT_SIZE_BYTES);
    let err = engine.get(b"m", 0).unwrap_err();
    assert_corruption_at(&err, &segment, record_at as u64, "checksum");
    assert!(
        engine.scan(&Scan::all(10), 0).is_err(),
        "a scan reading values must fail too"
    );
    // The directory-only answer comes from the (intact) hint, never from the rotten record.
    assert_eq!(engine.meta(b"m", 0).unwrap().meta, meta(b"revision"));
    engine.close().unwrap();

    // Without its hint: the strict scan of the sealed file refuses the open.
    remove_hints(&fs);
    let err = Engine::open(
        sim_dir(),
        sim_options(&fs, SyncPolicy::Never, SEGMENT_SIZE_BYTES),
    )
    .unwrap_err();
    assert_corruption_at(&err, &segment, record_at as u64, "checksum");

    // A meta length beyond the limit is corruption naming file and offset.
    let (fs, segment) = sealed_put_with_meta(b"m", meta(b"revision"));
    remove_hints(&fs);
    edit(
        &fs,
        &segment,
        record_at + format::RECORD_META_LEN_OFFSET,
        |_| RECORD_META_BYTES_MAX as u8 + 1,
    );
    let err = Engine::open(
        sim_dir(),
        sim_options(&fs, SyncPolicy::Never, SEGMENT_SIZE_BYTES),
    )
    .unwrap_err();
    assert_corruption_at(&err, &segment, record_at as u64, "meta length");

    // In the active segment's last batch it is a torn tail: cut off.
    let fs = SimFs::new();
    let engine = open_sim(&fs, SyncPolicy::Never, 1 << 20);
    engine
        .write_batch(&Batch::new().put_with_meta("a", "1", 0, meta(b"first")))
        .unwrap();
    let tail_at = engine.active_file().unwrap().len as usize;
    engine
        .write_batch(&Batch::new().put_with_meta("b", "2", 0, meta(b"second")))
        .unwrap();
    let active = engine.active_file().unwrap().name;
    engine.close().unwrap();
    edit(&fs, &active, tail_at + format::RECORD_META_OFFSET, |b| {
        b ^ 1
    });
    let engine = open_sim(&fs, SyncPolicy::Never, 1 << 20);
    assert_eq!(engine.get(b"a", 0).unwrap().unwrap().meta, meta(b"first"));
    assert_eq!(engine.get(b"b", 0).unwrap(), None);
    assert_eq!(engine.active_file().unwrap().len, tail_at as u64);
    engine.close().unwrap();
}

#[test]
fn a_bad_meta_length_in_a_hint_falls_back_to_a_scan() {
    // A 46-byte meta and a 5-byte key: 51 bytes follow the entry's meta
    // length, so a length of 0 (key length 51) or of 49 (key length 2)
    // still walks the hint in step, with a correct checksum: only the check
    // of the meta length itself can refuse it.
    let long = meta(&[0x5a; 46]);
    let (fs, segment) = sealed_put_with_meta(b"m-key", long);
    let hint_name = segment.replace(".data", ".hint");
    let path = sim_dir().join(&hint_name);
    let original = fs.read_file(&path).unwrap();
    let first = format::FILE_HEADER_SIZE_BYTES;
    assert_eq!(
        original[first + format::HINT_KIND_OFFSET],
        format::KIND_PUT_WITH_META
    );
    for (bad_len, key_len) in [(0u8, 51u32), (RECORD_META_BYTES_MAX as u8 + 1, 2)] {
        let mut bad = original.clone();
        bad[first + format::HINT_META_LEN_OFFSET] = bad_len;
        let key_len_at = first + format::HINT_KEY_LEN_OFFSET;
        bad[key_len_at..key_len_at + 4].copy_from_slice(&key_len.to_le_bytes());
        // Re-seal the hint's checksum so only the entry check can catch it.
        let body_len = bad.len() - format::HINT_TRAILER_SIZE_BYTES;
        let crc = crc32fast::hash(&bad[..body_len]);
        let crc_at = body_len + format::TRAILER_HINT_CRC_OFFSET;
        bad[crc_at..crc_at + 4].copy_from_slice(&crc.to_le_bytes());
        fs.write_file(&path, &bad);
        let engine = open_sim(&fs, SyncPolicy::Never, SEGMENT_SIZE_BYTES);
        let item = engine.get(b"m-key", 0).unwrap().unwrap();
        assert_eq!((item.value.as_slice(), item.meta), (&b"value"[..], long));
        engine.close().unwrap();
        assert_eq!(
            fs.read_file(&path).unwrap(),
            original,
            "meta length {bad_len}: the hint was ignored, the segment scanned and the hint rewritten"
        );
    }
}
