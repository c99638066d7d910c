//! The snapshot archive: one file holding a whole saved snapshot (what
//! `kvctl snapshot save FILE` writes and `kvnode restore --from FILE`
//! reads). Writer, reader and verifier; std and `crc32fast` only, so the
//! module can move to a shared crate unchanged.
//!
//! # Format (version 1)
//!
//! All integers little-endian. `crc32` is IEEE CRC-32 as `crc32fast`
//! computes it.
//!
//! Header:
//!
//! | bytes | field |
//! |-------|-------|
//! | 8     | magic `RCASKSNP` ([`MAGIC`]) |
//! | 4     | u32 format version, `1` ([`FORMAT_VERSION`]) |
//! | 8     | u64 last log index the snapshot covers |
//! | 8     | u64 term of that entry |
//! | 2     | u16 snapshot id length `n` (at most [`ID_SIZE_BYTES_MAX`]) |
//! | n     | snapshot id, UTF-8 |
//! | 4     | u32 manifest length `m` (at most [`MANIFEST_SIZE_BYTES_MAX`]) |
//! | m     | the node's own encoded manifest, verbatim (opaque here) |
//! | 4     | u32 file count `f` (at most [`FILES_MAX`]) |
//!
//! then `f` file records, in the order the files' bytes follow:
//!
//! | bytes | field |
//! |-------|-------|
//! | 2     | u16 name length `k` (1 ..= [`NAME_SIZE_BYTES_MAX`]) |
//! | k     | file name, UTF-8, a plain name (no `/`, `\`, NUL, not `.` or `..`) |
//! | 8     | u64 file length in bytes |
//! | 4     | u32 crc32 of the file's bytes |
//!
//! and the header ends with:
//!
//! | bytes | field |
//! |-------|-------|
//! | 4     | u32 crc32 of every header byte before it (magic included) |
//!
//! Body: each file's bytes, in the header's order, back to back (a file of
//! length 0 takes no bytes).
//!
//! Trailer: the 8 bytes `RCASKEND` ([`END_MAGIC`]), then end of file.
//!
//! A reader checks the magic, the version, every limit, the header crc,
//! each file's length and crc while copying it, the trailer and that
//! nothing follows it. Any failure is an [`ArchiveError`] naming what was
//! wrong; a truncated archive is an error, never a shorter snapshot.

use std::fmt;
use std::io::{self, Read, Write};
use std::path::Path;

/// First 8 bytes of every archive.
pub const MAGIC: [u8; 8] = *b"RCASKSNP";
/// Last 8 bytes of every archive.
pub const END_MAGIC: [u8; 8] = *b"RCASKEND";
/// The format version this module writes and reads.
pub const FORMAT_VERSION: u32 = 1;
/// Longest snapshot id, in bytes.
pub const ID_SIZE_BYTES_MAX: usize = 1024;
/// Largest manifest, in bytes (a manifest lists files; far below this).
pub const MANIFEST_SIZE_BYTES_MAX: usize = 64 * 1024 * 1024;
/// Most files in one archive.
pub const FILES_MAX: usize = 1_000_000;
/// Longest file name, in bytes.
pub const NAME_SIZE_BYTES_MAX: usize = 255;
/// Size of the copy buffer of the reader.
const COPY_BUFFER_SIZE_BYTES: usize = 256 * 1024;

/// One file of the snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileEntry {
    /// The engine file's name (a plain name, no directories).
    pub name: String,
    /// Its length in bytes.
    pub length_bytes: u64,
    /// crc32 of its bytes.
    pub crc32: u32,
}

/// Everything in the archive's header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArchiveHeader {
    /// The snapshot's id.
    pub snapshot_id: String,
    /// The last log index the snapshot covers.
    pub last_log_index: u64,
    /// The term of that entry.
    pub last_log_term: u64,
    /// The node's own encoded manifest, verbatim.
    pub manifest: Vec<u8>,
    /// The files, in the order their bytes follow.
    pub files: Vec<FileEntry>,
}

impl ArchiveHeader {
    /// Total bytes of the files.
    pub fn data_bytes(&self) -> u64 {
        self.files.iter().map(|f| f.length_bytes).sum()
    }
}

/// What went wrong writing or reading an archive.
#[derive(Debug)]
pub enum ArchiveError {
    /// Reading or writing failed.
    Io(io::Error),
    /// The bytes are not a valid archive (or the writer was fed data that
    /// does not match the header): the message says where and why.
    Format(String),
    /// A value is over its limit.
    Limit {
        /// The field.
        field: &'static str,
        /// Its value.
        value: u64,
        /// The limit's name and value.
        limit: String,
    },
    /// A checksum does not match.
    Checksum {
        /// What was checked (the header, or a file's name).
        what: String,
        /// The crc32 the archive (or manifest) names.
        expected: u32,
        /// The crc32 of the bytes.
        actual: u32,
    },
}

impl fmt::Display for ArchiveError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ArchiveError::Io(err) => write!(f, "archive I/O: {err}"),
            ArchiveError::Format(message) => write!(f, "bad archive: {message}"),
            ArchiveError::Limit {
                field,
                value,
                limit,
            } => write!(f, "bad archive: {field} = {value} is over {limit}"),
            ArchiveError::Checksum {
                what,
                expected,
                actual,
            } => write!(
                f,
                "bad archive: crc32 of {what} is {actual:#010x}, expected {expected:#010x}"
            ),
        }
    }
}

impl std::error::Error for ArchiveError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ArchiveError::Io(err) => Some(err),
            _ => None,
        }
    }
}

impl From<io::Error> for ArchiveError {
    fn from(err: io::Error) -> Self {
        if err.kind() == io::ErrorKind::UnexpectedEof {
            ArchiveError::Format("truncated (unexpected end of file)".into())
        } else {
            ArchiveError::Io(err)
        }
    }
}

/// Result of the archive functions.
pub type Result<T, E = ArchiveError> = std::result::Result<T, E>;

fn limit(field: &'static str, value: usize, max: usize, name: &str) -> Result<()> {
    if value > max {
        return Err(ArchiveError::Limit {
            field,
            value: value as u64,
            limit: format!("{name} ({max})"),
        });
    }
    Ok(())
}

/// Checks a file name: a plain name within [`NAME_SIZE_BYTES_MAX`].
fn check_name(name: &str) -> Result<()> {
    limit(
        "file name length",
        name.len(),
        NAME_SIZE_BYTES_MAX,
        "NAME_SIZE_BYTES_MAX",
    )?;
    if name.is_empty() || name == "." || name == ".." || name.contains(['/', '\\', '\0']) {
        return Err(ArchiveError::Format(format!(
            "file name {name:?} is not a plain file name"
        )));
    }
    Ok(())
}

fn check_header(header: &ArchiveHeader) -> Result<()> {
    limit(
        "snapshot id length",
        header.snapshot_id.len(),
        ID_SIZE_BYTES_MAX,
        "ID_SIZE_BYTES_MAX",
    )?;
    limit(
        "manifest length",
        header.manifest.len(),
        MANIFEST_SIZE_BYTES_MAX,
        "MANIFEST_SIZE_BYTES_MAX",
    )?;
    limit("file count", header.files.len(), FILES_MAX, "FILES_MAX")?;
    let mut names = std::collections::BTreeSet::new();
    for file in &header.files {
        check_name(&file.name)?;
        if !names.insert(file.name.as_str()) {
            return Err(ArchiveError::Format(format!(
                "file {:?} is listed twice",
                file.name
            )));
        }
    }
    Ok(())
}

/// Encodes the header (crc included).
fn encode_header(header: &ArchiveHeader) -> Result<Vec<u8>> {
    check_header(header)?;
    let mut out = Vec::with_capacity(64 + header.manifest.len() + header.files.len() * 48);
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    out.extend_from_slice(&header.last_log_index.to_le_bytes());
    out.extend_from_slice(&header.last_log_term.to_le_bytes());
    // Lengths fit: checked against limits far below u16/u32 above.
    out.extend_from_slice(&(header.snapshot_id.len() as u16).to_le_bytes());
    out.extend_from_slice(header.snapshot_id.as_bytes());
    out.extend_from_slice(&(header.manifest.len() as u32).to_le_bytes());
    out.extend_from_slice(&header.manifest);
    out.extend_from_slice(&(header.files.len() as u32).to_le_bytes());
    for file in &header.files {
        out.extend_from_slice(&(file.name.len() as u16).to_le_bytes());
        out.extend_from_slice(file.name.as_bytes());
        out.extend_from_slice(&file.length_bytes.to_le_bytes());
        out.extend_from_slice(&file.crc32.to_le_bytes());
    }
    let crc = crc32fast::hash(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    Ok(out)
}

/// Writes an archive from a snapshot stream: the header first, then the
/// files' chunks in order, then [`ArchiveWriter::finish`]. Every file's
/// length and crc are checked against the header as its bytes arrive; a
/// mismatch is an error (the output is then not a valid archive: write to a
/// temporary name and rename after `finish`).
#[derive(Debug)]
pub struct ArchiveWriter<W: Write> {
    out: W,
    files: Vec<FileEntry>,
    /// The file being written (index into `files`).
    current: usize,
    /// Bytes of the current file written so far.
    written: u64,
    hasher: crc32fast::Hasher,
}

impl<W: Write> ArchiveWriter<W> {
    /// Writes the header.
    pub fn new(mut out: W, header: &ArchiveHeader) -> Result<Self> {
        out.write_all(&encode_header(header)?)?;
        Ok(ArchiveWriter {
            out,
            files: header.files.clone(),
            current: 0,
            written: 0,
            hasher: crc32fast::Hasher::new(),
        })
    }

    /// Checks the current file is complete and moves to the next one.
    fn close_current(&mut self) -> Result<()> {
        let file = &self.files[self.current];
        if self.written != file.length_bytes {
            return Err(ArchiveError::Format(format!(
                "file {:?} ended after {} of its {} bytes",
                file.name, self.written, file.length_bytes
            )));
        }
        let actual = std::mem::take(&mut self.hasher).finalize();
        if actual != file.crc32 {
            return Err(ArchiveError::Checksum {
                what: format!("file {:?}", file.name),
                expected: file.crc32,
                actual,
            });
        }
        self.current += 1;
        self.written = 0;
        Ok(())
    }

    /// Appends `data`, which belongs to `file_name` at `offset`. Chunks
    /// must come in the header's file order with increasing, gapless
    /// offsets (files of length 0 need no chunk).
    pub fn write_chunk(&mut self, file_name: &str, offset: u64, data: &[u8]) -> Result<()> {
        while self
            .files
            .get(self.current)
            .is_some_and(|f| f.name != file_name)
        {
            self.close_current()?;
        }
        let Some(file) = self.files.get(self.current) else {
            return Err(ArchiveError::Format(format!(
                "chunk of {file_name:?} is not for a file still to come in the manifest"
            )));
        };
        if offset != self.written {
            return Err(ArchiveError::Format(format!(
                "chunk of {file_name:?} at offset {offset}, expected offset {}",
                self.written
            )));
        }
        let end = self.written.saturating_add(data.len() as u64);
        if end > file.length_bytes {
            return Err(ArchiveError::Format(format!(
                "file {file_name:?} gets {end} bytes, more than its {} in the manifest",
                file.length_bytes
            )));
        }
        self.out.write_all(data)?;
        self.hasher.update(data);
        self.written = end;
        Ok(())
    }

    /// Checks that every file is complete, writes the trailer and flushes;
    /// returns the output.
    pub fn finish(mut self) -> Result<W> {
        while self.current < self.files.len() {
            self.close_current()?;
        }
        self.out.write_all(&END_MAGIC)?;
        self.out.flush()?;
        Ok(self.out)
    }
}

/// Reads an archive: [`ArchiveReader::open`] reads and checks the header;
/// [`ArchiveReader::next_file`] copies each file's bytes to a sink, checking
/// its crc; [`ArchiveReader::finish`] checks the trailer.
#[derive(Debug)]
pub struct ArchiveReader<R: Read> {
    input: R,
    header: ArchiveHeader,
    next: usize,
}

/// Reads and hashes header bytes.
struct HeaderInput<'a, R: Read> {
    input: &'a mut R,
    hasher: crc32fast::Hasher,
}

impl<R: Read> HeaderInput<'_, R> {
    fn bytes(&mut self, length: usize) -> Result<Vec<u8>> {
        let mut buffer = vec![0; length];
        self.input.read_exact(&mut buffer)?;
        self.hasher.update(&buffer);
        Ok(buffer)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N]> {
        let mut buffer = [0; N];
        self.input.read_exact(&mut buffer)?;
        self.hasher.update(&buffer);
        Ok(buffer)
    }

    fn u16(&mut self) -> Result<u16> {
        Ok(u16::from_le_bytes(self.array()?))
    }

    fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    fn string(&mut self, length: usize, what: &str) -> Result<String> {
        String::from_utf8(self.bytes(length)?)
            .map_err(|_| ArchiveError::Format(format!("{what} is not UTF-8")))
    }
}

impl<R: Read> ArchiveReader<R> {
    /// Reads and checks the header (magic, version, limits, crc).
    pub fn open(mut input: R) -> Result<Self> {
        let mut head = HeaderInput {
            input: &mut input,
            hasher: crc32fast::Hasher::new(),
        };
        let magic: [u8; 8] = head.array()?;
        if magic != MAGIC {
            return Err(ArchiveError::Format(format!(
                "magic is {magic:02x?}, expected {MAGIC:02x?} (\"RCASKSNP\"): not a raftcask snapshot archive"
            )));
        }
        let version = head.u32()?;
        if version != FORMAT_VERSION {
            return Err(ArchiveError::Format(format!(
                "format version {version}; this build reads version {FORMAT_VERSION}"
            )));
        }
        let last_log_index = head.u64()?;
        let last_log_term = head.u64()?;
        let id_length = usize::from(head.u16()?);
        limit(
            "snapshot id length",
            id_length,
            ID_SIZE_BYTES_MAX,
            "ID_SIZE_BYTES_MAX",
        )?;
        let snapshot_id = head.string(id_length, "snapshot id")?;
        let manifest_length = head.u32()? as usize;
        limit(
            "manifest length",
            manifest_length,
            MANIFEST_SIZE_BYTES_MAX,
            "MANIFEST_SIZE_BYTES_MAX",
        )?;
        let manifest = head.bytes(manifest_length)?;
        let count = head.u32()? as usize;
        limit("file count", count, FILES_MAX, "FILES_MAX")?;
        let mut files = Vec::new();
        for _ in 0..count {
            let name_length = usize::from(head.u16()?);
            limit(
                "file name length",
                name_length,
                NAME_SIZE_BYTES_MAX,
                "NAME_SIZE_BYTES_MAX",
            )?;
            let name = head.string(name_length, "file name")?;
            let length_bytes = head.u64()?;
            let crc32 = head.u32()?;
            files.push(FileEntry {
                name,
                length_bytes,
                crc32,
            });
        }
        let actual = head.hasher.finalize();
        let mut stored = [0; 4];
        input.read_exact(&mut stored)?;
        let expected = u32::from_le_bytes(stored);
        if actual != expected {
            return Err(ArchiveError::Checksum {
                what: "the header".into(),
                expected,
                actual,
            });
        }
        let header = ArchiveHeader {
            snapshot_id,
            last_log_index,
            last_log_term,
            manifest,
            files,
        };
        check_header(&header)?;
        Ok(ArchiveReader {
            input,
            header,
            next: 0,
        })
    }

    /// The header.
    pub fn header(&self) -> &ArchiveHeader {
        &self.header
    }

    /// Copies the next file's bytes into `sink`, checking its crc; `None`
    /// after the last file. On a crc error `sink` has received bad bytes:
    /// discard them.
    pub fn next_file(&mut self, sink: &mut dyn Write) -> Result<Option<FileEntry>> {
        let Some(file) = self.header.files.get(self.next).cloned() else {
            return Ok(None);
        };
        self.next += 1;
        let mut hasher = crc32fast::Hasher::new();
        let mut left = file.length_bytes;
        let mut buffer = vec![0; COPY_BUFFER_SIZE_BYTES];
        while left > 0 {
            let take = usize::try_from(left).map_or(buffer.len(), |l| l.min(buffer.len()));
            self.input.read_exact(&mut buffer[..take]).map_err(|err| {
                if err.kind() == io::ErrorKind::UnexpectedEof {
                    ArchiveError::Format(format!(
                        "truncated in file {:?} ({} of {} bytes missing)",
                        file.name, left, file.length_bytes
                    ))
                } else {
                    ArchiveError::Io(err)
                }
            })?;
            hasher.update(&buffer[..take]);
            sink.write_all(&buffer[..take])?;
            left -= take as u64;
        }
        let actual = hasher.finalize();
        if actual != file.crc32 {
            return Err(ArchiveError::Checksum {
                what: format!("file {:?}", file.name),
                expected: file.crc32,
                actual,
            });
        }
        Ok(Some(file))
    }

    /// Skips any files not read yet (checking them), then checks the
    /// trailer and that nothing follows it.
    pub fn finish(mut self) -> Result<ArchiveHeader> {
        while self.next_file(&mut io::sink())?.is_some() {}
        let mut end = [0; 8];
        self.input.read_exact(&mut end).map_err(|err| {
            if err.kind() == io::ErrorKind::UnexpectedEof {
                ArchiveError::Format("truncated before the trailer".into())
            } else {
                ArchiveError::Io(err)
            }
        })?;
        if end != END_MAGIC {
            return Err(ArchiveError::Format(format!(
                "trailer is {end:02x?}, expected {END_MAGIC:02x?} (\"RCASKEND\")"
            )));
        }
        let mut extra = [0; 1];
        if self.input.read(&mut extra)? != 0 {
            return Err(ArchiveError::Format("bytes follow the trailer".into()));
        }
        Ok(self.header)
    }
}

/// Reads a whole archive, checking every byte; returns its header.
pub fn verify(input: impl Read) -> Result<ArchiveHeader> {
    ArchiveReader::open(input)?.finish()
}

/// Reads a whole archive and writes its files into `dir` (which must exist;
/// files must not), checking every byte; returns its header. On error some
/// files may have been written: use a fresh directory and remove it.
pub fn extract(input: impl Read, dir: &Path) -> Result<ArchiveHeader> {
    let mut reader = ArchiveReader::open(input)?;
    let files = reader.header().files.clone();
    for file in &files {
        let mut out = io::BufWriter::new(
            std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(dir.join(&file.name))?,
        );
        reader.next_file(&mut out)?;
        out.into_inner().map_err(|e| e.into_error())?.sync_all()?;
    }
    reader.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> (ArchiveHeader, Vec<(String, Vec<u8>)>) {
        let contents = vec![
            ("seg-1.data".to_string(), b"hello world".to_vec()),
            ("seg-1.hint".to_string(), Vec::new()),
            (
                "seg-12.data".to_string(),
                (0..=255u8).cycle().take(70_000).collect(),
            ),
        ];
        let header = ArchiveHeader {
            snapshot_id: "3-17-abc".into(),
            last_log_index: 17,
            last_log_term: 3,
            manifest: b"node manifest bytes".to_vec(),
            files: contents
                .iter()
                .map(|(name, bytes)| FileEntry {
                    name: name.clone(),
                    length_bytes: bytes.len() as u64,
                    crc32: crc32fast::hash(bytes),
                })
                .collect(),
        };
        (header, contents)
    }

    /// Writes the sample in chunks of `chunk` bytes.
    fn write(chunk: usize) -> (ArchiveHeader, Vec<u8>) {
        let (header, contents) = sample();
        let mut writer = ArchiveWriter::new(Vec::new(), &header).unwrap();
        for (name, bytes) in &contents {
            for (i, piece) in bytes.chunks(chunk).enumerate() {
                writer.write_chunk(name, (i * chunk) as u64, piece).unwrap();
            }
        }
        (header, writer.finish().unwrap())
    }

    #[test]
    fn round_trip() {
        let (header, bytes) = write(1000);
        assert_eq!(&bytes[..8], b"RCASKSNP");
        assert_eq!(&bytes[bytes.len() - 8..], b"RCASKEND");
        assert_eq!(verify(&bytes[..]).unwrap(), header);
        let dir = tempfile::tempdir().unwrap();
        extract(&bytes[..], dir.path()).unwrap();
        for (name, content) in sample().1 {
            assert_eq!(std::fs::read(dir.path().join(name)).unwrap(), content);
        }
        // The layout is byte for byte the documented one.
        let id_at = 8 + 4 + 8 + 8;
        assert_eq!(&bytes[id_at - 16..id_at - 8], &17u64.to_le_bytes());
        assert_eq!(&bytes[id_at..id_at + 2], &8u16.to_le_bytes());
        assert_eq!(&bytes[id_at + 2..id_at + 10], b"3-17-abc");
        let data: u64 = header.data_bytes();
        let header_len = encode_header(&header).unwrap().len();
        assert_eq!(bytes.len() as u64, header_len as u64 + data + 8);
    }

    #[test]
    fn every_flipped_byte_is_caught() {
        let (_, bytes) = write(4096);
        // Every header byte, the trailer, and a sample of data bytes.
        let header_len = encode_header(&sample().0).unwrap().len();
        let positions = (0..header_len)
            .chain((header_len..bytes.len()).step_by(997))
            .chain(bytes.len() - 8..bytes.len());
        for at in positions {
            let mut bad = bytes.clone();
            bad[at] ^= 0x40;
            assert!(verify(&bad[..]).is_err(), "flip at {at} not caught");
        }
    }

    #[test]
    fn truncation_and_trailing_bytes_are_caught() {
        let (_, bytes) = write(4096);
        for cut in [0, 7, 30, bytes.len() / 2, bytes.len() - 8, bytes.len() - 1] {
            let err = verify(&bytes[..cut]).unwrap_err();
            assert!(err.to_string().contains("truncated"), "cut {cut}: {err}");
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(
            verify(&longer[..])
                .unwrap_err()
                .to_string()
                .contains("follow")
        );
    }

    #[test]
    fn the_writer_refuses_what_the_manifest_does_not_say() {
        let (header, contents) = sample();
        // Wrong bytes: the crc check at the file's end.
        let mut writer = ArchiveWriter::new(Vec::new(), &header).unwrap();
        writer.write_chunk("seg-1.data", 0, b"hello WORLD").unwrap();
        let err = writer.write_chunk("seg-12.data", 0, b"x").unwrap_err();
        assert!(matches!(err, ArchiveError::Checksum { .. }), "{err}");
        // A gap.
        let mut writer = ArchiveWriter::new(Vec::new(), &header).unwrap();
        let err = writer.write_chunk("seg-1.data", 3, b"lo").unwrap_err();
        assert!(err.to_string().contains("offset"), "{err}");
        // Too many bytes.
        let mut writer = ArchiveWriter::new(Vec::new(), &header).unwrap();
        let err = writer
            .write_chunk("seg-1.data", 0, b"hello world!")
            .unwrap_err();
        assert!(err.to_string().contains("more than"), "{err}");
        // A file missing at the end.
        let mut writer = ArchiveWriter::new(Vec::new(), &header).unwrap();
        writer.write_chunk("seg-1.data", 0, &contents[0].1).unwrap();
        let err = writer.finish().unwrap_err();
        assert!(err.to_string().contains("seg-12.data"), "{err}");
        // A name that is not a plain file name.
        let mut evil = header.clone();
        evil.files[0].name = "../etc".into();
        assert!(ArchiveWriter::new(Vec::new(), &evil).is_err());
    }
}
