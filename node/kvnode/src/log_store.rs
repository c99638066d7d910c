//! The Raft log store: openraft's [`RaftLogStorage`] over segmented,
//! append-only, checksummed files, with every file access going through
//! [`bitcask::io::Vfs`] (real files in production, [`bitcask::sim::SimFs`] in
//! power-loss and fault tests).
//!
//! `node/kvnode/LOG_FORMAT.md` documents every byte on disk; the constants
//! below carry the same names.
//!
//! # Files (one directory)
//! - `log-<first index, 20 digits>.seg`: log segments. Each starts with a
//!   header (magic, format version, first index) and holds records, one per
//!   entry, in index order. Only the last segment is appended to; it rotates
//!   when the next batch would take it past [`LOG_SEGMENT_SIZE_BYTES`].
//! - `vote.meta`, `purged.meta`: the vote and the purge point; and
//!   `committed.meta`, the committed log id, only with
//!   [`LogStoreOptions::persist_committed`] (off by default: the committed id
//!   lives in memory, and a vote is always reopened uncommitted so that a
//!   former leader wins a new term before it serves reads; see
//!   [`uncommitted`]). Each is replaced whole: written to `<name>.tmp`,
//!   fsynced, renamed over the old file, then the directory is fsynced. No
//!   metadata file is ever truncated and rewritten in place.
//!
//! # Write path
//! All writes (appends, vote, committed, truncate, purge) are executed in
//! order by one dedicated writer thread, so the tokio runtime never blocks on
//! a disk and write I/O is serialized as openraft requires. `append` lays the
//! batch out in memory (the entries are readable when it returns), hands one
//! buffer to the writer and returns; the writer issues ONE positioned write
//! for the batch and ONE fsync (batches queued behind each other for the same
//! segment share that fsync), and only then fires openraft's
//! [`LogFlushed`] callback. `save_vote`, `truncate` and `purge` (and
//! `save_committed` when it persists) wait for the writer and return only
//! once durable.
//!
//! # Reads
//! An in-memory index maps every live log index to its log id, segment and
//! offset, so reads never rescan. The payloads of the most recent entries
//! (up to [`LOG_CACHE_BYTES_MAX`], plus every entry not yet fsynced) are
//! kept in memory, so replication of fresh entries does no I/O; older
//! entries are read with one positioned read each and their checksum
//! verified.
//!
//! # Failures
//! A failed write or fsync poisons the store: the error is reported (to the
//! callback or the caller), every later write is refused with
//! [`LogError::Poisoned`], and the fsync is never retried (after a failed
//! fsync the kernel may have dropped the dirty pages; retrying could report
//! success for data that is gone). Reopening recovers the durable state.
//!
//! # Recovery (open)
//! Leftover `*.tmp` files are deleted; segments wholly below the purge point
//! (left by a purge interrupted between writing the purge point and deleting
//! files) are deleted; every remaining segment is scanned. Each batch is
//! fsynced before the next is written, and a new segment is created only
//! after the previous one is fsynced, so only the tail of the last segment
//! can be torn: a bad record there with no valid record after it is cut off
//! (and the cut fsynced). A bad record anywhere else, a bad header or a gap
//! between segments is corruption: an error naming the file and offset.

use std::collections::{BTreeMap, VecDeque};
use std::fmt::Debug;
use std::io;
use std::ops::{Bound, RangeBounds};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, mpsc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bitcask::io::{Vfs, VfsFile};
use openraft::storage::{LogFlushed, RaftLogStorage};
use openraft::{
    LogId, LogState, OptionalSend, RaftLogId, RaftLogReader, RaftTypeConfig, StorageError,
    StorageIOError, Vote,
};
use tokio::sync::oneshot;

use crate::codec;

// ---------------------------------------------------------------------------
// Limits
// ---------------------------------------------------------------------------

/// A segment rotates when the next batch would take it past this many bytes
/// (a single batch larger than this still goes into one segment).
pub const LOG_SEGMENT_SIZE_BYTES: u64 = 64 * 1024 * 1024;

/// Largest record body (encoded log id + encoded entry), in bytes. The
/// cluster caps one Raft entry's payload at 4 MiB (DESIGN §4); this leaves
/// room for the entry's framing and for membership entries. An append with a
/// larger entry fails; recovery treats a larger length field as damage.
pub const LOG_ENTRY_SIZE_BYTES_MAX: usize = 8 * 1024 * 1024;

/// Bytes of recent, already fsynced entry payloads kept in memory so that
/// replication of fresh entries does not read the disk. Entries not yet
/// fsynced are always in memory, on top of this budget.
pub const LOG_CACHE_BYTES_MAX: usize = 64 * 1024 * 1024;

/// Largest metadata file (vote, committed, purge point) accepted at open, in
/// bytes.
pub const META_FILE_BYTES_MAX: u64 = 64 * 1024;

/// Most queued append batches one fsync covers (group commit in the writer
/// thread). Bounds the work between two callbacks.
pub const GROUP_COMMIT_BATCHES_MAX: usize = 256;

// ---------------------------------------------------------------------------
// On-disk format (LOG_FORMAT.md)
// ---------------------------------------------------------------------------

/// Format version written in every segment and metadata file header.
/// 2: a client request's session carries `opens` (issue 15); a version-1
/// log is refused by name rather than decoded wrongly.
pub const LOG_FORMAT_VERSION: u32 = 2;

/// Magic number opening every segment file.
pub const SEGMENT_MAGIC: [u8; 8] = *b"RCLOGSEG";
/// Segment header: magic (8) | format version u32 LE (4) | first index u64 LE
/// (8) | crc32 of the preceding 20 bytes u32 LE (4).
pub const SEGMENT_HEADER_BYTES: u64 = 24;
/// Offset of the format version in the segment header.
pub const SEGMENT_HEADER_VERSION_OFFSET: usize = 8;
/// Offset of the first index in the segment header.
pub const SEGMENT_HEADER_FIRST_INDEX_OFFSET: usize = 12;
/// Offset of the header checksum in the segment header.
pub const SEGMENT_HEADER_CRC_OFFSET: usize = 20;

/// Record header: crc32 u32 LE (4) over every following byte of the record
/// (header rest + body) | body length u32 LE (4) | log index u64 LE (8).
pub const RECORD_HEADER_BYTES: u64 = 16;
/// Offset of the body length in a record.
pub const RECORD_BODY_LEN_OFFSET: usize = 4;
/// Offset of the log index in a record.
pub const RECORD_INDEX_OFFSET: usize = 8;
/// Record body: log id length u16 LE (2) | log id (codec) | entry (codec).
pub const RECORD_LOG_ID_LEN_BYTES: usize = 2;

/// Magic number opening every metadata file.
pub const META_MAGIC: [u8; 8] = *b"RCLOGMET";
/// Metadata header: magic (8) | format version u32 LE (4) | kind u32 LE (4) |
/// payload length u32 LE (4); then the payload (codec), then a crc32 u32 LE
/// (4) of every preceding byte of the file.
pub const META_HEADER_BYTES: usize = 20;
/// Length of the metadata trailer (the crc32).
pub const META_TRAILER_BYTES: usize = 4;
/// Metadata kind: the vote (`openraft::Vote`: term, voted-for node, committed flag).
pub const META_KIND_VOTE: u32 = 1;
/// Metadata kind: the committed log id (`Option<openraft::LogId>`).
pub const META_KIND_COMMITTED: u32 = 2;
/// Metadata kind: the purge point (`openraft::LogId`).
pub const META_KIND_PURGED: u32 = 3;

/// File holding the vote.
pub const VOTE_FILE: &str = "vote.meta";
/// File holding the committed log id.
pub const COMMITTED_FILE: &str = "committed.meta";
/// File holding the purge point.
pub const PURGED_FILE: &str = "purged.meta";
/// Suffix of a metadata file being written (deleted at open).
pub const TMP_SUFFIX: &str = ".tmp";
/// Segment names: `log-` + first index as 20 decimal digits + `.seg`.
pub const SEGMENT_PREFIX: &str = "log-";
/// See [`SEGMENT_PREFIX`].
pub const SEGMENT_SUFFIX: &str = ".seg";

/// The file name of the segment whose first entry has `first_index`.
pub fn segment_name(first_index: u64) -> String {
    format!("{SEGMENT_PREFIX}{first_index:020}{SEGMENT_SUFFIX}")
}

fn parse_segment_name(name: &str) -> Option<u64> {
    let digits = name
        .strip_prefix(SEGMENT_PREFIX)?
        .strip_suffix(SEGMENT_SUFFIX)?;
    if digits.len() != 20 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

fn segment_header(first_index: u64) -> Vec<u8> {
    let mut header = Vec::with_capacity(SEGMENT_HEADER_BYTES as usize);
    header.extend_from_slice(&SEGMENT_MAGIC);
    header.extend_from_slice(&LOG_FORMAT_VERSION.to_le_bytes());
    header.extend_from_slice(&first_index.to_le_bytes());
    let crc = crc32fast::hash(&header);
    header.extend_from_slice(&crc.to_le_bytes());
    header
}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(bytes: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"))
}

/// Appends one record to `buf`.
fn encode_record(buf: &mut Vec<u8>, index: u64, log_id: &[u8], entry: &[u8]) {
    let body_len = RECORD_LOG_ID_LEN_BYTES + log_id.len() + entry.len();
    let start = buf.len();
    buf.extend_from_slice(&[0; 4]);
    buf.extend_from_slice(&(body_len as u32).to_le_bytes());
    buf.extend_from_slice(&index.to_le_bytes());
    buf.extend_from_slice(&(log_id.len() as u16).to_le_bytes());
    buf.extend_from_slice(log_id);
    buf.extend_from_slice(entry);
    let crc = crc32fast::hash(&buf[start + 4..]);
    buf[start..start + 4].copy_from_slice(&crc.to_le_bytes());
}

/// A record found valid at some offset.
struct RecordView {
    /// Total length (header + body).
    len: usize,
    index: u64,
    /// The encoded log id, relative to the record start.
    log_id: std::ops::Range<usize>,
    /// The encoded entry, relative to the record start.
    entry: std::ops::Range<usize>,
}

/// Why a record is bad: `torn` if it may be the cut-off end of an unsynced
/// write (short, checksum mismatch), otherwise it is damage whatever follows.
struct BadRecord {
    reason: String,
    torn: bool,
}

/// Validates the record starting at `bytes[0]` (a slice to the end of the data).
fn parse_record(bytes: &[u8]) -> Result<RecordView, BadRecord> {
    let torn = |reason: String| BadRecord { reason, torn: true };
    let header = RECORD_HEADER_BYTES as usize;
    if bytes.len() < header {
        return Err(torn(format!(
            "truncated record header ({} of {header} bytes)",
            bytes.len()
        )));
    }
    let body_len = u32_at(bytes, RECORD_BODY_LEN_OFFSET) as usize;
    if body_len > LOG_ENTRY_SIZE_BYTES_MAX {
        return Err(torn(format!(
            "record body length {body_len} exceeds LOG_ENTRY_SIZE_BYTES_MAX ({LOG_ENTRY_SIZE_BYTES_MAX} bytes)"
        )));
    }
    if bytes.len() < header + body_len {
        return Err(torn(format!(
            "truncated record body ({} of {body_len} bytes)",
            bytes.len() - header
        )));
    }
    let stored = u32_at(bytes, 0);
    let actual = crc32fast::hash(&bytes[4..header + body_len]);
    if stored != actual {
        return Err(torn(format!(
            "record checksum mismatch (stored {stored:#010x}, computed {actual:#010x})"
        )));
    }
    let index = u64_at(bytes, RECORD_INDEX_OFFSET);
    if body_len < RECORD_LOG_ID_LEN_BYTES {
        return Err(BadRecord {
            reason: format!("record body of {body_len} bytes has no log id length"),
            torn: false,
        });
    }
    let log_id_len = u16::from_le_bytes([bytes[header], bytes[header + 1]]) as usize;
    let log_id_start = header + RECORD_LOG_ID_LEN_BYTES;
    if RECORD_LOG_ID_LEN_BYTES + log_id_len > body_len {
        return Err(BadRecord {
            reason: format!(
                "record log id length {log_id_len} exceeds its body ({body_len} bytes)"
            ),
            torn: false,
        });
    }
    Ok(RecordView {
        len: header + body_len,
        index,
        log_id: log_id_start..log_id_start + log_id_len,
        entry: log_id_start + log_id_len..header + body_len,
    })
}

/// Whether a checksum-valid record with index at least `min_index` starts
/// anywhere after `from` in `bytes`: if so, a bad record at `from` is not a
/// torn tail but damage in the middle.
fn valid_record_after(bytes: &[u8], from: usize, min_index: u64) -> bool {
    let header = RECORD_HEADER_BYTES as usize;
    let mut at = from + 1;
    while at + header <= bytes.len() {
        let index = u64_at(bytes, at + RECORD_INDEX_OFFSET);
        let body_len = u32_at(bytes, at + RECORD_BODY_LEN_OFFSET) as usize;
        // A record after `from` has an index in [min_index, min_index + records
        // that fit): random bytes almost never pass this, so the checksum runs
        // rarely.
        let fit =
            (bytes.len() - at) as u64 / (RECORD_HEADER_BYTES + RECORD_LOG_ID_LEN_BYTES as u64);
        if index >= min_index
            && index - min_index <= fit
            && body_len <= LOG_ENTRY_SIZE_BYTES_MAX
            && at + header + body_len <= bytes.len()
            && crc32fast::hash(&bytes[at + 4..at + header + body_len]) == u32_at(bytes, at)
        {
            return true;
        }
        at += 1;
    }
    false
}

fn encode_meta(kind: u32, payload: &[u8]) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(META_HEADER_BYTES + payload.len() + META_TRAILER_BYTES);
    bytes.extend_from_slice(&META_MAGIC);
    bytes.extend_from_slice(&LOG_FORMAT_VERSION.to_le_bytes());
    bytes.extend_from_slice(&kind.to_le_bytes());
    bytes.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    bytes.extend_from_slice(payload);
    let crc = crc32fast::hash(&bytes);
    bytes.extend_from_slice(&crc.to_le_bytes());
    bytes
}

fn decode_meta<'a>(path: &Path, bytes: &'a [u8], kind: u32) -> Result<&'a [u8], LogError> {
    let corrupt = |offset: u64, reason: String| LogError::Corrupt {
        path: path.to_path_buf(),
        offset,
        reason,
    };
    if bytes.len() < META_HEADER_BYTES + META_TRAILER_BYTES {
        return Err(corrupt(
            0,
            format!(
                "metadata file of {} bytes is shorter than its framing",
                bytes.len()
            ),
        ));
    }
    if bytes[..8] != META_MAGIC {
        return Err(corrupt(0, "bad magic number".into()));
    }
    let version = u32_at(bytes, 8);
    if version != LOG_FORMAT_VERSION {
        return Err(corrupt(
            8,
            format!("format version {version}, this build reads {LOG_FORMAT_VERSION}"),
        ));
    }
    let payload_len = u32_at(bytes, 16) as usize;
    if META_HEADER_BYTES + payload_len + META_TRAILER_BYTES != bytes.len() {
        return Err(corrupt(
            16,
            format!(
                "payload length {payload_len} does not match the file length {}",
                bytes.len()
            ),
        ));
    }
    let crc_at = bytes.len() - META_TRAILER_BYTES;
    if crc32fast::hash(&bytes[..crc_at]) != u32_at(bytes, crc_at) {
        return Err(corrupt(crc_at as u64, "checksum mismatch".into()));
    }
    let found = u32_at(bytes, 12);
    if found != kind {
        return Err(corrupt(
            12,
            format!("metadata kind {found}, expected {kind}"),
        ));
    }
    Ok(&bytes[META_HEADER_BYTES..crc_at])
}

// ---------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------

/// What went wrong in the log store. Converted to openraft's
/// [`StorageError`] at the trait boundary (openraft then stops the node).
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    /// A file operation failed.
    #[error("raft log: {op} {}: {source}", path.display())]
    Io {
        /// The operation (`write`, `fsync`, `rename`, ...).
        op: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The error from the file system.
        #[source]
        source: io::Error,
    },
    /// The data on disk is damaged (or from an incompatible format).
    #[error("raft log corrupt: {} at offset {offset}: {reason}", path.display())]
    Corrupt {
        /// The damaged file.
        path: PathBuf,
        /// Byte offset of the damaged record or field.
        offset: u64,
        /// What is wrong.
        reason: String,
    },
    /// An earlier write or fsync failed; the store refuses further writes.
    #[error(
        "raft log is poisoned by an earlier write/fsync failure ({cause}); it refuses further \
         writes until the node restarts and recovers from the durable state"
    )]
    Poisoned {
        /// The failure that poisoned the store.
        cause: String,
    },
    /// An entry is too large to store.
    #[error(
        "raft log entry {index} encodes to {size} bytes, above LOG_ENTRY_SIZE_BYTES_MAX ({max} bytes)"
    )]
    EntryTooLarge {
        /// Its log index.
        index: u64,
        /// Its encoded size (log id + entry + framing) in bytes.
        size: usize,
        /// The limit in bytes.
        max: usize,
    },
    /// Appended entries do not continue the log.
    #[error("raft log append out of order: expected index {expected}, got {got}")]
    NotContiguous {
        /// The next index of the log.
        expected: u64,
        /// The first index of the batch.
        got: u64,
    },
    /// The writer thread is gone (the store is shutting down, or it panicked).
    #[error("raft log writer thread is gone")]
    WriterGone,
}

impl LogError {
    fn io(op: &'static str, path: &Path, source: io::Error) -> LogError {
        LogError::Io {
            op,
            path: path.to_path_buf(),
            source,
        }
    }
}

fn write_logs_err<C: RaftTypeConfig>(err: LogError) -> StorageError<C::NodeId> {
    StorageIOError::write_logs(&err).into()
}

fn read_logs_err<C: RaftTypeConfig>(err: LogError) -> StorageError<C::NodeId> {
    StorageIOError::read_logs(&err).into()
}

fn write_vote_err<C: RaftTypeConfig>(err: LogError) -> StorageError<C::NodeId> {
    StorageIOError::write_vote(&err).into()
}

// ---------------------------------------------------------------------------
// Options
// ---------------------------------------------------------------------------

/// Tunables of a [`LogStore`]; the defaults are the named constants.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LogStoreOptions {
    /// Segment rotation size in bytes ([`LOG_SEGMENT_SIZE_BYTES`]).
    pub segment_size_bytes: u64,
    /// Bytes of fsynced entry payloads kept in memory ([`LOG_CACHE_BYTES_MAX`]).
    pub cache_bytes_max: usize,
    /// Whether `save_committed` makes the committed log id durable (default
    /// `false`). openraft 0.9 calls it every time the commit index moves,
    /// awaited on the Raft core's path before the apply, so persisting it
    /// costs a file fsync and a directory fsync per commit (half of a
    /// one-client put's latency). With `false` it is kept in memory only:
    /// after a restart openraft takes the state machine's applied id and
    /// learns the rest from the leader. That is safe only because [`LogStore::open`]
    /// never hands back a committed vote (see there), so a member that led
    /// before a restart must win a new election, with a fresh no-op entry,
    /// before it serves a linearizable read.
    pub persist_committed: bool,
}

/// Called with the duration of every fsync that covers appended entries
/// (success or failure), on the writer thread: it must be quick. The node
/// feeds it to its metrics; the store itself knows nothing of them.
pub type FsyncObserver = Arc<dyn Fn(Duration) + Send + Sync>;

impl Default for LogStoreOptions {
    fn default() -> Self {
        LogStoreOptions {
            segment_size_bytes: LOG_SEGMENT_SIZE_BYTES,
            cache_bytes_max: LOG_CACHE_BYTES_MAX,
            persist_committed: false,
        }
    }
}

// ---------------------------------------------------------------------------
// Poisoning
// ---------------------------------------------------------------------------

#[derive(Debug, Default)]
struct Poison(Mutex<Option<String>>);

impl Poison {
    fn check(&self) -> Result<(), LogError> {
        match &*lock(&self.0) {
            None => Ok(()),
            Some(cause) => Err(LogError::Poisoned {
                cause: cause.clone(),
            }),
        }
    }

    fn set(&self, err: &LogError) {
        let mut cause = lock(&self.0);
        if cause.is_none() {
            tracing::error!(error = %err, "raft log poisoned: refusing further writes");
            *cause = Some(err.to_string());
        }
    }
}

/// The vote as [`LogStore::open`] hands it to openraft: never committed.
///
/// openraft 0.9 restarts a member whose stored vote is committed and its own
/// as the leader at once, without an election, reusing the first entry of
/// its old term as its no-op. Its linearizable read index is then the
/// committed log id it recovered, and that id is not durable (see
/// [`LogStoreOptions::persist_committed`]): after a power cut it falls back
/// to the state machine's applied id, which can be below acknowledged
/// writes. Opened uncommitted, the vote keeps its term and candidate (so
/// this member can never vote twice in a term), but a former leader starts
/// as a follower and must win a new term with a fresh no-op entry, whose
/// commit covers every earlier entry, before it serves a read. A follower
/// whose vote named another leader commits it again on that leader's next
/// message.
fn uncommitted<NID: openraft::NodeId>(mut vote: Vote<NID>) -> Vote<NID> {
    vote.committed = false;
    vote
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

// ---------------------------------------------------------------------------
// The writer thread
// ---------------------------------------------------------------------------

type Reply<T> = oneshot::Sender<Result<T, LogError>>;

struct AppendJob {
    file: Arc<dyn VfsFile>,
    path: Arc<Path>,
    offset: u64,
    bytes: Vec<u8>,
    /// Called after the fsync covering this batch (or with the failure).
    done: Box<dyn FnOnce(Result<(), LogError>) + Send>,
}

enum Command {
    Append(AppendJob),
    /// Calls `done` once every earlier command is done (an empty append).
    Barrier {
        done: Box<dyn FnOnce(Result<(), LogError>) + Send>,
    },
    /// Create a segment: create, header, fsync, directory fsync.
    Create {
        path: PathBuf,
        first_index: u64,
        reply: Reply<Arc<dyn VfsFile>>,
    },
    /// Replace a metadata file atomically.
    SaveMeta {
        name: &'static str,
        bytes: Vec<u8>,
        reply: Reply<()>,
    },
    /// Delete whole segments (highest first, each durable before the next),
    /// then cut one segment and fsync it.
    Truncate {
        remove: Vec<Arc<Path>>,
        cut: Option<(Arc<dyn VfsFile>, Arc<Path>, u64)>,
        reply: Reply<()>,
    },
    /// Save the purge point, then delete segments wholly below it (lowest first).
    Purge {
        meta: Vec<u8>,
        remove: Vec<Arc<Path>>,
        reply: Reply<()>,
    },
}

struct Writer {
    vfs: Arc<dyn Vfs>,
    dir: PathBuf,
    poison: Arc<Poison>,
    fsync_observer: Option<FsyncObserver>,
}

impl Writer {
    fn run(self, rx: mpsc::Receiver<Command>) {
        let mut next: Option<Command> = None;
        loop {
            let command = match next.take() {
                Some(command) => command,
                None => match rx.recv() {
                    Ok(command) => command,
                    Err(_) => return,
                },
            };
            match command {
                Command::Append(first) => {
                    let mut group = vec![first];
                    while group.len() < GROUP_COMMIT_BATCHES_MAX {
                        match rx.try_recv() {
                            Ok(Command::Append(job)) if job.path == group[0].path => {
                                group.push(job)
                            }
                            Ok(other) => {
                                next = Some(other);
                                break;
                            }
                            Err(_) => break,
                        }
                    }
                    let result = self.guarded(|| self.write_group(&group));
                    for job in group {
                        let outcome = match &result {
                            Ok(()) => Ok(()),
                            Err(LogError::Poisoned { cause }) => Err(LogError::Poisoned {
                                cause: cause.clone(),
                            }),
                            Err(err) => Err(LogError::Poisoned {
                                cause: err.to_string(),
                            }),
                        };
                        (job.done)(outcome);
                    }
                }
                Command::Barrier { done } => done(self.poison.check()),
                Command::Create {
                    path,
                    first_index,
                    reply,
                } => {
                    let result = self.guarded(|| self.create_segment(&path, first_index));
                    let _ = reply.send(result);
                }
                Command::SaveMeta { name, bytes, reply } => {
                    let result = self.guarded(|| self.save_meta(name, &bytes));
                    let _ = reply.send(result);
                }
                Command::Truncate { remove, cut, reply } => {
                    let result = self.guarded(|| {
                        for path in &remove {
                            self.remove_durably(path)?;
                        }
                        if let Some((file, path, len)) = &cut {
                            file.truncate(*len)
                                .map_err(|e| LogError::io("truncate", path, e))?;
                            file.sync().map_err(|e| LogError::io("fsync", path, e))?;
                        }
                        Ok(())
                    });
                    let _ = reply.send(result);
                }
                Command::Purge {
                    meta,
                    remove,
                    reply,
                } => {
                    let result = self.guarded(|| {
                        self.save_meta(PURGED_FILE, &meta)?;
                        for path in &remove {
                            self.remove_durably(path)?;
                        }
                        Ok(())
                    });
                    let _ = reply.send(result);
                }
            }
        }
    }

    /// Runs a write operation unless poisoned; a failure poisons.
    fn guarded<T>(&self, op: impl FnOnce() -> Result<T, LogError>) -> Result<T, LogError> {
        self.poison.check()?;
        op().inspect_err(|err| self.poison.set(err))
    }

    fn write_group(&self, group: &[AppendJob]) -> Result<(), LogError> {
        let mut wrote = false;
        for job in group {
            if job.bytes.is_empty() {
                continue;
            }
            job.file
                .write_all_at(&job.bytes, job.offset)
                .map_err(|e| LogError::io("write", &job.path, e))?;
            wrote = true;
        }
        // NEGATIVE CONTROL (feature nc-skip-log-fsync): appended entries are
        // never fsynced (lost at a power cut; only the lazy disk shows it).
        #[cfg(feature = "nc-skip-log-fsync")]
        let wrote = {
            let _ = wrote;
            false
        };
        if wrote {
            // One fsync for the whole group; never retried on failure.
            let started = Instant::now();
            let synced = group[0].file.sync();
            if let Some(observe) = &self.fsync_observer {
                observe(started.elapsed());
            }
            synced.map_err(|e| LogError::io("fsync", &group[0].path, e))?;
        }
        Ok(())
    }

    fn create_segment(&self, path: &Path, first_index: u64) -> Result<Arc<dyn VfsFile>, LogError> {
        let file = self
            .vfs
            .create(path)
            .map_err(|e| LogError::io("create", path, e))?;
        file.write_all_at(&segment_header(first_index), 0)
            .map_err(|e| LogError::io("write", path, e))?;
        file.sync().map_err(|e| LogError::io("fsync", path, e))?;
        self.sync_dir()?;
        tracing::debug!(segment = %path.display(), "raft log segment created");
        Ok(file)
    }

    fn save_meta(&self, name: &str, bytes: &[u8]) -> Result<(), LogError> {
        let path = self.dir.join(name);
        let tmp = self.dir.join(format!("{name}{TMP_SUFFIX}"));
        let file = self
            .vfs
            .create(&tmp)
            .map_err(|e| LogError::io("create", &tmp, e))?;
        file.write_all_at(bytes, 0)
            .map_err(|e| LogError::io("write", &tmp, e))?;
        file.sync().map_err(|e| LogError::io("fsync", &tmp, e))?;
        self.vfs
            .rename(&tmp, &path)
            .map_err(|e| LogError::io("rename", &tmp, e))?;
        // NEGATIVE CONTROL (feature nc-rename-no-dir-fsync): the rename is
        // not made durable (no directory fsync), so a power cut can undo it
        // and bring back the previous vote or purge point (only the lazy
        // disk shows it).
        if cfg!(feature = "nc-rename-no-dir-fsync") {
            return Ok(());
        }
        self.sync_dir()
    }

    fn remove_durably(&self, path: &Path) -> Result<(), LogError> {
        self.vfs
            .remove(path)
            .map_err(|e| LogError::io("remove", path, e))?;
        self.sync_dir()
    }

    fn sync_dir(&self) -> Result<(), LogError> {
        self.vfs
            .sync_dir(&self.dir)
            .map_err(|e| LogError::io("fsync directory", &self.dir, e))
    }
}

// ---------------------------------------------------------------------------
// In-memory state
// ---------------------------------------------------------------------------

#[derive(Debug)]
struct Segment {
    path: Arc<Path>,
    file: Arc<dyn VfsFile>,
    /// Logical length: every byte written or queued for writing.
    len: u64,
}

#[derive(Debug)]
struct Slot<C: RaftTypeConfig> {
    log_id: LogId<C::NodeId>,
    /// Key (first index) of the segment holding the record.
    segment: u64,
    offset: u64,
    len: u32,
    /// An fsync covers the record.
    durable: bool,
    /// The encoded entry, while cached.
    cached: Option<Arc<[u8]>>,
}

#[derive(Debug)]
struct State<C: RaftTypeConfig> {
    segments: BTreeMap<u64, Segment>,
    /// Log index of `slots[0]` (or of the next entry when `slots` is empty).
    first: u64,
    /// One per live entry, in index order.
    slots: VecDeque<Slot<C>>,
    last_purged: Option<LogId<C::NodeId>>,
    vote: Option<Vote<C::NodeId>>,
    committed: Option<LogId<C::NodeId>>,
    cache_bytes: usize,
    /// Slots below this index hold no cached payload.
    evict_from: u64,
}

impl<C: RaftTypeConfig> State<C> {
    fn next_index(&self) -> u64 {
        self.first + self.slots.len() as u64
    }

    fn slot(&self, index: u64) -> Option<&Slot<C>> {
        let at = index.checked_sub(self.first)?;
        self.slots.get(usize::try_from(at).ok()?)
    }

    fn slot_mut(&mut self, index: u64) -> Option<&mut Slot<C>> {
        let at = index.checked_sub(self.first)?;
        self.slots.get_mut(usize::try_from(at).ok()?)
    }

    fn last_log_id(&self) -> Option<LogId<C::NodeId>> {
        match self.slots.back() {
            Some(slot) => Some(slot.log_id.clone()),
            None => self.last_purged.clone(),
        }
    }

    fn forget(&mut self, slot: Slot<C>) {
        if let Some(bytes) = slot.cached {
            self.cache_bytes -= bytes.len();
        }
    }

    fn evict(&mut self, max: usize) {
        while self.cache_bytes > max {
            let from = self.evict_from;
            let Some(slot) = self.slot_mut(from) else {
                break;
            };
            if !slot.durable {
                break;
            }
            let freed = slot.cached.take().map_or(0, |bytes| bytes.len());
            self.cache_bytes -= freed;
            self.evict_from += 1;
        }
    }
}

struct Shared<C: RaftTypeConfig> {
    dir: PathBuf,
    options: LogStoreOptions,
    state: Mutex<State<C>>,
}

impl<C: RaftTypeConfig> Debug for Shared<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = lock(&self.state);
        f.debug_struct("LogStore")
            .field("dir", &self.dir)
            .field("segments", &state.segments.len())
            .field("first", &state.first)
            .field("next", &state.next_index())
            .field("last_purged", &state.last_purged)
            .field("cache_bytes", &state.cache_bytes)
            .finish()
    }
}

/// Where to get one entry's bytes.
enum Source {
    /// The encoded entry, and where its record is on disk (for errors).
    Cached(Arc<[u8]>, Arc<Path>, u64),
    File {
        file: Arc<dyn VfsFile>,
        path: Arc<Path>,
        offset: u64,
        len: u32,
        index: u64,
    },
}

/// Reads one record and returns its encoded entry.
fn read_record(
    file: &dyn VfsFile,
    path: &Path,
    offset: u64,
    len: u32,
    index: u64,
) -> Result<Vec<u8>, LogError> {
    let mut bytes = vec![0u8; len as usize];
    file.read_exact_at(&mut bytes, offset)
        .map_err(|e| LogError::io("read", path, e))?;
    let corrupt = |reason: String| LogError::Corrupt {
        path: path.to_path_buf(),
        offset,
        reason,
    };
    let record = parse_record(&bytes).map_err(|bad| corrupt(bad.reason))?;
    if record.len != bytes.len() || record.index != index {
        return Err(corrupt(format!(
            "record is index {} of {} bytes where the index expects index {index} of {len} bytes",
            record.index, record.len
        )));
    }
    Ok(bytes[record.entry].to_vec())
}

impl<C: RaftTypeConfig> Shared<C> {
    fn mark_durable(&self, first: u64, count: u64) {
        let mut state = lock(&self.state);
        for index in first..first + count {
            if let Some(slot) = state.slot_mut(index) {
                slot.durable = true;
            }
        }
        state.evict(self.options.cache_bytes_max);
    }

    async fn read_entries<RB: RangeBounds<u64>>(
        &self,
        range: RB,
    ) -> Result<Vec<C::Entry>, StorageError<C::NodeId>> {
        let sources = self.sources(range).map_err(read_logs_err::<C>)?;
        let all_cached = sources.iter().all(|s| matches!(s, Source::Cached(..)));
        let payloads = if all_cached {
            load(sources)
        } else {
            // Positioned reads of older entries: off the async runtime.
            tokio::task::spawn_blocking(move || load(sources))
                .await
                .map_err(|join| {
                    read_logs_err::<C>(LogError::io("read", &self.dir, io::Error::other(join)))
                })?
        }
        .map_err(read_logs_err::<C>)?;
        payloads
            .into_iter()
            .map(|(bytes, path, offset)| {
                codec::decode::<C::Entry>(&bytes).map_err(|err| LogError::Corrupt {
                    path: path.to_path_buf(),
                    offset,
                    reason: format!("log entry does not decode: {err}"),
                })
            })
            .collect::<Result<Vec<_>, LogError>>()
            .map_err(read_logs_err::<C>)
    }

    /// Where each entry of `range` is (memory or file), under the lock.
    fn sources<RB: RangeBounds<u64>>(&self, range: RB) -> Result<Vec<Source>, LogError> {
        let state = lock(&self.state);
        let start = match range.start_bound() {
            Bound::Included(&i) => i,
            Bound::Excluded(&i) => i.saturating_add(1),
            Bound::Unbounded => 0,
        }
        .max(state.first);
        let end = match range.end_bound() {
            Bound::Included(&i) => i.saturating_add(1),
            Bound::Excluded(&i) => i,
            Bound::Unbounded => u64::MAX,
        }
        .min(state.next_index());
        let mut sources = Vec::with_capacity(end.saturating_sub(start) as usize);
        for index in start..end.max(start) {
            let Some(slot) = state.slot(index) else {
                break;
            };
            let Some(segment) = state.segments.get(&slot.segment) else {
                return Err(LogError::Corrupt {
                    path: self.dir.join(segment_name(slot.segment)),
                    offset: slot.offset,
                    reason: format!("entry {index} points at a segment that is gone"),
                });
            };
            sources.push(match &slot.cached {
                Some(bytes) => Source::Cached(bytes.clone(), segment.path.clone(), slot.offset),
                None => Source::File {
                    file: segment.file.clone(),
                    path: segment.path.clone(),
                    offset: slot.offset,
                    len: slot.len,
                    index,
                },
            });
        }
        Ok(sources)
    }
}

/// An encoded entry and where its record is (for errors).
type Loaded = (Arc<[u8]>, Arc<Path>, u64);

/// Fetches the encoded entries: from memory, or with one positioned read and
/// a checksum check per record.
fn load(sources: Vec<Source>) -> Result<Vec<Loaded>, LogError> {
    sources
        .into_iter()
        .map(|source| match source {
            Source::Cached(bytes, path, offset) => Ok((bytes, path, offset)),
            Source::File {
                file,
                path,
                offset,
                len,
                index,
            } => {
                let bytes = read_record(&*file, &path, offset, len, index)?;
                Ok((Arc::from(bytes), path, offset))
            }
        })
        .collect()
}

// ---------------------------------------------------------------------------
// The store
// ---------------------------------------------------------------------------

/// The Raft log store of one node (see the module docs).
///
/// Dropping it stops the writer thread after the queued writes are done.
pub struct LogStore<C: RaftTypeConfig> {
    shared: Arc<Shared<C>>,
    poison: Arc<Poison>,
    tx: Option<mpsc::Sender<Command>>,
    writer: Option<JoinHandle<()>>,
}

impl<C: RaftTypeConfig> Debug for LogStore<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.shared.fmt(f)
    }
}

/// A cheap, cloneable reader of the log, for openraft's replication tasks.
pub struct LogReader<C: RaftTypeConfig> {
    shared: Arc<Shared<C>>,
}

impl<C: RaftTypeConfig> Clone for LogReader<C> {
    fn clone(&self) -> Self {
        LogReader {
            shared: self.shared.clone(),
        }
    }
}

impl<C: RaftTypeConfig> Debug for LogReader<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.shared.fmt(f)
    }
}

impl<C: RaftTypeConfig> Drop for LogStore<C> {
    fn drop(&mut self) {
        drop(self.tx.take());
        if let Some(writer) = self.writer.take() {
            let _ = writer.join();
        }
    }
}

fn decode_payload<T: serde::de::DeserializeOwned>(
    dir: &Path,
    name: &str,
    payload: &[u8],
) -> Result<T, LogError> {
    codec::decode(payload).map_err(|err| LogError::Corrupt {
        path: dir.join(name),
        offset: META_HEADER_BYTES as u64,
        reason: format!("payload does not decode: {err}"),
    })
}

fn read_whole(file: &dyn VfsFile, path: &Path) -> Result<Vec<u8>, LogError> {
    let len = file.len().map_err(|e| LogError::io("stat", path, e))?;
    let mut bytes = vec![0u8; len as usize];
    file.read_exact_at(&mut bytes, 0)
        .map_err(|e| LogError::io("read", path, e))?;
    Ok(bytes)
}

impl<C: RaftTypeConfig> LogStore<C> {
    /// Opens (creating if needed) the log in `dir` with the default options.
    /// Blocking: it reads and repairs the files (see the module docs); call
    /// it before starting Raft or from `spawn_blocking`.
    pub fn open(vfs: Arc<dyn Vfs>, dir: impl Into<PathBuf>) -> Result<Self, LogError> {
        Self::open_with(vfs, dir, LogStoreOptions::default())
    }

    /// [`LogStore::open`] with explicit options.
    pub fn open_with(
        vfs: Arc<dyn Vfs>,
        dir: impl Into<PathBuf>,
        options: LogStoreOptions,
    ) -> Result<Self, LogError> {
        Self::open_observed(vfs, dir, options, None)
    }

    /// [`LogStore::open_with`], calling `fsync_observer` with the duration
    /// of every fsync that covers appended entries.
    pub fn open_observed(
        vfs: Arc<dyn Vfs>,
        dir: impl Into<PathBuf>,
        options: LogStoreOptions,
        fsync_observer: Option<FsyncObserver>,
    ) -> Result<Self, LogError> {
        let dir = dir.into();
        let state = Self::recover(&*vfs, &dir)?;
        tracing::info!(
            dir = %dir.display(),
            segments = state.segments.len(),
            first = state.first,
            next = state.next_index(),
            "raft log opened"
        );
        let shared = Arc::new(Shared {
            dir: dir.clone(),
            options,
            state: Mutex::new(state),
        });
        let poison = Arc::new(Poison::default());
        let (tx, rx) = mpsc::channel();
        let writer = Writer {
            vfs,
            dir,
            poison: poison.clone(),
            fsync_observer,
        };
        let writer = std::thread::Builder::new()
            .name("raft-log-writer".into())
            .spawn(move || writer.run(rx))
            .map_err(|e| LogError::io("spawn writer thread for", &shared.dir, e))?;
        Ok(LogStore {
            shared,
            poison,
            tx: Some(tx),
            writer: Some(writer),
        })
    }

    /// The directory of the log.
    pub fn dir(&self) -> &Path {
        &self.shared.dir
    }

    fn recover(vfs: &dyn Vfs, dir: &Path) -> Result<State<C>, LogError> {
        vfs.create_dir_all(dir)
            .map_err(|e| LogError::io("create directory", dir, e))?;
        if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
            // The directory's own name must be durable before anything in it.
            vfs.sync_dir(parent)
                .map_err(|e| LogError::io("fsync directory", parent, e))?;
        }
        let sync_dir = || {
            vfs.sync_dir(dir)
                .map_err(|e| LogError::io("fsync directory", dir, e))
        };
        let remove = |path: &Path| -> Result<(), LogError> {
            vfs.remove(path)
                .map_err(|e| LogError::io("remove", path, e))?;
            sync_dir()
        };
        let names = vfs.list(dir).map_err(|e| LogError::io("list", dir, e))?;

        // 1. Half-written metadata files.
        for name in names.iter().filter(|n| n.ends_with(TMP_SUFFIX)) {
            remove(&dir.join(name))?;
        }

        // 2. Metadata.
        let read_meta = |name: &str, kind: u32| -> Result<Option<Vec<u8>>, LogError> {
            if !names.iter().any(|n| n == name) {
                return Ok(None);
            }
            let path = dir.join(name);
            let file = vfs
                .open(&path)
                .map_err(|e| LogError::io("open", &path, e))?;
            let len = file.len().map_err(|e| LogError::io("stat", &path, e))?;
            if len > META_FILE_BYTES_MAX {
                return Err(LogError::Corrupt {
                    path,
                    offset: 0,
                    reason: format!(
                        "metadata file of {len} bytes exceeds META_FILE_BYTES_MAX ({META_FILE_BYTES_MAX} bytes)"
                    ),
                });
            }
            let bytes = read_whole(&*file, &path)?;
            let payload = decode_meta(&path, &bytes, kind)?;
            Ok(Some(payload.to_vec()))
        };
        let vote: Option<Vote<C::NodeId>> = match read_meta(VOTE_FILE, META_KIND_VOTE)? {
            Some(payload) => Some(uncommitted(decode_payload(dir, VOTE_FILE, &payload)?)),
            None => None,
        };
        let committed: Option<LogId<C::NodeId>> =
            match read_meta(COMMITTED_FILE, META_KIND_COMMITTED)? {
                Some(payload) => decode_payload(dir, COMMITTED_FILE, &payload)?,
                None => None,
            };
        let last_purged: Option<LogId<C::NodeId>> = match read_meta(PURGED_FILE, META_KIND_PURGED)?
        {
            Some(payload) => Some(decode_payload(dir, PURGED_FILE, &payload)?),
            None => None,
        };
        // Every index below this is purged.
        let live_from = last_purged.as_ref().map_or(0, |p| p.index + 1);

        // 3. Segments.
        let mut keys: Vec<u64> = names.iter().filter_map(|n| parse_segment_name(n)).collect();
        keys.sort_unstable();
        let mut segments = BTreeMap::new();
        let mut slots: VecDeque<Slot<C>> = VecDeque::new();
        let mut first_slot: Option<u64> = None;
        // The index the next segment must start with.
        let mut expected: Option<u64> = None;
        for (i, &key) in keys.iter().enumerate() {
            let path = dir.join(segment_name(key));
            let is_last = i + 1 == keys.len();
            if !is_last && last_purged.is_some() && keys[i + 1] <= live_from {
                // Wholly purged; left by an interrupted purge.
                remove(&path)?;
                continue;
            }
            let corrupt = |offset: u64, reason: String| LogError::Corrupt {
                path: path.clone(),
                offset,
                reason,
            };
            let file = vfs
                .open(&path)
                .map_err(|e| LogError::io("open", &path, e))?;
            let bytes = read_whole(&*file, &path)?;
            let header_len = SEGMENT_HEADER_BYTES as usize;
            if bytes.len() < header_len {
                if is_last {
                    // Created, then cut by a crash before its header was fsynced.
                    tracing::warn!(segment = %path.display(), "raft log: removing a segment with a torn header");
                    remove(&path)?;
                    continue;
                }
                return Err(corrupt(0, "segment shorter than its header".into()));
            }
            if bytes[..8] != SEGMENT_MAGIC {
                return Err(corrupt(0, "bad magic number".into()));
            }
            let version = u32_at(&bytes, SEGMENT_HEADER_VERSION_OFFSET);
            if version != LOG_FORMAT_VERSION {
                return Err(corrupt(
                    SEGMENT_HEADER_VERSION_OFFSET as u64,
                    format!("format version {version}, this build reads {LOG_FORMAT_VERSION}"),
                ));
            }
            if crc32fast::hash(&bytes[..SEGMENT_HEADER_CRC_OFFSET])
                != u32_at(&bytes, SEGMENT_HEADER_CRC_OFFSET)
            {
                return Err(corrupt(
                    SEGMENT_HEADER_CRC_OFFSET as u64,
                    "segment header checksum mismatch".into(),
                ));
            }
            let header_first = u64_at(&bytes, SEGMENT_HEADER_FIRST_INDEX_OFFSET);
            if header_first != key {
                return Err(corrupt(
                    SEGMENT_HEADER_FIRST_INDEX_OFFSET as u64,
                    format!("header says first index {header_first}, the name says {key}"),
                ));
            }
            match expected {
                Some(expected) if key != expected => {
                    return Err(corrupt(
                        0,
                        format!(
                            "segment starts at index {key} but the previous segment ends before index {expected}"
                        ),
                    ));
                }
                None if last_purged.is_some() && key > live_from => {
                    return Err(corrupt(
                        0,
                        format!(
                            "first segment starts at index {key} but the purge point is index {} (a hole)",
                            live_from - 1
                        ),
                    ));
                }
                _ => {}
            }
            let mut offset = header_len;
            let mut index = key;
            while offset < bytes.len() {
                let record = match parse_record(&bytes[offset..]) {
                    Ok(record) if record.index == index => record,
                    Ok(record) => {
                        return Err(corrupt(
                            offset as u64,
                            format!("record has index {}, expected {index}", record.index),
                        ));
                    }
                    Err(bad) => {
                        if is_last && bad.torn && !valid_record_after(&bytes, offset, index) {
                            tracing::warn!(
                                segment = %path.display(),
                                offset,
                                cut_bytes = bytes.len() - offset,
                                reason = %bad.reason,
                                "raft log: cutting a torn tail"
                            );
                            file.truncate(offset as u64)
                                .map_err(|e| LogError::io("truncate", &path, e))?;
                            file.sync().map_err(|e| LogError::io("fsync", &path, e))?;
                            break;
                        }
                        return Err(corrupt(offset as u64, bad.reason));
                    }
                };
                let at = &bytes[offset..];
                let log_id: LogId<C::NodeId> =
                    codec::decode(&at[record.log_id.clone()]).map_err(|err| {
                        corrupt(
                            offset as u64,
                            format!("record log id does not decode: {err}"),
                        )
                    })?;
                if log_id.index != index {
                    return Err(corrupt(
                        offset as u64,
                        format!("record log id {log_id} does not match its index {index}"),
                    ));
                }
                if index >= live_from {
                    first_slot.get_or_insert(index);
                    slots.push_back(Slot {
                        log_id,
                        segment: key,
                        offset: offset as u64,
                        len: record.len as u32,
                        durable: true,
                        cached: None,
                    });
                }
                offset += record.len;
                index += 1;
            }
            let wholly_purged = index <= live_from && last_purged.is_some();
            let empty_log = slots.is_empty() && last_purged.is_none();
            if is_last && (wholly_purged || (empty_log && offset == header_len)) {
                // Holds no live entry (only purged ones, or none at all): a
                // fresh segment is made for the next append.
                remove(&path)?;
                continue;
            }
            expected = Some(index);
            segments.insert(
                key,
                Segment {
                    path: path.as_path().into(),
                    file,
                    len: offset as u64,
                },
            );
        }
        let first = match (&last_purged, first_slot) {
            (Some(_), _) => live_from,
            (None, Some(first)) => first,
            (None, None) => 0,
        };
        Ok(State {
            segments,
            first,
            slots,
            last_purged,
            vote,
            committed,
            cache_bytes: 0,
            evict_from: first,
        })
    }

    fn send(&self, command: Command) -> Result<(), LogError> {
        self.tx
            .as_ref()
            .ok_or(LogError::WriterGone)?
            .send(command)
            .map_err(|_| LogError::WriterGone)
    }

    async fn request<T>(&self, make: impl FnOnce(Reply<T>) -> Command) -> Result<T, LogError> {
        let (reply, rx) = oneshot::channel();
        self.send(make(reply))?;
        rx.await.map_err(|_| LogError::WriterGone)?
    }

    async fn save_meta(
        &self,
        name: &'static str,
        kind: u32,
        payload: &[u8],
    ) -> Result<(), LogError> {
        self.poison.check()?;
        let bytes = encode_meta(kind, payload);
        self.request(|reply| Command::SaveMeta { name, bytes, reply })
            .await
    }

    async fn append_batch<I>(&mut self, entries: I, callback: LogFlushed<C>) -> Result<(), LogError>
    where
        I: IntoIterator<Item = C::Entry>,
    {
        self.poison.check()?;
        // Encode outside the lock.
        let mut encoded = Vec::new();
        let mut total = 0u64;
        for entry in entries {
            let log_id = entry.get_log_id().clone();
            let log_id_bytes = codec::encode(&log_id);
            let entry_bytes = codec::encode(&entry);
            let body = RECORD_LOG_ID_LEN_BYTES + log_id_bytes.len() + entry_bytes.len();
            if body > LOG_ENTRY_SIZE_BYTES_MAX {
                return Err(LogError::EntryTooLarge {
                    index: log_id.index,
                    size: body,
                    max: LOG_ENTRY_SIZE_BYTES_MAX,
                });
            }
            total += RECORD_HEADER_BYTES + body as u64;
            encoded.push((log_id, log_id_bytes, Arc::<[u8]>::from(entry_bytes)));
        }
        // Entries at or below the purge point are already covered by the
        // state machine; openraft never sends them in practice (its storage
        // test suite does, after its startup purge), so they are dropped.
        let purged_upto = lock(&self.shared.state)
            .last_purged
            .as_ref()
            .map(|p| p.index);
        if let Some(purged_upto) = purged_upto {
            let before = encoded.len();
            encoded.retain(|(log_id, _, _)| log_id.index > purged_upto);
            if encoded.len() != before {
                tracing::debug!(
                    dropped = before - encoded.len(),
                    purged_upto,
                    "raft log: dropping appended entries at or below the purge point"
                );
                total = encoded
                    .iter()
                    .map(|(_, id, entry)| {
                        RECORD_HEADER_BYTES
                            + (RECORD_LOG_ID_LEN_BYTES + id.len() + entry.len()) as u64
                    })
                    .sum();
            }
        }
        let Some((first_log_id, _, _)) = encoded.first() else {
            // Nothing to write, but the callback must still follow every
            // earlier write: it goes through the writer queue.
            return self.send(Command::Barrier {
                done: Box::new(move |result| {
                    callback.log_io_completed(result.map_err(io::Error::other));
                }),
            });
        };
        let first_index = first_log_id.index;

        // Continuity and rotation.
        let rotate = {
            let state = lock(&self.shared.state);
            let expected = if !state.slots.is_empty() {
                Some(state.next_index())
            } else {
                state.last_purged.as_ref().map(|p| p.index + 1)
            };
            if let Some(expected) = expected
                && expected != first_index
            {
                return Err(LogError::NotContiguous {
                    expected,
                    got: first_index,
                });
            }
            for (i, (log_id, _, _)) in encoded.iter().enumerate() {
                if log_id.index != first_index + i as u64 {
                    return Err(LogError::NotContiguous {
                        expected: first_index + i as u64,
                        got: log_id.index,
                    });
                }
            }
            match state.segments.iter().next_back() {
                None => true,
                Some((&key, segment)) => {
                    if segment.len <= SEGMENT_HEADER_BYTES {
                        if key != first_index {
                            return Err(LogError::NotContiguous {
                                expected: key,
                                got: first_index,
                            });
                        }
                        false
                    } else {
                        segment.len + total > self.shared.options.segment_size_bytes
                    }
                }
            }
        };
        if rotate {
            let path = self.shared.dir.join(segment_name(first_index));
            let file = self
                .request(|reply| Command::Create {
                    path: path.clone(),
                    first_index,
                    reply,
                })
                .await?;
            lock(&self.shared.state).segments.insert(
                first_index,
                Segment {
                    path: path.into(),
                    file,
                    len: SEGMENT_HEADER_BYTES,
                },
            );
        }

        // Lay the batch out; the entries are readable from memory at once.
        let count = encoded.len() as u64;
        let job = {
            let mut guard = lock(&self.shared.state);
            let state = &mut *guard;
            let (&key, segment) = state
                .segments
                .iter_mut()
                .next_back()
                .expect("a segment exists after rotation");
            let start = segment.len;
            let mut buf = Vec::with_capacity(total as usize);
            let mut added = 0usize;
            if state.slots.is_empty() {
                state.first = first_index;
                state.evict_from = first_index;
            }
            for (log_id, log_id_bytes, entry_bytes) in encoded {
                let offset = start + buf.len() as u64;
                encode_record(&mut buf, log_id.index, &log_id_bytes, &entry_bytes);
                let len = (start + buf.len() as u64 - offset) as u32;
                added += entry_bytes.len();
                state.slots.push_back(Slot {
                    log_id,
                    segment: key,
                    offset,
                    len,
                    durable: false,
                    cached: Some(entry_bytes),
                });
            }
            segment.len += buf.len() as u64;
            state.cache_bytes += added;
            let shared = self.shared.clone();
            AppendJob {
                file: segment.file.clone(),
                path: segment.path.clone(),
                offset: start,
                bytes: buf,
                done: Box::new(move |result| match result {
                    Ok(()) => {
                        shared.mark_durable(first_index, count);
                        callback.log_io_completed(Ok(()));
                    }
                    Err(err) => callback.log_io_completed(Err(io::Error::other(err))),
                }),
            }
        };
        self.send(Command::Append(job))
    }

    async fn truncate_from(&mut self, index: u64) -> Result<(), LogError> {
        self.poison.check()?;
        let command_parts = {
            let mut guard = lock(&self.shared.state);
            let state = &mut *guard;
            if index >= state.next_index() {
                return Ok(());
            }
            let index = index.max(state.first);
            let cut_at = state.slot(index).map(|slot| (slot.segment, slot.offset));
            while state.next_index() > index {
                let slot = state.slots.pop_back().expect("non-empty");
                state.forget(slot);
            }
            state.evict_from = state.evict_from.min(index);
            let doomed: Vec<u64> = state
                .segments
                .range(index..)
                .map(|(&k, _)| k)
                .rev()
                .collect();
            let mut remove = Vec::with_capacity(doomed.len());
            for key in doomed {
                let segment = state.segments.remove(&key).expect("listed");
                remove.push(segment.path);
            }
            let cut = match cut_at {
                Some((key, offset)) if key < index => {
                    let segment = state
                        .segments
                        .get_mut(&key)
                        .expect("the segment of a live slot exists");
                    segment.len = offset;
                    Some((segment.file.clone(), segment.path.clone(), offset))
                }
                _ => None,
            };
            (remove, cut)
        };
        let (remove, cut) = command_parts;
        self.request(|reply| Command::Truncate { remove, cut, reply })
            .await
    }

    async fn purge_upto(&mut self, log_id: LogId<C::NodeId>) -> Result<(), LogError> {
        self.poison.check()?;
        let (meta, remove) = {
            let mut guard = lock(&self.shared.state);
            let state = &mut *guard;
            if state
                .last_purged
                .as_ref()
                .is_some_and(|purged| purged.index >= log_id.index)
            {
                return Ok(());
            }
            let index = log_id.index;
            while state.first <= index {
                match state.slots.pop_front() {
                    Some(slot) => {
                        state.forget(slot);
                        state.first += 1;
                    }
                    None => {
                        state.first = index + 1;
                    }
                }
            }
            state.evict_from = state.evict_from.max(state.first);
            state.last_purged = Some(log_id.clone());
            let keys: Vec<u64> = state.segments.keys().copied().collect();
            let next_index = state.next_index();
            let mut remove = Vec::new();
            for (i, &key) in keys.iter().enumerate() {
                let next_start = keys.get(i + 1).copied().unwrap_or(next_index);
                if next_start > index + 1 {
                    break;
                }
                let segment = state.segments.remove(&key).expect("listed");
                remove.push(segment.path);
            }
            (
                encode_meta(META_KIND_PURGED, &codec::encode(&log_id)),
                remove,
            )
        };
        self.request(|reply| Command::Purge {
            meta,
            remove,
            reply,
        })
        .await
    }
}

// ---------------------------------------------------------------------------
// openraft traits
// ---------------------------------------------------------------------------

impl<C: RaftTypeConfig> RaftLogReader<C> for LogStore<C> {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<C::Entry>, StorageError<C::NodeId>> {
        self.shared.read_entries(range).await
    }
}

impl<C: RaftTypeConfig> RaftLogReader<C> for LogReader<C> {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<C::Entry>, StorageError<C::NodeId>> {
        self.shared.read_entries(range).await
    }
}

impl<C: RaftTypeConfig> RaftLogStorage<C> for LogStore<C> {
    type LogReader = LogReader<C>;

    async fn get_log_state(&mut self) -> Result<LogState<C>, StorageError<C::NodeId>> {
        let state = lock(&self.shared.state);
        Ok(LogState {
            last_purged_log_id: state.last_purged.clone(),
            last_log_id: state.last_log_id(),
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        LogReader {
            shared: self.shared.clone(),
        }
    }

    async fn save_vote(&mut self, vote: &Vote<C::NodeId>) -> Result<(), StorageError<C::NodeId>> {
        self.save_meta(VOTE_FILE, META_KIND_VOTE, &codec::encode(vote))
            .await
            .map_err(write_vote_err::<C>)?;
        lock(&self.shared.state).vote = Some(vote.clone());
        Ok(())
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<C::NodeId>>, StorageError<C::NodeId>> {
        Ok(lock(&self.shared.state).vote.clone())
    }

    async fn save_committed(
        &mut self,
        committed: Option<LogId<C::NodeId>>,
    ) -> Result<(), StorageError<C::NodeId>> {
        // NEGATIVE CONTROL (feature nc-skip-log-fsync): the committed log id
        // is not persisted either (it would point past the lost entries).
        if self.shared.options.persist_committed && !cfg!(feature = "nc-skip-log-fsync") {
            self.save_meta(
                COMMITTED_FILE,
                META_KIND_COMMITTED,
                &codec::encode(&committed),
            )
            .await
            .map_err(write_logs_err::<C>)?;
        } else {
            self.poison.check().map_err(write_logs_err::<C>)?;
        }
        lock(&self.shared.state).committed = committed;
        Ok(())
    }

    async fn read_committed(
        &mut self,
    ) -> Result<Option<LogId<C::NodeId>>, StorageError<C::NodeId>> {
        Ok(lock(&self.shared.state).committed.clone())
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<C>,
    ) -> Result<(), StorageError<C::NodeId>>
    where
        I: IntoIterator<Item = C::Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        self.append_batch(entries, callback)
            .await
            .map_err(write_logs_err::<C>)
    }

    async fn truncate(&mut self, log_id: LogId<C::NodeId>) -> Result<(), StorageError<C::NodeId>> {
        tracing::debug!(%log_id, "raft log: truncate");
        self.truncate_from(log_id.index)
            .await
            .map_err(write_logs_err::<C>)
    }

    async fn purge(&mut self, log_id: LogId<C::NodeId>) -> Result<(), StorageError<C::NodeId>> {
        tracing::debug!(%log_id, "raft log: purge");
        self.purge_upto(log_id).await.map_err(write_logs_err::<C>)
    }
}
