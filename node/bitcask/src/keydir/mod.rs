//! The key directory: an in-memory map from key to where its latest value
//! lives, with point lookups by hash and scans in key order.
//!
//! Memory per key is a headline figure (≤ 64 B beyond the key, by the
//! allocator and by resident set), and a lookup should touch little memory:
//!
//! - `arena`: every entry (28-byte location, key length, key) packed into
//!   1 MiB chunks and named by a 4-byte id; no allocation per key.
//! - a hash table of ids (`hashbrown::HashTable<u32>`, seeded `foldhash`):
//!   a point lookup hashes the key, probes one group of control bytes and
//!   compares one entry (about two cache misses);
//! - `order`: the ids in key order, in chunks of up to 512, for range and
//!   prefix scans; built in one sort when the engine opens.
//!
//! Tombstones are not kept: a deleted key is simply absent. A delete leaves
//! a hole in the arena; when holes outweigh live entries (and at least
//! [`COMPACT_DEAD_BYTES_MIN`]), the arena is rewritten in key order and every
//! id remapped, under the caller's write lock: a pause of O(live keys),
//! amortised over at least as many bytes of deletes.

mod arena;
mod order;

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::ops::Bound;

use hashbrown::HashTable;

use crate::format::record_size;
use arena::{Arena, EntryId};
use order::Order;

pub use arena::entry_size_bytes;

/// The arena is compacted only once its holes reach this many bytes (and
/// outweigh its live entries), so small directories never bother.
pub const COMPACT_DEAD_BYTES_MIN: usize = 4 * 1024 * 1024;

/// Where a key's latest record lives, and its version and expiry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Location {
    /// Engine-internal file number (not stable across restarts).
    pub file: u32,
    /// Offset of the record in the file.
    pub offset: u32,
    /// Length of the value.
    pub value_len: u32,
    /// Sequence number of the record.
    pub seq: u64,
    /// Expiry, ms of the caller's clock; 0 = never.
    pub expiry_ms: u64,
}

impl Location {
    /// Whether the value has expired at `now_ms`.
    pub fn expired(&self, now_ms: u64) -> bool {
        self.expiry_ms != 0 && self.expiry_ms <= now_ms
    }
}

/// The key directory plus the live-byte accounting that depends on it.
#[derive(Debug)]
pub struct KeyDir {
    arena: Arena,
    table: HashTable<EntryId>,
    hasher: foldhash::fast::RandomState,
    /// `None` while the engine opens (see [`KeyDir::finish_load`]).
    order: Option<Order>,
    /// Bytes of live records per file number.
    live_bytes: HashMap<u32, u64>,
    /// Sum of key lengths.
    key_bytes: u64,
    /// Highest sequence number applied to this directory.
    applied_seq: u64,
    /// Latest expiry of any record put into this directory (0 = none): a
    /// high-water mark, not lowered by deletes or overwrites.
    expiry_high_ms: u64,
}

impl Default for KeyDir {
    fn default() -> Self {
        KeyDir {
            arena: Arena::default(),
            table: HashTable::new(),
            hasher: foldhash::fast::RandomState::default(),
            order: Some(Order::default()),
            live_bytes: HashMap::new(),
            key_bytes: 0,
            applied_seq: 0,
            expiry_high_ms: 0,
        }
    }
}

impl KeyDir {
    /// An empty directory for loading many keys at open: the ordered index
    /// is left out until [`KeyDir::finish_load`] builds it in one go.
    pub fn for_load() -> KeyDir {
        KeyDir {
            order: None,
            ..KeyDir::default()
        }
    }

    /// Builds the ordered index after a [`KeyDir::for_load`] load.
    pub fn finish_load(&mut self) {
        if self.order.is_none() {
            self.order = Some(Order::build(&self.arena));
        }
    }

    /// Room for about `additional` more keys in the hash table (a load
    /// that knows how many entries come next avoids regrowing it).
    pub fn reserve(&mut self, additional: usize) {
        let KeyDir {
            arena,
            table,
            hasher,
            ..
        } = self;
        table.reserve(additional, |&id| hasher.hash_one(arena.key(id)));
    }

    fn find(&self, key: &[u8]) -> Option<EntryId> {
        let hash = self.hasher.hash_one(key);
        self.table
            .find(hash, |&id| self.arena.key(id) == key)
            .copied()
    }

    /// Location of `key`, if present (expired or not).
    pub fn get(&self, key: &[u8]) -> Option<Location> {
        self.find(key).map(|id| self.arena.location(id))
    }

    /// Whether entries for `keys_bytes` bytes of new keys (see
    /// [`entry_size_bytes`]) are sure to fit: the write path asks before it
    /// appends a batch, so applying one never fails.
    pub fn has_room(&self, entry_bytes: usize) -> bool {
        self.arena.has_room(entry_bytes)
    }

    /// Records that `key` now lives at `location`.
    ///
    /// # Panics
    /// When the arena is full; callers check [`KeyDir::has_room`] first.
    pub fn put(&mut self, key: &[u8], location: Location) {
        self.applied_seq = self.applied_seq.max(location.seq);
        self.expiry_high_ms = self.expiry_high_ms.max(location.expiry_ms);
        *self.live_bytes.entry(location.file).or_default() +=
            record_size(key.len(), location.value_len as usize) as u64;
        let hash = self.hasher.hash_one(key);
        let KeyDir {
            arena,
            table,
            hasher,
            ..
        } = self;
        if let Some(&id) = table.find(hash, |&id| arena.key(id) == key) {
            let old = arena.location(id);
            arena.set_location(id, &location);
            self.forget_bytes(key.len(), &old);
            return;
        }
        let id = arena
            .push(key, &location)
            .expect("the write path checked has_room before appending");
        table.insert_unique(hash, id, |&id| hasher.hash_one(arena.key(id)));
        if let Some(order) = &mut self.order {
            order.insert(arena, id);
        }
        self.key_bytes += key.len() as u64;
    }

    /// The latest expiry any put since open carried (0 = none): until time
    /// passes it, some key may still be waiting to expire.
    pub fn expiry_high_ms(&self) -> u64 {
        self.expiry_high_ms
    }

    /// Records that `key` was deleted by the record with `seq`.
    pub fn delete(&mut self, key: &[u8], seq: u64) {
        self.applied_seq = self.applied_seq.max(seq);
        let hash = self.hasher.hash_one(key);
        let KeyDir { arena, table, .. } = self;
        let Ok(entry) = table.find_entry(hash, |&id| arena.key(id) == key) else {
            return;
        };
        let (id, _) = entry.remove();
        let old = arena.location(id);
        if let Some(order) = &mut self.order {
            order.remove(arena, id);
        }
        arena.free(id);
        self.key_bytes -= key.len() as u64;
        self.forget_bytes(key.len(), &old);
        self.maybe_compact();
    }

    /// Rewrites the arena without its holes once they outweigh the live
    /// entries, in key order (so scans then read the arena in sequence).
    fn maybe_compact(&mut self) {
        let dead = self.arena.dead_bytes();
        if dead < COMPACT_DEAD_BYTES_MIN || dead < self.arena.live_bytes() {
            return;
        }
        let mut old = std::mem::take(&mut self.arena);
        self.arena = match &self.order {
            Some(order) => old.compacted(order.ids()),
            None => {
                let ids: Vec<EntryId> = old.live_ids().collect();
                old.compacted(ids.into_iter())
            }
        };
        for id in self.table.iter_mut() {
            *id = old.forwarded(*id);
        }
        if let Some(order) = &mut self.order {
            order.remap(|id| old.forwarded(id));
        }
    }

    /// Notes a sequence number that touched no key (a commit record).
    pub fn note_seq(&mut self, seq: u64) {
        self.applied_seq = self.applied_seq.max(seq);
    }

    /// Moves `key` to a new place if its record is still the one with `seq`
    /// (a merge copied it); returns whether it moved.
    pub fn repoint(&mut self, key: &[u8], seq: u64, file: u32, offset: u32) -> bool {
        match self.get(key) {
            Some(old) if old.seq == seq => {
                self.put(
                    key,
                    Location {
                        file,
                        offset,
                        ..old
                    },
                );
                true
            }
            _ => false,
        }
    }

    /// Removes `key` if its record is still the one with `seq` (a merge
    /// dropped it as expired).
    pub fn remove_if_seq(&mut self, key: &[u8], seq: u64) {
        if self.get(key).is_some_and(|old| old.seq == seq) {
            self.delete(key, seq);
        }
    }

    fn forget_bytes(&mut self, key_len: usize, old: &Location) {
        let size = record_size(key_len, old.value_len as usize) as u64;
        if let Some(live) = self.live_bytes.get_mut(&old.file) {
            *live = live.saturating_sub(size);
        }
    }

    fn order(&self) -> &Order {
        self.order
            .as_ref()
            .expect("the ordered index is built before the engine serves scans")
    }

    /// Entries with keys in the range, in key order.
    pub fn range<'a>(
        &'a self,
        start: Bound<&'a [u8]>,
        end: Bound<&'a [u8]>,
    ) -> impl Iterator<Item = (&'a [u8], Location)> + 'a {
        self.order()
            .range(&self.arena, start, end)
            .map(|id| (self.arena.key(id), self.arena.location(id)))
    }

    /// Every entry, in key order.
    pub fn iter(&self) -> impl Iterator<Item = (&[u8], Location)> + '_ {
        self.order()
            .ids()
            .map(|id| (self.arena.key(id), self.arena.location(id)))
    }

    /// Number of keys.
    pub fn len(&self) -> usize {
        self.table.len()
    }

    /// Sum of key lengths.
    pub fn key_bytes(&self) -> u64 {
        self.key_bytes
    }

    /// Live bytes in a file.
    pub fn live_bytes(&self, file: u32) -> u64 {
        self.live_bytes.get(&file).copied().unwrap_or(0)
    }

    /// Forgets the accounting of a file that left the engine.
    pub fn drop_file(&mut self, file: u32) {
        self.live_bytes.remove(&file);
    }

    /// Highest sequence number applied.
    pub fn applied_seq(&self) -> u64 {
        self.applied_seq
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(file: u32, seq: u64) -> Location {
        Location {
            file,
            offset: 32,
            value_len: 10,
            seq,
            expiry_ms: 0,
        }
    }

    #[test]
    fn put_get_delete_and_accounting() {
        let mut dir = KeyDir::default();
        dir.put(b"b", at(1, 1));
        dir.put(b"a", at(1, 2));
        dir.put(b"b", at(2, 3));
        assert_eq!(dir.len(), 2);
        assert_eq!(dir.get(b"b").unwrap().seq, 3);
        assert_eq!(dir.live_bytes(1), record_size(1, 10) as u64);
        assert_eq!(dir.live_bytes(2), record_size(1, 10) as u64);
        dir.delete(b"a", 4);
        assert_eq!(dir.get(b"a"), None);
        assert_eq!(dir.live_bytes(1), 0);
        assert_eq!(dir.key_bytes(), 1);
        assert_eq!(dir.applied_seq(), 4);
    }

    #[test]
    fn ranges_are_ordered_and_repoint_checks_seq() {
        let mut dir = KeyDir::default();
        for (i, key) in [b"c".as_slice(), b"a", b"ab", b"b"].iter().enumerate() {
            dir.put(key, at(1, i as u64 + 1));
        }
        let keys: Vec<&[u8]> = dir
            .range(
                Bound::Included(b"a".as_slice()),
                Bound::Excluded(b"b".as_slice()),
            )
            .map(|(k, _)| k)
            .collect();
        assert_eq!(keys, vec![b"a".as_slice(), b"ab"]);
        assert!(!dir.repoint(b"c", 99, 7, 0));
        assert!(dir.repoint(b"c", 1, 7, 64));
        assert_eq!(dir.get(b"c").unwrap().file, 7);
        assert_eq!(dir.get(b"c").unwrap().offset, 64);
    }

    /// Random puts, deletes, repoints and a bulk load against a BTreeMap,
    /// with enough deletes to force arena compactions on the way.
    #[test]
    fn matches_a_btreemap_through_compactions() {
        use rand::{Rng, SeedableRng};
        use std::collections::BTreeMap;
        let mut rng = rand::rngs::SmallRng::seed_from_u64(11);
        let mut model: BTreeMap<Vec<u8>, Location> = BTreeMap::new();
        let mut dir = KeyDir::for_load();
        let mut seq = 0;
        let mut compactions_seen = 0;
        for step in 0..400_000u64 {
            if step == 50_000 {
                dir.finish_load();
            }
            seq += 1;
            // 64-byte keys: the deletes leave enough holes to compact.
            let key = format!("k{:063}", rng.random_range(0..60_000u32)).into_bytes();
            if rng.random_bool(0.45) {
                let dead_before = dir.arena.dead_bytes();
                dir.delete(&key, seq);
                model.remove(&key);
                if dir.arena.dead_bytes() < dead_before {
                    compactions_seen += 1;
                }
            } else {
                let location = at(1 + (seq % 3) as u32, seq);
                dir.put(&key, location);
                model.insert(key, location);
            }
        }
        assert!(compactions_seen > 0, "the test must exercise compaction");
        dir.order.as_ref().unwrap().check_heads(&dir.arena);
        assert_eq!(dir.len(), model.len());
        for (key, location) in &model {
            assert_eq!(dir.get(key), Some(*location));
        }
        let all: Vec<(Vec<u8>, Location)> = dir.iter().map(|(k, l)| (k.to_vec(), l)).collect();
        let expected: Vec<(Vec<u8>, Location)> = model.into_iter().collect();
        assert_eq!(all, expected);
    }
}
