//! Faults injected through the nodes' test hooks (`kvnode::Faults`), on an
//! in-process three-node cluster over real gRPC:
//!
//! - a write whose reply is lost after it committed and applied (the leader
//!   drops the reply), then the leader stops: the client's retry with the
//!   same session sequence to the new leader returns the ORIGINAL version
//!   (the entry written before the leader stopped) and the write is applied
//!   once;
//! - a follower cut off from both other members answers linearizable reads
//!   with UNAVAILABLE — at once, and still after its election timeouts
//!   passed — never with its stale value, while stale reads still answer;
//!   once the links are back it serves the writes made meanwhile;
//! - with pre-vote, a follower cut off for several election timeouts does
//!   not raise its term (its pre-votes are refused or unanswered), and when
//!   it rejoins, the leader and every member's term are as before.

use std::time::{Duration, Instant};

use kvnode::raft::watch::MetricsWatch;
use kvnode::{Faults, Node};
use kvproto::kv::v1::{Consistency, PutRequest, Session, put_response};

use crate::cluster::{connect, get, put, three_node_layout, try_start, wait_for_leader};

const DEADLINE: Duration = Duration::from_secs(30);
const POLL: Duration = Duration::from_millis(50);

/// Starts members 1..=3 (member 1 bootstraps), each with its own faults.
async fn three_nodes() -> (Vec<tempfile::TempDir>, Vec<Node>, Vec<Faults>) {
    three_nodes_evicting_after(None).await
}

/// [`three_nodes`] whose sessions are evicted after `session_idle_ms` of
/// idle cluster time (`None`: the default window).
async fn three_nodes_evicting_after(
    session_idle_ms: Option<u64>,
) -> (Vec<tempfile::TempDir>, Vec<Node>, Vec<Faults>) {
    let (dirs, pairs, cluster) = three_node_layout().await;
    let mut nodes = Vec::new();
    let mut faults = Vec::new();
    for (i, pair) in pairs.into_iter().enumerate() {
        let id = i as u64 + 1;
        let hooks = Faults::default();
        let set = hooks.clone();
        let node = try_start(id, dirs[i].path(), &cluster, id == 1, pair, |config| {
            config.faults = set;
            config.state_machine.session_idle_ms = session_idle_ms;
        })
        .await
        .expect("start node");
        nodes.push(node);
        faults.push(hooks);
    }
    (dirs, nodes, faults)
}

/// Session idle window of the eviction test (cluster time, ms).
const SHORT_SESSION_IDLE_MS: u64 = 1_500;

/// A write whose reply was lost is retried after its session was evicted
/// (the client was idle longer than the window): the retry is answered
/// ABORTED with a `SessionExpired` detail (outcome unknown) and is NOT
/// applied a second time, although it does not carry an "opens" flag that
/// would let it start a new session. Fails with `nc-unknown-sessions`
/// (the retry opens a fresh session and applies again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_after_its_session_was_evicted_is_refused_not_applied_again() {
    let (_dirs, nodes, faults) = three_nodes_evicting_after(Some(SHORT_SESSION_IDLE_MS)).await;
    let leader_id = wait_for_leader(&nodes.iter().collect::<Vec<_>>()).await;
    let at = nodes.iter().position(|n| n.id() == leader_id).unwrap();
    let leader = &nodes[at];
    let mut client = connect(leader).await;
    let session = |sequence, opens| {
        Some(Session {
            client_id: 777,
            sequence,
            lowest_unacked_sequence: sequence,
            opens,
        })
    };
    // The session opens with an answered write.
    client
        .put(PutRequest {
            session: session(1, true),
            ..put("counter", "opened")
        })
        .await
        .unwrap();
    // The next write applies, but its reply is lost.
    let write = PutRequest {
        session: session(2, false),
        ..put("counter", "once")
    };
    faults[at].set_drop_write_replies(true);
    let lost = client.put(write.clone()).await.unwrap_err();
    assert_eq!(lost.code(), tonic::Code::Unavailable, "{lost:?}");
    faults[at].set_drop_write_replies(false);
    let lost_at_ms = leader.state_machine().cluster_time_ms();
    let applied_at_loss = leader.raft().metrics().borrow().last_applied.unwrap().index;
    // Another client overwrites the key, then writes (no session) until
    // cluster time is past the window: the idle session is evicted.
    let overwritten = version_of(
        &client
            .put(put("counter", "other"))
            .await
            .unwrap()
            .into_inner(),
    );
    let start = Instant::now();
    while leader.state_machine().cluster_time_ms() <= lost_at_ms + SHORT_SESSION_IDLE_MS {
        assert!(start.elapsed() < DEADLINE, "cluster time did not advance");
        client.put(put("clock", "tick")).await.unwrap();
        tokio::time::sleep(POLL).await;
    }
    // The retry arrives now.
    let retried = client.put(write).await;
    let status = match retried {
        Ok(reply) => panic!(
            "the retry after its session was evicted applied again: {:?} (entry {} > {applied_at_loss})",
            reply.get_ref().outcome,
            version_of(reply.get_ref()) >> 16
        ),
        Err(status) => status,
    };
    assert_eq!(status.code(), tonic::Code::Aborted, "{status:?}");
    assert!(
        matches!(
            kvnode::server::convert::detail_of(&status).and_then(|d| d.detail),
            Some(kvproto::kv::v1::error_detail::Detail::SessionExpired(_))
        ),
        "{status:?}"
    );
    let got = client
        .get(get("counter", Consistency::Linearizable, 0))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (&got.value[..], got.seq),
        (&b"other"[..], overwritten),
        "the key keeps the later write"
    );
    for node in nodes {
        node.shutdown(Duration::from_secs(5)).await;
    }
}

/// Cuts member `at` off from everyone, in both directions.
fn isolate(nodes: &[Node], faults: &[Faults], at: usize) {
    let cut_off = nodes[at].id();
    for (i, hooks) in faults.iter().enumerate() {
        if i == at {
            hooks.set_cut_peers(nodes.iter().map(|n| n.id()).filter(|id| *id != cut_off));
        } else {
            hooks.set_cut_peers([cut_off]);
        }
    }
}

fn version_of(reply: &kvproto::kv::v1::PutResponse) -> u64 {
    match reply.outcome {
        Some(put_response::Outcome::Seq(version)) => version,
        ref other => panic!("put outcome: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_reply_retried_to_the_new_leader_applies_once() {
    let (_dirs, mut nodes, faults) = three_nodes().await;
    let leader_id = wait_for_leader(&nodes.iter().collect::<Vec<_>>()).await;
    let leader_at = nodes.iter().position(|n| n.id() == leader_id).unwrap();
    let mut client = connect(&nodes[leader_at]).await;
    client.put(put("other", "x")).await.unwrap();

    let write = PutRequest {
        session: Some(Session {
            client_id: 4242,
            sequence: 1,
            lowest_unacked_sequence: 1,
            opens: true,
        }),
        ..put("once", "v1")
    };
    faults[leader_at].set_drop_write_replies(true);
    let lost = client.put(write.clone()).await.unwrap_err();
    assert_eq!(lost.code(), tonic::Code::Unavailable, "{lost:?}");
    // The entry committed and applied before the reply was dropped. (Its
    // index is not compared with the old leader's `last_applied` metric:
    // metrics may lag the state machine's answer on a loaded machine; the
    // key's version below tells one application from two.)
    let old_leader = nodes.remove(leader_at);
    old_leader.shutdown(Duration::from_secs(5)).await;

    // The survivors still name the old leader until their election timeout.
    let start = Instant::now();
    let new_leader = loop {
        let leader = wait_for_leader(&nodes.iter().collect::<Vec<_>>()).await;
        if leader != leader_id {
            break leader;
        }
        assert!(start.elapsed() < DEADLINE, "no new leader");
        tokio::time::sleep(POLL).await;
    };
    let mut client = connect(nodes.iter().find(|n| n.id() == new_leader).unwrap()).await;
    // The retry may meet the new leader before it has applied its first
    // entry; retry on errors until a deadline.
    let start = Instant::now();
    let retried = loop {
        match client.put(write.clone()).await {
            Ok(reply) => break reply.into_inner(),
            Err(status) => {
                assert!(start.elapsed() < DEADLINE, "retry kept failing: {status:?}");
                tokio::time::sleep(POLL).await;
            }
        }
    };
    let version = version_of(&retried);
    let got = client
        .get(get("once", Consistency::Linearizable, 0))
        .await
        .unwrap()
        .into_inner();
    assert!(got.found);
    assert_eq!(got.seq, version, "the stored version is the original");
    // Applied once: the key was created and never changed again (a second
    // application would make it version 2 at a later revision).
    assert_eq!(
        (got.version, got.create_revision),
        (1, got.mod_revision),
        "the retry was applied again: {got:?}"
    );

    // A new write of the same client goes on normally.
    let next = client
        .put(PutRequest {
            session: Some(Session {
                client_id: 4242,
                sequence: 2,
                lowest_unacked_sequence: 2,
                opens: false,
            }),
            ..put("once", "v2")
        })
        .await
        .unwrap()
        .into_inner();
    assert!(version_of(&next) > version);
    drop(client);
    for node in nodes {
        node.shutdown(Duration::from_secs(5)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_off_follower_answers_linearizable_reads_with_unavailable() {
    let (_dirs, nodes, faults) = three_nodes().await;
    let leader_id = wait_for_leader(&nodes.iter().collect::<Vec<_>>()).await;
    let leader = nodes.iter().find(|n| n.id() == leader_id).unwrap();
    let follower_at = nodes.iter().position(|n| n.id() != leader_id).unwrap();
    let mut writer = connect(leader).await;
    let first = version_of(&writer.put(put("k", "before")).await.unwrap().into_inner());
    let mut reader = connect(&nodes[follower_at]).await;
    let got = reader
        .get(get("k", Consistency::Stale, first >> 16))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(&got.value[..], b"before");

    // Cut the follower off from everyone, in both directions.
    isolate(&nodes, &faults, follower_at);
    let second = version_of(&writer.put(put("k", "during")).await.unwrap().into_inner());
    let refused = reader
        .get(get("k", Consistency::Linearizable, 0))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unavailable, "{refused:?}");
    // Stale reads still answer, from the follower's own (old) state.
    let stale = reader
        .get(get("k", Consistency::Stale, 0))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(&stale.value[..], b"before");
    // After its election timeouts (max 3 s) it has no leader: still
    // UNAVAILABLE, never the stale value.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let refused = reader
        .get(get("k", Consistency::Linearizable, 0))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unavailable, "{refused:?}");

    // Heal: the follower rejoins and its linearizable reads see the write
    // made while it was cut off.
    for hooks in &faults {
        hooks.set_cut_peers([]);
    }
    let start = Instant::now();
    loop {
        match reader.get(get("k", Consistency::Linearizable, 0)).await {
            Ok(reply) => {
                let reply = reply.into_inner();
                assert_eq!(&reply.value[..], b"during");
                assert!(reply.seq >= second);
                break;
            }
            Err(status) => {
                assert!(
                    start.elapsed() < DEADLINE,
                    "the healed follower kept refusing: {status:?}"
                );
                tokio::time::sleep(POLL).await;
            }
        }
    }
    drop((writer, reader));
    for node in nodes {
        node.shutdown(Duration::from_secs(5)).await;
    }
}

/// Pre-vote: a follower cut off for 4 × the largest election timeout keeps
/// its term (a candidate asks "would you vote for me?" before it raises its
/// term, and nobody answers yes), and after it rejoins the leader is the
/// same member in the same term. Without pre-vote (openraft's default) the
/// cut-off member would campaign in ever higher terms and, on rejoining,
/// force an election.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_isolated_follower_rejoins_without_raising_the_term() {
    let (_dirs, nodes, faults) = three_nodes().await;
    let leader_id = wait_for_leader(&nodes.iter().collect::<Vec<_>>()).await;
    let leader = nodes.iter().find(|n| n.id() == leader_id).unwrap();
    let follower_at = nodes.iter().position(|n| n.id() != leader_id).unwrap();
    let mut writer = connect(leader).await;
    writer.put(put("k", "before")).await.unwrap();
    let term = leader.raft().metrics().borrow().current_term;
    assert_eq!(
        nodes[follower_at].raft().metrics().borrow().current_term,
        term
    );

    isolate(&nodes, &faults, follower_at);
    let cut_for = Duration::from_millis(4 * kvnode::node::ELECTION_TIMEOUT_MAX_MS);
    tokio::time::sleep(cut_for).await;
    let isolated_term = nodes[follower_at].raft().metrics().borrow().current_term;
    assert_eq!(
        isolated_term, term,
        "the cut-off member raised its term while isolated for {cut_for:?}"
    );
    for hooks in &faults {
        hooks.set_cut_peers([]);
    }
    // It catches up with a write made after the heal, under the same leader.
    let after = version_of(&writer.put(put("k", "after")).await.unwrap().into_inner());
    let start = Instant::now();
    while nodes[follower_at]
        .raft()
        .metrics()
        .borrow()
        .last_applied
        .is_none_or(|applied| applied.index < after >> 16)
    {
        assert!(
            start.elapsed() < DEADLINE,
            "the rejoined member did not catch up"
        );
        tokio::time::sleep(POLL).await;
    }
    for node in &nodes {
        let metrics = node.raft().metrics().borrow().clone();
        assert_eq!(
            (metrics.current_leader, metrics.current_term),
            (Some(leader_id), term),
            "member {} after the rejoin",
            node.id()
        );
    }
    drop(writer);
    for node in nodes {
        node.shutdown(Duration::from_secs(5)).await;
    }
}
