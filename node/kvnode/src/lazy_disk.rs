//! The lazy disk: a test-only [`Vfs`] over the real files (kvnode feature
//! `lazy-disk`, off by default) whose file writes reach the real file only
//! at the file's fsync.
//!
//! Every write (and truncate) since a file's last `sync` is kept in this
//! process's memory, in [`PAGE_SIZE_BYTES`] pages; reads of the running
//! process see them. `sync` writes the pages to the real file and fsyncs
//! it. So when the process is SIGKILLed, exactly the un-fsynced file data
//! is gone, as after a power cut, while a plain SIGKILL of a real-disk
//! build loses nothing (the page cache keeps it). The jepsen `power-loss`
//! faults run against a build with this feature.
//!
//! What it models, precisely:
//! - **File data and length**: a file's bytes and length on disk are those
//!   of its last `sync`; nothing written after it survives (no torn
//!   prefix: the harshest of the outcomes a real disk allows).
//! - **Creates, renames, deletions**: applied to the real file system at
//!   once, so durable at once, as if every directory were fsynced right
//!   after (one of the outcomes a real file system allows; we do not model
//!   a lost create or rename). `create` truncates the real file at once
//!   (`O_TRUNC`), so re-creating a file drops its durable bytes too.
//! - **Files written outside the vfs** (identity, snapshot manifests,
//!   `CURRENT`, received snapshot files written with `std::fs`): real
//!   files, durable as the real disk makes them.
//! - Handles of one file share one state (keyed by device and inode), so a
//!   second `open` of a file, or of a hard link to it, sees the unsynced
//!   bytes too, as it would through the page cache.
//!
//! All handles live in one process-wide [`LazyFs`] ([`shared`]), used for
//! both the Raft log store and the engine.

use std::collections::{BTreeMap, HashMap};
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt as _, MetadataExt as _};
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use bitcask::io::{DirLock, RealFs, Vfs, VfsFile};

/// Granularity of the unsynced bytes kept in memory: a write touches whole
/// pages (the first touch reads the page's durable bytes), as a page cache
/// does.
pub const PAGE_SIZE_BYTES: u64 = 4096;

/// Device and inode: one file whatever its names.
type FileKey = (u64, u64);

/// The lazy file system; cheap to clone (clones share the handles).
#[derive(Clone, Debug, Default)]
pub struct LazyFs {
    files: Arc<Mutex<HashMap<FileKey, Arc<LazyFile>>>>,
}

/// The one lazy file system of this process.
pub fn shared() -> Arc<LazyFs> {
    static SHARED: OnceLock<Arc<LazyFs>> = OnceLock::new();
    SHARED.get_or_init(|| Arc::new(LazyFs::new())).clone()
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn key_of(metadata: &std::fs::Metadata) -> FileKey {
    (metadata.dev(), metadata.ino())
}

impl LazyFs {
    /// A lazy file system with no handle open yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// The shared handle of `file` (opened at `path`), registering it.
    fn handle(&self, file: File, truncated: bool) -> io::Result<Arc<dyn VfsFile>> {
        let metadata = file.metadata()?;
        let key = key_of(&metadata);
        let mut files = lock(&self.files);
        if let Some(existing) = files.get(&key) {
            if truncated {
                existing.reset_to_empty();
            }
            return Ok(existing.clone());
        }
        let len = metadata.len();
        let lazy = Arc::new(LazyFile {
            real: file,
            state: Mutex::new(Pending {
                len,
                durable_len: len,
                pages: BTreeMap::new(),
            }),
        });
        files.insert(key, lazy.clone());
        Ok(lazy)
    }

    /// Drops the registry entry of `key` once no name points at the file.
    fn forget_if_unlinked(&self, key: Option<FileKey>) {
        let Some(key) = key else { return };
        let mut files = lock(&self.files);
        let unlinked = files
            .get(&key)
            .is_some_and(|f| f.real.metadata().map_or(true, |m| m.nlink() == 0));
        if unlinked {
            files.remove(&key);
        }
    }

    /// Bytes written and not yet synced, over every handle (for tests).
    pub fn unsynced_pages(&self) -> usize {
        lock(&self.files)
            .values()
            .map(|f| lock(&f.state).pages.len())
            .sum()
    }
}

impl Vfs for LazyFs {
    fn create(&self, path: &Path) -> io::Result<Arc<dyn VfsFile>> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(path)?;
        self.handle(file, true)
    }

    fn open(&self, path: &Path) -> io::Result<Arc<dyn VfsFile>> {
        let file = OpenOptions::new().read(true).write(true).open(path)?;
        self.handle(file, false)
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        RealFs.list(dir)
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let replaced = std::fs::metadata(to).ok().map(|m| key_of(&m));
        std::fs::rename(from, to)?;
        self.forget_if_unlinked(replaced);
        Ok(())
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        let removed = std::fs::metadata(path).ok().map(|m| key_of(&m));
        std::fs::remove_file(path)?;
        self.forget_if_unlinked(removed);
        Ok(())
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        RealFs.sync_dir(dir)
    }

    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        RealFs.create_dir_all(dir)
    }

    fn lock_dir(&self, dir: &Path) -> io::Result<DirLock> {
        RealFs.lock_dir(dir)
    }
}

/// What a file holds beyond its durable bytes.
#[derive(Debug)]
struct Pending {
    /// The file's length as the process sees it.
    len: u64,
    /// Bytes of the real file still valid below the pages: its length at
    /// the last sync, lowered by truncates since (the real bytes past it
    /// read as zeros until the next sync cuts them).
    durable_len: u64,
    /// Pages written since the last sync, by page number.
    pages: BTreeMap<u64, Box<[u8]>>,
}

/// One file: the real file and its unsynced pages.
#[derive(Debug)]
struct LazyFile {
    real: File,
    state: Mutex<Pending>,
}

impl LazyFile {
    fn reset_to_empty(&self) {
        let mut state = lock(&self.state);
        state.len = 0;
        state.durable_len = 0;
        state.pages.clear();
    }

    /// Reads durable bytes at `offset` into `buf` (zeros past the durable
    /// length).
    fn read_durable(&self, state: &Pending, buf: &mut [u8], offset: u64) -> io::Result<()> {
        buf.fill(0);
        let readable = state
            .durable_len
            .saturating_sub(offset)
            .min(buf.len() as u64) as usize;
        let mut done = 0;
        while done < readable {
            let n = self
                .real
                .read_at(&mut buf[done..readable], offset + done as u64)?;
            if n == 0 {
                // The real file is shorter than it was at the last sync:
                // someone cut it outside the vfs; the rest reads as zeros.
                break;
            }
            done += n;
        }
        Ok(())
    }
}

impl VfsFile for LazyFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let state = lock(&self.state);
        if offset >= state.len {
            return Ok(0);
        }
        let n = (state.len - offset).min(buf.len() as u64) as usize;
        let out = &mut buf[..n];
        self.read_durable(&state, out, offset)?;
        let end = offset + n as u64;
        let first_page = offset / PAGE_SIZE_BYTES;
        let last_page = (end - 1) / PAGE_SIZE_BYTES;
        for (&page_no, page) in state.pages.range(first_page..=last_page) {
            let page_start = page_no * PAGE_SIZE_BYTES;
            let from = offset.max(page_start);
            let to = end.min(page_start + PAGE_SIZE_BYTES);
            out[(from - offset) as usize..(to - offset) as usize]
                .copy_from_slice(&page[(from - page_start) as usize..(to - page_start) as usize]);
        }
        Ok(n)
    }

    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        if buf.is_empty() {
            return Ok(());
        }
        let mut state = lock(&self.state);
        let end = offset + buf.len() as u64;
        for page_no in offset / PAGE_SIZE_BYTES..=(end - 1) / PAGE_SIZE_BYTES {
            let page_start = page_no * PAGE_SIZE_BYTES;
            if !state.pages.contains_key(&page_no) {
                let mut page = vec![0u8; PAGE_SIZE_BYTES as usize].into_boxed_slice();
                // Bytes past the current length read as zeros, whatever the
                // real file still holds there.
                let visible = state.len.saturating_sub(page_start).min(PAGE_SIZE_BYTES) as usize;
                self.read_durable(&state, &mut page[..visible], page_start)?;
                state.pages.insert(page_no, page);
            }
            let from = offset.max(page_start);
            let to = end.min(page_start + PAGE_SIZE_BYTES);
            if let Some(page) = state.pages.get_mut(&page_no) {
                page[(from - page_start) as usize..(to - page_start) as usize]
                    .copy_from_slice(&buf[(from - offset) as usize..(to - offset) as usize]);
            }
        }
        state.len = state.len.max(end);
        Ok(())
    }

    fn sync(&self) -> io::Result<()> {
        let mut state = lock(&self.state);
        let real_len = self.real.metadata()?.len();
        if real_len > state.durable_len {
            // Cut what truncates removed, so the gap below `len` reads as zeros.
            self.real.set_len(state.durable_len)?;
        }
        if real_len != state.len || state.durable_len != state.len {
            self.real.set_len(state.len)?;
        }
        let len = state.len;
        for (&page_no, page) in &state.pages {
            let page_start = page_no * PAGE_SIZE_BYTES;
            if page_start >= len {
                continue;
            }
            let n = (len - page_start).min(PAGE_SIZE_BYTES) as usize;
            self.real.write_all_at(&page[..n], page_start)?;
        }
        self.real.sync_data()?;
        state.pages.clear();
        state.durable_len = len;
        Ok(())
    }

    fn len(&self) -> io::Result<u64> {
        Ok(lock(&self.state).len)
    }

    fn truncate(&self, len: u64) -> io::Result<()> {
        let mut state = lock(&self.state);
        if len < state.len {
            state.durable_len = state.durable_len.min(len);
            let boundary_page = len / PAGE_SIZE_BYTES;
            let keep_from_boundary = (len % PAGE_SIZE_BYTES) as usize;
            // Pages wholly past the cut go; the page holding the cut keeps
            // its head and reads zeros after it.
            let first_gone = if keep_from_boundary == 0 {
                boundary_page
            } else {
                boundary_page + 1
            };
            let _ = state.pages.split_off(&first_gone);
            if keep_from_boundary != 0 {
                // A clean page holding the cut needs nothing: its bytes
                // past the durable length already read as zeros.
                if let Some(page) = state.pages.get_mut(&boundary_page) {
                    page[keep_from_boundary..].fill(0);
                }
            }
        }
        state.len = len;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a restarted process finds: a fresh lazy file system over the
    /// same real files (the old one's memory is gone, as after SIGKILL).
    fn power_cut() -> LazyFs {
        LazyFs::new()
    }

    fn read_all(file: &dyn VfsFile) -> Vec<u8> {
        let mut bytes = vec![0u8; file.len().unwrap() as usize];
        file.read_exact_at(&mut bytes, 0).unwrap();
        bytes
    }

    #[test]
    fn unsynced_writes_are_seen_by_the_process_and_lost_at_a_power_cut() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let fs = LazyFs::new();
        let file = fs.create(&path).unwrap();
        file.write_all_at(b"hello", 0).unwrap();
        file.sync().unwrap();
        file.write_all_at(b" world", 5).unwrap();
        assert_eq!(read_all(&*file), b"hello world");
        assert_eq!(file.len().unwrap(), 11);
        assert_eq!(
            std::fs::read(&path).unwrap(),
            b"hello",
            "the real file holds only the synced bytes"
        );
        let after = power_cut().open(&path).unwrap();
        assert_eq!(read_all(&*after), b"hello");
    }

    #[test]
    fn sync_makes_everything_durable() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let fs = LazyFs::new();
        let file = fs.create(&path).unwrap();
        // Across page boundaries, with a hole.
        let big: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
        file.write_all_at(&big, 100).unwrap();
        file.write_all_at(b"x", 20_000).unwrap();
        assert!(fs.unsynced_pages() > 0);
        file.sync().unwrap();
        assert_eq!(fs.unsynced_pages(), 0);
        let mut expected = vec![0u8; 20_001];
        expected[100..10_100].copy_from_slice(&big);
        expected[20_000] = b'x';
        assert_eq!(std::fs::read(&path).unwrap(), expected);
        assert_eq!(read_all(&*power_cut().open(&path).unwrap()), expected);
    }

    #[test]
    fn overwrites_of_synced_bytes_are_lost_too() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let fs = LazyFs::new();
        let file = fs.create(&path).unwrap();
        file.write_all_at(&[1u8; 5000], 0).unwrap();
        file.sync().unwrap();
        file.write_all_at(&[2u8; 10], 4090).unwrap();
        let seen = read_all(&*file);
        assert_eq!(
            &seen[4088..4102],
            &[1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 1, 1]
        );
        assert_eq!(std::fs::read(&path).unwrap(), vec![1u8; 5000]);
    }

    #[test]
    fn truncate_then_grow_reads_zeros_and_a_cut_is_lost_without_sync() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let fs = LazyFs::new();
        let file = fs.create(&path).unwrap();
        file.write_all_at(&[7u8; 9000], 0).unwrap();
        file.sync().unwrap();
        file.truncate(5000).unwrap();
        assert_eq!(file.len().unwrap(), 5000);
        file.write_all_at(b"z", 8999).unwrap();
        let seen = read_all(&*file);
        assert_eq!(seen.len(), 9000);
        assert!(seen[..5000].iter().all(|&b| b == 7));
        assert!(
            seen[5000..8999].iter().all(|&b| b == 0),
            "the cut part reads as zeros"
        );
        assert_eq!(seen[8999], b'z');
        // Not synced: the real file still has all 9000 sevens.
        assert_eq!(std::fs::read(&path).unwrap(), vec![7u8; 9000]);
        file.sync().unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), seen);
        // A plain cut, synced.
        file.truncate(3).unwrap();
        file.sync().unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), vec![7u8; 3]);
    }

    #[test]
    fn handles_of_one_file_share_unsynced_bytes_and_create_truncates() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let fs = LazyFs::new();
        let a = fs.create(&path).unwrap();
        a.write_all_at(b"abc", 0).unwrap();
        let b = fs.open(&path).unwrap();
        assert_eq!(read_all(&*b), b"abc");
        // A rename keeps the file (same inode), its unsynced bytes too.
        let moved = dir.path().join("g");
        fs.rename(&path, &moved).unwrap();
        assert_eq!(read_all(&*fs.open(&moved).unwrap()), b"abc");
        a.sync().unwrap();
        let again = fs.create(&moved).unwrap();
        assert_eq!(again.len().unwrap(), 0);
        assert_eq!(a.len().unwrap(), 0, "every handle sees the re-created file");
        fs.remove(&moved).unwrap();
        assert!(fs.open(&moved).is_err());
        assert!(
            lock(&fs.files).is_empty(),
            "a removed file leaves the registry"
        );
    }

    #[derive(Clone, Debug)]
    enum Step {
        Write(u64, Vec<u8>),
        Truncate(u64),
        Sync,
        PowerCut,
    }

    fn step() -> impl proptest::strategy::Strategy<Value = Step> {
        use proptest::prelude::*;
        prop_oneof![
            4 => (0u64..3 * PAGE_SIZE_BYTES, proptest::collection::vec(any::<u8>(), 1..3000))
                .prop_map(|(offset, bytes)| Step::Write(offset, bytes)),
            1 => (0u64..4 * PAGE_SIZE_BYTES).prop_map(Step::Truncate),
            2 => Just(Step::Sync),
            1 => Just(Step::PowerCut),
        ]
    }

    proptest::proptest! {
        /// Against a model (the bytes the process sees; the bytes of the
        /// last sync): every read agrees, and a power cut leaves exactly
        /// the synced bytes.
        #[test]
        fn agrees_with_a_model(steps in proptest::collection::vec(step(), 1..40)) {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("f");
            let mut fs = LazyFs::new();
            let mut file = fs.create(&path).unwrap();
            let mut live: Vec<u8> = Vec::new();
            let mut durable: Vec<u8> = Vec::new();
            for step in steps {
                match step {
                    Step::Write(offset, bytes) => {
                        file.write_all_at(&bytes, offset).unwrap();
                        let end = offset as usize + bytes.len();
                        if live.len() < end {
                            live.resize(end, 0);
                        }
                        live[offset as usize..end].copy_from_slice(&bytes);
                    }
                    Step::Truncate(len) => {
                        file.truncate(len).unwrap();
                        live.resize(len as usize, 0);
                    }
                    Step::Sync => {
                        file.sync().unwrap();
                        durable = live.clone();
                    }
                    Step::PowerCut => {
                        drop(file);
                        fs = power_cut();
                        file = fs.open(&path).unwrap();
                        live = durable.clone();
                    }
                }
                proptest::prop_assert_eq!(read_all(&*file), live.clone());
                proptest::prop_assert_eq!(std::fs::read(&path).unwrap(), durable.clone());
            }
        }
    }
}
