//! The restart/memory data set of one engine variant: build it, then the
//! caller's probe measures (e) the key directory and (f) the open time,
//! warm and with the pages dropped.

use anyhow::Result;

use crate::fsutil::{disk_usage, drop_page_cache};
use crate::probe::Probe;
use crate::run::sequential_writes;
use crate::store::bitcask_store::{self, BitcaskStore};
use crate::store::{Durability, EngineKind, Store, open};
use crate::workload::{LOADED_PREFIX, ValuePool, shuffled};

use super::{BigRun, Config, ProbeFn, fresh_dir, log_measured};

/// Builds the data set of `label` (bitcask with `segment_bytes` segments
/// when given) and probes its open `cfg.probe_runs` times warm and cold.
pub(super) fn run_big(
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
