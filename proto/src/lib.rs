//! # kvproto
//!
//! gRPC protocol definitions (.proto files and generated code) shared by node and client.
//!
//! This crate is an empty shell in the workspace layout: its work is tracked
//! by issue 3 of the project tracker and has not landed yet. Nothing here is
//! exported, so nothing can depend on it by accident.
