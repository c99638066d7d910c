//! # kvbench
//!
//! Storage benchmarks and the benchmark binaries; the cluster load
//! generator itself is the `kvload` crate (`bench/load`), which depends on
//! no part of the node. The storage benchmark (`engine-compare`) runs the
//! seed workload (25-byte keys, incompressible 4 KiB values) against
//! bitcask, redb and fjall side by side; its results live in
//! `node/bitcask/BENCHMARKS.md`.
//!
//! ## Modules
//! - [`workload`]: keys, incompressible values, random orders.
//! - [`store`]: the [`store::Store`] interface and one adapter per engine
//!   (bitcask always; redb and fjall behind the `compare` feature), with the
//!   durability mapping of each.
//! - [`run`]: bounded timed loops: load, random reads, concurrent writers,
//!   writes while something else runs; latency histograms.
//! - [`probe`]: open time and key-directory memory of one engine, measured
//!   in a fresh child process.
//! - [`compare`]: the whole `engine-compare` run (`engine`: the main data
//!   set of one engine; `big`: the restart data set; `tables`: one function
//!   a result table; `targets`: the targets and their verdicts).
//! - [`report`]: Markdown tables and number formats ([`report::Table`] and
//!   [`report::count`] are kvload's, shared with the load report).
//! - [`fsutil`]: disk usage, page-cache dropping, resident memory.
//! - [`load`]: the `kvload` crate re-exported (so `kvbench::load` paths keep
//!   working): the cluster load generator (gRPC clients, leader discovery,
//!   latency histogram, errors by kind, ops per Raft entry, a live progress
//!   counter and a bounded latency-over-time sample); `kvctl bench` runs on
//!   it too. With feature `etcd` (which enables `kvload/etcd`) the same loop
//!   drives etcd's v3 API ([`load::System`]).
//! - `versus` (feature `etcd`): the raftcask-vs-etcd matrix (raftcask
//!   native, raftcask through its etcd port, etcd), its table (with the
//!   members' CPU per operation) and its SVG.
//!
//! ## Binaries (default build)
//! - `cluster-load`: drives a running cluster with [`load`] and prints a
//!   table; results in `node/kvnode/BENCHMARKS.md`.
//!
//! ## Binaries (feature `compare`)
//! - `engine-compare`: the comparison; `--help` lists its bounds.
//! - `engine-probe`: the child process `engine-compare` starts for each
//!   open measurement; it installs a counting global allocator, which is why
//!   it is a separate program (the comparison itself runs on the plain
//!   system allocator).
//!
//! ## Binaries (feature `etcd`)
//! - `etcd-compare`: raftcask (native and through its etcd port) vs etcd
//!   on running clusters, one table and an SVG; `deploy/bench/compare-etcd.sh` starts both clusters and runs it.
//!
//! Build and run (release profile):
//! `cargo build --release -p kvbench --features compare` then
//! `target/release/engine-compare`.

pub mod compare;
pub mod fsutil;
/// The cluster load core, now its own crate ([`kvload`]); re-exported here
/// so `kvbench::load` paths keep working.
pub use kvload as load;
pub mod probe;
pub mod report;
pub mod run;
pub mod store;
#[cfg(feature = "etcd")]
pub mod versus;
pub mod workload;
