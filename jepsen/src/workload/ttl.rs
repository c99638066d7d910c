//! The TTL workload: keys written once each with a time to live, read
//! around their expiry from every member, linearizably and stale.
//!
//! The writers (the first half of the workers, [`writers`]) write a fresh
//! key (`t/<n>`, a unique value, a TTL drawn from the run's TTL range, by
//! default [`TTL_MIN`] ..= [`TTL_MAX`]), while the nemesis's write gate is
//! open, on [`WRITE_PERCENT`] of their turns; every
//! other turn of every worker reads a key acknowledged within the last
//! TTL + [`READ_AFTER_TTL`]: half the reads linearizable (any member,
//! through the full client), half stale from one member picked at random
//! (a client of that member alone, [`super::member_client`], which gives
//! up on a member that does not answer within a second), asking for `min_index` = the highest
//! applied index any operation of the run has reported so far (or, on
//! [`STALE_UNCONSTRAINED_PERCENT`] of them, no constraint). Each read
//! records the applied index the member reported, absent keys included
//! (`kvclient::Client::get_with_index`), so [`crate::ttl_check`] can order
//! an observed expiry against later reads.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kvclient::{Consistency, PutOptions};
use rand::rngs::SmallRng;
use rand::{Rng as _, SeedableRng as _};
use tokio::time::Instant;

use super::{
    Function, History, Outcome, WorkloadConfig, client, member_client, write_error_outcome,
};

/// Shortest TTL written by default (well above the 250 ms tick, so early
/// expiry would show; `jepsen run --ttl-min`).
pub const TTL_MIN: Duration = Duration::from_millis(1500);
/// Longest TTL written by default (short enough that most keys expire
/// within a 30 s run; `jepsen run --ttl-max`).
pub const TTL_MAX: Duration = Duration::from_millis(4000);
/// How long after its TTL a key is still read (its expiry must stick).
pub const READ_AFTER_TTL: Duration = Duration::from_secs(3);
/// Percentage of a writer's turns that write a new key.
pub const WRITE_PERCENT: u32 = 40;
/// Percentage of reads that are linearizable (the rest are stale).
pub const LINEARIZABLE_PERCENT: u32 = 50;
/// Percentage of stale reads sent without a `min_index`.
pub const STALE_UNCONSTRAINED_PERCENT: u32 = 20;
/// Keys kept readable at once at most (bounds memory at high rates).
pub const LIVE_KEYS_MAX: usize = 10_000;

/// A key acknowledged by the cluster.
#[derive(Debug, Clone)]
struct Written {
    key: String,
    /// When it stops being read.
    read_until: Instant,
}

/// State the workers share.
#[derive(Debug, Default)]
struct Shared {
    live: Mutex<VecDeque<Written>>,
    /// The highest applied index any operation reported.
    max_index: AtomicU64,
    next_key: AtomicU64,
}

impl Shared {
    fn note_index(&self, index: u64) {
        self.max_index.fetch_max(index, Ordering::Relaxed);
    }

    fn pick(&self, rng: &mut SmallRng) -> Option<String> {
        let mut live = self.live.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        while live.front().is_some_and(|w| w.read_until < now) {
            live.pop_front();
        }
        if live.is_empty() {
            return None;
        }
        let at = rng.random_range(0..live.len());
        live.get(at).map(|w| w.key.clone())
    }

    fn add(&self, written: Written) {
        let mut live = self.live.lock().unwrap_or_else(|p| p.into_inner());
        if live.len() >= LIVE_KEYS_MAX {
            live.pop_front();
        }
        // Keys differ in TTL: keep the queue roughly ordered by insertion;
        // `pick` drops only the expired front, the rest ages out later.
        live.push_back(written);
    }
}

/// Workers that write (the first half, at least one): more than one, so a
/// writer stuck on a read of a member that is down does not leave a calm
/// period without an acknowledged write.
pub fn writers(concurrency: usize) -> usize {
    (concurrency / 2).max(1)
}

/// The prefix of every TTL key.
pub const PREFIX: &str = "t/";

/// The key name of TTL key `n`.
pub fn key_name(n: u64) -> String {
    format!("{PREFIX}{n:06}")
}

/// Runs the workload until the deadline; every operation goes into
/// `history`.
pub async fn run(config: WorkloadConfig, history: Arc<History>) -> anyhow::Result<()> {
    let shared = Arc::new(Shared::default());
    let mut workers = tokio::task::JoinSet::new();
    for worker in 0..config.concurrency {
        let (config, history, shared) = (config.clone(), history.clone(), shared.clone());
        workers.spawn(async move { worker_loop(worker as u64, config, history, shared).await });
    }
    while let Some(joined) = workers.join_next().await {
        joined??;
    }
    Ok(())
}

async fn worker_loop(
    worker: u64,
    config: WorkloadConfig,
    history: Arc<History>,
    shared: Arc<Shared>,
) -> anyhow::Result<()> {
    let full = client(&config.endpoints)?;
    let members = config
        .endpoints
        .iter()
        .map(|e| member_client(e))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let mut rng = SmallRng::seed_from_u64(config.seed ^ worker.wrapping_mul(0x2545_f491));
    let mut process = history.new_process();
    let pause = config.worker_pause();
    while Instant::now() < config.deadline {
        let writer = worker < writers(config.concurrency) as u64;
        let key = if writer && rng.random_range(0..100) < WRITE_PERCENT {
            None
        } else {
            shared.pick(&mut rng)
        };
        let outcome = match key {
            None if writer => match config.gate.begin_write() {
                Some(_write) => write(&full, &config, &history, process, &shared, &mut rng).await?,
                None => {
                    tokio::time::sleep(pause).await;
                    continue;
                }
            },
            None => {
                tokio::time::sleep(pause).await;
                continue;
            }
            Some(key) => {
                let pinned = if rng.random_range(0..100) < LINEARIZABLE_PERCENT {
                    None
                } else {
                    let at = rng.random_range(0..members.len());
                    let min_index = if rng.random_range(0..100) < STALE_UNCONSTRAINED_PERCENT {
                        0
                    } else {
                        shared.max_index.load(Ordering::Relaxed)
                    };
                    Some((at, min_index))
                };
                let mut pending = history.invoke(process, Function::Read, &key);
                let (reader, consistency) = match pinned {
                    None => (&full, Consistency::Linearizable),
                    Some((at, min_index)) => {
                        pending.op_mut().stale_min_index = Some(min_index);
                        pending.op_mut().member = Some(at as u64 + 1);
                        (&members[at], Consistency::Stale { min_index })
                    }
                };
                match reader.get_with_index(key, consistency).await {
                    Ok((entry, index)) => {
                        shared.note_index(index);
                        let op = pending.op_mut();
                        op.index = Some(index);
                        op.version = Some(entry.as_ref().map_or(0, |e| e.seq));
                        op.value = entry.map(|e| String::from_utf8_lossy(&e.value).into_owned());
                        history.complete(pending, Outcome::Ok)?.outcome
                    }
                    Err(err) => {
                        pending.op_mut().error = Some(err.to_string());
                        history.complete(pending, Outcome::Fail)?.outcome
                    }
                }
            }
        };
        if outcome == Outcome::Info {
            process = history.new_process();
        }
        tokio::time::sleep(pause).await;
    }
    Ok(())
}

/// Writes a fresh key with a random TTL; an acknowledged one becomes
/// readable by every worker.
async fn write(
    client: &kvclient::Client,
    config: &WorkloadConfig,
    history: &History,
    process: u64,
    shared: &Shared,
    rng: &mut SmallRng,
) -> anyhow::Result<Outcome> {
    let n = shared.next_key.fetch_add(1, Ordering::Relaxed);
    let key = key_name(n);
    let (low, high) = config.ttl_range;
    let ttl_ms = rng.random_range(low.as_millis()..=high.as_millis().max(low.as_millis())) as u64;
    let ttl = Duration::from_millis(ttl_ms);
    // Whatever the outcome, the key may live until a TTL after the reply.
    struct NoteTtl<'a>(&'a WorkloadConfig, Duration);
    impl Drop for NoteTtl<'_> {
        fn drop(&mut self) {
            self.0.gate.note_ttl(self.1);
        }
    }
    let _note = NoteTtl(config, ttl);
    let value = format!("t{n}-p{process}");
    let mut pending = history.invoke(process, Function::Write, &key);
    pending.op_mut().value = Some(value.clone());
    pending.op_mut().ttl_ms = Some(ttl_ms);
    match client
        .put_with(key.clone(), value, PutOptions::default().ttl(ttl))
        .await
    {
        Ok(w) => {
            shared.note_index(w.applied_index);
            pending.op_mut().version = Some(w.seq);
            pending.op_mut().index = Some(w.applied_index);
            let op = history.complete(pending, Outcome::Ok)?;
            shared.add(Written {
                key,
                read_until: Instant::now() + ttl + READ_AFTER_TTL,
            });
            Ok(op.outcome)
        }
        Err(err) => {
            pending.op_mut().error = Some(err.to_string());
            Ok(history
                .complete(pending, write_error_outcome(&err))?
                .outcome)
        }
    }
}
