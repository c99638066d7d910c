//! Integration tests of the bitcask engine: one binary, one module per
//! scenario. Each module opens with what it proves and how.

mod basic;
mod common;
mod crash;
mod determinism;
mod fsync_failure;
mod fuzz;
mod history;
mod merge;
mod model;
mod power_loss;
mod record_meta;
mod recovery;
mod snapshot_files;
