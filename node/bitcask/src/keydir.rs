//! The key directory: an ordered in-memory map from key to where its latest
//! value lives.
//!
//! Memory per key is a headline figure, so each entry is a single heap
//! allocation holding a compact location (about 15 bytes plus the record
//! meta, see the slot layout below) followed by the key bytes, and the
//! ordered set stores only that allocation's 16-byte fat pointer. Entries
//! compare by their key part, so the set answers exact lookups and range or
//! prefix scans. Tombstones are not kept: a deleted key is simply absent.
//!
//! Slot layout (one boxed byte slice per key; its length is in the fat
//! pointer the set holds):
//!
//! | offset | size | field |
//! |---:|---:|---|
//! | 0 | 1 | location length `n`: bytes of the location at the end |
//! | 1 | rest − `n` | the key |
//! | len − `n` | 4 | file number (u32 LE) |
//! | +4 | 4 | record offset in that file (u32 LE) |
//! | +8 | 1–5 | value length (LEB128) |
//! | … | 1–10 | sequence number (LEB128) |
//! | … | 1–10 | expiry ms, 0 = never (LEB128; almost always 1 byte) |
//! | … | 1 | record meta length `m` (0..=RECORD_META_BYTES_MAX) |
//! | … | `m` | record meta |
//!
//! The key starts at byte 1, next to the byte that says where it ends, so a
//! comparison touches the slot where the key is (usually one cache line, as
//! with a fixed header in front); the location, read once per lookup, sits
//! behind the key.

use std::borrow::Borrow;
use std::collections::{BTreeSet, HashMap};
use std::ops::Bound;

use crate::format::{record_size, u32_at};
use crate::options::RECORD_META_BYTES_MAX;
use crate::record_meta::RecordMeta;

const SLOT_LOCATION_LEN_OFFSET: usize = 0; // u8: bytes of location at the end of the slot
const SLOT_KEY_OFFSET: usize = 1; // the key, up to the location
const LOCATION_FILE_OFFSET: usize = 0; // u32: engine-internal file number
const LOCATION_RECORD_OFFSET: usize = 4; // u32: record offset in that file
const LOCATION_VARINTS_OFFSET: usize = 8; // LEB128 value length, sequence, expiry ms; then meta
/// Largest LEB128 encoding of a u32 and of a u64.
const VARINT_U32_BYTES_MAX: usize = 5;
const VARINT_U64_BYTES_MAX: usize = 10;
/// Largest location part of a slot.
const LOCATION_BYTES_MAX: usize = LOCATION_VARINTS_OFFSET
    + VARINT_U32_BYTES_MAX
    + 2 * VARINT_U64_BYTES_MAX
    + 1
    + RECORD_META_BYTES_MAX;
const _: () = assert!(LOCATION_BYTES_MAX <= u8::MAX as usize);
/// Bytes of a slot besides the key for a location with the smallest varints
/// and no meta: the figure the per-key memory budget starts from (it grows
/// with the sequence number's size and the meta).
pub const SLOT_HEADER_SIZE_BYTES: usize = SLOT_KEY_OFFSET + LOCATION_VARINTS_OFFSET + 3 + 1;

/// Where a key's latest record lives, and its version, expiry and meta.
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
    /// The record's meta.
    pub meta: RecordMeta,
}

impl Location {
    /// Whether the value has expired at `now_ms`.
    pub fn expired(&self, now_ms: u64) -> bool {
        self.expiry_ms != 0 && self.expiry_ms <= now_ms
    }

    /// Size of the record on disk, given its key length.
    pub fn record_size(&self, key_len: usize) -> usize {
        record_size(key_len, self.value_len as usize, self.meta.len())
    }
}

/// Appends `value` as LEB128 (7 bits a byte, low bits first).
fn put_varint(out: &mut [u8], pos: &mut usize, mut value: u64) {
    loop {
        let byte = (value & 0x7f) as u8;
        value >>= 7;
        if value == 0 {
            out[*pos] = byte;
            *pos += 1;
            return;
        }
        out[*pos] = byte | 0x80;
        *pos += 1;
    }
}

/// Reads a LEB128 value written by [`put_varint`] (slots are only ever
/// built by [`Slot::new`], so the bytes are well-formed).
fn get_varint(bytes: &[u8], pos: &mut usize) -> u64 {
    let mut value = 0u64;
    let mut shift = 0;
    loop {
        let byte = bytes[*pos];
        *pos += 1;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return value;
        }
        shift += 7;
    }
}

/// One entry: the key, then its location, in one allocation.
#[derive(Debug)]
struct Slot(Box<[u8]>);

impl Slot {
    fn new(key: &[u8], location: &Location) -> Slot {
        let mut tail = [0u8; LOCATION_BYTES_MAX];
        tail[LOCATION_FILE_OFFSET..LOCATION_FILE_OFFSET + 4]
            .copy_from_slice(&location.file.to_le_bytes());
        tail[LOCATION_RECORD_OFFSET..LOCATION_RECORD_OFFSET + 4]
            .copy_from_slice(&location.offset.to_le_bytes());
        let mut pos = LOCATION_VARINTS_OFFSET;
        put_varint(&mut tail, &mut pos, u64::from(location.value_len));
        put_varint(&mut tail, &mut pos, location.seq);
        put_varint(&mut tail, &mut pos, location.expiry_ms);
        let meta = location.meta.as_bytes();
        tail[pos] = meta.len() as u8;
        pos += 1;
        tail[pos..pos + meta.len()].copy_from_slice(meta);
        pos += meta.len();
        // Exactly sized: the allocation is the per-key memory figure.
        let mut bytes = Vec::with_capacity(SLOT_KEY_OFFSET + key.len() + pos);
        bytes.push(pos as u8);
        bytes.extend_from_slice(key);
        bytes.extend_from_slice(&tail[..pos]);
        Slot(bytes.into_boxed_slice())
    }

    #[inline]
    fn key(&self) -> &[u8] {
        let location_len = self.0[SLOT_LOCATION_LEN_OFFSET] as usize;
        &self.0[SLOT_KEY_OFFSET..self.0.len() - location_len]
    }

    fn location(&self) -> Location {
        let location_len = self.0[SLOT_LOCATION_LEN_OFFSET] as usize;
        let bytes = &self.0[self.0.len() - location_len..];
        let mut pos = LOCATION_VARINTS_OFFSET;
        let value_len = get_varint(bytes, &mut pos) as u32;
        let seq = get_varint(bytes, &mut pos);
        let expiry_ms = get_varint(bytes, &mut pos);
        let meta_len = bytes[pos] as usize;
        pos += 1;
        let meta = RecordMeta::new(&bytes[pos..pos + meta_len])
            .expect("a slot holds a meta that fitted when it was built");
        Location {
            file: u32_at(bytes, LOCATION_FILE_OFFSET),
            offset: u32_at(bytes, LOCATION_RECORD_OFFSET),
            value_len,
            seq,
            expiry_ms,
            meta,
        }
    }
}

impl Borrow<[u8]> for Slot {
    #[inline]
    fn borrow(&self) -> &[u8] {
        self.key()
    }
}

impl PartialEq for Slot {
    fn eq(&self, other: &Self) -> bool {
        self.key() == other.key()
    }
}
impl Eq for Slot {}
impl PartialOrd for Slot {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Slot {
    #[inline]
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.key().cmp(other.key())
    }
}

/// The key directory plus the live-byte accounting that depends on it.
#[derive(Debug, Default)]
pub struct KeyDir {
    set: BTreeSet<Slot>,
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
}

impl KeyDir {
    /// Location of `key`, if present (expired or not).
    pub fn get(&self, key: &[u8]) -> Option<Location> {
        self.set.get(key).map(Slot::location)
    }

    /// Records that `key` now lives at `location`.
    pub fn put(&mut self, key: &[u8], location: Location) {
        self.applied_seq = self.applied_seq.max(location.seq);
        self.expiry_high_ms = self.expiry_high_ms.max(location.expiry_ms);
        *self.live_bytes.entry(location.file).or_default() +=
            location.record_size(key.len()) as u64;
        match self.set.replace(Slot::new(key, &location)) {
            Some(old) => self.forget_bytes(key.len(), &old.location()),
            None => self.key_bytes += key.len() as u64,
        }
    }

    /// The latest expiry any put since open carried (0 = none): until time
    /// passes it, some key may still be waiting to expire.
    pub fn expiry_high_ms(&self) -> u64 {
        self.expiry_high_ms
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
            .set
            .iter()
            .map(|slot| slot.location().expiry_ms)
            .max()
            .unwrap_or(0);
    }

    /// Records that `key` was deleted by the record with `seq`.
    pub fn delete(&mut self, key: &[u8], seq: u64) {
        self.applied_seq = self.applied_seq.max(seq);
        if let Some(old) = self.set.take(key) {
            self.key_bytes -= key.len() as u64;
            self.forget_bytes(key.len(), &old.location());
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
        self.set
            .range::<[u8], _>((start, end))
            .map(|slot| (slot.key(), slot.location()))
    }

    /// Every entry, in key order.
    pub fn iter(&self) -> impl Iterator<Item = (&[u8], Location)> + '_ {
        self.set.iter().map(|slot| (slot.key(), slot.location()))
    }

    /// Number of keys.
    pub fn len(&self) -> usize {
        self.set.len()
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

    /// Pins the per-key size: the budget is 64 B of key directory per key
    /// beyond the key (measured by `engine-probe`: slot + 16-byte pointer in
    /// the B-tree + the B-tree's own slack, about 11 B). A benchmark key of
    /// 25 bytes with an 8-byte meta, a 100-byte value and a sequence number
    /// around a million must stay a 48-byte allocation.
    #[test]
    fn slot_size_is_pinned_for_a_benchmark_key_with_an_8_byte_meta() {
        let key = b"user:00000000000000123456";
        let location = Location {
            file: 3,
            offset: 123_456_789,
            value_len: 100,
            seq: 1_000_000,
            expiry_ms: 0,
            meta: RecordMeta::new(&[0x81, 0x01, 0x02, 0x83, 0x7f, 0x05, 0x00, 0x01]).unwrap(),
        };
        let slot = Slot::new(key, &location);
        // 1 location length + 25 key + 4 file + 4 offset + 1 value length
        // + 3 seq + 1 expiry + 1 meta length + 8 meta.
        assert_eq!(slot.0.len(), 48);
        assert_eq!(slot.key(), key);
        assert_eq!(slot.location(), location);
        let no_meta = Slot::new(
            key,
            &Location {
                meta: RecordMeta::EMPTY,
                ..location
            },
        );
        assert_eq!(no_meta.0.len(), 40);
        assert_eq!(
            Slot::new(b"k", &at(1, 1)).0.len(),
            SLOT_HEADER_SIZE_BYTES + 1
        );
    }

    #[test]
    fn slots_round_trip_extreme_locations() {
        let full = RecordMeta::new(&[0xff; RECORD_META_BYTES_MAX]).unwrap();
        for (value_len, seq, expiry_ms, meta) in [
            (0, 0, 0, RecordMeta::EMPTY),
            (u32::MAX, u64::MAX, u64::MAX, full),
            (127, 128, 16_383, RecordMeta::new(b"x").unwrap()),
            (128, 16_384, 1 << 63, full),
        ] {
            let location = Location {
                file: u32::MAX,
                offset: u32::MAX,
                value_len,
                seq,
                expiry_ms,
                meta,
            };
            let key = vec![0xffu8; 300];
            let slot = Slot::new(&key, &location);
            assert_eq!(slot.location(), location);
            assert_eq!(slot.key(), &key[..]);
        }
    }
}
