//! The steps of starting a member ([`super::Node::start_with_listeners`]
//! runs them in order): open the storage, start openraft, bootstrap, serve
//! the ports, spawn the background tasks.

use std::net::SocketAddr;
use std::sync::Arc;

use openraft::error::RaftError;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tonic::transport::server::TcpIncoming;
#[cfg(not(feature = "lazy-disk"))]
use vfs::RealFs;

use crate::log_store::{LogStore, LogStoreOptions};
use crate::node::clock::ClusterClock;
use crate::node::identity::Identity;
use crate::node::tasks::{learn_identities, tick_loop};
use crate::node::{
    ELECTION_TIMEOUT_MAX_MS, ELECTION_TIMEOUT_MIN_MS, HEARTBEAT_MS, INSTALL_SNAPSHOT_TIMEOUT_MS,
    NodeConfig, StartError,
};
use crate::raft::batcher::Batcher;
use crate::raft::membership::Membership;
use crate::raft::network::Network;
use crate::raft::propose::{propose_fn, propose_merge_fn};
use crate::raft::read_index::LinearizableReads;
use crate::raft::read_index::ReadRounds;
use crate::raft::types::{NodeRaft, TypeConfig};
use crate::raft::watch::{MetricsWatch, NodeMetricsWatch};
use crate::server::cluster::ClusterService;
use crate::server::kv::KvService;
use crate::server::metrics::Metrics;
use crate::server::raft::PeerService;
use crate::server::security::ClientCerts;
use crate::state_machine::StateMachine;

/// The address a listener is bound to (`asked` names it in the error).
pub(super) fn local_addr(
    listener: &TcpListener,
    asked: SocketAddr,
) -> Result<SocketAddr, StartError> {
    listener.local_addr().map_err(|source| StartError::Bind {
        addr: asked,
        source,
    })
}

/// Opens (or creates) the member's identity, Raft log and state machine,
/// off the async threads.
pub(super) async fn open_storage(
    config: &NodeConfig,
    member_metrics: &Metrics,
) -> Result<(Identity, LogStore<TypeConfig>, StateMachine), StartError> {
    let log_dir = config.data_dir.join("raft-log");
    let state_dir = config.data_dir.join("state");
    let state_machine_options = config.state_machine.clone();
    let fsync_observer = Some(member_metrics.log_fsync_observer());
    let data_dir = config.data_dir.clone();
    let id = config.id;
    tokio::task::spawn_blocking(move || {
        let identity = Identity::load_or_create(&data_dir, id)?;
        // The same vfs as `snapshot::node_vfs`, which identity and the
        // state machine use: the lazy disk in a lazy-disk build.
        #[cfg(feature = "lazy-disk")]
        let log_vfs: Arc<dyn vfs::Vfs> = crate::lazy_disk::shared();
        #[cfg(not(feature = "lazy-disk"))]
        let log_vfs: Arc<dyn vfs::Vfs> = Arc::new(RealFs);
        // The committed id is kept in memory only (`persist_committed`
        // is off by default): the store reopens every vote as
        // uncommitted, so a member that led before a restart must win a
        // new election, whose no-op entry commits after every earlier
        // entry, before it serves a linearizable read. (With a committed
        // vote, openraft would restart it as the leader at once (0.9 always,
        // 0.10 with its default `enable_leader_restore`) and
        // its read index would be the recovered committed id, which after
        // a power cut is only the applied id, below acknowledged writes;
        // see ARCHITECTURE.md, Raft log store.)
        let log_options = LogStoreOptions::default();
        let log =
            LogStore::<TypeConfig>::open_observed(log_vfs, log_dir, log_options, fsync_observer)?;
        let sm = StateMachine::open(state_dir, state_machine_options)?;
        Ok::<_, StartError>((identity, log, sm))
    })
    .await
    .map_err(|err| StartError::Raft(format!("open task: {err}")))?
}

/// openraft with the cluster's timing and snapshot settings over this
/// member's network, log and state machine.
pub(super) async fn start_raft(
    config: &NodeConfig,
    network: Network,
    log_store: LogStore<TypeConfig>,
    state_machine: StateMachine,
) -> Result<NodeRaft, StartError> {
    if config.read_policy == LinearizableReads::Lease {
        // A leader counts on its followers' leases: a follower that
        // acknowledged it refuses other candidates for one lease. A restart
        // forgets that promise, so under the lease policy a member stays out
        // of elections for one lease after it starts.
        tracing::info!(
            id = config.id,
            "read policy lease: waiting one lease ({ELECTION_TIMEOUT_MAX_MS} ms) before taking part in elections"
        );
        tokio::time::sleep(std::time::Duration::from_millis(ELECTION_TIMEOUT_MAX_MS)).await;
    }
    let raft_config = openraft::Config {
        cluster_name: "raftcask".to_string(),
        heartbeat_interval: HEARTBEAT_MS,
        election_timeout_min: ELECTION_TIMEOUT_MIN_MS,
        election_timeout_max: ELECTION_TIMEOUT_MAX_MS,
        install_snapshot_timeout: INSTALL_SNAPSHOT_TIMEOUT_MS,
        max_in_snapshot_log_to_keep: config.snapshot_log_keep,
        snapshot_policy: config.snapshot_policy.openraft(),
        // A candidate first asks "would you vote for me?" without raising
        // its term: a member cut off for a while cannot depose a healthy
        // leader when it comes back (openraft leaves this off).
        enable_pre_vote: Some(true),
        // Never restart as the leader of the old term without an election:
        // apply does not fsync and the committed id is not persisted, so a
        // restarted leader's state machine may be behind what it
        // acknowledged; it must win a new term, whose first entry commits
        // everything before it, before it serves a read. (The log store also
        // reopens every vote uncommitted; see raftlog's `recovery`.)
        enable_leader_restore: Some(false),
        ..Default::default()
    }
    .validate()
    .map_err(|err| StartError::Raft(err.to_string()))?;
    openraft::Raft::new(
        config.id,
        Arc::new(raft_config),
        network,
        log_store,
        state_machine,
    )
    .await
    .map_err(|err| StartError::Raft(err.to_string()))
}

/// Initializes the cluster on the bootstrapping member's first start,
/// unless a peer reports the cluster exists already (`existing`: a wiped
/// directory must not fork it).
pub(super) async fn bootstrap(
    config: &NodeConfig,
    raft: &NodeRaft,
    identity: &Identity,
    state_machine: &StateMachine,
    existing: Option<(u64, u64)>,
) -> Result<(), StartError> {
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
    Ok(())
}

/// What the ports and tasks of a starting member share.
pub(super) struct Member<'a> {
    pub(super) config: &'a NodeConfig,
    pub(super) raft: NodeRaft,
    pub(super) state_machine: StateMachine,
    pub(super) identity: Identity,
    pub(super) network: Network,
    pub(super) metrics: Metrics,
    pub(super) clock: Arc<ClusterClock>,
    pub(super) shutdown: &'a watch::Sender<bool>,
}

impl Member<'_> {
    /// The peer port (Raft service), the client port (Kv, Cluster) and the
    /// Redis and etcd ports if given, each with its TLS, limits and
    /// credential checks, until shutdown.
    pub(super) fn serve_ports(
        &self,
        client: TcpListener,
        peer: TcpListener,
        redis: Option<TcpListener>,
        etcd: Option<TcpListener>,
    ) -> Result<Vec<JoinHandle<()>>, StartError> {
        let Member {
            config,
            raft,
            state_machine,
            identity,
            network,
            metrics: member_metrics,
            clock,
            shutdown,
        } = self;
        // The bound client address (port 0 picks one): the etcd port's
        // MemberList tells other members' etcd ports by their offset.
        let client_bound = local_addr(&client, config.client_addr)?;
        let batcher = Batcher::spawn_observed(
            propose_fn(raft.clone(), (*clock).clone()),
            Some(member_metrics.proposal_observer()),
        );
        let reads = ReadRounds::new(config.id, raft.clone(), network.clone())
            .with_policy(config.read_policy);
        let peer_service = PeerService::new(
            raft.clone(),
            state_machine.clone(),
            identity.clone(),
            reads.clone(),
            config.faults.clone(),
        )
        .with_metrics(member_metrics.clone())
        .with_etcd_addr(match &etcd {
            Some(listener) => Some(local_addr(
                listener,
                config.etcd_addr.unwrap_or(config.client_addr),
            )?),
            None => None,
        });
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
        .with_compactor(crate::raft::propose::propose_command_fn(
            raft.clone(),
            (*clock).clone(),
        ))
        .with_watermark(crate::node::disk::Watermark::new(
            &config.data_dir,
            config.limits.disk_free_min_bytes,
        ))
        .with_shutdown(shutdown.subscribe())
        .with_forwarder(crate::server::forward::Forwarder::new(
            config.id,
            raft.clone(),
            network.clone(),
            Some(member_metrics.clone()),
        ));
        let peer_service = peer_service.with_forwarding(kv_service.clone());
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
            &[],
        )
        .layer(tonic::service::InterceptorLayer::new(
            security.client_check(),
        ));
        let mut servers = Vec::new();
        if let Some(listener) = redis {
            let listen_addr =
                local_addr(&listener, config.redis_addr.unwrap_or(config.client_addr))?;
            let front_end = crate::server::redis::RedisFrontEnd::new(
                kv_service.clone(),
                raft.clone(),
                security.auth_token.clone(),
                security.tls.is_some(),
                listen_addr,
            );
            // The Redis port asks for a client certificate when the client
            // port does (`--client-cert-auth`); it speaks no ALPN.
            let tls = match &security.tls {
                Some(tls) => {
                    let mut config =
                        (*tls.rustls_server_config(security.client_cert_auth)?).clone();
                    config.alpn_protocols.clear();
                    Some(Arc::new(config))
                }
                None => None,
            };
            servers.push(tokio::spawn(crate::server::redis::serve(
                listener,
                front_end,
                tls,
                config.limits.redis_connections_max,
                shutdown.subscribe(),
            )));
        }
        if let Some(listener) = etcd {
            let listen_addr =
                local_addr(&listener, config.etcd_addr.unwrap_or(config.client_addr))?;
            let front_end = crate::server::etcd::EtcdFrontEnd::new(
                kv_service.clone(),
                cluster_service.clone(),
                raft.clone(),
                listen_addr,
                client_bound,
                security,
            )
            .with_merge(propose_merge_fn(raft.clone(), clock.clone()))
            .with_peers(network.clone());
            servers.push(tokio::spawn(crate::server::etcd::serve(
                listener,
                front_end,
                security.clone(),
                limits.clone(),
                shutdown.subscribe(),
            )));
        }
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
        Ok(servers)
    }

    /// The background tasks: identity learning, member incarnations, the
    /// merge policy, the snapshot-by-bytes trigger and the tick loop.
    pub(super) fn spawn_tasks(&self) -> Vec<JoinHandle<()>> {
        let Member {
            config,
            raft,
            state_machine,
            identity,
            network,
            clock,
            shutdown,
            ..
        } = self;
        vec![
            tokio::spawn(learn_identities(
                network.clone(),
                identity.clone(),
                state_machine.clone(),
                config.initial_cluster.clone(),
                shutdown.subscribe(),
            )),
            tokio::spawn(crate::raft::membership::learn_member_incarnations(
                raft.clone(),
                identity.clone(),
                network.clone(),
                shutdown.subscribe(),
            )),
            tokio::spawn(crate::raft::merge_policy::merge_loop(
                config.id,
                config.merge_policy,
                raft.clone(),
                state_machine.clone(),
                propose_merge_fn(raft.clone(), clock.clone()),
                shutdown.subscribe(),
            )),
            tokio::spawn(crate::raft::merge_policy::snapshot_bytes_loop(
                config.id,
                config.snapshot_policy.every_bytes,
                raft.clone(),
                state_machine.clone(),
                shutdown.subscribe(),
            )),
            tokio::spawn(tick_loop(
                config.id,
                raft.clone(),
                state_machine.clone(),
                clock.clone(),
                config.history_window,
                shutdown.subscribe(),
            )),
        ]
    }

    /// The admin HTTP port (metrics, health, readiness), over TLS when the
    /// member has it.
    pub(super) fn serve_admin(&self, listener: TcpListener) -> Result<JoinHandle<()>, StartError> {
        let state = crate::server::admin::AdminState::new(
            self.config.id,
            self.raft.clone(),
            self.state_machine.clone(),
            self.metrics.clone(),
        );
        let stop = self.shutdown.subscribe();
        let security = &self.config.security;
        let tls = (security.tls.as_ref())
            .map(|tls| tls.rustls_server_config(security.admin_client_cert_auth))
            .transpose()?;
        Ok(tokio::spawn(crate::server::admin::serve(
            listener, state, tls, stop,
        )))
    }
}

/// One log line per leader change and per membership change, until
/// shutdown.
pub(super) async fn log_leader_changes(
    id: u64,
    mut metrics: NodeMetricsWatch,
    mut stop: watch::Receiver<bool>,
) {
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
}
