//! Proves the revision checks on raftcask's own kind of history: the seeded
//! simulation of a correct register, with store revisions (1 at the start,
//! one more per applied write; reads carry the header revision and the
//! key's `mod_revision`, writes the revision they were applied at), passes
//! every checker with the revision checks active; then one anomaly of each
//! kind is injected and must be flagged by name and make the verdict
//! invalid, though the linearizability and index checks (which do not read
//! revisions) still pass. Without revisions the same simulation reports no
//! revision section, so histories recorded before revisions check as before.

use jepsen::check::{CheckReport, ModelName, check};
use jepsen::history::{Event, EventType, Function};
use jepsen::linearizability::{Settings, Verdict};
use jepsen::revision_checks::RevisionAnomalyKind;
use jepsen::simulate::{self, simulate};

use crate::common::invocation_of;

/// Seeds of the simulated runs (each a different interleaving).
const SEEDS: [u64; 4] = [1, 2, 3, 42];

fn run(events: &[Event]) -> CheckReport {
    check(ModelName::Register, events, Settings::default()).expect("checks")
}

fn history(seed: u64, revisions: bool) -> Vec<Event> {
    simulate(simulate::Settings {
        seed,
        revisions,
        ..simulate::Settings::default()
    })
}

/// Ok completions of reads (`read`) or writes and compare-and-sets.
fn ok_completions(events: &[Event], read: bool) -> Vec<usize> {
    (0..events.len())
        .filter(|&i| {
            let e = &events[i];
            e.event_type == EventType::Ok && (e.f == Function::Read) == read
        })
        .collect()
}

/// The injected anomaly is flagged by `kind`, makes the verdict invalid,
/// and the revision checks name it.
fn assert_flagged(events: &[Event], kind: RevisionAnomalyKind, seed: u64) {
    let report = run(events);
    let revisions = report.revisions.as_ref().expect("revision checks ran");
    assert!(
        revisions.count(kind) > 0,
        "seed {seed}: {} not flagged\n{}",
        kind.name(),
        report.summary()
    );
    assert!(
        revisions.examples.iter().any(|a| a.kind == kind),
        "seed {seed}: no example of {}",
        kind.name()
    );
    assert_eq!(report.verdict, Verdict::NotLinearizable, "seed {seed}");
    // The register model compares mod_revisions in such a history, so a
    // moved write revision or read mod_revision may also make the register
    // history non-linearizable; what matters here is that the revision
    // check names it, whatever else does.
    assert!(report.anomalies.is_empty(), "seed {seed}");
}

#[test]
fn simulated_histories_with_revisions_pass_and_without_are_not_checked() {
    for seed in SEEDS {
        let with = run(&history(seed, true));
        assert_eq!(
            with.verdict,
            Verdict::Linearizable,
            "seed {seed}:\n{}",
            with.summary()
        );
        let revisions = with.revisions.as_ref().expect("revision checks ran");
        assert!(revisions.valid(), "seed {seed}:\n{}", with.summary());
        assert!(revisions.operations_checked > 100, "seed {seed}");
        let without = run(&history(seed, false));
        assert!(without.revisions.is_none(), "seed {seed}");
        let json = serde_json::to_value(&without).expect("serializes");
        assert!(
            json.get("revisions").is_none(),
            "seed {seed}: checker.json of a history without revisions is unchanged"
        );
        assert_eq!(without.verdict, Verdict::Linearizable);
    }
}

#[test]
fn an_injected_revision_regression_is_flagged() {
    for seed in SEEDS {
        let mut events = history(seed, true);
        // A read whose process observed revision q ≥ 2 just before it (and
        // whose key's mod_revision is below q): it answers at q − 1.
        let target = ok_completions(&events, true).into_iter().find_map(|r| {
            let invoked = invocation_of(&events, r);
            let previous = (0..invoked).rev().find(|&i| {
                events[i].process == events[r].process && events[i].event_type == EventType::Ok
            })?;
            let q = events[previous].revision?;
            (q >= 2 && events[r].mod_revision.unwrap_or(0) < q).then_some((r, q))
        });
        let (r, q) = target.expect("a read after an ok operation of its process");
        events[r].revision = Some(q - 1);
        assert_flagged(&events, RevisionAnomalyKind::RevisionRegression, seed);
    }
}

#[test]
fn an_injected_read_ahead_of_its_header_is_flagged() {
    for seed in SEEDS {
        let mut events = history(seed, true);
        let r = ok_completions(&events, true)
            .into_iter()
            .find(|&r| events[r].mod_revision.is_some_and(|m| m >= 2))
            .expect("a read of a written key");
        events[r].revision = events[r].mod_revision.map(|m| m - 1);
        assert_flagged(&events, RevisionAnomalyKind::ReadAheadOfHeader, seed);
    }
}

#[test]
fn an_injected_duplicate_revision_is_flagged() {
    for seed in SEEDS {
        let mut events = history(seed, true);
        let writes = ok_completions(&events, false);
        let (first, second) = (writes[0], writes[1]);
        events[second].revision = events[first].revision;
        assert_flagged(&events, RevisionAnomalyKind::DuplicateRevision, seed);
    }
}

#[test]
fn an_injected_revision_order_inversion_is_flagged() {
    for seed in SEEDS {
        let mut events = history(seed, true);
        // Two ok writes in real-time order; the later one is acknowledged
        // at the earlier one's revision minus one.
        let writes = ok_completions(&events, false);
        let (earlier, later) = writes
            .iter()
            .find_map(|&a| {
                let b = writes
                    .iter()
                    .copied()
                    .find(|&b| invocation_of(&events, b) > a)?;
                Some((a, b))
            })
            .expect("two writes in real-time order");
        events[later].revision = events[earlier].revision.map(|r| r - 1);
        assert_flagged(&events, RevisionAnomalyKind::RevisionOrder, seed);
    }
}

#[test]
fn an_injected_mod_revision_mismatch_is_flagged() {
    for seed in SEEDS {
        let mut events = history(seed, true);
        // A read of a value whose write was acknowledged: its mod_revision
        // is moved one below that write's revision.
        let writes = ok_completions(&events, false);
        let r = ok_completions(&events, true)
            .into_iter()
            .find(|&r| {
                events[r].value.is_some()
                    && writes.iter().any(|&w| {
                        events[w].key == events[r].key && events[w].value == events[r].value
                    })
            })
            .expect("a read of an acknowledged write");
        events[r].mod_revision = events[r].mod_revision.map(|m| m - 1);
        assert_flagged(&events, RevisionAnomalyKind::ModRevisionMismatch, seed);
    }
}
