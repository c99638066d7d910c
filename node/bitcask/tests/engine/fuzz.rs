//! Decoders never panic: an arbitrary-bytes harness over everything the
//! engine reads from disk (file headers, records, hint entries and
//! trailers, file names), driven by proptest with a fixed seed.
//!
//! The seed corpus is a real engine directory checked into
//! `tests/corpus/engine/` (three sealed segments with hints, one active
//! segment, a merge output). Each case copies it onto a [`SimFs`], applies
//! one to four mutations to one or more files (flip a byte, truncate, extend
//! with random bytes, overwrite a range, replace a file with random bytes,
//! add a file with a random valid-looking name) and opens the engine. The
//! open may fail — with an error — but must not panic; an engine that opens
//! must then answer a full scan, a get of every key it lists, a write and a
//! close without panicking. Inputs that once broke a decoder go to
//! `tests/corpus/engine-regressions/<case>/` and are replayed first.
//!
//! `RAFTCASK_WRITE_CORPUS=1` rewrites the seed corpus (needed only when the
//! on-disk format changes; the first test fails with that advice when the
//! checked-in corpus no longer opens cleanly).

use std::path::{Path, PathBuf};

use bitcask::{Batch, Engine, Scan, SyncPolicy};
use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
use vfs::sim::SimFs;

use crate::common::{sim_dir, sim_files, sim_options};

/// Segment size of the corpus engine: small, so a few batches make several
/// sealed segments.
const CORPUS_SEGMENT_BYTES: u64 = 600;
/// Batches written into the corpus engine.
const CORPUS_BATCHES: u64 = 24;
/// Keys the corpus engine holds after its writes, deletes and merge.
const CORPUS_LIVE_KEYS: usize = 19;
/// Largest scan a case runs (more than any mutated directory can hold).
const SCAN_LIMIT: usize = 100_000;
/// Largest random file or extension a mutation makes.
const RANDOM_BYTES_MAX: usize = 2048;

fn corpus_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus/engine")
}

fn regressions_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus/engine-regressions")
}

/// Builds the seed engine directory on a SimFs: overwrites, deletes, TTLs,
/// several rotations and one merge, closed cleanly.
pub(crate) fn build_corpus() -> Vec<(String, Vec<u8>)> {
    build_corpus_merging(|engine, inputs, now_ms| engine.merge(inputs, now_ms))
}

/// [`build_corpus`] with its one merge made by `merge` (inputs, "now").
pub(crate) fn build_corpus_merging(
    merge: impl Fn(&Engine, &[String], u64) -> bitcask::Result<bitcask::MergeReport>,
) -> Vec<(String, Vec<u8>)> {
    let fs = SimFs::new();
    let engine = Engine::open(
        sim_dir(),
        sim_options(&fs, SyncPolicy::Always, CORPUS_SEGMENT_BYTES),
    )
    .expect("open corpus engine");
    for i in 1..=CORPUS_BATCHES {
        let mut batch = Batch::new()
            .meta(format!("batch {i}"))
            .seq(i * 10)
            .put(format!("key{:02}", i % 16), format!("value {i}"));
        if i % 5 == 0 {
            batch = batch.delete(format!("key{:02}", (i + 3) % 16));
        }
        if i % 7 == 0 {
            batch = batch.put_with_expiry(format!("ttl{i}"), "short-lived", 1_000 + i);
        }
        engine.write_batch(&batch).expect("corpus write");
    }
    let sealed = engine.sealed_data_files();
    merge(&engine, &sealed[..2.min(sealed.len())], 500).expect("corpus merge");
    engine.close().expect("close corpus engine");
    sim_files(&fs, &sim_dir())
        .into_iter()
        .filter(|(name, _)| name != "LOCK")
        .collect()
}

fn read_dir_files(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut files: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir)
        .unwrap_or_else(|err| panic!("read {}: {err}", dir.display()))
        .map(|entry| {
            let entry = entry.expect("dir entry");
            let name = entry.file_name().to_string_lossy().into_owned();
            let bytes = std::fs::read(entry.path()).expect("read corpus file");
            (name, bytes)
        })
        .collect();
    files.sort();
    files
}

/// The checked-in seed corpus (rewritten first when asked to).
pub(crate) fn corpus() -> Vec<(String, Vec<u8>)> {
    let dir = corpus_dir();
    if std::env::var_os("RAFTCASK_WRITE_CORPUS").is_some() {
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create corpus dir");
        for (name, bytes) in build_corpus() {
            std::fs::write(dir.join(name), bytes).expect("write corpus file");
        }
    }
    read_dir_files(&dir)
}

fn load(files: &[(String, Vec<u8>)]) -> SimFs {
    let fs = SimFs::new();
    for (name, bytes) in files {
        fs.write_file(&sim_dir().join(name), bytes);
    }
    fs
}

/// Opens `files` and, if that works, exercises the engine; panics only if
/// the engine does.
fn exercise(files: &[(String, Vec<u8>)]) -> Result<usize, bitcask::Error> {
    let fs = load(files);
    let engine = Engine::open(
        sim_dir(),
        sim_options(&fs, SyncPolicy::Always, CORPUS_SEGMENT_BYTES),
    )?;
    let entries = engine.scan(&Scan::all(SCAN_LIMIT), 0)?;
    for entry in &entries {
        let _ = engine.get(&entry.key, 0)?;
    }
    let _ = engine.stats();
    let _ = engine.write_batch(&Batch::new().put("after-open", "v"));
    let _ = engine.close();
    Ok(entries.len())
}

#[test]
fn the_seed_corpus_opens_cleanly() {
    let files = corpus();
    let data = files.iter().filter(|(n, _)| n.ends_with(".data")).count();
    let hints = files.iter().filter(|(n, _)| n.ends_with(".hint")).count();
    assert!(
        data >= 3 && hints >= 2,
        "the corpus should hold several segments and hints, has {data} data and {hints} hint files; \
         regenerate it with RAFTCASK_WRITE_CORPUS=1 if the format changed"
    );
    let live = exercise(&files).unwrap_or_else(|err| {
        panic!(
            "the checked-in corpus no longer opens ({err}); if the on-disk format changed, \
             regenerate it with RAFTCASK_WRITE_CORPUS=1 cargo test -p bitcask --test engine fuzz"
        )
    });
    // The live keys as of the corpus writes (the TTL keys count: scans at
    // time 0 see them); a changed count means the corpus is not what this
    // module describes.
    assert_eq!(live, CORPUS_LIVE_KEYS);
}

#[test]
fn regressions_replay_without_panic() {
    let dir = regressions_dir();
    let Ok(cases) = std::fs::read_dir(&dir) else {
        panic!("{} is missing (it is checked in)", dir.display());
    };
    let mut replayed = 0;
    for case in cases {
        let case = case.expect("dir entry").path();
        if case.is_dir() {
            let _ = exercise(&read_dir_files(&case));
            replayed += 1;
        }
    }
    assert!(replayed > 0, "no regression case under {}", dir.display());
}

/// One change to the directory.
#[derive(Clone, Debug)]
enum Mutation {
    FlipByte {
        file: usize,
        at: usize,
        bit: u8,
    },
    Truncate {
        file: usize,
        at: usize,
    },
    Extend {
        file: usize,
        bytes: Vec<u8>,
    },
    Overwrite {
        file: usize,
        at: usize,
        bytes: Vec<u8>,
    },
    Replace {
        file: usize,
        bytes: Vec<u8>,
    },
    AddFile {
        name: String,
        bytes: Vec<u8>,
    },
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let bytes = || proptest::collection::vec(any::<u8>(), 0..RANDOM_BYTES_MAX);
    prop_oneof![
        4 => (any::<usize>(), any::<usize>(), 0u8..8)
            .prop_map(|(file, at, bit)| Mutation::FlipByte { file, at, bit }),
        2 => (any::<usize>(), any::<usize>()).prop_map(|(file, at)| Mutation::Truncate { file, at }),
        1 => (any::<usize>(), bytes()).prop_map(|(file, bytes)| Mutation::Extend { file, bytes }),
        2 => (any::<usize>(), any::<usize>(), proptest::collection::vec(any::<u8>(), 1..64))
            .prop_map(|(file, at, bytes)| Mutation::Overwrite { file, at, bytes }),
        1 => (any::<usize>(), bytes()).prop_map(|(file, bytes)| Mutation::Replace { file, bytes }),
        1 => ("(seg-[0-9]{20}|merge-[0-9]{20}-[0-9]{4})\\.(data|hint)(\\.tmp)?", bytes())
            .prop_map(|(name, bytes)| Mutation::AddFile { name, bytes }),
    ]
}

fn apply(files: &mut Vec<(String, Vec<u8>)>, mutation: &Mutation) {
    let n = files.len();
    match mutation {
        Mutation::FlipByte { file, at, bit } => {
            let bytes = &mut files[file % n].1;
            if !bytes.is_empty() {
                let at = at % bytes.len();
                bytes[at] ^= 1 << bit;
            }
        }
        Mutation::Truncate { file, at } => {
            let bytes = &mut files[file % n].1;
            let at = at % (bytes.len() + 1);
            bytes.truncate(at);
        }
        Mutation::Extend { file, bytes } => files[file % n].1.extend_from_slice(bytes),
        Mutation::Overwrite { file, at, bytes } => {
            let target = &mut files[file % n].1;
            if !target.is_empty() {
                let at = at % target.len();
                for (i, b) in bytes.iter().enumerate() {
                    if let Some(slot) = target.get_mut(at + i) {
                        *slot = *b;
                    }
                }
            }
        }
        Mutation::Replace { file, bytes } => files[file % n].1 = bytes.clone(),
        Mutation::AddFile { name, bytes } => files.push((name.clone(), bytes.clone())),
    }
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(64)
        * 4
}

#[test]
fn mutated_engine_directories_never_panic() {
    let seed = corpus();
    let config = Config {
        cases: cases(),
        failure_persistence: None,
        max_shrink_iters: 500,
        ..Config::default()
    };
    let mut runner = TestRunner::new_with_rng(
        config,
        TestRng::from_seed(RngAlgorithm::ChaCha, b"raftcask-bitcask-fuzz-decoders!!"),
    );
    let opened = std::cell::Cell::new(0u32);
    let refused = std::cell::Cell::new(0u32);
    let result = runner.run(&proptest::collection::vec(mutation(), 1..=4), |mutations| {
        let mut files = seed.clone();
        for m in &mutations {
            apply(&mut files, m);
        }
        match exercise(&files) {
            Ok(_) => opened.set(opened.get() + 1),
            Err(_) => refused.set(refused.get() + 1),
        }
        Ok(())
    });
    if let Err(err) = result {
        panic!("a mutated engine directory made the engine panic: {err}");
    }
    // Both outcomes must occur, or the mutations are not reaching the
    // decoders (all refused) or not changing anything (all opened).
    let (opened, refused) = (opened.get(), refused.get());
    eprintln!("mutated engine directories: {opened} opened, {refused} refused");
    assert!(
        opened > 0 && refused > 0,
        "mutations should both corrupt and spare: {opened} opened, {refused} refused"
    );
}

/// The pure decoders on arbitrary bytes, directly (cheap, many cases).
#[test]
fn format_decoders_take_arbitrary_bytes() {
    use bitcask::format;
    let config = Config {
        cases: cases() * 8,
        failure_persistence: None,
        ..Config::default()
    };
    let mut runner = TestRunner::new_with_rng(
        config,
        TestRng::from_seed(RngAlgorithm::ChaCha, b"raftcask-bitcask-format-decoders"),
    );
    let result = runner.run(
        &(
            proptest::collection::vec(any::<u8>(), 0..256),
            any::<u64>(),
            "\\PC{0,40}",
        ),
        |(bytes, remaining, name)| {
            let _ = format::FileHeader::decode(&bytes, format::DATA_MAGIC, "fuzz");
            let _ = format::decode_record_header(&bytes, remaining);
            let mut rest: &[u8] = &bytes;
            while let Some((_, size)) = format::decode_hint_entry(rest) {
                rest = &rest[size..];
            }
            let _ = format::decode_hint_trailer(&bytes);
            let _ = format::FileId::parse_stem(&name);
            Ok(())
        },
    );
    if let Err(err) = result {
        panic!("a format decoder panicked: {err}");
    }
}
