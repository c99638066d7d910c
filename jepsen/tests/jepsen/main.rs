//! The jepsen crate's integration tests: one binary, one module per scenario.

mod cli;
mod common;
mod controls;
mod harness_checks;
mod harness_register;
mod injected_anomalies;
mod properties;
mod set_and_lost;
mod testdata;
