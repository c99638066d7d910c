//! The snapshot lifecycle in one folder: what a snapshot is on disk, how it
//! is built from the engine's files, sent to a follower, received,
//! installed by switching the engine directory, saved to a client, and
//! restored from a backup archive. Byte layout in `SNAPSHOT_FORMAT.md`.
//!
//! - [`manifest`]: the snapshot manifest, the `CURRENT` engine pointer and
//!   the snapshot handle; durable file plumbing through [`node_vfs`].
//! - [`backup`]: the backup archive and `kvnode restore`.

pub mod backup;
pub mod manifest;

pub use manifest::*;
