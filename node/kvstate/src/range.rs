//! Range reads as etcd v3 serves them (`RangeRequest` / `RangeResponse`,
//! server v3.4/v3.5), evaluated against the engine at a cluster time.
//!
//! A range names keys the etcd way ([`RangeSpec::key`] and
//! [`RangeSpec::range_end`]): an empty `range_end` is the single key, `"\0"`
//! is every key at or after `key`, anything else is `[key, range_end)`.
//! Expired keys are absent, and keys under [`RESERVED_KEY_PREFIX`] (the
//! node's own bookkeeping) are never visited: a range that spans them is
//! read as the two ranges around them.
//!
//! The order of work is etcd's (`applierV3backend.Range`): the keys in the
//! range are counted ([`RangeResult::count`], before filters and limit);
//! when a sort order or a min/max revision filter is set every key is
//! fetched, otherwise only `limit + 1` (to know [`RangeResult::more`]);
//! then the filters, then the sort, then the cut to `limit`.
//!
//! Two callers: [`range`] reads the engine alone (a read outside the log),
//! and the apply of a transaction reads the engine under the entry's
//! pending writes (an [`Overlay`]), so a range inside a transaction sees
//! the transaction's earlier puts and deletes, as etcd's do. Every read is
//! bounded by a [`Budget`]: keys visited, and bytes of keys visited and
//! values returned; past it the read fails with an error naming the limit.

use std::cmp::Ordering;
use std::ops::Bound;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use bitcask::{Engine, KeyRange, Scan};
use serde::{Deserialize, Serialize};

use crate::command::RESERVED_KEY_PREFIX;
use crate::history::{History, HistoryError};
use crate::revision::{KeyMeta, RevisionError};

/// Keys a read outside the log ([`range`]) may visit: every key in the
/// range is visited to count it, and the key directory hands them over in
/// one pass (so the keys and revisions read are one consistent state).
/// 100 000 keys of a typical 50 bytes are about 10 MiB.
pub const RANGE_KEYS_MAX: usize = 100_000;
/// Keys a read outside the log ([`range`]) may walk to count them when it
/// returns only some (a `limit` in key order, or `count_only`) and some
/// key may have expired (a put with a TTL since the engine opened): the
/// walk reads no record but holds the key directory's read lock, which
/// the apply's writes wait for, ~0.25 s per million keys on the 2-core
/// machine of BENCHMARKS.md (`bitcask/examples/count_profile.rs`). Without
/// expiring keys, and at a past revision, the count comes from the key
/// directory's order without visiting keys and is not bounded, as etcd's.
pub const RANGE_COUNT_KEYS_MAX: usize = 1_000_000;
/// Bytes a read outside the log ([`range`]) may visit: the keys in the
/// range plus the values it returns. Below the node's largest client
/// message (8 MiB), so a range that passes it also fits its answer.
pub const RANGE_READ_BYTES_MAX: usize = 6 * 1024 * 1024;
/// Times [`range`] starts over when an entry applied between its pass over
/// the key directory and its value reads (a key changed under it).
pub const RANGE_READ_ATTEMPTS_MAX: usize = 8;
/// How long [`range_at`] keeps starting over while merges move the records
/// it was about to read (the history points at the new places once the
/// merge thread has listed the outputs: longer for a larger store).
pub const HISTORY_READ_WAIT_MAX: Duration = Duration::from_secs(30);
/// The first wait of [`range_at`] before it starts over; doubled each
/// time up to [`HISTORY_RETRY_WAIT_MAX`].
const HISTORY_RETRY_WAIT: Duration = Duration::from_millis(1);
/// The longest single wait of [`range_at`] before it starts over.
const HISTORY_RETRY_WAIT_MAX: Duration = Duration::from_millis(100);
/// Bytes of a key shown in an error message; longer keys are cut.
const KEY_SHOWN_BYTES_MAX: usize = 64;
/// The first key after every key that starts with [`RESERVED_KEY_PREFIX`]
/// (its last byte, `/`, plus one). Checked against the prefix in a test.
const RESERVED_KEY_END: &[u8] = b"\xff\xffraftcask0";

/// How a range sorts its keys (etcd's `RangeRequest.SortOrder`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum SortOrder {
    /// Key order, unless [`RangeSpec::sort_target`] is not
    /// [`SortTarget::Key`]: then ascending (etcd's default).
    #[default]
    None,
    /// Lowest first.
    Ascend,
    /// Highest first.
    Descend,
}

/// What a range sorts by (etcd's `RangeRequest.SortTarget`). Keys that tie
/// stay in ascending key order (etcd leaves ties unordered).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum SortTarget {
    /// The key.
    #[default]
    Key,
    /// The key's version.
    Version,
    /// The key's create revision.
    Create,
    /// The key's mod revision.
    Mod,
    /// The value's bytes.
    Value,
}

/// A range read, field for field etcd's `RangeRequest`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct RangeSpec {
    /// The first key; must not be empty (etcd: "key is not provided").
    #[serde(with = "serde_bytes")]
    pub key: Vec<u8>,
    /// Empty: `key` alone; `"\0"`: every key at or after `key`; otherwise
    /// the keys in `[key, range_end)`.
    #[serde(with = "serde_bytes")]
    pub range_end: Vec<u8>,
    /// Keys returned at most; 0 = no limit.
    pub limit: u64,
    /// Return keys and revisions with empty values.
    pub keys_only: bool,
    /// Return only [`RangeResult::count`], no keys.
    pub count_only: bool,
    /// The order of the keys returned.
    pub sort_order: SortOrder,
    /// What [`RangeSpec::sort_order`] sorts by.
    pub sort_target: SortTarget,
    /// Leave out keys whose mod revision is below this; 0 = no bound.
    pub min_mod_revision: u64,
    /// Leave out keys whose mod revision is above this; 0 = no bound.
    pub max_mod_revision: u64,
    /// Leave out keys whose create revision is below this; 0 = no bound.
    pub min_create_revision: u64,
    /// Leave out keys whose create revision is above this; 0 = no bound.
    pub max_create_revision: u64,
    /// The store revision to read at; 0 = the current one. Any other value
    /// than the current store revision is refused for now (reads at a past
    /// revision need the change history).
    pub revision: u64,
}

impl RangeSpec {
    /// A read of the single key `key`, every other field at its default.
    pub fn key(key: impl Into<Vec<u8>>) -> RangeSpec {
        RangeSpec {
            key: key.into(),
            ..RangeSpec::default()
        }
    }

    /// A read of `[key, range_end)` (with `range_end`'s etcd meanings),
    /// every other field at its default.
    pub fn between(key: impl Into<Vec<u8>>, range_end: impl Into<Vec<u8>>) -> RangeSpec {
        RangeSpec {
            key: key.into(),
            range_end: range_end.into(),
            ..RangeSpec::default()
        }
    }

    /// Whether etcd fetches every key of the range before it filters, sorts
    /// and cuts to the limit (a sort order or a revision filter is set);
    /// otherwise it fetches `limit + 1` keys in key order.
    fn fetches_all(&self) -> bool {
        self.sort_order != SortOrder::None || self.filters()
    }

    /// Whether a revision filter is set.
    fn filters(&self) -> bool {
        self.min_mod_revision != 0
            || self.max_mod_revision != 0
            || self.min_create_revision != 0
            || self.max_create_revision != 0
    }

    /// Whether the answer is the range's first keys in ascending key order
    /// (no filter; no sort, or ascending by key, clientv3's
    /// `WithFirstKey`): then a limit needs only its first `limit + 1` keys
    /// read, whatever etcd fetches (the answer is the same).
    fn in_key_order(&self) -> bool {
        !self.filters()
            && self.sort_target == SortTarget::Key
            && self.sort_order != SortOrder::Descend
    }
}

/// A key as a range returns it (etcd's `mvccpb.KeyValue`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct KeyValue {
    /// The key.
    #[serde(with = "serde_bytes")]
    pub key: Vec<u8>,
    /// The value (empty for a keys-only read).
    #[serde(with = "serde_bytes")]
    pub value: Vec<u8>,
    /// Revision of the write that created the key.
    pub create_revision: u64,
    /// Revision of the write that last changed it.
    pub mod_revision: u64,
    /// Changes since creation: 1 on create.
    pub version: u64,
    /// The lease the key is attached to; 0 = none.
    pub lease: u64,
}

impl KeyValue {
    /// A key, its value and its revisions.
    pub(crate) fn from_meta(key: Vec<u8>, value: Vec<u8>, meta: &KeyMeta) -> KeyValue {
        KeyValue {
            key,
            value,
            create_revision: meta.create_revision,
            mod_revision: meta.mod_revision,
            version: meta.version,
            lease: meta.lease,
        }
    }
}

/// What a range read found (etcd's `RangeResponse`, without its header).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct RangeResult {
    /// The keys, in the order asked for (empty for a count-only read).
    pub kvs: Vec<KeyValue>,
    /// Whether keys were left out by the limit.
    pub more: bool,
    /// Keys in the range, before the revision filters and the limit.
    pub count: u64,
}

/// Why a range read was refused or failed.
#[derive(Debug, thiserror::Error)]
pub enum RangeError {
    /// The range's `key` is empty.
    #[error("etcdserver: key is not provided (field `key` is empty)")]
    KeyEmpty,
    /// The range's `key` is one of the node's own.
    #[error("key {} starts with the reserved prefix RESERVED_KEY_PREFIX", shown(.key))]
    ReservedKey {
        /// The key.
        key: Vec<u8>,
    },
    /// `revision` is above the store revision (etcd's `ErrFutureRev`).
    #[error(
        "mvcc: required revision is a future revision: field `revision` is {requested}, \
         the store revision is {current}"
    )]
    FutureRevision {
        /// The revision asked for.
        requested: u64,
        /// The store revision.
        current: u64,
    },
    /// A range inside a transaction names a revision below the store
    /// revision: a transaction reads its own revision only.
    #[error(
        "field `revision` is {requested}, below the store revision {current}: a range inside \
         a transaction reads the current revision (leave `revision` 0)"
    )]
    PastRevision {
        /// The revision asked for.
        requested: u64,
        /// The store revision.
        current: u64,
    },
    /// The revision is outside the change history's window.
    #[error(transparent)]
    History(#[from] HistoryError),
    /// A record the history named kept moving under the read.
    #[error(
        "merges kept moving the records of revision {revision} under the read for \
         {HISTORY_READ_WAIT_MAX:?} (the limit HISTORY_READ_WAIT_MAX)"
    )]
    HistoryUnstable {
        /// The revision read.
        revision: u64,
    },
    /// The read would count more keys than its budget allows.
    #[error("the read counts more than {max} keys (the limit {limit})")]
    TooManyCounted {
        /// The limit's name.
        limit: &'static str,
        /// Its value.
        max: usize,
    },
    /// The read would visit more keys than its budget allows.
    #[error("the read visits more than {max} keys (the limit {limit})")]
    TooManyKeys {
        /// The limit's name.
        limit: &'static str,
        /// Its value.
        max: usize,
    },
    /// The read would visit or return more bytes than its budget allows.
    #[error(
        "the read visits or returns more than {max} bytes of keys and values (the limit {limit})"
    )]
    TooManyBytes {
        /// The limit's name.
        limit: &'static str,
        /// Its value.
        max: usize,
    },
    /// A key changed between the pass over the key directory and the read
    /// of its value: an entry applied meanwhile. [`range`] starts over; in
    /// the apply, where nothing else writes, it is an inconsistent engine.
    #[error("key {} changed while it was read", shown(.key))]
    KeyChanged {
        /// The key.
        key: Vec<u8>,
    },
    /// A transaction read outside the log ([`crate::read_txn::read_txn`])
    /// holds an op that writes.
    #[error("the op writes: only a transaction whose ops are all ranges is read outside the log")]
    NotARead,
    /// [`range`] found keys changing under it on every attempt.
    #[error(
        "entries kept applying under the read: {RANGE_READ_ATTEMPTS_MAX} attempts (the limit RANGE_READ_ATTEMPTS_MAX) saw a key change"
    )]
    Unstable,
    /// The engine failed.
    #[error("engine: {0}")]
    Engine(#[from] bitcask::Error),
    /// A key's revision metadata does not decode.
    #[error(transparent)]
    Revision(#[from] RevisionError),
}

/// Reads `spec` from the engine alone, at cluster time `now_ms`, when the
/// store revision is `store_revision` (what [`crate::apply::Applier`]
/// publishes; a `spec.revision` other than 0 or this is refused), within
/// [`RANGE_KEYS_MAX`] and [`RANGE_READ_BYTES_MAX`].
///
/// The keys and their revisions come from one pass over the key directory
/// (one consistent state), except that a range spanning the reserved keys
/// takes one pass each side of them. Values are read after: if an entry
/// changed one of the keys meanwhile, the read starts over, at most
/// [`RANGE_READ_ATTEMPTS_MAX`] times.
pub fn range(
    engine: &Engine,
    spec: &RangeSpec,
    now_ms: u64,
    store_revision: u64,
) -> Result<RangeResult, RangeError> {
    for _ in 0..RANGE_READ_ATTEMPTS_MAX {
        let mut budget = Budget::new(
            ("RANGE_KEYS_MAX", RANGE_KEYS_MAX),
            ("RANGE_READ_BYTES_MAX", RANGE_READ_BYTES_MAX),
        )
        .counting(("RANGE_COUNT_KEYS_MAX", RANGE_COUNT_KEYS_MAX));
        match evaluate(engine, None, spec, now_ms, store_revision, &mut budget) {
            Err(RangeError::KeyChanged { .. }) => continue,
            other => return other,
        }
    }
    Err(RangeError::Unstable)
}

/// Reads `spec` at `spec.revision` (not 0), at or below the store revision
/// and within the change history's window (else [`RangeError::History`]),
/// within [`RANGE_KEYS_MAX`] and [`RANGE_READ_BYTES_MAX`]. `engine` gives
/// the engine the history describes: it is called under the history's read
/// lock, which a snapshot install takes to switch both.
///
/// The read holds the history's read lock throughout, so no entry applies
/// meanwhile: keys the history holds read as they were at the revision
/// (their records read by location), the others as they are now, TTLs not
/// judged (an expired key is there until its expiry delete, which has a
/// revision). At the store revision itself, expiry is judged at `now_ms`,
/// as [`range`] does. A merge that moved a record makes it start over, for
/// at most [`HISTORY_READ_WAIT_MAX`].
pub fn range_at(
    engine: impl Fn() -> Arc<Engine>,
    history: &RwLock<History>,
    spec: &RangeSpec,
    now_ms: u64,
) -> Result<RangeResult, RangeError> {
    let revision = spec.revision;
    let current = RangeSpec {
        revision: 0,
        ..spec.clone()
    };
    let mut wait = HISTORY_RETRY_WAIT;
    let deadline = std::time::Instant::now() + HISTORY_READ_WAIT_MAX;
    loop {
        let attempt = {
            let history = history.read().unwrap_or_else(PoisonError::into_inner);
            history.check(revision)?;
            let engine = engine();
            // At the store revision, expiry is judged as a current read
            // judges it; below it, not at all ("now" 0).
            let now_ms = if revision == history.revision() {
                now_ms
            } else {
                0
            };
            let overlay = history.overlay(&engine, revision, now_ms);
            let mut budget = Budget::new(
                ("RANGE_KEYS_MAX", RANGE_KEYS_MAX),
                ("RANGE_READ_BYTES_MAX", RANGE_READ_BYTES_MAX),
            )
            .counting(("RANGE_COUNT_KEYS_MAX", RANGE_COUNT_KEYS_MAX));
            evaluate(&engine, Some(&overlay), &current, now_ms, 0, &mut budget)
        };
        match attempt {
            Err(RangeError::Engine(bitcask::Error::LocationGone { .. }))
                if std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(wait);
                wait = (wait * 2).min(HISTORY_RETRY_WAIT_MAX);
            }
            Err(RangeError::Engine(bitcask::Error::LocationGone { .. })) => {
                return Err(RangeError::HistoryUnstable { revision });
            }
            other => return other,
        }
    }
}

/// What reads may still cost: keys visited, keys counted without being
/// visited (a range's `count` past its limit), and bytes of keys visited
/// and values returned, each with the name and value of its limit for
/// errors.
#[derive(Clone, Debug)]
pub(crate) struct Budget {
    keys_left: usize,
    keys_limit: (&'static str, usize),
    counted_left: usize,
    counted_limit: (&'static str, usize),
    /// Whether every key counted is charged, or only those a count walked
    /// (see [`Budget::new`]).
    charges_every_count: bool,
    bytes_left: usize,
    bytes_limit: (&'static str, usize),
}

impl Budget {
    /// A budget of `keys` keys and `bytes` bytes, each `(name, value)`,
    /// that counts as many keys as it visits, charging every key counted:
    /// the apply's, whose refusals must follow from the log alone (whether
    /// a count walks depends on the member's own key directory: see
    /// `bitcask::Engine::scan_counted`).
    pub(crate) fn new(keys: (&'static str, usize), bytes: (&'static str, usize)) -> Budget {
        Budget {
            keys_left: keys.1,
            keys_limit: keys,
            counted_left: keys.1,
            counted_limit: keys,
            charges_every_count: true,
            bytes_left: bytes.1,
            bytes_limit: bytes,
        }
    }

    /// The budget of a read outside the log: it walks up to `counted` keys,
    /// `(name, value)`, to count them, and charges only keys walked (a
    /// count from the key directory's order costs nothing per key).
    pub(crate) fn counting(self, counted: (&'static str, usize)) -> Budget {
        Budget {
            counted_left: counted.1,
            counted_limit: counted,
            charges_every_count: false,
            ..self
        }
    }

    fn too_many_counted(&self) -> RangeError {
        RangeError::TooManyCounted {
            limit: self.counted_limit.0,
            max: self.counted_limit.1,
        }
    }

    fn too_many_keys(&self) -> RangeError {
        RangeError::TooManyKeys {
            limit: self.keys_limit.0,
            max: self.keys_limit.1,
        }
    }

    fn take_keys(&mut self, keys: usize) -> Result<(), RangeError> {
        self.keys_left = self
            .keys_left
            .checked_sub(keys)
            .ok_or_else(|| self.too_many_keys())?;
        Ok(())
    }

    /// Bytes taken so far.
    pub(crate) fn bytes_used(&self) -> usize {
        self.bytes_limit.1 - self.bytes_left
    }

    pub(crate) fn take_bytes(&mut self, bytes: usize) -> Result<(), RangeError> {
        self.bytes_left = self
            .bytes_left
            .checked_sub(bytes)
            .ok_or(RangeError::TooManyBytes {
                limit: self.bytes_limit.0,
                max: self.bytes_limit.1,
            })?;
        Ok(())
    }
}

/// The keys a range, a compare or a delete names: from `start` (included)
/// to `end`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyBounds {
    start: Vec<u8>,
    end: Bound<Vec<u8>>,
}

impl KeyBounds {
    /// etcd's reading of a key and a range end: empty = `key` alone,
    /// `"\0"` = every key at or after `key`, otherwise `[key, range_end)`.
    pub fn new(key: &[u8], range_end: &[u8]) -> KeyBounds {
        let end = match range_end {
            [] => Bound::Included(key.to_vec()),
            [0] => Bound::Unbounded,
            end => Bound::Excluded(end.to_vec()),
        };
        KeyBounds {
            start: key.to_vec(),
            end,
        }
    }

    /// The first key within the bounds (the bounds are one interval).
    pub fn start(&self) -> &[u8] {
        &self.start
    }

    /// Whether `key` is within the bounds.
    pub fn contains(&self, key: &[u8]) -> bool {
        key >= self.start.as_slice() && below_end(key, &self.end)
    }

    /// The bounds without the reserved keys: none, one or two ranges, each
    /// non-empty, ascending.
    fn parts(&self) -> Vec<(Vec<u8>, Bound<Vec<u8>>)> {
        let mut parts = Vec::with_capacity(2);
        if self.start.as_slice() < RESERVED_KEY_PREFIX {
            let end = if below_end(RESERVED_KEY_PREFIX, &self.end) {
                Bound::Excluded(RESERVED_KEY_PREFIX.to_vec())
            } else {
                self.end.clone()
            };
            if !is_empty(&self.start, &end) {
                parts.push((self.start.clone(), end));
            }
        }
        let start = self.start.as_slice().max(RESERVED_KEY_END).to_vec();
        if !is_empty(&start, &self.end) {
            parts.push((start, self.end.clone()));
        }
        parts
    }
}

/// Whether `key` is before `end`.
fn below_end(key: &[u8], end: &Bound<Vec<u8>>) -> bool {
    match end {
        Bound::Included(end) => key <= end.as_slice(),
        Bound::Excluded(end) => key < end.as_slice(),
        Bound::Unbounded => true,
    }
}

/// Whether no key is at or after `start` and before `end`.
fn is_empty(start: &[u8], end: &Bound<Vec<u8>>) -> bool {
    !below_end(start, end)
}

/// A key as a layer of writes not yet in the engine holds it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Pending {
    /// Deleted (or expired).
    Deleted,
    /// Written, with these revisions.
    Written(KeyMeta),
}

/// Writes a read sees on top of the engine: those of earlier ops of the
/// entry being applied (and of the transaction being evaluated).
pub(crate) trait Overlay {
    /// The keys from `start` to `end` this overlay holds, ascending.
    fn changed(&self, start: &[u8], end: &Bound<Vec<u8>>) -> Vec<(Vec<u8>, Pending)>;
    /// The value of `key`, which [`Overlay::changed`] reported written.
    fn value(&self, key: &[u8]) -> Result<Vec<u8>, bitcask::Error>;
}

/// A key a read found present, before its value is read.
#[derive(Clone, Debug)]
pub(crate) struct Found {
    /// The key.
    pub(crate) key: Vec<u8>,
    /// Its revisions.
    pub(crate) meta: KeyMeta,
    /// Where its value is: the engine (at this sequence number), or the
    /// overlay.
    engine_seq: Option<u64>,
}

/// Every present key within `bounds`, ascending: the engine's under the
/// overlay's, reserved keys left out; charges `budget` one key and the
/// key's bytes for each.
pub(crate) fn visit(
    engine: &Engine,
    overlay: Option<&dyn Overlay>,
    bounds: &KeyBounds,
    now_ms: u64,
    budget: &mut Budget,
) -> Result<Vec<Found>, RangeError> {
    let mut found = Vec::new();
    for (start, end) in bounds.parts() {
        let changed = overlay.map_or_else(Vec::new, |overlay| overlay.changed(&start, &end));
        // One key past the budget tells that the budget is exceeded; each
        // deleted overlay key may hide one engine key.
        let room = budget.keys_left.saturating_sub(found.len());
        let scan = Scan {
            range: KeyRange::Range(Bound::Included(start), end),
            after: None,
            limit: room.saturating_add(deleted(&changed)).saturating_add(1),
            keys_only: true,
        };
        let stored = engine.scan(&scan, now_ms)?;
        merge(stored, changed, true, &mut found)?;
        if found.len() > budget.keys_left {
            return Err(budget.too_many_keys());
        }
    }
    budget.take_keys(found.len())?;
    budget.take_bytes(found.iter().map(|f| f.key.len()).sum())?;
    Ok(found)
}

/// The first `first` present keys within `bounds`, as [`visit`] finds
/// them, and the number of present keys in all of `bounds`: the engine's
/// counted in the same pass over the key directory that finds its first
/// keys (no record read), then each overlay key's word applied. Charges
/// `budget` as [`visit`] for the keys returned, and its count for every
/// key counted.
pub(crate) fn visit_first(
    engine: &Engine,
    overlay: Option<&dyn Overlay>,
    bounds: &KeyBounds,
    now_ms: u64,
    first: usize,
    budget: &mut Budget,
) -> Result<(Vec<Found>, u64), RangeError> {
    let mut found = Vec::new();
    let mut count = 0usize;
    for (start, end) in bounds.parts() {
        let changed = overlay.map_or_else(Vec::new, |overlay| overlay.changed(&start, &end));
        // No more than one key past the budget (which tells that it is
        // exceeded); each deleted overlay key may hide one engine key.
        let room = budget
            .keys_left
            .saturating_sub(found.len())
            .saturating_add(1);
        let wanted = first.saturating_sub(found.len()).min(room);
        let scan = Scan {
            range: KeyRange::Range(Bound::Included(start), end),
            after: None,
            limit: wanted.saturating_add(deleted(&changed)),
            keys_only: true,
        };
        // Each overlay key may take one engine key off the count.
        let walk_max = budget.counted_left.saturating_add(changed.len());
        let (stored, counted) = engine.scan_counted(&scan, now_ms, walk_max)?;
        let counted = counted.ok_or_else(|| budget.too_many_counted())?;
        // Each overlay key counts as the overlay says instead of as the
        // engine does (nothing applies meanwhile where there is an overlay:
        // the apply itself, or the history's read lock).
        let written = changed
            .iter()
            .filter(|(_, pending)| matches!(pending, Pending::Written(_)))
            .count();
        let in_engine = changed
            .iter()
            .filter(|(key, _)| engine.meta(key, now_ms).is_some())
            .count();
        let part = (counted.keys + written).saturating_sub(in_engine);
        count += part;
        if counted.walked || budget.charges_every_count {
            budget.counted_left = budget
                .counted_left
                .checked_sub(part)
                .ok_or_else(|| budget.too_many_counted())?;
        }
        if found.len() < first {
            let whole = stored.len() == counted.keys;
            merge(stored, changed, whole, &mut found)?;
        }
    }
    found.truncate(first);
    budget.take_keys(found.len())?;
    budget.take_bytes(found.iter().map(|f| f.key.len()).sum())?;
    Ok((found, count as u64))
}

/// Overlay keys that are deleted.
fn deleted(changed: &[(Vec<u8>, Pending)]) -> usize {
    changed
        .iter()
        .filter(|(_, pending)| *pending == Pending::Deleted)
        .count()
}

/// Appends to `found` the engine's keys `stored` (ascending) under the
/// overlay's `changed` (ascending; the overlay's word wins). When `whole`
/// is false the engine had more keys past the last of `stored`, so
/// overlay keys past it are left out (which engine keys lie between is
/// not known).
fn merge(
    stored: Vec<bitcask::Entry>,
    changed: Vec<(Vec<u8>, Pending)>,
    whole: bool,
    found: &mut Vec<Found>,
) -> Result<(), RangeError> {
    let last = if whole {
        None
    } else {
        stored.last().map(|entry| entry.key.clone())
    };
    let mut changed = changed.into_iter().peekable();
    for entry in stored {
        // The overlay's keys up to this one; the overlay's word wins.
        let mut shadowed = false;
        while let Some((key, pending)) = changed.next_if(|(key, _)| *key <= entry.key) {
            shadowed = key == entry.key;
            if let Pending::Written(meta) = pending {
                found.push(Found {
                    key,
                    meta,
                    engine_seq: None,
                });
            }
        }
        if !shadowed {
            found.push(Found {
                meta: KeyMeta::decode(&entry.meta)?,
                key: entry.key,
                engine_seq: Some(entry.seq),
            });
        }
    }
    for (key, pending) in changed {
        if last.as_ref().is_some_and(|last| key > *last) {
            break;
        }
        if let Pending::Written(meta) = pending {
            found.push(Found {
                key,
                meta,
                engine_seq: None,
            });
        }
    }
    Ok(())
}

/// The value of a key [`visit`] found, charged to `budget`.
fn read_value(
    engine: &Engine,
    overlay: Option<&dyn Overlay>,
    found: &Found,
    now_ms: u64,
    budget: &mut Budget,
) -> Result<Vec<u8>, RangeError> {
    let value = match found.engine_seq {
        Some(seq) => match engine.get(&found.key, now_ms)? {
            Some(item) if item.seq == seq => item.value,
            _ => {
                return Err(RangeError::KeyChanged {
                    key: found.key.clone(),
                });
            }
        },
        None => overlay
            .expect("a key found in an overlay was visited with that overlay")
            .value(&found.key)?,
    };
    budget.take_bytes(value.len())?;
    Ok(value)
}

/// The keys [`visit`] found as [`KeyValue`]s, with their values when
/// `with_values` (charged to `budget`), else with empty ones.
pub(crate) fn key_values(
    engine: &Engine,
    overlay: Option<&dyn Overlay>,
    found: Vec<Found>,
    with_values: bool,
    now_ms: u64,
    budget: &mut Budget,
) -> Result<Vec<KeyValue>, RangeError> {
    found
        .into_iter()
        .map(|found| {
            let value = if with_values {
                read_value(engine, overlay, &found, now_ms, budget)?
            } else {
                Vec::new()
            };
            Ok(KeyValue::from_meta(found.key, value, &found.meta))
        })
        .collect()
}

/// Checks a read's `revision` against the store revision `current`: 0 and
/// `current` are served, anything else is refused.
pub(crate) fn check_revision(requested: u64, current: u64) -> Result<(), RangeError> {
    match requested {
        0 => Ok(()),
        requested if requested == current => Ok(()),
        requested if requested > current => Err(RangeError::FutureRevision { requested, current }),
        requested => Err(RangeError::PastRevision { requested, current }),
    }
}

/// Evaluates `spec` against the engine under `overlay`, at cluster time
/// `now_ms`, when the store revision is `store_revision`, within `budget`:
/// etcd's order of work (see the module documentation).
pub(crate) fn evaluate(
    engine: &Engine,
    overlay: Option<&dyn Overlay>,
    spec: &RangeSpec,
    now_ms: u64,
    store_revision: u64,
    budget: &mut Budget,
) -> Result<RangeResult, RangeError> {
    if spec.key.is_empty() {
        return Err(RangeError::KeyEmpty);
    }
    if spec.key.starts_with(RESERVED_KEY_PREFIX) {
        return Err(RangeError::ReservedKey {
            key: spec.key.clone(),
        });
    }
    check_revision(spec.revision, store_revision)?;
    let bounds = KeyBounds::new(&spec.key, &spec.range_end);
    // 0 = no limit; a limit past the address space is no limit either.
    let limit = usize::try_from(spec.limit).unwrap_or(0);
    if spec.count_only {
        let (_, count) = visit_first(engine, overlay, &bounds, now_ms, 0, budget)?;
        return Ok(RangeResult {
            kvs: Vec::new(),
            more: false,
            count,
        });
    }
    // Only the first `limit + 1` keys are needed when they come in the
    // answer's order (one past the limit tells `more`); the rest are
    // counted, not visited.
    let (mut found, count) = if spec.in_key_order() && limit > 0 {
        visit_first(
            engine,
            overlay,
            &bounds,
            now_ms,
            limit.saturating_add(1),
            budget,
        )?
    } else {
        let found = visit(engine, overlay, &bounds, now_ms, budget)?;
        let count = found.len() as u64;
        (found, count)
    };
    if !spec.fetches_all() && limit > 0 {
        found.truncate(limit.saturating_add(1));
    }
    let bound = |bound: u64, keep: bool| bound == 0 || keep;
    found.retain(|f| {
        bound(
            spec.max_mod_revision,
            f.meta.mod_revision <= spec.max_mod_revision,
        ) && bound(
            spec.min_mod_revision,
            f.meta.mod_revision >= spec.min_mod_revision,
        ) && bound(
            spec.max_create_revision,
            f.meta.create_revision <= spec.max_create_revision,
        ) && bound(
            spec.min_create_revision,
            f.meta.create_revision >= spec.min_create_revision,
        )
    });
    // etcd: no order with a target other than the key means ascending; the
    // keys already come in ascending key order.
    let order = match (spec.sort_order, spec.sort_target) {
        (SortOrder::None, SortTarget::Key) | (SortOrder::Ascend, SortTarget::Key) => {
            SortOrder::None
        }
        (SortOrder::None, _) => SortOrder::Ascend,
        (order, _) => order,
    };
    let mut rows: Vec<(Found, Option<Vec<u8>>)> = Vec::with_capacity(found.len());
    let by_value = order != SortOrder::None && spec.sort_target == SortTarget::Value;
    for found in found {
        let value = if by_value {
            Some(read_value(engine, overlay, &found, now_ms, budget)?)
        } else {
            None
        };
        rows.push((found, value));
    }
    if order != SortOrder::None {
        let target = spec.sort_target;
        // Stable: keys that tie stay in ascending key order either way.
        rows.sort_by(|a, b| {
            let ordering = compare_by(target, a, b);
            if order == SortOrder::Descend {
                ordering.reverse()
            } else {
                ordering
            }
        });
    }
    let more = limit > 0 && rows.len() > limit;
    if more {
        rows.truncate(limit);
    }
    let mut kvs = Vec::with_capacity(rows.len());
    for (found, value) in rows {
        let value = match (spec.keys_only, value) {
            (true, _) => Vec::new(),
            (false, Some(value)) => value,
            (false, None) => read_value(engine, overlay, &found, now_ms, budget)?,
        };
        kvs.push(KeyValue::from_meta(found.key, value, &found.meta));
    }
    Ok(RangeResult { kvs, more, count })
}

/// How two rows compare by `target` (values are read when sorting by value).
fn compare_by(
    target: SortTarget,
    (a, a_value): &(Found, Option<Vec<u8>>),
    (b, b_value): &(Found, Option<Vec<u8>>),
) -> Ordering {
    match target {
        SortTarget::Key => a.key.cmp(&b.key),
        SortTarget::Version => a.meta.version.cmp(&b.meta.version),
        SortTarget::Create => a.meta.create_revision.cmp(&b.meta.create_revision),
        SortTarget::Mod => a.meta.mod_revision.cmp(&b.meta.mod_revision),
        SortTarget::Value => a_value.cmp(b_value),
    }
}

/// A key for an error message: lossy UTF-8, cut at [`KEY_SHOWN_BYTES_MAX`].
pub(crate) fn shown(key: &[u8]) -> String {
    let cut = &key[..key.len().min(KEY_SHOWN_BYTES_MAX)];
    let more = if cut.len() < key.len() { "…" } else { "" };
    format!("{:?}{more}", String::from_utf8_lossy(cut))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn excluded(end: &[u8]) -> Bound<Vec<u8>> {
        Bound::Excluded(end.to_vec())
    }

    /// An engine on the in-memory disk holding `k0`..`k9`, `k9` with a TTL
    /// when `expiring` (so a count at a clock above 0 walks the keys), and
    /// its store revision.
    fn ten_keys(expiring: bool) -> (Engine, u64) {
        use crate::apply::Applier;
        use crate::command::{Command, Op, Proposal, Request};
        let options = bitcask::Options {
            sync: bitcask::SyncPolicy::Never,
            auto_merge: None,
            vfs: Arc::new(vfs::sim::SimFs::new()),
            ..bitcask::Options::default()
        };
        let engine = Engine::open("/sm", options).unwrap();
        let puts = (0..10)
            .map(|i| Request {
                session: None,
                conditions: Vec::new(),
                ops: vec![Op::Put {
                    key: format!("k{i}").into_bytes(),
                    value: b"v".to_vec(),
                    ttl_ms: if expiring && i == 9 { 1_000_000 } else { 0 },
                }],
            })
            .collect();
        let proposal = Proposal {
            time_ms: 0,
            command: Command::Writes(puts),
        };
        let revision = Applier::default()
            .apply(&engine, 1, &proposal, Vec::new())
            .unwrap()
            .revision;
        (engine, revision)
    }

    fn limit_one() -> RangeSpec {
        RangeSpec {
            limit: 1,
            ..RangeSpec::between("k", "l")
        }
    }

    #[test]
    fn a_count_past_the_budget_is_refused_naming_its_limit() {
        let (engine, revision) = ten_keys(true);
        let spec = limit_one();
        let budget =
            |counted| Budget::new(("KEYS", 100), ("BYTES", 1 << 20)).counting(("COUNTED", counted));
        let read = |counted| evaluate(&engine, None, &spec, 1, revision, &mut budget(counted));
        assert_eq!(read(10).unwrap().count, 10);
        let error = read(9).unwrap_err();
        assert!(
            matches!(
                error,
                RangeError::TooManyCounted {
                    limit: "COUNTED",
                    max: 9
                }
            ),
            "{error}"
        );
        assert!(error.to_string().contains("COUNTED"), "{error}");
        // A count that needs no walk (a clock of 0: nothing expires) is
        // not charged to a read's budget.
        let unwalked = evaluate(&engine, None, &spec, 0, revision, &mut budget(1));
        assert_eq!(unwalked.unwrap().count, 10);
    }

    /// The apply's budget charges every key counted, walked or not: two
    /// members holding the same keys, one whose key directory makes its
    /// count walk (a key with a TTL) and one whose does not, refuse or
    /// answer alike.
    #[test]
    fn the_apply_charges_a_count_whether_or_not_it_walks() {
        let spec = limit_one();
        let count_only = RangeSpec {
            count_only: true,
            ..limit_one()
        };
        for expiring in [false, true] {
            let (engine, revision) = ten_keys(expiring);
            for spec in [&spec, &count_only] {
                let mut tight = Budget::new(("KEYS", 9), ("BYTES", 1 << 20));
                let error = evaluate(&engine, None, spec, 1, revision, &mut tight).unwrap_err();
                assert!(
                    matches!(error, RangeError::TooManyCounted { limit: "KEYS", .. }),
                    "expiring {expiring}: {error}"
                );
                let mut enough = Budget::new(("KEYS", 10), ("BYTES", 1 << 20));
                let read = evaluate(&engine, None, spec, 1, revision, &mut enough).unwrap();
                assert_eq!(read.count, 10, "expiring {expiring}");
            }
        }
    }

    /// A limit far past the keys a read may visit visits no more than one
    /// key past them before it is refused naming the limit.
    #[test]
    fn a_huge_limit_is_held_to_the_visit_budget() {
        let (engine, revision) = ten_keys(false);
        let spec = RangeSpec {
            limit: 1 << 40,
            ..RangeSpec::between("k", "l")
        };
        let mut budget = Budget::new(("KEYS", 3), ("BYTES", 1 << 20)).counting(("COUNTED", 100));
        let error = evaluate(&engine, None, &spec, 0, revision, &mut budget).unwrap_err();
        assert!(
            matches!(error, RangeError::TooManyKeys { limit: "KEYS", .. }),
            "{error}"
        );
        let found = visit_first(
            &engine,
            None,
            &KeyBounds::new(b"k", b"l"),
            0,
            usize::MAX,
            &mut Budget::new(("KEYS", 3), ("BYTES", 1 << 20)).counting(("COUNTED", 100)),
        );
        assert!(matches!(found, Err(RangeError::TooManyKeys { .. })));
        let mut roomy = Budget::new(("KEYS", 100), ("BYTES", 1 << 20)).counting(("COUNTED", 100));
        let whole = evaluate(&engine, None, &spec, 0, revision, &mut roomy).unwrap();
        assert_eq!((whole.kvs.len(), whole.count, whole.more), (10, 10, false));
    }

    #[test]
    fn the_reserved_end_follows_every_reserved_key() {
        let mut end = RESERVED_KEY_PREFIX.to_vec();
        let last = end.pop().unwrap();
        end.push(last + 1);
        assert_eq!(end, RESERVED_KEY_END);
    }

    #[test]
    fn range_ends_read_as_etcd_reads_them() {
        let single = KeyBounds::new(b"k", b"");
        assert!(single.contains(b"k"));
        assert!(!single.contains(b"k\0"));
        let from = KeyBounds::new(b"k", b"\0");
        assert!(from.contains(b"k") && from.contains(b"zzz") && !from.contains(b"j"));
        let all = KeyBounds::new(b"\0", b"\0");
        assert!(all.contains(b"\0") && all.contains(&[0xff; 9]));
        let between = KeyBounds::new(b"a", b"c");
        assert!(between.contains(b"b") && !between.contains(b"c"));
        // An end at or before the key: nothing.
        assert!(KeyBounds::new(b"c", b"a").parts().is_empty());
        assert!(KeyBounds::new(b"c", b"c").parts().is_empty());
    }

    #[test]
    fn parts_go_around_the_reserved_keys() {
        let all = KeyBounds::new(b"\0", b"\0");
        assert_eq!(
            all.parts(),
            vec![
                (b"\0".to_vec(), excluded(RESERVED_KEY_PREFIX)),
                (RESERVED_KEY_END.to_vec(), Bound::Unbounded),
            ]
        );
        assert_eq!(
            KeyBounds::new(b"a", b"b").parts(),
            vec![(b"a".to_vec(), excluded(b"b"))]
        );
        // A range inside the reserved keys: nothing.
        let inside = [RESERVED_KEY_PREFIX, b"a"].concat();
        assert!(
            KeyBounds::new(&inside, &[RESERVED_KEY_PREFIX, b"z"].concat())
                .parts()
                .is_empty()
        );
        // A range ending inside them stops before them.
        assert_eq!(
            KeyBounds::new(b"a", &inside).parts(),
            vec![(b"a".to_vec(), excluded(RESERVED_KEY_PREFIX))]
        );
        // A single key that is not reserved stays itself.
        assert_eq!(
            KeyBounds::new(&[0xff, 0xff, b's'], b"").parts(),
            vec![(
                vec![0xff, 0xff, b's'],
                Bound::Included(vec![0xff, 0xff, b's'])
            )]
        );
    }

    #[test]
    fn revisions_other_than_the_current_one_are_refused_by_name() {
        assert!(check_revision(0, 9).is_ok());
        assert!(check_revision(9, 9).is_ok());
        let future = check_revision(10, 9).unwrap_err().to_string();
        assert!(
            future.contains("future revision") && future.contains("10") && future.contains('9'),
            "{future}"
        );
        assert!(matches!(
            check_revision(3, 9),
            Err(RangeError::PastRevision {
                requested: 3,
                current: 9
            })
        ));
    }

    #[test]
    fn long_keys_are_cut_in_messages() {
        assert_eq!(shown(b"k"), "\"k\"");
        let long = shown(&[b'x'; 100]);
        assert!(long.ends_with('…') && long.len() < 100, "{long}");
    }
}
