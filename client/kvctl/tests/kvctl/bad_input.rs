//! Proves that bad input ends with exit 2 and a message naming the problem
//! (unknown flag, oversized key naming KEY_SIZE_BYTES_MAX, a bad duration,
//! bench settings out of bounds, a missing value file), that unreachable
//! endpoints end with exit 3 naming every endpoint tried, and that the long
//! help documents the exit codes. No cluster: nothing here needs one.

use crate::harness::kvctl;
use kvnode::testing::private_loopback;

/// Addresses nobody listens on: a fresh private loopback address, port 1
/// and 2 (refused at once).
fn nowhere() -> String {
    let ip = private_loopback();
    format!("{ip}:1,{ip}:2")
}

#[test]
fn bad_input_is_exit_2_and_unreachable_is_exit_3() {
    let run = kvctl(&["get", "k", "--no-such-flag"], None);
    run.expect_code(2);
    assert!(run.stderr.contains("--no-such-flag"), "{run:?}");

    let endpoints = nowhere();
    let key = "k".repeat(4097);
    let run = kvctl(&["--endpoints", &endpoints, "put", &key, "v"], None);
    run.expect_code(2);
    assert!(run.stderr.contains("KEY_SIZE_BYTES_MAX"), "{run:?}");
    assert!(run.stderr.contains("4097"), "{run:?}");
    let run = kvctl(&["--endpoints", &endpoints, "get", &key], None);
    run.expect_code(2);
    assert!(run.stderr.contains("KEY_SIZE_BYTES_MAX"), "{run:?}");

    let run = kvctl(
        &[
            "--endpoints",
            &endpoints,
            "put",
            "k",
            "v",
            "--ttl",
            "5 weeks",
        ],
        None,
    );
    run.expect_code(2);
    assert!(run.stderr.contains("unit"), "{run:?}");

    let run = kvctl(
        &["--endpoints", &endpoints, "put", "k", "@/no/such/file"],
        None,
    );
    run.expect_code(2);
    assert!(run.stderr.contains("/no/such/file"), "{run:?}");

    let run = kvctl(
        &["--endpoints", &endpoints, "bench", "put", "--clients", "0"],
        None,
    );
    run.expect_code(2);
    assert!(run.stderr.contains("CLIENTS_MAX"), "{run:?}");

    // Unreachable: exit 3, every endpoint named; in JSON too.
    let run = kvctl(
        &[
            "--endpoints",
            &endpoints,
            "--timeout",
            "2s",
            "-o",
            "json",
            "get",
            "k",
        ],
        None,
    );
    run.expect_code(3);
    for endpoint in endpoints.split(',') {
        assert!(
            run.stderr.contains(endpoint),
            "{endpoint} not named: {run:?}"
        );
    }
    let error = run.json();
    assert_eq!(error["error"]["exit_code"], 3, "{error}");
    assert_eq!(error["error"]["kind"], "unavailable", "{error}");
    let run = kvctl(
        &["--endpoints", &endpoints, "--timeout", "2s", "status"],
        None,
    );
    run.expect_code(3);
    assert!(
        run.stderr
            .contains(endpoints.split(',').next().unwrap_or_default()),
        "{run:?}"
    );

    // The environment variable is read (and names what was tried).
    let run = {
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_kvctl"));
        let output = command
            .args(["--timeout", "2s", "get", "k"])
            .env("KVCTL_ENDPOINTS", &endpoints)
            .env("NO_COLOR", "1")
            .output()
            .expect("run kvctl");
        (
            output.status.code(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    };
    assert_eq!(run.0, Some(3), "{}", run.1);
    assert!(
        run.1
            .contains(endpoints.split(',').next().unwrap_or_default()),
        "{}",
        run.1
    );

    // The long help documents the exit codes.
    let help = kvctl(&["--help"], None);
    help.expect_code(0);
    for line in [
        "key not found",
        "cluster unavailable",
        "condition failed",
        "outcome unknown",
    ] {
        assert!(
            help.out().contains(line),
            "help lacks {line:?}: {}",
            help.out()
        );
    }
}
