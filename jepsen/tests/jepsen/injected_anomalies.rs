//! Proves the checkers catch anomalies in raftcask's own kind of history: a
//! seeded simulation of a correct concurrent register (versions, applied
//! indexes, unknown outcomes, final healed reads) passes every checker; then
//! one stale read, one lost write or one duplicate apply is injected, and
//! each must be flagged by the checker that names it.

use jepsen::check::{CheckReport, ModelName, check};
use jepsen::history::{Event, EventType, Function, pair};
use jepsen::index_checks::AnomalyKind;
use jepsen::linearizability::{Settings, Verdict};
use jepsen::simulate::{self, simulate};

use crate::common::invocation_of;

/// Seeds of the simulated runs (each a different interleaving).
const SEEDS: [u64; 4] = [1, 2, 3, 42];

fn run(events: &[Event]) -> CheckReport {
    check(ModelName::Register, events, Settings::default()).expect("checks")
}

fn history(seed: u64) -> Vec<Event> {
    simulate(simulate::Settings {
        seed,
        ..simulate::Settings::default()
    })
}

fn kinds(report: &CheckReport) -> Vec<AnomalyKind> {
    let mut kinds: Vec<AnomalyKind> = report.anomalies.iter().map(|a| a.kind).collect();
    if let Some(lost) = &report.lost_writes {
        kinds.extend(lost.lost.iter().map(|a| a.kind));
    }
    kinds
}

/// Positions of ok completions of `f` on `key` (the final reads excluded
/// unless `finals`).
fn ok_completions(events: &[Event], f: Function, finals: bool) -> Vec<usize> {
    let final_process = events.last().expect("events").process;
    (0..events.len())
        .filter(|&i| {
            let e = &events[i];
            e.event_type == EventType::Ok && e.f == f && (finals || e.process != final_process)
        })
        .collect()
}

/// Acknowledged writes of `key` completed before `position`: (value, version), oldest first.
fn acked_before(events: &[Event], key: &str, position: usize) -> Vec<(Option<String>, u64)> {
    let mut writes: Vec<(Option<String>, u64)> = events[..position]
        .iter()
        .filter(|e| e.event_type == EventType::Ok && e.f != Function::Read && e.key == key)
        .filter_map(|e| Some((e.value.clone(), e.version?)))
        .collect();
    writes.sort_by_key(|(_, version)| *version);
    writes
}

#[test]
fn simulated_histories_pass_every_checker() {
    for seed in SEEDS {
        let events = history(seed);
        let operations = pair(&events).expect("pairs");
        let unknown = operations
            .iter()
            .filter(|o| o.outcome == jepsen::history::Outcome::Unknown)
            .count();
        let failed = operations
            .iter()
            .filter(|o| o.outcome == jepsen::history::Outcome::Fail)
            .count();
        assert!(
            unknown > 0 && failed > 0,
            "seed {seed}: the simulation must include unknown and failed operations"
        );
        let report = run(&events);
        assert_eq!(
            report.verdict,
            Verdict::Linearizable,
            "seed {seed}:\n{}",
            report.summary()
        );
        assert!(report.anomalies.is_empty());
        let lost = report.lost_writes.as_ref().expect("lost-writes result");
        assert_eq!(
            lost.checked_keys, 3,
            "seed {seed}: every key has a final read"
        );
    }
}

#[test]
fn an_injected_stale_read_is_flagged() {
    for seed in SEEDS {
        let mut events = history(seed);
        // A read of the newest write acknowledged before it began, with at
        // least two older ones: make it return the one just before (stale,
        // yet newer than the key's first write).
        let target = ok_completions(&events, Function::Read, false)
            .into_iter()
            .find(|&r| {
                let read = &events[r];
                let acked = acked_before(&events, &read.key, invocation_of(&events, r));
                acked.len() >= 3 && acked.last().map(|(_, v)| *v) == read.version
            })
            .expect("a read of the newest of three acknowledged writes");
        let invoked = invocation_of(&events, target);
        let older = acked_before(&events, &events[target].key, invoked)
            .into_iter()
            .rfind(|(_, version)| Some(*version) < events[target].version)
            .unwrap_or((None, 0));
        events[target].value = older.0;
        events[target].version = Some(older.1);
        let report = run(&events);
        assert!(
            kinds(&report).contains(&AnomalyKind::StaleRead),
            "seed {seed}:\n{}",
            report.summary()
        );
        assert_eq!(report.verdict, Verdict::NotLinearizable);
        assert_eq!(
            report.linearizability.as_ref().map(|l| l.verdict),
            Some(Verdict::NotLinearizable),
            "seed {seed}: the linearizability checker must also reject a stale read"
        );
    }
}

#[test]
fn an_injected_lost_write_is_flagged() {
    for seed in SEEDS {
        let mut events = history(seed);
        // The final read of a key forgets the last acknowledged write.
        let finals = ok_completions(&events, Function::Read, true);
        let target = *finals
            .iter()
            .rev()
            .find(|&&r| {
                let acked = acked_before(&events, &events[r].key, r);
                acked.last().map(|(_, v)| Some(*v)) == Some(events[r].version)
            })
            .expect("a final read showing the last acknowledged write");
        let acked = acked_before(&events, &events[target].key, target);
        let older = acked.iter().rev().nth(1).cloned().unwrap_or((None, 0));
        events[target].value = older.0;
        events[target].version = Some(older.1);
        let report = run(&events);
        let lost = report.lost_writes.as_ref().expect("lost-writes result");
        assert!(!lost.lost.is_empty(), "seed {seed}:\n{}", report.summary());
        assert!(kinds(&report).contains(&AnomalyKind::LostWrite));
        assert_eq!(report.verdict, Verdict::NotLinearizable);
    }
}

#[test]
fn an_injected_duplicate_apply_is_flagged() {
    for seed in SEEDS {
        let mut events = history(seed);
        // A read after write W1 (value x, version v1) sees x again in a later
        // log entry: W1 was applied twice.
        let target = ok_completions(&events, Function::Read, false)
            .into_iter()
            .find(|&r| {
                let invoked = invocation_of(&events, r);
                let acked = acked_before(&events, &events[r].key, invoked);
                acked.len() >= 2 && events[r].version == acked.last().map(|(_, v)| *v)
            })
            .expect("a read after two acknowledged writes");
        let invoked = invocation_of(&events, target);
        let acked = acked_before(&events, &events[target].key, invoked);
        let (first_value, _) = acked[0].clone();
        let version = events[target].version.expect("version") + 1;
        events[target].value = first_value;
        events[target].version = Some(version);
        let report = run(&events);
        assert!(
            kinds(&report).contains(&AnomalyKind::DuplicateApply),
            "seed {seed}:\n{}",
            report.summary()
        );
        assert!(!kinds(&report).contains(&AnomalyKind::StaleRead));
        assert_eq!(report.verdict, Verdict::NotLinearizable);
    }
}

#[test]
fn a_phantom_value_and_an_index_behind_its_version_are_flagged() {
    let mut events = history(SEEDS[0]);
    let reads = ok_completions(&events, Function::Read, false);
    let phantom = *reads
        .iter()
        .find(|&&r| events[r].version.is_some_and(|v| v > 0))
        .expect("a read");
    events[phantom].value = Some("never-written".to_string());
    let behind = *reads
        .iter()
        .rev()
        .find(|&&r| events[r].version.is_some_and(|v| v > 0))
        .expect("a read");
    let version = events[behind].version.expect("version");
    events[behind].index = Some((version >> 16) - 1);
    let report = run(&events);
    let kinds = kinds(&report);
    assert!(
        kinds.contains(&AnomalyKind::PhantomValue),
        "{}",
        report.summary()
    );
    assert!(
        kinds.contains(&AnomalyKind::IndexBehindVersion),
        "{}",
        report.summary()
    );
}

#[test]
fn a_read_of_the_right_value_at_the_wrong_version_is_not_linearizable() {
    for seed in SEEDS {
        let mut events = history(seed);
        let target = ok_completions(&events, Function::Read, false)
            .into_iter()
            .find(|&r| events[r].version.is_some_and(|v| v > 0))
            .expect("a read of a written value");
        events[target].version = events[target].version.map(|v| v + 1);
        let report = run(&events);
        assert_eq!(
            report.linearizability.as_ref().map(|l| l.verdict),
            Some(Verdict::NotLinearizable),
            "seed {seed}: the register model must compare versions\n{}",
            report.summary()
        );
    }
}
