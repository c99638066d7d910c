//! Re-export of [`vfs::sim`] (bitcask feature `sim`), kept so that
//! `bitcask::sim::...` paths keep working; new code should name `vfs::sim`
//! directly.

pub use vfs::sim::{SimFs, Torn};
