//! # kvclient
//!
//! Async Rust client: leader routing, retries, read consistency.
//!
//! This crate is an empty shell in the workspace layout: its work is tracked
//! by issue 5 of the project tracker and has not landed yet. Nothing here is
//! exported, so nothing can depend on it by accident.
