//! Building a snapshot from the engine's files: under the apply lock the
//! engine is synced, its files listed and pinned; then the sealed files are
//! hard-linked into `snapshots/snap-<counter>/`, the active segment's prefix
//! copied (and checked), and the `MANIFEST` written last.

use std::sync::atomic::Ordering;

use openraft::Snapshot;

use crate::raft::types::NodeSnapshot;
use crate::snapshot::layout::{
    CurrentSnapshot, SNAPSHOT_DIR_PREFIX, counter_name, hard_link, meta_of,
};
use crate::snapshot::{
    self, KIND_ACTIVE_PREFIX, KIND_SEALED, Manifest, ManifestFile, SnapshotHandle, io_err, node_vfs,
};
use crate::state_machine::{SmError, StateMachine};

impl StateMachine {
    /// Builds a snapshot of the files as of the last applied entry.
    pub fn build(&self) -> Result<NodeSnapshot, SmError> {
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
            snapshot: SnapshotHandle::new(&snap_dir),
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
}
