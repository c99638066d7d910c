//! # kvarchive
//!
//! The backup archive: one file holding one snapshot of a member — its
//! `MANIFEST` and its files — as `kvctl snapshot save FILE` writes it (fed
//! by the `SaveSnapshot` stream) and `kvnode restore` reads it. This crate
//! is the format only (std + `crc32fast`): a streaming writer and a
//! verifying reader. Restoring a member from an archive is kvnode's
//! (`kvnode::snapshot::backup`).
//!
//! ## Modules
//!
//! - [`envelope`]: the snapshot MANIFEST's envelope (magic, version, body
//!   length, CRC-32), checked by kvctl before it saves and by kvnode's
//!   decoder.
//! - [`writer`]: [`ArchiveWriter`], an archive from the manifest's bytes
//!   and the files' bytes in manifest order, every chunk's file, offset,
//!   length and CRC-32 checked as it goes.
//! - [`reader`]: [`read_archive`] and [`verify_archive`], which check every
//!   field of an archive and hand each file's bytes to a sink.
//! - this file: the format's constants, [`ArchiveFile`] (one file's name,
//!   length and CRC-32) and [`ArchiveError`].
//!
//! ## The manifest is opaque here
//!
//! The archive carries the member's snapshot `MANIFEST` verbatim
//! (`node/kvnode/SNAPSHOT_FORMAT.md`: format version, last log id,
//! membership, cluster id, files; it carries its own CRC-32) and never
//! decodes its body: [`envelope`] checks only the envelope (magic,
//! version, length, CRC-32), and the caller says which files the manifest
//! lists, in order ([`ArchiveFile`]s). `kvnode` decodes the manifest for that;
//! `kvctl snapshot save` takes the list the `SaveSnapshot` stream sends
//! next to the manifest's bytes (`SnapshotManifest.files`, which the member
//! fills from the same manifest).
//!
//! # Archive format (version 1)
//!
//! One file, written front to back (a stream can produce it). All integers
//! are little-endian; every checksum is CRC-32 (IEEE, the `crc32fast`
//! crate).
//!
//! | size | field |
//! | --- | --- |
//! | 8 | magic `RCBACKUP` ([`ARCHIVE_MAGIC`]) |
//! | 4 | format version, u32 = 1 ([`ARCHIVE_FORMAT_VERSION`]) |
//! | 4 | manifest length `M`, u32 (≤ [`MANIFEST_BYTES_MAX`] = 16 MiB) |
//! | `M` | the member's snapshot `MANIFEST`, verbatim |
//! | 4 | file count `F`, u32: equal to the manifest's file count |
//! | | then `F` files, in the manifest's order, each: |
//! | 2 | name length `n`, u16 (≤ [`FILE_NAME_BYTES_MAX`] = 255) |
//! | `n` | file name, UTF-8: the manifest's name for this position |
//! | 8 | length `L`, u64: the manifest's length for this file |
//! | 4 | CRC-32 of the `L` bytes: the manifest's CRC for this file |
//! | `L` | the file's bytes (for the active segment: the prefix the snapshot covers) |
//! | | then the trailer: |
//! | 8 | end magic `RCBKDONE` ([`ARCHIVE_END_MAGIC`]) |
//! | 4 | CRC-32 of every byte of the archive before this field |
//!
//! Nothing may follow the trailer. A reader refuses any difference between
//! a file's header and the manifest's list, any file whose bytes do not
//! match its CRC, a bad trailer, a truncation or trailing bytes.
//!
//! ## Example
//!
//! ```
//! use kvarchive::{ArchiveFile, ArchiveWriter, read_archive};
//!
//! let files = vec![ArchiveFile::of("seg-1.data", b"hello")];
//! let mut writer = ArchiveWriter::new(Vec::new(), b"opaque manifest", files.clone()).unwrap();
//! writer.write_chunk("seg-1.data", 0, b"hello").unwrap();
//! let bytes = writer.finish().unwrap();
//!
//! let summary = read_archive::<_, kvarchive::ArchiveError>(
//!     &bytes[..],
//!     &mut |_manifest| Ok(files.clone()),
//!     &mut |_file, _data| Ok(()),
//! )
//! .unwrap();
//! assert_eq!(summary.file_bytes, 5);
//! assert_eq!(summary.manifest_bytes, b"opaque manifest");
//! ```

use std::io;
use std::path::PathBuf;

pub mod envelope;
pub mod reader;
pub mod writer;

pub use envelope::manifest_body;
pub use reader::{
    ArchiveSummary, FileSink, ManifestFiles, in_archive, read_archive, verify_archive,
};
pub use writer::ArchiveWriter;

/// Magic at the start of an archive.
pub const ARCHIVE_MAGIC: [u8; 8] = *b"RCBACKUP";
/// Archive format version this code writes and reads.
pub const ARCHIVE_FORMAT_VERSION: u32 = 1;
/// Magic that opens the trailer.
pub const ARCHIVE_END_MAGIC: [u8; 8] = *b"RCBKDONE";
/// Largest manifest an archive holds, in bytes (a member's own manifest
/// limit, kvnode's `snapshot::MANIFEST_BYTES_MAX`, is checked to fit).
pub const MANIFEST_BYTES_MAX: usize = 16 * 1024 * 1024;
/// Longest file name in an archive, in bytes (kvnode's
/// `snapshot::FILE_NAME_BYTES_MAX` is checked to fit).
pub const FILE_NAME_BYTES_MAX: usize = 255;
/// Bytes read or written at a time when copying file contents (bounds the
/// memory a backup or restore holds).
pub const ARCHIVE_COPY_BYTES: usize = 1024 * 1024;

/// One file of the manifest, as its archive header repeats it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ArchiveFile {
    /// The file's name in the snapshot directory.
    pub name: String,
    /// Its length in bytes.
    pub len: u64,
    /// CRC-32 of its bytes.
    pub crc: u32,
}

impl ArchiveFile {
    /// The entry for a file named `name` holding `bytes`.
    pub fn of(name: &str, bytes: &[u8]) -> ArchiveFile {
        ArchiveFile {
            name: name.to_string(),
            len: bytes.len() as u64,
            crc: crc32fast::hash(bytes),
        }
    }
}

/// Why an archive could not be written or read.
#[derive(Debug, thiserror::Error)]
pub enum ArchiveError {
    /// A file operation failed.
    #[error("{op} {path}: {source}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// On which path.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
    /// The archive (or a stream being written into one) is malformed or
    /// does not match its manifest.
    #[error("archive: {0}")]
    Format(String),
}

pub(crate) fn format_err(reason: impl Into<String>) -> ArchiveError {
    ArchiveError::Format(reason.into())
}

/// A file's header: name length, name, length, CRC-32.
pub(crate) fn file_header(file: &ArchiveFile) -> Vec<u8> {
    let mut header = Vec::with_capacity(14 + file.name.len());
    header.extend_from_slice(&(file.name.len() as u16).to_le_bytes());
    header.extend_from_slice(file.name.as_bytes());
    header.extend_from_slice(&file.len.to_le_bytes());
    header.extend_from_slice(&file.crc.to_le_bytes());
    header
}
