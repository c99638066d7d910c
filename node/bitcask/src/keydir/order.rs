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
    /// Per chunk, its first key's sort word at `shared` bytes: finding the
    /// chunk of a key searches this compact array and dereferences an
    /// arena entry only when two words tie.
    heads: Vec<Word>,
    /// A prefix every key in the index starts with (it only shrinks: a key
    /// that does not share it cuts it to what they do share, and the heads
    /// are recomputed).
    shared: Vec<u8>,
}

/// A position: chunk, then index inside it.
type Position = (usize, usize);

fn new_chunk() -> Vec<EntryId> {
    Vec::with_capacity(ORDER_CHUNK_IDS_MAX)
}

/// Eight key bytes from some depth on, big-endian and zero-padded, and how
/// many bytes the key has left from that depth, capped at 9 (9 = "more
/// than 8": the word does not settle the order). Comparing `(word, rest)`
/// orders keys as their bytes do, except that two keys with rest 9 and
/// equal words need their later bytes compared: when the words tie and a
/// key has fewer than 9 bytes left, it is a prefix of the other one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Word {
    word: u64,
    rest: u8,
}

const WORD_BYTES: usize = 8;

fn word_at(key: &[u8], depth: usize) -> Word {
    let tail = &key[depth.min(key.len())..];
    let mut word = [0u8; WORD_BYTES];
    let n = tail.len().min(WORD_BYTES);
    word[..n].copy_from_slice(&tail[..n]);
    Word {
        word: u64::from_be_bytes(word),
        rest: tail.len().min(WORD_BYTES + 1) as u8,
    }
}

impl Order {
    /// The index of every live entry of `arena` (at open: one sort instead
    /// of one insert per key).
    pub fn build(arena: &Arena) -> Order {
        let (sorted, shared) = sort_ids(arena);
        let mut order = Order {
            chunks: Vec::with_capacity(sorted.len().div_ceil(ORDER_CHUNK_IDS_BUILD)),
            heads: Vec::new(),
            shared,
        };
        for part in sorted.chunks(ORDER_CHUNK_IDS_BUILD) {
            let mut chunk = new_chunk();
            chunk.extend(part.iter().map(|item| item.id));
            order.chunks.push(chunk);
        }
        order.recompute_heads(arena);
        order
    }

    fn recompute_heads(&mut self, arena: &Arena) {
        let depth = self.shared.len();
        self.heads = self
            .chunks
            .iter()
            .map(|chunk| word_at(arena.key(chunk[0]), depth))
            .collect();
    }

    fn refresh_head(&mut self, arena: &Arena, chunk: usize) {
        self.heads[chunk] = word_at(arena.key(self.chunks[chunk][0]), self.shared.len());
    }

    /// The first position whose key is not below `key` (`strict`: above).
    fn seek(&self, arena: &Arena, key: &[u8], strict: bool) -> Position {
        let end = (self.chunks.len(), 0);
        if self.chunks.is_empty() {
            return end;
        }
        let depth = self.shared.len();
        let head = &key[..depth.min(key.len())];
        if head != self.shared.as_slice() {
            // Every key in the index starts with `shared`; this one does not.
            return if head < self.shared.as_slice() {
                (0, 0)
            } else {
                end
            };
        }
        let before = |id: EntryId| match arena.key(id).cmp(key) {
            Ordering::Less => true,
            Ordering::Equal => strict,
            Ordering::Greater => false,
        };
        let probe = word_at(key, depth);
        let head_before = |chunk: usize| match self.heads[chunk].cmp(&probe) {
            Ordering::Less => true,
            Ordering::Greater => false,
            Ordering::Equal if probe.rest as usize > WORD_BYTES => before(self.chunks[chunk][0]),
            Ordering::Equal => strict,
        };
        // The first chunk whose head is not before `key`; the position is
        // in the chunk ahead of it (or at its start).
        let (mut low, mut high) = (0, self.heads.len());
        while low < high {
            let middle = low + (high - low) / 2;
            if head_before(middle) {
                low = middle + 1;
            } else {
                high = middle;
            }
        }
        let chunk = low;
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
            self.shared = key.to_vec();
            self.heads = vec![word_at(key, self.shared.len())];
            return;
        }
        let common = key
            .iter()
            .zip(&self.shared)
            .take_while(|(a, b)| a == b)
            .count();
        if common < self.shared.len() {
            self.shared.truncate(common);
            self.recompute_heads(arena);
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
            self.heads.insert(chunk + 1, self.heads[chunk]);
            self.refresh_head(arena, chunk + 1);
            if index > ORDER_CHUNK_IDS_MAX / 2 {
                chunk += 1;
                index -= ORDER_CHUNK_IDS_MAX / 2;
            }
        }
        self.chunks[chunk].insert(index, id);
        if index == 0 {
            self.refresh_head(arena, chunk);
        }
    }

    /// Removes `id` (present in the index).
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
            self.heads.remove(chunk);
            return;
        }
        if index == 0 {
            self.refresh_head(arena, chunk);
        }
        if len <= ORDER_CHUNK_IDS_MERGE {
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
            self.heads.remove(chunk + 1);
            self.chunks[chunk].extend_from_slice(&next);
        } else if chunk > 0 && fits(self.chunks[chunk - 1].len(), self.chunks[chunk].len()) {
            let this = self.chunks.remove(chunk);
            self.heads.remove(chunk);
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

    /// Rewrites every id through `map` (after an arena compaction; keys,
    /// and so the heads, stay the same).
    pub fn remap(&mut self, map: impl Fn(EntryId) -> EntryId) {
        for id in self.chunks.iter_mut().flatten() {
            *id = map(*id);
        }
    }

    /// Every id, in key order.
    pub fn ids(&self) -> impl Iterator<Item = EntryId> + '_ {
        self.chunks.iter().flatten().copied()
    }

    /// Asserts the invariants: heads match their chunks, every key starts
    /// with the shared prefix, no chunk is empty.
    #[cfg(test)]
    pub fn check_heads(&self, arena: &Arena) {
        assert_eq!(self.heads.len(), self.chunks.len());
        for (chunk, head) in self.chunks.iter().zip(&self.heads) {
            assert!(!chunk.is_empty());
            assert_eq!(*head, word_at(arena.key(chunk[0]), self.shared.len()));
            for &id in chunk {
                assert!(arena.key(id).starts_with(&self.shared));
            }
        }
    }
}

/// One id to sort, with its key's word at the current depth.
#[derive(Clone, Copy)]
struct SortItem {
    word: Word,
    id: EntryId,
}

/// Every live id of `arena` in key order, and the prefix all keys share.
/// Keys are compared eight bytes at a time as integers (after the shared
/// prefix), so the sort touches each key once per eight bytes that matter
/// instead of once per comparison; only ties are looked at again, deeper.
fn sort_ids(arena: &Arena) -> (Vec<SortItem>, Vec<u8>) {
    let Some(first) = arena.live_ids().next() else {
        return (Vec::new(), Vec::new());
    };
    let first_key = arena.key(first);
    let shared = arena.live_ids().fold(first_key.len(), |shared, id| {
        arena
            .key(id)
            .iter()
            .zip(&first_key[..shared])
            .take_while(|(a, b)| a == b)
            .count()
    });
    let mut items: Vec<SortItem> = arena
        .live_ids()
        .map(|id| SortItem {
            word: word_at(arena.key(id), shared),
            id,
        })
        .collect();
    sort_items(arena, &mut items, shared);
    (items, first_key[..shared].to_vec())
}

fn sort_items(arena: &Arena, items: &mut [SortItem], depth: usize) {
    items.sort_unstable_by_key(|item| item.word);
    let mut start = 0;
    while start < items.len() {
        let head = items[start].word;
        let mut end = start + 1;
        while end < items.len() && items[end].word == head {
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
                    item.word = word_at(arena.key(item.id), deeper);
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
        // Half the keys go in by a build, the rest one by one (a build sees
        // every live entry of its arena, so the second half is stored after).
        let (built_keys, inserted_keys) = shuffled.split_at(shuffled.len() / 2);
        let mut ids: Vec<EntryId> = built_keys
            .iter()
            .enumerate()
            .map(|(i, key)| arena.push(key, &at(i as u64)).unwrap())
            .collect();
        let mut order = Order::build(&arena);
        for (i, key) in inserted_keys.iter().enumerate() {
            let id = arena.push(key, &at(i as u64)).unwrap();
            order.insert(&arena, id);
            ids.push(id);
        }
        order.check_heads(&arena);
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
        order.check_heads(&arena);
        assert!(order.chunks.len() <= 2);
        assert_eq!(order.ids().count(), 10);
    }
}
