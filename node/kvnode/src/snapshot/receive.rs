//! The receiving side of a snapshot transfer (the follower): match the
//! offered manifest against this member's files (reuse whole files by hard
//! link or copy, shorter data-file prefixes by copy) into a new
//! `staging-<counter>/`, then receive the rest over the `TransferSnapshot`
//! stream (chunks checked by crc32 and position, written through the
//! node's vfs), check every staged file against the manifest (a mismatch is
//! fetched again whole, for at most [`SNAPSHOT_REFETCH_ROUNDS_MAX`] rounds),
//! and seal: fsync each file, write the `MANIFEST`, rename to
//! `snap-<counter>/`, fsync `snapshots/`. A received snapshot openraft does
//! not install is discarded. The gRPC service (`server::raft`) only decodes
//! the offer and hands the sealed snapshot to openraft.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use kvproto::raft::v1::{
    FileRange, SnapshotChunk, SnapshotNeed, TransferSnapshotRequest, TransferSnapshotResponse,
    transfer_snapshot_request, transfer_snapshot_response,
};
use tokio::sync::mpsc;
use tonic::{Status, Streaming};
use vfs::VfsFile;

use crate::hooks::InstallStep;
use crate::server::metrics::Metrics;
use crate::snapshot::layout::{
    CurrentSnapshot, SNAPSHOT_DIR_PREFIX, STAGING_DIR_PREFIX, counter_name, hard_link, list_dir,
    parse_counter, rank, remove_dir_logged, remove_file,
};
use crate::snapshot::{self, Manifest, SnapshotHandle, io_err, node_vfs};
use crate::state_machine::{SmError, StateMachine};

/// it abandons the transfer (deletes its staging, drops its pins).
pub const SNAPSHOT_RECEIVE_IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// Rounds of "these staged files do not match, send them again" a receiver
/// asks for before it abandons the transfer.
pub const SNAPSHOT_REFETCH_ROUNDS_MAX: usize = 3;

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

impl StateMachine {
    /// A new empty staging directory for a snapshot being received.
    pub fn begin_receiving(&self) -> Result<SnapshotHandle, SmError> {
        let counter = self.take_counter();
        let dir = self
            .snapshots_dir()
            .join(counter_name(STAGING_DIR_PREFIX, counter));
        snapshot::create_dir_durable(&dir)?;
        Ok(SnapshotHandle::new(dir))
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
        let counter = self.take_counter();
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
}

fn need_message(ranges: impl Iterator<Item = FileRange>) -> TransferSnapshotResponse {
    TransferSnapshotResponse {
        step: Some(transfer_snapshot_response::Step::Need(SnapshotNeed {
            ranges: ranges.collect(),
        })),
    }
}

impl ReceivePlan {
    /// The first `need` message: the ranges of [`ReceivePlan::needed`].
    pub(crate) fn first_need(&self) -> TransferSnapshotResponse {
        need_message(self.needed.iter().map(|n| FileRange {
            name: n.name.clone(),
            offset_bytes: n.offset,
            prefix_crc32: n.prefix_crc,
        }))
    }
}

/// Receives the ranges `plan` asks for (and any refetch rounds) from
/// `incoming`, answering on `tx`, and seals the snapshot: its handle. `None`
/// when a test crash point fired (everything left as a crash would) or the
/// transfer failed (the staging directory deleted, the leader told).
pub(crate) async fn receive(
    sm: &StateMachine,
    manifest: &Manifest,
    plan: &ReceivePlan,
    metrics: Option<&Metrics>,
    tx: &mpsc::Sender<Result<TransferSnapshotResponse, Status>>,
    incoming: &mut Streaming<TransferSnapshotRequest>,
) -> Option<SnapshotHandle> {
    let receiver = Receiver {
        sm,
        manifest,
        staging: &plan.staging,
        metrics,
        tx,
    };
    match receiver.run(incoming, &plan.needed).await {
        Ok(snap) => Some(snap),
        Err(Abandon::Crashed) => None,
        Err(Abandon::Failed(status)) => {
            tracing::warn!(error = %status.message(), "snapshot transfer abandoned");
            let doomed = plan.staging.dir().to_path_buf();
            let _ = tokio::task::spawn_blocking(move || snapshot::remove_dir_all(&doomed)).await;
            let _ = tx.send(Err(status)).await;
            None
        }
    }
}

/// Why a receive stopped without a sealed snapshot.
enum Abandon {
    /// A test crash point fired: leave everything as a crash would.
    Crashed,
    /// The transfer failed: the staging directory is deleted and the leader
    /// told.
    Failed(Status),
}

impl From<Status> for Abandon {
    fn from(status: Status) -> Abandon {
        Abandon::Failed(status)
    }
}

/// One file being received in the current round.
struct Incoming {
    /// Length the manifest gives.
    len: u64,
    /// Bytes staged so far (a reused prefix counts).
    written: u64,
    /// Whether a chunk of it arrived in this round (the first one may
    /// restart the file at offset 0).
    started: bool,
    /// A chunk failed its crc32: the rest of the file is ignored and it is
    /// fetched again whole.
    bad: bool,
}

/// The receiving side of one transfer.
struct Receiver<'a> {
    sm: &'a StateMachine,
    manifest: &'a Manifest,
    staging: &'a SnapshotHandle,
    metrics: Option<&'a Metrics>,
    tx: &'a mpsc::Sender<Result<TransferSnapshotResponse, Status>>,
}

impl Receiver<'_> {
    /// Receives the needed ranges (and any refetch rounds) until every
    /// staged file matches the manifest, then seals the snapshot.
    async fn run(
        &self,
        incoming: &mut Streaming<TransferSnapshotRequest>,
        needed: &[NeededRange],
    ) -> Result<SnapshotHandle, Abandon> {
        let lens: BTreeMap<&str, u64> = self
            .manifest
            .files
            .iter()
            .map(|f| (f.name.as_str(), f.len))
            .collect();
        let mut files: BTreeMap<String, Incoming> = needed
            .iter()
            .map(|n| {
                let len = lens.get(n.name.as_str()).copied().unwrap_or(0);
                let file = Incoming {
                    len,
                    written: n.offset,
                    started: false,
                    bad: false,
                };
                (n.name.clone(), file)
            })
            .collect();
        let mut open: Option<(String, Arc<dyn VfsFile>)> = None;
        let mut refetches = 0usize;
        let failpoints = self.sm.failpoints().clone();
        loop {
            let message = match tokio::time::timeout(
                SNAPSHOT_RECEIVE_IDLE_TIMEOUT,
                incoming.message(),
            )
            .await
            {
                Err(_) => {
                    return Err(Status::deadline_exceeded(format!(
                        "no snapshot message within SNAPSHOT_RECEIVE_IDLE_TIMEOUT ({SNAPSHOT_RECEIVE_IDLE_TIMEOUT:?})"
                    ))
                    .into());
                }
                Ok(Err(status)) => return Err(status.into()),
                Ok(Ok(None)) => {
                    return Err(
                        Status::cancelled("the leader closed the snapshot stream early").into(),
                    );
                }
                Ok(Ok(Some(message))) => message,
            };
            match message.step {
                Some(transfer_snapshot_request::Step::Chunk(chunk)) => {
                    self.chunk(&mut files, &mut open, chunk).await?;
                    if failpoints.hit(InstallStep::Staging) {
                        return Err(Abandon::Crashed);
                    }
                }
                Some(transfer_snapshot_request::Step::Done(_)) => {
                    // Written with positioned writes: nothing to flush (the
                    // seal fsyncs every file).
                    open = None;
                    let staging = self.staging.clone();
                    let manifest = self.manifest.clone();
                    let mismatched = tokio::task::spawn_blocking(move || {
                        StateMachine::staged_mismatches(&staging, &manifest)
                    })
                    .await
                    .map_err(|err| Status::internal(format!("snapshot check task: {err}")))?;
                    if mismatched.is_empty() {
                        let sm = self.sm.clone();
                        let staging = self.staging.clone();
                        let manifest = self.manifest.clone();
                        return tokio::task::spawn_blocking(move || {
                            sm.seal_received(&staging, &manifest)
                        })
                        .await
                        .map_err(|err| Status::internal(format!("snapshot seal task: {err}")))?
                        .map_err(|err| {
                            Status::internal(format!("seal the received snapshot: {err}")).into()
                        });
                    }
                    refetches += 1;
                    if refetches > SNAPSHOT_REFETCH_ROUNDS_MAX {
                        return Err(Status::data_loss(format!(
                            "snapshot files {mismatched:?} still do not match the manifest after SNAPSHOT_REFETCH_ROUNDS_MAX ({SNAPSHOT_REFETCH_ROUNDS_MAX}) refetch rounds"
                        ))
                        .into());
                    }
                    tracing::warn!(files = ?mismatched, round = refetches, "staged snapshot files do not match the manifest: fetching them again");
                    if let Some(metrics) = self.metrics {
                        metrics.add_snapshot_files_refetched(mismatched.len() as u64);
                    }
                    files.clear();
                    for name in &mismatched {
                        if let Ok(path) = self.staging.file_path(name) {
                            let _ =
                                tokio::task::spawn_blocking(move || node_vfs().remove(&path)).await;
                        }
                        let len = lens.get(name.as_str()).copied().unwrap_or(0);
                        files.insert(
                            name.clone(),
                            Incoming {
                                len,
                                written: 0,
                                started: false,
                                bad: false,
                            },
                        );
                    }
                    let need = need_message(mismatched.into_iter().map(|name| FileRange {
                        name,
                        offset_bytes: 0,
                        prefix_crc32: 0,
                    }));
                    if self.tx.send(Ok(need)).await.is_err() {
                        return Err(Status::cancelled("the snapshot stream closed").into());
                    }
                }
                _ => return Err(Status::invalid_argument("expected a chunk or done").into()),
            }
        }
    }

    /// Writes one chunk into its staged file (checked: crc32, a file asked
    /// for, the next offset, within the manifest length).
    async fn chunk(
        &self,
        files: &mut BTreeMap<String, Incoming>,
        open: &mut Option<(String, Arc<dyn VfsFile>)>,
        chunk: SnapshotChunk,
    ) -> Result<(), Abandon> {
        let Some(file) = files.get_mut(&chunk.file_name) else {
            return Err(Status::invalid_argument(format!(
                "chunk of file {:?}, which was not asked for",
                chunk.file_name
            ))
            .into());
        };
        if file.bad {
            return Ok(());
        }
        if crc32fast::hash(&chunk.data) != chunk.crc32 {
            tracing::warn!(file = %chunk.file_name, offset = chunk.offset_bytes, "snapshot chunk fails its crc32: the file will be fetched again");
            file.bad = true;
            return Ok(());
        }
        // The first chunk of a file may restart it at 0: the leader found
        // our prefix differs from its own.
        let restart = !file.started && chunk.offset_bytes == 0;
        let at = if restart { 0 } else { file.written };
        let data_len = chunk.data.len() as u64;
        if chunk.offset_bytes != at || at + data_len > file.len {
            return Err(Status::invalid_argument(format!(
                "chunk of {:?} at offset {} ({data_len} bytes) does not follow {} bytes of {}",
                chunk.file_name, chunk.offset_bytes, file.written, file.len
            ))
            .into());
        }
        let reopen = open
            .as_ref()
            .is_none_or(|(name, _)| *name != chunk.file_name);
        if reopen || restart {
            *open = None;
            let path = self
                .staging
                .file_path(&chunk.file_name)
                .map_err(|err| Status::invalid_argument(err.to_string()))?;
            // Through the node's vfs (the lazy disk in a lazy-disk build):
            // the staged prefix copy if there is one, else a new file; cut
            // to where this chunk starts.
            let handle = tokio::task::spawn_blocking(move || {
                let vfs = node_vfs();
                let handle = if vfs.file_exists(&path) {
                    vfs.open(&path)
                } else {
                    vfs.create(&path)
                }
                .map_err(|err| Status::internal(format!("open {}: {err}", path.display())))?;
                handle.truncate(at).map_err(|err| {
                    Status::internal(format!("truncate {}: {err}", path.display()))
                })?;
                Ok::<_, Status>(handle)
            })
            .await
            .map_err(|err| Status::internal(format!("snapshot file task: {err}")))??;
            *open = Some((chunk.file_name.clone(), handle));
        }
        let Some((_, handle)) = open.as_ref() else {
            return Err(Status::internal("no open staged file").into());
        };
        let (handle, data) = (handle.clone(), chunk.data);
        tokio::task::spawn_blocking(move || handle.write_all_at(&data, at))
            .await
            .map_err(|err| Status::internal(format!("snapshot write task: {err}")))?
            .map_err(|err| Status::internal(format!("write snapshot file: {err}")))?;
        file.written = at + data_len;
        file.started = true;
        if let Some(metrics) = self.metrics {
            metrics.add_snapshot_bytes_received(data_len);
        }
        Ok(())
    }
}
