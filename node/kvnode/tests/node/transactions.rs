//! etcd's Range, DeleteRange and Txn end to end on a three-node in-process
//! cluster over real gRPC: a range with a limit, counts, keys only, sorting
//! and revision checks (a future revision is OUT_OF_RANGE, a past one not
//! served yet); a range delete at one revision with the deleted keys; a
//! transaction's two branches (reads inside see the branch's own writes;
//! the failed compare runs the else branch and changes nothing); a refused
//! transaction (two writes of one key) applies nothing; and every member
//! serves the same range afterwards.

use kvnode::StateMachineOptions;
use kvproto::kv::v1::{
    Compare, CompareResult, Consistency, DeleteRangeRequest, Header, PutRequest, RangeRequest,
    SortOrder, SortTarget, TxnOp, TxnPut, TxnRequest, compare, txn_op, txn_op_result,
};

use crate::harness::Cluster;

fn revision(header: &Option<Header>) -> u64 {
    header.as_ref().expect("a header").revision
}

async fn put(cluster: &Cluster, key: &str, value: &str) -> u64 {
    let reply = cluster
        .write("put", |mut kv| async move {
            kv.put(PutRequest {
                key: key.as_bytes().to_vec().into(),
                value: value.as_bytes().to_vec().into(),
                ..Default::default()
            })
            .await
        })
        .await;
    revision(&reply.header)
}

fn prefix(p: &str) -> RangeRequest {
    let mut end = p.as_bytes().to_vec();
    *end.last_mut().expect("a non-empty prefix") += 1;
    RangeRequest {
        key: p.as_bytes().to_vec().into(),
        range_end: end.into(),
        ..Default::default()
    }
}

fn keys(kvs: &[kvproto::kv::v1::KeyValue]) -> Vec<String> {
    kvs.iter()
        .map(|kv| String::from_utf8_lossy(&kv.key).to_string())
        .collect()
}

fn txn_put(key: &str, value: &str, prev_kv: bool) -> TxnOp {
    TxnOp {
        op: Some(txn_op::Op::Put(TxnPut {
            key: key.as_bytes().to_vec().into(),
            value: value.as_bytes().to_vec().into(),
            prev_kv,
            ..Default::default()
        })),
    }
}

fn txn_range(range: RangeRequest) -> TxnOp {
    TxnOp {
        op: Some(txn_op::Op::Range(range)),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ranges_range_deletes_and_transactions_answer_as_etcd_does() {
    let cluster = Cluster::start(|_| StateMachineOptions::default()).await;
    for (key, value) in [("a1", "x"), ("a2", "y"), ("a3", "z"), ("b1", "v")] {
        put(&cluster, key, value).await;
    }
    let leader = cluster.leader().await;
    let mut kv = cluster.kv(leader).await;

    // Ranges: limit and more, count before the limit, keys only, sorting.
    let limited = kv
        .range(RangeRequest {
            limit: 2,
            ..prefix("a")
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(keys(&limited.kvs), ["a1", "a2"]);
    assert!(limited.more);
    assert_eq!(limited.count, 3);
    let current = revision(&limited.header);
    let sorted = kv
        .range(RangeRequest {
            sort_target: SortTarget::Mod as i32,
            sort_order: SortOrder::Descend as i32,
            keys_only: true,
            ..prefix("a")
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(keys(&sorted.kvs), ["a3", "a2", "a1"]);
    assert!(sorted.kvs.iter().all(|kv| kv.value.is_empty()));
    let counted = kv
        .range(RangeRequest {
            count_only: true,
            ..prefix("a")
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((counted.kvs.len(), counted.count), (0, 3));
    // Revisions: the current one is served, a future one is OUT_OF_RANGE
    // naming both, a past one reads as it was (before "a3" and "b1").
    let at_current = kv
        .range(RangeRequest {
            revision: current,
            ..prefix("a")
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(at_current.count, 3);
    let future = kv
        .range(RangeRequest {
            revision: current + 100,
            ..prefix("a")
        })
        .await
        .unwrap_err();
    assert_eq!(future.code(), tonic::Code::OutOfRange, "{future:?}");
    assert!(future.message().contains("future revision"), "{future:?}");
    let past = kv
        .range(RangeRequest {
            revision: current - 2,
            ..prefix("a")
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(keys(&past.kvs), ["a1", "a2"]);
    assert_eq!(revision(&past.header), current, "the header is the store's");

    // A range delete: every key at one revision, the keys as they were.
    let deleted = cluster
        .write("delete range", |mut kv| async move {
            let range = prefix("a");
            kv.delete_range(DeleteRangeRequest {
                key: range.key,
                range_end: range.range_end,
                prev_kv: true,
                ..Default::default()
            })
            .await
        })
        .await;
    assert_eq!(deleted.deleted, 3);
    assert_eq!(keys(&deleted.prev_kvs), ["a1", "a2", "a3"]);
    let after_delete = revision(&deleted.header);
    assert_eq!(
        after_delete,
        current + 1,
        "one revision for the whole delete"
    );

    // A transaction whose compare holds: the put returns the old key, the
    // read after it sees the new value; one revision.
    let b1 = kv
        .range(RangeRequest {
            key: b"b1".to_vec().into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let b1_mod = b1.kvs[0].mod_revision;
    let guarded = move |expected: u64| {
        move |mut kv: kvproto::kv::v1::kv_client::KvClient<tonic::transport::Channel>| async move {
            kv.txn(TxnRequest {
                compare: vec![Compare {
                    result: CompareResult::Equal as i32,
                    key: b"b1".to_vec().into(),
                    range_end: Default::default(),
                    target: Some(compare::Target::ModRevision(expected)),
                }],
                success: vec![txn_put("b1", "w", true), txn_range(prefix("b"))],
                failure: vec![txn_range(prefix("b"))],
                ..Default::default()
            })
            .await
        }
    };
    let won = cluster.write("txn", guarded(b1_mod)).await;
    assert!(won.succeeded);
    assert_eq!(revision(&won.header), after_delete + 1);
    let [put_result, read] = &won.responses[..] else {
        panic!("{:?}", won.responses);
    };
    let Some(txn_op_result::Result::Put(put_result)) = &put_result.result else {
        panic!("{put_result:?}");
    };
    assert_eq!(&put_result.prev_kv.as_ref().unwrap().value[..], b"v");
    let Some(txn_op_result::Result::Range(read)) = &read.result else {
        panic!("{read:?}");
    };
    assert_eq!(
        &read.kvs[0].value[..],
        b"w",
        "reads see the branch's writes"
    );
    assert_eq!(read.kvs[0].mod_revision, after_delete + 1);

    // The same compare again fails: the else branch reads, nothing changes.
    let lost = cluster.write("txn again", guarded(b1_mod)).await;
    assert!(!lost.succeeded);
    assert_eq!(revision(&lost.header), after_delete + 1);
    let Some(txn_op_result::Result::Range(read)) = &lost.responses[0].result else {
        panic!("{:?}", lost.responses);
    };
    assert_eq!(&read.kvs[0].value[..], b"w");

    // Two writes of one key in a branch: refused, nothing applied.
    let refused = kv
        .txn(TxnRequest {
            success: vec![txn_put("c", "1", false), txn_put("c", "2", false)],
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");
    assert!(refused.message().contains("duplicate key"), "{refused:?}");

    // Every member serves the same keys and revisions.
    let applied = cluster.wait_applied_equal().await;
    let mut seen = Vec::new();
    for member in cluster.running() {
        let range = cluster
            .kv(member)
            .await
            .range(RangeRequest {
                key: vec![0].into(),
                range_end: vec![0].into(),
                consistency: Consistency::Stale as i32,
                min_index: applied,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(revision(&range.header), after_delete + 1, "member {member}");
        seen.push(range.kvs);
    }
    assert_eq!(keys(&seen[0]), ["b1"]);
    assert!(seen.windows(2).all(|pair| pair[0] == pair[1]));
    cluster.shutdown().await;
}
