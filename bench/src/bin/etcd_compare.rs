//! `etcd-compare`: raftcask vs etcd on two running three-member clusters,
//! with the same load code for both (`kvbench::load`): the matrix of
//! `kvbench::versus` (put 256 B, put 4 KiB, linearizable get, stale /
//! serializable get × client counts), the two systems alternating inside
//! each cell. Prints one Markdown table (ops/s, p50, p99, p99.9 of each,
//! and the ratios) and writes an SVG. `deploy/bench/compare-etcd.sh`
//! starts both clusters, runs this, and stops them.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Parser;
use kvbench::load::etcd_leader;
use kvbench::versus::{
    CLIENTS_FULL, CLIENTS_QUICK, MatrixConfig, WORKLOADS, run_matrix, table, write_svg,
};

/// Measured seconds per system and cell of the full matrix.
const SECONDS_FULL: u64 = 15;
/// Measured seconds per system and cell of `--quick`.
const SECONDS_QUICK: u64 = 4;

#[derive(Debug, Parser)]
#[command(about = "raftcask vs etcd: one table and an SVG (bounded: cells × 2 × --seconds)")]
struct Args {
    /// raftcask client addresses, comma-separated.
    #[arg(long, value_delimiter = ',', required = true)]
    raftcask: Vec<String>,
    /// etcd client addresses, comma-separated.
    #[arg(long, value_delimiter = ',', required = true)]
    etcd: Vec<String>,
    /// The reduced matrix: client counts 1 and 64, 4 s per run.
    #[arg(long)]
    quick: bool,
    /// Client counts (default 1,16,64; with --quick 1,64).
    #[arg(long, value_delimiter = ',')]
    clients: Vec<usize>,
    /// Measured seconds per system and cell (default 15; with --quick 4).
    #[arg(long)]
    seconds: Option<u64>,
    /// gRPC connections per endpoint, shared by the clients.
    #[arg(long, default_value_t = 4)]
    connections: usize,
    /// Key length in bytes.
    #[arg(long, default_value_t = 16)]
    key_size: usize,
    /// Keys drawn uniformly from this many (the puts fill them for the gets).
    #[arg(long, default_value_t = 10_000)]
    key_space: u64,
    /// Seed of keys and values.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Where to write the SVG.
    #[arg(long)]
    svg: Option<PathBuf>,
    /// Also write the table here.
    #[arg(long)]
    markdown: Option<PathBuf>,
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    let clients = match (args.clients.is_empty(), args.quick) {
        (false, _) => args.clients.clone(),
        (true, true) => CLIENTS_QUICK.to_vec(),
        (true, false) => CLIENTS_FULL.to_vec(),
    };
    let seconds = args.seconds.unwrap_or(if args.quick {
        SECONDS_QUICK
    } else {
        SECONDS_FULL
    });
    let matrix = MatrixConfig {
        raftcask: args.raftcask,
        etcd: args.etcd,
        clients,
        duration: Duration::from_secs(seconds),
        connections: args.connections,
        key_size_bytes: args.key_size,
        key_space: args.key_space,
        seed: args.seed,
    };
    let leader = etcd_leader(&matrix.etcd).await.context("etcd endpoints")?;
    eprintln!(
        "etcd-compare: etcd leader {}",
        leader
            .as_deref()
            .unwrap_or("not found (writes go to the first endpoint, which forwards them)")
    );
    let cells_total = WORKLOADS.len() * matrix.clients.len();
    eprintln!(
        "etcd-compare: {cells_total} cells x 2 systems x {seconds} s (about {} s)",
        cells_total as u64 * 2 * seconds
    );
    let mut done = 0;
    let cells = run_matrix(&matrix, |cell| {
        done += 1;
        eprintln!(
            "[{done}/{cells_total}] {} x{}: raftcask {:.0} ops/s p99 {:.2} ms | etcd {:.0} ops/s p99 {:.2} ms",
            cell.workload,
            cell.clients,
            cell.raftcask.ops_per_second,
            cell.raftcask.p99_ms,
            cell.etcd.ops_per_second,
            cell.etcd.p99_ms
        );
    })
    .await
    .context("invalid settings")?;
    let title = format!(
        "raftcask vs etcd, {} B keys from {}, {} s per run, {} connection(s) per endpoint",
        matrix.key_size_bytes, matrix.key_space, seconds, matrix.connections
    );
    let markdown = table(&title, &cells).to_markdown();
    print!("{markdown}");
    if let Some(path) = &args.markdown {
        std::fs::write(path, &markdown).with_context(|| format!("writing {}", path.display()))?;
    }
    if let Some(path) = &args.svg {
        write_svg(path, "raftcask vs etcd", &cells)
            .map_err(|err| anyhow::anyhow!("writing {}: {err}", path.display()))?;
    }
    let silent: Vec<_> = cells
        .iter()
        .filter(|c| c.raftcask.ops_per_second == 0.0 || c.etcd.ops_per_second == 0.0)
        .map(|c| c.label())
        .collect();
    if !silent.is_empty() {
        bail!("no operation succeeded in: {}", silent.join(", "));
    }
    Ok(())
}
