//! The set workload: workers add unique elements (each element is a key of
//! its own, `s/<element>`, written once) and, one operation in
//! [`READ_EVERY`], read back a random element added earlier (linearizable
//! `get`: absent is a valid answer only for an add not yet acknowledged);
//! once the run is over and
//! healed a final linearizable scan reads every element. A set checker then
//! compares: every acknowledged add must be in the final read, and nothing
//! that was never added may be.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::{Function, History, Outcome, WorkloadConfig, client, write_error_outcome};
use kvclient::{Consistency, Scan};
use rand::rngs::SmallRng;
use rand::{Rng as _, SeedableRng as _};

/// One operation in this many is a read of an earlier element.
pub const READ_EVERY: u64 = 5;

/// The prefix of every element's key.
pub const PREFIX: &str = "s/";
/// Attempts of the final read (each bounded by the client's operation
/// timeout), so a cluster still recovering gets time.
pub const FINAL_READ_ATTEMPTS_MAX: u32 = 10;
/// Pause between two final-read attempts.
const FINAL_READ_PAUSE: Duration = Duration::from_secs(1);
/// Elements a final read accepts at most (a bound on memory).
pub const ELEMENTS_MAX: usize = 1_000_000;

/// The key of an element.
pub fn element_key(element: &str) -> String {
    format!("{PREFIX}{element:0>10}")
}

/// Runs the adds (and reads) until the deadline; every operation goes into `history`.
pub async fn run(config: WorkloadConfig, history: Arc<History>) -> anyhow::Result<()> {
    let next = Arc::new(AtomicU64::new(0));
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..config.concurrency {
        let (config, history, next) = (config.clone(), history.clone(), next.clone());
        workers.spawn(async move { worker_loop(config, history, next).await });
    }
    while let Some(joined) = workers.join_next().await {
        joined??;
    }
    Ok(())
}

async fn worker_loop(
    config: WorkloadConfig,
    history: Arc<History>,
    next: Arc<AtomicU64>,
) -> anyhow::Result<()> {
    let client = client(&config.endpoints)?;
    let mut process = history.new_process();
    let pause = config.worker_pause();
    let mut rng = SmallRng::seed_from_u64(config.seed ^ process.wrapping_mul(0x9e37_79b9));
    let mut count = 0_u64;
    while tokio::time::Instant::now() < config.deadline {
        count += 1;
        let added = next.load(Ordering::Relaxed);
        if count.is_multiple_of(READ_EVERY) && added > 0 {
            let key = element_key(&rng.random_range(0..added).to_string());
            let mut pending = history.invoke(process, Function::Read, &key);
            match client.get_with(key, Consistency::Linearizable).await {
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
        }
        let Some(_write) = config.gate.begin_write() else {
            tokio::time::sleep(pause).await;
            continue;
        };
        let element = next.fetch_add(1, Ordering::Relaxed).to_string();
        let key = element_key(&element);
        let mut pending = history.invoke(process, Function::Add, &key);
        pending.op_mut().value = Some(element.clone());
        let outcome = match client.put(key, element).await {
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
        }
        tokio::time::sleep(pause).await;
    }
    Ok(())
}

/// The final read: a linearizable scan of every element, retried (bounded)
/// until one succeeds. Returns whether one did.
pub async fn final_read(endpoints: &[String], history: &History) -> anyhow::Result<bool> {
    let client = client(endpoints)?;
    let process = history.new_process();
    for attempt in 1..=FINAL_READ_ATTEMPTS_MAX {
        let mut pending = history.invoke(process, Function::ReadAll, PREFIX);
        pending.op_mut().final_read = true;
        let scan = Scan::prefix(PREFIX).consistency(Consistency::Linearizable);
        let mut after = None;
        let mut values = Vec::new();
        let mut index = None;
        let result: Result<(), kvclient::Error> = async {
            loop {
                let page = client.scan_page(&scan, after.take()).await?;
                index.get_or_insert(page.applied_index);
                for kv in page.entries {
                    if values.len() < ELEMENTS_MAX {
                        values.push(String::from_utf8_lossy(&kv.value).into_owned());
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
