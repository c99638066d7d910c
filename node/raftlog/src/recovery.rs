//! Opening the log: leftover temporary files deleted, the metadata read,
//! every segment scanned and indexed, a torn tail of the last segment cut
//! off. Anything else that does not parse is corruption, reported by file
//! and offset.

use std::collections::{BTreeMap, VecDeque};
use std::path::Path;
use std::sync::Arc;

use openraft::RaftTypeConfig;
use openraft::alias::{LogIdOf, VoteOf};
use openraft::vote::RaftVote;
use vfs::{Vfs, VfsFile};

use crate::error::LogError;
use crate::format::{
    COMMITTED_FILE, META_HEADER_BYTES, META_KIND_COMMITTED, META_KIND_PURGED, META_KIND_VOTE,
    PURGED_FILE, SEGMENT_HEADER_BYTES, TMP_SUFFIX, VOTE_FILE, check_segment_header, decode_meta,
    parse_record, parse_segment_name, segment_name, valid_record_after,
};
use crate::index::{Segment, Slot, State};
use crate::limits::META_FILE_BYTES_MAX;

/// Reads and repairs the log in `dir` (creating it if needed) and returns
/// its in-memory state; see the crate docs, "Recovery". Blocking.
pub(crate) fn recover<C: RaftTypeConfig>(vfs: &dyn Vfs, dir: &Path) -> Result<State<C>, LogError> {
    vfs.create_dir_all(dir)
        .map_err(|e| LogError::io("create directory", dir, e))?;
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        // The directory's own name must be durable before anything in it.
        vfs.sync_dir(parent)
            .map_err(|e| LogError::io("fsync directory", parent, e))?;
    }
    let names = vfs.list(dir).map_err(|e| LogError::io("list", dir, e))?;
    let disk = LogDir { vfs, dir, names };

    // 1. Half-written metadata files.
    for name in disk.names.iter().filter(|n| n.ends_with(TMP_SUFFIX)) {
        disk.remove(&dir.join(name))?;
    }

    // 2. Metadata.
    let meta = Meta::<C>::read(&disk)?;

    // 3. Segments.
    let mut keys: Vec<u64> = disk
        .names
        .iter()
        .filter_map(|n| parse_segment_name(n))
        .collect();
    keys.sort_unstable();
    let mut scan = Scan::<C>::new(meta.last_purged.as_ref());
    for (i, &key) in keys.iter().enumerate() {
        scan.segment(&disk, key, keys.get(i + 1).copied())?;
    }
    Ok(scan.finish(meta))
}

/// The vote as [`crate::LogStore::open`] hands it to openraft: never
/// committed.
///
/// openraft (0.9 always; 0.10 unless `enable_leader_restore` is off, which
/// kvnode also sets) restarts a member whose stored vote is committed and its own
/// as the leader at once, without an election, reusing the first entry of
/// its old term as its no-op. Its linearizable read index is then the
/// committed log id it recovered, and that id is not durable (see
/// [`crate::LogStoreOptions::persist_committed`]): after a power cut it
/// falls back to the state machine's applied id, which can be below
/// acknowledged writes. Opened uncommitted, the vote keeps its term and
/// candidate (so this member can never vote twice in a term), but a former
/// leader starts as a follower and must win a new term with a fresh no-op
/// entry, whose commit covers every earlier entry, before it serves a read.
/// A follower whose vote named another leader commits it again on that
/// leader's next message.
fn uncommitted<V: RaftVote>(vote: V) -> V {
    V::from_leader_id(vote.leader_id().clone(), false)
}

/// The log directory being recovered; every removal is made durable at once.
struct LogDir<'a> {
    vfs: &'a dyn Vfs,
    dir: &'a Path,
    /// The names in the directory when recovery began.
    names: Vec<String>,
}

impl LogDir<'_> {
    fn remove(&self, path: &Path) -> Result<(), LogError> {
        self.vfs
            .remove(path)
            .map_err(|e| LogError::io("remove", path, e))?;
        self.vfs
            .sync_dir(self.dir)
            .map_err(|e| LogError::io("fsync directory", self.dir, e))
    }

    fn open(&self, path: &Path) -> Result<Arc<dyn VfsFile>, LogError> {
        self.vfs
            .open(path)
            .map_err(|e| LogError::io("open", path, e))
    }

    /// The payload of metadata file `name` (checked: size, framing, kind,
    /// checksum), or `None` if there is no such file.
    fn read_meta(&self, name: &str, kind: u32) -> Result<Option<Vec<u8>>, LogError> {
        if !self.names.iter().any(|n| n == name) {
            return Ok(None);
        }
        let path = self.dir.join(name);
        let file = self.open(&path)?;
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
    }

    /// The error for a metadata payload that does not decode.
    fn bad_payload(&self, name: &str, err: kvcodec::CodecError) -> LogError {
        LogError::Corrupt {
            path: self.dir.join(name),
            offset: META_HEADER_BYTES as u64,
            reason: format!("payload does not decode: {err}"),
        }
    }
}

fn read_whole(file: &dyn VfsFile, path: &Path) -> Result<Vec<u8>, LogError> {
    let len = file.len().map_err(|e| LogError::io("stat", path, e))?;
    let mut bytes = vec![0u8; len as usize];
    file.read_exact_at(&mut bytes, 0)
        .map_err(|e| LogError::io("read", path, e))?;
    Ok(bytes)
}

fn corrupt(path: &Path, offset: u64, reason: String) -> LogError {
    LogError::Corrupt {
        path: path.to_path_buf(),
        offset,
        reason,
    }
}

/// The three metadata files, decoded.
struct Meta<C: RaftTypeConfig> {
    vote: Option<VoteOf<C>>,
    committed: Option<LogIdOf<C>>,
    last_purged: Option<LogIdOf<C>>,
}

impl<C: RaftTypeConfig> Meta<C> {
    fn read(disk: &LogDir<'_>) -> Result<Self, LogError> {
        let vote = match disk.read_meta(VOTE_FILE, META_KIND_VOTE)? {
            Some(payload) => Some(uncommitted(
                kvcodec::decode(&payload).map_err(|err| disk.bad_payload(VOTE_FILE, err))?,
            )),
            None => None,
        };
        let committed = match disk.read_meta(COMMITTED_FILE, META_KIND_COMMITTED)? {
            Some(payload) => {
                kvcodec::decode(&payload).map_err(|err| disk.bad_payload(COMMITTED_FILE, err))?
            }
            None => None,
        };
        let last_purged = match disk.read_meta(PURGED_FILE, META_KIND_PURGED)? {
            Some(payload) => {
                Some(kvcodec::decode(&payload).map_err(|err| disk.bad_payload(PURGED_FILE, err))?)
            }
            None => None,
        };
        Ok(Meta {
            vote,
            committed,
            last_purged,
        })
    }
}

/// What the scan of the segments (lowest first) has found so far.
struct Scan<C: RaftTypeConfig> {
    /// Whether there is a purge point.
    purged: bool,
    /// Every index below this is purged.
    live_from: u64,
    segments: BTreeMap<u64, Segment>,
    slots: VecDeque<Slot<C>>,
    first_slot: Option<u64>,
    /// The index the next segment must start with.
    expected: Option<u64>,
}

impl<C: RaftTypeConfig> Scan<C> {
    fn new(last_purged: Option<&LogIdOf<C>>) -> Self {
        Scan {
            purged: last_purged.is_some(),
            live_from: last_purged.map_or(0, |p| p.index + 1),
            segments: BTreeMap::new(),
            slots: VecDeque::new(),
            first_slot: None,
            expected: None,
        }
    }

    /// Scans the segment whose first index is `key`; `next_key` is the first
    /// index of the segment after it (`None` for the last one). A segment
    /// that holds no live entry is removed.
    fn segment(
        &mut self,
        disk: &LogDir<'_>,
        key: u64,
        next_key: Option<u64>,
    ) -> Result<(), LogError> {
        let path = disk.dir.join(segment_name(key));
        let is_last = next_key.is_none();
        if next_key.is_some_and(|next| self.purged && next <= self.live_from) {
            // Wholly purged; left by an interrupted purge.
            return disk.remove(&path);
        }
        let file = disk.open(&path)?;
        let bytes = read_whole(&*file, &path)?;
        let header_len = SEGMENT_HEADER_BYTES as usize;
        if bytes.len() < header_len {
            if is_last {
                // Created, then cut by a crash before its header was fsynced.
                tracing::warn!(segment = %path.display(), "raft log: removing a segment with a torn header");
                return disk.remove(&path);
            }
            return Err(corrupt(&path, 0, "segment shorter than its header".into()));
        }
        check_segment_header(&path, &bytes, key)?;
        self.check_continuity(&path, key)?;
        let (end, next_index) = self.records(&path, &*file, &bytes, key, is_last)?;
        let wholly_purged = next_index <= self.live_from && self.purged;
        let empty_log = self.slots.is_empty() && !self.purged;
        if is_last && (wholly_purged || (empty_log && end == header_len)) {
            // Holds no live entry (only purged ones, or none at all): a
            // fresh segment is made for the next append.
            return disk.remove(&path);
        }
        self.expected = Some(next_index);
        self.segments.insert(
            key,
            Segment {
                path: path.as_path().into(),
                file,
                len: end as u64,
            },
        );
        Ok(())
    }

    /// A segment must start where the previous one ended, and the first one
    /// no later than just after the purge point.
    fn check_continuity(&self, path: &Path, key: u64) -> Result<(), LogError> {
        match self.expected {
            Some(expected) if key != expected => Err(corrupt(
                path,
                0,
                format!(
                    "segment starts at index {key} but the previous segment ends before index {expected}"
                ),
            )),
            None if self.purged && key > self.live_from => Err(corrupt(
                path,
                0,
                format!(
                    "first segment starts at index {key} but the purge point is index {} (a hole)",
                    self.live_from - 1
                ),
            )),
            _ => Ok(()),
        }
    }

    /// Indexes the records of one segment (`bytes`, the whole file; its
    /// first index `key`), keeping a slot for each live one. Returns the end
    /// offset of the last valid record and the index after it. A torn tail
    /// of the last segment is cut off and the cut fsynced.
    fn records(
        &mut self,
        path: &Path,
        file: &dyn VfsFile,
        bytes: &[u8],
        key: u64,
        is_last: bool,
    ) -> Result<(usize, u64), LogError> {
        let mut offset = SEGMENT_HEADER_BYTES as usize;
        let mut index = key;
        while offset < bytes.len() {
            let record = match parse_record(&bytes[offset..]) {
                Ok(record) if record.index == index => record,
                Ok(record) => {
                    return Err(corrupt(
                        path,
                        offset as u64,
                        format!("record has index {}, expected {index}", record.index),
                    ));
                }
                Err(bad) => {
                    if is_last && bad.torn && !valid_record_after(bytes, offset, index) {
                        if bytes[offset..].iter().all(|&b| b == 0) {
                            // The zeros the writer keeps past the records
                            // (LOG_FILL_AHEAD_BYTES), left by a stop that
                            // did not cut them.
                            tracing::info!(
                                segment = %path.display(),
                                offset,
                                cut_bytes = bytes.len() - offset,
                                "raft log: cutting the zeros after the last record"
                            );
                        } else {
                            tracing::warn!(
                                segment = %path.display(),
                                offset,
                                cut_bytes = bytes.len() - offset,
                                reason = %bad.reason,
                                "raft log: cutting a torn tail"
                            );
                        }
                        file.truncate(offset as u64)
                            .map_err(|e| LogError::io("truncate", path, e))?;
                        file.sync().map_err(|e| LogError::io("fsync", path, e))?;
                        break;
                    }
                    return Err(corrupt(path, offset as u64, bad.reason));
                }
            };
            let at = &bytes[offset..];
            let log_id: LogIdOf<C> =
                kvcodec::decode(&at[record.log_id.clone()]).map_err(|err| {
                    corrupt(
                        path,
                        offset as u64,
                        format!("record log id does not decode: {err}"),
                    )
                })?;
            if log_id.index != index {
                return Err(corrupt(
                    path,
                    offset as u64,
                    format!("record log id {log_id} does not match its index {index}"),
                ));
            }
            if index >= self.live_from {
                self.first_slot.get_or_insert(index);
                self.slots.push_back(Slot {
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
        Ok((offset, index))
    }

    fn finish(self, meta: Meta<C>) -> State<C> {
        let first = match (&meta.last_purged, self.first_slot) {
            (Some(_), _) => self.live_from,
            (None, Some(first)) => first,
            (None, None) => 0,
        };
        State {
            segments: self.segments,
            first,
            slots: self.slots,
            last_purged: meta.last_purged,
            vote: meta.vote,
            committed: meta.committed,
            cache_bytes: 0,
            evict_from: first,
        }
    }
}
