//! The slab: owner of every key directory slot, named by a `u32` id (which
//! changes when a slot moves to another size class or compaction moves it
//! down; the key directory repoints its indexes then).
//!
//! Slots live inline in fixed-size cells, one class per cell size
//! ([`CELL_BYTES`]), so a key costs its cell and nothing else: no heap
//! allocation of its own, no pointer to it, no allocator header. Reading a
//! slot by id is one memory access into the class's chunk (the pointer
//! chase a boxed slot would add is gone). A slot longer than the largest
//! cell holds (keys over about 220 bytes) is boxed, in the last class.
//!
//! Cell layout: byte 0 is the slot's length (0 = a free cell), then the
//! slot (`slot.rs`), then unused bytes up to the cell size.
//!
//! Id layout: the class in the top [`CLASS_BITS`] bits, the cell's index in
//! its class below them. Each class reuses its lowest free index first and
//! drops a trailing chunk once no slot in it is live; a class under half
//! full compacts (the key directory moves slots of its last chunk into its
//! lowest free cells, a few per delete), so after deletes anywhere a class
//! shrinks to about twice its live slots.

use std::collections::BTreeSet;

use super::slot::SlotRef;

/// Cell sizes of the inline classes in bytes (length byte included), in
/// increasing order: steps of 8 bytes up to 64, then wider.
const CELL_BYTES: [usize; 15] = [
    16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256,
];
/// The class of slots too long for any cell: one boxed allocation each.
const BOXED_CLASS: usize = CELL_BYTES.len();
const CLASSES: usize = BOXED_CLASS + 1;
/// Bits of an id naming its class.
const CLASS_BITS: u32 = 4;
const CLASS_SHIFT: u32 = 32 - CLASS_BITS;
const INDEX_MASK: u32 = (1 << CLASS_SHIFT) - 1;
const _: () = assert!(CLASSES <= 1 << CLASS_BITS);
/// Largest slot a cell holds: its length must fit the length byte.
const INLINE_SLOT_BYTES_MAX: usize = CELL_BYTES[CELL_BYTES.len() - 1] - 1;
const _: () = assert!(INLINE_SLOT_BYTES_MAX <= u8::MAX as usize);
/// Cells per chunk: a class grows by one chunk (1024 cells, 16 to 256 KiB)
/// at a time, never by doubling.
const CHUNK_CELLS: usize = 1024;
const CHUNK_SHIFT: u32 = CHUNK_CELLS.trailing_zeros();
const _: () = assert!(CHUNK_CELLS.is_power_of_two() && CHUNK_CELLS <= u16::MAX as usize);

/// A class holding fewer live slots than 1/this of its cells compacts:
/// each delete moves a few slots from its last chunk into its lowest free
/// cells, so scattered deletes empty trailing chunks too.
const COMPACT_BELOW_FULL_RATIO: usize = 2;
/// Slots a delete moves down, at most, while its class compacts.
pub(super) const COMPACT_MOVES_PER_DELETE: usize = 2;

/// The class a slot of `len` bytes goes to.
fn class_of(len: usize) -> usize {
    CELL_BYTES
        .iter()
        .position(|&cell| cell > len)
        .unwrap_or(BOXED_CLASS)
}

/// A chunk of the boxed class: one optional boxed slot per cell.
type BoxedChunk = Box<[Option<Box<[u8]>>]>;

/// Where a class keeps its slots.
enum Cells {
    /// Chunks of `cell`-byte cells.
    Inline { cell: usize, chunks: Vec<Box<[u8]>> },
    /// Chunks of boxed slots.
    Boxed { chunks: Vec<BoxedChunk> },
}

/// One size class.
struct Class {
    cells: Cells,
    /// Live slots per chunk.
    live: Vec<u16>,
    /// Freed indexes below `high` (ordered: the lowest is reused first, and
    /// dropping trailing chunks cuts the set's tail).
    free: BTreeSet<u32>,
    /// Indexes below this are in a chunk.
    high: u32,
    /// Live slots in all.
    live_total: u32,
    /// At least the highest live index (compaction scans down from it).
    top_live: u32,
}

impl Class {
    fn new(class: usize) -> Class {
        let cells = match CELL_BYTES.get(class) {
            Some(&cell) => Cells::Inline {
                cell,
                chunks: Vec::new(),
            },
            None => Cells::Boxed { chunks: Vec::new() },
        };
        Class {
            cells,
            live: Vec::new(),
            free: BTreeSet::new(),
            high: 0,
            live_total: 0,
            top_live: 0,
        }
    }

    /// The slot in cell `index`, `None` for a free cell.
    #[inline]
    fn cell(&self, index: u32) -> Option<&[u8]> {
        let (chunk, at) = (
            (index >> CHUNK_SHIFT) as usize,
            index as usize & (CHUNK_CELLS - 1),
        );
        match &self.cells {
            Cells::Inline { cell, chunks } => {
                let bytes = &chunks[chunk][at * cell..(at + 1) * cell];
                let len = bytes[0] as usize;
                (len > 0).then(|| &bytes[1..1 + len])
            }
            Cells::Boxed { chunks } => chunks[chunk][at].as_deref(),
        }
    }

    #[inline]
    fn get(&self, index: u32) -> &[u8] {
        self.cell(index)
            .expect("an id the indexes hold names a live slot")
    }

    /// Stores `slot` (of this class) at `index`.
    fn set(&mut self, index: u32, slot: &[u8]) {
        let (chunk, at) = (
            (index >> CHUNK_SHIFT) as usize,
            index as usize & (CHUNK_CELLS - 1),
        );
        match &mut self.cells {
            Cells::Inline { cell, chunks } => {
                let bytes = &mut chunks[chunk][at * *cell..(at + 1) * *cell];
                bytes[0] = slot.len() as u8;
                bytes[1..1 + slot.len()].copy_from_slice(slot);
            }
            Cells::Boxed { chunks } => chunks[chunk][at] = Some(slot.into()),
        }
    }

    fn clear(&mut self, index: u32) {
        let (chunk, at) = (
            (index >> CHUNK_SHIFT) as usize,
            index as usize & (CHUNK_CELLS - 1),
        );
        match &mut self.cells {
            Cells::Inline { cell, chunks } => chunks[chunk][at * *cell] = 0,
            Cells::Boxed { chunks } => chunks[chunk][at] = None,
        }
    }

    fn chunks(&self) -> usize {
        self.live.len()
    }

    /// Stores `slot` in a free cell; `None` when the class holds
    /// [`INDEX_MASK`] + 1 slots already.
    fn alloc(&mut self, slot: &[u8]) -> Option<u32> {
        let index = match self.free.pop_first() {
            Some(index) => index,
            None => {
                let index = self.high;
                if index > INDEX_MASK {
                    return None;
                }
                self.high += 1;
                if (index >> CHUNK_SHIFT) as usize == self.chunks() {
                    match &mut self.cells {
                        Cells::Inline { cell, chunks } => {
                            chunks.push(vec![0u8; *cell * CHUNK_CELLS].into_boxed_slice());
                        }
                        Cells::Boxed { chunks } => {
                            chunks.push((0..CHUNK_CELLS).map(|_| None).collect());
                        }
                    }
                    self.live.push(0);
                }
                index
            }
        };
        self.set(index, slot);
        self.live[(index >> CHUNK_SHIFT) as usize] += 1;
        self.live_total += 1;
        self.top_live = self.top_live.max(index);
        Some(index)
    }

    fn release(&mut self, index: u32) {
        self.clear(index);
        self.live[(index >> CHUNK_SHIFT) as usize] -= 1;
        self.live_total -= 1;
        self.free.insert(index);
        if self.live.last() == Some(&0) {
            while self.live.last() == Some(&0) {
                self.live.pop();
                match &mut self.cells {
                    Cells::Inline { chunks, .. } => drop(chunks.pop()),
                    Cells::Boxed { chunks } => drop(chunks.pop()),
                }
            }
            self.high = (self.chunks() as u32) << CHUNK_SHIFT;
            drop(self.free.split_off(&self.high));
            self.top_live = self.top_live.min(self.high.saturating_sub(1));
        }
    }

    /// The highest live index, when the class is less than half full and
    /// a free cell lies below its last chunk: the slot compaction moves
    /// down next (moving slots within the only chunk would free nothing).
    fn compaction_candidate(&mut self) -> Option<u32> {
        if self.live_total as usize * COMPACT_BELOW_FULL_RATIO >= self.high as usize {
            return None;
        }
        let last = self.chunks().checked_sub(1)?;
        let start = (last as u32) << CHUNK_SHIFT;
        if *self.free.first()? >= start {
            return None;
        }
        let from = self.top_live.min(self.high - 1);
        let top = (start..=from).rev().find(|&index| self.is_live(index))?;
        self.top_live = top;
        Some(top)
    }

    fn is_live(&self, index: u32) -> bool {
        self.cell(index).is_some()
    }

    /// Every live slot with its index, in index order.
    fn live(&self) -> impl Iterator<Item = (u32, &[u8])> + '_ {
        (0..self.high).filter_map(move |index| Some((index, self.cell(index)?)))
    }
}

/// Every slot of the key directory, by id.
pub(super) struct Slab {
    classes: [Class; CLASSES],
}

impl Default for Slab {
    fn default() -> Slab {
        Slab {
            classes: std::array::from_fn(Class::new),
        }
    }
}

impl std::fmt::Debug for Slab {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let chunks: Vec<usize> = self.classes.iter().map(Class::chunks).collect();
        f.debug_struct("Slab")
            .field("chunks_per_class", &chunks)
            .finish_non_exhaustive()
    }
}

#[inline]
fn split(id: u32) -> (usize, u32) {
    ((id >> CLASS_SHIFT) as usize, id & INDEX_MASK)
}

impl Slab {
    /// The slot `id` names (a live one: ids come from the indexes).
    #[inline]
    pub(super) fn slot(&self, id: u32) -> SlotRef<'_> {
        let (class, index) = split(id);
        SlotRef(self.classes[class].get(index))
    }

    #[inline]
    pub(super) fn key(&self, id: u32) -> &[u8] {
        self.slot(id).key()
    }

    /// Stores a new slot; returns its id. A class that is full (2^28
    /// slots) passes the slot on to the next larger one.
    pub(super) fn alloc(&mut self, slot: &[u8]) -> u32 {
        let first = class_of(slot.len());
        for class in first..CLASSES {
            if let Some(index) = self.classes[class].alloc(slot) {
                return ((class as u32) << CLASS_SHIFT) | index;
            }
        }
        // Every class from this slot's up holds 2^28 slots: tens of GiB of
        // key directory, far past any memory this engine runs in.
        panic!("the key directory is full ({CLASSES} classes of 2^{CLASS_SHIFT} slots)")
    }

    /// Overwrites slot `id` with `slot` if it is of the same class (true),
    /// else leaves it (false: the caller moves it with a new id).
    pub(super) fn overwrite(&mut self, id: u32, slot: &[u8]) -> bool {
        let (class, index) = split(id);
        if class != class_of(slot.len()) {
            return false;
        }
        self.classes[class].set(index, slot);
        true
    }

    /// Frees slot `id`.
    pub(super) fn release(&mut self, id: u32) {
        let (class, index) = split(id);
        self.classes[class].release(index);
    }

    /// The slot compaction of `id`'s class (a class just freed a cell of)
    /// should move down next, if any.
    pub(super) fn compaction_candidate(&mut self, id: u32) -> Option<u32> {
        let (class, _) = split(id);
        let index = self.classes[class].compaction_candidate()?;
        Some(((class as u32) << CLASS_SHIFT) | index)
    }

    /// Copies slot `id` into its class's lowest free cell and returns the
    /// new id; the old cell stays live until released.
    pub(super) fn move_down(&mut self, id: u32) -> u32 {
        let (class, index) = split(id);
        let slot = self.classes[class].get(index).to_vec();
        let moved = self.classes[class]
            .alloc(&slot)
            .expect("a class compacts only with a free cell below");
        ((class as u32) << CLASS_SHIFT) | moved
    }

    /// Every live slot with its id.
    pub(super) fn live(&self) -> impl Iterator<Item = (u32, SlotRef<'_>)> + '_ {
        self.classes.iter().enumerate().flat_map(|(class, cells)| {
            cells.live().map(move |(index, bytes)| {
                (((class as u32) << CLASS_SHIFT) | index, SlotRef(bytes))
            })
        })
    }

    /// Chunks held, over all classes (tests).
    #[cfg(test)]
    pub(super) fn chunks(&self) -> usize {
        self.classes.iter().map(Class::chunks).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_fit_their_slots() {
        assert_eq!(class_of(1), 0);
        assert_eq!(class_of(15), 0);
        assert_eq!(class_of(16), 1);
        assert_eq!(class_of(40), 4);
        assert_eq!(class_of(INLINE_SLOT_BYTES_MAX), CELL_BYTES.len() - 1);
        assert_eq!(class_of(INLINE_SLOT_BYTES_MAX + 1), BOXED_CLASS);
        for len in 1..=INLINE_SLOT_BYTES_MAX {
            let class = class_of(len);
            assert!(CELL_BYTES[class] > len);
            assert!(class == 0 || CELL_BYTES[class - 1] <= len);
        }
    }

    #[test]
    fn cells_hold_reuse_and_shrink() {
        let mut slab = Slab::default();
        let small = slab.alloc(b"abc");
        let long = vec![7u8; 300];
        let boxed = slab.alloc(&long);
        assert_eq!(slab.slot(small).0, b"abc");
        assert_eq!(slab.slot(boxed).0, &long[..]);
        assert!(slab.overwrite(small, b"xyz"));
        assert!(!slab.overwrite(small, &[1u8; 40]), "another class");
        assert_eq!(slab.slot(small).0, b"xyz");
        let ids: Vec<u32> = (0..3000u32).map(|n| slab.alloc(&n.to_le_bytes())).collect();
        assert_eq!(slab.live().count(), 3002);
        for &id in ids.iter().rev() {
            slab.release(id);
        }
        assert_eq!(slab.chunks(), 2, "one chunk per class still holding a slot");
        slab.release(small);
        let again = slab.alloc(b"def");
        assert_eq!(again, small, "the lowest free index is reused");
        slab.release(again);
        slab.release(boxed);
        assert_eq!(slab.chunks(), 0);
        assert_eq!(slab.live().count(), 0);
    }
}
