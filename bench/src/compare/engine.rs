//! One engine on the main data set: (b) the load and (a) the reads, (c)
//! and (d) the synced writes, (g) the overwrites and the reclaiming (for
//! bitcask, a merge while one thread keeps writing).

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::Result;

use crate::fsutil::disk_usage;
use crate::report::seconds;
use crate::run::{
    Bounds, Measured, concurrent_writes, random_reads, read_each, sequential_writes, writes_while,
};
use crate::store::bitcask_store::BitcaskStore;
use crate::store::{Durability, EngineKind, Store, open};
use crate::workload::{LOADED_PREFIX, ValuePool, shuffled};

use super::{Config, EngineRun, MergeRun, fresh_dir, log_measured};

/// Results of (b) and (a).
#[derive(Debug)]
struct Loaded {
    load: Measured,
    disk_loaded: u64,
    reads: Vec<(usize, Measured)>,
}

/// Results of (c) and (d), and the reopen before them.
#[derive(Debug)]
struct Synced {
    reopen: Duration,
    sync_big: Measured,
    sync_small: Measured,
}

/// Results of (g).
#[derive(Debug)]
struct Reclaimed {
    overwrites: Vec<Measured>,
    disk_overwritten: u64,
    compact_time: Duration,
    disk_compacted: u64,
    merge: Option<MergeRun>,
}

/// Every section of the main data set on `kind`, in its own directory
/// (deleted afterwards).
pub(super) fn run_engine(cfg: &Config, kind: EngineKind, pool: &ValuePool) -> Result<EngineRun> {
    eprintln!("== {} with {} keys", kind.label(), cfg.keys);
    let dir = fresh_dir(cfg, &format!("{}-main", kind.label()))?;
    let ids = shuffled(cfg.keys, cfg.seed);
    let first = load_and_read(cfg, kind, &dir, &ids, pool)?;
    let loaded = &ids[..first.load.ops as usize];
    let synced = synced_writes(cfg, kind, &dir, pool)?;
    let reclaimed = if kind == EngineKind::Bitcask {
        reclaim_bitcask(cfg, kind, &dir, loaded, pool)?
    } else {
        reclaim(cfg, kind, &dir, loaded, pool)?
    };
    std::fs::remove_dir_all(&dir)?;
    Ok(EngineRun {
        kind,
        load: first.load,
        disk_loaded: first.disk_loaded,
        reads: first.reads,
        reopen: synced.reopen,
        sync_big: synced.sync_big,
        sync_small: synced.sync_small,
        overwrites: reclaimed.overwrites,
        disk_overwritten: reclaimed.disk_overwritten,
        compact_time: reclaimed.compact_time,
        disk_compacted: reclaimed.disk_compacted,
        merge: reclaimed.merge,
    })
}

/// (b) load `ids` without fsync, then (a) reads of the loaded keys.
fn load_and_read(
    cfg: &Config,
    kind: EngineKind,
    dir: &Path,
    ids: &[u64],
    pool: &ValuePool,
) -> Result<Loaded> {
    let store = open(kind, dir, Durability::NoSync)?;
    let load = sequential_writes(
        store.as_ref(),
        ids,
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
    let disk_loaded = disk_usage(dir)?;
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
    Ok(Loaded {
        load,
        disk_loaded,
        reads,
    })
}

/// Reopen with fsync per write; (c) 4 KiB and (d) small values from
/// concurrent writers, on new keys.
fn synced_writes(cfg: &Config, kind: EngineKind, dir: &Path, pool: &ValuePool) -> Result<Synced> {
    let started = Instant::now();
    let store = open(kind, dir, Durability::SyncEachOp)?;
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
    Ok(Synced {
        reopen,
        sync_big,
        sync_small,
    })
}

/// (g) on bitcask: overwrite twice, then merge every sealed file while one
/// thread keeps writing.
fn reclaim_bitcask(
    cfg: &Config,
    kind: EngineKind,
    dir: &Path,
    loaded: &[u64],
    pool: &ValuePool,
) -> Result<Reclaimed> {
    let store = BitcaskStore::open(dir, Durability::NoSync)?;
    let overwrites = overwrite_twice(cfg, kind, &store, loaded, pool)?;
    let disk_overwritten = disk_usage(dir)?;
    let (compact_time, merge) = merge_while_writing(cfg, kind, &store, loaded, pool)?;
    store.flush()?;
    let disk_compacted = disk_usage(dir)?;
    Box::new(store).close()?;
    Ok(Reclaimed {
        overwrites,
        disk_overwritten,
        compact_time,
        disk_compacted,
        merge: Some(merge),
    })
}

/// The writer without a merge (the baseline), then the merge with the
/// writer beside it: the merge's wall time and both measurements.
fn merge_while_writing(
    cfg: &Config,
    kind: EngineKind,
    store: &BitcaskStore,
    loaded: &[u64],
    pool: &ValuePool,
) -> Result<(Duration, MergeRun)> {
    let always = AtomicBool::new(true);
    let baseline_bounds = Bounds {
        ops: cfg.merge_writes.ops,
        time: cfg.merge_baseline_time_max,
    };
    let baseline = writes_while(
        store,
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
            store,
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
    let compact_time = started.elapsed();
    let report = report?;
    let during = during?;
    log_measured("writes during merge", kind, &during);
    eprintln!(
        "  {:<12} merge: {} ({:?})",
        kind.label(),
        seconds(compact_time),
        report.as_ref().map(|r| (r.bytes_before, r.bytes_after))
    );
    Ok((
        compact_time,
        MergeRun {
            baseline,
            during,
            report,
        },
    ))
}

/// (g) on redb and fjall: overwrite twice, then the engine's compaction.
fn reclaim(
    cfg: &Config,
    kind: EngineKind,
    dir: &Path,
    loaded: &[u64],
    pool: &ValuePool,
) -> Result<Reclaimed> {
    let mut store = open(kind, dir, Durability::NoSync)?;
    let overwrites = overwrite_twice(cfg, kind, store.as_ref(), loaded, pool)?;
    store.settle()?;
    let disk_overwritten = disk_usage(dir)?;
    let started = Instant::now();
    store.compact()?;
    let compact_time = started.elapsed();
    store.flush()?;
    let disk_compacted = disk_usage(dir)?;
    eprintln!(
        "  {:<12} compaction: {}",
        kind.label(),
        seconds(compact_time)
    );
    store.close()?;
    Ok(Reclaimed {
        overwrites,
        disk_overwritten,
        compact_time,
        disk_compacted,
        merge: None,
    })
}

/// Two passes overwriting every loaded key, each in a fresh random order.
fn overwrite_twice(
    cfg: &Config,
    kind: EngineKind,
    store: &dyn Store,
    loaded: &[u64],
    pool: &ValuePool,
) -> Result<Vec<Measured>> {
    let mut overwrites = Vec::new();
    for pass in 1..=2u64 {
        let order = shuffled(loaded.len() as u64, cfg.seed + pass);
        let pass_ids: Vec<u64> = order.iter().map(|&i| loaded[i as usize]).collect();
        let m = sequential_writes(
            store,
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
    Ok(overwrites)
}
