//! The kvnode integration tests: one binary, one module per scenario.

mod admin;
mod backup;
mod cluster;
mod cluster_service;
mod common;
mod conditions;
mod corruption;
mod disk_full;
mod faults;
mod fsync_failure;
mod fuzz;
mod harness;
mod identity;
mod kv_ops;
mod limits;
mod log_store;
mod membership;
mod merges;
mod power_loss;
mod process;
mod replica_files;
mod snapshot_transfer;
mod state_machine;
mod suite;
mod tls;
mod ttl;
