//! The jepsen crate's integration tests: one binary, one module per scenario.

mod cli;
mod common;
mod injected_anomalies;
mod properties;
mod set_and_lost;
mod testdata;
