//! The etcd port's watches at their edges:
//! - a revision too large to join into one message (one DeleteRange of
//!   thousands of keys watched with `prev_kv`, some 9 MiB of events, above
//!   the port's 8 MiB response limit) reaches a watch created without
//!   `fragment` whole, in several messages each within the joining bound,
//!   and the stream goes on;
//! - a cancel sent right behind its own create (client-chosen ids, all in
//!   one burst) still gets the watch its `created` first, and every later
//!   create gets its own `created`, in order.

use kvproto::etcd::etcdserverpb::kv_client::KvClient;
use kvproto::etcd::etcdserverpb::{
    DeleteRangeRequest, RequestOp, TxnRequest, WatchCancelRequest, WatchCreateRequest,
    WatchRequest, request_op, watch_request,
};
use kvproto::etcd::mvccpb::event::EventType;
use prost::Message as _;

use super::etcd::{WatchStream, channel, cluster, prefix, put, watch_prefix};

/// Keys the large revision deletes, and each one's value size: with
/// `prev_kv` every delete event carries the value, 9 000 × 1 KiB ≈ 9 MiB.
const LARGE_REVISION_KEYS: usize = 9_000;
const LARGE_VALUE_BYTES: usize = 1024;
/// Puts per transaction while filling (etcd's limit is 128 ops).
const PUTS_PER_TXN: usize = 100;
/// The joining bound the port keeps to (`ETCD_WATCH_JOINED_BYTES_MAX`).
const JOINED_BYTES_MAX: usize = 4 * 1024 * 1024;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revision_too_large_to_join_arrives_whole_in_bounded_messages() {
    let root = tempfile::tempdir().unwrap();
    let (cluster, leader, follower) = cluster(root.path()).await;
    let mut kv = KvClient::new(channel(&cluster, leader).await);
    let value = "v".repeat(LARGE_VALUE_BYTES);
    let keys: Vec<String> = (0..LARGE_REVISION_KEYS)
        .map(|n| format!("big/{n:05}"))
        .collect();
    for chunk in keys.chunks(PUTS_PER_TXN) {
        let success = chunk
            .iter()
            .map(|key| RequestOp {
                request: Some(request_op::Request::RequestPut(put(key, &value))),
            })
            .collect();
        kv.txn(TxnRequest {
            success,
            ..Default::default()
        })
        .await
        .expect("a put transaction");
    }
    let mut watch = WatchStream::open(channel(&cluster, follower).await).await;
    watch
        .create(WatchCreateRequest {
            prev_kv: true,
            ..watch_prefix("big/", 0)
        })
        .await;
    let range = prefix("big/");
    let deleted = kv
        .delete_range(DeleteRangeRequest {
            key: range.key,
            range_end: range.range_end,
            ..Default::default()
        })
        .await
        .expect("one DeleteRange of every key")
        .into_inner();
    assert_eq!(deleted.deleted, LARGE_REVISION_KEYS as i64);
    let revision = deleted.header.unwrap().revision;

    let mut seen = Vec::new();
    let mut messages = 0;
    while seen.len() < LARGE_REVISION_KEYS {
        let answer = watch.next().await;
        assert!(!answer.canceled, "the watch goes on: {answer:?}");
        assert!(!answer.fragment, "not asked for fragments");
        let bytes: usize = answer.events.iter().map(|e| e.encoded_len()).sum();
        assert!(bytes <= JOINED_BYTES_MAX, "{bytes} bytes in one message");
        messages += 1;
        for event in answer.events {
            assert_eq!(event.r#type, EventType::Delete as i32);
            let kv = event.kv.unwrap();
            assert_eq!(kv.mod_revision, revision);
            assert_eq!(event.prev_kv.unwrap().value.len(), LARGE_VALUE_BYTES);
            seen.push(String::from_utf8(kv.key.to_vec()).unwrap());
        }
    }
    assert_eq!(seen, keys, "every delete, once, in key order");
    assert!(messages > 1, "more than the bound in one message");
    // The stream still carries the next revision.
    let next = kv.put(put("big/after", "x")).await.unwrap().into_inner();
    let answer = watch.next().await;
    assert_eq!(answer.events.len(), 1, "{answer:?}");
    assert_eq!(
        answer.events[0].kv.as_ref().unwrap().mod_revision,
        next.header.unwrap().revision
    );
    cluster.shutdown().await;
}

fn create_with_id(key: &str, watch_id: i64) -> WatchRequest {
    WatchRequest {
        request_union: Some(watch_request::RequestUnion::CreateRequest(
            WatchCreateRequest {
                watch_id,
                ..watch_prefix(key, 0)
            },
        )),
    }
}

fn cancel(watch_id: i64) -> WatchRequest {
    WatchRequest {
        request_union: Some(watch_request::RequestUnion::CancelRequest(
            WatchCancelRequest { watch_id },
        )),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_right_behind_its_create_keeps_the_creates_in_step() {
    let root = tempfile::tempdir().unwrap();
    let (cluster, leader, follower) = cluster(root.path()).await;
    let mut kv = KvClient::new(channel(&cluster, leader).await);
    let mut watch = WatchStream::open(channel(&cluster, follower).await).await;
    // Several rounds: each sends create A, create B, cancel B, create C in
    // one burst, before any `created` can come back.
    for round in 0..5i64 {
        let (a, b, c) = (100 + 10 * round, 101 + 10 * round, 102 + 10 * round);
        for request in [
            create_with_id(&format!("r{round}/a/"), a),
            create_with_id(&format!("r{round}/b/"), b),
            cancel(b),
            create_with_id(&format!("r{round}/c/"), c),
        ] {
            watch.requests.send(request).await.unwrap();
        }
        let mut answers = Vec::new();
        for _ in 0..4 {
            let answer = watch.next().await;
            answers.push((answer.watch_id, answer.created, answer.canceled));
        }
        assert_eq!(
            answers,
            [
                (a, true, false),
                (b, true, false),
                (b, false, true),
                (c, true, false)
            ],
            "round {round}: created A, created B, canceled B, created C"
        );
        // C watches what it was created for (not B's or A's prefix).
        let put_c = kv
            .put(put(&format!("r{round}/c/k"), "v"))
            .await
            .unwrap()
            .into_inner();
        let answer = watch.next().await;
        assert_eq!(answer.watch_id, c, "{answer:?}");
        assert_eq!(
            answer.events[0].kv.as_ref().unwrap().mod_revision,
            put_c.header.unwrap().revision
        );
        // A sees its own put; the cancelled B sees nothing.
        kv.put(put(&format!("r{round}/b/k"), "v")).await.unwrap();
        kv.put(put(&format!("r{round}/a/k"), "v")).await.unwrap();
        let answer = watch.next().await;
        assert_eq!(answer.watch_id, a, "{answer:?}");
    }
    cluster.shutdown().await;
}
