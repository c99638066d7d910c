//! The kvnode integration tests: one binary, one module per scenario.

mod cluster;
mod cluster_service;
mod common;
mod corruption;
mod faults;
mod fsync_failure;
mod identity;
mod kv_ops;
mod log_store;
mod power_loss;
mod process;
mod state_machine;
mod suite;
