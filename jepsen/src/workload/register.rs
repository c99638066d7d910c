//! The register workload: linearizable reads, unconditional writes and
//! compare-and-set (a write conditioned on the version the worker last
//! saw) over many keys. Every written value is unique (`p<process>-<n>`),
//! and each key takes at most [`KEY_OPS_MAX`] operations before it is
//! retired for a fresh one, so per-key checks stay small. After the faults
//! are healed, [`final_reads`] reads every key ever written once more, so
//! the lost-write checker can judge every key.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kvclient::{Consistency, PutOptions, Read};
use rand::rngs::SmallRng;
use rand::{Rng as _, SeedableRng as _};

use super::{Function, History, Op, Outcome, Record, WorkloadConfig, client, write_error_outcome};

/// Operations one key takes before it is retired.
pub const KEY_OPS_MAX: u64 = 200;
/// Keys in use at a time (spread enough to be independent, few enough that
/// workers contend on them).
pub const KEYS_ACTIVE: usize = 8;
/// Percentage of operations that are reads (the rest split between writes
/// and compare-and-sets).
pub(super) const READ_PERCENT: u32 = 40;
/// Percentage of operations that are unconditional writes.
pub(super) const WRITE_PERCENT: u32 = 30;
/// Attempts of one key's final read (each bounded by the client's
/// operation timeout), so a cluster still electing after the heal gets
/// time.
pub const FINAL_READ_ATTEMPTS_MAX: u32 = 10;
/// Pause between two final-read attempts of a key.
pub(super) const FINAL_READ_PAUSE: Duration = Duration::from_secs(1);

/// The keys in use and how many operations each has taken.
#[derive(Debug)]
pub(super) struct Keys {
    slots: Vec<(u64, u64)>,
    next_key: u64,
}

impl Keys {
    pub(super) fn new() -> Self {
        Self {
            slots: (0..KEYS_ACTIVE as u64).map(|k| (k, 0)).collect(),
            next_key: KEYS_ACTIVE as u64,
        }
    }

    /// Picks a slot's key and counts one operation on it, retiring it when
    /// it reached [`KEY_OPS_MAX`].
    pub(super) fn pick(&mut self, slot: usize) -> u64 {
        let slot = slot % self.slots.len();
        if self.slots[slot].1 >= KEY_OPS_MAX {
            self.slots[slot] = (self.next_key, 0);
            self.next_key += 1;
        }
        self.slots[slot].1 += 1;
        self.slots[slot].0
    }
}

/// The key name of register `k`.
pub fn key_name(k: u64) -> String {
    format!("r/{k:06}")
}

/// Runs the workload until the deadline; every operation goes into
/// `history`.
pub async fn run(config: WorkloadConfig, history: Arc<History>) -> anyhow::Result<()> {
    run_workers(config, history, worker_loop).await
}

/// A request of the value registers (`redis-register`, `etcd-register`),
/// which compare values rather than versions: read the key, write a value,
/// or set a value if the key holds the one this worker saw last.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ValueRequest {
    /// Read the key.
    Read,
    /// Write the value.
    Write {
        /// The value written.
        value: String,
    },
    /// If the key's value is `expected`, write `value`.
    Cas {
        /// The value compared with.
        expected: String,
        /// The value written.
        value: String,
    },
}

impl ValueRequest {
    /// The next request of a worker: a read unless `writes` (the pick's
    /// write guard was granted); otherwise a cas of the value the worker
    /// last `seen` when the dice say so, else a write. Written values are
    /// `p{process}-{n}`, unique per process (`written` counts them).
    pub(super) fn pick(
        writes: bool,
        dice: u32,
        seen: Option<&Option<String>>,
        process: u64,
        written: &mut u64,
    ) -> ValueRequest {
        if !writes {
            return ValueRequest::Read;
        }
        *written += 1;
        let value = format!("p{process}-{written}");
        match seen {
            Some(Some(expected)) if dice >= READ_PERCENT + WRITE_PERCENT => ValueRequest::Cas {
                expected: expected.clone(),
                value,
            },
            _ => ValueRequest::Write { value },
        }
    }

    /// The history's function for it.
    pub fn function(&self) -> Function {
        match self {
            Self::Read => Function::Read,
            Self::Write { .. } => Function::Write,
            Self::Cas { .. } => Function::Cas,
        }
    }

    /// Records its invocation on `key` by `process` in `history`, with its
    /// values (and the member asked, when known).
    pub fn invoke(
        &self,
        history: &History,
        process: u64,
        key: &str,
        member: Option<u64>,
    ) -> super::Pending {
        let mut pending = history.invoke(process, self.function(), key);
        let op = pending.op_mut();
        op.member = member;
        match self {
            Self::Read => {}
            Self::Write { value } => op.value = Some(value.clone()),
            Self::Cas { expected, value } => {
                op.value = Some(value.clone());
                op.expected = Some(expected.clone());
            }
        }
        pending
    }
}

/// A worker's next operation: a key (its number and name), the dice
/// (0..100) that chose between a read and a write, and the write's guard
/// when it may write (a write needs the nemesis's gate open; while it is
/// closed, an idle period, the worker reads instead).
pub(super) fn next_pick(
    rng: &mut SmallRng,
    keys: &Mutex<Keys>,
    config: &WorkloadConfig,
) -> anyhow::Result<(u64, String, u32, Option<super::WriteGuard>)> {
    let slot = rng.random_range(0..KEYS_ACTIVE);
    let k = keys
        .lock()
        .map_err(|_| anyhow::anyhow!("key table lock poisoned"))?
        .pick(slot);
    let dice = rng.random_range(0..100);
    let write_guard = if dice >= READ_PERCENT {
        config.gate.begin_write()
    } else {
        None
    };
    Ok((k, key_name(k), dice, write_guard))
}

/// Runs `config.concurrency` workers of `worker_loop` over one shared
/// [`Keys`] until each returns (the register workloads: native, Redis
/// and etcd); the first error ends the run.
pub(super) async fn run_workers<F, Fut>(
    config: WorkloadConfig,
    history: Arc<History>,
    worker_loop: F,
) -> anyhow::Result<()>
where
    F: Fn(u64, WorkloadConfig, Arc<History>, Arc<Mutex<Keys>>) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>> + Send + 'static,
{
    let keys = Arc::new(Mutex::new(Keys::new()));
    let mut workers = tokio::task::JoinSet::new();
    for worker in 0..config.concurrency {
        workers.spawn(worker_loop(
            worker as u64,
            config.clone(),
            history.clone(),
            keys.clone(),
        ));
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
    keys: Arc<Mutex<Keys>>,
) -> anyhow::Result<()> {
    let client = client(&config.endpoints)?;
    let mut rng = SmallRng::seed_from_u64(config.seed ^ (worker.wrapping_mul(0x9e37_79b9)));
    let mut process = history.new_process();
    let mut written = 0_u64;
    // The version this worker last saw per key (the cas condition).
    let mut seen: HashMap<u64, u64> = HashMap::new();
    let pause = config.worker_pause();
    while tokio::time::Instant::now() < config.deadline {
        let (k, key, dice, write_guard) = next_pick(&mut rng, &keys, &config)?;
        let outcome = if write_guard.is_none() {
            let mut pending = history.invoke(process, Function::Read, &key);
            match client.read(key.clone(), Consistency::Linearizable).await {
                Ok(read) => {
                    let mod_revision = record_read(pending.op_mut(), read);
                    seen.insert(k, mod_revision);
                    history.complete(pending, Outcome::Ok)?.outcome
                }
                Err(err) => {
                    pending.op_mut().error = Some(err.to_string());
                    history.complete(pending, Outcome::Fail)?.outcome
                }
            }
        } else {
            written += 1;
            let value = format!("p{process}-{written}");
            let cas = dice >= READ_PERCENT + WRITE_PERCENT;
            let f = if cas { Function::Cas } else { Function::Write };
            let mut pending = history.invoke(process, f, &key);
            pending.op_mut().value = Some(value.clone());
            let mut options = PutOptions::default();
            if cas {
                let expected = seen.get(&k).copied().unwrap_or(0);
                pending.op_mut().expected_mod_revision = Some(expected);
                options = options.if_mod_revision(expected);
            }
            match client.put_with(key.clone(), value, options).await {
                Ok(w) => {
                    pending.op_mut().version = Some(w.seq);
                    pending.op_mut().index = Some(w.applied_index);
                    pending.op_mut().record_write_revision(w.revision);
                    seen.insert(k, w.revision);
                    history.complete(pending, Outcome::Ok)?.outcome
                }
                Err(err) => {
                    if let kvclient::Error::VersionMismatch {
                        current_mod_revision,
                        ..
                    } = &err
                    {
                        seen.insert(k, *current_mod_revision);
                    }
                    pending.op_mut().error = Some(err.to_string());
                    history
                        .complete(pending, write_error_outcome(&err))?
                        .outcome
                }
            }
        };
        drop(write_guard);
        if outcome == Outcome::Info {
            process = history.new_process();
        }
        tokio::time::sleep(pause).await;
    }
    Ok(())
}

/// Records what an ok read returned (an absent key: seq and mod_revision
/// 0) and its header's revision; returns the key's `mod_revision` read,
/// what a compare-and-set compares.
fn record_read(op: &mut Op, read: Read) -> u64 {
    let entry = read.entry;
    op.version = Some(entry.as_ref().map_or(0, |e| e.seq));
    op.index = entry.as_ref().map(|e| e.applied_index);
    let mod_revision = entry.as_ref().map_or(0, |e| e.revisions.mod_revision);
    op.record_read_revisions(read.revision, Some(mod_revision));
    op.value = entry.map(|e| String::from_utf8_lossy(&e.value).into_owned());
    mod_revision
}

/// Every key a write was invoked on so far, in order (the keys the final
/// reads of the register workloads read).
pub(super) fn written_keys(history: &History) -> BTreeSet<String> {
    history
        .records()
        .into_iter()
        .filter_map(|record| match record {
            Record::Op(op) if op.f.is_write() => Some(op.key),
            _ => None,
        })
        .collect()
}

/// The final reads: once every fault is healed, one linearizable read of
/// each key any write was invoked on, retried (bounded) until it succeeds.
/// Each read is recorded like any other, so the linearizability checker
/// sees it and the lost-write checker judges the key by it. Returns the
/// keys whose read never succeeded.
pub async fn final_reads(endpoints: &[String], history: &History) -> anyhow::Result<Vec<String>> {
    let written = written_keys(history);
    let client = client(endpoints)?;
    let mut process = history.new_process();
    let mut unread = Vec::new();
    for key in written {
        let mut read = false;
        for attempt in 1..=FINAL_READ_ATTEMPTS_MAX {
            let mut pending = history.invoke(process, Function::Read, &key);
            pending.op_mut().final_read = true;
            match client.read(key.clone(), Consistency::Linearizable).await {
                Ok(answer) => {
                    record_read(pending.op_mut(), answer);
                    history.complete(pending, Outcome::Ok)?;
                    read = true;
                    break;
                }
                Err(err) => {
                    pending.op_mut().error = Some(format!("final read attempt {attempt}: {err}"));
                    history.complete(pending, Outcome::Fail)?;
                    // A failed read has no effect, but a fresh process keeps
                    // the history's one-operation-per-process rule obvious.
                    process = history.new_process();
                    tokio::time::sleep(FINAL_READ_PAUSE).await;
                }
            }
        }
        if !read {
            unread.push(key);
        }
    }
    Ok(unread)
}
