//! Raft around the state machine: openraft's type config and network, the
//! proposal batcher, linearizable reads, membership changes and the
//! leader's merge policy (where openraft is used in kvnode: see
//! [`types`]).
//!
//! - [`types`]: the openraft type config (`TypeConfig`), the node type
//!   (`NodeInfo`: client and peer address) and the commit metadata every
//!   applied entry leaves in the engine (`CommitMeta`).
//! - [`network`]: openraft's network over tonic (a cached channel per peer,
//!   bound to the node's own address, identity on every request, codec
//!   payloads, ReadIndex and Identify); the snapshot transfer it starts is
//!   in [`crate::snapshot`].
//! - [`batcher`]: proposal batching — concurrent client requests gathered
//!   into one entry (capped by count, ops and bytes), pipelined.
//! - [`read_index`]: linearizable reads — shared read-index rounds (leader:
//!   quorum round; follower: `ReadIndex` RPC to the leader), then a wait
//!   until applied.
//! - [`membership`]: membership changes on the leader (add, promote,
//!   remove).
//! - [`merge_policy`]: the leader's merge policy (merge entries when dead
//!   bytes pile up, one at a time) and the snapshot-by-bytes trigger.
//! - [`watch`]: openraft's metrics receiver with tokio's method names
//!   (`MetricsWatch`: borrow, changed, wait_for).

pub mod batcher;
pub mod membership;
pub mod merge_policy;
pub mod network;
pub(crate) mod propose;
pub mod read_index;
pub mod types;
pub mod watch;
