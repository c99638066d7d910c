//! [`RecordMeta`]: a few opaque caller bytes stored with each put and
//! tombstone record, kept inline in the key directory and in hint files.
//!
//! The engine never interprets them. The layer above keeps per-key
//! revisions there (etcd's create and mod revision, version and lease), so a
//! lookup of "what does this key's latest record say about itself" needs no
//! disk read and a restart rebuilds it from hints alone. At most
//! [`RECORD_META_BYTES_MAX`] bytes: the key directory holds one per key.

use crate::error::{Error, Result};
use crate::options::RECORD_META_BYTES_MAX;

/// Opaque per-record caller bytes, at most [`RECORD_META_BYTES_MAX`], held
/// inline (no heap). The unused tail of the array is always zero, so the
/// derived equality and hash see only the meaningful bytes.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct RecordMeta {
    len: u8,
    bytes: [u8; RECORD_META_BYTES_MAX],
}

const _: () = assert!(RECORD_META_BYTES_MAX <= u8::MAX as usize);

impl RecordMeta {
    /// No meta: records carrying it are written exactly as before metas
    /// existed (record kinds 1 and 2).
    pub const EMPTY: RecordMeta = RecordMeta {
        len: 0,
        bytes: [0u8; RECORD_META_BYTES_MAX],
    };

    /// A meta holding `bytes`; an error naming the limit if they are more
    /// than [`RECORD_META_BYTES_MAX`].
    pub fn new(bytes: &[u8]) -> Result<RecordMeta> {
        if bytes.len() > RECORD_META_BYTES_MAX {
            return Err(Error::RecordMetaTooLarge {
                len: bytes.len(),
                max: RECORD_META_BYTES_MAX,
            });
        }
        let mut meta = RecordMeta::EMPTY;
        meta.bytes[..bytes.len()].copy_from_slice(bytes);
        meta.len = bytes.len() as u8;
        Ok(meta)
    }

    /// The bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len as usize]
    }

    /// Number of bytes.
    pub fn len(&self) -> usize {
        self.len as usize
    }

    /// Whether there are no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Default for RecordMeta {
    fn default() -> Self {
        RecordMeta::EMPTY
    }
}

impl std::fmt::Debug for RecordMeta {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RecordMeta(")?;
        for byte in self.as_bytes() {
            write!(f, "{byte:02x}")?;
        }
        write!(f, ")")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_up_to_the_limit_and_names_it_beyond() {
        let full = [7u8; RECORD_META_BYTES_MAX];
        assert_eq!(RecordMeta::new(&full).unwrap().as_bytes(), &full[..]);
        let err = RecordMeta::new(&[0u8; RECORD_META_BYTES_MAX + 1]).unwrap_err();
        let message = err.to_string();
        assert!(message.contains("meta"), "{message}");
        assert!(message.contains("RECORD_META_BYTES_MAX"), "{message}");
        assert!(RecordMeta::EMPTY.is_empty());
        assert_eq!(RecordMeta::default(), RecordMeta::EMPTY);
        assert_eq!(RecordMeta::new(&[]).unwrap(), RecordMeta::EMPTY);
    }

    #[test]
    fn debug_prints_hex_and_equality_ignores_nothing_meaningful() {
        let meta = RecordMeta::new(&[0x01, 0xab, 0x00]).unwrap();
        assert_eq!(format!("{meta:?}"), "RecordMeta(01ab00)");
        assert_ne!(meta, RecordMeta::new(&[0x01, 0xab]).unwrap());
        assert_eq!(meta, RecordMeta::new(&[0x01, 0xab, 0x00]).unwrap());
    }
}
