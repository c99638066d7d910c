//! Durability checks outside the history: what the operations cannot show
//! but a member must keep across its faults.
//!
//! - [`VOTE_REGRESSION`]: a saved vote a power cut took back, or a vote
//!   file it left unreadable ([`crate::nemesis::vote`]).
//! - [`MEMBER_LOST`]: a member that did not come back once every fault was
//!   healed: it exited on its own, or it did not apply, within
//!   [`CONVERGENCE_TIMEOUT`], the highest index any operation of the run
//!   was answered at ([`converged`]). A member that restarted with a state
//!   machine below its log's first entry (snapshot chosen wrongly at
//!   startup) never gets there.
//!
//! Any one of them makes the run's verdict `not-durable` ([`apply`]).

use std::fmt::Write as _;
use std::time::Duration;

use anyhow::bail;
use serde::Serialize;
use tokio::time::Instant;

use crate::control::cluster::{Cluster, client_addr};
use crate::workload::{Outcome, Record};

/// Kind of a saved vote a power cut took back.
pub const VOTE_REGRESSION: &str = "vote-regression";
/// Kind of a member that did not come back after the heal.
pub const MEMBER_LOST: &str = "member-lost";
/// The `checker.json` field listing them.
pub const JSON_FIELD: &str = "durability_anomalies";
/// How long every member has, after the final heal and reads, to apply
/// the run's highest answered index (generous: a member powered on last
/// may still be taking a snapshot).
pub const CONVERGENCE_TIMEOUT: Duration = Duration::from_secs(60);
/// Pause between two status polls of a member that is behind.
pub const CONVERGENCE_POLL: Duration = Duration::from_millis(250);

/// One durability anomaly.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DurabilityAnomaly {
    /// [`VOTE_REGRESSION`] or [`MEMBER_LOST`].
    pub kind: String,
    /// The member (slot id).
    pub member: u64,
    /// What happened, for people.
    pub detail: String,
}

/// The highest applied index an ok operation reported.
pub fn highest_answered_index(records: &[Record]) -> u64 {
    records
        .iter()
        .filter_map(|r| match r {
            Record::Op(op) if op.outcome == Outcome::Ok => op.index,
            _ => None,
        })
        .max()
        .unwrap_or(0)
}

/// [`MEMBER_LOST`] anomalies: every member in `exited` (exited on its
/// own), and every running member whose applied index does not reach
/// [`highest_answered_index`] within [`CONVERGENCE_TIMEOUT`]. Slots in
/// `unconfirmed` (a removal the membership nemesis could not confirm: it
/// may have happened, and a removed member gets no more entries) are
/// passed over.
pub async fn converged(
    cluster: &mut Cluster,
    exited: &[(u64, String)],
    unconfirmed: &[u64],
    records: &[Record],
) -> Vec<DurabilityAnomaly> {
    let mut lost: Vec<DurabilityAnomaly> = exited
        .iter()
        .map(|(member, status)| DurabilityAnomaly {
            kind: MEMBER_LOST.to_string(),
            member: *member,
            detail: format!("member {member} exited on its own: {status}"),
        })
        .collect();
    let target = highest_answered_index(records);
    let deadline = Instant::now() + CONVERGENCE_TIMEOUT;
    for member in cluster.ids() {
        if exited.iter().any(|(id, _)| *id == member)
            || unconfirmed.contains(&member)
            || !cluster.is_running(member)
        {
            continue;
        }
        let addr = client_addr(member);
        let mut applied = None;
        loop {
            if let Some(index) = applied_index(&addr).await {
                applied = Some(index);
                if index >= target {
                    break;
                }
            }
            if Instant::now() >= deadline {
                lost.push(DurabilityAnomaly {
                    kind: MEMBER_LOST.to_string(),
                    member,
                    detail: format!(
                        "member {member} did not apply index {target} (the run's highest \
                         answered) within {} s of the heal: {}",
                        CONVERGENCE_TIMEOUT.as_secs(),
                        match applied {
                            Some(index) => format!("it is at {index}"),
                            None => "it does not answer".to_string(),
                        }
                    ),
                });
                break;
            }
            tokio::time::sleep(CONVERGENCE_POLL).await;
        }
    }
    lost
}

/// The applied index member `addr` reports for itself, if it answers.
async fn applied_index(addr: &str) -> Option<u64> {
    crate::workload::own_status(addr).await?.applied_index
}

/// The verdict with the durability anomalies: listed in `checker.json`
/// under [`JSON_FIELD`] (and counted under `anomalies_by_kind` when the
/// checker has it); any one makes the verdict `not-durable` (`valid:
/// false` for the TTL and exactly-once checkers) unless it failed already.
pub fn apply(
    mut json: serde_json::Value,
    text: String,
    passes: bool,
    anomalies: &[DurabilityAnomaly],
) -> anyhow::Result<(serde_json::Value, String, bool)> {
    if anomalies.is_empty() {
        return Ok((json, text, passes));
    }
    let Some(object) = json.as_object_mut() else {
        bail!("checker.json is not an object");
    };
    object.insert(JSON_FIELD.to_string(), serde_json::to_value(anomalies)?);
    match object.get("verdict").and_then(|v| v.as_str()) {
        Some(verdict) if !verdict.starts_with("not-") => {
            object.insert("verdict".to_string(), "not-durable".into());
        }
        Some(_) => {}
        None => {
            object.insert("valid".to_string(), false.into());
        }
    }
    if let Some(kinds) = object
        .get_mut("anomalies_by_kind")
        .and_then(|k| k.as_object_mut())
    {
        for anomaly in anomalies {
            let count = kinds
                .get(&anomaly.kind)
                .and_then(|c| c.as_u64())
                .unwrap_or(0);
            kinds.insert(anomaly.kind.clone(), (count + 1).into());
        }
    }
    let mut out = format!("NOT DURABLE: {} durability anomalies\n", anomalies.len());
    for anomaly in anomalies {
        let _ = writeln!(out, "  - {}: {}", anomaly.kind, anomaly.detail);
    }
    out.push_str(&text);
    Ok((json, out, false))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn anomaly(kind: &str) -> DurabilityAnomaly {
        DurabilityAnomaly {
            kind: kind.to_string(),
            member: 2,
            detail: "member 2 reported term 7 saved; the cut left term 5".to_string(),
        }
    }

    #[test]
    fn an_anomaly_fails_a_passing_verdict() {
        let json = serde_json::json!({ "verdict": "linearizable" });
        let (json, text, passes) = apply(
            json,
            "linearizable\n".into(),
            true,
            &[anomaly(VOTE_REGRESSION)],
        )
        .unwrap();
        assert!(!passes);
        assert_eq!(json["verdict"], "not-durable");
        assert_eq!(json[JSON_FIELD][0]["kind"], VOTE_REGRESSION);
        assert!(
            text.starts_with("NOT DURABLE: 1 durability anomalies"),
            "{text}"
        );
        assert!(text.ends_with("linearizable\n"), "{text}");
    }

    #[test]
    fn the_ttl_verdict_becomes_invalid_and_counts_each_kind() {
        let json = serde_json::json!({ "valid": true, "anomalies_by_kind": { "early": 1 } });
        let anomalies = [
            anomaly(MEMBER_LOST),
            anomaly(MEMBER_LOST),
            anomaly(VOTE_REGRESSION),
        ];
        let (json, _, passes) = apply(json, String::new(), true, &anomalies).unwrap();
        assert!(!passes);
        assert_eq!(json["valid"], false);
        assert_eq!(json["anomalies_by_kind"][MEMBER_LOST], 2);
        assert_eq!(json["anomalies_by_kind"][VOTE_REGRESSION], 1);
        assert_eq!(json["anomalies_by_kind"]["early"], 1);
    }

    #[test]
    fn a_failed_verdict_keeps_its_name_and_none_changes_nothing() {
        let json = serde_json::json!({ "verdict": "not-linearizable" });
        let (out, _, _) = apply(json.clone(), "x".into(), false, &[anomaly(MEMBER_LOST)]).unwrap();
        assert_eq!(out["verdict"], "not-linearizable");
        let (out, text, passes) = apply(json.clone(), "x".into(), false, &[]).unwrap();
        assert_eq!((out, text.as_str(), passes), (json, "x", false));
    }
}
