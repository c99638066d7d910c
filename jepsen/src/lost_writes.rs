//! Lost acknowledged writes, judged by a final healed read: for each key, the
//! last ok read invoked after every acknowledged write of the key completed
//! (the harness issues one per key after healing every fault). Every
//! acknowledged write must be visible to it:
//!
//! - with versions (raftcask histories): the read's version is at least
//!   every acknowledged write's version; the writes above it are lost;
//! - kv histories of appends only: every acknowledged append's text occurs
//!   in the value read.
//!
//! Keys with no such read, or with neither versions nor appends-only
//! writes, are listed as unchecked rather than passed.

use serde::Serialize;

use crate::history::{Function, Operation, Outcome, by_key};
use crate::index_checks::{Anomaly, AnomalyKind};

/// The result over all keys.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct LostWrites {
    /// Keys judged by a final read.
    pub checked_keys: usize,
    /// Keys that could not be judged, with the reason.
    pub unchecked_keys: Vec<(String, String)>,
    /// One anomaly per lost write.
    pub lost: Vec<Anomaly>,
}

fn is_write(operation: &Operation) -> bool {
    matches!(
        operation.f,
        Function::Write | Function::Cas | Function::Put | Function::Append
    )
}

/// Checks every key.
pub fn check(operations: &[Operation]) -> LostWrites {
    let mut result = LostWrites::default();
    for (key, operations) in by_key(operations) {
        let acked: Vec<&Operation> = operations
            .iter()
            .filter(|o| is_write(o) && o.outcome == Outcome::Ok)
            .collect();
        let last_ack = acked.iter().filter_map(|o| o.complete_position).max();
        let final_read = operations
            .iter()
            .filter(|o| matches!(o.f, Function::Read | Function::Get) && o.outcome == Outcome::Ok)
            .filter(|o| last_ack.is_none_or(|done| o.invoke_position > done))
            .max_by_key(|o| o.invoke_position);
        let Some(read) = final_read else {
            result.unchecked_keys.push((
                key,
                "no ok read after the last acknowledged write".to_string(),
            ));
            continue;
        };
        if let Some(version) = read.version {
            for write in &acked {
                if let Some(written) = write.version
                    && written > version
                {
                    result.lost.push(Anomaly {
                        kind: AnomalyKind::LostWrite,
                        key: key.clone(),
                        message: format!(
                            "acknowledged write at version {written} missing from the final read (version {version})"
                        ),
                        operations: vec![write.describe(), read.describe()],
                    });
                }
            }
        } else if acked.iter().all(|o| o.f == Function::Append) {
            let value = read.value.as_deref().unwrap_or("");
            for write in &acked {
                let text = write.value.as_deref().unwrap_or("");
                if !value.contains(text) {
                    result.lost.push(Anomaly {
                        kind: AnomalyKind::LostWrite,
                        key: key.clone(),
                        message: format!(
                            "acknowledged append {text:?} missing from the final read"
                        ),
                        operations: vec![write.describe(), read.describe()],
                    });
                }
            }
        } else {
            result.unchecked_keys.push((
                key,
                "the final read has no version and the writes are not appends only".to_string(),
            ));
            continue;
        }
        result.checked_keys += 1;
    }
    result
}
