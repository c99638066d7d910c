//! Merge: it keeps exactly the live data, reclaims the rest, refuses inputs
//! that are not a prefix covering every earlier merge output, lets readers
//! and writers carry on while it runs, survives a power cut at any moment
//! of it, and runs by itself when dead bytes pile up (automatic merge).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use bitcask::{AutoMerge, Batch, Engine, Error, Options, Scan, SyncPolicy};
use vfs::sim::{SimFs, Torn};

use crate::common::{open_sim, sim_dir, sim_options, value_for};

fn contents(engine: &Engine, now_ms: u64) -> BTreeMap<Vec<u8>, Vec<u8>> {
    engine
        .scan(&Scan::all(usize::MAX), now_ms)
        .unwrap()
        .into_iter()
        .map(|entry| (entry.key, entry.value.unwrap()))
        .collect()
}

/// Overwrites 20 keys three times, deletes 5, lets 5 expire at 1000.
fn churn(engine: &Engine) {
    for round in 0..3u64 {
        for i in 0..20u32 {
            let key = format!("k{i:02}").into_bytes();
            let expiry = if i >= 15 && round == 2 { 1_000 } else { 0 };
            engine
                .put_with_expiry(&key, &value_for(&key, round, 150), expiry)
                .unwrap();
        }
    }
    for i in 0..5u32 {
        engine.delete(format!("k{i:02}").as_bytes()).unwrap();
    }
    engine.put(b"last", b"x").unwrap();
}

#[test]
fn merge_keeps_live_data_and_reclaims_the_rest() {
    let fs = SimFs::new();
    let engine = open_sim(&fs, SyncPolicy::Never, 1024);
    churn(&engine);
    let now = 2_000;
    let before = contents(&engine, now);
    assert_eq!(before.len(), 11, "10 live k-keys plus 'last'");
    let last_seq = engine.last_seq();
    let bytes_before: u64 = engine.stats().files.iter().map(|f| f.total_bytes).sum();
    let inputs = engine.sealed_data_files();
    let report = engine.merge(&inputs, now).unwrap();
    assert_eq!(report.inputs, inputs);
    assert!(
        report
            .outputs
            .iter()
            .all(|name| name.starts_with(&format!("merge-{:020}-", report.cutoff)))
    );
    assert!(report.bytes_after < report.bytes_before / 3, "{report:?}");
    assert_eq!(contents(&engine, now), before);
    assert_eq!(engine.last_seq(), last_seq);
    let bytes_after: u64 = engine.stats().files.iter().map(|f| f.total_bytes).sum();
    assert!(bytes_after < bytes_before);
    // Inputs are gone from disk; outputs have hints.
    for name in &inputs {
        assert!(fs.read_file(&sim_dir().join(name)).is_none(), "{name} kept");
    }
    for name in &report.outputs {
        assert!(
            fs.read_file(&sim_dir().join(name.replace(".data", ".hint")))
                .is_some()
        );
    }
    // Expired keys were dropped, not just hidden.
    assert_eq!(engine.stats().keys, 11);
    drop(engine);
    let engine = open_sim(&fs, SyncPolicy::Never, 1024);
    assert_eq!(contents(&engine, now), before);
    assert_eq!(engine.last_seq(), last_seq);
    // A second merge after more writes folds the first one's output in.
    churn(&engine);
    let before = contents(&engine, now);
    let inputs = engine.sealed_data_files();
    assert!(inputs[0].starts_with("merge-"));
    engine.merge(&inputs, now).unwrap();
    assert_eq!(contents(&engine, now), before);
}

#[test]
fn merge_refuses_inputs_that_are_not_a_covering_prefix() {
    let fs = SimFs::new();
    let engine = open_sim(&fs, SyncPolicy::Never, 512);
    churn(&engine);
    let sealed = engine.sealed_data_files();
    assert!(sealed.len() >= 4);
    let not_prefix = vec![sealed[1].clone()];
    assert!(matches!(
        engine.merge(&not_prefix, 0),
        Err(Error::MergeInput(_))
    ));
    assert!(matches!(engine.merge(&[], 0), Err(Error::MergeInput(_))));
    let report = engine.merge(&sealed[..2], 0).unwrap();
    // Writes happen; now the first output alone is not a covering prefix
    // when the output has several parts, and merging nothing new is refused.
    if report.outputs.len() > 1 {
        let first = vec![report.outputs[0].clone()];
        assert!(matches!(engine.merge(&first, 0), Err(Error::MergeInput(_))));
    }
    assert!(
        matches!(engine.merge(&report.outputs, 0), Err(Error::MergeInput(_))),
        "no new writes since the merge"
    );
}

#[test]
fn readers_and_writers_carry_on_during_merges() {
    let fs = SimFs::new();
    let engine = Arc::new(open_sim(&fs, SyncPolicy::Never, 2048));
    for i in 0..200u32 {
        let key = format!("k{i:03}").into_bytes();
        engine.put(&key, &value_for(&key, 0, 100)).unwrap();
    }
    let stop = Arc::new(AtomicBool::new(false));
    let deadline = Instant::now() + Duration::from_secs(20);
    std::thread::scope(|scope| {
        let writer = {
            let engine = engine.clone();
            let stop = stop.clone();
            scope.spawn(move || {
                let mut version = 1;
                while !stop.load(Ordering::SeqCst) && version < 200 && Instant::now() < deadline {
                    for i in 0..200u32 {
                        let key = format!("k{i:03}").into_bytes();
                        engine.put(&key, &value_for(&key, version, 100)).unwrap();
                    }
                    version += 1;
                }
                version - 1
            })
        };
        let reader = {
            let engine = engine.clone();
            let stop = stop.clone();
            scope.spawn(move || {
                let mut reads = 0u64;
                while !stop.load(Ordering::SeqCst) && Instant::now() < deadline {
                    for i in (0..200u32).step_by(7) {
                        let key = format!("k{i:03}").into_bytes();
                        let item = engine.get(&key, 0).unwrap().expect("key never deleted");
                        assert!(item.value.starts_with(&key));
                        reads += 1;
                    }
                }
                reads
            })
        };
        let mut merges = 0;
        while merges < 5 && Instant::now() < deadline {
            let sealed = engine.sealed_data_files();
            if sealed.len() >= 2 {
                match engine.merge(&sealed, 0) {
                    Ok(_) => merges += 1,
                    Err(Error::MergeInput(_)) => {}
                    Err(e) => panic!("merge failed: {e}"),
                }
            }
            std::thread::yield_now();
        }
        stop.store(true, Ordering::SeqCst);
        let last_version = writer.join().unwrap();
        let reads = reader.join().unwrap();
        assert!(merges >= 1 && reads > 0, "merges {merges}, reads {reads}");
        for i in 0..200u32 {
            let key = format!("k{i:03}").into_bytes();
            assert_eq!(
                engine.get(&key, 0).unwrap().unwrap().value,
                value_for(&key, last_version, 100)
            );
        }
    });
}

#[test]
fn a_power_cut_at_any_moment_of_a_merge_loses_nothing() {
    for attempt in 0..20u64 {
        let fs = SimFs::new();
        let engine = Arc::new(open_sim(&fs, SyncPolicy::Always, 700));
        churn(&engine);
        let expected = contents(&engine, 0);
        let merging = {
            let engine = engine.clone();
            std::thread::spawn(move || engine.merge(&engine.sealed_data_files(), 0))
        };
        // Cut the power after a varying amount of merge progress.
        for _ in 0..attempt * 3 {
            std::thread::yield_now();
        }
        let after = fs.power_cut(if attempt % 2 == 0 {
            Torn::Nothing
        } else {
            Torn::Prefix(attempt)
        });
        merging.join().unwrap().unwrap();
        drop(engine);
        let engine = open_sim(&after, SyncPolicy::Always, 700);
        assert_eq!(
            contents(&engine, 0),
            expected,
            "power cut during merge, attempt {attempt}"
        );
        // And the recovered engine merges again cleanly.
        engine.put(b"post", b"1").unwrap();
        churn(&engine);
        let expected = contents(&engine, 0);
        engine.merge(&engine.sealed_data_files(), 0).unwrap();
        assert_eq!(contents(&engine, 0), expected);
    }
}

#[test]
fn automatic_merge_runs_when_dead_bytes_pile_up() {
    let fs = SimFs::new();
    let opts = Options {
        auto_merge: Some(AutoMerge {
            dead_ratio_min: 0.5,
            dead_bytes_min: 4096,
        }),
        ..sim_options(&fs, SyncPolicy::Never, 1024)
    };
    let engine = Engine::open(sim_dir(), opts).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut version = 0;
    while engine.stats().merges == 0 && Instant::now() < deadline {
        for i in 0..10u32 {
            let key = format!("k{i}").into_bytes();
            engine
                .write_batch(&Batch::new().put(key.clone(), value_for(&key, version, 200)))
                .unwrap();
        }
        version += 1;
        if version > 2_000 {
            break;
        }
    }
    assert!(
        engine.stats().merges > 0,
        "no automatic merge after {version} rounds of overwrites"
    );
    for i in 0..10u32 {
        let key = format!("k{i}").into_bytes();
        assert_eq!(
            engine.get(&key, 0).unwrap().unwrap().value,
            value_for(&key, version - 1, 200)
        );
    }
}

#[test]
fn a_lost_hint_of_any_merge_part_falls_back_to_a_scan() {
    let fs = SimFs::new();
    let engine = open_sim(&fs, SyncPolicy::Never, 512);
    churn(&engine);
    let report = engine.merge(&engine.sealed_data_files(), 0).unwrap();
    assert!(
        report.outputs.len() >= 2,
        "the merge should write several parts: {report:?}"
    );
    let expected = contents(&engine, 0);
    drop(engine);
    use vfs::Vfs;
    for part in &report.outputs {
        let hint = sim_dir().join(part.replace(".data", ".hint"));
        let _ = fs.remove(&hint);
    }
    let engine = open_sim(&fs, SyncPolicy::Never, 512);
    assert_eq!(contents(&engine, 0), expected);
}

#[test]
fn a_failed_fsync_under_concurrent_group_commit_loses_no_acknowledged_write() {
    // Writers share fsyncs and rotate often; the disk starts failing every
    // fsync mid-way. Every acknowledged write must survive a power cut. (The
    // interleavings are up to the scheduler: this is a stress test, not a
    // proof of each race.)
    for seed in 0..5u64 {
        let fs = SimFs::new();
        fs.set_sync_delay(Duration::from_micros(300));
        let engine = Arc::new(open_sim(&fs, SyncPolicy::Always, 600));
        let acked = std::sync::Mutex::new(Vec::new());
        std::thread::scope(|scope| {
            for writer in 0..4u64 {
                let (engine, acked) = (&engine, &acked);
                scope.spawn(move || {
                    for i in 0..200u64 {
                        let key = format!("w{writer}-{i}").into_bytes();
                        match engine.put(&key, &value_for(&key, 1, 100)) {
                            Ok(_) => acked.lock().unwrap().push(key),
                            Err(_) => return,
                        }
                    }
                });
            }
            std::thread::sleep(Duration::from_millis(5 + seed * 3));
            fs.set_fail_sync(true);
        });
        assert!(
            engine.is_poisoned(),
            "seed {seed}: the failing disk went unnoticed"
        );
        let after = fs.power_cut(Torn::Nothing);
        let acked = acked.into_inner().unwrap();
        drop(engine);
        let engine = open_sim(&after, SyncPolicy::Always, 600);
        for key in &acked {
            assert!(
                engine.get(key, 0).unwrap().is_some(),
                "seed {seed}: acknowledged {key:?} lost"
            );
        }
    }
}

#[test]
fn a_captured_merge_is_the_same_whenever_it_runs() {
    // The cluster captures a merge while applying its entry and runs it in
    // the background while later entries apply. Replica A runs the job
    // after more writes, replica B at once: their files must be identical.
    let write = |engine: &Engine, from: u64, to: u64| {
        for n in from..to {
            let key = format!("k{}", n % 13).into_bytes();
            engine
                .write_batch(
                    &Batch::new()
                        .put(key.clone(), value_for(&key, n, 80))
                        .seq(n << 16),
                )
                .unwrap();
        }
    };
    let (fs_a, fs_b) = (SimFs::new(), SimFs::new());
    let a = open_sim(&fs_a, SyncPolicy::Never, 700);
    let b = open_sim(&fs_b, SyncPolicy::Never, 700);
    write(&a, 1, 80);
    write(&b, 1, 80);
    let job_a = a.begin_merge(&a.sealed_data_files(), 0).unwrap();
    let job_b = b.begin_merge(&b.sealed_data_files(), 0).unwrap();
    assert_eq!(job_a.cutoff(), job_b.cutoff());
    job_b.run().unwrap();
    write(&b, 80, 160);
    write(&a, 80, 160);
    job_a.run().unwrap();
    assert_eq!(a.sealed_files(), b.sealed_files());
    assert_eq!(a.active_file(), b.active_file());
    assert_eq!(contents(&a, 0), contents(&b, 0));
}

#[test]
fn the_next_merge_is_captured_only_after_run_then_returns() {
    // kvnode repoints its change history at a merge's outputs in
    // `run_then`: a next merge captured before that could swap the
    // outputs away first.
    let fs = SimFs::new();
    let engine = open_sim(&fs, SyncPolicy::Never, 700);
    churn(&engine);
    let job = engine.begin_merge(&engine.sealed_data_files(), 0).unwrap();
    let (captured_tx, captured) = std::sync::mpsc::channel();
    let then_done = AtomicBool::new(false);
    let (engine, then_done) = (&engine, &then_done);
    std::thread::scope(|scope| {
        let outputs = job.run_then(|report| {
            let report = report.unwrap();
            let captured_tx = captured_tx.clone();
            let (starting_tx, starting) = std::sync::mpsc::channel();
            scope.spawn(move || {
                let inputs = engine.sealed_data_files();
                starting_tx.send(()).unwrap();
                let next = engine.begin_merge(&inputs, 0);
                // Captured (or refused) only once `run_then` let go.
                drop(next);
                captured_tx.send(then_done.load(Ordering::SeqCst)).unwrap();
            });
            // The other thread is about to capture: give it time to.
            starting.recv_timeout(Duration::from_secs(60)).unwrap();
            assert!(
                captured.recv_timeout(Duration::from_millis(300)).is_err(),
                "a next merge was captured while the first's follow-up ran"
            );
            then_done.store(true, Ordering::SeqCst);
            report.outputs
        });
        let after_then = captured
            .recv_timeout(Duration::from_secs(60))
            .expect("the next merge is captured once run_then returns");
        assert!(after_then, "captured before run_then's follow-up finished");
        assert!(!outputs.is_empty());
    });
}
