//! # kvstate
//!
//! The replicated state of a raftcask member, without the machinery that
//! replicates it: what a Raft entry carries and how it is applied to the
//! bitcask engine. No openraft, no tokio, no network — the same entry
//! applied to the same engine state writes the same bytes on every
//! replica, which is what lets followers receive the leader's files as
//! snapshots. kvnode's state machine wraps this crate in openraft's
//! `RaftStateMachine`.
//!
//! ## Modules
//! - [`command`]: what a Raft entry carries — the leader's cluster time and
//!   a command (client requests, tick, merge) — the outcome per request,
//!   and the limits on them.
//! - [`revision`]: revisions as etcd counts them: the store revision in
//!   each commit record, each key's create / mod revision, version and
//!   lease in its engine record's meta, and how both are encoded.
//! - [`apply`]: applying one entry deterministically: one engine batch per
//!   entry, sequence numbers `index × 65536 + position`, a revision per
//!   changing request, conditions, TTLs deleted by cluster time through an
//!   expiry index, exactly-once sessions.

pub mod apply;
pub mod command;
pub mod revision;
