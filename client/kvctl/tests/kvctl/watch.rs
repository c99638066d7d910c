//! Proves `kvctl watch` end to end against a three-member cluster: from a
//! past revision it prints each change as etcdctl does (PUT / DELETE, the
//! key, the value; with `--prev-kv` the previous key and value first) and
//! exits after `--count` events; `-o json` prints one object per event;
//! from now it waits for a write made after it started; a start below the
//! compact revision exits 2 naming it.

use crate::harness::{Cluster, kvctl};

#[test]
fn watch_prints_changes_as_etcdctl_does() {
    let cluster = Cluster::start();
    cluster.kvctl(&["put", "app/a", "1"]).expect_code(0);
    let first = cluster
        .kvctl(&["-o", "json", "get", "app/a", "--prefix"])
        .json()["kvs"][0]["mod_revision"]
        .as_u64()
        .expect("mod_revision");
    cluster.kvctl(&["put", "other", "x"]).expect_code(0);
    cluster.kvctl(&["put", "app/a", "2"]).expect_code(0);
    cluster.kvctl(&["put", "app/b", "3"]).expect_code(0);
    cluster.kvctl(&["del", "app/a"]).expect_code(0);
    let from = first.to_string();

    let run = cluster.kvctl(&["watch", "app/", "--prefix", "--rev", &from, "--count", "4"]);
    run.expect_code(0);
    assert_eq!(
        run.out(),
        "PUT\napp/a\n1\nPUT\napp/a\n2\nPUT\napp/b\n3\nDELETE\napp/a\n\n",
        "{run:?}"
    );
    let run = cluster.kvctl(&[
        "watch",
        "app/a",
        "--rev",
        &from,
        "--prev-kv",
        "--count",
        "3",
    ]);
    assert_eq!(
        run.out(),
        "PUT\napp/a\n1\nPUT\napp/a\n1\napp/a\n2\nDELETE\napp/a\n2\napp/a\n\n",
        "{run:?}"
    );
    let run = cluster.kvctl(&[
        "-o", "json", "watch", "app/b", "--rev", &from, "--count", "1",
    ]);
    run.expect_code(0);
    let event = run.json();
    assert_eq!(event["type"], "PUT", "{event}");
    assert_eq!(event["kv"]["key"], "app/b", "{event}");
    assert_eq!(event["kv"]["value"], "3", "{event}");
    assert_eq!(event["kv"]["version"], 1, "{event}");

    // From now: a write made after the watch started.
    let endpoints = cluster.endpoints();
    let watcher = std::thread::spawn(move || {
        kvctl(
            &["--endpoints", &endpoints, "watch", "live", "--count", "1"],
            None,
        )
    });
    // Puts until the watcher has seen one (it may start after the first).
    let mut n = 0;
    while !watcher.is_finished() {
        assert!(n < 600, "the watcher saw none of {n} puts");
        cluster
            .kvctl(&["put", "live", &n.to_string()])
            .expect_code(0);
        n += 1;
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let run = watcher.join().expect("watcher thread");
    run.expect_code(0);
    assert!(run.out().starts_with("PUT\nlive\n"), "{run:?}");

    // Below the compact revision: exit 2, naming it.
    let compact = (first + 2).to_string();
    cluster.kvctl(&["compact", &compact]).expect_code(0);
    let run = cluster.kvctl(&["watch", "app/", "--prefix", "--rev", &from]);
    run.expect_code(2);
    assert!(
        run.stderr.contains("compacted") && run.stderr.contains(&compact),
        "{run:?}"
    );
}
