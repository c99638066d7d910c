//! The gRPC services of a node: [`raft`] on the peer port, [`kv`] and
//! [`cluster`] on the client port.

pub mod cluster;
pub mod kv;
pub mod raft;
