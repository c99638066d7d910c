//! The key directory's order: the slab ids of every key, sorted by key, in
//! chunks of at most [`ORDER_CHUNK_IDS_MAX`] ids (a sorted list of sorted
//! lists, two levels deep).
//!
//! Each chunk keeps a copy of its first key, so finding the chunk for a key
//! is a binary search over a small, cache-resident array of short byte
//! strings. Inside a chunk, every key shares the chunk's first `skip`
//! bytes, and the chunk keeps, beside each id, the next 4 bytes of its key
//! (a "word", big-endian, zero-padded): the search compares words and reads
//! a slot only when two words are equal, so placing a key costs about one
//! slot read instead of one per comparison. An id and its word are 8 bytes,
//! so the order costs about 9 bytes a key once built in bulk (chunks 7/8
//! full) and up to 12 when grown by random inserts. Point lookups never
//! touch it: they go through the hash index; the order serves scans,
//! ranges and the placing of new keys.

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
    /// Every key in the chunk starts with `first[..skip]`.
    skip: usize,
    /// Never empty; sorted by key.
    ids: Vec<u32>,
    /// `words[i]`: the 4 key bytes of `ids[i]` after `skip`.
    words: Vec<u32>,
}

/// The 4 bytes of `key` after its first `skip`, big-endian, zero-padded
/// (equal words between two keys sharing `skip` bytes leave their order to
/// the full keys).
#[inline]
fn word(key: &[u8], skip: usize) -> u32 {
    let mut bytes = [0u8; 4];
    let rest = key.get(skip..).unwrap_or_default();
    let n = rest.len().min(4);
    bytes[..n].copy_from_slice(&rest[..n]);
    u32::from_be_bytes(bytes)
}

/// Length of the common prefix of two keys.
fn common_prefix(a: &[u8], b: &[u8]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

impl Chunk {
    /// A chunk of sorted `ids` whose keys all start with `skip` shared bytes.
    fn new(slab: &Slab, ids: &[u32], skip: usize) -> Chunk {
        let mut held = Vec::with_capacity(ORDER_CHUNK_IDS_MAX);
        held.extend_from_slice(ids);
        let mut words = Vec::with_capacity(ORDER_CHUNK_IDS_MAX);
        words.extend(ids.iter().map(|&id| word(slab.key(id), skip)));
        Chunk {
            first: slab.key(ids[0]).into(),
            skip,
            ids: held,
            words,
        }
    }

    /// Sets `skip` and recomputes every word (reads every slot).
    fn reskip(&mut self, slab: &Slab, skip: usize) {
        self.skip = skip;
        for (word_at, &id) in self.words.iter_mut().zip(&self.ids) {
            *word_at = word(slab.key(id), skip);
        }
    }

    /// Position of the first id whose key is ≥ `key` (`inclusive`) or
    /// > `key` (not `inclusive`).
    fn bound(&self, slab: &Slab, key: &[u8], inclusive: bool) -> usize {
        let prefix = &self.first[..self.skip];
        if key.get(..self.skip) != Some(prefix) {
            // Not sharing the prefix every key here has: before or after all.
            return if key < prefix { 0 } else { self.ids.len() };
        }
        let probe = word(key, self.skip);
        let before = |i: usize| {
            let order = self.words[i]
                .cmp(&probe)
                .then_with(|| slab.key(self.ids[i]).cmp(key));
            if inclusive {
                order.is_lt()
            } else {
                order.is_le()
            }
        };
        // Binary search for the first position `before` says no to.
        let (mut low, mut high) = (0, self.ids.len());
        while low < high {
            let mid = low + (high - low) / 2;
            if before(mid) {
                low = mid + 1;
            } else {
                high = mid;
            }
        }
        low
    }

    /// Inserts `id` (key `key`) at `at`, lowering `skip` first if `key` does
    /// not share it.
    fn insert(&mut self, slab: &Slab, at: usize, key: &[u8], id: u32) {
        let shared = common_prefix(key, &self.first);
        if shared < self.skip {
            self.reskip(slab, shared);
        }
        self.ids.insert(at, id);
        self.words.insert(at, word(key, self.skip));
        if at == 0 {
            self.first = key.into();
        }
    }

    /// Splits off the upper half as a new chunk. Each half's `skip` becomes
    /// what its keys really share (its first and last key's common prefix,
    /// as they are sorted), which is often more than the whole chunk did:
    /// words past a longer prefix tell more keys apart.
    fn split(&mut self, slab: &Slab) -> Chunk {
        let half = self.ids.len() / 2;
        let mut tail = Chunk::new(slab, &self.ids[half..], 0);
        self.ids.truncate(half);
        self.words.truncate(half);
        tail.tighten(slab);
        self.tighten(slab);
        tail
    }

    /// Raises `skip` to the common prefix of the first and last key (all
    /// keys share it: they are sorted) and recomputes the words if it grew.
    fn tighten(&mut self, slab: &Slab) {
        let last = slab.key(self.ids[self.ids.len() - 1]);
        let shared = common_prefix(&self.first, last);
        if shared != self.skip {
            self.reskip(slab, shared);
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
    /// Builds the order from ids already sorted by key, each beside the 8
    /// bytes of its key after the first `shared` (which every key shares),
    /// big-endian and zero-padded: a chunk's words come from those bytes
    /// when its prefix ends within them, without reading a slot.
    pub(super) fn from_sorted(slab: &Slab, sorted: &[(u64, u32)], shared: usize) -> Order {
        let chunks = sorted
            .chunks(ORDER_BULK_FILL)
            .map(|part| {
                let (first, last) = (slab.key(part[0].1), slab.key(part[part.len() - 1].1));
                // Sorted: the first and last keys share what all of them share.
                let skip = common_prefix(first, last);
                let mut ids = Vec::with_capacity(ORDER_CHUNK_IDS_MAX);
                ids.extend(part.iter().map(|&(_, id)| id));
                let mut words = Vec::with_capacity(ORDER_CHUNK_IDS_MAX);
                match skip.checked_sub(shared).filter(|&shift| shift <= 4) {
                    Some(shift) => words.extend(
                        part.iter()
                            .map(|&(eight, _)| ((eight << (8 * shift)) >> 32) as u32),
                    ),
                    None => words.extend(ids.iter().map(|&id| word(slab.key(id), skip))),
                }
                Chunk {
                    first: first.into(),
                    skip,
                    ids,
                    words,
                }
            })
            .collect();
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

    /// Where the order ends (one past its last id).
    pub(super) fn end(&self) -> Position {
        (self.chunks.len(), 0)
    }

    /// Ids from `from` up to `to` (excluded), from the chunks' lengths
    /// alone: no slot read.
    pub(super) fn ids_between(&self, from: Position, to: Position) -> usize {
        let rank = |(chunk, index): Position| -> usize {
            let before: usize = self.chunks[..chunk.min(self.chunks.len())]
                .iter()
                .map(|c| c.ids.len())
                .sum();
            before + self.chunks.get(chunk).map_or(0, |c| index.min(c.ids.len()))
        };
        rank(to).saturating_sub(rank(from))
    }

    /// Inserts `id`, whose key `key` is not in the order yet.
    pub(super) fn insert(&mut self, slab: &Slab, key: &[u8], id: u32) {
        if self.chunks.is_empty() {
            self.chunks.push(Chunk::new(slab, &[id], key.len()));
            return;
        }
        let index = self.chunk_for(key);
        let chunk = &mut self.chunks[index];
        let at = chunk.bound(slab, key, true);
        chunk.insert(slab, at, key, id);
        if chunk.ids.len() >= ORDER_CHUNK_IDS_MAX {
            let tail = chunk.split(slab);
            self.chunks.insert(index + 1, tail);
        }
    }

    /// Where `id`, whose key is `key`, is: found by key, or (should the
    /// order ever disagree with the slab, which the tests say it does not)
    /// by a walk of every chunk, so a misplaced id is still found and
    /// removed or repointed (it is logged as an error).
    fn locate(&self, slab: &Slab, key: &[u8], id: u32) -> Option<Position> {
        let (index, at) = self.bound(slab, key, true);
        if self.chunks.get(index).and_then(|c| c.ids.get(at)) == Some(&id) {
            return Some((index, at));
        }
        debug_assert!(false, "the order does not hold the key where it sorts");
        tracing::error!(id, "key directory order: a key is not where it sorts");
        self.chunks
            .iter()
            .enumerate()
            .find_map(|(index, c)| Some((index, c.ids.iter().position(|&i| i == id)?)))
    }

    /// Replaces `old`, whose key is `key`, with `new` (same key, new slot).
    pub(super) fn repoint(&mut self, slab: &Slab, key: &[u8], old: u32, new: u32) {
        if let Some((index, at)) = self.locate(slab, key, old) {
            self.chunks[index].ids[at] = new;
        }
    }

    /// Removes `id`, whose key is `key` (its slot must still be in the slab).
    pub(super) fn remove(&mut self, slab: &Slab, key: &[u8], id: u32) {
        let Some((index, at)) = self.locate(slab, key, id) else {
            return;
        };
        let chunk = &mut self.chunks[index];
        chunk.ids.remove(at);
        chunk.words.remove(at);
        if chunk.ids.is_empty() {
            self.chunks.remove(index);
            return;
        }
        if at == 0 {
            chunk.first = slab.key(chunk.ids[0]).into();
        }
        if chunk.ids.len() < ORDER_CHUNK_IDS_MIN {
            self.join_around(slab, index);
        }
    }

    /// Joins the small chunk at `index` with a neighbour when they fit in
    /// one chunk of [`ORDER_JOINED_IDS_MAX`] ids.
    fn join_around(&mut self, slab: &Slab, index: usize) {
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
        let kept = &mut self.chunks[left];
        let skip = kept
            .skip
            .min(moved.skip)
            .min(common_prefix(&kept.first, &moved.first));
        kept.ids.extend_from_slice(&moved.ids);
        kept.words.extend_from_slice(&moved.words);
        if skip < kept.skip || skip < moved.skip {
            kept.reskip(slab, skip);
        }
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
            assert_eq!(chunk.ids.len(), chunk.words.len());
            for (&id, &w) in chunk.ids.iter().zip(&chunk.words) {
                let key = slab.key(id);
                assert!(key.starts_with(&chunk.first[..chunk.skip]), "skip too long");
                assert_eq!(w, word(key, chunk.skip), "stale word");
                assert!(last.is_none_or(|last| last < key), "keys out of order");
                last = Some(key);
            }
        }
    }
}
