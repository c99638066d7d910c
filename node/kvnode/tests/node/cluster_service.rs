//! The Cluster gRPC service on an in-process three-node cluster:
//!
//! - Status on the leader lists all three members with roles, its own row in
//!   full, the followers' matched index and lag, and a committed index that
//!   covers an acknowledged write; on a follower its own row says follower;
//!   MemberList names the three voters with their addresses;
//! - a follower that was down while the leader took a snapshot on request
//!   (TriggerSnapshot with purge_log) and purged its log comes back, catches
//!   up through the snapshot (its log cannot serve it) and serves the data;
//! - AddLearner of a member nobody runs is refused (FAILED_PRECONDITION:
//!   start it first); membership changes are proven in `membership.rs`;
//! - MoveLeader hands leadership to the named voter and loses no
//!   acknowledged write; a follower and a non-voter are refused.

use kvnode::raft::watch::MetricsWatch;
use std::time::{Duration, Instant};

use kvproto::cluster::v1::cluster_client::ClusterClient;
use kvproto::cluster::v1::{
    AddLearnerRequest, MemberListRequest, MoveLeaderRequest, Role, StatusRequest,
    TriggerSnapshotRequest,
};
use kvproto::kv::v1::{Consistency, put_response};
use tonic::transport::Channel;

use crate::cluster::{connect, get, put, rebind, start, start_three, wait_for_leader};

const DEADLINE: Duration = Duration::from_secs(30);
const POLL: Duration = Duration::from_millis(50);

async fn cluster_client(node: &kvnode::Node) -> ClusterClient<Channel> {
    ClusterClient::connect(format!("http://{}", node.client_addr()))
        .await
        .expect("connect")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_members_and_a_triggered_snapshot() {
    let (dirs, mut nodes, addrs, cluster) = start_three().await;
    let leader_id = wait_for_leader(&nodes.iter().collect::<Vec<_>>()).await;
    let leader = nodes.iter().find(|n| n.id() == leader_id).unwrap();
    let mut kv = connect(leader).await;
    let written = kv.put(put("k", "v")).await.unwrap().into_inner();
    let Some(put_response::Outcome::Seq(version)) = written.outcome else {
        panic!("{written:?}");
    };
    let index = version >> 16;

    // The leader's view. Followers' matched index reaches the write soon.
    let mut admin = cluster_client(leader).await;
    let start_wait = Instant::now();
    let status = loop {
        let status = admin.status(StatusRequest {}).await.unwrap().into_inner();
        let caught_up = status
            .members
            .iter()
            .all(|m| m.matched_index.is_some_and(|i| i >= index));
        if caught_up {
            break status;
        }
        assert!(start_wait.elapsed() < DEADLINE, "{status:?}");
        tokio::time::sleep(POLL).await;
    };
    assert_eq!(status.members.len(), 3, "{status:?}");
    assert!(status.committed_index >= index, "{status:?}");
    assert_eq!(status.header.as_ref().unwrap().leader_id, leader_id);
    for row in &status.members {
        let member = row.member.as_ref().unwrap();
        if member.id == leader_id {
            assert!(row.is_self);
            assert_eq!(row.role, Role::Leader as i32);
            assert!(row.applied_index.unwrap() >= index);
            assert!(row.term.unwrap() >= 1);
        } else {
            assert!(!row.is_self);
            assert_eq!(row.role, Role::Follower as i32);
            assert!(row.lag_entries.is_some());
        }
        assert_eq!(member.client_addr, cluster[&member.id].client_addr);
    }
    let follower_at = nodes.iter().position(|n| n.id() != leader_id).unwrap();
    let follower_id = nodes[follower_at].id();
    let mine = cluster_client(&nodes[follower_at])
        .await
        .status(StatusRequest {})
        .await
        .unwrap()
        .into_inner();
    let me = mine.members.iter().find(|m| m.is_self).unwrap();
    assert_eq!(me.member.as_ref().unwrap().id, follower_id);
    assert_eq!(me.role, Role::Follower as i32);
    let list = admin
        .member_list(MemberListRequest {})
        .await
        .unwrap()
        .into_inner();
    let ids: Vec<(u64, bool)> = list.members.iter().map(|m| (m.id, m.voter)).collect();
    assert_eq!(ids, vec![(1, true), (2, true), (3, true)]);
    let later = admin
        .add_learner(AddLearnerRequest {
            id: 4,
            client_addr: "127.0.0.1:1".into(),
            peer_addr: "127.0.0.1:2".into(),
            wait_caught_up: false,
        })
        .await
        .unwrap_err();
    assert_eq!(later.code(), tonic::Code::FailedPrecondition, "{later:?}");
    assert!(
        later.message().contains("start the new member"),
        "{later:?}"
    );

    // A follower goes down; the leader writes on, snapshots and purges.
    let down = nodes.remove(follower_at);
    down.shutdown(Duration::from_secs(5)).await;
    let mut last = 0;
    for i in 0..50 {
        let reply = kv
            .put(put(&format!("key{i:03}"), &format!("value{i}")))
            .await
            .unwrap()
            .into_inner();
        if let Some(put_response::Outcome::Seq(v)) = reply.outcome {
            last = v >> 16;
        }
    }
    let snap = admin
        .trigger_snapshot(TriggerSnapshotRequest { purge_log: true })
        .await
        .unwrap()
        .into_inner();
    assert!(snap.last_log_index >= last, "{snap:?}");
    assert!(!snap.snapshot_id.is_empty());
    // The purge runs in the background once the snapshot is durable.
    let start_purge = Instant::now();
    loop {
        let purged = admin
            .status(StatusRequest {})
            .await
            .unwrap()
            .into_inner()
            .purged_index;
        if purged.is_some_and(|p| p >= last) {
            break;
        }
        assert!(start_purge.elapsed() < DEADLINE, "purged {purged:?}");
        tokio::time::sleep(POLL).await;
    }

    // It comes back on its addresses and catches up by snapshot.
    let pair = rebind(addrs[follower_id as usize - 1]).await;
    let back = start(
        follower_id,
        dirs[follower_id as usize - 1].path(),
        &cluster,
        false,
        pair,
    )
    .await;
    let start_catch_up = Instant::now();
    while back
        .raft()
        .metrics()
        .borrow()
        .last_applied
        .is_none_or(|l| l.index < last)
    {
        assert!(
            start_catch_up.elapsed() < DEADLINE,
            "member {follower_id} did not catch up"
        );
        tokio::time::sleep(POLL).await;
    }
    let mut reader = connect(&back).await;
    let got = reader
        .get(get("key049", Consistency::Stale, last))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(&got.value[..], b"value49");
    let snapshot = back.raft().metrics().borrow().snapshot;
    assert!(
        snapshot.is_some_and(|s| s.index >= last),
        "caught up without the snapshot: {snapshot:?}"
    );
    drop((kv, admin, reader));
    back.shutdown(Duration::from_secs(5)).await;
    for node in nodes {
        node.shutdown(Duration::from_secs(5)).await;
    }
}

/// MoveLeader hands leadership to the named voter: every member names it as
/// leader soon after, no acknowledged write is lost (all read back
/// linearizably on the new leader), a follower refuses (not the leader),
/// and a name that is not a voter is refused naming `id`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn move_leader_hands_leadership_to_the_named_voter_and_loses_no_write() {
    let (_dirs, nodes, _addrs, _cluster) = start_three().await;
    let leader_id = wait_for_leader(&nodes.iter().collect::<Vec<_>>()).await;
    let leader = nodes.iter().find(|n| n.id() == leader_id).unwrap();
    let target = nodes.iter().find(|n| n.id() != leader_id).unwrap().id();
    let mut kv = connect(leader).await;
    let mut acknowledged = Vec::new();
    for i in 0..50 {
        let key = format!("move{i:02}");
        kv.put(put(&key, &format!("v{i}"))).await.unwrap();
        acknowledged.push((key, format!("v{i}")));
    }

    let mut admin = cluster_client(leader).await;
    let refused = admin
        .move_leader(MoveLeaderRequest { id: 9 })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");
    assert!(refused.message().starts_with("id: "), "{refused:?}");
    let follower = nodes.iter().find(|n| n.id() == target).unwrap();
    let not_leader = cluster_client(follower)
        .await
        .move_leader(MoveLeaderRequest { id: target })
        .await
        .unwrap_err();
    assert_eq!(
        not_leader.code(),
        tonic::Code::FailedPrecondition,
        "{not_leader:?}"
    );

    let started = Instant::now();
    let moved = admin
        .move_leader(MoveLeaderRequest { id: target })
        .await
        .unwrap()
        .into_inner();
    let took = started.elapsed();
    assert_eq!(moved.leader_id, target);
    assert_eq!(moved.header.unwrap().member_id, leader_id);
    println!("leadership moved from {leader_id} to {target} in {took:?}");

    // Every member names the target.
    let start_wait = Instant::now();
    while !nodes
        .iter()
        .all(|n| n.raft().metrics().borrow().current_leader == Some(target))
    {
        assert!(
            start_wait.elapsed() < DEADLINE,
            "not every member names {target}"
        );
        tokio::time::sleep(POLL).await;
    }
    // Nothing acknowledged is lost: linearizable reads on the new leader.
    let new_leader = nodes.iter().find(|n| n.id() == target).unwrap();
    let mut reader = connect(new_leader).await;
    for (key, value) in &acknowledged {
        let got = reader
            .get(get(key, Consistency::Linearizable, 0))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(&got.value[..], value.as_bytes(), "{key}");
    }
    // The new leader takes writes.
    reader.put(put("after-move", "yes")).await.unwrap();
    drop((kv, admin, reader));
    for node in nodes {
        node.shutdown(Duration::from_secs(5)).await;
    }
}
