//! `cluster-load`: drives a running raftcask cluster with concurrent gRPC
//! clients and prints one Markdown table: operations, seconds, ops/s,
//! latency percentiles, errors, and the mean operations per Raft entry. See
//! `kvbench::load`.
//!
//! Example (a local cluster from `kvnode local --nodes 3`):
//! `cluster-load put --clients 64 --ops 50000 --duration 20s`.

use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::{Parser, ValueEnum};
use kvbench::load::{LoadConfig, OpKind, ReadTarget, run};
use kvproto::kv::v1::Consistency;

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Op {
    Put,
    Get,
    Mixed,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum ConsistencyArg {
    Linearizable,
    Stale,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum ReadsFrom {
    /// Client i reads from endpoint i mod n.
    Any,
    /// Every read goes to the leader.
    Leader,
}

#[derive(Debug, Parser)]
#[command(about = "Load generator for a raftcask cluster (bounded by --ops and --duration)")]
struct Args {
    /// put, get or mixed.
    #[arg(value_enum)]
    op: Op,
    /// Client addresses of the members, comma-separated.
    #[arg(
        long,
        env = "KVCTL_ENDPOINTS",
        value_delimiter = ',',
        default_value = "127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003"
    )]
    endpoints: Vec<String>,
    /// Concurrent clients (one operation in flight each).
    #[arg(long, default_value_t = 1)]
    clients: usize,
    /// gRPC connections per endpoint, shared by the clients.
    #[arg(long, default_value_t = 4)]
    connections: usize,
    /// Stop after this many operations...
    #[arg(long, default_value_t = 50_000)]
    ops: u64,
    /// ...or after this long (`20s`, `500ms`, `2m`), whichever comes first.
    #[arg(long, default_value = "20s", value_parser = parse_duration)]
    duration: Duration,
    /// Key length in bytes.
    #[arg(long, default_value_t = 16)]
    key_size: usize,
    /// Value length in bytes.
    #[arg(long, default_value_t = 100)]
    value_size: usize,
    /// Keys drawn uniformly from this many.
    #[arg(long, default_value_t = 100_000)]
    key_space: u64,
    /// Percent of gets in `mixed`.
    #[arg(long, default_value_t = 50)]
    read_percent: u8,
    /// Read consistency.
    #[arg(long, value_enum, default_value = "linearizable")]
    consistency: ConsistencyArg,
    /// Where reads go.
    #[arg(long, value_enum, default_value = "any")]
    reads_from: ReadsFrom,
    /// Seed of keys and values.
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

fn parse_duration(text: &str) -> Result<Duration, String> {
    let (number, unit) = text
        .find(|c: char| !c.is_ascii_digit())
        .map(|at| text.split_at(at))
        .unwrap_or((text, "s"));
    let number: u64 = number
        .parse()
        .map_err(|_| format!("{text:?}: expected a number and ms, s or m"))?;
    match unit {
        "ms" => Ok(Duration::from_millis(number)),
        "s" => Ok(Duration::from_secs(number)),
        "m" => Ok(Duration::from_secs(number.saturating_mul(60))),
        _ => Err(format!("{text:?}: unit must be ms, s or m")),
    }
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    let op = match args.op {
        Op::Put => OpKind::Put,
        Op::Get => OpKind::Get,
        Op::Mixed => OpKind::Mixed {
            read_percent: args.read_percent,
        },
    };
    let config = LoadConfig {
        endpoints: args.endpoints,
        clients: args.clients,
        connections: args.connections,
        ops: args.ops,
        duration: args.duration,
        key_size_bytes: args.key_size,
        value_size_bytes: args.value_size,
        key_space: args.key_space,
        op,
        consistency: match args.consistency {
            ConsistencyArg::Linearizable => Consistency::Linearizable,
            ConsistencyArg::Stale => Consistency::Stale,
        },
        read_target: match args.reads_from {
            ReadsFrom::Any => ReadTarget::Spread,
            ReadsFrom::Leader => ReadTarget::Leader,
        },
        seed: args.seed,
    };
    let op_name = format!("{:?}", args.op).to_lowercase();
    let title = format!(
        "{op_name}, {} client(s), {} B keys, {} B values, key space {}",
        config.clients, config.key_size_bytes, config.value_size_bytes, config.key_space
    );
    let clients = config.clients;
    let report = run(config).await.context("invalid settings")?;
    let mut table = report.table(&title, &op_name, clients);
    table.note("latency in ms, per successful operation (redirects included); ops/entry = acknowledged writes / distinct Raft entries (version >> 16) that carried them");
    print!("{}", table.to_markdown());
    if report.ops_ok == 0 {
        bail!("no operation succeeded; is a cluster running at the endpoints?");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("20s"), Ok(Duration::from_secs(20)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("7"), Ok(Duration::from_secs(7)));
        assert!(parse_duration("1h").is_err());
    }
}
