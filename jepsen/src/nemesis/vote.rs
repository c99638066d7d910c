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
//! its directory's fsync). A durable term below the reported one (or a
//! vote file that cannot be read) is a `vote-regression`: the run's
//! verdict becomes `not-durable` ([`crate::durability`]).
//!
//! The vote file is read by its documented layout
//! (`node/raftlog/LOG_FORMAT.md`, "Metadata files"): a 20-byte header
//! (magic, format version, kind, payload length), the payload, a CRC-32.
//! The payload is a bincode-2 (standard config) `Vote`, whose first field
//! is the term, a variable-length integer.

use std::path::Path;

use anyhow::{Context as _, bail};

use crate::durability::{DurabilityAnomaly, VOTE_REGRESSION};

/// The vote file under a member's data directory.
pub const VOTE_FILE: &str = "raft-log/vote.meta";
/// Its magic number (`META_MAGIC`).
pub const META_MAGIC: &[u8; 8] = b"RCLOGMET";
/// The kind of a vote file (`META_KIND_VOTE`).
pub const META_KIND_VOTE: u32 = 1;
/// Header bytes before the payload (`META_HEADER_BYTES`).
pub const META_HEADER_BYTES: usize = 20;

/// The anomaly, if any, of member `member` whose vote was reported saved
/// at `reported` (None: it did not answer, nothing to compare) before a
/// cut at `at_ns`, and whose vote file after it reads `durable`.
pub fn check(
    member: u64,
    reported: Option<u64>,
    durable: anyhow::Result<u64>,
    at_ns: u64,
) -> Option<DurabilityAnomaly> {
    let at = at_ns as f64 / 1e9;
    let detail = match (reported, durable) {
        (Some(reported), Ok(durable)) if durable < reported => format!(
            "member {member} reported its vote of term {reported} saved, and the power cut at \
             +{at:.2} s left a vote of term {durable}"
        ),
        (_, Err(err)) => format!(
            "member {member}'s vote file cannot be read after the power cut at +{at:.2} s: \
             {err:#}"
        ),
        _ => return None,
    };
    Some(DurabilityAnomaly {
        kind: VOTE_REGRESSION.to_string(),
        member,
        detail,
    })
}

/// The saved-vote terms `members` report, asked concurrently (see
/// [`reported_saved_term`]), in the same order.
pub async fn reported_saved_terms(members: &[u64]) -> Vec<Option<u64>> {
    let mut asks = tokio::task::JoinSet::new();
    for (at, &member) in members.iter().enumerate() {
        asks.spawn(async move {
            let addr = crate::control::cluster::client_addr(member);
            (at, reported_saved_term(&addr).await)
        });
    }
    let mut terms = vec![None; members.len()];
    while let Some(joined) = asks.join_next().await {
        if let Ok((at, term)) = joined {
            terms[at] = term;
        }
    }
    terms
}

/// The term of the vote member `endpoint` reports saved, if it answers
/// within [`crate::workload::MEMBER_OPERATION_TIMEOUT`].
pub async fn reported_saved_term(endpoint: &str) -> Option<u64> {
    crate::workload::own_status(endpoint).await?.saved_vote_term
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
    fn only_a_lower_or_unreadable_durable_vote_is_an_anomaly() {
        assert_eq!(check(1, Some(4), Ok(4), 0), None);
        assert_eq!(check(1, Some(4), Ok(5), 0), None);
        assert_eq!(check(1, None, Ok(0), 0), None);
        let lower = check(2, Some(6), Ok(4), 52_040_000_000).unwrap();
        assert_eq!((lower.kind.as_str(), lower.member), (VOTE_REGRESSION, 2));
        assert!(
            lower.detail.contains("term 6 saved")
                && lower.detail.contains("+52.04 s left a vote of term 4"),
            "{}",
            lower.detail
        );
        let unreadable = check(3, None, Err(anyhow::anyhow!("bad magic")), 0).unwrap();
        assert!(
            unreadable.detail.contains("cannot be read") && unreadable.detail.contains("bad magic")
        );
    }

    #[test]
    fn a_missing_file_is_term_zero() {
        let dir = std::env::temp_dir().join(format!("jepsen-vote-{}", std::process::id()));
        assert_eq!(durable_term(&dir).unwrap(), 0);
    }
}
