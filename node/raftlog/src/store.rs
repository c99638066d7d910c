//! The store: [`LogStore`] (open, the write operations) and [`LogReader`],
//! and openraft's `RaftLogReader` and `RaftLogStorage` on them.

use std::fmt::Debug;
use std::io;
use std::ops::RangeBounds;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, mpsc};
use std::thread::JoinHandle;

use openraft::alias::{LogIdOf, VoteOf};
use openraft::entry::RaftEntry;
use openraft::storage::{IOFlushed, RaftLogStorage};
use openraft::{LogState, OptionalSend, RaftLogReader, RaftTypeConfig};
use tokio::sync::oneshot;
use vfs::Vfs;

use crate::error::LogError;
use crate::format::{
    COMMITTED_FILE, META_KIND_COMMITTED, META_KIND_PURGED, META_KIND_VOTE, RECORD_HEADER_BYTES,
    RECORD_LOG_ID_LEN_BYTES, SEGMENT_HEADER_BYTES, VOTE_FILE, encode_meta, encode_record,
    segment_name,
};
use crate::index::{Segment, Shared, Slot};
use crate::limits::LOG_ENTRY_SIZE_BYTES_MAX;
use crate::lock;
use crate::options::{FsyncObserver, LogStoreOptions};
use crate::recovery::recover;
use crate::writer::{AppendJob, Command, Poison, Reply, Writer};

/// The Raft log store of one node (see the crate docs).
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

/// One entry encoded for its record.
struct Encoded<C: RaftTypeConfig> {
    log_id: LogIdOf<C>,
    log_id_bytes: Vec<u8>,
    entry: Arc<[u8]>,
}

impl<C: RaftTypeConfig> Encoded<C> {
    /// Bytes of its record (header and body).
    fn record_len(&self) -> u64 {
        RECORD_HEADER_BYTES
            + (RECORD_LOG_ID_LEN_BYTES + self.log_id_bytes.len() + self.entry.len()) as u64
    }
}

/// Encodes a batch (outside the lock); an entry whose record body would
/// exceed [`LOG_ENTRY_SIZE_BYTES_MAX`] fails the whole batch.
fn encode_batch<C: RaftTypeConfig>(
    entries: impl IntoIterator<Item = C::Entry>,
) -> Result<Vec<Encoded<C>>, LogError> {
    let mut encoded = Vec::new();
    for entry in entries {
        let log_id = entry.log_id();
        let log_id_bytes = kvcodec::encode(&log_id);
        let entry_bytes = kvcodec::encode(&entry);
        let body = RECORD_LOG_ID_LEN_BYTES + log_id_bytes.len() + entry_bytes.len();
        if body > LOG_ENTRY_SIZE_BYTES_MAX {
            return Err(LogError::EntryTooLarge {
                index: log_id.index,
                size: body,
                max: LOG_ENTRY_SIZE_BYTES_MAX,
            });
        }
        encoded.push(Encoded {
            log_id,
            log_id_bytes,
            entry: Arc::from(entry_bytes),
        });
    }
    Ok(encoded)
}

impl<C: RaftTypeConfig> LogStore<C> {
    /// Opens (creating if needed) the log in `dir` with the default options.
    /// Blocking: it reads and repairs the files (see the crate docs); call
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
        // One store per directory, taken before recovery reads or cuts
        // anything: recovery repairs the last segment (a torn tail, the
        // writer's zeros), which under a live writer would cut records it
        // had acknowledged. Held by the writer thread until its last write.
        vfs.create_dir_all(&dir)
            .map_err(|e| LogError::io("create directory", &dir, e))?;
        let dir_lock = vfs.lock_dir(&dir).map_err(|e| match e.kind() {
            std::io::ErrorKind::WouldBlock => LogError::DirectoryInUse { path: dir.clone() },
            _ => LogError::io("lock", &dir, e),
        })?;
        let state = recover::<C>(&*vfs, &dir)?;
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
            fill: None,
            _dir_lock: dir_lock,
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

    async fn append_batch<I>(&mut self, entries: I, callback: IOFlushed<C>) -> Result<(), LogError>
    where
        I: IntoIterator<Item = C::Entry>,
    {
        self.poison.check()?;
        let mut encoded = encode_batch::<C>(entries)?;
        self.drop_purged(&mut encoded);
        let Some(first) = encoded.first() else {
            // Nothing to write, but the callback must still follow every
            // earlier write: it goes through the writer queue.
            return self.send(Command::Barrier {
                done: Box::new(move |result| {
                    callback.io_completed(result.map_err(io::Error::other));
                }),
            });
        };
        let first_index = first.log_id.index;
        let total: u64 = encoded.iter().map(Encoded::record_len).sum();
        if self.needs_new_segment(first_index, &encoded, total)? {
            self.create_segment(first_index).await?;
        }
        let job = self.lay_out(encoded, first_index, total, callback);
        self.send(Command::Append(job))
    }

    /// Drops appended entries at or below the purge point. They are already
    /// covered by the state machine; openraft never sends them in practice
    /// (its storage test suite does, after its startup purge).
    fn drop_purged(&self, encoded: &mut Vec<Encoded<C>>) {
        let purged_upto = lock(&self.shared.state)
            .last_purged
            .as_ref()
            .map(|p| p.index);
        if let Some(purged_upto) = purged_upto {
            let before = encoded.len();
            encoded.retain(|e| e.log_id.index > purged_upto);
            if encoded.len() != before {
                tracing::debug!(
                    dropped = before - encoded.len(),
                    purged_upto,
                    "raft log: dropping appended entries at or below the purge point"
                );
            }
        }
    }

    /// Checks that a batch of `total` record bytes starting at `first_index`
    /// continues the log (and starts the empty last segment, if that is
    /// there), and returns whether it needs a new segment: there is none
    /// yet, or the batch would take the last one past the rotation size.
    fn needs_new_segment(
        &self,
        first_index: u64,
        encoded: &[Encoded<C>],
        total: u64,
    ) -> Result<bool, LogError> {
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
        for (i, e) in encoded.iter().enumerate() {
            if e.log_id.index != first_index + i as u64 {
                return Err(LogError::NotContiguous {
                    expected: first_index + i as u64,
                    got: e.log_id.index,
                });
            }
        }
        match state.segments.iter().next_back() {
            None => Ok(true),
            Some((&key, segment)) => {
                if segment.len <= SEGMENT_HEADER_BYTES {
                    if key != first_index {
                        return Err(LogError::NotContiguous {
                            expected: key,
                            got: first_index,
                        });
                    }
                    Ok(false)
                } else {
                    Ok(segment.len + total > self.shared.options.segment_size_bytes)
                }
            }
        }
    }

    /// Has the writer create the segment starting at `first_index` (header
    /// and directory entry durable) and adds it as the last segment.
    async fn create_segment(&self, first_index: u64) -> Result<(), LogError> {
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
        Ok(())
    }

    /// Lays the batch out at the end of the last segment: a slot per entry,
    /// its payload cached (so it is readable at once), and the job for the
    /// writer, whose completion marks the entries durable and calls back.
    fn lay_out(
        &self,
        encoded: Vec<Encoded<C>>,
        first_index: u64,
        total: u64,
        callback: IOFlushed<C>,
    ) -> AppendJob {
        let count = encoded.len() as u64;
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
        for Encoded {
            log_id,
            log_id_bytes,
            entry,
        } in encoded
        {
            let offset = start + buf.len() as u64;
            encode_record(&mut buf, log_id.index, &log_id_bytes, &entry);
            let len = (start + buf.len() as u64 - offset) as u32;
            added += entry.len();
            state.slots.push_back(Slot {
                log_id,
                segment: key,
                offset,
                len,
                durable: false,
                cached: Some(entry),
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
                    callback.io_completed(Ok(()));
                }
                Err(err) => callback.io_completed(Err(io::Error::other(err))),
            }),
        }
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

    async fn purge_upto(&mut self, log_id: LogIdOf<C>) -> Result<(), LogError> {
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
                encode_meta(META_KIND_PURGED, &kvcodec::encode(&log_id)),
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
    ) -> Result<Vec<C::Entry>, io::Error> {
        self.shared.read_entries(range).await
    }
    async fn read_vote(&mut self) -> Result<Option<VoteOf<C>>, io::Error> {
        Ok(self.shared.vote())
    }
}

impl<C: RaftTypeConfig> RaftLogReader<C> for LogReader<C> {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<C::Entry>, io::Error> {
        self.shared.read_entries(range).await
    }
    async fn read_vote(&mut self) -> Result<Option<VoteOf<C>>, io::Error> {
        Ok(self.shared.vote())
    }
}

impl<C: RaftTypeConfig> RaftLogStorage<C> for LogStore<C> {
    type LogReader = LogReader<C>;

    async fn get_log_state(&mut self) -> Result<LogState<C>, io::Error> {
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

    async fn save_vote(&mut self, vote: &VoteOf<C>) -> Result<(), io::Error> {
        self.save_meta(VOTE_FILE, META_KIND_VOTE, &kvcodec::encode(vote))
            .await
            .map_err(io::Error::from)?;
        lock(&self.shared.state).vote = Some(vote.clone());
        Ok(())
    }

    async fn save_committed(&mut self, committed: Option<LogIdOf<C>>) -> Result<(), io::Error> {
        // NEGATIVE CONTROL (feature nc-skip-log-fsync): the committed log id
        // is not persisted either (it would point past the lost entries).
        if self.shared.options.persist_committed && !cfg!(feature = "nc-skip-log-fsync") {
            self.save_meta(
                COMMITTED_FILE,
                META_KIND_COMMITTED,
                &kvcodec::encode(&committed),
            )
            .await
            .map_err(io::Error::from)?;
        } else {
            self.poison.check().map_err(io::Error::from)?;
        }
        lock(&self.shared.state).committed = committed;
        Ok(())
    }

    async fn read_committed(&mut self) -> Result<Option<LogIdOf<C>>, io::Error> {
        Ok(lock(&self.shared.state).committed.clone())
    }

    async fn append<I>(&mut self, entries: I, callback: IOFlushed<C>) -> Result<(), io::Error>
    where
        I: IntoIterator<Item = C::Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        self.append_batch(entries, callback)
            .await
            .map_err(io::Error::from)
    }

    async fn truncate_after(&mut self, last_log_id: Option<LogIdOf<C>>) -> Result<(), io::Error> {
        // Keeps entries up to `last_log_id` (none: the whole log goes).
        let from = last_log_id.as_ref().map_or(0, |id| id.index + 1);
        tracing::debug!(from, "raft log: truncate");
        self.truncate_from(from).await.map_err(io::Error::from)
    }

    async fn purge(&mut self, log_id: LogIdOf<C>) -> Result<(), io::Error> {
        tracing::debug!(%log_id, "raft log: purge");
        self.purge_upto(log_id).await.map_err(io::Error::from)
    }
}
