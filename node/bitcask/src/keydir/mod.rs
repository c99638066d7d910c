//! The key directory: from each live key to where its latest value lives,
//! found by hash for point lookups and in key order for scans.
//!
//! - `slot.rs`: one entry's bytes: the key, then its [`Location`].
//! - `slab.rs`: the owner of every slot, inline in size-class cells, by
//!   `u32` id.
//! - `order.rs`: the ids sorted by key, in chunks with 4-byte key words.
//! - this file: the sharded hash index, the directory over the three, and
//!   the live-byte accounting.
//!
//! Three structures, one owner. The slab holds every slot and names it by a
//! `u32` id; the hash index (256 `hashbrown::HashTable` shards of ids,
//! compared and rehashed through the slab) answers "where is this key" in
//! one probe, so a read costs a few cache misses whatever the number of
//! keys; the order answers ranges and prefix scans. An overwrite rewrites
//! the slot in its cell when the new one is of the same size class and
//! touches neither index; otherwise the slot moves to a cell of its new
//! class and both indexes are told the new id. New keys, deleted keys and
//! compaction (slots moved down into free cells after deletes) change ids
//! too, always in both indexes before the old cell is freed.
//!
//! Memory per key beyond the key (1 M keys of 25 bytes, no record meta):
//! the slot's 48-byte cell (23 bytes past the key), about 10.5 bytes of
//! hash table (a 4-byte id and a control byte, at the table's load factor)
//! and about 9 bytes of order (an id and a word, chunks 7/8 full after a
//! restart): about 43 bytes, by the allocator's count and resident alike
//! (`engine-probe`, BENCHMARKS.md).
//!
//! While recovery loads hints ([`KeyDir::loading`]), only the slab and the
//! hash index are kept; [`KeyDir::finish_loading`] sorts the survivors once,
//! builds the order in bulk and fits the index to them, instead of
//! inserting a million keys one at a time in write order.

mod order;
mod slab;
mod slot;

use std::collections::HashMap;
use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::ops::Bound;

use hashbrown::HashTable;
use hashbrown::hash_table::Entry;

use order::Order;
use slab::{COMPACT_MOVES_PER_DELETE, Slab};
use slot::encode;
pub use slot::{Location, SLOT_HEADER_SIZE_BYTES};

/// Most keys [`KeyDir::loading`] makes room for up front (a larger estimate
/// grows the table as keys arrive instead).
const LOADING_RESERVE_KEYS_MAX: usize = 1 << 24;
/// Sorts at the end of loading that need this much scratch or more ask for
/// at least [`SORT_SCRATCH_MAPPED_BYTES`]: glibc serves any request above
/// 32 MiB (its largest mmap threshold) with a mapping of its own, returned
/// to the OS when freed, so the sort leaves no freed-but-resident heap
/// behind (pages never touched are never resident).
const SORT_SCRATCH_LARGE_BYTES: usize = 1 << 20;
const SORT_SCRATCH_MAPPED_BYTES: usize = (32 << 20) + 4096;

/// Shards of the hash index: a key's shard is picked by the top bits of its
/// hash, and each shard's table grows (rehashing, which reads the slot of
/// every id it holds) on its own, so a write that makes a table grow holds
/// the directory for 1/256 of a whole-index rehash (about 1 ms at a million
/// keys on the benchmark machine, not 200).
const INDEX_SHARDS: usize = 256;
/// The shard comes from hash bits 48..56: hashbrown places an entry by the
/// low bits and tags it with the top 7, so bits that every entry of a shard
/// shares must be neither (sharing the tag bits made every probe compare
/// every key of its group).
const INDEX_SHARD_SHIFT: u32 = 48;
const INDEX_SHARD_MASK: u64 = INDEX_SHARDS as u64 - 1;
const _: () = assert!(INDEX_SHARD_SHIFT + INDEX_SHARDS.trailing_zeros() <= 57);
const _: () = assert!(INDEX_SHARDS.is_power_of_two());
/// A shard's table holding fewer than 1/this of its capacity after a
/// removal shrinks to twice its length (mass deletes give memory back).
const INDEX_SHRINK_RATIO: usize = 4;
/// Tables this small are never shrunk.
const INDEX_SHRINK_CAPACITY_MIN: usize = 64;

/// Slab ids by the hash of their key. SipHash with a per-directory random
/// key (std's `RandomState`): keys come from the network, and a hash an
/// outsider could aim would let chosen keys pile into one probe chain.
struct HashIndex {
    shards: Box<[HashTable<u32>]>,
    hasher: RandomState,
}

impl Default for HashIndex {
    fn default() -> HashIndex {
        HashIndex {
            shards: (0..INDEX_SHARDS).map(|_| HashTable::new()).collect(),
            hasher: RandomState::new(),
        }
    }
}

impl HashIndex {
    #[inline]
    fn hash(&self, key: &[u8]) -> (u64, usize) {
        let hash = self.hasher.hash_one(key);
        (
            hash,
            ((hash >> INDEX_SHARD_SHIFT) & INDEX_SHARD_MASK) as usize,
        )
    }

    #[inline]
    fn find(&self, slab: &Slab, key: &[u8]) -> Option<u32> {
        let (hash, shard) = self.hash(key);
        self.shards[shard]
            .find(hash, |&id| slab.key(id) == key)
            .copied()
    }

    /// `key`'s entry: its id, or the free bucket a new id for it goes
    /// into (room is made first, so inserting needs no rehash).
    fn entry<'a>(&'a mut self, slab: &Slab, key: &[u8]) -> Entry<'a, u32> {
        let (hash, shard) = self.hash(key);
        let hasher = &self.hasher;
        self.shards[shard].entry(
            hash,
            |&id| slab.key(id) == key,
            |&id| hasher.hash_one(slab.key(id)),
        )
    }

    /// Replaces `key`'s id `old` with `new`.
    fn repoint(&mut self, key: &[u8], old: u32, new: u32) {
        let (hash, shard) = self.hash(key);
        match self.shards[shard].find_entry(hash, |&id| id == old) {
            Ok(mut entry) => *entry.get_mut() = new,
            Err(_) => {
                debug_assert!(false, "repointing an id the hash index does not hold");
                tracing::error!(
                    old,
                    new,
                    "key directory hash index: an id to repoint is missing"
                );
            }
        }
    }

    /// Removes `key`'s id and returns it; with `shrink`, a shard left
    /// mostly empty shrinks (not while recovery loads: it sized the index
    /// for what is still to come).
    fn remove(&mut self, slab: &Slab, key: &[u8], shrink: bool) -> Option<u32> {
        let (hash, shard) = self.hash(key);
        let hasher = &self.hasher;
        let table = &mut self.shards[shard];
        let (id, _) = table
            .find_entry(hash, |&id| slab.key(id) == key)
            .ok()?
            .remove();
        if shrink
            && table.capacity() > INDEX_SHRINK_CAPACITY_MIN
            && table.len() * INDEX_SHRINK_RATIO < table.capacity()
        {
            table.shrink_to(table.len() * 2, |&id| hasher.hash_one(slab.key(id)));
        }
        Some(id)
    }

    /// Shrinks every shard holding less than half of what it has room for
    /// to its length and an eighth (recovery's estimate counts overwritten
    /// and deleted keys too).
    fn fit(&mut self, slab: &Slab) {
        let hasher = &self.hasher;
        for table in &mut self.shards {
            if table.capacity() > INDEX_SHRINK_CAPACITY_MIN && table.len() * 2 < table.capacity() {
                let len = table.len();
                table.shrink_to(len + len / 8, |&id| hasher.hash_one(slab.key(id)));
            }
        }
    }

    /// Makes room for about `keys` keys in all, spread over the shards.
    fn reserve(&mut self, slab: &Slab, keys: usize) {
        let per_shard = keys.div_ceil(INDEX_SHARDS);
        // Shards fill unevenly: an eighth more spares most of them a growth.
        let per_shard = per_shard + per_shard / 8;
        let hasher = &self.hasher;
        for table in &mut self.shards {
            table.reserve(per_shard, |&id| hasher.hash_one(slab.key(id)));
        }
    }
}

/// The key directory plus the live-byte accounting that depends on it.
#[derive(Default)]
pub struct KeyDir {
    slab: Slab,
    /// Ids by the hash of their key.
    index: HashIndex,
    /// Ids by key; empty while `loading`.
    order: Order,
    /// Recovery is loading hints: the order is built once at the end.
    loading: bool,
    /// Where a put encodes its slot before the slab stores it.
    scratch: Vec<u8>,
    /// Number of keys.
    len: usize,
    /// Bytes of live records per file number.
    live_bytes: HashMap<u32, u64>,
    /// Sum of key lengths.
    key_bytes: u64,
    /// Highest sequence number applied to this directory.
    applied_seq: u64,
    /// Latest expiry of any record put into this directory (0 = none): a
    /// high-water mark, not lowered by deletes or overwrites (recovery
    /// recomputes it from the live entries: [`KeyDir::reset_expiry_high`]).
    expiry_high_ms: u64,
    /// Keys whose entry carries an expiry (expired or not): while 0, no
    /// key can expire, so a range's count is its length in the order.
    expiring: usize,
}

impl std::fmt::Debug for KeyDir {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyDir")
            .field("keys", &self.len)
            .field("key_bytes", &self.key_bytes)
            .field("applied_seq", &self.applied_seq)
            .field("loading", &self.loading)
            .finish_non_exhaustive()
    }
}

impl KeyDir {
    /// An empty directory for recovery to load into, with room for about
    /// `keys` keys: no order is kept until [`KeyDir::finish_loading`].
    pub fn loading(keys: usize) -> KeyDir {
        let mut dir = KeyDir {
            loading: true,
            ..KeyDir::default()
        };
        dir.index
            .reserve(&dir.slab, keys.min(LOADING_RESERVE_KEYS_MAX));
        dir
    }

    /// Ends loading: sorts the live keys once and builds the order from
    /// them. Sorting compares 8 bytes of each key past the prefix all keys
    /// share, held beside the id, and reads the slots only to break ties.
    pub fn finish_loading(&mut self) {
        if !self.loading {
            return;
        }
        self.loading = false;
        let slab = &self.slab;
        let mut shared: Option<&[u8]> = None;
        for (_, slot) in slab.live() {
            let key = slot.key();
            shared = Some(match shared {
                None => key,
                Some(common) => {
                    let same = common.iter().zip(key).take_while(|(a, b)| a == b).count();
                    &common[..same]
                }
            });
        }
        let skip = shared.map_or(0, <[u8]>::len);
        let entry_bytes = std::mem::size_of::<(u64, u32)>();
        let mut capacity = self.len;
        if capacity * entry_bytes >= SORT_SCRATCH_LARGE_BYTES {
            capacity = capacity.max(SORT_SCRATCH_MAPPED_BYTES.div_ceil(entry_bytes));
        }
        let mut sorted: Vec<(u64, u32)> = Vec::with_capacity(capacity);
        sorted.extend(slab.live().map(|(id, slot)| {
            let mut word = [0u8; 8];
            let rest = &slot.key()[skip..];
            let n = rest.len().min(8);
            word[..n].copy_from_slice(&rest[..n]);
            (u64::from_be_bytes(word), id)
        }));
        sorted.sort_unstable_by(|a, b| {
            a.0.cmp(&b.0)
                .then_with(|| slab.key(a.1)[skip..].cmp(&slab.key(b.1)[skip..]))
        });
        self.order = Order::from_sorted(slab, &sorted, skip);
        drop(sorted);
        self.index.fit(&self.slab);
    }

    #[inline]
    fn find(&self, key: &[u8]) -> Option<u32> {
        self.index.find(&self.slab, key)
    }

    /// Location of `key`, if present (expired or not).
    #[inline]
    pub fn get(&self, key: &[u8]) -> Option<Location> {
        self.find(key).map(|id| self.slab.slot(id).location())
    }

    /// Records that `key` now lives at `location`.
    pub fn put(&mut self, key: &[u8], location: Location) {
        self.applied_seq = self.applied_seq.max(location.seq);
        self.expiry_high_ms = self.expiry_high_ms.max(location.expiry_ms);
        self.expiring += usize::from(location.expiry_ms != 0);
        *self.live_bytes.entry(location.file).or_default() +=
            location.record_size(key.len()) as u64;
        encode(key, &location, &mut self.scratch);
        let slot = &self.scratch;
        // One hash and one probe: the entry is either the key's id or the
        // free bucket its new id goes into.
        match self.index.entry(&self.slab, key) {
            Entry::Occupied(mut entry) => {
                let id = *entry.get();
                let old = self.slab.slot(id).location();
                if !self.slab.overwrite(id, slot) {
                    // Another size class: a new cell, and both indexes
                    // told the new id (the key, so its place, is the same).
                    let moved = self.slab.alloc(slot);
                    *entry.get_mut() = moved;
                    if !self.loading {
                        self.order.repoint(&self.slab, key, id, moved);
                    }
                    self.slab.release(id);
                    if !self.loading {
                        self.compact(id);
                    }
                }
                self.forget_bytes(key.len(), &old);
                self.expiring -= usize::from(old.expiry_ms != 0);
            }
            Entry::Vacant(entry) => {
                let id = self.slab.alloc(slot);
                entry.insert(id);
                if !self.loading {
                    self.order.insert(&self.slab, key, id);
                }
                self.len += 1;
                self.key_bytes += key.len() as u64;
            }
        }
    }

    /// The latest expiry any put since open carried (0 = none): until time
    /// passes it, some key may still be waiting to expire.
    pub fn expiry_high_ms(&self) -> u64 {
        self.expiry_high_ms
    }

    /// Keys present whose entry carries an expiry, expired or not (0: no
    /// key can expire, whatever the time).
    pub fn expiring_keys(&self) -> usize {
        self.expiring
    }

    /// Recomputes the expiry high-water from the entries present (expired
    /// or not), forgetting the expiries of overwritten and deleted puts:
    /// recovery replays history a retaining merge kept, and a kept put with
    /// a far expiry must not hold the mark up while no live key has it.
    /// Walks the directory only when the mark is set.
    pub fn reset_expiry_high(&mut self) {
        if self.expiry_high_ms == 0 {
            return;
        }
        self.expiry_high_ms = self
            .slab
            .live()
            .map(|(_, slot)| slot.location().expiry_ms)
            .max()
            .unwrap_or(0);
    }

    /// Records that `key` was deleted by the record with `seq`.
    pub fn delete(&mut self, key: &[u8], seq: u64) {
        self.applied_seq = self.applied_seq.max(seq);
        let Some(id) = self.index.remove(&self.slab, key, !self.loading) else {
            return;
        };
        if !self.loading {
            self.order.remove(&self.slab, key, id);
        }
        let old = self.slab.slot(id).location();
        self.slab.release(id);
        self.len -= 1;
        self.key_bytes -= key.len() as u64;
        self.forget_bytes(key.len(), &old);
        self.expiring -= usize::from(old.expiry_ms != 0);
        if !self.loading {
            self.compact(id);
        }
    }

    /// Moves a few slots of the class `freed` is in from its last chunk
    /// into its lowest free cells (when the class is under half full), so
    /// deletes anywhere give chunks back, not only deletes at the top.
    fn compact(&mut self, freed: u32) {
        for _ in 0..COMPACT_MOVES_PER_DELETE {
            let Some(from) = self.slab.compaction_candidate(freed) else {
                return;
            };
            let to = self.slab.move_down(from);
            let key = self.slab.key(from);
            self.index.repoint(key, from, to);
            self.order.repoint(&self.slab, key, from, to);
            self.slab.release(from);
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
        let size = old.record_size(key_len) as u64;
        if let Some(live) = self.live_bytes.get_mut(&old.file) {
            *live = live.saturating_sub(size);
        }
    }

    /// Entries with keys in the range, in key order.
    pub fn range<'a>(
        &'a self,
        start: Bound<&'a [u8]>,
        end: Bound<&'a [u8]>,
    ) -> impl Iterator<Item = (&'a [u8], Location)> + 'a {
        debug_assert!(!self.loading, "the order is built when loading ends");
        let from = match start {
            Bound::Unbounded => (0, 0),
            Bound::Included(key) => self.order.bound(&self.slab, key, true),
            Bound::Excluded(key) => self.order.bound(&self.slab, key, false),
        };
        let slab = &self.slab;
        self.order
            .ids_from(from)
            .map(move |id| slab.slot(id))
            .take_while(move |slot| match end {
                Bound::Unbounded => true,
                Bound::Included(end) => slot.key() <= end,
                Bound::Excluded(end) => slot.key() < end,
            })
            .map(|slot| (slot.key(), slot.location()))
    }

    /// Number of entries with keys in the range, expired or not, from the
    /// order's chunk lengths: two searches and no slot read, whatever the
    /// range holds.
    pub fn count_range(&self, start: Bound<&[u8]>, end: Bound<&[u8]>) -> usize {
        debug_assert!(!self.loading, "the order is built when loading ends");
        let from = match start {
            Bound::Unbounded => (0, 0),
            Bound::Included(key) => self.order.bound(&self.slab, key, true),
            Bound::Excluded(key) => self.order.bound(&self.slab, key, false),
        };
        let to = match end {
            Bound::Unbounded => self.order.end(),
            Bound::Included(key) => self.order.bound(&self.slab, key, false),
            Bound::Excluded(key) => self.order.bound(&self.slab, key, true),
        };
        self.order.ids_between(from, to)
    }

    /// Every entry, in key order.
    pub fn iter(&self) -> impl Iterator<Item = (&[u8], Location)> + '_ {
        self.range(Bound::Unbounded, Bound::Unbounded)
    }

    /// Number of keys.
    pub fn len(&self) -> usize {
        self.len
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
pub(super) mod tests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use super::*;
    use crate::format::record_size;
    use crate::record_meta::RecordMeta;

    /// A location in `file` with sequence `seq` (tests of the directory and
    /// of its slots).
    pub(super) fn at(file: u32, seq: u64) -> Location {
        Location {
            file,
            offset: 32,
            value_len: 10,
            seq,
            expiry_ms: 0,
            meta: RecordMeta::EMPTY,
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
        assert_eq!(dir.live_bytes(1), record_size(1, 10, 0) as u64);
        assert_eq!(dir.live_bytes(2), record_size(1, 10, 0) as u64);
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

    #[derive(Clone, Debug)]
    enum Step {
        Put(Vec<u8>),
        Delete(Vec<u8>),
        Range(Vec<u8>, Vec<u8>, bool, bool),
    }

    /// Short keys over a small alphabet, so steps hit the same keys, share
    /// prefixes and cross chunk boundaries.
    fn key() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            4 => proptest::collection::vec(0u8..4, 0..4),
            4 => (0u32..3000).prop_map(|n| format!("k{n:05}").into_bytes()),
            // Slots too long for a cell: the boxed class.
            1 => (0u32..50, 200usize..300).prop_map(|(n, len)| {
                let mut key = format!("k{n:05}").into_bytes();
                key.resize(len, b'x');
                key
            }),
        ]
    }

    /// A location whose meta length changes with `seq`, so overwrites move
    /// slots between size classes, with an expiry when `seq` is a multiple
    /// of 3 (so overwrites and deletes add and drop keys that carry one).
    fn at_varied(seq: u64) -> Location {
        let meta = vec![0x5a; (seq % 5) as usize * 4];
        Location {
            meta: RecordMeta::new(&meta).unwrap(),
            expiry_ms: if seq.is_multiple_of(3) { seq } else { 0 },
            ..at(1, seq)
        }
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            6 => key().prop_map(Step::Put),
            3 => key().prop_map(Step::Delete),
            1 => (key(), key(), any::<bool>(), any::<bool>())
                .prop_map(|(a, b, i, j)| Step::Range(a, b, i, j)),
        ]
    }

    fn check_against(dir: &KeyDir, model: &BTreeMap<Vec<u8>, u64>) {
        dir.order.check(&dir.slab);
        // The slab holds exactly the keys, each under the id both indexes
        // name for it.
        assert_eq!(
            dir.slab.live().count(),
            model.len(),
            "slab holds leaked slots"
        );
        for (id, slot) in dir.slab.live() {
            assert_eq!(
                dir.index.find(&dir.slab, slot.key()),
                Some(id),
                "hash index"
            );
        }
        let ordered: Vec<u32> = dir.order.ids_from((0, 0)).collect();
        let mut from_slab: Vec<u32> = dir.slab.live().map(|(id, _)| id).collect();
        let mut from_order = ordered.clone();
        from_slab.sort_unstable();
        from_order.sort_unstable();
        assert_eq!(from_order, from_slab, "order and slab hold other ids");
        // Counts from the chunk lengths agree with the model's, over ranges
        // that start and end inside chunks, between them and past the ends.
        let keys: Vec<&Vec<u8>> = model.keys().collect();
        let step = (keys.len() / 40).max(1);
        for (i, from) in keys.iter().enumerate().step_by(step) {
            for to in keys[i..].iter().step_by(step * 3 + 1) {
                let (lo, hi) = (
                    Bound::Included(from.as_slice()),
                    Bound::Excluded(to.as_slice()),
                );
                let want = model.range::<[u8], _>((lo, hi)).count();
                assert_eq!(dir.count_range(lo, hi), want, "{from:?}..{to:?}");
                let hi = Bound::Included(to.as_slice());
                assert_eq!(dir.count_range(lo, hi), want + 1, "{from:?}..={to:?}");
            }
            let lo = Bound::Excluded(from.as_slice());
            let want = model.range::<[u8], _>((lo, Bound::Unbounded)).count();
            assert_eq!(dir.count_range(lo, Bound::Unbounded), want);
        }
        assert_eq!(
            dir.count_range(Bound::Unbounded, Bound::Unbounded),
            model.len()
        );
        let past: &[u8] = &[0xff; 40];
        assert_eq!(dir.count_range(Bound::Included(past), Bound::Unbounded), 0);
        assert_eq!(dir.order.len(), model.len());
        assert_eq!(dir.len(), model.len());
        assert_eq!(
            dir.expiring_keys(),
            dir.iter().filter(|(_, l)| l.expiry_ms != 0).count(),
            "keys carrying an expiry"
        );
        let listed: Vec<(Vec<u8>, u64)> = dir.iter().map(|(k, l)| (k.to_vec(), l.seq)).collect();
        let expected: Vec<(Vec<u8>, u64)> = model.iter().map(|(k, s)| (k.clone(), *s)).collect();
        assert_eq!(listed, expected);
    }

    fn bound(key: &[u8], inclusive: bool) -> Bound<&[u8]> {
        if inclusive {
            Bound::Included(key)
        } else {
            Bound::Excluded(key)
        }
    }

    fn run(steps: &[Step], loading: bool) {
        let mut dir = if loading {
            KeyDir::loading(16)
        } else {
            KeyDir::default()
        };
        let mut model = BTreeMap::new();
        let mut seq = 0;
        for step in steps {
            seq += 1;
            match step {
                Step::Put(k) if !k.is_empty() => {
                    dir.put(k, at_varied(seq));
                    model.insert(k.clone(), seq);
                }
                Step::Delete(k) => {
                    dir.delete(k, seq);
                    model.remove(k);
                }
                Step::Range(a, b, i, j) if !loading => {
                    let (lo, hi) = (bound(a, *i), bound(b, *j));
                    let empty = match (lo, hi) {
                        (Bound::Included(s), Bound::Included(e)) => s > e,
                        (Bound::Included(s) | Bound::Excluded(s), Bound::Excluded(e))
                        | (Bound::Excluded(s), Bound::Included(e)) => s >= e,
                        _ => false,
                    };
                    if empty {
                        continue;
                    }
                    let got: Vec<Vec<u8>> = dir.range(lo, hi).map(|(k, _)| k.to_vec()).collect();
                    let want: Vec<Vec<u8>> = model
                        .range::<[u8], _>((lo, hi))
                        .map(|(k, _)| k.clone())
                        .collect();
                    assert_eq!(dir.count_range(lo, hi), want.len());
                    assert_eq!(got, want);
                }
                _ => {}
            }
            for (k, s) in model.iter().take(3) {
                assert_eq!(dir.get(k).map(|l| l.seq), Some(*s));
            }
        }
        dir.finish_loading();
        check_against(&dir, &model);
    }

    /// Against a `BTreeMap`: lookups, ranges and the order's invariants
    /// hold after any mix of puts and deletes, built key by key or loaded
    /// and sorted at the end. Fixed seed; `PROPTEST_CASES` (default 64).
    #[test]
    fn matches_an_ordered_map() {
        use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
        let cases = std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(64);
        let config = Config {
            cases,
            failure_persistence: None,
            ..Config::default()
        };
        let mut runner = TestRunner::new_with_rng(
            config,
            TestRng::from_seed(RngAlgorithm::ChaCha, b"raftcask-keydir-order-model-seed"),
        );
        let strategy = (proptest::collection::vec(step(), 0..3000), any::<bool>());
        runner
            .run(&strategy, |(steps, loading)| {
                run(&steps, loading);
                Ok(())
            })
            .unwrap();
    }

    /// `key00000042` for 42.
    fn numbered(n: u64) -> Vec<u8> {
        format!("key{n:08}").into_bytes()
    }

    /// A directory holding `numbered(0..keys)` put at sequences 1.., and
    /// the same as a model.
    fn filled(keys: u64) -> (KeyDir, BTreeMap<Vec<u8>, u64>) {
        let mut dir = KeyDir::default();
        let mut model = BTreeMap::new();
        for n in 0..keys {
            dir.put(&numbered(n), at(1, n + 1));
            model.insert(numbered(n), n + 1);
        }
        (dir, model)
    }

    /// Deletes scattered over the whole key space (not only the newest
    /// keys) give slab chunks back: the class compacts from the top.
    #[test]
    fn scattered_deletes_give_slab_chunks_back() {
        let (mut dir, mut model) = filled(40_000);
        let key = numbered;
        let full = dir.slab.chunks();
        // Keep every tenth key, deleting in a scattered order.
        for step in 0..40_000u64 {
            let n = (step * 7919) % 40_000;
            if n % 10 != 0 {
                dir.delete(&key(n), 100_000 + step);
                model.remove(&key(n));
            }
        }
        check_against(&dir, &model);
        for (k, seq) in &model {
            assert_eq!(dir.get(k).map(|l| l.seq), Some(*seq));
        }
        assert!(
            dir.slab.chunks() * 4 <= full,
            "{} of {full} chunks left for a tenth of the keys",
            dir.slab.chunks()
        );
    }

    /// Recovery's estimate counts every record of the hints, overwritten
    /// and deleted keys included: loading ends with the index fitted to the
    /// keys that are there, and deletes while loading do not shrink it.
    #[test]
    fn loading_fits_an_oversized_index_at_the_end() {
        let mut dir = KeyDir::loading(500_000);
        let capacity =
            |dir: &KeyDir| -> usize { dir.index.shards.iter().map(HashTable::capacity).sum() };
        let reserved = capacity(&dir);
        assert!(reserved >= 500_000);
        let key = |n: u64| format!("key{n:08}").into_bytes();
        for n in 0..20_000u64 {
            dir.put(&key(n), at(1, n + 1));
        }
        for n in 0..10_000u64 {
            dir.delete(&key(n), 30_000 + n);
        }
        assert_eq!(capacity(&dir), reserved, "no shrink while loading");
        dir.finish_loading();
        assert!(
            capacity(&dir) <= 2 * 10_000 + INDEX_SHARDS * INDEX_SHRINK_CAPACITY_MIN,
            "fitted: {}",
            capacity(&dir)
        );
        for n in 10_000..20_000u64 {
            assert_eq!(dir.get(&key(n)).map(|l| l.seq), Some(n + 1));
        }
        assert_eq!(dir.iter().count(), 10_000);
    }

    /// Deleting most keys gives the slab's trailing chunks and most of the
    /// hash tables back, and a new key takes the lowest free id.
    #[test]
    fn mass_deletes_give_memory_back() {
        let (mut dir, mut model) = filled(50_000);
        let key = numbered;
        let capacity =
            |dir: &KeyDir| -> usize { dir.index.shards.iter().map(HashTable::capacity).sum() };
        let full_capacity = capacity(&dir);
        let full_chunks = dir.slab.chunks();
        assert!(full_chunks >= 50_000 / 1024);
        for n in (100..50_000u64).rev() {
            dir.delete(&key(n), 100_000 + n);
            model.remove(&key(n));
        }
        assert_eq!(
            dir.slab.chunks(),
            1,
            "trailing empty chunks dropped, of {full_chunks}"
        );
        assert!(
            capacity(&dir) <= INDEX_SHARDS * INDEX_SHRINK_CAPACITY_MIN,
            "tables shrank to their floor: {} of {full_capacity}",
            capacity(&dir)
        );
        check_against(&dir, &model);
        let third = dir.index.find(&dir.slab, &key(3));
        dir.delete(&key(7), 200_000);
        dir.delete(&key(3), 200_001);
        model.remove(&key(7));
        model.remove(&key(3));
        dir.put(&key(99_999_999), at(1, 200_002));
        model.insert(key(99_999_999), 200_002);
        // One chunk left: nothing to compact, so the new key takes the
        // lowest free cell, the one `key(3)` had.
        assert_eq!(
            dir.index.find(&dir.slab, &key(99_999_999)),
            third,
            "the lowest free cell"
        );
        check_against(&dir, &model);
    }

    /// Thousands of keys inserted, then most deleted in a scattered order:
    /// chunks split and join, and the order stays exact.
    #[test]
    fn chunks_split_and_join() {
        let mut dir = KeyDir::default();
        let mut model = BTreeMap::new();
        for n in 0..20_000u64 {
            let key = format!("key{:08}", (n * 7919) % 20_000).into_bytes();
            dir.put(&key, at(1, n + 1));
            model.insert(key, n + 1);
        }
        check_against(&dir, &model);
        for n in 0..19_000u64 {
            let key = format!("key{:08}", (n * 104_729) % 20_000).into_bytes();
            dir.delete(&key, 100_000 + n);
            model.remove(&key);
        }
        check_against(&dir, &model);
        let mut loaded = KeyDir::loading(0);
        for (k, s) in &model {
            loaded.put(k, at(1, *s));
        }
        loaded.finish_loading();
        check_against(&loaded, &model);
    }
}
