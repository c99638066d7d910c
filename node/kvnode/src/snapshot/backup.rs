//! Backups: the archive a snapshot is saved into (`kvctl snapshot save
//! FILE`, fed by the `SaveSnapshot` stream) and `kvnode restore`, which
//! seeds a member of a new cluster from one.
//!
//! # Archive format
//!
//! The byte layout, its writer and its verifying reader are the
//! `kvarchive` crate (`node/archive`; every byte is described in its crate
//! docs), which treats the manifest as opaque bytes. This module adds what
//! needs the node's types: [`ArchiveWriter`] and [`verify_archive`] decode
//! the `MANIFEST` an archive carries ([`Manifest`], `SNAPSHOT_FORMAT.md`)
//! and check every file header against its list; [`write_snapshot_dir`]
//! writes a member's snapshot directory as an archive.
//!
//! # Restore
//!
//! [`restore`] verifies the whole archive before it writes anything, refuses
//! a non-empty data directory, and builds the member's directory under a
//! temporary sibling name, renamed into place last (so an interrupted
//! restore leaves no half-made data directory under the real name):
//!
//! 1. `state/`: the archive's files are installed as a snapshot at the
//!    backup's last log id `L` (the state machine's own install path:
//!    verify, fsync, switch `CURRENT`), with the manifest rewritten to the
//!    new cluster id;
//! 2. one membership entry at `L + 1` (same leader id as `L`) naming the new
//!    members (all voters) is applied, then a snapshot at `L + 1` is built;
//!    every member restored from the same archive with the same
//!    `--initial-cluster` holds identical files;
//! 3. `raft-log/`: empty, purged through `L + 1`, and a vote of `L`'s term
//!    (reopened uncommitted, as every vote is), so the first election is in
//!    a later term than every log id the state machine holds — openraft then
//!    starts with `last_applied` = last log id = purge point = `L + 1`, the
//!    new membership taken from the state machine, and no log before it (a
//!    member that lags catches up by snapshot). No committed id is written:
//!    the log store keeps it in memory only (`LogStoreOptions::
//!    persist_committed` is off by default), and openraft takes the state
//!    machine's applied id `L + 1` as committed at start;
//! 4. `IDENTITY`: a fresh incarnation and the new cluster id.
//!
//! Files: the state machine, log store and identity write through the
//! node's vfs (`snapshot::node_vfs`) as in a running member; only the
//! archive's files are extracted with `std::fs` (written and fsynced, in a
//! directory no member runs on yet), so in a `lazy-disk` build they are
//! outside the lazy disk's model. [`write_snapshot_dir`] reads a snapshot
//! through the vfs; the archive it writes (like `kvctl snapshot save`'s, on
//! the client's machine) is not a member's file.
//!
//! The new cluster id is derived from the archive's manifest, the new
//! membership and `--cluster-token` (so every member restored with the same
//! arguments agrees on it without talking to the others; a different token
//! makes a different cluster from the same backup). It is never the backup's
//! own cluster id, so restored members and the old cluster refuse each
//! other.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::{self, File};
use std::io::{self, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use kvarchive::{ARCHIVE_COPY_BYTES, ArchiveError, ArchiveFile};
use openraft::storage::RaftLogStorage;
use openraft::{EntryPayload, Membership, SnapshotMeta, Vote};
use vfs::RealFs;

use crate::log_store::LogStore;
use crate::node::identity::{Identity, IdentityError};
use crate::raft::types::{NodeEntry, NodeInfo, NodeLogId, TypeConfig};
use crate::snapshot::{
    self, FILE_NAME_BYTES_MAX, MANIFEST_BYTES_MAX, Manifest, SnapshotError, SnapshotHandle,
};
use crate::state_machine::{SmError, StateMachine, StateMachineOptions};

// Every manifest a member writes, and every file name in it, fits an archive.
const _: () = assert!(MANIFEST_BYTES_MAX <= kvarchive::MANIFEST_BYTES_MAX);
const _: () = assert!(FILE_NAME_BYTES_MAX <= kvarchive::FILE_NAME_BYTES_MAX);

/// Suffix of the sibling directory a restore builds before renaming it to
/// the data directory.
pub const RESTORE_TMP_SUFFIX: &str = ".restore-tmp";
/// Name of the log directory inside a data directory (as `Node` uses it).
pub const RAFT_LOG_DIR: &str = "raft-log";
/// Name of the state-machine directory inside a data directory.
pub const STATE_DIR: &str = "state";

/// Why a backup could not be written, read or restored.
#[derive(Debug, thiserror::Error)]
pub enum BackupError {
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
    /// The restore's arguments are unusable (member not listed, data
    /// directory not empty, ...).
    #[error("{0}")]
    Config(String),
    /// The state machine refused the snapshot or failed.
    #[error("state machine: {0}")]
    StateMachine(#[from] SmError),
    /// A snapshot file operation failed.
    #[error("snapshot: {0}")]
    Snapshot(#[from] SnapshotError),
    /// The Raft log could not be prepared.
    #[error("raft log: {0}")]
    Log(String),
    /// The identity file could not be written.
    #[error("identity: {0}")]
    Identity(#[from] IdentityError),
}

impl From<ArchiveError> for BackupError {
    fn from(err: ArchiveError) -> BackupError {
        match err {
            ArchiveError::Io { op, path, source } => BackupError::Io { op, path, source },
            ArchiveError::Format(reason) => BackupError::Format(reason),
        }
    }
}

fn io_err(op: &'static str, path: &Path) -> impl FnOnce(io::Error) -> BackupError {
    let path = path.to_path_buf();
    move |source| BackupError::Io { op, path, source }
}

fn format_err(reason: impl Into<String>) -> BackupError {
    BackupError::Format(reason.into())
}

/// The manifest's files as the archive's headers repeat them.
fn archive_files(manifest: &Manifest) -> Vec<ArchiveFile> {
    manifest
        .files
        .iter()
        .map(|f| ArchiveFile {
            name: f.name.clone(),
            len: f.len,
            crc: f.crc,
        })
        .collect()
}

/// Decodes an archive's manifest for the reader, keeping it in `slot`.
fn decoding(
    slot: &mut Option<Manifest>,
) -> impl FnMut(&[u8]) -> Result<Vec<ArchiveFile>, String> + '_ {
    move |bytes| {
        let manifest = Manifest::decode(bytes)?;
        let files = archive_files(&manifest);
        *slot = Some(manifest);
        Ok(files)
    }
}

/// Writes an archive from a manifest and the files' bytes in manifest
/// order, as the `SaveSnapshot` stream delivers them (manifest, then
/// chunks): `kvarchive::ArchiveWriter` over the decoded manifest's file
/// list, so every chunk's file and offset and every file's length and
/// CRC-32 are checked against the manifest as it goes.
pub struct ArchiveWriter<W: Write> {
    inner: kvarchive::ArchiveWriter<W>,
    manifest: Manifest,
}

impl<W: Write> std::fmt::Debug for ArchiveWriter<W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ArchiveWriter")
            .field("snapshot_id", &self.manifest.snapshot_id)
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl<W: Write> ArchiveWriter<W> {
    /// Starts an archive with `manifest_bytes` (a member's `MANIFEST`, as
    /// `SnapshotManifest.encoded` carries it): decoded first, refused if
    /// malformed.
    pub fn new(out: W, manifest_bytes: &[u8]) -> Result<ArchiveWriter<W>, BackupError> {
        let manifest = Manifest::decode(manifest_bytes)
            .map_err(|reason| format_err(format!("the manifest: {reason}")))?;
        let inner = kvarchive::ArchiveWriter::new(out, manifest_bytes, archive_files(&manifest))?;
        Ok(ArchiveWriter { inner, manifest })
    }

    /// The manifest being written.
    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// Bytes of file contents the archive holds when complete (for a
    /// progress bar).
    pub fn file_bytes_total(&self) -> u64 {
        self.inner.file_bytes_total()
    }

    /// Bytes of file contents written so far.
    pub fn file_bytes_written(&self) -> u64 {
        self.inner.file_bytes_written()
    }

    /// Appends `data` at `offset` of file `file_name`. Files come in
    /// manifest order with consecutive offsets; an empty file may have no
    /// chunk at all.
    pub fn write_chunk(
        &mut self,
        file_name: &str,
        offset: u64,
        data: &[u8],
    ) -> Result<(), BackupError> {
        Ok(self.inner.write_chunk(file_name, offset, data)?)
    }

    /// Writes the trailer once every file is complete; returns the output.
    pub fn finish(self) -> Result<W, BackupError> {
        Ok(self.inner.finish()?)
    }
}

/// Writes a snapshot directory (its `MANIFEST` and files) as an archive.
pub fn write_snapshot_dir<W: Write>(handle: &SnapshotHandle, out: W) -> Result<W, BackupError> {
    let manifest_bytes = snapshot::read_capped(&handle.manifest_path(), MANIFEST_BYTES_MAX)?;
    let mut writer = ArchiveWriter::new(out, &manifest_bytes)?;
    let files = writer.manifest().files.clone();
    let mut buf = vec![0u8; ARCHIVE_COPY_BYTES];
    for file in &files {
        let path = handle.file_path(&file.name)?;
        // Through the node's vfs (the lazy disk in a lazy-disk build).
        let source = snapshot::node_vfs()
            .open(&path)
            .map_err(io_err("open", &path))?;
        let mut offset = 0u64;
        while offset < file.len {
            let want = (file.len - offset).min(buf.len() as u64) as usize;
            let n = source
                .read_at(&mut buf[..want], offset)
                .map_err(io_err("read", &path))?;
            if n == 0 {
                break;
            }
            writer.write_chunk(&file.name, offset, &buf[..n])?;
            offset += n as u64;
        }
        if offset == 0 {
            writer.write_chunk(&file.name, 0, &[])?;
        }
    }
    writer.finish()
}

/// What a verified archive holds.
/// What a verified archive holds.
#[derive(Clone, Debug)]
pub struct ArchiveSummary {
    /// The manifest.
    pub manifest: Manifest,
    /// The manifest's bytes, as in the archive.
    pub manifest_bytes: Vec<u8>,
    /// Bytes of file contents.
    pub file_bytes: u64,
}

/// Receives each file's entry and a piece of its bytes.
type FileSink<'a> = dyn FnMut(&ArchiveFile, &[u8]) -> Result<(), BackupError> + 'a;

/// Reads an archive from `input` (`kvarchive::read_archive`, every header
/// checked against the decoded manifest); `sink` gets each file's entry and
/// its bytes in pieces of at most [`ARCHIVE_COPY_BYTES`] (an empty piece
/// opens each file). Any error stops the read.
fn read_archive(input: impl Read, sink: &mut FileSink<'_>) -> Result<ArchiveSummary, BackupError> {
    let mut manifest = None;
    let read = kvarchive::read_archive(input, &mut decoding(&mut manifest), sink)?;
    let manifest = manifest.ok_or_else(|| format_err("the manifest was not read"))?;
    Ok(ArchiveSummary {
        manifest,
        manifest_bytes: read.manifest_bytes,
        file_bytes: read.file_bytes,
    })
}

/// Reads and checks the whole archive at `path` (every header against the
/// manifest, every file's CRC-32, the trailer), writing nothing.
pub fn verify_archive(path: &Path) -> Result<ArchiveSummary, BackupError> {
    let file = File::open(path).map_err(io_err("open", path))?;
    read_archive(BufReader::new(file), &mut |_, _| Ok(())).map_err(|err| in_archive(path, err))
}

fn in_archive(path: &Path, err: BackupError) -> BackupError {
    match err {
        BackupError::Format(reason) => format_err(format!("{}: {reason}", path.display())),
        other => other,
    }
}

/// Reads the archive at `path` again and writes each file into `handle`'s
/// directory (checking everything again: the archive may have changed since
/// it was verified).
fn extract(path: &Path, handle: &SnapshotHandle) -> Result<ArchiveSummary, BackupError> {
    let file = File::open(path).map_err(io_err("open", path))?;
    let mut out: Option<(String, File)> = None;
    let summary = read_archive(BufReader::new(file), &mut |entry, bytes| {
        if out.as_ref().is_none_or(|(name, _)| *name != entry.name) {
            if let Some((name, file)) = out.take() {
                file.sync_all()
                    .map_err(io_err("fsync", &handle.dir().join(name)))?;
            }
            let target = handle.file_path(&entry.name)?;
            let file = fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&target)
                .map_err(io_err("create", &target))?;
            out = Some((entry.name.clone(), file));
        }
        if let Some((name, file)) = out.as_mut() {
            file.write_all(bytes)
                .map_err(io_err("write", &handle.dir().join(name.as_str())))?;
        }
        Ok(())
    })
    .map_err(|err| in_archive(path, err))?;
    if let Some((name, file)) = out.take() {
        file.sync_all()
            .map_err(io_err("fsync", &handle.dir().join(name)))?;
    }
    Ok(summary)
}

/// What `kvnode restore` needs.
#[derive(Clone, Debug)]
pub struct RestoreOptions {
    /// The archive.
    pub archive: PathBuf,
    /// The new member's data directory: must not exist or be empty.
    pub data_dir: PathBuf,
    /// The new member's id.
    pub member_id: u64,
    /// The new cluster's members (all voters), the same on every member.
    pub initial_cluster: BTreeMap<u64, NodeInfo>,
    /// Mixed into the new cluster id (the same on every member).
    pub cluster_token: String,
    /// State-machine options of the new member (segment size: the same on
    /// every member, and as the backup's cluster used).
    pub state_machine: StateMachineOptions,
}

/// What a restore made.
#[derive(Clone, Debug)]
pub struct Restored {
    /// The new cluster id.
    pub cluster_id: u64,
    /// The backup's cluster id (0 if it did not know one).
    pub source_cluster_id: u64,
    /// The backup's last applied log id.
    pub snapshot_last_log_id: NodeLogId,
    /// The membership entry written after it: the restored member's
    /// last applied log id.
    pub last_log_id: NodeLogId,
    /// Files restored.
    pub files: usize,
    /// Bytes of file contents restored.
    pub file_bytes: u64,
}

/// The new cluster's id: derived from the backup's manifest, the new
/// membership and the token, never 0 nor the backup's own id.
pub fn derive_cluster_id(
    manifest_bytes: &[u8],
    members: &BTreeMap<u64, NodeInfo>,
    token: &str,
) -> u64 {
    let mut material = b"raftcask restore cluster id\0".to_vec();
    material.extend_from_slice(&(manifest_bytes.len() as u64).to_le_bytes());
    material.extend_from_slice(manifest_bytes);
    for (id, info) in members {
        material.extend_from_slice(&id.to_le_bytes());
        for addr in [&info.client_addr, &info.peer_addr] {
            material.extend_from_slice(&(addr.len() as u64).to_le_bytes());
            material.extend_from_slice(addr.as_bytes());
        }
    }
    material.extend_from_slice(&(token.len() as u64).to_le_bytes());
    material.extend_from_slice(token.as_bytes());
    let low = crc32fast::hash(&material);
    material.reverse();
    let high = crc32fast::hash(&material);
    let id = (u64::from(high) << 32) | u64::from(low);
    let old = Manifest::decode(manifest_bytes)
        .map(|m| m.cluster_id as u64)
        .unwrap_or(0);
    if id == 0 || id == old {
        id ^ 0x5a5a
    } else {
        id
    }
}

fn check_empty_or_missing(dir: &Path) -> Result<(), BackupError> {
    match fs::read_dir(dir) {
        Ok(mut entries) => {
            if entries.next().is_some() {
                return Err(BackupError::Config(format!(
                    "the data directory {} is not empty: restore seeds a new member and never \
                     overwrites one",
                    dir.display()
                )));
            }
            Ok(())
        }
        Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(BackupError::Io {
            op: "list",
            path: dir.to_path_buf(),
            source,
        }),
    }
}

async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, BackupError> + Send + 'static,
) -> Result<T, BackupError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|err| BackupError::Config(format!("restore task: {err}")))?
}

/// Seeds `options.data_dir` as member `options.member_id` of a new cluster
/// from the archive (steps in the module docs). Verifies the whole archive
/// before writing anything.
pub async fn restore(options: RestoreOptions) -> Result<Restored, BackupError> {
    let RestoreOptions {
        archive,
        data_dir,
        member_id,
        initial_cluster,
        cluster_token,
        state_machine,
    } = options;
    if member_id == 0 {
        return Err(BackupError::Config("member ids start at 1".to_string()));
    }
    if !initial_cluster.contains_key(&member_id) {
        return Err(BackupError::Config(format!(
            "the new cluster's members do not list member {member_id}"
        )));
    }
    for (id, info) in &initial_cluster {
        info.validate(*id).map_err(BackupError::Config)?;
    }
    check_empty_or_missing(&data_dir)?;
    let Some(name) = data_dir.file_name() else {
        return Err(BackupError::Config(format!(
            "the data directory {} has no name",
            data_dir.display()
        )));
    };
    let mut tmp_name = name.to_os_string();
    tmp_name.push(RESTORE_TMP_SUFFIX);
    let tmp = data_dir.with_file_name(tmp_name);
    if tmp.exists() {
        return Err(BackupError::Config(format!(
            "{} exists (left by an interrupted restore?): delete it and run again",
            tmp.display()
        )));
    }

    // 1. Verify everything before writing anything.
    let summary = {
        let archive = archive.clone();
        blocking(move || verify_archive(&archive)).await?
    };
    let manifest = summary.manifest.clone();
    let Some(snapshot_last) = manifest.last_log_id else {
        return Err(format_err(
            "the backup holds no applied entry: nothing to restore",
        ));
    };
    let cluster_id = derive_cluster_id(&summary.manifest_bytes, &initial_cluster, &cluster_token);
    let restore_log_id = NodeLogId::new(snapshot_last.leader_id, snapshot_last.index + 1);
    tracing::info!(
        archive = %archive.display(),
        snapshot = %manifest.snapshot_id,
        last_log_id = %snapshot_last,
        files = manifest.files.len(),
        bytes = summary.file_bytes,
        "archive verified"
    );

    let result = build(
        &archive,
        &tmp,
        member_id,
        &initial_cluster,
        cluster_id,
        &manifest,
        restore_log_id,
        state_machine,
    )
    .await;
    if let Err(err) = result {
        let doomed = tmp.clone();
        let _ = tokio::task::spawn_blocking(move || snapshot::remove_dir_all(&doomed)).await;
        return Err(err);
    }

    // Last: the finished directory takes the data directory's name.
    {
        let (tmp, data_dir) = (tmp.clone(), data_dir.clone());
        blocking(move || {
            snapshot::node_vfs()
                .rename(&tmp, &data_dir)
                .map_err(io_err("rename", &tmp))?;
            if let Some(parent) = data_dir.parent().filter(|p| !p.as_os_str().is_empty()) {
                snapshot::fsync_dir(parent)?;
            }
            Ok(())
        })
        .await?;
    }
    tracing::info!(
        member = member_id,
        cluster = format!("{cluster_id:016x}"),
        last_log_id = %restore_log_id,
        data_dir = %data_dir.display(),
        "restored"
    );
    Ok(Restored {
        cluster_id,
        source_cluster_id: manifest.cluster_id as u64,
        snapshot_last_log_id: snapshot_last,
        last_log_id: restore_log_id,
        files: manifest.files.len(),
        file_bytes: summary.file_bytes,
    })
}

/// Steps 1–4 of the module docs, in `dir` (the temporary directory).
#[allow(clippy::too_many_arguments)]
async fn build(
    archive: &Path,
    dir: &Path,
    member_id: u64,
    members: &BTreeMap<u64, NodeInfo>,
    cluster_id: u64,
    manifest: &Manifest,
    restore_log_id: NodeLogId,
    options: StateMachineOptions,
) -> Result<(), BackupError> {
    // State machine: install the archive's files as a snapshot.
    let sm = {
        let (archive, dir, manifest) = (archive.to_path_buf(), dir.to_path_buf(), manifest.clone());
        blocking(move || {
            snapshot::create_dir_durable(&dir)?;
            let sm = StateMachine::open(dir.join(STATE_DIR), options)?;
            let staging = sm.begin_receiving()?;
            let extracted = extract(&archive, &staging)?;
            if extracted.manifest != manifest {
                return Err(format_err(
                    "the archive changed between verifying and extracting it",
                ));
            }
            let mut ours = manifest.clone();
            ours.cluster_id = u128::from(cluster_id);
            staging.write_manifest(&ours)?;
            let meta = SnapshotMeta {
                last_log_id: ours.last_log_id,
                last_membership: ours.membership.clone(),
            };
            sm.install(&meta, &staging)?;
            sm.set_cluster_id(cluster_id);
            Ok(sm)
        })
        .await?
    };
    let (applied, _) = sm.applied();
    if applied != manifest.last_log_id {
        return Err(BackupError::Config(format!(
            "after installing the backup the state machine is at {applied:?}, the manifest says {:?}",
            manifest.last_log_id
        )));
    }

    // The new membership, as an entry at L + 1, then a snapshot there.
    let voters: BTreeSet<u64> = members.keys().copied().collect();
    let membership = Membership::new(vec![voters], members.clone())
        .map_err(|err| BackupError::Config(format!("the new membership: {err}")))?;
    let entry = NodeEntry {
        log_id: restore_log_id,
        payload: EntryPayload::Membership(membership),
    };
    sm.apply_entries(vec![entry])
        .map_err(|err| BackupError::Config(format!("applying the new membership: {err}")))?;
    let sm = blocking(move || {
        sm.build()?;
        Ok(sm)
    })
    .await?;
    let (applied, membership) = sm.applied();
    if applied != Some(restore_log_id) || membership.log_id() != &Some(restore_log_id) {
        return Err(BackupError::Config(format!(
            "the new membership did not apply: the state machine is at {applied:?}"
        )));
    }
    blocking(move || {
        drop(sm);
        Ok(())
    })
    .await?;

    // The Raft log: empty, purged through L + 1, a vote of L's term (no
    // committed id: the store keeps it in memory only, see the module docs).
    let log_dir = dir.join(RAFT_LOG_DIR);
    let mut log = blocking(move || {
        LogStore::<TypeConfig>::open(Arc::new(RealFs), log_dir)
            .map_err(|err| BackupError::Log(err.to_string()))
    })
    .await?;
    let vote = Vote::new(
        restore_log_id.leader_id.term,
        restore_log_id.leader_id.node_id,
    );
    log.save_vote(&vote)
        .await
        .map_err(|err| BackupError::Log(format!("save the vote: {err}")))?;
    log.purge(restore_log_id)
        .await
        .map_err(|err| BackupError::Log(format!("purge through {restore_log_id}: {err}")))?;
    blocking(move || {
        drop(log);
        Ok(())
    })
    .await?;

    // Identity: a fresh incarnation, the new cluster id.
    let dir = dir.to_path_buf();
    blocking(move || {
        let identity = Identity::load_or_create(&dir, member_id)?;
        identity.adopt_cluster_id(cluster_id)?;
        snapshot::fsync_dir(&dir)?;
        Ok(())
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::raft::types::log_id;
    use crate::snapshot::ManifestFile;
    use openraft::StoredMembership;

    fn sample(files: &[(&str, &[u8])]) -> (Manifest, Vec<u8>) {
        let log_id = log_id(3, 1, 42);
        let nodes = BTreeMap::from([(1u64, NodeInfo::default())]);
        let manifest = Manifest {
            snapshot_id: "s".into(),
            cluster_id: 7,
            last_log_id: Some(log_id),
            membership: StoredMembership::new(
                Some(log_id),
                Membership::new(vec![BTreeSet::from([1])], nodes).unwrap(),
            ),
            files: files
                .iter()
                .map(|(name, bytes)| ManifestFile {
                    kind: snapshot::KIND_SEALED,
                    name: name.to_string(),
                    len: bytes.len() as u64,
                    crc: crc32fast::hash(bytes),
                })
                .collect(),
        };
        let bytes = manifest.encode();
        (manifest, bytes)
    }

    fn archive(files: &[(&str, &[u8])]) -> Vec<u8> {
        let (_, manifest_bytes) = sample(files);
        let mut writer = ArchiveWriter::new(Vec::new(), &manifest_bytes).unwrap();
        for (name, bytes) in files {
            for (i, chunk) in bytes.chunks(3).enumerate() {
                writer.write_chunk(name, (i * 3) as u64, chunk).unwrap();
            }
        }
        writer.finish().unwrap()
    }

    const FILES: &[(&str, &[u8])] = &[
        ("seg-1.data", b"hello world"),
        ("seg-1.hint", b""),
        ("seg-2.data", b"abcdefgh"),
    ];

    // The format's own checks (every truncation and flip, the writer's
    // refusals) are kvarchive's tests; these cover the manifest's part.
    #[test]
    fn archive_round_trips_with_its_decoded_manifest() {
        let bytes = archive(FILES);
        let mut seen = Vec::new();
        let summary = read_archive(&bytes[..], &mut |file, data| {
            seen.push((file.name.clone(), data.to_vec()));
            Ok(())
        })
        .unwrap();
        assert_eq!(summary.manifest, sample(FILES).0);
        assert_eq!(summary.manifest_bytes, sample(FILES).1);
        assert_eq!(summary.file_bytes, 19);
        let joined: Vec<u8> = seen
            .iter()
            .filter(|(n, _)| n == "seg-1.data")
            .flat_map(|(_, d)| d.clone())
            .collect();
        assert_eq!(joined, b"hello world");
    }

    #[test]
    fn headers_must_match_the_manifest() {
        // An archive whose opaque manifest lists other files than its
        // headers: the format is intact, the decoded manifest refuses it.
        let (_, other) = sample(&[("seg-1.data", b"hello world")]);
        let files = FILES
            .iter()
            .map(|(name, bytes)| ArchiveFile::of(name, bytes))
            .collect();
        let mut writer = kvarchive::ArchiveWriter::new(Vec::new(), &other, files).unwrap();
        for (name, bytes) in FILES {
            writer.write_chunk(name, 0, bytes).unwrap();
        }
        let bytes = writer.finish().unwrap();
        let refused = read_archive(&bytes[..], &mut |_, _| Ok(()));
        assert!(
            matches!(refused, Err(BackupError::Format(_))),
            "{refused:?}"
        );
        // A manifest that does not decode is refused by the writer.
        assert!(ArchiveWriter::new(Vec::new(), b"not a manifest").is_err());
    }

    #[test]
    fn cluster_ids_depend_on_token_and_members() {
        let (_, manifest_bytes) = sample(FILES);
        let members = BTreeMap::from([(1u64, NodeInfo::default())]);
        let a = derive_cluster_id(&manifest_bytes, &members, "");
        assert_eq!(a, derive_cluster_id(&manifest_bytes, &members, ""));
        assert_ne!(a, derive_cluster_id(&manifest_bytes, &members, "x"));
        let more = BTreeMap::from([(1u64, NodeInfo::default()), (2u64, NodeInfo::default())]);
        assert_ne!(a, derive_cluster_id(&manifest_bytes, &more, ""));
        assert_ne!(a, 0);
        assert_ne!(a, 7);
    }
}
