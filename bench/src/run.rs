//! Bounded, timed loops: every loop stops at an operation count or a time
//! cap, whichever comes first, and reports which.
//!
//! Key building and value selection cost the same for every engine (a
//! 25-byte stack buffer and a slice of a pre-filled random buffer).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use hdrhistogram::Histogram;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::store::Store;
use crate::workload::{ValuePool, key, splitmix64};

/// Largest latency the histograms hold: 60 s, in microseconds.
const LATENCY_US_MAX: u64 = 60_000_000;

/// Stop after `ops` operations or `time`, whichever comes first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bounds {
    /// Operations at most (over all threads).
    pub ops: u64,
    /// Wall time at most.
    pub time: Duration,
}

/// Latency percentiles in microseconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Latency {
    /// Median.
    pub p50_us: u64,
    /// 99th percentile.
    pub p99_us: u64,
    /// Largest.
    pub max_us: u64,
}

/// What one loop did.
#[derive(Clone, Debug)]
pub struct Measured {
    /// Operations completed.
    pub ops: u64,
    /// Wall time of the loop (including a final flush, where asked).
    pub elapsed: Duration,
    /// Per-operation latency, where recorded.
    pub latency: Option<Latency>,
    /// Whether the time cap ended the loop before the operation count.
    pub hit_time_cap: bool,
}

impl Measured {
    /// Operations per second.
    pub fn ops_per_sec(&self) -> f64 {
        self.ops as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, LATENCY_US_MAX, 3).expect("valid histogram bounds")
}

fn latency_of(hist: &Histogram<u64>) -> Option<Latency> {
    (!hist.is_empty()).then(|| Latency {
        p50_us: hist.value_at_quantile(0.50),
        p99_us: hist.value_at_quantile(0.99),
        max_us: hist.max(),
    })
}

/// Writes `prefix`+`id` for each id in order, one thread, values of
/// `value_len` bytes (value number `splitmix64(id ^ value_seed)`), then
/// flushes if `flush_at_end` (the flush is timed).
#[allow(clippy::too_many_arguments)]
pub fn sequential_writes(
    store: &dyn Store,
    ids: &[u64],
    prefix: &[u8],
    pool: &ValuePool,
    value_len: usize,
    value_seed: u64,
    time_cap: Duration,
    flush_at_end: bool,
) -> Result<Measured> {
    let started = Instant::now();
    let mut ops = 0u64;
    let mut hit_time_cap = false;
    for &id in ids {
        if ops.is_multiple_of(256) && started.elapsed() >= time_cap {
            hit_time_cap = true;
            break;
        }
        store.put(
            &key(prefix, id),
            pool.value(splitmix64(id ^ value_seed), value_len),
        )?;
        ops += 1;
    }
    if flush_at_end {
        store.flush()?;
    }
    Ok(Measured {
        ops,
        elapsed: started.elapsed(),
        latency: None,
        hit_time_cap,
    })
}

/// Point reads of uniformly random keys among `prefix`+`ids` from `threads`
/// threads, `bounds.ops` reads over all threads. Fails if a key is missing
/// or a value has the wrong length.
pub fn random_reads(
    store: &dyn Store,
    ids: &[u64],
    prefix: &[u8],
    value_len: usize,
    threads: usize,
    bounds: Bounds,
    seed: u64,
) -> Result<Measured> {
    if ids.is_empty() {
        bail!("no keys to read");
    }
    let per_thread = bounds.ops / threads as u64;
    let started = Instant::now();
    let results: Vec<Result<(u64, bool)>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                scope.spawn(move || -> Result<(u64, bool)> {
                    let mut rng = SmallRng::seed_from_u64(seed ^ splitmix64(t as u64));
                    let mut reader = store.reader()?;
                    let mut done = 0u64;
                    while done < per_thread {
                        if done.is_multiple_of(256) && started.elapsed() >= bounds.time {
                            return Ok((done, true));
                        }
                        let id = ids[rng.random_range(0..ids.len())];
                        let k = key(prefix, id);
                        match reader.get(&k)? {
                            Some(len) if len == value_len => {}
                            Some(len) => {
                                bail!("{}: value of {len} bytes, expected {value_len}", show(&k))
                            }
                            None => bail!("{}: missing", show(&k)),
                        }
                        done += 1;
                    }
                    Ok((done, false))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("reader thread panicked"))
            .collect()
    });
    let elapsed = started.elapsed();
    let mut ops = 0;
    let mut hit_time_cap = false;
    for result in results {
        let (done, capped) = result?;
        ops += done;
        hit_time_cap |= capped;
    }
    Ok(Measured {
        ops,
        elapsed,
        latency: None,
        hit_time_cap,
    })
}

/// Reads every key `prefix`+`ids` once, in order, one thread (an untimed
/// warm-up that also checks the load: fails on a missing key or a value of
/// the wrong length).
pub fn read_each(
    store: &dyn Store,
    ids: &[u64],
    prefix: &[u8],
    value_len: usize,
    time_cap: Duration,
) -> Result<Measured> {
    let started = Instant::now();
    let mut reader = store.reader()?;
    let mut ops = 0u64;
    for &id in ids {
        if ops.is_multiple_of(256) && started.elapsed() >= time_cap {
            return Ok(Measured {
                ops,
                elapsed: started.elapsed(),
                latency: None,
                hit_time_cap: true,
            });
        }
        let k = key(prefix, id);
        match reader.get(&k)? {
            Some(len) if len == value_len => {}
            Some(len) => bail!("{}: value of {len} bytes, expected {value_len}", show(&k)),
            None => bail!("{}: missing", show(&k)),
        }
        ops += 1;
    }
    Ok(Measured {
        ops,
        elapsed: started.elapsed(),
        latency: None,
        hit_time_cap: false,
    })
}

/// `threads` writers putting new keys `prefix`+`first_id..`, sharing one
/// budget of `bounds.ops` puts; records each put's latency.
pub fn concurrent_writes(
    store: &dyn Store,
    threads: usize,
    prefix: &[u8],
    first_id: u64,
    pool: &ValuePool,
    value_len: usize,
    bounds: Bounds,
) -> Result<Measured> {
    let next = AtomicU64::new(0);
    let capped = AtomicBool::new(false);
    let started = Instant::now();
    let results: Vec<Result<Histogram<u64>>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(|| -> Result<Histogram<u64>> {
                    let mut hist = new_histogram();
                    loop {
                        if started.elapsed() >= bounds.time {
                            capped.store(true, Ordering::Relaxed);
                            break;
                        }
                        let n = next.fetch_add(1, Ordering::Relaxed);
                        if n >= bounds.ops {
                            break;
                        }
                        let id = first_id + n;
                        let k = key(prefix, id);
                        let value = pool.value(splitmix64(id), value_len);
                        let op_started = Instant::now();
                        store.put(&k, value)?;
                        hist.saturating_record(op_started.elapsed().as_micros() as u64);
                    }
                    Ok(hist)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("writer thread panicked"))
            .collect()
    });
    let elapsed = started.elapsed();
    let mut all = new_histogram();
    for result in results {
        all.add(result?).expect("same histogram bounds");
    }
    Ok(Measured {
        ops: all.len(),
        elapsed,
        latency: latency_of(&all),
        hit_time_cap: capped.load(Ordering::Relaxed),
    })
}

/// One thread overwriting random keys among `prefix`+`ids` while `running`
/// stays true (and within `bounds`); records each put's latency.
#[allow(clippy::too_many_arguments)]
pub fn writes_while(
    store: &dyn Store,
    running: &AtomicBool,
    ids: &[u64],
    prefix: &[u8],
    pool: &ValuePool,
    value_len: usize,
    bounds: Bounds,
    seed: u64,
) -> Result<Measured> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut hist = new_histogram();
    let started = Instant::now();
    let mut hit_time_cap = false;
    while running.load(Ordering::Relaxed) && hist.len() < bounds.ops {
        if started.elapsed() >= bounds.time {
            hit_time_cap = true;
            break;
        }
        let id = ids[rng.random_range(0..ids.len())];
        let value = pool.value(rng.random(), value_len);
        let op_started = Instant::now();
        store.put(&key(prefix, id), value)?;
        hist.saturating_record(op_started.elapsed().as_micros() as u64);
    }
    Ok(Measured {
        ops: hist.len(),
        elapsed: started.elapsed(),
        latency: latency_of(&hist),
        hit_time_cap,
    })
}

fn show(key: &[u8]) -> String {
    String::from_utf8_lossy(key).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{Durability, EngineKind, open};

    fn bounds(ops: u64) -> Bounds {
        Bounds {
            ops,
            time: Duration::from_secs(60),
        }
    }

    #[test]
    fn loops_on_bitcask_count_and_verify() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let pool = ValuePool::new(1, 1 << 20);
        let ids: Vec<u64> = (0..300).collect();
        let store = open(EngineKind::Bitcask, dir.path(), Durability::NoSync)?;
        let load = sequential_writes(
            store.as_ref(),
            &ids,
            b"user:",
            &pool,
            512,
            0,
            Duration::from_secs(60),
            true,
        )?;
        assert_eq!(load.ops, 300);
        assert!(!load.hit_time_cap);
        assert_eq!(
            read_each(store.as_ref(), &ids, b"user:", 512, Duration::from_secs(60))?.ops,
            300
        );
        let reads = random_reads(store.as_ref(), &ids, b"user:", 512, 2, bounds(1000), 9)?;
        assert_eq!(reads.ops, 1000);
        // A wrong expected length is reported, not counted.
        assert!(random_reads(store.as_ref(), &ids, b"user:", 100, 1, bounds(10), 9).is_err());
        let writes = concurrent_writes(store.as_ref(), 4, b"new:", 0, &pool, 64, bounds(100))?;
        assert_eq!(writes.ops, 100);
        assert!(writes.latency.is_some());
        let running = AtomicBool::new(true);
        let during = writes_while(
            store.as_ref(),
            &running,
            &ids,
            b"user:",
            &pool,
            512,
            bounds(50),
            3,
        )?;
        assert_eq!(during.ops, 50);
        store.close()?;
        Ok(())
    }

    #[test]
    fn the_time_cap_ends_a_loop() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let pool = ValuePool::new(1, 1 << 16);
        let store = open(EngineKind::Bitcask, dir.path(), Durability::NoSync)?;
        let capped = Bounds {
            ops: u64::MAX,
            time: Duration::ZERO,
        };
        let writes = concurrent_writes(store.as_ref(), 2, b"k:", 0, &pool, 8, capped)?;
        assert!(writes.hit_time_cap);
        assert_eq!(writes.ops, 0);
        Ok(())
    }
}
