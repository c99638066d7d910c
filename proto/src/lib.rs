//! # kvproto
//!
//! The gRPC protocol of raftcask: the `.proto` files in `proto/proto/` and the
//! Rust code generated from them at build time (prost messages, tonic clients
//! and servers), and [`session`]: the client half of the exactly-once
//! session protocol, shared by `kvclient` and by a member forwarding writes
//! to its leader. Nothing else lives here: conversions to domain types
//! belong to `kvnode` and `kvclient`.
//!
//! The build needs no system `protoc`: `build.rs` compiles the files with
//! `protox` (a protobuf compiler written in Rust) and hands the descriptor set
//! to `tonic-prost-build`. The generated code goes to `OUT_DIR` and is not
//! committed.
//!
//! ## Modules (one per `.proto` file; module path = protobuf package minus `raftcask`)
//!
//! - [`kv::v1`] (`kv.proto`, package `raftcask.kv.v1`): the `Kv` service on
//!   the client port — Get, Put, Delete, Expire, Persist, Scan, Batch, Range,
//!   DeleteRange, Txn, Compact, Watch, and the Lease calls — with
//!   versions, TTLs, conditions, read consistency, `min_index` and the
//!   exactly-once `Session`; the common response `Header`; and the error
//!   convention: gRPC status codes plus an optional [`kv::v1::ErrorDetail`]
//!   (e.g. [`kv::v1::NotLeader`]) in the status metadata under the binary key
//!   `raftcask-error-bin`. Client: `kv::v1::kv_client::KvClient`; server:
//!   `kv::v1::kv_server::{Kv, KvServer}`.
//! - [`cluster::v1`] (`cluster.proto`, package `raftcask.cluster.v1`): the
//!   `Cluster` service on the client port — Status, MemberList, AddLearner,
//!   Promote, RemoveMember, TriggerSnapshot, SaveSnapshot (server-streaming:
//!   manifest, then chunks). Client: `cluster::v1::cluster_client::ClusterClient`;
//!   server: `cluster::v1::cluster_server::{Cluster, ClusterServer}`.
//! - [`raft::v1`] (`raft.proto`, package `raftcask.raft.v1`): the `Raft`
//!   service on the peer port only — AppendEntries, Vote, ReadIndex, Forward, Identify
//!   and TransferSnapshot (bidirectional: offer, need, chunks, done,
//!   installed). openraft structures travel as opaque `bytes` encoded by
//!   kvnode's codec; every request carries an [`raft::v1::Identity`] (cluster
//!   id, incarnations). Client: `raft::v1::raft_client::RaftClient`; server:
//!   `raft::v1::raft_server::{Raft, RaftServer}`.
//! - [`etcd`] (`etcd/**.proto`): etcd 3.4's v3 API as its clients speak it,
//!   served on the etcd port — packages `etcdserverpb` (services KV, Watch,
//!   Lease, Cluster, Maintenance, Auth), `mvccpb` (KeyValue, Event),
//!   `authpb`, `v3lockpb` (Lock) and `v3electionpb` (Election). Names,
//!   packages and field numbers are etcd's; the comments are ours. Clients:
//!   e.g. `etcd::etcdserverpb::kv_client::KvClient`; servers:
//!   `etcd::etcdserverpb::kv_server::{Kv, KvServer}`.
//!
//! Every protobuf `bytes` field is a `prost::bytes::Bytes` (decoding slices the
//! received buffer instead of copying). Enum fields are stored as `i32`;
//! prost generates typed getters and setters (e.g. `GetRequest::consistency()`).
//!
//! ## Limits
//!
//! The wire constants live here, once: [`ERROR_DETAIL_KEY`],
//! [`KEY_SIZE_BYTES_MAX`] (4 KiB), [`VALUE_SIZE_BYTES_MAX`] (1 MiB),
//! [`SESSION_IDLE_MS`], and the lease constants ([`LEASE_TTL_MS_MIN`],
//! [`LEASE_TTL_MS_MAX`], [`LEASE_ID_MAX`], and the expiry promises
//! [`LEASE_EARLY_BOUND_MS`] and [`LEASE_LATE_BOUND_MS`]). The node enforces the limits (and one Raft entry of
//! 4 MiB, DESIGN §4) and answers INVALID_ARGUMENT naming the limit. Servers and clients should configure
//! tonic's message size limits above the largest legal request.
//!
//! ## Example
//!
//! ```
//! use kvproto::kv::v1::{Consistency, GetRequest, PutRequest, Session, put_request};
//! use prost::Message;
//!
//! let put = PutRequest {
//!     session: Some(Session { client_id: 7, sequence: 1, lowest_unacked_sequence: 1, opens: true }),
//!     key: "greeting".into(),
//!     value: "hello".into(),
//!     ttl_ms: 10_000,
//!     condition: Some(put_request::Condition::IfModRevision(0)),
//! };
//! let wire = put.encode_to_vec();
//! assert_eq!(PutRequest::decode(wire.as_slice()).unwrap(), put);
//!
//! // Linearizable is the default (0 on the wire).
//! assert_eq!(GetRequest::default().consistency(), Consistency::Linearizable);
//! ```

/// Binary gRPC metadata key carrying an encoded [`kv::v1::ErrorDetail`] on
/// an error status (see `kv.proto`). Servers write it, clients read it.
pub const ERROR_DETAIL_KEY: &str = "raftcask-error-bin";
/// Cluster limit on a key, in bytes (DESIGN §4): the node refuses a longer
/// key with INVALID_ARGUMENT naming this limit; clients may check it first.
pub const KEY_SIZE_BYTES_MAX: usize = 4 * 1024;
/// Cluster limit on a value, in bytes (DESIGN §4).
pub const VALUE_SIZE_BYTES_MAX: usize = 1024 * 1024;

/// The peer protocol this build speaks (`Identity.protocol_version` in
/// raft.proto): 2 since openraft 0.10 (its Vote request gained a field and
/// its errors changed shape, so a 0.9 member cannot decode them). A request
/// that says 0 comes from a build before the field existed: version 1.
/// 3 since revisions: entries carry a command (`Writes`) a version 2 member
/// cannot decode. 4 since transactions: entries carry `Txns` and session
/// records transaction answers, which a version 3 member cannot decode.
/// 5 since the change history: entries carry `Compact`, and merges keep
/// the records the history names (a version 4 member's merges would not).
/// 6 since leases: entries carry `Leases`, and a new leader's first entry
/// renews every lease (a version 5 member would apply it differently).
/// Members refuse a request of another version with FAILED_PRECONDITION
/// naming both versions.
pub const PEER_PROTOCOL_VERSION: u32 = 6;

/// The shortest lease time to live (ms): a grant asking for less gets this
/// (etcd raises a TTL below its minimum, 2 s with its default timings, the
/// same way). Shorter leases would not outlive a leader election.
pub const LEASE_TTL_MS_MIN: u64 = 2_000;
/// The longest lease time to live (ms): etcd's `MaxLeaseTTL` (9 × 10^9 s).
pub const LEASE_TTL_MS_MAX: u64 = 9_000_000_000_000;
/// The largest lease id: an etcd lease id is a positive int64.
pub const LEASE_ID_MAX: u64 = i64::MAX as u64;
/// A lease never expires before its TTL minus this (ms) after its last
/// acknowledged keep-alive was sent, measured on the leaders' monotonic
/// clocks (ARCHITECTURE.md, "Leases"): the cluster clock's rounding step.
pub const LEASE_EARLY_BOUND_MS: u64 = 1;
/// Once nothing renews a lease, it expires within its TTL plus this (ms)
/// after its last renewal, outside leaderless periods (a new leader renews
/// every lease): the leader's tick interval, commit and apply on a loaded
/// member, and room for a backlog of expiries.
pub const LEASE_LATE_BOUND_MS: u64 = 1_000;

/// Cluster time (ms) a session may stay idle before the state machine
/// evicts it and forgets its answers (DESIGN §3). A client must not retry a
/// write for longer than half of it (kvclient refuses a longer operation
/// timeout), so a retry always finds its session.
pub const SESSION_IDLE_MS: u64 = 10 * 60 * 1000;

// The generated code passes the workspace lints as it is (checked by clippy
// with `-D warnings`), so the modules below carry no `allow`: prost derives
// `Debug` for every message and tonic for every public client and server.

pub mod session;

/// `raftcask.kv.v1`: the key-value service (client port). See `proto/kv.proto`.
pub mod kv {
    /// Version 1 of the key-value protocol.
    pub mod v1 {
        include!(concat!(env!("OUT_DIR"), "/raftcask.kv.v1.rs"));
    }
}

/// `raftcask.cluster.v1`: cluster administration (client port). See
/// `proto/cluster.proto`.
pub mod cluster {
    /// Version 1 of the cluster protocol.
    pub mod v1 {
        include!(concat!(env!("OUT_DIR"), "/raftcask.cluster.v1.rs"));
    }
}

/// `raftcask.raft.v1`: replication between members (peer port only). See
/// `proto/raft.proto`.
pub mod raft {
    /// Version 1 of the Raft peer protocol.
    pub mod v1 {
        include!(concat!(env!("OUT_DIR"), "/raftcask.raft.v1.rs"));
    }
}

/// etcd 3.4's v3 API (the etcd port), one module per protobuf package, as
/// etcd names them (the generated code refers across them as siblings).
/// See `proto/etcd/`.
pub mod etcd {
    /// Package `etcdserverpb`: the KV, Watch, Lease, Cluster, Maintenance
    /// and Auth services.
    pub mod etcdserverpb {
        include!(concat!(env!("OUT_DIR"), "/etcdserverpb.rs"));
    }
    /// Package `mvccpb`: `KeyValue` and `Event`.
    pub mod mvccpb {
        include!(concat!(env!("OUT_DIR"), "/mvccpb.rs"));
    }
    /// Package `authpb`: users, roles and permissions.
    pub mod authpb {
        include!(concat!(env!("OUT_DIR"), "/authpb.rs"));
    }
    /// Package `v3lockpb`: the Lock service.
    pub mod v3lockpb {
        include!(concat!(env!("OUT_DIR"), "/v3lockpb.rs"));
    }
    /// Package `v3electionpb`: the Election service.
    pub mod v3electionpb {
        include!(concat!(env!("OUT_DIR"), "/v3electionpb.rs"));
    }
}
