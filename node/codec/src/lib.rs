//! # kvcodec
//!
//! The one binary codec of the node: bincode 2 in serde mode with the
//! standard configuration (little-endian, variable-length integers).
//!
//! Every Raft entry, vote, log id and openraft payload the node writes to
//! disk or sends to a peer goes through [`encode`] and comes back through
//! [`decode`]. Nothing else in the node (kvnode, raftlog) names bincode, so
//! changing the encoding touches only this crate.
//!
//! Decoding treats its input as untrusted (bytes from disk may be rotten,
//! bytes from the network may be hostile): the input is capped at
//! [`DECODE_INPUT_BYTES_MAX`], bincode is told to claim at most
//! [`DECODE_ALLOC_BYTES_MAX`] bytes while decoding (so a garbage length
//! prefix cannot make it allocate gigabytes), and every byte must be used. A
//! malformed input is an error, never a panic.
//!
//! ## Modules
//! One file, no submodules: [`encode`], [`decode`], [`CodecError`] and the
//! two decoding limits. kvnode re-exports it as `kvnode::codec`.

use serde::Serialize;
use serde::de::DeserializeOwned;

/// Largest input [`decode`] accepts, in bytes. Raft entries are capped far
/// below this (see `raftlog::LOG_ENTRY_SIZE_BYTES_MAX`); the network layer
/// splits messages so that none exceeds it.
pub const DECODE_INPUT_BYTES_MAX: usize = 64 * 1024 * 1024;

/// Most bytes bincode may claim (allocate or read) while decoding one value.
/// A value's claim is roughly its in-memory size: every length prefix is
/// checked against what is left of this budget before anything is allocated.
pub const DECODE_ALLOC_BYTES_MAX: usize = 128 * 1024 * 1024;

/// Why bytes could not be decoded.
#[derive(Debug, thiserror::Error)]
pub enum CodecError {
    /// The input is longer than [`DECODE_INPUT_BYTES_MAX`].
    #[error("encoded value of {len} bytes exceeds DECODE_INPUT_BYTES_MAX ({max} bytes)")]
    TooLarge {
        /// Length of the input in bytes.
        len: usize,
        /// The limit in bytes.
        max: usize,
    },
    /// The bytes are not a valid encoding of the expected type (including a
    /// length prefix beyond [`DECODE_ALLOC_BYTES_MAX`]).
    #[error("malformed encoded value: {0}")]
    Malformed(#[from] bincode::error::DecodeError),
    /// A valid value was decoded but bytes were left over.
    #[error("malformed encoded value: {trailing} trailing bytes after the value (of {len})")]
    TrailingBytes {
        /// Bytes left unread.
        trailing: usize,
        /// Length of the input in bytes.
        len: usize,
    },
}

fn config() -> impl bincode::config::Config {
    bincode::config::standard().with_limit::<DECODE_ALLOC_BYTES_MAX>()
}

/// Encodes a value.
///
/// # Panics
/// Only for types that serde cannot describe to a non-self-describing format
/// (sequences of unknown length, `serialize_any`-style tricks): a programming
/// error in the type, never a property of the data. Every type the node
/// encodes (openraft's types and ours) is plain structs, enums, sequences and
/// maps.
pub fn encode<T: Serialize + ?Sized>(value: &T) -> Vec<u8> {
    match bincode::serde::encode_to_vec(value, bincode::config::standard()) {
        Ok(bytes) => bytes,
        Err(err) => panic!(
            "codec::encode: {} cannot be encoded with bincode: {err}",
            std::any::type_name::<T>()
        ),
    }
}

/// Decodes a value from exactly `bytes`.
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, CodecError> {
    if bytes.len() > DECODE_INPUT_BYTES_MAX {
        return Err(CodecError::TooLarge {
            len: bytes.len(),
            max: DECODE_INPUT_BYTES_MAX,
        });
    }
    let (value, used) = bincode::serde::decode_from_slice(bytes, config())?;
    if used != bytes.len() {
        return Err(CodecError::TrailingBytes {
            trailing: bytes.len() - used,
            len: bytes.len(),
        });
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
    enum Op {
        Put { key: Vec<u8>, value: Vec<u8> },
        Delete(Vec<u8>),
        Tick,
    }

    #[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
    struct Payload {
        ops: Vec<Op>,
        name: String,
        meta: BTreeMap<u64, Option<String>>,
    }

    fn sample() -> Payload {
        Payload {
            ops: vec![
                Op::Put {
                    key: b"k".to_vec(),
                    value: vec![7; 300],
                },
                Op::Delete(b"gone".to_vec()),
                Op::Tick,
            ],
            name: "batch".to_string(),
            meta: BTreeMap::from([(1, None), (u64::MAX, Some("x".to_string()))]),
        }
    }

    #[test]
    fn round_trip() {
        let bytes = encode(&sample());
        assert_eq!(decode::<Payload>(&bytes).unwrap(), sample());
    }

    #[test]
    fn trailing_bytes_are_an_error() {
        let mut bytes = encode(&sample());
        bytes.push(0);
        assert!(matches!(
            decode::<Payload>(&bytes),
            Err(CodecError::TrailingBytes { trailing: 1, .. })
        ));
    }

    #[test]
    fn huge_length_prefix_is_refused_without_allocating() {
        // A Vec<u8> whose varint length claims u64::MAX / 2 bytes.
        let mut bytes = vec![253u8];
        bytes.extend_from_slice(&(u64::MAX / 2).to_le_bytes());
        assert!(decode::<Vec<u8>>(&bytes).is_err());
        assert!(decode::<String>(&bytes).is_err());
        assert!(decode::<Vec<Vec<u64>>>(&bytes).is_err());
        // Just above the allocation budget.
        let mut bytes = vec![253u8];
        bytes.extend_from_slice(&(DECODE_ALLOC_BYTES_MAX as u64 + 1).to_le_bytes());
        assert!(decode::<Vec<u8>>(&bytes).is_err());
    }

    #[test]
    fn oversized_input_is_refused() {
        let bytes = vec![0u8; DECODE_INPUT_BYTES_MAX + 1];
        assert!(matches!(
            decode::<Vec<u8>>(&bytes),
            Err(CodecError::TooLarge { .. })
        ));
    }

    #[test]
    fn garbage_never_panics() {
        // Deterministic xorshift garbage, truncations and bit flips of a
        // valid encoding: every outcome must be Ok or Err, never a panic.
        let valid = encode(&sample());
        let mut rng = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        for _ in 0..2_000 {
            let len = (next() % 64) as usize;
            let garbage: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            let _ = decode::<Payload>(&garbage);
            let _ = decode::<Vec<String>>(&garbage);
        }
        for cut in 0..valid.len() {
            assert!(decode::<Payload>(&valid[..cut]).is_err());
        }
        for _ in 0..2_000 {
            let mut flipped = valid.clone();
            let at = (next() as usize) % flipped.len();
            flipped[at] ^= 1 << (next() % 8);
            let _ = decode::<Payload>(&flipped);
        }
    }
}
