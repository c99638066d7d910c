//! `kvctl bench put|get|mixed`: runs the kvload load core against the
//! endpoints with a progress bar (on a terminal), then prints throughput
//! and latency percentiles from the run's histogram (table or JSON) and
//! optionally writes an SVG plot ([`crate::plot`]). `bench watch` is
//! [`super::bench_watch`].

use std::sync::Arc;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressState, ProgressStyle};
use kvclient::kvproto::kv::v1::Consistency;
use kvload::{LoadConfig, LoadReport, OpKind, Progress, ReadTarget, run_observed};
use serde_json::json;

use super::Context;
use crate::cli::{BenchArgs, BenchOp, ConsistencyArg};
use crate::exit::{Exit, Failure};
use crate::output::Style;

/// Operations of a run given only `--duration`.
pub const TOTAL_WITH_DURATION_DEFAULT: u64 = 1_000_000;
/// Operations of a run given neither bound.
pub const TOTAL_DEFAULT: u64 = 10_000;
/// Duration of a run given only `--total`.
pub const DURATION_WITH_TOTAL_DEFAULT: Duration = Duration::from_secs(60);
/// Duration of a run given neither bound (the count ends it first).
pub const DURATION_DEFAULT: Duration = Duration::from_secs(600);
/// How often the progress bar is refreshed.
const PROGRESS_TICK: Duration = Duration::from_millis(100);
/// The percentiles reported, as (label, quantile).
pub const PERCENTILES: [(&str, f64); 4] =
    [("p50", 0.5), ("p90", 0.9), ("p99", 0.99), ("p99.9", 0.999)];

/// A progress bar on standard error, drawn only on a terminal (hidden
/// otherwise); `bytes` picks a byte count display.
pub fn progress_bar(length: u64, bytes: bool) -> ProgressBar {
    let bar = ProgressBar::with_draw_target(Some(length), ProgressDrawTarget::stderr());
    let template = if bytes {
        "{msg} [{bar:40}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}"
    } else {
        "{msg} [{bar:40}] {pos}/{len} ops {rate} eta {eta}"
    };
    if let Ok(style) = ProgressStyle::with_template(template) {
        let style = style.progress_chars("=> ").with_key(
            "rate",
            |state: &ProgressState, w: &mut dyn std::fmt::Write| {
                let _ = write!(w, "{:.0}/s", state.per_sec());
            },
        );
        bar.set_style(style);
    }
    bar
}

/// Latency at `quantile` in ms.
fn ms(report: &LoadReport, quantile: f64) -> f64 {
    report.latency_us.value_at_quantile(quantile) as f64 / 1000.0
}

/// The kvload settings of a run of `op` with the command's flags.
pub fn load_config(
    context: &Context,
    args: &BenchArgs,
    op: OpKind,
    total: u64,
    duration: Duration,
) -> LoadConfig {
    LoadConfig {
        endpoints: context.endpoints.clone(),
        clients: args.clients,
        connections: args.conns,
        ops: total,
        duration,
        key_size_bytes: args.key_size,
        value_size_bytes: args.value_size,
        key_space: args.key_space,
        op,
        consistency: match args.consistency {
            ConsistencyArg::Linearizable => Consistency::Linearizable,
            ConsistencyArg::Stale => Consistency::Stale,
        },
        read_target: ReadTarget::Spread,
        seed: args.seed,
    }
}

/// Runs the bench and prints its report.
pub async fn run(context: &Context, args: BenchArgs) -> Result<(), Failure> {
    let (total, duration) = match (args.total, args.duration) {
        (Some(total), Some(duration)) => (total, duration),
        (Some(total), None) => (total, DURATION_WITH_TOTAL_DEFAULT),
        (None, Some(duration)) => (TOTAL_WITH_DURATION_DEFAULT, duration),
        (None, None) => (TOTAL_DEFAULT, DURATION_DEFAULT),
    };
    let op = match args.op {
        BenchOp::Put => OpKind::Put,
        BenchOp::Get => OpKind::Get,
        BenchOp::Mixed => OpKind::Mixed {
            read_percent: args.read_percent,
        },
        BenchOp::Watch => return super::bench_watch::run(context, &args, total, duration).await,
        BenchOp::Lease => {
            let (total, duration) = super::bench_lease::bounds(args.total, args.duration);
            return super::bench_lease::run(context, &args, total, duration).await;
        }
    };
    let config = load_config(context, &args, op, total, duration);
    // Bad settings are usage errors naming the setting and its bound.
    config
        .validate()
        .map_err(|err| Failure::usage(format!("bench: {err}")))?;
    if let Some(plot) = &args.plot {
        // Fail before the run, not after it.
        std::fs::File::create(plot).map_err(|err| {
            Failure::usage(format!("cannot create plot file {}: {err}", plot.display()))
        })?;
    }
    let op_name = format!("{:?}", args.op).to_lowercase();
    let clients = config.clients;
    let progress = Arc::new(Progress::default());
    let bar = progress_bar(total, false);
    bar.set_message(format!("{op_name} x{clients}"));
    let ticker = {
        let (progress, bar) = (progress.clone(), bar.clone());
        tokio::spawn(async move {
            loop {
                bar.set_position(progress.finished());
                tokio::time::sleep(PROGRESS_TICK).await;
            }
        })
    };
    let result = run_observed(config, progress).await;
    ticker.abort();
    bar.finish_and_clear();
    let report = result.map_err(|err| Failure::usage(format!("bench: {err}")))?;
    let printer = &context.printer;
    if printer.json() {
        let mut latency = serde_json::Map::new();
        for (label, quantile) in PERCENTILES {
            latency.insert(label.to_string(), json!(ms(&report, quantile)));
        }
        latency.insert("max".into(), json!(report.latency_us.max() as f64 / 1000.0));
        latency.insert("mean".into(), json!(report.latency_us.mean() / 1000.0));
        printer.print_json(&json!({
            "op": op_name,
            "clients": clients,
            "connections": args.conns,
            "ops_ok": report.ops_ok,
            "errors": report.errors_total(),
            "errors_by_kind": report.errors,
            "redirects": report.redirects,
            "seconds": report.elapsed.as_secs_f64(),
            "ops_per_second": report.ops_per_second(),
            "latency_ms": latency,
            "ops_per_entry": report.ops_per_entry(),
            "plot": args.plot.as_ref().map(|p| p.display().to_string()),
        }));
    } else {
        println!(
            "{op_name}: {} ops in {:.2} s = {} ops/s, {} clients, {} B keys, {} B values",
            report.ops_ok,
            report.elapsed.as_secs_f64(),
            printer.paint(Style::Bold, &format!("{:.0}", report.ops_per_second())),
            clients,
            args.key_size,
            args.value_size,
        );
        let mut headers: Vec<&str> = PERCENTILES.iter().map(|(label, _)| *label).collect();
        headers.push("max");
        let mut row: Vec<String> = PERCENTILES
            .iter()
            .map(|(_, q)| format!("{:.3}", ms(&report, *q)))
            .collect();
        row.push(format!("{:.3}", report.latency_us.max() as f64 / 1000.0));
        println!("latency (ms):");
        printer.print_table(&headers, &[row]);
        if let Some(ratio) = report.ops_per_entry() {
            println!("writes per Raft entry: {ratio:.2}");
        }
        if report.errors_total() > 0 || report.redirects > 0 {
            println!(
                "errors: {}, redirects followed: {}",
                report.errors_total(),
                report.redirects
            );
            for (kind, n) in &report.errors {
                println!("  {kind}: {n}");
            }
        }
    }
    if let Some(plot) = &args.plot {
        crate::plot::write_svg(plot, &report, &op_name).map_err(|err| {
            Failure::usage(format!("cannot write plot {}: {err}", plot.display()))
        })?;
        if !printer.json() {
            println!("plot: {}", plot.display());
        }
    }
    if report.ops_ok == 0 {
        return Err(Failure::new(
            Exit::Unavailable,
            format!(
                "cluster unavailable: no operation succeeded (tried {})",
                context.endpoints.join(", ")
            ),
        ));
    }
    Ok(())
}
