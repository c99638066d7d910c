//! One verdict for a recorded history: the checkers a model calls for, run
//! together, with the exit code of `jepsen check`.
//!
//! - `cas-register`, `kv`: per-key linearizability (plus, for `kv`, lost
//!   appends when the history ends with final reads; for `cas-register`,
//!   the revision checks when the history carries revisions: the
//!   etcd-register workload's);
//! - `register` (raftcask's own histories): linearizability, the cheap index
//!   checks, the revision checks (when the history carries revisions) and
//!   lost acknowledged writes;
//! - `set`: the set checker.

use serde::Serialize;

use crate::Error;
use crate::history::{Event, pair};
use crate::index_checks::{self, Anomaly};
use crate::linearizability::{self, Settings, Verdict};
use crate::lost_writes::{self, LostWrites};
use crate::model::{CasRegister, Kv, Register};
use crate::revision_checks::{self, RevisionReport};
use crate::set::{self, SetResult};

/// Exit code: the history is valid.
pub const EXIT_VALID: i32 = 0;
/// Exit code: the history is not valid.
pub const EXIT_INVALID: i32 = 1;
/// Exit code: the checker could not decide (error, budget exhausted).
pub const EXIT_ERROR: i32 = 2;

/// The model (and so the checkers) to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ModelName {
    /// Jepsen's compare-and-set register (read / write / cas by value).
    CasRegister,
    /// get / put / append per key.
    Kv,
    /// raftcask's register (read / write / cas by version).
    Register,
    /// A set of added elements with a final read.
    Set,
}

/// Everything the checkers found.
#[derive(Debug, Clone, Serialize)]
pub struct CheckReport {
    /// The overall verdict.
    pub verdict: Verdict,
    /// Events read.
    pub events: usize,
    /// Operations paired from them.
    pub operations: usize,
    /// Per-key linearizability (not for `set`).
    pub linearizability: Option<linearizability::Report>,
    /// The cheap index checks (`register` only).
    pub anomalies: Vec<Anomaly>,
    /// The revision checks (`register` and `cas-register` histories that
    /// carry revisions; left out of the JSON otherwise, so older reports
    /// read the same).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub revisions: Option<RevisionReport>,
    /// Lost acknowledged writes (`register`, `kv`).
    pub lost_writes: Option<LostWrites>,
    /// The set checker (`set` only).
    pub sets: Vec<SetResult>,
}

impl CheckReport {
    /// The exit code of `jepsen check`.
    pub fn exit_code(&self) -> i32 {
        match self.verdict {
            Verdict::Linearizable => EXIT_VALID,
            Verdict::NotLinearizable => EXIT_INVALID,
            Verdict::Unknown => EXIT_ERROR,
        }
    }

    /// A short human verdict (a few lines per failing key).
    pub fn summary(&self) -> String {
        let mut out = format!(
            "{} events, {} operations: {}\n",
            self.events,
            self.operations,
            match self.verdict {
                Verdict::Linearizable => "VALID",
                Verdict::NotLinearizable => "NOT VALID",
                Verdict::Unknown => "UNKNOWN (budget exhausted)",
            }
        );
        if let Some(report) = &self.linearizability {
            let count = |v| report.keys.iter().filter(|k| k.verdict == v).count();
            out.push_str(&format!(
                "linearizability ({}): {} keys linearizable, {} not, {} unknown\n",
                report.model,
                count(Verdict::Linearizable),
                count(Verdict::NotLinearizable),
                count(Verdict::Unknown)
            ));
            for key in report
                .keys
                .iter()
                .filter(|k| k.verdict != Verdict::Linearizable)
            {
                let note = if key.cancelled {
                    " (cancelled: another key failed)"
                } else {
                    ""
                };
                out.push_str(&format!(
                    "  key {:?}: {:?} after {} steps{note}\n",
                    key.key, key.verdict, key.steps
                ));
                if let Some(failure) = &key.failure {
                    out.push_str(&format!(
                        "    shortest failing prefix: {} events; fails at {}\n",
                        failure.prefix_events, failure.failing
                    ));
                    for operation in &failure.involved {
                        out.push_str(&format!("      {operation}\n"));
                    }
                }
            }
        }
        for anomaly in &self.anomalies {
            out.push_str(&format!(
                "{:?} on {:?}: {}\n",
                anomaly.kind, anomaly.key, anomaly.message
            ));
            for operation in &anomaly.operations {
                out.push_str(&format!("    {operation}\n"));
            }
        }
        if let Some(revisions) = &self.revisions {
            out.push_str(&format!(
                "revisions: {} operations checked, {} anomalies\n",
                revisions.operations_checked,
                revisions.anomaly_count()
            ));
            for (kind, count) in revisions.anomalies_by_kind.iter().filter(|(_, n)| **n > 0) {
                out.push_str(&format!("  {kind}: {count}\n"));
            }
            for anomaly in &revisions.examples {
                out.push_str(&format!("  {}: {}\n", anomaly.kind.name(), anomaly.message));
                for witness in &anomaly.operations {
                    out.push_str(&format!(
                        "    #{} p{} {:?} key={:?} revision={:?} mod_revision={:?}\n",
                        witness.id,
                        witness.process,
                        witness.f,
                        witness.key,
                        witness.revision,
                        witness.mod_revision
                    ));
                }
            }
        }
        if let Some(lost) = &self.lost_writes {
            out.push_str(&format!(
                "lost writes: {} keys checked, {} unchecked, {} lost\n",
                lost.checked_keys,
                lost.unchecked_keys.len(),
                lost.lost.len()
            ));
            for anomaly in &lost.lost {
                out.push_str(&format!("  {:?}: {}\n", anomaly.key, anomaly.message));
            }
        }
        for set in &self.sets {
            out.push_str(&format!(
                "set {:?}: final read {}, {} acknowledged, {} lost {:?}, {} unexpected {:?}, {} recovered\n",
                set.key,
                if set.final_read { "yes" } else { "MISSING" },
                set.acknowledged,
                set.lost.len(),
                set.lost,
                set.unexpected.len(),
                set.unexpected,
                set.recovered
            ));
        }
        out
    }
}

/// Runs the checkers of `model` on a history.
pub fn check(model: ModelName, events: &[Event], settings: Settings) -> Result<CheckReport, Error> {
    let operations = pair(events)?;
    let mut report = CheckReport {
        verdict: Verdict::Linearizable,
        events: events.len(),
        operations: operations.len(),
        linearizability: None,
        anomalies: Vec::new(),
        revisions: None,
        lost_writes: None,
        sets: Vec::new(),
    };
    let mut invalid = false;
    match model {
        ModelName::CasRegister => {
            report.linearizability =
                Some(linearizability::check(&CasRegister, &operations, settings)?);
            // None for a history without revisions (Jepsen's, Redis's).
            report.revisions = revision_checks::check(&operations);
            invalid |= report.revisions.as_ref().is_some_and(|r| !r.valid());
        }
        ModelName::Kv => {
            report.linearizability = Some(linearizability::check(&Kv, &operations, settings)?);
            let lost = lost_writes::check(&operations);
            invalid |= !lost.lost.is_empty();
            report.lost_writes = Some(lost);
        }
        ModelName::Register => {
            report.linearizability =
                Some(linearizability::check(&Register, &operations, settings)?);
            report.anomalies = index_checks::check(&operations);
            invalid |= !report.anomalies.is_empty();
            report.revisions = revision_checks::check(&operations);
            invalid |= report.revisions.as_ref().is_some_and(|r| !r.valid());
            let lost = lost_writes::check(&operations);
            invalid |= !lost.lost.is_empty();
            report.lost_writes = Some(lost);
        }
        ModelName::Set => {
            report.sets = set::check(&operations);
            invalid |= report.sets.iter().any(|s| !s.valid());
        }
    }
    let linearizable = report
        .linearizability
        .as_ref()
        .map_or(Verdict::Linearizable, |r| r.verdict);
    report.verdict = if invalid || linearizable == Verdict::NotLinearizable {
        Verdict::NotLinearizable
    } else {
        linearizable
    };
    Ok(report)
}
