//! The I/O trait every file access goes through.
//!
//! [`RealFs`] is the production implementation (positioned reads and writes
//! on `std::fs::File`, `fdatasync` for file syncs, a directory fsync after
//! every create, rename and delete that must be durable). [`crate::sim::SimFs`]
//! keeps files in memory and can lose what was not fsynced or fail on
//! command, for power-loss and fault tests.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
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
    /// guard lives; fails with `WouldBlock` if another engine holds it. The
    /// default takes no lock (test file systems live in one process).
    fn lock_dir(&self, _dir: &Path) -> io::Result<DirLock> {
        Ok(DirLock(None))
    }
}

/// Name of the lock file in a data directory (empty; only its lock matters).
pub const LOCK_FILE_NAME: &str = "LOCK";

/// Holds a data directory's lock until dropped (the open, locked file; the
/// lock goes with it).
#[derive(Debug)]
pub struct DirLock(#[allow(dead_code)] Option<File>);

/// The real file system.
#[derive(Clone, Copy, Debug, Default)]
pub struct RealFs;

#[derive(Debug)]
struct RealFile(File);

impl VfsFile for RealFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        self.0.read_at(buf, offset)
    }
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.0.write_all_at(buf, offset)
    }
    fn sync(&self) -> io::Result<()> {
        self.0.sync_data()
    }
    fn len(&self) -> io::Result<u64> {
        Ok(self.0.metadata()?.len())
    }
    fn truncate(&self, len: u64) -> io::Result<()> {
        self.0.set_len(len)
    }

    // Reads of sealed segments are served from a memory map: a lookup then
    // costs a copy out of the page cache instead of a pread(2) system call.
    #[allow(unsafe_code)]
    fn map(&self) -> io::Result<Mapping> {
        // SAFETY: a memory map is undefined behaviour only if the file
        // changes underneath it. The engine maps only sealed files, which it
        // never writes, truncates or renames over (a merge deletes them, and
        // unlinking leaves existing mappings valid); the data directory
        // belongs to one engine. An outside process truncating a sealed file
        // would break that, as it would break any Bitcask.
        let map = unsafe { memmap2::Mmap::map(&self.0)? };
        Ok(Arc::new(map))
    }
}

impl Vfs for RealFs {
    fn create(&self, path: &Path) -> io::Result<Arc<dyn VfsFile>> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(path)?;
        Ok(Arc::new(RealFile(file)))
    }
    fn open(&self, path: &Path) -> io::Result<Arc<dyn VfsFile>> {
        let file = OpenOptions::new().read(true).write(true).open(path)?;
        Ok(Arc::new(RealFile(file)))
    }
    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        let mut names = Vec::new();
        for entry in std::fs::read_dir(dir)? {
            let entry = entry?;
            if let Some(name) = entry.file_name().to_str() {
                names.push(name.to_string());
            }
        }
        names.sort();
        Ok(names)
    }
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        std::fs::rename(from, to)
    }
    fn remove(&self, path: &Path) -> io::Result<()> {
        std::fs::remove_file(path)
    }
    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        File::open(dir)?.sync_all()
    }
    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        std::fs::create_dir_all(dir)
    }
    fn hard_link(&self, from: &Path, to: &Path) -> io::Result<()> {
        std::fs::hard_link(from, to)
    }
    fn remove_dir_all(&self, dir: &Path) -> io::Result<()> {
        std::fs::remove_dir_all(dir)
    }
    fn file_exists(&self, path: &Path) -> bool {
        std::fs::metadata(path).is_ok_and(|m| m.is_file())
    }
    fn lock_dir(&self, dir: &Path) -> io::Result<DirLock> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(dir.join(LOCK_FILE_NAME))?;
        match file.try_lock() {
            Ok(()) => Ok(DirLock(Some(file))),
            Err(std::fs::TryLockError::WouldBlock) => Err(io::Error::new(
                io::ErrorKind::WouldBlock,
                "another engine has this data directory open",
            )),
            Err(std::fs::TryLockError::Error(e)) => Err(e),
        }
    }
}

/// Joins a directory and a file name.
pub(crate) fn path_in(dir: &Path, name: &str) -> PathBuf {
    dir.join(name)
}
