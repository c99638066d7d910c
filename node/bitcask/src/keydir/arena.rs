//! The arena: every key-directory entry (location and key) packed into
//! large chunks, addressed by a 4-byte [`EntryId`].
//!
//! One entry, little-endian, padded to [`ENTRY_ALIGN_BYTES`]:
//!
//! | offset | size | field |
//! |---:|---:|---|
//! | 0 | 4 | engine-internal file number ([`DEAD_FILE`] once the entry is freed) |
//! | 4 | 4 | record offset in that file |
//! | 8 | 4 | value length |
//! | 12 | 8 | sequence number |
//! | 20 | 8 | expiry, ms of the caller's clock; 0 = never |
//! | 28 | 2 | key length |
//! | 30 | key length | key |
//!
//! An entry never straddles two chunks, so it is one contiguous slice, and
//! a chunk is one allocation of [`ARENA_CHUNK_BYTES`]: per key the arena
//! costs the entry and its padding, with no allocator header. An update of
//! a key that is present rewrites its location in place; a delete leaves a
//! hole that [`Arena::compacted`] reclaims.

use super::Location;
use crate::format::{u16_at, u32_at, u64_at};

const ENTRY_FILE_OFFSET: usize = 0; // u32: engine-internal file number
const ENTRY_RECORD_OFFSET: usize = 4; // u32: record offset in that file
const ENTRY_VALUE_LEN_OFFSET: usize = 8; // u32: value length
const ENTRY_SEQ_OFFSET: usize = 12; // u64: sequence number
const ENTRY_EXPIRY_OFFSET: usize = 20; // u64: expiry ms, 0 = never
const ENTRY_KEY_LEN_OFFSET: usize = 28; // u16: key length
/// Bytes of an entry in front of its key.
pub const ENTRY_HEADER_SIZE_BYTES: usize = 30;
const _: () = assert!(ENTRY_KEY_LEN_OFFSET + 2 == ENTRY_HEADER_SIZE_BYTES);

/// Entries start at multiples of this, so an id counts 8-byte units and a
/// 4-byte id reaches 32 GiB of arena.
pub const ENTRY_ALIGN_BYTES: usize = 8;
/// Bytes of one arena chunk: large enough that the padding left at the end
/// of a chunk is small beside it (the largest entry, a 64 KiB key, fits),
/// small enough that an idle engine does not hold much more than it uses.
pub const ARENA_CHUNK_BYTES: usize = 1 << 20;
/// log2 of the 8-byte units in a chunk: an id is `chunk << 17 | unit`.
const CHUNK_UNITS_SHIFT: u32 = 17;
const _: () = assert!(ENTRY_ALIGN_BYTES << CHUNK_UNITS_SHIFT == ARENA_CHUNK_BYTES);
/// The largest entry: one holding a key of the format's largest size.
pub const ENTRY_SIZE_BYTES_MAX: usize =
    (ENTRY_HEADER_SIZE_BYTES + u16::MAX as usize).next_multiple_of(ENTRY_ALIGN_BYTES);
const _: () = assert!(ENTRY_SIZE_BYTES_MAX < ARENA_CHUNK_BYTES);
/// Most chunks a 4-byte id can address: 32 768 chunks, 32 GiB of entries.
pub const ARENA_CHUNKS_MAX: usize = 1 << (32 - CHUNK_UNITS_SHIFT);
/// File number that marks a freed entry (real file numbers start at 1 and
/// never reach it: the engine numbers files with a u32 counter from 1).
pub const DEAD_FILE: u32 = u32::MAX;

/// Where an entry lives in the arena.
pub type EntryId = u32;

/// Size in the arena of an entry holding a `key_len`-byte key.
pub fn entry_size_bytes(key_len: usize) -> usize {
    (ENTRY_HEADER_SIZE_BYTES + key_len).next_multiple_of(ENTRY_ALIGN_BYTES)
}

/// The packed entries.
#[derive(Debug, Default)]
pub struct Arena {
    chunks: Vec<Vec<u8>>,
    /// Bytes (padding included) of entries in use.
    live_bytes: usize,
    /// Bytes (padding included) of freed entries not yet reclaimed.
    dead_bytes: usize,
}

impl Arena {
    fn split(id: EntryId) -> (usize, usize) {
        let chunk = (id >> CHUNK_UNITS_SHIFT) as usize;
        let unit = (id & ((1 << CHUNK_UNITS_SHIFT) - 1)) as usize;
        (chunk, unit * ENTRY_ALIGN_BYTES)
    }

    fn bytes(&self, id: EntryId) -> &[u8] {
        let (chunk, at) = Arena::split(id);
        &self.chunks[chunk][at..]
    }

    fn bytes_mut(&mut self, id: EntryId) -> &mut [u8] {
        let (chunk, at) = Arena::split(id);
        &mut self.chunks[chunk][at..]
    }

    /// Bytes of live entries, padding included.
    pub fn live_bytes(&self) -> usize {
        self.live_bytes
    }

    /// Bytes of freed entries waiting for a compaction.
    pub fn dead_bytes(&self) -> usize {
        self.dead_bytes
    }

    /// Whether entries of `additional_bytes` in all are sure to fit: the
    /// chunks not yet allocated, each counted without room for one largest
    /// entry (the padding a chunk may end with).
    pub fn has_room(&self, additional_bytes: usize) -> bool {
        let spare_chunks = ARENA_CHUNKS_MAX - self.chunks.len();
        additional_bytes <= spare_chunks * (ARENA_CHUNK_BYTES - ENTRY_SIZE_BYTES_MAX)
    }

    /// Stores a new entry; `None` when the arena is full (see [`Arena::has_room`]).
    pub fn push(&mut self, key: &[u8], location: &Location) -> Option<EntryId> {
        debug_assert!(location.file != DEAD_FILE);
        let size = entry_size_bytes(key.len());
        let fits = self
            .chunks
            .last()
            .is_some_and(|chunk| chunk.len() + size <= ARENA_CHUNK_BYTES);
        if !fits {
            if self.chunks.len() == ARENA_CHUNKS_MAX {
                return None;
            }
            self.chunks.push(Vec::with_capacity(ARENA_CHUNK_BYTES));
        }
        let chunk_index = self.chunks.len() - 1;
        let chunk = self.chunks.last_mut().expect("a chunk was just ensured");
        let at = chunk.len();
        chunk.extend_from_slice(&location.file.to_le_bytes());
        chunk.extend_from_slice(&location.offset.to_le_bytes());
        chunk.extend_from_slice(&location.value_len.to_le_bytes());
        chunk.extend_from_slice(&location.seq.to_le_bytes());
        chunk.extend_from_slice(&location.expiry_ms.to_le_bytes());
        chunk.extend_from_slice(&(key.len() as u16).to_le_bytes());
        chunk.extend_from_slice(key);
        chunk.resize(at + size, 0);
        self.live_bytes += size;
        Some(((chunk_index as u32) << CHUNK_UNITS_SHIFT) | (at / ENTRY_ALIGN_BYTES) as u32)
    }

    /// The key of entry `id`.
    pub fn key(&self, id: EntryId) -> &[u8] {
        let bytes = self.bytes(id);
        let len = u16_at(bytes, ENTRY_KEY_LEN_OFFSET) as usize;
        &bytes[ENTRY_HEADER_SIZE_BYTES..ENTRY_HEADER_SIZE_BYTES + len]
    }

    /// The location of entry `id`.
    pub fn location(&self, id: EntryId) -> Location {
        let bytes = self.bytes(id);
        Location {
            file: u32_at(bytes, ENTRY_FILE_OFFSET),
            offset: u32_at(bytes, ENTRY_RECORD_OFFSET),
            value_len: u32_at(bytes, ENTRY_VALUE_LEN_OFFSET),
            seq: u64_at(bytes, ENTRY_SEQ_OFFSET),
            expiry_ms: u64_at(bytes, ENTRY_EXPIRY_OFFSET),
        }
    }

    /// Points entry `id` (whose key stays) at a new location.
    pub fn set_location(&mut self, id: EntryId, location: &Location) {
        debug_assert!(location.file != DEAD_FILE);
        let bytes = self.bytes_mut(id);
        bytes[ENTRY_FILE_OFFSET..ENTRY_FILE_OFFSET + 4]
            .copy_from_slice(&location.file.to_le_bytes());
        bytes[ENTRY_RECORD_OFFSET..ENTRY_RECORD_OFFSET + 4]
            .copy_from_slice(&location.offset.to_le_bytes());
        bytes[ENTRY_VALUE_LEN_OFFSET..ENTRY_VALUE_LEN_OFFSET + 4]
            .copy_from_slice(&location.value_len.to_le_bytes());
        bytes[ENTRY_SEQ_OFFSET..ENTRY_SEQ_OFFSET + 8].copy_from_slice(&location.seq.to_le_bytes());
        bytes[ENTRY_EXPIRY_OFFSET..ENTRY_EXPIRY_OFFSET + 8]
            .copy_from_slice(&location.expiry_ms.to_le_bytes());
    }

    /// Frees entry `id`: its bytes stay until the next compaction.
    pub fn free(&mut self, id: EntryId) {
        let size = entry_size_bytes(self.key(id).len());
        let bytes = self.bytes_mut(id);
        bytes[ENTRY_FILE_OFFSET..ENTRY_FILE_OFFSET + 4].copy_from_slice(&DEAD_FILE.to_le_bytes());
        self.live_bytes -= size;
        self.dead_bytes += size;
    }

    /// Every live entry, in arena order (the order they were stored in).
    pub fn live_ids(&self) -> impl Iterator<Item = EntryId> + '_ {
        self.chunks.iter().enumerate().flat_map(|(index, chunk)| {
            let mut at = 0;
            std::iter::from_fn(move || {
                while at < chunk.len() {
                    let here = at;
                    let key_len = u16_at(chunk, here + ENTRY_KEY_LEN_OFFSET) as usize;
                    at += entry_size_bytes(key_len);
                    if u32_at(chunk, here + ENTRY_FILE_OFFSET) != DEAD_FILE {
                        let id = ((index as u32) << CHUNK_UNITS_SHIFT)
                            | (here / ENTRY_ALIGN_BYTES) as u32;
                        return Some(id);
                    }
                }
                None
            })
        })
    }

    /// A new arena holding the entries `ids` (every live one) in that
    /// order, and in this one a forwarding note per moved entry: afterwards
    /// [`Arena::forwarded`] maps an old id to its new one. The old arena is
    /// only good for that.
    pub fn compacted(&mut self, ids: impl Iterator<Item = EntryId>) -> Arena {
        let mut fresh = Arena::default();
        for id in ids {
            let location = self.location(id);
            let new_id = fresh
                .push(self.key(id), &location)
                .expect("a compacted arena is no larger than the one it replaces");
            // The old entry's record-offset field now holds the new id.
            let bytes = self.bytes_mut(id);
            bytes[ENTRY_RECORD_OFFSET..ENTRY_RECORD_OFFSET + 4]
                .copy_from_slice(&new_id.to_le_bytes());
        }
        fresh
    }

    /// After [`Arena::compacted`]: the new id of the entry that was `id`.
    pub fn forwarded(&self, id: EntryId) -> EntryId {
        u32_at(self.bytes(id), ENTRY_RECORD_OFFSET)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(file: u32, seq: u64) -> Location {
        Location {
            file,
            offset: 7,
            value_len: 3,
            seq,
            expiry_ms: 9,
        }
    }

    #[test]
    fn entries_round_trip_and_never_straddle_chunks() {
        let mut arena = Arena::default();
        let big_key = vec![b'k'; u16::MAX as usize];
        let mut ids = Vec::new();
        for i in 0..100u64 {
            let key = if i % 5 == 4 {
                big_key.clone()
            } else {
                i.to_be_bytes().to_vec()
            };
            ids.push((key.clone(), arena.push(&key, &at(1, i)).unwrap()));
        }
        for (i, (key, id)) in ids.iter().enumerate() {
            assert_eq!(arena.key(*id), key.as_slice());
            assert_eq!(arena.location(*id), at(1, i as u64));
        }
        assert!(arena.chunks.len() > 1);
        assert!(arena.chunks.iter().all(|c| c.len() <= ARENA_CHUNK_BYTES));
    }

    #[test]
    fn free_and_compact_forward_ids() {
        let mut arena = Arena::default();
        let ids: Vec<EntryId> = (0..100u64)
            .map(|i| arena.push(&i.to_be_bytes(), &at(2, i)).unwrap())
            .collect();
        for id in ids.iter().step_by(2) {
            arena.free(*id);
        }
        assert_eq!(arena.live_bytes(), arena.dead_bytes());
        let live: Vec<EntryId> = arena.live_ids().collect();
        assert_eq!(live.len(), 50);
        let fresh = arena.compacted(live.iter().copied());
        assert_eq!(fresh.dead_bytes(), 0);
        assert_eq!(fresh.live_bytes(), arena.live_bytes());
        for (i, id) in ids.iter().enumerate().skip(1).step_by(2) {
            let new_id = arena.forwarded(*id);
            assert_eq!(fresh.key(new_id), (i as u64).to_be_bytes());
            assert_eq!(fresh.location(new_id).seq, i as u64);
        }
    }
}
