//! The Raft state machine: openraft's `RaftStateMachine` over the bitcask
//! engine and [`Applier`], with snapshots made of the engine's files. The
//! snapshot stages (build, receive, install, prune) are `impl StateMachine`
//! blocks in [`crate::snapshot`]; this file opens the state machine, applies
//! entries and implements openraft's traits, delegating snapshot work.
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

use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::task::Poll;

use bitcask::{Batch, Engine, MergeReport, Options, PublishedPrefix, SyncPolicy};
use openraft::storage::{EntryResponder, RaftStateMachine};
use openraft::{EntryPayload, OptionalSend, RaftSnapshotBuilder, StoredMembership};
use tokio_stream::{Stream, StreamExt};

use crate::codec::CodecError;
use crate::hooks::InstallFailpoints;
use crate::raft::types::{
    CommitMeta, NodeEntry, NodeLogId, NodeMembership, NodeSnapshot, NodeSnapshotMeta, TypeConfig,
};
use crate::snapshot::install::Recovered;
use crate::snapshot::layout::CurrentSnapshot;
use crate::snapshot::{self, Pointer, SnapshotError, SnapshotHandle, node_vfs};
use kvstate::apply::{Applier, ApplyError, VERSIONS_PER_INDEX};
use kvstate::command::{Command, EntryResponse};
use kvstate::history::History;

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

/// What the apply lock guards. `pub(crate)` for the snapshot stages
/// (`crate::snapshot::{build, receive, install}`), which are `impl
/// StateMachine` blocks of their own.
#[derive(Debug)]
pub(crate) struct Inner {
    pub(crate) engine: Arc<Engine>,
    pub(crate) applier: Applier,
    pub(crate) generation: u64,
    pub(crate) last_applied: Option<NodeLogId>,
    pub(crate) membership: NodeMembership,
    pub(crate) time_ms: u64,
    pub(crate) current: Option<CurrentSnapshot>,
    pub(crate) next_counter: u64,
}

#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) dir: PathBuf,
    pub(crate) options: StateMachineOptions,
    pub(crate) inner: Mutex<Inner>,
    pub(crate) engine: RwLock<Arc<Engine>>,
    pub(crate) cluster_time_ms: AtomicU64,
    /// Leases and their attached keys after the last applied entry, and
    /// leases revoked by expiry and by request since this process started
    /// (for metrics and the tick loop, without the apply lock).
    pub(crate) lease_counts: [AtomicU64; 4],
    /// The store revision (what a read's header reports): the applier
    /// publishes each entry's before the entry's engine write
    /// (`Applier::with_published_revision`).
    pub(crate) revision: Arc<AtomicU64>,
    /// The change history's index (`kvstate::history`), extended by the
    /// applier; a read at a past revision holds its read lock, and takes
    /// the engine under it (an install switches both under its write lock).
    pub(crate) history: Arc<RwLock<History>>,
    /// The store revision after the last applied batch of entries (or
    /// install), sent once the change history holds it: what the watch hub
    /// listens to ([`StateMachine::subscribe_applied`]).
    pub(crate) applied: tokio::sync::watch::Sender<u64>,
    /// Held for the whole of a snapshot build or install: an install never
    /// removes an engine directory a build is still linking from.
    pub(crate) snapshot_work: Mutex<()>,
    /// The cluster id written into manifests (0 = not known yet).
    pub(crate) cluster_id: AtomicU64,
    /// The index of `Inner::last_applied` (0 = none), stored with it under
    /// the apply lock: response headers read it without taking that lock.
    pub(crate) applied_index: AtomicU64,
}

/// Whether every copy of a state machine is gone: see
/// [`StateMachine::release_watch`].
#[derive(Debug)]
pub struct Released(std::sync::Weak<Shared>, std::sync::Weak<Engine>);

impl Released {
    /// True once no copy of the state machine and no handle on its engine
    /// is left. (A merge still running on its thread holds the engine's
    /// files but not this handle; the engine's own lock outlives it.)
    pub fn released(&self) -> bool {
        self.0.strong_count() == 0 && self.1.strong_count() == 0
    }
}

/// The state machine (cheap to clone: clones share one state). It is also
/// its own snapshot builder.
#[derive(Clone, Debug)]
pub struct StateMachine {
    pub(crate) shared: Arc<Shared>,
}

/// A state-machine failure as openraft's storage error (it stops the node);
/// the message names what failed.
fn sm_err(err: SmError) -> io::Error {
    io::Error::other(err)
}

/// Most entries applied under one lock of the engine: a follower catching
/// up gets its entries in large runs, and a client waits for its whole
/// batch (a few ms at most at this size).
pub const APPLY_BATCH_ENTRIES_MAX: usize = 1024;

/// The node's part of the engine's last commit record (after kvstate's
/// store header, see `kvstate::revision`).
fn decode_meta(engine: &Engine) -> Result<Option<CommitMeta>, SmError> {
    match engine.last_commit_meta() {
        None => Ok(None),
        Some(bytes) => {
            let (_, node_meta) =
                kvstate::revision::split_commit_meta(&bytes).map_err(ApplyError::from)?;
            Ok(Some(CommitMeta::decode(node_meta)?))
        }
    }
}

impl StateMachine {
    /// Opens (or creates) the state machine in `dir`.
    pub fn open(dir: impl AsRef<Path>, options: StateMachineOptions) -> Result<Self, SmError> {
        let dir = dir.as_ref().to_path_buf();
        snapshot::create_dir_durable(&dir)?;
        // The CURRENT pointer, and what an interrupted install, write or
        // receive left behind (see `snapshot::install`).
        let Recovered {
            pointer,
            current,
            next_counter,
        } = snapshot::install::recover_at_open(&dir)?;
        let (engine, applier, meta) = open_engine(&dir, &options, &pointer)?;
        let (last_applied, membership, time_ms) = match meta {
            Some(meta) => (Some(meta.log_id), meta.membership, meta.time_ms),
            None => (None, StoredMembership::default(), 0),
        };
        let engine = Arc::new(engine);
        let revision = Arc::new(AtomicU64::new(0));
        let history = Arc::new(RwLock::new(History::default()));
        let applier = applier
            .with_published_revision(revision.clone())
            .with_shared_history(history.clone());
        let sm = StateMachine {
            shared: Arc::new(Shared {
                dir,
                options,
                engine: RwLock::new(engine.clone()),
                cluster_time_ms: AtomicU64::new(time_ms),
                lease_counts: Default::default(),
                revision,
                history,
                applied: tokio::sync::watch::Sender::new(0),
                snapshot_work: Mutex::new(()),
                cluster_id: AtomicU64::new(0),
                applied_index: AtomicU64::new(last_applied.map_or(0, |id| id.index)),
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
        sm.publish_lease_counts(&sm.lock(), (0, 0));
        sm.switch_in_newer_snapshot()?;
        sm.prune_snapshots();
        sm.notify_applied();
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

    /// The store revision after the last applied entry. Read it after the
    /// engine read it describes: the state read is then at or below it.
    pub fn revision(&self) -> u64 {
        self.shared.revision.load(Ordering::SeqCst)
    }

    /// Runs `read` on the leases of the applied state, with the cluster
    /// time they are judged at. Takes the apply lock: call it from a
    /// blocking thread.
    pub fn with_leases<T>(&self, read: impl FnOnce(&kvstate::lease::Leases, u64) -> T) -> T {
        let inner = self.lock();
        read(inner.applier.leases(), inner.time_ms)
    }

    /// Leases and keys attached to them after the last applied entry, and
    /// leases revoked by expiry and at a client's request since this
    /// process started.
    pub fn lease_counts(&self) -> (u64, u64, u64, u64) {
        let [leases, keys, expired, revoked] = self
            .shared
            .lease_counts
            .each_ref()
            .map(|count| count.load(Ordering::SeqCst));
        (leases, keys, expired, revoked)
    }

    /// Publishes the lease counts of the applied state; `revokes` adds
    /// (expired, revoked) leases of the entries just applied.
    pub(crate) fn publish_lease_counts(&self, inner: &Inner, revokes: (u64, u64)) {
        let leases = inner.applier.leases();
        let [count, keys, expired, revoked] = &self.shared.lease_counts;
        count.store(leases.len() as u64, Ordering::SeqCst);
        keys.store(leases.attached_keys() as u64, Ordering::SeqCst);
        expired.fetch_add(revokes.0, Ordering::SeqCst);
        revoked.fetch_add(revokes.1, Ordering::SeqCst);
    }

    /// Whether keys whose TTL ran out wait for their expiry deletes (more
    /// ran out at once than one entry deletes); `None` if the apply lock is
    /// busy (an entry is being applied, which deletes some).
    pub fn expiry_backlog(&self) -> Option<bool> {
        let inner = self.shared.inner.try_lock().ok()?;
        Some(
            inner
                .applier
                .next_expiry_ms()
                .is_some_and(|expiry_ms| expiry_ms <= inner.time_ms),
        )
    }

    /// Runs `read` on the engine while no entry applies (under the change
    /// history's read lock, which the apply takes around each entry's
    /// engine write), and returns what it returned with the store revision
    /// it reflects exactly. The apply waits for `read`: keep it bounded.
    pub fn read_exact<T>(&self, read: impl FnOnce(&Engine) -> T) -> (T, u64) {
        let history = self
            .shared
            .history
            .read()
            .unwrap_or_else(|p| p.into_inner());
        let engine = self.engine();
        let result = read(&engine);
        (result, history.revision())
    }

    /// [`StateMachine::read_exact`] if the lock is free now (no entry is
    /// applying or waiting to): what an async handler tries before it moves
    /// the read to a blocking thread. `None`: `read` did not run.
    pub fn try_read_exact<T>(&self, read: impl FnOnce(&Engine) -> T) -> Option<(T, u64)> {
        let history = self.shared.history.try_read().ok()?;
        let engine = self.engine();
        let result = read(&engine);
        Some((result, history.revision()))
    }

    /// The store revision the change history holds, sent after each
    /// applied batch of entries and each install (read from the history
    /// under its lock, so a reader that sees a value finds at least that
    /// revision there): what the watch hub (`server::watch_hub`) listens
    /// to.
    pub fn subscribe_applied(&self) -> tokio::sync::watch::Receiver<u64> {
        self.shared.applied.subscribe()
    }

    /// Tells watchers what the change history holds now.
    pub(crate) fn notify_applied(&self) {
        let revision = self
            .shared
            .history
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .revision();
        self.shared.applied.send_if_modified(|sent| {
            let changed = *sent != revision;
            *sent = revision;
            changed
        });
    }

    /// The change history's index: hold its read lock while reading at a
    /// past revision, and take [`StateMachine::engine`] under it.
    pub fn history(&self) -> &Arc<RwLock<History>> {
        &self.shared.history
    }

    /// Reads `spec` at its past revision (`spec.revision` ≠ 0) through the
    /// change history, at cluster time `now_ms` (see
    /// `kvstate::range::range_at`). Blocking: run it off the async workers.
    pub fn range_at(
        &self,
        spec: &kvstate::range::RangeSpec,
        now_ms: u64,
    ) -> Result<kvstate::range::RangeResult, kvstate::range::RangeError> {
        kvstate::range::range_at(|| self.engine(), &self.shared.history, spec, now_ms)
    }

    /// The index of the last applied entry (0 = none), without the apply
    /// lock: what a response header reports.
    pub fn applied_index(&self) -> u64 {
        self.shared.applied_index.load(Ordering::SeqCst)
    }

    /// Last applied log id and membership (as openraft's `applied_state`).
    pub fn applied(&self) -> (Option<NodeLogId>, NodeMembership) {
        let inner = self.lock();
        (inner.last_applied, inner.membership.clone())
    }

    /// Tells when every copy of this state machine is gone (and with the
    /// last one, the engine and its directory lock).
    pub fn release_watch(&self) -> Released {
        Released(Arc::downgrade(&self.shared), Arc::downgrade(&self.engine()))
    }

    /// The state machine's directory.
    pub fn dir(&self) -> &Path {
        &self.shared.dir
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, Inner> {
        self.shared.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Applies entries in order under one lock; entries at or below the
    /// last applied one are skipped (replay after a restart). Public for the
    /// restore's membership entry and for tests.
    pub fn apply_entries(
        &self,
        entries: impl IntoIterator<Item = NodeEntry>,
    ) -> Result<Vec<EntryResponse>, SmError> {
        self.apply_entries_answering(entries, |_| true)
    }

    /// [`StateMachine::apply_entries`], keeping the response of the `i`-th
    /// entry only where `wanted(i)` (the others are replaced by an empty
    /// one as soon as they are made): nobody waits for a follower's
    /// answers, and a transaction's answer may be megabytes.
    pub fn apply_entries_answering(
        &self,
        entries: impl IntoIterator<Item = NodeEntry>,
        wanted: impl Fn(usize) -> bool,
    ) -> Result<Vec<EntryResponse>, SmError> {
        let mut inner = self.lock();
        let mut responses = Vec::new();
        for entry in entries {
            let position = responses.len();
            let log_id = entry.log_id;
            let index = log_id.index;
            if inner
                .last_applied
                .is_some_and(|applied| index <= applied.index)
            {
                // Nobody proposed it in this process (a proposal's index is
                // above everything applied). Were someone waiting, the empty
                // answer list would not match its request count, which the
                // batcher reports as outcome unknown, never as an outcome.
                responses.push(EntryResponse::default());
                continue;
            }
            let engine = inner.engine.clone();
            let before = inner.applier.leases().revoke_counts();
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
                        // With revisions on, only the log deletes a key
                        // (expiry deletes are entries): a merge judging TTLs
                        // would drop expired keys from the key directory at
                        // a moment of its own thread, and replicas would
                        // then disagree on which expiry deletes to write.
                        let now_ms = if inner.applier.revisions_on() {
                            0
                        } else {
                            proposal.time_ms
                        };
                        start_merge(&engine, inputs, now_ms, &self.shared.history);
                    }
                    (response, proposal.time_ms, meta.membership)
                }
                payload => {
                    let blank = matches!(payload, EntryPayload::Blank);
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
                    if blank {
                        // A new leader's first entry: every lease counts as
                        // renewed now (kvstate::lease, "Lease time").
                        let time_ms = inner.time_ms;
                        inner
                            .applier
                            .apply_leader_start(&engine, seq, time_ms, &meta.encode())?;
                    } else {
                        let commit = inner.applier.commit_meta(&meta.encode());
                        engine.write_batch(&Batch::new().seq(seq).meta(commit))?;
                    }
                    (EntryResponse::default(), inner.time_ms, meta.membership)
                }
            };
            inner.last_applied = Some(log_id);
            self.shared
                .applied_index
                .store(log_id.index, Ordering::SeqCst);
            inner.membership = membership;
            inner.time_ms = time_ms;
            self.shared.cluster_time_ms.store(time_ms, Ordering::SeqCst);
            let revokes = inner.applier.leases().revoke_counts();
            self.publish_lease_counts(&inner, (revokes.0 - before.0, revokes.1 - before.1));
            responses.push(if wanted(position) {
                response
            } else {
                EntryResponse::default()
            });
        }
        drop(inner);
        self.notify_applied();
        Ok(responses)
    }

    /// Sets the cluster id that manifests carry and installs check.
    pub fn set_cluster_id(&self, cluster_id: u64) {
        self.shared.cluster_id.store(cluster_id, Ordering::SeqCst);
    }

    /// Held for the whole of a snapshot build or install.
    pub(crate) fn snapshot_work(&self) -> MutexGuard<'_, ()> {
        self.shared
            .snapshot_work
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// The options it was opened with.
    pub fn options(&self) -> &StateMachineOptions {
        &self.shared.options
    }

    /// The crash points of receiving and installing snapshots.
    pub fn failpoints(&self) -> &InstallFailpoints {
        &self.shared.options.failpoints
    }
}

pub(crate) fn open_engine(
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

/// Captures the merge now (deterministic cut-off, expiry judged at
/// `now_ms`; it keeps the records the change history names now, the same
/// on every replica) and runs it on a thread, which then points the
/// history at the records' new places (holding the merge slot until it
/// has, so the next merge is captured only after).
fn start_merge(
    engine: &Arc<Engine>,
    inputs: &[String],
    now_ms: u64,
    history: &Arc<RwLock<History>>,
) {
    let (named, generation) = {
        let history = history.read().unwrap_or_else(|p| p.into_inner());
        (history.named(), history.generation())
    };
    match engine.begin_merge_retaining(inputs, now_ms, History::retain(named)) {
        Ok(job) => {
            let engine = engine.clone();
            let history = history.clone();
            let spawned = std::thread::Builder::new()
                .name("kvnode-merge".to_string())
                // The history is repointed before the merge slot is let go
                // (so the capture above must never run under the history
                // lock: the relocation below takes it while holding the slot):
                // a next merge (a Merge entry applied meanwhile waits for
                // the slot) would otherwise swap this one's outputs away
                // before the history named them, and the versions it moved
                // would stay unreadable until a restart rebuilt the index.
                .spawn(move || {
                    job.run_then(|result| match result {
                        Ok(report) => {
                            tracing::info!(
                                cutoff = report.cutoff,
                                inputs = report.inputs.len(),
                                outputs = report.outputs.len(),
                                retained = report.records_retained,
                                "merge finished"
                            );
                            relocate_history(&engine, &history, generation, &report);
                        }
                        Err(err) => tracing::warn!(error = %err, "merge failed"),
                    })
                });
            if let Err(err) = spawned {
                tracing::warn!(error = %err, "could not start the merge thread");
            }
        }
        // Bad inputs are refused the same way on every replica.
        Err(err) => tracing::warn!(error = %err, ?inputs, "merge entry not run"),
    }
}

/// Points the change history at the records a merge moved, if it is still
/// the index the merge was captured with (`generation`): after an install
/// it was rebuilt from the new engine's files, which the merge never saw.
/// The versions to move are those in the inputs now, after the swap (bases
/// noted while the merge ran point there too: the merge copied those
/// records as live ones).
fn relocate_history(
    engine: &Engine,
    history: &RwLock<History>,
    generation: u64,
    report: &MergeReport,
) {
    let in_inputs = {
        let history = history.read().unwrap_or_else(|p| p.into_inner());
        if history.generation() != generation {
            tracing::info!(
                "merge finished after an install replaced its engine: history not relocated"
            );
            return;
        }
        history.in_files(&report.inputs)
    };
    let moved = in_inputs.and_then(|seqs| {
        History::moved_records(engine, &report.outputs, &seqs).map_err(|err| err.to_string())
    });
    let relocated = moved.and_then(|moved| {
        let mut history = history.write().unwrap_or_else(|p| p.into_inner());
        if history.generation() != generation {
            return Ok(0);
        }
        history.relocate(&report.inputs, &moved)
    });
    match relocated {
        Ok(0) => {}
        Ok(forgotten) => {
            tracing::warn!(
                forgotten,
                "the merge dropped records the change history named"
            )
        }
        // Reads of the records it names then fail after a wait
        // (UNAVAILABLE) until a restart rebuilds the index.
        Err(err) => tracing::error!(error = %err, "the change history was not relocated"),
    }
}

impl RaftSnapshotBuilder<TypeConfig> for StateMachine {
    type SnapshotData = SnapshotHandle;

    async fn build_snapshot(&mut self) -> Result<NodeSnapshot, io::Error> {
        // File work (fsync, links, a copy of the active prefix): off the
        // async threads.
        let sm = self.clone();
        tokio::task::spawn_blocking(move || sm.build())
            .await
            .map_err(|err| sm_err(SmError::Inconsistent(format!("build task: {err}"))))?
            .map_err(sm_err)
    }
}

/// The next entry of openraft's apply stream if it is ready now, without
/// waiting: `Ready(None)` when the stream has ended, `Pending` when the next
/// entry is not there yet.
async fn ready_now<S>(entries: &mut S) -> Poll<Option<S::Item>>
where
    S: Stream + Unpin,
{
    std::future::poll_fn(|cx| Poll::Ready(Pin::new(&mut *entries).poll_next(cx))).await
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotData = SnapshotHandle;
    type SnapshotBuilder = Self;

    async fn applied_state(&mut self) -> Result<(Option<NodeLogId>, NodeMembership), io::Error> {
        Ok(self.applied())
    }

    /// Drains openraft's stream in batches of what is ready (at most
    /// [`APPLY_BATCH_ENTRIES_MAX`] entries under one lock of the engine), and
    /// answers each waiting client once its batch is applied.
    async fn apply<S>(&mut self, mut entries: S) -> Result<(), io::Error>
    where
        S: Stream<Item = Result<EntryResponder<TypeConfig>, io::Error>> + Unpin + OptionalSend,
    {
        #[cfg(feature = "testing")]
        crate::testing::stale_build::before_apply(self).await;
        let mut batch = Vec::new();
        let mut responders = Vec::new();
        let mut ended = false;
        while !ended {
            // A read error ends the stream, but what was read before it is
            // applied and answered first.
            let mut failed = None;
            match entries.next().await {
                None => break,
                Some(Ok((entry, responder))) => {
                    batch.push(entry);
                    responders.push(responder);
                }
                Some(Err(err)) => return Err(err),
            }
            while batch.len() < APPLY_BATCH_ENTRIES_MAX {
                match ready_now(&mut entries).await {
                    Poll::Ready(Some(Ok((entry, responder)))) => {
                        batch.push(entry);
                        responders.push(responder);
                    }
                    Poll::Ready(Some(Err(err))) => {
                        failed = Some(err);
                        break;
                    }
                    Poll::Ready(None) => {
                        ended = true;
                        break;
                    }
                    Poll::Pending => break,
                }
            }
            let wanted: Vec<bool> = responders.iter().map(Option::is_some).collect();
            let responses = self
                .apply_entries_answering(batch.drain(..), |i| wanted[i])
                .map_err(sm_err)?;
            for (responder, response) in responders.drain(..).zip(responses) {
                if let Some(responder) = responder {
                    responder.send(response);
                }
            }
            if let Some(err) = failed {
                return Err(err);
            }
        }
        Ok(())
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn install_snapshot(
        &mut self,
        meta: &NodeSnapshotMeta,
        snapshot: SnapshotHandle,
    ) -> Result<(), io::Error> {
        #[cfg(feature = "testing")]
        crate::testing::stale_build::before_install(self, meta).await;
        let sm = self.clone();
        let owned_meta = meta.clone();
        tokio::task::spawn_blocking(move || sm.install(&owned_meta, &snapshot))
            .await
            .map_err(|err| SmError::Inconsistent(format!("install task: {err}")))
            .and_then(|installed| installed)
            .map_err(sm_err)?;
        self.notify_applied();
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<NodeSnapshot>, io::Error> {
        Ok(self.current_snapshot())
    }
}
