//! Crash test with real process death. The test re-executes its own binary
//! as a child that writes from several threads with sync=always (tiny
//! segments, so rotation, hint writing and automatic merges are in flight
//! too) and prints a line for every acknowledged write. The parent SIGKILLs
//! the child at a pseudo-random moment, reopens the directory, and checks:
//! every acknowledged write is there (the key holds that version or a later
//! one), and every value is one the child really wrote (no garbage). Then
//! the child runs again on the same directory, continuing from there.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bitcask::{AutoMerge, Engine, Options, Scan, SyncPolicy};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::common::value_for;

const CHILD_ENV: &str = "BITCASK_CRASH_CHILD_DIR";
const THREADS: u64 = 4;
const KEYS_PER_THREAD: u64 = 25;
/// The child stops by itself after this many writes per thread.
const WRITES_PER_THREAD_MAX: u64 = 50_000;
const ROUNDS: usize = 4;

fn options() -> Options {
    Options {
        sync: SyncPolicy::Always,
        segment_size_bytes: 16 * 1024,
        auto_merge: Some(AutoMerge {
            dead_ratio_min: 0.3,
            dead_bytes_min: 32 * 1024,
        }),
        ..Options::default()
    }
}

/// Values are `value_for(key, version)`; the version is the text between
/// the first two `#`.
fn version_of(key: &[u8], value: &[u8]) -> u64 {
    let text = String::from_utf8(value.to_vec()).expect("values are text");
    let mut parts = text.split('#');
    assert_eq!(
        parts.next().unwrap().as_bytes(),
        key,
        "value {text:?} belongs to another key"
    );
    let version: u64 = parts.next().unwrap().parse().expect("version");
    assert_eq!(
        value,
        value_for(key, version, value.len()).as_slice(),
        "garbage value for {key:?}"
    );
    version
}

fn child(dir: &str) {
    let engine = Arc::new(Engine::open(dir, options()).expect("child opens"));
    // Continue each key from the version it holds.
    let mut start = vec![0u64; (THREADS * KEYS_PER_THREAD) as usize];
    for entry in engine.scan(&Scan::all(usize::MAX), 0).unwrap() {
        let index: usize = String::from_utf8(entry.key.clone()).unwrap()[1..]
            .parse()
            .unwrap();
        start[index] = version_of(&entry.key, entry.value.as_ref().unwrap());
    }
    let start = Arc::new(start);
    let threads: Vec<_> = (0..THREADS)
        .map(|t| {
            let engine = engine.clone();
            let start = start.clone();
            std::thread::spawn(move || {
                let mut rng = SmallRng::seed_from_u64(t);
                for i in 0..WRITES_PER_THREAD_MAX {
                    let index = t * KEYS_PER_THREAD + i % KEYS_PER_THREAD;
                    let key = format!("k{index}").into_bytes();
                    let version = start[index as usize] + 1 + i / KEYS_PER_THREAD;
                    let value = value_for(&key, version, rng.random_range(10..2000));
                    engine.put(&key, &value).expect("child write");
                    // One write(2) per line: the line is in the pipe before
                    // the next write starts, so a SIGKILL cannot split it.
                    println!("ack {index} {version}");
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
}

#[test]
fn sigkill_loses_no_acknowledged_write() {
    if let Ok(dir) = std::env::var(CHILD_ENV) {
        child(&dir);
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let exe = std::env::current_exe().unwrap();
    let mut rng = SmallRng::seed_from_u64(7);
    let mut acked = vec![0u64; (THREADS * KEYS_PER_THREAD) as usize];
    for round in 0..ROUNDS {
        let mut child = Command::new(&exe)
            .args([
                "--exact",
                "crash::sigkill_loses_no_acknowledged_write",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_ENV, dir.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let kill_after = rng.random_range(200..3000);
        let deadline = Instant::now() + Duration::from_secs(60);
        let stdout = child.stdout.take().unwrap();
        let mut lines = BufReader::new(stdout).lines();
        let mut seen = 0;
        let mut killed = false;
        while let Some(Ok(line)) = lines.next() {
            // The test harness prints "test <name> ... " in front of the first line.
            if let Some(rest) = line.find("ack ").map(|at| &line[at + 4..]) {
                let (index, version) = rest.split_once(' ').unwrap();
                let index: usize = index.parse().unwrap();
                acked[index] = acked[index].max(version.parse().unwrap());
                seen += 1;
            }
            if !killed && (seen >= kill_after || Instant::now() > deadline) {
                child.kill().unwrap(); // SIGKILL
                killed = true;
                // Keep reading: lines already in the pipe were acknowledged.
            }
        }
        let status = child.wait().unwrap();
        assert!(
            killed,
            "round {round}: the child finished before it was killed ({status})"
        );
        assert!(seen > 0, "round {round}: the child acknowledged nothing");

        let engine = Engine::open(dir.path(), options()).unwrap();
        let mut found = vec![0u64; acked.len()];
        for entry in engine.scan(&Scan::all(usize::MAX), 0).unwrap() {
            let key = String::from_utf8(entry.key.clone()).unwrap();
            let index: usize = key
                .strip_prefix('k')
                .and_then(|i| i.parse().ok())
                .expect("only the child's keys");
            found[index] = version_of(&entry.key, entry.value.as_ref().unwrap());
        }
        for (index, (&want, &have)) in acked.iter().zip(&found).enumerate() {
            assert!(
                have >= want,
                "round {round}: k{index} acknowledged at version {want}, found {have}"
            );
        }
        // The next round continues from what survived.
        acked = found;
        engine.close().unwrap();
    }
}
