//! Durability: group commit, fsyncs of data files, the background sync
//! thread of `SyncPolicy::EveryMs`, and poisoning after a failed write or
//! fsync.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use vfs::VfsFile;

use super::write::apply_updates;
use super::{Engine, Shared, lock, write};
use crate::error::{Error, Result};
use crate::format::path_in;

/// Group-commit state: whether a leader is fsyncing right now.
#[derive(Debug, Default)]
pub(super) struct SyncState {
    leader_active: bool,
}

impl Engine {
    /// Makes every write so far durable.
    pub fn sync(&self) -> Result<()> {
        let target = lock(&self.shared.writer).written_total;
        self.shared.sync_to(target)
    }

    /// Whether an earlier I/O failure poisoned the engine.
    pub fn is_poisoned(&self) -> bool {
        self.shared.poisoned.is_poisoned()
    }
}

impl Shared {
    pub(crate) fn check_poison(&self) -> Result<()> {
        if self.closed.load(Ordering::SeqCst) {
            return Err(Error::Closed);
        }
        if let Some(cause) = self.poisoned.cause() {
            return Err(Error::Poisoned { cause });
        }
        Ok(())
    }

    /// Marks the engine poisoned and returns the error to report.
    pub(crate) fn poison(&self, error: Error) -> Error {
        if self.poisoned.set(&error) {
            tracing::error!(error = %error, "write or fsync failed; the engine refuses further writes");
        }
        error
    }

    /// Returns once everything up to write position `target` is durable and
    /// visible. Group commit: one caller at a time is the leader and fsyncs
    /// everything appended so far; the others wait on a condition variable
    /// (not on a mutex, so a returning leader cannot barge ahead of them)
    /// and most find their writes covered when they wake.
    pub(crate) fn sync_to(&self, target: u64) -> Result<()> {
        {
            let mut state = lock(&self.sync_state);
            loop {
                if self.synced_total.load(Ordering::SeqCst) >= target {
                    return self.check_poison_after_sync();
                }
                self.check_poison()?;
                if !state.leader_active {
                    state.leader_active = true;
                    break;
                }
                state = self
                    .sync_done
                    .wait(state)
                    .unwrap_or_else(|poisoned| poisoned.into_inner());
            }
        }
        let result = self.lead_sync();
        lock(&self.sync_state).leader_active = false;
        self.sync_done.notify_all();
        result
    }

    /// One group-commit round: fsync the active segment, then publish every
    /// batch the fsync covered to the key directory.
    fn lead_sync(&self) -> Result<()> {
        let (file, name, end) = {
            let writer = lock(&self.writer);
            match &writer.active {
                Some(active) => (
                    Some(active.file.clone()),
                    active.id.data_name(),
                    writer.written_total,
                ),
                None => (None, String::new(), writer.written_total),
            }
        };
        if let Some(file) = file {
            self.sync_file(file.as_ref(), &name)?;
        }
        let mut writer = lock(&self.writer);
        // A seal or another fsync may have failed meanwhile: then nothing
        // pending is known to be durable, and nothing may be published.
        self.check_poison()?;
        let mut ready = Vec::new();
        let mut published = None;
        while writer
            .pending
            .front()
            .is_some_and(|(batch_end, _, _)| *batch_end <= end)
        {
            let (_, file_end, updates) = writer.pending.pop_front().expect("front exists");
            published = Some(file_end);
            ready.push(updates);
        }
        if let Some(file_end) = published {
            let mut keydir = write(&self.keydir);
            for updates in ready {
                apply_updates(&mut keydir, updates);
            }
            // Pending batches are all in the active segment (sealing applies
            // them all), so this is its published length now; stored before
            // the key directory is unlocked (see `Shared::active_published`).
            self.active_published.store(file_end, Ordering::SeqCst);
        }
        self.synced_total.fetch_max(end, Ordering::SeqCst);
        Ok(())
    }

    /// fsyncs a data file; a failure poisons the engine, and once poisoned
    /// no data file is fsynced again (see `fsync_serial`).
    pub(crate) fn sync_file(&self, file: &dyn VfsFile, name: &str) -> Result<()> {
        let _serial = lock(&self.fsync_serial);
        // Not `check_poison`: closing fsyncs after `closed` is set.
        self.check_poison_after_sync()?;
        file.sync()
            .map_err(|e| self.poison(Error::io(path_in(&self.dir, name), e)))
    }

    /// The poison, if any, whether or not the engine is closing: closing a
    /// poisoned engine reports why it is poisoned, not that it is closed.
    pub(super) fn check_poison_after_sync(&self) -> Result<()> {
        if let Some(cause) = self.poisoned.cause() {
            return Err(Error::Poisoned { cause });
        }
        Ok(())
    }

    pub(super) fn sync_loop(self: Arc<Self>, interval_ms: u64) {
        let (stopped, wake) = &self.stop;
        let mut stop = lock(stopped);
        while !*stop {
            let (guard, _) = wake
                .wait_timeout(stop, std::time::Duration::from_millis(interval_ms))
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            stop = guard;
            if *stop {
                break;
            }
            drop(stop);
            let target = lock(&self.writer).written_total;
            if let Err(e) = self.sync_to(target) {
                tracing::warn!(error = %e, "background fsync failed");
            }
            stop = lock(stopped);
        }
    }
}
