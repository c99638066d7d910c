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
//! - [`codec`]: the one binary codec (bincode 2, serde mode) for Raft
//!   entries, votes and openraft payloads, with bounded decoding.
//! - [`log_store`]: the Raft log store — segmented, checksummed append-only
//!   files through the engine's I/O trait, implementing openraft's
//!   `RaftLogStorage` (byte layout in `LOG_FORMAT.md`).
//!
//! The rest of the node (the openraft type config and state-machine trait
//! over [`apply`], snapshots, proposal batching, the peer and client gRPC
//! services, the admin HTTP port, the binary) is being built.

pub mod apply;
pub mod codec;
pub mod command;
pub mod log_store;

pub use log_store::{LogError, LogReader, LogStore, LogStoreOptions};
