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
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use crate::fsutil::{disk_usage, drop_page_cache};
use crate::probe::Probe;
use crate::report::{Table, bytes, count, ratio, seconds};
use crate::run::{
    Bounds, Measured, concurrent_writes, random_reads, read_each, sequential_writes, writes_while,
};
use crate::store::bitcask_store::{self, BitcaskStore};
use crate::store::{Durability, EngineKind, Store, open};
use crate::workload::{LOADED_PREFIX, VALUE_POOL_SIZE_BYTES, ValuePool, shuffled};

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

fn fresh_dir(cfg: &Config, name: &str) -> Result<PathBuf> {
    let dir = cfg.work_dir.join(name);
    if dir.exists() {
        std::fs::remove_dir_all(&dir)?;
    }
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

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

fn run_engine(cfg: &Config, kind: EngineKind, pool: &ValuePool) -> Result<EngineRun> {
    eprintln!("== {} with {} keys", kind.label(), cfg.keys);
    let dir = fresh_dir(cfg, &format!("{}-main", kind.label()))?;
    let ids = shuffled(cfg.keys, cfg.seed);

    // (b) load without fsync, then (a) reads.
    let mut store = open(kind, &dir, Durability::NoSync)?;
    let load = sequential_writes(
        store.as_ref(),
        &ids,
        LOADED_PREFIX,
        pool,
        cfg.value_len,
        0,
        cfg.load_time_max,
        true,
    )?;
    log_measured("load (no fsync)", kind, &load);
    store.settle()?;
    let loaded = &ids[..load.ops as usize];
    let disk_loaded = disk_usage(&dir)?;
    // Untimed: every key read once, so each engine's own cache is as warm as
    // the OS page cache bitcask reads from; then let background work finish.
    let warmup = read_each(
        store.as_ref(),
        loaded,
        LOADED_PREFIX,
        cfg.value_len,
        cfg.load_time_max,
    )?;
    log_measured("warm-up reads (untimed)", kind, &warmup);
    store.settle()?;
    let mut reads = Vec::new();
    for &threads in &cfg.read_threads {
        let measured = random_reads(
            store.as_ref(),
            loaded,
            LOADED_PREFIX,
            cfg.value_len,
            threads,
            cfg.reads,
            cfg.seed ^ threads as u64,
        )?;
        log_measured(&format!("reads x{threads}"), kind, &measured);
        reads.push((threads, measured));
    }
    store.close()?;

    // (c), (d) with fsync per write.
    let started = Instant::now();
    store = open(kind, &dir, Durability::SyncEachOp)?;
    let reopen = started.elapsed();
    eprintln!("  {:<12} reopen: {}", kind.label(), seconds(reopen));
    let sync_big = concurrent_writes(
        store.as_ref(),
        cfg.sync_threads,
        b"s4k:",
        0,
        pool,
        cfg.value_len,
        cfg.sync,
    )?;
    log_measured("synced writes 4 KiB", kind, &sync_big);
    let sync_small = concurrent_writes(
        store.as_ref(),
        cfg.sync_threads,
        b"s256:",
        0,
        pool,
        cfg.small_value_len,
        cfg.sync,
    )?;
    log_measured("synced writes 256 B", kind, &sync_small);
    store.close()?;

    // (g) overwrite twice, then reclaim.
    let mut overwrites = Vec::new();
    let mut merge = None;
    let (compact_time, disk_overwritten, disk_compacted);
    if kind == EngineKind::Bitcask {
        let store = BitcaskStore::open(&dir, Durability::NoSync)?;
        for pass in 1..=2u64 {
            let order = shuffled(loaded.len() as u64, cfg.seed + pass);
            let pass_ids: Vec<u64> = order.iter().map(|&i| loaded[i as usize]).collect();
            let m = sequential_writes(
                &store,
                &pass_ids,
                LOADED_PREFIX,
                pool,
                cfg.value_len,
                pass,
                cfg.load_time_max,
                true,
            )?;
            log_measured(&format!("overwrite pass {pass}"), kind, &m);
            overwrites.push(m);
        }
        disk_overwritten = disk_usage(&dir)?;
        let always = AtomicBool::new(true);
        let baseline_bounds = Bounds {
            ops: cfg.merge_writes.ops,
            time: cfg.merge_baseline_time_max,
        };
        let baseline = writes_while(
            &store,
            &always,
            loaded,
            LOADED_PREFIX,
            pool,
            cfg.value_len,
            baseline_bounds,
            cfg.seed + 10,
        )?;
        log_measured("writes, no merge", kind, &baseline);
        let running = AtomicBool::new(true);
        let started = Instant::now();
        let (report, during) = std::thread::scope(|scope| {
            let merger = scope.spawn(|| {
                let report = store.merge_sealed();
                running.store(false, Ordering::SeqCst);
                report
            });
            let during = writes_while(
                &store,
                &running,
                loaded,
                LOADED_PREFIX,
                pool,
                cfg.value_len,
                cfg.merge_writes,
                cfg.seed + 11,
            );
            (merger.join().expect("merge thread panicked"), during)
        });
        compact_time = started.elapsed();
        let report = report?;
        let during = during?;
        log_measured("writes during merge", kind, &during);
        eprintln!(
            "  {:<12} merge: {} ({:?})",
            kind.label(),
            seconds(compact_time),
            report.as_ref().map(|r| (r.bytes_before, r.bytes_after))
        );
        store.flush()?;
        disk_compacted = disk_usage(&dir)?;
        Box::new(store).close()?;
        merge = Some(MergeRun {
            baseline,
            during,
            report,
        });
    } else {
        let mut store = open(kind, &dir, Durability::NoSync)?;
        for pass in 1..=2u64 {
            let order = shuffled(loaded.len() as u64, cfg.seed + pass);
            let pass_ids: Vec<u64> = order.iter().map(|&i| loaded[i as usize]).collect();
            let m = sequential_writes(
                store.as_ref(),
                &pass_ids,
                LOADED_PREFIX,
                pool,
                cfg.value_len,
                pass,
                cfg.load_time_max,
                true,
            )?;
            log_measured(&format!("overwrite pass {pass}"), kind, &m);
            overwrites.push(m);
        }
        store.settle()?;
        disk_overwritten = disk_usage(&dir)?;
        let started = Instant::now();
        store.compact()?;
        compact_time = started.elapsed();
        store.flush()?;
        disk_compacted = disk_usage(&dir)?;
        eprintln!(
            "  {:<12} compaction: {}",
            kind.label(),
            seconds(compact_time)
        );
        store.close()?;
    }
    std::fs::remove_dir_all(&dir)?;
    Ok(EngineRun {
        kind,
        load,
        disk_loaded,
        reads,
        reopen,
        sync_big,
        sync_small,
        overwrites,
        disk_overwritten,
        compact_time,
        disk_compacted,
        merge,
    })
}

fn run_big(
    cfg: &Config,
    kind: EngineKind,
    label: &str,
    segment_bytes: Option<u64>,
    pool: &ValuePool,
    probe: ProbeFn<'_>,
) -> Result<BigRun> {
    eprintln!(
        "== restart data set: {label}, {} keys of {} B",
        cfg.big_keys, cfg.big_value_len
    );
    let dir = fresh_dir(cfg, &format!("{}-restart", kind.label()))?;
    let ids = shuffled(cfg.big_keys, cfg.seed ^ 0xb16);
    let store: Box<dyn Store> = match segment_bytes {
        Some(segment_size_bytes) => {
            let options = bitcask::Options {
                segment_size_bytes,
                ..bitcask_store::options(Durability::NoSync)
            };
            Box::new(BitcaskStore::from_engine(bitcask::Engine::open(
                &dir, options,
            )?))
        }
        None => open(kind, &dir, Durability::NoSync)?,
    };
    let build = sequential_writes(
        store.as_ref(),
        &ids,
        LOADED_PREFIX,
        pool,
        cfg.big_value_len,
        7,
        cfg.load_time_max,
        true,
    )?;
    log_measured("build", kind, &build);
    store.settle()?;
    store.close()?;
    let disk = disk_usage(&dir)?;
    let mut warm = Vec::new();
    let mut cold = Vec::new();
    for _ in 0..cfg.probe_runs {
        warm.push(probe(kind, &dir)?);
    }
    for _ in 0..cfg.probe_runs {
        drop_page_cache(&dir)?;
        cold.push(probe(kind, &dir)?);
    }
    let show = |probes: &[Probe]| {
        probes
            .iter()
            .map(|p| p.open_us.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    };
    eprintln!(
        "  {label}: open µs warm [{}], cold [{}]",
        show(&warm),
        show(&cold)
    );
    std::fs::remove_dir_all(&dir)?;
    Ok(BigRun {
        kind,
        label: label.to_string(),
        build,
        disk,
        warm,
        cold,
    })
}

fn median_open(probes: &[Probe]) -> Option<Duration> {
    let mut us: Vec<u64> = probes.iter().map(|p| p.open_us).collect();
    us.sort_unstable();
    us.get(us.len() / 2).map(|&us| Duration::from_micros(us))
}

/// The fastest of `kinds` by `metric`.
fn best(
    runs: &[EngineRun],
    kinds: &[EngineKind],
    metric: impl Fn(&EngineRun) -> f64,
) -> Option<f64> {
    runs.iter()
        .filter(|r| kinds.contains(&r.kind))
        .map(metric)
        .fold(None, |acc, v| Some(acc.map_or(v, |a: f64| a.max(v))))
}

const FJALLS: [EngineKind; 2] = [EngineKind::Fjall, EngineKind::FjallKvSep];

fn read_rate(run: &EngineRun, threads: usize) -> f64 {
    run.reads
        .iter()
        .find(|(t, _)| *t == threads)
        .map_or(f64::NAN, |(_, m)| m.ops_per_sec())
}

fn capped(m: &Measured) -> &'static str {
    if m.hit_time_cap { "yes" } else { "no" }
}

fn us(v: Option<u64>) -> String {
    v.map(|v| count(v as f64))
        .unwrap_or_else(|| "n/a".to_string())
}

fn tables(cfg: &Config, runs: &[EngineRun], big: &[BigRun]) -> Vec<Table> {
    let mut out = Vec::new();
    let bitcask = runs.iter().find(|r| r.kind == EngineKind::Bitcask);
    let of = |metric: &dyn Fn(&EngineRun) -> f64| bitcask.map(metric);
    let mb =
        |m: &Measured, value_len: usize| m.ops_per_sec() * value_len as f64 / (1024.0 * 1024.0);

    if !runs.is_empty() {
        // (a)
        let mut headers = vec!["engine".to_string()];
        for t in &cfg.read_threads {
            headers.push(format!(
                "{t} thread{} ops/s",
                if *t == 1 { "" } else { "s" }
            ));
        }
        for t in &cfg.read_threads {
            headers.push(format!("bitcask ÷ engine ({t}T)"));
        }
        let mut table = Table {
            title: format!(
                "(a) Random point reads, {} keys, {} B values",
                cfg.keys, cfg.value_len
            ),
            headers,
            ..Table::default()
        };
        for run in runs {
            let mut row = vec![run.kind.label().to_string()];
            row.extend(cfg.read_threads.iter().map(|&t| count(read_rate(run, t))));
            row.extend(
                cfg.read_threads
                    .iter()
                    .map(|&t| ratio(of(&|b| read_rate(b, t)), Some(read_rate(run, t)))),
            );
            table.row(row);
        }
        table.note(format!("Each cell: {} reads over all threads or {} s, whichever first; uniform random keys of the loaded set; every value's length is checked. Before them, an untimed pass read every key once.", cfg.reads.ops, cfg.reads.time.as_secs()));
        let capped_any: Vec<String> = runs
            .iter()
            .flat_map(|r| {
                r.reads
                    .iter()
                    .filter(|(_, m)| m.hit_time_cap)
                    .map(move |(t, _)| format!("{} ({t}T)", r.kind.label()))
            })
            .collect();
        if !capped_any.is_empty() {
            table.note(format!(
                "Stopped by the time cap: {}.",
                capped_any.join(", ")
            ));
        }
        out.push(table);

        // (b)
        let mut table = Table::new(
            format!(
                "(b) Writes without fsync: load of {} keys, {} B values, 1 thread, random key order",
                cfg.keys, cfg.value_len
            ),
            &[
                "engine",
                "puts",
                "time (incl. final flush)",
                "ops/s",
                "value MiB/s",
                "bitcask ÷ engine",
            ],
        );
        for run in runs {
            table.row(vec![
                run.kind.label().to_string(),
                count(run.load.ops as f64),
                seconds(run.load.elapsed),
                count(run.load.ops_per_sec()),
                format!("{:.1}", mb(&run.load, cfg.value_len)),
                ratio(of(&|b| b.load.ops_per_sec()), Some(run.load.ops_per_sec())),
            ]);
        }
        out.push(table);

        // (c), (d)
        for (section, value_len, pick) in [
            (
                "(c)",
                cfg.value_len,
                (|r: &EngineRun| &r.sync_big) as fn(&EngineRun) -> &Measured,
            ),
            ("(d)", cfg.small_value_len, |r: &EngineRun| &r.sync_small),
        ] {
            let mut table = Table::new(
                format!(
                    "{section} Writes with fsync per write, {} concurrent writers, {value_len} B values, new keys",
                    cfg.sync_threads
                ),
                &[
                    "engine",
                    "puts",
                    "time",
                    "ops/s",
                    "p50 µs",
                    "p99 µs",
                    "max µs",
                    "time-capped",
                    "bitcask ÷ engine",
                ],
            );
            for run in runs {
                let m = pick(run);
                table.row(vec![
                    run.kind.label().to_string(),
                    count(m.ops as f64),
                    seconds(m.elapsed),
                    count(m.ops_per_sec()),
                    us(m.latency.map(|l| l.p50_us)),
                    us(m.latency.map(|l| l.p99_us)),
                    us(m.latency.map(|l| l.max_us)),
                    capped(m).to_string(),
                    ratio(of(&|b| pick(b).ops_per_sec()), Some(m.ops_per_sec())),
                ]);
            }
            table.note(format!("Bound: {} puts over all writers or {} s, whichever first. Latency is per put, as seen by its writer.", cfg.sync.ops, cfg.sync.time.as_secs()));
            out.push(table);
        }
    }

    if !big.is_empty() {
        // (e)
        let mut table = Table::new(
            format!(
                "(e) bitcask key directory at {} keys (25 B keys, {} B values)",
                cfg.big_keys, cfg.big_value_len
            ),
            &[
                "data set",
                "keys",
                "key bytes",
                "heap kept by open",
                "heap B/key beyond key",
                "RSS growth",
                "RSS B/key beyond key",
            ],
        );
        for run in big.iter().filter(|b| b.kind == EngineKind::Bitcask) {
            if let Some(p) = run.warm.first() {
                table.row(vec![
                    run.label.clone(),
                    count(p.keys as f64),
                    bytes(p.key_bytes),
                    p.alloc_net_bytes
                        .map_or_else(|| "n/a".to_string(), |b| bytes(b.max(0) as u64)),
                    p.heap_bytes_per_key_beyond_key()
                        .map_or_else(|| "n/a".to_string(), |v| format!("{v:.1}")),
                    bytes(p.rss_delta_bytes.max(0) as u64),
                    format!("{:.1}", p.rss_bytes_per_key_beyond_key()),
                ]);
            }
        }
        table.note("Heap: net bytes requested from the allocator during `Engine::open` (a counting `#[global_allocator]` around `System`, in a fresh process), minus the key bytes, per key. RSS: growth of the resident set over the same open, which also counts malloc's per-chunk overhead and rounding.");
        out.push(table);

        // (f)
        let mut table = Table::new(
            format!(
                "(f) Restart (open) time at {} keys, {} B values",
                cfg.big_keys, cfg.big_value_len
            ),
            &[
                "engine / data set",
                "build ops/s (no fsync)",
                "on disk",
                "scanned at open (active segment)",
                "open, warm cache",
                "open, cold cache",
            ],
        );
        for run in big {
            let scanned = run.warm.first().map(|p| p.scanned_bytes).unwrap_or(0);
            table.row(vec![
                run.label.clone(),
                count(run.build.ops_per_sec()),
                bytes(run.disk),
                if run.kind == EngineKind::Bitcask {
                    bytes(scanned)
                } else {
                    "n/a".to_string()
                },
                median_open(&run.warm).map(seconds).unwrap_or_default(),
                median_open(&run.cold).map(seconds).unwrap_or_default(),
            ]);
        }
        table.note(format!("Median of {} opens each, each in a fresh process (open until ready to serve; redb/fjall: database and table/keyspace). Cold: the data set's files dropped from the page cache first (`dd iflag=nocache count=0` on every file).", cfg.probe_runs));
        out.push(table);
    }

    if !runs.is_empty() {
        // (g)
        let mut table = Table::new(
            format!(
                "(g) Disk use: {} keys × {} B, then every key overwritten twice, then space reclaimed",
                cfg.keys, cfg.value_len
            ),
            &[
                "engine",
                "after load",
                "after 2 overwrites",
                "overwrite ops/s (pass 1, 2)",
                "reclaim",
                "reclaim time",
                "after reclaim",
            ],
        );
        for run in runs {
            let passes = run
                .overwrites
                .iter()
                .map(|m| count(m.ops_per_sec()))
                .collect::<Vec<_>>()
                .join(", ");
            let how = match run.kind {
                EngineKind::Bitcask => "merge of all sealed files",
                EngineKind::Redb => "Database::compact",
                EngineKind::Fjall | EngineKind::FjallKvSep => "major_compact",
            };
            table.row(vec![
                run.kind.label().to_string(),
                bytes(run.disk_loaded),
                bytes(run.disk_overwritten),
                passes,
                how.to_string(),
                seconds(run.compact_time),
                bytes(run.disk_compacted),
            ]);
        }
        let key_len = crate::workload::KEY_SIZE_BYTES as u64;
        let live = |run: &EngineRun| {
            (run.load.ops + run.sync_big.ops) * (key_len + cfg.value_len as u64)
                + run.sync_small.ops * (key_len + cfg.small_value_len as u64)
        };
        let live_all = runs.iter().map(live).max().unwrap_or(0);
        table.note(format!("Live data: {} (keys + values of the loaded keys and of those (c) and (d) added). Disk use is allocated blocks (`du`). bitcask's figure after the merge includes what the concurrent writer below wrote meanwhile.", bytes(live_all)));
        out.push(table);

        if let Some(m) = bitcask.and_then(|b| b.merge.as_ref()) {
            let mut table = Table::new(
                format!(
                    "(g) bitcask writes ({} B overwrites, no fsync, 1 thread) with and without a merge running",
                    cfg.value_len
                ),
                &["", "puts", "time", "ops/s", "p50 µs", "p99 µs", "max µs"],
            );
            for (label, x) in [("no merge", &m.baseline), ("merge running", &m.during)] {
                table.row(vec![
                    label.to_string(),
                    count(x.ops as f64),
                    seconds(x.elapsed),
                    count(x.ops_per_sec()),
                    us(x.latency.map(|l| l.p50_us)),
                    us(x.latency.map(|l| l.p99_us)),
                    us(x.latency.map(|l| l.max_us)),
                ]);
            }
            if let Some(report) = &m.report {
                table.note(format!(
                    "Merge: {} inputs ({}) → {} outputs ({}), {} records kept, {} wall time. Writes during merge / without: {}.",
                    report.inputs.len(),
                    bytes(report.bytes_before),
                    report.outputs.len(),
                    bytes(report.bytes_after),
                    count(report.records_kept as f64),
                    seconds(bitcask.map(|b| b.compact_time).unwrap_or_default()),
                    ratio(Some(m.during.ops_per_sec()), Some(m.baseline.ops_per_sec())),
                ));
            }
            out.push(table);
        }

        let mut table = Table::new(
            format!(
                "Reopen at {} keys × {} B (warm cache, in process)",
                cfg.keys, cfg.value_len
            ),
            &["engine", "open"],
        );
        for run in runs {
            table.row(vec![run.kind.label().to_string(), seconds(run.reopen)]);
        }
        out.push(table);
    }

    out.push(targets(cfg, runs, big));
    out
}

fn verdict(met: Option<bool>) -> String {
    match met {
        Some(true) => "met".to_string(),
        Some(false) => "NOT met".to_string(),
        None => "not measured".to_string(),
    }
}

fn targets(cfg: &Config, runs: &[EngineRun], big: &[BigRun]) -> Table {
    let mut table = Table::new("Targets", &["target", "measured", "verdict"]);
    let bitcask = runs.iter().find(|r| r.kind == EngineKind::Bitcask);
    let others = [EngineKind::Redb, EngineKind::Fjall, EngineKind::FjallKvSep];
    let cmp = |need: f64, b: Option<f64>, other: Option<f64>| -> (String, Option<bool>) {
        match (b, other) {
            (Some(b), Some(o)) if o > 0.0 => (format!("{:.2}×", b / o), Some(b / o >= need)),
            _ => ("n/a".to_string(), None),
        }
    };
    for &t in &cfg.read_threads {
        let (m, ok) = cmp(
            1.5,
            bitcask.map(|b| read_rate(b, t)),
            best(runs, &others, |r| read_rate(r, t)),
        );
        table.row(vec![
            format!("4 KiB random reads ({t}T) ≥ 1.5× the faster of redb and fjall"),
            m,
            verdict(ok),
        ]);
    }
    let (m, ok) = cmp(
        2.0,
        bitcask.map(|b| b.load.ops_per_sec()),
        best(runs, &FJALLS, |r| r.load.ops_per_sec()),
    );
    table.row(vec![
        "4 KiB unsynced writes ≥ 2× fjall".to_string(),
        m,
        verdict(ok),
    ]);
    let (m, ok) = cmp(
        2.0,
        bitcask.map(|b| b.sync_big.ops_per_sec()),
        best(runs, &FJALLS, |r| r.sync_big.ops_per_sec()),
    );
    table.row(vec![
        format!(
            "synced 4 KiB writes, {} writers ≥ 2× fjall",
            cfg.sync_threads
        ),
        m,
        verdict(ok),
    ]);
    let (m, ok) = cmp(
        5.0,
        bitcask.map(|b| b.sync_big.ops_per_sec()),
        best(runs, &[EngineKind::Redb], |r| r.sync_big.ops_per_sec()),
    );
    table.row(vec![
        format!(
            "synced 4 KiB writes, {} writers ≥ 5× redb",
            cfg.sync_threads
        ),
        m,
        verdict(ok),
    ]);
    let default_bitcask = big.iter().find(|b| b.kind == EngineKind::Bitcask);
    let per_key = default_bitcask
        .and_then(|b| b.warm.first())
        .and_then(Probe::heap_bytes_per_key_beyond_key);
    table.row(vec![
        "≤ 64 B of index per key beyond the key (heap, counting allocator)".to_string(),
        per_key
            .map(|v| format!("{v:.1} B"))
            .unwrap_or_else(|| "n/a".to_string()),
        verdict(per_key.map(|v| v <= 64.0)),
    ]);
    let rss = default_bitcask
        .and_then(|b| b.warm.first())
        .map(Probe::rss_bytes_per_key_beyond_key);
    table.row(vec![
        "(same, by resident-set growth, malloc overhead included)".to_string(),
        rss.map(|v| format!("{v:.1} B"))
            .unwrap_or_else(|| "n/a".to_string()),
        verdict(rss.map(|v| v <= 64.0)),
    ]);
    for (label, probes) in [
        ("warm", default_bitcask.map(|b| &b.warm)),
        ("cold", default_bitcask.map(|b| &b.cold)),
    ] {
        let open = probes.and_then(|p| median_open(p));
        table.row(vec![
            format!(
                "{} M-key restart ≤ 1 s ({label} cache, default segments)",
                cfg.big_keys as f64 / 1e6
            ),
            open.map(seconds).unwrap_or_else(|| "n/a".to_string()),
            verdict(open.map(|d| d <= Duration::from_secs(1))),
        ]);
    }
    table.note("Ratios against fjall use the faster of its two configurations (inline values, key-value separation).");
    table
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
