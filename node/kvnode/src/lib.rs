//! # kvnode
//!
//! The replicated node: openraft over the bitcask engine, gRPC services, the
//! kvnode binary. See DESIGN §3 and `ARCHITECTURE.md`.
//!
//! ## Layout (the folders are the architecture; see `ARCHITECTURE.md`)
//! - [`node`]: one member — configuration checks, identity
//!   ([`node::identity`]), storage, openraft, the background tasks, the
//!   ports, bootstrap and graceful shutdown; disk-full handling
//!   ([`node::disk`]).
//! - [`raft`]: openraft's type config and network over tonic, the proposal
//!   batcher, linearizable reads, membership changes, the merge policy.
//! - [`state_machine`]: openraft's `RaftStateMachine` over the engine and
//!   the `kvstate` crate (commands, deterministic apply): exact recovery of
//!   `last_applied`, membership and cluster time.
//! - [`snapshot`]: the snapshot lifecycle — manifest, build, send, receive,
//!   install, save, backup and restore.
//! - [`server`]: the ports — one file per gRPC service, the admin port,
//!   conversions, limits, security, metrics.
//! - [`log_store`]: the `raftlog` crate, re-exported — the Raft log store
//!   (segmented, checksummed files; `node/raftlog/LOG_FORMAT.md`).
//! - [`codec`]: the `kvcodec` crate, re-exported — the one binary codec
//!   (bincode 2) for Raft entries, votes and openraft payloads, with
//!   bounded decoding.
//! - [`hooks`]: the seams tests plug into (fault switches, install crash
//!   points): the real switches with the `testing` feature, constant-false
//!   stand-ins without it.
//! - `testing` (feature `testing` only): test support — an in-process
//!   cluster on a private loopback address, the fault switches, the crash
//!   points and the stale-build fault.
//! - [`lazy_disk`] (feature `lazy-disk`, test builds only): a file system
//!   keeping un-fsynced writes, and directory changes not followed by a
//!   directory fsync, in process memory, so SIGKILL is a power cut.
//! - [`BUILD_FEATURES`]: the test-only features this build has (negative
//!   controls `nc-*` break the node on purpose; see Cargo.toml).

pub use kvcodec as codec;
pub mod hooks;
#[cfg(feature = "lazy-disk")]
pub mod lazy_disk;
pub use raftlog as log_store;
pub mod node;
pub mod raft;
pub mod server;
pub mod snapshot;
pub mod state_machine;
#[cfg(feature = "testing")]
pub mod testing;

// kvstate evicts sessions after the wire constant clients size retries by;
// it does not link the protocol, so the two are checked equal here.
const _: () = assert!(kvstate::command::SESSION_IDLE_MS_MAX == kvproto::SESSION_IDLE_MS);

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
    #[cfg(feature = "nc-watch-skip")]
    "nc-watch-skip",
    #[cfg(feature = "nc-lease-leader-memory")]
    "nc-lease-leader-memory",
    // Last, so a variant's feature list reads `<lazy-disk/nc-*>+testing`.
    #[cfg(feature = "testing")]
    "testing",
];

pub use hooks::Faults;
pub use log_store::{LogError, LogReader, LogStore, LogStoreOptions};
pub use node::{Listeners, Node, NodeConfig};
pub use raft::types::{CommitMeta, NodeInfo, TypeConfig};
pub use snapshot::SnapshotHandle;
pub use state_machine::{SmError, StateMachine, StateMachineOptions};
