//! The key directory: an ordered in-memory map from key to where its latest
//! value lives.
//!
//! Memory per key is a headline figure, so each entry is a single heap
//! allocation holding a 28-byte location followed by the key bytes, and the
//! ordered set stores only that allocation's 16-byte fat pointer. Entries
//! compare by their key part, so the set answers exact lookups and range or
//! prefix scans. Tombstones are not kept: a deleted key is simply absent.

use std::borrow::Borrow;
use std::collections::{BTreeSet, HashMap};
use std::ops::Bound;

use crate::format::{record_size, u32_at, u64_at};

const SLOT_FILE_OFFSET: usize = 0; // u32: engine-internal file number
const SLOT_RECORD_OFFSET: usize = 4; // u32: record offset in that file
const SLOT_VALUE_LEN_OFFSET: usize = 8; // u32: value length
const SLOT_SEQ_OFFSET: usize = 12; // u64: sequence number
const SLOT_EXPIRY_OFFSET: usize = 20; // u64: expiry ms, 0 = never
/// Bytes of location stored in front of each key.
pub const SLOT_HEADER_SIZE_BYTES: usize = 28;

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

/// One entry: location header followed by the key, in one allocation.
#[derive(Debug)]
struct Slot(Box<[u8]>);

impl Slot {
    fn new(key: &[u8], location: &Location) -> Slot {
        let mut bytes = Vec::with_capacity(SLOT_HEADER_SIZE_BYTES + key.len());
        bytes.extend_from_slice(&location.file.to_le_bytes());
        bytes.extend_from_slice(&location.offset.to_le_bytes());
        bytes.extend_from_slice(&location.value_len.to_le_bytes());
        bytes.extend_from_slice(&location.seq.to_le_bytes());
        bytes.extend_from_slice(&location.expiry_ms.to_le_bytes());
        bytes.extend_from_slice(key);
        Slot(bytes.into_boxed_slice())
    }

    fn key(&self) -> &[u8] {
        &self.0[SLOT_HEADER_SIZE_BYTES..]
    }

    fn location(&self) -> Location {
        Location {
            file: u32_at(&self.0, SLOT_FILE_OFFSET),
            offset: u32_at(&self.0, SLOT_RECORD_OFFSET),
            value_len: u32_at(&self.0, SLOT_VALUE_LEN_OFFSET),
            seq: u64_at(&self.0, SLOT_SEQ_OFFSET),
            expiry_ms: u64_at(&self.0, SLOT_EXPIRY_OFFSET),
        }
    }
}

impl Borrow<[u8]> for Slot {
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
    /// high-water mark, not lowered by deletes or overwrites.
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
            record_size(key.len(), location.value_len as usize) as u64;
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
        let size = record_size(key_len, old.value_len as usize) as u64;
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
}
