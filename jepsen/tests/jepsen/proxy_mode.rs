//! Proves the no-root fallback: `jepsen run` in proxy mode (forced with
//! `JEPSEN_FORCE_PROXY=1`, the same path a non-root user takes; run by
//! hand as `setpriv --reuid=65534 ...` it behaves alike) says so loudly,
//! runs the members on the host's loopback with every Raft connection
//! through a userspace proxy, and a leader partition cut through those
//! proxies stalls the cluster until a new leader is elected; the run does
//! enough and the checker passes. Loss and clock faults are refused in
//! this mode. Runs the `jepsen` binary as a child (the mode is
//! process-wide). Needs a built `kvnode` next to `jepsen`.

use std::process::Command;

use jepsen::run::FORCE_PROXY_ENV;
use jepsen::workload::{Function, Outcome, Record, read_history};

#[test]
fn a_partition_through_userspace_proxies_bites_and_the_run_passes() {
    let _serial = crate::common::RUN_LOCK.blocking_lock();
    let out = crate::common::run_dir("proxy");
    let output = Command::new(env!("CARGO_BIN_EXE_jepsen"))
        .env(FORCE_PROXY_ENV, "1")
        .args([
            "run",
            "--workload",
            "register",
            "--nemesis",
            "partition-leader",
        ])
        .args([
            "--time",
            "20s",
            "--fault-hold",
            "6s",
            "--quiet",
            "2s",
            "--seed",
            "2",
        ])
        .args([
            "--rate",
            "60",
            "--min-ok-writes",
            "30",
            "--min-ok-reads",
            "30",
        ])
        .arg("--out")
        .arg(&out)
        .output()
        .expect("running jepsen");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "the proxy-mode run failed ({}):\n{stdout}\n{stderr}\n(run directory: {})",
        output.status,
        out.display()
    );
    assert!(
        stderr.contains("NOT ROOT"),
        "no loud proxy-mode notice: {stderr}"
    );
    assert!(stdout.contains("isolated member"), "{stdout}");

    let records = read_history(&out.join("history.jsonl")).expect("history parses");
    let window: Vec<u64> = records
        .iter()
        .filter_map(|r| match r {
            Record::Nemesis(e) if e.fault == "partition-leader" => Some(e.time_ns),
            _ => None,
        })
        .collect();
    let [cut, healed, ..] = window[..] else {
        panic!("a partition started and healed expected: {window:?}\n{stdout}");
    };
    let bit = records.iter().any(|r| {
        matches!(r, Record::Op(op)
            if op.invoke_ns < healed && op.complete_ns > cut && op.f != Function::Cas
                && (op.outcome != Outcome::Ok || op.complete_ns - op.invoke_ns >= 1_000_000_000))
    });
    assert!(
        bit,
        "nothing stalled while the leader was cut off:\n{stdout}"
    );
    let _ = std::fs::remove_dir_all(&out);

    let refused = Command::new(env!("CARGO_BIN_EXE_jepsen"))
        .env(FORCE_PROXY_ENV, "1")
        .args(["run", "--nemesis", "loss", "--time", "5s", "--out"])
        .arg(out.join("refused"))
        .output()
        .expect("running jepsen");
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("loss and clock faults are unavailable"),
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(&out);
}
