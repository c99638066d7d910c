//! Leases end to end on a three-node in-process cluster over real gRPC
//! (ARCHITECTURE.md, "Leases"): a revoke deletes every attached key at one
//! revision, and a watcher gets them in one message; keep-alives hold a
//! lease across a leader change and it expires once they stop (never
//! early, never immortal); a new leader renews every lease; renewals
//! arriving together share Raft entries; a restart and a snapshot install
//! keep the leases and their keys.

use std::time::{Duration, Instant};

use kvproto::kv::v1::{
    EventType, LeaseGrantRequest, LeaseKeepAliveRequest, LeaseKeepAliveResponse,
    LeaseLeasesRequest, LeaseRevokeRequest, LeaseTimeToLiveRequest, RangeRequest, TxnOp, TxnPut,
    TxnRequest, WatchCreateRequest, WatchRequest, kv_client::KvClient, txn_op, watch_request,
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;
use tonic::{Code, Streaming};

use crate::harness::{Cluster, DEADLINE, POLL};

async fn grant(cluster: &Cluster, id: u64, ttl_ms: u64) -> u64 {
    cluster
        .write("grant", |mut kv| async move {
            kv.lease_grant(LeaseGrantRequest {
                session: None,
                ttl_ms,
                id,
            })
            .await
        })
        .await
        .id
}

async fn revoke(cluster: &Cluster, id: u64) -> kvproto::kv::v1::LeaseRevokeResponse {
    cluster
        .write("revoke", |mut kv| async move {
            kv.lease_revoke(LeaseRevokeRequest { session: None, id })
                .await
        })
        .await
}

fn put_with_lease(key: &str, lease: u64) -> TxnRequest {
    TxnRequest {
        success: vec![TxnOp {
            op: Some(txn_op::Op::Put(TxnPut {
                key: key.as_bytes().to_vec().into(),
                value: b"v".to_vec().into(),
                lease,
                ..Default::default()
            })),
        }],
        ..Default::default()
    }
}

async fn attach(cluster: &Cluster, key: &str, lease: u64) -> u64 {
    let reply = cluster
        .write("put with lease", |mut kv| async move {
            kv.txn(put_with_lease(key, lease)).await
        })
        .await;
    reply.header.unwrap().revision
}

/// Keys with `prefix` on member `id` (linearizable).
async fn keys(kv: &mut KvClient<Channel>, prefix: &str) -> Vec<String> {
    let mut end = prefix.as_bytes().to_vec();
    *end.last_mut().unwrap() += 1;
    kv.range(RangeRequest {
        key: prefix.as_bytes().to_vec().into(),
        range_end: end.into(),
        keys_only: true,
        ..Default::default()
    })
    .await
    .expect("range")
    .into_inner()
    .kvs
    .into_iter()
    .map(|kv| String::from_utf8(kv.key.to_vec()).unwrap())
    .collect()
}

/// A keep-alive stream on one member and its request sender.
struct KeepAlive {
    requests: mpsc::Sender<LeaseKeepAliveRequest>,
    responses: Streaming<LeaseKeepAliveResponse>,
}

impl KeepAlive {
    async fn open(mut kv: KvClient<Channel>) -> Result<KeepAlive, tonic::Status> {
        let (requests, stream) = mpsc::channel(1024);
        let responses = kv
            .lease_keep_alive(ReceiverStream::new(stream))
            .await?
            .into_inner();
        Ok(KeepAlive {
            requests,
            responses,
        })
    }

    /// Renews `id`: its TTL, or the stream's error.
    async fn once(&mut self, id: u64) -> Result<u64, tonic::Status> {
        self.requests
            .send(LeaseKeepAliveRequest { id })
            .await
            .map_err(|_| tonic::Status::unavailable("stream closed"))?;
        match tokio::time::timeout(DEADLINE, self.responses.message()).await {
            Ok(Ok(Some(response))) => {
                assert_eq!(response.id, id, "answers come in the order of requests");
                Ok(response.ttl_ms)
            }
            Ok(Ok(None)) => Err(tonic::Status::unavailable("stream ended")),
            Ok(Err(status)) => Err(status),
            Err(_) => panic!("no keep-alive answer in time"),
        }
    }
}

/// Renews `id` on whoever leads, re-opening the stream on the leader
/// after an error. Returns the TTL and when the acknowledged request was sent.
async fn keep_alive(cluster: &Cluster, stream: &mut Option<KeepAlive>, id: u64) -> (u64, Instant) {
    let start = Instant::now();
    loop {
        assert!(
            start.elapsed() < DEADLINE,
            "no keep-alive acknowledged in time"
        );
        if stream.is_none() {
            let leader = cluster.leader().await;
            match KeepAlive::open(cluster.kv(leader).await).await {
                Ok(opened) => *stream = Some(opened),
                Err(_) => {
                    tokio::time::sleep(POLL).await;
                    continue;
                }
            }
        }
        let sent = Instant::now();
        match stream.as_mut().unwrap().once(id).await {
            Ok(ttl_ms) => return (ttl_ms, sent),
            Err(_) => {
                *stream = None;
                tokio::time::sleep(POLL).await;
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoke_deletes_every_key_at_one_revision_and_a_watcher_sees_them_together() {
    let cluster = Cluster::start(|_| Default::default()).await;
    let lease = grant(&cluster, 0, 60_000).await;
    assert!(lease > 0 && lease <= kvproto::LEASE_ID_MAX);
    for key in ["job/a", "job/b", "job/c"] {
        attach(&cluster, key, lease).await;
    }
    let mut kv = cluster.kv(cluster.leader().await).await;
    let ttl = kv
        .lease_time_to_live(LeaseTimeToLiveRequest {
            id: lease,
            keys: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(ttl.granted_ttl_ms, 60_000);
    assert!(ttl.ttl_ms > 50_000 && ttl.ttl_ms <= 60_000, "{ttl:?}");
    let attached: Vec<&[u8]> = ttl.keys.iter().map(|k| k.as_ref()).collect();
    assert_eq!(attached, [&b"job/a"[..], b"job/b", b"job/c"]);

    // A watcher on a follower.
    let first_leader = cluster.leader().await;
    let follower = cluster
        .running()
        .into_iter()
        .find(|id| *id != first_leader)
        .unwrap();
    let (watch_requests, stream) = mpsc::channel(4);
    watch_requests
        .send(WatchRequest {
            request: Some(watch_request::Request::Create(WatchCreateRequest {
                key: b"job/".to_vec().into(),
                range_end: b"job0".to_vec().into(),
                ..Default::default()
            })),
        })
        .await
        .unwrap();
    let mut watch = cluster
        .kv(follower)
        .await
        .watch(ReceiverStream::new(stream))
        .await
        .unwrap()
        .into_inner();
    let created = watch.message().await.unwrap().unwrap();
    assert!(created.created);

    let revoked = revoke(&cluster, lease).await;
    assert_eq!(revoked.deleted, 3);
    let revision = revoked.header.unwrap().revision;
    let message = tokio::time::timeout(DEADLINE, watch.message())
        .await
        .expect("events in time")
        .unwrap()
        .unwrap();
    let events: Vec<(i32, Vec<u8>, u64)> = message
        .events
        .iter()
        .map(|e| {
            let kv = e.kv.as_ref().unwrap();
            (e.r#type, kv.key.to_vec(), kv.mod_revision)
        })
        .collect();
    let delete = EventType::Delete as i32;
    assert_eq!(
        events,
        [
            (delete, b"job/a".to_vec(), revision),
            (delete, b"job/b".to_vec(), revision),
            (delete, b"job/c".to_vec(), revision),
        ],
        "one message, one revision, every key"
    );
    assert!(keys(&mut kv, "job/").await.is_empty());

    // Gone: time-to-live says -1, a second revoke and a put naming it are
    // NOT_FOUND, and nothing is listed.
    let ttl = kv
        .lease_time_to_live(LeaseTimeToLiveRequest {
            id: lease,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((ttl.ttl_ms, ttl.granted_ttl_ms), (-1, 0));
    let leader = cluster.leader().await;
    let mut on_leader = cluster.kv(leader).await;
    let again = on_leader
        .lease_revoke(LeaseRevokeRequest {
            session: None,
            id: lease,
        })
        .await
        .unwrap_err();
    assert_eq!(again.code(), Code::NotFound, "{again:?}");
    assert!(
        again
            .message()
            .starts_with("etcdserver: requested lease not found")
    );
    let refused = on_leader
        .txn(put_with_lease("job/d", lease))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::NotFound, "{refused:?}");
    assert!(keys(&mut kv, "job/").await.is_empty());

    // An id of one's own; taken twice is ALREADY_EXISTS; a TTL below the
    // minimum is raised to it.
    let mine = on_leader
        .lease_grant(LeaseGrantRequest {
            session: None,
            ttl_ms: 10,
            id: 0x1234,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((mine.id, mine.ttl_ms), (0x1234, kvproto::LEASE_TTL_MS_MIN));
    let taken = on_leader
        .lease_grant(LeaseGrantRequest {
            session: None,
            ttl_ms: 10_000,
            id: 0x1234,
        })
        .await
        .unwrap_err();
    assert_eq!(taken.code(), Code::AlreadyExists, "{taken:?}");
    let too_long = on_leader
        .lease_grant(LeaseGrantRequest {
            session: None,
            ttl_ms: kvproto::LEASE_TTL_MS_MAX + 1,
            id: 0,
        })
        .await
        .unwrap_err();
    assert_eq!(too_long.code(), Code::InvalidArgument);
    assert!(
        too_long.message().contains("LEASE_TTL_MS_MAX"),
        "{too_long:?}"
    );
    let listed = kv
        .lease_leases(LeaseLeasesRequest::default())
        .await
        .unwrap()
        .into_inner();
    let ids: Vec<u64> = listed.leases.iter().map(|l| l.id).collect();
    assert_eq!(ids, [0x1234]);
    // A keep-alive stream on a follower is refused with NotLeader.
    let follower = cluster
        .running()
        .into_iter()
        .find(|id| *id != leader)
        .unwrap();
    let refused = KeepAlive::open(cluster.kv(follower).await).await;
    let status = refused.err().expect("a follower refuses keep-alives");
    assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_alives_hold_a_lease_across_a_leader_change_and_it_expires_once_they_stop() {
    const TTL_MS: u64 = 3_000;
    let mut cluster = Cluster::start(|_| Default::default()).await;
    let lease = grant(&cluster, 0, TTL_MS).await;
    attach(&cluster, "held", lease).await;
    let mut stream = None;
    let mut last_sent = Instant::now();
    // Keep alive for two TTLs, with a leader change in the middle.
    let until = Instant::now() + Duration::from_millis(2 * TTL_MS);
    let mut changed = false;
    while Instant::now() < until || !changed {
        let (ttl_ms, sent) = keep_alive(&cluster, &mut stream, lease).await;
        assert_eq!(ttl_ms, TTL_MS, "the lease is alive");
        last_sent = sent;
        let mut kv = cluster.kv(cluster.leader().await).await;
        assert_eq!(keys(&mut kv, "held").await, ["held"], "no early expiry");
        if !changed && Instant::now() + Duration::from_millis(TTL_MS) > until {
            cluster.change_leader().await;
            stream = None;
            changed = true;
        }
        tokio::time::sleep(Duration::from_millis(TTL_MS / 3)).await;
    }
    drop(stream);
    // No more keep-alives: the key goes, not before the TTL after the last
    // acknowledged keep-alive was sent, and not never.
    let start = Instant::now();
    loop {
        let mut kv = cluster.kv(cluster.leader().await).await;
        let present = !keys(&mut kv, "held").await.is_empty();
        if !present {
            let early = last_sent + Duration::from_millis(TTL_MS - kvproto::LEASE_EARLY_BOUND_MS);
            assert!(Instant::now() >= early, "expired before its TTL");
            break;
        }
        assert!(start.elapsed() < DEADLINE, "the lease never expired");
        tokio::time::sleep(POLL).await;
    }
    let mut kv = cluster.kv(cluster.leader().await).await;
    let ttl = kv
        .lease_time_to_live(LeaseTimeToLiveRequest {
            id: lease,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(ttl.ttl_ms, -1, "the lease went with its key");
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_leader_renews_every_lease() {
    const TTL_MS: u64 = 20_000;
    let mut cluster = Cluster::start(|_| Default::default()).await;
    let lease = grant(&cluster, 0, TTL_MS).await;
    async fn remaining(cluster: &Cluster, lease: u64) -> i64 {
        let mut kv = cluster.kv(cluster.leader().await).await;
        kv.lease_time_to_live(LeaseTimeToLiveRequest {
            id: lease,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .ttl_ms
    }
    // Let a few seconds of cluster time pass (ticks advance it).
    let start = Instant::now();
    while remaining(&cluster, lease).await > (TTL_MS - 3_000) as i64 {
        assert!(start.elapsed() < DEADLINE, "cluster time does not advance");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Cluster time stands still while there is no leader, so without the
    // renewal the lease would still have about TTL - 3 s left; renewed by
    // the new leader's first entry, it has the whole TTL less the time the
    // new leader has led.
    let old = cluster.leader().await;
    cluster.stop(old).await;
    let new = cluster.leader().await;
    let elected = Instant::now();
    let after = remaining(&cluster, lease).await;
    let led = elected.elapsed().as_millis() as i64;
    assert!(
        after >= TTL_MS as i64 - led - 1_000,
        "member {new}'s first entry renewed the lease: {after} ms left, {led} ms after it led"
    );
    cluster.restart(old).await;
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewals_arriving_together_share_raft_entries() {
    const LEASES: usize = 200;
    const ROUNDS: usize = 20;
    let cluster = Cluster::start(|_| Default::default()).await;
    let mut ids = Vec::new();
    for _ in 0..LEASES {
        ids.push(grant(&cluster, 0, 60_000).await);
    }
    let leader = cluster.leader().await;
    let mut stream = KeepAlive::open(cluster.kv(leader).await).await.unwrap();
    let before = cluster.applied(leader).unwrap();
    let mut keep_alives = 0;
    for _ in 0..ROUNDS {
        for id in &ids {
            stream
                .requests
                .send(LeaseKeepAliveRequest { id: *id })
                .await
                .unwrap();
        }
        for id in &ids {
            let response = tokio::time::timeout(DEADLINE, stream.responses.message())
                .await
                .expect("answers in time")
                .unwrap()
                .unwrap();
            assert_eq!((response.id, response.ttl_ms), (*id, 60_000));
            keep_alives += 1;
        }
    }
    let entries = cluster.applied(leader).unwrap() - before;
    assert!(
        entries * 20 < keep_alives,
        "{keep_alives} keep-alives took {entries} entries"
    );
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_and_a_snapshot_install_keep_leases_and_their_keys() {
    let mut cluster = Cluster::start(|_| Default::default()).await;
    let leader = cluster.leader().await;
    let follower = cluster
        .running()
        .into_iter()
        .find(|id| *id != leader)
        .unwrap();
    let kept = grant(&cluster, 0, 600_000).await;
    attach(&cluster, "k/1", kept).await;
    cluster.stop(follower).await;
    // While the follower is away: more leases and keys, one revoked.
    let second = grant(&cluster, 77, 600_000).await;
    attach(&cluster, "k/2", second).await;
    attach(&cluster, "k/3", second).await;
    let gone = grant(&cluster, 0, 600_000).await;
    attach(&cluster, "k/4", gone).await;
    revoke(&cluster, gone).await;
    let applied = cluster.applied(leader).unwrap();
    cluster.snapshot_and_purge(leader, applied).await;
    cluster.restart(follower).await;
    cluster.wait_applied_equal().await;
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
    cluster.wait_applied_equal().await;
    let view = |id: u64| {
        cluster.node(id).state_machine().with_leases(|leases, _| {
            leases
                .ids()
                .into_iter()
                .map(|lease| {
                    let keys: Vec<String> = leases
                        .keys_of(lease)
                        .into_iter()
                        .map(|k| String::from_utf8(k).unwrap())
                        .collect();
                    (lease, leases.get(lease).unwrap().ttl_ms, keys)
                })
                .collect::<Vec<_>>()
        })
    };
    let expected = view(leader);
    let mut want = vec![
        (kept, 600_000, vec!["k/1".to_string()]),
        (second, 600_000, vec!["k/2".to_string(), "k/3".to_string()]),
    ];
    want.sort();
    assert_eq!(expected, want);
    assert_eq!(view(follower), expected, "after a snapshot install");
    assert_eq!(view(other), expected, "after a restart");
    // The installed member revokes like the others: keys go with the lease.
    revoke(&cluster, second).await;
    cluster.wait_applied_equal().await;
    for id in cluster.running() {
        let mut kv = cluster.kv(id).await;
        assert_eq!(keys(&mut kv, "k/").await, ["k/1"], "member {id}");
    }
    cluster.shutdown().await;
}
