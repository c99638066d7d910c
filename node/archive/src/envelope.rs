//! The envelope of a snapshot `MANIFEST` (`node/kvnode/SNAPSHOT_FORMAT.md`):
//! magic, format version, body length, the body, and a CRC-32 of all that
//! precedes it. The body's fields are kvnode's to decode (they become
//! openraft types); the envelope is checked here so that `kvctl snapshot
//! save` can refuse a corrupt or unknown manifest without linking the node,
//! and kvnode's decoder runs the same check.

/// Magic at the start of a manifest.
pub const MANIFEST_MAGIC: [u8; 8] = *b"RCSNAPMF";
/// Manifest format version this code writes and reads.
pub const MANIFEST_FORMAT_VERSION: u32 = 1;
/// Bytes before the manifest body: magic, version, body length.
pub const MANIFEST_HEADER_BYTES: usize = 16;
/// Bytes after the body: its CRC-32.
pub const MANIFEST_TRAILER_BYTES: usize = 4;

/// Checks a manifest's envelope — length within `max_bytes`, magic,
/// format version, body length, CRC-32 — and returns its body.
pub fn manifest_body(bytes: &[u8], max_bytes: usize) -> Result<&[u8], String> {
    if bytes.len() > max_bytes {
        return Err(format!(
            "{} bytes exceed MANIFEST_BYTES_MAX ({max_bytes})",
            bytes.len()
        ));
    }
    if bytes.len() < MANIFEST_HEADER_BYTES + MANIFEST_TRAILER_BYTES {
        return Err(format!("{} bytes is shorter than a manifest", bytes.len()));
    }
    if bytes[..8] != MANIFEST_MAGIC {
        return Err("bad magic".to_string());
    }
    let version = u32::from_le_bytes(bytes[8..12].try_into().expect("4 bytes"));
    if version != MANIFEST_FORMAT_VERSION {
        return Err(format!(
            "format version {version} is not {MANIFEST_FORMAT_VERSION}"
        ));
    }
    let body_len = u32::from_le_bytes(bytes[12..16].try_into().expect("4 bytes")) as usize;
    if MANIFEST_HEADER_BYTES + body_len + MANIFEST_TRAILER_BYTES != bytes.len() {
        return Err(format!(
            "body length {body_len} does not match the file length {}",
            bytes.len()
        ));
    }
    let end = MANIFEST_HEADER_BYTES + body_len;
    let stored = u32::from_le_bytes(bytes[end..].try_into().expect("4 bytes"));
    if crc32fast::hash(&bytes[..end]) != stored {
        return Err("crc32 mismatch".to_string());
    }
    Ok(&bytes[MANIFEST_HEADER_BYTES..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest(body: &[u8]) -> Vec<u8> {
        let mut out = MANIFEST_MAGIC.to_vec();
        out.extend_from_slice(&MANIFEST_FORMAT_VERSION.to_le_bytes());
        out.extend_from_slice(&(body.len() as u32).to_le_bytes());
        out.extend_from_slice(body);
        let crc = crc32fast::hash(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        out
    }

    #[test]
    fn a_good_envelope_gives_its_body() {
        assert_eq!(manifest_body(&manifest(b"body"), 1024).unwrap(), b"body");
    }

    #[test]
    fn every_broken_envelope_is_refused_with_its_reason() {
        let good = manifest(b"body");
        let mut flipped = good.clone();
        flipped[17] ^= 1;
        assert_eq!(manifest_body(&flipped, 1024).unwrap_err(), "crc32 mismatch");
        let mut magic = good.clone();
        magic[0] = b'X';
        assert_eq!(manifest_body(&magic, 1024).unwrap_err(), "bad magic");
        let mut version = good.clone();
        version[8] = 2;
        assert!(
            manifest_body(&version, 1024)
                .unwrap_err()
                .contains("format version 2")
        );
        assert!(
            manifest_body(&good[..good.len() - 1], 1024)
                .unwrap_err()
                .contains("body length")
        );
        assert!(
            manifest_body(&good[..10], 1024)
                .unwrap_err()
                .contains("shorter")
        );
        assert!(
            manifest_body(&good, 8)
                .unwrap_err()
                .contains("MANIFEST_BYTES_MAX")
        );
    }
}
