//! The snapshot lifecycle in one folder: what a snapshot is on disk, how it
//! is built from the engine's files, sent to a follower, received,
//! installed by switching the engine directory, saved to a client, and
//! restored from a backup archive. Byte layout in `SNAPSHOT_FORMAT.md`.
//!
//! One file per stage, in lifecycle order:
//! - [`manifest`]: the snapshot manifest, the `CURRENT` engine pointer and
//!   the snapshot handle; durable file plumbing through [`node_vfs`].
//! - [`layout`]: the `snapshots/` directory — `snap-`/`staging-` names, the
//!   rank of complete snapshots (which one is current), durable deletion.
//! - [`build`]: a snapshot from the engine's files (links, the active
//!   prefix copied, the `MANIFEST` last).
//! - [`send`]: the leader's side of `TransferSnapshot` (offer, answer the
//!   follower's needs with crc32-checked chunks read from the files).
//! - [`receive`]: the follower's side (plan by reusing its own files, stage,
//!   write chunks, check, refetch, seal; discard what openraft skips).
//! - [`install`]: the switch of the engine directory, the recovery of an
//!   interrupted install at open, pruning old snapshots.
//! - [`save`]: SaveSnapshot's file side (open the current snapshot, stream
//!   its files to a client).
//! - [`convert`]: the manifest on the wire (peer and client protocol),
//!   written once.
//! - [`backup`]: the backup archive and `kvnode restore`.
//!
//! The split with its callers: the stages that need the state machine's
//! private state (its apply lock, directory counter, current snapshot,
//! engine) are `impl StateMachine` blocks here (`build`, `layout`,
//! `receive`, `install`; the state machine's fields are `pub(crate)` for
//! them), and `state_machine` keeps opening, applying and openraft's traits,
//! which delegate to them. The leader's sending is an `impl PeerClient`
//! block (`send`), the connection staying `raft::network`'s. The gRPC
//! services in `server/` and `raft/network.rs` keep only the RPC plumbing:
//! no file I/O outside this folder.

pub mod backup;
pub mod build;
pub mod convert;
pub mod install;
pub mod layout;
pub mod manifest;
pub mod receive;
pub mod save;
pub mod send;

pub use manifest::*;
