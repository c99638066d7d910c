//! The change history end to end on a three-node in-process cluster over
//! real gRPC: a range at a past revision reads what that revision held on
//! every member; `Kv.Compact` moves the window (a read below it is
//! OUT_OF_RANGE naming the oldest revision served, a compaction at or
//! below it or past the store revision is refused); a member that restarts
//! rebuilds the history from its files, and one that catches up by
//! snapshot install serves the same past revisions as the leader.

use kvnode::StateMachineOptions;
use kvproto::kv::v1::{CompactRequest, Consistency, GetRequest, PutRequest, RangeRequest};
use tonic::Code;

use crate::harness::Cluster;

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
    assert!(reply.outcome.is_some(), "put {key}");
    reply.header.unwrap().revision
}

/// (key, value, mod_revision) of every key at `revision`, read on member
/// `id` once it applied `min_index`; or the refusal.
async fn read_at(
    cluster: &Cluster,
    id: u64,
    revision: u64,
    min_index: u64,
) -> Result<Vec<(String, String, u64)>, tonic::Status> {
    let reply = cluster
        .kv(id)
        .await
        .range(RangeRequest {
            key: b"\0".to_vec().into(),
            range_end: b"\0".to_vec().into(),
            revision,
            consistency: Consistency::Stale as i32,
            min_index,
            ..Default::default()
        })
        .await?
        .into_inner();
    Ok(reply
        .kvs
        .into_iter()
        .map(|kv| {
            (
                String::from_utf8_lossy(&kv.key).into_owned(),
                String::from_utf8_lossy(&kv.value).into_owned(),
                kv.mod_revision,
            )
        })
        .collect())
}

fn kv(key: &str, value: &str, revision: u64) -> (String, String, u64) {
    (key.to_string(), value.to_string(), revision)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_revisions_read_the_same_on_every_member_across_compaction_restart_and_install() {
    let mut cluster = Cluster::start(|_| StateMachineOptions::default()).await;
    let r1 = put(&cluster, "a", "1").await;
    let r2 = put(&cluster, "b", "1").await;
    let r3 = put(&cluster, "a", "2").await;
    let _ = put(&cluster, "b", "2").await;
    let applied = cluster.wait_applied_equal().await;
    for id in cluster.running() {
        assert_eq!(
            read_at(&cluster, id, r1, applied).await.unwrap(),
            vec![kv("a", "1", r1)],
            "member {id} at revision {r1}"
        );
        assert_eq!(
            read_at(&cluster, id, r3, applied).await.unwrap(),
            vec![kv("a", "2", r3), kv("b", "1", r2)],
            "member {id} at revision {r3}"
        );
    }

    // Compaction: through the leader, below it refused, at it served.
    let leader = cluster.leader().await;
    let mut kv_leader = cluster.kv(leader).await;
    kv_leader
        .compact(CompactRequest { revision: r2 })
        .await
        .unwrap();
    for (revision, says) in [(r2, "has been compacted"), (r3 + 100, "future revision")] {
        let refused = kv_leader
            .compact(CompactRequest { revision })
            .await
            .unwrap_err();
        assert_eq!(refused.code(), Code::OutOfRange, "{refused:?}");
        assert!(refused.message().contains(says), "{refused:?}");
    }
    let applied = cluster.wait_applied_equal().await;
    for id in cluster.running() {
        let refused = read_at(&cluster, id, r1, applied).await.unwrap_err();
        assert_eq!(refused.code(), Code::OutOfRange, "member {id}: {refused:?}");
        assert!(
            refused.message().contains("compacted") && refused.message().contains(&r2.to_string()),
            "member {id} names the oldest revision served: {refused:?}"
        );
        assert_eq!(
            read_at(&cluster, id, r2, applied).await.unwrap(),
            vec![kv("a", "1", r1), kv("b", "1", r2)],
            "member {id} at the compact revision"
        );
    }

    // A follower away while the leader snapshots and purges its log comes
    // back by snapshot install; another restarts on its own files.
    let follower = cluster
        .running()
        .into_iter()
        .find(|id| *id != leader)
        .unwrap();
    cluster.stop(follower).await;
    let mut later = Vec::new();
    for i in 0..20 {
        later.push((
            i,
            put(&cluster, &format!("c{}", i % 3), &i.to_string()).await,
        ));
    }
    let applied = cluster.wait_applied_equal().await;
    cluster.snapshot_and_purge(leader, applied).await;
    cluster.restart(follower).await;
    let applied = cluster.wait_applied_equal().await;
    assert!(
        cluster.node(follower).metrics().snapshot_bytes_received() > 0,
        "member {follower} caught up by snapshot install"
    );
    let other = cluster
        .running()
        .into_iter()
        .find(|id| *id != leader && *id != follower)
        .unwrap();
    cluster.stop(other).await;
    cluster.restart(other).await;
    let applied = applied.max(cluster.wait_applied_equal().await);
    let mut revisions = vec![r2, r3];
    revisions.extend(later.iter().map(|(_, revision)| *revision));
    for revision in revisions {
        let expected = read_at(&cluster, leader, revision, applied).await.unwrap();
        for id in [follower, other] {
            assert_eq!(
                read_at(&cluster, id, revision, applied).await.unwrap(),
                expected,
                "member {id} at revision {revision}"
            );
        }
    }
    cluster.shutdown().await;
}

/// The value of "x" at `revision` through the change history, read on the
/// leader.
async fn value_at(cluster: &Cluster, leader: u64, revision: u64) -> Option<Vec<u8>> {
    let reply = cluster
        .kv(leader)
        .await
        .range(RangeRequest {
            key: b"x".to_vec().into(),
            revision,
            consistency: Consistency::Stale as i32,
            ..Default::default()
        })
        .await
        .unwrap_or_else(|err| panic!("range at {revision}: {err:?}"))
        .into_inner();
    reply.kvs.first().map(|kv| kv.value.to_vec())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_header_names_exactly_the_revision_it_read_while_writes_go_on() {
    let cluster = Cluster::start(|_| StateMachineOptions::default()).await;
    let leader = cluster.leader().await;
    put(&cluster, "x", "0").await;
    // Writes of "x" go on while reads check their header against history.
    let writer = {
        let mut kv = cluster.kv(leader).await;
        tokio::spawn(async move {
            // A write refused (a leader change on a loaded machine) is
            // skipped: the reads check whatever the history holds.
            for i in 1..=WRITES {
                let _ = kv
                    .put(PutRequest {
                        key: b"x".to_vec().into(),
                        value: i.to_string().into_bytes().into(),
                        ..Default::default()
                    })
                    .await;
            }
        })
    };
    let mut kv = cluster.kv(leader).await;
    let mut checked = 0;
    while !writer.is_finished() && checked < WRITES {
        // Stale reads on the leader: served locally, so a leader change
        // cannot refuse them.
        let got = kv
            .get(GetRequest {
                key: b"x".to_vec().into(),
                consistency: Consistency::Stale as i32,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        let revision = got.header.unwrap().revision;
        assert_eq!(
            value_at(&cluster, leader, revision).await,
            Some(got.value.to_vec()),
            "a get's header revision {revision} is the state it read"
        );
        let ranged = kv
            .range(RangeRequest {
                key: b"x".to_vec().into(),
                consistency: Consistency::Stale as i32,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        let revision = ranged.header.unwrap().revision;
        assert_eq!(
            value_at(&cluster, leader, revision).await,
            ranged.kvs.first().map(|kv| kv.value.to_vec()),
            "a range's header revision {revision} is the state it read"
        );
        checked += 1;
    }
    writer.await.unwrap();
    assert!(checked > 0, "no read ran while the writes went on");
    cluster.shutdown().await;
}

/// Writes of the exact-header test.
const WRITES: u64 = 300;
