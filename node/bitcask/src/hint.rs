//! Hint files: for each sealed data file, the key, sequence, expiry, record
//! meta and position of every record, so a restart rebuilds the key directory without
//! reading values.
//!
//! A hint is written while its segment is active, streamed into
//! `<name>.hint.tmp`, and renamed into place only after the data file was
//! fsynced at sealing; so a hint file that exists describes a sealed data
//! file. A hint whose checksum, length or header does not match is ignored
//! and its segment is scanned instead.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::format::{
    FILE_HEADER_SIZE_BYTES, FileHeader, FileId, HINT_ENTRY_HEADER_SIZE_BYTES, HINT_MAGIC,
    HINT_TRAILER_SIZE_BYTES, HintEntry, HintTrailer, RecordKind, TEMP_SUFFIX, decode_hint_entry,
    decode_hint_trailer, encode_hint_entry, encode_hint_trailer, path_in,
};
use vfs::{Mapping, Vfs, VfsFile};

/// Hint bytes buffered in memory before they are written to the temp file.
const HINT_FLUSH_BYTES: usize = 256 * 1024;

/// Streams the hint of one data file into a temp file.
#[derive(Debug)]
pub(crate) struct HintWriter {
    file: Arc<dyn VfsFile>,
    tmp_path: PathBuf,
    final_path: PathBuf,
    buf: Vec<u8>,
    written: u64,
    hasher: crc32fast::Hasher,
    count: u64,
    last_commit: Option<(Vec<u8>, u32, u64)>,
}

impl HintWriter {
    /// Starts the hint of data file `id` whose header is `header`.
    pub(crate) fn create(
        vfs: &dyn Vfs,
        dir: &Path,
        id: &FileId,
        header: &FileHeader,
    ) -> Result<HintWriter> {
        let final_path = path_in(dir, &id.hint_name());
        let tmp_path = path_in(dir, &format!("{}{TEMP_SUFFIX}", id.hint_name()));
        let file = vfs.create(&tmp_path).map_err(|e| Error::io(&tmp_path, e))?;
        let mut buf = Vec::with_capacity(HINT_FLUSH_BYTES);
        buf.extend_from_slice(&header.encode(HINT_MAGIC));
        Ok(HintWriter {
            file,
            tmp_path,
            final_path,
            buf,
            written: 0,
            hasher: crc32fast::Hasher::new(),
            count: 0,
            last_commit: None,
        })
    }

    /// Adds the entry of a put or tombstone record.
    pub(crate) fn add(&mut self, entry: &HintEntry<'_>) -> Result<()> {
        debug_assert!(entry.kind != RecordKind::Commit);
        encode_hint_entry(&mut self.buf, entry);
        self.count += 1;
        if self.buf.len() >= HINT_FLUSH_BYTES {
            self.flush()?;
        }
        Ok(())
    }

    /// Notes a commit record; only the file's last one goes into the hint.
    pub(crate) fn commit(&mut self, meta: &[u8], offset: u32, seq: u64) {
        self.last_commit = Some((meta.to_vec(), offset, seq));
    }

    fn flush(&mut self) -> Result<()> {
        self.hasher.update(&self.buf);
        self.file
            .write_all_at(&self.buf, self.written)
            .map_err(|e| Error::io(&self.tmp_path, e))?;
        self.written += self.buf.len() as u64;
        self.buf.clear();
        Ok(())
    }

    /// Writes the last commit entry and the trailer, fsyncs, and renames the
    /// hint into place. The caller fsyncs the directory.
    pub(crate) fn finish(mut self, vfs: &dyn Vfs, data_len: u64, data_crc: u32) -> Result<()> {
        if let Some((meta, offset, seq)) = self.last_commit.take() {
            let entry = HintEntry {
                kind: RecordKind::Commit,
                key: &meta,
                value_len: meta.len() as u32,
                offset,
                seq,
                expiry_ms: 0,
                meta: &[],
            };
            encode_hint_entry(&mut self.buf, &entry);
            self.count += 1;
        }
        self.hasher.update(&self.buf);
        let hint_crc = self.hasher.clone().finalize();
        let trailer = HintTrailer {
            entry_count: self.count,
            data_len,
            data_crc,
        };
        encode_hint_trailer(&mut self.buf, &trailer, hint_crc);
        self.file
            .write_all_at(&self.buf, self.written)
            .map_err(|e| Error::io(&self.tmp_path, e))?;
        self.file.sync().map_err(|e| Error::io(&self.tmp_path, e))?;
        vfs.rename(&self.tmp_path, &self.final_path)
            .map_err(|e| Error::io(&self.final_path, e))?;
        Ok(())
    }

    /// Abandons the hint (its temp file is deleted at the next open anyway).
    pub(crate) fn discard(self, vfs: &dyn Vfs) {
        let _ = vfs.remove(&self.tmp_path);
    }
}

/// How [`load`] gets a hint's bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum HintRead {
    /// Read into memory (recovery: a failing disk is an I/O error, not a
    /// fault in a mapped page).
    Read,
    /// Memory-mapped (record walks: no copy of a file that may be large;
    /// hints are never written after they are renamed into place).
    Map,
}

/// A valid hint: its bytes (entries in file order) and the trailer.
pub(crate) struct LoadedHint {
    bytes: Mapping,
    pub(crate) trailer: HintTrailer,
}

impl std::fmt::Debug for LoadedHint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadedHint")
            .field("len", &self.bytes.as_ref().as_ref().len())
            .field("trailer", &self.trailer)
            .finish()
    }
}

impl LoadedHint {
    /// The entries, in the order of the records in the data file.
    pub(crate) fn entries(&self) -> impl Iterator<Item = HintEntry<'_>> + '_ {
        let bytes: &[u8] = self.bytes.as_ref().as_ref();
        let body = &bytes[..bytes.len() - HINT_TRAILER_SIZE_BYTES];
        let mut pos = FILE_HEADER_SIZE_BYTES;
        std::iter::from_fn(move || {
            let (entry, size) = decode_hint_entry(&body[pos..])?;
            pos += size;
            Some(entry)
        })
    }
}

/// The entry count data file `id`'s hint claims in its trailer, without
/// reading or checking the rest: a capacity estimate for recovery, bounded
/// by what the hint's length can hold, so a damaged trailer cannot make it
/// larger than the file justifies. `None` when there is no readable hint.
pub(crate) fn claimed_entries(vfs: &dyn Vfs, dir: &Path, id: &FileId) -> Option<u64> {
    let file = vfs.open(&path_in(dir, &id.hint_name())).ok()?;
    let len = file.len().ok()?;
    let body = len.checked_sub((FILE_HEADER_SIZE_BYTES + HINT_TRAILER_SIZE_BYTES) as u64)?;
    let mut trailer = [0u8; HINT_TRAILER_SIZE_BYTES];
    file.read_exact_at(&mut trailer, len - HINT_TRAILER_SIZE_BYTES as u64)
        .ok()?;
    let (trailer, _) = decode_hint_trailer(&trailer)?;
    // Every entry is at least its fixed part and one key byte.
    Some(
        trailer
            .entry_count
            .min(body / (HINT_ENTRY_HEADER_SIZE_BYTES as u64 + 1)),
    )
}

/// Reads (or maps, per `how`) and checks the hint of data file `id`, whose
/// header is `header` and length `data_len`. `Ok(None)` means "missing or
/// not trustworthy: scan".
pub(crate) fn load(
    vfs: &dyn Vfs,
    dir: &Path,
    id: &FileId,
    header: &FileHeader,
    data_len: u64,
    how: HintRead,
) -> Result<Option<LoadedHint>> {
    let path = path_in(dir, &id.hint_name());
    let file = match vfs.open(&path) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::io(&path, e)),
    };
    let len = file.len().map_err(|e| Error::io(&path, e))? as usize;
    if len < FILE_HEADER_SIZE_BYTES + HINT_TRAILER_SIZE_BYTES {
        return Ok(None);
    }
    let bytes: Mapping = match how {
        HintRead::Read => {
            let mut bytes = vec![0u8; len];
            file.read_exact_at(&mut bytes, 0)
                .map_err(|e| Error::io(&path, e))?;
            Arc::new(bytes)
        }
        HintRead::Map => file.map().map_err(|e| Error::io(&path, e))?,
    };
    let all: &[u8] = bytes.as_ref().as_ref();
    if all.len() != len {
        return Ok(None);
    }
    let (body, trailer_bytes) = all.split_at(len - HINT_TRAILER_SIZE_BYTES);
    let Some((trailer, hint_crc)) = decode_hint_trailer(trailer_bytes) else {
        return Ok(None);
    };
    if crc32fast::hash(body) != hint_crc || trailer.data_len != data_len {
        return Ok(None);
    }
    match FileHeader::decode(body, HINT_MAGIC, &id.hint_name()) {
        Ok(found) if found == *header => {}
        _ => return Ok(None),
    }
    // Walk the entries once so a structurally bad hint falls back to a scan
    // before any of it reaches the key directory.
    let mut pos = FILE_HEADER_SIZE_BYTES;
    let mut count = 0u64;
    while pos < body.len() {
        let Some((_, size)) = decode_hint_entry(&body[pos..]) else {
            return Ok(None);
        };
        pos += size;
        count += 1;
    }
    if count != trailer.entry_count {
        return Ok(None);
    }
    Ok(Some(LoadedHint { bytes, trailer }))
}
