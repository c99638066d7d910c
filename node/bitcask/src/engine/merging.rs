//! The engine's merge entry points: explicit merges, captured merge jobs
//! and automatic merges (the merge itself is `crate::merge`).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::{Engine, Shared, lock, read};
use crate::error::{Error, Result};
use crate::merge::MergeJob;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MergeReport {
    /// The cut-off sequence: liveness was judged as of it.
    pub cutoff: u64,
    /// Data files replaced.
    pub inputs: Vec<String>,
    /// Data files written.
    pub outputs: Vec<String>,
    /// Records copied.
    pub records_kept: u64,
    /// Bytes of the inputs.
    pub bytes_before: u64,
    /// Bytes of the outputs.
    pub bytes_after: u64,
}

impl Engine {
    /// Merges `inputs` (a prefix of the sealed data files that includes every
    /// earlier merge output) into new files, judging expiry at `now_ms`.
    /// Blocks the calling thread; readers and writers carry on meanwhile.
    pub fn merge(&self, inputs: &[String], now_ms: u64) -> Result<MergeReport> {
        crate::merge::merge(&self.shared, inputs, now_ms)
    }

    /// Captures a merge of `inputs` now and returns it for [`MergeJob::run`]
    /// (on any thread). The cut-off is the engine's state at this call, so a
    /// caller that captures at the same point of the same write stream gets
    /// the same output on every replica (the cluster captures while applying
    /// a merge entry). Waits while another merge job exists.
    pub fn begin_merge(&self, inputs: &[String], now_ms: u64) -> Result<MergeJob> {
        crate::merge::begin(&self.shared, inputs, now_ms)
    }
}

impl Shared {
    pub(super) fn maybe_auto_merge(self: &Arc<Self>) {
        let Some(auto) = self.opts.auto_merge else {
            return;
        };
        let (total, live, inputs) = {
            let files = read(&self.files);
            let keydir = read(&self.keydir);
            let total: u64 = files.sealed.iter().map(|m| m.len).sum();
            let live: u64 = files.sealed.iter().map(|m| keydir.live_bytes(m.num)).sum();
            (
                total,
                live,
                files
                    .sealed
                    .iter()
                    .map(|m| m.id.data_name())
                    .collect::<Vec<_>>(),
            )
        };
        let dead = total.saturating_sub(live);
        if total == 0
            || dead < auto.dead_bytes_min
            || (dead as f64) < auto.dead_ratio_min * total as f64
        {
            return;
        }
        if self.auto_merge_queued.swap(true, Ordering::SeqCst) {
            return;
        }
        let worker = self.clone();
        let now_ms = self.now_seen_ms.load(Ordering::Relaxed);
        let spawned = std::thread::Builder::new()
            .name("bitcask-merge".to_string())
            .spawn(move || {
                match crate::merge::merge(&worker, &inputs, now_ms) {
                    Ok(report) => tracing::info!(
                        inputs = report.inputs.len(),
                        outputs = report.outputs.len(),
                        bytes_before = report.bytes_before,
                        bytes_after = report.bytes_after,
                        "automatic merge done"
                    ),
                    Err(Error::Closed) => {}
                    Err(e) => tracing::warn!(error = %e, "automatic merge failed"),
                }
                worker.auto_merge_queued.store(false, Ordering::SeqCst);
            });
        match spawned {
            Ok(handle) => {
                let mut threads = lock(&self.threads);
                threads.retain(|t| !t.is_finished());
                threads.push(handle);
            }
            Err(e) => {
                tracing::warn!(error = %e, "could not start a merge thread");
                self.auto_merge_queued.store(false, Ordering::SeqCst);
            }
        }
    }
}
