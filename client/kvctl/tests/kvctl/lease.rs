//! Proves `kvctl lease` end to end against a three-member cluster, with
//! etcdctl's output: `lease grant` (`lease %016x granted with TTL(%ds)`, a
//! TTL under the minimum raised, a fractional TTL printed with its
//! fraction, `--id` in use exits 4 with etcd's message), `put --lease`
//! (a missing lease exits 1 with etcd's message), `lease timetolive` /
//! `ttl` with `--keys`, `lease list`, `lease keepalive --once`, `lease
//! revoke` deleting the attached keys, and for a lease that is gone:
//! `already expired`, `requested lease not found`, exit 1. `-o json` prints
//! one object per answer with hex ids. A running `lease keepalive` prints a
//! line per renewal and, once the lease is revoked, `expired or revoked.`
//! and exits 1. Bad ids exit 2 before anything is sent. `bench lease`
//! reports its keep-alives, latency and Raft entries.

use std::time::{Duration, Instant};

use crate::harness::{Cluster, DEADLINE, kvctl};

/// The id in `lease <ID> granted with TTL(...)`.
fn granted_id(out: &str) -> String {
    let mut words = out.split_whitespace();
    assert_eq!(words.next(), Some("lease"), "{out:?}");
    let id = words.next().expect("an id").to_string();
    assert_eq!(id.len(), 16, "%016x: {out:?}");
    assert!(id.chars().all(|c| c.is_ascii_hexdigit()), "hex: {out:?}");
    id
}

#[test]
fn lease_commands_print_as_etcdctl_does() {
    let cluster = Cluster::start();

    let run = cluster.kvctl(&["lease", "grant", "60"]);
    run.expect_code(0);
    let picked = granted_id(&run.out());
    assert_eq!(run.out(), format!("lease {picked} granted with TTL(60s)\n"));
    let run = cluster.kvctl(&["lease", "grant", "1500ms"]);
    run.expect_code(0);
    assert!(
        run.out().ends_with(" granted with TTL(2s)\n"),
        "raised to LEASE_TTL_MS_MIN: {run:?}"
    );
    let run = cluster.kvctl(&["lease", "grant", "2500ms"]);
    run.expect_code(0);
    assert!(run.out().ends_with(" granted with TTL(2.5s)\n"), "{run:?}");
    let run = cluster.kvctl(&["lease", "grant", "1m", "--id", "2a"]);
    run.expect_code(0);
    assert_eq!(run.out(), "lease 000000000000002a granted with TTL(60s)\n");
    let run = cluster.kvctl(&["lease", "grant", "30", "--id", "0x2A"]);
    run.expect_code(4);
    assert_eq!(run.stderr, "Error: etcdserver: lease already exists\n");

    // Attach keys.
    cluster
        .kvctl(&["put", "svc/a", "10.0.0.1", "--lease", "2a"])
        .expect_code(0);
    let run = cluster.kvctl(&["-o", "json", "put", "svc/b", "10.0.0.2", "--lease", "0x2a"]);
    run.expect_code(0);
    assert_eq!(run.json()["lease"], "000000000000002a", "{run:?}");
    let run = cluster.kvctl(&["put", "svc/c", "x", "--lease", "7777"]);
    run.expect_code(1);
    assert_eq!(run.stderr, "Error: etcdserver: requested lease not found\n");
    cluster.kvctl(&["get", "svc/c"]).expect_code(1);
    let run = cluster.kvctl(&["-o", "json", "get", "svc/a"]);
    assert_eq!(run.json()["lease"], 0x2a, "{run:?}");

    let run = cluster.kvctl(&["lease", "timetolive", "2a"]);
    run.expect_code(0);
    let out = run.out();
    assert!(
        out.starts_with("lease 000000000000002a granted with TTL(60s), remaining(")
            && out.ends_with("s)\n"),
        "{run:?}"
    );
    let run = cluster.kvctl(&["lease", "ttl", "2a", "--keys"]);
    run.expect_code(0);
    assert!(
        run.out().ends_with("s), attached keys([svc/a svc/b])\n"),
        "{run:?}"
    );
    let run = cluster.kvctl(&["-o", "json", "lease", "ttl", "2a", "--keys"]);
    run.expect_code(0);
    let ttl = run.json();
    assert_eq!(ttl["id"], "000000000000002a", "{ttl}");
    assert_eq!(ttl["found"], true, "{ttl}");
    assert_eq!(ttl["granted_ttl_ms"], 60_000, "{ttl}");
    assert!(
        ttl["ttl_ms"].as_u64().is_some_and(|ms| ms <= 60_000),
        "{ttl}"
    );
    assert_eq!(ttl["keys"][1]["key"], "svc/b", "{ttl}");

    // (The 2 s leases may have expired by now: the count is read.)
    let run = cluster.kvctl(&["lease", "list"]);
    run.expect_code(0);
    let out = run.out();
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines[0],
        format!("found {} leases", lines.len() - 1),
        "{run:?}"
    );
    assert!(lines[1..].contains(&"000000000000002a"), "{run:?}");
    assert!(lines[1..].contains(&picked.as_str()), "{run:?}");
    let mut sorted = lines[1..].to_vec();
    sorted.sort();
    assert_eq!(sorted, lines[1..], "in id order");
    let run = cluster.kvctl(&["-o", "json", "lease", "list"]);
    let list = run.json();
    assert_eq!(
        list["count"].as_u64(),
        list["leases"].as_array().map(|a| a.len() as u64),
        "{list}"
    );
    assert!(
        list["leases"]
            .as_array()
            .is_some_and(|a| a.contains(&"000000000000002a".into())),
        "{list}"
    );

    let run = cluster.kvctl(&["lease", "keepalive", "2a", "--once"]);
    run.expect_code(0);
    assert_eq!(
        run.out(),
        "lease 000000000000002a keepalived with TTL(60)\n"
    );
    let run = cluster.kvctl(&["-o", "json", "lease", "keep-alive", "2a", "--once"]);
    run.expect_code(0);
    assert_eq!(run.json()["ttl_ms"], 60_000, "{run:?}");

    // Revoke: the keys go with it.
    let run = cluster.kvctl(&["lease", "revoke", "2a"]);
    run.expect_code(0);
    assert_eq!(run.out(), "lease 000000000000002a revoked\n");
    cluster.kvctl(&["get", "svc/a"]).expect_code(1);
    cluster.kvctl(&["get", "svc/b"]).expect_code(1);

    // Gone.
    let run = cluster.kvctl(&["lease", "revoke", "2a"]);
    run.expect_code(1);
    assert_eq!(run.out(), "");
    assert_eq!(run.stderr, "Error: etcdserver: requested lease not found\n");
    let run = cluster.kvctl(&["lease", "keepalive", "2a", "--once"]);
    run.expect_code(1);
    assert_eq!(run.stderr, "Error: etcdserver: requested lease not found\n");
    let run = cluster.kvctl(&["lease", "ttl", "2a"]);
    run.expect_code(1);
    assert_eq!(run.out(), "lease 000000000000002a already expired\n");
    let run = cluster.kvctl(&["-o", "json", "lease", "ttl", "2a"]);
    run.expect_code(1);
    let gone = run.json();
    assert_eq!(
        (gone["found"].clone(), gone["ttl_ms"].clone()),
        (false.into(), (-1).into())
    );

    // Bad ids never reach the cluster.
    for bad in ["0", "xyz", "8000000000000000"] {
        let run = kvctl(
            &["--endpoints", "127.0.0.1:1", "lease", "revoke", bad],
            None,
        );
        run.expect_code(2);
    }
    let run = kvctl(
        &[
            "--endpoints",
            "127.0.0.1:1",
            "put",
            "k",
            "v",
            "--lease",
            "0",
        ],
        None,
    );
    run.expect_code(2);
}

#[test]
fn keepalive_renews_until_the_lease_is_revoked() {
    let cluster = Cluster::start();
    let run = cluster.kvctl(&["lease", "grant", "3"]);
    run.expect_code(0);
    let id = granted_id(&run.out());
    let endpoints = cluster.endpoints();
    let keeper = {
        let id = id.clone();
        std::thread::spawn(move || {
            kvctl(
                &["--endpoints", &endpoints, "lease", "keepalive", &id],
                None,
            )
        })
    };
    // Past the TTL, the lease still lives: the keepalive renews it.
    std::thread::sleep(Duration::from_secs(5));
    assert!(
        !keeper.is_finished(),
        "keepalive runs until the lease is lost"
    );
    let run = cluster.kvctl(&["lease", "ttl", &id]);
    run.expect_code(0);
    cluster.kvctl(&["lease", "revoke", &id]).expect_code(0);
    let start = Instant::now();
    while !keeper.is_finished() {
        assert!(start.elapsed() < DEADLINE, "keepalive saw the revoke");
        std::thread::sleep(Duration::from_millis(50));
    }
    let run = keeper.join().expect("keepalive thread");
    run.expect_code(1);
    let out = run.out();
    let lines: Vec<&str> = out.lines().collect();
    let (last, renewals) = lines.split_last().expect("output");
    assert_eq!(*last, format!("lease {id} expired or revoked."), "{run:?}");
    assert!(
        renewals.len() >= 4,
        "a renewal every third of the TTL for 5 s (about 6): {run:?}"
    );
    for line in renewals {
        assert_eq!(
            *line,
            format!("lease {id} keepalived with TTL(3)"),
            "{run:?}"
        );
    }
    assert_eq!(run.stderr, "Error: etcdserver: requested lease not found\n");
}

#[test]
fn bench_lease_reports_keep_alives_and_raft_entries() {
    let cluster = Cluster::start();
    let run = cluster.kvctl(&[
        "-o",
        "json",
        "bench",
        "lease",
        "--leases",
        "300",
        "--clients",
        "3",
        "--renew-every",
        "500ms",
        "--duration",
        "2s",
    ]);
    run.expect_code(0);
    let report = run.json();
    assert_eq!(report["leases"], 300, "{report}");
    assert_eq!(report["leases_expired"], 0, "{report}");
    assert_eq!(report["revoke_failures"], 0, "{report}");
    let keep_alives = report["keep_alives"].as_u64().expect("keep_alives");
    // 600 offered per second for 2 s; the count, not the rate, is checked.
    assert!(
        keep_alives >= 300,
        "every lease renewed at least once: {report}"
    );
    let entries = report["raft_entries"].as_u64().expect("raft_entries");
    assert!(
        entries > 0 && entries < keep_alives,
        "renewals share Raft entries: {report}"
    );
    assert!(report["latency_ms"]["p99"].as_f64().is_some(), "{report}");
    // Every lease was revoked at the end.
    let run = cluster.kvctl(&["lease", "list"]);
    assert_eq!(run.out(), "found 0 leases\n", "{run:?}");

    let run = cluster.kvctl(&["bench", "lease", "--leases", "10", "--clients", "11"]);
    run.expect_code(2);
    assert!(run.stderr.contains("--clients"), "{run:?}");
}
