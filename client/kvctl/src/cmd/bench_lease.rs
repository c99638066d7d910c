//! `kvctl bench lease`: what keeping many leases alive costs, and how
//! fast renewals are answered.
//!
//! Three phases against the same cluster:
//! 1. grants `--leases` leases of TTL `--lease-ttl` ([`GRANT_CONCURRENCY`]
//!    grants in flight);
//! 2. renews them over `--clients` `LeaseKeepAlive` streams to the leader
//!    (on `--conns` connections), each stream owning an equal share of the
//!    leases and renewing each of its leases once per `--renew-every`,
//!    evenly spread (an offered load of leases / renew-every keep-alives
//!    per second; a stream that falls behind catches up as fast as its
//!    window of [`STREAM_WINDOW`] unanswered renewals lets it, so the
//!    achieved rate shows whether the offered one is sustained).
//!    `--renew-every 0` renews as fast as answers come (the window only).
//!    Ends after `--duration` or `--total` keep-alives; the answers still
//!    due are awaited for up to [`DRAIN_WAIT`]. Each keep-alive's latency
//!    runs from its send to its answer (the renewal applied through Raft);
//!    the leader's commit index before and after counts the Raft entries
//!    the phase cost;
//! 3. revokes the leases.
//!
//! Prints the achieved keep-alives per second beside the offered rate,
//! latency percentiles, keep-alives per Raft entry, leases answered TTL 0
//! (expired: a failure of the run), and the grant and revoke rates. The
//! streams stay on the leader found at the start: a leader change during
//! the run ends them (counted as stream errors), which a benchmark should
//! not see.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use kvclient::Client;
use kvclient::kvproto::kv::v1 as pb;
use kvclient::kvproto::kv::v1::kv_client::KvClient;
use serde_json::json;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use super::Context;
use super::bench::{PERCENTILES, progress_bar};
use crate::cli::BenchArgs;
use crate::exit::{Exit, Failure};
use crate::output::Style;

/// Most leases a run grants.
pub const BENCH_LEASES_MAX: usize = 1_000_000;
/// Grants (and revokes) in flight at once.
pub const GRANT_CONCURRENCY: usize = 64;
/// Unanswered renewals per stream at most.
pub const STREAM_WINDOW: usize = 256;
/// How long the answers still due after the run's end are awaited.
pub const DRAIN_WAIT: Duration = Duration::from_secs(5);
/// Keep-alives of a run given no `--total`.
pub const TOTAL_DEFAULT: u64 = 1_000_000;
/// Length of a run given neither `--duration` nor `--total`.
pub const DURATION_DEFAULT: Duration = Duration::from_secs(10);
/// Length of a run given only `--total`.
pub const DURATION_WITH_TOTAL_DEFAULT: Duration = Duration::from_secs(60);
/// Longest latency recorded (longer ones count as this).
const LATENCY_US_MAX: u64 = 60_000_000;

/// The run's bounds from `--total` and `--duration`.
pub fn bounds(total: Option<u64>, duration: Option<Duration>) -> (u64, Duration) {
    match (total, duration) {
        (Some(total), Some(duration)) => (total, duration),
        (Some(total), None) => (total, DURATION_WITH_TOTAL_DEFAULT),
        (None, Some(duration)) => (TOTAL_DEFAULT, duration),
        (None, None) => (TOTAL_DEFAULT, DURATION_DEFAULT),
    }
}

fn usage(message: impl std::fmt::Display) -> Failure {
    Failure::usage(format!("bench lease: {message}"))
}

/// Checks the flags against their bounds.
fn validate(args: &BenchArgs, total: u64, duration: Duration) -> Result<(), Failure> {
    if args.leases == 0 || args.leases > BENCH_LEASES_MAX {
        return Err(usage(format!(
            "--leases = {}: must be in 1..={BENCH_LEASES_MAX} (BENCH_LEASES_MAX)",
            args.leases
        )));
    }
    if args.clients == 0 || args.clients > args.leases.min(kvload::CLIENTS_MAX) {
        return Err(usage(format!(
            "--clients = {}: must be in 1..={} (at most one stream per lease, and \
             CLIENTS_MAX)",
            args.clients,
            args.leases.min(kvload::CLIENTS_MAX)
        )));
    }
    if args.conns == 0 || args.conns > kvload::CONNECTIONS_MAX {
        return Err(usage(format!(
            "--conns = {}: must be in 1..={} (CONNECTIONS_MAX)",
            args.conns,
            kvload::CONNECTIONS_MAX
        )));
    }
    if total == 0 || total > kvload::OPS_MAX {
        return Err(usage(format!(
            "--total = {total}: must be in 1..={} (OPS_MAX)",
            kvload::OPS_MAX
        )));
    }
    if duration.is_zero() || duration > kvload::DURATION_MAX {
        return Err(usage(format!(
            "--duration = {duration:?}: must be in (0, {:?}] (DURATION_MAX)",
            kvload::DURATION_MAX
        )));
    }
    if args.renew_every * 2 > args.lease_ttl {
        return Err(usage(format!(
            "--renew-every = {:?} is more than half of --lease-ttl = {:?}: leases would expire \
             between renewals",
            args.renew_every, args.lease_ttl
        )));
    }
    Ok(())
}

/// Runs `count` calls of `call` with [`GRANT_CONCURRENCY`] in flight, a
/// progress bar named `what`; the results in order.
async fn bounded<T, F, Fut>(what: &str, count: usize, call: F) -> Vec<kvclient::Result<T>>
where
    T: Send + 'static,
    F: Fn(usize) -> Fut,
    Fut: std::future::Future<Output = kvclient::Result<T>> + Send + 'static,
{
    let bar = progress_bar(count as u64, false);
    bar.set_message(what.to_string());
    let mut results = Vec::with_capacity(count);
    let mut pending = VecDeque::new();
    for i in 0..count {
        pending.push_back(tokio::spawn(call(i)));
        if pending.len() >= GRANT_CONCURRENCY
            && let Some(first) = pending.pop_front()
        {
            results.push(first.await.expect("a lease call panicked"));
            bar.inc(1);
        }
    }
    for handle in pending {
        results.push(handle.await.expect("a lease call panicked"));
        bar.inc(1);
    }
    bar.finish_and_clear();
    results
}

/// What one stream did.
struct StreamReport {
    answered: u64,
    /// Answers with TTL 0: the lease had expired.
    lost: u64,
    latency_us: Histogram<u64>,
    /// When its last answer came.
    last_answer: Option<Instant>,
    /// Why it ended early, if it did.
    error: Option<String>,
    /// Renewals sent and never answered.
    unanswered: u64,
}

/// The run phase of one stream: renews `ids` until `stop` or the shared
/// budget of `total` sends is spent, then awaits its answers.
async fn renew(
    mut kv: KvClient<tonic::transport::Channel>,
    ids: Vec<u64>,
    renew_every: Duration,
    stop: Instant,
    budget: Arc<AtomicU64>,
    total: u64,
    progress: Arc<AtomicU64>,
) -> StreamReport {
    let mut report = StreamReport {
        answered: 0,
        lost: 0,
        latency_us: Histogram::new_with_bounds(1, LATENCY_US_MAX, 3).expect("histogram bounds"),
        last_answer: None,
        error: None,
        unanswered: 0,
    };
    let (requests, receiver) = mpsc::channel(STREAM_WINDOW);
    let mut responses = match kv.lease_keep_alive(ReceiverStream::new(receiver)).await {
        Ok(responses) => responses.into_inner(),
        Err(status) => {
            report.error = Some(format!("{:?}: {}", status.code(), status.message()));
            return report;
        }
    };
    // Each lease once per `renew_every`, evenly spread over the stream.
    let pace = renew_every / ids.len() as u32;
    let mut next_send = Instant::now();
    let mut next = 0;
    let mut in_flight: HashMap<u64, VecDeque<Instant>> = HashMap::new();
    let mut unanswered = 0usize;
    let mut sending = true;
    let drain_until = stop + DRAIN_WAIT;
    loop {
        let now = Instant::now();
        if sending && now >= stop {
            sending = false;
        }
        if !sending && (unanswered == 0 || now >= drain_until) {
            break;
        }
        let may_send = sending && unanswered < STREAM_WINDOW;
        let wait_until = if !sending {
            drain_until
        } else if may_send && next_send > now {
            next_send.min(stop)
        } else {
            stop
        };
        tokio::select! {
            biased;
            message = responses.message() => match message {
                Ok(Some(answer)) => {
                    let now = Instant::now();
                    if let Some(sent) = in_flight.get_mut(&answer.id).and_then(VecDeque::pop_front) {
                        unanswered -= 1;
                        report.answered += 1;
                        report.last_answer = Some(now);
                        progress.fetch_add(1, Ordering::Relaxed);
                        let us = now.duration_since(sent).as_micros() as u64;
                        report.latency_us.saturating_record(us.max(1));
                        if answer.ttl_ms == 0 {
                            report.lost += 1;
                        }
                    }
                }
                Ok(None) => {
                    report.error = Some("the leader ended the stream".into());
                    break;
                }
                Err(status) => {
                    report.error = Some(format!("{:?}: {}", status.code(), status.message()));
                    break;
                }
            },
            permit = requests.reserve(), if may_send && next_send <= now => {
                let Ok(permit) = permit else {
                    report.error = Some("the request stream closed".into());
                    break;
                };
                if budget.fetch_add(1, Ordering::Relaxed) >= total {
                    sending = false;
                    continue;
                }
                let id = ids[next];
                next = (next + 1) % ids.len();
                permit.send(pb::LeaseKeepAliveRequest { id });
                in_flight.entry(id).or_default().push_back(Instant::now());
                unanswered += 1;
                // Behind schedule, the next one goes at once (up to the
                // window): the offered rate is kept, not reset.
                next_send += pace;
            }
            () = tokio::time::sleep_until(wait_until.into()) => {}
        }
    }
    report.unanswered = unanswered as u64;
    report
}

/// The leader's commit index (the Raft entries so far).
async fn committed_index(context: &Context, leader: &str) -> Result<u64, Failure> {
    let client = context.client_for(&[leader.to_string()], Duration::from_secs(10))?;
    let status = client.status().await.map_err(|err| context.fail(err))?;
    Ok(status.committed_index)
}

/// `bench lease`.
pub async fn run(
    context: &Context,
    args: &BenchArgs,
    total: u64,
    duration: Duration,
) -> Result<(), Failure> {
    validate(args, total, duration)?;
    let client: Client = context.client_for(&context.endpoints, Duration::from_secs(60))?;

    // 1. Grants.
    let ttl = args.lease_ttl;
    let started = Instant::now();
    let granted = bounded("grant", args.leases, |_| {
        let client = client.clone();
        async move { client.lease_grant(ttl).await.map(|grant| grant.id) }
    })
    .await;
    let grant_seconds = started.elapsed().as_secs_f64();
    let mut ids = Vec::with_capacity(args.leases);
    for result in granted {
        ids.push(result.map_err(|err| context.fail(err))?);
    }

    // 2. Renewals on the leader.
    let leader = client
        .discover_leader()
        .await
        .map_err(|err| context.fail(err))?
        .ok_or_else(|| {
            Failure::new(
                Exit::Unavailable,
                "bench lease: no leader known to renew on",
            )
        })?;
    let mut channels = Vec::with_capacity(args.conns);
    for _ in 0..args.conns {
        let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{leader}"))
            .map_err(|err| usage(format!("leader address {leader:?}: {err}")))?
            .tcp_nodelay(true);
        let channel = endpoint.connect().await.map_err(|err| {
            Failure::new(
                Exit::Unavailable,
                format!("bench lease: cannot connect to the leader {leader}: {err}"),
            )
        })?;
        channels.push(channel);
    }
    let entries_before = committed_index(context, &leader).await?;
    let offered = if args.renew_every.is_zero() {
        None
    } else {
        Some(ids.len() as f64 / args.renew_every.as_secs_f64())
    };
    let expected = offered.map_or(total, |rate| {
        (rate * duration.as_secs_f64()).min(total as f64) as u64
    });
    let bar = progress_bar(expected, false);
    bar.set_message(format!("keep-alive x{}", args.clients));
    let progress = Arc::new(AtomicU64::new(0));
    let budget = Arc::new(AtomicU64::new(0));
    let run_start = Instant::now();
    let stop = run_start + duration;
    let mut streams = Vec::with_capacity(args.clients);
    for s in 0..args.clients {
        let share: Vec<u64> = ids.iter().skip(s).step_by(args.clients).copied().collect();
        let kv = KvClient::new(channels[s % channels.len()].clone());
        streams.push(tokio::spawn(renew(
            kv,
            share,
            args.renew_every,
            stop,
            budget.clone(),
            total,
            progress.clone(),
        )));
    }
    let ticker = {
        let (progress, bar) = (progress.clone(), bar.clone());
        tokio::spawn(async move {
            loop {
                bar.set_position(progress.load(Ordering::Relaxed));
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };
    let mut reports = Vec::with_capacity(streams.len());
    for stream in streams {
        reports.push(stream.await.expect("a renewal stream panicked"));
    }
    ticker.abort();
    bar.finish_and_clear();
    let entries_after = committed_index(context, &leader).await?;

    // 3. Revokes.
    let started = Instant::now();
    let revoked = bounded("revoke", ids.len(), |i| {
        let (client, id) = (client.clone(), ids[i]);
        async move { client.lease_revoke(id).await }
    })
    .await;
    let revoke_seconds = started.elapsed().as_secs_f64();
    let revoke_failures = revoked.iter().filter(|r| r.is_err()).count();

    let mut latency =
        Histogram::<u64>::new_with_bounds(1, LATENCY_US_MAX, 3).expect("histogram bounds");
    let (mut answered, mut lost, mut unanswered) = (0, 0, 0);
    let mut errors = Vec::new();
    let mut last_answer = run_start;
    for report in &reports {
        answered += report.answered;
        lost += report.lost;
        unanswered += report.unanswered;
        latency
            .add(&report.latency_us)
            .map_err(|err| usage(format!("histogram: {err}")))?;
        last_answer = last_answer.max(report.last_answer.unwrap_or(run_start));
        errors.extend(report.error.clone());
    }
    let seconds = last_answer.duration_since(run_start).as_secs_f64();
    let rate = answered as f64 / seconds.max(f64::MIN_POSITIVE);
    let entries = entries_after.saturating_sub(entries_before);
    let per_entry = (entries > 0).then(|| answered as f64 / entries as f64);
    let ms = |q: f64| latency.value_at_quantile(q) as f64 / 1000.0;
    let printer = &context.printer;
    if printer.json() {
        let mut percentiles = serde_json::Map::new();
        for (label, quantile) in PERCENTILES {
            percentiles.insert(label.to_string(), json!(ms(quantile)));
        }
        percentiles.insert("max".into(), json!(latency.max() as f64 / 1000.0));
        percentiles.insert("mean".into(), json!(latency.mean() / 1000.0));
        printer.print_json(&json!({
            "leases": ids.len(),
            "lease_ttl_ms": ttl.as_millis() as u64,
            "streams": args.clients,
            "connections": args.conns,
            "renew_every_ms": args.renew_every.as_millis() as u64,
            "offered_per_second": offered,
            "keep_alives": answered,
            "seconds": seconds,
            "keep_alives_per_second": rate,
            "latency_ms": percentiles,
            "raft_entries": entries,
            "keep_alives_per_entry": per_entry,
            "leases_expired": lost,
            "unanswered": unanswered,
            "stream_errors": errors,
            "grants_per_second": ids.len() as f64 / grant_seconds.max(f64::MIN_POSITIVE),
            "revokes_per_second": ids.len() as f64 / revoke_seconds.max(f64::MIN_POSITIVE),
            "revoke_failures": revoke_failures,
        }));
    } else {
        let offered_text = offered.map_or_else(
            || "as fast as answers come".to_string(),
            |rate| {
                format!(
                    "each renewed every {:?} (offered {rate:.0}/s)",
                    args.renew_every
                )
            },
        );
        println!(
            "lease: {} leases (TTL {:?}) on {} streams, {offered_text}",
            ids.len(),
            ttl,
            args.clients
        );
        println!(
            "keep-alives: {answered} in {seconds:.2} s = {} /s; Raft entries: {entries} ({} \
             keep-alives per entry)",
            printer.paint(Style::Bold, &format!("{rate:.0}")),
            per_entry.map_or_else(|| "-".to_string(), |r| format!("{r:.1}")),
        );
        let mut headers: Vec<&str> = PERCENTILES.iter().map(|(label, _)| *label).collect();
        headers.push("max");
        let mut row: Vec<String> = PERCENTILES
            .iter()
            .map(|(_, q)| format!("{:.3}", ms(*q)))
            .collect();
        row.push(format!("{:.3}", latency.max() as f64 / 1000.0));
        println!("latency (ms), send to answer:");
        printer.print_table(&headers, &[row]);
        println!(
            "grants: {:.0} /s, revokes: {:.0} /s",
            ids.len() as f64 / grant_seconds.max(f64::MIN_POSITIVE),
            ids.len() as f64 / revoke_seconds.max(f64::MIN_POSITIVE)
        );
        if lost > 0 || unanswered > 0 || !errors.is_empty() || revoke_failures > 0 {
            println!(
                "leases expired (answered TTL 0): {lost}, unanswered: {unanswered}, revoke \
                 failures: {revoke_failures}, stream errors: {}",
                errors.len()
            );
            for error in &errors {
                println!("  {error}");
            }
        }
    }
    if answered == 0 {
        return Err(Failure::new(
            Exit::Unavailable,
            format!(
                "bench lease: no keep-alive was answered (leader {leader}; {})",
                errors.join("; ")
            ),
        ));
    }
    if lost > 0 {
        return Err(Failure::new(
            Exit::Unavailable,
            format!("bench lease: {lost} keep-alives found their lease expired"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_default_to_a_ten_second_run() {
        assert_eq!(bounds(None, None), (TOTAL_DEFAULT, DURATION_DEFAULT));
        assert_eq!(
            bounds(Some(5), None),
            (5, DURATION_WITH_TOTAL_DEFAULT),
            "a count alone still has a time bound"
        );
        assert_eq!(
            bounds(None, Some(Duration::from_secs(3))),
            (TOTAL_DEFAULT, Duration::from_secs(3))
        );
    }
}
