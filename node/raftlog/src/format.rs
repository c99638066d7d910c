//! The on-disk format (`LOG_FORMAT.md`, same names): segment names and
//! headers, records, metadata files — how each is laid out, written and
//! validated. No I/O here: callers hand in bytes.

use std::ops::Range;
use std::path::Path;

use crate::error::LogError;
use crate::limits::LOG_ENTRY_SIZE_BYTES_MAX;

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

pub(crate) fn parse_segment_name(name: &str) -> Option<u64> {
    let digits = name
        .strip_prefix(SEGMENT_PREFIX)?
        .strip_suffix(SEGMENT_SUFFIX)?;
    if digits.len() != 20 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

pub(crate) fn segment_header(first_index: u64) -> Vec<u8> {
    let mut header = Vec::with_capacity(SEGMENT_HEADER_BYTES as usize);
    header.extend_from_slice(&SEGMENT_MAGIC);
    header.extend_from_slice(&LOG_FORMAT_VERSION.to_le_bytes());
    header.extend_from_slice(&first_index.to_le_bytes());
    let crc = crc32fast::hash(&header);
    header.extend_from_slice(&crc.to_le_bytes());
    header
}

/// Validates the header of the segment named for `first_index` (`bytes`
/// holds the file from its start, at least [`SEGMENT_HEADER_BYTES`] of it):
/// magic, format version, checksum, and a first index matching the name.
pub(crate) fn check_segment_header(
    path: &Path,
    bytes: &[u8],
    first_index: u64,
) -> Result<(), LogError> {
    let corrupt = |offset: u64, reason: String| LogError::Corrupt {
        path: path.to_path_buf(),
        offset,
        reason,
    };
    if bytes[..8] != SEGMENT_MAGIC {
        return Err(corrupt(0, "bad magic number".into()));
    }
    let version = u32_at(bytes, SEGMENT_HEADER_VERSION_OFFSET);
    if version != LOG_FORMAT_VERSION {
        return Err(corrupt(
            SEGMENT_HEADER_VERSION_OFFSET as u64,
            format!("format version {version}, this build reads {LOG_FORMAT_VERSION}"),
        ));
    }
    if crc32fast::hash(&bytes[..SEGMENT_HEADER_CRC_OFFSET])
        != u32_at(bytes, SEGMENT_HEADER_CRC_OFFSET)
    {
        return Err(corrupt(
            SEGMENT_HEADER_CRC_OFFSET as u64,
            "segment header checksum mismatch".into(),
        ));
    }
    let header_first = u64_at(bytes, SEGMENT_HEADER_FIRST_INDEX_OFFSET);
    if header_first != first_index {
        return Err(corrupt(
            SEGMENT_HEADER_FIRST_INDEX_OFFSET as u64,
            format!("header says first index {header_first}, the name says {first_index}"),
        ));
    }
    Ok(())
}

pub(crate) fn u32_at(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"))
}

pub(crate) fn u64_at(bytes: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"))
}

/// Appends one record to `buf`.
pub(crate) fn encode_record(buf: &mut Vec<u8>, index: u64, log_id: &[u8], entry: &[u8]) {
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
pub(crate) struct RecordView {
    /// Total length (header + body).
    pub(crate) len: usize,
    /// The log index in the record header.
    pub(crate) index: u64,
    /// The encoded log id, relative to the record start.
    pub(crate) log_id: Range<usize>,
    /// The encoded entry, relative to the record start.
    pub(crate) entry: Range<usize>,
}

/// Why a record is bad: `torn` if it may be the cut-off end of an unsynced
/// write (short, checksum mismatch), otherwise it is damage whatever follows.
pub(crate) struct BadRecord {
    pub(crate) reason: String,
    pub(crate) torn: bool,
}

/// Validates the record starting at `bytes[0]` (a slice to the end of the data).
pub(crate) fn parse_record(bytes: &[u8]) -> Result<RecordView, BadRecord> {
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
pub(crate) fn valid_record_after(bytes: &[u8], from: usize, min_index: u64) -> bool {
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

pub(crate) fn encode_meta(kind: u32, payload: &[u8]) -> Vec<u8> {
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

pub(crate) fn decode_meta<'a>(
    path: &Path,
    bytes: &'a [u8],
    kind: u32,
) -> Result<&'a [u8], LogError> {
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
