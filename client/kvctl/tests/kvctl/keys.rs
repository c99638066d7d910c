//! Proves the key commands end to end against a three-member cluster:
//! put (argument, @file, stdin, --ttl, --if-mod-revision and its old name
//! --if-version, --if-absent), get (found: the value's exact bytes and, in
//! JSON, the key's revisions under etcd's names; absent: exit 1),
//! conditions that fail (exit 4), del (with --if-version; absent: exit 1), expire / persist
//! (TTL shown, then gone), scan (--prefix, --from/--to, --limit,
//! --keys-only), --hex, and JSON that parses with binary values in base64.

use crate::harness::Cluster;

#[test]
fn key_commands() {
    let cluster = Cluster::start();

    // put from an argument, get it back byte for byte.
    let run = cluster.kvctl(&["put", "greeting", "hello"]);
    run.expect_code(0);
    assert!(run.out().starts_with("OK greeting revision "), "{run:?}");
    let run = cluster.kvctl(&["get", "greeting"]);
    run.expect_code(0);
    assert_eq!(run.stdout, b"hello", "{run:?}");

    // Absent: exit 1, in table and JSON form.
    let run = cluster.kvctl(&["get", "nobody"]);
    run.expect_code(1);
    assert!(run.stderr.contains("key not found: nobody"), "{run:?}");
    let run = cluster.kvctl(&["-o", "json", "get", "nobody"]);
    run.expect_code(1);
    assert_eq!(run.json()["found"], false);

    // Binary values from a file and from stdin, exact on the way back.
    let dir = tempfile::tempdir().expect("tempdir");
    let binary: Vec<u8> = (0..=255u8).chain([0, 10, 13]).collect();
    let path = dir.path().join("value.bin");
    std::fs::write(&path, &binary).expect("write value file");
    let at_file = format!("@{}", path.display());
    cluster.kvctl(&["put", "bin/file", &at_file]).expect_code(0);
    let run = cluster.kvctl(&["get", "bin/file"]);
    run.expect_code(0);
    assert_eq!(run.stdout, binary);
    cluster
        .kvctl_stdin(&["put", "bin/stdin", "-"], b"from\nstdin\x00")
        .expect_code(0);
    let run = cluster.kvctl(&["--hex", "get", "bin/stdin"]);
    run.expect_code(0);
    assert_eq!(run.out().trim(), "66726f6d0a737464696e00");
    let run = cluster.kvctl(&["-o", "json", "get", "bin/file"]);
    run.expect_code(0);
    let json = run.json();
    assert_eq!(json["key"], "bin/file");
    assert!(
        json.get("value").is_none(),
        "not UTF-8, so base64 only: {json}"
    );
    use base64::Engine as _;
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(json["value_base64"].as_str().expect("value_base64"))
        .expect("base64");
    assert_eq!(decoded, binary);
    let version = json["mod_revision"].as_u64().expect("mod_revision");
    assert!(version > 1, "a fresh cluster is at revision 1: {json}");
    assert_eq!(json["create_revision"], json["mod_revision"], "{json}");
    assert_eq!(json["version"], 1, "{json}");
    assert_eq!(json["lease"], 0, "{json}");
    assert!(json["revision"].as_u64().expect("revision") >= version);
    assert!(json["seq"].as_u64().expect("seq") > 0);

    // A value over the cluster's limit (1 MiB) is refused by the cluster:
    // exit 2, the limit named.
    let big = dir.path().join("big.bin");
    std::fs::write(&big, vec![7u8; 1024 * 1024 + 1]).expect("write big value");
    let run = cluster.kvctl(&["put", "big", &format!("@{}", big.display())]);
    run.expect_code(2);
    assert!(run.stderr.contains("VALUE_SIZE_BYTES_MAX"), "{run:?}");
    cluster.kvctl(&["get", "big"]).expect_code(1);

    // Conditions: --if-mod-revision (and its old name --if-version) with the
    // key's mod_revision works, a stale one is exit 4; --if-absent on an
    // existing key is exit 4, on a new one 0.
    let version_arg = version.to_string();
    let run = cluster.kvctl(&[
        "-o",
        "json",
        "put",
        "bin/file",
        "v2",
        "--if-version",
        &version_arg,
    ]);
    run.expect_code(0);
    let new_version = run.json()["revision"].as_u64().expect("revision");
    assert!(new_version > version);
    let run = cluster.kvctl(&["put", "bin/file", "v3", "--if-mod-revision", &version_arg]);
    run.expect_code(4);
    assert!(
        run.stderr
            .contains(&format!("current mod_revision is {new_version}")),
        "{run:?}"
    );
    cluster
        .kvctl(&["put", "greeting", "x", "--if-absent"])
        .expect_code(4);
    cluster
        .kvctl(&["put", "fresh", "x", "--if-absent"])
        .expect_code(0);
    let run = cluster.kvctl(&["-o", "json", "put", "fresh", "y", "--if-absent"]);
    run.expect_code(4);
    assert_eq!(run.json()["error"]["kind"], "condition_failed");
    cluster.kvctl(&["get", "bin/file"]).expect_code(0);
    assert_eq!(cluster.kvctl(&["get", "bin/file"]).stdout, b"v2");

    // TTL: put --ttl shows it; persist removes it; expire sets it again.
    cluster
        .kvctl(&["put", "temp", "t", "--ttl", "1h"])
        .expect_code(0);
    let ttl =
        |cluster: &Cluster| cluster.kvctl(&["-o", "json", "get", "temp"]).json()["ttl_ms"].clone();
    let left = ttl(&cluster).as_u64().expect("a TTL");
    assert!(left > 3_500_000 && left <= 3_600_000, "{left}");
    cluster.kvctl(&["persist", "temp"]).expect_code(0);
    assert!(ttl(&cluster).is_null());
    let run = cluster.kvctl(&["expire", "temp", "30m"]);
    run.expect_code(0);
    assert!(run.out().contains("expires in 1800.000s"), "{run:?}");
    let left = ttl(&cluster).as_u64().expect("a TTL");
    assert!(left > 1_700_000 && left <= 1_800_000, "{left}");
    cluster.kvctl(&["expire", "nobody", "1s"]).expect_code(1);
    cluster.kvctl(&["persist", "nobody"]).expect_code(1);
    // A short TTL runs out.
    cluster
        .kvctl(&["put", "brief", "b", "--ttl", "300ms"])
        .expect_code(0);
    let start = std::time::Instant::now();
    while cluster.kvctl(&["get", "brief"]).code == 0 {
        assert!(
            start.elapsed() < crate::harness::DEADLINE,
            "the TTL never ran out"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    cluster.kvctl(&["get", "brief"]).expect_code(1);

    // del: --if-version mismatch is 4, a plain del 0, again 1.
    cluster
        .kvctl(&["del", "fresh", "--if-version", "1"])
        .expect_code(4);
    let run = cluster.kvctl(&["del", "fresh"]);
    run.expect_code(0);
    assert!(run.out().contains("deleted fresh"), "{run:?}");
    cluster.kvctl(&["del", "fresh"]).expect_code(1);
    let run = cluster.kvctl(&["-o", "json", "del", "fresh"]);
    run.expect_code(1);
    assert_eq!(run.json()["deleted"], false);
    let run = cluster.kvctl(&["-o", "json", "expire", "fresh", "1s"]);
    run.expect_code(1);
    assert_eq!(run.json()["found"], false);
    cluster.kvctl(&["get", "fresh"]).expect_code(1);

    // scan.
    for (key, value) in [("s/a", "1"), ("s/b", "2"), ("s/c", "3"), ("t/a", "4")] {
        cluster.kvctl(&["put", key, value]).expect_code(0);
    }
    let keys_of = |run: &crate::harness::Run| -> Vec<String> {
        run.json()["entries"]
            .as_array()
            .expect("entries")
            .iter()
            .map(|e| e["key"].as_str().expect("key").to_string())
            .collect()
    };
    let run = cluster.kvctl(&["-o", "json", "scan", "--prefix", "s/"]);
    run.expect_code(0);
    assert_eq!(keys_of(&run), ["s/a", "s/b", "s/c"]);
    assert_eq!(run.json()["entries"][1]["value"], "2");
    assert_eq!(run.json()["count"], 3);
    let run = cluster.kvctl(&["-o", "json", "scan", "--from", "s/b", "--to", "t/a"]);
    assert_eq!(keys_of(&run), ["s/b", "s/c"]);
    let run = cluster.kvctl(&["-o", "json", "scan", "--prefix", "s/", "--limit", "2"]);
    assert_eq!(keys_of(&run), ["s/a", "s/b"]);
    let run = cluster.kvctl(&["-o", "json", "scan", "--prefix", "s/", "--keys-only"]);
    assert!(
        run.json()["entries"][0].get("value").is_none(),
        "{}",
        run.out()
    );
    let run = cluster.kvctl(&["scan", "--prefix", "s/"]);
    run.expect_code(0);
    let lines: Vec<String> = run.out().lines().map(str::to_string).collect();
    assert!(
        lines[0].starts_with("KEY") && lines[0].ends_with("VALUE"),
        "{lines:?}"
    );
    assert!(
        lines[1].starts_with("s/a ") && lines[1].ends_with(" 1"),
        "{lines:?}"
    );
    assert_eq!(lines.len(), 4, "{lines:?}");
    let run = cluster.kvctl(&["scan", "--prefix", "bin/s", "--limit", "1"]);
    run.expect_code(0);
    assert!(
        run.out().contains("from\\x0astdin\\x00"),
        "escaped binary: {}",
        run.out()
    );
    let run = cluster.kvctl(&["--hex", "scan", "--prefix", "bin/s", "--keys-only"]);
    assert!(
        run.out().contains(
            &"bin/stdin"
                .bytes()
                .map(|b| format!("{b:02x}"))
                .collect::<String>()
        ),
        "{}",
        run.out()
    );
    let run = cluster.kvctl(&["-o", "json", "scan", "--prefix", "nothing/"]);
    run.expect_code(0);
    assert_eq!(run.json()["count"], 0);
}
