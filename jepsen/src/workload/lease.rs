//! The lease workload (issue 20): owners grant leases, attach keys to
//! them, keep them alive, then revoke them or stop renewing them; every
//! worker reads leases' keys with linearizable range reads; watchers
//! record every delete. [`crate::lease_check`] judges the history.
//!
//! Each worker is an **owner**, one lease at a time:
//!
//! 1. grants lease `n` (a TTL drawn from the run's `--ttl-min` ..=
//!    `--ttl-max`, at least `LEASE_TTL_MS_MIN`; the TTL the grant answers
//!    is the one the checker uses);
//! 2. attaches [`KEYS_PER_LEASE`] keys `l/<n>/<k>` (puts of unique values
//!    with the lease);
//! 3. keeps it alive for 1 ..= [`KEEP_TTLS_MAX`] TTLs (or until the
//!    schedule ends): a **keeper** (a process of its own) sends one
//!    keep-alive (`kvclient::Client::lease_keep_alive_once`) every TTL /
//!    [`KEEP_ALIVES_PER_TTL`] after the previous one's invoke (at once
//!    when that one took longer), recording its invoke and completion,
//!    the TTL answered (0 = the lease is gone: the keeper stops) and
//!    kvclient's send time of the attempt that was answered; meanwhile
//!    the owner reads (below);
//! 4. then revokes it ([`REVOKE_PERCENT`] of leases) or simply stops
//!    renewing it, and goes on with the next lease. At the end of the
//!    schedule every lease still kept is let go.
//!
//! Under the nemesis an owner's keep-alives to a cut-off or killed leader
//! go unanswered: for the cluster it is a client partitioned away.
//!
//! **Reads**: between keep-alives every worker reads a lease — its own
//! half the time, else one picked at random among those kept or let go
//! within their TTL + [`READ_AFTER_RELEASE`] — with one linearizable range
//! over the lease's prefix, which shows all of its keys at one revision.
//!
//! **Watchers**: one per member over [`PREFIX`], the `watch` workload's
//! (`super::watch::start_watchers`), from the revision a first read shows;
//! the checker needs their delete events (one revision per lease).
//!
//! After the schedule and the heal, [`finish`] reads the whole prefix
//! every [`FINISH_READ_PERIOD`] until every lease is past its TTL and the
//! late bound even if the last fault's leaderless allowance renewed it
//! (the last leases' expiry, judged outside leaderless time), then once
//! more (no key may be left), lets the watchers catch up with that read
//! and stops them. These reads are final reads: not counted as work.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kvclient::Consistency;
use kvclient::txn::Range;
use rand::rngs::SmallRng;
use rand::{Rng as _, SeedableRng as _};
use tokio::time::Instant;

use super::watch::{Watchers, start_watchers, stop_watchers};
use super::{
    Function, History, LeaseRecord, Outcome, Pending, WorkloadConfig, client, write_error_outcome,
};

/// Keys attached to each lease.
pub const KEYS_PER_LEASE: u64 = 3;
/// An owner keeps its lease alive for 1 ..= this many TTLs.
pub const KEEP_TTLS_MAX: u32 = 3;
/// Keep-alives per TTL (etcd's clients renew at a third of the TTL).
pub const KEEP_ALIVES_PER_TTL: u32 = 3;
/// Percentage of leases revoked by their owner (the others expire).
pub const REVOKE_PERCENT: u32 = 30;
/// Percentage of a worker's reads that read its own lease.
const OWN_READ_PERCENT: u32 = 50;
/// How long after its owner let go (revoked it, or stopped renewing it,
/// plus its TTL) a lease is still read.
pub const READ_AFTER_RELEASE: Duration = Duration::from_secs(3);
/// Attempts of the first read and of the final read.
const READ_ATTEMPTS_MAX: u32 = 10;
/// Pause between two attempts of those reads.
const READ_PAUSE: Duration = Duration::from_secs(1);
/// Extra wait before the final read, beyond the longest TTL, the late
/// bound and the leaderless allowance of the last heal.
const FINAL_READ_MARGIN: Duration = Duration::from_secs(2);
/// Pause between two reads of every lease while the last ones run out.
const FINISH_READ_PERIOD: Duration = Duration::from_millis(200);

/// The prefix of every key of the workload (and of the watchers' watch).
pub const PREFIX: &str = "l/";

/// The prefix of lease `n`'s keys: a range over it reads all of them at
/// one revision.
pub fn lease_prefix(n: u64) -> String {
    format!("{PREFIX}{n:06}/")
}

/// The key `k` of lease `n`.
pub fn key_name(n: u64, k: u64) -> String {
    format!("{}{k}", lease_prefix(n))
}

/// The lease number of a workload key (`l/<n>/<k>`), if it is one.
pub fn lease_of_key(key: &str) -> Option<u64> {
    let rest = key.strip_prefix(PREFIX)?;
    let (number, k) = rest.split_once('/')?;
    if k.is_empty() {
        return None;
    }
    number.parse().ok()
}

/// Leases readers pick from: number -> until when it is read (`None`:
/// still kept alive).
#[derive(Debug, Default)]
struct Registry {
    leases: Mutex<BTreeMap<u64, Option<Instant>>>,
    next: AtomicU64,
}

impl Registry {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, Option<Instant>>> {
        self.leases
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn set(&self, n: u64, read_until: Option<Instant>) {
        self.lock().insert(n, read_until);
    }

    /// A lease to read, at random; forgets those read long enough.
    fn pick(&self, rng: &mut SmallRng) -> Option<u64> {
        let mut leases = self.lock();
        let now = Instant::now();
        leases.retain(|_, until| until.is_none_or(|until| until > now));
        if leases.is_empty() {
            return None;
        }
        let at = rng.random_range(0..leases.len());
        leases.keys().nth(at).copied()
    }
}

/// Runs the workload until the deadline (owners, keepers, reads), with
/// the watchers started first; they run until [`finish`].
pub async fn run(
    config: WorkloadConfig,
    history: Arc<History>,
    watchers: Arc<Watchers>,
) -> anyhow::Result<()> {
    let client = client(&config.endpoints)?;
    let mut before = None;
    for attempt in 1..=READ_ATTEMPTS_MAX {
        before = read(&client, &history, PREFIX, 0, false, attempt).await?;
        if before.is_some() {
            break;
        }
        tokio::time::sleep(READ_PAUSE).await;
    }
    let before = before
        .ok_or_else(|| anyhow::anyhow!("no linearizable read succeeded before the leases"))?;
    start_watchers(PREFIX, before + 1, &config, &history, &watchers);
    let registry = Arc::new(Registry::default());
    let mut workers = tokio::task::JoinSet::new();
    for worker in 0..config.concurrency {
        let (config, history, registry) = (config.clone(), history.clone(), registry.clone());
        workers.spawn(async move { owner_loop(worker as u64, config, history, registry).await });
    }
    while let Some(joined) = workers.join_next().await {
        joined??;
    }
    Ok(())
}

/// One linearizable range over `prefix`, recorded as a `lease-read` of
/// lease `n` (0: every lease); returns its revision when it succeeded.
async fn read(
    client: &kvclient::Client,
    history: &History,
    prefix: &str,
    n: u64,
    final_read: bool,
    attempt: u32,
) -> anyhow::Result<Option<u64>> {
    let process = history.new_process();
    let mut pending = history.invoke(process, Function::LeaseRead, prefix);
    pending.op_mut().final_read = final_read;
    pending.op_mut().lease = Some(lease_record(n, 0));
    let range = Range::prefix(prefix.to_string()).consistency(Consistency::Linearizable);
    match client.range(&range).await {
        Ok(result) => {
            let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
            let op = pending.op_mut();
            op.revision = Some(result.revision);
            op.index = Some(result.applied_index);
            if let Some(lease) = op.lease.as_mut() {
                lease.present = Some(
                    result
                        .kvs
                        .iter()
                        .map(|kv| (text(&kv.key), text(&kv.value)))
                        .collect(),
                );
            }
            history.complete(pending, Outcome::Ok)?;
            Ok(Some(result.revision))
        }
        Err(err) => {
            pending.op_mut().error = Some(format!("attempt {attempt}: {err}"));
            history.complete(pending, Outcome::Fail)?;
            Ok(None)
        }
    }
}

/// The outcome of a failed lease write: a lease that does not exist, or
/// an id in use, fails (nothing applied); otherwise as any write.
fn lease_write_outcome(err: &kvclient::Error) -> Outcome {
    match err {
        kvclient::Error::LeaseNotFound { .. } | kvclient::Error::LeaseAlreadyExists { .. } => {
            Outcome::Fail
        }
        other => write_error_outcome(other),
    }
}

fn lease_record(n: u64, id: u64) -> LeaseRecord {
    LeaseRecord {
        lease: n,
        id,
        ..LeaseRecord::default()
    }
}

/// Completes `pending` with `outcome`; an unknown outcome retires the
/// process (`process` gets a new one).
fn complete(
    history: &History,
    pending: Pending,
    outcome: Outcome,
    process: &mut u64,
) -> anyhow::Result<()> {
    history.complete(pending, outcome)?;
    if outcome == Outcome::Info {
        *process = history.new_process();
    }
    Ok(())
}

/// Grants lease `n` with a TTL from the run's range; `None` when the
/// grant was not acknowledged.
async fn grant(
    n: u64,
    client: &kvclient::Client,
    config: &WorkloadConfig,
    history: &History,
    process: &mut u64,
    rng: &mut SmallRng,
) -> anyhow::Result<Option<kvclient::LeaseGrant>> {
    let (low, high) = config.ttl_range;
    let low_ms = (low.as_millis() as u64).max(kvclient::kvproto::LEASE_TTL_MS_MIN);
    let ttl_ms = rng.random_range(low_ms..=(high.as_millis() as u64).max(low_ms));
    let mut pending = history.invoke(*process, Function::LeaseGrant, "");
    pending.op_mut().ttl_ms = Some(ttl_ms);
    pending.op_mut().lease = Some(lease_record(n, 0));
    match client.lease_grant(Duration::from_millis(ttl_ms)).await {
        Ok(grant) => {
            let op = pending.op_mut();
            op.revision = Some(grant.revision);
            op.index = Some(grant.applied_index);
            op.lease = Some(LeaseRecord {
                ttl_ms: Some(grant.ttl.as_millis() as u64),
                ..lease_record(n, grant.id)
            });
            complete(history, pending, Outcome::Ok, process)?;
            Ok(Some(grant))
        }
        Err(err) => {
            pending.op_mut().error = Some(err.to_string());
            complete(history, pending, lease_write_outcome(&err), process)?;
            Ok(None)
        }
    }
}

/// Attaches the keys of lease `n` (one put each); stops at the first
/// that finds the lease gone.
async fn attach(
    n: u64,
    id: u64,
    client: &kvclient::Client,
    history: &History,
    process: &mut u64,
) -> anyhow::Result<()> {
    for k in 0..KEYS_PER_LEASE {
        let key = key_name(n, k);
        let value = format!("{n}-{k}-p{process}");
        let mut pending = history.invoke(*process, Function::Write, &key);
        pending.op_mut().value = Some(value.clone());
        pending.op_mut().lease = Some(lease_record(n, id));
        match client.put_with_lease(key, value, id).await {
            Ok(written) => {
                pending.op_mut().index = Some(written.applied_index);
                pending.op_mut().record_write_revision(written.revision);
                complete(history, pending, Outcome::Ok, process)?;
            }
            Err(err) => {
                let gone = matches!(err, kvclient::Error::LeaseNotFound { .. });
                pending.op_mut().error = Some(err.to_string());
                complete(history, pending, lease_write_outcome(&err), process)?;
                if gone {
                    break;
                }
            }
        }
    }
    Ok(())
}

/// Revokes lease `n`.
async fn revoke(
    n: u64,
    id: u64,
    client: &kvclient::Client,
    history: &History,
    process: &mut u64,
) -> anyhow::Result<()> {
    let mut pending = history.invoke(*process, Function::LeaseRevoke, "");
    pending.op_mut().lease = Some(lease_record(n, id));
    match client.lease_revoke(id).await {
        Ok(revoked) => {
            let op = pending.op_mut();
            op.index = Some(revoked.applied_index);
            op.revision = Some(revoked.revision);
            if let Some(lease) = op.lease.as_mut() {
                lease.deleted = Some(revoked.deleted);
            }
            complete(history, pending, Outcome::Ok, process)
        }
        Err(err) => {
            pending.op_mut().error = Some(err.to_string());
            complete(history, pending, lease_write_outcome(&err), process)
        }
    }
}

async fn owner_loop(
    worker: u64,
    config: WorkloadConfig,
    history: Arc<History>,
    registry: Arc<Registry>,
) -> anyhow::Result<()> {
    let client = client(&config.endpoints)?;
    let mut rng = SmallRng::seed_from_u64(config.seed ^ worker.wrapping_mul(0x6a09_e667_f3bc));
    let mut process = history.new_process();
    let pause = config.worker_pause();
    while Instant::now() < config.deadline {
        let Some(write) = config.gate.begin_write() else {
            tokio::time::sleep(pause).await;
            continue;
        };
        let n = registry.next.fetch_add(1, Ordering::Relaxed) + 1;
        let Some(lease) = grant(n, &client, &config, &history, &mut process, &mut rng).await?
        else {
            drop(write);
            tokio::time::sleep(pause).await;
            continue;
        };
        registry.set(n, None);
        attach(n, lease.id, &client, &history, &mut process).await?;
        drop(write);
        let stop = Arc::new(AtomicBool::new(false));
        let keeper = tokio::spawn(keeper_loop(
            n,
            lease,
            client.clone(),
            history.clone(),
            stop.clone(),
        ));
        let keep_for = lease.ttl * rng.random_range(1..=KEEP_TTLS_MAX);
        let keep_until = (Instant::now() + keep_for).min(config.deadline);
        while Instant::now() < keep_until && !keeper.is_finished() {
            let pick = if rng.random_range(0..100) < OWN_READ_PERCENT {
                Some(n)
            } else {
                registry.pick(&mut rng)
            };
            if let Some(m) = pick {
                read(&client, &history, &lease_prefix(m), m, false, 1).await?;
            }
            tokio::time::sleep(pause).await;
        }
        stop.store(true, Ordering::SeqCst);
        keeper.await??;
        if Instant::now() < config.deadline && rng.random_range(0..100) < REVOKE_PERCENT {
            revoke(n, lease.id, &client, &history, &mut process).await?;
            registry.set(n, Some(Instant::now() + READ_AFTER_RELEASE));
        } else {
            registry.set(n, Some(Instant::now() + lease.ttl + READ_AFTER_RELEASE));
        }
    }
    Ok(())
}

/// Keeps lease `n` alive until `stop`: a keep-alive every TTL /
/// [`KEEP_ALIVES_PER_TTL`] after the previous one's invoke (at once when
/// that one took longer); returns when the lease is gone.
async fn keeper_loop(
    n: u64,
    lease: kvclient::LeaseGrant,
    client: kvclient::Client,
    history: Arc<History>,
    stop: Arc<AtomicBool>,
) -> anyhow::Result<()> {
    /// How often a keeper waiting for its next keep-alive looks at `stop`.
    const STOP_POLL: Duration = Duration::from_millis(50);
    let mut process = history.new_process();
    let period = lease.ttl / KEEP_ALIVES_PER_TTL;
    let mut next = Instant::now() + period;
    loop {
        while Instant::now() < next {
            if stop.load(Ordering::SeqCst) {
                return Ok(());
            }
            let left = next.saturating_duration_since(Instant::now());
            tokio::time::sleep(left.min(STOP_POLL)).await;
        }
        if stop.load(Ordering::SeqCst) {
            return Ok(());
        }
        next = Instant::now() + period;
        let mut pending = history.invoke(process, Function::LeaseKeepAlive, "");
        pending.op_mut().lease = Some(lease_record(n, lease.id));
        let answer = client.lease_keep_alive_once(lease.id).await;
        let record = pending.op_mut();
        match answer {
            Ok(renewal) => {
                record.revision = Some(renewal.revision);
                if let Some(lease) = record.lease.as_mut() {
                    lease.ttl_ms = Some(renewal.ttl.as_millis() as u64);
                    lease.sent_ns = Some(history.ns_at(renewal.sent));
                }
                complete(&history, pending, Outcome::Ok, &mut process)?;
            }
            Err(kvclient::Error::LeaseNotFound { .. }) => {
                if let Some(lease) = record.lease.as_mut() {
                    lease.ttl_ms = Some(0);
                }
                complete(&history, pending, Outcome::Ok, &mut process)?;
                return Ok(());
            }
            Err(err) => {
                record.error = Some(err.to_string());
                complete(&history, pending, write_error_outcome(&err), &mut process)?;
            }
        }
    }
}

/// After the schedule and the heal: while every lease runs out — until
/// each is past its TTL and the late bound, counted from the end of the
/// last fault's leaderless allowance (which may have renewed it) — reads
/// every key under [`PREFIX`] every [`FINISH_READ_PERIOD`] (final reads:
/// the checker judges the last leases' expiry outside leaderless time,
/// which a schedule whose fault windows merge leaves no room for), then
/// once more (retried), lets the watchers catch up with that read and
/// stops them. Returns whether the last read succeeded.
pub async fn finish(
    endpoints: &[String],
    history: &History,
    watchers: &Watchers,
    ttl_max: Duration,
) -> anyhow::Result<bool> {
    let wait = crate::ttl_check::ELECTION_ALLOWANCE
        + ttl_max.max(Duration::from_millis(kvclient::kvproto::LEASE_TTL_MS_MIN))
        + Duration::from_millis(
            crate::lease_check::LATE_BOUND_MS + crate::lease_check::MEASUREMENT_SLACK_MS,
        )
        + FINAL_READ_MARGIN;
    let client = client(endpoints)?;
    let until = Instant::now() + wait;
    while Instant::now() < until {
        read(&client, history, PREFIX, 0, true, 1).await?;
        tokio::time::sleep(FINISH_READ_PERIOD).await;
    }
    let mut last = None;
    for attempt in 1..=READ_ATTEMPTS_MAX {
        last = read(&client, history, PREFIX, 0, true, attempt).await?;
        if last.is_some() {
            break;
        }
        tokio::time::sleep(READ_PAUSE).await;
    }
    stop_watchers(watchers, last).await?;
    Ok(last.is_some())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_name_their_lease() {
        assert_eq!(key_name(7, 2), "l/000007/2");
        assert_eq!(lease_of_key(&key_name(7, 2)), Some(7));
        assert_eq!(lease_of_key("l/000007/"), None);
        assert_eq!(lease_of_key("w/0"), None);
        assert_eq!(lease_of_key("l/x/1"), None);
        // A prefix read of one lease never covers another's keys.
        assert!(!key_name(10, 0).starts_with(&lease_prefix(1)));
    }
}
