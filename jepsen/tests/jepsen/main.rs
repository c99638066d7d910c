//! The jepsen crate's one integration-test binary: a module per scenario.

mod harness_checks;
mod harness_register;
