//! Property tests (fixed seeds; `PROPTEST_CASES`, default 64, sets the
//! number of cases): random sequential histories are always linearizable
//! (cas-register and kv), and on small random concurrent cas-register
//! histories the Wing–Gong search agrees with a brute-force search over
//! every order that respects real time.

use jepsen::history::{Event, EventType, Function, Operation, Outcome, pair};
use jepsen::linearizability::{self, Settings, Verdict};
use jepsen::model::{CasRegister, Interner, Model};
use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};

use crate::common::event;

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(64)
}

fn runner(seed: &[u8; 32]) -> TestRunner {
    let config = Config {
        cases: cases(),
        failure_persistence: None,
        ..Config::default()
    };
    TestRunner::new_with_rng(config, TestRng::from_seed(RngAlgorithm::ChaCha, seed))
}

/// One generated step: function (0 read, 1 write, 2 cas), two small values,
/// and an outcome choice (0..8: 0 = unknown and applied, 1 = unknown and not).
type Step = (u8, u8, u8, u8);

fn steps(max: usize) -> impl Strategy<Value = Vec<Step>> {
    prop::collection::vec((0u8..3, 0u8..3, 0u8..3, 0u8..8), 0..max)
}

/// A sequential cas-register history run against a reference register.
fn sequential_cas_register(steps: &[Step]) -> Vec<Event> {
    let mut events = Vec::new();
    let mut register: Option<String> = None;
    let mut process = 0;
    for &(f, a, b, outcome) in steps {
        let (a, b) = (a.to_string(), b.to_string());
        let unknown = outcome < 2;
        let applies = outcome != 1;
        let (function, value, expected) = match f {
            0 => (Function::Read, None, None),
            1 => (Function::Write, Some(b.clone()), None),
            _ => (Function::Cas, Some(b.clone()), Some(a.clone())),
        };
        let mut invoke = event(process, EventType::Invoke, function, "", value.as_deref());
        invoke.expected = expected.clone();
        events.push(invoke);
        let mut done = event(process, EventType::Ok, function, "", value.as_deref());
        done.expected = expected;
        match f {
            0 => done.value = register.clone(),
            1 if applies => register = Some(b),
            1 => {}
            _ if register.as_deref() == Some(a.as_str()) && applies => register = Some(b),
            _ if register.as_deref() == Some(a.as_str()) => {}
            _ => done.event_type = EventType::Fail,
        }
        if unknown && f != 0 {
            done.event_type = EventType::Info;
            process += 1; // Jepsen retires a process after an unknown outcome.
        }
        events.push(done);
    }
    events
}

#[test]
fn sequential_cas_register_histories_are_linearizable() {
    let result = runner(b"raftcask-jepsen-seq-cas-register").run(&steps(40), |steps| {
        let events = sequential_cas_register(&steps);
        let operations = pair(&events).expect("pairs");
        let report =
            linearizability::check(&CasRegister, &operations, Settings::default()).expect("checks");
        prop_assert_eq!(report.verdict, Verdict::Linearizable, "{:?}", events);
        Ok(())
    });
    if let Err(error) = result {
        panic!("{error}");
    }
}

#[test]
fn sequential_kv_histories_are_linearizable() {
    let strategy = prop::collection::vec((0u8..3, 0u8..3, 0u8..4), 0..40);
    let result = runner(b"raftcask-jepsen-seq-kv-histories").run(&strategy, |steps| {
        let mut events = Vec::new();
        let mut map = std::collections::BTreeMap::<String, String>::new();
        for (i, &(f, key, text)) in steps.iter().enumerate() {
            let key = format!("k{key}");
            let text = format!("{text}.{i};");
            let function = [Function::Get, Function::Put, Function::Append][f as usize];
            let written = (f != 0).then_some(text.as_str());
            events.push(event(0, EventType::Invoke, function, &key, written));
            let current = map.entry(key.clone()).or_default();
            match f {
                0 => {}
                1 => *current = text.clone(),
                _ => current.push_str(&text),
            }
            let value = if f == 0 {
                Some(current.clone())
            } else {
                Some(text.clone())
            };
            events.push(event(0, EventType::Ok, function, &key, value.as_deref()));
        }
        let report =
            jepsen::check::check(jepsen::check::ModelName::Kv, &events, Settings::default())
                .expect("checks");
        prop_assert_eq!(
            report.verdict,
            Verdict::Linearizable,
            "{}",
            report.summary()
        );
        Ok(())
    });
    if let Err(error) = result {
        panic!("{error}");
    }
}

/// An open invocation: function, value, expected value.
type Invoked = (Function, Option<String>, Option<String>);

/// A small concurrent history: each step starts or finishes an operation of
/// one of three processes, with random (often wrong) results.
fn concurrent_cas_register(steps: &[Step]) -> Vec<Event> {
    let mut events = Vec::new();
    let mut open: [Option<Invoked>; 3] = [None, None, None];
    let mut process_id = [0u64, 1, 2];
    for &(f, a, b, choice) in steps {
        let slot = (a as usize + b as usize + choice as usize) % 3;
        match open[slot].take() {
            None => {
                let (function, value, expected) = match f {
                    0 => (Function::Read, None, None),
                    1 => (Function::Write, Some(b.to_string()), None),
                    _ => (Function::Cas, Some(b.to_string()), Some(a.to_string())),
                };
                let mut invoke = event(
                    process_id[slot],
                    EventType::Invoke,
                    function,
                    "",
                    value.as_deref(),
                );
                invoke.expected = expected.clone();
                events.push(invoke);
                open[slot] = Some((function, value, expected));
            }
            Some((function, value, expected)) => {
                let event_type = match choice {
                    0 => EventType::Info,
                    1 if function == Function::Cas => EventType::Fail,
                    _ => EventType::Ok,
                };
                let mut done = event(process_id[slot], event_type, function, "", value.as_deref());
                done.expected = expected;
                if function == Function::Read {
                    // Read a random value (or nil).
                    done.value = (a < 2).then(|| (b % 2).to_string());
                }
                events.push(done);
                if event_type == EventType::Info {
                    process_id[slot] += 3;
                }
            }
        }
    }
    events
}

/// Whether some order of the operations, respecting real time, satisfies the
/// model; ok operations must all be placed, unknown ones may be left out.
fn brute_force(operations: &[Operation]) -> bool {
    let model = CasRegister;
    let mut values = Interner::default();
    let kept: Vec<(&Operation, <CasRegister as Model>::Input)> = operations
        .iter()
        .filter(|o| o.outcome == Outcome::Ok || (o.outcome == Outcome::Unknown && !o.is_read()))
        .map(|o| {
            (
                o,
                model
                    .prepare(o, &mut values)
                    .expect("prepares")
                    .expect("kept"),
            )
        })
        .collect();
    fn search(
        kept: &[(&Operation, <CasRegister as Model>::Input)],
        done: &mut Vec<bool>,
        state: Option<u32>,
    ) -> bool {
        let required_left = kept
            .iter()
            .zip(done.iter())
            .any(|((o, _), d)| !d && o.outcome == Outcome::Ok);
        if !required_left {
            return true;
        }
        for i in 0..kept.len() {
            if done[i] {
                continue;
            }
            // Every unplaced ok operation that finished before this one began
            // would be out of real-time order.
            let blocked =
                (0..kept.len()).any(|j| !done[j] && j != i && kept[j].0.precedes(kept[i].0));
            if blocked {
                continue;
            }
            let mut next = Vec::new();
            CasRegister.step(&mut (), &state, &kept[i].1, &mut next);
            for state in next {
                done[i] = true;
                let found = search(kept, done, state);
                done[i] = false;
                if found {
                    return true;
                }
            }
        }
        false
    }
    let mut done = vec![false; kept.len()];
    search(&kept, &mut done, None)
}

#[test]
fn small_concurrent_histories_agree_with_brute_force() {
    let mut verdicts = [0usize; 2];
    let result = runner(b"raftcask-jepsen-wgl-vs-brute-for").run(&steps(16), |steps| {
        let events = concurrent_cas_register(&steps);
        let operations = pair(&events).expect("pairs");
        let report =
            linearizability::check(&CasRegister, &operations, Settings::default()).expect("checks");
        let expected = if brute_force(&operations) {
            Verdict::Linearizable
        } else {
            Verdict::NotLinearizable
        };
        prop_assert_eq!(report.verdict, expected, "{:?}", events);
        Ok(())
    });
    if let Err(error) = result {
        panic!("{error}");
    }
    // Count both kinds of verdict over a fixed sample, so the property
    // cannot pass by generating only trivial histories.
    let mut sampler = runner(b"raftcask-jepsen-wgl-vs-brute-for");
    for _ in 0..200 {
        let tree = steps(16).new_tree(&mut sampler).expect("a case");
        let events = concurrent_cas_register(&proptest::strategy::ValueTree::current(&tree));
        let operations = pair(&events).expect("pairs");
        verdicts[usize::from(brute_force(&operations))] += 1;
    }
    assert!(
        verdicts[0] > 20 && verdicts[1] > 20,
        "the generator must produce both verdicts often: {verdicts:?}"
    );
}
