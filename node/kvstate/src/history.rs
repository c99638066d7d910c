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
//! TTLs: below the store revision they are not judged (a key whose TTL ran
//! out is there until its expiry delete, which has a revision of its own);
//! at the store revision they are, as a current read judges them. With
//! revisions on, merges judge no TTL at all (kvnode passes them "now" 0):
//! only the log deletes keys, so a key the index does not hold is in the
//! key directory until its delete.
//!
//! A record meta that does not decode, even a superseded record's, stops
//! [`History::load`] (and so the open) with an error naming it: the index
//! must be the same on every replica, and skipping a record would make it
//! depend on the damage.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::ops::Bound;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bitcask::format::{DATA_SUFFIX, FileId};
use bitcask::{Engine, RecordLocation, RecordView, Retain, StoredKind};

use crate::command::RESERVED_KEY_PREFIX;
use crate::range::{Overlay, Pending};
use crate::revision::{KeyMeta, RevisionError, tombstone_revision};

/// The window's default size in revisions: the leader compacts to
/// `revision - HISTORY_WINDOW_REVISIONS_DEFAULT` once the window is
/// longer.
pub const HISTORY_WINDOW_REVISIONS_DEFAULT: u64 = 100_000;
/// The window's default size in records (a revision may write up to an
/// entry's 65 535 keys): what bounds the index's memory, about 120 bytes
/// per record (an 88-byte version, 16 bytes in the record order, vector
/// slack) plus the key and some 60 bytes per key held, so some 220 MiB at
/// most for keys of 50 bytes.
pub const HISTORY_WINDOW_RECORDS_DEFAULT: u64 = 1_000_000;
/// The window's default size in bytes of the records the history names
/// (in-window records and each key's base, header, meta, key and value as
/// stored): about the disk it may hold beyond the live data.
pub const HISTORY_WINDOW_BYTES_DEFAULT: u64 = 256 * 1024 * 1024;

/// How large the change history may grow before the leader compacts it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HistoryWindow {
    /// Revisions kept at most (at least 1).
    pub revisions: u64,
    /// Bytes of in-window records kept at most.
    pub bytes: u64,
    /// In-window records kept at most.
    pub records: u64,
}

impl Default for HistoryWindow {
    fn default() -> Self {
        HistoryWindow {
            revisions: HISTORY_WINDOW_REVISIONS_DEFAULT,
            bytes: HISTORY_WINDOW_BYTES_DEFAULT,
            records: HISTORY_WINDOW_RECORDS_DEFAULT,
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
    /// A put's expiry in ms of cluster time; 0 = never (a delete: 0).
    pub expiry_ms: u64,
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
    /// Keys changed within the window, ascending: each one's slot in
    /// `slots`. For ranges and walks in key order.
    keys: BTreeMap<Arc<[u8]>, u32>,
    /// The same keys and slots, hashed: what finds one key (the apply's
    /// search, once per written key, and a read's). A search of `keys`
    /// dereferences a key per comparison, a dozen or so for 10 000 keys.
    slot_of: HashMap<Arc<[u8]>, u32>,
    /// Each held key and its versions, ascending (the first may be the
    /// base, at or below the compact revision), by slot: the apply finds a
    /// key once ([`History::slot`]) and adds its records by slot
    /// ([`History::add`]), with no second search. A slot `free` lists is
    /// empty.
    slots: Vec<Slot>,
    /// Slots of keys compaction or a relocation forgot, for reuse.
    free: Vec<u32>,
    /// In-window records by revision, ascending, each naming its key by
    /// slot, with its size: what compaction walks, and what watchers read.
    /// A slot named here holds its key until the record leaves (see
    /// [`History::relocate`]).
    order: VecDeque<Record>,
    /// Bytes of every record the index names (in-window records and
    /// bases): what the history holds on disk beyond a merged store.
    bytes: u64,
}

/// A held key and its versions (see `History::slots`).
#[derive(Debug, Default)]
struct Slot {
    key: Arc<[u8]>,
    versions: Vec<Version>,
}

/// An in-window record in the record order (see `History::order`): 16
/// bytes, its key named by slot.
#[derive(Clone, Copy, Debug)]
struct Record {
    revision: u64,
    slot: u32,
    len: u32,
}

/// Where the index keeps a key it holds: what [`History::slot`] gives the
/// apply before an entry's engine write and [`History::add`] takes after
/// it. Valid until the index changes otherwise (a compaction, a
/// relocation).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct KeySlot(u32);

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
        expiry_ms: view.expiry_ms,
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
                    let slot = match history.slot_of.get(view.key) {
                        Some(slot) => KeySlot(*slot),
                        None => history.insert(view.key, Vec::new()),
                    };
                    // The record order is built once every version is in.
                    history.bytes += u64::from(location.len);
                    history.slots[slot.0 as usize].versions.push(Version {
                        revision,
                        kind: view.kind,
                        meta,
                        expiry_ms: view.expiry_ms,
                        location,
                    });
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
        let mut bases: HashMap<u32, (u64, Option<Version>)> = HashMap::new();
        engine.for_each_record(None, |view, location| {
            if failed.is_some() {
                return;
            }
            let Some(slot) = history.slot_of.get(view.key) else {
                return;
            };
            if view.seq >= history.slots[*slot as usize].versions[0].location.seq {
                return;
            }
            match base_version(view, location) {
                Ok(version) => {
                    let base = bases.entry(*slot).or_insert((0, None));
                    if view.seq >= base.0 {
                        *base = (view.seq, version);
                    }
                }
                Err(err) => failed = Some(err),
            }
        })?;
        if let Some(err) = failed {
            return Err(err.into());
        }
        // The record order: in-window records by revision, and within a
        // revision in the order they were written (by sequence number).
        let mut order = Vec::new();
        for (slot, Slot { versions, .. }) in history.slots.iter_mut().enumerate() {
            versions.sort_by_key(|v| (v.revision, v.location.seq));
            order.extend(
                versions
                    .iter()
                    .map(|v| (v.revision, v.location.seq, slot as u32, v.location.len)),
            );
            if let Some((_, Some(base))) = bases.remove(&(slot as u32)) {
                history.bytes += u64::from(base.location.len);
                versions.insert(0, base);
            }
        }
        order.sort_unstable();
        history.order = order
            .into_iter()
            .map(|(revision, _, slot, len)| Record {
                revision,
                slot,
                len,
            })
            .collect();
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
            .map(|(key, slot)| (&key[..], self.slots[*slot as usize].versions.as_slice()))
    }

    /// (In-window records, bytes of every record the index names: the
    /// in-window ones and the bases).
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

    /// The in-window records from `revision` on, ascending by revision
    /// (within a revision, in no particular order): (revision, key).
    pub fn records_from(&self, revision: u64) -> impl Iterator<Item = (u64, &[u8])> {
        let start = self
            .order
            .partition_point(|record| record.revision < revision);
        self.order
            .range(start..)
            .map(|record| (record.revision, &self.slots[record.slot as usize].key[..]))
    }

    /// `key`'s versions, ascending (the first may be its base), if the
    /// index holds it.
    pub fn versions(&self, key: &[u8]) -> Option<&[Version]> {
        self.slot_of
            .get(key)
            .map(|slot| self.slots[*slot as usize].versions.as_slice())
    }

    /// `key`'s slot, before the apply writes it: when the index does not
    /// hold `key` yet, adds it with its base (its state just before its
    /// first change within the window), which `base` reads (it is called
    /// only then). One search of the keys when the index holds `key`.
    pub(crate) fn slot<E>(
        &mut self,
        key: &[u8],
        base: impl FnOnce() -> Result<Option<Version>, E>,
    ) -> Result<KeySlot, E> {
        if let Some(slot) = self.slot_of.get(key) {
            return Ok(KeySlot(*slot));
        }
        let base = base()?;
        if let Some(base) = &base {
            self.bytes += u64::from(base.location.len);
        }
        Ok(self.insert(key, base.into_iter().collect()))
    }

    /// Adds `key`, which the index does not hold, with `versions`.
    fn insert(&mut self, key: &[u8], versions: Vec<Version>) -> KeySlot {
        let key: Arc<[u8]> = Arc::from(key);
        let slot = match self.free.pop() {
            Some(slot) => slot,
            None => {
                let slot = u32::try_from(self.slots.len())
                    .expect("fewer keys in the window than u32::MAX");
                self.slots.push(Slot::default());
                slot
            }
        };
        self.keys.insert(key.clone(), slot);
        self.slot_of.insert(key.clone(), slot);
        self.slots[slot as usize] = Slot { key, versions };
        KeySlot(slot)
    }

    /// Forgets the key in `slot`, which has no versions left, and frees
    /// the slot for reuse.
    fn remove(&mut self, slot: u32) {
        let Slot { key, versions } = std::mem::take(&mut self.slots[slot as usize]);
        debug_assert!(versions.is_empty());
        self.keys.remove(&key);
        self.slot_of.remove(&key);
        self.free.push(slot);
    }

    /// Adds a record the apply wrote at `version.revision`, to the key
    /// [`History::slot`] gave it.
    pub(crate) fn add(&mut self, slot: KeySlot, version: Version) {
        self.bytes += u64::from(version.location.len);
        self.order.push_back(Record {
            revision: version.revision,
            slot: slot.0,
            len: version.location.len,
        });
        self.slots[slot.0 as usize].versions.push(version);
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
        // Each key once, however many of its revisions leave the window: a
        // slot is one key's until the last of its records leaves the order
        // (a slot compaction frees below has none left in it).
        let leaving = self
            .order
            .partition_point(|record| record.revision <= compact_revision);
        let mut touched: Vec<u32> = Vec::with_capacity(leaving);
        touched.extend(self.order.drain(..leaving).map(|record| record.slot));
        touched.sort_unstable();
        touched.dedup();
        for slot in touched {
            let versions = &mut self.slots[slot as usize].versions;
            // The last version at or below the floor stays, as the base, if
            // it is a put and the key changed after the floor.
            let below = versions.partition_point(|v| v.revision <= compact_revision);
            if below == 0 {
                continue;
            }
            let base = versions[below - 1];
            let keep_base = base.kind == StoredKind::Put && below < versions.len();
            let dropped = if keep_base { below - 1 } else { below };
            self.bytes -= versions[..dropped]
                .iter()
                .map(|v| u64::from(v.location.len))
                .sum::<u64>();
            if dropped == versions.len() {
                versions.clear();
                self.remove(slot);
            } else {
                versions.drain(..dropped);
            }
        }
    }

    /// Where the window's start should move for it to fit `window`, if it
    /// does not fit now: the lowest revision that keeps at most
    /// `window.revisions` revisions, `window.bytes` bytes and
    /// `window.records` records.
    pub fn compaction_target(&self, window: HistoryWindow) -> Option<u64> {
        let mut target = self
            .compact_revision
            .max(self.revision.saturating_sub(window.revisions.max(1)));
        let mut bytes_over = self.bytes.saturating_sub(window.bytes);
        let mut records_over = (self.order.len() as u64).saturating_sub(window.records);
        for record in &self.order {
            if bytes_over == 0 && records_over == 0 {
                break;
            }
            bytes_over = bytes_over.saturating_sub(u64::from(record.len));
            records_over = records_over.saturating_sub(1);
            target = target.max(record.revision);
        }
        (target > self.compact_revision).then_some(target.min(self.revision))
    }

    /// Whether the window is past `window` by more than an eighth in one
    /// of its measures: when the leader compacts (to
    /// [`History::compaction_target`]), so that it does not propose a
    /// compaction on every tick while writes go on.
    pub fn is_over(&self, window: HistoryWindow) -> bool {
        let slack = |limit: u64| limit.saturating_add(limit / 8);
        self.revision.saturating_sub(self.compact_revision) > slack(window.revisions)
            || self.bytes > slack(window.bytes)
            || self.order.len() as u64 > slack(window.records)
    }

    /// `key`'s state at `revision`: `None` if the index does not hold the
    /// key (its current record is its state), `Some(None)` if it was
    /// absent, else the put.
    pub fn state_at(&self, key: &[u8], revision: u64) -> Option<Option<Version>> {
        let versions = self.versions(key)?;
        Some(latest_put_at(versions, revision))
    }

    /// The sequence numbers of the records the index names: what a merge
    /// captured now must keep ([`History::retain`]) and relocate.
    pub fn named(&self) -> Arc<HashSet<u64>> {
        Arc::new(
            self.slots
                .iter()
                .flat_map(|slot| &slot.versions)
                .map(|version| version.location.seq)
                .collect(),
        )
    }

    /// A merge's retention predicate keeping exactly the records in
    /// `named` ([`History::named`]) besides the live ones.
    pub fn retain(named: Arc<HashSet<u64>>) -> Retain {
        let min_seq = named.iter().copied().min().unwrap_or(u64::MAX);
        Retain::new(move |record| named.contains(&record.seq)).with_min_seq(min_seq)
    }

    /// The sequence numbers of the versions whose records are in the data
    /// files `inputs` (a merge's, once it swapped its output in: then no
    /// version can be noted there any more, so this is every version the
    /// merge moved, bases noted while it ran included). Err names a file
    /// name that is not a data file's.
    pub fn in_files(&self, inputs: &[String]) -> Result<HashSet<u64>, String> {
        let inputs = file_ids(inputs)?;
        Ok(self
            .slots
            .iter()
            .flat_map(|slot| &slot.versions)
            .filter(|version| inputs.contains(&version.location.file))
            .map(|version| version.location.seq)
            .collect())
    }

    /// Points the index at where a merge put its records: `inputs` are the
    /// merge's input files, `moved` the new location of each record of the
    /// outputs that the index names ([`History::in_files`] after the swap,
    /// then [`History::moved_records`]). A version in an input that `moved`
    /// lacks is forgotten (a merge keeps every record the index named when
    /// it was captured and every live one, so only a record compaction let
    /// go since can be missing; a key that lost an in-window version is
    /// forgotten whole, and its slot never reused). Returns how many versions
    /// were forgotten that way; Err names a file name that is not a data
    /// file's. The
    /// caller checks first that the index is the one the merge was
    /// captured with ([`History::generation`]): an install in between
    /// replaced it, and the merge's files are not its.
    pub fn relocate(
        &mut self,
        inputs: &[String],
        moved: &HashMap<u64, RecordLocation>,
    ) -> Result<usize, String> {
        let inputs = file_ids(inputs)?;
        let compact_revision = self.compact_revision;
        let mut forgotten = 0;
        let mut forgotten_bytes = 0;
        let mut emptied = Vec::new();
        for slot in self.keys.values() {
            let versions = &mut self.slots[*slot as usize].versions;
            let mut in_order = false;
            versions.retain_mut(|version| {
                if !inputs.contains(&version.location.file) {
                    return true;
                }
                match moved.get(&version.location.seq) {
                    Some(location) => {
                        version.location = *location;
                        true
                    }
                    None => {
                        forgotten += 1;
                        forgotten_bytes += u64::from(version.location.len);
                        in_order |= version.revision > compact_revision;
                        false
                    }
                }
            });
            // A key that lost an in-window version (a merge that kept no
            // history: not expected, a retaining merge keeps every in-window
            // record) loses the rest of its versions too. Kept, they would
            // let a later compaction free the slot while the order still
            // names it, and the slot could then be reused for another key;
            // emptied, the slot is detached below and never reused, and
            // readers of the order find the key's history lost.
            if in_order && !versions.is_empty() {
                forgotten += versions.len();
                forgotten_bytes += versions
                    .iter()
                    .map(|version| u64::from(version.location.len))
                    .sum::<u64>();
                versions.clear();
            }
            if versions.is_empty() {
                emptied.push((*slot, in_order));
            }
        }
        for (slot, in_order) in emptied {
            if in_order {
                // Not expected (a merge keeps every in-window record), but
                // the record order still names this slot: it keeps its key
                // for the order (whose readers then find the record lost)
                // and is never reused.
                let key = self.slots[slot as usize].key.clone();
                self.keys.remove(&key);
                self.slot_of.remove(&key);
            } else {
                self.remove(slot);
            }
        }
        self.bytes -= forgotten_bytes;
        Ok(forgotten)
    }

    /// Where the records a merge wrote to `outputs` are, for those in
    /// `named` ([`History::in_files`]): one pass over the outputs' hints,
    /// keeping only those.
    pub fn moved_records(
        engine: &Engine,
        outputs: &[String],
        named: &HashSet<u64>,
    ) -> Result<HashMap<u64, RecordLocation>, bitcask::Error> {
        let mut moved = HashMap::new();
        engine.for_each_record(Some(outputs), |view, location| {
            if named.contains(&view.seq) {
                moved.insert(view.seq, location);
            }
        })?;
        Ok(moved)
    }

    /// The overlay a read at `revision` sees on top of the engine: each
    /// indexed key, present (with its record) or absent at `revision`; a
    /// put whose TTL ran out by `now_ms` is absent (0: none counts as
    /// expired).
    pub(crate) fn overlay<'a>(
        &'a self,
        engine: &'a Engine,
        revision: u64,
        now_ms: u64,
    ) -> HistoryOverlay<'a> {
        HistoryOverlay {
            history: self,
            engine,
            revision,
            now_ms,
        }
    }
}

/// The file ids of data file names.
fn file_ids(names: &[String]) -> Result<HashSet<FileId>, String> {
    names
        .iter()
        .map(|name| {
            name.strip_suffix(DATA_SUFFIX)
                .and_then(FileId::parse_stem)
                .ok_or_else(|| format!("{name:?} is not a data file's name"))
        })
        .collect()
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
    now_ms: u64,
}

impl HistoryOverlay<'_> {
    /// The put `versions` hold at the read's revision, unless it expired.
    fn put_of(&self, versions: &[Version]) -> Option<Version> {
        latest_put_at(versions, self.revision)
            .filter(|v| v.expiry_ms == 0 || self.now_ms == 0 || v.expiry_ms > self.now_ms)
    }
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
            .map(|(key, slot)| {
                let versions = &self.history.slots[*slot as usize].versions;
                let pending = match self.put_of(versions) {
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
            .versions(key)
            .and_then(|versions| self.put_of(versions))
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
