//! The write path: validation at the API edge, appending a batch to the
//! active segment (and its hint), rotation and sealing of segments.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use vfs::VfsFile;

use super::files::FileMeta;
use super::read::Handle;
use super::{Batch, Engine, Op, Shared, Written, lock, read, write};
use crate::error::{Error, Result};
use crate::format::{
    DATA_MAGIC, FileId, HintEntry, RecordKind, encode_record, path_in, record_size,
};
use crate::hint::HintWriter;
use crate::keydir::{KeyDir, Location, entry_size_bytes};
use crate::options::{METADATA_SIZE_BYTES_MAX, SyncPolicy};

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
    /// `written_total` when the writer last asked for a write-back.
    pub(crate) writeback_requested_at: u64,
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
            writeback_requested_at: 0,
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
        let op = OpRef::Put {
            key,
            value,
            expiry_ms,
        };
        Ok(self.shared.write_ops(&[op], &[], None)?.first_seq)
    }

    /// Deletes `key`; returns the tombstone's sequence number.
    pub fn delete(&self, key: &[u8]) -> Result<u64> {
        let op = OpRef::Delete { key };
        Ok(self.shared.write_ops(&[op], &[], None)?.first_seq)
    }

    /// Writes a batch atomically: after a crash all of it or none of it is there.
    pub fn write_batch(&self, batch: &Batch) -> Result<Written> {
        self.shared.write_batch(batch)
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

/// One op of a batch, borrowed: [`Batch`]'s ops, or a single put or delete
/// straight from the caller's slices (no copy of the value before it is
/// encoded).
#[derive(Clone, Copy, Debug)]
pub(crate) enum OpRef<'a> {
    Put {
        key: &'a [u8],
        value: &'a [u8],
        expiry_ms: u64,
    },
    Delete {
        key: &'a [u8],
    },
}

impl<'a> OpRef<'a> {
    fn of(op: &'a Op) -> OpRef<'a> {
        match op {
            Op::Put {
                key,
                value,
                expiry_ms,
            } => OpRef::Put {
                key,
                value,
                expiry_ms: *expiry_ms,
            },
            Op::Delete { key } => OpRef::Delete { key },
        }
    }

    fn key(&self) -> &'a [u8] {
        match self {
            OpRef::Put { key, .. } | OpRef::Delete { key } => key,
        }
    }
}

impl Shared {
    fn validate(&self, ops: &[OpRef<'_>], meta: &[u8]) -> Result<usize> {
        if meta.len() > METADATA_SIZE_BYTES_MAX {
            return Err(Error::MetadataTooLarge {
                len: meta.len(),
                max: METADATA_SIZE_BYTES_MAX,
            });
        }
        let mut size = record_size(0, meta.len());
        for op in ops {
            let (key, value_len) = match op {
                OpRef::Put { key, value, .. } => (key, value.len()),
                OpRef::Delete { key } => (key, 0),
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
        let ops: Vec<OpRef<'_>> = batch.ops.iter().map(OpRef::of).collect();
        self.write_ops(&ops, &batch.meta, batch.seq)
    }

    /// Appends one batch (its records and a commit record, in one write),
    /// then makes it visible: at once, or after its fsync under
    /// `SyncPolicy::Always`.
    pub(crate) fn write_ops(
        self: &Arc<Self>,
        ops: &[OpRef<'_>],
        meta: &[u8],
        seq: Option<u64>,
    ) -> Result<Written> {
        let size = self.validate(ops, meta)?;
        let (written, end, sealed) = {
            let mut guard = lock(&self.writer);
            self.check_poison()?;
            let writer = &mut *guard;
            let first_seq = match seq {
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
            let commit_seq =
                first_seq
                    .checked_add(ops.len() as u64)
                    .ok_or(Error::SequenceNotIncreasing {
                        given: first_seq,
                        last: writer.last_seq,
                    })?;
            self.check_keydir_room(ops, &writer.pending)?;
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
            // Where each put landed (puts only, in op order).
            let mut locations = Vec::with_capacity(ops.len());
            for (i, op) in ops.iter().enumerate() {
                let seq = first_seq + i as u64;
                let offset = (base + buf.len() as u64) as u32;
                match *op {
                    OpRef::Put {
                        key,
                        value,
                        expiry_ms,
                    } => {
                        encode_record(buf, RecordKind::Put, seq, expiry_ms, key, value);
                        locations.push(Location {
                            file: active.num,
                            offset,
                            value_len: value.len() as u32,
                            seq,
                            expiry_ms,
                        });
                    }
                    OpRef::Delete { key } => {
                        encode_record(buf, RecordKind::Tombstone, seq, 0, key, &[]);
                    }
                }
            }
            let commit_offset = (base + buf.len() as u64) as u32;
            encode_record(buf, RecordKind::Commit, commit_seq, 0, &[], meta);
            if let Err(e) = active.file.write_all_at(buf, base) {
                let path = path_in(&self.dir, &active.id.data_name());
                return Err(self.poison(Error::io(path, e)));
            }
            active.len += buf.len() as u64;
            active.hasher.update(buf);
            active.max_seq = commit_seq;
            active.last_commit = Some((commit_seq, meta.to_vec()));
            let mut puts = locations.iter();
            for (i, op) in ops.iter().enumerate() {
                let hinted = match op {
                    OpRef::Put { key, .. } => {
                        let location = puts.next().expect("one location per put");
                        active.hint.add(&HintEntry {
                            kind: RecordKind::Put,
                            key,
                            value_len: location.value_len,
                            offset: location.offset,
                            seq: location.seq,
                            expiry_ms: location.expiry_ms,
                        })
                    }
                    OpRef::Delete { key } => active
                        .hint
                        .add(&HintEntry::tombstone(key, first_seq + i as u64)),
                };
                hinted.map_err(|e| self.poison(e))?;
            }
            active.hint.commit(meta, commit_offset, commit_seq);
            writer.written_total += buf.len() as u64;
            writer.last_seq = commit_seq;
            writer.last_meta = Some(meta.to_vec());
            let end = writer.written_total;
            if self.opts.sync == SyncPolicy::Always {
                let updates = updates_of(ops, &locations, first_seq, commit_seq);
                writer.pending.push_back((end, updates));
            } else {
                let mut keydir = write(&self.keydir);
                let mut puts = locations.iter();
                for (i, op) in ops.iter().enumerate() {
                    match op {
                        OpRef::Put { key, .. } => {
                            keydir.put(key, *puts.next().expect("one location per put"))
                        }
                        OpRef::Delete { key } => keydir.delete(key, first_seq + i as u64),
                    }
                }
                keydir.note_seq(commit_seq);
                drop(keydir);
                if let Some(interval) = self.opts.writeback_interval_bytes
                    && end - writer.writeback_requested_at >= interval
                {
                    writer.writeback_requested_at = end;
                    self.request_writeback();
                }
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

    /// Refuses a batch whose new keys might not fit in the key directory,
    /// counting the batches still waiting for their fsync (applied later):
    /// applying a batch that is on disk must never fail.
    fn check_keydir_room(
        &self,
        ops: &[OpRef<'_>],
        pending: &VecDeque<(u64, Vec<Update>)>,
    ) -> Result<()> {
        let waiting = pending
            .iter()
            .flat_map(|(_, updates)| updates)
            .map(|update| match update {
                Update::Put(key, _) => entry_size_bytes(key.len()),
                _ => 0,
            });
        let adding = ops.iter().map(|op| match op {
            OpRef::Put { key, .. } => entry_size_bytes(key.len()),
            OpRef::Delete { .. } => 0,
        });
        let needed: usize = waiting.chain(adding).sum();
        if read(&self.keydir).has_room(needed) {
            Ok(())
        } else {
            Err(Error::KeyDirFull { needed })
        }
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
        write(&self.keydir).handles.insert(
            num,
            Handle::File(file.clone()),
            self.opts.open_files_max,
        );
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
}

/// The key-directory changes of a batch, kept until its fsync.
fn updates_of(
    ops: &[OpRef<'_>],
    locations: &[Location],
    first_seq: u64,
    commit_seq: u64,
) -> Vec<Update> {
    let mut puts = locations.iter();
    let mut updates: Vec<Update> = ops
        .iter()
        .enumerate()
        .map(|(i, op)| match op {
            OpRef::Put { .. } => Update::Put(
                op.key().to_vec(),
                *puts.next().expect("one location per put"),
            ),
            OpRef::Delete { key } => Update::Delete(key.to_vec(), first_seq + i as u64),
        })
        .collect();
    updates.push(Update::Seq(commit_seq));
    updates
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
