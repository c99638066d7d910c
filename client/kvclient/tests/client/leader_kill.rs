//! Proves: a stream of writes from one client, several in flight at once,
//! across a leader kill, ends with every write either acknowledged or
//! reported outcome-unknown (never as failed), and none applied twice. Each
//! write is an if-absent put of its own key with a unique value: a second
//! application (a retry that escaped deduplication) would come back as a
//! version mismatch, which the test forbids; every acknowledged write is then
//! present with exactly its acknowledged version and value, every unknown one
//! is absent or holds its own value, and nothing else is in the key space.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use kvclient::{Client, Error, PutOptions, Scan, Written};
use tokio_stream::StreamExt;

use crate::harness::{Cluster, DEADLINE, POLL};

/// Concurrent writers sharing the one client (writes in flight at once).
const WRITERS: usize = 8;
/// Writes per writer.
const WRITES_PER_WRITER: usize = 120;
/// Acknowledged writes before the leader is killed.
const KILL_AFTER_ACKS: usize = 200;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn writes_across_a_leader_kill_apply_at_most_once() {
    let mut cluster = Cluster::start().await;
    let client = Client::builder(cluster.endpoints())
        .request_timeout(Duration::from_secs(5))
        .operation_timeout(Duration::from_secs(60))
        .attempts(500)
        .build()
        .expect("client");
    client.discover_leader().await.expect("discover leader");
    let acks = Arc::new(AtomicUsize::new(0));
    let mut writers = Vec::new();
    for w in 0..WRITERS {
        let client = client.clone();
        let acks = Arc::clone(&acks);
        writers.push(tokio::spawn(async move {
            let mut out = Vec::new();
            for i in 0..WRITES_PER_WRITER {
                let key = format!("w/{w:02}/{i:04}");
                let value = format!("{key}@{}", client.client_id());
                let result = client
                    .put_with(
                        key.clone(),
                        value.clone(),
                        PutOptions::default().if_absent(),
                    )
                    .await;
                if result.is_ok() {
                    acks.fetch_add(1, Ordering::Relaxed);
                }
                out.push((key, value, result));
            }
            out
        }));
    }
    let start = Instant::now();
    while acks.load(Ordering::Relaxed) < KILL_AFTER_ACKS {
        assert!(
            start.elapsed() < DEADLINE,
            "writes too slow before the kill"
        );
        tokio::time::sleep(POLL).await;
    }
    let old = cluster.leader().await;
    let acked_at_kill = acks.load(Ordering::Relaxed);
    cluster.kill(old).await;
    let new = cluster.leader().await;
    assert_ne!(old, new, "a new leader must be elected");

    let mut acked: BTreeMap<String, (String, Written)> = BTreeMap::new();
    let mut unknown: BTreeMap<String, String> = BTreeMap::new();
    for writer in writers {
        for (key, value, result) in writer.await.expect("writer task") {
            match result {
                Ok(written) => {
                    acked.insert(key, (value, written));
                }
                Err(Error::OutcomeUnknown { .. }) => {
                    unknown.insert(key, value);
                }
                Err(err) => panic!("write of {key} failed (applied twice or lost?): {err}"),
            }
        }
    }
    eprintln!(
        "leader {old} killed after {acked_at_kill} acks; {} acknowledged, {} outcome unknown",
        acked.len(),
        unknown.len()
    );
    assert_eq!(acked.len() + unknown.len(), WRITERS * WRITES_PER_WRITER);
    assert!(
        acked.len() > acked_at_kill,
        "writes must go on after the kill"
    );

    for (key, (value, written)) in &acked {
        let entry = client
            .get(key.clone())
            .await
            .expect("get")
            .unwrap_or_else(|| panic!("acknowledged {key} is missing"));
        assert_eq!(entry.value, value.as_bytes(), "{key}");
        assert_eq!(
            entry.seq, written.seq,
            "{key} changed after its acknowledgement (applied twice?)"
        );
    }
    let mut listed = 0;
    let mut scan = client.scan(Scan::prefix("w/"));
    while let Some(kv) = scan.next().await {
        let kv = kv.expect("scan");
        let key = String::from_utf8(kv.key.to_vec()).expect("utf-8 key");
        let expected = acked
            .get(&key)
            .map(|(v, _)| v)
            .or_else(|| unknown.get(&key))
            .unwrap_or_else(|| panic!("unexpected key {key}"));
        assert_eq!(kv.value, expected.as_bytes(), "{key}");
        listed += 1;
        assert!(
            listed <= WRITERS * WRITES_PER_WRITER,
            "the scan does not end"
        );
    }
    assert!(listed >= acked.len() && listed <= acked.len() + unknown.len());
}
