//! Proves: a watch follows its member's failure by itself. A client watches
//! a prefix on the leader; writes go on while that leader is killed; the
//! stream resumes on another member and delivers every acknowledged write's
//! event exactly once, in revision order, at its acknowledged revision,
//! and nothing that was not written.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use kvclient::{Client, Error, EventKind, Watch};
use tokio_stream::StreamExt;

use crate::harness::{Cluster, DEADLINE};

/// Writes before and after the kill.
const WRITES_EACH_SIDE: usize = 60;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_watch_resumes_on_another_member_with_every_event_exactly_once() {
    let mut cluster = Cluster::start().await;
    let client = Client::builder(cluster.endpoints())
        .request_timeout(Duration::from_secs(5))
        .operation_timeout(Duration::from_secs(60))
        .attempts(500)
        .build()
        .expect("client");
    let leader = cluster.leader().await;
    let mut watch = client
        .watch_on(&cluster.addr(leader), Watch::prefix("w/").prev_kv())
        .await
        .expect("watch created");
    let start = watch.created_revision();
    // Outside the prefix: never delivered.
    client.put("x", "outside").await.expect("put outside");

    let mut written = BTreeMap::new(); // revision -> (key, value)
    let mut unknown = BTreeMap::new(); // key -> value
    for i in 0..2 * WRITES_EACH_SIDE {
        if i == WRITES_EACH_SIDE {
            cluster.kill(leader).await;
        }
        let key = format!("w/{:03}", i % 40);
        let value = format!("v{i}");
        match client.put(key.clone(), value.clone()).await {
            Ok(ack) => {
                assert!(ack.revision > start);
                written.insert(ack.revision, (key, value));
            }
            Err(Error::OutcomeUnknown { .. }) => {
                unknown.insert(value, key);
            }
            Err(err) => panic!("put {i}: {err}"),
        }
    }
    let last = *written.keys().last().unwrap();

    let deadline = Instant::now() + DEADLINE;
    let mut events = Vec::new();
    let mut members = std::collections::BTreeSet::new();
    while events
        .last()
        .is_none_or(|(revision, _, _)| *revision < last)
    {
        let remaining = deadline.saturating_duration_since(Instant::now());
        let batch = tokio::time::timeout(remaining, watch.next())
            .await
            .unwrap_or_else(|_| panic!("events up to {last} within {DEADLINE:?}: {events:?}"))
            .expect("the stream goes on")
            .expect("no error");
        members.insert(batch.member_id);
        for event in batch.events {
            assert_eq!(event.kind, EventKind::Put);
            let kv = &event.kv;
            events.push((
                event.revision(),
                String::from_utf8(kv.key.to_vec()).unwrap(),
                String::from_utf8(kv.value.to_vec()).unwrap(),
            ));
        }
    }
    assert!(
        members.len() >= 2 && !members.contains(&0),
        "events came from the killed leader and another member: {members:?}"
    );
    for pair in events.windows(2) {
        assert!(pair[0].0 < pair[1].0, "in revision order, once: {pair:?}");
    }
    for (revision, key, value) in &events {
        match written.get(revision) {
            Some(write) => assert_eq!(write, &(key.clone(), value.clone())),
            None => assert_eq!(
                unknown.get(value),
                Some(key),
                "an event at {revision} that no write made: {key}={value}"
            ),
        }
    }
    let seen: std::collections::BTreeSet<u64> = events.iter().map(|e| e.0).collect();
    for revision in written.keys() {
        assert!(
            seen.contains(revision),
            "the acknowledged write at {revision} was delivered"
        );
    }
    assert!(watch.next_revision() > last);
}
