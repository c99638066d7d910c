//! Revisions as etcd counts them, end to end on a three-node in-process
//! cluster over real gRPC: every write's header carries the revision it
//! applied at, one per request that changes something (a delete of an absent
//! key, a failed condition and a read leave it); each key reports its
//! `create_revision`, `mod_revision`, `version` and `lease`, identically on
//! every member and after a member restarts; conditions compare
//! `mod_revision`; and a key whose TTL runs out is deleted at a revision of
//! its own on every member alike (the store revision moves with no client
//! write at all: the leader's tick entries carry the expiry).

use std::time::{Duration, Instant};

use kvnode::StateMachineOptions;
use kvproto::kv::v1::{
    BatchCondition, BatchOp, BatchRequest, DeleteRequest, GetResponse, Header, PutOp, PutRequest,
    batch_op, batch_response, delete_response, put_request, put_response,
};

use crate::harness::{Cluster, DEADLINE, POLL};

/// A TTL that runs out during the test.
const TTL_MS: u64 = 1_500;

fn revision(header: &Option<Header>) -> u64 {
    header
        .as_ref()
        .expect("every response has a header")
        .revision
}

async fn put(cluster: &Cluster, key: &str, value: &str, ttl_ms: u64) -> (u64, u64) {
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
    let Some(put_response::Outcome::Seq(seq)) = reply.outcome else {
        panic!("put {key}: {:?}", reply.outcome);
    };
    let header = reply.header.as_ref().unwrap();
    (header.revision, header.applied_index.max(seq >> 16))
}

async fn delete(cluster: &Cluster, key: &str) -> (bool, u64) {
    let reply = cluster
        .write("delete", |mut kv| async move {
            kv.delete(DeleteRequest {
                key: key.as_bytes().to_vec().into(),
                ..Default::default()
            })
            .await
        })
        .await;
    let Some(delete_response::Outcome::Deleted(deleted)) = reply.outcome else {
        panic!("delete {key}: {:?}", reply.outcome);
    };
    (deleted.found, revision(&reply.header))
}

/// (create, mod, version, lease) of a read.
fn revisions_of(get: &GetResponse) -> (u64, u64, u64, u64) {
    (
        get.create_revision,
        get.mod_revision,
        get.version,
        get.lease,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_changing_request_takes_one_revision_and_every_member_agrees() {
    let mut cluster = Cluster::start(|_| StateMachineOptions::default()).await;
    let (r1, _) = put(&cluster, "a", "1", 0).await;
    assert!(
        r1 >= 2,
        "a fresh cluster is at revision 1: the first write is 2 or more"
    );
    let (r2, _) = put(&cluster, "b", "1", 0).await;
    assert_eq!(r2, r1 + 1, "one revision per put");
    let (r3, _) = put(&cluster, "a", "2", 0).await;
    assert_eq!(r3, r2 + 1);
    // A delete of nothing changes nothing.
    let (found, r) = delete(&cluster, "nothing").await;
    assert_eq!((found, r), (false, r3));
    // A condition on the key's mod_revision: a stale one fails and changes
    // nothing, the current one holds.
    let conditional = |mod_revision| {
        move |mut kv: kvproto::kv::v1::kv_client::KvClient<tonic::transport::Channel>| async move {
            kv.put(PutRequest {
                key: b"a".to_vec().into(),
                value: b"3".to_vec().into(),
                condition: Some(put_request::Condition::IfModRevision(mod_revision)),
                ..Default::default()
            })
            .await
        }
    };
    let failed = cluster.write("stale condition", conditional(r1)).await;
    let Some(put_response::Outcome::ConditionFailed(why)) = failed.outcome else {
        panic!("a stale mod_revision must fail: {:?}", failed.outcome);
    };
    assert_eq!(why.current_mod_revision, r3);
    assert_eq!(
        revision(&failed.header),
        r3,
        "a failed condition changes nothing"
    );
    let held = cluster.write("current condition", conditional(r3)).await;
    assert!(matches!(held.outcome, Some(put_response::Outcome::Seq(_))));
    let r4 = revision(&held.header);
    assert_eq!(r4, r3 + 1);
    // The condition fields of builds before revisions compared sequence
    // numbers: refused by name on any member, never applied.
    let mut kv = cluster.kv(cluster.running()[0]).await;
    let refused = kv
        .put(PutRequest {
            key: b"a".to_vec().into(),
            value: b"old client".to_vec().into(),
            condition: Some(put_request::Condition::IfSeq(r4)),
            ..Default::default()
        })
        .await
        .expect_err("if_seq is refused");
    assert_eq!(refused.code(), tonic::Code::InvalidArgument);
    assert!(refused.message().contains("if_seq"), "{refused:?}");
    let refused = kv
        .delete(DeleteRequest {
            key: b"a".to_vec().into(),
            if_seq: Some(1),
            ..Default::default()
        })
        .await
        .expect_err("if_seq is refused");
    assert!(refused.message().contains("if_seq"), "{refused:?}");
    // A batch writing two keys is one revision; its condition compares mod_revision.
    let batch = cluster
        .write("batch", |mut kv| async move {
            kv.batch(BatchRequest {
                conditions: vec![BatchCondition {
                    key: b"b".to_vec().into(),
                    mod_revision: r2,
                    seq: 0,
                }],
                ops: ["c", "d"]
                    .iter()
                    .map(|key| BatchOp {
                        op: Some(batch_op::Op::Put(PutOp {
                            key: key.as_bytes().to_vec().into(),
                            value: b"x".to_vec().into(),
                            ttl_ms: 0,
                        })),
                    })
                    .collect(),
                ..Default::default()
            })
            .await
        })
        .await;
    assert!(matches!(
        batch.outcome,
        Some(batch_response::Outcome::Applied(_))
    ));
    let r5 = revision(&batch.header);
    assert_eq!(r5, r4 + 1, "two keys, one revision");
    let (found, r6) = delete(&cluster, "b").await;
    assert_eq!((found, r6), (true, r5 + 1));

    // Every member reports the same revisions, and a header revision at or
    // above every mod_revision it returned.
    let applied = cluster.wait_applied_equal().await;
    let expect = [
        ("a", Some((r1, r4, 3, 0))),
        ("b", None),
        ("c", Some((r5, r5, 1, 0))),
        ("d", Some((r5, r5, 1, 0))),
    ];
    for id in cluster.running() {
        for (key, want) in expect {
            let got = cluster.stale_get(id, key.as_bytes(), applied).await;
            assert_eq!(
                got.found.then(|| revisions_of(&got)),
                want,
                "member {id}, key {key}"
            );
            assert_eq!(revision(&got.header), r6, "member {id}'s store revision");
        }
    }
    // A restarted member recovers the store revision and every key's revisions.
    let follower = cluster.running().into_iter().find(|id| *id != 1).unwrap();
    cluster.stop(follower).await;
    cluster.restart(follower).await;
    let applied = cluster.wait_applied_equal().await;
    let got = cluster.stale_get(follower, b"a", applied).await;
    assert_eq!(revisions_of(&got), (r1, r4, 3, 0));
    assert!(revision(&got.header) >= r6);
    let (r7, _) = put(&cluster, "e", "1", 0).await;
    assert!(
        r7 > r6,
        "the revision goes on after a restart: {r7} after {r6}"
    );
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ttl_runs_out_as_a_delete_at_a_revision_of_its_own_on_every_member() {
    let cluster = Cluster::start(|_| StateMachineOptions::default()).await;
    put(&cluster, "kept", "1", 0).await;
    let (written, _) = put(&cluster, "brief", "1", TTL_MS).await;
    // No client write from here on: the expiry comes with a tick entry.
    let start = Instant::now();
    let mut revisions = Vec::new();
    for id in cluster.running() {
        loop {
            let got = cluster.stale_get(id, b"brief", 0).await;
            if !got.found && revision(&got.header) > written {
                revisions.push(revision(&got.header));
                break;
            }
            assert!(
                start.elapsed() < DEADLINE,
                "member {id}: the key with a {TTL_MS} ms TTL is not deleted (found {}, revision {})",
                got.found,
                revision(&got.header)
            );
            tokio::time::sleep(POLL).await;
        }
    }
    // Deleted at a revision of its own, the same on every member.
    assert_eq!(
        revisions,
        vec![written + 1; revisions.len()],
        "every member deleted the key at revision {} (it was written at {written})",
        written + 1
    );
    let kept = cluster.stale_get(1, b"kept", 0).await;
    assert!(kept.found);
    assert!(
        start.elapsed() >= Duration::from_millis(TTL_MS / 2),
        "the key went too early"
    );
    cluster.shutdown().await;
}
