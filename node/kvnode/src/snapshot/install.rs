//! Installing a snapshot: the engine switches to a complete snapshot's
//! files by a new `engine-<generation>/` directory (hard links to the sealed
//! files, a private copy of the active prefix), opened and checked against
//! the manifest, then the `CURRENT` pointer written last; the old engine
//! directory is deleted after. At open, the recovery of what an interrupted
//! install, write or receive left behind (and the switch to a sealed
//! snapshot ahead of the engine); after a build or install, the pruning of
//! old snapshots.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use crate::hooks::InstallStep;
use crate::raft::types::NodeSnapshotMeta;
use crate::snapshot::layout::{
    CurrentSnapshot, Rank, SNAPSHOT_DIR_PREFIX, SNAPSHOTS_DIR, SNAPSHOTS_KEPT, STAGING_DIR_PREFIX,
    counter_name, hard_link, list_dir, parse_counter, rank, remove_dir_logged, remove_file,
};
use crate::snapshot::{
    self, CURRENT_BYTES_MAX, CURRENT_FILE, KIND_ACTIVE_PREFIX, Manifest, Pointer, SnapshotError,
    SnapshotHandle, node_vfs,
};
use crate::state_machine::{Inner, SmError, StateMachine, open_engine};

/// What [`recover_at_open`] found: the engine pointer, the current snapshot
/// and the next directory counter.
pub(crate) struct Recovered {
    pub(crate) pointer: Pointer,
    pub(crate) current: Option<CurrentSnapshot>,
    pub(crate) next_counter: u64,
}

/// At open of the state machine in `dir`: reads the `CURRENT` pointer (a
/// new one, with an empty `engine-0/`, the first time), deletes what an
/// interrupted install or write left (other engine directories, `*.tmp`)
/// and the snapshots that are not complete (staging directories, builds
/// without a `MANIFEST`), and finds the current snapshot.
pub(crate) fn recover_at_open(dir: &Path) -> Result<Recovered, SmError> {
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
        snapshot::write_atomic(dir, CURRENT_FILE, &pointer.encode())?;
        pointer
    };
    // Leftovers of an interrupted install or write.
    for name in list_dir(dir)? {
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
    Ok(Recovered {
        pointer,
        current,
        next_counter,
    })
}

impl StateMachine {
    /// Installs the snapshot in `handle`: one this member received and
    /// sealed (`snap-<n>`, checked when sealed), one of its staging
    /// directories, or another state machine's snapshot directory (linked
    /// in); the latter two are checked against the manifest and sealed
    /// first. Then the engine switches to its files atomically.
    pub fn install(&self, meta: &NodeSnapshotMeta, handle: &SnapshotHandle) -> Result<(), SmError> {
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
        // The history and the engine switch together: a reader at a past
        // revision takes the engine under the history's read lock.
        let mut history = self
            .shared
            .history
            .write()
            .unwrap_or_else(|p| p.into_inner());
        inner.applier = applier
            .with_published_revision(self.shared.revision.clone())
            .with_shared_history_locked(self.shared.history.clone(), &mut history);
        inner.generation = pointer.generation;
        inner.last_applied = manifest.last_log_id;
        self.shared.applied_index.store(
            manifest.last_log_id.map_or(0, |id| id.index),
            Ordering::SeqCst,
        );
        inner.membership = manifest.membership.clone();
        inner.time_ms = time_ms;
        self.publish_lease_counts(inner, (0, 0));
        inner.current = Some(CurrentSnapshot {
            counter,
            manifest: manifest.clone(),
        });
        *self
            .shared
            .engine
            .write()
            .unwrap_or_else(|p| p.into_inner()) = engine;
        drop(history);
        self.shared.cluster_time_ms.store(time_ms, Ordering::SeqCst);
        Ok(old_dir)
    }

    /// At open: if the current snapshot (the highest last log id) is ahead
    /// of the engine (a crash after the snapshot was made durable but before
    /// the engine switched to it), switch to it now, before Raft starts.
    pub(crate) fn switch_in_newer_snapshot(&self) -> Result<(), SmError> {
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

    /// Deletes complete snapshots ranked (see [`Rank`]) at or below the
    /// current one beyond the best [`SNAPSHOTS_KEPT`]; so a stale build (a
    /// higher counter, a lower last log id) goes in its turn. Snapshots
    /// ranked above the current one (a received one not installed yet, a
    /// build not yet recorded) and directories without a manifest (a build
    /// in progress) are left alone.
    pub(crate) fn prune_snapshots(&self) {
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
