//! The `snapshots/` directory of a state machine: the names of complete
//! (`snap-<counter>`) and staging (`staging-<counter>`) directories, the
//! order of complete snapshots (their `Rank`) and which one is current,
//! and the file plumbing every stage shares (listing, hard links, the
//! durable deletion of a snapshot directory).

use std::path::{Path, PathBuf};

use openraft::{Snapshot, SnapshotMeta};

use crate::raft::types::{NodeLogId, NodeSnapshot, NodeSnapshotMeta};
use crate::snapshot::{self, Manifest, SnapshotError, SnapshotHandle, io_err, node_vfs};
use crate::state_machine::StateMachine;

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

/// The current snapshot: the greatest complete one by [`Rank`].
#[derive(Clone, Debug)]
pub(crate) struct CurrentSnapshot {
    pub(crate) counter: u64,
    pub(crate) manifest: Manifest,
}

/// The order of complete snapshots: the current one is the greatest. By
/// last log id (what the snapshot holds), ties broken by the higher counter
/// (the later made; equal log ids hold equal state). Never by counter
/// alone: a build that started on the old engine just after a received
/// snapshot was sealed takes a higher counter with a lower last log id, and
/// openraft may already have purged the log through the received one.
pub(crate) type Rank = (Option<NodeLogId>, u64);

pub(crate) fn rank(counter: u64, manifest: &Manifest) -> Rank {
    // NEGATIVE CONTROL (feature nc-snapshot-by-counter): the highest counter
    // wins whatever it holds (the old choice), so a stale build made on the
    // old engine beats a received snapshot whose install was cut short.
    if cfg!(feature = "nc-snapshot-by-counter") {
        return (None, counter);
    }
    (manifest.last_log_id, counter)
}

impl CurrentSnapshot {
    pub(crate) fn rank(&self) -> Rank {
        rank(self.counter, &self.manifest)
    }
}

pub(crate) fn counter_name(prefix: &str, counter: u64) -> String {
    format!("{prefix}{counter:020}")
}

pub(crate) fn parse_counter(name: &str, prefix: &str) -> Option<u64> {
    let digits = name.strip_prefix(prefix)?;
    if digits.len() != 20 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

pub(crate) fn list_dir(dir: &Path) -> Result<Vec<String>, SnapshotError> {
    node_vfs().list(dir).map_err(io_err("list", dir))
}

pub(crate) fn remove_file(path: &Path) {
    let _ = node_vfs().remove(path);
}

pub(crate) fn hard_link(from: &Path, to: &Path) -> Result<(), SnapshotError> {
    node_vfs()
        .hard_link(from, to)
        .map_err(io_err("hard-link", to))
}

/// Deletes a directory. A snapshot's `MANIFEST` goes first, durably (its
/// directory fsynced), so a crash part-way through the rest never leaves
/// a snapshot that looks complete with files missing (the next open would
/// pick it and fail to verify it); without the manifest, the next open
/// deletes what is left as incomplete.
pub(crate) fn remove_dir_logged(path: &Path) {
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

/// openraft's snapshot meta of `manifest`.
pub(crate) fn meta_of(manifest: &Manifest) -> NodeSnapshotMeta {
    SnapshotMeta {
        last_log_id: manifest.last_log_id,
        last_membership: manifest.membership.clone(),
    }
}

impl StateMachine {
    /// `<dir>/snapshots`.
    pub(crate) fn snapshots_dir(&self) -> PathBuf {
        self.shared.dir.join(SNAPSHOTS_DIR)
    }

    /// The next directory counter (staging and complete directories share
    /// one sequence).
    pub(crate) fn take_counter(&self) -> u64 {
        let mut inner = self.lock();
        inner.next_counter += 1;
        inner.next_counter - 1
    }

    /// The counter of `handle` if it is one of this state machine's
    /// directories named `<prefix><counter>`.
    pub(crate) fn own_counter(&self, handle: &SnapshotHandle, prefix: &str) -> Option<u64> {
        if handle.dir().parent() != Some(self.snapshots_dir().as_path()) {
            return None;
        }
        handle
            .dir()
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| parse_counter(n, prefix))
    }

    /// The latest snapshot built or installed.
    pub fn current_snapshot(&self) -> Option<NodeSnapshot> {
        let inner = self.lock();
        inner.current.as_ref().map(|current| Snapshot {
            meta: meta_of(&current.manifest),
            snapshot: SnapshotHandle::new(
                self.snapshots_dir()
                    .join(counter_name(SNAPSHOT_DIR_PREFIX, current.counter)),
            ),
        })
    }

    /// The id of the latest snapshot built or installed, from its manifest
    /// (openraft's snapshot meta carries no id since 0.10).
    pub fn current_snapshot_id(&self) -> Option<String> {
        let inner = self.lock();
        inner
            .current
            .as_ref()
            .map(|current| current.manifest.snapshot_id.clone())
    }
}
