//! One member: the log store and state machine on disk, openraft, the
//! proposal batcher, and the two gRPC ports (peer: Raft service; client: Kv
//! service), the Redis port when configured, with bootstrap and graceful
//! shutdown.

pub(crate) mod clock;
pub mod disk;
pub mod identity;
mod start;
mod tasks;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

pub use crate::hooks::Faults;
pub use crate::raft::propose::LEADER_CATCH_UP_WAIT;
pub use clock::CLUSTER_TIME_STEP_BOUND_MS;
pub use tasks::{IDENTIFY_TIMEOUT, LEARN_IDENTITY_INTERVAL, TICK_INTERVAL};

use crate::node::clock::ClusterClock;
use crate::node::tasks::check_peers_cluster;
use crate::raft::merge_policy::{MergePolicy, SnapshotPolicy};
use crate::raft::network::Network;
use crate::raft::read_index::LinearizableReads;
use crate::raft::types::{NodeInfo, NodeRaft};
use crate::raft::watch::MetricsWatch;
use crate::server::security::{Security, SecurityError};
use crate::state_machine::{StateMachine, StateMachineOptions};

/// Heartbeat interval (DESIGN §3).
pub const HEARTBEAT_MS: u64 = 200;
/// Election timeout range (DESIGN §3).
pub const ELECTION_TIMEOUT_MIN_MS: u64 = 1500;
/// Election timeout range (DESIGN §3).
pub const ELECTION_TIMEOUT_MAX_MS: u64 = 3000;
/// Deadline of one snapshot transfer step.
pub const INSTALL_SNAPSHOT_TIMEOUT_MS: u64 = 10_000;
/// How long a stopping leader waits for another voter to take over
/// ([`Node::hand_over_leadership`]): a caught-up target wins in one round
/// trip; one that lags first gets the missing entries.
pub const LEADER_HANDOVER_WAIT: Duration = Duration::from_secs(3);
/// How long [`Node::shutdown`] waits for openraft to let go of the state
/// machine after it stopped.
pub const SHUTDOWN_RELEASE_WAIT: Duration = Duration::from_secs(5);
/// A stopping leader hands over only to a voter whose last acknowledgement
/// is younger than this (a few heartbeats).
pub const HANDOVER_TARGET_SILENCE_MAX: Duration = Duration::from_millis(4 * HEARTBEAT_MS);

/// How a member starts.
#[derive(Clone, Debug)]
pub struct NodeConfig {
    /// Member id (from 1).
    pub id: u64,
    /// Data directory (`raft-log/` and `state/` inside).
    pub data_dir: PathBuf,
    /// Client port address (bound unless a listener is given).
    pub client_addr: SocketAddr,
    /// Peer port address (bound unless a listener is given).
    pub peer_addr: SocketAddr,
    /// The initial members (id → addresses), used when bootstrapping.
    pub initial_cluster: BTreeMap<u64, NodeInfo>,
    /// Initialize the cluster if the log is empty (one member only).
    pub bootstrap: bool,
    /// Admin HTTP address (`/metrics`, `/health`, `/ready`); `None` = no
    /// admin port.
    pub admin_addr: Option<SocketAddr>,
    /// Redis (RESP) port address (`--redis-addr`); `None` = no Redis port.
    /// Bound at start (port 0 picks a free one: [`Node::redis_addr`]).
    pub redis_addr: Option<SocketAddr>,
    /// etcd v3 port address (`--etcd-addr`); `None` = no etcd port. Bound
    /// at start (port 0 picks a free one: [`Node::etcd_addr`]).
    pub etcd_addr: Option<SocketAddr>,
    /// Log entries kept behind a snapshot when the log is purged
    /// (`--snapshot-log-keep`).
    pub snapshot_log_keep: u64,
    /// How the state machine opens its engine (segment size and such).
    pub state_machine: StateMachineOptions,
    /// When the leader proposes merges (`enabled: false` = never).
    pub merge_policy: MergePolicy,
    /// When this member snapshots (`--snapshot-every-entries`,
    /// `--snapshot-every-bytes`).
    pub snapshot_policy: SnapshotPolicy,
    /// Test hooks: lost replies and cut peer links. Off by default.
    pub faults: Faults,
    /// Limits under load and the free-space watermark ([`crate::server::limits`]).
    pub limits: crate::server::limits::Limits,
    /// TLS on the ports and the client port's token (off by default).
    pub security: Security,
    /// How the leader confirms leadership for a linearizable read
    /// (`--read-policy`; ReadIndex by default, see [`LinearizableReads`]).
    pub read_policy: LinearizableReads,
    /// How much change history the leader keeps before it compacts
    /// (`--history-revisions`, `--history-bytes`).
    pub history_window: kvstate::history::HistoryWindow,
}

/// Default of [`NodeConfig::snapshot_log_keep`]: entries kept behind a
/// snapshot, so a briefly lagging follower catches up from the log.
pub const SNAPSHOT_LOG_KEEP_DEFAULT: u64 = 1000;

impl NodeConfig {
    /// A member with the defaults for everything but its identity and
    /// addresses: no admin port, not bootstrapping.
    pub fn new(
        id: u64,
        data_dir: impl Into<PathBuf>,
        client_addr: SocketAddr,
        peer_addr: SocketAddr,
        initial_cluster: BTreeMap<u64, NodeInfo>,
    ) -> NodeConfig {
        NodeConfig {
            id,
            data_dir: data_dir.into(),
            client_addr,
            peer_addr,
            initial_cluster,
            bootstrap: false,
            admin_addr: None,
            redis_addr: None,
            etcd_addr: None,
            snapshot_log_keep: SNAPSHOT_LOG_KEEP_DEFAULT,
            state_machine: StateMachineOptions::default(),
            merge_policy: MergePolicy::default(),
            snapshot_policy: SnapshotPolicy::default(),
            faults: Faults::default(),
            limits: crate::server::limits::Limits::default(),
            security: Security::default(),
            read_policy: LinearizableReads::default(),
            history_window: kvstate::history::HistoryWindow::default(),
        }
    }
}

/// Listeners bound before start (tests bind ephemeral ports first so they
/// can name every member's addresses up front).
#[derive(Debug)]
pub struct Listeners {
    /// The client port (kv and cluster services).
    pub client: TcpListener,
    /// The peer port (Raft service).
    pub peer: TcpListener,
    /// The admin HTTP port, if any.
    pub admin: Option<TcpListener>,
}

/// Why a member could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The log store failed to open.
    #[error("raft log: {0}")]
    Log(#[from] crate::log_store::LogError),
    /// The state machine failed to open.
    #[error("state machine: {0}")]
    StateMachine(#[from] crate::state_machine::SmError),
    /// openraft refused the configuration or failed.
    #[error("raft: {0}")]
    Raft(String),
    /// The data directory's identity could not be loaded or belongs to
    /// another member.
    #[error("identity: {0}")]
    Identity(#[from] crate::node::identity::IdentityError),
    /// The data directory belongs to another cluster than its peers'.
    #[error(
        "this data directory belongs to cluster {mine:016x}, but member {peer} (a member of \
         --initial-cluster) is in cluster {theirs:016x}: refusing to start; give this member a \
         fresh data directory or point it at its own cluster"
    )]
    ForeignCluster {
        /// The peer that answered.
        peer: u64,
        /// The peer's cluster id.
        theirs: u64,
        /// This directory's cluster id.
        mine: u64,
    },
    /// The TLS material or the token is unusable.
    #[error("security: {0}")]
    Security(#[from] SecurityError),
    /// The configuration is invalid.
    #[error("configuration: {0}")]
    Config(String),
    /// A port could not be bound.
    #[error("bind {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
}

/// A running member.
pub struct Node {
    id: u64,
    metrics: crate::server::metrics::Metrics,
    raft: NodeRaft,
    state_machine: StateMachine,
    client_addr: SocketAddr,
    peer_addr: SocketAddr,
    redis_addr: Option<SocketAddr>,
    etcd_addr: Option<SocketAddr>,
    shutdown: watch::Sender<bool>,
    servers: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node")
            .field("id", &self.id)
            .field("client_addr", &self.client_addr)
            .field("peer_addr", &self.peer_addr)
            .finish_non_exhaustive()
    }
}

fn validate(config: &NodeConfig) -> Result<(), StartError> {
    if config.id == 0 {
        return Err(StartError::Config("member ids start at 1".to_string()));
    }
    if !config.initial_cluster.contains_key(&config.id) {
        return Err(StartError::Config(format!(
            "the initial cluster does not list member {}",
            config.id
        )));
    }
    for (id, info) in &config.initial_cluster {
        info.validate(*id).map_err(StartError::Config)?;
    }
    config.security.validate()?;
    config.limits.validate().map_err(StartError::Config)
}

async fn bind(addr: SocketAddr) -> Result<TcpListener, StartError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| StartError::Bind { addr, source })
}

impl Node {
    /// Starts a member, binding its two ports.
    pub async fn start(config: NodeConfig) -> Result<Node, StartError> {
        validate(&config)?;
        let client = bind(config.client_addr).await?;
        let peer = bind(config.peer_addr).await?;
        let admin = match config.admin_addr {
            Some(addr) => Some(bind(addr).await?),
            None => None,
        };
        Node::start_with_listeners(
            config,
            Listeners {
                client,
                peer,
                admin,
            },
        )
        .await
    }

    /// Starts a member on listeners already bound: storage, the peers'
    /// cluster check, openraft, bootstrap, the ports and the background
    /// tasks (each a step in [`start`](mod@start)).
    pub async fn start_with_listeners(
        config: NodeConfig,
        listeners: Listeners,
    ) -> Result<Node, StartError> {
        validate(&config)?;
        let Listeners {
            client,
            peer,
            admin,
        } = listeners;
        let client_addr = start::local_addr(&client, config.client_addr)?;
        let peer_addr = start::local_addr(&peer, config.peer_addr)?;
        let redis = match config.redis_addr {
            Some(addr) => Some(bind(addr).await?),
            None => None,
        };
        let redis_addr = match (&redis, config.redis_addr) {
            (Some(listener), Some(asked)) => Some(start::local_addr(listener, asked)?),
            _ => None,
        };
        let etcd = match config.etcd_addr {
            Some(addr) => Some(bind(addr).await?),
            None => None,
        };
        let etcd_addr = match (&etcd, config.etcd_addr) {
            (Some(listener), Some(asked)) => Some(start::local_addr(listener, asked)?),
            _ => None,
        };
        let metrics = crate::server::metrics::Metrics::new(config.id);
        let (identity, log_store, state_machine) = start::open_storage(&config, &metrics).await?;
        let network = Network::new(identity.clone(), peer_addr.ip(), config.faults.clone())
            .with_metrics(metrics.clone())
            .with_tls(config.security.tls.clone())?;
        let existing = check_peers_cluster(&network, &identity, &config.initial_cluster).await?;
        state_machine.set_cluster_id(identity.cluster_id());
        let raft =
            start::start_raft(&config, network.clone(), log_store, state_machine.clone()).await?;
        if config.bootstrap {
            start::bootstrap(&config, &raft, &identity, &state_machine, existing).await?;
        }
        let (shutdown, _) = watch::channel(false);
        let member = start::Member {
            config: &config,
            raft: raft.clone(),
            state_machine: state_machine.clone(),
            identity,
            network,
            metrics: metrics.clone(),
            clock: Arc::new(ClusterClock::new(state_machine.clone())),
            shutdown: &shutdown,
        };
        let mut servers = member.serve_ports(client, peer, redis, etcd)?;
        servers.extend(member.spawn_tasks());
        if let Some(listener) = admin {
            servers.push(member.serve_admin(listener)?);
        }
        servers.push(tokio::spawn(start::log_leader_changes(
            config.id,
            raft.metrics(),
            shutdown.subscribe(),
        )));
        tracing::info!(id = config.id, %client_addr, %peer_addr, ?redis_addr, ?etcd_addr, "node started");
        Ok(Node {
            id: config.id,
            metrics,
            raft,
            state_machine,
            client_addr,
            peer_addr,
            redis_addr,
            etcd_addr,
            shutdown,
            servers,
        })
    }

    /// The member id.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The bound client address.
    pub fn client_addr(&self) -> SocketAddr {
        self.client_addr
    }

    /// The bound peer address.
    pub fn peer_addr(&self) -> SocketAddr {
        self.peer_addr
    }

    /// The bound Redis port address, if the member has one.
    pub fn redis_addr(&self) -> Option<SocketAddr> {
        self.redis_addr
    }

    /// The bound etcd port address, if the member has one.
    pub fn etcd_addr(&self) -> Option<SocketAddr> {
        self.etcd_addr
    }

    /// The openraft handle.
    pub fn raft(&self) -> &NodeRaft {
        &self.raft
    }

    /// The state machine.
    pub fn state_machine(&self) -> &StateMachine {
        &self.state_machine
    }

    /// This member's metrics (served on the admin port).
    pub fn metrics(&self) -> &crate::server::metrics::Metrics {
        &self.metrics
    }

    /// If this member leads, hands leadership to the voter whose log is
    /// furthest along (openraft's leader transfer) and waits, at most
    /// `wait`, until another member leads: a member stopping on purpose
    /// (SIGTERM, a rolling restart) costs its cluster a round trip instead
    /// of an election timeout. Returns the new leader, or `None` if this
    /// member did not lead, has no other voter, or nobody took over in time
    /// (the election that follows its stop then picks one).
    pub async fn hand_over_leadership(&self, wait: Duration) -> Option<u64> {
        let metrics = self.raft.metrics().borrow().clone();
        if metrics.current_leader != Some(self.id) {
            return None;
        }
        // Only a voter that answered lately can take over: a leader in a
        // transfer stops serving until someone does, so a transfer to an
        // unreachable member would only add a gap before the election.
        let answered_lately = |id: &u64| {
            metrics
                .heartbeat
                .as_ref()
                .and_then(|h| h.get(id).cloned().flatten())
                .is_some_and(|at| {
                    openraft::Instant::elapsed(&at.into_inner()) < HANDOVER_TARGET_SILENCE_MAX
                })
        };
        let voters: Vec<u64> = metrics
            .membership_config
            .membership()
            .voter_ids()
            .filter(|id| *id != self.id && answered_lately(id))
            .collect();
        // The most caught-up voter by the leader's own replication view;
        // ties go to the lower id.
        let matched = |id: &u64| {
            metrics
                .replication
                .as_ref()
                .and_then(|r| r.get(id).cloned().flatten())
                .map(|log_id| log_id.index)
        };
        let target = voters
            .iter()
            .copied()
            .max_by_key(|id| (matched(id), std::cmp::Reverse(*id)))?;
        tracing::info!(
            id = self.id,
            to = target,
            "stopping: handing leadership over"
        );
        let me = self.id;
        let raft = self.raft.clone();
        let handed_over = async move {
            raft.trigger().transfer_leader(target).await.ok()?;
            let mut watch = raft.metrics();
            let now = watch
                .wait_for(move |m| m.current_leader.is_some_and(|l| l != me))
                .await
                .ok()?;
            now.current_leader
        };
        match tokio::time::timeout(wait, handed_over).await {
            Ok(Some(leader)) => Some(leader),
            _ => {
                tracing::warn!(
                    id = self.id,
                    to = target,
                    ?wait,
                    "nobody took over in time; an election follows this member's stop"
                );
                None
            }
        }
    }

    /// Stops serving (in-flight requests finish, bounded by `grace`), then
    /// stops Raft, and returns once openraft has let go of the state
    /// machine (bounded by [`SHUTDOWN_RELEASE_WAIT`]): openraft 0.10 drops
    /// its copy after `Raft::shutdown` returns, and the engine's directory
    /// lock goes with the last copy, so a restart in the same process could
    /// otherwise find the directory still in use.
    pub async fn shutdown(self, grace: Duration) {
        let _ = self.shutdown.send(true);
        for server in self.servers {
            let abort = server.abort_handle();
            if tokio::time::timeout(grace, server).await.is_err() {
                abort.abort();
            }
        }
        if let Err(err) = self.raft.shutdown().await {
            tracing::warn!(error = %err, "raft shutdown");
        }
        let released = self.state_machine.release_watch();
        drop(self.state_machine);
        drop(self.raft);
        let start = std::time::Instant::now();
        while !released.released() {
            if start.elapsed() >= SHUTDOWN_RELEASE_WAIT {
                tracing::warn!(
                    id = self.id,
                    "the state machine is still held {SHUTDOWN_RELEASE_WAIT:?} after shutdown"
                );
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}
