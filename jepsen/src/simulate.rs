//! A seeded simulator of a correct concurrent raftcask register, for tests
//! of the checkers: processes run read / write / compare-and-set operations
//! on a few keys; each operation takes effect at one instant inside its
//! interval (in one global apply order that assigns log indexes and
//! versions), some writes end with an unknown outcome (applied or not),
//! and after the run one final read per key observes the healed state.
//! Written values are unique, so checkers can tell writes apart.
//!
//! With [`Settings::revisions`], completions also carry etcd-style store
//! revisions: the store starts at revision 1 and every applied write (one
//! per log entry here) adds one, so the store revision is the last log
//! index + 1; a read carries the revision it was answered at and the key's
//! `mod_revision`, an ok write the revision it was applied at.

use std::collections::BTreeMap;

use crate::history::{Event, EventType, Function};
use crate::index_checks::VERSION_INDEX_SHIFT;

/// The settings of one simulated run.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    /// Seed of the pseudo-random choices.
    pub seed: u64,
    /// Concurrent client processes.
    pub processes: usize,
    /// Keys.
    pub keys: usize,
    /// Operations each process runs.
    pub operations_per_process: usize,
    /// Per mille of writes whose outcome is unknown.
    pub unknown_per_mille: u64,
    /// Whether completions carry store revisions (`revision`,
    /// `mod_revision`); off, the history is the one recorded before them.
    pub revisions: bool,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            seed: 1,
            processes: 5,
            keys: 3,
            operations_per_process: 40,
            unknown_per_mille: 100,
            revisions: false,
        }
    }
}

/// SplitMix64: a tiny deterministic generator (no dependency needed).
#[derive(Debug, Clone)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// A generator from a seed.
    pub fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..bound` (`bound` > 0).
    pub fn below(&mut self, bound: u64) -> u64 {
        self.next_u64() % bound.max(1)
    }
}

#[derive(Debug)]
struct Planned {
    process: u64,
    key: String,
    f: Function,
    value: Option<String>,
    invoke_ns: u64,
    apply_ns: u64,
    complete_ns: u64,
    unknown: bool,
    /// Whether an unknown write applied.
    applies: bool,
    expected_version: Option<u64>,
}

/// A planned operation's completion: event type, value read, version and
/// applied index.
type Completion = (EventType, Option<String>, Option<u64>, Option<u64>);

/// Runs the simulation; the events come in real-time order.
pub fn simulate(settings: Settings) -> Vec<Event> {
    let (mut planned, end_ns) = plan(settings);
    let (results, state, index) = apply_in_order(&mut planned);
    let mut events = timeline_events(&planned, &results, settings.revisions);
    push_final_reads(settings, &state, index, end_ns, &mut events);
    events
}

/// The store revision after the writes of log indexes up to `index`
/// (the store starts at revision 1; one write per log entry here).
fn store_revision(index: u64) -> u64 {
    index + 1
}

/// The `mod_revision` of a key at `version` (`None`: absent).
fn mod_revision(version: u64) -> Option<u64> {
    (version != 0).then(|| store_revision(version >> VERSION_INDEX_SHIFT))
}

/// The final state: key -> (value, version).
type State = BTreeMap<String, (Option<String>, u64)>;

/// Each process's operations with their times (and whether an unknown
/// write applies); the latest completion time.
fn plan(settings: Settings) -> (Vec<Planned>, u64) {
    let mut random = SplitMix64::new(settings.seed);
    let mut planned: Vec<Planned> = Vec::new();
    let mut next_value = 0u64;
    let mut end_ns = 0;
    for process in 0..settings.processes as u64 {
        let mut now = random.below(50);
        for _ in 0..settings.operations_per_process {
            let key = format!("k{}", random.below(settings.keys as u64));
            let choice = random.below(10);
            let f = match choice {
                0..=3 => Function::Read,
                4..=7 => Function::Write,
                _ => Function::Cas,
            };
            let value = (f != Function::Read).then(|| {
                next_value += 1;
                format!("v{next_value}")
            });
            let invoke_ns = now + 1 + random.below(20);
            let apply_ns = invoke_ns + 1 + random.below(40);
            let complete_ns = apply_ns + 1 + random.below(40);
            let unknown = f != Function::Read && random.below(1000) < settings.unknown_per_mille;
            let applies = !unknown || random.below(2) == 0;
            now = complete_ns;
            end_ns = end_ns.max(complete_ns);
            planned.push(Planned {
                process,
                key,
                f,
                value,
                invoke_ns,
                apply_ns,
                complete_ns,
                unknown,
                applies,
                expected_version: None,
            });
        }
    }
    (planned, end_ns)
}

/// Applies the operations in one global order (by apply time); returns
/// each one's completion, the final state and the last log index.
fn apply_in_order(planned: &mut [Planned]) -> (Vec<Completion>, State, u64) {
    // Compare-and-set expects a version the process could have seen: the
    // key's version a little before its invocation (so some succeed, some fail).
    let mut order: Vec<usize> = (0..planned.len()).collect();
    order.sort_by_key(|&i| (planned[i].apply_ns, i));
    // Apply in one global order: log index per applied write, version = index << shift.
    let mut state: State = BTreeMap::new();
    let mut history_of: BTreeMap<String, Vec<(u64, u64)>> = BTreeMap::new();
    let mut index = 0u64;
    let mut results: Vec<Completion> = vec![(EventType::Info, None, None, None); planned.len()];
    for &i in &order {
        let operation = &mut planned[i];
        let current = state
            .entry(operation.key.clone())
            .or_insert((None, 0))
            .clone();
        match operation.f {
            Function::Read => {
                results[i] = (
                    EventType::Ok,
                    current.0.clone(),
                    Some(current.1),
                    Some(index),
                );
            }
            Function::Write | Function::Cas => {
                if operation.f == Function::Cas {
                    let seen = history_of
                        .get(&operation.key)
                        .and_then(|versions| {
                            versions
                                .iter()
                                .rev()
                                .find(|(at, _)| *at + 30 < operation.invoke_ns)
                                .map(|(_, v)| *v)
                        })
                        .unwrap_or(0);
                    operation.expected_version = Some(seen);
                    if seen != current.1 {
                        results[i] = (
                            if operation.unknown {
                                EventType::Info
                            } else {
                                EventType::Fail
                            },
                            None,
                            None,
                            None,
                        );
                        continue;
                    }
                }
                if !operation.applies {
                    results[i] = (EventType::Info, None, None, None);
                    continue;
                }
                index += 1;
                let version = index << VERSION_INDEX_SHIFT;
                state.insert(operation.key.clone(), (operation.value.clone(), version));
                history_of
                    .entry(operation.key.clone())
                    .or_default()
                    .push((operation.apply_ns, version));
                results[i] = if operation.unknown {
                    (EventType::Info, None, None, None)
                } else {
                    (
                        EventType::Ok,
                        operation.value.clone(),
                        Some(version),
                        Some(index),
                    )
                };
            }
            _ => unreachable!("the simulator plans reads, writes and cas only"),
        }
    }
    (results, state, index)
}

/// The invocation and completion events, in time order.
fn timeline_events(planned: &[Planned], results: &[Completion], revisions: bool) -> Vec<Event> {
    // Events in time order: invocations, completions (unknown: an `info`).
    let mut timeline: Vec<(u64, u8, usize)> = Vec::new();
    for (i, operation) in planned.iter().enumerate() {
        timeline.push((operation.invoke_ns, 0, i));
        timeline.push((operation.complete_ns, 1, i));
    }
    timeline.sort_unstable();
    let mut events = Vec::with_capacity(timeline.len());
    for (time, phase, i) in timeline {
        let operation = &planned[i];
        let mut event = Event::new(
            operation.process,
            if phase == 0 {
                EventType::Invoke
            } else {
                results[i].0
            },
            operation.f,
            &operation.key,
        );
        event.monotonic_ns = Some(time);
        event.expected_version = operation.expected_version;
        if revisions {
            // A cas then names the mod_revision it requires (0: absent), as
            // the register workload records it since revisions.
            event.expected_mod_revision = operation
                .expected_version
                .map(|version| mod_revision(version).unwrap_or(0));
        }
        if phase == 0 || operation.f != Function::Read {
            event.value = operation.value.clone();
        }
        if phase == 1 {
            let (event_type, value, version, applied) = &results[i];
            if operation.f == Function::Read {
                event.value = value.clone();
            }
            event.version = *version;
            event.index = *applied;
            if revisions && *event_type == EventType::Ok {
                // A read's applied index is the store's last log index; a
                // write's is its own entry.
                event.revision = applied.map(store_revision);
                if operation.f == Function::Read {
                    event.mod_revision = version.and_then(mod_revision);
                }
            }
            if *event_type == EventType::Info {
                event.error = Some("timed-out".to_string());
            }
            if *event_type == EventType::Fail {
                event.error = Some("version-mismatch".to_string());
            }
        }
        events.push(event);
    }
    events
}

/// Final healed reads, one per key, after everything.
fn push_final_reads(
    settings: Settings,
    state: &State,
    index: u64,
    end_ns: u64,
    events: &mut Vec<Event>,
) {
    let final_process = settings.processes as u64 + 1000;
    for key in 0..settings.keys {
        let key = format!("k{key}");
        let (value, version) = state.get(&key).cloned().unwrap_or((None, 0));
        let mut invoke = Event::new(final_process, EventType::Invoke, Function::Read, &key);
        invoke.monotonic_ns = Some(end_ns + 1);
        let mut ok = Event::new(final_process, EventType::Ok, Function::Read, &key);
        ok.monotonic_ns = Some(end_ns + 2);
        ok.value = value;
        ok.version = Some(version);
        ok.index = Some(index);
        if settings.revisions {
            ok.revision = Some(store_revision(index));
            ok.mod_revision = mod_revision(version);
        }
        events.push(invoke);
        events.push(ok);
    }
}
