//! The engine: one [`Engine`] over one data directory, split by job.
//!
//! - this file: the [`Engine`] handle and the state it shares with its
//!   background threads (`Shared`), open, close and the lock helpers;
//! - `batch`: the write input ([`Batch`], [`Op`], [`RecordMeta`]) and what
//!   it returns ([`Written`]);
//! - `write`: the write path: validation, appending a batch, rotation and
//!   sealing of segments;
//! - `sync`: group commit, fsyncs, the background sync thread, poisoning;
//! - `read`: lookups and scans, and the cache of open files and maps;
//! - `files`: the file API the Raft layer uses: file lists with checksums,
//!   pins, retiring files;
//! - `records`: listing every put and tombstone record with its location,
//!   reading one back by location, and the merge retention predicate
//!   ([`Retain`]) — the engine side of a change history;
//! - `stats`: per-file live and dead bytes;
//! - `merging`: the merge entry points and automatic merges (the merge
//!   itself is `crate::merge`).
//!
//! Locks, always taken in this order and never held across an fsync unless
//! said so: the merge slot → `sync_state` (never held across the fsync) →
//! `writer` → `files` → `keydir` → `handles` → `pins`. Readers take only
//! `keydir` (shared, briefly) and `handles`; record bytes are read with
//! positioned reads after every lock is released, so a reader never waits
//! behind I/O.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::thread::JoinHandle;

use vfs::Poison;

use crate::error::{Error, Result};
use crate::keydir::KeyDir;
use crate::options::{Options, SyncPolicy};

mod batch;
mod files;
mod merging;
mod read;
mod records;
mod stats;
mod sync;
mod write;

pub use batch::{Batch, Op, RecordMeta, Written};
pub use files::{FileInfo, Pin};
pub(crate) use files::{FileMeta, FileSet, checksum_file};
pub use merging::MergeReport;
pub(crate) use read::{Check, RecordBytes};
pub use read::{Counted, Entry, Item, ItemMeta, ItemRef, KeyRange, Scan};
pub use records::{RecordLocation, RecordView, Retain, StoredKind, StoredRecord, StoredValue};
pub use stats::{FileStats, Stats};
pub(crate) use write::{Active, Writer};

use files::Pins;
use read::Handles;
use sync::SyncState;

/// State shared by the engine handle and its background threads.
#[derive(Debug)]
pub(crate) struct Shared {
    /// Held while the engine is open: one engine per data directory.
    _dir_lock: vfs::DirLock,
    pub(crate) dir: PathBuf,
    pub(crate) opts: Options,
    pub(crate) keydir: RwLock<KeyDir>,
    pub(crate) files: RwLock<FileSet>,
    handles: RwLock<Handles>,
    pub(crate) writer: Mutex<Writer>,
    sync_state: Mutex<SyncState>,
    sync_done: Condvar,
    /// Held across every fsync of a data file and the poisoning that a
    /// failure causes, so no fsync runs after one failed: on Linux a second
    /// fsync of the same file would report success for pages already lost.
    fsync_serial: Mutex<()>,
    synced_total: AtomicU64,
    /// Length of the active segment's published prefix: the end of the
    /// last batch whose key-directory updates were applied (with
    /// `SyncPolicy::Always`, only once an fsync covered it). Record listing
    /// and reads by location see no further. Stored under `writer`, and
    /// while `keydir` is still write-locked by the update it publishes (a
    /// reader that sees a batch in the key directory sees it published, and
    /// the reverse); changed to another segment's only under `files`
    /// (write), so read under `files` it belongs to `files.active` (which
    /// a seal that failed midway leaves set, the writer's segment gone).
    pub(crate) active_published: AtomicU64,
    /// Set by the first failed write or fsync; then every write is refused.
    poisoned: Poison,
    /// Whether a merge job exists (captured, not yet finished or dropped).
    pub(crate) merge_running: Mutex<bool>,
    pub(crate) merge_done: Condvar,
    /// An automatic merge thread was started and has not finished.
    auto_merge_queued: AtomicBool,
    pub(crate) merges: AtomicU64,
    pins: Mutex<Pins>,
    /// Highest "now" any caller passed in: the clock of automatic merges.
    now_seen_ms: AtomicU64,
    pub(crate) closed: AtomicBool,
    stop: (Mutex<bool>, Condvar),
    threads: Mutex<Vec<JoinHandle<()>>>,
}

pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}
pub(crate) fn read<T>(lock: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(|poisoned| poisoned.into_inner())
}
pub(crate) fn write<T>(lock: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    lock.write()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A Bitcask engine over one directory. Share it between threads with `Arc`.
#[derive(Debug)]
pub struct Engine {
    shared: Arc<Shared>,
}

impl Engine {
    /// Opens (or creates) the engine in `dir`, recovering from any crash.
    pub fn open(dir: impl AsRef<Path>, opts: Options) -> Result<Engine> {
        opts.validate()?;
        let dir = dir.as_ref().to_path_buf();
        opts.vfs
            .create_dir_all(&dir)
            .map_err(|e| Error::io(&dir, e))?;
        let dir_lock = opts.vfs.lock_dir(&dir).map_err(|e| match e.kind() {
            std::io::ErrorKind::WouldBlock => Error::DirectoryInUse { path: dir.clone() },
            _ => Error::io(&dir, e),
        })?;
        let recovered = crate::recovery::recover(&dir, &opts)?;
        let active_published = recovered.writer.active.as_ref().map_or(0, |a| a.len);

        let shared = Arc::new(Shared {
            _dir_lock: dir_lock,
            dir,
            keydir: RwLock::new(recovered.keydir),
            files: RwLock::new(recovered.files),
            handles: RwLock::new(Handles::default()),
            writer: Mutex::new(recovered.writer),
            sync_state: Mutex::new(SyncState::default()),
            sync_done: Condvar::new(),
            fsync_serial: Mutex::new(()),
            synced_total: AtomicU64::new(0),
            active_published: AtomicU64::new(active_published),
            poisoned: Poison::new(),
            merge_running: Mutex::new(false),
            merge_done: Condvar::new(),
            auto_merge_queued: AtomicBool::new(false),
            merges: AtomicU64::new(0),
            pins: Mutex::new(Pins::default()),
            now_seen_ms: AtomicU64::new(0),
            closed: AtomicBool::new(false),
            stop: (Mutex::new(false), Condvar::new()),
            threads: Mutex::new(Vec::new()),
            opts,
        });
        if let SyncPolicy::EveryMs(interval_ms) = shared.opts.sync {
            let worker = shared.clone();
            let handle = std::thread::Builder::new()
                .name("bitcask-sync".to_string())
                .spawn(move || worker.sync_loop(interval_ms))
                .map_err(|e| Error::io(&shared.dir, e))?;
            lock(&shared.threads).push(handle);
        }
        Ok(Engine { shared })
    }

    /// The data directory.
    pub fn dir(&self) -> &Path {
        &self.shared.dir
    }

    /// Stops background work, fsyncs, and closes.
    pub fn close(self) -> Result<()> {
        self.shared.shutdown()
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        if !self.shared.closed.load(Ordering::SeqCst)
            && let Err(e) = self.shared.shutdown()
        {
            tracing::warn!(error = %e, "engine closed with an error");
        }
    }
}

impl Shared {
    fn note_now(&self, now_ms: u64) {
        // A plain load first: readers on several cores do not fight over the
        // cache line unless the clock actually moved.
        if now_ms > self.now_seen_ms.load(Ordering::Relaxed) {
            self.now_seen_ms.fetch_max(now_ms, Ordering::Relaxed);
        }
    }

    fn shutdown(&self) -> Result<()> {
        if self.closed.swap(true, Ordering::SeqCst) {
            return Ok(());
        }
        {
            let (stopped, wake) = &self.stop;
            *lock(stopped) = true;
            wake.notify_all();
        }
        let threads: Vec<JoinHandle<()>> = lock(&self.threads).drain(..).collect();
        for thread in threads {
            let _ = thread.join();
        }
        // A poisoned engine reports why (sync_file refuses to fsync again).
        let mut writer = lock(&self.writer);
        match &mut writer.active {
            Some(active) => {
                let name = active.id.data_name();
                if !self.poisoned.is_poisoned() {
                    active.cut_fill().map_err(|e| {
                        self.poison(Error::io(crate::format::path_in(&self.dir, &name), e))
                    })?;
                }
                self.sync_file(active.file.as_ref(), &name)
            }
            None => self.check_poison_after_sync(),
        }
    }
}
