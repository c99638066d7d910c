//! [`ArchiveWriter`]: writes an archive front to back from the manifest's
//! bytes, the manifest's file list and the files' bytes in that order, as
//! the `SaveSnapshot` stream delivers them (manifest, then chunks).

use std::io::{self, Write};
use std::path::PathBuf;

use crate::{
    ARCHIVE_END_MAGIC, ARCHIVE_FORMAT_VERSION, ARCHIVE_MAGIC, ArchiveError, ArchiveFile,
    FILE_NAME_BYTES_MAX, MANIFEST_BYTES_MAX, file_header, format_err,
};

/// A writer that hashes everything passing through it.
struct Hashing<W> {
    inner: W,
    hasher: crc32fast::Hasher,
}

impl<W: Write> Hashing<W> {
    fn put(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.inner.write_all(bytes)?;
        self.hasher.update(bytes);
        Ok(())
    }
}

/// The file being written and how far.
struct Current {
    index: usize,
    written: u64,
    hasher: crc32fast::Hasher,
}

/// Writes an archive from a manifest, its file list and the files' bytes
/// in list order. Checks every chunk's file and offset and every file's
/// length and CRC-32 against the list as it goes, so it never writes an
/// archive the reader refuses.
pub struct ArchiveWriter<W: Write> {
    out: Hashing<W>,
    files: Vec<ArchiveFile>,
    /// The file being written (header already out), if any.
    current: Option<Current>,
    /// Files completely written.
    done: usize,
}

impl<W: Write> std::fmt::Debug for ArchiveWriter<W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ArchiveWriter")
            .field("files", &self.files.len())
            .field("done", &self.done)
            .finish_non_exhaustive()
    }
}

fn write_err(source: io::Error) -> ArchiveError {
    ArchiveError::Io {
        op: "write the archive",
        path: PathBuf::from("<archive>"),
        source,
    }
}

/// Refuses what the format cannot hold (see the crate docs' table).
fn check_fits(manifest_bytes: &[u8], files: &[ArchiveFile]) -> Result<(), ArchiveError> {
    if manifest_bytes.len() > MANIFEST_BYTES_MAX {
        return Err(format_err(format!(
            "the manifest: {} bytes exceed MANIFEST_BYTES_MAX ({MANIFEST_BYTES_MAX})",
            manifest_bytes.len()
        )));
    }
    if u32::try_from(files.len()).is_err() {
        return Err(format_err(format!(
            "{} files do not fit the u32 file count",
            files.len()
        )));
    }
    if let Some(long) = files.iter().find(|f| f.name.len() > FILE_NAME_BYTES_MAX) {
        return Err(format_err(format!(
            "file name of {} bytes exceeds FILE_NAME_BYTES_MAX ({FILE_NAME_BYTES_MAX})",
            long.name.len()
        )));
    }
    Ok(())
}

impl<W: Write> ArchiveWriter<W> {
    /// Starts an archive with `manifest_bytes` (a member's `MANIFEST`, as
    /// `SnapshotManifest.encoded` carries it; opaque here) and `files`, the
    /// files that manifest lists, in its order.
    pub fn new(
        out: W,
        manifest_bytes: &[u8],
        files: Vec<ArchiveFile>,
    ) -> Result<ArchiveWriter<W>, ArchiveError> {
        check_fits(manifest_bytes, &files)?;
        let mut out = Hashing {
            inner: out,
            hasher: crc32fast::Hasher::new(),
        };
        let write = |out: &mut Hashing<W>| -> io::Result<()> {
            out.put(&ARCHIVE_MAGIC)?;
            out.put(&ARCHIVE_FORMAT_VERSION.to_le_bytes())?;
            out.put(&(manifest_bytes.len() as u32).to_le_bytes())?;
            out.put(manifest_bytes)?;
            out.put(&(files.len() as u32).to_le_bytes())
        };
        write(&mut out).map_err(write_err)?;
        Ok(ArchiveWriter {
            out,
            files,
            current: None,
            done: 0,
        })
    }

    /// The files being written, in order.
    pub fn files(&self) -> &[ArchiveFile] {
        &self.files
    }

    /// Bytes of file contents the archive holds when complete (for a
    /// progress bar).
    pub fn file_bytes_total(&self) -> u64 {
        self.files.iter().map(|f| f.len).sum()
    }

    /// Bytes of file contents written so far.
    pub fn file_bytes_written(&self) -> u64 {
        let whole: u64 = self.files[..self.done].iter().map(|f| f.len).sum();
        whole + self.current.as_ref().map_or(0, |c| c.written)
    }

    fn start_next(&mut self) -> Result<(), ArchiveError> {
        let index = self.done;
        let file = self.files.get(index).ok_or_else(|| {
            format_err(format!(
                "data after the last of the manifest's {} files",
                self.files.len()
            ))
        })?;
        let header = file_header(file);
        self.out.put(&header).map_err(write_err)?;
        self.current = Some(Current {
            index,
            written: 0,
            hasher: crc32fast::Hasher::new(),
        });
        Ok(())
    }

    /// Closes the current file if all its bytes are in (checking its CRC).
    fn close_if_complete(&mut self) -> Result<(), ArchiveError> {
        let Some(current) = &self.current else {
            return Ok(());
        };
        let file = &self.files[current.index];
        if current.written < file.len {
            return Ok(());
        }
        let crc = current.hasher.clone().finalize();
        if crc != file.crc {
            return Err(format_err(format!(
                "file {}: its {} bytes have crc32 {crc:08x}, the manifest says {:08x}",
                file.name, file.len, file.crc
            )));
        }
        self.current = None;
        self.done += 1;
        Ok(())
    }

    /// Appends `data` at `offset` of file `file_name`. Files come in
    /// manifest order with consecutive offsets; an empty file may have no
    /// chunk at all.
    pub fn write_chunk(
        &mut self,
        file_name: &str,
        offset: u64,
        data: &[u8],
    ) -> Result<(), ArchiveError> {
        loop {
            if self.current.is_none() {
                self.start_next()?;
                self.close_if_complete()?;
                if self.current.is_none() {
                    // An empty file: it needs no chunk.
                    if self.files[self.done - 1].name == file_name && data.is_empty() {
                        return Ok(());
                    }
                    continue;
                }
            }
            let Some(current) = self.current.as_mut() else {
                continue;
            };
            let file = &self.files[current.index];
            if file.name != file_name {
                return Err(format_err(format!(
                    "a chunk of {file_name} while {} ({} of {} bytes written) is not complete",
                    file.name, current.written, file.len
                )));
            }
            if offset != current.written {
                return Err(format_err(format!(
                    "file {file_name}: a chunk at offset {offset}, expected {}",
                    current.written
                )));
            }
            if current.written + data.len() as u64 > file.len {
                return Err(format_err(format!(
                    "file {file_name}: {} bytes would exceed its length {} in the manifest",
                    current.written + data.len() as u64,
                    file.len
                )));
            }
            current.hasher.update(data);
            current.written += data.len() as u64;
            self.out.put(data).map_err(write_err)?;
            return self.close_if_complete();
        }
    }

    /// Writes the trailer once every file is complete; returns the output.
    pub fn finish(mut self) -> Result<W, ArchiveError> {
        while self.done < self.files.len() {
            if self.current.is_none() {
                self.start_next()?;
                self.close_if_complete()?;
            }
            if let Some(current) = &self.current {
                let file = &self.files[current.index];
                return Err(format_err(format!(
                    "the stream ended in file {} after {} of {} bytes",
                    file.name, current.written, file.len
                )));
            }
        }
        self.out.put(&ARCHIVE_END_MAGIC).map_err(write_err)?;
        let crc = self.out.hasher.clone().finalize();
        self.out
            .inner
            .write_all(&crc.to_le_bytes())
            .map_err(write_err)?;
        self.out.inner.flush().map_err(write_err)?;
        Ok(self.out.inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILES: &[(&str, &[u8])] = &[
        ("seg-1.data", b"hello world"),
        ("seg-1.hint", b""),
        ("seg-2.data", b"abcdefgh"),
    ];

    fn writer() -> ArchiveWriter<Vec<u8>> {
        let files = FILES
            .iter()
            .map(|(name, bytes)| ArchiveFile::of(name, bytes))
            .collect();
        ArchiveWriter::new(Vec::new(), b"manifest", files).unwrap()
    }

    #[test]
    fn writer_refuses_wrong_order_offsets_lengths_and_crcs() {
        let mut w = writer();
        assert!(w.write_chunk("seg-2.data", 0, b"abc").is_err(), "order");
        let mut w = writer();
        assert!(w.write_chunk("seg-1.data", 1, b"ello").is_err(), "offset");
        let mut w = writer();
        assert!(
            w.write_chunk("seg-1.data", 0, b"hello world!").is_err(),
            "length"
        );
        let mut w = writer();
        assert!(
            w.write_chunk("seg-1.data", 0, b"hello_world").is_err(),
            "crc"
        );
        let mut w = writer();
        w.write_chunk("seg-1.data", 0, b"hello world").unwrap();
        assert!(w.finish().is_err(), "a missing file");
        // The empty file needs no chunk.
        let mut w = writer();
        w.write_chunk("seg-1.data", 0, b"hello world").unwrap();
        w.write_chunk("seg-2.data", 0, b"abcdefgh").unwrap();
        assert_eq!(w.file_bytes_written(), w.file_bytes_total());
        assert!(w.finish().is_ok());
    }

    #[test]
    fn writer_refuses_what_the_format_cannot_hold() {
        let long = vec![ArchiveFile::of(&"n".repeat(FILE_NAME_BYTES_MAX + 1), b"")];
        assert!(ArchiveWriter::new(Vec::new(), b"m", long).is_err());
        let big = vec![0u8; MANIFEST_BYTES_MAX + 1];
        assert!(ArchiveWriter::new(Vec::new(), &big, Vec::new()).is_err());
    }
}
