//! The on-disk format: file headers, records and hint entries.
//!
//! `FORMAT.md` next to this crate is the prose version of this file; every
//! offset and size below appears there too. All integers are little-endian.
//! Nothing in this module touches a file: it only turns bytes into values and
//! back, so it is the one place that knows the layout.

use crate::error::{Error, Result};
use crate::options::RECORD_META_BYTES_MAX;

// ---------------------------------------------------------------------------
// File header: the first `FILE_HEADER_SIZE_BYTES` of every data and hint file.
// ---------------------------------------------------------------------------

/// Magic of a data file (segment or merge output): ASCII `RCBD`.
pub const DATA_MAGIC: [u8; 4] = *b"RCBD";
/// Magic of a hint file: ASCII `RCBH`.
pub const HINT_MAGIC: [u8; 4] = *b"RCBH";
/// Format version written into every file; readers refuse any other.
pub const FORMAT_VERSION: u16 = 1;

/// Header field offsets (bytes from the start of the file).
pub const HEADER_MAGIC_OFFSET: usize = 0; // [u8; 4] DATA_MAGIC or HINT_MAGIC
pub const HEADER_VERSION_OFFSET: usize = 4; // u16 FORMAT_VERSION
pub const HEADER_KIND_OFFSET: usize = 6; // u8 FileKind
pub const HEADER_RESERVED_OFFSET: usize = 7; // u8, always 0
pub const HEADER_ID_OFFSET: usize = 8; // u64: segment first seq, or merge cut-off
pub const HEADER_BOUNDARY_OFFSET: usize = 16; // u64: merge boundary seq, 0 for segments
pub const HEADER_PART_OFFSET: usize = 24; // u32: merge part index, 0 for segments
pub const HEADER_CRC_OFFSET: usize = 28; // u32: crc32 of bytes 0..28
/// Size of the header at the start of every data and hint file.
pub const FILE_HEADER_SIZE_BYTES: usize = 32;
const _: () = assert!(HEADER_CRC_OFFSET + 4 == FILE_HEADER_SIZE_BYTES);

/// What a file holds; byte 6 of its header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum FileKind {
    /// A segment written by the write path, named after its first sequence.
    Segment = 1,
    /// A part of a merge output, named after the merge cut-off.
    Merge = 2,
}

/// A decoded file header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileHeader {
    /// Segment or merge output.
    pub kind: FileKind,
    /// Segment: sequence number of its first record. Merge: the cut-off.
    pub id: u64,
    /// Merge: every input record has a sequence below this; segment: 0.
    pub boundary: u64,
    /// Merge: index of this part of the output; segment: 0.
    pub part: u32,
}

impl FileHeader {
    /// Encodes the header with `magic` (data or hint).
    pub fn encode(&self, magic: [u8; 4]) -> [u8; FILE_HEADER_SIZE_BYTES] {
        let mut out = [0u8; FILE_HEADER_SIZE_BYTES];
        out[HEADER_MAGIC_OFFSET..HEADER_MAGIC_OFFSET + 4].copy_from_slice(&magic);
        out[HEADER_VERSION_OFFSET..HEADER_VERSION_OFFSET + 2]
            .copy_from_slice(&FORMAT_VERSION.to_le_bytes());
        out[HEADER_KIND_OFFSET] = self.kind as u8;
        out[HEADER_RESERVED_OFFSET] = 0;
        out[HEADER_ID_OFFSET..HEADER_ID_OFFSET + 8].copy_from_slice(&self.id.to_le_bytes());
        out[HEADER_BOUNDARY_OFFSET..HEADER_BOUNDARY_OFFSET + 8]
            .copy_from_slice(&self.boundary.to_le_bytes());
        out[HEADER_PART_OFFSET..HEADER_PART_OFFSET + 4].copy_from_slice(&self.part.to_le_bytes());
        let crc = crc32fast::hash(&out[..HEADER_CRC_OFFSET]);
        out[HEADER_CRC_OFFSET..].copy_from_slice(&crc.to_le_bytes());
        out
    }

    /// Decodes and checks a header; `file` names the file in errors.
    pub fn decode(bytes: &[u8], magic: [u8; 4], file: &str) -> Result<FileHeader> {
        let bad = |reason: String| Error::Corruption {
            file: file.to_string(),
            offset: 0,
            reason,
        };
        if bytes.len() < FILE_HEADER_SIZE_BYTES {
            return Err(bad(format!(
                "file header is {} bytes, expected {FILE_HEADER_SIZE_BYTES}",
                bytes.len()
            )));
        }
        if bytes[HEADER_MAGIC_OFFSET..HEADER_MAGIC_OFFSET + 4] != magic {
            return Err(bad("bad magic number".to_string()));
        }
        let crc = u32_at(bytes, HEADER_CRC_OFFSET);
        if crc != crc32fast::hash(&bytes[..HEADER_CRC_OFFSET]) {
            return Err(bad("file header checksum mismatch".to_string()));
        }
        let version = u16_at(bytes, HEADER_VERSION_OFFSET);
        if version != FORMAT_VERSION {
            return Err(bad(format!(
                "format version {version}, this build reads {FORMAT_VERSION}"
            )));
        }
        let kind = match bytes[HEADER_KIND_OFFSET] {
            1 => FileKind::Segment,
            2 => FileKind::Merge,
            other => return Err(bad(format!("unknown file kind {other}"))),
        };
        Ok(FileHeader {
            kind,
            id: u64_at(bytes, HEADER_ID_OFFSET),
            boundary: u64_at(bytes, HEADER_BOUNDARY_OFFSET),
            part: u32_at(bytes, HEADER_PART_OFFSET),
        })
    }
}

// ---------------------------------------------------------------------------
// Records: everything after the header of a data file is a run of records.
// ---------------------------------------------------------------------------

pub const RECORD_CRC_OFFSET: usize = 0; // u32: crc32 of bytes 4..end of record
pub const RECORD_KIND_OFFSET: usize = 4; // u8: RecordKind
pub const RECORD_KEY_LEN_OFFSET: usize = 5; // u16: key length in bytes
pub const RECORD_VALUE_LEN_OFFSET: usize = 7; // u32: value length in bytes
pub const RECORD_SEQ_OFFSET: usize = 11; // u64: sequence number
pub const RECORD_EXPIRY_OFFSET: usize = 19; // u64: expiry, ms (caller's clock); 0 = never
/// Size of the fixed part of a record; the key follows, then the value.
pub const RECORD_HEADER_SIZE_BYTES: usize = 27;
const _: () = assert!(RECORD_EXPIRY_OFFSET + 8 == RECORD_HEADER_SIZE_BYTES);
/// Records with meta (kinds 4 and 5) only: after the fixed part, the meta
/// length (u8, 1..=RECORD_META_BYTES_MAX), then the meta, then the key and value.
pub const RECORD_META_LEN_OFFSET: usize = 27; // u8: meta length (kinds 4 and 5 only)
pub const RECORD_META_OFFSET: usize = 28; // meta bytes (kinds 4 and 5 only)
/// Size of the fixed part of a record with meta; the meta follows, then the
/// key, then the value.
pub const RECORD_WITH_META_HEADER_SIZE_BYTES: usize = 28;
const _: () = assert!(RECORD_META_LEN_OFFSET + 1 == RECORD_WITH_META_HEADER_SIZE_BYTES);
const _: () = assert!(RECORD_META_OFFSET == RECORD_WITH_META_HEADER_SIZE_BYTES);

/// Record kind bytes (byte 4 of a record, byte 0 of a hint entry). A put or
/// tombstone with an empty meta is written as kind 1 or 2, byte for byte as
/// before metas existed; one with a meta as kind 4 or 5.
pub const KIND_PUT: u8 = 1; // put, no meta
pub const KIND_TOMBSTONE: u8 = 2; // tombstone, no meta
pub const KIND_COMMIT: u8 = 3; // batch commit (never has a meta)
pub const KIND_PUT_WITH_META: u8 = 4; // put with a meta of 1..=RECORD_META_BYTES_MAX bytes
pub const KIND_TOMBSTONE_WITH_META: u8 = 5; // tombstone with a meta
const _: () = assert!(RECORD_META_BYTES_MAX <= u8::MAX as usize);

/// The largest key the format can hold (the key length is a u16).
pub const KEY_SIZE_BYTES_FORMAT_MAX: usize = u16::MAX as usize;

/// What a record means. Byte 4 of the record says it together with whether
/// a meta follows the fixed part (see [`RecordKind::byte`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecordKind {
    /// Key now has this value.
    Put,
    /// Key is deleted; the value is empty.
    Tombstone,
    /// Ends a batch; the key is empty and the value is the caller's metadata.
    Commit,
}

impl RecordKind {
    /// The kind byte of a record of this kind with (`has_meta`) or without
    /// a meta. A commit never has one.
    pub fn byte(self, has_meta: bool) -> u8 {
        match (self, has_meta) {
            (RecordKind::Put, false) => KIND_PUT,
            (RecordKind::Tombstone, false) => KIND_TOMBSTONE,
            (RecordKind::Put, true) => KIND_PUT_WITH_META,
            (RecordKind::Tombstone, true) => KIND_TOMBSTONE_WITH_META,
            (RecordKind::Commit, _) => {
                debug_assert!(!has_meta, "a commit record has no meta");
                KIND_COMMIT
            }
        }
    }

    /// The kind and whether a meta follows, from a kind byte.
    fn from_byte(byte: u8) -> Option<(RecordKind, bool)> {
        match byte {
            KIND_PUT => Some((RecordKind::Put, false)),
            KIND_TOMBSTONE => Some((RecordKind::Tombstone, false)),
            KIND_COMMIT => Some((RecordKind::Commit, false)),
            KIND_PUT_WITH_META => Some((RecordKind::Put, true)),
            KIND_TOMBSTONE_WITH_META => Some((RecordKind::Tombstone, true)),
            _ => None,
        }
    }
}

/// Why a meta length read from a record or hint is not acceptable, if it is not.
fn meta_len_fault(meta_len: usize) -> Option<String> {
    if meta_len == 0 {
        Some("record kind with meta but a meta length of 0".to_string())
    } else if meta_len > RECORD_META_BYTES_MAX {
        Some(format!(
            "meta length {meta_len} exceeds RECORD_META_BYTES_MAX ({RECORD_META_BYTES_MAX})"
        ))
    } else {
        None
    }
}

/// The fixed part of a record, decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecordHeader {
    /// The stored checksum.
    pub crc: u32,
    /// Put, tombstone or commit.
    pub kind: RecordKind,
    /// Key length in bytes.
    pub key_len: u16,
    /// Value length in bytes (the caller's value only, never the meta).
    pub value_len: u32,
    /// Sequence number.
    pub seq: u64,
    /// Expiry in ms of the caller's clock; 0 = never.
    pub expiry_ms: u64,
    /// Meta length in bytes: 0 for kinds 1 to 3, 1..=RECORD_META_BYTES_MAX
    /// for kinds 4 and 5.
    pub meta_len: u8,
}

impl RecordHeader {
    /// Total size of the record this header starts.
    pub fn record_size(&self) -> usize {
        record_size(
            self.key_len as usize,
            self.value_len as usize,
            self.meta_len as usize,
        )
    }

    /// Offset of the key in the record (the meta, if any, sits before it).
    pub fn key_offset(&self) -> usize {
        fixed_size(self.meta_len as usize) + self.meta_len as usize
    }

    /// The meta, key and value of `record`, a whole record this header was
    /// decoded from (as [`verify_record`] checked it).
    pub fn split<'a>(&self, record: &'a [u8]) -> (&'a [u8], &'a [u8], &'a [u8]) {
        let key_offset = self.key_offset();
        let value_offset = key_offset + self.key_len as usize;
        (
            &record[RECORD_META_OFFSET.min(key_offset)..key_offset],
            &record[key_offset..value_offset],
            &record[value_offset..self.record_size()],
        )
    }
}

/// Size of the fixed part of a record whose meta has `meta_len` bytes.
fn fixed_size(meta_len: usize) -> usize {
    if meta_len == 0 {
        RECORD_HEADER_SIZE_BYTES
    } else {
        RECORD_WITH_META_HEADER_SIZE_BYTES
    }
}

/// Size on disk of a record with these key, value and meta lengths (a meta
/// of 0 bytes: the record has no meta field at all).
pub fn record_size(key_len: usize, value_len: usize, meta_len: usize) -> usize {
    fixed_size(meta_len) + meta_len + key_len + value_len
}

/// Appends one record to `out`. An empty `meta` writes kind 1, 2 or 3 (the
/// layout from before metas existed), a non-empty one kind 4 or 5.
pub fn encode_record(
    out: &mut Vec<u8>,
    kind: RecordKind,
    seq: u64,
    expiry_ms: u64,
    meta: &[u8],
    key: &[u8],
    value: &[u8],
) {
    debug_assert!(key.len() <= KEY_SIZE_BYTES_FORMAT_MAX);
    debug_assert!(value.len() <= u32::MAX as usize);
    debug_assert!(meta.len() <= RECORD_META_BYTES_MAX);
    let start = out.len();
    out.extend_from_slice(&[0u8; 4]);
    out.push(kind.byte(!meta.is_empty()));
    out.extend_from_slice(&(key.len() as u16).to_le_bytes());
    out.extend_from_slice(&(value.len() as u32).to_le_bytes());
    out.extend_from_slice(&seq.to_le_bytes());
    out.extend_from_slice(&expiry_ms.to_le_bytes());
    if !meta.is_empty() {
        out.push(meta.len() as u8);
        out.extend_from_slice(meta);
    }
    out.extend_from_slice(key);
    out.extend_from_slice(value);
    let crc = crc32fast::hash(&out[start + 4..]);
    out[start..start + 4].copy_from_slice(&crc.to_le_bytes());
}

/// Why a record could not be decoded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RecordFault {
    /// Fewer bytes remain than the record needs (a torn write, or the end).
    Truncated,
    /// The bytes are all there but do not form a valid record.
    Invalid(String),
}

/// Decodes the fixed part of a record; `remaining` is how many bytes of the
/// file follow its start (so lengths that run past the end are caught).
/// `bytes` must hold [`RECORD_WITH_META_HEADER_SIZE_BYTES`] when that many
/// remain: a record with meta has its meta length there.
pub fn decode_record_header(
    bytes: &[u8],
    remaining: u64,
) -> std::result::Result<RecordHeader, RecordFault> {
    if bytes.len() < RECORD_HEADER_SIZE_BYTES {
        return Err(RecordFault::Truncated);
    }
    let (kind, has_meta) = RecordKind::from_byte(bytes[RECORD_KIND_OFFSET]).ok_or_else(|| {
        RecordFault::Invalid(format!("unknown record kind {}", bytes[RECORD_KIND_OFFSET]))
    })?;
    let meta_len = if has_meta {
        if bytes.len() < RECORD_WITH_META_HEADER_SIZE_BYTES {
            return Err(RecordFault::Truncated);
        }
        let meta_len = bytes[RECORD_META_LEN_OFFSET];
        if let Some(fault) = meta_len_fault(meta_len as usize) {
            return Err(RecordFault::Invalid(fault));
        }
        meta_len
    } else {
        0
    };
    let header = RecordHeader {
        crc: u32_at(bytes, RECORD_CRC_OFFSET),
        kind,
        key_len: u16_at(bytes, RECORD_KEY_LEN_OFFSET),
        value_len: u32_at(bytes, RECORD_VALUE_LEN_OFFSET),
        seq: u64_at(bytes, RECORD_SEQ_OFFSET),
        expiry_ms: u64_at(bytes, RECORD_EXPIRY_OFFSET),
        meta_len,
    };
    if header.record_size() as u64 > remaining {
        return Err(RecordFault::Truncated);
    }
    Ok(header)
}

/// Checks a whole record (header, key and value) against its checksum.
pub fn verify_record(record: &[u8]) -> std::result::Result<RecordHeader, RecordFault> {
    let header = decode_record_header(record, record.len() as u64)?;
    if header.record_size() != record.len() {
        return Err(RecordFault::Invalid("record length mismatch".to_string()));
    }
    if crc32fast::hash(&record[4..]) != header.crc {
        return Err(RecordFault::Invalid("record checksum mismatch".to_string()));
    }
    Ok(header)
}

// ---------------------------------------------------------------------------
// Hint files: the header (HINT_MAGIC), entries, then a trailer.
// ---------------------------------------------------------------------------

pub const HINT_KIND_OFFSET: usize = 0; // u8: kind byte of the data record (KIND_*)
pub const HINT_KEY_LEN_OFFSET: usize = 1; // u32: key length (commit: metadata length)
pub const HINT_VALUE_LEN_OFFSET: usize = 5; // u32: value length of the data record
pub const HINT_RECORD_OFFSET_OFFSET: usize = 9; // u32: offset of the record in the data file
pub const HINT_SEQ_OFFSET: usize = 13; // u64: sequence number
pub const HINT_EXPIRY_OFFSET: usize = 21; // u64: expiry ms, 0 = never
/// Size of the fixed part of a hint entry; the key (or metadata) follows.
pub const HINT_ENTRY_HEADER_SIZE_BYTES: usize = 29;
const _: () = assert!(HINT_EXPIRY_OFFSET + 8 == HINT_ENTRY_HEADER_SIZE_BYTES);
/// Entries of kinds 4 and 5 only: after the fixed part, the meta length (u8,
/// 1..=RECORD_META_BYTES_MAX), then the meta, then the key.
pub const HINT_META_LEN_OFFSET: usize = 29; // u8: meta length (kinds 4 and 5 only)
pub const HINT_META_OFFSET: usize = 30; // meta bytes (kinds 4 and 5 only)
/// Size of the fixed part of a hint entry with meta; the meta follows, then the key.
pub const HINT_ENTRY_WITH_META_HEADER_SIZE_BYTES: usize = 30;
const _: () = assert!(HINT_META_LEN_OFFSET + 1 == HINT_ENTRY_WITH_META_HEADER_SIZE_BYTES);
const _: () = assert!(HINT_META_OFFSET == HINT_ENTRY_WITH_META_HEADER_SIZE_BYTES);

pub const TRAILER_ENTRY_COUNT_OFFSET: usize = 0; // u64: number of entries
pub const TRAILER_DATA_LEN_OFFSET: usize = 8; // u64: length of the data file described
pub const TRAILER_DATA_CRC_OFFSET: usize = 16; // u32: crc32 of the whole data file
pub const TRAILER_HINT_CRC_OFFSET: usize = 20; // u32: crc32 of every hint byte before it
/// Size of the trailer that ends every hint file.
pub const HINT_TRAILER_SIZE_BYTES: usize = 24;
const _: () = assert!(TRAILER_HINT_CRC_OFFSET + 4 == HINT_TRAILER_SIZE_BYTES);

/// One decoded hint entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HintEntry<'a> {
    /// Kind of the data record it describes.
    pub kind: RecordKind,
    /// Put / tombstone: the key. Commit: the batch metadata.
    pub key: &'a [u8],
    /// Value length of the data record.
    pub value_len: u32,
    /// Offset of the data record in its file.
    pub offset: u32,
    /// Sequence number.
    pub seq: u64,
    /// Expiry ms, 0 = never.
    pub expiry_ms: u64,
    /// The record's meta (empty for commits and records without one).
    pub meta: &'a [u8],
}

impl<'a> HintEntry<'a> {
    /// The entry of a data record whose header is `header`, meta `meta`,
    /// key `key`, at `offset`. Tombstones get offset 0: the read path never
    /// reads a tombstone back (record listing derives its offset, see
    /// `crate::walk`), and a fixed value keeps hints identical however they
    /// were produced.
    pub fn of_record(
        header: &RecordHeader,
        meta: &'a [u8],
        key: &'a [u8],
        offset: u64,
    ) -> HintEntry<'a> {
        let offset = match header.kind {
            RecordKind::Tombstone => 0,
            _ => offset as u32,
        };
        HintEntry {
            kind: header.kind,
            key,
            value_len: header.value_len,
            offset,
            seq: header.seq,
            expiry_ms: header.expiry_ms,
            meta,
        }
    }

    /// The entry of a tombstone for `key` with `seq` and `meta`.
    pub fn tombstone(key: &'a [u8], meta: &'a [u8], seq: u64) -> HintEntry<'a> {
        HintEntry {
            kind: RecordKind::Tombstone,
            key,
            value_len: 0,
            offset: 0,
            seq,
            expiry_ms: 0,
            meta,
        }
    }
}

/// Appends one hint entry to `out`. An empty meta writes kind 1, 2 or 3 (the
/// layout from before metas existed), a non-empty one kind 4 or 5.
pub fn encode_hint_entry(out: &mut Vec<u8>, entry: &HintEntry<'_>) {
    debug_assert!(entry.meta.len() <= RECORD_META_BYTES_MAX);
    out.push(entry.kind.byte(!entry.meta.is_empty()));
    out.extend_from_slice(&(entry.key.len() as u32).to_le_bytes());
    out.extend_from_slice(&entry.value_len.to_le_bytes());
    out.extend_from_slice(&entry.offset.to_le_bytes());
    out.extend_from_slice(&entry.seq.to_le_bytes());
    out.extend_from_slice(&entry.expiry_ms.to_le_bytes());
    if !entry.meta.is_empty() {
        out.push(entry.meta.len() as u8);
        out.extend_from_slice(entry.meta);
    }
    out.extend_from_slice(entry.key);
}

/// Decodes the hint entry at the start of `bytes`; returns it and its size.
/// `None` for anything malformed (unknown kind, a meta length of 0 or above
/// [`RECORD_META_BYTES_MAX`], lengths running past the end).
pub fn decode_hint_entry(bytes: &[u8]) -> Option<(HintEntry<'_>, usize)> {
    if bytes.len() < HINT_ENTRY_HEADER_SIZE_BYTES {
        return None;
    }
    let (kind, has_meta) = RecordKind::from_byte(bytes[HINT_KIND_OFFSET])?;
    let (meta_start, meta_len) = if has_meta {
        let meta_len = *bytes.get(HINT_META_LEN_OFFSET)? as usize;
        if meta_len_fault(meta_len).is_some() {
            return None;
        }
        (HINT_META_OFFSET, meta_len)
    } else {
        (HINT_ENTRY_HEADER_SIZE_BYTES, 0)
    };
    let key_start = meta_start + meta_len;
    let key_len = u32_at(bytes, HINT_KEY_LEN_OFFSET) as usize;
    let size = key_start.checked_add(key_len)?;
    if bytes.len() < size {
        return None;
    }
    Some((
        HintEntry {
            kind,
            key: &bytes[key_start..size],
            value_len: u32_at(bytes, HINT_VALUE_LEN_OFFSET),
            offset: u32_at(bytes, HINT_RECORD_OFFSET_OFFSET),
            seq: u64_at(bytes, HINT_SEQ_OFFSET),
            expiry_ms: u64_at(bytes, HINT_EXPIRY_OFFSET),
            meta: &bytes[meta_start..key_start],
        },
        size,
    ))
}

/// The decoded trailer of a hint file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HintTrailer {
    /// Number of entries before the trailer.
    pub entry_count: u64,
    /// Length of the data file the hint describes.
    pub data_len: u64,
    /// crc32 of that whole data file.
    pub data_crc: u32,
}

/// Appends the trailer; `hint_crc` covers every hint byte before it.
pub fn encode_hint_trailer(out: &mut Vec<u8>, trailer: &HintTrailer, hint_crc: u32) {
    out.extend_from_slice(&trailer.entry_count.to_le_bytes());
    out.extend_from_slice(&trailer.data_len.to_le_bytes());
    out.extend_from_slice(&trailer.data_crc.to_le_bytes());
    out.extend_from_slice(&hint_crc.to_le_bytes());
}

/// Decodes a trailer; returns it and the hint crc it carries.
pub fn decode_hint_trailer(bytes: &[u8]) -> Option<(HintTrailer, u32)> {
    if bytes.len() != HINT_TRAILER_SIZE_BYTES {
        return None;
    }
    Some((
        HintTrailer {
            entry_count: u64_at(bytes, TRAILER_ENTRY_COUNT_OFFSET),
            data_len: u64_at(bytes, TRAILER_DATA_LEN_OFFSET),
            data_crc: u32_at(bytes, TRAILER_DATA_CRC_OFFSET),
        },
        u32_at(bytes, TRAILER_HINT_CRC_OFFSET),
    ))
}

// ---------------------------------------------------------------------------
// File names. They depend only on the position in the write stream.
// ---------------------------------------------------------------------------

/// Suffix of data files.
pub const DATA_SUFFIX: &str = ".data";
/// Suffix of hint files.
pub const HINT_SUFFIX: &str = ".hint";
/// Suffix of files being written; any left at open are deleted.
pub const TEMP_SUFFIX: &str = ".tmp";

/// What a file name says about the file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum FileId {
    /// `merge-<cutoff:020>-<part:04>`: part `part` of the merge at `cutoff`.
    Merge { cutoff: u64, part: u32 },
    /// `seg-<first_seq:020>`: segment whose first record has `first_seq`.
    Segment { first_seq: u64 },
}

impl FileId {
    /// The file name stem (without suffix).
    pub fn stem(&self) -> String {
        match self {
            FileId::Segment { first_seq } => format!("seg-{first_seq:020}"),
            FileId::Merge { cutoff, part } => format!("merge-{cutoff:020}-{part:04}"),
        }
    }

    /// Name of the data file.
    pub fn data_name(&self) -> String {
        format!("{}{DATA_SUFFIX}", self.stem())
    }

    /// Name of the hint file.
    pub fn hint_name(&self) -> String {
        format!("{}{HINT_SUFFIX}", self.stem())
    }

    /// Parses a stem produced by [`FileId::stem`].
    pub fn parse_stem(stem: &str) -> Option<FileId> {
        if let Some(rest) = stem.strip_prefix("seg-") {
            if rest.len() == 20 && rest.bytes().all(|b| b.is_ascii_digit()) {
                return Some(FileId::Segment {
                    first_seq: rest.parse().ok()?,
                });
            }
        } else if let Some(rest) = stem.strip_prefix("merge-") {
            let (cutoff, part) = rest.split_once('-')?;
            let digits = |text: &str| text.bytes().all(|b| b.is_ascii_digit());
            if cutoff.len() == 20 && part.len() == 4 && digits(cutoff) && digits(part) {
                return Some(FileId::Merge {
                    cutoff: cutoff.parse().ok()?,
                    part: part.parse().ok()?,
                });
            }
        }
        None
    }

    /// The header a data file with this name carries.
    pub fn header(&self, boundary: u64) -> FileHeader {
        match *self {
            FileId::Segment { first_seq } => FileHeader {
                kind: FileKind::Segment,
                id: first_seq,
                boundary: 0,
                part: 0,
            },
            FileId::Merge { cutoff, part } => FileHeader {
                kind: FileKind::Merge,
                id: cutoff,
                boundary,
                part,
            },
        }
    }
}

/// Joins a directory and a file name.
pub(crate) fn path_in(dir: &std::path::Path, name: &str) -> std::path::PathBuf {
    dir.join(name)
}

pub(crate) fn u16_at(bytes: &[u8], offset: usize) -> u16 {
    u16::from_le_bytes([bytes[offset], bytes[offset + 1]])
}

pub(crate) fn u32_at(bytes: &[u8], offset: usize) -> u32 {
    let mut raw = [0u8; 4];
    raw.copy_from_slice(&bytes[offset..offset + 4]);
    u32::from_le_bytes(raw)
}

pub(crate) fn u64_at(bytes: &[u8], offset: usize) -> u64 {
    let mut raw = [0u8; 8];
    raw.copy_from_slice(&bytes[offset..offset + 8]);
    u64::from_le_bytes(raw)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_round_trip_and_every_flipped_byte_is_caught() {
        let mut buf = Vec::new();
        encode_record(&mut buf, RecordKind::Put, 42, 7, &[], b"key", b"value");
        let header = verify_record(&buf).expect("valid record");
        assert_eq!(header.kind, RecordKind::Put);
        assert_eq!(header.seq, 42);
        assert_eq!(header.expiry_ms, 7);
        assert_eq!(header.key_len, 3);
        assert_eq!(header.value_len, 5);
        assert_eq!(header.record_size(), buf.len());
        for i in 0..buf.len() {
            let mut bad = buf.clone();
            bad[i] ^= 0x40;
            assert!(
                verify_record(&bad).is_err(),
                "flip at byte {i} went unnoticed"
            );
        }
    }

    #[test]
    fn header_round_trip_and_rejects_other_magic() {
        let header = FileHeader {
            kind: FileKind::Merge,
            id: 9,
            boundary: 11,
            part: 2,
        };
        let bytes = header.encode(DATA_MAGIC);
        assert_eq!(FileHeader::decode(&bytes, DATA_MAGIC, "f").unwrap(), header);
        assert!(FileHeader::decode(&bytes, HINT_MAGIC, "f").is_err());
        let mut bad = bytes;
        bad[HEADER_ID_OFFSET] ^= 1;
        assert!(FileHeader::decode(&bad, DATA_MAGIC, "f").is_err());
    }

    #[test]
    fn hint_entry_round_trip() {
        let mut buf = Vec::new();
        let entry = HintEntry {
            kind: RecordKind::Tombstone,
            key: b"abc",
            value_len: 0,
            offset: 77,
            seq: 5,
            expiry_ms: 0,
            meta: &[],
        };
        encode_hint_entry(&mut buf, &entry);
        let (entry, size) = decode_hint_entry(&buf).unwrap();
        assert_eq!(size, buf.len());
        assert_eq!(entry.key, b"abc");
        assert_eq!(entry.offset, 77);
        assert_eq!(entry.kind, RecordKind::Tombstone);
        assert!(decode_hint_entry(&buf[..buf.len() - 1]).is_none());
    }

    /// The record encoder as it was before metas existed, kept verbatim.
    fn encode_record_before_metas(
        out: &mut Vec<u8>,
        kind_byte: u8,
        seq: u64,
        expiry_ms: u64,
        key: &[u8],
        value: &[u8],
    ) {
        let start = out.len();
        out.extend_from_slice(&[0u8; 4]);
        out.push(kind_byte);
        out.extend_from_slice(&(key.len() as u16).to_le_bytes());
        out.extend_from_slice(&(value.len() as u32).to_le_bytes());
        out.extend_from_slice(&seq.to_le_bytes());
        out.extend_from_slice(&expiry_ms.to_le_bytes());
        out.extend_from_slice(key);
        out.extend_from_slice(value);
        let crc = crc32fast::hash(&out[start + 4..]);
        out[start..start + 4].copy_from_slice(&crc.to_le_bytes());
    }

    /// The hint entry encoder as it was before metas existed, kept verbatim.
    fn encode_hint_entry_before_metas(out: &mut Vec<u8>, kind_byte: u8, entry: &HintEntry<'_>) {
        out.push(kind_byte);
        out.extend_from_slice(&(entry.key.len() as u32).to_le_bytes());
        out.extend_from_slice(&entry.value_len.to_le_bytes());
        out.extend_from_slice(&entry.offset.to_le_bytes());
        out.extend_from_slice(&entry.seq.to_le_bytes());
        out.extend_from_slice(&entry.expiry_ms.to_le_bytes());
        out.extend_from_slice(entry.key);
    }

    #[test]
    fn an_empty_meta_encodes_exactly_the_bytes_from_before_metas() {
        for (kind, byte) in [
            (RecordKind::Put, 1u8),
            (RecordKind::Tombstone, 2),
            (RecordKind::Commit, 3),
        ] {
            let mut new = Vec::new();
            encode_record(&mut new, kind, 9, 11, &[], b"k", b"val");
            let mut old = Vec::new();
            encode_record_before_metas(&mut old, byte, 9, 11, b"k", b"val");
            assert_eq!(new, old, "{kind:?}");
            let entry = HintEntry {
                kind,
                key: b"k",
                value_len: 3,
                offset: 32,
                seq: 9,
                expiry_ms: 11,
                meta: &[],
            };
            let mut new = Vec::new();
            encode_hint_entry(&mut new, &entry);
            let mut old = Vec::new();
            encode_hint_entry_before_metas(&mut old, byte, &entry);
            assert_eq!(new, old, "{kind:?}");
        }
        // And a literal, so the helper above cannot drift with the encoder.
        let mut buf = Vec::new();
        encode_record(&mut buf, RecordKind::Put, 1, 0, &[], b"a", b"b");
        assert_eq!(
            &buf[4..],
            &[
                1, 1, 0, 1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, b'a', b'b'
            ]
        );
    }

    #[test]
    fn a_record_with_meta_round_trips_and_every_flipped_byte_is_caught() {
        for kind in [RecordKind::Put, RecordKind::Tombstone] {
            let mut buf = Vec::new();
            let value: &[u8] = if kind == RecordKind::Put {
                b"value"
            } else {
                b""
            };
            encode_record(&mut buf, kind, 42, 7, b"\x01\x02\x03", b"key", value);
            assert_eq!(buf[RECORD_KIND_OFFSET], kind.byte(true));
            assert_eq!(buf[RECORD_META_LEN_OFFSET], 3);
            let header = verify_record(&buf).expect("valid record");
            assert_eq!(header.kind, kind);
            assert_eq!(header.meta_len, 3);
            assert_eq!(header.value_len as usize, value.len());
            assert_eq!(header.record_size(), buf.len());
            assert_eq!(header.record_size(), record_size(3, value.len(), 3));
            let (meta, key, found) = header.split(&buf);
            assert_eq!(
                (meta, key, found),
                (&b"\x01\x02\x03"[..], &b"key"[..], value)
            );
            for i in 0..buf.len() {
                let mut bad = buf.clone();
                bad[i] ^= 0x40;
                assert!(
                    verify_record(&bad).is_err(),
                    "flip at byte {i} went unnoticed"
                );
            }
        }
    }

    #[test]
    fn a_meta_length_beyond_the_limit_or_zero_is_invalid_not_a_panic() {
        let mut buf = Vec::new();
        encode_record(&mut buf, RecordKind::Put, 1, 0, &[9; 4], b"k", b"v");
        for bad_len in [0u8, RECORD_META_BYTES_MAX as u8 + 1, u8::MAX] {
            let mut bad = buf.clone();
            bad[RECORD_META_LEN_OFFSET] = bad_len;
            match decode_record_header(&bad, bad.len() as u64) {
                Err(RecordFault::Invalid(reason)) => assert!(reason.contains("meta length")),
                other => panic!("meta length {bad_len}: {other:?}"),
            }
        }
        // A record with meta cut right after its fixed 27 bytes is torn.
        assert_eq!(
            decode_record_header(&buf[..RECORD_HEADER_SIZE_BYTES], 1000),
            Err(RecordFault::Truncated)
        );
    }

    #[test]
    fn hint_entry_with_meta_round_trips_and_a_bad_meta_length_is_refused() {
        for kind in [RecordKind::Put, RecordKind::Tombstone] {
            let entry = HintEntry {
                kind,
                key: b"abc",
                value_len: 4,
                offset: 77,
                seq: 5,
                expiry_ms: 3,
                meta: b"\xaa\xbb",
            };
            let mut buf = Vec::new();
            encode_hint_entry(&mut buf, &entry);
            assert_eq!(buf[HINT_KIND_OFFSET], kind.byte(true));
            let (found, size) = decode_hint_entry(&buf).unwrap();
            assert_eq!(size, buf.len());
            assert_eq!(found, entry);
            assert!(decode_hint_entry(&buf[..buf.len() - 1]).is_none());
            for bad_len in [0u8, RECORD_META_BYTES_MAX as u8 + 1, u8::MAX] {
                let mut bad = buf.clone();
                bad[HINT_META_LEN_OFFSET] = bad_len;
                bad.extend_from_slice(&[0u8; 300]);
                assert!(decode_hint_entry(&bad).is_none(), "meta length {bad_len}");
            }
        }
    }

    #[test]
    fn file_names_round_trip_and_sort_by_position() {
        let a = FileId::Segment { first_seq: 5 };
        let b = FileId::Segment { first_seq: 40 };
        let m = FileId::Merge {
            cutoff: 100,
            part: 3,
        };
        for id in [a, b, m] {
            assert_eq!(FileId::parse_stem(&id.stem()), Some(id));
        }
        assert!(a.data_name() < b.data_name());
        assert_eq!(FileId::parse_stem("seg-12"), None);
        assert_eq!(FileId::parse_stem("other"), None);
        assert_eq!(FileId::parse_stem("merge-+0000000000000000001-0000"), None);
    }
}
