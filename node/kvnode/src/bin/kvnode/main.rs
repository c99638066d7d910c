//! The kvnode binary: one member of a raftcask cluster, or a local cluster
//! of child processes (DESIGN §6).
//!
//! - `kvnode` with no arguments runs a single-node cluster on local
//!   defaults (data `./kvdata`, client 127.0.0.1:7001, peer :7101, admin
//!   :7201, Redis :6379).
//! - `kvnode run ...` runs one member of a static initial cluster.
//! - `kvnode local --nodes N ...` runs N `kvnode run` child processes on one
//!   host ([`local`]).
//! - `kvnode restore --from FILE --data-dir D --id N --initial-cluster ...`
//!   seeds a member of a new cluster from a backup archive ([`restore`]).
//!
//! TLS and client authentication (`--tls-cert`, `--tls-key`, `--tls-ca`,
//! `--client-cert-auth`, `--admin-client-cert-auth`, `--auth-token-file`,
//! each also a KVNODE_* variable) are [`kvnode::server::security`]'s.
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
use kvnode::node::SNAPSHOT_LOG_KEEP_DEFAULT;
use kvnode::node::disk::{
    DISK_FREE_MIN_BYTES_DEFAULT, STORAGE_FAILURE_EXIT_CODE, describe_storage_failure,
    wait_storage_failure,
};
use kvnode::raft::merge_policy::{
    MERGE_DEAD_BYTES_MIN_DEFAULT, MERGE_DEAD_RATIO_MIN_DEFAULT, MergePolicy,
    SNAPSHOT_EVERY_BYTES_DEFAULT, SNAPSHOT_EVERY_ENTRIES_DEFAULT, SnapshotPolicy,
};
use kvnode::raft::read_index::LinearizableReads;
use kvnode::server::limits::{
    CLIENT_CONNECTIONS_MAX_DEFAULT, CLIENT_INFLIGHT_MAX_DEFAULT,
    CLIENT_STREAMS_PER_CONNECTION_MAX_DEFAULT, HANDSHAKE_TIMEOUT_DEFAULT, Limits,
};
use kvnode::server::security::{AuthToken, Security, TlsMaterial};
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
/// Redis (RESP) address of the no-argument single-node cluster.
const DEFAULT_REDIS_ADDR: &str = "127.0.0.1:6379";
/// etcd v3 address of the no-argument single-node cluster (etcd's own).
const DEFAULT_ETCD_ADDR: &str = "127.0.0.1:2379";

#[derive(Debug, Parser)]
#[command(
    name = "kvnode",
    version = version_line(),
    about = "A raftcask member. Without a command: a single-node cluster on local defaults \
             (data ./kvdata, client 127.0.0.1:7001, peer :7101, admin :7201, Redis :6379, \
             etcd :2379)."
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Cmd>,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Runs one member of a cluster.
    Run(Box<RunArgs>),
    /// Runs a local cluster: N `kvnode run` child processes on one host.
    Local(local::LocalArgs),
    /// Seeds a member of a new cluster from a backup archive.
    Restore(restore::RestoreArgs),
}

/// `--read-policy` values (see [`LinearizableReads`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum ReadPolicyArg {
    /// A heartbeat round to a quorum per read batch (Raft's ReadIndex).
    ReadIndex,
    /// The leader's lease while it holds (assumes equal clock rates).
    Lease,
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
    /// Redis (RESP) address: redis-cli, redis-benchmark and Redis clients
    /// connect here (AUTH with the --auth-token-file token when one is
    /// set; TLS when the member has TLS); none if omitted.
    #[arg(long, env = "KVNODE_REDIS_ADDR")]
    redis_addr: Option<SocketAddr>,
    /// etcd v3 gRPC address: etcdctl and etcd client libraries connect
    /// here (the same TLS, client certificates and --auth-token-file token
    /// as the client port); none if omitted.
    #[arg(long, env = "KVNODE_ETCD_ADDR")]
    etcd_addr: Option<SocketAddr>,
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
    /// Revisions of change history kept for reads at a past revision (and
    /// watchers): while this member leads, it compacts to `revision - N`
    /// once the window is longer.
    #[arg(long, env = "KVNODE_HISTORY_REVISIONS",
          default_value_t = kvstate::history::HISTORY_WINDOW_REVISIONS_DEFAULT,
          value_parser = clap::value_parser!(u64).range(1..))]
    history_revisions: u64,
    /// Bytes of superseded records the change history may keep on disk:
    /// while this member leads, it compacts the oldest revisions past this.
    #[arg(long, env = "KVNODE_HISTORY_BYTES",
          default_value_t = kvstate::history::HISTORY_WINDOW_BYTES_DEFAULT)]
    history_bytes: u64,
    /// Superseded records the change history may keep (what bounds its
    /// index in memory, about 150 bytes plus the key each): while this
    /// member leads, it compacts the oldest revisions past this.
    #[arg(long, env = "KVNODE_HISTORY_RECORDS",
          default_value_t = kvstate::history::HISTORY_WINDOW_RECORDS_DEFAULT)]
    history_records: u64,
    /// How the leader confirms it still leads before a linearizable read:
    /// `read-index` (default) sends a heartbeat round to a quorum after the
    /// read arrives; `lease` skips the round while a quorum acknowledged a
    /// heartbeat sent less than 3 s (the largest election timeout) ago.
    /// `lease` ASSUMES every member's clock runs at the same rate as the
    /// leader's (small drift against 3 s): a member whose clock runs fast
    /// (a paused VM catching up) can elect a new leader while the old one
    /// still answers from its lease, i.e. stale reads. Set it on every
    /// member: each then stays out of elections for 3 s after it starts
    /// (a restart forgets the lease it granted).
    #[arg(long, env = "KVNODE_READ_POLICY", value_enum, default_value_t = ReadPolicyArg::ReadIndex)]
    read_policy: ReadPolicyArg,
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
    // Limits under load and disk full (kvnode::server::limits, kvnode::node::disk).
    /// Open connections to the client port at most; more are closed at
    /// once.
    #[arg(long, env = "KVNODE_MAX_CONNECTIONS", default_value_t = CLIENT_CONNECTIONS_MAX_DEFAULT)]
    max_connections: usize,
    /// Requests handled at once on the client port at most; more are
    /// answered RESOURCE_EXHAUSTED.
    #[arg(long, env = "KVNODE_MAX_INFLIGHT", default_value_t = CLIENT_INFLIGHT_MAX_DEFAULT)]
    max_inflight: usize,
    /// HTTP/2 streams (concurrent requests) per client connection at most;
    /// the client waits for a free one.
    #[arg(long, env = "KVNODE_MAX_STREAMS_PER_CONNECTION", default_value_t = CLIENT_STREAMS_PER_CONNECTION_MAX_DEFAULT)]
    max_streams_per_connection: u32,
    /// Milliseconds a new connection may take to send its first bytes
    /// (HTTP/2 preface or TLS hello) before it is closed.
    #[arg(long, env = "KVNODE_HANDSHAKE_TIMEOUT_MS", default_value_t = HANDSHAKE_TIMEOUT_DEFAULT.as_millis() as u64)]
    handshake_timeout_ms: u64,
    /// Free bytes the data directory's filesystem must keep; below, writes
    /// are answered RESOURCE_EXHAUSTED (reads still work). 0 = no
    /// watermark.
    #[arg(long, env = "KVNODE_DISK_FREE_MIN_BYTES", default_value_t = DISK_FREE_MIN_BYTES_DEFAULT)]
    disk_free_min_bytes: u64,
    /// The test-only flags (`testing` builds only: none in a product build).
    #[cfg(feature = "testing")]
    #[command(flatten)]
    test: TestArgs,
    /// Threads of the async runtime (gRPC, Raft, replication); 0 = one per
    /// CPU core. Lower it when several members share a machine (`kvnode
    /// local` splits the cores among its members).
    #[arg(long, env = "KVNODE_WORKER_THREADS", default_value_t = 0,
          value_parser = clap::value_parser!(u16).range(0..=i64::from(WORKER_THREADS_MAX)))]
    worker_threads: u16,
    #[command(flatten)]
    security: SecurityArgs,
}

/// Most runtime worker threads `--worker-threads` accepts.
pub const WORKER_THREADS_MAX: u16 = 1024;

/// TLS and client authentication flags of `kvnode run` (all off by
/// default). `kvnode local` passes them to its members through the
/// environment (KVNODE_TLS_CERT and so on are inherited).
#[derive(Debug, clap::Args)]
struct SecurityArgs {
    /// This member's certificate (PEM; chain after the leaf). With
    /// --tls-key and --tls-ca it turns TLS on for the client, peer and
    /// admin ports; the peer port then accepts only callers with a node
    /// certificate signed by --tls-ca.
    #[arg(long, env = "KVNODE_TLS_CERT", requires_all = ["tls_key", "tls_ca"])]
    tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM: PKCS#8, PKCS#1 or SEC1).
    #[arg(long, env = "KVNODE_TLS_KEY", requires_all = ["tls_cert", "tls_ca"])]
    tls_key: Option<PathBuf>,
    /// The cluster CA bundle (PEM): verifies peers and, where asked,
    /// client certificates.
    #[arg(long, env = "KVNODE_TLS_CA", requires_all = ["tls_cert", "tls_key"])]
    tls_ca: Option<PathBuf>,
    /// The client port demands a client certificate signed by --tls-ca
    /// (mutual TLS). As a variable: KVNODE_CLIENT_CERT_AUTH=true.
    #[arg(long, env = "KVNODE_CLIENT_CERT_AUTH", requires = "tls_cert")]
    client_cert_auth: bool,
    /// The admin port demands a client certificate signed by --tls-ca.
    #[arg(long, env = "KVNODE_ADMIN_CLIENT_CERT_AUTH", requires = "tls_cert")]
    admin_client_cert_auth: bool,
    /// A file holding the bearer token every client-port request must
    /// carry (`authorization: Bearer <token>`); without it, no token is
    /// asked for.
    #[arg(long, env = "KVNODE_AUTH_TOKEN_FILE")]
    auth_token_file: Option<PathBuf>,
}

impl SecurityArgs {
    fn security(&self) -> anyhow::Result<Security> {
        let tls = match (&self.tls_cert, &self.tls_key, &self.tls_ca) {
            (Some(cert), Some(key), Some(ca)) => Some(TlsMaterial::load(cert, key, ca)?),
            (None, None, None) => None,
            _ => bail!("--tls-cert, --tls-key and --tls-ca go together"),
        };
        let auth_token = match &self.auth_token_file {
            Some(path) => Some(AuthToken::load(path)?),
            None => None,
        };
        let security = Security {
            tls,
            client_cert_auth: self.client_cert_auth,
            admin_client_cert_auth: self.admin_client_cert_auth,
            auth_token,
        };
        security.validate()?;
        Ok(security)
    }
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
    #[cfg(feature = "testing")]
    args.test.apply(&mut config);
    config.admin_addr = args.admin_addr;
    config.redis_addr = args.redis_addr;
    config.etcd_addr = args.etcd_addr;
    config.security = args.security.security()?;
    config.snapshot_log_keep = args.snapshot_log_keep;
    config.history_window = kvstate::history::HistoryWindow {
        revisions: args.history_revisions,
        bytes: args.history_bytes,
        records: args.history_records,
    };
    config.read_policy = match args.read_policy {
        ReadPolicyArg::ReadIndex => LinearizableReads::ReadIndex,
        ReadPolicyArg::Lease => LinearizableReads::Lease,
    };
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
    config.limits = Limits {
        client_connections_max: args.max_connections,
        client_inflight_max: args.max_inflight,
        client_streams_per_connection_max: args.max_streams_per_connection,
        handshake_timeout: Duration::from_millis(args.handshake_timeout_ms),
        disk_free_min_bytes: args.disk_free_min_bytes,
        ..Limits::default()
    };
    config.limits.validate().map_err(anyhow::Error::msg)?;
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
    config.redis_addr = Some(DEFAULT_REDIS_ADDR.parse()?);
    config.etcd_addr = Some(DEFAULT_ETCD_ADDR.parse()?);
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

/// File descriptors a member needs besides its connections (data files,
/// log segments, the mapped-file cache, the admin port).
const FD_RESERVE: u64 = 1024;

/// Raises the soft open-files limit to the hard one, so the connection caps
/// are what limits connections (not EMFILE); warns if even the hard limit
/// is below the caps plus [`FD_RESERVE`].
fn raise_fd_limit(limits: &Limits, redis_port: bool, etcd_port: bool) {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let limit = getrlimit(Resource::Nofile);
    if limit.maximum != limit.current {
        let raised = rustix::process::Rlimit {
            current: limit.maximum,
            maximum: limit.maximum,
        };
        if let Err(err) = setrlimit(Resource::Nofile, raised) {
            tracing::warn!(error = %err, "could not raise the open-files limit");
        }
    }
    let redis_connections = if redis_port {
        limits.redis_connections_max
    } else {
        0
    };
    // The etcd port has the client port's connection cap.
    let etcd_connections = if etcd_port {
        limits.client_connections_max
    } else {
        0
    };
    let needed = (limits.client_connections_max
        + limits.peer_connections_max
        + redis_connections
        + etcd_connections) as u64
        + FD_RESERVE;
    if let Some(current) = getrlimit(Resource::Nofile).current
        && current < needed
    {
        tracing::warn!(
            open_files_limit = current,
            needed,
            "the open-files limit is below --max-connections plus the peer, Redis and etcd \
             ports' caps \
             plus a reserve: a connection flood may exhaust file descriptors; lower --max-connections \
             or raise the limit (ulimit -n)"
        );
    }
}

async fn run_member(config: NodeConfig) -> anyhow::Result<()> {
    local::follow_parent()?;
    raise_fd_limit(
        &config.limits,
        config.redis_addr.is_some(),
        config.etcd_addr.is_some(),
    );
    let node = Node::start(config).await.context("starting the node")?;
    tokio::select! {
        signal = wait_for_signal() => signal?,
        error = wait_storage_failure(node.raft().clone()) => {
            // The log or the engine failed a write (and poisoned itself):
            // this member stops; nothing acknowledged is lost, a restart
            // recovers from the log.
            let cause = describe_storage_failure(&error);
            tracing::error!(id = node.id(), error = %error, "member stopped: {cause}");
            eprintln!("kvnode: member {} stopped: {cause}; error: {error}", node.id());
            std::process::exit(STORAGE_FAILURE_EXIT_CODE);
        }
    }
    tracing::info!("shutting down");
    // A leader stopping on purpose hands over first: its clients see a
    // round trip, not an election timeout.
    if let Some(leader) = node
        .hand_over_leadership(kvnode::node::LEADER_HANDOVER_WAIT)
        .await
    {
        tracing::info!(id = node.id(), leader, "leadership handed over");
    }
    node.shutdown(SHUTDOWN_GRACE).await;
    Ok(())
}

/// mimalloc instead of glibc malloc: a loaded member allocates per request
/// and per entry on several threads, and glibc's arenas took about 12 % of
/// its CPU in perf (node/kvnode/BENCHMARKS.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    // The runtime is built here, not by #[tokio::main], so that `run` can
    // size it from its flags.
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    runtime.enable_all();
    match &cli.command {
        Some(Cmd::Run(args)) if args.worker_threads > 0 => {
            runtime.worker_threads(usize::from(args.worker_threads));
        }
        // `local` only supervises its children.
        Some(Cmd::Local(_)) => {
            runtime.worker_threads(1);
        }
        _ => {}
    }
    runtime_without_lifo_slot(&mut runtime);
    runtime
        .build()
        .context("starting the async runtime")?
        .block_on(async_main(cli))
}

/// Turns the runtime's LIFO slot off (an unstable tokio API: the workspace
/// builds with `--cfg tokio_unstable`, .cargo/config.toml). With the slot on,
/// a task woken by the running task runs next: each request task that
/// finishes wakes its HTTP/2 connection task, which then runs at once and
/// writes that one response with a `writev` of its own. With it off, the
/// connection task queues behind the request tasks an applied entry woke
/// together, and writes their responses in one `writev`. Measured
/// (BENCHMARKS.md, "The write path's cost per operation"): 25 % less
/// members' CPU per put at 64 clients, one-client latency unchanged. In a
/// build without the cfg it does nothing (the first log line says so).
fn runtime_without_lifo_slot(runtime: &mut tokio::runtime::Builder) {
    #[cfg(tokio_unstable)]
    runtime.disable_lifo_slot();
    #[cfg(not(tokio_unstable))]
    let _ = runtime;
}

async fn async_main(cli: Cli) -> anyhow::Result<()> {
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
    if !cfg!(tokio_unstable) {
        tracing::warn!(
            "built without --cfg tokio_unstable (RUSTFLAGS replaced .cargo/config.toml's): \
             the runtime's LIFO slot stays on, and puts cost more CPU"
        );
    }
    match cli.command {
        None => run_member(default_config()?).await,
        Some(Cmd::Run(args)) => run_member(run_config(*args)?).await,
        Some(Cmd::Local(args)) => local::run(args).await,
        Some(Cmd::Restore(args)) => restore::run(args).await,
    }
}

/// The flags of a `testing` build: faults and settings for the fault suite
/// (hidden from `--help`; a product build does not have them at all).
#[cfg(feature = "testing")]
#[derive(Debug, clap::Args)]
struct TestArgs {
    /// TEST FAULT: answer this percentage of applied writes with an error
    /// (the reply is "lost"; clients retry). For the fault suite only.
    #[arg(long, env = "KVNODE_TEST_DROP_WRITE_REPLY_PERCENT", default_value_t = 0,
          value_parser = clap::value_parser!(u8).range(0..=100), hide = true)]
    drop_write_reply_percent: u8,
    /// Evict exactly-once sessions after this many ms of cluster time without
    /// a request, instead of 10 minutes; 0 = the default. Every member must
    /// be given the same value. For the fault suite only (its exactly-once
    /// scenario evicts sessions within a short run).
    #[arg(long, env = "KVNODE_TEST_SESSION_IDLE_MS", default_value_t = 0,
          value_parser = clap::value_parser!(u64).range(0..=kvproto::SESSION_IDLE_MS), hide = true)]
    session_idle_ms: u64,
    /// TEST FAULT: at the first install of a received snapshot in this data
    /// directory, build a snapshot on the old engine first, and hold the
    /// apply that follows the install for 20 s (the fault suite's control
    /// for how a snapshot is chosen at startup). For the fault suite only.
    #[arg(long, env = "KVNODE_TEST_STALE_BUILD_BEFORE_SWITCH", hide = true)]
    stale_build_before_switch: bool,
}

#[cfg(feature = "testing")]
impl TestArgs {
    /// Turns the asked-for faults on in `config`, each with a warning.
    fn apply(&self, config: &mut NodeConfig) {
        if self.drop_write_reply_percent > 0 {
            tracing::warn!(
                percent = self.drop_write_reply_percent,
                "TEST FAULT: dropping this share of applied-write replies"
            );
            config
                .faults
                .set_drop_write_reply_percent(self.drop_write_reply_percent);
        }
        if self.session_idle_ms > 0 {
            tracing::warn!(
                ms = self.session_idle_ms,
                "TEST SETTING: sessions evicted after this much idle cluster time"
            );
            config.state_machine.session_idle_ms = Some(self.session_idle_ms);
        }
        if self.stale_build_before_switch {
            tracing::warn!(
                "TEST FAULT: the first received snapshot's install in this data directory builds \
                 a stale snapshot and holds before the switch"
            );
            config.state_machine.stale_build =
                kvnode::testing::stale_build::StaleBuildFault::armed();
        }
    }
}
