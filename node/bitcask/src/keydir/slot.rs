//! One key directory entry: the key and where its latest value lives, as
//! the bytes the slab (`keydir/slab.rs`) keeps in a cell, encoded by
//! [`encode`] and read through a [`SlotRef`].
//!
//! Slot layout (its length is the cell's first byte, or the boxed slice's
//! length for a slot too long for a cell):
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
//! key comparison touches one cache line of the slot (usually); the
//! location, read once per lookup, sits behind the key.

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
/// built by [`encode`], so the bytes are well-formed).
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

/// Encodes `key`'s slot (layout above) into `out`, replacing what it held.
pub(super) fn encode(key: &[u8], location: &Location, out: &mut Vec<u8>) {
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
    out.clear();
    out.push(pos as u8);
    out.extend_from_slice(key);
    out.extend_from_slice(&tail[..pos]);
}

/// One entry's bytes as the slab holds them: the key, then its location.
#[derive(Clone, Copy, Debug)]
pub(super) struct SlotRef<'a>(pub(super) &'a [u8]);

impl<'a> SlotRef<'a> {
    #[inline]
    pub(super) fn key(self) -> &'a [u8] {
        let location_len = self.0[SLOT_LOCATION_LEN_OFFSET] as usize;
        &self.0[SLOT_KEY_OFFSET..self.0.len() - location_len]
    }

    pub(super) fn location(self) -> Location {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keydir::tests::at;

    fn encoded(key: &[u8], location: &Location) -> Vec<u8> {
        let mut out = Vec::new();
        encode(key, location, &mut out);
        out
    }

    /// Pins the per-key size: the budget is 64 B of key directory per key
    /// beyond the key (measured by `engine-probe`). A benchmark key of 25
    /// bytes with an 8-byte meta, a 100-byte value and a sequence number
    /// around a million must stay a 48-byte slot (a 56-byte cell), 40 bytes
    /// without the meta (a 48-byte cell).
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
        let bytes = encoded(key, &location);
        let slot = SlotRef(&bytes);
        // 1 location length + 25 key + 4 file + 4 offset + 1 value length
        // + 3 seq + 1 expiry + 1 meta length + 8 meta.
        assert_eq!(bytes.len(), 48);
        assert_eq!(slot.key(), key);
        assert_eq!(slot.location(), location);
        let no_meta = encoded(
            key,
            &Location {
                meta: RecordMeta::EMPTY,
                ..location
            },
        );
        assert_eq!(no_meta.len(), 40);
        assert_eq!(encoded(b"k", &at(1, 1)).len(), SLOT_HEADER_SIZE_BYTES + 1);
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
            let bytes = encoded(&key, &location);
            let slot = SlotRef(&bytes);
            assert_eq!(slot.location(), location);
            assert_eq!(slot.key(), &key[..]);
        }
    }
}
