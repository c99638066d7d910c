//! The open probe: opens one engine on an existing directory and measures
//! the open time, the heap it keeps (net bytes allocated during the open, as
//! counted by the caller's counting global allocator) and the growth of the
//! resident set. Run in a fresh child process so earlier phases' heap and
//! page-cache state do not blur the numbers; the result is one text line.

use std::path::Path;
use std::time::Instant;

use anyhow::{Context, Result};

use crate::fsutil::rss_bytes;
use crate::store::{Durability, EngineKind, bitcask_store};
use crate::workload::{LOADED_PREFIX, key};

/// Net heap bytes in use (allocated minus freed), from a counting allocator.
pub type NetAllocated = fn() -> i64;

/// Prefix of the probe's output line.
pub const LINE_PREFIX: &str = "PROBE";

/// What one open cost.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Probe {
    /// Wall time of the open, microseconds.
    pub open_us: u64,
    /// Net heap bytes the open left allocated (`None` without a counting
    /// allocator).
    pub alloc_net_bytes: Option<i64>,
    /// Growth of the resident set over the open.
    pub rss_delta_bytes: i64,
    /// Keys in the key directory (bitcask; 0 for the others).
    pub keys: u64,
    /// Sum of key lengths (bitcask; 0 for the others).
    pub key_bytes: u64,
    /// Bytes of the active segment, which the open scans (bitcask; 0 otherwise).
    pub scanned_bytes: u64,
}

impl Probe {
    /// Heap bytes per key beyond the key bytes themselves.
    pub fn heap_bytes_per_key_beyond_key(&self) -> Option<f64> {
        self.alloc_net_bytes
            .map(|heap| (heap as f64 - self.key_bytes as f64) / self.keys.max(1) as f64)
    }

    /// Resident bytes per key beyond the key bytes themselves.
    pub fn rss_bytes_per_key_beyond_key(&self) -> f64 {
        (self.rss_delta_bytes as f64 - self.key_bytes as f64) / self.keys.max(1) as f64
    }

    /// The output line.
    pub fn to_line(&self) -> String {
        format!(
            "{LINE_PREFIX} open_us={} alloc_net_bytes={} rss_delta_bytes={} keys={} key_bytes={} scanned_bytes={}",
            self.open_us,
            self.alloc_net_bytes
                .map_or_else(|| "na".to_string(), |b| b.to_string()),
            self.rss_delta_bytes,
            self.keys,
            self.key_bytes,
            self.scanned_bytes
        )
    }

    /// Parses the output line out of a child's whole stdout.
    pub fn parse(output: &str) -> Result<Probe> {
        let line = output
            .lines()
            .find(|l| l.starts_with(LINE_PREFIX))
            .context("no probe line in the output")?;
        let mut probe = Probe::default();
        for field in line.split_whitespace().skip(1) {
            let (name, value) = field.split_once('=').context("malformed probe field")?;
            match name {
                "open_us" => probe.open_us = value.parse()?,
                "alloc_net_bytes" => {
                    probe.alloc_net_bytes = if value == "na" {
                        None
                    } else {
                        Some(value.parse()?)
                    }
                }
                "rss_delta_bytes" => probe.rss_delta_bytes = value.parse()?,
                "keys" => probe.keys = value.parse()?,
                "key_bytes" => probe.key_bytes = value.parse()?,
                "scanned_bytes" => probe.scanned_bytes = value.parse()?,
                _ => {}
            }
        }
        Ok(probe)
    }
}

/// Opens `kind` on `dir` (which holds the loaded data set), measures, checks
/// that key 0 of the data set is there, and closes. Without a counting
/// allocator (`None`) the heap figure is left out.
pub fn probe_open(
    kind: EngineKind,
    dir: &Path,
    net_allocated: Option<NetAllocated>,
) -> Result<Probe> {
    let net_allocated = || net_allocated.map(|count| count());
    let rss_before = rss_bytes()?;
    let alloc_before = net_allocated();
    let heap_kept = |before: Option<i64>| Some(net_allocated()? - before?);
    let started = Instant::now();
    let mut probe = Probe::default();
    match kind {
        EngineKind::Bitcask => {
            let engine = bitcask::Engine::open(dir, bitcask_store::options(Durability::NoSync))?;
            probe.open_us = started.elapsed().as_micros() as u64;
            probe.alloc_net_bytes = heap_kept(alloc_before);
            probe.rss_delta_bytes = rss_bytes()? as i64 - rss_before as i64;
            let stats = engine.stats();
            probe.keys = stats.keys;
            probe.key_bytes = stats.key_bytes;
            probe.scanned_bytes = stats
                .files
                .iter()
                .filter(|f| !f.sealed)
                .map(|f| f.total_bytes)
                .sum();
            engine
                .get(&key(LOADED_PREFIX, 0), 0)?
                .context("key 0 missing after open")?;
            engine.close()?;
        }
        other => {
            let store = crate::store::open(other, dir, Durability::NoSync)?;
            probe.open_us = started.elapsed().as_micros() as u64;
            probe.alloc_net_bytes = heap_kept(alloc_before);
            probe.rss_delta_bytes = rss_bytes()? as i64 - rss_before as i64;
            store
                .reader()?
                .get(&key(LOADED_PREFIX, 0))?
                .context("key 0 missing after open")?;
            store.close()?;
        }
    }
    Ok(probe)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_lines_round_trip() -> Result<()> {
        let probe = Probe {
            open_us: 5,
            alloc_net_bytes: Some(-3),
            rss_delta_bytes: 7,
            keys: 2,
            key_bytes: 50,
            scanned_bytes: 9,
        };
        assert_eq!(
            Probe::parse(&format!("noise\n{}\n", probe.to_line()))?,
            probe
        );
        Ok(())
    }

    #[test]
    fn probe_opens_a_bitcask_directory() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let engine = bitcask::Engine::open(dir.path(), bitcask_store::options(Durability::NoSync))?;
        engine.put(&key(LOADED_PREFIX, 0), b"v")?;
        engine.close()?;
        let probe = probe_open(EngineKind::Bitcask, dir.path(), None)?;
        assert_eq!(probe.keys, 1);
        assert_eq!(probe.alloc_net_bytes, None);
        assert_eq!(Probe::parse(&probe.to_line())?, probe);
        assert_eq!(probe.key_bytes, 25);
        Ok(())
    }
}
