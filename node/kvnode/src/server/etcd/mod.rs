//! The etcd v3 front end: etcdctl, etcd's `clientv3` and every etcd client
//! library talk to a member on its etcd port (`--etcd-addr`), in etcd
//! 3.4's gRPC wire format (`kvproto::etcd`). It only translates: each
//! request becomes the native request of the same meaning (the `Kv` and
//! `Cluster` services' own handlers, or one `Write` sent down
//! [`KvService::write_from_front_end`], which forwards it to the leader
//! exactly once when this member does not lead), and each answer and error
//! is put back in etcd's shapes (ARCHITECTURE.md, "The etcd v3 API").
//!
//! - this file: [`EtcdFrontEnd`] (what every service shares: headers in
//!   etcd's shape, the member's etcd address), the limits, and [`serve`]
//!   (the port: TLS, connection cap, the token check [`TokenLayer`] —
//!   etcd's `token` metadata or `authorization: Bearer` — and etcd's plain
//!   HTTP `GET /health` and `GET /version` next to the gRPC services).
//! - [`authority`]: every connection is read through it, which repairs
//!   the `:authority` etcd's clients send when given a URL endpoint
//!   (`http://host:port`), a value h2 would refuse.
//! - [`errors`]: native statuses as etcd's gRPC errors (code and exact
//!   message, so client libraries classify them as they do etcd's).
//! - [`kv`]: the `KV` service (Range, Put, DeleteRange, Txn, Compact).
//! - [`watch`]: the `Watch` service, over the native watch machinery.
//! - [`lease`]: the `Lease` service, over the native lease commands and
//!   the leader's renewal coalescer.
//! - [`cluster`]: the `Cluster` service (membership); [`peers`]: where
//!   the other members' etcd ports are (each tells its own in `Identify`).
//! - [`maintenance`]: the `Maintenance` service (Status, Alarm, MoveLeader,
//!   Defragment as a merge through Raft, Hash and HashKV as a digest of
//!   the applied state, Snapshot as the native backup archive).
//! - [`lock`]: the `Lock` service (Lock, Unlock) and [`election`]: the
//!   `Election` service (Campaign, Proclaim, Leader, Observe, Resign), as
//!   etcd's server builds them on its `concurrency` package; [`recipe`]:
//!   what they share (the session's key, the wait for the keys created
//!   before it over the native watch, the limits, their errors).
//! - [`unserved`]: `Auth` (Authenticate as `root` with the cluster token
//!   when the port demands one; the other calls UNIMPLEMENTED or etcd's
//!   "authentication is not enabled").

pub mod authority;
pub mod cluster;
pub mod election;
pub mod errors;
pub mod kv;
pub mod lease;
pub mod lock;
pub mod maintenance;
pub mod peers;
pub mod recipe;
pub mod unserved;
pub mod watch;

use std::net::SocketAddr;

use kvproto::etcd::etcdserverpb::ResponseHeader;
use kvproto::kv::v1::Header;
use tokio::net::TcpListener;
use tokio::sync::watch as signal;
use tokio_stream::StreamExt as _;
use tonic::transport::server::TcpIncoming;

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::http;
use tonic::Status;
use tonic::codegen::Service;

use crate::raft::merge_policy::ProposeMerge;
use crate::raft::types::NodeRaft;
use crate::raft::watch::MetricsWatch as _;
use crate::server::cluster::ClusterService;
use crate::server::kv::KvService;
use crate::server::limits::Limits;
use crate::server::security::{AuthToken, ClientCerts, Security};

/// etcd's request limit (its `--max-request-bytes` default, 1.5 MiB): a
/// Put, DeleteRange or Txn whose encoding is larger is refused with
/// `etcdserver: request is too large`. How it sits with the cluster's own
/// limits: a key is at most `KEY_SIZE_BYTES_MAX` (4 KiB) and a value
/// `VALUE_SIZE_BYTES_MAX` (1 MiB), both below it, so a single put of a
/// legal key and value always fits; a Raft entry is at most
/// `ENTRY_SIZE_BYTES_MAX` (4 MiB), above it, so every request the etcd port
/// takes fits one entry. A value between 1 MiB and 1.5 MiB, which etcd
/// takes, is refused here with the same error (the native reason naming
/// `VALUE_SIZE_BYTES_MAX` rides in the `raftcask-detail` metadata).
pub const ETCD_REQUEST_BYTES_MAX: usize = 3 * 512 * 1024;
/// What etcd allows above [`ETCD_REQUEST_BYTES_MAX`] for gRPC framing (its
/// `grpcOverheadBytes`): the port's decoding limit is the sum, so a request
/// slightly over the limit gets etcd's error rather than a transport one.
pub const ETCD_GRPC_OVERHEAD_BYTES: usize = 512 * 1024;
/// The largest answer the port encodes: the client port's.
pub const ETCD_RESPONSE_BYTES_MAX: usize = crate::server::kv::CLIENT_MESSAGE_BYTES_MAX;
/// etcd's transaction limit (`--max-txn-ops` default): compares, success
/// ops and failure ops, each at most this. The same as the native
/// transactions' `TXN_OPS_MAX`.
pub const ETCD_TXN_OPS_MAX: usize = 128;
const _: () = assert!(ETCD_TXN_OPS_MAX == kvstate::txn::TXN_OPS_MAX);
const _: () = assert!(kvproto::KEY_SIZE_BYTES_MAX < ETCD_REQUEST_BYTES_MAX);
const _: () = assert!(kvproto::VALUE_SIZE_BYTES_MAX < ETCD_REQUEST_BYTES_MAX);
const _: () = assert!(ETCD_REQUEST_BYTES_MAX < crate::raft::batcher::ENTRY_SIZE_BYTES_MAX);
/// The etcd version the port reports (`Status.version`, `GET /version`):
/// the API whose wire format and behaviour it follows. Clients read it to
/// decide which calls they may make.
pub const ETCD_COMPATIBLE_VERSION: &str = "3.4.0";
/// etcd's gRPC metadata key for an auth token (`rpctypes.TokenFieldNameGRPC`):
/// what a client sends after Authenticate.
pub const ETCD_TOKEN_KEY: &str = "token";
/// What the port serves without a token when it demands one: etcd's HTTP
/// health and version endpoints (open in etcd too) and Authenticate (how
/// a client gets its token).
pub const OPEN_PATHS: [&str; 3] = ["/health", "/version", "/etcdserverpb.Auth/Authenticate"];
/// How long `GET /health` waits for a linearizable read (etcd's health
/// check gives its quorum read one second).
pub const HEALTH_READ_TIMEOUT: Duration = Duration::from_secs(1);

/// Proposes merge entries (the leader's Defragment).
#[derive(Clone)]
pub struct MergeProposer(pub ProposeMerge);

impl std::fmt::Debug for MergeProposer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MergeProposer(..)")
    }
}

/// What the etcd services of one member share.
#[derive(Clone, Debug)]
pub struct EtcdFrontEnd {
    pub(crate) kv: KvService,
    pub(crate) cluster: ClusterService,
    pub(crate) raft: NodeRaft,
    /// This member's etcd address.
    pub(crate) listen_addr: SocketAddr,
    /// This member's client address (to tell the port offset others use).
    pub(crate) client_addr: SocketAddr,
    /// The client port's token, if it demands one (a follower presents it
    /// to the leader's client port for a compaction).
    pub(crate) token: Option<AuthToken>,
    /// Whether the ports speak TLS.
    pub(crate) tls: bool,
    /// The `Lock` and `Election` services' limits (waiters, observers).
    pub(crate) recipes: std::sync::Arc<recipe::RecipeLimits>,
    /// Proposes the merge of a Defragment on the leader.
    pub(crate) merge: Option<MergeProposer>,
    /// Held through each Defragment this member serves as the leader, so
    /// they run one at a time: a Defragment repeated while the first one's
    /// merge runs (an etcdctl retry, `defrag --cluster`, whose followers
    /// forward to the leader) waits for it instead of proposing a second
    /// merge whose apply would wait for the first under the state
    /// machine's lock. Never held while asking another member.
    pub(crate) defragments: std::sync::Arc<tokio::sync::Mutex<()>>,
    /// Asks the other members where their etcd ports are; `None`: they
    /// are guessed ([`EtcdFrontEnd::guessed_etcd_addr`]).
    pub(crate) peers: Option<peers::EtcdPeers>,
}

impl EtcdFrontEnd {
    /// The front end of the member whose services these are.
    pub fn new(
        kv: KvService,
        cluster: ClusterService,
        raft: NodeRaft,
        listen_addr: SocketAddr,
        client_addr: SocketAddr,
        security: &Security,
    ) -> EtcdFrontEnd {
        EtcdFrontEnd {
            kv,
            cluster,
            raft,
            listen_addr,
            client_addr,
            token: security.auth_token.clone(),
            tls: security.tls.is_some(),
            recipes: std::sync::Arc::new(recipe::RecipeLimits::new()),
            merge: None,
            defragments: std::sync::Arc::new(tokio::sync::Mutex::new(())),
            peers: None,
        }
    }

    /// Serves Defragment by proposing merges through `propose`.
    pub fn with_merge(mut self, propose: ProposeMerge) -> EtcdFrontEnd {
        self.merge = Some(MergeProposer(propose));
        self
    }

    /// Asks the other members over `network` where their etcd ports are.
    pub fn with_peers(mut self, network: crate::raft::network::Network) -> EtcdFrontEnd {
        self.peers = Some(peers::EtcdPeers::new(network));
        self
    }

    /// This member's id.
    pub(crate) fn member_id(&self) -> u64 {
        self.raft.metrics().borrow().id
    }

    /// A native header in etcd's shape.
    pub(crate) fn header_of(header: Option<Header>) -> Option<ResponseHeader> {
        header.map(|h| ResponseHeader {
            cluster_id: h.cluster_id,
            member_id: h.member_id,
            revision: revision_i64(h.revision),
            raft_term: h.raft_term,
        })
    }

    /// The header of an answer about the current state.
    pub(crate) fn header(&self) -> ResponseHeader {
        Self::header_of(Some(self.kv.read_header())).unwrap_or_default()
    }

    /// The header of a write's answer at `revision`.
    pub(crate) fn write_header(&self, revision: u64) -> ResponseHeader {
        Self::header_of(Some(self.kv.write_header(revision))).unwrap_or_default()
    }
}

/// A revision, count or id as etcd's `int64` (never above `i64::MAX`: a
/// revision counts applied requests, an id is at most `LEASE_ID_MAX`).
pub(crate) fn revision_i64(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

/// An etcd `int64` field that raftcask takes as unsigned: a negative value
/// means what 0 means (etcd reads a negative limit, revision or filter as
/// none).
pub(crate) fn non_negative(value: i64) -> u64 {
    u64::try_from(value).unwrap_or(0)
}

/// etcd's answer to a request without a token when the port demands one.
const USER_EMPTY: (tonic::Code, &str) = (
    tonic::Code::InvalidArgument,
    "etcdserver: user name is empty",
);
/// etcd's answer to a `token` that is not valid.
const INVALID_AUTH_TOKEN: (tonic::Code, &str) = (
    tonic::Code::Unauthenticated,
    "etcdserver: invalid auth token",
);

/// Whether a request may pass the port's token check: every request when
/// the port demands no token, the [`OPEN_PATHS`] always, otherwise a
/// request carrying the token as etcd's `token` metadata (what a client
/// sends after Authenticate) or as `authorization: Bearer <token>` (the
/// client port's form).
pub fn check_token(
    token: Option<&AuthToken>,
    path: &str,
    headers: &http::HeaderMap,
) -> Result<(), Status> {
    let Some(token) = token else {
        return Ok(());
    };
    if OPEN_PATHS.contains(&path) {
        return Ok(());
    }
    if let Some(presented) = headers.get(ETCD_TOKEN_KEY) {
        return if token.matches(presented.as_bytes()) {
            Ok(())
        } else {
            Err(errors::etcd_error(
                INVALID_AUTH_TOKEN,
                "the `token` metadata is not this cluster's token (Authenticate as root with it)",
            ))
        };
    }
    let Some(value) = headers.get("authorization") else {
        return Err(errors::etcd_error(
            USER_EMPTY,
            "this port requires the cluster token (--auth-token-file): Authenticate as root \
             with it and send the answer as `token` metadata, or send `authorization: Bearer \
             <token>`",
        ));
    };
    match value.as_bytes().strip_prefix(b"Bearer ") {
        Some(presented) if token.matches(presented) => Ok(()),
        Some(_) => Err(Status::unauthenticated(
            "the bearer token is not valid for this cluster",
        )),
        None => Err(Status::unauthenticated(
            "the `authorization` metadata is not `Bearer <token>`",
        )),
    }
}

/// The port's token check as a tower layer ([`check_token`] on every
/// request before it reaches a service; a refusal is a gRPC status).
#[derive(Clone, Debug)]
pub struct TokenLayer {
    token: Option<AuthToken>,
}

impl TokenLayer {
    /// The check for `token` (`None`: every request passes).
    pub fn new(token: Option<AuthToken>) -> TokenLayer {
        TokenLayer { token }
    }
}

impl<S> tower::Layer<S> for TokenLayer {
    type Service = TokenCheck<S>;

    fn layer(&self, inner: S) -> TokenCheck<S> {
        TokenCheck {
            inner,
            token: self.token.clone(),
        }
    }
}

/// The service [`TokenLayer`] wraps around the port's routes.
#[derive(Clone, Debug)]
pub struct TokenCheck<S> {
    inner: S,
    token: Option<AuthToken>,
}

impl<S, B, R> Service<http::Request<B>> for TokenCheck<S>
where
    S: Service<http::Request<B>, Response = http::Response<R>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    R: Default + Send + 'static,
{
    type Response = http::Response<R>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<http::Response<R>, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        match check_token(self.token.as_ref(), request.uri().path(), request.headers()) {
            Ok(()) => Box::pin(self.inner.call(request)),
            Err(status) => Box::pin(std::future::ready(Ok(status.into_http()))),
        }
    }
}

/// etcd's refusal of a method other than GET on its HTTP endpoints.
fn method_not_allowed() -> axum::response::Response {
    use axum::response::IntoResponse as _;
    (
        http::StatusCode::METHOD_NOT_ALLOWED,
        [
            (http::header::ALLOW, "GET"),
            (http::header::CONTENT_TYPE, "text/plain; charset=utf-8"),
            (http::header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        "Method Not Allowed\n",
    )
        .into_response()
}

/// `GET /version`: etcd's `{"etcdserver":…,"etcdcluster":…}`, both
/// [`ETCD_COMPATIBLE_VERSION`].
async fn http_version(method: http::Method) -> axum::response::Response {
    use axum::response::IntoResponse as _;
    if method != http::Method::GET {
        return method_not_allowed();
    }
    let body = format!(
        "{{\"etcdserver\":\"{ETCD_COMPATIBLE_VERSION}\",\"etcdcluster\":\"{ETCD_COMPATIBLE_VERSION}\"}}"
    );
    (
        http::StatusCode::OK,
        [(http::header::CONTENT_TYPE, "application/json")],
        body,
    )
        .into_response()
}

/// `GET /health` as etcd 3.4 answers it: 200 `{"health":"true"}` when a
/// leader is known and a linearizable read goes through within
/// [`HEALTH_READ_TIMEOUT`] (etcd's quorum read), otherwise 503
/// `{"health":"false"}` (with Go's error newline and headers). raftcask
/// raises no alarms, so etcd's alarm test never fails.
async fn http_health(front_end: EtcdFrontEnd, method: http::Method) -> axum::response::Response {
    use axum::response::IntoResponse as _;
    if method != http::Method::GET {
        return method_not_allowed();
    }
    let leader = crate::raft::membership::known_leader(&front_end.raft.metrics().borrow());
    let healthy = leader.is_some()
        && matches!(
            tokio::time::timeout(
                HEALTH_READ_TIMEOUT,
                front_end
                    .kv
                    .prepare_read(kvproto::kv::v1::Consistency::Linearizable, 0),
            )
            .await,
            Ok(Ok(()))
        );
    if healthy {
        (
            http::StatusCode::OK,
            [(http::header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            "{\"health\":\"true\"}",
        )
            .into_response()
    } else {
        (
            http::StatusCode::SERVICE_UNAVAILABLE,
            [
                (http::header::CONTENT_TYPE, "text/plain; charset=utf-8"),
                (http::header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            ],
            "{\"health\":\"false\"}\n",
        )
            .into_response()
    }
}

/// Serves the etcd port on `listener` until `shutdown` turns true: the
/// client port's TLS (and client certificates), connection cap, handshake
/// deadline, HTTP/2 limits and in-flight cap, the token check
/// ([`TokenLayer`]), and HTTP/1.1 next to HTTP/2 for etcd's `GET /health`
/// and `GET /version`.
pub async fn serve(
    listener: TcpListener,
    front_end: EtcdFrontEnd,
    security: Security,
    limits: Limits,
    mut shutdown: signal::Receiver<bool>,
) {
    let incoming = crate::server::limits::incoming(
        "etcd",
        TcpIncoming::from(listener).with_nodelay(Some(true)),
        limits.client_connections_max,
        limits.handshake_timeout,
    )
    .map(|conn| conn.map(authority::AuthorityRepair::new));
    let client_certs: ClientCerts = security.client_certs();
    let builder = match crate::server::security::grpc_server(security.tls.as_ref(), client_certs) {
        Ok(builder) => builder,
        Err(err) => {
            tracing::error!(error = %err, "etcd port: TLS set-up failed");
            return;
        }
    };
    // The client port's checks without its token (client certificates),
    // then this port's token check, which knows etcd's `token` metadata
    // and the paths open without one.
    let certs_only = Security {
        auth_token: None,
        ..security.clone()
    };
    let mut server = crate::server::limits::client_server(
        builder.accept_http1(true),
        &limits,
        recipe::RECIPE_WAIT_PATHS,
    )
    .layer(tonic::service::InterceptorLayer::new(
        certs_only.client_check(),
    ))
    .layer(TokenLayer::new(security.auth_token.clone()));
    let decode = ETCD_REQUEST_BYTES_MAX + ETCD_GRPC_OVERHEAD_BYTES;
    let encode = ETCD_RESPONSE_BYTES_MAX;
    macro_rules! sized {
        ($server:expr) => {
            $server
                .max_decoding_message_size(decode)
                .max_encoding_message_size(encode)
        };
    }
    use kvproto::etcd::etcdserverpb::{
        auth_server::AuthServer, cluster_server::ClusterServer, kv_server::KvServer,
        lease_server::LeaseServer, maintenance_server::MaintenanceServer,
        watch_server::WatchServer,
    };
    use kvproto::etcd::v3electionpb::election_server::ElectionServer;
    use kvproto::etcd::v3lockpb::lock_server::LockServer;
    let mut routes = tonic::service::Routes::builder();
    routes
        .add_service(sized!(KvServer::new(front_end.clone())))
        .add_service(sized!(WatchServer::new(front_end.clone())))
        .add_service(sized!(LeaseServer::new(front_end.clone())))
        .add_service(sized!(ClusterServer::new(front_end.clone())))
        .add_service(sized!(MaintenanceServer::new(front_end.clone())))
        .add_service(sized!(AuthServer::new(front_end.clone())))
        .add_service(sized!(LockServer::new(front_end.clone())))
        .add_service(sized!(ElectionServer::new(front_end.clone())));
    let router = routes
        .routes()
        .into_axum_router()
        .route("/version", axum::routing::any(http_version))
        .route(
            "/health",
            axum::routing::any(move |method: http::Method| http_health(front_end.clone(), method)),
        );
    let result = server
        .add_routes(tonic::service::Routes::from(router))
        .serve_with_incoming_shutdown(incoming, async move {
            let _ = shutdown.wait_for(|stop| *stop).await;
        })
        .await;
    if let Err(err) = result {
        tracing::error!(error = %err, "etcd server failed");
    }
}
