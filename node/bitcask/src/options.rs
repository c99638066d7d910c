//! Options, limits and sync policies.
//!
//! Every limit is a named constant with its unit in the name; the engine
//! checks limits at its API edge and names the limit in the error.

use std::sync::Arc;

use crate::error::{Error, Result};
use crate::format::KEY_SIZE_BYTES_FORMAT_MAX;
use vfs::{RealFs, Vfs};

/// Default largest key: 4 KiB.
pub const KEY_SIZE_BYTES_MAX: usize = 4 * 1024;
/// Default largest value: 16 MiB.
pub const VALUE_SIZE_BYTES_MAX: usize = 16 * 1024 * 1024;
/// Default largest batch, as encoded on disk: 64 MiB.
pub const BATCH_SIZE_BYTES_MAX: usize = 64 * 1024 * 1024;
/// Largest batch metadata (the value of a commit record): 64 KiB. Hint
/// files copy it, and restart reads it, so it stays small.
pub const METADATA_SIZE_BYTES_MAX: usize = 64 * 1024;
/// Largest per-record meta ([`crate::RecordMeta`]): 48 bytes. The key
/// directory keeps one inline per key, so it must stay small; the layer
/// above needs at most 40 (four LEB128 varints). Not configurable: it is the
/// size of the inline array, and a record or hint claiming more is corrupt.
pub const RECORD_META_BYTES_MAX: usize = 48;
/// Default segment rotation threshold: 64 MiB.
pub const SEGMENT_SIZE_BYTES_DEFAULT: u64 = 64 * 1024 * 1024;
/// Largest rotation threshold. Record offsets are u32, and a segment can
/// exceed the threshold by one batch, so threshold + batch must stay < 4 GiB.
pub const SEGMENT_SIZE_BYTES_MAX: u64 = 2 * 1024 * 1024 * 1024;
/// Largest configurable batch (see [`SEGMENT_SIZE_BYTES_MAX`]).
pub const BATCH_SIZE_BYTES_LIMIT: usize = 1024 * 1024 * 1024;
/// Largest record any data file can hold, in bytes: every record is part
/// of one batch (merge outputs copy records byte for byte), and no batch
/// exceeds [`BATCH_SIZE_BYTES_LIMIT`]. A location claiming more is refused
/// before anything is read.
pub const RECORD_SIZE_BYTES_MAX: usize = BATCH_SIZE_BYTES_LIMIT;
/// Before a batch that ends past the zeros already written ahead of the
/// active segment's end, zeros are written from the batch's end to the next
/// multiple of this size, so most batches land in page-cache pages that
/// already exist and the kernel does not allocate and zero a page per
/// append (node/bitcask/BENCHMARKS.md). The active segment's file is cut
/// back to its last batch when it is sealed or the engine closes; after a
/// kill, recovery cuts the zeros (node/bitcask/FORMAT.md, "Batches").
pub const FILL_AHEAD_BYTES: u64 = 64 * 1024;
/// Smallest rotation threshold (tests use tiny segments to rotate often).
pub const SEGMENT_SIZE_BYTES_MIN: u64 = 64;
/// Default cap on open segment file handles (readers share them).
pub const OPEN_FILES_MAX_DEFAULT: usize = 256;
/// Keys repointed per key-directory lock hold when a merge swaps in, so
/// readers and writers wait at most one chunk.
pub const MERGE_SWAP_CHUNK_KEYS: usize = 4096;

/// When appended data reaches the disk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SyncPolicy {
    /// Every write returns after an fsync covering it; concurrent writers
    /// share one fsync (group commit). Writes become visible to readers only
    /// once durable.
    Always,
    /// A background thread fsyncs every N milliseconds.
    EveryMs(u64),
    /// Only sealing a segment, [`crate::Engine::sync`] and close fsync. This is
    /// the policy inside the cluster, where the Raft log is the write-ahead log.
    Never,
}

/// Automatic merge, for the engine used on its own. The cluster leaves this
/// off and decides merges through Raft.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AutoMerge {
    /// Merge when dead bytes / total bytes of the sealed files reach this.
    pub dead_ratio_min: f64,
    /// ... and the dead bytes are at least this many.
    pub dead_bytes_min: u64,
}

impl Default for AutoMerge {
    fn default() -> Self {
        AutoMerge {
            dead_ratio_min: 0.5,
            dead_bytes_min: 64 * 1024 * 1024,
        }
    }
}

/// A prefix of the active segment that was fsynced and published (for
/// example named in a snapshot manifest). Recovery never truncates inside it:
/// a bad record there is corruption.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PublishedPrefix {
    /// Data file name, e.g. `seg-00000000000000000001.data`.
    pub file: String,
    /// Length in bytes of the published prefix.
    pub len: u64,
}

/// How to open an engine.
#[derive(Clone)]
pub struct Options {
    /// Rotate the active segment at the first batch boundary at or past this
    /// size. Files depend on it: replicas that must hold identical files must
    /// use the same value.
    pub segment_size_bytes: u64,
    /// Durability of writes.
    pub sync: SyncPolicy,
    /// Largest key accepted.
    pub key_size_bytes_max: usize,
    /// Largest value accepted.
    pub value_size_bytes_max: usize,
    /// Largest batch accepted (encoded size).
    pub batch_size_bytes_max: usize,
    /// Open file handles kept for readers.
    pub open_files_max: usize,
    /// Merge on its own by dead-bytes ratio; `None` leaves merging to the caller.
    /// Automatic merges retain no history (no retention predicate), and
    /// records a retaining merge kept count as dead bytes: a caller that
    /// keeps history ([`crate::Engine::merge_retaining`]) turns this off.
    pub auto_merge: Option<AutoMerge>,
    /// Published prefix of the active segment, if any.
    pub published_prefix: Option<PublishedPrefix>,
    /// The file system (real files, or a test double).
    pub vfs: Arc<dyn Vfs>,
}

impl std::fmt::Debug for Options {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Options")
            .field("segment_size_bytes", &self.segment_size_bytes)
            .field("sync", &self.sync)
            .field("key_size_bytes_max", &self.key_size_bytes_max)
            .field("value_size_bytes_max", &self.value_size_bytes_max)
            .field("batch_size_bytes_max", &self.batch_size_bytes_max)
            .field("open_files_max", &self.open_files_max)
            .field("auto_merge", &self.auto_merge)
            .field("published_prefix", &self.published_prefix)
            .finish_non_exhaustive()
    }
}

impl Default for Options {
    fn default() -> Self {
        Options {
            segment_size_bytes: SEGMENT_SIZE_BYTES_DEFAULT,
            sync: SyncPolicy::Always,
            key_size_bytes_max: KEY_SIZE_BYTES_MAX,
            value_size_bytes_max: VALUE_SIZE_BYTES_MAX,
            batch_size_bytes_max: BATCH_SIZE_BYTES_MAX,
            open_files_max: OPEN_FILES_MAX_DEFAULT,
            auto_merge: Some(AutoMerge::default()),
            published_prefix: None,
            vfs: Arc::new(RealFs),
        }
    }
}

impl Options {
    /// Checks every option against its limit.
    pub fn validate(&self) -> Result<()> {
        let range = |name, value: u64, min: u64, max: u64| {
            if value < min || value > max {
                Err(Error::InvalidOption {
                    name,
                    reason: format!("{value} is outside {min}..={max}"),
                })
            } else {
                Ok(())
            }
        };
        range(
            "segment_size_bytes",
            self.segment_size_bytes,
            SEGMENT_SIZE_BYTES_MIN,
            SEGMENT_SIZE_BYTES_MAX,
        )?;
        range(
            "key_size_bytes_max",
            self.key_size_bytes_max as u64,
            1,
            KEY_SIZE_BYTES_FORMAT_MAX as u64,
        )?;
        range(
            "batch_size_bytes_max",
            self.batch_size_bytes_max as u64,
            1,
            BATCH_SIZE_BYTES_LIMIT as u64,
        )?;
        range(
            "value_size_bytes_max",
            self.value_size_bytes_max as u64,
            0,
            self.batch_size_bytes_max as u64,
        )?;
        range("open_files_max", self.open_files_max as u64, 2, 1 << 20)?;
        if let SyncPolicy::EveryMs(ms) = self.sync {
            range("sync", ms, 1, 3_600_000)?;
        }
        if let Some(auto) = self.auto_merge
            && !(auto.dead_ratio_min > 0.0 && auto.dead_ratio_min <= 1.0)
        {
            return Err(Error::InvalidOption {
                name: "auto_merge.dead_ratio_min",
                reason: format!("{} is outside (0, 1]", auto.dead_ratio_min),
            });
        }
        Ok(())
    }
}
