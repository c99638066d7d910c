//! The engine's merge entry points: explicit merges, captured merge jobs
//! and automatic merges (the merge itself is `crate::merge`).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::{Engine, Retain, Shared, lock, read};
use crate::error::{Error, Result};
use crate::merge::MergeJob;

/// What a merge did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MergeReport {
    /// The cut-off sequence: liveness was judged as of it.
    pub cutoff: u64,
    /// Data files replaced.
    pub inputs: Vec<String>,
    /// Data files written (list their records with [`Engine::records_in`]).
    pub outputs: Vec<String>,
    /// Records copied that the key directory points at: the live ones (and
    /// expired ones a retention predicate kept).
    pub records_kept: u64,
    /// Superseded puts and tombstones copied because the retention
    /// predicate kept them, or because a record it kept needed its key's
    /// final tombstone (0 without a predicate).
    pub records_retained: u64,
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
        crate::merge::merge(&self.shared, inputs, now_ms, None)
    }

    /// [`Engine::merge`], keeping in the output every record it would drop
    /// (superseded puts, superseded and final tombstones, expired puts) that
    /// `retain` keeps. The live view (`get`, `scan`, `meta`) is the same as
    /// after a plain merge, before and after a restart; the kept records
    /// stay listable ([`Engine::records_in`] with the report's `outputs`) and
    /// readable by location. A predicate that keeps nothing writes exactly
    /// what [`Engine::merge`] writes.
    ///
    /// ```
    /// use bitcask::{Batch, Engine, Options, RecordMeta, Retain, StoredKind, SyncPolicy};
    ///
    /// let dir = tempfile::tempdir().unwrap();
    /// let opts = Options { segment_size_bytes: 64, sync: SyncPolicy::Never, ..Options::default() };
    /// let engine = Engine::open(dir.path(), opts)?;
    /// // Here a record's meta is one byte: the revision that wrote it.
    /// for revision in 1..=5u8 {
    ///     let meta = RecordMeta::new(&[revision])?;
    ///     engine.write_batch(&Batch::new().put_with_meta("k", [revision], 0, meta))?;
    /// }
    /// engine.write_batch(&Batch::new().delete_with_meta("k", RecordMeta::new(&[6])?))?;
    /// let floor = 3; // copied into the predicate: fixed when the merge is captured
    /// let keep = Retain::new(move |record| record.meta.as_bytes().first() > Some(&floor));
    /// let report = engine.merge_retaining(&engine.sealed_data_files(), 0, keep)?;
    /// let kept: Vec<(StoredKind, Vec<u8>)> = engine
    ///     .records_in(&report.outputs)?
    ///     .into_iter()
    ///     .map(|record| (record.kind, engine.read_record(&record.location).unwrap().value))
    ///     .collect();
    /// use StoredKind::{Put, Tombstone};
    /// assert_eq!(kept, [(Put, vec![4]), (Put, vec![5]), (Tombstone, vec![])]);
    /// assert_eq!(engine.get(b"k", 0)?, None); // the live view is a plain merge's
    /// # Ok::<(), bitcask::Error>(())
    /// ```
    pub fn merge_retaining(
        &self,
        inputs: &[String],
        now_ms: u64,
        retain: Retain,
    ) -> Result<MergeReport> {
        crate::merge::merge(&self.shared, inputs, now_ms, Some(retain))
    }

    /// Captures a merge of `inputs` now and returns it for [`MergeJob::run`]
    /// (on any thread). The cut-off is the engine's state at this call, so a
    /// caller that captures at the same point of the same write stream gets
    /// the same output on every replica (the cluster captures while applying
    /// a merge entry). Waits while another merge job exists (or, under
    /// [`MergeJob::run_then`], its follow-up runs).
    pub fn begin_merge(&self, inputs: &[String], now_ms: u64) -> Result<MergeJob> {
        crate::merge::begin(&self.shared, inputs, now_ms, None)
    }

    /// [`Engine::begin_merge`] with a retention predicate (see
    /// [`Engine::merge_retaining`]). The predicate is captured with the
    /// merge: whatever it reads must be fixed by now (say, a compaction
    /// floor copied into the closure), so replicas capturing at the same
    /// point of the write stream write the same files. Automatic merges
    /// ([`crate::Options::auto_merge`]) never retain anything: a caller
    /// keeping history merges explicitly.
    pub fn begin_merge_retaining(
        &self,
        inputs: &[String],
        now_ms: u64,
        retain: Retain,
    ) -> Result<MergeJob> {
        crate::merge::begin(&self.shared, inputs, now_ms, Some(retain))
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
                match crate::merge::merge(&worker, &inputs, now_ms, None) {
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
