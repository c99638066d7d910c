//! `Kv.Watch` end to end on a three-node in-process cluster over real
//! gRPC: every member sends the same events (a transaction's together, at
//! one revision; a TTL's expiry as a DELETE with the previous value); a
//! watcher resuming on another member from its last revision + 1 gets the
//! rest exactly once; a start at or below the compact revision is created,
//! then cancelled naming the compact revision; a watcher that does not read while thousands of
//! writes apply holds nothing back and then gets all of them, in order.

use std::time::{Duration, Instant};

use kvnode::StateMachineOptions;
use kvproto::kv::v1::{
    CompactRequest, EventType, PutRequest, TxnOp, TxnPut, TxnRequest, WatchCreateRequest,
    WatchRequest, WatchResponse, kv_client::KvClient, txn_op, watch_request,
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Streaming;
use tonic::transport::Channel;

use crate::harness::{Cluster, DEADLINE};

/// (revision, PUT/DELETE, key, value, previous value) of one event.
type Seen = (u64, &'static str, String, String, Option<String>);

async fn put(cluster: &Cluster, key: &str, value: &str, ttl_ms: u64) -> u64 {
    let reply = cluster
        .write("put", |mut kv| async move {
            kv.put(PutRequest {
                key: key.as_bytes().to_vec().into(),
                value: value.as_bytes().to_vec().into(),
                ttl_ms,
                ..Default::default()
            })
            .await
        })
        .await;
    reply.header.unwrap().revision
}

/// A watch stream with its request sender (the stream lives as long as
/// the sender).
struct Watching {
    _requests: mpsc::Sender<WatchRequest>,
    responses: Streaming<WatchResponse>,
}

async fn watch(mut kv: KvClient<Channel>, prefix: &str, start_revision: u64) -> Watching {
    let (requests, stream) = mpsc::channel(4);
    let mut end = prefix.as_bytes().to_vec();
    *end.last_mut().unwrap() += 1;
    requests
        .send(WatchRequest {
            request: Some(watch_request::Request::Create(WatchCreateRequest {
                key: prefix.as_bytes().to_vec().into(),
                range_end: end.into(),
                start_revision,
                prev_kv: true,
                ..Default::default()
            })),
        })
        .await
        .unwrap();
    let responses = kv
        .watch(ReceiverStream::new(stream))
        .await
        .unwrap()
        .into_inner();
    Watching {
        _requests: requests,
        responses,
    }
}

impl Watching {
    async fn next(&mut self) -> WatchResponse {
        tokio::time::timeout(DEADLINE, self.responses.message())
            .await
            .expect("a watch message in time")
            .expect("no stream error")
            .expect("the stream goes on")
    }

    /// The `created` message's header revision.
    async fn created(&mut self) -> u64 {
        let created = self.next().await;
        assert!(created.created && !created.canceled, "{created:?}");
        created.header.unwrap().revision
    }

    /// Events until one at `last` or above arrived; each message's events
    /// all at one revision or whole revisions.
    async fn events_through(&mut self, last: u64) -> Vec<Seen> {
        let deadline = Instant::now() + DEADLINE;
        let mut seen: Vec<Seen> = Vec::new();
        while seen.last().is_none_or(|e| e.0 < last) {
            assert!(Instant::now() < deadline, "events up to {last}: {seen:?}");
            let response = self.next().await;
            assert!(!response.canceled, "{response:?}");
            for event in response.events {
                let kv = event.kv.unwrap();
                let kind = if event.r#type == EventType::Delete as i32 {
                    "DELETE"
                } else {
                    "PUT"
                };
                seen.push((
                    kv.mod_revision,
                    kind,
                    String::from_utf8_lossy(&kv.key).into_owned(),
                    String::from_utf8_lossy(&kv.value).into_owned(),
                    event
                        .prev_kv
                        .map(|p| String::from_utf8_lossy(&p.value).into_owned()),
                ));
            }
        }
        seen
    }
}

fn seen(revision: u64, kind: &'static str, key: &str, value: &str, prev: Option<&str>) -> Seen {
    (
        revision,
        kind,
        key.to_string(),
        value.to_string(),
        prev.map(str::to_string),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_member_sends_the_same_events_and_a_watcher_resumes_on_another_exactly_once() {
    let cluster = Cluster::start(|_| StateMachineOptions::default()).await;
    let ids = cluster.running();
    let mut watchers = Vec::new();
    for id in &ids {
        let mut watching = watch(cluster.kv(*id).await, "w/", 0).await;
        watching.created().await;
        watchers.push(watching);
    }
    let r1 = put(&cluster, "w/a", "1", 0).await;
    put(&cluster, "other", "x", 0).await;
    let txn = cluster
        .write("txn", |mut kv| async move {
            let op = |key: &str, value: &str| TxnOp {
                op: Some(txn_op::Op::Put(TxnPut {
                    key: key.as_bytes().to_vec().into(),
                    value: value.as_bytes().to_vec().into(),
                    ..Default::default()
                })),
            };
            kv.txn(TxnRequest {
                success: vec![op("w/a", "2"), op("w/b", "1"), op("w/c", "1")],
                ..Default::default()
            })
            .await
        })
        .await;
    let r3 = txn.header.unwrap().revision;
    let r4 = put(&cluster, "w/t", "brief", 300).await;
    // The TTL's delete is an entry of its own, at the next revision.
    let expected = vec![
        seen(r1, "PUT", "w/a", "1", None),
        seen(r3, "PUT", "w/a", "2", Some("1")),
        seen(r3, "PUT", "w/b", "1", None),
        seen(r3, "PUT", "w/c", "1", None),
        seen(r4, "PUT", "w/t", "brief", None),
        seen(r4 + 1, "DELETE", "w/t", "", Some("brief")),
    ];
    for (id, watching) in ids.iter().zip(&mut watchers) {
        let got = watching.events_through(r4 + 1).await;
        assert_eq!(got, expected, "member {id}");
    }

    // A transaction's events come in one message.
    let mut from_r3 = watch(cluster.kv(ids[0]).await, "w/", r3).await;
    from_r3.created().await;
    let message = from_r3.next().await;
    let at_r3 = message
        .events
        .iter()
        .filter(|e| e.kv.as_ref().unwrap().mod_revision == r3)
        .count();
    assert_eq!(at_r3, 3, "{message:?}");

    // Resume: events up to r3 on one member, then from r3 + 1 on another,
    // make exactly the whole.
    let mut first = watch(cluster.kv(ids[1]).await, "w/", r1).await;
    assert_eq!(first.created().await, r1 - 1);
    let mut part = first.events_through(r3).await;
    // What a watcher that stopped reading after r3 had.
    part.retain(|e| e.0 <= r3);
    drop(first);
    let mut rest = watch(cluster.kv(ids[2]).await, "w/", r3 + 1).await;
    rest.created().await;
    part.extend(rest.events_through(r4 + 1).await);
    assert_eq!(part, expected);
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compacted_start_is_cancelled_naming_the_compact_revision() {
    let cluster = Cluster::start(|_| StateMachineOptions::default()).await;
    let mut last = 0;
    for i in 0..10 {
        last = put(&cluster, "w/k", &i.to_string(), 0).await;
    }
    let leader = cluster.leader().await;
    cluster
        .kv(leader)
        .await
        .compact(CompactRequest { revision: last - 3 })
        .await
        .unwrap();
    let applied = cluster.wait_applied_equal().await;
    assert!(applied > 0);
    for id in cluster.running() {
        // Created, then cancelled (as etcd does).
        let mut watching = watch(cluster.kv(id).await, "w/", last - 5).await;
        watching.created().await;
        let refused = watching.next().await;
        assert!(refused.canceled && refused.events.is_empty(), "{refused:?}");
        assert_eq!(refused.compact_revision, last - 3, "member {id}");
        assert!(
            refused.cancel_reason.contains("compacted"),
            "{}",
            refused.cancel_reason
        );
        // From the compact revision + 1 it is served.
        let mut served = watch(cluster.kv(id).await, "w/", last - 2).await;
        served.created().await;
        let got = served.events_through(last).await;
        assert_eq!(got.len(), 3, "member {id}: {got:?}");
    }
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watcher_that_does_not_read_holds_no_write_back_and_catches_up_in_order() {
    /// Far more than the stream's buffer of responses holds.
    const WRITES: usize = 3000;
    let cluster = Cluster::start(|_| StateMachineOptions::default()).await;
    let leader = cluster.leader().await;
    let follower = cluster
        .running()
        .into_iter()
        .find(|id| *id != leader)
        .unwrap();
    let mut slow = watch(cluster.kv(follower).await, "s/", 0).await;
    let start = slow.created().await;
    // Writes in batches of 100 keys each (one revision each), never read
    // by the watcher meanwhile: they all complete (a write held back
    // past its timeout fails the test).
    let mut last = 0;
    for batch in 0..WRITES / 100 {
        let reply = cluster
            .write("txn", |mut kv| async move {
                let success = (0..100)
                    .map(|i| TxnOp {
                        op: Some(txn_op::Op::Put(TxnPut {
                            key: format!("s/{batch:03}/{i:03}").into_bytes().into(),
                            value: vec![b'v'; 2000].into(),
                            ..Default::default()
                        })),
                    })
                    .collect();
                kv.txn(TxnRequest {
                    success,
                    ..Default::default()
                })
                .await
            })
            .await;
        last = reply.header.unwrap().revision;
    }
    let got = slow.events_through(last).await;
    assert_eq!(got.len(), WRITES);
    for (n, event) in got.iter().enumerate() {
        assert_eq!(event.0, start + 1 + (n / 100) as u64, "event {n}");
        assert_eq!(event.2, format!("s/{:03}/{:03}", n / 100, n % 100));
    }
    // The stream's watcher is caught up again: a new write arrives.
    let next = put(&cluster, "s/z", "z", 0).await;
    let after = tokio::time::timeout(Duration::from_secs(30), slow.events_through(next))
        .await
        .expect("the caught-up watcher gets the next write");
    assert_eq!(after, vec![seen(next, "PUT", "s/z", "z", None)]);
    cluster.shutdown().await;
}

/// Sends creates on one stream; returns the stream and its sender.
async fn stream_of(
    mut kv: KvClient<Channel>,
    creates: Vec<WatchCreateRequest>,
) -> (mpsc::Sender<WatchRequest>, Streaming<WatchResponse>) {
    let (requests, stream) = mpsc::channel(16);
    for create in creates {
        requests
            .send(WatchRequest {
                request: Some(watch_request::Request::Create(create)),
            })
            .await
            .unwrap();
    }
    let responses = kv
        .watch(ReceiverStream::new(stream))
        .await
        .unwrap()
        .into_inner();
    (requests, responses)
}

async fn message(responses: &mut Streaming<WatchResponse>) -> WatchResponse {
    tokio::time::timeout(DEADLINE, responses.message())
        .await
        .expect("a watch message in time")
        .expect("no stream error")
        .expect("the stream goes on")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_stream_answers_creates_in_order_refuses_bad_ones_by_name_and_outlives_a_half_close() {
    let cluster = Cluster::start(|_| StateMachineOptions::default()).await;
    let r1 = put(&cluster, "o/a", "1", 0).await;
    let leader = cluster.leader().await;
    let follower = cluster
        .running()
        .into_iter()
        .find(|id| *id != leader)
        .unwrap();
    let create = |key: &str, start_revision: u64| WatchCreateRequest {
        key: key.as_bytes().to_vec().into(),
        start_revision,
        ..Default::default()
    };
    // On a follower, a watch from now asks the leader for a read index; the
    // next create (from a past revision) needs nothing: its `created`
    // still comes second.
    for _ in 0..5 {
        let (requests, mut responses) = stream_of(
            cluster.kv(follower).await,
            vec![create("o/a", 0), create("o/a", r1)],
        )
        .await;
        let first = message(&mut responses).await;
        let second = message(&mut responses).await;
        assert!(first.created && second.created, "{first:?} {second:?}");
        assert_eq!((first.watch_id, second.watch_id), (0, 1));
        drop(requests);
    }

    // A duplicate id is refused as -1; the live watch goes on. A bad
    // consistency and a reserved key are refused by field name.
    let (requests, mut responses) = stream_of(
        cluster.kv(leader).await,
        vec![
            WatchCreateRequest {
                watch_id: 7,
                ..create("o/a", 0)
            },
            WatchCreateRequest {
                watch_id: 7,
                ..create("o/b", 0)
            },
            WatchCreateRequest {
                consistency: 9,
                ..create("o/c", 0)
            },
            WatchCreateRequest {
                key: b"\xff\xffraftcask/x".to_vec().into(),
                ..Default::default()
            },
        ],
    )
    .await;
    let live = message(&mut responses).await;
    assert!(
        live.created && !live.canceled && live.watch_id == 7,
        "{live:?}"
    );
    let duplicate = message(&mut responses).await;
    assert!(
        duplicate.canceled && duplicate.watch_id == -1,
        "{duplicate:?}"
    );
    assert!(!duplicate.unavailable, "{duplicate:?}");
    let consistency = message(&mut responses).await;
    assert!(consistency.canceled, "{consistency:?}");
    assert!(
        consistency.cancel_reason.contains("consistency"),
        "{consistency:?}"
    );
    let reserved = message(&mut responses).await;
    assert!(reserved.canceled, "{reserved:?}");
    assert!(reserved.cancel_reason.contains(".key"), "{reserved:?}");
    // The client closes its side: the watch goes on (as etcd's).
    drop(requests);
    let r2 = put(&cluster, "o/a", "2", 0).await;
    let events = message(&mut responses).await;
    assert_eq!(events.watch_id, 7, "{events:?}");
    assert_eq!(events.events[0].kv.as_ref().unwrap().mod_revision, r2);
    cluster.shutdown().await;
}
