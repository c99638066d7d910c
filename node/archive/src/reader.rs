//! [`read_archive`]: reads an archive front to back, checking every field
//! against the format and the manifest's file list, and hands each file's
//! bytes to a sink; [`verify_archive`]: the same on a file, writing nothing.

use std::fs::File;
use std::io::{self, BufReader, Read};
use std::path::Path;

use crate::{
    ARCHIVE_COPY_BYTES, ARCHIVE_END_MAGIC, ARCHIVE_FORMAT_VERSION, ARCHIVE_MAGIC, ArchiveError,
    ArchiveFile, FILE_NAME_BYTES_MAX, MANIFEST_BYTES_MAX, format_err,
};

/// What a verified archive holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ArchiveSummary {
    /// The manifest's bytes, as in the archive.
    pub manifest_bytes: Vec<u8>,
    /// The files, in order (equal to the manifest's list).
    pub files: Vec<ArchiveFile>,
    /// Bytes of file contents.
    pub file_bytes: u64,
}

/// Given the manifest's bytes, the files it lists in order, or why the
/// manifest is unusable (the reader reports it as `the manifest: REASON`).
pub type ManifestFiles<'a> = dyn FnMut(&[u8]) -> Result<Vec<ArchiveFile>, String> + 'a;

/// Receives each file's entry and a piece of its bytes.
pub type FileSink<'a, E> = dyn FnMut(&ArchiveFile, &[u8]) -> Result<(), E> + 'a;

/// A reader that hashes everything it returns and counts bytes.
struct HashingReader<R> {
    inner: R,
    hasher: crc32fast::Hasher,
    offset: u64,
}

impl<R: Read> HashingReader<R> {
    fn exact(&mut self, buf: &mut [u8], what: &str) -> Result<(), ArchiveError> {
        self.inner.read_exact(buf).map_err(|err| {
            if err.kind() == io::ErrorKind::UnexpectedEof {
                format_err(format!(
                    "truncated at byte {}: {what} is missing",
                    self.offset
                ))
            } else {
                format_err(format!("read at byte {}: {err}", self.offset))
            }
        })?;
        self.hasher.update(buf);
        self.offset += buf.len() as u64;
        Ok(())
    }

    fn u16(&mut self, what: &str) -> Result<u16, ArchiveError> {
        let mut b = [0u8; 2];
        self.exact(&mut b, what)?;
        Ok(u16::from_le_bytes(b))
    }

    fn u32(&mut self, what: &str) -> Result<u32, ArchiveError> {
        let mut b = [0u8; 4];
        self.exact(&mut b, what)?;
        Ok(u32::from_le_bytes(b))
    }

    fn u64(&mut self, what: &str) -> Result<u64, ArchiveError> {
        let mut b = [0u8; 8];
        self.exact(&mut b, what)?;
        Ok(u64::from_le_bytes(b))
    }
}

/// Magic, version, manifest and file count; returns the manifest's bytes
/// and its file list.
fn read_head<R: Read>(
    r: &mut HashingReader<R>,
    manifest_files: &mut ManifestFiles<'_>,
) -> Result<(Vec<u8>, Vec<ArchiveFile>), ArchiveError> {
    let mut magic = [0u8; 8];
    r.exact(&mut magic, "the magic")?;
    if magic != ARCHIVE_MAGIC {
        return Err(format_err("not a raftcask backup archive (bad magic)"));
    }
    let version = r.u32("the format version")?;
    if version != ARCHIVE_FORMAT_VERSION {
        return Err(format_err(format!(
            "format version {version}; this build reads version {ARCHIVE_FORMAT_VERSION}"
        )));
    }
    let manifest_len = r.u32("the manifest length")? as usize;
    if manifest_len > MANIFEST_BYTES_MAX {
        return Err(format_err(format!(
            "manifest length {manifest_len} exceeds MANIFEST_BYTES_MAX ({MANIFEST_BYTES_MAX})"
        )));
    }
    let mut manifest_bytes = vec![0u8; manifest_len];
    r.exact(&mut manifest_bytes, "the manifest")?;
    let files = manifest_files(&manifest_bytes)
        .map_err(|reason| format_err(format!("the manifest: {reason}")))?;
    let count = r.u32("the file count")? as usize;
    if count != files.len() {
        return Err(format_err(format!(
            "{count} files, the manifest lists {}",
            files.len()
        )));
    }
    Ok((manifest_bytes, files))
}

/// One file's header, checked against `file` (the manifest's entry).
fn read_file_header<R: Read>(
    r: &mut HashingReader<R>,
    file: &ArchiveFile,
) -> Result<(), ArchiveError> {
    let name_len = r.u16("a file name length")? as usize;
    if name_len > FILE_NAME_BYTES_MAX {
        return Err(format_err(format!(
            "file name of {name_len} bytes exceeds FILE_NAME_BYTES_MAX ({FILE_NAME_BYTES_MAX})"
        )));
    }
    let mut name = vec![0u8; name_len];
    r.exact(&mut name, "a file name")?;
    if name != file.name.as_bytes() {
        return Err(format_err(format!(
            "file {:?} where the manifest lists {}",
            String::from_utf8_lossy(&name),
            file.name
        )));
    }
    let len = r.u64("a file length")?;
    let crc = r.u32("a file crc32")?;
    if len != file.len || crc != file.crc {
        return Err(format_err(format!(
            "file {}: {len} bytes crc32 {crc:08x}, the manifest says {} bytes crc32 {:08x}",
            file.name, file.len, file.crc
        )));
    }
    Ok(())
}

/// The trailer: end magic, the CRC-32 of everything before it, then the
/// end of the input.
fn read_trailer<R: Read>(r: &mut HashingReader<R>) -> Result<(), ArchiveError> {
    let mut end = [0u8; 8];
    r.exact(&mut end, "the trailer")?;
    if end != ARCHIVE_END_MAGIC {
        return Err(format_err("bad trailer magic"));
    }
    let expected = r.hasher.clone().finalize();
    let mut stored = [0u8; 4];
    r.inner.read_exact(&mut stored).map_err(|_| {
        format_err(format!(
            "truncated at byte {}: the trailer crc32 is missing",
            r.offset
        ))
    })?;
    let stored = u32::from_le_bytes(stored);
    if stored != expected {
        return Err(format_err(format!(
            "archive crc32 {expected:08x}, the trailer says {stored:08x} (corrupted)"
        )));
    }
    let mut extra = [0u8; 1];
    match r.inner.read(&mut extra) {
        Ok(0) => Ok(()),
        Ok(_) => Err(format_err("bytes after the trailer")),
        Err(err) => Err(format_err(format!("read after the trailer: {err}"))),
    }
}

/// Reads an archive from `input`, checking every field; `manifest_files`
/// names the files the manifest lists (the headers must match it), `sink`
/// gets each file's entry and its bytes in pieces of at most
/// [`ARCHIVE_COPY_BYTES`] (an empty piece opens each file). Any error, the
/// sink's included, stops the read.
pub fn read_archive<R: Read, E: From<ArchiveError>>(
    input: R,
    manifest_files: &mut ManifestFiles<'_>,
    sink: &mut FileSink<'_, E>,
) -> Result<ArchiveSummary, E> {
    let mut r = HashingReader {
        inner: input,
        hasher: crc32fast::Hasher::new(),
        offset: 0,
    };
    let (manifest_bytes, files) = read_head(&mut r, manifest_files)?;
    let mut buf = vec![0u8; ARCHIVE_COPY_BYTES];
    let mut file_bytes = 0u64;
    for file in &files {
        read_file_header(&mut r, file)?;
        sink(file, &[])?;
        let mut hasher = crc32fast::Hasher::new();
        let mut left = file.len;
        while left > 0 {
            let n = left.min(ARCHIVE_COPY_BYTES as u64) as usize;
            r.exact(&mut buf[..n], "file contents")?;
            hasher.update(&buf[..n]);
            sink(file, &buf[..n])?;
            left -= n as u64;
        }
        let actual = hasher.finalize();
        if actual != file.crc {
            return Err(format_err(format!(
                "file {}: its bytes have crc32 {actual:08x}, the archive says {:08x} (corrupted)",
                file.name, file.crc
            ))
            .into());
        }
        file_bytes += file.len;
    }
    read_trailer(&mut r)?;
    Ok(ArchiveSummary {
        manifest_bytes,
        files,
        file_bytes,
    })
}

/// A format error as one about the archive at `path`.
pub fn in_archive(path: &Path, err: ArchiveError) -> ArchiveError {
    match err {
        ArchiveError::Format(reason) => format_err(format!("{}: {reason}", path.display())),
        other => other,
    }
}

/// Reads and checks the whole archive at `path` (every header against the
/// manifest's list from `manifest_files`, every file's CRC-32, the
/// trailer), writing nothing.
pub fn verify_archive(
    path: &Path,
    manifest_files: &mut ManifestFiles<'_>,
) -> Result<ArchiveSummary, ArchiveError> {
    let file = File::open(path).map_err(|source| ArchiveError::Io {
        op: "open",
        path: path.to_path_buf(),
        source,
    })?;
    read_archive(BufReader::new(file), manifest_files, &mut |_, _| Ok(()))
        .map_err(|err| in_archive(path, err))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ArchiveWriter;

    const FILES: &[(&str, &[u8])] = &[
        ("seg-1.data", b"hello world"),
        ("seg-1.hint", b""),
        ("seg-2.data", b"abcdefgh"),
    ];
    const MANIFEST: &[u8] = b"an opaque manifest";

    fn list() -> Vec<ArchiveFile> {
        FILES
            .iter()
            .map(|(name, bytes)| ArchiveFile::of(name, bytes))
            .collect()
    }

    fn archive() -> Vec<u8> {
        let mut writer = ArchiveWriter::new(Vec::new(), MANIFEST, list()).unwrap();
        for (name, bytes) in FILES {
            for (i, chunk) in bytes.chunks(3).enumerate() {
                writer.write_chunk(name, (i * 3) as u64, chunk).unwrap();
            }
        }
        writer.finish().unwrap()
    }

    fn read(bytes: &[u8]) -> Result<ArchiveSummary, ArchiveError> {
        read_archive(bytes, &mut |_| Ok(list()), &mut |_, _| Ok(()))
    }

    #[test]
    fn archive_round_trips_and_refuses_every_truncation_and_flip() {
        let bytes = archive();
        let mut seen = Vec::new();
        let summary = read_archive::<_, ArchiveError>(
            &bytes[..],
            &mut |manifest| {
                assert_eq!(manifest, MANIFEST);
                Ok(list())
            },
            &mut |file, data| {
                seen.push((file.name.clone(), data.to_vec()));
                Ok(())
            },
        )
        .unwrap();
        assert_eq!(summary.manifest_bytes, MANIFEST);
        assert_eq!(summary.files, list());
        assert_eq!(summary.file_bytes, 19);
        let joined: Vec<u8> = seen
            .iter()
            .filter(|(n, _)| n == "seg-1.data")
            .flat_map(|(_, d)| d.clone())
            .collect();
        assert_eq!(joined, b"hello world");
        for cut in 0..bytes.len() {
            assert!(read(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        for at in 0..bytes.len() {
            let mut flipped = bytes.clone();
            flipped[at] ^= 0x01;
            assert!(read(&flipped).is_err(), "flip at {at}");
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(read(&longer).is_err());
    }

    #[test]
    fn headers_must_match_the_manifests_list() {
        let bytes = archive();
        let mut other = list();
        other[2].crc ^= 1;
        let refused =
            read_archive::<_, ArchiveError>(&bytes[..], &mut |_| Ok(other.clone()), &mut |_, _| {
                Ok(())
            });
        assert!(
            matches!(refused, Err(ArchiveError::Format(_))),
            "{refused:?}"
        );
        let shorter = read_archive::<_, ArchiveError>(
            &bytes[..],
            &mut |_| Ok(list()[..2].to_vec()),
            &mut |_, _| Ok(()),
        );
        assert!(shorter.is_err());
        let unusable = read_archive::<_, ArchiveError>(
            &bytes[..],
            &mut |_| Err("bad".to_string()),
            &mut |_, _| Ok(()),
        )
        .unwrap_err();
        assert!(
            unusable.to_string().contains("the manifest: bad"),
            "{unusable}"
        );
    }

    #[test]
    fn verify_names_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.rcbk");
        std::fs::write(&path, archive()).unwrap();
        let summary = verify_archive(&path, &mut |_| Ok(list())).unwrap();
        assert_eq!(summary.file_bytes, 19);
        let mut bytes = archive();
        bytes.truncate(bytes.len() - 1);
        std::fs::write(&path, bytes).unwrap();
        let err = verify_archive(&path, &mut |_| Ok(list())).unwrap_err();
        assert!(err.to_string().contains("a.rcbk"), "{err}");
    }
}
