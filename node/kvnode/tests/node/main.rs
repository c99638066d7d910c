//! The kvnode integration tests: one binary, one module per scenario.

mod admin;
mod cluster;
mod cluster_service;
mod common;
mod conditions;
mod corruption;
mod faults;
mod fsync_failure;
mod harness;
mod identity;
mod kv_ops;
mod log_store;
mod power_loss;
mod process;
mod replica_files;
mod snapshot_transfer;
mod state_machine;
mod suite;
mod ttl;
