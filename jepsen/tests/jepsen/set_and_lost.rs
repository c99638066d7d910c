//! Proves the set checker and the lost-writes checker on small hand-made
//! histories: a valid set passes; a lost acknowledged add and an unexpected
//! element are each named; an unknown add may be present ("recovered") or
//! absent; a set without a final read is not passed; kv appends missing from
//! a final read are lost writes.

use jepsen::check::{ModelName, check};
use jepsen::history::{Event, EventType, Function};
use jepsen::linearizability::{Settings, Verdict};

use crate::common::event;

fn add(events: &mut Vec<Event>, process: u64, element: &str, outcome: EventType) {
    events.push(event(
        process,
        EventType::Invoke,
        Function::Add,
        "s",
        Some(element),
    ));
    events.push(event(process, outcome, Function::Add, "s", Some(element)));
}

fn final_read(events: &mut Vec<Event>, elements: &[&str]) {
    events.push(event(99, EventType::Invoke, Function::Read, "s", None));
    let mut read = event(99, EventType::Ok, Function::Read, "s", None);
    read.values = Some(elements.iter().map(|e| e.to_string()).collect());
    events.push(read);
}

fn set_history(read: &[&str]) -> Vec<Event> {
    let mut events = Vec::new();
    add(&mut events, 0, "a", EventType::Ok);
    add(&mut events, 1, "b", EventType::Ok);
    add(&mut events, 2, "c", EventType::Info);
    add(&mut events, 3, "d", EventType::Fail);
    final_read(&mut events, read);
    events
}

#[test]
fn set_checker_names_lost_and_unexpected_elements() {
    let valid = check(
        ModelName::Set,
        &set_history(&["a", "b", "c"]),
        Settings::default(),
    )
    .expect("checks");
    assert_eq!(valid.verdict, Verdict::Linearizable, "{}", valid.summary());
    assert_eq!(valid.sets[0].recovered, 1);
    let without_unknown = check(
        ModelName::Set,
        &set_history(&["a", "b"]),
        Settings::default(),
    )
    .expect("checks");
    assert_eq!(without_unknown.verdict, Verdict::Linearizable);

    let lost = check(
        ModelName::Set,
        &set_history(&["a", "c"]),
        Settings::default(),
    )
    .expect("checks");
    assert_eq!(lost.verdict, Verdict::NotLinearizable);
    assert_eq!(lost.sets[0].lost, vec!["b".to_string()]);

    let unexpected = check(
        ModelName::Set,
        &set_history(&["a", "b", "d", "z"]),
        Settings::default(),
    )
    .expect("checks");
    assert_eq!(unexpected.verdict, Verdict::NotLinearizable);
    assert_eq!(
        unexpected.sets[0].unexpected,
        vec!["d".to_string(), "z".to_string()]
    );

    let mut no_read = Vec::new();
    add(&mut no_read, 0, "a", EventType::Ok);
    let report = check(ModelName::Set, &no_read, Settings::default()).expect("checks");
    assert_eq!(
        report.verdict,
        Verdict::NotLinearizable,
        "no final read must not pass"
    );
}

#[test]
fn kv_appends_missing_from_the_final_read_are_lost() {
    let mut events = Vec::new();
    for (process, text) in [(0, "x;"), (1, "y;")] {
        events.push(event(
            process,
            EventType::Invoke,
            Function::Append,
            "k",
            Some(text),
        ));
        events.push(event(
            process,
            EventType::Ok,
            Function::Append,
            "k",
            Some(text),
        ));
    }
    events.push(event(5, EventType::Invoke, Function::Get, "k", None));
    let mut good = events.clone();
    good.push(event(5, EventType::Ok, Function::Get, "k", Some("x;y;")));
    let report = check(ModelName::Kv, &good, Settings::default()).expect("checks");
    assert_eq!(
        report.verdict,
        Verdict::Linearizable,
        "{}",
        report.summary()
    );
    assert_eq!(report.lost_writes.as_ref().map(|l| l.checked_keys), Some(1));

    events.push(event(5, EventType::Ok, Function::Get, "k", Some("x;")));
    let report = check(ModelName::Kv, &events, Settings::default()).expect("checks");
    assert_eq!(report.verdict, Verdict::NotLinearizable);
    let lost = report.lost_writes.expect("lost writes");
    assert_eq!(lost.lost.len(), 1, "{:?}", lost.lost);
    assert!(lost.lost[0].message.contains("y;"));
}
