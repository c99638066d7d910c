//! [`RealFs`]: the real file system, the production implementation of
//! [`Vfs`] (positioned reads and writes on `std::fs::File`, `fdatasync` for
//! file syncs, a directory fsync after every create, rename and delete that
//! must be durable, memory maps of sealed files).

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;

use crate::traits::{DirLock, LOCK_FILE_NAME, Mapping, Vfs, VfsFile};

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
                "another engine or log store has this directory open (its LOCK file is held)",
            )),
            Err(std::fs::TryLockError::Error(e)) => Err(e),
        }
    }
}
