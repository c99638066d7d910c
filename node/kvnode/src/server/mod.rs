//! The ports: the gRPC services (one file each), the admin HTTP port, and
//! what every port shares — protocol conversions, limits under load, TLS
//! and tokens, metrics. The front ends of later issues (etcd v3, Redis,
//! HTTP/JSON) go here too. No service does file I/O: what a service needs
//! from disk it asks of the state machine or the snapshot folder (the one
//! file read here is the TLS material, once at start-up, in `security`).
//!
//! - [`kv`]: the client `Kv` service (writes through the batcher, reads by
//!   consistency).
//! - [`txn`]: the wire form of `Kv.Range`, `Kv.DeleteRange` and `Kv.Txn`
//!   (checked into kvstate's range and transaction types, and back).
//! - [`lease`]: the `Kv.Lease*` calls and the leader's renewal coalescer
//!   (keep-alives arriving together share one Raft entry).
//! - [`watch`]: `Kv.Watch`: one task per watch reading its events page by
//!   page from the change history.
//! - [`watch_hub`]: one task per member that wakes the caught-up watches
//!   an applied change concerns.
//! - [`cluster`]: the client `Cluster` service (status, membership,
//!   snapshots, SaveSnapshot streaming).
//! - [`raft`]: the peer `Raft` service (AppendEntries, Vote, ReadIndex,
//!   Forward, Identify, and the receiving end of `TransferSnapshot`).
//! - [`forward`]: a front end's write taken by a member that does not
//!   lead, sent to the leader exactly once under the member's session.
//! - [`convert`]: protocol conversions, error statuses with `ErrorDetail`,
//!   request limits.
//! - [`limits`]: limits under load (connection caps, a handshake deadline,
//!   HTTP/2 streams and keepalives, the client port's in-flight cap
//!   answering RESOURCE_EXHAUSTED).
//! - [`security`]: TLS material and the ports' TLS settings (mutual TLS on
//!   the peer port), the client port's bearer-token check.
//! - [`admin`]: the admin HTTP port: `/metrics`, `/health`, `/ready`.
//! - [`etcd`]: the etcd v3 port: etcdctl and etcd's client libraries,
//!   translated onto the native services and the same write path.
//! - [`redis`]: the Redis (RESP) port: redis-cli, redis-benchmark and Redis
//!   clients, translated onto the same write path and reads.
//! - [`metrics`]: the Prometheus metrics of one member (`METRICS.md`).

pub mod admin;
pub mod cluster;
pub mod convert;
pub mod etcd;
pub mod forward;
pub mod kv;
pub mod lease;
pub mod limits;
pub mod metrics;
pub mod raft;
pub mod redis;
pub mod security;
pub mod txn;
pub mod watch;
pub mod watch_hub;
