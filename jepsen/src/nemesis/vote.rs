//! The saved-vote check of the power-loss faults: a Raft vote, once saved,
//! never goes back — not even across a power cut. A member that forgets
//! its vote can vote a second time in one term, and two leaders of one
//! term break every promise above the log.
//!
//! Just before the cut, each victim reports the term of the vote it has
//! made durable (`saved_vote_term` in its own status row; openraft sets it
//! only after `save_vote` returned). Just after the SIGKILL, with the
//! process reaped, the vote file on the real disk is what the power cut
//! left (the lazy disk writes a file's bytes at its fsync and a rename at
//! its directory's fsync). A durable term below the reported one is a
//! [`VoteRegression`]: the run's verdict becomes `not-durable`
//! ([`crate::durability`]).
//!
//! The vote file is read by its documented layout
//! (`node/kvnode/LOG_FORMAT.md`, "Metadata files"): a 20-byte header
//! (magic, format version, kind, payload length), the payload, a CRC-32.
//! The payload is a bincode-2 (standard config) `Vote`, whose first field
//! is the term, a variable-length integer.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context as _, bail};
use serde::Serialize;

/// The vote file under a member's data directory.
pub const VOTE_FILE: &str = "raft-log/vote.meta";
/// Its magic number (`META_MAGIC`).
pub const META_MAGIC: &[u8; 8] = b"RCLOGMET";
/// The kind of a vote file (`META_KIND_VOTE`).
pub const META_KIND_VOTE: u32 = 1;
/// Header bytes before the payload (`META_HEADER_BYTES`).
pub const META_HEADER_BYTES: usize = 20;
/// How long the status call before a cut may take (a member that does
/// not answer is cut unchecked).
pub const STATUS_TIMEOUT: Duration = Duration::from_secs(1);

/// A member whose durable vote after a power cut is older than the vote
/// it had reported saved just before.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct VoteRegression {
    /// The member (slot id).
    pub member: u64,
    /// The saved-vote term it reported before the cut.
    pub reported_term: u64,
    /// The term of the vote file the cut left (0: no vote file).
    pub durable_term: u64,
    /// Nanoseconds since the run started, at the cut.
    pub at_ns: u64,
}

impl VoteRegression {
    /// The run's durability anomaly.
    pub fn to_anomaly(&self) -> crate::durability::DurabilityAnomaly {
        crate::durability::DurabilityAnomaly {
            kind: crate::durability::VOTE_REGRESSION.to_string(),
            member: self.member,
            detail: self.describe(),
        }
    }

    /// One line for the checker's text.
    pub fn describe(&self) -> String {
        format!(
            "member {} reported its vote of term {} saved, and the power cut at +{:.2} s left \
             a vote of term {}",
            self.member,
            self.reported_term,
            self.at_ns as f64 / 1e9,
            self.durable_term
        )
    }
}

/// The term of the vote member `endpoint` reports saved, if it answers
/// within [`STATUS_TIMEOUT`] with its own row.
pub async fn reported_saved_term(endpoint: &str) -> Option<u64> {
    let client = crate::workload::member_client(endpoint).ok()?;
    let status = tokio::time::timeout(STATUS_TIMEOUT, client.status())
        .await
        .ok()?
        .ok()?;
    status
        .members
        .iter()
        .find(|m| m.is_self)
        .and_then(|m| m.saved_vote_term)
}

/// The term of the vote file in `data_dir` (0 if there is none yet).
pub fn durable_term(data_dir: &Path) -> anyhow::Result<u64> {
    let path = data_dir.join(VOTE_FILE);
    let bytes = match std::fs::read(&path) {
        Ok(bytes) => bytes,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(err) => return Err(err).with_context(|| format!("reading {}", path.display())),
    };
    decode_term(&bytes).with_context(|| format!("decoding {}", path.display()))
}

/// The term of an encoded vote file.
pub fn decode_term(bytes: &[u8]) -> anyhow::Result<u64> {
    if bytes.len() < META_HEADER_BYTES || &bytes[..8] != META_MAGIC {
        bail!("not a raft-log metadata file ({} bytes)", bytes.len());
    }
    let word =
        |at: usize| u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]]);
    let kind = word(12);
    if kind != META_KIND_VOTE {
        bail!("metadata kind {kind}, not a vote ({META_KIND_VOTE})");
    }
    let len = word(16) as usize;
    let payload = bytes
        .get(META_HEADER_BYTES..META_HEADER_BYTES + len)
        .context("the payload is cut short")?;
    varint(payload).context("the payload does not start with a term")
}

/// A bincode-2 variable-length unsigned integer: a byte below 251 is the
/// value; 251, 252 and 253 announce a little-endian u16, u32 or u64.
fn varint(bytes: &[u8]) -> Option<u64> {
    let (&first, rest) = bytes.split_first()?;
    let wide = |n: usize| -> Option<u64> {
        let mut le = [0u8; 8];
        le[..n].copy_from_slice(rest.get(..n)?);
        Some(u64::from_le_bytes(le))
    };
    match first {
        0..=250 => Some(u64::from(first)),
        251 => wide(2),
        252 => wide(4),
        253 => wide(8),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vote_file(payload: &[u8]) -> Vec<u8> {
        let mut bytes = META_MAGIC.to_vec();
        bytes.extend_from_slice(&2u32.to_le_bytes());
        bytes.extend_from_slice(&META_KIND_VOTE.to_le_bytes());
        bytes.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        bytes.extend_from_slice(payload);
        bytes.extend_from_slice(&[0; 4]);
        bytes
    }

    #[test]
    fn decodes_small_and_wide_terms() {
        // Term 5, node 1, committed: as a member wrote it.
        assert_eq!(decode_term(&vote_file(&[5, 1, 1])).unwrap(), 5);
        assert_eq!(
            decode_term(&vote_file(&[251, 0x2c, 0x01, 3, 0])).unwrap(),
            300
        );
        assert_eq!(
            decode_term(&vote_file(&[252, 0x70, 0x11, 0x01, 0x00, 2, 0])).unwrap(),
            70_000
        );
    }

    #[test]
    fn refuses_other_files() {
        let mut purged = vote_file(&[5, 1, 1]);
        purged[12] = 3;
        assert!(decode_term(&purged).is_err());
        assert!(decode_term(b"RCLOGMET").is_err());
        let mut cut = vote_file(&[251, 0x2c]);
        cut.truncate(cut.len() - 4);
        assert!(decode_term(&cut).is_err());
    }

    #[test]
    fn a_missing_file_is_term_zero() {
        let dir = std::env::temp_dir().join(format!("jepsen-vote-{}", std::process::id()));
        assert_eq!(durable_term(&dir).unwrap(), 0);
    }
}
