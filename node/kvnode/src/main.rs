//! The kvnode binary: one member of a raftcask cluster (DESIGN §6).
//!
//! `kvnode` with no arguments runs a single-node cluster on local defaults;
//! `kvnode run ...` runs one member of a static initial cluster.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::{Parser, Subcommand};
use kvnode::{Node, NodeConfig, NodeInfo};

/// Log filter when `RUST_LOG` is unset: our own events at info, openraft's
/// (one line per heartbeat-level step at info) only from warn.
const DEFAULT_LOG_FILTER: &str = "info,openraft=warn";

#[derive(Debug, Parser)]
#[command(name = "kvnode", about = "A raftcask member")]
struct Cli {
    #[command(subcommand)]
    command: Option<Cmd>,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Runs one member of a cluster.
    Run {
        /// Member id (from 1).
        #[arg(long)]
        id: u64,
        /// Data directory.
        #[arg(long)]
        data_dir: PathBuf,
        /// Client port address.
        #[arg(long)]
        client_addr: SocketAddr,
        /// Peer port address.
        #[arg(long)]
        peer_addr: SocketAddr,
        /// `1=<client>/<peer>,2=...`
        #[arg(long)]
        initial_cluster: String,
        /// Initialize the cluster if the log is empty.
        #[arg(long)]
        bootstrap: bool,
    },
}

fn parse_cluster(spec: &str) -> anyhow::Result<BTreeMap<u64, NodeInfo>> {
    let mut members = BTreeMap::new();
    for part in spec.split(',').filter(|p| !p.is_empty()) {
        let (id, addrs) = part
            .split_once('=')
            .with_context(|| format!("member {part:?}: expected ID=CLIENT/PEER"))?;
        let (client, peer) = addrs
            .split_once('/')
            .with_context(|| format!("member {part:?}: expected ID=CLIENT/PEER"))?;
        let id: u64 = id.parse().with_context(|| format!("member id {id:?}"))?;
        if members
            .insert(
                id,
                NodeInfo {
                    client_addr: client.to_string(),
                    peer_addr: peer.to_string(),
                },
            )
            .is_some()
        {
            bail!("member {id} is listed twice");
        }
    }
    if members.is_empty() {
        bail!("--initial-cluster lists no member");
    }
    Ok(members)
}

async fn wait_for_signal() -> anyhow::Result<()> {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        result = tokio::signal::ctrl_c() => result?,
        _ = term.recv() => {}
    }
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(DEFAULT_LOG_FILTER)),
        )
        .init();
    let cli = Cli::parse();
    let config = match cli.command {
        None => {
            let client_addr: SocketAddr = "127.0.0.1:7001".parse()?;
            let peer_addr: SocketAddr = "127.0.0.1:7101".parse()?;
            let mut config = NodeConfig::new(
                1,
                "./kvdata",
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
            config.admin_addr = Some("127.0.0.1:7201".parse()?);
            config
        }
        Some(Cmd::Run {
            id,
            data_dir,
            client_addr,
            peer_addr,
            initial_cluster,
            bootstrap,
        }) => {
            let initial_cluster = parse_cluster(&initial_cluster)?;
            if !initial_cluster.contains_key(&id) {
                bail!("--initial-cluster does not list member {id}");
            }
            let mut config = NodeConfig::new(id, data_dir, client_addr, peer_addr, initial_cluster);
            config.bootstrap = bootstrap;
            config
        }
    };
    let node = Node::start(config).await.context("starting the node")?;
    wait_for_signal().await?;
    tracing::info!("shutting down");
    node.shutdown(Duration::from_secs(5)).await;
    Ok(())
}
