//! # kvload
//!
//! The cluster load generator: concurrent clients issuing put / get / mixed
//! operations to a raftcask cluster over gRPC (the kvproto client), bounded
//! by an operation count and a duration, with latencies in a histogram,
//! errors counted by kind, and the mean number of operations per Raft entry.
//!
//! Used by kvbench's `cluster-load` and `etcd-compare` binaries and by
//! `kvctl bench`, which also watches a [`Progress`] while the run goes and
//! plots the run's [`LoadReport::timeline`] (latency over time). It depends
//! on no part of the node (no storage engine, no Raft), so the CLI that
//! links it pulls in neither.
//!
//! - Writes go to the leader: a client starts at an endpoint, follows a
//!   `NotLeader` detail (metadata [`ERROR_DETAIL_KEY`]) to the leader's
//!   client address, and shares what it learned with the other clients.
//!   Any other failure moves the shared guess to the next endpoint.
//! - Reads go to client `i`'s endpoint `i mod n` ([`ReadTarget::Spread`]) or
//!   to the leader ([`ReadTarget::Leader`]).
//! - Latency of an operation is what its caller sees, redirects included.
//! - Ops per Raft entry: an acknowledged write's version is `log index ×
//!   65536 + position`, so the distinct `version >> 16` values are the
//!   entries that carried the run's writes; acknowledged writes divided by
//!   that count is the mean batching factor the proposal batcher achieved.
//! - [`System`]: the same loop drives etcd's v3 API instead (feature `etcd`,
//!   module `etcd`): same clients, connections (one tonic channel each,
//!   built the same way), keys, values, bounds and retry rules; only the
//!   two RPCs differ. etcd has no redirects (its members forward writes to
//!   the leader); the load generator finds etcd's leader once at the start
//!   so writes and leader reads take the same one hop as raftcask's.
//!
//! ## Why not on kvclient
//!
//! The load core stays on raw kvproto calls with its own small leader guess
//! and retry rules, on purpose: what it measures must be one RPC per
//! attempt on the same channels for raftcask and for etcd, and kvclient
//! would add what etcd's side has no counterpart for (client sessions on
//! every write, its own attempt budget, backoff with jitter, skipping
//! unreachable members, TLS-capable channels), so the comparison and the
//! BENCHMARKS.md figures would change meaning. What can be shared without
//! changing the measured path is shared: the wire constants
//! ([`ERROR_DETAIL_KEY`], [`KEY_SIZE_BYTES_MAX`], [`VALUE_SIZE_BYTES_MAX`])
//! come from kvproto, no longer copied here. The three-line decoding of the
//! error detail stays local: taking it from kvclient would put a kvproto
//! type into kvclient's public API (which is moving to its own types) and
//! a kvclient dependency under the benchmark binaries for one function.
//!
//! ## Modules
//! - `config`: [`System`], [`OpKind`], [`ReadTarget`], [`LoadConfig`] and
//!   the bound of every setting ([`ConfigError`] names the one broken).
//! - `run`: [`run`], [`run_observed`], [`run_system`] (and, with `etcd`,
//!   `etcd_leader`): connect, start the clients, merge their tallies.
//! - `client`: one client task's loop and its tallies.
//! - `attempt`: one operation's attempts: the two RPCs, the retry rules, the
//!   error kinds; [`ATTEMPTS_MAX`] and the pauses.
//! - `shared`: the state the clients share (the leader guess and how it
//!   moves).
//! - `pool`: the lazily connected channels per endpoint.
//! - `report`: [`Progress`], [`Sample`], [`LoadReport`] and its table row.
//! - [`table`]: Markdown tables and the count format (kvbench's storage
//!   tables use them too).
//! - `etcd` (feature `etcd`): etcd's KV client on the pool's channels, its
//!   leader, its two RPCs.

mod attempt;
mod client;
mod config;
#[cfg(feature = "etcd")]
mod etcd;
mod pool;
mod report;
mod run;
mod shared;
pub mod table;

pub use attempt::{ATTEMPTS_MAX, REDIRECT_PAUSE, RETRY_PAUSE, RETRY_PAUSE_MAX};
pub use config::{
    CLIENTS_MAX, CONNECTIONS_MAX, ConfigError, DURATION_MAX, KEY_SIZE_BYTES_MAX, LoadConfig,
    OPS_MAX, OpKind, ReadTarget, System, VALUE_SIZE_BYTES_MAX,
};
pub use kvproto::ERROR_DETAIL_KEY;
pub use pool::RPC_TIMEOUT;
pub use report::{LATENCY_US_MAX, LoadReport, Progress, Sample, TIMELINE_SAMPLES_MAX};
#[cfg(feature = "etcd")]
pub use run::etcd_leader;
pub use run::{run, run_observed, run_system};
