//! Node identity (DESIGN §3): cluster id, incarnations, refusals.
//!
//! - Forged peer requests against a running member: a wrong member id, an
//!   earlier incarnation of the member, another cluster's id, and a known
//!   peer presenting a new incarnation are each refused with
//!   FAILED_PRECONDITION naming the mismatch; `Identify` answers anyone with
//!   the cluster id (the one client replies carry), member id and a non-zero
//!   incarnation.
//! - A data directory of another cluster refuses to start as a member of
//!   this one (its peers report another cluster id), and a directory made
//!   for member 2 refuses to start as member 3.
//! - A bootstrapping member whose directory was wiped does not initialize a
//!   second cluster when it starts again with `--bootstrap`.
//! - A member whose data directory was wiped and who comes back under its
//!   old id is refused by its peers: it never receives the cluster's data.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use kvnode::node::StartError;
use kvnode::raft::watch::MetricsWatch;
use kvproto::kv::v1::Consistency;
use kvproto::raft::v1::raft_client::RaftClient;
use kvproto::raft::v1::{AppendEntriesRequest, IdentifyRequest, Identity};

use crate::cluster::{
    connect, get, info, listeners, put, rebind, start, start_three, three_node_layout, try_start,
    wait_for_leader,
};

const DEADLINE: Duration = Duration::from_secs(30);
const POLL: Duration = Duration::from_millis(50);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_peer_requests_are_refused_with_the_mismatch_named() {
    let dir = tempfile::tempdir().unwrap();
    let pair = listeners().await;
    let cluster = BTreeMap::from([(1, info(&pair.0, &pair.1))]);
    let node = start(1, dir.path(), &cluster, true, pair).await;
    wait_for_leader(&[&node]).await;
    let header = connect(&node)
        .await
        .put(put("k", "v"))
        .await
        .unwrap()
        .into_inner()
        .header
        .unwrap();
    assert_ne!(header.cluster_id, 0, "the bootstrapped cluster has an id");

    let mut peer = RaftClient::connect(format!("http://{}", node.peer_addr()))
        .await
        .unwrap();
    let who = peer
        .identify(IdentifyRequest { identity: None })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (who.cluster_id, who.member_id),
        (header.cluster_id, 1),
        "Identify"
    );
    assert_ne!(who.incarnation, 0);

    let mut send = async |identity: Identity| {
        peer.append_entries(AppendEntriesRequest {
            identity: Some(identity),
            payload: b"not a payload".to_vec().into(),
        })
        .await
        .unwrap_err()
    };
    let good = Identity {
        cluster_id: who.cluster_id,
        from_id: 7,
        from_incarnation: 0x77,
        to_id: 1,
        to_incarnation: who.incarnation,
        protocol_version: kvproto::PEER_PROTOCOL_VERSION,
    };
    // Identity accepted: the refusal is about the payload.
    let passed = send(good).await;
    assert_eq!(passed.code(), tonic::Code::InvalidArgument, "{passed:?}");
    let cases = [
        (
            Identity { to_id: 2, ..good },
            "member id mismatch".to_string(),
        ),
        (
            Identity {
                to_incarnation: who.incarnation ^ 1,
                ..good
            },
            "incarnation mismatch".to_string(),
        ),
        (
            Identity {
                cluster_id: who.cluster_id ^ 1,
                ..good
            },
            "cluster id mismatch".to_string(),
        ),
        (
            Identity {
                from_incarnation: 0x78,
                ..good
            },
            "presented incarnation".to_string(),
        ),
        // A build before the field (0 = protocol 1, openraft 0.9) and a
        // newer one: both refused, the message naming both versions.
        (
            Identity {
                protocol_version: 0,
                ..good
            },
            format!(
                "speaks peer protocol 1, this member speaks {}",
                kvproto::PEER_PROTOCOL_VERSION
            ),
        ),
        (
            Identity {
                protocol_version: kvproto::PEER_PROTOCOL_VERSION + 1,
                ..good
            },
            format!(
                "speaks peer protocol {}, this member speaks {}",
                kvproto::PEER_PROTOCOL_VERSION + 1,
                kvproto::PEER_PROTOCOL_VERSION
            ),
        ),
    ];
    for (identity, named) in cases {
        let refused = send(identity).await;
        assert_eq!(
            refused.code(),
            tonic::Code::FailedPrecondition,
            "{identity:?}: {refused:?}"
        );
        assert!(
            refused.message().contains(named.as_str()),
            "{identity:?}: {refused:?}"
        );
    }
    node.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_and_misnamed_data_directories_refuse_to_start() {
    let (dirs, pairs, cluster) = three_node_layout().await;
    let mut pairs = pairs.into_iter();
    let mut nodes = Vec::new();
    for id in 1..=2u64 {
        let pair = pairs.next().unwrap();
        nodes.push(start(id, dirs[id as usize - 1].path(), &cluster, id == 1, pair).await);
    }
    let third = pairs.next().unwrap();
    let third_addrs = (third.0.local_addr().unwrap(), third.1.local_addr().unwrap());
    nodes.push(start(3, dirs[2].path(), &cluster, false, third).await);
    let leader = wait_for_leader(&nodes.iter().collect::<Vec<_>>()).await;
    connect(nodes.iter().find(|n| n.id() == leader).unwrap())
        .await
        .put(put("k", "v"))
        .await
        .unwrap();
    // Member 3 stops; a one-member cluster of its own is made as "member 3"
    // in another directory.
    let member3 = nodes.pop().unwrap();
    member3.shutdown(Duration::from_secs(5)).await;
    let foreign = tempfile::tempdir().unwrap();
    let pair = listeners().await;
    let alone = BTreeMap::from([(3, info(&pair.0, &pair.1))]);
    let other = start(3, foreign.path(), &alone, true, pair).await;
    wait_for_leader(&[&other]).await;
    other.shutdown(Duration::from_secs(5)).await;

    // That directory, started as member 3 of the first cluster, refuses.
    let refused = try_start(
        3,
        foreign.path(),
        &cluster,
        false,
        rebind(third_addrs).await,
        |_| {},
    )
    .await
    .unwrap_err();
    assert!(
        matches!(refused, StartError::ForeignCluster { .. }),
        "{refused}"
    );
    assert!(
        refused.to_string().contains("refusing to start"),
        "{refused}"
    );
    // Member 2's directory started as member 3: refused before anything.
    let misnamed = try_start(
        3,
        dirs[1].path(),
        &cluster,
        false,
        rebind(third_addrs).await,
        |_| {},
    )
    .await
    .unwrap_err();
    assert!(
        misnamed.to_string().contains("belongs to member 2"),
        "{misnamed}"
    );
    for node in nodes {
        node.shutdown(Duration::from_secs(5)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wiped_member_cannot_rejoin_under_its_old_id() {
    let (dirs, mut nodes, addrs, cluster) = start_three().await;
    // Every member learns every other member's incarnation.
    let leader = wait_for_leader(&nodes.iter().collect::<Vec<_>>()).await;
    let victim_id = (1..=3u64).find(|id| *id != leader).unwrap();
    let mut writer = connect(nodes.iter().find(|n| n.id() == leader).unwrap()).await;
    writer.put(put("before", "v")).await.unwrap();
    let start_wait = Instant::now();
    let mut peer = RaftClient::connect(format!("http://{}", addrs[victim_id as usize - 1].1))
        .await
        .unwrap();
    let victim_incarnation = peer
        .identify(IdentifyRequest { identity: None })
        .await
        .unwrap()
        .into_inner()
        .incarnation;
    drop(peer);
    // Wait until the leader knows the victim's incarnation (learned at
    // startup or within a second after).
    let leader_dir = dirs[leader as usize - 1].path().join("IDENTITY");
    let needle = format!("peer.{victim_id}={victim_incarnation:016x}");
    while !std::fs::read_to_string(&leader_dir)
        .unwrap()
        .contains(&needle)
    {
        assert!(
            start_wait.elapsed() < DEADLINE,
            "the leader never recorded member {victim_id}'s incarnation"
        );
        tokio::time::sleep(POLL).await;
    }

    let at = nodes.iter().position(|n| n.id() == victim_id).unwrap();
    nodes.remove(at).shutdown(Duration::from_secs(5)).await;
    let wiped = tempfile::tempdir().unwrap();
    let pair = rebind(addrs[victim_id as usize - 1]).await;
    let comeback = start(victim_id, wiped.path(), &cluster, false, pair).await;
    // The cluster goes on writing; the wiped member gets none of it.
    for i in 0..5 {
        writer.put(put(&format!("after{i}"), "v")).await.unwrap();
    }
    let leader_applied = nodes
        .iter()
        .find(|n| n.id() == leader)
        .unwrap()
        .raft()
        .metrics()
        .borrow()
        .last_applied
        .unwrap()
        .index;
    // Give replication ample time (a healthy follower catches up in
    // milliseconds), then check the wiped member has nothing.
    let watch_until = Instant::now() + Duration::from_secs(4);
    while Instant::now() < watch_until {
        let applied = comeback
            .raft()
            .metrics()
            .borrow()
            .last_applied
            .map(|l| l.index)
            .unwrap_or(0);
        assert_eq!(
            applied, 0,
            "the wiped member {victim_id} was fed the log up to {applied} (leader at {leader_applied})"
        );
        tokio::time::sleep(POLL).await;
    }
    let stale = connect(&comeback)
        .await
        .get(get("before", Consistency::Stale, 0))
        .await
        .unwrap()
        .into_inner();
    assert!(!stale.found);
    comeback.shutdown(Duration::from_secs(5)).await;
    drop(writer);
    for node in nodes {
        node.shutdown(Duration::from_secs(5)).await;
    }
}

/// The bootstrapping member's directory is wiped and it starts again with
/// `--bootstrap`: its peers report the existing cluster, so it does not
/// initialize a second one (its log stays empty), and the cluster goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wiped_bootstrap_member_does_not_bootstrap_again() {
    let (_dirs, mut nodes, addrs, cluster) = start_three().await;
    wait_for_leader(&nodes.iter().collect::<Vec<_>>()).await;
    nodes.remove(0).shutdown(Duration::from_secs(5)).await;
    let wiped = tempfile::tempdir().unwrap();
    let again = start(1, wiped.path(), &cluster, true, rebind(addrs[0]).await).await;
    assert!(
        !again.raft().is_initialized().await.unwrap(),
        "the wiped bootstrap member initialized a second cluster"
    );
    assert_eq!(again.raft().metrics().borrow().last_log_index, None);
    // The other two still elect a leader among themselves and take writes.
    let start_wait = Instant::now();
    loop {
        let leader = wait_for_leader(&nodes.iter().collect::<Vec<_>>()).await;
        if leader != 1 {
            let node = nodes.iter().find(|n| n.id() == leader).unwrap();
            connect(node).await.put(put("after", "v")).await.unwrap();
            break;
        }
        assert!(start_wait.elapsed() < DEADLINE, "no new leader");
        tokio::time::sleep(POLL).await;
    }
    again.shutdown(Duration::from_secs(5)).await;
    for node in nodes {
        node.shutdown(Duration::from_secs(5)).await;
    }
}
