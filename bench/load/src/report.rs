//! What a run reports: the live [`Progress`] counters, the bounded
//! latency-over-time [`Sample`]s (thinned evenly by each client's
//! `Sampler`), and the [`LoadReport`] with its table row.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use hdrhistogram::Histogram;

use crate::table::{Table, count};

/// Latencies above this are recorded as this (histogram bound), in µs.
pub const LATENCY_US_MAX: u64 = 60_000_000;
/// Most (time, latency) samples a run keeps for its timeline, over all
/// clients (8 bytes each). A client that fills its share keeps every other
/// sample and halves its sampling rate, so the timeline stays spread over
/// the whole run.
pub const TIMELINE_SAMPLES_MAX: usize = 1_000_000;

/// Operations finished so far, readable while a run goes (for a progress
/// bar). Pass one to [`run_observed`](crate::run_observed).
#[derive(Debug, Default)]
pub struct Progress {
    pub(crate) ok: AtomicU64,
    pub(crate) failed: AtomicU64,
}

impl Progress {
    /// Operations that succeeded so far.
    pub fn ok(&self) -> u64 {
        self.ok.load(Ordering::Relaxed)
    }

    /// Operations that failed so far.
    pub fn failed(&self) -> u64 {
        self.failed.load(Ordering::Relaxed)
    }

    /// Operations finished so far, either way.
    pub fn finished(&self) -> u64 {
        self.ok() + self.failed()
    }
}

/// One successful operation of the timeline: when it finished and how long
/// it took.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sample {
    /// When it finished, in ms since the run began.
    pub at_ms: u32,
    /// Its latency in µs (at most [`LATENCY_US_MAX`]).
    pub latency_us: u32,
}

/// A client's bounded share of the timeline (see [`TIMELINE_SAMPLES_MAX`]).
#[derive(Debug)]
pub(crate) struct Sampler {
    pub(crate) samples: Vec<Sample>,
    capacity: usize,
    /// Keep one operation in `stride`.
    stride: u64,
    seen: u64,
}

impl Sampler {
    pub(crate) fn new(capacity: usize) -> Sampler {
        Sampler {
            samples: Vec::new(),
            capacity: capacity.max(2),
            stride: 1,
            seen: 0,
        }
    }

    pub(crate) fn record(&mut self, sample: Sample) {
        self.seen += 1;
        if !self.seen.is_multiple_of(self.stride) {
            return;
        }
        self.samples.push(sample);
        if self.samples.len() >= self.capacity {
            // Kept: operations number 2, 4, 6, ... × stride, so the next one
            // kept (number len × 2 × stride + 2 × stride) continues the grid.
            let mut position = 0;
            self.samples.retain(|_| {
                position += 1;
                position % 2 == 0
            });
            self.stride = self.stride.saturating_mul(2);
        }
    }
}

/// The outcome of a run.
#[derive(Debug)]
pub struct LoadReport {
    /// Operations that succeeded (a get that found nothing counts).
    pub ops_ok: u64,
    /// Failed operations by kind (gRPC code, plus the detail when there is one).
    pub errors: BTreeMap<String, u64>,
    /// NotLeader redirects followed (not failures).
    pub redirects: u64,
    /// Wall time of the run.
    pub elapsed: Duration,
    /// Latency of successful operations, µs.
    pub latency_us: Histogram<u64>,
    /// Acknowledged writes.
    pub writes_acked: u64,
    /// Distinct Raft entries (log indexes) that carried acknowledged writes.
    pub write_entries: u64,
    /// Successful operations over time, ascending by `at_ms`: all of them,
    /// or an even thinning to at most [`TIMELINE_SAMPLES_MAX`].
    pub timeline: Vec<Sample>,
}

impl LoadReport {
    /// Failed operations.
    pub fn errors_total(&self) -> u64 {
        self.errors.values().sum()
    }

    /// Successful operations per second.
    pub fn ops_per_second(&self) -> f64 {
        self.ops_ok as f64 / self.elapsed.as_secs_f64().max(f64::MIN_POSITIVE)
    }

    /// Acknowledged writes per Raft entry that carried them; `None` without
    /// writes.
    pub fn ops_per_entry(&self) -> Option<f64> {
        (self.write_entries > 0).then(|| self.writes_acked as f64 / self.write_entries as f64)
    }

    /// The headers of [`LoadReport::row`].
    pub const HEADERS: [&'static str; 13] = [
        "op",
        "clients",
        "ops",
        "seconds",
        "ops/s",
        "p50 ms",
        "p90 ms",
        "p99 ms",
        "p99.9 ms",
        "max ms",
        "errors",
        "redirects",
        "ops/entry",
    ];

    /// One table row (see [`LoadReport::HEADERS`]).
    pub fn row(&self, op: &str, clients: usize) -> Vec<String> {
        let ms = |q: f64| {
            format!(
                "{:.2}",
                self.latency_us.value_at_quantile(q) as f64 / 1000.0
            )
        };
        vec![
            op.to_string(),
            clients.to_string(),
            count(self.ops_ok as f64),
            format!("{:.1}", self.elapsed.as_secs_f64()),
            count(self.ops_per_second()),
            ms(0.5),
            ms(0.9),
            ms(0.99),
            ms(0.999),
            format!("{:.2}", self.latency_us.max() as f64 / 1000.0),
            count(self.errors_total() as f64),
            count(self.redirects as f64),
            self.ops_per_entry()
                .map(|v| format!("{v:.2}"))
                .unwrap_or_else(|| "n/a".into()),
        ]
    }

    /// A one-row table plus a note per error kind.
    pub fn table(&self, title: &str, op: &str, clients: usize) -> Table {
        let mut table = Table::new(title, &Self::HEADERS);
        table.row(self.row(op, clients));
        for (kind, n) in &self.errors {
            table.note(format!("- errors {kind}: {n}"));
        }
        table
    }
}

pub(crate) fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, LATENCY_US_MAX, 3).expect("valid histogram bounds")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sampler_thins_evenly_and_stays_bounded() {
        let mut sampler = Sampler::new(8);
        for at_ms in 0..1000 {
            sampler.record(Sample {
                at_ms,
                latency_us: 1,
            });
        }
        assert!(sampler.samples.len() <= 8, "{:?}", sampler.samples);
        assert!(sampler.samples.len() >= 4, "{:?}", sampler.samples);
        // Spread over the whole run, not just its start.
        let last = sampler.samples.last().map(|s| s.at_ms);
        assert!(last.is_some_and(|t| t >= 500), "{:?}", sampler.samples);
        let gaps: Vec<u32> = sampler
            .samples
            .windows(2)
            .map(|w| w[1].at_ms - w[0].at_ms)
            .collect();
        assert!(gaps.iter().all(|g| *g == gaps[0]), "{gaps:?}");
    }

    #[test]
    fn ops_per_entry_counts_distinct_entries() {
        let report = LoadReport {
            ops_ok: 6,
            errors: BTreeMap::new(),
            redirects: 0,
            elapsed: Duration::from_secs(2),
            latency_us: new_histogram(),
            writes_acked: 6,
            write_entries: 2,
            timeline: Vec::new(),
        };
        assert_eq!(report.ops_per_entry(), Some(3.0));
        assert_eq!(report.ops_per_second(), 3.0);
    }
}
