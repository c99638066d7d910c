//! A failed fsync or write poisons the engine: the failing call reports the
//! error, every later write gets `Error::Poisoned`, and the fsync is never
//! retried (after a failed fsync the kernel may have dropped the dirty
//! pages, so a retry that "succeeds" would lie). Checked twice: through the
//! I/O trait (SimFs failing on command) and on real files under `fiu-run`
//! (Debian fiu-utils), which makes the real fdatasync(2) fail.

use std::process::Command;

use bitcask::{Engine, Error, Options, SyncPolicy};
use vfs::sim::SimFs;

use crate::common::open_sim;

#[test]
fn a_failed_fsync_poisons_the_engine_for_good() {
    let fs = SimFs::new();
    let engine = open_sim(&fs, SyncPolicy::Always, 1 << 20);
    engine.put(b"before", b"1").unwrap();
    fs.set_fail_sync(true);
    let err = engine.put(b"during", b"2").unwrap_err();
    assert!(matches!(err, Error::Io { .. }), "{err}");
    assert!(engine.is_poisoned());
    let syncs = fs.sync_count();
    fs.set_fail_sync(false);
    // The disk works again, but the engine must not trust it.
    let err = engine.put(b"after", b"3").unwrap_err();
    assert!(matches!(err, Error::Poisoned { .. }), "{err}");
    assert!(
        err.to_string().contains("injected failure: fsync"),
        "the cause is named: {err}"
    );
    assert!(
        engine
            .write_batch(&bitcask::Batch::new().delete("before"))
            .is_err()
    );
    assert!(engine.sync().is_err());
    assert_eq!(
        fs.sync_count(),
        syncs,
        "an fsync was retried after it failed"
    );
    // The unacknowledged write is not visible, the acknowledged one is.
    assert_eq!(engine.get(b"during", 0).unwrap(), None);
    assert_eq!(engine.get(b"before", 0).unwrap().unwrap().value, b"1");
    drop(engine);
    let engine = open_sim(&fs, SyncPolicy::Always, 1 << 20);
    assert_eq!(engine.get(b"before", 0).unwrap().unwrap().value, b"1");
    engine.put(b"after", b"3").unwrap();
}

#[test]
fn a_failed_write_poisons_the_engine() {
    let fs = SimFs::new();
    let engine = open_sim(&fs, SyncPolicy::Never, 1 << 20);
    engine.put(b"a", b"1").unwrap();
    fs.fail_writes_after(Some(0));
    assert!(matches!(engine.put(b"b", b"2"), Err(Error::Io { .. })));
    fs.fail_writes_after(None);
    assert!(matches!(
        engine.put(b"c", b"3"),
        Err(Error::Poisoned { .. })
    ));
    assert_eq!(engine.get(b"b", 0).unwrap(), None);
    match engine.close() {
        Err(Error::Poisoned { cause }) => assert!(cause.contains("injected"), "{cause}"),
        other => panic!("closing a poisoned engine must say why: {other:?}"),
    }
}

#[test]
fn a_failed_fsync_during_rotation_poisons_the_engine() {
    let fs = SimFs::new();
    let engine = open_sim(&fs, SyncPolicy::Never, 256);
    fs.set_fail_sync(true);
    let mut failed = None;
    for i in 0..20u32 {
        if let Err(e) = engine.put(format!("k{i}").as_bytes(), &[0u8; 64]) {
            failed = Some(e);
            break;
        }
    }
    assert!(
        matches!(failed, Some(Error::Io { .. })),
        "sealing must fsync: {failed:?}"
    );
    fs.set_fail_sync(false);
    assert!(matches!(
        engine.put(b"x", b"y"),
        Err(Error::Poisoned { .. })
    ));
}

const CHILD_ENV: &str = "BITCASK_FIU_CHILD_DIR";

/// Child mode: runs under fiu-run with every fsync failing.
fn fiu_child(dir: &str) {
    let engine = Engine::open(
        dir,
        Options {
            sync: SyncPolicy::Always,
            auto_merge: None,
            ..Options::default()
        },
    );
    // Creating the directory's first segment fsyncs the directory, so even
    // open may already fail; either way nothing may be acknowledged.
    let engine = match engine {
        Ok(engine) => engine,
        Err(e) => {
            println!("RESULT open-failed {e}");
            return;
        }
    };
    match engine.put(b"k", b"v") {
        Ok(_) => println!("RESULT acknowledged-without-fsync"),
        Err(e) => println!("RESULT first-put-failed {e}"),
    }
    match engine.put(b"k2", b"v2") {
        Err(Error::Poisoned { .. }) => println!("RESULT then-poisoned"),
        other => println!("RESULT then-not-poisoned {other:?}"),
    }
}

#[test]
fn fsync_failure_under_fiu_run_poisons_the_engine() {
    if let Ok(dir) = std::env::var(CHILD_ENV) {
        fiu_child(&dir);
        return;
    }
    let fiu_run = Command::new("fiu-run").arg("-h").output();
    if fiu_run.is_err() {
        if std::env::var("RAFTCASK_ALLOW_MISSING_TOOLS").is_ok() {
            eprintln!(
                "!!! SKIPPED fsync_failure_under_fiu_run: fiu-run not found (install Debian fiu-utils) !!!"
            );
            return;
        }
        panic!(
            "fiu-run not found: install Debian's fiu-utils (./test.sh does as root), or set RAFTCASK_ALLOW_MISSING_TOOLS=1 to skip loudly"
        );
    }
    let dir = tempfile::tempdir().unwrap();
    let exe = std::env::current_exe().unwrap();
    let output = Command::new("fiu-run")
        .args(["-x", "-c", "enable name=posix/io/sync/*"])
        .arg(&exe)
        .args([
            "--exact",
            "fsync_failure::fsync_failure_under_fiu_run_poisons_the_engine",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, dir.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    // The test harness prints "test <name> ... " in front of the first line.
    let results: Vec<&str> = stdout
        .lines()
        .filter_map(|l| l.find("RESULT").map(|at| &l[at..]))
        .collect();
    assert!(
        !results.is_empty(),
        "child printed no result; stdout: {stdout} stderr: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        !results
            .iter()
            .any(|r| r.contains("acknowledged-without-fsync")),
        "{results:?}"
    );
    if !results[0].contains("open-failed") {
        assert!(results[0].contains("first-put-failed"), "{results:?}");
        assert_eq!(
            results.get(1).copied(),
            Some("RESULT then-poisoned"),
            "{results:?}"
        );
    }
    // With fsync working again, the directory opens and holds nothing unacknowledged.
    let engine = Engine::open(dir.path(), Options::default()).unwrap();
    assert_eq!(engine.get(b"k2", 0).unwrap(), None);
}
