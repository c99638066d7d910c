//! Snapshots are the engine's files: a directory holding hard links to the
//! sealed data and hint files, a copy of the active segment's prefix, and a
//! `MANIFEST` naming each file with its length and crc32, plus the last log
//! id and membership the files contain. Also the `CURRENT` pointer that
//! names the engine directory in use. Every byte of both files is in
//! `SNAPSHOT_FORMAT.md`.
//!
//! This module is pure format and file plumbing (encode, decode, verify,
//! durable writes); the state machine decides when to build, switch and
//! delete. Every file operation goes through [`node_vfs`] (the lazy disk
//! in a `lazy-disk` build).

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

#[cfg(not(feature = "lazy-disk"))]
use vfs::RealFs;
use vfs::{Vfs, VfsFile};

use openraft::{Membership, StoredMembership};

use crate::raft::types::{NodeInfo, NodeLogId, NodeMembership, log_id};

/// File name of the manifest inside a snapshot directory.
pub const MANIFEST_FILE: &str = "MANIFEST";
/// The manifest's envelope (magic, version, body length, CRC-32) is
/// kvarchive's, so `kvctl snapshot save` checks it without the node.
pub use kvarchive::envelope::{MANIFEST_FORMAT_VERSION, MANIFEST_HEADER_BYTES, MANIFEST_MAGIC};
/// Largest manifest accepted, in bytes.
pub const MANIFEST_BYTES_MAX: usize = 16 * 1024 * 1024;
/// Largest file name accepted in a manifest or pointer.
pub const FILE_NAME_BYTES_MAX: usize = 255;
/// Largest snapshot id accepted.
pub const SNAPSHOT_ID_BYTES_MAX: usize = 1024;
/// Largest address accepted in a membership node.
pub const ADDR_BYTES_MAX: usize = 1024;
/// Manifest kind byte: a sealed data file or hint file, listed whole.
pub const KIND_SEALED: u8 = 0;
/// Manifest kind byte: the active segment, listed as a prefix.
pub const KIND_ACTIVE_PREFIX: u8 = 1;

/// File name of the engine-directory pointer in the state machine's directory.
pub const CURRENT_FILE: &str = "CURRENT";
/// Magic at the start of `CURRENT`.
pub const CURRENT_MAGIC: [u8; 8] = *b"RCENGCUR";
/// `CURRENT` format version.
pub const CURRENT_FORMAT_VERSION: u32 = 1;
/// Largest `CURRENT` accepted, in bytes.
pub const CURRENT_BYTES_MAX: usize = 4096;
/// Suffix of files being written before their rename into place.
pub const TMP_SUFFIX: &str = ".tmp";

/// Why a snapshot or pointer file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
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
    /// A manifest or pointer does not decode.
    #[error("malformed {path}: {reason}")]
    Malformed {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A snapshot file does not match its manifest entry.
    #[error("snapshot file {path} does not match the manifest: {reason}")]
    Mismatch {
        /// The file.
        path: PathBuf,
        /// Which of length or crc differs.
        reason: String,
    },
}

pub(crate) fn io_err(op: &'static str, path: &Path) -> impl FnOnce(io::Error) -> SnapshotError {
    let path = path.to_path_buf();
    move |source| SnapshotError::Io { op, path, source }
}

/// One file of a snapshot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ManifestFile {
    /// [`KIND_SEALED`] or [`KIND_ACTIVE_PREFIX`].
    pub kind: u8,
    /// File name (inside the engine directory and the snapshot directory).
    pub name: String,
    /// Length in bytes (for the active segment: of the prefix).
    pub len: u64,
    /// crc32 of those `len` bytes.
    pub crc: u32,
}

/// What a snapshot holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Manifest {
    /// openraft's snapshot id (unique per snapshot built).
    pub snapshot_id: String,
    /// Cluster id of the builder (a u64 widened; 0 = not known yet).
    pub cluster_id: u128,
    /// Last log id applied to the files.
    pub last_log_id: Option<NodeLogId>,
    /// Membership in force at `last_log_id`.
    pub membership: NodeMembership,
    /// The files, sealed ones first in engine order, the active prefix last.
    pub files: Vec<ManifestFile>,
}

impl Manifest {
    /// The active-prefix entry, if any.
    pub fn active(&self) -> Option<&ManifestFile> {
        self.files.iter().find(|f| f.kind == KIND_ACTIVE_PREFIX)
    }

    /// Encodes the manifest (layout in `SNAPSHOT_FORMAT.md`).
    pub fn encode(&self) -> Vec<u8> {
        let mut body = Vec::new();
        put_str(&mut body, &self.snapshot_id);
        body.extend_from_slice(&self.cluster_id.to_le_bytes());
        put_log_id(&mut body, self.last_log_id.as_ref());
        put_log_id(&mut body, self.membership.log_id().as_ref());
        let membership = self.membership.membership();
        let configs = membership.get_joint_config();
        body.extend_from_slice(&(configs.len() as u32).to_le_bytes());
        for config in configs {
            body.extend_from_slice(&(config.len() as u32).to_le_bytes());
            for id in config {
                body.extend_from_slice(&id.to_le_bytes());
            }
        }
        let nodes: Vec<(&u64, &NodeInfo)> = membership.nodes().collect();
        body.extend_from_slice(&(nodes.len() as u32).to_le_bytes());
        for (id, node) in nodes {
            body.extend_from_slice(&id.to_le_bytes());
            put_str(&mut body, &node.client_addr);
            put_str(&mut body, &node.peer_addr);
        }
        body.extend_from_slice(&(self.files.len() as u32).to_le_bytes());
        for file in &self.files {
            body.push(file.kind);
            put_str(&mut body, &file.name);
            body.extend_from_slice(&file.len.to_le_bytes());
            body.extend_from_slice(&file.crc.to_le_bytes());
        }
        let mut out = Vec::with_capacity(MANIFEST_HEADER_BYTES + body.len() + 4);
        out.extend_from_slice(&MANIFEST_MAGIC);
        out.extend_from_slice(&MANIFEST_FORMAT_VERSION.to_le_bytes());
        out.extend_from_slice(&(body.len() as u32).to_le_bytes());
        out.extend_from_slice(&body);
        let crc = crc32fast::hash(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        out
    }

    /// Decodes a manifest; any malformation is an error (never a panic).
    pub fn decode(bytes: &[u8]) -> Result<Manifest, String> {
        let body = kvarchive::manifest_body(bytes, MANIFEST_BYTES_MAX)?;
        let mut r = Reader { bytes: body };
        let snapshot_id = r.string(SNAPSHOT_ID_BYTES_MAX)?;
        let cluster_id = u128::from_le_bytes(r.take(16)?.try_into().expect("16 bytes"));
        let last_log_id = r.log_id()?;
        let membership_log_id = r.log_id()?;
        let config_count = r.u32()? as usize;
        let mut configs = Vec::new();
        for _ in 0..config_count {
            let voters = r.u32()? as usize;
            let mut config = BTreeSet::new();
            for _ in 0..voters {
                config.insert(r.u64()?);
            }
            configs.push(config);
        }
        let node_count = r.u32()? as usize;
        let mut nodes = BTreeMap::new();
        for _ in 0..node_count {
            let id = r.u64()?;
            let client_addr = r.string(ADDR_BYTES_MAX)?;
            let peer_addr = r.string(ADDR_BYTES_MAX)?;
            nodes.insert(
                id,
                NodeInfo {
                    client_addr,
                    peer_addr,
                },
            );
        }
        for config in &configs {
            if let Some(id) = config.iter().find(|id| !nodes.contains_key(id)) {
                return Err(format!("voter {id} has no node entry"));
            }
        }
        let file_count = r.u32()? as usize;
        let mut files = Vec::new();
        let mut names = BTreeSet::new();
        for _ in 0..file_count {
            let kind = r.u8()?;
            if kind != KIND_SEALED && kind != KIND_ACTIVE_PREFIX {
                return Err(format!("unknown file kind {kind}"));
            }
            let name = r.string(FILE_NAME_BYTES_MAX)?;
            check_file_name(&name)?;
            if !names.insert(name.clone()) {
                return Err(format!("file {name} listed twice"));
            }
            let len = r.u64()?;
            let crc = r.u32()?;
            files.push(ManifestFile {
                kind,
                name,
                len,
                crc,
            });
        }
        if files
            .iter()
            .filter(|f| f.kind == KIND_ACTIVE_PREFIX)
            .count()
            > 1
        {
            return Err("more than one active prefix".to_string());
        }
        if !r.bytes.is_empty() {
            return Err(format!("{} trailing bytes in the body", r.bytes.len()));
        }
        let membership = Membership::new(configs, nodes)
            .map_err(|err| format!("membership does not hold together: {err}"))?;
        Ok(Manifest {
            snapshot_id,
            cluster_id,
            last_log_id,
            membership: StoredMembership::new(membership_log_id, membership),
            files,
        })
    }
}

/// A file name a manifest may list: a plain name in the engine's alphabet,
/// never the manifest itself nor a temporary file.
pub fn check_file_name(name: &str) -> Result<(), String> {
    let plain = !name.is_empty()
        && name.len() <= FILE_NAME_BYTES_MAX
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.');
    if !plain || name == MANIFEST_FILE || name.ends_with(TMP_SUFFIX) {
        return Err(format!("file name {name:?} is not allowed in a snapshot"));
    }
    Ok(())
}

/// Where the engine lives, as named by `CURRENT`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pointer {
    /// The engine directory is `engine-<generation>`.
    pub generation: u64,
    /// The active-segment prefix installed from a snapshot (file name, length).
    pub published_prefix: Option<(String, u64)>,
}

impl Pointer {
    /// The engine directory's name.
    pub fn engine_dir_name(&self) -> String {
        engine_dir_name(self.generation)
    }

    /// Encodes the pointer (layout in `SNAPSHOT_FORMAT.md`).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(&CURRENT_MAGIC);
        out.extend_from_slice(&CURRENT_FORMAT_VERSION.to_le_bytes());
        out.extend_from_slice(&self.generation.to_le_bytes());
        match &self.published_prefix {
            None => out.push(0),
            Some((name, len)) => {
                out.push(1);
                put_str(&mut out, name);
                out.extend_from_slice(&len.to_le_bytes());
            }
        }
        let crc = crc32fast::hash(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        out
    }

    /// Decodes a pointer.
    pub fn decode(bytes: &[u8]) -> Result<Pointer, String> {
        if bytes.len() > CURRENT_BYTES_MAX || bytes.len() < 25 {
            return Err(format!("{} bytes is not a pointer", bytes.len()));
        }
        let end = bytes.len() - 4;
        let stored = u32::from_le_bytes(bytes[end..].try_into().expect("4 bytes"));
        if crc32fast::hash(&bytes[..end]) != stored {
            return Err("crc32 mismatch".to_string());
        }
        if bytes[..8] != CURRENT_MAGIC {
            return Err("bad magic".to_string());
        }
        let mut r = Reader {
            bytes: &bytes[8..end],
        };
        let version = r.u32()?;
        if version != CURRENT_FORMAT_VERSION {
            return Err(format!(
                "format version {version} is not {CURRENT_FORMAT_VERSION}"
            ));
        }
        let generation = r.u64()?;
        let published_prefix = match r.u8()? {
            0 => None,
            1 => {
                let name = r.string(FILE_NAME_BYTES_MAX)?;
                check_file_name(&name)?;
                Some((name, r.u64()?))
            }
            other => return Err(format!("bad prefix flag {other}")),
        };
        if !r.bytes.is_empty() {
            return Err(format!("{} trailing bytes", r.bytes.len()));
        }
        Ok(Pointer {
            generation,
            published_prefix,
        })
    }
}

/// `engine-<generation>` (decimal).
pub fn engine_dir_name(generation: u64) -> String {
    format!("engine-{generation}")
}

/// openraft's snapshot data: a directory holding a snapshot's files and its
/// `MANIFEST`. Built and installed snapshots live under the state machine's
/// `snapshots/` directory; a handle from `begin_receiving` names an
/// empty staging directory for the network layer to fill.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapshotHandle {
    dir: PathBuf,
}

impl SnapshotHandle {
    /// A handle on `dir`.
    pub fn new(dir: impl Into<PathBuf>) -> SnapshotHandle {
        SnapshotHandle { dir: dir.into() }
    }

    /// The snapshot directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Path of the manifest.
    pub fn manifest_path(&self) -> PathBuf {
        self.dir.join(MANIFEST_FILE)
    }

    /// Path of a listed file; refuses names a manifest may not hold.
    pub fn file_path(&self, name: &str) -> Result<PathBuf, SnapshotError> {
        check_file_name(name).map_err(|reason| SnapshotError::Malformed {
            path: self.dir.join(name),
            reason,
        })?;
        Ok(self.dir.join(name))
    }

    /// Reads and decodes the manifest.
    pub fn read_manifest(&self) -> Result<Manifest, SnapshotError> {
        let path = self.manifest_path();
        let bytes = read_capped(&path, MANIFEST_BYTES_MAX)?;
        Manifest::decode(&bytes).map_err(|reason| SnapshotError::Malformed { path, reason })
    }

    /// Writes the manifest durably (temp file, fsync, rename, fsync dir).
    /// The receiving side calls this with the manifest the leader sent.
    pub fn write_manifest(&self, manifest: &Manifest) -> Result<(), SnapshotError> {
        write_atomic(&self.dir, MANIFEST_FILE, &manifest.encode())
    }

    /// Checks every listed file's length and crc32 against the manifest and
    /// that the directory holds nothing else but the manifest.
    pub fn verify(&self, manifest: &Manifest) -> Result<(), SnapshotError> {
        for file in &manifest.files {
            let path = self.file_path(&file.name)?;
            let (len, crc) = crc_of_file(&path)?;
            if len != file.len {
                return Err(SnapshotError::Mismatch {
                    path,
                    reason: format!("{len} bytes, the manifest says {}", file.len),
                });
            }
            if crc != file.crc {
                return Err(SnapshotError::Mismatch {
                    path,
                    reason: format!("crc32 {crc:08x}, the manifest says {:08x}", file.crc),
                });
            }
        }
        Ok(())
    }
}

struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if self.bytes.len() < n {
            return Err(format!(
                "truncated: {n} bytes wanted, {} left",
                self.bytes.len()
            ));
        }
        let (head, tail) = self.bytes.split_at(n);
        self.bytes = tail;
        Ok(head)
    }
    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, String> {
        Ok(u16::from_le_bytes(
            self.take(2)?.try_into().expect("2 bytes"),
        ))
    }
    fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_le_bytes(
            self.take(4)?.try_into().expect("4 bytes"),
        ))
    }
    fn u64(&mut self) -> Result<u64, String> {
        Ok(u64::from_le_bytes(
            self.take(8)?.try_into().expect("8 bytes"),
        ))
    }
    fn string(&mut self, max: usize) -> Result<String, String> {
        let len = self.u16()? as usize;
        if len > max {
            return Err(format!("string of {len} bytes exceeds {max}"));
        }
        String::from_utf8(self.take(len)?.to_vec()).map_err(|_| "string is not UTF-8".to_string())
    }
    fn log_id(&mut self) -> Result<Option<NodeLogId>, String> {
        match self.u8()? {
            0 => Ok(None),
            1 => {
                let term = self.u64()?;
                let node_id = self.u64()?;
                let index = self.u64()?;
                Ok(Some(log_id(term, node_id, index)))
            }
            other => Err(format!("bad log id flag {other}")),
        }
    }
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    let len = u16::try_from(s.len()).expect("strings in manifests are short");
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn put_log_id(out: &mut Vec<u8>, log_id: Option<&NodeLogId>) {
    match log_id {
        None => out.push(0),
        Some(log_id) => {
            out.push(1);
            out.extend_from_slice(&log_id.leader_id.term.to_le_bytes());
            out.extend_from_slice(&log_id.leader_id.node_id.to_le_bytes());
            out.extend_from_slice(&log_id.index.to_le_bytes());
        }
    }
}

/// The file system every file of the node goes through: the lazy disk
/// (`crate::lazy_disk`, power loss = SIGKILL) in a `lazy-disk` build, the
/// real files otherwise. The Raft log store, the engine, snapshots,
/// `CURRENT` and `IDENTITY` all use it.
pub fn node_vfs() -> Arc<dyn Vfs> {
    #[cfg(feature = "lazy-disk")]
    {
        crate::lazy_disk::shared()
    }
    #[cfg(not(feature = "lazy-disk"))]
    {
        static REAL: std::sync::OnceLock<Arc<dyn Vfs>> = std::sync::OnceLock::new();
        REAL.get_or_init(|| Arc::new(RealFs)).clone()
    }
}

/// Bytes read or copied per call.
const COPY_BUF_BYTES: usize = 256 * 1024;

fn open(path: &Path) -> Result<Arc<dyn VfsFile>, SnapshotError> {
    node_vfs().open(path).map_err(io_err("open", path))
}

/// Reads a whole file of at most `max` bytes.
pub fn read_capped(path: &Path, max: usize) -> Result<Vec<u8>, SnapshotError> {
    let file = open(path)?;
    let len = file.len().map_err(io_err("read", path))?;
    if len > max as u64 {
        return Err(SnapshotError::Malformed {
            path: path.to_path_buf(),
            reason: format!("longer than {max} bytes"),
        });
    }
    let mut bytes = vec![0u8; len as usize];
    file.read_exact_at(&mut bytes, 0)
        .map_err(io_err("read", path))?;
    Ok(bytes)
}

/// Feeds the first `len` bytes of `file` to `hasher`; returns how many there
/// were (fewer if the file is shorter).
fn hash_prefix(
    file: &dyn VfsFile,
    path: &Path,
    len: u64,
    hasher: &mut crc32fast::Hasher,
) -> Result<u64, SnapshotError> {
    let mut buf = vec![0u8; COPY_BUF_BYTES];
    let mut read = 0u64;
    while read < len {
        let want = (len - read).min(buf.len() as u64) as usize;
        let n = file
            .read_at(&mut buf[..want], read)
            .map_err(io_err("read", path))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        read += n as u64;
    }
    Ok(read)
}

/// Length and crc32 of a whole file.
pub fn crc_of_file(path: &Path) -> Result<(u64, u32), SnapshotError> {
    let file = open(path)?;
    let len = file.len().map_err(io_err("read", path))?;
    let mut hasher = crc32fast::Hasher::new();
    let read = hash_prefix(&*file, path, len, &mut hasher)?;
    Ok((read, hasher.finalize()))
}

/// crc32 of the first `len` bytes of a file; `None` if it is shorter.
pub fn crc_of_prefix(path: &Path, len: u64) -> Result<Option<u32>, SnapshotError> {
    let file = open(path)?;
    let mut hasher = crc32fast::Hasher::new();
    let read = hash_prefix(&*file, path, len, &mut hasher)?;
    Ok((read == len).then(|| hasher.finalize()))
}

/// Copies the first `len` bytes of `from` into a new file `to` (which must
/// not exist) and fsyncs it (its name is durable once the caller fsyncs
/// the directory).
pub fn copy_prefix(from: &Path, to: &Path, len: u64) -> Result<(), SnapshotError> {
    let vfs = node_vfs();
    if vfs.file_exists(to) {
        return Err(SnapshotError::Io {
            op: "create",
            path: to.to_path_buf(),
            source: io::Error::new(io::ErrorKind::AlreadyExists, "the file exists"),
        });
    }
    let source = open(from)?;
    let out = vfs.create(to).map_err(io_err("create", to))?;
    let mut buf = vec![0u8; COPY_BUF_BYTES];
    let mut copied = 0u64;
    while copied < len {
        let want = (len - copied).min(buf.len() as u64) as usize;
        let n = source
            .read_at(&mut buf[..want], copied)
            .map_err(io_err("read", from))?;
        if n == 0 {
            break;
        }
        out.write_all_at(&buf[..n], copied)
            .map_err(io_err("copy into", to))?;
        copied += n as u64;
    }
    if copied != len {
        return Err(SnapshotError::Mismatch {
            path: from.to_path_buf(),
            reason: format!("only {copied} of {len} bytes could be copied"),
        });
    }
    out.sync().map_err(io_err("fsync", to))
}

/// fsyncs a file.
pub fn fsync_file(path: &Path) -> Result<(), SnapshotError> {
    open(path)?.sync().map_err(io_err("fsync", path))
}

/// fsyncs a directory (makes its entries durable).
pub fn fsync_dir(path: &Path) -> Result<(), SnapshotError> {
    node_vfs()
        .sync_dir(path)
        .map_err(io_err("fsync directory", path))
}

/// Creates a directory (and parents) and fsyncs its parent.
pub fn create_dir_durable(path: &Path) -> Result<(), SnapshotError> {
    node_vfs()
        .create_dir_all(path)
        .map_err(io_err("create directory", path))?;
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        fsync_dir(parent)?;
    }
    Ok(())
}

/// Deletes a directory and everything in it.
pub fn remove_dir_all(path: &Path) -> io::Result<()> {
    node_vfs().remove_dir_all(path)
}

/// Writes `dir/name` atomically: `name.tmp` written and fsynced, renamed
/// over `name`, directory fsynced. No file is ever truncated and rewritten.
pub fn write_atomic(dir: &Path, name: &str, bytes: &[u8]) -> Result<(), SnapshotError> {
    let vfs = node_vfs();
    let tmp = dir.join(format!("{name}{TMP_SUFFIX}"));
    let target = dir.join(name);
    if vfs.file_exists(&tmp) {
        vfs.remove(&tmp).map_err(io_err("remove", &tmp))?;
    }
    let file = vfs.create(&tmp).map_err(io_err("create", &tmp))?;
    file.write_all_at(bytes, 0).map_err(io_err("write", &tmp))?;
    file.sync().map_err(io_err("fsync", &tmp))?;
    drop(file);
    vfs.rename(&tmp, &target).map_err(io_err("rename", &tmp))?;
    fsync_dir(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Manifest {
        let log_id = log_id(2, 7, 99);
        let nodes = BTreeMap::from([
            (
                1u64,
                NodeInfo {
                    client_addr: "a:1".into(),
                    peer_addr: "a:2".into(),
                },
            ),
            (
                7u64,
                NodeInfo {
                    client_addr: "b:1".into(),
                    peer_addr: "b:2".into(),
                },
            ),
            (9u64, NodeInfo::default()),
        ]);
        Manifest {
            snapshot_id: "snap-x".into(),
            cluster_id: 0x0123_4567_89ab_cdef_0011_2233_4455_6677,
            last_log_id: Some(log_id),
            membership: StoredMembership::new(
                Some(log_id),
                Membership::new(vec![BTreeSet::from([1, 7])], nodes).unwrap(),
            ),
            files: vec![
                ManifestFile {
                    kind: KIND_SEALED,
                    name: "seg-00000000000000000001.data".into(),
                    len: 4096,
                    crc: 0xdead_beef,
                },
                ManifestFile {
                    kind: KIND_ACTIVE_PREFIX,
                    name: "seg-00000000000000065536.data".into(),
                    len: 17,
                    crc: 1,
                },
            ],
        }
    }

    #[test]
    fn manifest_round_trips_and_refuses_every_truncation_and_flip() {
        let bytes = sample().encode();
        assert_eq!(Manifest::decode(&bytes).unwrap(), sample());
        for cut in 0..bytes.len() {
            assert!(Manifest::decode(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        for at in 0..bytes.len() {
            let mut flipped = bytes.clone();
            flipped[at] ^= 0x10;
            assert!(Manifest::decode(&flipped).is_err(), "flip at {at}");
        }
    }

    #[test]
    fn pointer_round_trips() {
        for pointer in [
            Pointer {
                generation: 0,
                published_prefix: None,
            },
            Pointer {
                generation: 5,
                published_prefix: Some(("seg-1.data".into(), 77)),
            },
        ] {
            let bytes = pointer.encode();
            assert_eq!(Pointer::decode(&bytes).unwrap(), pointer);
            for cut in 0..bytes.len() {
                assert!(Pointer::decode(&bytes[..cut]).is_err());
            }
        }
    }

    #[test]
    fn unsafe_names_are_refused() {
        for bad in ["", "../x", "a/b", MANIFEST_FILE, ".hidden", "x.tmp"] {
            assert!(check_file_name(bad).is_err(), "{bad}");
        }
        assert!(check_file_name("seg-00000000000000000001.hint").is_ok());
    }
}
