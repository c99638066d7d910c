//! The key directory's order: the slab ids of every key, sorted by key, in
//! chunks of at most [`ORDER_CHUNK_IDS_MAX`] ids (a sorted list of sorted
//! lists, two levels deep).
//!
//! Each chunk keeps a copy of its first key, so finding the chunk for a key
//! is a binary search over a small, cache-resident array of short byte
//! strings; only the search inside one chunk reads slots (through the
//! slab). An id is 4 bytes, so the order costs about 4.6 bytes a key once
//! built in bulk (chunks 7/8 full) and about 6 when grown by random inserts
//! (chunks between half and wholly full). Point lookups never touch it:
//! they go through the hash index; the order serves scans and ranges.

use super::Slab;

/// Ids in a full chunk: an insert into it splits it in two. A chunk's ids
/// are allocated at this capacity once, so a chunk is 2 KiB of ids and an
/// insert moves at most that much.
pub(super) const ORDER_CHUNK_IDS_MAX: usize = 512;
/// A chunk this small after a removal joins a neighbour when the two fit in
/// [`ORDER_JOINED_IDS_MAX`].
const ORDER_CHUNK_IDS_MIN: usize = ORDER_CHUNK_IDS_MAX / 4;
/// Largest chunk a join makes (leaves room for inserts before a split).
const ORDER_JOINED_IDS_MAX: usize = ORDER_CHUNK_IDS_MAX * 3 / 4;
/// Ids per chunk when the order is built in bulk from sorted ids.
const ORDER_BULK_FILL: usize = ORDER_CHUNK_IDS_MAX * 7 / 8;

#[derive(Debug)]
struct Chunk {
    /// The key of `ids[0]` (a copy: the chunk search reads no slot).
    first: Box<[u8]>,
    /// Never empty; sorted by key.
    ids: Vec<u32>,
}

impl Chunk {
    fn new(slab: &Slab, ids: &[u32]) -> Chunk {
        let mut held = Vec::with_capacity(ORDER_CHUNK_IDS_MAX);
        held.extend_from_slice(ids);
        Chunk {
            first: slab.key(ids[0]).into(),
            ids: held,
        }
    }

    /// Position of the first id whose key is ≥ `key` (`inclusive`) or
    /// > `key` (not `inclusive`).
    fn bound(&self, slab: &Slab, key: &[u8], inclusive: bool) -> usize {
        if inclusive {
            self.ids.partition_point(|&id| slab.key(id) < key)
        } else {
            self.ids.partition_point(|&id| slab.key(id) <= key)
        }
    }
}

/// Slab ids sorted by key.
#[derive(Debug, Default)]
pub(super) struct Order {
    chunks: Vec<Chunk>,
}

/// A position in the order: chunk, then index in it (may be one past the
/// chunk's end, which reads as the start of the next chunk).
pub(super) type Position = (usize, usize);

impl Order {
    /// Builds the order from ids already sorted by key.
    pub(super) fn from_sorted(slab: &Slab, ids: impl ExactSizeIterator<Item = u32>) -> Order {
        let mut chunks = Vec::with_capacity(ids.len().div_ceil(ORDER_BULK_FILL));
        let mut part = Vec::with_capacity(ORDER_BULK_FILL);
        for id in ids {
            part.push(id);
            if part.len() == ORDER_BULK_FILL {
                chunks.push(Chunk::new(slab, &part));
                part.clear();
            }
        }
        if !part.is_empty() {
            chunks.push(Chunk::new(slab, &part));
        }
        Order { chunks }
    }

    /// The chunk `key` belongs in: the last whose first key is ≤ `key`, or
    /// the first chunk when `key` precedes them all.
    fn chunk_for(&self, key: &[u8]) -> usize {
        self.chunks
            .partition_point(|chunk| &*chunk.first <= key)
            .saturating_sub(1)
    }

    /// Where the first key ≥ `key` (`inclusive`) or > `key` is.
    pub(super) fn bound(&self, slab: &Slab, key: &[u8], inclusive: bool) -> Position {
        if self.chunks.is_empty() {
            return (0, 0);
        }
        let chunk = self.chunk_for(key);
        (chunk, self.chunks[chunk].bound(slab, key, inclusive))
    }

    /// Ids in key order from `from`.
    pub(super) fn ids_from(&self, from: Position) -> impl Iterator<Item = u32> + '_ {
        let (chunk, index) = from;
        self.chunks
            .get(chunk..)
            .unwrap_or_default()
            .iter()
            .enumerate()
            .flat_map(move |(i, c)| {
                let start = if i == 0 { index.min(c.ids.len()) } else { 0 };
                c.ids[start..].iter().copied()
            })
    }

    /// Inserts `id`, whose key `key` is not in the order yet.
    pub(super) fn insert(&mut self, slab: &Slab, key: &[u8], id: u32) {
        if self.chunks.is_empty() {
            self.chunks.push(Chunk::new(slab, &[id]));
            return;
        }
        let index = self.chunk_for(key);
        let chunk = &mut self.chunks[index];
        let at = chunk.bound(slab, key, true);
        chunk.ids.insert(at, id);
        if at == 0 {
            chunk.first = key.into();
        }
        if chunk.ids.len() >= ORDER_CHUNK_IDS_MAX {
            let tail = Chunk::new(slab, &chunk.ids[ORDER_CHUNK_IDS_MAX / 2..]);
            chunk.ids.truncate(ORDER_CHUNK_IDS_MAX / 2);
            self.chunks.insert(index + 1, tail);
        }
    }

    /// Replaces `old`, whose key is `key`, with `new` (same key, new slot).
    pub(super) fn repoint(&mut self, slab: &Slab, key: &[u8], old: u32, new: u32) {
        let (index, at) = self.bound(slab, key, true);
        match self.chunks.get_mut(index).and_then(|c| c.ids.get_mut(at)) {
            Some(id) if *id == old => *id = new,
            _ => debug_assert!(false, "repointing a key the order does not hold"),
        }
    }

    /// Removes `id`, whose key is `key` (its slot must still be in the slab).
    pub(super) fn remove(&mut self, slab: &Slab, key: &[u8], id: u32) {
        let (index, at) = self.bound(slab, key, true);
        let Some(chunk) = self.chunks.get_mut(index) else {
            debug_assert!(false, "removing a key the order does not hold");
            return;
        };
        if chunk.ids.get(at) != Some(&id) {
            debug_assert!(false, "removing a key the order does not hold");
            return;
        }
        chunk.ids.remove(at);
        if chunk.ids.is_empty() {
            self.chunks.remove(index);
            return;
        }
        if at == 0 {
            chunk.first = slab.key(chunk.ids[0]).into();
        }
        if chunk.ids.len() < ORDER_CHUNK_IDS_MIN {
            self.join_around(index);
        }
    }

    /// Joins the small chunk at `index` with a neighbour when they fit in
    /// one chunk of [`ORDER_JOINED_IDS_MAX`] ids.
    fn join_around(&mut self, index: usize) {
        let len = self.chunks[index].ids.len();
        let (left, right) = if self
            .chunks
            .get(index + 1)
            .is_some_and(|next| next.ids.len() + len <= ORDER_JOINED_IDS_MAX)
        {
            (index, index + 1)
        } else if index > 0 && self.chunks[index - 1].ids.len() + len <= ORDER_JOINED_IDS_MAX {
            (index - 1, index)
        } else {
            return;
        };
        let moved = self.chunks.remove(right);
        self.chunks[left].ids.extend_from_slice(&moved.ids);
    }

    /// Number of ids held (walks the chunks; for tests and checks).
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.chunks.iter().map(|c| c.ids.len()).sum()
    }

    /// Checks every invariant (tests only): chunks non-empty and within
    /// bounds, `first` equal to the first id's key, keys strictly ascending.
    #[cfg(test)]
    pub(super) fn check(&self, slab: &Slab) {
        let mut last: Option<&[u8]> = None;
        for chunk in &self.chunks {
            assert!(!chunk.ids.is_empty());
            assert!(chunk.ids.len() < ORDER_CHUNK_IDS_MAX);
            assert_eq!(&*chunk.first, slab.key(chunk.ids[0]));
            for &id in &chunk.ids {
                let key = slab.key(id);
                assert!(last.is_none_or(|last| last < key), "keys out of order");
                last = Some(key);
            }
        }
    }
}
