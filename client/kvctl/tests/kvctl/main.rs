//! kvctl's integration tests: the real binary against in-process clusters.
//! One module per scenario, each with at most one cluster.

mod bad_input;
mod cluster;
mod harness;
mod keys;
mod lease;
mod ranges;
mod tls;
mod watch;
