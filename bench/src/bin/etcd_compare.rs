//! `etcd-compare`: raftcask vs etcd on two running three-member clusters,
//! with the same load code (`kvbench::load`): the matrix of
//! `kvbench::versus` (put 256 B, put 4 KiB, linearizable get, stale /
//! serializable get × client counts) for three contenders taking turns
//! inside each cell: raftcask's native gRPC API, raftcask's etcd v3 port
//! (driven by the same etcd backend as etcd) and etcd. Prints one Markdown
//! table (ops/s, p50, p99, p99.9, errors, the members' CPU per operation
//! when their process ids are given, and the ratios to etcd and to native
//! raftcask) and writes an SVG. `deploy/bench/compare-etcd.sh` starts both
//! clusters, runs this, and stops them.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Parser;
use kvbench::load::etcd_leader;
use kvbench::versus::{
    CLIENTS_FULL, CLIENTS_QUICK, Contender, MatrixConfig, WORKLOADS, run_matrix, table, write_svg,
};

/// Measured seconds per contender and cell of the full matrix.
const SECONDS_FULL: u64 = 15;
/// Measured seconds per contender and cell of `--quick`.
const SECONDS_QUICK: u64 = 4;

#[derive(Debug, Parser)]
#[command(
    about = "raftcask (native and through its etcd port) vs etcd: one table and an SVG (bounded: cells × 3 × --seconds)"
)]
struct Args {
    /// raftcask client addresses, comma-separated.
    #[arg(long, value_delimiter = ',', required = true)]
    raftcask: Vec<String>,
    /// raftcask's etcd port addresses (the same members), comma-separated.
    #[arg(long, value_delimiter = ',', required = true)]
    raftcask_etcd: Vec<String>,
    /// etcd client addresses, comma-separated.
    #[arg(long, value_delimiter = ',', required = true)]
    etcd: Vec<String>,
    /// raftcask's member process ids, comma-separated (their CPU per
    /// operation goes in the table; without them it shows n/a).
    #[arg(long, value_delimiter = ',')]
    raftcask_pids: Vec<u32>,
    /// etcd's member process ids, comma-separated (as --raftcask-pids).
    #[arg(long, value_delimiter = ',')]
    etcd_pids: Vec<u32>,
    /// The reduced matrix: client counts 1 and 64, 4 s per run.
    #[arg(long)]
    quick: bool,
    /// Client counts (default 1,16,64; with --quick 1,64).
    #[arg(long, value_delimiter = ',')]
    clients: Vec<usize>,
    /// Measured seconds per contender and cell (default 15; with --quick 4).
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
        raftcask_etcd: args.raftcask_etcd,
        etcd: args.etcd,
        raftcask_pids: args.raftcask_pids,
        etcd_pids: args.etcd_pids,
        clients,
        duration: Duration::from_secs(seconds),
        connections: args.connections,
        key_size_bytes: args.key_size,
        key_space: args.key_space,
        seed: args.seed,
    };
    for contender in [Contender::RaftcaskEtcd, Contender::Etcd] {
        let endpoints = matrix.endpoints(contender);
        let leader = etcd_leader(endpoints)
            .await
            .with_context(|| format!("{} endpoints", contender.name()))?;
        eprintln!(
            "etcd-compare: {} leader {}",
            contender.name(),
            leader
                .as_deref()
                .unwrap_or("not found (writes go to the first endpoint, which forwards them)")
        );
    }
    let cells_total = WORKLOADS.len() * matrix.clients.len();
    let contenders = Contender::ALL.len() as u64;
    eprintln!(
        "etcd-compare: {cells_total} cells x {contenders} systems x {seconds} s (about {} s)",
        cells_total as u64 * contenders * seconds
    );
    let mut done = 0;
    let cells = run_matrix(&matrix, |cell| {
        done += 1;
        let figures: Vec<String> = Contender::ALL
            .iter()
            .map(|&c| {
                let s = cell.summary(c);
                format!(
                    "{} {:.0} ops/s p99 {:.2} ms",
                    c.name(),
                    s.ops_per_second,
                    s.p99_ms
                )
            })
            .collect();
        eprintln!(
            "[{done}/{cells_total}] {} x{}: {}",
            cell.workload,
            cell.clients,
            figures.join(" | ")
        );
    })
    .await
    .context("invalid settings")?;
    let title = format!(
        "raftcask (native, etcd API) vs etcd, {} B keys from {}, {} s per run, {} connection(s) per endpoint",
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
        .filter(|c| {
            Contender::ALL
                .iter()
                .any(|&k| c.summary(k).ops_per_second == 0.0)
        })
        .map(|c| c.label())
        .collect();
    if !silent.is_empty() {
        bail!("no operation succeeded in: {}", silent.join(", "));
    }
    Ok(())
}
