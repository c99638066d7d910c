//! The I/O trait every file access goes through: [`Vfs`] (directory
//! operations) and [`VfsFile`] (an open file).
//!
//! [`crate::RealFs`] is the production implementation; the simulated disks
//! (features `sim` and `lazy`) implement the same traits for tests.

use std::fs::File;
use std::io;
use std::path::Path;
use std::sync::Arc;

/// A read-only view of a whole file's bytes.
pub type Mapping = Arc<dyn AsRef<[u8]> + Send + Sync>;

/// An open file.
pub trait VfsFile: Send + Sync + std::fmt::Debug {
    /// Reads up to `buf.len()` bytes at `offset`; returns how many were read.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize>;
    /// Writes all of `buf` at `offset`.
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()>;
    /// Makes everything written so far durable (data and length).
    fn sync(&self) -> io::Result<()>;
    /// Current length in bytes.
    fn len(&self) -> io::Result<u64>;
    /// Whether the file is empty.
    fn is_empty(&self) -> io::Result<bool> {
        Ok(self.len()? == 0)
    }
    /// Cuts the file to `len` bytes.
    fn truncate(&self, len: u64) -> io::Result<()>;

    /// The whole file as one read-only slice. Only for files that nobody
    /// writes or truncates while the mapping lives (the engine maps sealed
    /// files only). The default reads the file into memory.
    fn map(&self) -> io::Result<Mapping> {
        let mut bytes = vec![0u8; self.len()? as usize];
        self.read_exact_at(&mut bytes, 0)?;
        Ok(Arc::new(bytes))
    }

    /// Reads exactly `buf.len()` bytes at `offset`.
    fn read_exact_at(&self, buf: &mut [u8], mut offset: u64) -> io::Result<()> {
        let mut done = 0;
        while done < buf.len() {
            let n = self.read_at(&mut buf[done..], offset)?;
            if n == 0 {
                return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "short read"));
            }
            done += n;
            offset += n as u64;
        }
        Ok(())
    }
}

/// A file system: the directory operations the engine needs.
pub trait Vfs: Send + Sync + std::fmt::Debug + 'static {
    /// Creates (or truncates) a file for reading and writing.
    fn create(&self, path: &Path) -> io::Result<Arc<dyn VfsFile>>;
    /// Opens an existing file for reading and writing.
    fn open(&self, path: &Path) -> io::Result<Arc<dyn VfsFile>>;
    /// Names of the entries of a directory (not paths).
    fn list(&self, dir: &Path) -> io::Result<Vec<String>>;
    /// Renames a file (or, where the file system supports it, a
    /// directory), replacing any file of the target name.
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
    /// Deletes a file.
    fn remove(&self, path: &Path) -> io::Result<()>;
    /// Makes creations, renames and deletions in `dir` durable.
    fn sync_dir(&self, dir: &Path) -> io::Result<()>;
    /// Creates a directory and its parents.
    fn create_dir_all(&self, dir: &Path) -> io::Result<()>;
    /// Makes `to` a second name of the file `from` (a hard link); fails if
    /// `to` exists. Durable, like a create, once `to`'s directory is
    /// synced. The default refuses (the engine never links; the node's
    /// snapshots do).
    fn hard_link(&self, _from: &Path, _to: &Path) -> io::Result<()> {
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "this file system does not make hard links",
        ))
    }
    /// Deletes a directory and everything in it. The default refuses (the
    /// engine never deletes directories; the node's snapshots do).
    fn remove_dir_all(&self, _dir: &Path) -> io::Result<()> {
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "this file system does not delete directories",
        ))
    }
    /// Whether a file exists at `path` (as this process sees it). The
    /// default tries to open it.
    fn file_exists(&self, path: &Path) -> bool {
        self.open(path).is_ok()
    }
    /// Takes an exclusive lock on the directory for as long as the returned
    /// guard lives (the engine and the Raft log store each lock their own
    /// directory); fails with `WouldBlock` if another holder, in this
    /// process or another, has it. The default takes no lock (test file
    /// systems live in one process).
    fn lock_dir(&self, _dir: &Path) -> io::Result<DirLock> {
        Ok(DirLock(None))
    }
}

/// Name of the lock file in a data directory (empty; only its lock matters).
pub const LOCK_FILE_NAME: &str = "LOCK";

/// Holds a data directory's lock until dropped (the open, locked file; the
/// lock goes with it).
#[derive(Debug)]
pub struct DirLock(#[allow(dead_code)] pub(crate) Option<File>);
