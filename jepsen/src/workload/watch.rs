//! The watch workload: writers put unique values to a few keys under
//! [`PREFIX`], delete them, and read them linearizably; some puts carry a
//! short TTL (the run's `--ttl-min` ..= `--ttl-max`), half of them to a
//! fresh key written once ([`ttl_key_name`]), so expiry deletes happen
//! (the shared keys are mostly overwritten before they expire); one
//! watcher per member watches the
//! whole prefix, recording every batch it receives (member, header
//! revision, each event's revision, key, kind, value and previous value).
//!
//! - Before any write, a linearizable read gives the store revision `H`;
//!   the even watchers ask for every event from `H + 1` (an explicit start
//!   revision), the odd ones start at "now" and record their created
//!   revision + 1. Watcher `i` starts on member `i` (`Client::watch_on`).
//! - Under the nemesis the client resumes a failed member's watch on
//!   another member by itself; a stream that ends anyway (an error after
//!   [`kvclient::watch::WATCH_RESUME_WINDOW`]) is recorded `fail`, and the
//!   watcher opens a new stream from the stream's `next_revision` on the
//!   next member.
//! - Each `watch` record carries the watcher's own cursor: the revision
//!   below which it has received every event (the last event's revision +
//!   1, or a progress notification's revision + 1). The client's
//!   `next_revision` runs ahead of what the caller has taken from its
//!   queue, so it is not what the watcher vouches for.
//! - Every store revision after `H` is a change of a watched key: nothing
//!   else writes during the run (the readiness probe writes before).
//!
//! After the schedule and the heal, [`finish`] reads the store revision
//! once more (a final read) and waits, at most [`CATCH_UP_TIMEOUT`], for
//! every watcher to have received every event up to it, then stops them.
//! [`crate::watch_check`] judges the history.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kvclient::{Consistency, PutOptions, Watch, WatchBatch};
use rand::rngs::SmallRng;
use rand::{Rng as _, SeedableRng as _};
use tokio::time::Instant;
use tokio_stream::StreamExt as _;

use super::{
    EventKind, Function, History, Op, Outcome, WatchEventRecord, WatchRecord, WorkloadConfig,
    client, write_error_outcome,
};

/// The prefix every key of the workload has (and the watchers watch).
pub const PREFIX: &str = "w/";
/// Keys written: few, so each key sees puts, deletes and expiries.
pub const KEYS: u64 = 8;
/// Percentage of a worker's turns that put without a TTL.
const PUT_PERCENT: u32 = 40;
/// Percentage that put with a TTL (the run's `--ttl-min` ..= `--ttl-max`).
const PUT_TTL_PERCENT: u32 = 15;
/// Percentage that delete (the rest are linearizable reads).
const DELETE_PERCENT: u32 = 15;
/// Longest a watcher waits for its catch-up after the final read.
pub const CATCH_UP_TIMEOUT: Duration = Duration::from_secs(45);
/// Pause between two checks of the watchers' progress while catching up.
const CATCH_UP_POLL: Duration = Duration::from_millis(200);
/// Streams one watcher opens at most (a bound on a flapping cluster).
pub const STREAMS_PER_WATCHER_MAX: u64 = 1000;
/// Batches one watcher records at most.
pub const BATCHES_PER_WATCHER_MAX: u64 = 1_000_000;
/// Pause before a watcher opens a new stream after one failed to open.
const REOPEN_PAUSE: Duration = Duration::from_millis(500);
/// How long a watcher may run past the schedule's end whatever happens.
pub const WATCHER_OVERRUN_MAX: Duration = Duration::from_secs(300);
/// Attempts of the first and the final read.
const READ_ATTEMPTS_MAX: u32 = 10;
/// Pause between two attempts of those reads.
const READ_PAUSE: Duration = Duration::from_secs(1);

/// The key name of key `k`.
pub fn key_name(k: u64) -> String {
    format!("{PREFIX}{k}")
}

/// The key of the `n`th TTL put to a fresh key (written once; it expires).
pub fn ttl_key_name(n: u64) -> String {
    format!("{PREFIX}t/{n:06}")
}

/// The watchers of a run: started by [`run`], stopped by [`finish`].
#[derive(Debug, Default)]
pub struct Watchers {
    stop: AtomicBool,
    /// Each watcher's cursor: every event below it received.
    cursors: Mutex<Vec<Arc<AtomicU64>>>,
    tasks: Mutex<Vec<tokio::task::JoinHandle<anyhow::Result<()>>>>,
}

impl Watchers {
    /// No watcher yet.
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }
}

/// Starts one watcher per member (they run until [`finish`]), then the
/// writers until the deadline; every operation goes into `history`.
pub async fn run(
    config: WorkloadConfig,
    history: Arc<History>,
    watchers: Arc<Watchers>,
) -> anyhow::Result<()> {
    let before = store_revision(&config.endpoints, &history, false)
        .await?
        .ok_or_else(|| anyhow::anyhow!("no linearizable read succeeded before the writes"))?;
    start_watchers(PREFIX, before + 1, &config, &history, &watchers);
    let fresh = Arc::new(AtomicU64::new(0));
    let mut workers = tokio::task::JoinSet::new();
    for worker in 0..config.concurrency {
        let (config, history, fresh) = (config.clone(), history.clone(), fresh.clone());
        workers.spawn(async move { worker_loop(worker as u64, config, history, fresh).await });
    }
    while let Some(joined) = workers.join_next().await {
        joined??;
    }
    Ok(())
}

/// Starts one watcher per member over `prefix` (they run until
/// [`stop_watchers`]): watcher `i` starts on member `i`; the even ones
/// from revision `first` (an explicit start revision), the odd ones from
/// "now".
pub fn start_watchers(
    prefix: &'static str,
    first: u64,
    config: &WorkloadConfig,
    history: &Arc<History>,
    watchers: &Arc<Watchers>,
) {
    for watcher in 0..config.endpoints.len() as u64 {
        let cursor = Arc::new(AtomicU64::new(0));
        lock(&watchers.cursors).push(cursor.clone());
        let start = if watcher % 2 == 0 { first } else { 0 };
        let task = tokio::spawn(watcher_loop(
            prefix,
            watcher,
            start,
            config.clone(),
            history.clone(),
            watchers.clone(),
            cursor,
        ));
        lock(&watchers.tasks).push(task);
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A linearizable read of key 0: its header revision (recorded as a read;
/// `final_read` marks the one after the schedule). Retried, bounded.
async fn store_revision(
    endpoints: &[String],
    history: &History,
    final_read: bool,
) -> anyhow::Result<Option<u64>> {
    let client = client(endpoints)?;
    let key = key_name(0);
    for attempt in 1..=READ_ATTEMPTS_MAX {
        let process = history.new_process();
        let mut pending = history.invoke(process, Function::Read, &key);
        pending.op_mut().final_read = final_read;
        match client.read(key.clone(), Consistency::Linearizable).await {
            Ok(read) => {
                let revision = read.revision;
                record_read(pending.op_mut(), read);
                history.complete(pending, Outcome::Ok)?;
                return Ok(Some(revision));
            }
            Err(err) => {
                pending.op_mut().error = Some(format!("attempt {attempt}: {err}"));
                history.complete(pending, Outcome::Fail)?;
                tokio::time::sleep(READ_PAUSE).await;
            }
        }
    }
    Ok(None)
}

fn record_read(op: &mut Op, read: kvclient::Read) {
    let entry = read.entry;
    op.version = Some(entry.as_ref().map_or(0, |e| e.seq));
    op.index = Some(read.applied_index);
    op.record_read_revisions(
        read.revision,
        entry.as_ref().map(|e| e.revisions.mod_revision),
    );
    op.value = entry.map(|e| String::from_utf8_lossy(&e.value).into_owned());
}

async fn worker_loop(
    worker: u64,
    config: WorkloadConfig,
    history: Arc<History>,
    fresh: Arc<AtomicU64>,
) -> anyhow::Result<()> {
    let client = client(&config.endpoints)?;
    let mut rng = SmallRng::seed_from_u64(config.seed ^ worker.wrapping_mul(0x9e37_79b9_7f4a));
    let mut process = history.new_process();
    let mut written = 0_u64;
    let pause = config.worker_pause();
    while Instant::now() < config.deadline {
        let mut key = key_name(rng.random_range(0..KEYS));
        let dice = rng.random_range(0..100);
        let ttl = (PUT_PERCENT..PUT_PERCENT + PUT_TTL_PERCENT).contains(&dice);
        if ttl && rng.random_bool(0.5) {
            key = ttl_key_name(fresh.fetch_add(1, Ordering::Relaxed));
        }
        let write = if dice < PUT_PERCENT + PUT_TTL_PERCENT + DELETE_PERCENT {
            config.gate.begin_write()
        } else {
            None
        };
        let outcome = if write.is_none() {
            let mut pending = history.invoke(process, Function::Read, &key);
            match client.read(key.clone(), Consistency::Linearizable).await {
                Ok(read) => {
                    record_read(pending.op_mut(), read);
                    history.complete(pending, Outcome::Ok)?.outcome
                }
                Err(err) => {
                    pending.op_mut().error = Some(err.to_string());
                    history.complete(pending, Outcome::Fail)?.outcome
                }
            }
        } else if dice < PUT_PERCENT + PUT_TTL_PERCENT {
            written += 1;
            let value = format!("w{worker}-p{process}-{written}");
            let mut pending = history.invoke(process, Function::Write, &key);
            pending.op_mut().value = Some(value.clone());
            let mut options = PutOptions::default();
            if ttl {
                let (low, high) = config.ttl_range;
                let ttl_ms =
                    rng.random_range(low.as_millis()..=high.as_millis().max(low.as_millis()));
                let ttl = Duration::from_millis(ttl_ms as u64);
                pending.op_mut().ttl_ms = Some(ttl_ms as u64);
                config.gate.note_ttl(ttl);
                options = options.ttl(ttl);
            }
            match client.put_with(key.clone(), value, options).await {
                Ok(w) => {
                    pending.op_mut().version = Some(w.seq);
                    pending.op_mut().index = Some(w.applied_index);
                    pending.op_mut().record_write_revision(w.revision);
                    history.complete(pending, Outcome::Ok)?.outcome
                }
                Err(err) => {
                    pending.op_mut().error = Some(err.to_string());
                    history
                        .complete(pending, write_error_outcome(&err))?
                        .outcome
                }
            }
        } else {
            let mut pending = history.invoke(process, Function::Delete, &key);
            match client.delete(key.clone()).await {
                Ok(removed) => {
                    let op = pending.op_mut();
                    op.found = Some(removed.found);
                    op.index = Some(removed.applied_index);
                    if removed.found {
                        op.record_write_revision(removed.revision);
                    }
                    history.complete(pending, Outcome::Ok)?.outcome
                }
                Err(err) => {
                    pending.op_mut().error = Some(err.to_string());
                    history
                        .complete(pending, write_error_outcome(&err))?
                        .outcome
                }
            }
        };
        drop(write);
        if outcome == Outcome::Info {
            process = history.new_process();
        }
        tokio::time::sleep(pause).await;
    }
    Ok(())
}

/// One event as the history records it.
fn event_record(event: &kvclient::WatchEvent) -> WatchEventRecord {
    let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
    let put = event.kind == kvclient::EventKind::Put;
    WatchEventRecord {
        revision: event.revision(),
        key: text(&event.kv.key),
        kind: if put {
            EventKind::Put
        } else {
            EventKind::Delete
        },
        value: put.then(|| text(&event.kv.value)),
        create_revision: put.then_some(event.kv.revisions.create_revision),
        version: put.then_some(event.kv.revisions.version),
        prev_value: event.prev_kv.as_ref().map(|kv| text(&kv.value)),
    }
}

/// The watcher's cursor after `batch`: every event below it received
/// (events: the last one's revision + 1; a progress notification: its
/// revision + 1). The workload writes one key per revision, so no
/// revision is split over batches.
fn cursor_after(cursor: u64, batch: &WatchBatch) -> u64 {
    let through = match batch.events.last() {
        Some(event) => event.revision(),
        None => batch.revision,
    };
    cursor.max(through + 1)
}

async fn watcher_loop(
    prefix: &'static str,
    watcher: u64,
    start: u64,
    config: WorkloadConfig,
    history: Arc<History>,
    watchers: Arc<Watchers>,
    cursor: Arc<AtomicU64>,
) -> anyhow::Result<()> {
    let client = client(&config.endpoints)?;
    let members = config.endpoints.len() as u64;
    let process = history.new_process();
    let hard_stop = config.deadline + WATCHER_OVERRUN_MAX;
    let stopped = || watchers.stop.load(Ordering::SeqCst) || Instant::now() >= hard_stop;
    // The revision the next stream starts from (0: "now", first stream).
    let mut next = start;
    let mut batches = 0_u64;
    'streams: for stream in 0..STREAMS_PER_WATCHER_MAX {
        if stopped() {
            break;
        }
        let slot = (watcher + stream) % members;
        let addr = &config.endpoints[slot as usize];
        let mut pending = history.invoke(process, Function::WatchOpen, prefix);
        pending.op_mut().member = Some(slot + 1);
        let watch = Watch::prefix(prefix)
            .start_revision(next)
            .prev_kv()
            .progress_notify();
        let mut events = match client.watch_on(addr, watch).await {
            Ok(events) => events,
            Err(err) => {
                pending.op_mut().error = Some(format!("{addr}: {err}"));
                pending.op_mut().watch = Some(WatchRecord {
                    watcher,
                    stream,
                    start_revision: Some(next),
                    next_revision: next,
                    events: Vec::new(),
                });
                history.complete(pending, Outcome::Fail)?;
                tokio::time::sleep(REOPEN_PAUSE).await;
                continue;
            }
        };
        let first = if next == 0 {
            events.created_revision() + 1
        } else {
            next
        };
        cursor.fetch_max(first, Ordering::SeqCst);
        pending.op_mut().revision = Some(events.created_revision());
        pending.op_mut().watch = Some(WatchRecord {
            watcher,
            stream,
            start_revision: Some(first),
            next_revision: first,
            events: Vec::new(),
        });
        history.complete(pending, Outcome::Ok)?;
        next = first;
        // The record of the batch being waited for (its invoke time is
        // when the wait began).
        let mut waiting = None;
        loop {
            if stopped() || batches >= BATCHES_PER_WATCHER_MAX {
                break 'streams;
            }
            if waiting.is_none() {
                waiting = Some(history.invoke(process, Function::Watch, prefix));
            }
            let item = tokio::select! {
                item = events.next() => item,
                // Looks at the stop switch now and then.
                () = tokio::time::sleep(CATCH_UP_POLL) => continue,
            };
            let Some(mut pending) = waiting.take() else {
                continue;
            };
            batches += 1;
            let mut record = WatchRecord {
                watcher,
                stream,
                start_revision: None,
                next_revision: next,
                events: Vec::new(),
            };
            match item {
                Some(Ok(batch)) => {
                    next = cursor_after(next, &batch);
                    record.next_revision = next;
                    record.events = batch.events.iter().map(event_record).collect();
                    let op = pending.op_mut();
                    op.member = Some(batch.member_id);
                    op.revision = Some(batch.revision);
                    op.watch = Some(record);
                    history.complete(pending, Outcome::Ok)?;
                    cursor.fetch_max(next, Ordering::SeqCst);
                }
                ended => {
                    // Every batch before the error was taken from the
                    // queue: the stream's own next revision is the resume
                    // point; a compacted watch cannot resume.
                    let compacted = matches!(ended, Some(Err(kvclient::Error::Compacted { .. })));
                    let mut error = match ended {
                        Some(Err(err)) => err.to_string(),
                        _ => "the watch stream ended".to_string(),
                    };
                    if events.next_revision() != next {
                        error = format!(
                            "{error} (the stream's next revision {} differs from the \
                             watcher's {next})",
                            events.next_revision()
                        );
                    }
                    pending.op_mut().error = Some(error);
                    pending.op_mut().watch = Some(record);
                    history.complete(pending, Outcome::Fail)?;
                    if compacted {
                        break 'streams;
                    }
                    continue 'streams;
                }
            }
        }
    }
    Ok(())
}

/// After the schedule and the heal: a final linearizable read of the
/// store revision, a wait (at most [`CATCH_UP_TIMEOUT`]) until every
/// watcher has received every event up to it, then the watchers stop.
/// Returns whether the final read succeeded.
pub async fn finish(
    endpoints: &[String],
    history: &History,
    watchers: &Watchers,
) -> anyhow::Result<bool> {
    let last = store_revision(endpoints, history, true).await?;
    stop_watchers(watchers, last).await?;
    Ok(last.is_some())
}

/// Waits, at most [`CATCH_UP_TIMEOUT`], until every watcher has received
/// every event up to revision `last` (if known), then stops them.
pub async fn stop_watchers(watchers: &Watchers, last: Option<u64>) -> anyhow::Result<()> {
    if let Some(last) = last {
        let started = Instant::now();
        while started.elapsed() < CATCH_UP_TIMEOUT {
            let behind = lock(&watchers.cursors)
                .iter()
                .any(|c| c.load(Ordering::SeqCst) <= last);
            if !behind {
                break;
            }
            tokio::time::sleep(CATCH_UP_POLL).await;
        }
    }
    watchers.stop.store(true, Ordering::SeqCst);
    let tasks: Vec<_> = lock(&watchers.tasks).drain(..).collect();
    for task in tasks {
        task.await??;
    }
    Ok(())
}
