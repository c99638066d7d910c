//! The file API the Raft layer uses: the sealed and active files with
//! their lengths and checksums, pins that keep files on disk while a
//! snapshot ships them, and retiring files a merge replaced.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use vfs::VfsFile;

use super::{Engine, Shared, lock, read};
use crate::error::{Error, Result};
use crate::format::{FileId, path_in};

/// Name, length and crc32 of a file, as snapshot manifests list them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileInfo {
    /// File name inside the data directory.
    pub name: String,
    /// Length in bytes.
    pub len: u64,
    /// crc32 of the whole file (for the active segment: of `len` bytes).
    pub crc: u32,
}

/// Per-file statistics.
/// A file known to the engine.
#[derive(Debug)]
pub(crate) struct FileMeta {
    pub(crate) id: FileId,
    pub(crate) num: u32,
    pub(crate) len: u64,
    pub(crate) crc: u32,
    /// Highest sequence in the file.
    pub(crate) max_seq: u64,
    /// The file's last commit record: (seq, metadata).
    pub(crate) last_commit: Option<(u64, Vec<u8>)>,
}

/// The data files: sealed ones in order, plus the active one's number.
#[derive(Debug, Default)]
pub(crate) struct FileSet {
    pub(crate) sealed: Vec<Arc<FileMeta>>,
    pub(crate) active: Option<(u32, FileId)>,
    /// Every readable file number → path (sealed, active, merge outputs
    /// being swapped in, inputs being swapped out).
    pub(crate) paths: HashMap<u32, PathBuf>,
    pub(crate) next_num: u32,
}

impl FileSet {
    pub(crate) fn allocate(&mut self, path: PathBuf) -> u32 {
        self.next_num += 1;
        self.paths.insert(self.next_num, path);
        self.next_num
    }
}

#[derive(Debug, Default)]
pub(crate) struct Pins {
    counts: HashMap<String, usize>,
    /// Pinned files the engine no longer uses; deleted at their last unpin.
    doomed: HashSet<String>,
}

/// Files kept on disk while this guard lives, even if a merge replaces them.
#[derive(Debug)]
pub struct Pin {
    shared: Arc<Shared>,
    names: Vec<String>,
}

impl Drop for Pin {
    fn drop(&mut self) {
        let mut doomed_now = Vec::new();
        {
            let mut pins = lock(&self.shared.pins);
            for name in &self.names {
                let count = pins.counts.get_mut(name).expect("pinned name has a count");
                *count -= 1;
                if *count == 0 {
                    pins.counts.remove(name);
                    if pins.doomed.remove(name) {
                        doomed_now.push(name.clone());
                    }
                }
            }
        }
        for name in doomed_now {
            let path = path_in(&self.shared.dir, &name);
            if let Err(e) = self.shared.opts.vfs.remove(&path) {
                tracing::warn!(file = %name, error = %e, "could not delete an unpinned merged file");
            }
        }
    }
}

impl Pin {
    /// The pinned file names.
    pub fn names(&self) -> &[String] {
        &self.names
    }
}

impl Engine {
    /// Sealed data and hint files, in order, with length and crc32.
    pub fn sealed_files(&self) -> Vec<FileInfo> {
        let files = read(&self.shared.files);
        let mut out = Vec::new();
        for meta in &files.sealed {
            out.push(FileInfo {
                name: meta.id.data_name(),
                len: meta.len,
                crc: meta.crc,
            });
        }
        drop(files);
        for info in out.clone() {
            let id = info
                .name
                .strip_suffix(crate::format::DATA_SUFFIX)
                .and_then(FileId::parse_stem);
            if let Some(id) = id {
                let path = path_in(&self.shared.dir, &id.hint_name());
                if let Ok(file) = self.shared.opts.vfs.open(&path)
                    && let Ok(Some((len, crc))) = checksum_file(file.as_ref(), None)
                {
                    out.push(FileInfo {
                        name: id.hint_name(),
                        len,
                        crc,
                    });
                }
            }
        }
        out
    }

    /// The active segment: its name, current length and crc32, if there is one.
    pub fn active_file(&self) -> Option<FileInfo> {
        let writer = lock(&self.shared.writer);
        writer.active.as_ref().map(|active| FileInfo {
            name: active.id.data_name(),
            len: active.len,
            crc: active.hasher.clone().finalize(),
        })
    }

    /// crc32 of the first `len` bytes of a data file the engine holds.
    pub fn checksum_prefix(&self, name: &str, len: u64) -> Result<u32> {
        let path = path_in(&self.shared.dir, name);
        let (known, active) = {
            let files = read(&self.shared.files);
            let num = files
                .paths
                .iter()
                .find_map(|(num, p)| (*p == path).then_some(*num));
            let active =
                num.is_some_and(|num| files.active.is_some_and(|(active, _)| active == num));
            (num.is_some(), active)
        };
        if !known {
            return Err(Error::UnknownFile(name.to_string()));
        }
        // Past its published length the active segment's file holds zeros
        // written ahead, or a batch still being written: not data.
        let published = self.shared.active_published.load(Ordering::SeqCst);
        if active && len > published {
            return Err(Error::InvalidOption {
                name: "len",
                reason: format!("{name} is active with {published} bytes published, not {len}"),
            });
        }
        let file = self
            .shared
            .opts
            .vfs
            .open(&path)
            .map_err(|e| Error::io(&path, e))?;
        match checksum_file(file.as_ref(), Some(len)).map_err(|e| Error::io(&path, e))? {
            Some((_, crc)) => Ok(crc),
            None => Err(Error::InvalidOption {
                name: "len",
                reason: format!("{name} is shorter than {len} bytes"),
            }),
        }
    }

    /// Keeps these files (names as listed by [`Engine::sealed_files`] or
    /// [`Engine::active_file`]) on disk until the returned guard drops, even
    /// if a merge replaces them meanwhile.
    pub fn pin(&self, names: &[String]) -> Result<Pin> {
        let files = read(&self.shared.files);
        let known: HashSet<String> = files
            .paths
            .values()
            .filter_map(|p| p.file_name()?.to_str().map(str::to_string))
            .flat_map(|data| {
                let hint = data
                    .strip_suffix(crate::format::DATA_SUFFIX)
                    .map(|stem| format!("{stem}{}", crate::format::HINT_SUFFIX));
                std::iter::once(data).chain(hint)
            })
            .collect();
        let mut pins = lock(&self.shared.pins);
        if let Some(unknown) = names.iter().find(|name| !known.contains(*name)) {
            return Err(Error::UnknownFile(unknown.clone()));
        }
        for name in names {
            *pins.counts.entry(name.clone()).or_default() += 1;
        }
        Ok(Pin {
            shared: self.shared.clone(),
            names: names.to_vec(),
        })
    }

    /// Names of the sealed data files, in order (the candidates for a merge).
    pub fn sealed_data_files(&self) -> Vec<String> {
        read(&self.shared.files)
            .sealed
            .iter()
            .map(|meta| meta.id.data_name())
            .collect()
    }
}

/// crc32 of the first `len` bytes of a file (all of it when `None`); `None`
/// when the file is shorter.
pub(crate) fn checksum_file(
    file: &dyn VfsFile,
    len: Option<u64>,
) -> std::io::Result<Option<(u64, u32)>> {
    const CHUNK_BYTES: usize = 1 << 20;
    let actual = file.len()?;
    let len = len.unwrap_or(actual);
    if len > actual {
        return Ok(None);
    }
    let mut hasher = crc32fast::Hasher::new();
    let mut buf = vec![0u8; CHUNK_BYTES];
    let mut pos = 0u64;
    while pos < len {
        let n = CHUNK_BYTES.min((len - pos) as usize);
        file.read_exact_at(&mut buf[..n], pos)?;
        hasher.update(&buf[..n]);
        pos += n as u64;
    }
    Ok(Some((len, hasher.finalize())))
}

impl Shared {
    /// Pins `names`, which the caller knows are the engine's (it holds the
    /// file-set lock it read them under).
    pub(super) fn pin_known(self: &Arc<Self>, names: Vec<String>) -> Pin {
        let mut pins = lock(&self.pins);
        for name in &names {
            *pins.counts.entry(name.clone()).or_default() += 1;
        }
        Pin {
            shared: self.clone(),
            names,
        }
    }

    /// Deletes a file the engine no longer uses, unless it is pinned (then
    /// its last unpin deletes it).
    pub(crate) fn retire_file(&self, name: &str) {
        {
            let mut pins = lock(&self.pins);
            if pins.counts.contains_key(name) {
                pins.doomed.insert(name.to_string());
                return;
            }
        }
        let path = path_in(&self.dir, name);
        if let Err(e) = self.opts.vfs.remove(&path)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(file = %name, error = %e, "could not delete a merged file");
        }
    }
}
