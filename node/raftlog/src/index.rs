//! The in-memory state of the log — its segments, one slot per live entry
//! (log id, segment, offset, durability), the payload cache — and reads:
//! from memory when cached, otherwise one positioned read and a checksum
//! check per record.

use std::collections::{BTreeMap, VecDeque};
use std::fmt::Debug;
use std::io;
use std::ops::{Bound, RangeBounds};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use openraft::RaftTypeConfig;
use openraft::alias::{LogIdOf, VoteOf};
use vfs::VfsFile;

use crate::error::LogError;
use crate::format::{parse_record, segment_name};
use crate::lock;
use crate::options::LogStoreOptions;

/// One segment file.
#[derive(Debug)]
pub(crate) struct Segment {
    pub(crate) path: Arc<Path>,
    pub(crate) file: Arc<dyn VfsFile>,
    /// Logical length: every byte written or queued for writing.
    pub(crate) len: u64,
}

/// Where one live entry is, and its payload while cached.
#[derive(Debug)]
pub(crate) struct Slot<C: RaftTypeConfig> {
    pub(crate) log_id: LogIdOf<C>,
    /// Key (first index) of the segment holding the record.
    pub(crate) segment: u64,
    pub(crate) offset: u64,
    pub(crate) len: u32,
    /// An fsync covers the record.
    pub(crate) durable: bool,
    /// The encoded entry, while cached.
    pub(crate) cached: Option<Arc<[u8]>>,
}

/// Everything the store knows about the log, under one lock.
#[derive(Debug)]
pub(crate) struct State<C: RaftTypeConfig> {
    pub(crate) segments: BTreeMap<u64, Segment>,
    /// Log index of `slots[0]` (or of the next entry when `slots` is empty).
    pub(crate) first: u64,
    /// One per live entry, in index order.
    pub(crate) slots: VecDeque<Slot<C>>,
    pub(crate) last_purged: Option<LogIdOf<C>>,
    pub(crate) vote: Option<VoteOf<C>>,
    pub(crate) committed: Option<LogIdOf<C>>,
    pub(crate) cache_bytes: usize,
    /// Slots below this index hold no cached payload.
    pub(crate) evict_from: u64,
}

impl<C: RaftTypeConfig> State<C> {
    pub(crate) fn next_index(&self) -> u64 {
        self.first + self.slots.len() as u64
    }

    pub(crate) fn slot(&self, index: u64) -> Option<&Slot<C>> {
        let at = index.checked_sub(self.first)?;
        self.slots.get(usize::try_from(at).ok()?)
    }

    pub(crate) fn slot_mut(&mut self, index: u64) -> Option<&mut Slot<C>> {
        let at = index.checked_sub(self.first)?;
        self.slots.get_mut(usize::try_from(at).ok()?)
    }

    pub(crate) fn last_log_id(&self) -> Option<LogIdOf<C>> {
        match self.slots.back() {
            Some(slot) => Some(slot.log_id.clone()),
            None => self.last_purged.clone(),
        }
    }

    pub(crate) fn forget(&mut self, slot: Slot<C>) {
        if let Some(bytes) = slot.cached {
            self.cache_bytes -= bytes.len();
        }
    }

    pub(crate) fn evict(&mut self, max: usize) {
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

/// The state shared by the store, its readers and the writer's callbacks.
pub(crate) struct Shared<C: RaftTypeConfig> {
    pub(crate) dir: PathBuf,
    pub(crate) options: LogStoreOptions,
    pub(crate) state: Mutex<State<C>>,
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
    /// The vote last saved (durable: `save_vote` returns after its fsync).
    pub(crate) fn vote(&self) -> Option<VoteOf<C>> {
        lock(&self.state).vote.clone()
    }

    pub(crate) fn mark_durable(&self, first: u64, count: u64) {
        let mut state = lock(&self.state);
        for index in first..first + count {
            if let Some(slot) = state.slot_mut(index) {
                slot.durable = true;
            }
        }
        state.evict(self.options.cache_bytes_max);
    }

    pub(crate) async fn read_entries<RB: RangeBounds<u64>>(
        &self,
        range: RB,
    ) -> Result<Vec<C::Entry>, io::Error> {
        let sources = self.sources(range).map_err(io::Error::from)?;
        let all_cached = sources.iter().all(|s| matches!(s, Source::Cached(..)));
        let payloads = if all_cached {
            load(sources)
        } else {
            // Positioned reads of older entries: off the async runtime.
            tokio::task::spawn_blocking(move || load(sources))
                .await
                .map_err(|join| {
                    io::Error::from(LogError::io("read", &self.dir, io::Error::other(join)))
                })?
        }
        .map_err(io::Error::from)?;
        payloads
            .into_iter()
            .map(|(bytes, path, offset)| {
                kvcodec::decode::<C::Entry>(&bytes).map_err(|err| LogError::Corrupt {
                    path: path.to_path_buf(),
                    offset,
                    reason: format!("log entry does not decode: {err}"),
                })
            })
            .collect::<Result<Vec<_>, LogError>>()
            .map_err(io::Error::from)
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
