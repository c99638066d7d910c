//! Re-export of the [`vfs`] crate's I/O trait and real disk, kept so that
//! `bitcask::io::...` paths keep working; new code should name `vfs`
//! directly.

pub use vfs::{DirLock, LOCK_FILE_NAME, Mapping, RealFs, Vfs, VfsFile};
