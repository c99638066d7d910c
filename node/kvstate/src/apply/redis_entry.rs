//! Applying Redis requests ([`crate::redis`]) inside an entry, and the
//! per-entry housekeeping of hashes.
//!
//! A request runs its commands over a [`RequestStore`]: reads see the
//! engine, the entry's earlier writes (its overlay and batch) and the
//! request's own staged writes; writes are staged, one record per key
//! (a key written twice keeps its first place), as a transaction's are.
//! When every command has run, the staged writes move into the batch at
//! one revision (none if there are none) — or, if they would not fit the
//! entry (`ENTRY_OPS_MAX`, `TXN_ENTRY_BATCH_BYTES_MAX`) or a read passed
//! its budget, the request is refused whole, naming the limit.

use std::collections::BTreeMap;
use std::ops::Bound;

use super::{ApplyError, EntryWrite, KeyState, SESSION_EVICTIONS_PER_ENTRY_MAX, Staged};
use crate::command::{ENTRY_OPS_MAX, Outcome, RESERVED_KEY_PREFIX};
use crate::redis::{
    CLEANUP_RECORDS_PER_ENTRY_MAX, Fault, Found, HASH_DEAD_TAG, HASH_EXPIRY_TAG, HashHead,
    RedisAnswer, RedisRequest, Store, dead_key, execute, field_prefix, malformed_marker,
    marker_key, prefix_end, watched_revision,
};
use crate::revision::{KeyMeta, tombstone_meta};
use crate::txn::{TXN_ENTRY_BATCH_BYTES_MAX, TXN_READ_BYTES_MAX, TXN_READ_KEYS_MAX};

/// Keys read from the engine per page while merging a key range with the
/// entry's writes.
const MERGE_PAGE_KEYS: usize = 1024;

impl EntryWrite<'_> {
    /// Applies one Redis request: its replies, `WatchFailed`, or
    /// `Rejected` naming the limit it would pass (nothing written).
    pub(super) fn evaluate_redis(&mut self, request: &RedisRequest) -> Result<Outcome, ApplyError> {
        let batched_bytes = self.batch_bytes();
        let mut store = RequestStore::new(self, batched_bytes);
        for (key, seen) in &request.watched {
            match watched_revision(&mut store, key) {
                Ok(current) if current == *seen => {}
                Ok(_) => return Ok(Outcome::Redis(RedisAnswer::WatchFailed)),
                Err(fault) => return refused_or_failed(fault),
            }
        }
        let mut replies = Vec::with_capacity(request.commands.len());
        for command in &request.commands {
            match execute(&mut store, command) {
                Ok(reply) => replies.push(reply),
                Err(fault) => return refused_or_failed(fault),
            }
        }
        let RequestStore {
            staged, read_bytes, ..
        } = store;
        let writes = staged.writes.len();
        if writes > 0 {
            // Room beside the entry's records, its lease and session
            // records and the idle-session evictions, as for a request.
            let batched = self.batch.ops.len()
                + self.leases.pending_records()
                + self.touched_sessions.len()
                + 1
                + SESSION_EVICTIONS_PER_ENTRY_MAX;
            if batched + writes >= ENTRY_OPS_MAX {
                return Ok(Outcome::Rejected {
                    reason: format!(
                        "the request writes {writes} records, which beside the {batched} its \
                         entry holds or keeps room for would pass ENTRY_OPS_MAX ({ENTRY_OPS_MAX}); \
                         nothing was applied"
                    ),
                });
            }
            let revision = self.revision + 1;
            for (key, state) in staged.writes {
                // A string's old TTL leaves the expiry index; a hash
                // marker's TTL never enters it (the housekeeping below
                // expires hashes, through their expiry records).
                if let KeyState::Present { expiry_ms, .. } = self.state_of(&key)?
                    && expiry_ms != 0
                {
                    self.expiries.remove(&(expiry_ms, key.clone()));
                }
                let reserved_expiry = match &state {
                    KeyState::Present { expiry_ms, .. } if key.starts_with(RESERVED_KEY_PREFIX) => {
                        *expiry_ms
                    }
                    _ => 0,
                };
                self.write_staged(key.clone(), state, revision)?;
                if reserved_expiry != 0 {
                    self.expiries.remove(&(reserved_expiry, key));
                }
            }
            self.revision = revision;
        }
        self.txn_read_bytes_left = self.txn_read_bytes_left.saturating_sub(read_bytes);
        Ok(Outcome::Redis(RedisAnswer::Replies(replies)))
    }

    /// The housekeeping of hashes, after the entry's requests and in the
    /// room they left (at most [`CLEANUP_RECORDS_PER_ENTRY_MAX`] records):
    /// deletes the marker of each hash whose TTL ran out (in expiry
    /// order), then the fields of dead hashes (in id order). No revision:
    /// readers already see such a hash as absent.
    ///
    /// Skipped when the store holds no expiry or dead record: the last
    /// pass found none (`hash_records` false) and this entry wrote none.
    pub(super) fn redis_cleanup(&mut self) -> Result<(), ApplyError> {
        let expiries = [RESERVED_KEY_PREFIX, HASH_EXPIRY_TAG].concat();
        let deads = [RESERVED_KEY_PREFIX, HASH_DEAD_TAG].concat();
        if !self.hash_records
            && !self.overlay_holds_prefix(&expiries)
            && !self.overlay_holds_prefix(&deads)
        {
            return Ok(());
        }
        // Each loop says whether it stopped for want of records.
        let (mut expiries_done, mut deads_done) = (false, false);
        let reserved = self.batch.ops.len()
            + self.leases.pending_records()
            + self.touched_sessions.len()
            + 1
            + SESSION_EVICTIONS_PER_ENTRY_MAX;
        let mut budget =
            CLEANUP_RECORDS_PER_ENTRY_MAX.min(ENTRY_OPS_MAX.saturating_sub(reserved + 1));
        let expiries_end = prefix_end(&expiries);
        // Each expired hash: its marker, its expiry record, a dead record.
        while budget >= 3 {
            let Some(record) = self
                .merged_keys(&expiries, expiries_end.as_deref(), None, 1)?
                .pop()
            else {
                expiries_done = true;
                break;
            };
            let Some((expiry_ms, key)) = record[expiries.len()..]
                .split_first_chunk::<8>()
                .map(|(expiry, key)| (u64::from_be_bytes(*expiry), key.to_vec()))
            else {
                return Err(corrupt(&record, "a hash expiry record's key is cut short"));
            };
            if expiry_ms > self.now_ms {
                break;
            }
            let id_bytes = self.value_of(&record, None)?;
            let Ok(id) = <[u8; 8]>::try_from(id_bytes.as_slice()).map(u64::from_be_bytes) else {
                return Err(corrupt(
                    &record,
                    "a hash expiry record's value is not an id",
                ));
            };
            // The marker goes only if it is still this hash at this
            // expiry: a hash written over it since has its own record.
            let marker = marker_key(&key);
            if self.raw_expiry(&marker)? == Some(expiry_ms) {
                let value = self.raw_value(&marker)?;
                let head = HashHead::decode(&value)
                    .ok_or_else(|| fault_error(malformed_marker(&key, &value)))?;
                if head.id == id {
                    self.write_staged(marker, KeyState::Absent, self.revision)?;
                }
            }
            self.write_staged(record, KeyState::Absent, self.revision)?;
            self.write_reserved(dead_key(id))?;
            budget -= 3;
        }
        // Dead hashes' fields, then their dead records.
        let deads_end = prefix_end(&deads);
        while budget >= 2 {
            let Some(record) = self
                .merged_keys(&deads, deads_end.as_deref(), None, 1)?
                .pop()
            else {
                deads_done = true;
                break;
            };
            let Ok(id) = <[u8; 8]>::try_from(&record[deads.len()..]).map(u64::from_be_bytes) else {
                return Err(corrupt(&record, "a dead hash record's key is not an id"));
            };
            let prefix = field_prefix(id);
            let wanted = budget - 1;
            let fields = self.merged_keys(&prefix, prefix_end(&prefix).as_deref(), None, wanted)?;
            let done = fields.len() < wanted;
            budget -= fields.len();
            for field in fields {
                self.write_staged(field, KeyState::Absent, self.revision)?;
            }
            if !done {
                break;
            }
            self.write_staged(record, KeyState::Absent, self.revision)?;
            budget -= 1;
        }
        self.hash_records = !(expiries_done && deads_done);
        Ok(())
    }

    /// Whether this entry wrote (or deleted) a key starting with `prefix`.
    fn overlay_holds_prefix(&self, prefix: &[u8]) -> bool {
        self.overlay
            .range::<[u8], _>((Bound::Included(prefix), Bound::Unbounded))
            .next()
            .is_some_and(|(key, _)| key.starts_with(prefix))
    }

    /// Puts a bookkeeping record (empty value, no TTL) at no revision.
    fn write_reserved(&mut self, key: Vec<u8>) -> Result<(), ApplyError> {
        let state = KeyState::Present {
            seq: self.base + self.batch.ops.len() as u64,
            expiry_ms: 0,
            meta: KeyMeta::created(self.revision, 0),
            value: Some(Vec::new()),
        };
        self.write_staged(key, state, self.revision)
    }

    /// The expiry of `key`'s record, judged at no time (a TTL that ran
    /// out still counts): `None` if there is no record.
    fn raw_expiry(&self, key: &[u8]) -> Result<Option<u64>, ApplyError> {
        Ok(match self.overlay.get(key) {
            Some(KeyState::Present { expiry_ms, .. }) => Some(*expiry_ms),
            Some(KeyState::Absent) => None,
            None => self.engine.meta(key, 0).map(|item| item.expiry_ms),
        })
    }

    /// The value of a record [`EntryWrite::raw_expiry`] found, its TTL
    /// run out or not.
    fn raw_value(&self, key: &[u8]) -> Result<Vec<u8>, ApplyError> {
        if self.overlay.contains_key(key) {
            return Ok(self.written_value(key)?);
        }
        // "Now" 0: no TTL has run out.
        match self.engine.get(key, 0)? {
            Some(item) => Ok(item.value),
            None => Err(super::missing_value(key, "the engine").into()),
        }
    }

    /// Present keys of `[start, end)` after `after` as the entry sees them.
    fn merged_keys(
        &self,
        start: &[u8],
        end: Option<&[u8]>,
        after: Option<&[u8]>,
        limit: usize,
    ) -> Result<Vec<Vec<u8>>, ApplyError> {
        let mut store = RequestStore::new(self, 0);
        store.keys(start, end, after, limit).map_err(fault_error)
    }
}

/// A fault of a request: a limit refuses it (nothing applied); anything
/// else stops the apply.
fn refused_or_failed(fault: Fault) -> Result<Outcome, ApplyError> {
    match fault {
        Fault::Limit(reason) => Ok(Outcome::Rejected { reason }),
        fault => Err(fault_error(fault)),
    }
}

fn fault_error(fault: Fault) -> ApplyError {
    match fault {
        Fault::Engine(error) => ApplyError::Engine(error),
        Fault::Revision(error) => ApplyError::Revision(error),
        // Not reachable from the entry's store, which writes and never
        // sees a key change under it; an inconsistent engine if it were.
        Fault::Limit(reason) => corrupt_reason(reason),
        Fault::ReadOnly => corrupt_reason("a write through a store that only reads".to_string()),
        Fault::Changed => corrupt_reason("a key changed under the apply".to_string()),
    }
}

fn corrupt(key: &[u8], what: &str) -> ApplyError {
    corrupt_reason(format!("{what}: {}", crate::range::shown(key)))
}

fn corrupt_reason(reason: String) -> ApplyError {
    ApplyError::Engine(bitcask::Error::Corruption {
        file: String::new(),
        offset: 0,
        reason,
    })
}

impl From<ApplyError> for Fault {
    fn from(error: ApplyError) -> Fault {
        match error {
            ApplyError::Engine(error) => Fault::Engine(error),
            ApplyError::Revision(error) => Fault::Revision(error),
            other => Fault::Engine(bitcask::Error::Corruption {
                file: String::new(),
                offset: 0,
                reason: other.to_string(),
            }),
        }
    }
}

/// What a Redis request reads and writes through: the entry so far, and
/// the request's staged writes on top.
struct RequestStore<'v, 'e> {
    entry: &'v EntryWrite<'e>,
    staged: Staged,
    /// The revision the request's writes take.
    revision: u64,
    /// Bytes of the entry's batch before the request.
    batched_bytes: usize,
    /// Bytes of the records staged (a key staged again counts once).
    staged_bytes: usize,
    keys_left: usize,
    /// The read budget: the request's, or what is left of the entry's.
    bytes_limit: (&'static str, usize),
    read_bytes: usize,
}

impl<'v, 'e> RequestStore<'v, 'e> {
    fn new(entry: &'v EntryWrite<'e>, batched_bytes: usize) -> RequestStore<'v, 'e> {
        let bytes_limit = if entry.txn_read_bytes_left < TXN_READ_BYTES_MAX {
            ("ENTRY_TXN_READ_BYTES_MAX", entry.txn_read_bytes_left)
        } else {
            ("TXN_READ_BYTES_MAX", TXN_READ_BYTES_MAX)
        };
        RequestStore {
            entry,
            staged: Staged::default(),
            revision: entry.revision + 1,
            batched_bytes,
            staged_bytes: 0,
            keys_left: TXN_READ_KEYS_MAX,
            bytes_limit,
            read_bytes: 0,
        }
    }

    fn is_present(&self, state: &KeyState) -> bool {
        matches!(state, KeyState::Present { expiry_ms, .. }
            if *expiry_ms == 0 || *expiry_ms > self.entry.now_ms)
    }

    fn stage(&mut self, key: Vec<u8>, state: KeyState, record_bytes: usize) -> Result<(), Fault> {
        // A key staged again replaces its record: the batch gets one.
        let replaced = match self.staged.get(&key) {
            Some(old) => self.record_bytes(&key, old),
            None => 0,
        };
        self.staged_bytes = self.staged_bytes - replaced + record_bytes;
        if self.batched_bytes + self.staged_bytes > TXN_ENTRY_BATCH_BYTES_MAX {
            return Err(Fault::Limit(format!(
                "the request's writes would take its entry's batch past \
                 TXN_ENTRY_BATCH_BYTES_MAX ({TXN_ENTRY_BATCH_BYTES_MAX}) bytes; nothing was applied"
            )));
        }
        self.staged.stage(key, state);
        Ok(())
    }
}

impl RequestStore<'_, '_> {
    /// Bytes of the record `state` stages for `key`.
    fn record_bytes(&self, key: &[u8], state: &KeyState) -> usize {
        match state {
            KeyState::Present { meta, value, .. } => bitcask::format::record_size(
                key.len(),
                value.as_ref().map_or(0, Vec::len),
                meta.encode().len(),
            ),
            KeyState::Absent => {
                bitcask::format::record_size(key.len(), 0, tombstone_meta(self.revision).len())
            }
        }
    }
}

impl Store for RequestStore<'_, '_> {
    fn now_ms(&self) -> u64 {
        self.entry.now_ms
    }

    fn find(&mut self, key: &[u8]) -> Result<Option<Found>, Fault> {
        if let Some(state) = self.staged.get(key) {
            return Ok(match state {
                KeyState::Present {
                    expiry_ms, meta, ..
                } if self.is_present(state) => Some(Found {
                    expiry_ms: *expiry_ms,
                    meta: *meta,
                }),
                _ => None,
            });
        }
        Ok(match self.entry.state_of(key)? {
            KeyState::Present {
                expiry_ms, meta, ..
            } => Some(Found { expiry_ms, meta }),
            KeyState::Absent => None,
        })
    }

    fn value(&mut self, key: &[u8]) -> Result<Vec<u8>, Fault> {
        match self.staged.get(key) {
            Some(KeyState::Present {
                value: Some(value), ..
            }) => Ok(value.clone()),
            Some(_) => Err(Fault::Engine(super::missing_value(
                key,
                "the request's writes",
            ))),
            None => Ok(self.entry.value_of(key, None)?),
        }
    }

    fn keys(
        &mut self,
        start: &[u8],
        end: Option<&[u8]>,
        after: Option<&[u8]>,
        limit: usize,
    ) -> Result<Vec<Vec<u8>>, Fault> {
        let lower = match after {
            Some(after) if after >= start => Bound::Excluded(after),
            _ => Bound::Included(start),
        };
        let upper = end.map_or(Bound::Unbounded, Bound::Excluded);
        let empty = match (lower, upper) {
            (_, Bound::Unbounded) => false,
            (Bound::Included(lower), Bound::Excluded(upper)) => lower >= upper,
            (Bound::Excluded(lower), Bound::Excluded(upper)) => lower >= upper,
            _ => false,
        };
        if empty || limit == 0 {
            return Ok(Vec::new());
        }
        // What the entry and the request changed in the range: present or not.
        let mut changes: BTreeMap<&[u8], bool> = BTreeMap::new();
        for (key, state) in self.entry.overlay.range::<[u8], _>((lower, upper)) {
            changes.insert(key.as_slice(), self.is_present(state));
        }
        for (key, &place) in self.staged.index.range::<[u8], _>((lower, upper)) {
            changes.insert(
                key.as_slice(),
                self.is_present(&self.staged.writes[place].1),
            );
        }
        let changes: Vec<(&[u8], bool)> = changes.into_iter().collect();
        let mut keys: Vec<Vec<u8>> = Vec::new();
        let mut next_change = 0;
        let mut engine_after: Option<Vec<u8>> = after.map(<[u8]>::to_vec);
        let mut engine_page: std::collections::VecDeque<Vec<u8>> = Default::default();
        let mut engine_done = false;
        while keys.len() < limit {
            if engine_page.is_empty() && !engine_done {
                let page = (limit - keys.len() + changes.len() - next_change).min(MERGE_PAGE_KEYS);
                let scan = bitcask::Scan {
                    range: bitcask::KeyRange::Range(
                        Bound::Included(start.to_vec()),
                        end.map_or(Bound::Unbounded, |end| Bound::Excluded(end.to_vec())),
                    ),
                    after: engine_after.clone(),
                    limit: page.max(1),
                    keys_only: true,
                };
                let found = self.entry.engine.scan(&scan, self.entry.now_ms)?;
                engine_done = found.len() < page.max(1);
                engine_after = found.last().map(|entry| entry.key.clone());
                engine_page.extend(found.into_iter().map(|entry| entry.key));
            }
            let change = changes.get(next_change).copied();
            match (engine_page.front(), change) {
                (None, None) => break,
                (Some(stored), Some((changed, present))) if changed <= stored.as_slice() => {
                    if changed == stored.as_slice() {
                        engine_page.pop_front();
                    }
                    if present {
                        keys.push(changed.to_vec());
                    }
                    next_change += 1;
                }
                (Some(_), _) => keys.extend(engine_page.pop_front()),
                (None, Some((changed, present))) => {
                    if present {
                        keys.push(changed.to_vec());
                    }
                    next_change += 1;
                }
            }
        }
        Ok(keys)
    }

    fn put(&mut self, key: Vec<u8>, value: Vec<u8>, expiry_ms: u64) -> Result<(), Fault> {
        let previous = match self.staged.get(&key) {
            Some(KeyState::Present { meta, .. }) => Some(*meta),
            Some(KeyState::Absent) => None,
            None => match self.entry.state_of(&key)? {
                KeyState::Present { meta, .. } => Some(meta),
                KeyState::Absent => None,
            },
        };
        // Redis writes detach a key from a native lease, as a native put
        // without one does; a key written twice by the request changes
        // (and counts) once.
        let meta = match previous {
            Some(meta) if meta.mod_revision == self.revision => KeyMeta { lease: 0, ..meta },
            Some(meta) => meta.modified(self.revision, 0),
            None => KeyMeta::created(self.revision, 0),
        };
        let seq = self.entry.base + (self.entry.batch.ops.len() + self.staged.place(&key)) as u64;
        let state = KeyState::Present {
            seq,
            expiry_ms,
            meta,
            value: Some(value),
        };
        let bytes = self.record_bytes(&key, &state);
        self.stage(key, state, bytes)
    }

    fn delete(&mut self, key: Vec<u8>) -> Result<(), Fault> {
        let bytes = self.record_bytes(&key, &KeyState::Absent);
        self.stage(key, KeyState::Absent, bytes)
    }

    fn new_hash_id(&mut self) -> Result<u64, Fault> {
        // The position the request's next new record would take: a hash
        // that is written stages a record no earlier one did (a field
        // under its new id), so no two written hashes share one, within
        // the request or the entry (`index × 65536 + position`, as a
        // record's seq).
        Ok(self.entry.base + (self.entry.batch.ops.len() + self.staged.writes.len()) as u64)
    }

    fn keys_left(&self) -> usize {
        self.keys_left
    }

    fn charge(&mut self, keys: usize, bytes: usize) -> Result<(), Fault> {
        if keys > self.keys_left {
            return Err(Fault::Limit(format!(
                "the request reads more than TXN_READ_KEYS_MAX ({TXN_READ_KEYS_MAX}) keys; \
                 nothing was applied (read a large hash with HSCAN, outside MULTI)"
            )));
        }
        let (name, limit) = self.bytes_limit;
        if self.read_bytes + bytes > limit {
            return Err(Fault::Limit(format!(
                "the request reads more than {name} ({limit}) bytes; nothing was applied"
            )));
        }
        self.keys_left -= keys;
        self.read_bytes += bytes;
        Ok(())
    }
}
