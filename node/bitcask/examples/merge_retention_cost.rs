//! Measures what a merge's retention predicate costs: the same merge of the
//! same files without a predicate, with one that keeps nothing (without and
//! with a `min_seq` past every record), and with one that keeps the upper
//! half of the history (without and with the `min_seq` of its floor); plus
//! listing every record (`Engine::records`) of the data set. Wall and CPU
//! time of the merging thread are printed. Each variant runs on a fresh copy
//! of one data set, alternating, `RUNS` times; the medians are printed.
//!
//! ```sh
//! cargo run --release -p bitcask --example merge_retention_cost -- DIR KEYS VERSIONS RUNS
//! ```
//!
//! The data set: `KEYS` keys of 25 bytes, each written `VERSIONS` times
//! with 100-byte values (one put a batch, keys in order, round after
//! round), every put carrying an 8-byte record meta whose first varint is
//! its revision (as the KV layer's), and every tenth key of the last round
//! deleted with a 3-byte tombstone meta; no fsync, 16 MiB segments. The
//! merge takes every sealed file at "now" 0.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use bitcask::{Batch, Engine, MergeReport, Options, RecordMeta, Retain, SyncPolicy};

/// Length of every key.
const KEY_SIZE_BYTES: usize = 25;
/// Length of every value.
const VALUE_SIZE_BYTES: usize = 100;
/// Segment rotation size of the data set.
const SEGMENT_SIZE_BYTES: u64 = 16 * 1024 * 1024;
/// One key in this many is deleted after the last round.
const DELETE_EVERY_KEYS: u64 = 10;

/// A variant: its name and how to make its predicate (`None`: a plain merge).
type Variant = (&'static str, Box<dyn Fn() -> Option<Retain>>);

fn key(id: u64) -> Vec<u8> {
    format!("user:{id:0width$}", width = KEY_SIZE_BYTES - 5).into_bytes()
}

/// LEB128 of `value` appended to `out`.
fn varint(out: &mut Vec<u8>, mut value: u64) {
    loop {
        let byte = (value & 0x7f) as u8;
        value >>= 7;
        if value == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}

/// The revision a meta starts with.
fn revision(meta: &RecordMeta) -> u64 {
    let mut value = 0u64;
    for (i, byte) in meta.as_bytes().iter().enumerate() {
        value |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            break;
        }
    }
    value
}

fn options() -> Options {
    Options {
        segment_size_bytes: SEGMENT_SIZE_BYTES,
        sync: SyncPolicy::Never,
        auto_merge: None,
        ..Options::default()
    }
}

/// Writes the data set; returns the last revision.
fn build(dir: &Path, keys: u64, versions: u64) -> Result<u64, bitcask::Error> {
    let engine = Engine::open(dir, options())?;
    let value = vec![b'v'; VALUE_SIZE_BYTES];
    let mut rev = 1u64;
    for version in 0..versions {
        for id in 0..keys {
            rev += 1;
            let mut meta = Vec::new();
            // mod_revision, create delta, version, lease: 8 bytes or so.
            varint(&mut meta, rev);
            varint(&mut meta, version * keys);
            varint(&mut meta, version + 1);
            varint(&mut meta, 0);
            meta.resize(8, 0);
            let meta = RecordMeta::new(&meta)?;
            engine.write_batch(&Batch::new().put_with_meta(key(id), value.clone(), 0, meta))?;
        }
    }
    for id in (0..keys).step_by(DELETE_EVERY_KEYS as usize) {
        rev += 1;
        let mut meta = Vec::new();
        varint(&mut meta, rev);
        engine.write_batch(&Batch::new().delete_with_meta(key(id), RecordMeta::new(&meta)?))?;
    }
    engine.close()?;
    Ok(rev)
}

fn copy_dir(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        if entry.file_name() != "LOCK" {
            std::fs::copy(entry.path(), to.join(entry.file_name()))?;
        }
    }
    Ok(())
}

/// CPU time the calling thread has used (Linux: its schedstat; zero
/// where that is not available).
fn thread_cpu() -> Duration {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|stat| stat.split_whitespace().next()?.parse().ok())
        .map_or(Duration::ZERO, Duration::from_nanos)
}

/// One merge of every sealed file of a fresh copy of `data` (in the
/// calling thread): its wall time, its CPU time, and its report.
fn merge_once(
    data: &Path,
    work: &Path,
    retain: Option<Retain>,
) -> Result<(Duration, Duration, MergeReport), Box<dyn std::error::Error>> {
    let _ = std::fs::remove_dir_all(work);
    copy_dir(data, work)?;
    let engine = Engine::open(work, options())?;
    let inputs = engine.sealed_data_files();
    let (start, cpu_start) = (Instant::now(), thread_cpu());
    let report = match retain {
        None => engine.merge(&inputs, 0)?,
        Some(retain) => engine.merge_retaining(&inputs, 0, retain)?,
    };
    let (elapsed, cpu) = (start.elapsed(), thread_cpu() - cpu_start);
    engine.close()?;
    std::fs::remove_dir_all(work)?;
    Ok((elapsed, cpu, report))
}

fn median(mut times: Vec<Duration>) -> Duration {
    times.sort();
    times[times.len() / 2]
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [dir, keys, versions, runs] = args.as_slice() else {
        return Err("usage: merge_retention_cost DIR KEYS VERSIONS RUNS".into());
    };
    let dir = PathBuf::from(dir);
    let (keys, versions, runs): (u64, u64, usize) =
        (keys.parse()?, versions.parse()?, runs.parse()?);
    if dir.exists() {
        return Err(format!("{} exists; give a new directory", dir.display()).into());
    }
    let data = dir.join("data");
    let work = dir.join("work");
    let start = Instant::now();
    let last_rev = build(&data, keys, versions)?;
    println!(
        "data set: {keys} keys x {versions} versions, {} deletes, built in {:.1?}",
        keys.div_ceil(DELETE_EVERY_KEYS),
        start.elapsed()
    );
    let floor = last_rev / 2;
    // The lowest sequence number above the floor (the KV layer reads it
    // from its history index), and one above everything (floor caught up).
    let (floor_seq, past_seq) = {
        let engine = Engine::open(&data, options())?;
        let mut listing = Vec::new();
        let mut records = Vec::new();
        for _ in 0..runs {
            let start = Instant::now();
            records = engine.records()?;
            listing.push(start.elapsed());
        }
        println!(
            "records(): {} records listed in {:.1?} (median of {runs})",
            records.len(),
            median(listing)
        );
        let floor_seq = records
            .iter()
            .filter(|record| revision(&record.meta) > floor)
            .map(|record| record.seq)
            .min()
            .unwrap_or(u64::MAX);
        let past_seq = engine.last_seq() + 1;
        engine.close()?;
        (floor_seq, past_seq)
    };
    let variants: Vec<Variant> = vec![
        ("merge (no predicate)", Box::new(|| None)),
        (
            "merge_retaining (keeps nothing)",
            Box::new(|| Some(Retain::new(|_| false))),
        ),
        (
            "merge_retaining (keeps nothing, min_seq past every record)",
            Box::new(move || Some(Retain::new(|_| false).with_min_seq(past_seq))),
        ),
        (
            "merge_retaining (revision > half)",
            Box::new(move || Some(Retain::new(move |r| revision(&r.meta) > floor))),
        ),
        (
            "merge_retaining (revision > half, min_seq of the floor)",
            Box::new(move || {
                Some(Retain::new(move |r| revision(&r.meta) > floor).with_min_seq(floor_seq))
            }),
        ),
    ];
    let mut times: Vec<Vec<Duration>> = vec![Vec::new(); variants.len()];
    let mut cpus: Vec<Vec<Duration>> = vec![Vec::new(); variants.len()];
    let mut reports: Vec<Option<MergeReport>> = vec![None; variants.len()];
    for _ in 0..runs {
        for (index, (_, retain)) in variants.iter().enumerate() {
            let (elapsed, cpu, report) = merge_once(&data, &work, retain())?;
            times[index].push(elapsed);
            cpus[index].push(cpu);
            reports[index] = Some(report);
        }
    }
    for (((name, _), (times, report)), cpus) in variants
        .iter()
        .zip(times.into_iter().zip(reports))
        .zip(cpus)
    {
        let report = report.expect("at least one run");
        let all: Vec<String> = times
            .iter()
            .map(|t| format!("{} ms", t.as_millis()))
            .collect();
        println!(
            "{name}: wall median {} ms [{}], CPU median {} ms; {} inputs ({} MiB) -> {} outputs ({} MiB), kept {}, retained {}",
            median(times.clone()).as_millis(),
            all.join(", "),
            median(cpus).as_millis(),
            report.inputs.len(),
            report.bytes_before >> 20,
            report.outputs.len(),
            report.bytes_after >> 20,
            report.records_kept,
            report.records_retained,
        );
    }
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}
