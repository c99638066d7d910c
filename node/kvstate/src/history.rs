//! The change history: which engine record holds each key's state at each
//! revision of the window, so reads at a past revision (and, later,
//! watchers) find it without the apply path ever reading a value.
//!
//! The history is the segments themselves. Every record written since
//! revisions turned on stays in the engine's files until compaction lets
//! it go: merges are told to keep exactly the records this index names
//! ([`History::retain`]). The index holds, for each key changed within the
//! window, its versions in revision order with where each record is:
//! - every record written at a revision above the compact revision (its
//!   put or its tombstone), and
//! - before those, the key's *base*: the put that was its state at the
//!   compact revision, if it had one (a key absent then has no base).
//!
//! A key the index does not hold has not changed within the window: its
//! state at every revision the window serves is its current record.
//!
//! The window is `[compact_revision, revision]`. A read below it is
//! refused as compacted, naming the oldest revision still served; above
//! it, as a future revision. It moves only by an entry of the log
//! ([`crate::command::Command::Compact`]), which the leader proposes when
//! the window passes its size in revisions or in bytes of records
//! ([`HistoryWindow`], [`History::compaction_target`]); so it moves at the
//! same point on every replica, and merges captured at the same point keep
//! the same records.
//!
//! The index is rebuilt from the engine's records at open and after a
//! snapshot install ([`History::load`]): two passes over the record
//! listing (hints, no values). What it holds is a function of the files
//! and the store header alone, the same whether a replica built it by
//! applying entries or by loading files:
//! - in-window records are those with revision metadata (written since
//!   revisions turned on) above the compact revision;
//! - a key's base is its last record at or below the compact revision, or
//!   written before revisions, if that record is a put.
//!
//! A merge moves records to new files: [`History::relocate`] points the
//! index at them once the merge is swapped in; until then a read that
//! finds its record gone starts over.
//!
//! Known limit: past reads ignore TTLs (a key whose TTL ran out is there
//! until its expiry delete, which has a revision of its own); but a key
//! whose TTL ran out before the compact revision and whose expiry delete
//! is still pending may have been dropped by a merge (the engine drops
//! expired records the index does not name), and then reads as absent at
//! window revisions before its delete.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::ops::Bound;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bitcask::{Engine, RecordLocation, RecordView, Retain, StoredKind, StoredRecord};

use crate::command::RESERVED_KEY_PREFIX;
use crate::range::{Overlay, Pending};
use crate::revision::{KeyMeta, RevisionError, tombstone_revision};

/// The window's default size in revisions: the leader compacts to
/// `revision - HISTORY_WINDOW_REVISIONS_DEFAULT` once the window is
/// longer. About 10 MiB of index for keys of 30 bytes.
pub const HISTORY_WINDOW_REVISIONS_DEFAULT: u64 = 100_000;
/// The window's default size in bytes of in-window records (header, meta,
/// key and value, as stored): the disk the history may hold beyond the
/// live data.
pub const HISTORY_WINDOW_BYTES_DEFAULT: u64 = 256 * 1024 * 1024;

/// How large the change history may grow before the leader compacts it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HistoryWindow {
    /// Revisions kept at most (at least 1).
    pub revisions: u64,
    /// Bytes of in-window records kept at most.
    pub bytes: u64,
}

impl Default for HistoryWindow {
    fn default() -> Self {
        HistoryWindow {
            revisions: HISTORY_WINDOW_REVISIONS_DEFAULT,
            bytes: HISTORY_WINDOW_BYTES_DEFAULT,
        }
    }
}

/// One state of a key: a put (with its revisions) or a delete, and the
/// record that says so.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Version {
    /// The revision of the write (a put's `mod_revision`; a delete's
    /// revision). A base written before revisions reads as revision 1.
    pub revision: u64,
    /// Put or delete.
    pub kind: StoredKind,
    /// A put's revisions (a delete: all zero).
    pub meta: KeyMeta,
    /// Where the record is.
    pub location: RecordLocation,
}

/// Why the history could not serve a revision.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HistoryError {
    /// Below the window (etcd's `ErrCompacted`).
    #[error(
        "mvcc: required revision has been compacted: field `revision` is {requested}, the \
         oldest revision served is {compact_revision}"
    )]
    Compacted {
        /// The revision asked for.
        requested: u64,
        /// The compact revision: the oldest still served.
        compact_revision: u64,
    },
    /// Above the store revision (etcd's `ErrFutureRev`).
    #[error(
        "mvcc: required revision is a future revision: field `revision` is {requested}, the \
         store revision is {current}"
    )]
    Future {
        /// The revision asked for.
        requested: u64,
        /// The store revision.
        current: u64,
    },
}

/// The change history's index (see the module documentation). Shared
/// between the applier, which extends it under a write lock around each
/// entry's engine write, and readers, which hold a read lock while they
/// read (so the engine and the index agree for them).
#[derive(Debug, Default)]
pub struct History {
    /// Which index this is: every [`History::new`] / [`History::load`]
    /// gets its own, so a merge of an engine an install replaced does not
    /// relocate the index of the new one ([`History::relocate`]).
    generation: u64,
    /// The store revision the index reflects.
    revision: u64,
    /// Revisions below this are compacted; it is still served.
    compact_revision: u64,
    /// Keys changed within the window: their versions, ascending; the
    /// first may be the base (at or below the compact revision).
    keys: BTreeMap<Arc<[u8]>, Vec<Version>>,
    /// In-window records by (revision, key), ascending, with their sizes:
    /// what compaction walks, and what watchers will.
    order: VecDeque<(u64, Arc<[u8]>, u32)>,
    /// Bytes of the in-window records.
    bytes: u64,
}

/// The revision a record says it was written at: `None` for a record
/// written before revisions (no meta), or for a reserved key.
fn record_revision(view: &RecordView<'_>) -> Result<Option<(u64, KeyMeta)>, RevisionError> {
    if view.key.starts_with(RESERVED_KEY_PREFIX) || view.meta.as_bytes().is_empty() {
        return Ok(None);
    }
    Ok(match view.kind {
        StoredKind::Put => {
            let meta = KeyMeta::decode(&view.meta)?;
            Some((meta.mod_revision, meta))
        }
        StoredKind::Tombstone => {
            tombstone_revision(&view.meta)?.map(|revision| (revision, KeyMeta::default()))
        }
    })
}

/// A base candidate: a record at or below the compact revision, or from
/// before revisions, as a version (`None` for a tombstone: no base).
fn base_version(
    view: &RecordView<'_>,
    location: RecordLocation,
) -> Result<Option<Version>, RevisionError> {
    if view.kind != StoredKind::Put {
        return Ok(None);
    }
    let meta = KeyMeta::decode(&view.meta)?;
    Ok(Some(Version {
        revision: meta.mod_revision,
        kind: StoredKind::Put,
        meta,
        location,
    }))
}

impl History {
    /// An empty history at `revision`, compacted at `compact_revision`.
    pub fn new(revision: u64, compact_revision: u64) -> History {
        static GENERATIONS: AtomicU64 = AtomicU64::new(1);
        History {
            generation: GENERATIONS.fetch_add(1, Ordering::Relaxed),
            revision,
            compact_revision,
            ..History::default()
        }
    }

    /// Which index this is (see [`History::relocate`]).
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Rebuilds the index from the engine's records, for a store at
    /// `revision` compacted at `compact_revision` (its store header).
    pub fn load(
        engine: &Engine,
        revision: u64,
        compact_revision: u64,
    ) -> Result<History, HistoryLoadError> {
        let mut history = History::new(revision, compact_revision);
        let mut failed = None;
        // Pass 1: the in-window records.
        engine.for_each_record(None, |view, location| {
            if failed.is_some() {
                return;
            }
            match record_revision(view) {
                Ok(Some((revision, meta))) if revision > compact_revision => {
                    let key: Arc<[u8]> = match history.keys.get_key_value(view.key) {
                        Some((key, _)) => key.clone(),
                        None => Arc::from(view.key),
                    };
                    history.keys.entry(key.clone()).or_default().push(Version {
                        revision,
                        kind: view.kind,
                        meta,
                        location,
                    });
                    history.order.push_back((revision, key, location.len));
                    history.bytes += u64::from(location.len);
                }
                Ok(_) => {}
                Err(err) => failed = Some(err),
            }
        })?;
        if let Some(err) = failed {
            return Err(err.into());
        }
        if history.keys.is_empty() {
            return Ok(history);
        }
        // Pass 2: each such key's base, its last record before the window.
        let mut bases: HashMap<Arc<[u8]>, (u64, Option<Version>)> = HashMap::new();
        engine.for_each_record(None, |view, location| {
            if failed.is_some() {
                return;
            }
            let Some((key, versions)) = history.keys.get_key_value(view.key) else {
                return;
            };
            if view.seq >= versions[0].location.seq {
                return;
            }
            match base_version(view, location) {
                Ok(version) => {
                    let slot = bases.entry(key.clone()).or_insert((0, None));
                    if view.seq >= slot.0 {
                        *slot = (view.seq, version);
                    }
                }
                Err(err) => failed = Some(err),
            }
        })?;
        if let Some(err) = failed {
            return Err(err.into());
        }
        for (key, versions) in history.keys.iter_mut() {
            versions.sort_by_key(|v| (v.revision, v.location.seq));
            if let Some((_, Some(base))) = bases.remove(key) {
                versions.insert(0, base);
            }
        }
        history
            .order
            .make_contiguous()
            .sort_by(|a, b| a.0.cmp(&b.0).then_with(|| a.1.cmp(&b.1)));
        Ok(history)
    }

    /// The store revision the index reflects.
    pub fn revision(&self) -> u64 {
        self.revision
    }

    /// The oldest revision served.
    pub fn compact_revision(&self) -> u64 {
        self.compact_revision
    }

    /// Keys the index holds (changed within the window).
    pub fn keys(&self) -> usize {
        self.keys.len()
    }

    /// Each key the index holds, ascending, with its versions (ascending
    /// revisions; the first may be the base).
    pub fn keys_in_window(&self) -> impl Iterator<Item = (&[u8], &[Version])> {
        self.keys
            .iter()
            .map(|(key, versions)| (&key[..], versions.as_slice()))
    }

    /// In-window records: (count, bytes).
    pub fn records(&self) -> (usize, u64) {
        (self.order.len(), self.bytes)
    }

    /// Checks that `requested` is within the window.
    pub fn check(&self, requested: u64) -> Result<(), HistoryError> {
        if requested > self.revision {
            Err(HistoryError::Future {
                requested,
                current: self.revision,
            })
        } else if requested < self.compact_revision {
            Err(HistoryError::Compacted {
                requested,
                compact_revision: self.compact_revision,
            })
        } else {
            Ok(())
        }
    }

    /// Whether `key` needs a base before the apply writes it: it is not
    /// in the index yet.
    pub(crate) fn holds(&self, key: &[u8]) -> bool {
        self.keys.contains_key(key)
    }

    /// Adds `key`'s base (its state just before its first change within
    /// the window), when the key is not in the index yet.
    pub(crate) fn add_base(&mut self, key: &[u8], base: Option<Version>) {
        if self.keys.contains_key(key) {
            return;
        }
        self.keys.insert(Arc::from(key), base.into_iter().collect());
    }

    /// Adds a record the apply wrote at `version.revision`.
    pub(crate) fn add(&mut self, key: &[u8], version: Version) {
        let key = match self.keys.get_key_value(key) {
            Some((key, _)) => key.clone(),
            None => Arc::from(key),
        };
        self.bytes += u64::from(version.location.len);
        self.order
            .push_back((version.revision, key.clone(), version.location.len));
        self.keys.entry(key).or_default().push(version);
    }

    /// The store revision after an entry.
    pub(crate) fn set_revision(&mut self, revision: u64) {
        self.revision = revision;
    }

    /// Moves the window's start to `compact_revision` (not back): forgets
    /// what only revisions below it needed.
    pub(crate) fn compact(&mut self, compact_revision: u64) {
        if compact_revision <= self.compact_revision {
            return;
        }
        self.compact_revision = compact_revision;
        while let Some((revision, _, _)) = self.order.front() {
            if *revision > compact_revision {
                break;
            }
            let (_, key, len) = self.order.pop_front().expect("a front was just seen");
            self.bytes -= u64::from(len);
            let Some(versions) = self.keys.get_mut(&key) else {
                continue;
            };
            // The last version at or below the floor stays, as the base, if
            // it is a put and the key changed after the floor.
            let below = versions.partition_point(|v| v.revision <= compact_revision);
            if below == 0 {
                continue;
            }
            let base = versions[below - 1];
            versions.drain(..below);
            if versions.is_empty() {
                self.keys.remove(&key);
            } else if base.kind == StoredKind::Put {
                versions.insert(0, base);
            }
        }
    }

    /// Where the window's start should move for it to fit `window`, if it
    /// does not fit now: the lowest revision that keeps at most
    /// `window.revisions` revisions and `window.bytes` bytes of records.
    pub fn compaction_target(&self, window: HistoryWindow) -> Option<u64> {
        let mut target = self
            .compact_revision
            .max(self.revision.saturating_sub(window.revisions.max(1)));
        let mut excess = self.bytes.saturating_sub(window.bytes);
        for (revision, _, len) in &self.order {
            if excess == 0 {
                break;
            }
            excess = excess.saturating_sub(u64::from(*len));
            target = target.max(*revision);
        }
        (target > self.compact_revision).then_some(target.min(self.revision))
    }

    /// `key`'s state at `revision`: `None` if the index does not hold the
    /// key (its current record is its state), `Some(None)` if it was
    /// absent, else the put.
    pub fn state_at(&self, key: &[u8], revision: u64) -> Option<Option<Version>> {
        let versions = self.keys.get(key)?;
        Some(latest_put_at(versions, revision))
    }

    /// The records the index names, as a merge's retention predicate: a
    /// merge captured now keeps exactly these (and the live records).
    pub fn retain(&self) -> Retain {
        let seqs: HashSet<u64> = self
            .keys
            .values()
            .flatten()
            .map(|version| version.location.seq)
            .collect();
        let min_seq = seqs.iter().copied().min().unwrap_or(u64::MAX);
        Retain::new(move |record| seqs.contains(&record.seq)).with_min_seq(min_seq)
    }

    /// Points the index at where a merge put its records: `inputs` are the
    /// merge's input files, `moved` its outputs' records. A version in an
    /// input that the outputs lack is forgotten (a merge keeps every
    /// record the index named when it was captured, so only a record
    /// compaction let go since can be missing). Returns how many versions
    /// were forgotten that way. The caller checks first that the index is
    /// the one the merge was captured with ([`History::generation`]): an
    /// install in between replaced it, and the merge's files are not its.
    pub fn relocate(&mut self, inputs: &[String], moved: &[StoredRecord]) -> usize {
        let inputs: HashSet<&str> = inputs.iter().map(String::as_str).collect();
        let by_seq: HashMap<u64, RecordLocation> =
            moved.iter().map(|r| (r.seq, r.location)).collect();
        let mut forgotten = 0;
        let mut emptied = Vec::new();
        for (key, versions) in self.keys.iter_mut() {
            versions.retain_mut(|version| {
                if !inputs.contains(version.location.file_name().as_str()) {
                    return true;
                }
                match by_seq.get(&version.location.seq) {
                    Some(location) => {
                        version.location = *location;
                        true
                    }
                    None => {
                        forgotten += 1;
                        false
                    }
                }
            });
            if versions.is_empty() {
                emptied.push(key.clone());
            }
        }
        for key in emptied {
            self.keys.remove(&key);
        }
        forgotten
    }

    /// The overlay a read at `revision` over `[start, end)` sees on top of
    /// the engine: each indexed key in the range, present (with its
    /// record) or absent at `revision`.
    pub(crate) fn overlay<'a>(&'a self, engine: &'a Engine, revision: u64) -> HistoryOverlay<'a> {
        HistoryOverlay {
            history: self,
            engine,
            revision,
        }
    }
}

/// The last version at or below `revision`, if it is a put.
fn latest_put_at(versions: &[Version], revision: u64) -> Option<Version> {
    let at = versions.partition_point(|v| v.revision <= revision);
    versions[..at]
        .last()
        .filter(|v| v.kind == StoredKind::Put)
        .copied()
}

/// A read at a past revision's view of the history (see
/// [`History::overlay`]).
pub(crate) struct HistoryOverlay<'a> {
    history: &'a History,
    engine: &'a Engine,
    revision: u64,
}

impl Overlay for HistoryOverlay<'_> {
    fn changed(&self, start: &[u8], end: &Bound<Vec<u8>>) -> Vec<(Vec<u8>, Pending)> {
        let end: Bound<&[u8]> = match end {
            Bound::Included(end) => Bound::Included(end.as_slice()),
            Bound::Excluded(end) => Bound::Excluded(end.as_slice()),
            Bound::Unbounded => Bound::Unbounded,
        };
        self.history
            .keys
            .range::<[u8], _>((Bound::Included(start), end))
            .map(|(key, versions)| {
                let pending = match latest_put_at(versions, self.revision) {
                    Some(version) => Pending::Written(version.meta),
                    None => Pending::Deleted,
                };
                (key.to_vec(), pending)
            })
            .collect()
    }

    fn value(&self, key: &[u8]) -> Result<Vec<u8>, bitcask::Error> {
        let version = self
            .history
            .keys
            .get(key)
            .and_then(|versions| latest_put_at(versions, self.revision))
            .ok_or_else(|| bitcask::Error::Corruption {
                file: String::new(),
                offset: 0,
                reason: format!(
                    "the change history lost {} at revision {}",
                    crate::range::shown(key),
                    self.revision
                ),
            })?;
        Ok(self.engine.read_record(&version.location)?.value)
    }
}

/// Why the history could not be rebuilt.
#[derive(Debug, thiserror::Error)]
pub enum HistoryLoadError {
    /// Listing the engine's records failed.
    #[error("engine: {0}")]
    Engine(#[from] bitcask::Error),
    /// A record's revision metadata does not decode.
    #[error(transparent)]
    Revision(#[from] RevisionError),
}
