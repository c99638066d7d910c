//! The history of a run: one [`Event`] per invocation or completion (the
//! JSON-lines record), and the [`Operation`]s they pair into (an invocation
//! with its outcome), which is what every checker reads.
//!
//! Order: the position of an event in the history is its real-time order
//! (the recorder appends each event under one lock when it happens); the
//! times carried in the events are for reports and plots, never for pairing.

use std::collections::HashMap;
use std::io::{BufRead, Write};

use serde::{Deserialize, Serialize};

use crate::Error;

/// The longest line the JSON-lines reader accepts, so a corrupt file cannot
/// make it buffer without bound.
pub const LINE_BYTES_MAX: usize = 1 << 20;

/// What an event records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum EventType {
    /// The client is about to send the operation.
    Invoke,
    /// The operation completed and took effect (for a read: returned).
    Ok,
    /// The operation definitely did not take effect.
    Fail,
    /// The outcome is unknown: it may take effect at any later time, or never.
    Info,
}

/// The operation's function.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Function {
    /// Register read (cas-register, register; the value read is `value`).
    Read,
    /// Register write of `value`.
    Write,
    /// Compare-and-set: cas-register compares with `expected`, raftcask's
    /// register with `expected_version`; writes `value`.
    Cas,
    /// kv model: read a key (missing reads as "").
    Get,
    /// kv model: set a key to `value`.
    Put,
    /// kv model: append `value` to the key's value.
    Append,
    /// Set: add the element `value`.
    Add,
}

/// One line of a history: an invocation or a completion.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    /// The client process (a process runs one operation at a time).
    pub process: u64,
    /// Invoke, ok, fail or info.
    #[serde(rename = "type")]
    pub event_type: EventType,
    /// The function.
    pub f: Function,
    /// The key ("" for single-register histories).
    #[serde(default)]
    pub key: String,
    /// The value written (invoke and completion of writes) or read
    /// (completion of reads); `None` = nil / absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    /// cas-register compare-and-set: the value compared with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected: Option<String>,
    /// raftcask compare-and-set: the version compared with (0 = absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected_version: Option<u64>,
    /// Set read: the elements read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub values: Option<Vec<String>>,
    /// Completion of a raftcask operation: the key's version written or read
    /// (`log index × 65536 + position`; 0 = absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<u64>,
    /// Completion of a raftcask operation: the applied index returned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub index: Option<u64>,
    /// Ok completion: the store revision the answer reflects (a read: the
    /// response header's revision; a write or cas: the revision it was
    /// applied at). Absent in histories recorded before revisions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<u64>,
    /// Ok read that found the key: the key's `mod_revision` (the revision
    /// of the write that last changed it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mod_revision: Option<u64>,
    /// raftcask compare-and-set since revisions: the `mod_revision` it
    /// compared with (0 = absent). Such a history's writes carry the
    /// `revision` they applied at and its reads the `mod_revision` they
    /// found, and the register model compares in that space.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected_mod_revision: Option<u64>,
    /// Wall-clock time of the event, Unix milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wall_time_unix_ms: Option<u64>,
    /// Monotonic time of the event since the run started, nanoseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub monotonic_ns: Option<u64>,
    /// A failure's or unknown outcome's reason (`timed-out`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl Event {
    /// An event with only the required fields set.
    pub fn new(process: u64, event_type: EventType, f: Function, key: &str) -> Self {
        Event {
            process,
            event_type,
            f,
            key: key.to_string(),
            value: None,
            expected: None,
            expected_version: None,
            values: None,
            version: None,
            index: None,
            revision: None,
            mod_revision: None,
            expected_mod_revision: None,
            wall_time_unix_ms: None,
            monotonic_ns: None,
            error: None,
        }
    }
}

/// The outcome of an operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Outcome {
    /// Completed and took effect.
    Ok,
    /// Definitely did not take effect.
    Fail,
    /// May take effect at any time after its invocation, or never
    /// (`info`, or no completion at all).
    Unknown,
}

/// An invocation paired with its completion.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Operation {
    /// Position of the operation in the history (order of invocation).
    pub id: usize,
    /// The client process.
    pub process: u64,
    /// The function.
    pub f: Function,
    /// The key.
    pub key: String,
    /// Value written (writes), or read (ok reads).
    pub value: Option<String>,
    /// cas-register: the value compared with.
    pub expected: Option<String>,
    /// raftcask cas: the version compared with.
    pub expected_version: Option<u64>,
    /// Set read: the elements read.
    pub values: Option<Vec<String>>,
    /// The version returned (ok completions).
    pub version: Option<u64>,
    /// The applied index returned (ok completions).
    pub index: Option<u64>,
    /// The store revision the answer reflects (ok completions: a read's
    /// header revision, a write's applied revision).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<u64>,
    /// The key's `mod_revision` an ok read returned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mod_revision: Option<u64>,
    /// raftcask cas since revisions: the `mod_revision` compared with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected_mod_revision: Option<u64>,
    /// Ok, fail or unknown.
    pub outcome: Outcome,
    /// Event position of the invocation.
    pub invoke_position: usize,
    /// Event position of the completion; `None` = never (unknown outcome).
    pub complete_position: Option<usize>,
    /// Monotonic time of the invocation, if recorded.
    pub invoke_ns: Option<u64>,
    /// Monotonic time of the completion, if recorded.
    pub complete_ns: Option<u64>,
}

impl Operation {
    /// Whether this operation reads (its result constrains the state).
    pub fn is_read(&self) -> bool {
        matches!(self.f, Function::Read | Function::Get)
    }

    /// Whether `self` completed before `other` was invoked (real-time order).
    pub fn precedes(&self, other: &Operation) -> bool {
        self.complete_position
            .is_some_and(|done| done < other.invoke_position)
    }

    /// A one-line description for reports.
    pub fn describe(&self) -> String {
        let mut text = format!(
            "#{} p{} {:?} {:?}",
            self.id, self.process, self.outcome, self.f
        );
        if !self.key.is_empty() {
            text.push_str(&format!(" key={:?}", self.key));
        }
        if let Some(expected) = &self.expected {
            text.push_str(&format!(" expected={expected:?}"));
        }
        if let Some(expected_version) = self.expected_version {
            text.push_str(&format!(" expected_version={expected_version}"));
        }
        if let Some(expected) = self.expected_mod_revision {
            text.push_str(&format!(" expected_mod_revision={expected}"));
        }
        match &self.value {
            Some(value) => text.push_str(&format!(" value={value:?}")),
            None if self.is_read() => text.push_str(" value=nil"),
            None => {}
        }
        if let Some(version) = self.version {
            text.push_str(&format!(" version={version}"));
        }
        if let Some(index) = self.index {
            text.push_str(&format!(" index={index}"));
        }
        if let Some(revision) = self.revision {
            text.push_str(&format!(" revision={revision}"));
        }
        if let Some(mod_revision) = self.mod_revision {
            text.push_str(&format!(" mod_revision={mod_revision}"));
        }
        let done = self
            .complete_position
            .map_or("never".to_string(), |p| p.to_string());
        text.push_str(&format!(" [{}..{done}]", self.invoke_position));
        text
    }
}

/// Pairs invocations with completions, per process, in history order.
///
/// A completion answers the process's open invocation; an invocation while
/// the process still has one open (or with no completion by the end) leaves
/// the earlier one unknown. A completion with no open invocation, or of a
/// different function, is an error naming the event.
pub fn pair(events: &[Event]) -> Result<Vec<Operation>, Error> {
    let mut operations: Vec<Operation> = Vec::new();
    let mut open: HashMap<u64, usize> = HashMap::new();
    for (position, event) in events.iter().enumerate() {
        match event.event_type {
            EventType::Invoke => {
                // A process that invokes again has given up on the old one.
                open.insert(event.process, operations.len());
                operations.push(Operation {
                    id: operations.len(),
                    process: event.process,
                    f: event.f,
                    key: event.key.clone(),
                    value: event.value.clone(),
                    expected: event.expected.clone(),
                    expected_version: event.expected_version,
                    values: None,
                    version: None,
                    index: None,
                    revision: None,
                    mod_revision: None,
                    expected_mod_revision: event.expected_mod_revision,
                    outcome: Outcome::Unknown,
                    invoke_position: position,
                    complete_position: None,
                    invoke_ns: event.monotonic_ns,
                    complete_ns: None,
                });
            }
            completion => {
                let Some(id) = open.remove(&event.process) else {
                    return Err(Error::Pairing {
                        position,
                        reason: format!(
                            "{completion:?} of process {} with no open invocation",
                            event.process
                        ),
                    });
                };
                let operation = &mut operations[id];
                if operation.f != event.f {
                    return Err(Error::Pairing {
                        position,
                        reason: format!(
                            "completion {:?} does not match invocation {:?} of process {}",
                            event.f, operation.f, event.process
                        ),
                    });
                }
                match completion {
                    EventType::Ok => {
                        operation.outcome = Outcome::Ok;
                        operation.complete_position = Some(position);
                        operation.complete_ns = event.monotonic_ns;
                        if operation.is_read() || event.value.is_some() {
                            operation.value = event.value.clone();
                        }
                        operation.values = event.values.clone();
                        operation.version = event.version;
                        operation.index = event.index;
                        operation.revision = event.revision;
                        operation.mod_revision = event.mod_revision;
                    }
                    EventType::Fail => {
                        operation.outcome = Outcome::Fail;
                        operation.complete_position = Some(position);
                        operation.complete_ns = event.monotonic_ns;
                        // A failed read with a reason such as `timed-out`
                        // is a read of unknown outcome; it constrains nothing.
                        if operation.is_read() && event.error.is_some() {
                            operation.outcome = Outcome::Unknown;
                        }
                    }
                    // Unknown: no completion time, it may apply any time later.
                    _ => operation.outcome = Outcome::Unknown,
                }
            }
        }
    }
    Ok(operations)
}

/// Reads a JSON-lines history (one [`Event`] per line; blank lines skipped).
pub fn read_json_lines(reader: impl BufRead) -> Result<Vec<Event>, Error> {
    let mut events = Vec::new();
    for (number, line) in reader.lines().enumerate() {
        let line = line.map_err(Error::Io)?;
        if line.len() > LINE_BYTES_MAX {
            return Err(Error::Parse {
                line: number + 1,
                reason: format!(
                    "line is {} bytes, over LINE_BYTES_MAX = {LINE_BYTES_MAX}",
                    line.len()
                ),
            });
        }
        if line.trim().is_empty() {
            continue;
        }
        let event = serde_json::from_str(&line).map_err(|error| Error::Parse {
            line: number + 1,
            reason: error.to_string(),
        })?;
        events.push(event);
    }
    Ok(events)
}

/// Writes a history as JSON lines.
pub fn write_json_lines(events: &[Event], mut writer: impl Write) -> Result<(), Error> {
    for event in events {
        let line = serde_json::to_string(event).map_err(|error| Error::Parse {
            line: 0,
            reason: error.to_string(),
        })?;
        writeln!(writer, "{line}").map_err(Error::Io)?;
    }
    Ok(())
}

/// Groups operations by key, keeping history order within each key.
pub fn by_key(operations: &[Operation]) -> Vec<(String, Vec<Operation>)> {
    let mut keys: Vec<(String, Vec<Operation>)> = Vec::new();
    let mut slot: HashMap<&str, usize> = HashMap::new();
    for operation in operations {
        let index = *slot.entry(operation.key.as_str()).or_insert_with(|| {
            keys.push((operation.key.clone(), Vec::new()));
            keys.len() - 1
        });
        keys[index].1.push(operation.clone());
    }
    keys
}
