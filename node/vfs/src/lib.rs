//! # vfs
//!
//! The I/O layer of raftcask: every file the engine, the Raft log and the
//! node's snapshots touch is reached through the [`Vfs`] trait, so tests can
//! swap the disk for one that loses un-fsynced data or fails on command.
//! Nothing above this crate opens a file directly.
//!
//! ## Modules
//! - `traits`: the [`Vfs`] and [`VfsFile`] traits, [`Mapping`] (a
//!   read-only view of a whole file), [`DirLock`] and [`LOCK_FILE_NAME`].
//! - `real`: [`RealFs`], the real disk (the production implementation),
//!   including the memory map of sealed files — the one audited `unsafe`
//!   block of the workspace, with its SAFETY comment.
//! - `poison`: [`Poison`], the latch a store sets at its first failed write
//!   or fsync, after which it refuses every write.
//! - `sim` (feature `sim`, test builds only): `SimFs`, an in-memory
//!   disk that tracks what was made durable, can cut the power (with a torn
//!   tail) and fails writes or syncs on command.
//! - `lazy` (feature `lazy`, test builds only): `LazyFs`, real files
//!   whose un-fsynced writes and directory changes stay in process memory,
//!   so a SIGKILL loses exactly what a power cut would.
//!
//! Both simulated disks are always compiled for this crate's own unit
//! tests; other crates get them only by enabling the feature.

mod poison;
mod real;
mod traits;

#[cfg(any(test, feature = "lazy"))]
pub mod lazy;
#[cfg(any(test, feature = "sim"))]
pub mod sim;

#[cfg(any(test, feature = "lazy"))]
pub use lazy::LazyFs;
pub use poison::Poison;
pub use real::RealFs;
#[cfg(any(test, feature = "sim"))]
pub use sim::{SimFs, Torn};
pub use traits::{DirLock, LOCK_FILE_NAME, Mapping, Vfs, VfsFile};
