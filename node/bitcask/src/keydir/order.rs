//! The ordered index: every live entry id in key order, in chunks of at
//! most [`ORDER_CHUNK_IDS_MAX`] ids, for range and prefix scans (point
//! lookups go through the hash table instead).
//!
//! A chunk is a sorted `Vec` of 4-byte ids with a fixed capacity, so an
//! insert or delete moves at most one chunk's worth of ids and the index
//! costs about 4 B / fill per key. Finding a key's place compares against
//! chunk heads (binary search over chunks), then inside one chunk.
//!
//! [`Order::build`] makes the index in one go from unordered ids (at open):
//! a sort of fixed-size integer keys taken from the key bytes, rather than
//! one insert per key.

use std::cmp::Ordering;
use std::ops::Bound;

use super::arena::{Arena, EntryId};

/// Ids per chunk at most; a full chunk splits in two halves.
pub const ORDER_CHUNK_IDS_MAX: usize = 512;
/// Ids per chunk when the index is built in one go: room for inserts
/// before the first split, little spare capacity.
const ORDER_CHUNK_IDS_BUILD: usize = ORDER_CHUNK_IDS_MAX * 7 / 8;
/// A chunk this small is merged into a neighbour (when they fit in one),
/// so deletes cannot leave many near-empty chunks behind.
const ORDER_CHUNK_IDS_MERGE: usize = ORDER_CHUNK_IDS_MAX / 8;
/// Tied runs this short are finished by comparing whole keys.
const SORT_RUN_COMPARE_MAX: usize = 16;

/// The ordered index.
#[derive(Debug, Default)]
pub struct Order {
    chunks: Vec<Vec<EntryId>>,
}

/// A position: chunk, then index inside it.
type Position = (usize, usize);

fn new_chunk() -> Vec<EntryId> {
    Vec::with_capacity(ORDER_CHUNK_IDS_MAX)
}

impl Order {
    /// The index of `ids` (each a live entry of `arena`, any order).
    pub fn build(arena: &Arena, ids: Vec<EntryId>) -> Order {
        let sorted = sort_ids(arena, ids);
        let chunks = sorted
            .chunks(ORDER_CHUNK_IDS_BUILD)
            .map(|part| {
                let mut chunk = new_chunk();
                chunk.extend_from_slice(part);
                chunk
            })
            .collect();
        Order { chunks }
    }

    /// The first position whose key is not below `key` (`strict`: above).
    fn seek(&self, arena: &Arena, key: &[u8], strict: bool) -> Position {
        let before = |id: EntryId| match arena.key(id).cmp(key) {
            Ordering::Less => true,
            Ordering::Equal => strict,
            Ordering::Greater => false,
        };
        // The first chunk whose head is not before `key`; the position is
        // in the chunk ahead of it (or at its start).
        let chunk = self.chunks.partition_point(|chunk| before(chunk[0]));
        if chunk == 0 {
            return (0, 0);
        }
        let index = self.chunks[chunk - 1].partition_point(|&id| before(id));
        if index == self.chunks[chunk - 1].len() {
            (chunk, 0)
        } else {
            (chunk - 1, index)
        }
    }

    /// Adds `id`, whose key is in no other entry.
    pub fn insert(&mut self, arena: &Arena, id: EntryId) {
        let key = arena.key(id);
        if self.chunks.is_empty() {
            let mut chunk = new_chunk();
            chunk.push(id);
            self.chunks.push(chunk);
            return;
        }
        let (mut chunk, mut index) = self.seek(arena, key, false);
        if chunk == self.chunks.len() {
            // Past every key: append to the last chunk.
            chunk -= 1;
            index = self.chunks[chunk].len();
        }
        if self.chunks[chunk].len() == ORDER_CHUNK_IDS_MAX {
            let mut upper = new_chunk();
            upper.extend_from_slice(&self.chunks[chunk][ORDER_CHUNK_IDS_MAX / 2..]);
            self.chunks[chunk].truncate(ORDER_CHUNK_IDS_MAX / 2);
            self.chunks.insert(chunk + 1, upper);
            if index > ORDER_CHUNK_IDS_MAX / 2 {
                chunk += 1;
                index -= ORDER_CHUNK_IDS_MAX / 2;
            }
        }
        self.chunks[chunk].insert(index, id);
    }

    /// Removes `id` (present, with `key` its key).
    pub fn remove(&mut self, arena: &Arena, id: EntryId) {
        let (chunk, index) = self.seek(arena, arena.key(id), false);
        assert_eq!(
            self.chunks.get(chunk).and_then(|c| c.get(index)),
            Some(&id),
            "the ordered index holds every live key"
        );
        self.chunks[chunk].remove(index);
        let len = self.chunks[chunk].len();
        if len == 0 {
            self.chunks.remove(chunk);
        } else if len <= ORDER_CHUNK_IDS_MERGE {
            self.merge_small(chunk);
        }
    }

    /// Joins the small chunk `chunk` with a neighbour when both fit in one.
    fn merge_small(&mut self, chunk: usize) {
        let fits = |a: usize, b: usize| a + b <= ORDER_CHUNK_IDS_BUILD;
        if chunk + 1 < self.chunks.len()
            && fits(self.chunks[chunk].len(), self.chunks[chunk + 1].len())
        {
            let next = self.chunks.remove(chunk + 1);
            self.chunks[chunk].extend_from_slice(&next);
        } else if chunk > 0 && fits(self.chunks[chunk - 1].len(), self.chunks[chunk].len()) {
            let this = self.chunks.remove(chunk);
            self.chunks[chunk - 1].extend_from_slice(&this);
        }
    }

    /// Ids with keys in the range, in key order.
    pub fn range<'a>(
        &'a self,
        arena: &'a Arena,
        start: Bound<&[u8]>,
        end: Bound<&'a [u8]>,
    ) -> impl Iterator<Item = EntryId> + 'a {
        let (chunk, index) = match start {
            Bound::Unbounded => (0, 0),
            Bound::Included(key) => self.seek(arena, key, false),
            Bound::Excluded(key) => self.seek(arena, key, true),
        };
        let first = self.chunks.get(chunk).map_or(&[][..], |c| &c[index..]);
        let rest = self.chunks.get(chunk + 1..).unwrap_or(&[]);
        first
            .iter()
            .chain(rest.iter().flatten())
            .copied()
            .take_while(move |&id| match end {
                Bound::Unbounded => true,
                Bound::Included(end) => arena.key(id) <= end,
                Bound::Excluded(end) => arena.key(id) < end,
            })
    }

    /// Rewrites every id through `map` (after an arena compaction).
    pub fn remap(&mut self, map: impl Fn(EntryId) -> EntryId) {
        for id in self.chunks.iter_mut().flatten() {
            *id = map(*id);
        }
    }

    /// Every id, in key order.
    pub fn ids(&self) -> impl Iterator<Item = EntryId> + '_ {
        self.chunks.iter().flatten().copied()
    }

    /// Bytes this index holds on the heap (chunk capacities).
    #[cfg(test)]
    pub fn heap_bytes(&self) -> usize {
        self.chunks.len() * ORDER_CHUNK_IDS_MAX * size_of::<EntryId>()
    }
}

/// One id to sort, with the eight key bytes at the current depth.
#[derive(Clone, Copy)]
struct SortItem {
    /// Key bytes `depth..depth + 8`, big-endian, zero-padded.
    word: u64,
    /// Key bytes left from `depth`, capped at 9 (9 = "more than 8": the
    /// word does not settle the order).
    rest: u8,
    id: EntryId,
}

const WORD_BYTES: usize = 8;

fn sort_item(arena: &Arena, id: EntryId, depth: usize) -> SortItem {
    let key = arena.key(id);
    let tail = &key[depth.min(key.len())..];
    let mut word = [0u8; WORD_BYTES];
    let n = tail.len().min(WORD_BYTES);
    word[..n].copy_from_slice(&tail[..n]);
    SortItem {
        word: u64::from_be_bytes(word),
        rest: tail.len().min(WORD_BYTES + 1) as u8,
        id,
    }
}

/// `ids` in key order. Keys are compared eight bytes at a time as integers
/// (after the prefix all keys share), so the sort touches each key once per
/// eight bytes that matter instead of once per comparison. Two keys with
/// equal words compare by how many bytes they have left: fewer than eight
/// left means the shorter key is a prefix of the other, so it goes first.
fn sort_ids(arena: &Arena, ids: Vec<EntryId>) -> Vec<EntryId> {
    let Some(&first) = ids.first() else {
        return ids;
    };
    let first_key = arena.key(first);
    let shared = ids.iter().fold(first_key.len(), |shared, &id| {
        let key = arena.key(id);
        key.iter()
            .zip(&first_key[..shared])
            .take_while(|(a, b)| a == b)
            .count()
    });
    let mut items: Vec<SortItem> = ids.iter().map(|&id| sort_item(arena, id, shared)).collect();
    drop(ids);
    sort_items(arena, &mut items, shared);
    items.into_iter().map(|item| item.id).collect()
}

fn sort_items(arena: &Arena, items: &mut [SortItem], depth: usize) {
    items.sort_unstable_by_key(|item| (item.word, item.rest));
    let mut start = 0;
    while start < items.len() {
        let head = items[start];
        let mut end = start + 1;
        while end < items.len() && (items[end].word, items[end].rest) == (head.word, head.rest) {
            end += 1;
        }
        // Equal words with fewer than nine bytes left mean equal keys,
        // which the key directory never holds twice.
        if end - start > 1 {
            debug_assert!(head.rest as usize > WORD_BYTES);
            let run = &mut items[start..end];
            if run.len() <= SORT_RUN_COMPARE_MAX {
                run.sort_unstable_by(|a, b| arena.key(a.id).cmp(arena.key(b.id)));
            } else {
                let deeper = depth + WORD_BYTES;
                for item in run.iter_mut() {
                    *item = sort_item(arena, item.id, deeper);
                }
                sort_items(arena, run, deeper);
            }
        }
        start = end;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keydir::Location;
    use rand::seq::SliceRandom;
    use rand::{Rng, SeedableRng};

    fn at(seq: u64) -> Location {
        Location {
            file: 1,
            offset: 0,
            value_len: 0,
            seq,
            expiry_ms: 0,
        }
    }

    /// Keys with shared prefixes, zero bytes, prefixes of each other and
    /// long equal stretches: everything the word sort must order right.
    fn awkward_keys(rng: &mut impl Rng) -> Vec<Vec<u8>> {
        let mut keys = std::collections::BTreeSet::new();
        while keys.len() < 3000 {
            let mut key = b"user:".to_vec();
            match rng.random_range(0..4) {
                0 => key.extend(format!("{:020}", rng.random_range(0..100_000u64)).bytes()),
                1 => key.extend(std::iter::repeat_n(0u8, rng.random_range(0..20))),
                2 => key.extend(std::iter::repeat_n(b'x', rng.random_range(0..40))),
                _ => key.extend((0..rng.random_range(0..12)).map(|_| rng.random_range(0..3u8))),
            }
            keys.insert(key);
        }
        keys.into_iter().collect()
    }

    #[test]
    fn build_and_inserts_order_like_a_btreeset() {
        let mut rng = rand::rngs::SmallRng::seed_from_u64(7);
        let sorted = awkward_keys(&mut rng);
        let mut shuffled = sorted.clone();
        shuffled.shuffle(&mut rng);
        let mut arena = Arena::default();
        let ids: Vec<EntryId> = shuffled
            .iter()
            .enumerate()
            .map(|(i, key)| arena.push(key, &at(i as u64)).unwrap())
            .collect();
        let (built_ids, inserted_ids) = ids.split_at(ids.len() / 2);
        let mut order = Order::build(&arena, built_ids.to_vec());
        for &id in inserted_ids {
            order.insert(&arena, id);
        }
        let keys: Vec<&[u8]> = order.ids().map(|id| arena.key(id)).collect();
        let expected: Vec<&[u8]> = sorted.iter().map(Vec::as_slice).collect();
        assert_eq!(keys, expected);
        // Ranges from every kind of bound.
        let start = sorted[100].as_slice();
        let end = sorted[200].as_slice();
        let got: Vec<&[u8]> = order
            .range(&arena, Bound::Excluded(start), Bound::Included(end))
            .map(|id| arena.key(id))
            .collect();
        assert_eq!(got, expected[101..=200].to_vec());
        // Removing everything leaves an empty index, with merges on the way.
        for &id in &ids[..ids.len() - 10] {
            order.remove(&arena, id);
        }
        assert!(order.chunks.len() <= 2);
        assert_eq!(order.ids().count(), 10);
    }
}
