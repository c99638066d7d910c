//! The exactly-once workload: workers add unique elements, each a key of
//! its own (`e/<element>`), with a **put-if-absent**, while replies are
//! lost (kvnode's `KVNODE_TEST_DROP_WRITE_REPLY_PERCENT`) and leaders are
//! killed, so writes are retried; a final linearizable scan reads every
//! element with its version ([`crate::exactly_once`] checks the history).
//!
//! Why put-if-absent: kvnode has no append, and an unconditional put of
//! a unique key applied twice leaves the same key and value (only the
//! version moves, and the client is told the second one). With the
//! condition, a second application of the same request finds the key its
//! own first application wrote and fails its condition: the client is
//! told "condition failed" (recorded `fail`, definitely not applied) for
//! an element that is there. Nothing else writes an element's key, so a
//! failed condition is proof of a double application; and a key seen at
//! two versions (by a read and the final scan, or by the add's reply) is
//! one too.
//!
//! Most workers ([`slow_workers`]: all but a quarter) retry slowly: their client waits
//! longer than the session idle window (`jepsen run --session-idle-ms`,
//! kvnode's `--test-session-idle-ms`) before retrying, so the retry of a
//! write whose reply was lost arrives after the server evicted the
//! client's session. A correct server answers it SESSION_EXPIRED (the
//! client reports outcome unknown); one that silently opens a new session
//! applies it again. The other workers retry at kvclient's usual pace and
//! keep the cluster time moving (eviction is judged on cluster time, which
//! advances with applied entries). After an unknown outcome a worker
//! starts a new client (a new session), as the session may be gone, and
//! opens it with a write of its own ([`open_session`]) before any element
//! add, so no element add opens a session.
//!
//! One operation in [`READ_EVERY`] is a linearizable read of an element
//! added earlier (its version is recorded).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::Context as _;
use kvclient::{Consistency, PutOptions, Scan};
use rand::rngs::SmallRng;
use rand::{Rng as _, SeedableRng as _};

use super::{
    Function, History, Outcome, WorkloadConfig, client, client_builder, slow_retry_builder,
    write_error_outcome,
};

/// One operation in this many is a read of an earlier element.
pub const READ_EVERY: u64 = 5;
/// The prefix of every element's key.
pub const PREFIX: &str = "e/";
/// How much longer than the session idle window a slow worker waits
/// before a retry (at least).
pub const SLOW_RETRY_MARGIN: Duration = Duration::from_millis(1000);
/// A slow worker's retry pause when the session idle window is not
/// shortened (then the slow retries only vary the timing).
pub const SLOW_RETRY_PAUSE_DEFAULT: Duration = Duration::from_secs(1);
/// Time a slow worker's write may take, retries included: room for a
/// retry after the idle window and one more across an election.
pub const SLOW_OPERATION_TIMEOUT: Duration = Duration::from_secs(20);
/// Attempts of the final read (each bounded by the operation timeout).
pub const FINAL_READ_ATTEMPTS_MAX: u32 = 10;
/// Pause between two final-read attempts.
const FINAL_READ_PAUSE: Duration = Duration::from_secs(1);
/// Elements a final read accepts at most (a bound on memory).
pub const ELEMENTS_MAX: usize = 1_000_000;

/// The key of an element.
pub fn element_key(element: u64) -> String {
    format!("{PREFIX}{element:010}")
}

/// A slow worker's pause before a retry: longer than the session idle
/// window by [`SLOW_RETRY_MARGIN`].
pub fn slow_retry_pause(session_idle: Option<Duration>) -> Duration {
    session_idle.map_or(SLOW_RETRY_PAUSE_DEFAULT, |idle| idle + SLOW_RETRY_MARGIN)
}

/// Workers that retry slowly: all but a quarter (at least one fast one,
/// which keeps cluster time moving; with one worker, that one is slow).
/// A slow worker spends most of its time waiting before retries, so the
/// slow ones must be many for their retries to be many.
pub fn slow_workers(concurrency: usize) -> usize {
    concurrency.saturating_sub((concurrency / 4).max(1)).max(1)
}

/// Runs the adds (and reads) until the deadline; every operation goes
/// into `history`.
pub async fn run(config: WorkloadConfig, history: Arc<History>) -> anyhow::Result<()> {
    let next = Arc::new(AtomicU64::new(0));
    let slow_workers = slow_workers(config.concurrency);
    let mut workers = tokio::task::JoinSet::new();
    for worker in 0..config.concurrency {
        let (config, history, next) = (config.clone(), history.clone(), next.clone());
        let slow = worker < slow_workers;
        workers.spawn(async move { worker_loop(worker as u64, slow, config, history, next).await });
    }
    while let Some(joined) = workers.join_next().await {
        joined??;
    }
    Ok(())
}

/// A worker's client: slow retries or the usual pace, and never a silent
/// re-run of a write under a fresh session (kvclient's
/// `rerun_after_expiry`): such a re-run opens its session, and with
/// retries stretched past the window on purpose an opening request can
/// apply twice (see the module doc). A SESSION_EXPIRED is an unknown
/// outcome here, after which the worker opens a new session itself.
fn worker_client(config: &WorkloadConfig, slow: bool) -> anyhow::Result<kvclient::Client> {
    let builder = if slow {
        slow_retry_builder(
            &config.endpoints,
            slow_retry_pause(config.session_idle),
            SLOW_OPERATION_TIMEOUT,
        )
    } else {
        client_builder(&config.endpoints)
    };
    builder
        .rerun_after_expiry(false)
        .build()
        .context("building an exactly-once worker's kvclient")
}

async fn worker_loop(
    worker: u64,
    slow: bool,
    config: WorkloadConfig,
    history: Arc<History>,
    next: Arc<AtomicU64>,
) -> anyhow::Result<()> {
    let mut process = history.new_process();
    let mut client = worker_client(&config, slow)?;
    if !open_session(&client, &history, &mut process, config.deadline).await? {
        return Ok(());
    }
    // Reads go through a client of the usual pace (a slow retry would only
    // make a read late; reads carry no session).
    let reader = super::client(&config.endpoints)?;
    let pause = config.worker_pause();
    let mut rng = SmallRng::seed_from_u64(config.seed ^ worker.wrapping_mul(0x9e37_79b9));
    let mut count = 0_u64;
    while tokio::time::Instant::now() < config.deadline {
        count += 1;
        let added = next.load(Ordering::Relaxed);
        let write = if count.is_multiple_of(READ_EVERY) && added > 0 {
            None
        } else {
            config.gate.begin_write()
        };
        let Some(_write) = write else {
            if added == 0 {
                tokio::time::sleep(pause).await;
                continue;
            }
            let element = rng.random_range(0..added);
            let key = element_key(element);
            let mut pending = history.invoke(process, Function::Read, &key);
            match reader.get_with(key, Consistency::Linearizable).await {
                Ok(entry) => {
                    let op = pending.op_mut();
                    op.version = Some(entry.as_ref().map_or(0, |e| e.seq));
                    op.index = entry.as_ref().map(|e| e.applied_index);
                    op.value = entry.map(|e| String::from_utf8_lossy(&e.value).into_owned());
                    history.complete(pending, Outcome::Ok)?;
                }
                Err(err) => {
                    pending.op_mut().error = Some(err.to_string());
                    history.complete(pending, Outcome::Fail)?;
                }
            }
            tokio::time::sleep(pause).await;
            continue;
        };
        let element = next.fetch_add(1, Ordering::Relaxed);
        let key = element_key(element);
        let value = element.to_string();
        let mut pending = history.invoke(process, Function::Add, &key);
        pending.op_mut().value = Some(value.clone());
        let outcome = match client
            .put_with(key, value, PutOptions::default().if_absent())
            .await
        {
            Ok(w) => {
                pending.op_mut().version = Some(w.seq);
                pending.op_mut().index = Some(w.applied_index);
                history.complete(pending, Outcome::Ok)?.outcome
            }
            Err(err) => {
                pending.op_mut().error = Some(err.to_string());
                history
                    .complete(pending, write_error_outcome(&err))?
                    .outcome
            }
        };
        if outcome == Outcome::Info {
            process = history.new_process();
            client = worker_client(&config, slow)?;
            if !open_session(&client, &history, &mut process, config.deadline).await? {
                return Ok(());
            }
        }
        tokio::time::sleep(pause).await;
    }
    Ok(())
}

/// The prefix of the session-opening writes (not elements).
pub const OPENER_PREFIX: &str = "o/";
/// Opens a fresh client's session with a write of its own (an
/// unconditional put of `o/<client id>`, recorded as a `write`), retried
/// until one is acknowledged, so every element add after it is a request
/// that does not open its session. Why: kvnode applies a request that
/// opens its session whenever the session is unknown, so an opening
/// request retried after its session was evicted applies again — which
/// kvclient rules out by capping its operation timeout at half the
/// production idle window, a bound this workload breaks on purpose by
/// shortening the server's window (and retrying slowly). The promise
/// under test is the server's: a request that does not open its session,
/// for an unknown session, is never applied (SESSION_EXPIRED).
///
/// Tried until `deadline`: false when no opener was acknowledged by then,
/// and the worker must add nothing more (its next add would open the
/// session itself).
async fn open_session(
    client: &kvclient::Client,
    history: &History,
    process: &mut u64,
    deadline: tokio::time::Instant,
) -> anyhow::Result<bool> {
    let key = format!("{OPENER_PREFIX}{:016x}", client.client_id());
    while tokio::time::Instant::now() < deadline {
        let mut pending = history.invoke(*process, Function::Write, &key);
        pending.op_mut().value = Some(format!("open-{process}"));
        match client.put(key.clone(), format!("open-{process}")).await {
            Ok(w) => {
                pending.op_mut().version = Some(w.seq);
                pending.op_mut().index = Some(w.applied_index);
                history.complete(pending, Outcome::Ok)?;
                return Ok(true);
            }
            Err(err) => {
                pending.op_mut().error = Some(err.to_string());
                if history
                    .complete(pending, write_error_outcome(&err))?
                    .outcome
                    == Outcome::Info
                {
                    *process = history.new_process();
                }
            }
        }
    }
    Ok(false)
}

/// The final read: a linearizable scan of every element (values and
/// versions), retried (bounded) until one succeeds. Returns whether one
/// did.
pub async fn final_read(endpoints: &[String], history: &History) -> anyhow::Result<bool> {
    let client = client(endpoints)?;
    let process = history.new_process();
    for attempt in 1..=FINAL_READ_ATTEMPTS_MAX {
        let mut pending = history.invoke(process, Function::ReadAll, PREFIX);
        pending.op_mut().final_read = true;
        let scan = Scan::prefix(PREFIX).consistency(Consistency::Linearizable);
        let mut after = None;
        let mut values = Vec::new();
        let mut versions = Vec::new();
        let mut index = None;
        let result: Result<(), kvclient::Error> = async {
            loop {
                let page = client.scan_page(&scan, after.take()).await?;
                index.get_or_insert(page.applied_index);
                for kv in page.entries {
                    if values.len() < ELEMENTS_MAX {
                        values.push(String::from_utf8_lossy(&kv.value).into_owned());
                        versions.push(kv.seq);
                    }
                }
                match page.next_after {
                    Some(next) => after = Some(next),
                    None => return Ok(()),
                }
            }
        }
        .await;
        match result {
            Ok(()) => {
                pending.op_mut().values = Some(values);
                pending.op_mut().versions = Some(versions);
                pending.op_mut().index = index;
                history.complete(pending, Outcome::Ok)?;
                return Ok(true);
            }
            Err(err) => {
                pending.op_mut().error = Some(format!("attempt {attempt}: {err}"));
                history.complete(pending, Outcome::Fail)?;
                tokio::time::sleep(FINAL_READ_PAUSE).await;
            }
        }
    }
    Ok(false)
}
