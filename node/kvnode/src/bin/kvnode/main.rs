//! The kvnode binary: one member of a raftcask cluster, or a local cluster
//! of child processes (DESIGN §6).
//!
//! - `kvnode` with no arguments runs a single-node cluster on local
//!   defaults (data `./kvdata`, client 127.0.0.1:7001, peer :7101, admin
//!   :7201).
//! - `kvnode run ...` runs one member of a static initial cluster.
//! - `kvnode local --nodes N ...` runs N `kvnode run` child processes on one
//!   host ([`local`]).
//! - `kvnode restore --from FILE --data-dir D --id N --initial-cluster ...`
//!   seeds a member of a new cluster from a backup archive ([`restore`]).
//!
//! `main` parses flags, sets up tracing and calls the library; SIGINT and
//! SIGTERM shut a member down gracefully.

mod local;
mod restore;

use std::collections::BTreeMap;
use std::io::IsTerminal as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::{Parser, Subcommand};
use kvnode::merge_policy::{
    MERGE_DEAD_BYTES_MIN_DEFAULT, MERGE_DEAD_RATIO_MIN_DEFAULT, MergePolicy,
    SNAPSHOT_EVERY_BYTES_DEFAULT, SNAPSHOT_EVERY_ENTRIES_DEFAULT, SnapshotPolicy,
};
use kvnode::node::SNAPSHOT_LOG_KEEP_DEFAULT;
use kvnode::{Node, NodeConfig, NodeInfo};

/// Log filter when `RUST_LOG` is unset: our own events at info, openraft's
/// (one line per heartbeat-level step at info) only from warn.
const DEFAULT_LOG_FILTER: &str = "info,openraft=warn";

/// How long a member lets in-flight requests finish when asked to stop.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// Data directory of the no-argument single-node cluster.
const DEFAULT_DATA_DIR: &str = "./kvdata";
/// Client address of the no-argument single-node cluster.
const DEFAULT_CLIENT_ADDR: &str = "127.0.0.1:7001";
/// Peer address of the no-argument single-node cluster.
const DEFAULT_PEER_ADDR: &str = "127.0.0.1:7101";
/// Admin address of the no-argument single-node cluster.
const DEFAULT_ADMIN_ADDR: &str = "127.0.0.1:7201";

#[derive(Debug, Parser)]
#[command(
    name = "kvnode",
    version = version_line(),
    about = "A raftcask member. Without a command: a single-node cluster on local defaults \
             (data ./kvdata, client 127.0.0.1:7001, peer :7101, admin :7201)."
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Cmd>,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Runs one member of a cluster.
    Run(RunArgs),
    /// Runs a local cluster: N `kvnode run` child processes on one host.
    Local(local::LocalArgs),
    /// Seeds a member of a new cluster from a backup archive.
    Restore(restore::RestoreArgs),
}

/// Flags of `kvnode run`.
#[derive(Debug, clap::Args)]
struct RunArgs {
    /// Member id (from 1).
    #[arg(long, env = "KVNODE_ID", value_parser = clap::value_parser!(u64).range(1..))]
    id: u64,
    /// Data directory (created if missing).
    #[arg(long, env = "KVNODE_DATA_DIR")]
    data_dir: PathBuf,
    /// Address the client port binds (kv and cluster services), e.g.
    /// 0.0.0.0:7001; the address others use is this member's entry in
    /// --initial-cluster.
    #[arg(long, env = "KVNODE_CLIENT_ADDR")]
    client_addr: SocketAddr,
    /// Address the peer port binds (Raft service only).
    #[arg(long, env = "KVNODE_PEER_ADDR")]
    peer_addr: SocketAddr,
    /// Admin HTTP address (`/metrics`, `/health`, `/ready`); none if omitted.
    #[arg(long, env = "KVNODE_ADMIN_ADDR")]
    admin_addr: Option<SocketAddr>,
    /// The initial members: `1=<client>/<peer>,2=...`, each address
    /// host:port (an IP or a name, e.g. node1:7001 in a compose network).
    #[arg(long, env = "KVNODE_INITIAL_CLUSTER")]
    initial_cluster: String,
    /// Initialize the cluster if the log is empty (never re-initializes an
    /// existing directory). As a variable: KVNODE_BOOTSTRAP=true.
    #[arg(long, env = "KVNODE_BOOTSTRAP")]
    bootstrap: bool,
    /// Log entries kept behind a snapshot when the log is purged (0: a
    /// follower behind the snapshot catches up by snapshot).
    #[arg(long, env = "KVNODE_SNAPSHOT_LOG_KEEP", default_value_t = SNAPSHOT_LOG_KEEP_DEFAULT)]
    snapshot_log_keep: u64,
    /// Build a snapshot after this many entries since the last one (0 =
    /// never by entries).
    #[arg(long, env = "KVNODE_SNAPSHOT_EVERY_ENTRIES", default_value_t = SNAPSHOT_EVERY_ENTRIES_DEFAULT)]
    snapshot_every_entries: u64,
    /// Build a snapshot when the engine holds this many file bytes the last
    /// snapshot does not (0 = never by bytes).
    #[arg(long, env = "KVNODE_SNAPSHOT_EVERY_BYTES", default_value_t = SNAPSHOT_EVERY_BYTES_DEFAULT)]
    snapshot_every_bytes: u64,
    /// Never propose merges when leading (the engine's files then only
    /// grow; for tests and diagnosis).
    #[arg(long, env = "KVNODE_NO_MERGE")]
    no_merge: bool,
    /// Propose a merge when the sealed files' dead bytes reach this share
    /// of their bytes ...
    #[arg(long, env = "KVNODE_MERGE_DEAD_RATIO_MIN", default_value_t = MERGE_DEAD_RATIO_MIN_DEFAULT)]
    merge_dead_ratio_min: f64,
    /// ... and at least this many bytes.
    #[arg(long, env = "KVNODE_MERGE_DEAD_BYTES_MIN", default_value_t = MERGE_DEAD_BYTES_MIN_DEFAULT)]
    merge_dead_bytes_min: u64,
    /// TEST FAULT: answer this percentage of applied writes with an error
    /// (the reply is "lost"; clients retry). For the fault suite only.
    #[arg(long, env = "KVNODE_TEST_DROP_WRITE_REPLY_PERCENT", default_value_t = 0,
          value_parser = clap::value_parser!(u8).range(0..=100), hide = true)]
    test_drop_write_reply_percent: u8,
}

/// `kvnode --version`: the version and the test-only features of this
/// build (`features: none` for a real build; the fault suite reads it).
fn version_line() -> &'static str {
    static LINE: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    LINE.get_or_init(|| {
        let features = if kvnode::BUILD_FEATURES.is_empty() {
            "none".to_string()
        } else {
            kvnode::BUILD_FEATURES.join(",")
        };
        format!("{} features: {features}", env!("CARGO_PKG_VERSION"))
    })
}

pub(crate) fn parse_cluster(spec: &str) -> anyhow::Result<BTreeMap<u64, NodeInfo>> {
    let mut members = BTreeMap::new();
    for part in spec.split(',').filter(|p| !p.is_empty()) {
        let (id, addrs) = part.split_once('=').with_context(|| {
            format!("--initial-cluster member {part:?}: expected ID=CLIENT/PEER")
        })?;
        let (client, peer) = addrs.split_once('/').with_context(|| {
            format!("--initial-cluster member {part:?}: expected ID=CLIENT/PEER")
        })?;
        let id: u64 = id
            .parse()
            .with_context(|| format!("--initial-cluster member id {id:?}"))?;
        if id == 0 {
            bail!("--initial-cluster member {part:?}: ids start at 1");
        }
        let info = NodeInfo {
            client_addr: client.to_string(),
            peer_addr: peer.to_string(),
        };
        info.validate(id)
            .map_err(|err| anyhow::anyhow!("--initial-cluster {err}"))?;
        if members.insert(id, info).is_some() {
            bail!("--initial-cluster lists member {id} twice");
        }
    }
    if members.is_empty() {
        bail!("--initial-cluster lists no member");
    }
    Ok(members)
}

fn run_config(args: RunArgs) -> anyhow::Result<NodeConfig> {
    let initial_cluster = parse_cluster(&args.initial_cluster)?;
    if !initial_cluster.contains_key(&args.id) {
        bail!("--initial-cluster does not list member {}", args.id);
    }
    let mut config = NodeConfig::new(
        args.id,
        args.data_dir,
        args.client_addr,
        args.peer_addr,
        initial_cluster,
    );
    config.bootstrap = args.bootstrap;
    if args.test_drop_write_reply_percent > 0 {
        tracing::warn!(
            percent = args.test_drop_write_reply_percent,
            "TEST FAULT: dropping this share of applied-write replies"
        );
        config
            .faults
            .set_drop_write_reply_percent(args.test_drop_write_reply_percent);
    }
    config.admin_addr = args.admin_addr;
    config.snapshot_log_keep = args.snapshot_log_keep;
    config.snapshot_policy = SnapshotPolicy {
        every_entries: args.snapshot_every_entries,
        every_bytes: args.snapshot_every_bytes,
    };
    if !(0.0..=1.0).contains(&args.merge_dead_ratio_min) {
        bail!(
            "--merge-dead-ratio-min {} is not between 0 and 1",
            args.merge_dead_ratio_min
        );
    }
    config.merge_policy = MergePolicy {
        enabled: !args.no_merge,
        dead_ratio_min: args.merge_dead_ratio_min,
        dead_bytes_min: args.merge_dead_bytes_min,
        ..MergePolicy::default()
    };
    Ok(config)
}

fn default_config() -> anyhow::Result<NodeConfig> {
    let client_addr: SocketAddr = DEFAULT_CLIENT_ADDR.parse()?;
    let peer_addr: SocketAddr = DEFAULT_PEER_ADDR.parse()?;
    let mut config = NodeConfig::new(
        1,
        DEFAULT_DATA_DIR,
        client_addr,
        peer_addr,
        BTreeMap::from([(
            1,
            NodeInfo {
                client_addr: client_addr.to_string(),
                peer_addr: peer_addr.to_string(),
            },
        )]),
    );
    config.bootstrap = true;
    config.admin_addr = Some(DEFAULT_ADMIN_ADDR.parse()?);
    Ok(config)
}

/// Resolves on SIGINT (Ctrl-C) or SIGTERM.
async fn wait_for_signal() -> anyhow::Result<()> {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        result = tokio::signal::ctrl_c() => result?,
        _ = term.recv() => {}
    }
    Ok(())
}

async fn run_member(config: NodeConfig) -> anyhow::Result<()> {
    local::follow_parent()?;
    let node = Node::start(config).await.context("starting the node")?;
    wait_for_signal().await?;
    tracing::info!("shutting down");
    node.shutdown(SHUTDOWN_GRACE).await;
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    // Logs go to stderr (stdout is for `local`'s table), coloured only on a
    // terminal (a `local` child writes to its log file).
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(DEFAULT_LOG_FILTER)),
        )
        .init();
    let cli = Cli::parse();
    match cli.command {
        None => run_member(default_config()?).await,
        Some(Cmd::Run(args)) => run_member(run_config(args)?).await,
        Some(Cmd::Local(args)) => local::run(args).await,
        Some(Cmd::Restore(args)) => restore::run(args).await,
    }
}
