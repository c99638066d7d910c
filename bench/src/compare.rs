//! The `engine-compare` run: the seed workload against every engine, one
//! engine at a time, each in its own directory that is deleted afterwards.
//!
//! Per engine (N keys of 25 bytes, 4 KiB random values):
//! 1. (b) load N keys in random order without fsync, one thread; the final
//!    flush to disk is inside the timed region;
//! 2. (a) random point reads of loaded keys from 1 and 2 threads, after an
//!    untimed pass that reads every key once (warms each engine's cache);
//! 3. reopen with fsync per write; (c) 16 writers putting new 4 KiB keys,
//!    (d) the same with 256-byte values, each bounded by count and time;
//! 4. (g) reopen without fsync, overwrite every key twice, then reclaim
//!    space (bitcask: merge of every sealed file while one thread keeps
//!    writing; redb: compaction; fjall: major compaction); disk use at each
//!    step.
//!
//! Then, on a separate data set of `big_keys` keys with 100-byte values:
//! (e) the key directory's heap per key and (f) the open time, measured by
//! the caller's probe (a child process with a counting allocator), warm and
//! with the data set's pages dropped from the page cache.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};

use crate::probe::Probe;
use crate::report::{Table, bytes, count, seconds};
use crate::run::{Bounds, Measured};
use crate::store::EngineKind;
use crate::workload::{VALUE_POOL_SIZE_BYTES, ValuePool};

mod big;
mod engine;
mod tables;
mod targets;

use big::run_big;
use engine::run_engine;
use tables::tables;

/// Everything a run needs.
#[derive(Clone, Debug)]
pub struct Config {
    /// Keys of the main data set (N).
    pub keys: u64,
    /// Value size of the main data set.
    pub value_len: usize,
    /// Value size of section (d).
    pub small_value_len: usize,
    /// Reads per read measurement (over all threads) and their time cap.
    pub reads: Bounds,
    /// Reader thread counts measured.
    pub read_threads: Vec<usize>,
    /// Writer threads of the synced-write sections.
    pub sync_threads: usize,
    /// Puts per synced-write measurement and their time cap.
    pub sync: Bounds,
    /// Time cap of each load or overwrite pass.
    pub load_time_max: Duration,
    /// Puts of the writer that runs beside the merge (and of its baseline).
    pub merge_writes: Bounds,
    /// Time the baseline writer (no merge) runs at most.
    pub merge_baseline_time_max: Duration,
    /// Keys of the restart/memory data set (0 skips sections e and f).
    pub big_keys: u64,
    /// Value size of the restart/memory data set.
    pub big_value_len: usize,
    /// Segment size of the extra bitcask restart variant whose active
    /// segment (the part an open scans) is small.
    pub small_segment_bytes: u64,
    /// Probe runs per cache state; the median is reported.
    pub probe_runs: usize,
    /// Engines, in report order.
    pub engines: Vec<EngineKind>,
    /// Where data directories go (each deleted after use).
    pub work_dir: PathBuf,
    /// Seed of every random choice.
    pub seed: u64,
}

impl Config {
    /// The defaults of the brief for `keys` keys.
    pub fn new(keys: u64, work_dir: PathBuf) -> Config {
        Config {
            keys,
            value_len: 4096,
            small_value_len: 256,
            reads: Bounds {
                ops: 1_000_000,
                time: Duration::from_secs(20),
            },
            read_threads: vec![1, 2],
            sync_threads: 16,
            sync: Bounds {
                ops: keys.min(20_000),
                time: Duration::from_secs(30),
            },
            load_time_max: Duration::from_secs(900),
            merge_writes: Bounds {
                ops: (keys * 2).max(1),
                time: Duration::from_secs(300),
            },
            merge_baseline_time_max: Duration::from_secs(10),
            big_keys: 1_000_000,
            big_value_len: 100,
            small_segment_bytes: 4 * 1024 * 1024,
            probe_runs: 3,
            engines: EngineKind::ALL
                .into_iter()
                .filter(|kind| kind.available())
                .collect(),
            work_dir,
            seed: 0x5eed,
        }
    }
}

/// Runs an open probe on `dir` (normally a child process).
pub type ProbeFn<'a> = &'a dyn Fn(EngineKind, &Path) -> Result<Probe>;

/// Results of the main data set for one engine.
#[derive(Debug)]
struct EngineRun {
    kind: EngineKind,
    load: Measured,
    disk_loaded: u64,
    reads: Vec<(usize, Measured)>,
    reopen: Duration,
    sync_big: Measured,
    sync_small: Measured,
    overwrites: Vec<Measured>,
    disk_overwritten: u64,
    compact_time: Duration,
    disk_compacted: u64,
    merge: Option<MergeRun>,
}

#[derive(Debug)]
struct MergeRun {
    baseline: Measured,
    during: Measured,
    report: Option<bitcask::MergeReport>,
}

/// Results of the restart/memory data set for one engine variant.
#[derive(Debug)]
struct BigRun {
    kind: EngineKind,
    label: String,
    build: Measured,
    disk: u64,
    warm: Vec<Probe>,
    cold: Vec<Probe>,
}

/// Runs everything and returns the tables, in report order.
pub fn run(cfg: &Config, probe: ProbeFn<'_>) -> Result<Vec<Table>> {
    std::fs::create_dir_all(&cfg.work_dir)?;
    eprintln!(
        "filling a {} random value pool",
        bytes(VALUE_POOL_SIZE_BYTES as u64)
    );
    let pool = ValuePool::new(cfg.seed, VALUE_POOL_SIZE_BYTES);
    let mut runs = Vec::new();
    if cfg.keys > 0 {
        for &kind in &cfg.engines {
            runs.push(
                run_engine(cfg, kind, &pool)
                    .with_context(|| format!("running {}", kind.label()))?,
            );
        }
    }
    let mut big = Vec::new();
    if cfg.big_keys > 0 {
        for &kind in &cfg.engines {
            let variants: Vec<(String, Option<u64>)> = if kind == EngineKind::Bitcask {
                vec![
                    ("bitcask (64 MiB segments, default)".to_string(), None),
                    (
                        format!("bitcask ({} segments)", bytes(cfg.small_segment_bytes)),
                        Some(cfg.small_segment_bytes),
                    ),
                ]
            } else {
                vec![(kind.label().to_string(), None)]
            };
            for (label, segment) in variants {
                big.push(
                    run_big(cfg, kind, &label, segment, &pool, probe)
                        .with_context(|| format!("restart data set of {label}"))?,
                );
            }
        }
    }
    Ok(tables(cfg, &runs, &big))
}

/// `name` under the work directory, emptied.
fn fresh_dir(cfg: &Config, name: &str) -> Result<PathBuf> {
    let dir = cfg.work_dir.join(name);
    if dir.exists() {
        std::fs::remove_dir_all(&dir)?;
    }
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

/// One progress line on stderr for a measurement.
fn log_measured(what: &str, kind: EngineKind, m: &Measured) {
    let latency = m
        .latency
        .map(|l| format!(", p50 {} µs, p99 {} µs", l.p50_us, l.p99_us))
        .unwrap_or_default();
    let capped = if m.hit_time_cap { " (time cap)" } else { "" };
    eprintln!(
        "  {:<12} {what}: {} ops in {}{capped} = {} ops/s{latency}",
        kind.label(),
        m.ops,
        seconds(m.elapsed),
        count(m.ops_per_sec())
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tiny_run_on_bitcask_fills_every_table() -> Result<()> {
        let work = tempfile::tempdir()?;
        let mut cfg = Config::new(300, work.path().to_path_buf());
        cfg.engines = vec![EngineKind::Bitcask];
        cfg.value_len = 256;
        cfg.small_value_len = 32;
        cfg.reads = Bounds {
            ops: 500,
            time: Duration::from_secs(30),
        };
        cfg.sync = Bounds {
            ops: 40,
            time: Duration::from_secs(30),
        };
        cfg.sync_threads = 4;
        cfg.merge_writes = Bounds {
            ops: 50,
            time: Duration::from_secs(30),
        };
        cfg.big_keys = 200;
        cfg.small_segment_bytes = 4096;
        cfg.probe_runs = 1;
        let probe = |kind: EngineKind, dir: &Path| crate::probe::probe_open(kind, dir, Some(|| 0));
        let tables = run(&cfg, &probe)?;
        let text: String = tables.iter().map(Table::to_markdown).collect();
        for section in ["(a)", "(b)", "(c)", "(d)", "(e)", "(f)", "(g)", "Targets"] {
            assert!(text.contains(section), "missing {section} in\n{text}");
        }
        assert!(text.contains("| bitcask |"));
        // Every data directory was removed.
        assert_eq!(std::fs::read_dir(work.path())?.count(), 0);
        Ok(())
    }
}
