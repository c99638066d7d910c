//! The write path: validation at the API edge, appending a batch to the
//! active segment (and its hint), rotation and sealing of segments.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use vfs::VfsFile;

use super::batch::{BatchRef, OpRef};
use super::files::FileMeta;
use super::read::Handle;
use super::{Batch, Engine, RecordLocation, RecordMeta, Shared, Written, lock, write};
use crate::error::{Error, Result};
use crate::format::{
    DATA_MAGIC, FileId, HintEntry, RecordKind, encode_record, path_in, record_size,
};
use crate::hint::HintWriter;
use crate::keydir::{KeyDir, Location};
use crate::options::{
    FILL_AHEAD_BYTES, METADATA_SIZE_BYTES_MAX, RECORD_META_BYTES_MAX, SyncPolicy,
};

/// The active segment and the writer's state.
#[derive(Debug)]
pub(crate) struct Active {
    pub(crate) num: u32,
    pub(crate) id: FileId,
    pub(crate) file: Arc<dyn VfsFile>,
    pub(crate) len: u64,
    /// Where the zeros written ahead of `len` end ([`FILL_AHEAD_BYTES`]):
    /// `len` rounded up to a block while the engine writes, `len` after
    /// recovery or a cut. The file is cut back to `len` when it is sealed
    /// or the engine closes.
    pub(crate) filled: u64,
    pub(crate) hasher: crc32fast::Hasher,
    pub(crate) hint: HintWriter,
    pub(crate) max_seq: u64,
    pub(crate) last_commit: Option<(u64, Vec<u8>)>,
}

/// What the fill ahead writes.
static ZEROS: [u8; FILL_AHEAD_BYTES as usize] = [0; FILL_AHEAD_BYTES as usize];

impl Active {
    /// Before a batch ending at `end` is written: if it passes the zeros
    /// already there, writes zeros from `end` to the next block boundary,
    /// so the file's length is always `len` rounded up to a block (the
    /// same on every replica fed the same batches, whatever its restarts).
    fn fill_ahead(&mut self, end: u64) -> std::io::Result<()> {
        if end <= self.filled {
            return Ok(());
        }
        let target = end.next_multiple_of(FILL_AHEAD_BYTES);
        if target > end {
            self.file
                .write_all_at(&ZEROS[..(target - end) as usize], end)?;
        }
        self.filled = target;
        Ok(())
    }

    /// Cuts the zeros written ahead off the file (before it is sealed or
    /// the engine closes), so a file at rest ends with its last batch.
    pub(crate) fn cut_fill(&mut self) -> std::io::Result<()> {
        if self.filled > self.len {
            self.file.truncate(self.len)?;
            self.filled = self.len;
        }
        Ok(())
    }
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
    /// Batches appended but not yet fsynced, in order, with their end
    /// position (over all files, as `written_total`) and their end offset
    /// in the active segment (the published length once applied).
    pub(crate) pending: VecDeque<(u64, u64, Vec<Update>)>,
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

impl Engine {
    /// Stores `key` → `value` without expiry; returns its sequence number.
    pub fn put(&self, key: &[u8], value: &[u8]) -> Result<u64> {
        self.put_with_expiry(key, value, 0)
    }

    /// Stores `key` → `value`, absent from reads with `now_ms >= expiry_ms`.
    pub fn put_with_expiry(&self, key: &[u8], value: &[u8], expiry_ms: u64) -> Result<u64> {
        let ops = [OpRef::Put {
            key,
            value,
            expiry_ms,
            meta: RecordMeta::EMPTY,
        }];
        let batch = BatchRef {
            ops: &ops,
            meta: &[],
            seq: None,
        };
        Ok(self.shared.write_batch(&batch, None)?.first_seq)
    }

    /// Deletes `key`; returns the tombstone's sequence number.
    pub fn delete(&self, key: &[u8]) -> Result<u64> {
        Ok(self.write_batch(&Batch::new().delete(key))?.first_seq)
    }

    /// Writes a batch atomically: after a crash all of it or none of it is there.
    pub fn write_batch(&self, batch: &Batch) -> Result<Written> {
        let ops: Vec<OpRef<'_>> = batch.ops.iter().map(OpRef::from).collect();
        self.shared.write_batch(&batch.lend(&ops), None)
    }

    /// [`Engine::write_batch`], also telling where each op's record went:
    /// `locations` is cleared and gets one [`RecordLocation`] per op, in op
    /// order (what a change history indexes without listing the files).
    /// The locations are readable by [`Engine::read_record`] once the batch
    /// is visible to reads, which is when this returns.
    pub fn write_batch_located(
        &self,
        batch: &Batch,
        locations: &mut Vec<RecordLocation>,
    ) -> Result<Written> {
        locations.clear();
        let ops: Vec<OpRef<'_>> = batch.ops.iter().map(OpRef::from).collect();
        self.shared.write_batch(&batch.lend(&ops), Some(locations))
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
}

impl Shared {
    fn validate(&self, batch: &BatchRef<'_>) -> Result<usize> {
        if batch.meta.len() > METADATA_SIZE_BYTES_MAX {
            return Err(Error::MetadataTooLarge {
                len: batch.meta.len(),
                max: METADATA_SIZE_BYTES_MAX,
            });
        }
        let mut size = record_size(0, batch.meta.len(), 0);
        for op in batch.ops {
            let (key, value_len, meta) = match op {
                OpRef::Put {
                    key, value, meta, ..
                } => (key, value.len(), meta),
                OpRef::Delete { key, meta } => (key, 0, meta),
            };
            // `RecordMeta::new` already refused anything longer; checked
            // again here because a record or hint must never claim more.
            if meta.len() > RECORD_META_BYTES_MAX {
                return Err(Error::RecordMetaTooLarge {
                    len: meta.len(),
                    max: RECORD_META_BYTES_MAX,
                });
            }
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
            size += record_size(key.len(), value_len, meta.len());
        }
        if size > self.opts.batch_size_bytes_max {
            return Err(Error::BatchTooLarge {
                len: size,
                max: self.opts.batch_size_bytes_max,
            });
        }
        Ok(size)
    }

    fn write_batch(
        self: &Arc<Self>,
        batch: &BatchRef<'_>,
        locations: Option<&mut Vec<RecordLocation>>,
    ) -> Result<Written> {
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
                    OpRef::Put {
                        key,
                        value,
                        expiry_ms,
                        meta,
                    } => {
                        encode_record(
                            buf,
                            RecordKind::Put,
                            seq,
                            *expiry_ms,
                            meta.as_bytes(),
                            key,
                            value,
                        );
                        let location = Location {
                            file: active.num,
                            offset,
                            value_len: value.len() as u32,
                            seq,
                            expiry_ms: *expiry_ms,
                            meta: *meta,
                        };
                        updates.push(Update::Put(key.to_vec(), location));
                    }
                    OpRef::Delete { key, meta } => {
                        encode_record(
                            buf,
                            RecordKind::Tombstone,
                            seq,
                            0,
                            meta.as_bytes(),
                            key,
                            &[],
                        );
                        updates.push(Update::Delete(key.to_vec(), seq));
                    }
                }
            }
            if let Some(locations) = locations {
                record_locations(batch, active.id, base, first_seq, locations);
                debug_assert_eq!(
                    locations
                        .last()
                        .map_or(base, |l| u64::from(l.offset) + u64::from(l.len)),
                    base + buf.len() as u64,
                    "record sizes agree with the encoding"
                );
            }
            let commit_offset = (base + buf.len() as u64) as u32;
            encode_record(buf, RecordKind::Commit, commit_seq, 0, &[], &[], batch.meta);
            updates.push(Update::Seq(commit_seq));
            let written = active
                .fill_ahead(base + buf.len() as u64)
                .and_then(|()| active.file.write_all_at(buf, base));
            if let Err(e) = written {
                let path = path_in(&self.dir, &active.id.data_name());
                return Err(self.poison(Error::io(path, e)));
            }
            active.len += buf.len() as u64;
            active.hasher.update(buf);
            active.max_seq = commit_seq;
            active.last_commit = Some((commit_seq, batch.meta.to_vec()));
            for (op, update) in batch.ops.iter().zip(&updates) {
                let hinted = match (op, update) {
                    (OpRef::Put { key, .. }, Update::Put(_, location)) => {
                        active.hint.add(&HintEntry {
                            kind: RecordKind::Put,
                            key,
                            value_len: location.value_len,
                            offset: location.offset,
                            seq: location.seq,
                            expiry_ms: location.expiry_ms,
                            meta: location.meta.as_bytes(),
                        })
                    }
                    (OpRef::Delete { key, meta }, Update::Delete(_, seq)) => active
                        .hint
                        .add(&HintEntry::tombstone(key, meta.as_bytes(), *seq)),
                    _ => unreachable!("updates are built in op order"),
                };
                hinted.map_err(|e| self.poison(e))?;
            }
            active.hint.commit(batch.meta, commit_offset, commit_seq);
            writer.written_total += buf.len() as u64;
            writer.last_seq = commit_seq;
            writer.last_meta = Some(batch.meta.to_vec());
            let end = writer.written_total;
            let file_end = writer.active.as_ref().map_or(0, |a| a.len);
            if self.opts.sync == SyncPolicy::Always {
                writer.pending.push_back((end, file_end, updates));
            } else {
                let mut keydir = write(&self.keydir);
                apply_updates(&mut keydir, updates);
                // Published before the key directory is unlocked, so a
                // reader that sees the batch there can read it by location.
                self.active_published.store(file_end, Ordering::SeqCst);
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
            self.active_published
                .store(header_bytes.len() as u64, Ordering::SeqCst);
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
            filled: header_bytes.len() as u64,
            hasher,
            hint,
            max_seq: 0,
            last_commit: None,
        })
    }

    /// Seals the active segment: fsync, hint, and it joins the sealed list.
    pub(crate) fn seal_active(&self, writer: &mut Writer) -> Result<()> {
        let Some(mut active) = writer.active.take() else {
            return Ok(());
        };
        active
            .cut_fill()
            .map_err(|e| self.poison(Error::io(path_in(&self.dir, &active.id.data_name()), e)))?;
        self.sync_file(active.file.as_ref(), &active.id.data_name())?;
        // Everything written so far is durable now.
        let pending: Vec<(u64, u64, Vec<Update>)> = writer.pending.drain(..).collect();
        {
            let mut keydir = write(&self.keydir);
            for (_, _, updates) in pending {
                apply_updates(&mut keydir, updates);
            }
            self.active_published.store(active.len, Ordering::SeqCst);
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

/// Where the records of `batch` go when it is appended at `base` of the
/// active segment `file`: each record's size follows from its op alone.
fn record_locations(
    batch: &BatchRef<'_>,
    file: FileId,
    base: u64,
    first_seq: u64,
    out: &mut Vec<RecordLocation>,
) {
    let mut offset = base;
    for (i, op) in batch.ops.iter().enumerate() {
        let len = match op {
            OpRef::Put {
                key, value, meta, ..
            } => record_size(key.len(), value.len(), meta.len()),
            OpRef::Delete { key, meta } => record_size(key.len(), 0, meta.len()),
        };
        out.push(RecordLocation {
            file,
            offset: offset as u32,
            len: len as u32,
            seq: first_seq + i as u64,
        });
        offset += len as u64;
    }
}
