//! # kvnode
//!
//! The replicated node: openraft over the bitcask engine, gRPC services, the
//! kvnode binary. See DESIGN §3 and `ARCHITECTURE.md`.
//!
//! ## Modules
//! - [`command`]: what a Raft entry carries — the leader's cluster time and
//!   a command (client requests, tick, merge) — and the outcome per request.
//! - [`apply`]: applying one entry to the engine deterministically: one
//!   engine batch per entry, versions `index × 65536 + position`,
//!   conditions, TTL by cluster time, exactly-once sessions.
//! - [`batcher`]: proposal batching — concurrent client requests gathered
//!   into one entry (capped by count, ops and bytes), pipelined.
//! - [`codec`]: the one binary codec (bincode 2, serde mode) for Raft
//!   entries, votes and openraft payloads, with bounded decoding.
//! - [`log_store`]: the Raft log store — segmented, checksummed append-only
//!   files through the engine's I/O trait, implementing openraft's
//!   `RaftLogStorage` (byte layout in `LOG_FORMAT.md`).
//! - [`types`]: the openraft type config (`TypeConfig`), the node type
//!   (`NodeInfo`: client and peer address) and the commit metadata every
//!   applied entry leaves in the engine (`CommitMeta`).
//! - [`state_machine`]: openraft's `RaftStateMachine` over the engine and
//!   [`apply`]: one engine batch per entry, exact recovery of
//!   `last_applied` / membership / cluster time, snapshots built from the
//!   engine's files and installed by an atomic switch of the engine
//!   directory.
//! - [`snapshot`]: the snapshot manifest, the `CURRENT` engine pointer and
//!   the snapshot handle (byte layout in `SNAPSHOT_FORMAT.md`).
//!
//! - [`identity`]: who a member is — incarnation per data directory, the
//!   cluster id, peers' incarnations (`DATA/IDENTITY`) — and the checks
//!   every peer request passes.
//! - [`read_index`]: linearizable reads — shared read-index rounds (leader:
//!   quorum round; follower: `ReadIndex` RPC to the leader), then a wait
//!   until applied.
//! - [`faults`]: test hooks (lost write replies, cut peer links), off by
//!   default.
//! - [`network`]: openraft's network over tonic (cached channel per peer,
//!   bound to the node's own address, identity on every request, codec
//!   payloads, incremental snapshot transfer — only the files and tails the
//!   follower lacks — ReadIndex and Identify).
//! - [`service`]: the peer `Raft` gRPC service, the client `Kv` and
//!   `Cluster` services.
//! - [`convert`]: protocol conversions, error statuses with `ErrorDetail`,
//!   request limits.
//! - [`node`]: one member: configuration checks, identity, storage,
//!   openraft, batcher, tick loop, the ports, bootstrap and graceful
//!   shutdown.
//! - [`limits`]: limits under load on the ports (connection caps, a
//!   handshake deadline, HTTP/2 streams and keepalives, the client port's
//!   in-flight cap answering RESOURCE_EXHAUSTED).
//! - [`disk`]: the free-space watermark checked before proposing writes,
//!   and storage failure (ENOSPC, EROFS) stopping the member.
//! - [`membership`]: membership changes on the leader (add, promote, remove).
//! - [`metrics`]: the Prometheus metrics of one member (DESIGN §6 names;
//!   `METRICS.md`), per node, gauges filled at scrape time.
//! - [`admin`]: the admin HTTP port: `/metrics`, `/health`, `/ready`.
//! - [`merge_policy`]: the leader's merge policy (proposes merge entries
//!   when dead bytes pile up, one at a time) and the snapshot-by-bytes
//!   trigger.
//! - [`security`]: TLS material and the ports' TLS settings (mutual TLS
//!   on the peer port) and the client port's bearer-token check (the
//!   development CA of `kvctl certs` and the tests is the `kvcerts` crate).
//! - [`testing`]: test support for the crates above (an in-process cluster
//!   on a private loopback address); nothing in the node uses it.
//! - [`lazy_disk`] (feature `lazy-disk`, test builds only): a file system
//!   keeping un-fsynced writes, and directory changes not followed by a
//!   directory fsync, in process memory, so SIGKILL is a power cut.
//! - [`BUILD_FEATURES`]: the test-only features this build has (negative
//!   controls `nc-*` break the node on purpose; see Cargo.toml).
//! - [`backup`]: backups over the `kvarchive` format (the archive's
//!   headers checked against the decoded snapshot manifest) and `kvnode
//!   restore` (seed a member of a new cluster from an archive).

pub mod admin;
pub mod apply;
pub mod backup;
pub mod batcher;
pub mod codec;
pub mod command;
pub mod convert;
pub mod disk;
pub mod faults;
pub mod identity;
#[cfg(feature = "lazy-disk")]
pub mod lazy_disk;
pub mod limits;
pub mod log_store;
pub mod membership;
pub mod merge_policy;
pub mod metrics;
pub mod network;
pub mod node;
pub mod read_index;
pub mod security;
pub mod service;
pub mod snapshot;
pub mod state_machine;
pub mod testing;
pub mod types;

/// The test-only cargo features this build was made with (none in a real
/// build); `kvnode --version` prints them and the fault suite checks them.
pub const BUILD_FEATURES: &[&str] = &[
    #[cfg(feature = "lazy-disk")]
    "lazy-disk",
    #[cfg(feature = "nc-local-reads")]
    "nc-local-reads",
    #[cfg(feature = "nc-ack-before-commit")]
    "nc-ack-before-commit",
    #[cfg(feature = "nc-skip-log-fsync")]
    "nc-skip-log-fsync",
    #[cfg(feature = "nc-forget-sessions")]
    "nc-forget-sessions",
    #[cfg(feature = "nc-old-clock")]
    "nc-old-clock",
    #[cfg(feature = "nc-unknown-sessions")]
    "nc-unknown-sessions",
    #[cfg(feature = "nc-snapshot-by-counter")]
    "nc-snapshot-by-counter",
    #[cfg(feature = "nc-rename-no-dir-fsync")]
    "nc-rename-no-dir-fsync",
];

pub use faults::Faults;
pub use log_store::{LogError, LogReader, LogStore, LogStoreOptions};
pub use node::{Listeners, Node, NodeConfig};
pub use snapshot::SnapshotHandle;
pub use state_machine::{SmError, StateMachine, StateMachineOptions};
pub use types::{CommitMeta, NodeInfo, TypeConfig};
