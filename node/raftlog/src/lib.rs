//! # raftlog
//!
//! The Raft log store: openraft's `RaftLogStorage` over segmented,
//! append-only, checksummed files, with every file access going through
//! [`vfs::Vfs`] (real files in production, `vfs::sim::SimFs` in
//! power-loss and fault tests). Generic over openraft's `RaftTypeConfig`;
//! entries, log ids and metadata payloads are encoded with `kvcodec`.
//!
//! `node/raftlog/LOG_FORMAT.md` documents every byte on disk; the constants
//! carry the same names.
//!
//! ## Modules
//! - `limits`: the size limits (segment rotation, largest entry, payload
//!   cache, largest metadata file, batches per group commit).
//! - `format`: the on-disk format — constants named as in `LOG_FORMAT.md`,
//!   segment names and headers, record and metadata encoding and validation.
//! - `error`: [`LogError`] and its conversion to openraft's `StorageError`.
//! - `options`: [`LogStoreOptions`] and the [`FsyncObserver`] hook.
//! - `writer`: the writer thread — every write in order, group commit (one
//!   write and one fsync per group of batches), poisoning after a failed
//!   write or fsync.
//! - `index`: the in-memory state — segments, one slot per live entry
//!   (log id, segment, offset), the payload cache — and reads.
//! - `recovery`: open — leftovers deleted, metadata read, segments scanned,
//!   a torn tail cut off, corruption reported by file and offset.
//! - `store`: [`LogStore`] and [`LogReader`], the write operations (append,
//!   truncate, purge, vote, committed) and openraft's `RaftLogReader` and
//!   `RaftLogStorage` impls.
//!
//! ## Files (one directory)
//! - `log-<first index, 20 digits>.seg`: log segments. Each starts with a
//!   header (magic, format version, first index) and holds records, one per
//!   entry, in index order. Only the last segment is appended to; it rotates
//!   when the next batch would take it past [`LOG_SEGMENT_SIZE_BYTES`]. The
//!   last segment may end in up to [`LOG_FILL_AHEAD_BYTES`] of zeros after
//!   its records (see "Write path"); every other segment ends at its last
//!   record.
//! - `vote.meta`, `purged.meta`: the vote and the purge point; and
//!   `committed.meta`, the committed log id, only with
//!   [`LogStoreOptions::persist_committed`] (off by default: the committed id
//!   lives in memory, and a vote is always reopened uncommitted so that a
//!   former leader wins a new term before it serves reads; see
//!   `recovery::uncommitted`). Each is replaced whole: written to
//!   `<name>.tmp`, fsynced, renamed over the old file, then the directory is
//!   fsynced. No metadata file is ever truncated and rewritten in place.
//! - `LOCK`: held (an exclusive `flock`, [`vfs::Vfs::lock_dir`]) from
//!   before recovery until the writer thread ends, so a second store on the
//!   same directory fails to open ([`LogError::DirectoryInUse`]) instead of
//!   cutting a live writer's tail.
//!
//! ## Write path
//! All writes (appends, vote, committed, truncate, purge) are executed in
//! order by one dedicated writer thread, so the tokio runtime never blocks on
//! a disk and write I/O is serialized as openraft requires. `append` lays the
//! batch out in memory (the entries are readable when it returns), hands one
//! buffer to the writer and returns; the writer issues ONE positioned write
//! for the batch and ONE fsync (batches queued behind each other for the same
//! segment share that fsync), and only then fires openraft's `IOFlushed`
//! callback. `save_vote`, `truncate` and `purge` (and `save_committed` when
//! it persists) wait for the writer and return only once durable. Every
//! fsync, by operation:
//! - append: one fsync of the segment per group of batches (none under the
//!   negative control `nc-skip-log-fsync`, which also never persists the
//!   committed id). When a group's records pass the end of the zeros
//!   written after the segment's records, the writer first writes
//!   [`LOG_FILL_AHEAD_BYTES`] more zeros after them, under the same fsync:
//!   later appends overwrite zeros, so the file's size and blocks stay as
//!   they were and their fsync flushes data only, not the filesystem's
//!   journal (`deploy/bench/fsync-modes.py`);
//! - new segment (rotation, or the first append): the previous segment is
//!   cut to its last record and fsynced (if zeros followed it), then the
//!   new one's header is written, the file fsynced, then the directory
//!   fsynced, before the batch that needs it is laid out; the writer cuts
//!   the last segment's zeros the same way when the store closes;
//! - metadata file (vote, committed, purge point): the `.tmp` file fsynced,
//!   renamed, then the directory fsynced (not under `nc-rename-no-dir-fsync`);
//! - truncate: a directory fsync after each removed segment (highest
//!   first), then the cut segment fsynced;
//! - purge: the purge point saved (as a metadata file), then a directory
//!   fsync after each removed segment (lowest first).
//!
//! ## Reads
//! An in-memory index maps every live log index to its log id, segment and
//! offset, so reads never rescan. The payloads of the most recent entries
//! (up to [`LOG_CACHE_BYTES_MAX`], plus every entry not yet fsynced) are
//! kept in memory, so replication of fresh entries does no I/O; older
//! entries are read with one positioned read each and their checksum
//! verified.
//!
//! ## Failures
//! A failed write or fsync poisons the store: the error is reported (to the
//! callback or the caller), every later write is refused with
//! [`LogError::Poisoned`], and the fsync is never retried (after a failed
//! fsync the kernel may have dropped the dirty pages; retrying could report
//! success for data that is gone). Reopening recovers the durable state.
//!
//! ## Recovery (open)
//! The directory is created if needed, its `LOCK` taken, and its parent
//! fsynced. Leftover
//! `*.tmp` files are deleted; segments wholly below the purge point
//! (left by a purge interrupted between writing the purge point and deleting
//! files) are deleted; every remaining segment is scanned. Each batch is
//! fsynced before the next is written, and a new segment is created only
//! after the previous one is fsynced, so only the tail of the last segment
//! can be torn: a bad record there with no valid record after it is cut off
//! (and the cut fsynced); the writer's zeros after the last record (an
//! all-zero header never checks) are cut the same way. A segment before the
//! last never holds them: they are cut, durably, before the next segment is
//! created. A bad record anywhere else, a bad header or a gap
//! between segments is corruption: an error naming the file and offset.
//! Every removal at open is followed by a directory fsync.

mod error;
mod format;
mod index;
mod limits;
mod options;
mod recovery;
mod store;
mod writer;

pub use error::LogError;
pub use format::{
    COMMITTED_FILE, LOG_FORMAT_VERSION, META_HEADER_BYTES, META_KIND_COMMITTED, META_KIND_PURGED,
    META_KIND_VOTE, META_MAGIC, META_TRAILER_BYTES, PURGED_FILE, RECORD_BODY_LEN_OFFSET,
    RECORD_HEADER_BYTES, RECORD_INDEX_OFFSET, RECORD_LOG_ID_LEN_BYTES, SEGMENT_HEADER_BYTES,
    SEGMENT_HEADER_CRC_OFFSET, SEGMENT_HEADER_FIRST_INDEX_OFFSET, SEGMENT_HEADER_VERSION_OFFSET,
    SEGMENT_MAGIC, SEGMENT_PREFIX, SEGMENT_SUFFIX, TMP_SUFFIX, VOTE_FILE, segment_name,
};
pub use limits::{
    GROUP_COMMIT_BATCHES_MAX, LOG_CACHE_BYTES_MAX, LOG_ENTRY_SIZE_BYTES_MAX, LOG_FILL_AHEAD_BYTES,
    LOG_SEGMENT_SIZE_BYTES, META_FILE_BYTES_MAX,
};
pub use options::{FsyncObserver, LogStoreOptions};
pub use store::{LogReader, LogStore};

use std::sync::{Mutex, MutexGuard};

/// Locks a mutex, carrying on if a holder panicked.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}
