//! Proves the checker agrees with histories nobody on this project wrote:
//! every line of `jepsen-etcd/VERDICTS.txt` (cas-register model) and the
//! `-ok` / `-bad` names of the kv files (kv model), each file in seconds;
//! and that every etcd log survives the Jepsen log export unchanged. Prints
//! a timing table. Skips loudly without the folder (fails in CI).

use std::time::{Duration, Instant};

use jepsen::check::{ModelName, check};
use jepsen::formats::{self, Format};
use jepsen::linearizability::{Settings, Verdict};

use crate::common::testdata;

/// A generous bound per file on a loaded 2-core machine ("in seconds").
const FILE_SECONDS_MAX: u64 = 10;

fn run(path: &std::path::Path, model: ModelName) -> (Verdict, Duration, usize) {
    let text = std::fs::read_to_string(path).expect("readable history");
    let started = Instant::now();
    let events = formats::read(&text, formats::detect(&text)).expect("parses");
    let report = check(model, &events, Settings::default()).expect("checks");
    let elapsed = started.elapsed();
    assert!(
        elapsed < Duration::from_secs(FILE_SECONDS_MAX),
        "{} took {elapsed:?}, over {FILE_SECONDS_MAX} s",
        path.display()
    );
    (report.verdict, elapsed, events.len())
}

#[test]
fn etcd_logs_agree_with_every_published_verdict() {
    let Some(root) = testdata() else { return };
    let verdicts =
        std::fs::read_to_string(root.join("jepsen-etcd/VERDICTS.txt")).expect("VERDICTS.txt");
    let mut table =
        String::from("file            events  expected            got               ms\n");
    let mut checked = 0;
    for line in verdicts.lines().filter(|l| !l.trim().is_empty()) {
        let (file, expected) = line.split_once(' ').expect("`file verdict` lines");
        let expected = match expected.trim() {
            "linearizable" => Verdict::Linearizable,
            "not-linearizable" => Verdict::NotLinearizable,
            other => panic!("unknown verdict {other:?} in VERDICTS.txt"),
        };
        let (got, elapsed, events) =
            run(&root.join("jepsen-etcd").join(file), ModelName::CasRegister);
        table.push_str(&format!(
            "{file:<15} {events:>6}  {:<18}  {:<16} {:>4}\n",
            format!("{expected:?}"),
            format!("{got:?}"),
            elapsed.as_millis()
        ));
        assert_eq!(got, expected, "{file}: checker disagrees with VERDICTS.txt");
        checked += 1;
    }
    eprintln!("{table}");
    assert!(checked >= 50, "VERDICTS.txt listed only {checked} files");
}

#[test]
fn etcd_logs_without_verdict_are_decided_and_round_trip_the_export() {
    let Some(root) = testdata() else { return };
    let mut files: Vec<_> = std::fs::read_dir(root.join("jepsen-etcd"))
        .expect("folder")
        .map(|entry| entry.expect("entry").path())
        .filter(|path| path.extension().is_some_and(|e| e == "log"))
        .collect();
    files.sort();
    assert!(files.len() > 100, "expected the ~100 etcd logs");
    for path in files {
        let text = std::fs::read_to_string(&path).expect("readable");
        let events = formats::read(&text, Format::JepsenLog).expect("parses");
        let exported = formats::export_jepsen_log(&events);
        let again = formats::read_jepsen_log(&exported).expect("export parses");
        assert_eq!(
            events,
            again,
            "{}: export does not round-trip",
            path.display()
        );
        // Every file is decided (none runs out of budget).
        let (verdict, _, _) = run(&path, ModelName::CasRegister);
        assert_ne!(verdict, Verdict::Unknown, "{}: undecided", path.display());
    }
}

#[test]
fn kv_files_agree_with_their_names() {
    let Some(root) = testdata() else { return };
    let mut files: Vec<_> = std::fs::read_dir(root.join("kv"))
        .expect("folder")
        .map(|entry| entry.expect("entry").path())
        .filter(|path| path.extension().is_some_and(|e| e == "txt"))
        .collect();
    files.sort();
    assert_eq!(files.len(), 6, "expected c01, c10, c50 each -ok and -bad");
    let mut table =
        String::from("file            events  expected            got               ms\n");
    for path in files {
        let name = path
            .file_name()
            .expect("name")
            .to_string_lossy()
            .to_string();
        let expected = if name.contains("-ok") {
            Verdict::Linearizable
        } else {
            Verdict::NotLinearizable
        };
        let (got, elapsed, events) = run(&path, ModelName::Kv);
        table.push_str(&format!(
            "{name:<15} {events:>6}  {:<18}  {:<16} {:>4}\n",
            format!("{expected:?}"),
            format!("{got:?}"),
            elapsed.as_millis()
        ));
        assert_eq!(
            got, expected,
            "{name}: checker disagrees with the file name"
        );
    }
    eprintln!("{table}");
}
