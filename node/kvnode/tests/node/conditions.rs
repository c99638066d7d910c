//! Conditional writes on a three-node in-process cluster, each result read
//! back from every member (stale reads at the write's applied index).
//! A Batch with two ops on one key applies atomically: the ops apply in
//! order (the second sees the first: `found`), take consecutive sequence
//! numbers `log index × 65536 + position` (position 0 and 1 of their entry,
//! the entry newer than the previous write and covered by the reply's
//! applied index) and one revision (the header's, every key's new
//! `mod_revision`), and the last op wins — for put+put, delete+put and
//! put+delete. Conditions compare `mod_revision` and are checked against
//! the state before the batch. A Batch with a failing condition applies
//! none of its ops and names the first failing condition (list order) with
//! the key's current `mod_revision`; a Batch whose expire names a missing
//! key applies nothing and names the op; single Put / Delete conditions
//! report index 0 and the current `mod_revision`. Concurrent
//! conditional batches that all require the same key to be absent have
//! exactly one winner, and only the winner's other writes exist, on every
//! member.

use std::collections::BTreeMap;

use kvnode::StateMachineOptions;
use kvproto::kv::v1::{
    BatchCondition, BatchOp, BatchRequest, BatchResponse, ConditionFailed, DeleteOp, DeleteRequest,
    ExpireOp, KeyNotFound, OpResult, PutOp, PutRequest, batch_op, batch_response, delete_response,
    put_request, put_response,
};

use crate::harness::Cluster;

/// Versions per log index (DESIGN §3): `version = index × 65536 + position`.
const VERSIONS_PER_INDEX: u64 = 65_536;
/// Rounds of the concurrent test; each is a fresh key.
const CONCURRENT_ROUNDS: usize = 10;
/// Contending batches per round.
const CONTENDERS: usize = 3;
/// TTL of the expire op (never runs out during the test).
const TTL_MS: u64 = 10 * 60 * 1000;

fn put_op(key: &str, value: &str) -> BatchOp {
    BatchOp {
        op: Some(batch_op::Op::Put(PutOp {
            key: key.as_bytes().to_vec().into(),
            value: value.as_bytes().to_vec().into(),
            ttl_ms: 0,
        })),
    }
}

fn delete_op(key: &str) -> BatchOp {
    BatchOp {
        op: Some(batch_op::Op::Delete(DeleteOp {
            key: key.as_bytes().to_vec().into(),
        })),
    }
}

fn expire_op(key: &str) -> BatchOp {
    BatchOp {
        op: Some(batch_op::Op::Expire(ExpireOp {
            key: key.as_bytes().to_vec().into(),
            ttl_ms: TTL_MS,
        })),
    }
}

fn condition(key: &str, mod_revision: u64) -> BatchCondition {
    BatchCondition {
        key: key.as_bytes().to_vec().into(),
        mod_revision,
        seq: 0,
    }
}

async fn batch(
    cluster: &Cluster,
    conditions: Vec<BatchCondition>,
    ops: Vec<BatchOp>,
) -> BatchResponse {
    let request = BatchRequest {
        session: None,
        conditions,
        ops,
    };
    cluster
        .write("batch", move |mut kv| {
            let request = request.clone();
            async move { kv.batch(request).await }
        })
        .await
}

fn applied_index(reply: &BatchResponse) -> u64 {
    reply.header.as_ref().expect("header").applied_index
}

/// The revision a write applied at (its keys' new `mod_revision`).
fn revision(reply: &BatchResponse) -> u64 {
    reply.header.as_ref().expect("header").revision
}

/// The op results of an applied batch (fails the test otherwise).
fn results(reply: &BatchResponse) -> Vec<OpResult> {
    match &reply.outcome {
        Some(batch_response::Outcome::Applied(applied)) => applied.results.clone(),
        other => panic!("the batch did not apply: {other:?}"),
    }
}

/// Checks the versions of an applied batch that was alone in its entry:
/// consecutive from position 0 of an entry after `previous_index` and
/// covered by the reply. Returns the entry's index.
fn check_versions(reply: &BatchResponse, previous_index: u64) -> u64 {
    let results = results(reply);
    let first = results[0].seq;
    let index = first / VERSIONS_PER_INDEX;
    assert_eq!(first % VERSIONS_PER_INDEX, 0, "first op at position 0");
    for (position, result) in results.iter().enumerate() {
        assert_eq!(result.seq, first + position as u64, "{results:?}");
    }
    assert!(
        index > previous_index,
        "entry {index} must follow {previous_index}"
    );
    assert!(index <= applied_index(reply), "{reply:?}");
    index
}

/// What every member serves for `key` once it has applied `min_index`:
/// `Some((value, seq, mod_revision))` or `None`; fails the test if members
/// disagree.
async fn read_everywhere(
    cluster: &Cluster,
    key: &str,
    min_index: u64,
) -> Option<(Vec<u8>, u64, u64)> {
    let mut seen = BTreeMap::new();
    for id in cluster.running() {
        let got = cluster.stale_get(id, key.as_bytes(), min_index).await;
        assert!(got.header.expect("header").applied_index >= min_index);
        let state = got
            .found
            .then(|| (got.value.to_vec(), got.seq, got.mod_revision));
        if !got.found {
            assert_eq!(
                (got.seq, got.mod_revision),
                (0, 0),
                "an absent key has seq and mod_revision 0"
            );
        }
        seen.insert(id, state);
    }
    let first = seen.values().next().expect("a member").clone();
    assert!(
        seen.values().all(|s| *s == first),
        "members disagree on {key}: {seen:?}"
    );
    first
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_with_two_ops_on_one_key_and_failed_conditions() {
    let cluster = Cluster::start(|_| StateMachineOptions::default()).await;

    let anchor = cluster
        .write("put anchor", |mut kv| async move {
            kv.put(PutRequest {
                key: b"anchor".to_vec().into(),
                value: b"a".to_vec().into(),
                ..Default::default()
            })
            .await
        })
        .await;
    let Some(put_response::Outcome::Seq(va)) = anchor.outcome else {
        panic!("{anchor:?}")
    };
    let ra = anchor.header.as_ref().expect("header").revision;
    let mut index = va / VERSIONS_PER_INDEX;

    // put + put on an absent key, conditions hold: the last put wins.
    let reply = batch(
        &cluster,
        vec![condition("anchor", ra), condition("k", 0)],
        vec![put_op("k", "one"), put_op("k", "two")],
    )
    .await;
    index = check_versions(&reply, index);
    let r = results(&reply);
    assert_eq!((r[0].found, r[1].found), (false, true), "{r:?}");
    let (v_two, rev_two) = (r[1].seq, revision(&reply));
    assert_eq!(rev_two, ra + 1, "one revision for the batch");
    assert_eq!(
        read_everywhere(&cluster, "k", applied_index(&reply)).await,
        Some((b"two".to_vec(), v_two, rev_two))
    );

    // delete + put: the delete finds the key, the put finds it gone.
    let reply = batch(
        &cluster,
        vec![condition("k", rev_two)],
        vec![delete_op("k"), put_op("k", "three")],
    )
    .await;
    index = check_versions(&reply, index);
    let r = results(&reply);
    assert_eq!((r[0].found, r[1].found), (true, false), "{r:?}");
    let (v_three, rev_three) = (r[1].seq, revision(&reply));
    assert_eq!(
        read_everywhere(&cluster, "k", applied_index(&reply)).await,
        Some((b"three".to_vec(), v_three, rev_three))
    );

    // put + delete: the key ends absent; the delete reports its tombstone's
    // sequence number.
    let reply = batch(
        &cluster,
        vec![condition("k", rev_three)],
        vec![put_op("k", "four"), delete_op("k")],
    )
    .await;
    index = check_versions(&reply, index);
    let r = results(&reply);
    assert_eq!((r[0].found, r[1].found), (true, true), "{r:?}");
    assert_eq!(
        read_everywhere(&cluster, "k", applied_index(&reply)).await,
        None
    );

    // Conditions see the state before the batch, not the batch's own ops:
    // "k" must be absent although the first op writes it.
    let reply = batch(
        &cluster,
        vec![condition("k", 0)],
        vec![put_op("k", "five"), put_op("side", "five")],
    )
    .await;
    index = check_versions(&reply, index);
    let (v_five, rev_five) = (results(&reply)[0].seq, revision(&reply));

    // The second condition fails: none of the ops (two on "k", one on the
    // anchor, whose condition holds) applies, and it is named with the
    // key's current mod_revision.
    let reply = batch(
        &cluster,
        vec![condition("anchor", ra), condition("k", rev_three)],
        vec![
            put_op("anchor", "changed"),
            put_op("k", "six"),
            delete_op("k"),
        ],
    )
    .await;
    assert_eq!(
        reply.outcome,
        Some(batch_response::Outcome::ConditionFailed(ConditionFailed {
            condition_index: 1,
            current_mod_revision: rev_five,
        }))
    );
    assert_eq!(revision(&reply), rev_five, "a failed batch changes nothing");
    let failed_index = applied_index(&reply);
    assert!(failed_index > index, "a failed batch is still an entry");
    assert_eq!(
        read_everywhere(&cluster, "anchor", failed_index).await,
        Some((b"a".to_vec(), va, ra))
    );
    assert_eq!(
        read_everywhere(&cluster, "k", failed_index).await,
        Some((b"five".to_vec(), v_five, rev_five))
    );

    // Both conditions fail: the first in list order is named.
    let reply = batch(
        &cluster,
        vec![condition("side", 1), condition("anchor", 0)],
        vec![put_op("k", "seven")],
    )
    .await;
    assert_eq!(
        reply.outcome,
        Some(batch_response::Outcome::ConditionFailed(ConditionFailed {
            condition_index: 0,
            current_mod_revision: rev_five,
        }))
    );

    // An expire of a missing key fails the batch, naming the op; the put
    // before it does not apply.
    let reply = batch(
        &cluster,
        vec![],
        vec![put_op("k", "eight"), expire_op("missing")],
    )
    .await;
    assert_eq!(
        reply.outcome,
        Some(batch_response::Outcome::KeyNotFound(KeyNotFound {
            op_index: 1
        }))
    );
    let not_found_index = applied_index(&reply);
    assert_eq!(
        read_everywhere(&cluster, "k", not_found_index).await,
        Some((b"five".to_vec(), v_five, rev_five))
    );
    assert_eq!(
        read_everywhere(&cluster, "missing", not_found_index).await,
        None
    );

    // Single-key conditions: index 0 and the current mod_revision.
    let reply = cluster
        .write("put if absent", |mut kv| async move {
            kv.put(PutRequest {
                key: b"k".to_vec().into(),
                value: b"nine".to_vec().into(),
                condition: Some(put_request::Condition::IfAbsent(Default::default())),
                ..Default::default()
            })
            .await
        })
        .await;
    assert_eq!(
        reply.outcome,
        Some(put_response::Outcome::ConditionFailed(ConditionFailed {
            condition_index: 0,
            current_mod_revision: rev_five,
        }))
    );
    let reply = cluster
        .write("delete if mod_revision", |mut kv| async move {
            kv.delete(DeleteRequest {
                key: b"k".to_vec().into(),
                if_mod_revision: Some(rev_two),
                ..Default::default()
            })
            .await
        })
        .await;
    assert_eq!(
        reply.outcome,
        Some(delete_response::Outcome::ConditionFailed(ConditionFailed {
            condition_index: 0,
            current_mod_revision: rev_five,
        }))
    );
    let last_index = reply.header.expect("header").applied_index;
    assert_eq!(
        read_everywhere(&cluster, "k", last_index).await,
        Some((b"five".to_vec(), v_five, rev_five))
    );

    // Every member lists the same keys, values and sequence numbers.
    let index = cluster.wait_applied_equal().await;
    let mut listings = BTreeMap::new();
    for id in cluster.running() {
        listings.insert(id, cluster.stale_scan(id, index).await);
    }
    let expected = vec![
        (b"anchor".to_vec(), b"a".to_vec(), va, false),
        (b"k".to_vec(), b"five".to_vec(), v_five, false),
        (b"side".to_vec(), b"five".to_vec(), v_five + 1, false),
    ];
    for (id, listing) in &listings {
        assert_eq!(listing, &expected, "member {id}");
    }
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_conditional_batches_have_one_winner() {
    let cluster = Cluster::start(|_| StateMachineOptions::default()).await;
    let leader = cluster.leader().await;
    for round in 0..CONCURRENT_ROUNDS {
        let key = format!("round{round:02}");
        let mut clients = Vec::new();
        for _ in 0..CONTENDERS {
            clients.push(cluster.kv(leader).await);
        }
        // Each contender requires the key to be absent and writes it plus a
        // key of its own.
        let sends = clients.into_iter().enumerate().map(|(c, mut kv)| {
            let request = BatchRequest {
                session: None,
                conditions: vec![condition(&key, 0)],
                ops: vec![
                    put_op(&key, &format!("contender {c}")),
                    put_op(&format!("{key}/{c}"), "mine"),
                ],
            };
            async move { kv.batch(request).await }
        });
        let replies: Vec<BatchResponse> = futures_join(sends)
            .await
            .into_iter()
            .map(|r| r.expect("batch on the leader").into_inner())
            .collect();
        let winners: Vec<usize> = replies
            .iter()
            .enumerate()
            .filter(|(_, r)| matches!(r.outcome, Some(batch_response::Outcome::Applied(_))))
            .map(|(c, _)| c)
            .collect();
        assert_eq!(winners.len(), 1, "round {round}: {replies:?}");
        let winner = winners[0];
        let version = results(&replies[winner])[0].seq;
        let won_at = revision(&replies[winner]);
        assert_eq!(version % VERSIONS_PER_INDEX, 0, "the only op at its entry");
        for (c, reply) in replies.iter().enumerate().filter(|(c, _)| *c != winner) {
            assert_eq!(
                reply.outcome,
                Some(batch_response::Outcome::ConditionFailed(ConditionFailed {
                    condition_index: 0,
                    current_mod_revision: won_at,
                })),
                "round {round}, contender {c}"
            );
        }
        let index = replies.iter().map(applied_index).max().expect("replies");
        assert_eq!(
            read_everywhere(&cluster, &key, index).await,
            Some((format!("contender {winner}").into_bytes(), version, won_at))
        );
        for c in 0..CONTENDERS {
            let own = read_everywhere(&cluster, &format!("{key}/{c}"), index).await;
            if c == winner {
                assert_eq!(own, Some((b"mine".to_vec(), version + 1, won_at)));
            } else {
                assert_eq!(own, None, "round {round}: a losing batch applied in part");
            }
        }
    }
    cluster.shutdown().await;
}

/// Runs the futures concurrently and collects their outputs in order.
async fn futures_join<F: std::future::Future + Send + 'static>(
    futures: impl IntoIterator<Item = F>,
) -> Vec<F::Output>
where
    F::Output: Send + 'static,
{
    let tasks: Vec<_> = futures.into_iter().map(tokio::spawn).collect();
    let mut outputs = Vec::new();
    for task in tasks {
        outputs.push(task.await.expect("task"));
    }
    outputs
}
