//! The kvclient integration tests: one binary, one module per scenario, each
//! against an in-process three-node cluster on ephemeral 127.0.0.1 ports.

mod harness;
mod leader_kill;
mod lease;
mod operations;
mod read_your_writes;
mod scan_paging;
mod unknown_outcome;
mod watch;
