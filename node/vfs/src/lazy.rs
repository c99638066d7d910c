//! The lazy disk: a test-only [`Vfs`] over the real files (feature `lazy`,
//! off by default; kvnode's `lazy-disk` feature turns it on and re-exports
//! this module as `kvnode::lazy_disk`) whose file writes reach the real
//! file only at the file's fsync, and whose directory changes reach the
//! real directory only at the directory's fsync.
//!
//! Everything not yet made durable is kept in this process's memory; the
//! real files hold exactly what a power cut would leave. So when the
//! process is SIGKILLed, exactly the un-fsynced data and the un-fsynced
//! directory changes are gone, as after a power cut, while a plain SIGKILL
//! of a real-disk build loses nothing (the page cache keeps it). The jepsen
//! `power-loss` faults run against a build with this feature.
//!
//! What it models, precisely:
//! - **File data and length**: every write (and truncate) since a file's
//!   last `sync` is kept in memory, in [`PAGE_SIZE_BYTES`] pages; reads of
//!   the running process see them. `sync` writes the pages to the real file
//!   and fsyncs it. A file's bytes and length on disk are those of its last
//!   `sync`; nothing written after it survives (no torn prefix: the
//!   harshest of the outcomes a real disk allows). `create` of an existing
//!   name truncates that file at once (`O_TRUNC`), so re-creating a file
//!   drops its durable bytes too.
//! - **Creates, renames, deletions and hard links of files**: kept, in the
//!   order they were made, in a list of pending directory changes; the
//!   process sees them at once (`open`, `list`, `file_exists` look through
//!   the list), the real directories do not. A new file's data lives in
//!   the real file system under a hidden name in the same directory
//!   (`.lazy-<instance>-<n>`, an *anchor*), so that its fsynced bytes have
//!   somewhere to go; [`Vfs::list`] never shows anchors. `sync_dir(d)`
//!   applies to the real file system the pending changes up to and
//!   including the last one that touches `d` (an entry of `d` created,
//!   renamed in or out, deleted or linked), in order, then fsyncs `d`. So
//!   the real file system always holds the result of a *prefix* of the
//!   changes made — what an ordered journaling file system (ext4) keeps at
//!   a power cut, and never less than every change whose directory was
//!   fsynced. A rename between two directories is applied whole when
//!   either of them is synced. Anchors left by a process that died (their
//!   create never applied) are deleted by the next process's first `list`
//!   of their directory.
//! - **Directories themselves** (`create_dir_all`, a rename of a
//!   directory, `remove_dir_all`) are applied at once, as if their parent
//!   were fsynced right after: not modeled. To keep the real file system a
//!   prefix of the changes, each first applies every pending change at or
//!   below (or above) the paths it touches.
//! - Paths are compared as given (component by component), not
//!   canonicalized: the node names each file the same way every time.
//! - Handles of one file share one state (keyed by device and inode), so a
//!   second `open` of a file, or of a hard link to it, sees the unsynced
//!   bytes too, as it would through the page cache.
//! - **Files written outside the vfs** are outside the model. In a
//!   lazy-disk build, every file the node writes goes through the node's
//!   vfs (kvnode's `snapshot::node_vfs`): the Raft log, the engine, snapshots
//!   (staging, received chunks, `MANIFEST`, copies and links), `CURRENT`,
//!   `IDENTITY`. The exceptions write somewhere no running member reads
//!   from: `kvnode restore` builds a fresh data directory offline (real
//!   files, fsynced), and `kvctl snapshot save` writes the archive on the
//!   client's machine.
//!
//! All handles live in one process-wide [`LazyFs`] ([`shared`]), used for
//! the Raft log store, the engine, snapshots and identity.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt as _, MetadataExt as _};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use crate::real::RealFs;
use crate::traits::{DirLock, Vfs, VfsFile};

/// Granularity of the unsynced bytes kept in memory: a write touches whole
/// pages (the first touch reads the page's durable bytes), as a page cache
/// does.
pub const PAGE_SIZE_BYTES: u64 = 4096;

/// Start of the hidden name of an anchor (a new file whose create is not
/// durable yet): `.lazy-<instance tag>-<n>`.
pub const ANCHOR_PREFIX: &str = ".lazy-";

/// Device and inode: one file whatever its names.
type FileKey = (u64, u64);

/// A directory change not made durable yet. Paths are the process's view
/// at the time the change was made, which is what the real file system
/// holds when the change is applied (every earlier change is applied
/// first).
#[derive(Clone, Debug)]
enum Change {
    /// A new file, kept at the hidden `anchor` (same directory) until
    /// applied: the anchor is renamed to `name`.
    Create { anchor: PathBuf, name: PathBuf },
    /// A file renamed (replacing any file named `to`).
    Rename { from: PathBuf, to: PathBuf },
    /// A file deleted.
    Remove { path: PathBuf },
    /// A second name `to` for the file `from`.
    Link { from: PathBuf, to: PathBuf },
}

impl Change {
    fn paths(&self) -> [&Path; 2] {
        match self {
            Change::Create { anchor, name } => [anchor, name],
            Change::Rename { from, to } | Change::Link { from, to } => [from, to],
            Change::Remove { path } => [path, path],
        }
    }

    /// Whether the change adds, removes or renames an entry of `dir` (a
    /// link changes only the directory of its new name).
    fn touches_dir(&self, dir: &Path) -> bool {
        let changed = match self {
            Change::Link { to, .. } => [to.as_path(), to.as_path()],
            other => other.paths(),
        };
        changed.iter().any(|p| p.parent() == Some(dir))
    }

    /// Whether the change names `path`, something below it or above it.
    fn overlaps(&self, path: &Path) -> bool {
        self.paths()
            .iter()
            .any(|p| p.starts_with(path) || path.starts_with(p))
    }

    /// Makes the change on the real file system.
    fn apply(&self, fs: &LazyFs) -> io::Result<()> {
        match self {
            Change::Create { anchor, name } => {
                let replaced = real_key(name);
                std::fs::rename(anchor, name)?;
                fs.forget_if_unlinked(replaced);
            }
            Change::Rename { from, to } => {
                let replaced = real_key(to);
                std::fs::rename(from, to)?;
                fs.forget_if_unlinked(replaced);
            }
            Change::Remove { path } => {
                let removed = real_key(path);
                std::fs::remove_file(path)?;
                fs.forget_if_unlinked(removed);
            }
            Change::Link { from, to } => std::fs::hard_link(from, to)?,
        }
        Ok(())
    }
}

/// The directory changes this process made and the real file system does
/// not hold yet, oldest first.
#[derive(Debug, Default)]
struct Namespace {
    pending: Vec<Change>,
    next_anchor: u64,
}

impl Namespace {
    /// Where the file the process knows as `path` is in the real file
    /// system now (`None`: it does not exist for the process; `Some`: it
    /// exists there if it exists at all).
    fn resolve(&self, path: &Path) -> Option<PathBuf> {
        let mut at = path.to_path_buf();
        for change in self.pending.iter().rev() {
            match change {
                Change::Create { anchor, name } => {
                    if at == *name {
                        return Some(anchor.clone());
                    }
                }
                Change::Rename { from, to } => {
                    if at == *to {
                        at = from.clone();
                    } else if at == *from {
                        return None;
                    }
                }
                Change::Remove { path } => {
                    if at == *path {
                        return None;
                    }
                }
                Change::Link { from, to } => {
                    if at == *to {
                        at = from.clone();
                    }
                }
            }
        }
        Some(at)
    }

    /// The real path of the file the process knows as `path`, if it is a
    /// file.
    fn file(&self, path: &Path) -> Option<PathBuf> {
        self.resolve(path)
            .filter(|real| std::fs::metadata(real).is_ok_and(|m| m.is_file()))
    }
}

fn real_key(path: &Path) -> Option<FileKey> {
    std::fs::metadata(path).ok().map(|m| key_of(&m))
}

fn not_found(path: &Path) -> io::Error {
    io::Error::new(
        io::ErrorKind::NotFound,
        format!("{}: no such file", path.display()),
    )
}

/// The lazy file system; cheap to clone (clones share the handles and the
/// pending directory changes).
#[derive(Clone, Debug)]
pub struct LazyFs {
    files: Arc<Mutex<HashMap<FileKey, Arc<LazyFile>>>>,
    namespace: Arc<Mutex<Namespace>>,
    /// Names this instance's anchors (`.lazy-<tag>-<n>`): anchors of any
    /// other tag are leftovers of a process that died.
    tag: String,
}

impl Default for LazyFs {
    fn default() -> Self {
        Self::new()
    }
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
    /// A lazy file system with no handle open and no change pending (what
    /// a process starting after a power cut has).
    pub fn new() -> Self {
        static INSTANCES: AtomicU64 = AtomicU64::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let tag = format!(
            "{:x}{:x}{:x}",
            std::process::id(),
            nanos,
            INSTANCES.fetch_add(1, Ordering::Relaxed)
        );
        LazyFs {
            files: Arc::default(),
            namespace: Arc::default(),
            tag,
        }
    }

    fn namespace(&self) -> MutexGuard<'_, Namespace> {
        lock(&self.namespace)
    }

    /// The shared handle of `file`, registering it.
    fn handle(&self, file: File, truncated: bool) -> io::Result<Arc<dyn VfsFile>> {
        let metadata = file.metadata()?;
        let key = key_of(&metadata);
        let mut files = lock(&self.files);
        // An entry whose file lost its last name outside the vfs is stale
        // (the inode number may be someone else's now).
        let stale = files
            .get(&key)
            .is_some_and(|f| f.real.metadata().map_or(true, |m| m.nlink() == 0));
        if stale {
            files.remove(&key);
        }
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

    /// Drops every registry entry whose file has no name left.
    fn forget_unlinked(&self) {
        lock(&self.files).retain(|_, f| f.real.metadata().is_ok_and(|m| m.nlink() > 0));
    }

    /// Applies the pending changes `..=last` to the real file system.
    fn apply_through(&self, ns: &mut Namespace, last: Option<usize>) -> io::Result<()> {
        let Some(last) = last else { return Ok(()) };
        for (i, change) in ns.pending[..=last].iter().enumerate() {
            match change.apply(self) {
                Ok(()) => {}
                // Its file or directory was deleted behind the vfs (a test
                // removing its temporary directory while changes of its
                // files were pending): nothing is left to change. Under
                // correct use — every file of the tree through the vfs —
                // this cannot happen.
                Err(err) if err.kind() == io::ErrorKind::NotFound => {
                    tracing::debug!(?change, error = %err, "lazy disk: a pending change's file is gone");
                }
                Err(err) => {
                    // Someone changed the real files behind the vfs; keep what
                    // was not applied for a later try and report.
                    ns.pending.drain(..i);
                    return Err(err);
                }
            }
        }
        ns.pending.drain(..=last);
        Ok(())
    }

    /// Before a directory operation on `path`: applies every pending change
    /// up to the last one that names `path`, something below or above it.
    fn settle(&self, ns: &mut Namespace, paths: &[&Path]) -> io::Result<()> {
        let last = ns
            .pending
            .iter()
            .rposition(|c| paths.iter().any(|p| c.overlaps(p)));
        self.apply_through(ns, last)
    }

    fn is_own_anchor(&self, name: &str) -> bool {
        name.strip_prefix(ANCHOR_PREFIX)
            .and_then(|rest| rest.strip_prefix(self.tag.as_str()))
            .is_some_and(|rest| rest.starts_with('-'))
    }

    /// Bytes written and not yet synced, over every handle (for tests).
    pub fn unsynced_pages(&self) -> usize {
        lock(&self.files)
            .values()
            .map(|f| lock(&f.state).pages.len())
            .sum()
    }

    /// Directory changes made and not yet durable (for tests).
    pub fn pending_changes(&self) -> usize {
        self.namespace().pending.len()
    }
}

impl Vfs for LazyFs {
    fn create(&self, path: &Path) -> io::Result<Arc<dyn VfsFile>> {
        let mut ns = self.namespace();
        if let Some(real) = ns.file(path) {
            // An existing file: truncated at once (a data change).
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .truncate(true)
                .open(real)?;
            return self.handle(file, true);
        }
        if std::fs::metadata(path).is_ok_and(|m| m.is_dir()) {
            return Err(io::Error::new(
                io::ErrorKind::IsADirectory,
                format!("{} is a directory", path.display()),
            ));
        }
        let parent = path.parent().unwrap_or(Path::new(""));
        let anchor = parent.join(format!("{ANCHOR_PREFIX}{}-{}", self.tag, ns.next_anchor));
        ns.next_anchor += 1;
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&anchor)?;
        ns.pending.push(Change::Create {
            anchor,
            name: path.to_path_buf(),
        });
        self.handle(file, true)
    }

    fn open(&self, path: &Path) -> io::Result<Arc<dyn VfsFile>> {
        let real = self
            .namespace()
            .resolve(path)
            .ok_or_else(|| not_found(path))?;
        let file = OpenOptions::new().read(true).write(true).open(real)?;
        self.handle(file, false)
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        let ns = self.namespace();
        let mut names = BTreeSet::new();
        for name in RealFs.list(dir)? {
            if name.starts_with(ANCHOR_PREFIX) {
                if !self.is_own_anchor(&name) {
                    // Left by a process that died before the create was
                    // durable: the file never existed.
                    let _ = std::fs::remove_file(dir.join(&name));
                }
                continue;
            }
            names.insert(name);
        }
        let name_in_dir = |path: &Path| {
            (path.parent() == Some(dir))
                .then(|| {
                    path.file_name()
                        .and_then(|n| n.to_str())
                        .map(str::to_string)
                })
                .flatten()
        };
        for change in &ns.pending {
            let (gone, added) = match change {
                Change::Create { name, .. } => (None, Some(name)),
                Change::Rename { from, to } => (Some(from), Some(to)),
                Change::Remove { path } => (Some(path), None),
                Change::Link { to, .. } => (None, Some(to)),
            };
            if let Some(name) = gone.and_then(|p| name_in_dir(p)) {
                names.remove(&name);
            }
            if let Some(name) = added.and_then(|p| name_in_dir(p)) {
                names.insert(name);
            }
        }
        Ok(names.into_iter().collect())
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let mut ns = self.namespace();
        if ns.file(from).is_none() && std::fs::metadata(from).is_ok_and(|m| m.is_dir()) {
            // A directory: applied at once (see the module docs).
            self.settle(&mut ns, &[from, to])?;
            std::fs::rename(from, to)?;
            self.forget_unlinked();
            return Ok(());
        }
        if ns.file(from).is_none() {
            return Err(not_found(from));
        }
        if std::fs::metadata(to).is_ok_and(|m| m.is_dir()) && ns.resolve(to).as_deref() == Some(to)
        {
            return Err(io::Error::new(
                io::ErrorKind::IsADirectory,
                format!("{} is a directory", to.display()),
            ));
        }
        // POSIX: renaming a file onto another name of the same file does
        // nothing (both names stay).
        let same_file = ns
            .file(to)
            .is_some_and(|to| ns.file(from).and_then(|f| real_key(&f)) == real_key(&to));
        if !same_file {
            ns.pending.push(Change::Rename {
                from: from.to_path_buf(),
                to: to.to_path_buf(),
            });
        }
        Ok(())
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        let mut ns = self.namespace();
        if ns.file(path).is_none() {
            return Err(not_found(path));
        }
        ns.pending.push(Change::Remove {
            path: path.to_path_buf(),
        });
        Ok(())
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        let mut ns = self.namespace();
        let last = ns.pending.iter().rposition(|c| c.touches_dir(dir));
        self.apply_through(&mut ns, last)?;
        drop(ns);
        RealFs.sync_dir(dir)
    }

    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        let mut ns = self.namespace();
        self.settle(&mut ns, &[dir])?;
        RealFs.create_dir_all(dir)
    }

    fn hard_link(&self, from: &Path, to: &Path) -> io::Result<()> {
        let mut ns = self.namespace();
        if ns.file(from).is_none() {
            return Err(not_found(from));
        }
        let taken = ns.file(to).is_some()
            || (ns.resolve(to).as_deref() == Some(to) && std::fs::symlink_metadata(to).is_ok());
        if taken {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("{} exists", to.display()),
            ));
        }
        ns.pending.push(Change::Link {
            from: from.to_path_buf(),
            to: to.to_path_buf(),
        });
        Ok(())
    }

    fn remove_dir_all(&self, dir: &Path) -> io::Result<()> {
        let mut ns = self.namespace();
        self.settle(&mut ns, &[dir])?;
        std::fs::remove_dir_all(dir)?;
        self.forget_unlinked();
        Ok(())
    }

    fn file_exists(&self, path: &Path) -> bool {
        self.namespace().file(path).is_some()
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
        fs.sync_dir(dir.path()).unwrap();
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
        fs.sync_dir(dir.path()).unwrap();
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
        fs.sync_dir(dir.path()).unwrap();
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
        fs.sync_dir(dir.path()).unwrap();
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
        fs.sync_dir(dir.path()).unwrap();
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
            fs.sync_dir(dir.path()).unwrap();
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

    // ----- directory changes -----

    fn real_names(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| !n.starts_with(ANCHOR_PREFIX))
            .collect();
        names.sort();
        names
    }

    fn write_synced(fs: &LazyFs, path: &Path, bytes: &[u8]) {
        let file = fs.create(path).unwrap();
        file.write_all_at(bytes, 0).unwrap();
        file.sync().unwrap();
    }

    fn contents(fs: &LazyFs, path: &Path) -> Vec<u8> {
        read_all(&*fs.open(path).unwrap())
    }

    #[test]
    fn a_create_without_a_directory_fsync_is_lost_at_a_power_cut() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let fs = LazyFs::new();
        write_synced(&fs, &path, b"data");
        // The process sees it; the real directory does not.
        assert_eq!(fs.list(dir.path()).unwrap(), vec!["f".to_string()]);
        assert_eq!(contents(&fs, &path), b"data");
        assert!(fs.file_exists(&path));
        assert!(real_names(dir.path()).is_empty());
        let after = power_cut();
        assert!(after.open(&path).is_err());
        assert!(after.list(dir.path()).unwrap().is_empty());
        // The dead process's anchor is gone after the next list.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);

        // Synced, it survives.
        write_synced(&after, &path, b"data");
        after.sync_dir(dir.path()).unwrap();
        assert_eq!(real_names(dir.path()), vec!["f".to_string()]);
        assert_eq!(contents(&power_cut(), &path), b"data");
    }

    #[test]
    fn a_rename_over_a_file_without_a_directory_fsync_is_undone_at_a_power_cut() {
        // The metadata-file pattern: write a temp file, fsync, rename over.
        let dir = tempfile::tempdir().unwrap();
        let (target, tmp) = (dir.path().join("vote"), dir.path().join("vote.tmp"));
        let fs = LazyFs::new();
        write_synced(&fs, &target, b"old");
        fs.sync_dir(dir.path()).unwrap();
        write_synced(&fs, &tmp, b"new");
        fs.rename(&tmp, &target).unwrap();
        assert_eq!(contents(&fs, &target), b"new");
        assert!(fs.open(&tmp).is_err());
        assert_eq!(fs.list(dir.path()).unwrap(), vec!["vote".to_string()]);
        // Power cut before the directory fsync: the old file is back.
        let after = power_cut();
        assert_eq!(contents(&after, &target), b"old");
        assert_eq!(after.list(dir.path()).unwrap(), vec!["vote".to_string()]);
        // With it, the new one stays.
        write_synced(&after, &tmp, b"new");
        after.rename(&tmp, &target).unwrap();
        after.sync_dir(dir.path()).unwrap();
        assert_eq!(contents(&power_cut(), &target), b"new");
        assert_eq!(real_names(dir.path()), vec!["vote".to_string()]);
    }

    #[test]
    fn a_delete_without_a_directory_fsync_comes_back_and_links_wait_too() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        let fs = LazyFs::new();
        write_synced(&fs, &a, b"aaa");
        fs.sync_dir(dir.path()).unwrap();
        fs.hard_link(&a, &b).unwrap();
        assert!(fs.hard_link(&a, &b).is_err(), "the name is taken");
        fs.remove(&a).unwrap();
        assert!(fs.remove(&a).is_err(), "already gone for the process");
        assert_eq!(contents(&fs, &b), b"aaa");
        assert_eq!(fs.list(dir.path()).unwrap(), vec!["b".to_string()]);
        assert_eq!(real_names(dir.path()), vec!["a".to_string()]);
        let after = power_cut();
        assert_eq!(after.list(dir.path()).unwrap(), vec!["a".to_string()]);
        // Applied at the fsync.
        fs.sync_dir(dir.path()).unwrap();
        assert_eq!(real_names(dir.path()), vec!["b".to_string()]);
    }

    #[test]
    fn directory_operations_first_apply_the_changes_below_them() {
        let root = tempfile::tempdir().unwrap();
        let (staging, sealed) = (root.path().join("staging"), root.path().join("snap"));
        let fs = LazyFs::new();
        fs.create_dir_all(&staging).unwrap();
        write_synced(&fs, &staging.join("f"), b"x");
        // Not durable yet...
        assert!(real_names(&staging).is_empty());
        // ...but a directory rename (applied at once) takes it along.
        fs.rename(&staging, &sealed).unwrap();
        assert_eq!(real_names(&sealed), vec!["f".to_string()]);
        assert_eq!(contents(&power_cut(), &sealed.join("f")), b"x");
        // Removing a directory with a pending create in it.
        write_synced(&fs, &sealed.join("g"), b"y");
        fs.remove_dir_all(&sealed).unwrap();
        assert!(!sealed.exists());
        assert!(fs.open(&sealed.join("g")).is_err());
        assert_eq!(fs.pending_changes(), 0);
    }

    #[test]
    fn sync_dir_applies_a_prefix_and_a_cross_directory_rename_whole() {
        let root = tempfile::tempdir().unwrap();
        let (d1, d2) = (root.path().join("d1"), root.path().join("d2"));
        let fs = LazyFs::new();
        fs.create_dir_all(&d1).unwrap();
        fs.create_dir_all(&d2).unwrap();
        write_synced(&fs, &d1.join("x"), b"1"); // change 0: d1
        write_synced(&fs, &d2.join("y"), b"2"); // change 1: d2
        fs.rename(&d1.join("x"), &d2.join("z")).unwrap(); // change 2: d1 and d2
        write_synced(&fs, &d1.join("w"), b"3"); // change 3: d1
        fs.sync_dir(&d2).unwrap();
        // Changes 0..=2 are applied; 3 is not.
        assert!(real_names(&d1).is_empty());
        assert_eq!(real_names(&d2), vec!["y".to_string(), "z".to_string()]);
        assert_eq!(fs.pending_changes(), 1);
        assert_eq!(fs.list(&d1).unwrap(), vec!["w".to_string()]);
        let after = power_cut();
        assert_eq!(contents(&after, &d2.join("z")), b"1");
        assert!(after.open(&d1.join("w")).is_err());
    }

    #[derive(Clone, Debug)]
    enum NsStep {
        Create(usize, usize),
        Rename(usize, usize, usize, usize),
        Remove(usize, usize),
        Link(usize, usize, usize, usize),
        SyncDir(usize),
        PowerCut,
    }

    const DIRS: usize = 2;
    const NAMES: usize = 3;

    fn ns_step() -> impl proptest::strategy::Strategy<Value = NsStep> {
        use proptest::prelude::*;
        let d = 0..DIRS;
        let n = 0..NAMES;
        prop_oneof![
            3 => (d.clone(), n.clone()).prop_map(|(d, n)| NsStep::Create(d, n)),
            2 => (d.clone(), n.clone(), d.clone(), n.clone())
                .prop_map(|(a, b, c, e)| NsStep::Rename(a, b, c, e)),
            1 => (d.clone(), n.clone()).prop_map(|(d, n)| NsStep::Remove(d, n)),
            1 => (d.clone(), n.clone(), d.clone(), n.clone())
                .prop_map(|(a, b, c, e)| NsStep::Link(a, b, c, e)),
            2 => d.prop_map(NsStep::SyncDir),
            1 => Just(NsStep::PowerCut),
        ]
    }

    /// A name: (directory, name); the model's files are numbered.
    type Name = (usize, usize);

    #[derive(Clone, Debug)]
    enum ModelChange {
        Put(Name, u64),
        Remove(Name),
        Rename(Name, Name),
    }

    impl ModelChange {
        fn touches(&self, dir: usize) -> bool {
            match self {
                ModelChange::Put(n, _) | ModelChange::Remove(n) => n.0 == dir,
                ModelChange::Rename(a, b) => a.0 == dir || b.0 == dir,
            }
        }
        fn apply(&self, names: &mut BTreeMap<Name, u64>) {
            match self {
                ModelChange::Put(n, file) => {
                    names.insert(*n, *file);
                }
                ModelChange::Remove(n) => {
                    names.remove(n);
                }
                ModelChange::Rename(a, b) => {
                    if let Some(file) = names.remove(a) {
                        names.insert(*b, file);
                    }
                }
            }
        }
    }

    proptest::proptest! {
        /// Against a model of the namespace (names the process sees, names
        /// on disk = a prefix of the changes, applied through the last one
        /// touching a synced directory): every list and read agrees, and a
        /// power cut leaves exactly the durable names with their synced
        /// bytes.
        #[test]
        fn the_namespace_agrees_with_a_model(steps in proptest::collection::vec(ns_step(), 1..50)) {
            let root = tempfile::tempdir().unwrap();
            let dirs: Vec<PathBuf> = (0..DIRS).map(|d| root.path().join(format!("d{d}"))).collect();
            let path = |(d, n): Name| dirs[d].join(format!("n{n}"));
            let mut fs = LazyFs::new();
            for dir in &dirs {
                fs.create_dir_all(dir).unwrap();
            }
            // File number -> its (synced) bytes; a create of an existing
            // name rewrites that file (every name of it sees the new bytes).
            let mut bytes: BTreeMap<u64, Vec<u8>> = BTreeMap::new();
            let mut next_file = 0u64;
            let mut live: BTreeMap<Name, u64> = BTreeMap::new();
            let mut durable: BTreeMap<Name, u64> = BTreeMap::new();
            let mut pending: Vec<ModelChange> = Vec::new();
            for (i, step) in steps.into_iter().enumerate() {
                match step {
                    NsStep::Create(d, n) => {
                        let content = format!("step {i}").into_bytes();
                        write_synced(&fs, &path((d, n)), &content);
                        match live.get(&(d, n)) {
                            Some(file) => {
                                bytes.insert(*file, content);
                            }
                            None => {
                                next_file += 1;
                                bytes.insert(next_file, content);
                                live.insert((d, n), next_file);
                                pending.push(ModelChange::Put((d, n), next_file));
                            }
                        }
                    }
                    NsStep::Rename(a, b, c, e) => {
                        let ok = fs.rename(&path((a, b)), &path((c, e))).is_ok();
                        proptest::prop_assert_eq!(ok, live.contains_key(&(a, b)));
                        // Onto another name of the same file: nothing
                        // (POSIX).
                        if ok && live.get(&(a, b)) != live.get(&(c, e)) {
                            let change = ModelChange::Rename((a, b), (c, e));
                            change.apply(&mut live);
                            pending.push(change);
                        }
                    }
                    NsStep::Remove(d, n) => {
                        let ok = fs.remove(&path((d, n))).is_ok();
                        proptest::prop_assert_eq!(ok, live.contains_key(&(d, n)));
                        if ok {
                            let change = ModelChange::Remove((d, n));
                            change.apply(&mut live);
                            pending.push(change);
                        }
                    }
                    NsStep::Link(a, b, c, e) => {
                        let ok = fs.hard_link(&path((a, b)), &path((c, e))).is_ok();
                        let expected = live.contains_key(&(a, b)) && !live.contains_key(&(c, e));
                        proptest::prop_assert_eq!(ok, expected);
                        if ok {
                            let change = ModelChange::Put((c, e), live[&(a, b)]);
                            change.apply(&mut live);
                            pending.push(change);
                        }
                    }
                    NsStep::SyncDir(d) => {
                        fs.sync_dir(&dirs[d]).unwrap();
                        if let Some(last) = pending.iter().rposition(|c| c.touches(d)) {
                            for change in pending.drain(..=last) {
                                change.apply(&mut durable);
                            }
                        }
                    }
                    NsStep::PowerCut => {
                        fs = power_cut();
                        live = durable.clone();
                        pending.clear();
                    }
                }
                for (d, dir) in dirs.iter().enumerate() {
                    let expected: Vec<String> = live
                        .keys()
                        .filter(|(dir, _)| *dir == d)
                        .map(|(_, n)| format!("n{n}"))
                        .collect();
                    proptest::prop_assert_eq!(fs.list(dir).unwrap(), expected);
                    let on_disk: Vec<String> = durable
                        .keys()
                        .filter(|(dir, _)| *dir == d)
                        .map(|(_, n)| format!("n{n}"))
                        .collect();
                    proptest::prop_assert_eq!(real_names(dir), on_disk);
                }
                for (name, file) in &live {
                    proptest::prop_assert_eq!(&contents(&fs, &path(*name)), &bytes[file]);
                }
                for (name, file) in &durable {
                    proptest::prop_assert_eq!(&std::fs::read(path(*name)).unwrap(), &bytes[file]);
                }
            }
        }
    }
}
