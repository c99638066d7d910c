//! A whole run: validate, connect (and, for etcd, find the leader), start
//! the clients, and merge their tallies into one [`LoadReport`].

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use prost::bytes::Bytes;
use rand::rngs::SmallRng;
use rand::{RngCore as _, SeedableRng as _};

use crate::client::{Tally, client_loop};
use crate::config::{ConfigError, LoadConfig, System};
#[cfg(feature = "etcd")]
use crate::etcd;
use crate::pool::Pool;
use crate::report::{LoadReport, Progress, new_histogram};
use crate::shared::Shared;

/// Size of the random buffer values are cut from.
const VALUE_POOL_SIZE_BYTES: usize = 4 * 1024 * 1024;

/// The etcd endpoint among `endpoints` that answers etcd's `Status` call
/// as the leader (the one the etcd backend sends writes and leader reads
/// to), or `None` when none does.
#[cfg(feature = "etcd")]
pub async fn etcd_leader(endpoints: &[String]) -> Result<Option<String>, ConfigError> {
    let pool = Pool::new(1);
    etcd::Clients::connect(&pool, endpoints)
        .await
        .map(|(_, leader)| leader)
}

/// Runs the load described by `config` (validated first).
pub async fn run(config: LoadConfig) -> Result<LoadReport, ConfigError> {
    run_observed(config, Arc::new(Progress::default())).await
}

/// [`run`], counting finished operations in `progress` as they finish.
pub async fn run_observed(
    config: LoadConfig,
    progress: Arc<Progress>,
) -> Result<LoadReport, ConfigError> {
    run_system(config, System::Raftcask, progress).await
}

/// [`run_observed`] against `system`.
pub async fn run_system(
    config: LoadConfig,
    system: System,
    progress: Arc<Progress>,
) -> Result<LoadReport, ConfigError> {
    config.validate()?;
    let shared = Arc::new(prepare(config, system, progress).await?);
    let tasks: Vec<_> = (0..shared.config.clients)
        .map(|client| tokio::spawn(client_loop(shared.clone(), client)))
        .collect();
    let mut report = LoadReport {
        ops_ok: 0,
        errors: BTreeMap::new(),
        redirects: 0,
        elapsed: Duration::ZERO,
        latency_us: new_histogram(),
        writes_acked: 0,
        write_entries: 0,
        timeline: Vec::new(),
    };
    let mut entries = HashSet::new();
    for task in tasks {
        match task.await {
            Ok(tally) => absorb(&mut report, &mut entries, tally),
            Err(err) => {
                *report
                    .errors
                    .entry(format!("client task: {err}"))
                    .or_default() += 1
            }
        }
    }
    report.elapsed = shared.began.elapsed();
    report.write_entries = entries.len() as u64;
    report.timeline.sort_by_key(|s| s.at_ms);
    Ok(report)
}

/// The state of a run with validated `config`: the channel pool, the first
/// leader guess, the values; the run's clock starts at the end.
async fn prepare(
    config: LoadConfig,
    system: System,
    progress: Arc<Progress>,
) -> Result<Shared, ConfigError> {
    let pool = Pool::new(config.connections);
    // The first leader guess: etcd's is asked for; raftcask's clients
    // follow redirects from the first endpoint.
    #[cfg(feature = "etcd")]
    let (etcd, leader) = match system {
        System::Etcd => {
            let (clients, leader) = etcd::Clients::connect(&pool, &config.endpoints).await?;
            (
                clients,
                leader.unwrap_or_else(|| config.endpoints[0].clone()),
            )
        }
        System::Raftcask => (etcd::Clients::default(), config.endpoints[0].clone()),
    };
    #[cfg(not(feature = "etcd"))]
    let leader = config.endpoints[0].clone();
    let mut values = vec![0u8; VALUE_POOL_SIZE_BYTES.max(config.value_size_bytes * 2)];
    SmallRng::seed_from_u64(config.seed).fill_bytes(&mut values);
    let began = Instant::now();
    Ok(Shared {
        pool,
        leader: Mutex::new(leader),
        started: AtomicU64::new(0),
        began,
        deadline: began + config.duration,
        values: Bytes::from(values),
        progress,
        system,
        #[cfg(feature = "etcd")]
        etcd,
        config,
    })
}

/// Adds one client's tallies to the report (and its entries to `entries`).
fn absorb(report: &mut LoadReport, entries: &mut HashSet<u64>, tally: Tally) {
    report.ops_ok += tally.ops_ok;
    report.redirects += tally.redirects;
    report.writes_acked += tally.writes_acked;
    // Same bounds on both sides, so adding cannot fail.
    let _ = report.latency_us.add(&tally.latency_us);
    for (kind, n) in tally.errors {
        *report.errors.entry(kind).or_default() += n;
    }
    entries.extend(tally.entries);
    report.timeline.extend(tally.sampler.samples);
}
