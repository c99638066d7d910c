//! The comparison's result tables, one function per section, in report
//! order (the targets table is [`super::targets`]).

use std::time::Duration;

use crate::probe::Probe;
use crate::report::{Table, bytes, count, ratio, seconds};
use crate::run::Measured;
use crate::store::EngineKind;

use super::{BigRun, Config, EngineRun, MergeRun, targets::targets};

/// Every table, in report order: (a)–(d) of the main data set, (e) and (f)
/// of the restart data set, (g) and the reopen time, then the targets.
pub(super) fn tables(cfg: &Config, runs: &[EngineRun], big: &[BigRun]) -> Vec<Table> {
    let mut out = Vec::new();
    let bitcask = runs.iter().find(|r| r.kind == EngineKind::Bitcask);
    if !runs.is_empty() {
        out.push(reads_table(cfg, runs, bitcask));
        out.push(load_table(cfg, runs, bitcask));
        out.extend(synced_tables(cfg, runs, bitcask));
    }
    if !big.is_empty() {
        out.push(key_directory_table(cfg, big));
        out.push(restart_table(cfg, big));
    }
    if !runs.is_empty() {
        out.push(disk_table(cfg, runs));
        if let Some(bitcask) = bitcask
            && let Some(m) = &bitcask.merge
        {
            out.push(merge_table(cfg, bitcask, m));
        }
        out.push(reopen_table(cfg, runs));
    }
    out.push(targets(cfg, runs, big));
    out
}

/// (a) Random point reads per reader thread count, and bitcask's ratios.
fn reads_table(cfg: &Config, runs: &[EngineRun], bitcask: Option<&EngineRun>) -> Table {
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
                .map(|&t| ratio(bitcask.map(|b| read_rate(b, t)), Some(read_rate(run, t)))),
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
    table
}

/// (b) The load without fsync.
fn load_table(cfg: &Config, runs: &[EngineRun], bitcask: Option<&EngineRun>) -> Table {
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
            format!("{:.1}", mib_per_sec(&run.load, cfg.value_len)),
            ratio(
                bitcask.map(|b| b.load.ops_per_sec()),
                Some(run.load.ops_per_sec()),
            ),
        ]);
    }
    table
}

/// (c) and (d): writes with fsync per write, 4 KiB and small values.
fn synced_tables(cfg: &Config, runs: &[EngineRun], bitcask: Option<&EngineRun>) -> Vec<Table> {
    let mut tables = Vec::new();
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
                ratio(
                    bitcask.map(|b| pick(b).ops_per_sec()),
                    Some(m.ops_per_sec()),
                ),
            ]);
        }
        table.note(format!("Bound: {} puts over all writers or {} s, whichever first. Latency is per put, as seen by its writer.", cfg.sync.ops, cfg.sync.time.as_secs()));
        tables.push(table);
    }
    tables
}

/// (e) bitcask's key directory: heap and RSS per key.
fn key_directory_table(cfg: &Config, big: &[BigRun]) -> Table {
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
    table
}

/// (f) Restart (open) time, warm and cold.
fn restart_table(cfg: &Config, big: &[BigRun]) -> Table {
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
    table
}

/// (g) Disk use after load, overwrites and reclaiming.
fn disk_table(cfg: &Config, runs: &[EngineRun]) -> Table {
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
    table
}

/// (g) bitcask's writes with and without a merge running.
fn merge_table(cfg: &Config, bitcask: &EngineRun, m: &MergeRun) -> Table {
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
            seconds(bitcask.compact_time),
            ratio(Some(m.during.ops_per_sec()), Some(m.baseline.ops_per_sec())),
        ));
    }
    table
}

/// The in-process reopen time of the main data set.
fn reopen_table(cfg: &Config, runs: &[EngineRun]) -> Table {
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
    table
}

/// The median open time of `probes`.
pub(super) fn median_open(probes: &[Probe]) -> Option<Duration> {
    let mut us: Vec<u64> = probes.iter().map(|p| p.open_us).collect();
    us.sort_unstable();
    us.get(us.len() / 2).map(|&us| Duration::from_micros(us))
}

/// Reads per second of `run` at `threads` reader threads (NaN if not measured).
pub(super) fn read_rate(run: &EngineRun, threads: usize) -> f64 {
    run.reads
        .iter()
        .find(|(t, _)| *t == threads)
        .map_or(f64::NAN, |(_, m)| m.ops_per_sec())
}

/// `yes` when the time cap stopped the measurement.
fn capped(m: &Measured) -> &'static str {
    if m.hit_time_cap { "yes" } else { "no" }
}

/// A latency in µs, or `n/a`.
fn us(v: Option<u64>) -> String {
    v.map(|v| count(v as f64))
        .unwrap_or_else(|| "n/a".to_string())
}

/// Value MiB per second of a write measurement with `value_len`-byte values.
fn mib_per_sec(m: &Measured, value_len: usize) -> f64 {
    m.ops_per_sec() * value_len as f64 / (1024.0 * 1024.0)
}
