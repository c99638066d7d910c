//! The Raft state machine: openraft's `RaftStateMachine` over the bitcask
//! engine and [`Applier`], with snapshots made of the engine's files.
//!
//! Directory layout (`<dir>` is the state machine's directory):
//! - `CURRENT`: names the engine directory in use (see [`Pointer`]);
//! - `engine-<generation>/`: the engine's data directory;
//! - `snapshots/snap-<counter>/`: a built or installed snapshot (its files
//!   and `MANIFEST`); the current one is the one with the highest last log
//!   id (ties: the higher counter; never the counter alone, see `Rank`),
//!   and the two best are kept;
//! - `snapshots/staging-<counter>/`: a snapshot being received.
//!
//! Every applied entry (normal, blank, membership) is one engine batch whose
//! commit record carries a [`CommitMeta`], so `last_applied`, the membership
//! and the cluster clock come back exactly from the engine at open, and
//! replaying entries at or below `last_applied` does nothing. The engine
//! never fsyncs on apply (the Raft log is the write-ahead log) and never
//! merges on its own; merges come as `Command::Merge` entries.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use bitcask::{Batch, Engine, Options, PublishedPrefix, SyncPolicy};
use openraft::storage::RaftStateMachine;
use openraft::{
    EntryPayload, OptionalSend, RaftSnapshotBuilder, Snapshot, SnapshotMeta, StorageError,
    StorageIOError, StoredMembership,
};

use crate::codec::CodecError;
use crate::hooks::{InstallFailpoints, InstallStep};
use crate::raft::types::{CommitMeta, NodeInfo, NodeLogId, NodeMembership, TypeConfig};
use crate::snapshot::{
    self, CURRENT_BYTES_MAX, CURRENT_FILE, KIND_ACTIVE_PREFIX, KIND_SEALED, Manifest, ManifestFile,
    Pointer, SnapshotError, SnapshotHandle, io_err, node_vfs,
};
use kvstate::apply::{Applier, ApplyError, VERSIONS_PER_INDEX};
use kvstate::command::{Command, EntryResponse};

/// Name of the directory holding snapshots.
pub const SNAPSHOTS_DIR: &str = "snapshots";
/// Prefix of a complete snapshot directory (`snap-<20-digit counter>`).
pub const SNAPSHOT_DIR_PREFIX: &str = "snap-";
/// Prefix of a staging directory (`staging-<20-digit counter>`).
pub const STAGING_DIR_PREFIX: &str = "staging-";
/// Complete snapshots kept on disk: the current one (the highest last log
/// id, ties broken by the higher counter) and the next one in that order,
/// which stays so that a transfer of it in progress can finish.
pub const SNAPSHOTS_KEPT: usize = 2;

/// Why the state machine failed. Any of these stops the node.
#[derive(Debug, thiserror::Error)]
pub enum SmError {
    /// The engine failed.
    #[error("engine: {0}")]
    Engine(#[from] bitcask::Error),
    /// Applying an entry failed.
    #[error("apply: {0}")]
    Apply(#[from] ApplyError),
    /// A snapshot, pointer or file operation failed.
    #[error("snapshot: {0}")]
    Snapshot(#[from] SnapshotError),
    /// The engine's last commit metadata does not decode.
    #[error("commit metadata of the engine's last batch: {0}")]
    Meta(#[from] CodecError),
    /// The state does not hold together (snapshot and meta disagree, ...).
    #[error("{0}")]
    Inconsistent(String),
}

/// Options of the state machine.
#[derive(Clone, Debug, Default)]
pub struct StateMachineOptions {
    /// Engine options; `sync`, `auto_merge`, `published_prefix` and `vfs` are
    /// overridden (never, off, from `CURRENT`, `snapshot::node_vfs`: the
    /// lazy disk in a `lazy-disk` build, real files otherwise). Options that
    /// shape files (segment size) must be equal on every replica.
    pub engine: Options,
    /// Crash points of a snapshot receive and install (tests; a stand-in
    /// that never fires without the `testing` feature).
    pub failpoints: InstallFailpoints,
    /// Test-only: cluster time a session may stay idle before it is evicted;
    /// `None` = [`kvstate::command::SESSION_IDLE_MS_MAX`]. Every member must
    /// use the same value (`kvnode run --test-session-idle-ms`).
    pub session_idle_ms: Option<u64>,
    /// TEST FAULT (`testing` builds only): the stale build before an
    /// install's engine switch (see [`crate::testing::stale_build`]).
    #[cfg(feature = "testing")]
    pub stale_build: crate::testing::stale_build::StaleBuildFault,
}

/// What a receiver asks the leader for: the file `name` from `offset` (0 =
/// whole) to its manifest length; `prefix_crc` is the crc32 of the first
/// `offset` bytes it holds already.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NeededRange {
    /// File name from the manifest.
    pub name: String,
    /// Bytes already staged (a copy of a prefix this member holds).
    pub offset: u64,
    /// crc32 of those bytes.
    pub prefix_crc: u32,
}

/// The outcome of matching an offered manifest against this member's files.
#[derive(Debug)]
pub struct ReceivePlan {
    /// The staging directory: reused files are already in it.
    pub staging: SnapshotHandle,
    /// What to ask the leader for, in manifest order.
    pub needed: Vec<NeededRange>,
    /// Files reused whole (hard-linked or copied; not transferred).
    pub files_reused: u64,
    /// Bytes reused (whole files and staged prefixes).
    pub bytes_reused: u64,
}

/// A file this member holds that may match a manifest entry.
#[derive(Clone, Debug)]
struct Candidate {
    path: PathBuf,
    len: u64,
    crc: u32,
    /// Never appended to (a sealed engine file or a snapshot's file): may be
    /// hard-linked. The engine's active segment is copied instead.
    immutable: bool,
}

#[derive(Clone, Debug)]
struct CurrentSnapshot {
    counter: u64,
    manifest: Manifest,
}

/// The order of complete snapshots: the current one is the greatest. By
/// last log id (what the snapshot holds), ties broken by the higher counter
/// (the later made; equal log ids hold equal state). Never by counter
/// alone: a build that started on the old engine just after a received
/// snapshot was sealed takes a higher counter with a lower last log id, and
/// openraft may already have purged the log through the received one.
type Rank = (Option<NodeLogId>, u64);

fn rank(counter: u64, manifest: &Manifest) -> Rank {
    // NEGATIVE CONTROL (feature nc-snapshot-by-counter): the highest counter
    // wins whatever it holds (the old choice), so a stale build made on the
    // old engine beats a received snapshot whose install was cut short.
    if cfg!(feature = "nc-snapshot-by-counter") {
        return (None, counter);
    }
    (manifest.last_log_id, counter)
}

impl CurrentSnapshot {
    fn rank(&self) -> Rank {
        rank(self.counter, &self.manifest)
    }
}

#[derive(Debug)]
struct Inner {
    engine: Arc<Engine>,
    applier: Applier,
    generation: u64,
    last_applied: Option<NodeLogId>,
    membership: NodeMembership,
    time_ms: u64,
    current: Option<CurrentSnapshot>,
    next_counter: u64,
}

#[derive(Debug)]
struct Shared {
    dir: PathBuf,
    options: StateMachineOptions,
    inner: Mutex<Inner>,
    engine: RwLock<Arc<Engine>>,
    cluster_time_ms: AtomicU64,
    /// Held for the whole of a snapshot build or install: an install never
    /// removes an engine directory a build is still linking from.
    snapshot_work: Mutex<()>,
    /// The cluster id written into manifests (0 = not known yet).
    cluster_id: AtomicU64,
}

/// The state machine (cheap to clone: clones share one state). It is also
/// its own snapshot builder.
#[derive(Clone, Debug)]
pub struct StateMachine {
    shared: Arc<Shared>,
}

fn sm_err(err: SmError) -> StorageError<u64> {
    StorageIOError::write_state_machine(&err).into()
}

fn snapshot_err(err: SmError) -> StorageError<u64> {
    StorageIOError::write_snapshot(None, &err).into()
}

fn counter_name(prefix: &str, counter: u64) -> String {
    format!("{prefix}{counter:020}")
}

fn parse_counter(name: &str, prefix: &str) -> Option<u64> {
    let digits = name.strip_prefix(prefix)?;
    if digits.len() != 20 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

fn list_dir(dir: &Path) -> Result<Vec<String>, SnapshotError> {
    node_vfs().list(dir).map_err(io_err("list", dir))
}

fn remove_file(path: &Path) {
    let _ = node_vfs().remove(path);
}

fn hard_link(from: &Path, to: &Path) -> Result<(), SnapshotError> {
    node_vfs()
        .hard_link(from, to)
        .map_err(io_err("hard-link", to))
}

/// Deletes a directory. A snapshot's `MANIFEST` goes first, durably (its
/// directory fsynced), so a crash part-way through the rest never leaves
/// a snapshot that looks complete with files missing (the next open would
/// pick it and fail to verify it); without the manifest, the next open
/// deletes what is left as incomplete.
fn remove_dir_logged(path: &Path) {
    let vfs = node_vfs();
    let manifest = path.join(snapshot::MANIFEST_FILE);
    if vfs.file_exists(&manifest) {
        let unlinked = vfs
            .remove(&manifest)
            .map_err(io_err("remove", &manifest))
            .and_then(|()| snapshot::fsync_dir(path));
        if let Err(err) = unlinked {
            tracing::warn!(path = %path.display(), error = %err, "could not delete a snapshot's manifest; the directory is kept");
            return;
        }
    }
    if let Err(err) = snapshot::remove_dir_all(path)
        && err.kind() != std::io::ErrorKind::NotFound
    {
        tracing::warn!(path = %path.display(), error = %err, "could not delete a directory");
    }
}

fn decode_meta(engine: &Engine) -> Result<Option<CommitMeta>, SmError> {
    match engine.last_commit_meta() {
        None => Ok(None),
        Some(bytes) => Ok(Some(CommitMeta::decode(&bytes)?)),
    }
}

impl StateMachine {
    /// Opens (or creates) the state machine in `dir`.
    pub fn open(dir: impl AsRef<Path>, options: StateMachineOptions) -> Result<Self, SmError> {
        let dir = dir.as_ref().to_path_buf();
        snapshot::create_dir_durable(&dir)?;
        let snapshots = dir.join(SNAPSHOTS_DIR);
        snapshot::create_dir_durable(&snapshots)?;
        let current_path = dir.join(CURRENT_FILE);
        let pointer = if node_vfs().file_exists(&current_path) {
            let bytes = snapshot::read_capped(&current_path, CURRENT_BYTES_MAX)?;
            Pointer::decode(&bytes).map_err(|reason| SnapshotError::Malformed {
                path: current_path.clone(),
                reason,
            })?
        } else {
            let pointer = Pointer {
                generation: 0,
                published_prefix: None,
            };
            snapshot::create_dir_durable(&dir.join(pointer.engine_dir_name()))?;
            snapshot::write_atomic(&dir, CURRENT_FILE, &pointer.encode())?;
            pointer
        };
        // Leftovers of an interrupted install or write.
        for name in list_dir(&dir)? {
            if (name.starts_with("engine-") && name != pointer.engine_dir_name())
                || name.ends_with(snapshot::TMP_SUFFIX)
            {
                let path = dir.join(&name);
                if path.is_dir() {
                    remove_dir_logged(&path);
                } else {
                    remove_file(&path);
                }
            }
        }
        // Snapshots: complete ones have a MANIFEST; staging ones and
        // incomplete builds are deleted.
        let mut complete: Vec<CurrentSnapshot> = Vec::new();
        let mut next_counter = 0u64;
        for name in list_dir(&snapshots)? {
            let path = snapshots.join(&name);
            if let Some(counter) = parse_counter(&name, SNAPSHOT_DIR_PREFIX) {
                next_counter = next_counter.max(counter + 1);
                match SnapshotHandle::new(&path).read_manifest() {
                    Ok(manifest) => complete.push(CurrentSnapshot { counter, manifest }),
                    Err(err) => {
                        tracing::warn!(snapshot = %name, error = %err, "deleting an incomplete snapshot");
                        remove_dir_logged(&path);
                    }
                }
            } else {
                if let Some(counter) = parse_counter(&name, STAGING_DIR_PREFIX) {
                    next_counter = next_counter.max(counter + 1);
                }
                remove_dir_logged(&path);
            }
        }
        let current = complete.iter().max_by_key(|s| s.rank()).cloned();
        let (engine, applier, meta) = open_engine(&dir, &options, &pointer)?;
        let (last_applied, membership, time_ms) = match meta {
            Some(meta) => (Some(meta.log_id), meta.membership, meta.time_ms),
            None => (None, StoredMembership::default(), 0),
        };
        let engine = Arc::new(engine);
        let sm = StateMachine {
            shared: Arc::new(Shared {
                dir,
                options,
                engine: RwLock::new(engine.clone()),
                cluster_time_ms: AtomicU64::new(time_ms),
                snapshot_work: Mutex::new(()),
                cluster_id: AtomicU64::new(0),
                inner: Mutex::new(Inner {
                    engine,
                    applier,
                    generation: pointer.generation,
                    last_applied,
                    membership,
                    time_ms,
                    current,
                    next_counter,
                }),
            }),
        };
        sm.switch_in_newer_snapshot()?;
        sm.prune_snapshots();
        Ok(sm)
    }

    /// The engine in use (replaced when a snapshot is installed: take it
    /// anew for each read).
    pub fn engine(&self) -> Arc<Engine> {
        self.shared
            .engine
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Cluster time of the last applied entry, in ms: what reads judge
    /// expiry against.
    pub fn cluster_time_ms(&self) -> u64 {
        self.shared.cluster_time_ms.load(Ordering::SeqCst)
    }

    /// Last applied log id and membership (as openraft's `applied_state`).
    pub fn applied(&self) -> (Option<NodeLogId>, NodeMembership) {
        let inner = self.lock();
        (inner.last_applied, inner.membership.clone())
    }

    /// The state machine's directory.
    pub fn dir(&self) -> &Path {
        &self.shared.dir
    }

    fn snapshots_dir(&self) -> PathBuf {
        self.shared.dir.join(SNAPSHOTS_DIR)
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.shared.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn apply_entries(
        &self,
        entries: impl IntoIterator<Item = openraft::Entry<TypeConfig>>,
    ) -> Result<Vec<EntryResponse>, SmError> {
        let mut inner = self.lock();
        let mut responses = Vec::new();
        for entry in entries {
            let log_id = entry.log_id;
            let index = log_id.index;
            if inner
                .last_applied
                .is_some_and(|applied| index <= applied.index)
            {
                responses.push(EntryResponse::default());
                continue;
            }
            let engine = inner.engine.clone();
            let (response, time_ms, membership) = match entry.payload {
                EntryPayload::Normal(mut proposal) => {
                    proposal.time_ms =
                        kvstate::apply::entry_time_ms(inner.time_ms, proposal.time_ms);
                    if index == 0 {
                        return Err(SmError::Inconsistent(
                            "a normal entry at log index 0 has no versions".to_string(),
                        ));
                    }
                    let meta = CommitMeta {
                        log_id,
                        time_ms: proposal.time_ms,
                        membership: inner.membership.clone(),
                    };
                    let response = inner
                        .applier
                        .apply(&engine, index, &proposal, meta.encode())?;
                    if let Command::Merge { inputs } = &proposal.command {
                        start_merge(&engine, inputs, proposal.time_ms);
                    }
                    (response, proposal.time_ms, meta.membership)
                }
                payload => {
                    let membership = match payload {
                        EntryPayload::Membership(membership) => {
                            StoredMembership::new(Some(log_id), membership)
                        }
                        _ => inner.membership.clone(),
                    };
                    let meta = CommitMeta {
                        log_id,
                        time_ms: inner.time_ms,
                        membership,
                    };
                    // Index 0 (openraft's initial membership) cannot use
                    // sequence 0; it comes first, so sequence 1 is free.
                    let seq = (index * VERSIONS_PER_INDEX).max(1);
                    engine.write_batch(&Batch::new().seq(seq).meta(meta.encode()))?;
                    (EntryResponse::default(), inner.time_ms, meta.membership)
                }
            };
            inner.last_applied = Some(log_id);
            inner.membership = membership;
            inner.time_ms = time_ms;
            self.shared.cluster_time_ms.store(time_ms, Ordering::SeqCst);
            responses.push(response);
        }
        Ok(responses)
    }

    /// Sets the cluster id that manifests carry and installs check.
    pub fn set_cluster_id(&self, cluster_id: u64) {
        self.shared.cluster_id.store(cluster_id, Ordering::SeqCst);
    }

    fn snapshot_work(&self) -> std::sync::MutexGuard<'_, ()> {
        self.shared
            .snapshot_work
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// Builds a snapshot of the files as of the last applied entry.
    pub fn build(&self) -> Result<Snapshot<TypeConfig>, SmError> {
        let _work = self.snapshot_work();
        // Capture under the lock (no apply meanwhile): fsync, file lists, pins.
        let (engine, pin, sealed, active, last_applied, membership, counter) = {
            let mut inner = self.lock();
            let engine = inner.engine.clone();
            engine.sync()?;
            let mut attempts = 0;
            let (sealed, active, pin) = loop {
                let sealed = engine.sealed_files();
                let active = engine.active_file();
                let names: Vec<String> = sealed
                    .iter()
                    .chain(active.iter())
                    .map(|f| f.name.clone())
                    .collect();
                match engine.pin(&names) {
                    Ok(pin) => break (sealed, active, pin),
                    // A merge swapped files in between: list again.
                    Err(bitcask::Error::UnknownFile(_)) if attempts < 100 => attempts += 1,
                    Err(err) => return Err(err.into()),
                }
            };
            let counter = inner.next_counter;
            inner.next_counter += 1;
            (
                engine,
                pin,
                sealed,
                active,
                inner.last_applied,
                inner.membership.clone(),
                counter,
            )
        };
        let snap_dir = self
            .snapshots_dir()
            .join(counter_name(SNAPSHOT_DIR_PREFIX, counter));
        node_vfs()
            .create_dir_all(&snap_dir)
            .map_err(io_err("create directory", &snap_dir))?;
        let mut files = Vec::new();
        for file in &sealed {
            let from = engine.dir().join(&file.name);
            let to = snap_dir.join(&file.name);
            hard_link(&from, &to)?;
            files.push(ManifestFile {
                kind: KIND_SEALED,
                name: file.name.clone(),
                len: file.len,
                crc: file.crc,
            });
        }
        if let Some(file) = &active {
            let from = engine.dir().join(&file.name);
            let to = snap_dir.join(&file.name);
            snapshot::copy_prefix(&from, &to, file.len)?;
            let (len, crc) = snapshot::crc_of_file(&to)?;
            if (len, crc) != (file.len, file.crc) {
                return Err(SmError::Inconsistent(format!(
                    "copied prefix of {} has length {len} crc {crc:08x}; the engine said {} {:08x}",
                    file.name, file.len, file.crc
                )));
            }
            files.push(ManifestFile {
                kind: KIND_ACTIVE_PREFIX,
                name: file.name.clone(),
                len: file.len,
                crc: file.crc,
            });
        }
        let snapshot_id = match last_applied {
            Some(id) => format!(
                "{}-{}-{}-{counter}",
                id.leader_id.term, id.leader_id.node_id, id.index
            ),
            None => format!("none-{counter}"),
        };
        let manifest = Manifest {
            snapshot_id,
            cluster_id: u128::from(self.shared.cluster_id.load(Ordering::SeqCst)),
            last_log_id: last_applied,
            membership,
            files,
        };
        // The manifest comes last: fsyncing the directory also makes the
        // hard links durable; then the snapshot's entry in `snapshots/`.
        SnapshotHandle::new(&snap_dir).write_manifest(&manifest)?;
        snapshot::fsync_dir(&self.snapshots_dir())?;
        drop(pin);
        tracing::info!(snapshot = %manifest.snapshot_id, files = manifest.files.len(), "snapshot built");
        let snapshot = Snapshot {
            meta: meta_of(&manifest),
            snapshot: Box::new(SnapshotHandle::new(&snap_dir)),
        };
        {
            let mut inner = self.lock();
            let built = CurrentSnapshot { counter, manifest };
            if inner
                .current
                .as_ref()
                .is_none_or(|c| c.rank() < built.rank())
            {
                inner.current = Some(built);
            }
        }
        self.prune_snapshots();
        Ok(snapshot)
    }

    /// A new empty staging directory for a snapshot being received.
    pub fn begin_receiving(&self) -> Result<SnapshotHandle, SmError> {
        let counter = {
            let mut inner = self.lock();
            inner.next_counter += 1;
            inner.next_counter - 1
        };
        let dir = self
            .snapshots_dir()
            .join(counter_name(STAGING_DIR_PREFIX, counter));
        snapshot::create_dir_durable(&dir)?;
        Ok(SnapshotHandle::new(dir))
    }

    /// The options it was opened with.
    pub fn options(&self) -> &StateMachineOptions {
        &self.shared.options
    }

    /// The crash points of receiving and installing snapshots.
    pub fn failpoints(&self) -> &InstallFailpoints {
        &self.shared.options.failpoints
    }

    /// Every file this member holds that an offered snapshot may reuse, by
    /// name: the engine's sealed data and hint files, its active segment,
    /// and the files of the complete snapshots it keeps.
    fn candidates(&self) -> BTreeMap<String, Vec<Candidate>> {
        let mut found: BTreeMap<String, Vec<Candidate>> = BTreeMap::new();
        let engine = self.engine();
        let mut add = |name: String, candidate: Candidate| {
            found.entry(name).or_default().push(candidate);
        };
        for file in engine.sealed_files() {
            let path = engine.dir().join(&file.name);
            add(
                file.name,
                Candidate {
                    path,
                    len: file.len,
                    crc: file.crc,
                    immutable: true,
                },
            );
        }
        if let Some(file) = engine.active_file() {
            let path = engine.dir().join(&file.name);
            add(
                file.name,
                Candidate {
                    path,
                    len: file.len,
                    crc: file.crc,
                    immutable: false,
                },
            );
        }
        let snapshots = self.snapshots_dir();
        for name in list_dir(&snapshots).unwrap_or_default() {
            if parse_counter(&name, SNAPSHOT_DIR_PREFIX).is_none() {
                continue;
            }
            let snap = SnapshotHandle::new(snapshots.join(&name));
            let Ok(manifest) = snap.read_manifest() else {
                continue;
            };
            for file in manifest.files {
                if let Ok(path) = snap.file_path(&file.name) {
                    add(
                        file.name,
                        Candidate {
                            path,
                            len: file.len,
                            crc: file.crc,
                            immutable: true,
                        },
                    );
                }
            }
        }
        found
    }

    /// Starts receiving the snapshot `manifest` describes: a new staging
    /// directory, into which every file this member already holds whole
    /// (same name, length and crc32) is hard-linked (a copy for the engine's
    /// active segment) and, for a data file of which it holds a shorter
    /// prefix, that prefix is copied. The links pin the reused files: a
    /// merge deleting the engine's name leaves the staged one. Returns what
    /// to ask the leader for. Every staged byte is checked again against the
    /// manifest before the snapshot is sealed.
    pub fn plan_receive(&self, manifest: &Manifest) -> Result<ReceivePlan, SmError> {
        if self.failpoints().dead() {
            return Err(SmError::Inconsistent(
                "this member crashed at a test crash point".to_string(),
            ));
        }
        let staging = self.begin_receiving()?;
        match self.stage_local_files(&staging, manifest) {
            Ok(plan) => Ok(plan),
            Err(err) => {
                remove_dir_logged(staging.dir());
                Err(err)
            }
        }
    }

    fn stage_local_files(
        &self,
        staging: &SnapshotHandle,
        manifest: &Manifest,
    ) -> Result<ReceivePlan, SmError> {
        let candidates = self.candidates();
        let mut plan = ReceivePlan {
            staging: staging.clone(),
            needed: Vec::new(),
            files_reused: 0,
            bytes_reused: 0,
        };
        for file in &manifest.files {
            let to = staging.file_path(&file.name)?;
            let held = candidates.get(&file.name).map(Vec::as_slice).unwrap_or(&[]);
            // The whole file, if held.
            let whole = held
                .iter()
                .filter(|c| c.len == file.len && c.crc == file.crc)
                .any(|c| {
                    let staged = if c.immutable {
                        hard_link(&c.path, &to).is_ok()
                    } else {
                        snapshot::copy_prefix(&c.path, &to, file.len).is_ok()
                    };
                    if !staged {
                        remove_file(&to);
                    }
                    staged
                });
            if whole {
                plan.files_reused += 1;
                plan.bytes_reused += file.len;
                continue;
            }
            // Else the longest shorter prefix of a data file (segments only
            // grow; hints are written whole).
            let prefix = held
                .iter()
                .filter(|c| {
                    file.name.ends_with(bitcask::format::DATA_SUFFIX)
                        && c.len > 0
                        && c.len < file.len
                })
                .max_by_key(|c| c.len);
            if let Some(c) = prefix
                && snapshot::copy_prefix(&c.path, &to, c.len).is_ok()
                && let Ok((len, crc)) = snapshot::crc_of_file(&to)
                && len == c.len
            {
                plan.bytes_reused += len;
                plan.needed.push(NeededRange {
                    name: file.name.clone(),
                    offset: len,
                    prefix_crc: crc,
                });
                continue;
            }
            remove_file(&to);
            plan.needed.push(NeededRange {
                name: file.name.clone(),
                offset: 0,
                prefix_crc: 0,
            });
        }
        Ok(plan)
    }

    /// The files of a staging directory that do not match `manifest` (missing,
    /// another length or crc32): the receiver fetches them again whole.
    pub fn staged_mismatches(staging: &SnapshotHandle, manifest: &Manifest) -> Vec<String> {
        manifest
            .files
            .iter()
            .filter(|file| {
                let held = staging
                    .file_path(&file.name)
                    .and_then(|path| snapshot::crc_of_file(&path));
                !matches!(held, Ok((len, crc)) if len == file.len && crc == file.crc)
            })
            .map(|file| file.name.clone())
            .collect()
    }

    /// Makes a fully received staging directory a complete snapshot: checks
    /// every file against the manifest, fsyncs each, writes the manifest,
    /// renames the directory to `snap-<n>` and fsyncs `snapshots/`. From
    /// here on a crash leaves a snapshot that the next open switches to if
    /// it is ahead of the engine (openraft may purge the log it covers as
    /// soon as it is told), so this runs before openraft is told.
    pub fn seal_received(
        &self,
        staging: &SnapshotHandle,
        manifest: &Manifest,
    ) -> Result<SnapshotHandle, SmError> {
        if self.failpoints().dead() {
            return Err(SmError::Inconsistent(
                "this member crashed at a test crash point".to_string(),
            ));
        }
        staging.verify(manifest)?;
        for file in &manifest.files {
            snapshot::fsync_file(&staging.file_path(&file.name)?)?;
        }
        staging.write_manifest(manifest)?;
        let snapshots = self.snapshots_dir();
        let counter = {
            let mut inner = self.lock();
            inner.next_counter += 1;
            inner.next_counter - 1
        };
        let snap_dir = snapshots.join(counter_name(SNAPSHOT_DIR_PREFIX, counter));
        node_vfs()
            .rename(staging.dir(), &snap_dir)
            .map_err(io_err("rename", staging.dir()))?;
        snapshot::fsync_dir(&snapshots)?;
        Ok(SnapshotHandle::new(snap_dir))
    }

    /// Deletes a received snapshot that openraft did not install (not newer
    /// than what this member committed): no staged garbage stays behind.
    pub fn discard_received(&self, snap: &SnapshotHandle) {
        if self.failpoints().dead() || !snap.dir().exists() {
            return;
        }
        let current = self.lock().current.as_ref().map(CurrentSnapshot::rank);
        let counter = self.own_counter(snap, SNAPSHOT_DIR_PREFIX);
        // Installed (now current, or ranked below a snapshot made since):
        // kept; pruning deletes it in its turn.
        if let (Some(counter), Some(current)) = (counter, current)
            && let Ok(manifest) = snap.read_manifest()
            && rank(counter, &manifest) <= current
        {
            return;
        }
        tracing::info!(dir = %snap.dir().display(), "deleting a received snapshot that was not installed");
        remove_dir_logged(snap.dir());
    }

    /// The counter of `handle` if it is one of this state machine's
    /// directories named `<prefix><counter>`.
    fn own_counter(&self, handle: &SnapshotHandle, prefix: &str) -> Option<u64> {
        if handle.dir().parent() != Some(self.snapshots_dir().as_path()) {
            return None;
        }
        handle
            .dir()
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| parse_counter(n, prefix))
    }

    /// Installs the snapshot in `handle`: one this member received and
    /// sealed (`snap-<n>`, checked when sealed), one of its staging
    /// directories, or another state machine's snapshot directory (linked
    /// in); the latter two are checked against the manifest and sealed
    /// first. Then the engine switches to its files atomically.
    pub fn install(
        &self,
        meta: &SnapshotMeta<u64, NodeInfo>,
        handle: &SnapshotHandle,
    ) -> Result<(), SmError> {
        let _work = self.snapshot_work();
        let failpoints = self.failpoints().clone();
        if failpoints.dead() {
            return Err(SmError::Inconsistent(
                "this member crashed at a test crash point".to_string(),
            ));
        }
        let manifest = handle.read_manifest()?;
        let ours = self.shared.cluster_id.load(Ordering::SeqCst);
        if manifest.cluster_id != 0 && ours != 0 && manifest.cluster_id != u128::from(ours) {
            return Err(SmError::Inconsistent(format!(
                "the snapshot is of cluster {:016x}, this member is in cluster {ours:016x}",
                manifest.cluster_id
            )));
        }
        if manifest.last_log_id != meta.last_log_id || manifest.membership != meta.last_membership {
            return Err(SmError::Inconsistent(format!(
                "snapshot manifest (last log id {:?}) does not match the snapshot meta (last log id {:?}) or its membership",
                manifest.last_log_id, meta.last_log_id
            )));
        }
        let snap = if self.own_counter(handle, SNAPSHOT_DIR_PREFIX).is_some() {
            handle.clone()
        } else {
            // Bring the files into a staging directory of ours (a handle
            // filled by a test already is one; another state machine's
            // snapshot is linked in), then check and seal.
            let staging = if self.own_counter(handle, STAGING_DIR_PREFIX).is_some() {
                handle.clone()
            } else {
                let staging = self.begin_receiving()?;
                for file in &manifest.files {
                    let from = handle.file_path(&file.name)?;
                    let to = staging.file_path(&file.name)?;
                    if hard_link(&from, &to).is_err() {
                        snapshot::copy_prefix(&from, &to, file.len)?;
                    }
                }
                staging
            };
            self.seal_received(&staging, &manifest)?
        };
        let Some(counter) = self.own_counter(&snap, SNAPSHOT_DIR_PREFIX) else {
            return Err(SmError::Inconsistent(format!(
                "{} is not a snapshot directory of this member",
                snap.dir().display()
            )));
        };
        if failpoints.hit(InstallStep::BeforeSwitch) {
            return Err(SmError::Inconsistent(
                "test crash point before the switch".to_string(),
            ));
        }
        let mut inner = self.lock();
        let old_dir = self.switch_to(&mut inner, counter, &snap, &manifest)?;
        drop(inner);
        if failpoints.hit(InstallStep::AfterSwitch) {
            return Err(SmError::Inconsistent(
                "test crash point after the switch".to_string(),
            ));
        }
        remove_dir_logged(&old_dir);
        tracing::info!(snapshot = %manifest.snapshot_id, last_log_id = ?manifest.last_log_id, "snapshot installed");
        self.prune_snapshots();
        Ok(())
    }

    /// Switches the engine to the files of the complete snapshot `snap`
    /// (numbered `counter`): a new engine directory (links to the sealed
    /// files, a private copy of the active prefix, which the engine appends
    /// to), opened and checked against the manifest, then the `CURRENT`
    /// pointer written last. Returns the old engine directory, for the
    /// caller to delete once the lock is released.
    fn switch_to(
        &self,
        inner: &mut Inner,
        counter: u64,
        snap: &SnapshotHandle,
        manifest: &Manifest,
    ) -> Result<PathBuf, SmError> {
        let pointer = Pointer {
            generation: inner.generation + 1,
            published_prefix: manifest.active().map(|f| (f.name.clone(), f.len)),
        };
        let engine_dir = self.shared.dir.join(pointer.engine_dir_name());
        remove_dir_logged(&engine_dir);
        snapshot::create_dir_durable(&engine_dir)?;
        for file in &manifest.files {
            let from = snap.file_path(&file.name)?;
            let to = engine_dir.join(&file.name);
            if file.kind == KIND_ACTIVE_PREFIX {
                snapshot::copy_prefix(&from, &to, file.len)?;
            } else {
                hard_link(&from, &to)?;
            }
        }
        snapshot::fsync_dir(&engine_dir)?;
        let (engine, applier, engine_meta) =
            match open_engine(&self.shared.dir, &self.shared.options, &pointer) {
                Ok(opened) => opened,
                Err(err) => {
                    remove_dir_logged(&engine_dir);
                    return Err(err);
                }
            };
        let recovered = engine_meta.as_ref().map(|m| m.log_id);
        if recovered != manifest.last_log_id {
            drop(engine);
            remove_dir_logged(&engine_dir);
            return Err(SmError::Inconsistent(format!(
                "the snapshot's files end at {recovered:?}, its manifest says {:?}",
                manifest.last_log_id
            )));
        }
        // The switch: the pointer is written last.
        snapshot::write_atomic(&self.shared.dir, CURRENT_FILE, &pointer.encode())?;
        let old_dir = self
            .shared
            .dir
            .join(snapshot::engine_dir_name(inner.generation));
        let engine = Arc::new(engine);
        let time_ms = engine_meta.as_ref().map_or(0, |m| m.time_ms);
        inner.engine = engine.clone();
        inner.applier = applier;
        inner.generation = pointer.generation;
        inner.last_applied = manifest.last_log_id;
        inner.membership = manifest.membership.clone();
        inner.time_ms = time_ms;
        inner.current = Some(CurrentSnapshot {
            counter,
            manifest: manifest.clone(),
        });
        *self
            .shared
            .engine
            .write()
            .unwrap_or_else(|p| p.into_inner()) = engine;
        self.shared.cluster_time_ms.store(time_ms, Ordering::SeqCst);
        Ok(old_dir)
    }

    /// At open: if the current snapshot (the highest last log id) is ahead
    /// of the engine (a crash after the snapshot was made durable but before
    /// the engine switched to it), switch to it now, before Raft starts.
    fn switch_in_newer_snapshot(&self) -> Result<(), SmError> {
        let mut inner = self.lock();
        let Some(current) = inner.current.clone() else {
            return Ok(());
        };
        if current.manifest.last_log_id <= inner.last_applied {
            return Ok(());
        }
        tracing::warn!(
            snapshot = %current.manifest.snapshot_id,
            snapshot_last = ?current.manifest.last_log_id,
            applied = ?inner.last_applied,
            "the newest snapshot is ahead of the engine (interrupted install): switching to it"
        );
        let snap = SnapshotHandle::new(
            self.snapshots_dir()
                .join(counter_name(SNAPSHOT_DIR_PREFIX, current.counter)),
        );
        snap.verify(&current.manifest)?;
        let old_dir = self.switch_to(&mut inner, current.counter, &snap, &current.manifest)?;
        drop(inner);
        remove_dir_logged(&old_dir);
        Ok(())
    }

    /// The latest snapshot built or installed.
    pub fn current_snapshot(&self) -> Option<Snapshot<TypeConfig>> {
        let inner = self.lock();
        inner.current.as_ref().map(|current| Snapshot {
            meta: meta_of(&current.manifest),
            snapshot: Box::new(SnapshotHandle::new(
                self.snapshots_dir()
                    .join(counter_name(SNAPSHOT_DIR_PREFIX, current.counter)),
            )),
        })
    }

    /// Deletes complete snapshots ranked (see [`Rank`]) at or below the
    /// current one beyond the best [`SNAPSHOTS_KEPT`]; so a stale build (a
    /// higher counter, a lower last log id) goes in its turn. Snapshots
    /// ranked above the current one (a received one not installed yet, a
    /// build not yet recorded) and directories without a manifest (a build
    /// in progress) are left alone.
    fn prune_snapshots(&self) {
        let snapshots = self.snapshots_dir();
        let Ok(names) = list_dir(&snapshots) else {
            return;
        };
        let Some(current) = self.lock().current.as_ref().map(CurrentSnapshot::rank) else {
            return;
        };
        let mut complete: Vec<(Rank, u64)> = names
            .iter()
            .filter_map(|n| parse_counter(n, SNAPSHOT_DIR_PREFIX))
            .filter_map(|c| {
                let handle =
                    SnapshotHandle::new(snapshots.join(counter_name(SNAPSHOT_DIR_PREFIX, c)));
                let manifest = handle.read_manifest().ok()?;
                Some((rank(c, &manifest), c))
            })
            .filter(|(r, _)| *r <= current)
            .collect();
        complete.sort_unstable();
        let excess = complete.len().saturating_sub(SNAPSHOTS_KEPT);
        for (_, counter) in &complete[..excess] {
            remove_dir_logged(&snapshots.join(counter_name(SNAPSHOT_DIR_PREFIX, *counter)));
        }
    }
}

fn meta_of(manifest: &Manifest) -> SnapshotMeta<u64, NodeInfo> {
    SnapshotMeta {
        last_log_id: manifest.last_log_id,
        last_membership: manifest.membership.clone(),
        snapshot_id: manifest.snapshot_id.clone(),
    }
}

fn open_engine(
    dir: &Path,
    options: &StateMachineOptions,
    pointer: &Pointer,
) -> Result<(Engine, Applier, Option<CommitMeta>), SmError> {
    let opts = Options {
        sync: SyncPolicy::Never,
        auto_merge: None,
        published_prefix: pointer
            .published_prefix
            .as_ref()
            .map(|(file, len)| PublishedPrefix {
                file: file.clone(),
                len: *len,
            }),
        vfs: node_vfs(),
        ..options.engine.clone()
    };
    let engine = Engine::open(dir.join(pointer.engine_dir_name()), opts)?;
    let meta = decode_meta(&engine)?;
    let mut applier = Applier::load(&engine)?;
    if let Some(ms) = options.session_idle_ms {
        applier = applier.with_session_idle_ms(ms);
    }
    Ok((engine, applier, meta))
}

/// Captures the merge now (deterministic cut-off) and runs it on a thread.
fn start_merge(engine: &Arc<Engine>, inputs: &[String], time_ms: u64) {
    match engine.begin_merge(inputs, time_ms) {
        Ok(job) => {
            let spawned = std::thread::Builder::new()
                .name("kvnode-merge".to_string())
                .spawn(move || match job.run() {
                    Ok(report) => tracing::info!(
                        cutoff = report.cutoff,
                        inputs = report.inputs.len(),
                        outputs = report.outputs.len(),
                        "merge finished"
                    ),
                    Err(err) => tracing::warn!(error = %err, "merge failed"),
                });
            if let Err(err) = spawned {
                tracing::warn!(error = %err, "could not start the merge thread");
            }
        }
        // Bad inputs are refused the same way on every replica.
        Err(err) => tracing::warn!(error = %err, ?inputs, "merge entry not run"),
    }
}

impl RaftSnapshotBuilder<TypeConfig> for StateMachine {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError<u64>> {
        // File work (fsync, links, a copy of the active prefix): off the
        // async threads.
        let sm = self.clone();
        tokio::task::spawn_blocking(move || sm.build())
            .await
            .map_err(|err| snapshot_err(SmError::Inconsistent(format!("build task: {err}"))))?
            .map_err(snapshot_err)
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotBuilder = Self;

    async fn applied_state(
        &mut self,
    ) -> Result<(Option<NodeLogId>, NodeMembership), StorageError<u64>> {
        Ok(self.applied())
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<EntryResponse>, StorageError<u64>>
    where
        I: IntoIterator<Item = openraft::Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        self.apply_entries(entries).map_err(sm_err)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<SnapshotHandle>, StorageError<u64>> {
        self.begin_receiving().map(Box::new).map_err(snapshot_err)
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<u64, NodeInfo>,
        snapshot: Box<SnapshotHandle>,
    ) -> Result<(), StorageError<u64>> {
        #[cfg(feature = "testing")]
        crate::testing::stale_build::before_install(self, meta).await;
        let sm = self.clone();
        let owned_meta = meta.clone();
        tokio::task::spawn_blocking(move || sm.install(&owned_meta, &snapshot))
            .await
            .map_err(|err| SmError::Inconsistent(format!("install task: {err}")))
            .and_then(|installed| installed)
            .map_err(|err| StorageIOError::write_snapshot(Some(meta.signature()), &err).into())
    }

    async fn get_current_snapshot(
        &mut self,
    ) -> Result<Option<Snapshot<TypeConfig>>, StorageError<u64>> {
        Ok(self.current_snapshot())
    }
}
