//! # kvnode
//!
//! The replicated node: openraft over the bitcask engine, gRPC services, the kvnode binary.
//!
//! This crate is an empty shell in the workspace layout: its work is tracked
//! by issue 3 of the project tracker and has not landed yet. Nothing here is
//! exported, so nothing can depend on it by accident.
