//! Walking the put and tombstone records of one data file, each with its
//! offset and size, in file order: from the file's hint when it has a valid
//! one (no value is read), else by a strict scan of the data file. Record
//! enumeration (`engine::records`) and merges that retain history
//! (`merge`) use it; recovery has its own loop (it also rebuilds hints).
//!
//! A hint gives every put's offset but a tombstone's as 0 (FORMAT.md). The
//! walk finds a tombstone's offset without reading values:
//! - in a merge output, records follow each other with nothing between
//!   them (its only commit record ends the last part), so a tombstone
//!   starts where the record listed before it ends (the first one right
//!   after the file header);
//! - in a segment, a tombstone whose sequence follows the previous listed
//!   record's by one is in the same batch, so it starts where that record
//!   ends; one that starts a batch is the record whose sequence matches
//!   after the commit records in between, whose fixed parts the walk reads
//!   from the data file to step over them (one small read per commit
//!   record, never a value).

use std::path::Path;

use vfs::{Vfs, VfsFile};

use crate::engine::{RecordView, StoredKind};
use crate::error::{Error, Result};
use crate::format::{
    FILE_HEADER_SIZE_BYTES, FileId, RECORD_WITH_META_HEADER_SIZE_BYTES, RecordKind,
    decode_record_header, path_in, record_size,
};
use crate::hint::{self, HintRead};
use crate::record_meta::RecordMeta;
use crate::recovery::{Scanner, open_data};

/// One record the walk found: what it says and where it is.
pub(crate) struct Walked<'a> {
    /// Key, kind, sequence, expiry, value length and meta.
    pub(crate) view: RecordView<'a>,
    /// Offset of the record in the data file.
    pub(crate) offset: u32,
    /// Size of the whole record in bytes.
    pub(crate) size: u32,
}

/// Calls `f` for every put and tombstone record of data file `id` in the
/// first `len` bytes (the whole file for a sealed one; the committed prefix
/// of the active segment), in file order. `use_hint`: read the file's hint
/// if it is valid (sealed files); otherwise, and when it is not, scan the
/// data file, refusing any bad record as corruption.
pub(crate) fn walk_file(
    vfs: &dyn Vfs,
    dir: &Path,
    id: &FileId,
    len: u64,
    use_hint: bool,
    f: &mut dyn FnMut(&Walked<'_>) -> Result<()>,
) -> Result<()> {
    let (file, header) = open_data(vfs, dir, id)?;
    if use_hint && let Some(hint) = hint::load(vfs, dir, id, &header, len, HintRead::Map)? {
        let mut previous: Option<(u64, u64)> = None; // (seq, end) of the last record listed
        for entry in hint.entries() {
            let kind = match entry.kind {
                RecordKind::Put => StoredKind::Put,
                RecordKind::Tombstone => StoredKind::Tombstone,
                RecordKind::Commit => continue,
            };
            let size =
                record_size(entry.key.len(), entry.value_len as usize, entry.meta.len()) as u64;
            let offset = match kind {
                StoredKind::Put => u64::from(entry.offset),
                StoredKind::Tombstone => {
                    let start = previous.map_or(FILE_HEADER_SIZE_BYTES as u64, |(_, end)| end);
                    let contiguous = match (id, previous) {
                        (FileId::Merge { .. }, _) => true,
                        (_, Some((seq, _))) => seq.checked_add(1) == Some(entry.seq),
                        (FileId::Segment { first_seq }, None) => *first_seq == entry.seq,
                    };
                    if contiguous {
                        start
                    } else {
                        step_over_commits(file.as_ref(), dir, id, start, len, entry.seq)?
                    }
                }
            };
            if offset.checked_add(size).is_none_or(|end| end > len) {
                return Err(Error::Corruption {
                    file: id.hint_name(),
                    offset,
                    reason: format!(
                        "hint entry for sequence {} names a {size}-byte record at offset {offset} of a {len}-byte data file",
                        entry.seq
                    ),
                });
            }
            let meta = RecordMeta::new(entry.meta).map_err(|e| Error::Corruption {
                file: id.hint_name(),
                offset,
                reason: e.to_string(),
            })?;
            f(&Walked {
                view: RecordView {
                    key: entry.key,
                    kind,
                    seq: entry.seq,
                    expiry_ms: entry.expiry_ms,
                    value_len: entry.value_len,
                    meta,
                },
                // Both fit: the record ends within a file of `len` bytes,
                // and data files stay far below 4 GiB (offsets are u32 in
                // the format).
                offset: offset as u32,
                size: size as u32,
            })?;
            previous = Some((entry.seq, offset + size));
        }
        return Ok(());
    }
    let path = path_in(dir, &id.data_name());
    let mut scanner = Scanner::new(file.as_ref(), len);
    while let Some(next) = scanner.next().map_err(|e| Error::io(&path, e))? {
        let scanned = next.map_err(|fault| Error::Corruption {
            file: id.data_name(),
            offset: scanner.pos,
            reason: format!("bad record: {fault:?}"),
        })?;
        let kind = match scanned.header.kind {
            RecordKind::Put => StoredKind::Put,
            RecordKind::Tombstone => StoredKind::Tombstone,
            RecordKind::Commit => continue,
        };
        f(&Walked {
            view: RecordView {
                key: &scanned.key,
                kind,
                seq: scanned.header.seq,
                expiry_ms: scanned.header.expiry_ms,
                value_len: scanned.header.value_len,
                meta: scanned.meta,
            },
            offset: scanned.offset as u32,
            size: scanned.header.record_size() as u32,
        })?;
    }
    Ok(())
}

/// The offset of the tombstone with `seq` that starts a batch at or after
/// `start`: steps over the commit records in between, reading only their
/// fixed parts.
fn step_over_commits(
    file: &dyn VfsFile,
    dir: &Path,
    id: &FileId,
    start: u64,
    len: u64,
    seq: u64,
) -> Result<u64> {
    let mut pos = start;
    let mut head = [0u8; RECORD_WITH_META_HEADER_SIZE_BYTES];
    let corruption = |pos: u64, reason: String| Error::Corruption {
        file: id.data_name(),
        offset: pos,
        reason,
    };
    while pos < len {
        let n = (len - pos).min(head.len() as u64) as usize;
        file.read_exact_at(&mut head[..n], pos)
            .map_err(|e| Error::io(path_in(dir, &id.data_name()), e))?;
        let header = decode_record_header(&head[..n], len - pos)
            .map_err(|fault| corruption(pos, format!("bad record: {fault:?}")))?;
        match header.kind {
            RecordKind::Commit => pos += header.record_size() as u64,
            RecordKind::Tombstone if header.seq == seq => return Ok(pos),
            _ => {
                return Err(corruption(
                    pos,
                    format!(
                        "the hint lists a tombstone with sequence {seq} here, the file holds a {:?} with sequence {}",
                        header.kind, header.seq
                    ),
                ));
            }
        }
    }
    Err(corruption(
        len,
        format!("the hint lists a tombstone with sequence {seq} the file does not hold"),
    ))
}
