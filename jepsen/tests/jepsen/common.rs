//! Shared helpers: where the recorded test histories live, and small history
//! builders.

use std::path::PathBuf;

use jepsen::history::{Event, EventType, Function};

/// The folder of recorded histories: `RAFTCASK_TESTDATA`, else
/// `../shared/testdata` beside the workspace. `None` (after a loud SKIPPED
/// line) when absent outside CI; in CI (`CI=true`) an absent folder fails.
pub fn testdata() -> Option<PathBuf> {
    let path = std::env::var_os("RAFTCASK_TESTDATA").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/testdata"),
        PathBuf::from,
    );
    if path.join("jepsen-etcd").is_dir() && path.join("kv").is_dir() {
        return Some(path);
    }
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!(
            "the recorded histories are missing at {} (CI=true: .ci/run must provide them; \
             set RAFTCASK_TESTDATA to override)",
            path.display()
        );
    }
    eprintln!(
        "SKIPPED: recorded histories not found at {} (set RAFTCASK_TESTDATA); \
         the testdata checks did NOT run",
        path.display()
    );
    None
}

/// An event with a value.
pub fn event(
    process: u64,
    event_type: EventType,
    f: Function,
    key: &str,
    value: Option<&str>,
) -> Event {
    let mut event = Event::new(process, event_type, f, key);
    event.value = value.map(str::to_string);
    event
}

/// Serializes the tests that start real members: each checks that it left
/// no child process behind, which another run's members would break.
pub static RUN_LOCK: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A run directory that does not exist yet: `<tmp>/jepsen-<name>-<pid>-<ns>`
/// (`jepsen run` creates it and refuses one that holds an earlier run).
pub fn run_dir(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!(
        "jepsen-{name}-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
    ))
}

/// The invocation position of the operation completing at `completion`.
pub fn invocation_of(events: &[Event], completion: usize) -> usize {
    (0..completion)
        .rev()
        .find(|&i| {
            events[i].process == events[completion].process
                && events[i].event_type == EventType::Invoke
        })
        .expect("an invocation")
}
