//! The gRPC services of a node: [`raft`] on the peer port, [`kv`] on the
//! client port.

pub mod kv;
pub mod raft;
