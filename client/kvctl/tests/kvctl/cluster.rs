//! Proves the cluster commands and the bench end to end against a
//! three-member cluster: `status` shows every member (id, address, role,
//! term, last log index, applied index, lag) with exactly one leader
//! marked, in a table and in JSON; `member list` lists the three voters;
//! `member promote` of a voter is an idempotent success and of a
//! non-member a refusal (exit 4); `snapshot trigger` builds one; `snapshot
//! save` writes an archive that `kvnode::snapshot::backup::verify_archive` accepts;
//! `bench put --total 200` prints percentiles and writes a valid SVG.

use crate::harness::Cluster;

#[test]
fn cluster_commands_and_bench() {
    let cluster = Cluster::start();
    let leader = cluster.leader();
    cluster.kvctl(&["put", "a", "1"]).expect_code(0);

    // status, as a table.
    let run = cluster.kvctl(&["status"]);
    run.expect_code(0);
    let out = run.out();
    let lines: Vec<&str> = out.lines().collect();
    let header: Vec<&str> = lines[0].split_whitespace().collect();
    assert_eq!(
        header,
        [
            "ID", "ADDRESS", "ROLE", "TERM", "LAST", "LOG", "APPLIED", "LAG"
        ],
        "{out}"
    );
    for id in 1..=3u64 {
        let row = lines
            .iter()
            .find(|l| l.starts_with(&format!("{id} ")) || l.starts_with(&format!("{id}* ")))
            .unwrap_or_else(|| panic!("no row for member {id}: {out}"));
        let cells: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(cells.len(), 7, "{row}");
        assert_eq!(cells[1], cluster.addr(id), "{row}");
        let role = if id == leader { "leader" } else { "follower" };
        assert_eq!(cells[2], role, "{row}");
        assert_eq!(cells[0].ends_with('*'), id == leader, "{row}");
        for number in &cells[3..6] {
            assert!(number.parse::<u64>().is_ok_and(|n| n > 0), "{row}");
        }
        assert!(cells[6].parse::<u64>().is_ok(), "lag of {id}: {row}");
    }
    assert!(out.contains(&format!("* leader: member {leader}")), "{out}");

    // status, as JSON: the same facts.
    let run = cluster.kvctl(&["-o", "json", "status"]);
    run.expect_code(0);
    let json = run.json();
    assert_eq!(json["leader"], leader);
    let cluster_id = json["cluster_id"].as_str().expect("cluster_id").to_string();
    assert!(
        cluster_id.len() == 16 && u64::from_str_radix(&cluster_id, 16).is_ok_and(|id| id != 0),
        "cluster id {cluster_id:?}"
    );
    assert!(out.contains(&format!("cluster {cluster_id}")), "{out}");
    let members = json["members"].as_array().expect("members");
    assert_eq!(members.len(), 3);
    assert_eq!(members.iter().filter(|m| m["leader"] == true).count(), 1);
    assert!(
        members
            .iter()
            .all(|m| m["reachable"] == true && m["applied_index"].as_u64() > Some(0))
    );

    // status through one endpoint still finds every member.
    let run = crate::harness::kvctl(
        &["--endpoints", &cluster.addr(1), "-o", "json", "status"],
        None,
    );
    run.expect_code(0);
    assert_eq!(run.json()["members"].as_array().map(Vec::len), Some(3));

    // member list.
    let run = cluster.kvctl(&["member", "list"]);
    run.expect_code(0);
    let out = run.out();
    assert_eq!(out.lines().count(), 4, "{out}");
    assert_eq!(out.matches("voter").count(), 3, "{out}");
    let run = cluster.kvctl(&["-o", "json", "member", "list"]);
    run.expect_code(0);
    let ids: Vec<u64> = run.json()["members"]
        .as_array()
        .expect("members")
        .iter()
        .filter_map(|m| m["id"].as_u64())
        .collect();
    assert_eq!(ids, [1, 2, 3]);

    // Membership: promoting a voter is an idempotent no-op (exit 0, the
    // list); promoting or removing a non-member is refused (exit 4).
    let run = cluster.kvctl(&["member", "promote", "1"]);
    run.expect_code(0);
    assert_eq!(run.out().matches("voter").count(), 3, "{run:?}");
    let run = cluster.kvctl(&["member", "promote", "9"]);
    run.expect_code(4);
    assert!(run.stderr.contains("member 9"), "{run:?}");
    let run = cluster.kvctl(&["member", "remove", "9"]);
    run.expect_code(4);

    // snapshot trigger.
    let run = cluster.kvctl(&["-o", "json", "snapshot", "trigger"]);
    run.expect_code(0);
    assert!(
        run.json()["last_log_index"].as_u64() > Some(0),
        "{}",
        run.out()
    );

    // snapshot save: an archive that verifies, no partial file left.
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("backup.rcs");
    let file_arg = file.display().to_string();
    let run = cluster.kvctl(&["-o", "json", "snapshot", "save", &file_arg]);
    run.expect_code(0);
    let saved = run.json();
    let summary = kvnode::snapshot::backup::verify_archive(&file).expect("a valid archive");
    assert!(summary.manifest.last_log_id.is_some_and(|l| l.index > 0));
    assert_eq!(
        saved["files"].as_u64(),
        Some(summary.manifest.files.len() as u64)
    );
    assert_eq!(saved["data_bytes"].as_u64(), Some(summary.file_bytes));
    assert!(!dir.path().join("backup.rcs.partial").exists());

    // bench: percentiles, and a plot that is an SVG.
    let plot = dir.path().join("bench.svg");
    let plot_arg = plot.display().to_string();
    let run = cluster.kvctl(&[
        "bench",
        "put",
        "--total",
        "200",
        "--clients",
        "4",
        "--plot",
        &plot_arg,
    ]);
    run.expect_code(0);
    let out = run.out();
    assert!(out.starts_with("put: 200 ops in "), "{out}");
    for label in ["P50", "P90", "P99", "P99.9", "MAX"] {
        assert!(out.contains(label), "{label} missing: {out}");
    }
    let svg = std::fs::read_to_string(&plot).expect("plot file");
    assert!(
        svg.starts_with("<svg") || svg.starts_with("<?xml"),
        "{}",
        &svg[..svg.len().min(200)]
    );
    assert!(svg.trim_end().ends_with("</svg>"));
    assert!(svg.contains("latency over time") && svg.contains("latency histogram"));
    assert!(
        svg.matches("<polyline").count() >= 3 || svg.matches("<path").count() >= 3,
        "no lines drawn"
    );

    let run = cluster.kvctl(&["-o", "json", "bench", "mixed", "--total", "100"]);
    run.expect_code(0);
    let json = run.json();
    assert_eq!(json["ops_ok"], 100, "{json}");
    for label in ["p50", "p90", "p99", "p99.9", "max"] {
        assert!(
            json["latency_ms"][label].as_f64() > Some(0.0),
            "{label}: {json}"
        );
    }
    // Percentiles are ordered: from a real histogram, not made up.
    let p = |l: &str| json["latency_ms"][l].as_f64().unwrap_or_default();
    assert!(
        p("p50") <= p("p90") && p("p90") <= p("p99") && p("p99") <= p("max"),
        "{json}"
    );
}

/// `member add-learner --wait`, `promote` and `remove` against a real new
/// member: the tables show it as learner, then voter, then gone; `remove`
/// tells the operator to stop the removed process.
#[test]
fn member_add_learner_promote_remove() {
    let mut cluster = Cluster::start();
    let (client, peer) = cluster.start_new_member(4);
    let run = cluster.kvctl(&[
        "member",
        "add-learner",
        "4",
        "--client-addr",
        &client,
        "--peer-addr",
        &peer,
        "--wait",
    ]);
    run.expect_code(0);
    let learner_row = run
        .out()
        .lines()
        .find(|l| l.starts_with("4 "))
        .map(str::to_string)
        .unwrap_or_else(|| panic!("no row for member 4: {run:?}"));
    assert!(learner_row.ends_with("learner"), "{learner_row}");

    let status = cluster.kvctl(&["-o", "json", "status"]);
    status.expect_code(0);
    let members = status.json()["members"]
        .as_array()
        .cloned()
        .expect("members");
    let four = members
        .iter()
        .find(|m| m["id"] == 4)
        .unwrap_or_else(|| panic!("status lacks member 4: {members:?}"));
    assert_eq!(four["role"], "learner", "{four}");
    assert!(four["lag"].as_u64().is_some(), "{four}");

    let run = cluster.kvctl(&["-o", "json", "member", "promote", "4"]);
    run.expect_code(0);
    let listed = run.json()["members"].as_array().cloned().expect("members");
    assert!(
        listed.iter().any(|m| m["id"] == 4 && m["voter"] == true),
        "{listed:?}"
    );

    let run = cluster.kvctl(&["member", "remove", "4"]);
    run.expect_code(0);
    assert!(!run.out().lines().any(|l| l.starts_with("4 ")), "{run:?}");
    assert!(run.stderr.contains("stop its process"), "{run:?}");
}
