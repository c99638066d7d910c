//! One member: the log store and state machine on disk, openraft, the
//! proposal batcher, and the two gRPC ports (peer: Raft service; client: Kv
//! service), with bootstrap and graceful shutdown.

pub mod disk;
pub mod identity;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[cfg(not(feature = "lazy-disk"))]
use bitcask::io::RealFs;
use openraft::error::{ClientWriteError, RaftError};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tonic::transport::server::TcpIncoming;

pub use crate::hooks::Faults;
use crate::log_store::{LogStore, LogStoreOptions};
use crate::node::identity::Identity;
use crate::raft::batcher::{Batcher, ProposeError, ProposeFn};
use crate::raft::membership::Membership;
use crate::raft::merge_policy::{MergePolicy, ProposeMerge, SnapshotPolicy};
use crate::raft::network::Network;
use crate::raft::read_index::ReadRounds;
use crate::raft::types::{NodeInfo, TypeConfig};
use crate::server::cluster::ClusterService;
use crate::server::kv::KvService;
use crate::server::raft::PeerService;
use crate::server::security::{ClientCerts, Security, SecurityError};
use crate::state_machine::{StateMachine, StateMachineOptions};
use kvstate::command::{Command, Outcome, Proposal, Request};

/// Heartbeat interval (DESIGN §3).
pub const HEARTBEAT_MS: u64 = 200;
/// Election timeout range (DESIGN §3).
pub const ELECTION_TIMEOUT_MIN_MS: u64 = 1500;
/// Election timeout range (DESIGN §3).
pub const ELECTION_TIMEOUT_MAX_MS: u64 = 3000;
/// Deadline of one snapshot transfer step.
pub const INSTALL_SNAPSHOT_TIMEOUT_MS: u64 = 10_000;

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
            snapshot_log_keep: SNAPSHOT_LOG_KEEP_DEFAULT,
            state_machine: StateMachineOptions::default(),
            merge_policy: MergePolicy::default(),
            snapshot_policy: SnapshotPolicy::default(),
            faults: Faults::default(),
            limits: crate::server::limits::Limits::default(),
            security: Security::default(),
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
    raft: openraft::Raft<TypeConfig>,
    state_machine: StateMachine,
    client_addr: SocketAddr,
    peer_addr: SocketAddr,
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

/// Most that cluster time may advance between two entries beyond the
/// real time between their proposals, from rounding (ARCHITECTURE.md,
/// "Cluster time": the rule and its proof). A leader's monotonic clock may
/// also run fast by its slew rate (at most 500 ppm under NTP).
pub const CLUSTER_TIME_STEP_BOUND_MS: u64 = 1;

/// The leader's cluster clock. In each term this member leads, it starts
/// from the cluster time applied when the term's first proposal is stamped
/// (the leader has then applied every entry of earlier terms, see
/// [`leader_caught_up`]) and advances with this process's monotonic clock.
/// So time between two entries never runs ahead of the real time between
/// their proposals (plus [`CLUSTER_TIME_STEP_BOUND_MS`]); across a
/// leaderless gap it stands still. It never jumps by time this member spent
/// as a follower or idle, which a base taken at process start would carry.
struct ClusterClock {
    /// The cluster time this member has applied.
    applied_ms: Box<dyn Fn() -> u64 + Send + Sync>,
    inner: Mutex<ClockState>,
}

impl std::fmt::Debug for ClusterClock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterClock")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

#[derive(Debug)]
struct ClockState {
    /// The term the base was taken in (`None`: no stamp yet).
    term: Option<u64>,
    /// The cluster time applied when the base was taken.
    base_ms: u64,
    /// When the base was taken.
    at: Instant,
    /// The last stamp given in this term (stamps never decrease).
    last_ms: u64,
}

impl ClusterClock {
    fn new(state_machine: StateMachine) -> ClusterClock {
        ClusterClock::with_source(
            Box::new(move || state_machine.cluster_time_ms()),
            Instant::now(),
        )
    }

    /// A clock over any source of the applied time, created at `now`.
    fn with_source(applied_ms: Box<dyn Fn() -> u64 + Send + Sync>, now: Instant) -> ClusterClock {
        let applied = applied_ms();
        ClusterClock {
            applied_ms,
            inner: Mutex::new(ClockState {
                // NEGATIVE CONTROL (feature nc-old-clock): the base is the
                // time applied at process start, in every term.
                term: cfg!(feature = "nc-old-clock").then_some(0),
                base_ms: applied,
                at: now,
                last_ms: 0,
            }),
        }
    }

    /// The time of a proposal of `term`, by a leader that has applied an
    /// entry of `term` (its blank entry).
    fn stamp(&self, term: u64) -> u64 {
        self.stamp_at(term, Instant::now())
    }

    /// [`ClusterClock::stamp`] at the instant `now`.
    fn stamp_at(&self, term: u64, now_instant: Instant) -> u64 {
        let applied = (self.applied_ms)();
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let term = if cfg!(feature = "nc-old-clock") {
            0
        } else {
            term
        };
        if inner.term != Some(term) {
            *inner = ClockState {
                term: Some(term),
                base_ms: applied,
                at: now_instant,
                last_ms: applied,
            };
        }
        let elapsed = now_instant.saturating_duration_since(inner.at);
        let elapsed_ms = u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX);
        let mut now = inner.base_ms.saturating_add(elapsed_ms);
        if applied > now {
            // Only the old clock gets here (in a term, every applied entry
            // was stamped by this clock or came before its base).
            inner.base_ms = applied;
            inner.at = now_instant;
            now = applied;
        }
        let stamp = now.max(inner.last_ms);
        inner.last_ms = stamp;
        stamp
    }
}

/// How long a new leader waits to apply its predecessors' entries before
/// it stamps its first proposal.
pub const LEADER_CATCH_UP_WAIT: Duration = Duration::from_secs(5);

/// Waits until this leader has applied an entry of its own term (its blank
/// entry): then every earlier entry is applied, so the cluster time it
/// stamps is never below an entry earlier in the log. Returns that term,
/// which the cluster clock re-bases on when it changes.
async fn leader_caught_up(raft: &openraft::Raft<TypeConfig>) -> Result<u64, ProposeError> {
    let caught_up = |m: &openraft::RaftMetrics<u64, NodeInfo>| {
        m.last_applied
            .is_some_and(|applied| applied.leader_id.term >= m.current_term)
    };
    {
        let now = raft.metrics().borrow().clone();
        if caught_up(&now) {
            return Ok(now.current_term);
        }
    }
    let mut metrics = raft.metrics();
    match tokio::time::timeout(LEADER_CATCH_UP_WAIT, metrics.wait_for(caught_up)).await {
        Ok(Ok(now)) => Ok(now.current_term),
        Ok(Err(_)) => Err(ProposeError::Stopped),
        Err(_) => Err(ProposeError::NotApplied(
            "the leader has not applied its own first entry yet".to_string(),
        )),
    }
}

fn propose_fn(raft: openraft::Raft<TypeConfig>, clock: Arc<ClusterClock>) -> ProposeFn {
    Arc::new(move |requests: Vec<Request>| {
        let raft = raft.clone();
        let clock = clock.clone();
        Box::pin(async move {
            let term = leader_caught_up(&raft).await?;
            let proposal = Proposal {
                time_ms: clock.stamp(term),
                command: Command::Requests(requests),
            };
            match raft.client_write(proposal).await {
                Ok(response) => Ok::<Vec<Outcome>, ProposeError>(response.data.outcomes),
                Err(RaftError::APIError(ClientWriteError::ForwardToLeader(forward))) => {
                    Err(ProposeError::NotApplied(forward.to_string()))
                }
                Err(RaftError::APIError(ClientWriteError::ChangeMembershipError(err))) => {
                    Err(ProposeError::NotApplied(err.to_string()))
                }
                Err(RaftError::Fatal(fatal)) => Err(ProposeError::Unknown(fatal.to_string())),
            }
        })
    })
}

/// Proposes a merge entry the way writes and ticks are proposed: once the
/// leader has caught up, stamped with its cluster clock, `client_write`.
fn propose_merge_fn(raft: openraft::Raft<TypeConfig>, clock: Arc<ClusterClock>) -> ProposeMerge {
    Arc::new(move |inputs: Vec<String>| {
        let raft = raft.clone();
        let clock = clock.clone();
        Box::pin(async move {
            let term = leader_caught_up(&raft)
                .await
                .map_err(|err| format!("{err:?}"))?;
            let merge = Proposal {
                time_ms: clock.stamp(term),
                command: Command::Merge { inputs },
            };
            raft.client_write(merge)
                .await
                .map(|_| ())
                .map_err(|err| err.to_string())
        })
    })
}

/// How often the leader checks whether cluster time must advance without
/// client writes (DESIGN §3): at most one tick entry per interval, and only
/// while some key may still expire and no other entry was applied in the
/// last interval.
pub const TICK_INTERVAL: Duration = Duration::from_millis(250);

/// The leader's tick loop: proposes `Command::Tick` entries so TTL keys
/// expire on time when no client writes arrive.
async fn tick_loop(
    id: u64,
    raft: openraft::Raft<TypeConfig>,
    state_machine: StateMachine,
    clock: Arc<ClusterClock>,
    mut stop: watch::Receiver<bool>,
) {
    let mut interval = tokio::time::interval(TICK_INTERVAL);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_seen_applied = None;
    loop {
        tokio::select! {
            _ = interval.tick() => {}
            _ = stop.wait_for(|s| *s) => return,
        }
        let (leader, applied) = {
            let m = raft.metrics().borrow().clone();
            (m.current_leader, m.last_applied.map(|l| l.index))
        };
        let idle = applied == last_seen_applied;
        last_seen_applied = applied;
        if leader != Some(id) || !idle {
            continue;
        }
        let pending = state_machine.engine().expiry_high_water_ms();
        if pending == 0 || pending <= state_machine.cluster_time_ms() {
            continue;
        }
        let Ok(term) = leader_caught_up(&raft).await else {
            continue;
        };
        let tick = Proposal {
            time_ms: clock.stamp(term),
            command: Command::Tick,
        };
        if let Err(err) = raft.client_write(tick).await {
            tracing::debug!(error = %err, "tick not proposed");
        }
    }
}

/// How long a peer may take to answer `Identify` at startup.
pub const IDENTIFY_TIMEOUT: Duration = Duration::from_secs(1);
/// How often a member that does not know its cluster id or an initial
/// member's incarnation yet asks again.
pub const LEARN_IDENTITY_INTERVAL: Duration = Duration::from_secs(1);

/// Asks every other initial member who it is (concurrently, each within
/// [`IDENTIFY_TIMEOUT`]; silent members are skipped) and learns what it
/// can (see [`learn_from`]). A peer in another cluster than this
/// directory's refuses the start. Returns a member that reported an
/// existing cluster, if any.
async fn check_peers_cluster(
    network: &Network,
    identity: &Identity,
    initial: &BTreeMap<u64, NodeInfo>,
) -> Result<Option<(u64, u64)>, StartError> {
    let mut existing = None;
    let me = identity.member_id();
    let asks = initial
        .iter()
        .filter(|(peer, _)| **peer != me)
        .map(|(peer, info)| {
            let (network, peer, info) = (network.clone(), *peer, info.clone());
            async move { (peer, network.identify(peer, &info, IDENTIFY_TIMEOUT).await) }
        });
    for (peer, answer) in futures_join_all(asks).await {
        let Ok((theirs, member, incarnation)) = answer else {
            continue;
        };
        let mine = identity.cluster_id();
        if member == peer && theirs != 0 && mine != 0 && mine != theirs {
            return Err(StartError::ForeignCluster { peer, theirs, mine });
        }
        if member == peer && theirs != 0 {
            existing.get_or_insert((peer, theirs));
        }
        learn_from(identity, peer, (theirs, member, incarnation)).await;
    }
    Ok(existing)
}

/// Records an initial member's answer to `Identify`: its incarnation on
/// first contact and, while this member does not know one, its cluster id.
async fn learn_from(
    identity: &Identity,
    peer: u64,
    (cluster_id, member, incarnation): (u64, u64, u64),
) {
    if member != peer || incarnation == 0 {
        return;
    }
    let identity = identity.clone();
    let learned = tokio::task::spawn_blocking(move || {
        identity.learn_from_peer(peer, incarnation, cluster_id)
    })
    .await;
    if let Ok(Err(err)) = learned {
        tracing::warn!(error = %err, peer, "identify");
    }
}

/// Runs `futures` concurrently and collects their outputs in order.
async fn futures_join_all<F>(futures: impl Iterator<Item = F>) -> Vec<F::Output>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    let mut set = tokio::task::JoinSet::new();
    for (i, fut) in futures.enumerate() {
        set.spawn(async move { (i, fut.await) });
    }
    let mut out: Vec<(usize, F::Output)> = Vec::new();
    while let Some(joined) = set.join_next().await {
        if let Ok(item) = joined {
            out.push(item);
        }
    }
    out.sort_by_key(|(i, _)| *i);
    out.into_iter().map(|(_, o)| o).collect()
}

/// Until this member knows its cluster id and every initial member's
/// incarnation, asks the ones it does not know every
/// [`LEARN_IDENTITY_INTERVAL`] (a leader's AppendEntries also teaches the
/// cluster id, and any peer request its sender's incarnation).
async fn learn_identities(
    network: Network,
    identity: Identity,
    state_machine: StateMachine,
    initial: BTreeMap<u64, NodeInfo>,
    mut stop: watch::Receiver<bool>,
) {
    let me = identity.member_id();
    while !identity.knows_all(initial.keys().copied()) {
        for (peer, info) in initial.iter().filter(|(peer, _)| **peer != me) {
            if identity.cluster_id() != 0 && identity.peer_incarnation(*peer) != 0 {
                continue;
            }
            if let Ok(answer) = network.identify(*peer, info, IDENTIFY_TIMEOUT).await {
                learn_from(&identity, *peer, answer).await;
            }
        }
        state_machine.set_cluster_id(identity.cluster_id());
        tokio::select! {
            _ = tokio::time::sleep(LEARN_IDENTITY_INTERVAL) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
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

    /// Starts a member on listeners already bound.
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
        let client_addr = client.local_addr().map_err(|source| StartError::Bind {
            addr: config.client_addr,
            source,
        })?;
        let peer_addr = peer.local_addr().map_err(|source| StartError::Bind {
            addr: config.peer_addr,
            source,
        })?;
        let log_dir = config.data_dir.join("raft-log");
        let state_dir = config.data_dir.join("state");
        let state_machine_options = config.state_machine.clone();
        let member_metrics = crate::server::metrics::Metrics::new(config.id);
        let fsync_observer = Some(member_metrics.log_fsync_observer());
        let data_dir = config.data_dir.clone();
        let id = config.id;
        let (identity, log_store, state_machine) = tokio::task::spawn_blocking(move || {
            let identity = Identity::load_or_create(&data_dir, id)?;
            // The same vfs as `snapshot::node_vfs`, which identity and the
            // state machine use: the lazy disk in a lazy-disk build.
            #[cfg(feature = "lazy-disk")]
            let log_vfs: Arc<dyn bitcask::io::Vfs> = crate::lazy_disk::shared();
            #[cfg(not(feature = "lazy-disk"))]
            let log_vfs: Arc<dyn bitcask::io::Vfs> = Arc::new(RealFs);
            // The committed id is kept in memory only (`persist_committed`
            // is off by default): the store reopens every vote as
            // uncommitted, so a member that led before a restart must win a
            // new election, whose no-op entry commits after every earlier
            // entry, before it serves a linearizable read. (With a committed
            // vote, openraft 0.9 would restart it as the leader at once and
            // its read index would be the recovered committed id, which after
            // a power cut is only the applied id, below acknowledged writes;
            // see ARCHITECTURE.md, Raft log store.)
            let log_options = LogStoreOptions::default();
            let log = LogStore::<TypeConfig>::open_observed(
                log_vfs,
                log_dir,
                log_options,
                fsync_observer,
            )?;
            let sm = StateMachine::open(state_dir, state_machine_options)?;
            Ok::<_, StartError>((identity, log, sm))
        })
        .await
        .map_err(|err| StartError::Raft(format!("open task: {err}")))??;
        let network = Network::new(identity.clone(), peer_addr.ip(), config.faults.clone())
            .with_metrics(member_metrics.clone())
            .with_tls(config.security.tls.clone())?;
        let existing = check_peers_cluster(&network, &identity, &config.initial_cluster).await?;
        state_machine.set_cluster_id(identity.cluster_id());

        let raft_config = openraft::Config {
            cluster_name: "raftcask".to_string(),
            heartbeat_interval: HEARTBEAT_MS,
            election_timeout_min: ELECTION_TIMEOUT_MIN_MS,
            election_timeout_max: ELECTION_TIMEOUT_MAX_MS,
            install_snapshot_timeout: INSTALL_SNAPSHOT_TIMEOUT_MS,
            max_in_snapshot_log_to_keep: config.snapshot_log_keep,
            snapshot_policy: config.snapshot_policy.openraft(),
            ..Default::default()
        }
        .validate()
        .map_err(|err| StartError::Raft(err.to_string()))?;
        let raft = openraft::Raft::new(
            config.id,
            Arc::new(raft_config),
            network.clone(),
            log_store,
            state_machine.clone(),
        )
        .await
        .map_err(|err| StartError::Raft(err.to_string()))?;

        if config.bootstrap {
            let initialized = raft
                .is_initialized()
                .await
                .map_err(|err| StartError::Raft(err.to_string()))?;
            if let (false, Some((peer, cluster))) = (initialized, existing) {
                // A new (or wiped) directory of the bootstrapping member: the
                // cluster exists; initializing again would fork it.
                tracing::error!(
                    id = config.id,
                    peer,
                    cluster = format!("{cluster:016x}"),
                    "not bootstrapping: member {peer} reports that the cluster already exists, and \
                     this data directory is new; a member that lost its data must be removed and \
                     added again under a new id"
                );
            } else if !initialized {
                let ensure = identity.clone();
                let cluster_id = tokio::task::spawn_blocking(move || ensure.ensure_cluster_id())
                    .await
                    .map_err(|err| StartError::Raft(format!("identity task: {err}")))??;
                state_machine.set_cluster_id(cluster_id);
                tracing::info!(id = config.id, members = ?config.initial_cluster.keys(), "bootstrapping the cluster");
                match raft.initialize(config.initial_cluster.clone()).await {
                    Ok(()) => {}
                    Err(RaftError::APIError(openraft::error::InitializeError::NotAllowed(e))) => {
                        tracing::info!(error = %e, "already initialized; not bootstrapping again");
                    }
                    Err(err) => return Err(StartError::Raft(err.to_string())),
                }
            }
        }

        let clock = Arc::new(ClusterClock::new(state_machine.clone()));
        let batcher = Batcher::spawn_observed(
            propose_fn(raft.clone(), clock.clone()),
            Some(member_metrics.proposal_observer()),
        );
        let (shutdown, _) = watch::channel(false);

        let reads = ReadRounds::new(config.id, raft.clone(), network.clone());
        let peer_service = PeerService::new(
            raft.clone(),
            state_machine.clone(),
            identity.clone(),
            reads.clone(),
            config.faults.clone(),
        )
        .with_metrics(member_metrics.clone());
        let cluster_service =
            ClusterService::new(raft.clone(), state_machine.clone(), identity.clone())
                .with_membership(Membership::new(
                    raft.clone(),
                    identity.clone(),
                    network.clone(),
                ));
        let kv_service = KvService::new(
            raft.clone(),
            state_machine.clone(),
            batcher,
            reads,
            identity.clone(),
            config.faults.clone(),
        )
        .with_metrics(member_metrics.clone())
        .with_watermark(crate::node::disk::Watermark::new(
            &config.data_dir,
            config.limits.disk_free_min_bytes,
        ));
        // No Nagle: a small reply held back for a delayed ACK costs 40 ms.
        let limits = config.limits.clone();
        let (peer, client) = (
            crate::server::limits::incoming(
                "peer",
                TcpIncoming::from(peer).with_nodelay(Some(true)),
                limits.peer_connections_max,
                limits.handshake_timeout,
            ),
            crate::server::limits::incoming(
                "client",
                TcpIncoming::from(client).with_nodelay(Some(true)),
                limits.client_connections_max,
                limits.handshake_timeout,
            ),
        );
        let security = &config.security;
        // TLS first (the builder), then the limits, then the credential
        // checks: a request over the in-flight cap is refused before its
        // credentials are looked at.
        let mut peer_server = crate::server::limits::peer_server(
            crate::server::security::grpc_server(security.tls.as_ref(), ClientCerts::Required)?,
        )
        .layer(tonic::service::InterceptorLayer::new(
            security.peer_check()?,
        ));
        let mut client_server = crate::server::limits::client_server(
            crate::server::security::grpc_server(security.tls.as_ref(), security.client_certs())?,
            &limits,
        )
        .layer(tonic::service::InterceptorLayer::new(
            security.client_check(),
        ));
        let mut servers = Vec::new();
        let mut stop = shutdown.subscribe();
        servers.push(tokio::spawn(async move {
            let result = peer_server
                .add_service(peer_service.into_server())
                .serve_with_incoming_shutdown(peer, async move {
                    let _ = stop.wait_for(|s| *s).await;
                })
                .await;
            if let Err(err) = result {
                tracing::error!(error = %err, "peer server failed");
            }
        }));
        let mut stop = shutdown.subscribe();
        servers.push(tokio::spawn(async move {
            let result = client_server
                .add_service(kv_service.into_server())
                .add_service(cluster_service.into_server())
                .serve_with_incoming_shutdown(client, async move {
                    let _ = stop.wait_for(|s| *s).await;
                })
                .await;
            if let Err(err) = result {
                tracing::error!(error = %err, "client server failed");
            }
        }));
        servers.push(tokio::spawn(learn_identities(
            network.clone(),
            identity.clone(),
            state_machine.clone(),
            config.initial_cluster.clone(),
            shutdown.subscribe(),
        )));
        servers.push(tokio::spawn(
            crate::raft::membership::learn_member_incarnations(
                raft.clone(),
                identity.clone(),
                network.clone(),
                shutdown.subscribe(),
            ),
        ));
        servers.push(tokio::spawn(crate::raft::merge_policy::merge_loop(
            config.id,
            config.merge_policy,
            raft.clone(),
            state_machine.clone(),
            propose_merge_fn(raft.clone(), clock.clone()),
            shutdown.subscribe(),
        )));
        servers.push(tokio::spawn(
            crate::raft::merge_policy::snapshot_bytes_loop(
                config.id,
                config.snapshot_policy.every_bytes,
                raft.clone(),
                state_machine.clone(),
                shutdown.subscribe(),
            ),
        ));
        servers.push(tokio::spawn(tick_loop(
            config.id,
            raft.clone(),
            state_machine.clone(),
            clock,
            shutdown.subscribe(),
        )));
        if let Some(listener) = admin {
            let state = crate::server::admin::AdminState::new(
                config.id,
                raft.clone(),
                state_machine.clone(),
                member_metrics.clone(),
            );
            let stop = shutdown.subscribe();
            let tls = (security.tls.as_ref())
                .map(|tls| tls.rustls_server_config(security.admin_client_cert_auth))
                .transpose()?;
            servers.push(tokio::spawn(crate::server::admin::serve(
                listener, state, tls, stop,
            )));
        }
        let mut stop = shutdown.subscribe();
        let mut metrics = raft.metrics();
        let id = config.id;
        servers.push(tokio::spawn(async move {
            // One line per leader change and per membership change.
            let mut seen = None;
            loop {
                let now = {
                    let m = metrics.borrow();
                    (
                        m.current_leader,
                        m.current_term,
                        *m.membership_config.log_id(),
                    )
                };
                if seen != Some(now) {
                    let (leader, term, membership_log_id) = now;
                    let membership = metrics.borrow().membership_config.membership().clone();
                    match seen {
                        Some((old_leader, _, old_membership))
                            if old_leader == leader && old_membership != membership_log_id =>
                        {
                            tracing::info!(id, ?membership, "membership changed")
                        }
                        _ => tracing::info!(id, ?leader, term, "leader changed"),
                    }
                    seen = Some(now);
                }
                tokio::select! {
                    changed = metrics.changed() => if changed.is_err() { break },
                    _ = stop.wait_for(|s| *s) => break,
                }
            }
        }));
        tracing::info!(id = config.id, %client_addr, %peer_addr, "node started");
        Ok(Node {
            id: config.id,
            metrics: member_metrics,
            raft,
            state_machine,
            client_addr,
            peer_addr,
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

    /// The openraft handle.
    pub fn raft(&self) -> &openraft::Raft<TypeConfig> {
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

    /// Stops serving (in-flight requests finish, bounded by `grace`), then
    /// stops Raft.
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
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};

    use super::*;

    fn clock(applied: &Arc<AtomicU64>, start: Instant) -> ClusterClock {
        let source = applied.clone();
        ClusterClock::with_source(Box::new(move || source.load(Ordering::SeqCst)), start)
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// Issue 15's first finding, replayed on one member's clock: the member
    /// started when the cluster time was 1 000, then followed through 40 s
    /// in which the cluster time advanced only 5 s (a leaderless gap, and
    /// leaders whose clocks lagged). When it becomes leader, its first stamp
    /// must continue from the applied time, not jump by the 35 s it spent
    /// as a follower. Fails with `nc-old-clock` (which stamps 41 000).
    #[test]
    fn a_new_leader_continues_from_the_applied_time() {
        let start = Instant::now();
        let applied = Arc::new(AtomicU64::new(1_000));
        let clock = clock(&applied, start);
        applied.store(6_000, Ordering::SeqCst);
        let first = clock.stamp_at(7, start + ms(40_000));
        assert_eq!(first, 6_000, "re-based on the applied time at term start");
        // Within the term it advances with real time.
        assert_eq!(clock.stamp_at(7, start + ms(40_250)), 6_250);
        assert_eq!(clock.stamp_at(7, start + ms(41_000)), 7_000);
    }

    /// A member that led term 3, lost leadership while its last stamps were
    /// not committed, and leads term 5 later continues from what was
    /// applied, not from its own old stamps or its old base.
    #[test]
    fn every_term_re_bases() {
        let start = Instant::now();
        let applied = Arc::new(AtomicU64::new(0));
        let clock = clock(&applied, start);
        assert_eq!(clock.stamp_at(3, start), 0);
        assert_eq!(clock.stamp_at(3, start + ms(5_000)), 5_000);
        // Term 4 (another leader) applied up to 2 000 more than what this
        // member saw committed (4 000 of its own), over 30 s.
        applied.store(6_000, Ordering::SeqCst);
        assert_eq!(clock.stamp_at(5, start + ms(35_000)), 6_000);
        assert_eq!(clock.stamp_at(5, start + ms(35_100)), 6_100);
    }

    /// Stamps of one term never decrease, and never run ahead of real time.
    #[test]
    fn stamps_follow_real_time_and_never_decrease() {
        let start = Instant::now();
        let applied = Arc::new(AtomicU64::new(500));
        let clock = clock(&applied, start);
        let mut last = 0;
        for step in 0..100u64 {
            let at = start + ms(step * 7);
            let stamp = clock.stamp_at(2, at);
            assert!(stamp >= last, "stamps decreased: {last} then {stamp}");
            assert!(stamp <= 500 + step * 7, "ran ahead of real time: {stamp}");
            last = stamp;
        }
        // An instant from before the base (two proposals stamped on two
        // threads): no step back.
        assert_eq!(clock.stamp_at(2, start), last);
    }
}
