//! Proves kvctl's etcdctl-style range commands end to end against a
//! three-member cluster: `get --prefix` (key line, value line; `--limit`,
//! `--keys-only`, `--count-only`, `--sort-by`/`--order`, `--rev` at the
//! current and a past revision, JSON with the header revision and each
//! key's revisions), `compact` (a read below it refused, naming it),
//! `del --prefix --prev-kv`
//! (the count, then the deleted keys), and `txn` reading etcdctl's format
//! from standard input (SUCCESS / FAILURE, then each op's result), with a
//! malformed transaction refused by line number (exit 2).

use crate::harness::Cluster;

#[test]
fn range_commands() {
    let cluster = Cluster::start();
    for (key, value) in [
        ("app/a", "1"),
        ("app/b", "2"),
        ("app/c", "3"),
        ("other", "x"),
    ] {
        cluster.kvctl(&["put", key, value]).expect_code(0);
    }

    let run = cluster.kvctl(&["get", "app/", "--prefix"]);
    run.expect_code(0);
    assert_eq!(run.out(), "app/a\n1\napp/b\n2\napp/c\n3\n", "{run:?}");
    let run = cluster.kvctl(&["get", "app/", "--prefix", "--limit", "2", "--keys-only"]);
    assert_eq!(run.out(), "app/a\n\napp/b\n\n", "{run:?}");
    let run = cluster.kvctl(&["get", "app/", "--prefix", "--count-only"]);
    assert_eq!(run.out(), "3\n", "{run:?}");
    let run = cluster.kvctl(&[
        "get",
        "app/",
        "--prefix",
        "--sort-by=modify",
        "--order=DESCEND",
    ]);
    assert_eq!(run.out(), "app/c\n3\napp/b\n2\napp/a\n1\n", "{run:?}");
    let run = cluster.kvctl(&["get", "app/a", "app/c"]);
    assert_eq!(run.out(), "app/a\n1\napp/b\n2\n", "{run:?}");

    let run = cluster.kvctl(&["-o", "json", "get", "app/", "--prefix", "--limit", "1"]);
    run.expect_code(0);
    let json = run.json();
    let revision = json["revision"].as_u64().expect("revision");
    assert_eq!(json["count"], 3, "{json}");
    assert_eq!(json["more"], true, "{json}");
    assert_eq!(json["kvs"][0]["key"], "app/a", "{json}");
    assert_eq!(json["kvs"][0]["version"], 1, "{json}");
    assert!(json["kvs"][0]["mod_revision"].as_u64().unwrap() <= revision);
    // At the current revision: served; in the future: refused.
    let rev = revision.to_string();
    cluster
        .kvctl(&["get", "app/", "--prefix", "--rev", &rev])
        .expect_code(0);
    let future = (revision + 1000).to_string();
    let run = cluster.kvctl(&["get", "app/", "--prefix", "--rev", &future]);
    assert_ne!(run.code, 0, "{run:?}");
    assert!(run.stderr.contains("future revision"), "{run:?}");

    // txn from stdin: the compare holds, then it does not.
    let script = format!(
        "mod(\"app/a\") < \"{}\"\n\nput app/a \"new\"\nget app/a\n\nget other\n",
        revision + 1
    );
    let run = cluster.kvctl_stdin(&["txn"], script.as_bytes());
    run.expect_code(0);
    assert_eq!(run.out(), "SUCCESS\n\nOK\n\napp/a\nnew\n", "{run:?}");
    let run = cluster.kvctl_stdin(
        &["txn"],
        b"value(\"app/a\") = \"old\"\n\nput app/a x\n\nget other\n",
    );
    run.expect_code(0);
    assert_eq!(run.out(), "FAILURE\n\nother\nx\n", "{run:?}");
    let run = cluster.kvctl_stdin(&["-o", "json", "txn"], b"\n\ndel app/ --prefix\n");
    run.expect_code(0);
    assert_eq!(run.json()["succeeded"], true, "{run:?}");
    let run = cluster.kvctl_stdin(&["txn"], b"mod(app/a) = \"1\"\n");
    run.expect_code(2);
    assert!(run.stderr.contains("line 1"), "{run:?}");

    // del --prefix --prev-kv: the count, then the keys as they were.
    let run = cluster.kvctl(&["del", "app/", "--prefix", "--prev-kv"]);
    run.expect_code(0);
    assert_eq!(run.out(), "3\napp/a\nnew\napp/b\n2\napp/c\n3\n", "{run:?}");
    let run = cluster.kvctl(&["get", "app/", "--prefix", "--count-only"]);
    assert_eq!(run.out(), "0\n", "{run:?}");

    // A past revision reads what it held, until it is compacted.
    let run = cluster.kvctl(&["get", "app/", "--prefix", "--rev", &rev]);
    run.expect_code(0);
    assert_eq!(run.out(), "app/a\n1\napp/b\n2\napp/c\n3\n", "{run:?}");
    let run = cluster.kvctl(&["compact", &rev]);
    run.expect_code(0);
    assert_eq!(
        run.out(),
        format!("compacted revision {revision}\n"),
        "{run:?}"
    );
    let before = (revision - 1).to_string();
    let run = cluster.kvctl(&["get", "app/", "--prefix", "--rev", &before]);
    assert_ne!(run.code, 0, "{run:?}");
    assert!(
        run.stderr.contains("compacted") && run.stderr.contains(&rev),
        "the error names the oldest revision served: {run:?}"
    );
    let run = cluster.kvctl(&["get", "app/", "--prefix", "--rev", &rev]);
    assert_eq!(run.out(), "app/a\n1\napp/b\n2\napp/c\n3\n", "{run:?}");
    let run = cluster.kvctl(&["-o", "json", "compact", &rev]);
    assert_ne!(run.code, 0, "{run:?}");
    assert!(run.stderr.contains("has been compacted"), "{run:?}");
}
