//! Proves the TTL workload end to end: three real `kvnode` members under
//! libfaketime, their wall clocks jumped by an hour (the `clock` nemesis)
//! while keys written with 1.5–4 s TTLs are read around their expiry from
//! every member; the TTL checker finds no early expiry and no resurrection,
//! many keys were seen expired, and `latency.svg` is well-formed. Then the
//! checker is shown not to be vacuous on this real history: one injected
//! early expiry and one injected resurrection are each flagged. Needs root
//! and libfaketime (CI installs it) and a built `kvnode`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use jepsen::nemesis::{Fault, FaultList};
use jepsen::run::{RunArgs, WorkloadKind};
use jepsen::ttl_check::{self, TtlAnomalyKind};
use jepsen::workload::{Function, Outcome, Record, read_history};

use crate::report_svg::svg_is_well_formed;

/// Keys the run must see expired (about 7 keys are written per second;
/// most expire within the run).
const KEYS_SEEN_EXPIRED_MIN: usize = 20;

#[tokio::test]
async fn ttl_run_under_clock_jumps_expires_on_time_and_never_resurrects() {
    let _serial = crate::common::RUN_LOCK.lock().await;
    assert!(
        rustix::process::geteuid().is_root(),
        "this test needs root (a private network namespace; CI runs as root)"
    );
    assert!(
        std::path::Path::new(jepsen::control::cluster::LIBFAKETIME_PATH).exists(),
        "this test needs libfaketime (apt-get install libfaketime)"
    );
    let out: PathBuf = crate::common::run_dir("ttl-clock");
    let args = RunArgs {
        workload: WorkloadKind::Ttl,
        nemesis: FaultList(vec![Fault::Clock]),
        time: Duration::from_secs(25),
        nodes: Some(3),
        out: out.clone(),
        kvnode_bin: std::env::var_os("KVNODE_BIN").map(PathBuf::from),
        concurrency: 4,
        rate: 80,
        seed: Some(11),
        fault_hold: Duration::from_secs(5),
        quiet: Duration::from_secs(2),
        min_ok_writes: 30,
        min_ok_reads: 200,
        ttl_min: jepsen::workload::ttl::TTL_MIN,
        ttl_max: jepsen::workload::ttl::TTL_MAX,
        idle: jepsen::nemesis::idle::IDLE_DEFAULT,
        session_idle_ms: None,
    };
    let code = jepsen::run::run(args).await.expect("the run ran");
    let summary = std::fs::read_to_string(out.join("summary.txt")).expect("summary.txt");
    let summary = format!("{summary}(run directory: {})", out.display());
    assert_eq!(code, ExitCode::SUCCESS, "the TTL run failed:\n{summary}");
    assert!(summary.contains("summary table:"), "{summary}");
    assert!(
        summary.contains("acknowledged writes lost:             0"),
        "{summary}"
    );

    let records = read_history(&out.join("history.jsonl")).expect("history parses");
    let clock_faults = records
        .iter()
        .filter(|r| matches!(r, Record::Nemesis(e) if e.fault == "clock"))
        .count();
    assert!(
        clock_faults >= 4,
        "at least two clock jumps and heals: {summary}"
    );
    let report = ttl_check::check(&records);
    assert!(report.valid, "{}", report.summary());
    assert!(
        report.keys_seen_expired >= KEYS_SEEN_EXPIRED_MIN,
        "too few keys seen expired: {}",
        report.summary()
    );
    let svg = std::fs::read_to_string(out.join("latency.svg")).expect("latency.svg");
    svg_is_well_formed(&svg).expect("latency.svg is well-formed");

    // Inject an early expiry: claim the first key seen expired had a TTL
    // ten times longer than it did.
    let seen_key = records
        .iter()
        .find_map(|r| match r {
            Record::Op(op)
                if op.f == Function::Read
                    && op.outcome == Outcome::Ok
                    && op.value.is_none()
                    && op.stale_min_index.is_none() =>
            {
                Some(op.key.clone())
            }
            _ => None,
        })
        .expect("a linearizable read saw a key expired");
    let mut early = records.clone();
    for record in &mut early {
        if let Record::Op(op) = record
            && op.key == seen_key
            && op.f == Function::Write
        {
            op.ttl_ms = op.ttl_ms.map(|t| t * 10);
        }
    }
    let flagged = ttl_check::check(&early);
    assert!(
        flagged
            .anomalies
            .iter()
            .any(|a| a.kind == TtlAnomalyKind::EarlyExpiry && a.key == seen_key),
        "an injected early expiry was not flagged: {}",
        flagged.summary()
    );
    // Inject a resurrection: a linearizable read of that key invoked after
    // the last event returns its value.
    let (value, end_ns) = records.iter().fold((None, 0), |(value, end), r| match r {
        Record::Op(op) => (
            if op.key == seen_key && op.f == Function::Write {
                op.value.clone()
            } else {
                value
            },
            end.max(op.complete_ns),
        ),
        Record::Nemesis(e) => (value, end.max(e.time_ns)),
    });
    let mut resurrected = records.clone();
    let template = records
        .iter()
        .find_map(|r| match r {
            Record::Op(op) if op.key == seen_key && op.f == Function::Read => Some(op.clone()),
            _ => None,
        })
        .expect("a read of the key");
    let mut read = template;
    read.id = u64::MAX;
    read.process = u64::MAX;
    read.value = value;
    read.outcome = Outcome::Ok;
    read.stale_min_index = None;
    read.invoke_ns = end_ns + 1;
    read.complete_ns = end_ns + 2;
    resurrected.push(Record::Op(read));
    let flagged = ttl_check::check(&resurrected);
    assert!(
        flagged
            .anomalies
            .iter()
            .any(|a| a.kind == TtlAnomalyKind::Resurrection && a.key == seen_key),
        "an injected resurrection was not flagged: {}",
        flagged.summary()
    );
    let _ = std::fs::remove_dir_all(&out);
}
