//! Revisions as etcd counts them, and where each piece lives.
//!
//! - **The store revision** starts at [`FIRST_REVISION`] (1) on a fresh
//!   store and advances by exactly one for each applied request that
//!   changes something (and for each key a TTL deletes). It is kept in
//!   every engine batch's commit record: kvstate puts a small
//!   [`StoreHeader`] in front of the node's own commit metadata
//!   ([`wrap_commit_meta`], [`split_commit_meta`]), so a restart, a
//!   snapshot or a restored backup finds it where it finds the last
//!   applied log id.
//! - **A key's `create_revision`, `mod_revision`, `version` and `lease`**
//!   ([`KeyMeta`]) live in its engine record's meta (bitcask's
//!   `RecordMeta`, stored with the record, in its hint entry and inline in
//!   the key directory), so conditions and apply never read the disk for
//!   them. Encoded as four LEB128 varints: `mod_revision`,
//!   `mod_revision - create_revision`, `version`, `lease` — six to ten bytes
//!   for a typical key, at most [`KEY_META_BYTES_MAX`].
//! - **A tombstone's meta** is one varint: the revision of the delete (the
//!   change history reads it).
//! - **Records without meta** were written before revisions existed: they
//!   read as [`KeyMeta::LEGACY`] (created and modified at revision 1,
//!   version 1, no lease).

use bitcask::RecordMeta;
use serde::{Deserialize, Serialize};

/// The store revision of a fresh store (etcd's too); the first change is 2.
pub const FIRST_REVISION: u64 = 1;
/// Bytes of a [`KeyMeta`] at most: four varints of at most 10 bytes.
pub const KEY_META_BYTES_MAX: usize = 4 * 10;
const _: () = assert!(KEY_META_BYTES_MAX <= bitcask::RECORD_META_BYTES_MAX);

/// First bytes of a commit record's metadata that carries a [`StoreHeader`].
/// The node's own metadata is a bincode value starting with a varint, whose
/// first byte is never 0xFF, so older commit records (without a header) are
/// told apart from newer ones by their first byte.
const STORE_HEADER_MAGIC: [u8; 3] = [0xFF, b'R', b'V'];
/// Layout version of the header that follows the magic.
const STORE_HEADER_VERSION: u8 = 1;

/// Why revision metadata could not be read (rotten or foreign bytes).
#[derive(Debug, thiserror::Error)]
#[error("revision metadata: {0}")]
pub struct RevisionError(String);

/// What a key carries besides its value, as etcd names it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct KeyMeta {
    /// Revision of the write that created the key (since its last delete).
    pub create_revision: u64,
    /// Revision of the write that last changed it.
    pub mod_revision: u64,
    /// Changes since creation: 1 on create.
    pub version: u64,
    /// The lease the key is attached to; 0 = none.
    pub lease: u64,
}

impl KeyMeta {
    /// What a key written before revisions existed reads as.
    pub const LEGACY: KeyMeta = KeyMeta {
        create_revision: FIRST_REVISION,
        mod_revision: FIRST_REVISION,
        version: 1,
        lease: 0,
    };

    /// A key created at `revision`.
    pub fn created(revision: u64, lease: u64) -> KeyMeta {
        KeyMeta {
            create_revision: revision,
            mod_revision: revision,
            version: 1,
            lease,
        }
    }

    /// This key changed again at `revision`.
    pub fn modified(self, revision: u64, lease: u64) -> KeyMeta {
        KeyMeta {
            mod_revision: revision,
            version: self.version.saturating_add(1),
            lease,
            ..self
        }
    }

    /// The engine record meta of a put.
    pub fn encode(&self) -> RecordMeta {
        let mut bytes = Vec::with_capacity(KEY_META_BYTES_MAX);
        for value in [
            self.mod_revision,
            self.mod_revision.saturating_sub(self.create_revision),
            self.version,
            self.lease,
        ] {
            put_varint(&mut bytes, value);
        }
        RecordMeta::new(&bytes).expect("at most KEY_META_BYTES_MAX, within RECORD_META_BYTES_MAX")
    }

    /// Reads a put's record meta (empty: [`KeyMeta::LEGACY`]).
    pub fn decode(meta: &RecordMeta) -> Result<KeyMeta, RevisionError> {
        let mut bytes = meta.as_bytes();
        if bytes.is_empty() {
            return Ok(KeyMeta::LEGACY);
        }
        let mod_revision = take_varint(&mut bytes, "mod_revision")?;
        let age = take_varint(&mut bytes, "create_revision")?;
        let version = take_varint(&mut bytes, "version")?;
        let lease = take_varint(&mut bytes, "lease")?;
        if !bytes.is_empty() || age > mod_revision {
            return Err(RevisionError(format!(
                "key meta {:02x?} is malformed",
                meta.as_bytes()
            )));
        }
        Ok(KeyMeta {
            create_revision: mod_revision - age,
            mod_revision,
            version,
            lease,
        })
    }
}

/// The engine record meta of a tombstone written at `revision`.
pub fn tombstone_meta(revision: u64) -> RecordMeta {
    let mut bytes = Vec::with_capacity(10);
    put_varint(&mut bytes, revision);
    RecordMeta::new(&bytes).expect("10 bytes at most, within RECORD_META_BYTES_MAX")
}

/// The revision of a tombstone's delete; `None` for a tombstone written
/// before revisions existed.
pub fn tombstone_revision(meta: &RecordMeta) -> Result<Option<u64>, RevisionError> {
    let mut bytes = meta.as_bytes();
    if bytes.is_empty() {
        return Ok(None);
    }
    let revision = take_varint(&mut bytes, "delete revision")?;
    if !bytes.is_empty() {
        return Err(RevisionError(format!(
            "tombstone meta {:02x?} is malformed",
            meta.as_bytes()
        )));
    }
    Ok(Some(revision))
}

/// The store-wide revision state, in every commit record.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoreHeader {
    /// The store revision after the entry.
    pub revision: u64,
    /// Revisions at or below this were compacted (0 = none).
    pub compact_revision: u64,
}

impl Default for StoreHeader {
    fn default() -> Self {
        StoreHeader {
            revision: FIRST_REVISION,
            compact_revision: 0,
        }
    }
}

/// The commit record metadata of an entry: the store header, then the
/// node's metadata as it is.
pub fn wrap_commit_meta(header: StoreHeader, node_meta: &[u8]) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(STORE_HEADER_MAGIC.len() + 1 + 20 + node_meta.len());
    bytes.extend_from_slice(&STORE_HEADER_MAGIC);
    bytes.push(STORE_HEADER_VERSION);
    put_varint(&mut bytes, header.revision);
    put_varint(&mut bytes, header.compact_revision);
    bytes.extend_from_slice(node_meta);
    bytes
}

/// Splits a commit record's metadata into the store header and the node's
/// metadata. Metadata written before revisions existed has no header: it
/// reads as a fresh store's ([`StoreHeader::default`]).
pub fn split_commit_meta(bytes: &[u8]) -> Result<(StoreHeader, &[u8]), RevisionError> {
    let (header, rest) = split_commit_meta_exact(bytes)?;
    Ok((header.unwrap_or_default(), rest))
}

/// Like [`split_commit_meta`], but `None` for metadata without a header
/// (written before revisions, or while the store still applied entries as
/// builds before revisions did; see `apply.rs`, "Entries from before
/// revisions").
pub fn split_commit_meta_exact(
    bytes: &[u8],
) -> Result<(Option<StoreHeader>, &[u8]), RevisionError> {
    let Some(mut rest) = bytes.strip_prefix(&STORE_HEADER_MAGIC[..]) else {
        return Ok((None, bytes));
    };
    match rest.split_first() {
        Some((&STORE_HEADER_VERSION, tail)) => rest = tail,
        Some((version, _)) => {
            return Err(RevisionError(format!(
                "store header version {version} is unknown (this build reads {STORE_HEADER_VERSION})"
            )));
        }
        None => return Err(RevisionError("store header cut short".to_string())),
    }
    let revision = take_varint(&mut rest, "store revision")?;
    let compact_revision = take_varint(&mut rest, "compact revision")?;
    Ok((
        Some(StoreHeader {
            revision,
            compact_revision,
        }),
        rest,
    ))
}

fn put_varint(out: &mut Vec<u8>, value: u64) {
    leb128::write::unsigned(out, value).expect("writing to a Vec cannot fail");
}

fn take_varint(bytes: &mut &[u8], field: &str) -> Result<u64, RevisionError> {
    leb128::read::unsigned(bytes).map_err(|e| RevisionError(format!("{field}: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_meta_round_trips_and_stays_small() {
        let meta = KeyMeta {
            create_revision: 1_000_000,
            mod_revision: 1_000_005,
            version: 3,
            lease: 0,
        };
        let encoded = meta.encode();
        assert_eq!(encoded.as_bytes().len(), 3 + 1 + 1 + 1);
        assert_eq!(KeyMeta::decode(&encoded).unwrap(), meta);
        let widest = KeyMeta {
            create_revision: 0,
            mod_revision: u64::MAX,
            version: u64::MAX,
            lease: u64::MAX,
        };
        assert_eq!(widest.encode().as_bytes().len(), KEY_META_BYTES_MAX);
        assert_eq!(KeyMeta::decode(&widest.encode()).unwrap(), widest);
        assert_eq!(
            KeyMeta::decode(&RecordMeta::EMPTY).unwrap(),
            KeyMeta::LEGACY
        );
    }

    #[test]
    fn rotten_key_meta_is_an_error_not_a_panic() {
        for bytes in [
            &[0x80][..],          // a varint cut short
            &[1, 2, 1, 0][..],    // created after it was modified
            &[1, 0, 1, 0, 9][..], // trailing byte
            &[0xff; 11][..],      // a varint past 64 bits
            &[5, 0, 1][..],       // a field missing
        ] {
            let meta = RecordMeta::new(bytes).unwrap();
            assert!(KeyMeta::decode(&meta).is_err(), "{bytes:02x?}");
        }
        assert!(tombstone_revision(&RecordMeta::new(&[1, 1]).unwrap()).is_err());
    }

    #[test]
    fn tombstones_carry_their_delete_revision() {
        assert_eq!(tombstone_revision(&tombstone_meta(77)).unwrap(), Some(77));
        assert_eq!(tombstone_revision(&RecordMeta::EMPTY).unwrap(), None);
    }

    #[test]
    fn commit_meta_with_and_without_a_store_header() {
        let header = StoreHeader {
            revision: 12_345,
            compact_revision: 100,
        };
        let wrapped = wrap_commit_meta(header, b"node meta");
        assert_eq!(
            split_commit_meta(&wrapped).unwrap(),
            (header, &b"node meta"[..])
        );
        // Written before revisions: the node's bincode starts with a varint
        // (first byte 0..=253), never the magic.
        for first in 0..=253u8 {
            let old = [first, 1, 2, 3];
            assert_eq!(
                split_commit_meta(&old).unwrap(),
                (StoreHeader::default(), &old[..])
            );
        }
        let mut future = wrapped.clone();
        future[3] = 9;
        assert!(split_commit_meta(&future).is_err());
        assert!(split_commit_meta(&wrapped[..4]).is_err());
    }
}
