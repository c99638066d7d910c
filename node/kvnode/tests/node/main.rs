//! The kvnode integration tests: one binary, one module per scenario.

mod cluster;
mod common;
mod corruption;
mod fsync_failure;
mod kv_ops;
mod log_store;
mod power_loss;
mod process;
mod state_machine;
mod suite;
