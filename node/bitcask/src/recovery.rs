//! Opening a data directory: finding the live files, rebuilding the key
//! directory from hints (or scans), and repairing a torn active segment.
//!
//! Rules, in order:
//! 1. `*.tmp` files are unfinished writes: deleted.
//! 2. Merge outputs form generations named by cut-off; a generation is
//!    complete when its part 0 exists (part 0 is renamed last). The newest
//!    complete generation is current; every other generation is deleted, and
//!    so is every segment whose first sequence is below the current
//!    generation's boundary (its records are in the merge output).
//! 3. Files are read in order: merge parts, then segments by first sequence.
//!    A file with a hint, and every segment but the last, is sealed: a bad
//!    record in it is corruption, reported with file and offset.
//! 4. The last segment without a hint is the active one. Records after its
//!    last commit record, and a torn or checksum-bad tail, are cut off — but
//!    never inside the published prefix: a bad record there is corruption.
//!    An active segment left with no complete batch is deleted (its name
//!    came from a batch that never committed). One that reached the rotation
//!    size is sealed, exactly as the write path would have done.

use std::collections::{BTreeSet, HashSet};
use std::path::Path;
use std::sync::Arc;

use crate::engine::{Active, FileMeta, FileSet, Writer, checksum_file};
use crate::error::{Error, Result};
use crate::format::{
    DATA_MAGIC, DATA_SUFFIX, FILE_HEADER_SIZE_BYTES, FileHeader, FileId, HINT_SUFFIX, HintEntry,
    RECORD_WITH_META_HEADER_SIZE_BYTES, RecordFault, RecordHeader, RecordKind, TEMP_SUFFIX,
    decode_record_header, path_in,
};
use crate::hint::{self, HintRead, HintWriter};
use crate::keydir::{KeyDir, Location};
use crate::options::{FILL_AHEAD_BYTES, Options};
use crate::record_meta::RecordMeta;
use vfs::{Vfs, VfsFile};

/// Bytes read at a time when scanning a data file.
const SCAN_WINDOW_BYTES: usize = 4 * 1024 * 1024;

/// What recovery hands the engine.
#[derive(Debug)]
pub(crate) struct Recovered {
    pub(crate) keydir: KeyDir,
    pub(crate) files: FileSet,
    pub(crate) writer: Writer,
}

pub(crate) fn recover(dir: &Path, opts: &Options) -> Result<Recovered> {
    let vfs = opts.vfs.as_ref();
    let listing = list_files(vfs, dir)?;
    let mut changed = listing.removed_temp;
    let plan = plan(vfs, dir, listing)?;
    let published = opts.published_prefix.as_ref();
    if let Some(published) = published {
        check_published_exists(&plan.ordered, published.file.as_str(), plan.boundary)?;
    }
    let (keydir, files, active) = load_files(vfs, dir, opts, &plan)?;
    check_last_merge_committed(&files)?;
    let last_meta = match &active {
        Some(active) => active.last_commit.clone(),
        None => files
            .sealed
            .last()
            .and_then(|meta| meta.last_commit.clone()),
    }
    .map(|(_, meta)| meta);
    for id in &plan.superseded {
        tracing::info!(file = %id.data_name(), "deleting a file superseded by a merge");
        remove(vfs, dir, &id.data_name())?;
        remove(vfs, dir, &id.hint_name())?;
        changed = true;
    }
    for id in &plan.orphan_hints {
        remove(vfs, dir, &id.hint_name())?;
        changed = true;
    }
    if changed {
        vfs.sync_dir(dir).map_err(|e| Error::io(dir, e))?;
    }
    let last_seq = keydir.applied_seq();
    Ok(Recovered {
        keydir,
        files,
        writer: Writer::new(active, last_seq, last_meta),
    })
}

/// The engine's files in a directory (rule 1 applied: `*.tmp` deleted).
struct Listing {
    data: BTreeSet<FileId>,
    hints: HashSet<FileId>,
    /// Whether a `*.tmp` file was deleted (the directory needs an fsync).
    removed_temp: bool,
}

fn list_files(vfs: &dyn Vfs, dir: &Path) -> Result<Listing> {
    let names = vfs.list(dir).map_err(|e| Error::io(dir, e))?;
    let mut listing = Listing {
        data: BTreeSet::new(),
        hints: HashSet::new(),
        removed_temp: false,
    };
    for name in names {
        if name.ends_with(TEMP_SUFFIX) {
            remove(vfs, dir, &name)?;
            listing.removed_temp = true;
        } else if let Some(id) = name.strip_suffix(DATA_SUFFIX).and_then(FileId::parse_stem) {
            listing.data.insert(id);
        } else if let Some(id) = name.strip_suffix(HINT_SUFFIX).and_then(FileId::parse_stem) {
            listing.hints.insert(id);
        } else if name != vfs::LOCK_FILE_NAME {
            tracing::warn!(file = %name, dir = %dir.display(), "ignoring a file that is not the engine's");
        }
    }
    Ok(listing)
}

/// Which files to load, in order, and which to delete once they loaded.
struct Plan {
    /// Data files to load: merge parts, then segments by first sequence.
    ordered: Vec<FileId>,
    /// Hints of the files in `ordered`.
    hints: HashSet<FileId>,
    /// Files a merge replaced (rule 2).
    superseded: Vec<FileId>,
    /// Hints without their data file.
    orphan_hints: Vec<FileId>,
    /// The current merge generation's boundary (0 without one).
    boundary: u64,
}

/// Rule 2: the current merge generation and what it supersedes; checks
/// that the current generation has every part.
fn plan(vfs: &dyn Vfs, dir: &Path, listing: Listing) -> Result<Plan> {
    let Listing {
        mut data,
        mut hints,
        ..
    } = listing;
    let current = data
        .iter()
        .filter_map(|id| match id {
            FileId::Merge { cutoff, part: 0 } => Some(*cutoff),
            _ => None,
        })
        .max();
    let mut boundary = 0;
    if let Some(cutoff) = current {
        let id = FileId::Merge { cutoff, part: 0 };
        let (_, header) = open_data(vfs, dir, &id)?;
        boundary = header.boundary;
    }
    let superseded: Vec<FileId> = data
        .iter()
        .filter(|id| match id {
            FileId::Merge { cutoff, .. } => Some(*cutoff) != current,
            FileId::Segment { first_seq } => *first_seq < boundary,
        })
        .copied()
        .collect();
    // Superseded files are deleted only after the files that replace them
    // loaded without error (a damaged merge output must not cost its inputs).
    for id in &superseded {
        data.remove(id);
    }
    let orphan_hints: Vec<FileId> = hints
        .iter()
        .filter(|id| !data.contains(id))
        .copied()
        .collect();
    hints.retain(|id| data.contains(id));

    let ordered: Vec<FileId> = data.into_iter().collect();
    let mut expected_part = 0;
    for id in &ordered {
        if let FileId::Merge { part, .. } = id {
            if *part != expected_part {
                return Err(Error::Corruption {
                    file: id.data_name(),
                    offset: 0,
                    reason: format!("merge part {expected_part} is missing"),
                });
            }
            expected_part += 1;
        }
    }
    Ok(Plan {
        ordered,
        hints,
        superseded,
        orphan_hints,
        boundary,
    })
}

/// Rules 3 and 4: loads the planned files in order into a key directory;
/// the last segment without a hint becomes the active one (or is sealed,
/// or deleted from the set when it holds no complete batch).
fn load_files(
    vfs: &dyn Vfs,
    dir: &Path,
    opts: &Options,
    plan: &Plan,
) -> Result<(KeyDir, FileSet, Option<Active>)> {
    let ordered = &plan.ordered;
    let published = opts.published_prefix.as_ref();
    // Hints are loaded in write order; the directory's order is built once,
    // sorted, when every file is in. The hash index is sized once, for
    // every entry the hints claim plus, for files without one (the active
    // segment), their length at the hinted files' bytes per entry (lengths
    // as the files really are, not as the unchecked trailers say): growing
    // step by step would rehash every key loaded so far. The claim counts
    // overwritten and deleted keys too; `finish_loading` fits the index to
    // the keys that are there.
    let (mut entries, mut hinted_bytes, mut unhinted_bytes) = (0u64, 0u64, 0u64);
    for id in ordered {
        let len = vfs
            .open(&path_in(dir, &id.data_name()))
            .and_then(|file| file.len())
            .unwrap_or(0);
        match plan
            .hints
            .contains(id)
            .then(|| hint::claimed_entries(vfs, dir, id))
            .flatten()
        {
            Some(count) => {
                entries = entries.saturating_add(count);
                hinted_bytes = hinted_bytes.saturating_add(len);
            }
            None => unhinted_bytes = unhinted_bytes.saturating_add(len),
        }
    }
    if let Some(bytes_per_entry) = hinted_bytes.checked_div(entries).filter(|&b| b > 0) {
        entries = entries.saturating_add(unhinted_bytes / bytes_per_entry);
    }
    let mut keydir = KeyDir::loading(usize::try_from(entries).unwrap_or(usize::MAX));
    let mut files = FileSet::default();
    let mut active = None;
    let last_index = ordered.len().checked_sub(1);
    for (index, id) in ordered.iter().enumerate() {
        let is_last_segment = Some(index) == last_index && matches!(id, FileId::Segment { .. });
        let path = path_in(dir, &id.data_name());
        if is_last_segment && !plan.hints.contains(id) {
            let num = files.allocate(path);
            let published_len = published
                .filter(|p| p.file == id.data_name())
                .map(|p| p.len);
            match recover_active(vfs, dir, id, num, published_len, &mut keydir)? {
                Some(found) if found.len >= opts.segment_size_bytes => {
                    // The write path would have sealed it at this batch boundary.
                    let meta = seal_recovered(vfs, dir, found)?;
                    files.sealed.push(Arc::new(meta));
                }
                Some(found) => {
                    files.active = Some((found.num, found.id));
                    active = Some(found);
                }
                None => {
                    files.paths.remove(&num);
                }
            }
        } else {
            let num = files.allocate(path);
            // Only the last part of a merge ends with a commit record.
            let next_is_merge = matches!(ordered.get(index + 1), Some(FileId::Merge { .. }));
            let needs_commit = !(matches!(id, FileId::Merge { .. }) && next_is_merge);
            let meta = load_sealed(vfs, dir, id, num, plan.boundary, needs_commit, &mut keydir)?;
            files.sealed.push(Arc::new(meta));
        }
    }
    // Replay put history too (superseded puts not merged away yet, and those
    // a retaining merge kept): the high-water reflects the live keys only.
    keydir.reset_expiry_high();
    keydir.finish_loading();
    Ok((keydir, files, active))
}

/// Seals a recovered active segment that reached the rotation size: fsync,
/// hint, directory fsync, as the write path's seal does.
fn seal_recovered(vfs: &dyn Vfs, dir: &Path, found: Active) -> Result<FileMeta> {
    let crc = found.hasher.clone().finalize();
    found
        .file
        .sync()
        .map_err(|e| Error::io(path_in(dir, &found.id.data_name()), e))?;
    found.hint.finish(vfs, found.len, crc)?;
    vfs.sync_dir(dir).map_err(|e| Error::io(dir, e))?;
    Ok(FileMeta {
        id: found.id,
        num: found.num,
        len: found.len,
        crc,
        max_seq: found.max_seq,
        last_commit: found.last_commit,
    })
}

/// The last merge part must end with a commit record (else a part is missing).
fn check_last_merge_committed(files: &FileSet) -> Result<()> {
    if let Some(last_merge) = files
        .sealed
        .iter()
        .rev()
        .find(|m| matches!(m.id, FileId::Merge { .. }))
        && last_merge.last_commit.is_none()
    {
        return Err(Error::Corruption {
            file: last_merge.id.data_name(),
            offset: last_merge.len,
            reason: "the last part of the merge holds no commit record (a part is missing)"
                .to_string(),
        });
    }
    Ok(())
}

fn remove(vfs: &dyn Vfs, dir: &Path, name: &str) -> Result<()> {
    let path = path_in(dir, name);
    match vfs.remove(&path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Error::io(&path, e)),
    }
}

/// The published file must still exist, unless it was sealed and merged
/// away (a later file exists, or the merge boundary passed it).
fn check_published_exists(ordered: &[FileId], published: &str, boundary: u64) -> Result<()> {
    if ordered.iter().any(|id| id.data_name() == published) {
        return Ok(());
    }
    let published_seq = published
        .strip_suffix(DATA_SUFFIX)
        .and_then(FileId::parse_stem)
        .and_then(|id| match id {
            FileId::Segment { first_seq } => Some(first_seq),
            FileId::Merge { .. } => None,
        });
    let passed = match published_seq {
        Some(seq) => {
            seq < boundary
                || ordered
                    .iter()
                    .any(|id| matches!(id, FileId::Segment { first_seq } if *first_seq > seq))
        }
        None => true,
    };
    if passed {
        Ok(())
    } else {
        Err(Error::Corruption {
            file: published.to_string(),
            offset: 0,
            reason: "the published segment is missing".to_string(),
        })
    }
}

/// Opens data file `id` and checks its header against its name.
pub(crate) fn open_data(
    vfs: &dyn Vfs,
    dir: &Path,
    id: &FileId,
) -> Result<(Arc<dyn VfsFile>, FileHeader)> {
    let path = path_in(dir, &id.data_name());
    let file = vfs.open(&path).map_err(|e| Error::io(&path, e))?;
    let mut bytes = [0u8; FILE_HEADER_SIZE_BYTES];
    let len = file.len().map_err(|e| Error::io(&path, e))?;
    if len < FILE_HEADER_SIZE_BYTES as u64 {
        return Err(Error::Corruption {
            file: id.data_name(),
            offset: 0,
            reason: format!("file is {len} bytes, shorter than its header"),
        });
    }
    file.read_exact_at(&mut bytes, 0)
        .map_err(|e| Error::io(&path, e))?;
    let header = FileHeader::decode(&bytes, DATA_MAGIC, &id.data_name())?;
    let name_says = id.header(header.boundary);
    if header != name_says {
        return Err(Error::Corruption {
            file: id.data_name(),
            offset: 0,
            reason: format!("header {header:?} does not match the file name"),
        });
    }
    Ok((file, header))
}

/// Walks the records of a data file.
pub(crate) struct Scanner<'a> {
    file: &'a dyn VfsFile,
    len: u64,
    window: Vec<u8>,
    window_start: u64,
    /// Offset of the next record (after a fault: of the bad one).
    pub(crate) pos: u64,
}

impl<'a> Scanner<'a> {
    pub(crate) fn new(file: &'a dyn VfsFile, len: u64) -> Scanner<'a> {
        Scanner {
            file,
            len,
            window: Vec::new(),
            window_start: 0,
            pos: FILE_HEADER_SIZE_BYTES as u64,
        }
    }

    /// Bytes `[pos, pos + n)`, or fewer if the file ends first.
    fn bytes(&mut self, pos: u64, n: usize) -> std::io::Result<&[u8]> {
        let end = (pos + n as u64).min(self.len);
        if pos < self.window_start || end > self.window_start + self.window.len() as u64 {
            let size = (end - pos)
                .max(SCAN_WINDOW_BYTES as u64)
                .min(self.len - pos) as usize;
            self.window.resize(size, 0);
            self.file.read_exact_at(&mut self.window, pos)?;
            self.window_start = pos;
        }
        let from = (pos - self.window_start) as usize;
        Ok(&self.window[from..from + (end - pos) as usize])
    }

    /// The next record or the fault at `pos`.
    pub(crate) fn next(
        &mut self,
    ) -> std::io::Result<Option<std::result::Result<Scanned, RecordFault>>> {
        if self.pos >= self.len {
            return Ok(None);
        }
        let pos = self.pos;
        let remaining = self.len - pos;
        // Enough for the meta length of a record with meta (fewer at the end).
        let head = self
            .bytes(pos, RECORD_WITH_META_HEADER_SIZE_BYTES)?
            .to_vec();
        let header = match decode_record_header(&head, remaining) {
            Ok(header) => header,
            Err(fault) => return Ok(Some(Err(fault))),
        };
        let size = header.record_size();
        let record = self.bytes(pos, size)?;
        if crc32fast::hash(&record[4..]) != header.crc {
            return Ok(Some(Err(RecordFault::Invalid(
                "record checksum mismatch".to_string(),
            ))));
        }
        let (meta, key, value) = header.split(record);
        let meta = match RecordMeta::new(meta) {
            Ok(meta) => meta,
            Err(e) => return Ok(Some(Err(RecordFault::Invalid(e.to_string())))),
        };
        let key = key.to_vec();
        let value = if header.kind == RecordKind::Commit {
            value.to_vec()
        } else {
            Vec::new()
        };
        self.pos += size as u64;
        Ok(Some(Ok(Scanned {
            offset: pos,
            header,
            meta,
            key,
            value,
        })))
    }
}

/// A record a [`Scanner`] read (its value only for commit records).
pub(crate) struct Scanned {
    pub(crate) offset: u64,
    pub(crate) header: RecordHeader,
    pub(crate) meta: RecordMeta,
    pub(crate) key: Vec<u8>,
    /// Commit: the batch metadata; otherwise empty (values are never read).
    pub(crate) value: Vec<u8>,
}

fn apply_record(keydir: &mut KeyDir, num: u32, record: &Scanned) {
    let Scanned {
        offset,
        header,
        meta,
        key,
        ..
    } = record;
    match header.kind {
        RecordKind::Put => keydir.put(
            key,
            Location {
                file: num,
                offset: *offset as u32,
                value_len: header.value_len,
                seq: header.seq,
                expiry_ms: header.expiry_ms,
                meta: *meta,
            },
        ),
        RecordKind::Tombstone => keydir.delete(key, header.seq),
        RecordKind::Commit => keydir.note_seq(header.seq),
    }
}

/// Loads a sealed file from its hint, or by a strict scan that rewrites the hint.
fn load_sealed(
    vfs: &dyn Vfs,
    dir: &Path,
    id: &FileId,
    num: u32,
    boundary: u64,
    needs_commit: bool,
    keydir: &mut KeyDir,
) -> Result<FileMeta> {
    let (file, header) = open_data(vfs, dir, id)?;
    if matches!(id, FileId::Merge { .. }) && header.boundary != boundary {
        return Err(Error::Corruption {
            file: id.data_name(),
            offset: 0,
            reason: format!(
                "merge boundary {} differs from part 0's {boundary}",
                header.boundary
            ),
        });
    }
    let path = path_in(dir, &id.data_name());
    let len = file.len().map_err(|e| Error::io(&path, e))?;
    let mut max_seq = 0;
    let mut last_commit = None;
    if let Some(hint) = hint::load(vfs, dir, id, &header, len, HintRead::Read)? {
        for entry in hint.entries() {
            max_seq = max_seq.max(entry.seq);
            match entry.kind {
                RecordKind::Put => keydir.put(
                    entry.key,
                    Location {
                        file: num,
                        offset: entry.offset,
                        value_len: entry.value_len,
                        seq: entry.seq,
                        expiry_ms: entry.expiry_ms,
                        // `decode_hint_entry` refused any longer meta.
                        meta: RecordMeta::new(entry.meta)
                            .expect("a decoded hint meta fits RECORD_META_BYTES_MAX"),
                    },
                ),
                RecordKind::Tombstone => keydir.delete(entry.key, entry.seq),
                RecordKind::Commit => {
                    keydir.note_seq(entry.seq);
                    last_commit = Some((entry.seq, entry.key.to_vec()));
                }
            }
        }
        return Ok(FileMeta {
            id: *id,
            num,
            len,
            crc: hint.trailer.data_crc,
            max_seq,
            last_commit,
        });
    }
    tracing::warn!(file = %id.data_name(), "hint missing or invalid; scanning the segment");
    let mut writer = HintWriter::create(vfs, dir, id, &header)?;
    let mut scanner = Scanner::new(file.as_ref(), len);
    while let Some(next) = scanner.next().map_err(|e| Error::io(&path, e))? {
        let scanned = next.map_err(|fault| Error::Corruption {
            file: id.data_name(),
            offset: scanner.pos,
            reason: format!("bad record in a sealed file: {fault:?}"),
        })?;
        let header = &scanned.header;
        max_seq = max_seq.max(header.seq);
        apply_record(keydir, num, &scanned);
        match header.kind {
            RecordKind::Commit => {
                writer.commit(&scanned.value, scanned.offset as u32, header.seq);
                last_commit = Some((header.seq, scanned.value));
            }
            _ => writer.add(&HintEntry::of_record(
                header,
                scanned.meta.as_bytes(),
                &scanned.key,
                scanned.offset,
            ))?,
        }
    }
    if needs_commit && last_commit.is_none() {
        return Err(Error::Corruption {
            file: id.data_name(),
            offset: len,
            reason: "sealed file holds no commit record".to_string(),
        });
    }
    let (_, crc) = checksum_file(file.as_ref(), None)
        .map_err(|e| Error::io(&path, e))?
        .expect("whole file");
    writer.finish(vfs, len, crc)?;
    vfs.sync_dir(dir).map_err(|e| Error::io(dir, e))?;
    Ok(FileMeta {
        id: *id,
        num,
        len,
        crc,
        max_seq,
        last_commit,
    })
}

/// Recovers the active segment; `None` when it holds no complete batch (deleted).
fn recover_active(
    vfs: &dyn Vfs,
    dir: &Path,
    id: &FileId,
    num: u32,
    published_len: Option<u64>,
    keydir: &mut KeyDir,
) -> Result<Option<Active>> {
    let path = path_in(dir, &id.data_name());
    let file = vfs.open(&path).map_err(|e| Error::io(&path, e))?;
    let len = file.len().map_err(|e| Error::io(&path, e))?;
    let published = published_len.unwrap_or(0);
    if len < published {
        return Err(Error::Corruption {
            file: id.data_name(),
            offset: len,
            reason: format!("file is {len} bytes but {published} bytes were published"),
        });
    }
    let header = match open_data(vfs, dir, id) {
        Ok((_, header)) => header,
        // A header that never reached the disk: the segment was created and
        // nothing in it was made durable.
        Err(Error::Corruption { .. })
            if published == 0 && !header_is_complete(file.as_ref(), len) =>
        {
            tracing::warn!(file = %id.data_name(), "deleting an active segment whose header never reached the disk");
            remove(vfs, dir, &id.data_name())?;
            vfs.sync_dir(dir).map_err(|e| Error::io(dir, e))?;
            return Ok(None);
        }
        Err(e) => return Err(e),
    };
    let mut hint = HintWriter::create(vfs, dir, id, &header)?;
    let mut scanner = Scanner::new(file.as_ref(), len);
    let mut batch: Vec<Scanned> = Vec::new();
    let mut committed_end = FILE_HEADER_SIZE_BYTES as u64;
    let mut max_seq = 0;
    let mut last_commit = None;
    let mut fault = None;
    while let Some(next) = scanner.next().map_err(|e| Error::io(&path, e))? {
        let scanned = match next {
            Ok(found) => found,
            Err(why) => {
                fault = Some((scanner.pos, why));
                break;
            }
        };
        if scanned.header.kind != RecordKind::Commit {
            batch.push(scanned);
            continue;
        }
        for record in batch.drain(..) {
            apply_record(keydir, num, &record);
            hint.add(&HintEntry::of_record(
                &record.header,
                record.meta.as_bytes(),
                &record.key,
                record.offset,
            ))?;
        }
        let seq = scanned.header.seq;
        keydir.note_seq(seq);
        hint.commit(&scanned.value, scanned.offset as u32, seq);
        max_seq = seq;
        last_commit = Some((seq, scanned.value));
        committed_end = scanner.pos;
    }
    if committed_end < len {
        let (fault_at, why) = fault.unwrap_or((
            committed_end,
            RecordFault::Invalid("batch without commit record".to_string()),
        ));
        if committed_end < published {
            return Err(Error::Corruption {
                file: id.data_name(),
                offset: fault_at,
                reason: format!(
                    "bad record inside the published prefix ({published} bytes): {why:?}"
                ),
            });
        }
        if is_fill_ahead(file.as_ref(), committed_end, len) {
            // What the write path writes ahead (`FILL_AHEAD_BYTES`) and a
            // clean close would have cut.
            tracing::debug!(
                file = %id.data_name(),
                offset = committed_end,
                cut_bytes = len - committed_end,
                "cutting the zeros written ahead of the active segment's end"
            );
        } else {
            tracing::warn!(
                file = %id.data_name(),
                offset = committed_end,
                cut_bytes = len - committed_end,
                fault_at,
                reason = ?why,
                "truncating an incomplete or torn tail of the active segment"
            );
        }
        file.truncate(committed_end)
            .map_err(|e| Error::io(&path, e))?;
    }
    // What a killed process wrote may still be only in the page cache: make
    // the recovered state durable before anything builds on it (a published
    // prefix, a merge cut-off, or acknowledging reads of it).
    file.sync().map_err(|e| Error::io(&path, e))?;
    if last_commit.is_none() {
        hint.discard(vfs);
        remove(vfs, dir, &id.data_name())?;
        vfs.sync_dir(dir).map_err(|e| Error::io(dir, e))?;
        return Ok(None);
    }
    let (_, crc) = checksum_file(file.as_ref(), Some(committed_end))
        .map_err(|e| Error::io(&path, e))?
        .expect("prefix exists");
    // Resumes the running checksum as if the prefix had just been hashed.
    let hasher = crc32fast::Hasher::new_with_initial_len(crc, committed_end);
    Ok(Some(Active {
        num,
        id: *id,
        file,
        len: committed_end,
        filled: committed_end,
        hasher,
        hint,
        max_seq,
        last_commit,
    }))
}

/// Whether `from..len` is what the write path fills ahead of a last batch
/// ending at `from`: zeros up to the next block boundary.
fn is_fill_ahead(file: &dyn VfsFile, from: u64, len: u64) -> bool {
    if len <= from || len != from.next_multiple_of(FILL_AHEAD_BYTES) {
        return false;
    }
    let mut bytes = vec![0u8; (len - from) as usize];
    file.read_exact_at(&mut bytes, from).is_ok() && bytes.iter().all(|&b| b == 0)
}

fn header_is_complete(file: &dyn VfsFile, len: u64) -> bool {
    if len < FILE_HEADER_SIZE_BYTES as u64 {
        return false;
    }
    let mut bytes = [0u8; FILE_HEADER_SIZE_BYTES];
    if file.read_exact_at(&mut bytes, 0).is_err() {
        return false;
    }
    crc32fast::hash(&bytes[..crate::format::HEADER_CRC_OFFSET])
        == crate::format::u32_at(&bytes, crate::format::HEADER_CRC_OFFSET)
}
