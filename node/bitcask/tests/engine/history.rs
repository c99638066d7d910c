//! History: the engine side of a change history kept in the segments
//! themselves — merges that retain what a caller's predicate keeps, listing
//! every record with its location, and reading a record back by location.
//!
//! The record metas here hold a revision as one LEB128 varint (as the KV
//! layer's tombstone meta does, and as its put meta starts), and the
//! predicates keep records whose revision is above a floor, as the KV layer
//! will with its compaction revision. What this proves, all on `SimFs`:
//! - a retaining merge writes exactly the live records plus the records
//!   above the floor it would otherwise drop (superseded puts, tombstones of
//!   deleted keys, expired puts), and nothing else; the live view (`get`,
//!   `scan`, `meta`) equals that of a twin engine merged without retention,
//!   also after reopening from hints and with every hint deleted (the hints
//!   a scan rewrites are byte for byte the ones the merge wrote);
//! - listing after a reopen (hints or data) gives the same records at the
//!   same locations, and every location reads back the key and value the
//!   model wrote with that sequence number;
//! - a second merge with a higher floor drops what fell below it;
//! - replicas fed the same batches and merged with the same predicate write
//!   identical files; a predicate that keeps nothing writes exactly what a
//!   plain merge writes, and what the build before retention wrote (the
//!   checked-in seed corpus, rebuilt byte for byte); a sequence floor
//!   (`Retain::with_min_seq`) at the predicate's own floor changes nothing,
//!   one past every record makes it keep nothing;
//! - a location into a merged-away file errs with `LocationGone` (even while
//!   the file is pinned on disk), and made-up locations with
//!   `InvalidLocation`, never a panic or a wrong value;
//! - whatever the predicate keeps, an older record never comes back to life
//!   (a key's final tombstone, or its expired latest put, is kept with it),
//!   checked by hand and over random streams, predicates and merge inputs;
//! - listing runs beside writers and merges; a power cut during a retaining
//!   merge loses nothing.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use bitcask::{
    Batch, Engine, Error, Item, ItemMeta, MergeReport, RecordLocation, RecordMeta, Retain, Scan,
    StoredKind, StoredRecord, SyncPolicy,
};
use vfs::Vfs;
use vfs::sim::{SimFs, Torn};

use crate::common::{open_sim, sim_dir, sim_files, value_for};

/// Small segments: many sealed files, merges with several parts.
const SEGMENT_SIZE_BYTES: u64 = 600;
/// Expiring puts expire at this ms of the caller's clock...
const EXPIRY_MS: u64 = 5_000;
/// ... and merges and reads judge expiry at this one (they are expired).
const NOW_MS: u64 = 10_000;
/// Keys the streams write: `k00` .. `k24`.
const KEYS: u64 = 25;

// ---------------------------------------------------------------------------
// Revisions in metas, predicates
// ---------------------------------------------------------------------------

/// A meta holding `rev` as one LEB128 varint.
fn rev_meta(mut rev: u64) -> RecordMeta {
    let mut bytes = Vec::new();
    loop {
        let byte = (rev & 0x7f) as u8;
        rev >>= 7;
        if rev == 0 {
            bytes.push(byte);
            break;
        }
        bytes.push(byte | 0x80);
    }
    RecordMeta::new(&bytes).expect("a varint fits")
}

/// The revision in a meta written by [`rev_meta`].
fn rev_of(meta: &RecordMeta) -> u64 {
    let mut rev = 0u64;
    for (i, byte) in meta.as_bytes().iter().enumerate() {
        rev |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            break;
        }
    }
    rev
}

/// Keeps records whose revision is above `floor`.
fn keep_above(floor: u64) -> Retain {
    Retain::new(move |record| rev_of(&record.meta) > floor)
}

// ---------------------------------------------------------------------------
// The write stream and its model
// ---------------------------------------------------------------------------

/// One record the test wrote.
#[derive(Clone, Debug)]
struct Wrote {
    key: Vec<u8>,
    kind: StoredKind,
    seq: u64,
    rev: u64,
    expiry_ms: u64,
    value: Vec<u8>,
}

/// A deterministic stream of batches (splitmix64) and every record in it.
struct Stream {
    rng: u64,
    next_seq: u64,
    next_rev: u64,
    wrote: Vec<Wrote>,
}

impl Stream {
    fn new(seed: u64) -> Stream {
        Stream {
            rng: seed,
            next_seq: 1,
            next_rev: 2,
            wrote: Vec::new(),
        }
    }

    fn next(&mut self) -> u64 {
        self.rng = self.rng.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// `count` batches of 1–4 ops: puts (one in five expiring at
    /// [`EXPIRY_MS`]) and deletes (one op in four), each op with the next
    /// revision in its meta.
    fn batches(&mut self, count: usize) -> Vec<Batch> {
        (0..count)
            .map(|_| {
                let first_seq = self.next_seq;
                let mut batch = Batch::new().seq(first_seq);
                for i in 0..1 + self.below(4) {
                    let key = format!("k{:02}", self.below(KEYS)).into_bytes();
                    let (seq, rev) = (first_seq + i, self.next_rev);
                    self.next_rev += 1;
                    let meta = rev_meta(rev);
                    if self.below(4) == 0 {
                        batch = batch.delete_with_meta(key.clone(), meta);
                        self.wrote.push(Wrote {
                            key,
                            kind: StoredKind::Tombstone,
                            seq,
                            rev,
                            expiry_ms: 0,
                            value: Vec::new(),
                        });
                    } else {
                        let expiry_ms = if self.below(5) == 0 { EXPIRY_MS } else { 0 };
                        let value = value_for(&key, seq, 20 + self.below(60) as usize);
                        batch = batch.put_with_meta(key.clone(), value.clone(), expiry_ms, meta);
                        self.wrote.push(Wrote {
                            key,
                            kind: StoredKind::Put,
                            seq,
                            rev,
                            expiry_ms,
                            value,
                        });
                    }
                }
                self.next_seq = first_seq + batch.ops.len() as u64 + 1;
                batch
            })
            .collect()
    }

    /// The record written with `seq`.
    fn record(&self, seq: u64) -> &Wrote {
        let index = self
            .wrote
            .binary_search_by_key(&seq, |wrote| wrote.seq)
            .expect("a sequence the stream wrote");
        &self.wrote[index]
    }

    /// What a reader at `now_ms` should see: key → (value, seq, rev).
    fn live(&self, now_ms: u64) -> BTreeMap<Vec<u8>, (Vec<u8>, u64, u64)> {
        let mut latest: BTreeMap<&[u8], &Wrote> = BTreeMap::new();
        for wrote in &self.wrote {
            latest.insert(&wrote.key, wrote);
        }
        latest
            .into_iter()
            .filter(|(_, w)| {
                w.kind == StoredKind::Put && (w.expiry_ms == 0 || w.expiry_ms > now_ms)
            })
            .map(|(key, w)| (key.to_vec(), (w.value.clone(), w.seq, w.rev)))
            .collect()
    }
}

fn feed(engine: &Engine, batches: &[Batch]) {
    for batch in batches {
        engine.write_batch(batch).expect("write a batch");
    }
}

// ---------------------------------------------------------------------------
// The live view, listings, expectations
// ---------------------------------------------------------------------------

/// Everything a reader sees at `now_ms`: `get` and `meta` of every key the
/// streams use, and a scan.
#[derive(Debug, PartialEq, Eq)]
struct LiveView {
    gets: Vec<(Vec<u8>, Option<Item>, Option<ItemMeta>)>,
    scan: Vec<bitcask::Entry>,
}

fn live_view(engine: &Engine, now_ms: u64) -> LiveView {
    let gets = (0..KEYS)
        .map(|i| format!("k{i:02}").into_bytes())
        .chain([b"extra".to_vec()])
        .map(|key| {
            let item = engine.get(&key, now_ms).expect("get");
            let meta = engine.meta(&key, now_ms);
            (key, item, meta)
        })
        .collect();
    let scan = engine.scan(&Scan::all(usize::MAX), now_ms).expect("scan");
    LiveView { gets, scan }
}

/// The live view matches the model.
fn assert_live_matches(engine: &Engine, stream: &Stream, now_ms: u64, when: &str) {
    let expected = stream.live(now_ms);
    let found: BTreeMap<Vec<u8>, (Vec<u8>, u64, u64)> = engine
        .scan(&Scan::all(usize::MAX), now_ms)
        .expect("scan")
        .into_iter()
        .map(|entry| {
            let rev = rev_of(&entry.meta);
            (entry.key, (entry.value.expect("values"), entry.seq, rev))
        })
        .collect();
    assert_eq!(found, expected, "{when}");
}

/// (key, kind, seq) of each record.
fn ids(records: &[StoredRecord]) -> BTreeSet<(Vec<u8>, StoredKind, u64)> {
    records
        .iter()
        .map(|r| (r.key.clone(), r.kind, r.seq))
        .collect()
}

/// What a merge of `inputs` at `now_ms` keeping `keep` must write, from
/// the listing before it: a record of the inputs is written if it is its
/// key's state and an unexpired put, or if `keep` keeps it. (The streams'
/// revisions grow with sequence numbers, so a floor predicate never needs
/// the rule that keeps a key's final tombstone: that tombstone is above the
/// floor whenever anything older of its key is.)
fn expected_output(
    before: &[StoredRecord],
    inputs: &[String],
    now_ms: u64,
    keep: &Retain,
) -> BTreeSet<(Vec<u8>, StoredKind, u64)> {
    let mut latest: BTreeMap<&[u8], u64> = BTreeMap::new();
    for record in before {
        latest.insert(&record.key, record.seq);
    }
    before
        .iter()
        .filter(|r| inputs.contains(&r.location.file_name()))
        .filter(|r| {
            let live = r.kind == StoredKind::Put && latest[r.key.as_slice()] == r.seq;
            let expired = r.expiry_ms != 0 && r.expiry_ms <= now_ms;
            (live && !expired) || keep.keeps(&r.view())
        })
        .map(|r| (r.key.clone(), r.kind, r.seq))
        .collect()
}

/// Every listed record reads back as the model wrote it.
fn assert_locations_read_back(engine: &Engine, stream: &Stream, records: &[StoredRecord]) {
    for record in records {
        let read = engine
            .read_record(&record.location)
            .unwrap_or_else(|e| panic!("{:?}: {e}", record.location));
        let wrote = stream.record(record.seq);
        assert_eq!(read.key, wrote.key, "{:?}", record.location);
        assert_eq!(read.kind, wrote.kind);
        assert_eq!(read.value, wrote.value);
        assert_eq!(read.seq, wrote.seq);
        assert_eq!(read.expiry_ms, wrote.expiry_ms);
        assert_eq!(rev_of(&read.meta), wrote.rev);
        assert_eq!(read.meta, record.meta);
        assert_eq!(
            (record.key.as_slice(), record.kind, record.expiry_ms),
            (wrote.key.as_slice(), wrote.kind, wrote.expiry_ms)
        );
        assert_eq!(record.value_len as usize, wrote.value.len());
    }
}

/// Within every key, listed records have increasing sequence numbers, and
/// the last one is the key's state: a put iff the key is in the directory
/// (expired or not), with its sequence number.
fn assert_last_record_is_the_state(engine: &Engine, records: &[StoredRecord]) {
    let mut last: BTreeMap<&[u8], &StoredRecord> = BTreeMap::new();
    for record in records {
        if let Some(previous) = last.get(record.key.as_slice()) {
            assert!(
                previous.seq < record.seq,
                "{:?} listed after {:?}",
                record.location,
                previous.location
            );
        }
        last.insert(&record.key, record);
    }
    for (key, record) in last {
        // Time 0: nothing has expired, so `meta` shows every directory entry.
        match engine.meta(key, 0) {
            Some(meta) => assert_eq!(
                (record.kind, record.seq),
                (StoredKind::Put, meta.seq),
                "{key:?}"
            ),
            None => assert_eq!(record.kind, StoredKind::Tombstone, "{key:?}"),
        }
    }
}

fn reopen(fs: &SimFs, engine: Engine) -> Engine {
    engine.close().expect("close");
    open_sim(fs, SyncPolicy::Never, SEGMENT_SIZE_BYTES)
}

/// Deletes every hint in the directory; returns them (name, bytes).
fn delete_hints(fs: &SimFs) -> Vec<(String, Vec<u8>)> {
    let hints: Vec<(String, Vec<u8>)> = sim_files(fs, &sim_dir())
        .into_iter()
        .filter(|(name, _)| name.ends_with(".hint"))
        .collect();
    for (name, _) in &hints {
        fs.remove(&sim_dir().join(name)).expect("remove a hint");
    }
    hints
}

/// An engine fed `batches` of a fresh stream with `seed`.
fn engine_with(fs: &SimFs, seed: u64, count: usize) -> (Engine, Stream) {
    let engine = open_sim(fs, SyncPolicy::Never, SEGMENT_SIZE_BYTES);
    let mut stream = Stream::new(seed);
    let batches = stream.batches(count);
    feed(&engine, &batches);
    (engine, stream)
}

// ---------------------------------------------------------------------------
// The scenarios
// ---------------------------------------------------------------------------

#[test]
fn a_retaining_merge_keeps_exactly_what_the_predicate_keeps_and_the_live_view_is_unchanged() {
    let floor = 120;
    let (fs, twin_fs) = (SimFs::new(), SimFs::new());
    let (engine, stream) = engine_with(&fs, 7, 150);
    let (twin, _) = engine_with(&twin_fs, 7, 150);
    assert!(stream.next_rev > 2 * floor, "the floor splits the stream");
    let before = engine.records().unwrap();
    assert_eq!(before.len(), stream.wrote.len(), "every record listed");
    assert_eq!(ids(&before), ids_of_stream(&stream));
    let inputs = engine.sealed_data_files();
    let keep = keep_above(floor);
    let expected = expected_output(&before, &inputs, NOW_MS, &keep);

    let report = engine.merge_retaining(&inputs, NOW_MS, keep).unwrap();
    twin.merge(&twin.sealed_data_files(), NOW_MS).unwrap();
    let written = engine.records_in(&report.outputs).unwrap();
    assert_eq!(ids(&written), expected);
    assert_eq!(
        report.records_kept + report.records_retained,
        written.len() as u64
    );
    // What the floor keeps is there: superseded puts, tombstones of deleted
    // keys, expired puts.
    let kinds = |pick: &dyn Fn(&StoredRecord) -> bool| written.iter().filter(|r| pick(r)).count();
    assert!(kinds(&|r| r.kind == StoredKind::Tombstone) > 0);
    assert!(kinds(&|r| r.expiry_ms == EXPIRY_MS) > 0);
    assert!(report.records_retained > report.records_kept, "{report:?}");
    // Below the floor only live records remain.
    for record in &written {
        if rev_of(&record.meta) <= floor {
            assert_eq!(engine.meta(&record.key, 0).map(|m| m.seq), Some(record.seq));
        }
    }

    let view = live_view(&engine, NOW_MS);
    assert_eq!(
        view,
        live_view(&twin, NOW_MS),
        "retention changed the live view"
    );
    assert_live_matches(&engine, &stream, NOW_MS, "after the merge");
    let listed = engine.records().unwrap();
    assert_last_record_is_the_state(&engine, &listed);
    assert_locations_read_back(&engine, &stream, &listed);

    let engine = reopen(&fs, engine);
    assert_eq!(
        live_view(&engine, NOW_MS),
        view,
        "after reopening from hints"
    );
    let hints = delete_hints(&fs);
    let engine = reopen(&fs, engine);
    assert_eq!(
        live_view(&engine, NOW_MS),
        view,
        "after reopening from data"
    );
    let rebuilt: BTreeMap<String, Vec<u8>> = sim_files(&fs, &sim_dir())
        .into_iter()
        .filter(|(name, _)| name.ends_with(".hint"))
        .collect();
    for (name, bytes) in hints {
        assert_eq!(
            rebuilt.get(&name),
            Some(&bytes),
            "{name} rebuilt differently"
        );
    }
    assert_eq!(engine.records().unwrap(), listed);
}

fn ids_of_stream(stream: &Stream) -> BTreeSet<(Vec<u8>, StoredKind, u64)> {
    stream
        .wrote
        .iter()
        .map(|w| (w.key.clone(), w.kind, w.seq))
        .collect()
}

#[test]
fn listing_after_reopen_from_hints_or_data_gives_the_same_readable_locations() {
    let fs = SimFs::new();
    let (engine, stream) = engine_with(&fs, 11, 120);
    let report = engine
        .merge_retaining(&engine.sealed_data_files(), NOW_MS, keep_above(100))
        .unwrap();
    let mut stream = stream;
    feed(&engine, &stream.batches(40));
    let listed = engine.records().unwrap();
    assert!(
        listed
            .iter()
            .any(|r| r.location.file_name().starts_with("merge-"))
    );
    assert!(
        listed
            .iter()
            .any(|r| r.location.file_name().starts_with("seg-"))
    );
    let tombstones_in_segments = listed
        .iter()
        .filter(|r| r.kind == StoredKind::Tombstone && r.location.file_name().starts_with("seg-"))
        .count();
    assert!(
        tombstones_in_segments > 0,
        "tombstone offsets come from hints"
    );
    assert_locations_read_back(&engine, &stream, &listed);
    assert_eq!(
        engine.records_in(&report.outputs).unwrap(),
        listed
            .iter()
            .filter(|r| report.outputs.contains(&r.location.file_name()))
            .cloned()
            .collect::<Vec<_>>()
    );

    // Sealing the active segment at reopen changes nothing in the listing.
    let engine = reopen(&fs, engine);
    assert_eq!(engine.records().unwrap(), listed, "from hints");
    assert_locations_read_back(&engine, &stream, &listed);
    delete_hints(&fs);
    let engine = reopen(&fs, engine);
    assert_eq!(engine.records().unwrap(), listed, "from data");
    assert_locations_read_back(&engine, &stream, &listed);
    assert_last_record_is_the_state(&engine, &listed);
    // An unknown name is refused by name.
    match engine.records_in(&["seg-00000000000000000000.data".to_string()]) {
        Err(Error::UnknownFile(name)) => assert_eq!(name, "seg-00000000000000000000.data"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_second_merge_with_a_higher_floor_drops_what_fell_below_it() {
    let fs = SimFs::new();
    let (engine, mut stream) = engine_with(&fs, 23, 120);
    let first = engine
        .merge_retaining(&engine.sealed_data_files(), NOW_MS, keep_above(60))
        .unwrap();
    let kept_first = engine.records_in(&first.outputs).unwrap();
    assert!(
        kept_first
            .iter()
            .any(|r| (61..=200).contains(&rev_of(&r.meta))
                && engine.meta(&r.key, 0).map(|m| m.seq) != Some(r.seq))
    );
    feed(&engine, &stream.batches(60));
    let before = engine.records().unwrap();
    let inputs = engine.sealed_data_files();
    assert_eq!(inputs[..first.outputs.len()], first.outputs[..]);
    let keep = keep_above(200);
    let expected = expected_output(&before, &inputs, NOW_MS, &keep);
    let second = engine.merge_retaining(&inputs, NOW_MS, keep).unwrap();
    let written = engine.records_in(&second.outputs).unwrap();
    assert_eq!(ids(&written), expected);
    for record in &written {
        let live = engine.meta(&record.key, 0).map(|m| m.seq) == Some(record.seq);
        assert!(
            live || rev_of(&record.meta) > 200,
            "{record:?} fell below the floor but was kept"
        );
    }
    // Some of what the first merge retained fell below the new floor.
    assert!(
        ids(&kept_first).difference(&ids(&written)).count() > 0,
        "the second merge dropped nothing of the first's history"
    );
    assert_live_matches(&engine, &stream, NOW_MS, "after the second merge");
    let engine = reopen(&fs, engine);
    assert_live_matches(&engine, &stream, NOW_MS, "reopened");
    assert_eq!(ids(&engine.records_in(&second.outputs).unwrap()), expected);
    delete_hints(&fs);
    let engine = reopen(&fs, engine);
    assert_live_matches(&engine, &stream, NOW_MS, "reopened from data");
    assert_locations_read_back(&engine, &stream, &engine.records().unwrap());
}

#[test]
fn replicas_merging_with_the_same_predicate_write_identical_files() {
    let mut stream = Stream::new(31);
    let first = stream.batches(100);
    let second = stream.batches(80);
    let run = |sync: SyncPolicy, reopen_every: usize, retain: &dyn Fn() -> Option<Retain>| {
        let fs = SimFs::new();
        let mut engine = open_sim(&fs, sync, SEGMENT_SIZE_BYTES);
        let mut reports: Vec<MergeReport> = Vec::new();
        for (round, batches) in [&first, &second].into_iter().enumerate() {
            for (i, batch) in batches.iter().enumerate() {
                engine.write_batch(batch).unwrap();
                if reopen_every != 0 && i % reopen_every == 0 {
                    engine.close().unwrap();
                    engine = open_sim(&fs, sync, SEGMENT_SIZE_BYTES);
                }
            }
            let inputs = engine.sealed_data_files();
            let now = NOW_MS + round as u64;
            reports.push(match retain() {
                Some(retain) => engine.merge_retaining(&inputs, now, retain).unwrap(),
                None => engine.merge(&inputs, now).unwrap(),
            });
        }
        engine.sync().unwrap();
        let files = sim_files(&fs, &sim_dir());
        (files, reports)
    };
    let a = run(SyncPolicy::Always, 0, &|| Some(keep_above(90)));
    let b = run(SyncPolicy::Never, 17, &|| Some(keep_above(90)));
    assert_eq!(names_of(&a.0), names_of(&b.0));
    assert_eq!(a, b, "replicas wrote different files");
    assert!(a.1.iter().all(|report| report.records_retained > 0));

    // A sequence floor at the revision floor changes nothing; one above
    // everything merged keeps nothing.
    let floor_seq = stream
        .wrote
        .iter()
        .find(|wrote| wrote.rev > 90)
        .expect("revisions pass 90")
        .seq;
    let at_floor = run(SyncPolicy::Never, 0, &|| {
        Some(keep_above(90).with_min_seq(floor_seq))
    });
    assert_eq!(a, at_floor, "min_seq at the floor changed the output");
    let past = run(SyncPolicy::Never, 0, &|| {
        Some(keep_above(90).with_min_seq(u64::MAX))
    });
    // Keeping nothing is a plain merge, byte for byte.
    let plain = run(SyncPolicy::Never, 0, &|| None);
    let nothing = run(SyncPolicy::Never, 0, &|| Some(Retain::new(|_| false)));
    assert_eq!(names_of(&plain.0), names_of(&nothing.0));
    assert_eq!(
        plain, nothing,
        "a predicate keeping nothing changed the output"
    );
    assert!(nothing.1.iter().all(|report| report.records_retained == 0));
    assert_eq!(plain, past, "min_seq past every record kept something");
    assert_ne!(plain.0, a.0, "retention must have written something");
}

#[test]
fn a_predicate_keeping_nothing_writes_what_the_build_before_retention_wrote() {
    // The checked-in seed corpus (its merge included) was written by a
    // build without retention.
    let rebuilt = crate::fuzz::build_corpus_merging(|engine, inputs, now_ms| {
        engine.merge_retaining(inputs, now_ms, Retain::new(|_| false))
    });
    let checked_in = crate::fuzz::corpus();
    assert_eq!(names_of(&rebuilt), names_of(&checked_in));
    assert!(
        checked_in
            .iter()
            .any(|(name, _)| name.starts_with("merge-"))
    );
    for ((name, new), (_, old)) in rebuilt.iter().zip(&checked_in) {
        assert!(
            new == old,
            "{name} differs from the file written before retention"
        );
    }
}

fn names_of(files: &[(String, Vec<u8>)]) -> Vec<&str> {
    files.iter().map(|(name, _)| name.as_str()).collect()
}

#[test]
fn a_location_into_a_merged_away_file_errs_cleanly() {
    let fs = SimFs::new();
    let (engine, stream) = engine_with(&fs, 41, 80);
    while engine.active_file().is_none() {
        engine.put(b"extra", b"x").unwrap();
    }
    let before = engine.records().unwrap();
    let in_segment = before
        .iter()
        .find(|r| r.kind == StoredKind::Put && r.location.file_name().starts_with("seg-"))
        .expect("a put in a segment")
        .clone();
    let active = engine.active_file().expect("an active segment").name;
    let in_active = before
        .iter()
        .find(|r| r.location.file_name() == active)
        .expect("a record in the active segment")
        .clone();
    assert_eq!(
        engine.read_record(&in_segment.location).unwrap().value,
        stream.record(in_segment.seq).value
    );

    // Made-up locations: a clean InvalidLocation, never a panic.
    let location = in_segment.location;
    for (bad, what) in [
        (
            RecordLocation {
                offset: location.offset + 1,
                ..location
            },
            "offset inside the record",
        ),
        (
            RecordLocation {
                len: location.len - 1,
                ..location
            },
            "short length",
        ),
        (
            RecordLocation {
                seq: location.seq + 1,
                ..location
            },
            "other sequence",
        ),
        (
            RecordLocation {
                offset: u32::MAX - 10,
                ..location
            },
            "past the end",
        ),
        (
            RecordLocation {
                offset: 0,
                len: 40,
                ..location
            },
            "the file header",
        ),
    ] {
        match engine.read_record(&bad) {
            Err(Error::InvalidLocation { file, .. }) => assert_eq!(file, location.file_name()),
            other => panic!("{what}: {other:?}"),
        }
    }

    // Pin the segment so it stays on disk: the location is still gone.
    let pin = engine.pin(&[location.file_name()]).unwrap();
    let report = engine
        .merge_retaining(&engine.sealed_data_files(), NOW_MS, keep_above(0))
        .unwrap();
    assert!(report.inputs.contains(&location.file_name()));
    assert!(
        fs.read_file(&sim_dir().join(location.file_name()))
            .is_some()
    );
    match engine.read_record(&location) {
        Err(Error::LocationGone { file }) => assert_eq!(file, location.file_name()),
        other => panic!("{other:?}"),
    }
    let message = engine.read_record(&location).unwrap_err().to_string();
    assert!(message.contains("merged away"), "{message}");
    drop(pin);
    assert!(
        fs.read_file(&sim_dir().join(location.file_name()))
            .is_none()
    );
    // The same record at its new place; the active segment was no input.
    let moved = engine
        .records_in(&report.outputs)
        .unwrap()
        .into_iter()
        .find(|r| r.seq == in_segment.seq)
        .expect("keep_above(0) keeps everything");
    assert_eq!(
        engine.read_record(&moved.location).unwrap().value,
        stream.record(in_segment.seq).value
    );
    assert_eq!(
        engine.read_record(&in_active.location).unwrap().seq,
        in_active.seq
    );
}

#[test]
fn a_predicate_that_keeps_an_old_record_cannot_bring_a_key_back() {
    let fs = SimFs::new();
    let engine = open_sim(&fs, SyncPolicy::Never, SEGMENT_SIZE_BYTES);
    let put = |key: &str, value: &str, expiry: u64, rev: u64| {
        let batch = Batch::new().put_with_meta(key, value, expiry, rev_meta(rev));
        engine.write_batch(&batch).unwrap();
    };
    let delete = |key: &str, rev: u64| {
        let batch = Batch::new().delete_with_meta(key, rev_meta(rev));
        engine.write_batch(&batch).unwrap();
    };
    // deleted: an old put kept, its final tombstone not.
    put("deleted", "v1", 0, 10);
    put("deleted", "v2", 0, 11);
    delete("deleted", 12);
    // expired: an old put kept, its expired latest put not.
    put("expired", "v1", 0, 20);
    put("expired", "v2", EXPIRY_MS, 21);
    // later: an old put kept; the key's latest put will be in the active segment.
    put("later", "v1", 0, 30);
    // gone-later: an old put kept; the key is deleted in the active segment.
    put("gone-later", "v1", 0, 40);
    // A tombstone kept alone, its key never written again.
    put("solo", "v1", 0, 50);
    delete("solo", 51);
    put("filler", &"x".repeat(700), 0, 60);
    let inputs = engine.sealed_data_files();
    put("later", "v2", 0, 70);
    delete("gone-later", 71);
    let odd = Retain::new(|record| [10, 20, 30, 40, 51].contains(&rev_of(&record.meta)));
    let report = engine.merge_retaining(&inputs, NOW_MS, odd).unwrap();
    let written = engine.records_in(&report.outputs).unwrap();
    let revs: Vec<(String, u64)> = written
        .iter()
        .map(|r| {
            (
                String::from_utf8_lossy(&r.key).into_owned(),
                rev_of(&r.meta),
            )
        })
        .collect();
    assert_eq!(
        revs,
        [
            ("deleted", 10),
            ("deleted", 12), // kept so that v1 stays history
            ("expired", 20),
            ("expired", 21), // kept (expired) so that v1 stays history
            ("filler", 60),
            ("gone-later", 40),
            ("later", 30),
            ("solo", 51),
        ]
        .map(|(key, rev)| (key.to_string(), rev))
    );
    assert_eq!(report.records_retained, 6);
    let expected = |engine: &Engine, when: &str| {
        for key in ["deleted", "expired", "gone-later", "solo"] {
            assert_eq!(
                engine.get(key.as_bytes(), NOW_MS).unwrap(),
                None,
                "{key} {when}"
            );
            assert_eq!(engine.meta(key.as_bytes(), NOW_MS), None, "{key} {when}");
        }
        let later = engine
            .get(b"later", NOW_MS)
            .unwrap()
            .expect("later is live");
        assert_eq!(
            (later.value.as_slice(), rev_of(&later.meta)),
            (&b"v2"[..], 70),
            "{when}"
        );
        let keys: Vec<Vec<u8>> = engine
            .scan(&Scan::all(100), NOW_MS)
            .unwrap()
            .into_iter()
            .map(|e| e.key)
            .collect();
        assert_eq!(keys, [b"filler".to_vec(), b"later".to_vec()], "{when}");
        // Before its expiry the expired key reads as its latest put, not v1.
        let expired = engine
            .get(b"expired", 0)
            .unwrap()
            .expect("not yet expired at 0");
        assert_eq!(expired.value, b"v2", "{when}");
        assert_last_record_is_the_state(engine, &engine.records().unwrap());
    };
    expected(&engine, "after the merge");
    let engine = reopen(&fs, engine);
    expected(&engine, "reopened from hints");
    delete_hints(&fs);
    let engine = reopen(&fs, engine);
    expected(&engine, "reopened from data");
}

/// A predicate that keeps a pseudo-random half of the records, by hash of
/// key and sequence number, unrelated to revisions or order.
fn coin(salt: u64) -> Retain {
    Retain::new(move |record| {
        let mut h = salt ^ record.seq.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        for byte in record.key {
            h = (h ^ u64::from(*byte)).wrapping_mul(0x100_0000_01b3);
        }
        (h >> 29) & 1 == 1
    })
}

#[test]
fn random_streams_predicates_and_inputs_keep_the_live_view() {
    for seed in 0..24u64 {
        let (fs, twin_fs) = (SimFs::new(), SimFs::new());
        // The twin never merges: merges change no live view.
        let count = 60 + (seed as usize % 5) * 20;
        let (engine, mut stream) = engine_with(&fs, 1000 + seed, count);
        let (twin, _) = engine_with(&twin_fs, 1000 + seed, count);
        for round in 0..3u64 {
            let sealed = engine.sealed_data_files();
            if sealed.len() < 2 {
                break;
            }
            // A prefix covering every earlier merge part.
            let merge_parts = sealed.iter().filter(|n| n.starts_with("merge-")).count();
            let take = (merge_parts + 1 + (seed + round) as usize % (sealed.len() - merge_parts))
                .min(sealed.len());
            let inputs = sealed[..take].to_vec();
            let now = if round == 1 { 0 } else { NOW_MS };
            // Every other seed promises a sequence floor somewhere in the stream.
            let retain = match seed % 2 {
                0 => coin(seed * 7 + round),
                _ => coin(seed * 7 + round).with_min_seq(stream.next_seq * (seed % 5) / 5),
            };
            engine.merge_retaining(&inputs, now, retain).unwrap();
            for at in [now, NOW_MS] {
                assert_eq!(
                    live_view(&engine, at),
                    live_view(&twin, at),
                    "seed {seed} round {round} at {at}"
                );
            }
            assert_live_matches(
                &engine,
                &stream,
                NOW_MS,
                &format!("seed {seed} round {round}"),
            );
            let batches = stream.batches(30);
            feed(&engine, &batches);
            feed(&twin, &batches);
        }
        let listed = engine.records().unwrap();
        assert_last_record_is_the_state(&engine, &listed);
        assert_locations_read_back(&engine, &stream, &listed);
        let view = live_view(&engine, NOW_MS);
        let engine = reopen(&fs, engine);
        assert_eq!(live_view(&engine, NOW_MS), view, "seed {seed}: from hints");
        assert_eq!(engine.records().unwrap(), listed, "seed {seed}");
        delete_hints(&fs);
        let engine = reopen(&fs, engine);
        assert_eq!(live_view(&engine, NOW_MS), view, "seed {seed}: from data");
        assert_eq!(engine.records().unwrap(), listed, "seed {seed}");
        assert_live_matches(&engine, &stream, NOW_MS, &format!("seed {seed} at the end"));
    }
}

#[test]
fn listing_runs_beside_writers_and_merges() {
    let fs = SimFs::new();
    let engine = Arc::new(open_sim(&fs, SyncPolicy::Never, SEGMENT_SIZE_BYTES));
    let stop = AtomicBool::new(false);
    std::thread::scope(|scope| {
        let writer = scope.spawn(|| {
            for i in 0..3_000u64 {
                let key = format!("k{:02}", i % KEYS).into_bytes();
                let batch = Batch::new().put_with_meta(
                    key.clone(),
                    value_for(&key, i, 40),
                    0,
                    rev_meta(i + 2),
                );
                engine.write_batch(&batch).unwrap();
            }
            stop.store(true, Ordering::SeqCst);
        });
        let merger = scope.spawn(|| {
            let mut merges = 0;
            let mut floor = 0;
            while !stop.load(Ordering::SeqCst) {
                let sealed = engine.sealed_data_files();
                if sealed.len() >= 3 {
                    floor += 100;
                    match engine.merge_retaining(&sealed, 0, keep_above(floor)) {
                        Ok(_) => merges += 1,
                        Err(Error::MergeInput(_)) => {}
                        Err(e) => panic!("merge: {e}"),
                    }
                }
                std::thread::yield_now();
            }
            merges
        });
        let mut listings = 0;
        let mut gone = 0;
        while !stop.load(Ordering::SeqCst) {
            let records = engine.records().expect("listing never fails under merges");
            for record in records.iter().step_by(7) {
                match engine.read_record(&record.location) {
                    Ok(read) => {
                        assert_eq!(read.seq, record.seq);
                        // Batch i holds the put with sequence 2i + 1.
                        assert_eq!(read.value, value_for(&read.key, (read.seq - 1) / 2, 40));
                    }
                    Err(Error::LocationGone { .. }) => gone += 1,
                    Err(e) => panic!("read {:?}: {e}", record.location),
                }
            }
            listings += 1;
        }
        writer.join().unwrap();
        let merges = merger.join().unwrap();
        assert!(
            listings > 0 && merges > 0,
            "listings {listings}, merges {merges}, gone {gone}"
        );
    });
    let listed = engine.records().unwrap();
    assert_last_record_is_the_state(&engine, &listed);
}

#[test]
fn a_power_cut_during_a_retaining_merge_loses_nothing() {
    for attempt in 0..12u64 {
        let fs = SimFs::new();
        let engine = Arc::new(open_sim(&fs, SyncPolicy::Always, SEGMENT_SIZE_BYTES));
        let mut stream = Stream::new(60 + attempt);
        feed(&engine, &stream.batches(80));
        let expected = live_view(&engine, NOW_MS);
        let merging = {
            let engine = engine.clone();
            std::thread::spawn(move || {
                engine.merge_retaining(&engine.sealed_data_files(), NOW_MS, keep_above(50))
            })
        };
        for _ in 0..attempt * 5 {
            std::thread::yield_now();
        }
        let after = fs.power_cut(if attempt % 2 == 0 {
            Torn::Nothing
        } else {
            Torn::Prefix(attempt)
        });
        merging.join().unwrap().unwrap();
        drop(engine);
        let engine = open_sim(&after, SyncPolicy::Always, SEGMENT_SIZE_BYTES);
        assert_eq!(live_view(&engine, NOW_MS), expected, "attempt {attempt}");
        let listed = engine.records().unwrap();
        assert_last_record_is_the_state(&engine, &listed);
        assert_locations_read_back(&engine, &stream, &listed);
        // And it merges again cleanly.
        feed(&engine, &stream.batches(20));
        engine
            .merge_retaining(&engine.sealed_data_files(), NOW_MS, keep_above(100))
            .unwrap();
        assert_live_matches(&engine, &stream, NOW_MS, &format!("attempt {attempt}"));
    }
}

// ---------------------------------------------------------------------------
// Visibility of the active segment, made-up locations
// ---------------------------------------------------------------------------

/// Waits (a failure guard, never a timing assumption) until `ready` holds.
fn wait_until(what: &str, mut ready: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !ready() {
        assert!(
            std::time::Instant::now() < deadline,
            "never happened: {what}"
        );
        std::thread::yield_now();
    }
}

#[test]
fn a_listing_under_sync_always_omits_a_batch_awaiting_its_fsync() {
    // With sync=always a batch is visible to readers only once an fsync
    // covers it; until then a listing must not show it, nor may a read by
    // location return it (FORMAT.md "Live or history": the last listed
    // record of a key is the one `meta` names). The fsync is held by the
    // simulated disk until the test releases it: no timing involved.
    let fs = SimFs::new();
    let engine = Arc::new(open_sim(&fs, SyncPolicy::Always, 1 << 20));
    let first_seq = engine.put(b"k", b"v1").unwrap();
    let first = engine.records().unwrap();
    assert_eq!(first.len(), 1);
    let first = first[0].location;
    // The second put has the same sizes and follows the first batch's
    // commit record (27 bytes: no key, no metadata).
    let pending = RecordLocation {
        offset: first.offset + first.len + 27,
        seq: first_seq + 2,
        ..first
    };

    fs.hold_syncs(true);
    let done = Arc::new(AtomicBool::new(false));
    let writer = {
        let engine = engine.clone();
        let done = done.clone();
        std::thread::spawn(move || {
            let seq = engine.put(b"k", b"v2").unwrap();
            done.store(true, Ordering::SeqCst);
            seq
        })
    };
    // Written (the batch is appended before its fsync starts) and its
    // fsync blocked on the simulated disk.
    wait_until("the second put's fsync starts", || fs.syncs_held() == 1);
    assert_eq!(engine.last_seq(), pending.seq + 1, "the batch is written");
    let listed = engine.records().unwrap();
    let read = engine.read_record(&pending);
    let seen = engine.meta(b"k", 0).unwrap().seq;
    let got = engine.get(b"k", 0).unwrap().unwrap().value;
    assert!(
        !done.load(Ordering::SeqCst),
        "the put returned before its fsync"
    );
    assert_eq!(
        (seen, got.as_slice()),
        (first_seq, &b"v1"[..]),
        "get shows the pending write"
    );
    assert_eq!(
        listed.iter().map(|r| r.seq).collect::<Vec<_>>(),
        vec![first_seq],
        "the listing shows a batch awaiting its fsync"
    );
    match read {
        Err(Error::InvalidLocation { reason, .. }) => {
            assert!(reason.contains("published"), "{reason}")
        }
        other => panic!("a record awaiting its fsync was read: {other:?}"),
    }

    fs.hold_syncs(false);
    assert_eq!(writer.join().unwrap(), pending.seq);
    assert_eq!(engine.meta(b"k", 0).unwrap().seq, pending.seq);
    let listed = engine.records().unwrap();
    assert_eq!(listed.last().unwrap().location, pending);
    assert_eq!(engine.read_record(&pending).unwrap().value, b"v2");
}

#[test]
fn a_seal_that_fails_midway_leaves_the_segment_listed_as_get_sees_it() {
    // A rotation's seal can fail after the segment left the writer (its
    // fsync, or the hint after it): the engine is poisoned, but reads go
    // on, and the segment stays the active file for them. The listing must
    // still show what `get` shows of it: each key's last listed record is
    // the one `meta` names, and every listed location reads back.
    // (The seal's fsync failing, and the hint failing after it succeeded.)
    for (sync, fail_hint, v2_visible) in [
        (SyncPolicy::Always, true, true),
        (SyncPolicy::Always, false, false),
        (SyncPolicy::Never, false, true),
    ] {
        let what = format!(
            "{sync:?}, the seal's {}",
            if fail_hint { "hint" } else { "fsync" }
        );
        let fs = SimFs::new();
        let engine = open_sim(&fs, sync, 200);
        let v1 = engine.put(b"k", b"v1").unwrap();
        engine.put(b"other", b"o").unwrap();
        assert!(engine.sealed_data_files().is_empty(), "{what}");
        if fail_hint {
            // The batch's data write succeeds, the hint's first write fails.
            fs.fail_writes_after(Some(1));
        } else {
            fs.set_fail_sync(true);
        }
        // 200 bytes of value: this batch reaches the rotation size.
        let err = engine.put(b"k", &[b'2'; 200]).unwrap_err();
        assert!(matches!(err, Error::Io { .. }), "{what}: {err}");
        assert!(engine.is_poisoned(), "{what}");
        assert!(engine.sealed_data_files().is_empty(), "{what}: not sealed");
        let live = engine.meta(b"k", 0).unwrap().seq;
        assert_eq!(live > v1, v2_visible, "{what}");

        let listed = engine.records().unwrap();
        let last_of_k = listed.iter().rev().find(|r| r.key == b"k");
        assert_eq!(
            last_of_k.map(|r| r.seq),
            Some(live),
            "{what}: the listing does not end with the record get sees: {listed:?}"
        );
        assert_eq!(listed.len(), if v2_visible { 3 } else { 2 }, "{what}");
        for record in &listed {
            let read = engine.read_record(&record.location).unwrap();
            assert_eq!(
                (read.key.as_slice(), read.seq),
                (&record.key[..], record.seq)
            );
        }
        assert_eq!(
            engine
                .records_in(&[listed[0].location.file_name()])
                .unwrap(),
            listed,
            "{what}: the segment can be named"
        );
    }
}

#[test]
fn a_made_up_location_is_refused_before_anything_is_allocated() {
    let fs = SimFs::new();
    let engine = open_sim(&fs, SyncPolicy::Never, 1 << 20);
    engine.put(b"k", b"v").unwrap();
    let active = engine.records().unwrap()[0].location;
    assert!(engine.active_file().is_some());
    // A length near u32::MAX in the active segment (read with pread into a
    // buffer) would allocate ~4 GiB if it were believed.
    for (bad, what, says) in [
        (
            RecordLocation {
                len: u32::MAX,
                ..active
            },
            "a 4 GiB record",
            "RECORD_SIZE_BYTES_MAX",
        ),
        (
            RecordLocation {
                len: bitcask::RECORD_SIZE_BYTES_MAX as u32 + 1,
                ..active
            },
            "one byte more than any record",
            "RECORD_SIZE_BYTES_MAX",
        ),
        (
            RecordLocation {
                len: bitcask::RECORD_SIZE_BYTES_MAX as u32,
                ..active
            },
            "as long as a record can be, past the end",
            "published",
        ),
        (
            RecordLocation {
                offset: active.offset + active.len,
                ..active
            },
            "past the committed prefix",
            "published",
        ),
    ] {
        match engine.read_record(&bad) {
            Err(Error::InvalidLocation { file, reason, .. }) => {
                assert_eq!(file, active.file_name(), "{what}");
                assert!(reason.contains(says), "{what}: {reason}");
            }
            other => panic!("{what}: {other:?}"),
        }
    }
    // The same in a sealed file (a 64-byte threshold seals every batch).
    let fs = SimFs::new();
    let engine = open_sim(&fs, SyncPolicy::Never, 64);
    engine.put(b"k", b"v").unwrap();
    let sealed = engine.sealed_data_files();
    let record = engine.records_in(&sealed).unwrap()[0].clone();
    match engine.read_record(&RecordLocation {
        len: u32::MAX,
        ..record.location
    }) {
        Err(Error::InvalidLocation { reason, .. }) => {
            assert!(reason.contains("RECORD_SIZE_BYTES_MAX"), "{reason}")
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(engine.read_record(&record.location).unwrap().value, b"v");
}

#[test]
fn the_expiry_high_water_after_a_reopen_counts_live_keys_only() {
    // A superseded put with a far expiry, kept by a retaining merge, is
    // replayed at open; it must not hold the expiry high-water up (kvnode
    // proposes expiry ticks while its clock is below the mark).
    const FAR_MS: u64 = 1 << 50;
    const LIVE_MS: u64 = 7_000;
    let fs = SimFs::new();
    let engine = open_sim(&fs, SyncPolicy::Never, 64);
    engine.put_with_expiry(b"k", b"v1", FAR_MS).unwrap();
    engine.put(b"k", b"v2").unwrap();
    engine.put_with_expiry(b"j", b"w", LIVE_MS).unwrap();
    engine.put_with_expiry(b"gone", b"x", FAR_MS).unwrap();
    engine.delete(b"gone").unwrap();
    let report = engine
        .merge_retaining(&engine.sealed_data_files(), 0, Retain::new(|_| true))
        .unwrap();
    let kept = engine.records_in(&report.outputs).unwrap();
    assert!(
        kept.iter()
            .any(|r| r.key == b"k" && r.expiry_ms == FAR_MS && r.kind == StoredKind::Put),
        "the superseded put was kept: {kept:?}"
    );
    assert!(
        kept.iter()
            .any(|r| r.key == b"gone" && r.expiry_ms == FAR_MS),
        "the deleted put was kept: {kept:?}"
    );
    let engine = reopen(&fs, engine);
    assert_eq!(engine.get(b"k", 0).unwrap().unwrap().value, b"v2");
    assert_eq!(engine.expiry_high_water_ms(), LIVE_MS);
    // Also with every hint gone (the data files are scanned).
    delete_hints(&fs);
    let engine = reopen(&fs, engine);
    assert_eq!(engine.expiry_high_water_ms(), LIVE_MS);
    // Once no live key expires, the mark is 0 at the next open.
    engine.delete(b"j").unwrap();
    let engine = reopen(&fs, engine);
    assert_eq!(engine.expiry_high_water_ms(), 0);
}
