//! The targets table: each target of the brief, what was measured, and
//! whether it was met.

use std::time::Duration;

use crate::probe::Probe;
use crate::report::{Table, seconds};
use crate::store::EngineKind;

use super::tables::{median_open, read_rate};
use super::{BigRun, Config, EngineRun};

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

/// fjall's two configurations (inline values, key-value separation).
const FJALLS: [EngineKind; 2] = [EngineKind::Fjall, EngineKind::FjallKvSep];

/// `met`, `NOT met` or `not measured`.
fn verdict(met: Option<bool>) -> String {
    match met {
        Some(true) => "met".to_string(),
        Some(false) => "NOT met".to_string(),
        None => "not measured".to_string(),
    }
}

/// Every target and its verdict.
pub(super) fn targets(cfg: &Config, runs: &[EngineRun], big: &[BigRun]) -> Table {
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
