//! Re-export of [`vfs::lazy`], the lazy disk (power loss = SIGKILL), kept
//! so that `kvnode::lazy_disk::...` paths keep working; kvnode feature
//! `lazy-disk` turns on `vfs/lazy`. The model and its tests live in
//! `node/vfs/src/lazy.rs`.

pub use vfs::lazy::*;
