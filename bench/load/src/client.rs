//! One client task: draws keys and operations from its seed, runs them one
//! at a time until the run's count or deadline, and tallies latencies,
//! errors, acknowledged versions and timeline samples.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use hdrhistogram::Histogram;
use prost::bytes::Bytes;
use rand::rngs::SmallRng;
use rand::{Rng as _, SeedableRng as _};

use crate::attempt::{error_kind, get_once, put_once};
use crate::config::{LoadConfig, OpKind};
use crate::report::{LATENCY_US_MAX, Sample, Sampler, TIMELINE_SAMPLES_MAX, new_histogram};
use crate::shared::Shared;

/// One client's tallies.
#[derive(Debug)]
pub(crate) struct Tally {
    pub(crate) ops_ok: u64,
    pub(crate) errors: BTreeMap<String, u64>,
    pub(crate) redirects: u64,
    pub(crate) latency_us: Histogram<u64>,
    pub(crate) writes_acked: u64,
    pub(crate) entries: HashSet<u64>,
    pub(crate) sampler: Sampler,
}

/// Key number `id`: zero-padded to the configured size.
fn key(config: &LoadConfig, id: u64) -> Bytes {
    Bytes::from(format!("{id:0>width$}", width = config.key_size_bytes))
}

/// Client number `client`'s loop, until the run's count or deadline.
pub(crate) async fn client_loop(shared: Arc<Shared>, client: usize) -> Tally {
    let config = &shared.config;
    let mut rng =
        SmallRng::seed_from_u64(config.seed ^ (client as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let mut tally = Tally {
        ops_ok: 0,
        errors: BTreeMap::new(),
        redirects: 0,
        latency_us: new_histogram(),
        writes_acked: 0,
        entries: HashSet::new(),
        sampler: Sampler::new(TIMELINE_SAMPLES_MAX / config.clients.max(1)),
    };
    let value_span = shared.values.len() - config.value_size_bytes;
    loop {
        if Instant::now() >= shared.deadline
            || shared.started.fetch_add(1, Ordering::Relaxed) >= config.ops
        {
            break;
        }
        let key = key(config, rng.random_range(0..config.key_space));
        let is_read = match config.op {
            OpKind::Put => false,
            OpKind::Get => true,
            OpKind::Mixed { read_percent } => rng.random_range(0..100u8) < read_percent,
        };
        let began = Instant::now();
        let result = if is_read {
            get_once(&shared, client, key, &mut tally)
                .await
                .map(|()| None)
        } else {
            let offset = rng.random_range(0..=value_span);
            let value = shared
                .values
                .slice(offset..offset + config.value_size_bytes);
            put_once(&shared, client, key, value, &mut tally).await
        };
        let micros = (began.elapsed().as_micros() as u64).clamp(1, LATENCY_US_MAX);
        match result {
            Ok(version) => {
                tally.ops_ok += 1;
                tally.latency_us.saturating_record(micros);
                shared.progress.ok.fetch_add(1, Ordering::Relaxed);
                let at_ms = shared.began.elapsed().as_millis();
                tally.sampler.record(Sample {
                    at_ms: u32::try_from(at_ms).unwrap_or(u32::MAX),
                    latency_us: u32::try_from(micros).unwrap_or(u32::MAX),
                });
                if let Some(version) = version {
                    tally.writes_acked += 1;
                    tally.entries.insert(version >> 16);
                }
            }
            Err(status) => {
                shared.progress.failed.fetch_add(1, Ordering::Relaxed);
                *tally.errors.entry(error_kind(&status)).or_default() += 1;
            }
        }
    }
    tally
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_have_the_configured_size() {
        let config = LoadConfig::default();
        assert_eq!(&key(&config, 42)[..], b"0000000000000042");
    }
}
