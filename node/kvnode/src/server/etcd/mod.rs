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
//!   (the port: TLS, connection cap, the client port's token check).
//! - [`errors`]: native statuses as etcd's gRPC errors (code and exact
//!   message, so client libraries classify them as they do etcd's).
//! - [`kv`]: the `KV` service (Range, Put, DeleteRange, Txn, Compact).
//! - [`watch`]: the `Watch` service, over the native watch machinery.
//! - [`lease`]: the `Lease` service, over the native lease commands and
//!   the leader's renewal coalescer.
//! - [`cluster`]: the `Cluster` service (membership).
//! - [`maintenance`]: the `Maintenance` service (Status, Alarm, MoveLeader,
//!   and the rest answered or refused with a message).
//! - [`lock`]: the `Lock` service (Lock, Unlock) and [`election`]: the
//!   `Election` service (Campaign, Proclaim, Leader, Observe, Resign), as
//!   etcd's server builds them on its `concurrency` package; [`recipe`]:
//!   what they share (the session's key, the wait for the keys created
//!   before it over the native watch, the limits, their errors).
//! - [`unserved`]: `Auth`: UNIMPLEMENTED with a message naming what is
//!   not served (AuthDisable answers "not enabled").

pub mod cluster;
pub mod election;
pub mod errors;
pub mod kv;
pub mod lease;
pub mod lock;
pub mod maintenance;
pub mod recipe;
pub mod unserved;
pub mod watch;

use std::net::SocketAddr;

use kvproto::etcd::etcdserverpb::ResponseHeader;
use kvproto::kv::v1::Header;
use tokio::net::TcpListener;
use tokio::sync::watch as signal;
use tonic::transport::server::TcpIncoming;

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
        }
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

/// Serves the etcd port on `listener` until `shutdown` turns true: the
/// client port's TLS (and client certificates), connection cap, handshake
/// deadline, HTTP/2 limits, in-flight cap and token check.
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
    );
    let client_certs: ClientCerts = security.client_certs();
    let builder = match crate::server::security::grpc_server(security.tls.as_ref(), client_certs) {
        Ok(builder) => builder,
        Err(err) => {
            tracing::error!(error = %err, "etcd port: TLS set-up failed");
            return;
        }
    };
    let mut server = crate::server::limits::client_server(builder, &limits).layer(
        tonic::service::InterceptorLayer::new(security.client_check()),
    );
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
    let result = server
        .add_service(sized!(KvServer::new(front_end.clone())))
        .add_service(sized!(WatchServer::new(front_end.clone())))
        .add_service(sized!(LeaseServer::new(front_end.clone())))
        .add_service(sized!(ClusterServer::new(front_end.clone())))
        .add_service(sized!(MaintenanceServer::new(front_end.clone())))
        .add_service(sized!(AuthServer::new(front_end.clone())))
        .add_service(sized!(LockServer::new(front_end.clone())))
        .add_service(sized!(ElectionServer::new(front_end)))
        .serve_with_incoming_shutdown(incoming, async move {
            let _ = shutdown.wait_for(|stop| *stop).await;
        })
        .await;
    if let Err(err) = result {
        tracing::error!(error = %err, "etcd server failed");
    }
}
