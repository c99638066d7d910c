//! `kvctl bench watch`: what watches cost the write path, and how soon an
//! event follows its write.
//!
//! Three phases against the same cluster, one after another:
//! 1. puts (the kvload core, `--clients`, bounded by `--total` and
//!    `--duration`) with no watcher;
//! 2. the same puts with `--idle-watchers` watchers of a prefix nobody
//!    writes (spread over the endpoints): every applied revision wakes each
//!    of them, which reads a page of nothing;
//! 3. `--clients` writers putting keys of their own prefix, watched by
//!    `--watchers` watchers of that prefix: each event's latency is the
//!    time from the put's acknowledgement to the event's arrival at a
//!    watcher (0 when the event came first).
//!
//! Prints the two throughputs, their ratio, and the event latency
//! percentiles; bounded in operations and time like every bench.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use kvclient::{Client, Watch};
use kvload::{LoadReport, OpKind};
use serde_json::json;
use tokio_stream::StreamExt;

use super::Context;
use crate::cli::BenchArgs;
use crate::exit::Failure;

/// The prefix the latency phase writes and watches (kvload's keys are
/// decimal digits, so neither this nor [`IDLE_PREFIX`] meets them).
pub const WATCHED_PREFIX: &str = "bench-watch/";
/// The prefix the idle watchers watch; nothing writes it.
pub const IDLE_PREFIX: &str = "bench-idle/";
/// Most watchers of either kind.
pub const BENCH_WATCHERS_MAX: usize = 10_000;
/// Watchers opened at once while setting up (each waits for its `created`).
const OPEN_CONCURRENCY: usize = 64;
/// How long the latency phase waits for the last events after its writes.
const DRAIN_WAIT: Duration = Duration::from_secs(10);

fn failure(what: &str, err: impl std::fmt::Display) -> Failure {
    Failure::usage(format!("bench watch: {what}: {err}"))
}

/// Watchers that share one client (one connection per member): each
/// watch is an HTTP/2 stream, and a member serves at most
/// `--max-streams-per-connection` (256 by default) on one connection.
pub const WATCHERS_PER_CLIENT: usize = 128;

/// Opens `count` watchers of `prefix`, spread over the endpoints, a new
/// client for every [`WATCHERS_PER_CLIENT`] of them.
async fn open_watchers(
    context: &Context,
    endpoints: &[String],
    prefix: &str,
    count: usize,
) -> Result<Vec<kvclient::WatchStream>, Failure> {
    let mut watchers = Vec::with_capacity(count);
    let mut clients = Vec::new();
    for _ in 0..count.div_ceil(WATCHERS_PER_CLIENT) {
        clients.push(context.client_for(endpoints, Duration::from_secs(60))?);
    }
    for chunk_start in (0..count).step_by(OPEN_CONCURRENCY) {
        let chunk = (chunk_start..count.min(chunk_start + OPEN_CONCURRENCY)).map(|i| {
            let addr = endpoints[i % endpoints.len()].clone();
            let client = clients[i / WATCHERS_PER_CLIENT].clone();
            let prefix = prefix.to_string();
            async move { client.watch_on(&addr, Watch::prefix(prefix)).await }
        });
        for opened in futures_join_all(chunk).await {
            watchers.push(opened.map_err(|err| failure("open a watcher", err))?);
        }
    }
    Ok(watchers)
}

/// Runs futures concurrently, results in order.
async fn futures_join_all<F, T>(futures: impl Iterator<Item = F>) -> Vec<T>
where
    F: std::future::Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    let handles: Vec<_> = futures.map(tokio::spawn).collect();
    let mut out = Vec::with_capacity(handles.len());
    for handle in handles {
        out.push(handle.await.expect("a watcher opener panicked"));
    }
    out
}

/// One put phase of the kvload core.
async fn put_phase(
    context: &Context,
    args: &BenchArgs,
    total: u64,
    duration: Duration,
) -> Result<LoadReport, Failure> {
    let config = super::bench::load_config(context, args, OpKind::Put, total, duration);
    config
        .validate()
        .map_err(|err| Failure::usage(format!("bench: {err}")))?;
    kvload::run(config)
        .await
        .map_err(|err| Failure::usage(format!("bench: {err}")))
}

/// The latency phase: writers of their own keys, watchers of them all.
async fn latency_phase(
    context: &Context,
    client: &Client,
    endpoints: &[String],
    args: &BenchArgs,
    total: u64,
    duration: Duration,
) -> Result<(Histogram<u64>, u64, u64), Failure> {
    let watchers = open_watchers(context, endpoints, WATCHED_PREFIX, args.watchers).await?;
    // revision -> when its put was acknowledged.
    let acked: Arc<Mutex<HashMap<u64, Instant>>> = Arc::default();
    // (revision, arrival) per watcher.
    let arrivals: Arc<Mutex<Vec<(u64, Instant)>>> = Arc::default();
    let stop = Instant::now() + duration;
    let mut readers = Vec::new();
    for mut watcher in watchers {
        let arrivals = arrivals.clone();
        readers.push(tokio::spawn(async move {
            let deadline = stop + DRAIN_WAIT;
            while let Ok(Some(Ok(batch))) =
                tokio::time::timeout_at(deadline.into(), watcher.next()).await
            {
                let now = Instant::now();
                arrivals
                    .lock()
                    .expect("arrivals")
                    .extend(batch.events.iter().map(|e| (e.revision(), now)));
            }
        }));
    }
    let value = vec![b'v'; args.value_size];
    let per_writer = total.div_ceil(args.clients as u64);
    let mut writers = Vec::new();
    for w in 0..args.clients {
        let (client, acked, value) = (client.clone(), acked.clone(), value.clone());
        writers.push(tokio::spawn(async move {
            let mut ok = 0u64;
            for i in 0..per_writer {
                if Instant::now() >= stop {
                    break;
                }
                let key = format!("{WATCHED_PREFIX}{w:04}/{:06}", i % 1000);
                if let Ok(written) = client.put(key, value.clone()).await {
                    acked
                        .lock()
                        .expect("acked")
                        .insert(written.revision, Instant::now());
                    ok += 1;
                }
            }
            ok
        }));
    }
    let mut puts = 0;
    for writer in writers {
        puts += writer.await.map_err(|err| failure("a writer", err))?;
    }
    // Watchers drain until DRAIN_WAIT after the phase's end at most; stop
    // them as soon as every acknowledged revision arrived everywhere.
    let drain_until = Instant::now() + DRAIN_WAIT;
    for reader in &readers {
        while !reader.is_finished() && Instant::now() < drain_until {
            let arrived = arrivals.lock().expect("arrivals").len();
            if arrived as u64 >= puts * args.watchers as u64 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    for reader in readers {
        reader.abort();
        let _ = reader.await;
    }
    let acked = acked.lock().expect("acked");
    let arrivals = arrivals.lock().expect("arrivals");
    let mut latency = Histogram::<u64>::new(3).map_err(|err| failure("histogram", err))?;
    let mut matched = 0;
    for (revision, arrived) in arrivals.iter() {
        if let Some(ack) = acked.get(revision) {
            let us = arrived.saturating_duration_since(*ack).as_micros() as u64;
            latency.saturating_record(us);
            matched += 1;
        }
    }
    Ok((latency, puts, matched))
}

/// `bench watch`.
pub async fn run(
    context: &Context,
    args: &BenchArgs,
    total: u64,
    duration: Duration,
) -> Result<(), Failure> {
    for (field, value) in [
        ("--watchers", args.watchers),
        ("--idle-watchers", args.idle_watchers),
    ] {
        if value > BENCH_WATCHERS_MAX {
            return Err(Failure::usage(format!(
                "bench watch: {field} = {value}: at most {BENCH_WATCHERS_MAX} (BENCH_WATCHERS_MAX)"
            )));
        }
    }
    if args.clients == 0 {
        return Err(Failure::usage("bench watch: --clients must be at least 1"));
    }
    let client = context.client_for(&context.endpoints, Duration::from_secs(60))?;
    let endpoints = context.endpoints.clone();

    let none = put_phase(context, args, total, duration).await?;
    let idle = open_watchers(context, &endpoints, IDLE_PREFIX, args.idle_watchers).await?;
    let with_idle = put_phase(context, args, total, duration).await?;
    drop(idle);
    let (latency, puts, events) =
        latency_phase(context, &client, &endpoints, args, total, duration).await?;

    let ms = |q: f64| latency.value_at_quantile(q) as f64 / 1000.0;
    let ratio = with_idle.ops_per_second() / none.ops_per_second().max(f64::MIN_POSITIVE);
    let printer = &context.printer;
    if printer.json() {
        printer.print_json(&json!({
            "clients": args.clients,
            "puts_per_second_no_watchers": none.ops_per_second(),
            "idle_watchers": args.idle_watchers,
            "puts_per_second_idle_watchers": with_idle.ops_per_second(),
            "idle_ratio": ratio,
            "watchers": args.watchers,
            "latency_puts": puts,
            "events_matched": events,
            "event_latency_ms": {
                "p50": ms(0.5), "p90": ms(0.9), "p99": ms(0.99), "max": latency.max() as f64 / 1000.0,
            },
        }));
    } else {
        println!(
            "puts, {} clients: {:.0} ops/s with no watcher, {:.0} ops/s with {} idle watchers \
             (ratio {ratio:.3})",
            args.clients,
            none.ops_per_second(),
            with_idle.ops_per_second(),
            args.idle_watchers,
        );
        println!(
            "event latency, put acknowledged -> event at a watcher ({} watchers, {puts} puts, \
             {events} events):",
            args.watchers
        );
        printer.print_table(
            &["p50", "p90", "p99", "max"],
            &[vec![
                format!("{:.3}", ms(0.5)),
                format!("{:.3}", ms(0.9)),
                format!("{:.3}", ms(0.99)),
                format!("{:.3}", latency.max() as f64 / 1000.0),
            ]],
        );
    }
    Ok(())
}
