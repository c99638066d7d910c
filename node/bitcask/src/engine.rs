//! The engine: write path (batches, group commit, rotation), read path
//! (lookups, scans), stats, and the file-level API the Raft layer uses.
//!
//! Locks, always taken in this order and never held across an fsync unless
//! said so: the merge slot → `sync_state` (never held across the fsync) → `writer` → `files` → `keydir` →
//! `handles` → `pins`. Readers take only `keydir` (shared, briefly) and
//! `handles`; record bytes are read with positioned reads after every lock
//! is released, so a reader never waits behind I/O.

use std::collections::{HashMap, HashSet, VecDeque};
use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::thread::JoinHandle;

use crate::error::{Error, Result};
use crate::format::{
    DATA_MAGIC, FileId, HintEntry, RECORD_HEADER_SIZE_BYTES, RecordKind, encode_record, path_in,
    record_size, verify_record,
};
use crate::hint::HintWriter;
use crate::keydir::{KeyDir, Location};
use crate::merge::MergeJob;
use crate::options::{METADATA_SIZE_BYTES_MAX, Options, SyncPolicy};
use vfs::{Mapping, VfsFile};

/// Attempts of a read whose file a concurrent merge removed (the key
/// directory points at the merge output by the next attempt).
const READ_ATTEMPTS_MAX: usize = 8;

/// One write in a batch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// Set `key` to `value`, expiring at `expiry_ms` (0 = never).
    Put {
        /// The key.
        key: Vec<u8>,
        /// The value.
        value: Vec<u8>,
        /// Expiry in ms of the caller's clock; 0 = never.
        expiry_ms: u64,
    },
    /// Delete `key` (a tombstone is written even if the key is absent).
    Delete {
        /// The key.
        key: Vec<u8>,
    },
}

/// An atomic group of writes plus opaque metadata stored in its commit record.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Batch {
    /// The writes, applied in order.
    pub ops: Vec<Op>,
    /// Caller metadata, returned by [`Engine::last_commit_meta`] after a restart.
    pub meta: Vec<u8>,
    /// First sequence number: op `i` gets `seq + i`, the commit record
    /// `seq + ops.len()`. `None` lets the engine continue from its last one.
    pub seq: Option<u64>,
}

impl Batch {
    /// An empty batch.
    pub fn new() -> Batch {
        Batch::default()
    }
    /// Adds a put without expiry.
    pub fn put(mut self, key: impl Into<Vec<u8>>, value: impl Into<Vec<u8>>) -> Batch {
        self.ops.push(Op::Put {
            key: key.into(),
            value: value.into(),
            expiry_ms: 0,
        });
        self
    }
    /// Adds a put that expires at `expiry_ms`.
    pub fn put_with_expiry(
        mut self,
        key: impl Into<Vec<u8>>,
        value: impl Into<Vec<u8>>,
        expiry_ms: u64,
    ) -> Batch {
        self.ops.push(Op::Put {
            key: key.into(),
            value: value.into(),
            expiry_ms,
        });
        self
    }
    /// Adds a delete.
    pub fn delete(mut self, key: impl Into<Vec<u8>>) -> Batch {
        self.ops.push(Op::Delete { key: key.into() });
        self
    }
    /// Sets the commit metadata.
    pub fn meta(mut self, meta: impl Into<Vec<u8>>) -> Batch {
        self.meta = meta.into();
        self
    }
    /// Sets the first sequence number.
    pub fn seq(mut self, seq: u64) -> Batch {
        self.seq = Some(seq);
        self
    }
}

/// Sequence numbers a batch received.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Written {
    /// Sequence of the first op (equal to `commit` for an empty batch).
    pub first_seq: u64,
    /// Sequence of the commit record, the batch's highest.
    pub commit_seq: u64,
}

/// A value read back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Item {
    /// The value.
    pub value: Vec<u8>,
    /// Sequence number of the write that stored it (its version).
    pub seq: u64,
    /// Expiry in ms of the caller's clock; 0 = never.
    pub expiry_ms: u64,
}

/// What the key directory knows of a live key, without its value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ItemMeta {
    /// Sequence number of the write that stored it (its version).
    pub seq: u64,
    /// Expiry in ms of the caller's clock; 0 = never.
    pub expiry_ms: u64,
    /// Length of the value in bytes.
    pub value_len: u32,
}

/// One entry of a scan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// The key.
    pub key: Vec<u8>,
    /// The value (`None` for a keys-only scan).
    pub value: Option<Vec<u8>>,
    /// Sequence number of the write that stored it.
    pub seq: u64,
    /// Expiry, 0 = never.
    pub expiry_ms: u64,
}

/// Which keys a scan visits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeyRange {
    /// Every key.
    All,
    /// Keys starting with these bytes.
    Prefix(Vec<u8>),
    /// Keys between two bounds.
    Range(Bound<Vec<u8>>, Bound<Vec<u8>>),
}

/// A scan request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Scan {
    /// Keys to visit.
    pub range: KeyRange,
    /// Resume strictly after this key (the last key of the previous page).
    pub after: Option<Vec<u8>>,
    /// Largest number of entries returned.
    pub limit: usize,
    /// Return keys and versions without reading values.
    pub keys_only: bool,
}

impl Scan {
    /// A scan of every key, at most `limit` entries.
    pub fn all(limit: usize) -> Scan {
        Scan {
            range: KeyRange::All,
            after: None,
            limit,
            keys_only: false,
        }
    }
    /// A scan of keys with `prefix`, at most `limit` entries.
    pub fn prefix(prefix: impl Into<Vec<u8>>, limit: usize) -> Scan {
        Scan {
            range: KeyRange::Prefix(prefix.into()),
            after: None,
            limit,
            keys_only: false,
        }
    }
}

/// Name, length and crc32 of a file, as snapshot manifests list them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileInfo {
    /// File name inside the data directory.
    pub name: String,
    /// Length in bytes.
    pub len: u64,
    /// crc32 of the whole file (for the active segment: of `len` bytes).
    pub crc: u32,
}

/// Per-file statistics.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileStats {
    /// Data file name.
    pub name: String,
    /// Whether the file is sealed (immutable).
    pub sealed: bool,
    /// Length in bytes.
    pub total_bytes: u64,
    /// Bytes of records that are the latest version of their key.
    pub live_bytes: u64,
    /// Everything else: overwritten and deleted records, tombstones, commit
    /// records, headers.
    pub dead_bytes: u64,
}

/// Engine statistics.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stats {
    /// Number of keys (expired but not yet merged keys included).
    pub keys: u64,
    /// Sum of key lengths.
    pub key_bytes: u64,
    /// Live bytes over all files.
    pub live_bytes: u64,
    /// Dead bytes over all files.
    pub dead_bytes: u64,
    /// Per data file, in order.
    pub files: Vec<FileStats>,
    /// Highest sequence number stored.
    pub last_seq: u64,
    /// Merges completed since open.
    pub merges: u64,
}

/// What [`Engine::merge`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MergeReport {
    /// The cut-off sequence: liveness was judged as of it.
    pub cutoff: u64,
    /// Data files replaced.
    pub inputs: Vec<String>,
    /// Data files written.
    pub outputs: Vec<String>,
    /// Records copied.
    pub records_kept: u64,
    /// Bytes of the inputs.
    pub bytes_before: u64,
    /// Bytes of the outputs.
    pub bytes_after: u64,
}

/// A file known to the engine.
#[derive(Debug)]
pub(crate) struct FileMeta {
    pub(crate) id: FileId,
    pub(crate) num: u32,
    pub(crate) len: u64,
    pub(crate) crc: u32,
    /// Highest sequence in the file.
    pub(crate) max_seq: u64,
    /// The file's last commit record: (seq, metadata).
    pub(crate) last_commit: Option<(u64, Vec<u8>)>,
}

/// The data files: sealed ones in order, plus the active one's number.
#[derive(Debug, Default)]
pub(crate) struct FileSet {
    pub(crate) sealed: Vec<Arc<FileMeta>>,
    pub(crate) active: Option<(u32, FileId)>,
    /// Every readable file number → path (sealed, active, merge outputs
    /// being swapped in, inputs being swapped out).
    pub(crate) paths: HashMap<u32, PathBuf>,
    pub(crate) next_num: u32,
}

impl FileSet {
    pub(crate) fn allocate(&mut self, path: PathBuf) -> u32 {
        self.next_num += 1;
        self.paths.insert(self.next_num, path);
        self.next_num
    }
}

/// The active segment and the writer's state.
#[derive(Debug)]
pub(crate) struct Active {
    pub(crate) num: u32,
    pub(crate) id: FileId,
    pub(crate) file: Arc<dyn VfsFile>,
    pub(crate) len: u64,
    pub(crate) hasher: crc32fast::Hasher,
    pub(crate) hint: HintWriter,
    pub(crate) max_seq: u64,
    pub(crate) last_commit: Option<(u64, Vec<u8>)>,
}

/// A key-directory change waiting for its fsync (sync policy `Always`).
#[derive(Debug)]
pub(crate) enum Update {
    Put(Vec<u8>, Location),
    Delete(Vec<u8>, u64),
    Seq(u64),
}

#[derive(Debug)]
pub(crate) struct Writer {
    pub(crate) active: Option<Active>,
    pub(crate) last_seq: u64,
    pub(crate) last_meta: Option<Vec<u8>>,
    /// Bytes appended since open, over all files: group-commit positions.
    pub(crate) written_total: u64,
    /// Batches appended but not yet fsynced, in order, with their end position.
    pub(crate) pending: VecDeque<(u64, Vec<Update>)>,
    buf: Vec<u8>,
}

impl Writer {
    pub(crate) fn new(active: Option<Active>, last_seq: u64, last_meta: Option<Vec<u8>>) -> Writer {
        Writer {
            active,
            last_seq,
            last_meta,
            written_total: 0,
            pending: VecDeque::new(),
            buf: Vec::new(),
        }
    }
}

/// Group-commit state: whether a leader is fsyncing right now.
#[derive(Debug, Default)]
struct SyncState {
    leader_active: bool,
}

#[derive(Debug, Default)]
pub(crate) struct Pins {
    counts: HashMap<String, usize>,
    /// Pinned files the engine no longer uses; deleted at their last unpin.
    doomed: HashSet<String>,
}

/// How a file is read: sealed files through a memory map, the active one
/// (still growing) with positioned reads.
#[derive(Clone)]
pub(crate) enum Handle {
    Map(Mapping),
    File(Arc<dyn VfsFile>),
}

impl std::fmt::Debug for Handle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Handle::Map(map) => write!(f, "Map({} bytes)", map.as_ref().as_ref().len()),
            Handle::File(file) => write!(f, "File({file:?})"),
        }
    }
}

/// The bounded cache of open files and maps. Reads take it shared, so
/// concurrent readers do not contend; a miss evicts the longest-cached entry
/// when `open_files_max` is reached (a reader still holding it keeps it
/// alive until done).
#[derive(Debug, Default)]
pub(crate) struct Handles {
    open: HashMap<u32, (Handle, u64)>,
    inserted: u64,
}

impl Handles {
    fn insert(&mut self, num: u32, handle: Handle, capacity: usize) {
        if self.open.len() >= capacity && !self.open.contains_key(&num) {
            let oldest = self
                .open
                .iter()
                .min_by_key(|(_, (_, at))| *at)
                .map(|(num, _)| *num);
            if let Some(oldest) = oldest {
                self.open.remove(&oldest);
            }
        }
        self.inserted += 1;
        self.open.insert(num, (handle, self.inserted));
    }
}

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
    poisoned: AtomicBool,
    poison_cause: Mutex<Option<String>>,
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

/// Files kept on disk while this guard lives, even if a merge replaces them.
#[derive(Debug)]
pub struct Pin {
    shared: Arc<Shared>,
    names: Vec<String>,
}

impl Drop for Pin {
    fn drop(&mut self) {
        let mut doomed_now = Vec::new();
        {
            let mut pins = lock(&self.shared.pins);
            for name in &self.names {
                let count = pins.counts.get_mut(name).expect("pinned name has a count");
                *count -= 1;
                if *count == 0 {
                    pins.counts.remove(name);
                    if pins.doomed.remove(name) {
                        doomed_now.push(name.clone());
                    }
                }
            }
        }
        for name in doomed_now {
            let path = path_in(&self.shared.dir, &name);
            if let Err(e) = self.shared.opts.vfs.remove(&path) {
                tracing::warn!(file = %name, error = %e, "could not delete an unpinned merged file");
            }
        }
    }
}

impl Pin {
    /// The pinned file names.
    pub fn names(&self) -> &[String] {
        &self.names
    }
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
            poisoned: AtomicBool::new(false),
            poison_cause: Mutex::new(None),
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

    /// Looks up `key`; an expired value (expiry ≤ `now_ms`) is absent.
    pub fn get(&self, key: &[u8], now_ms: u64) -> Result<Option<Item>> {
        self.shared.note_now(now_ms);
        for _ in 0..READ_ATTEMPTS_MAX {
            let Some(location) = read(&self.shared.keydir).get(key) else {
                return Ok(None);
            };
            if location.expired(now_ms) {
                return Ok(None);
            }
            if let Some(value) = self.shared.read_value(key, &location)? {
                return Ok(Some(Item {
                    value,
                    seq: location.seq,
                    expiry_ms: location.expiry_ms,
                }));
            }
        }
        Err(Error::Corruption {
            file: String::new(),
            offset: 0,
            reason: format!(
                "key {:?} kept pointing at removed files",
                String::from_utf8_lossy(key)
            ),
        })
    }

    /// `key`'s version and expiry from the key directory alone: no disk
    /// read (what a write needs to check a condition or to know whether it
    /// replaced a key). An expired key is absent, as in [`Engine::get`].
    pub fn meta(&self, key: &[u8], now_ms: u64) -> Option<ItemMeta> {
        self.shared.note_now(now_ms);
        let location = read(&self.shared.keydir).get(key)?;
        if location.expired(now_ms) {
            return None;
        }
        Some(ItemMeta {
            seq: location.seq,
            expiry_ms: location.expiry_ms,
            value_len: location.value_len,
        })
    }

    /// Stores `key` → `value` without expiry; returns its sequence number.
    pub fn put(&self, key: &[u8], value: &[u8]) -> Result<u64> {
        self.put_with_expiry(key, value, 0)
    }

    /// Stores `key` → `value`, absent from reads with `now_ms >= expiry_ms`.
    pub fn put_with_expiry(&self, key: &[u8], value: &[u8], expiry_ms: u64) -> Result<u64> {
        let batch = Batch::new().put_with_expiry(key, value, expiry_ms);
        Ok(self.write_batch(&batch)?.first_seq)
    }

    /// Deletes `key`; returns the tombstone's sequence number.
    pub fn delete(&self, key: &[u8]) -> Result<u64> {
        Ok(self.write_batch(&Batch::new().delete(key))?.first_seq)
    }

    /// Writes a batch atomically: after a crash all of it or none of it is there.
    pub fn write_batch(&self, batch: &Batch) -> Result<Written> {
        self.shared.write_batch(batch)
    }

    /// Visits keys in order. Expired entries are skipped.
    pub fn scan(&self, scan: &Scan, now_ms: u64) -> Result<Vec<Entry>> {
        self.shared.note_now(now_ms);
        let (start, end) = bounds(&scan.range);
        let start = match (&scan.after, start) {
            (Some(after), Bound::Unbounded) => Bound::Excluded(after.clone()),
            (Some(after), Bound::Included(s) | Bound::Excluded(s)) if *after >= s => {
                Bound::Excluded(after.clone())
            }
            (_, start) => start,
        };
        // A merge may retire a file between collecting locations and reading
        // them; then the page is collected again, so a page never mixes
        // records from before and after a batch.
        'attempt: for _ in 0..READ_ATTEMPTS_MAX {
            let found: Vec<(Vec<u8>, Location)> = {
                let keydir = read(&self.shared.keydir);
                if range_is_empty(&start, &end) {
                    return Ok(Vec::new());
                }
                keydir
                    .range(as_ref_bound(&start), as_ref_bound(&end))
                    .filter(|(_, location)| !location.expired(now_ms))
                    .take(scan.limit)
                    .map(|(key, location)| (key.to_vec(), location))
                    .collect()
            };
            let mut out = Vec::with_capacity(found.len());
            for (key, location) in found {
                let value = if scan.keys_only {
                    None
                } else {
                    match self.shared.read_value(&key, &location)? {
                        Some(value) => Some(value),
                        None => continue 'attempt,
                    }
                };
                out.push(Entry {
                    key,
                    value,
                    seq: location.seq,
                    expiry_ms: location.expiry_ms,
                });
            }
            return Ok(out);
        }
        Err(Error::Corruption {
            file: String::new(),
            offset: 0,
            reason: "scan kept finding records in removed files".to_string(),
        })
    }

    /// The latest expiry (ms) any put since open carried, 0 = none: while
    /// the caller's clock is below it, some key may still be due to expire
    /// (a high-water mark; deletes and overwrites do not lower it).
    pub fn expiry_high_water_ms(&self) -> u64 {
        read(&self.shared.keydir).expiry_high_ms()
    }

    /// Makes every write so far durable.
    pub fn sync(&self) -> Result<()> {
        let target = lock(&self.shared.writer).written_total;
        self.shared.sync_to(target)
    }

    /// Highest sequence number stored.
    pub fn last_seq(&self) -> u64 {
        lock(&self.shared.writer).last_seq
    }

    /// Metadata of the last complete batch (after `open`: the last one that
    /// survived recovery).
    pub fn last_commit_meta(&self) -> Option<Vec<u8>> {
        lock(&self.shared.writer).last_meta.clone()
    }

    /// Statistics: keys, live and dead bytes per data file.
    pub fn stats(&self) -> Stats {
        let (last_seq, active) = {
            let writer = lock(&self.shared.writer);
            (
                writer.last_seq,
                writer.active.as_ref().map(|a| (a.num, a.id, a.len)),
            )
        };
        let files = read(&self.shared.files);
        let keydir = read(&self.shared.keydir);
        let mut per_file: Vec<FileStats> = files
            .sealed
            .iter()
            .map(|meta| {
                file_stats(
                    meta.id.data_name(),
                    true,
                    meta.len,
                    keydir.live_bytes(meta.num),
                )
            })
            .collect();
        if let Some((num, id, len)) = active {
            per_file.push(file_stats(
                id.data_name(),
                false,
                len,
                keydir.live_bytes(num),
            ));
        }
        Stats {
            keys: keydir.len() as u64,
            key_bytes: keydir.key_bytes(),
            live_bytes: per_file.iter().map(|f| f.live_bytes).sum(),
            dead_bytes: per_file.iter().map(|f| f.dead_bytes).sum(),
            files: per_file,
            last_seq,
            merges: self.shared.merges.load(Ordering::SeqCst),
        }
    }

    /// Sealed data and hint files, in order, with length and crc32.
    pub fn sealed_files(&self) -> Vec<FileInfo> {
        let files = read(&self.shared.files);
        let mut out = Vec::new();
        for meta in &files.sealed {
            out.push(FileInfo {
                name: meta.id.data_name(),
                len: meta.len,
                crc: meta.crc,
            });
        }
        drop(files);
        for info in out.clone() {
            let id = info
                .name
                .strip_suffix(crate::format::DATA_SUFFIX)
                .and_then(FileId::parse_stem);
            if let Some(id) = id {
                let path = path_in(&self.shared.dir, &id.hint_name());
                if let Ok(file) = self.shared.opts.vfs.open(&path)
                    && let Ok(Some((len, crc))) = checksum_file(file.as_ref(), None)
                {
                    out.push(FileInfo {
                        name: id.hint_name(),
                        len,
                        crc,
                    });
                }
            }
        }
        out
    }

    /// The active segment: its name, current length and crc32, if there is one.
    pub fn active_file(&self) -> Option<FileInfo> {
        let writer = lock(&self.shared.writer);
        writer.active.as_ref().map(|active| FileInfo {
            name: active.id.data_name(),
            len: active.len,
            crc: active.hasher.clone().finalize(),
        })
    }

    /// crc32 of the first `len` bytes of a data file the engine holds.
    pub fn checksum_prefix(&self, name: &str, len: u64) -> Result<u32> {
        let path = path_in(&self.shared.dir, name);
        let known = {
            let files = read(&self.shared.files);
            files.paths.values().any(|p| *p == path)
        };
        if !known {
            return Err(Error::UnknownFile(name.to_string()));
        }
        let file = self
            .shared
            .opts
            .vfs
            .open(&path)
            .map_err(|e| Error::io(&path, e))?;
        match checksum_file(file.as_ref(), Some(len)).map_err(|e| Error::io(&path, e))? {
            Some((_, crc)) => Ok(crc),
            None => Err(Error::InvalidOption {
                name: "len",
                reason: format!("{name} is shorter than {len} bytes"),
            }),
        }
    }

    /// Keeps these files (names as listed by [`Engine::sealed_files`] or
    /// [`Engine::active_file`]) on disk until the returned guard drops, even
    /// if a merge replaces them meanwhile.
    pub fn pin(&self, names: &[String]) -> Result<Pin> {
        let files = read(&self.shared.files);
        let known: HashSet<String> = files
            .paths
            .values()
            .filter_map(|p| p.file_name()?.to_str().map(str::to_string))
            .flat_map(|data| {
                let hint = data
                    .strip_suffix(crate::format::DATA_SUFFIX)
                    .map(|stem| format!("{stem}{}", crate::format::HINT_SUFFIX));
                std::iter::once(data).chain(hint)
            })
            .collect();
        let mut pins = lock(&self.shared.pins);
        if let Some(unknown) = names.iter().find(|name| !known.contains(*name)) {
            return Err(Error::UnknownFile(unknown.clone()));
        }
        for name in names {
            *pins.counts.entry(name.clone()).or_default() += 1;
        }
        Ok(Pin {
            shared: self.shared.clone(),
            names: names.to_vec(),
        })
    }

    /// Merges `inputs` (a prefix of the sealed data files that includes every
    /// earlier merge output) into new files, judging expiry at `now_ms`.
    /// Blocks the calling thread; readers and writers carry on meanwhile.
    pub fn merge(&self, inputs: &[String], now_ms: u64) -> Result<MergeReport> {
        crate::merge::merge(&self.shared, inputs, now_ms)
    }

    /// Captures a merge of `inputs` now and returns it for [`MergeJob::run`]
    /// (on any thread). The cut-off is the engine's state at this call, so a
    /// caller that captures at the same point of the same write stream gets
    /// the same output on every replica (the cluster captures while applying
    /// a merge entry). Waits while another merge job exists.
    pub fn begin_merge(&self, inputs: &[String], now_ms: u64) -> Result<MergeJob> {
        crate::merge::begin(&self.shared, inputs, now_ms)
    }

    /// Names of the sealed data files, in order (the candidates for a merge).
    pub fn sealed_data_files(&self) -> Vec<String> {
        read(&self.shared.files)
            .sealed
            .iter()
            .map(|meta| meta.id.data_name())
            .collect()
    }

    /// Whether an earlier I/O failure poisoned the engine.
    pub fn is_poisoned(&self) -> bool {
        self.shared.poisoned.load(Ordering::SeqCst)
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

fn file_stats(name: String, sealed: bool, total_bytes: u64, live_bytes: u64) -> FileStats {
    FileStats {
        name,
        sealed,
        total_bytes,
        live_bytes,
        dead_bytes: total_bytes.saturating_sub(live_bytes),
    }
}

/// crc32 of the first `len` bytes of a file (all of it when `None`); `None`
/// when the file is shorter.
pub(crate) fn checksum_file(
    file: &dyn VfsFile,
    len: Option<u64>,
) -> std::io::Result<Option<(u64, u32)>> {
    const CHUNK_BYTES: usize = 1 << 20;
    let actual = file.len()?;
    let len = len.unwrap_or(actual);
    if len > actual {
        return Ok(None);
    }
    let mut hasher = crc32fast::Hasher::new();
    let mut buf = vec![0u8; CHUNK_BYTES];
    let mut pos = 0u64;
    while pos < len {
        let n = CHUNK_BYTES.min((len - pos) as usize);
        file.read_exact_at(&mut buf[..n], pos)?;
        hasher.update(&buf[..n]);
        pos += n as u64;
    }
    Ok(Some((len, hasher.finalize())))
}

fn bounds(range: &KeyRange) -> (Bound<Vec<u8>>, Bound<Vec<u8>>) {
    match range {
        KeyRange::All => (Bound::Unbounded, Bound::Unbounded),
        KeyRange::Prefix(prefix) => (
            Bound::Included(prefix.clone()),
            prefix_end(prefix).map_or(Bound::Unbounded, Bound::Excluded),
        ),
        KeyRange::Range(start, end) => (start.clone(), end.clone()),
    }
}

/// The smallest key greater than every key starting with `prefix`.
fn prefix_end(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < u8::MAX {
            end.push(last + 1);
            return Some(end);
        }
    }
    None
}

fn as_ref_bound(bound: &Bound<Vec<u8>>) -> Bound<&[u8]> {
    match bound {
        Bound::Included(key) => Bound::Included(key.as_slice()),
        Bound::Excluded(key) => Bound::Excluded(key.as_slice()),
        Bound::Unbounded => Bound::Unbounded,
    }
}

/// BTreeMap::range panics on inverted bounds; such a range is simply empty.
fn range_is_empty(start: &Bound<Vec<u8>>, end: &Bound<Vec<u8>>) -> bool {
    match (start, end) {
        (Bound::Included(s), Bound::Included(e)) => s > e,
        (Bound::Included(s), Bound::Excluded(e))
        | (Bound::Excluded(s), Bound::Included(e))
        | (Bound::Excluded(s), Bound::Excluded(e)) => s >= e,
        _ => false,
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

    pub(crate) fn check_poison(&self) -> Result<()> {
        if self.closed.load(Ordering::SeqCst) {
            return Err(Error::Closed);
        }
        if self.poisoned.load(Ordering::SeqCst) {
            let cause = lock(&self.poison_cause).clone().unwrap_or_default();
            return Err(Error::Poisoned { cause });
        }
        Ok(())
    }

    /// Marks the engine poisoned and returns the error to report.
    pub(crate) fn poison(&self, error: Error) -> Error {
        let mut cause = lock(&self.poison_cause);
        if cause.is_none() {
            tracing::error!(error = %error, "write or fsync failed; the engine refuses further writes");
            *cause = Some(error.to_string());
        }
        self.poisoned.store(true, Ordering::SeqCst);
        error
    }

    /// A way to read file `num`, or `None` if the file left the engine:
    /// sealed files are memory-mapped, the active one is read with pread.
    fn handle(&self, num: u32) -> Result<Option<Handle>> {
        if let Some((handle, _)) = read(&self.handles).open.get(&num) {
            return Ok(Some(handle.clone()));
        }
        let (path, active) = {
            let files = read(&self.files);
            let Some(path) = files.paths.get(&num).cloned() else {
                return Ok(None);
            };
            (path, files.active.is_some_and(|(active, _)| active == num))
        };
        let file = match self.opts.vfs.open(&path) {
            Ok(file) => file,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(Error::io(&path, e)),
        };
        let handle = if active {
            Handle::File(file)
        } else {
            Handle::Map(file.map().map_err(|e| Error::io(&path, e))?)
        };
        write(&self.handles).insert(num, handle.clone(), self.opts.open_files_max);
        // A merge may have retired the file while it was being opened: do
        // not keep a stale map of it (it would pin its disk space).
        if !read(&self.files).paths.contains_key(&num) {
            self.forget_handle(num);
        }
        Ok(Some(handle))
    }

    pub(crate) fn forget_handle(&self, num: u32) {
        write(&self.handles).open.remove(&num);
    }

    fn file_name(&self, num: u32) -> String {
        read(&self.files)
            .paths
            .get(&num)
            .and_then(|p| p.file_name()?.to_str().map(str::to_string))
            .unwrap_or_else(|| format!("file #{num}"))
    }

    /// Hands the whole record at `location`, checked against its checksum
    /// and the key directory, to `f`; `None` if its file left the engine
    /// meanwhile (a merge swapped it out: look the key up again).
    pub(crate) fn with_record<T>(
        &self,
        key_len: usize,
        location: &Location,
        f: impl FnOnce(&[u8]) -> T,
    ) -> Result<Option<T>> {
        let Some(handle) = self.handle(location.file)? else {
            return Ok(None);
        };
        let size = record_size(key_len, location.value_len as usize);
        let offset = location.offset as usize;
        let corruption = |reason: String| Error::Corruption {
            file: self.file_name(location.file),
            offset: offset as u64,
            reason,
        };
        let buf;
        let record: &[u8] = match &handle {
            Handle::Map(map) => {
                let bytes = map.as_ref().as_ref();
                bytes.get(offset..offset + size).ok_or_else(|| {
                    corruption(format!(
                        "record runs past the end of the {}-byte file",
                        bytes.len()
                    ))
                })?
            }
            Handle::File(file) => {
                let mut bytes = vec![0u8; size];
                file.read_exact_at(&mut bytes, offset as u64)
                    .map_err(|e| corruption(format!("record unreadable: {e}")))?;
                buf = bytes;
                &buf
            }
        };
        match verify_record(record) {
            Ok(header) if header.seq == location.seq && header.key_len as usize == key_len => {
                Ok(Some(f(record)))
            }
            Ok(_) => Err(corruption(
                "record is not the one the key directory names".to_string(),
            )),
            Err(fault) => Err(corruption(format!("{fault:?}"))),
        }
    }

    fn read_value(&self, key: &[u8], location: &Location) -> Result<Option<Vec<u8>>> {
        let value = self.with_record(key.len(), location, |record| {
            let key_end = RECORD_HEADER_SIZE_BYTES + key.len();
            (&record[RECORD_HEADER_SIZE_BYTES..key_end] == key).then(|| record[key_end..].to_vec())
        })?;
        match value {
            Some(Some(value)) => Ok(Some(value)),
            Some(None) => Err(Error::Corruption {
                file: self.file_name(location.file),
                offset: location.offset as u64,
                reason: "record holds another key".to_string(),
            }),
            None => Ok(None),
        }
    }

    fn validate(&self, batch: &Batch) -> Result<usize> {
        if batch.meta.len() > METADATA_SIZE_BYTES_MAX {
            return Err(Error::MetadataTooLarge {
                len: batch.meta.len(),
                max: METADATA_SIZE_BYTES_MAX,
            });
        }
        let mut size = record_size(0, batch.meta.len());
        for op in &batch.ops {
            let (key, value_len) = match op {
                Op::Put { key, value, .. } => (key, value.len()),
                Op::Delete { key } => (key, 0),
            };
            if key.is_empty() {
                return Err(Error::KeyEmpty);
            }
            if key.len() > self.opts.key_size_bytes_max {
                return Err(Error::KeyTooLarge {
                    len: key.len(),
                    max: self.opts.key_size_bytes_max,
                });
            }
            if value_len > self.opts.value_size_bytes_max {
                return Err(Error::ValueTooLarge {
                    len: value_len,
                    max: self.opts.value_size_bytes_max,
                });
            }
            size += record_size(key.len(), value_len);
        }
        if size > self.opts.batch_size_bytes_max {
            return Err(Error::BatchTooLarge {
                len: size,
                max: self.opts.batch_size_bytes_max,
            });
        }
        Ok(size)
    }

    fn write_batch(self: &Arc<Self>, batch: &Batch) -> Result<Written> {
        let size = self.validate(batch)?;
        let (written, end, sealed) = {
            let mut guard = lock(&self.writer);
            self.check_poison()?;
            let writer = &mut *guard;
            let first_seq = match batch.seq {
                Some(seq) => seq,
                None => writer
                    .last_seq
                    .checked_add(1)
                    .ok_or(Error::SequenceNotIncreasing {
                        given: u64::MAX,
                        last: writer.last_seq,
                    })?,
            };
            if first_seq <= writer.last_seq || first_seq == 0 {
                return Err(Error::SequenceNotIncreasing {
                    given: first_seq,
                    last: writer.last_seq,
                });
            }
            let commit_seq = first_seq.checked_add(batch.ops.len() as u64).ok_or(
                Error::SequenceNotIncreasing {
                    given: first_seq,
                    last: writer.last_seq,
                },
            )?;
            if writer.active.is_none() {
                let active = self.create_segment(first_seq).map_err(|e| self.poison(e))?;
                writer.active = Some(active);
            }
            let active = writer
                .active
                .as_mut()
                .expect("an active segment was just ensured");
            let base = active.len;
            let buf = &mut writer.buf;
            buf.clear();
            buf.reserve(size);
            let mut updates = Vec::with_capacity(batch.ops.len() + 1);
            for (i, op) in batch.ops.iter().enumerate() {
                let seq = first_seq + i as u64;
                let offset = (base + buf.len() as u64) as u32;
                match op {
                    Op::Put {
                        key,
                        value,
                        expiry_ms,
                    } => {
                        encode_record(buf, RecordKind::Put, seq, *expiry_ms, key, value);
                        let location = Location {
                            file: active.num,
                            offset,
                            value_len: value.len() as u32,
                            seq,
                            expiry_ms: *expiry_ms,
                        };
                        updates.push(Update::Put(key.clone(), location));
                    }
                    Op::Delete { key } => {
                        encode_record(buf, RecordKind::Tombstone, seq, 0, key, &[]);
                        updates.push(Update::Delete(key.clone(), seq));
                    }
                }
            }
            let commit_offset = (base + buf.len() as u64) as u32;
            encode_record(buf, RecordKind::Commit, commit_seq, 0, &[], &batch.meta);
            updates.push(Update::Seq(commit_seq));
            if let Err(e) = active.file.write_all_at(buf, base) {
                let path = path_in(&self.dir, &active.id.data_name());
                return Err(self.poison(Error::io(path, e)));
            }
            active.len += buf.len() as u64;
            active.hasher.update(buf);
            active.max_seq = commit_seq;
            active.last_commit = Some((commit_seq, batch.meta.clone()));
            for (op, update) in batch.ops.iter().zip(&updates) {
                let hinted = match (op, update) {
                    (Op::Put { key, .. }, Update::Put(_, location)) => {
                        active.hint.add(&HintEntry {
                            kind: RecordKind::Put,
                            key,
                            value_len: location.value_len,
                            offset: location.offset,
                            seq: location.seq,
                            expiry_ms: location.expiry_ms,
                        })
                    }
                    (Op::Delete { key }, Update::Delete(_, seq)) => {
                        active.hint.add(&HintEntry::tombstone(key, *seq))
                    }
                    _ => unreachable!("updates are built in op order"),
                };
                hinted.map_err(|e| self.poison(e))?;
            }
            active.hint.commit(&batch.meta, commit_offset, commit_seq);
            writer.written_total += buf.len() as u64;
            writer.last_seq = commit_seq;
            writer.last_meta = Some(batch.meta.clone());
            let end = writer.written_total;
            if self.opts.sync == SyncPolicy::Always {
                writer.pending.push_back((end, updates));
            } else {
                apply_updates(&mut write(&self.keydir), updates);
            }
            let rotate = writer
                .active
                .as_ref()
                .is_some_and(|a| a.len >= self.opts.segment_size_bytes);
            if rotate {
                self.seal_active(writer)?;
            }
            (
                Written {
                    first_seq,
                    commit_seq,
                },
                end,
                rotate,
            )
        };
        if self.opts.sync == SyncPolicy::Always {
            self.sync_to(end)?;
        }
        if sealed {
            self.maybe_auto_merge();
        }
        Ok(written)
    }

    fn create_segment(&self, first_seq: u64) -> Result<Active> {
        let id = FileId::Segment { first_seq };
        let path = path_in(&self.dir, &id.data_name());
        let vfs = self.opts.vfs.as_ref();
        let file = vfs.create(&path).map_err(|e| Error::io(&path, e))?;
        let header = id.header(0);
        let header_bytes = header.encode(DATA_MAGIC);
        file.write_all_at(&header_bytes, 0)
            .map_err(|e| Error::io(&path, e))?;
        // The new name must be durable before any write in it is acknowledged.
        vfs.sync_dir(&self.dir)
            .map_err(|e| Error::io(&self.dir, e))?;
        let hint = HintWriter::create(vfs, &self.dir, &id, &header)?;
        let num = {
            let mut files = write(&self.files);
            let num = files.allocate(path);
            files.active = Some((num, id));
            num
        };
        write(&self.handles).insert(num, Handle::File(file.clone()), self.opts.open_files_max);
        let mut hasher = crc32fast::Hasher::new();
        hasher.update(&header_bytes);
        Ok(Active {
            num,
            id,
            file,
            len: header_bytes.len() as u64,
            hasher,
            hint,
            max_seq: 0,
            last_commit: None,
        })
    }

    /// Seals the active segment: fsync, hint, and it joins the sealed list.
    pub(crate) fn seal_active(&self, writer: &mut Writer) -> Result<()> {
        let Some(active) = writer.active.take() else {
            return Ok(());
        };
        self.sync_file(active.file.as_ref(), &active.id.data_name())?;
        // Everything written so far is durable now.
        let pending: Vec<(u64, Vec<Update>)> = writer.pending.drain(..).collect();
        {
            let mut keydir = write(&self.keydir);
            for (_, updates) in pending {
                apply_updates(&mut keydir, updates);
            }
        }
        self.synced_total
            .fetch_max(writer.written_total, Ordering::SeqCst);
        let crc = active.hasher.clone().finalize();
        let vfs = self.opts.vfs.as_ref();
        active
            .hint
            .finish(vfs, active.len, crc)
            .map_err(|e| self.poison(e))?;
        vfs.sync_dir(&self.dir)
            .map_err(|e| self.poison(Error::io(&self.dir, e)))?;
        let meta = FileMeta {
            id: active.id,
            num: active.num,
            len: active.len,
            crc,
            max_seq: active.max_seq,
            last_commit: active.last_commit,
        };
        let num = meta.num;
        {
            let mut files = write(&self.files);
            files.sealed.push(Arc::new(meta));
            files.active = None;
        }
        // The next read maps the now immutable file.
        self.forget_handle(num);
        Ok(())
    }

    /// Returns once everything up to write position `target` is durable and
    /// visible. Group commit: one caller at a time is the leader and fsyncs
    /// everything appended so far; the others wait on a condition variable
    /// (not on a mutex, so a returning leader cannot barge ahead of them)
    /// and most find their writes covered when they wake.
    pub(crate) fn sync_to(&self, target: u64) -> Result<()> {
        {
            let mut state = lock(&self.sync_state);
            loop {
                if self.synced_total.load(Ordering::SeqCst) >= target {
                    return self.check_poison_after_sync();
                }
                self.check_poison()?;
                if !state.leader_active {
                    state.leader_active = true;
                    break;
                }
                state = self
                    .sync_done
                    .wait(state)
                    .unwrap_or_else(|poisoned| poisoned.into_inner());
            }
        }
        let result = self.lead_sync();
        lock(&self.sync_state).leader_active = false;
        self.sync_done.notify_all();
        result
    }

    /// One group-commit round: fsync the active segment, then publish every
    /// batch the fsync covered to the key directory.
    fn lead_sync(&self) -> Result<()> {
        let (file, name, end) = {
            let writer = lock(&self.writer);
            match &writer.active {
                Some(active) => (
                    Some(active.file.clone()),
                    active.id.data_name(),
                    writer.written_total,
                ),
                None => (None, String::new(), writer.written_total),
            }
        };
        if let Some(file) = file {
            self.sync_file(file.as_ref(), &name)?;
        }
        let mut writer = lock(&self.writer);
        // A seal or another fsync may have failed meanwhile: then nothing
        // pending is known to be durable, and nothing may be published.
        self.check_poison()?;
        let mut ready = Vec::new();
        while writer
            .pending
            .front()
            .is_some_and(|(batch_end, _)| *batch_end <= end)
        {
            ready.push(writer.pending.pop_front().expect("front exists").1);
        }
        if !ready.is_empty() {
            let mut keydir = write(&self.keydir);
            for updates in ready {
                apply_updates(&mut keydir, updates);
            }
        }
        self.synced_total.fetch_max(end, Ordering::SeqCst);
        Ok(())
    }

    /// fsyncs a data file; a failure poisons the engine, and once poisoned
    /// no data file is fsynced again (see `fsync_serial`).
    pub(crate) fn sync_file(&self, file: &dyn VfsFile, name: &str) -> Result<()> {
        let _serial = lock(&self.fsync_serial);
        // Not `check_poison`: closing fsyncs after `closed` is set.
        self.check_poison_after_sync()?;
        file.sync()
            .map_err(|e| self.poison(Error::io(path_in(&self.dir, name), e)))
    }

    fn check_poison_after_sync(&self) -> Result<()> {
        if self.poisoned.load(Ordering::SeqCst) {
            return self.check_poison();
        }
        Ok(())
    }

    fn sync_loop(self: Arc<Self>, interval_ms: u64) {
        let (stopped, wake) = &self.stop;
        let mut stop = lock(stopped);
        while !*stop {
            let (guard, _) = wake
                .wait_timeout(stop, std::time::Duration::from_millis(interval_ms))
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            stop = guard;
            if *stop {
                break;
            }
            drop(stop);
            let target = lock(&self.writer).written_total;
            if let Err(e) = self.sync_to(target) {
                tracing::warn!(error = %e, "background fsync failed");
            }
            stop = lock(stopped);
        }
    }

    fn maybe_auto_merge(self: &Arc<Self>) {
        let Some(auto) = self.opts.auto_merge else {
            return;
        };
        let (total, live, inputs) = {
            let files = read(&self.files);
            let keydir = read(&self.keydir);
            let total: u64 = files.sealed.iter().map(|m| m.len).sum();
            let live: u64 = files.sealed.iter().map(|m| keydir.live_bytes(m.num)).sum();
            (
                total,
                live,
                files
                    .sealed
                    .iter()
                    .map(|m| m.id.data_name())
                    .collect::<Vec<_>>(),
            )
        };
        let dead = total.saturating_sub(live);
        if total == 0
            || dead < auto.dead_bytes_min
            || (dead as f64) < auto.dead_ratio_min * total as f64
        {
            return;
        }
        if self.auto_merge_queued.swap(true, Ordering::SeqCst) {
            return;
        }
        let worker = self.clone();
        let now_ms = self.now_seen_ms.load(Ordering::Relaxed);
        let spawned = std::thread::Builder::new()
            .name("bitcask-merge".to_string())
            .spawn(move || {
                match crate::merge::merge(&worker, &inputs, now_ms) {
                    Ok(report) => tracing::info!(
                        inputs = report.inputs.len(),
                        outputs = report.outputs.len(),
                        bytes_before = report.bytes_before,
                        bytes_after = report.bytes_after,
                        "automatic merge done"
                    ),
                    Err(Error::Closed) => {}
                    Err(e) => tracing::warn!(error = %e, "automatic merge failed"),
                }
                worker.auto_merge_queued.store(false, Ordering::SeqCst);
            });
        match spawned {
            Ok(handle) => {
                let mut threads = lock(&self.threads);
                threads.retain(|t| !t.is_finished());
                threads.push(handle);
            }
            Err(e) => {
                tracing::warn!(error = %e, "could not start a merge thread");
                self.auto_merge_queued.store(false, Ordering::SeqCst);
            }
        }
    }

    /// Deletes a file the engine no longer uses, unless it is pinned (then
    /// its last unpin deletes it).
    pub(crate) fn retire_file(&self, name: &str) {
        {
            let mut pins = lock(&self.pins);
            if pins.counts.contains_key(name) {
                pins.doomed.insert(name.to_string());
                return;
            }
        }
        let path = path_in(&self.dir, name);
        if let Err(e) = self.opts.vfs.remove(&path)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(file = %name, error = %e, "could not delete a merged file");
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
        let writer = lock(&self.writer);
        match &writer.active {
            Some(active) => self.sync_file(active.file.as_ref(), &active.id.data_name()),
            None => self.check_poison_after_sync(),
        }
    }
}

pub(crate) fn apply_updates(keydir: &mut KeyDir, updates: Vec<Update>) {
    for update in updates {
        match update {
            Update::Put(key, location) => keydir.put(&key, location),
            Update::Delete(key, seq) => keydir.delete(&key, seq),
            Update::Seq(seq) => keydir.note_seq(seq),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_end_skips_trailing_max_bytes() {
        assert_eq!(prefix_end(b"ab"), Some(b"ac".to_vec()));
        assert_eq!(prefix_end(&[1, 0xff]), Some(vec![2]));
        assert_eq!(prefix_end(&[0xff, 0xff]), None);
    }
}
