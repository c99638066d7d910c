//! The set checker: clients add unique elements to a set (per key); a final
//! read (the last ok read of the key, carrying `values`) must contain every
//! add acknowledged before the read was invoked, and nothing that no add
//! (ok or unknown, invoked before the read completed) added. Adds of unknown
//! outcome may be present or not (counted as "recovered" when present);
//! a failed add must not be present.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use crate::history::{Function, Operation, Outcome, by_key};

/// The result for one key's set.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SetResult {
    /// The key.
    pub key: String,
    /// Whether the key had a final read; without one nothing is judged.
    pub final_read: bool,
    /// Adds acknowledged before the final read was invoked.
    pub acknowledged: usize,
    /// Acknowledged adds missing from the final read.
    pub lost: Vec<String>,
    /// Elements read that no possible add added (or whose add failed).
    pub unexpected: Vec<String>,
    /// Adds of unknown outcome present in the final read.
    pub recovered: usize,
}

impl SetResult {
    /// Whether the key passed (a key without a final read does not).
    pub fn valid(&self) -> bool {
        self.final_read && self.lost.is_empty() && self.unexpected.is_empty()
    }
}

/// Checks every key's set.
pub fn check(operations: &[Operation]) -> Vec<SetResult> {
    by_key(operations)
        .into_iter()
        .map(|(key, operations)| check_key(key, &operations))
        .collect()
}

fn check_key(key: String, operations: &[Operation]) -> SetResult {
    let final_read = operations
        .iter()
        .filter(|o| o.f == Function::Read && o.outcome == Outcome::Ok && o.values.is_some())
        .max_by_key(|o| o.invoke_position);
    let Some(read) = final_read else {
        return SetResult {
            key,
            final_read: false,
            acknowledged: 0,
            lost: Vec::new(),
            unexpected: Vec::new(),
            recovered: 0,
        };
    };
    let present: BTreeSet<&str> = read.values.iter().flatten().map(String::as_str).collect();
    // Element -> the outcomes of its adds that could precede the read.
    let mut adds: BTreeMap<&str, Vec<Outcome>> = BTreeMap::new();
    let mut acknowledged = BTreeSet::new();
    for add in operations.iter().filter(|o| o.f == Function::Add) {
        let Some(element) = add.value.as_deref() else {
            continue;
        };
        if add.outcome == Outcome::Ok && add.precedes(read) {
            acknowledged.insert(element);
        }
        if read
            .complete_position
            .is_none_or(|done| add.invoke_position < done)
        {
            adds.entry(element).or_default().push(add.outcome);
        }
    }
    let lost = acknowledged
        .iter()
        .filter(|e| !present.contains(*e))
        .map(|e| e.to_string())
        .collect();
    let mut unexpected = Vec::new();
    let mut recovered = 0;
    for element in &present {
        match adds.get(element) {
            None => unexpected.push(element.to_string()),
            Some(outcomes) if outcomes.iter().all(|o| *o == Outcome::Fail) => {
                unexpected.push(element.to_string());
            }
            Some(outcomes) if !outcomes.contains(&Outcome::Ok) => recovered += 1,
            Some(_) => {}
        }
    }
    SetResult {
        key,
        final_read: true,
        acknowledged: acknowledged.len(),
        lost,
        unexpected,
        recovered,
    }
}
