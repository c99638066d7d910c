//! The etcd v3 port end to end, on in-process three-member clusters, with
//! the tonic clients generated from etcd's own wire format (`kvproto::etcd`):
//! - KV through a follower: put (prev_kv), get, prefix ranges with limit,
//!   sort, keys_only, count_only and serializable reads, delete with
//!   prev_kv and `range_end` "\0"; the headers name the cluster, the
//!   answering member and the revision; the answers agree with the
//!   leader's (each write applied once: revisions advance by one per
//!   write);
//! - Txn: both branches, compares on value, version, create and mod
//!   revision, with the branch's ops' answers; etcd's errors for too many
//!   ops, an empty key and a nested transaction;
//! - read-only Txn (ranges only, as clientv3's STM sends): compares and
//!   ranges at one revision through a follower's read index or
//!   serializable, each range at its own past revision after later
//!   writes, the header's store revision, no revision taken; compacted
//!   and future revisions answer etcd's errors;
//! - Range and Compact: a compacted revision and a future one answer
//!   etcd's exact codes and messages; a follower's Compact reaches the leader;
//! - Lease: grant on a follower, a key attached, keep-alives on the same
//!   follower keep it past its TTL, TimeToLive lists its key, Leases lists
//!   it; once the keep-alives stop the lease expires and deletes the key;
//!   a revoke of an unknown lease answers etcd's NOT_FOUND message;
//! - Watch: puts and deletes of a prefix seen in order from a follower, a
//!   second watch resuming from a revision sees exactly the later events,
//!   a watch from below the compact revision is cancelled naming it, and
//!   one from the compact revision itself gets that revision's put;
//! - a prefix read with a limit, and a count-only read, over more keys
//!   than one range may visit answer with the whole prefix's count;
//! - MemberList (client URLs are the members' etcd ports as each tells
//!   them, also with ports at no common offset and a member stopped) and
//!   Status
//!   (the leader, version, raft index and term);
//! - a call not served (Auth.UserList) answers UNIMPLEMENTED at once.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use kvnode::testing::LocalCluster;
use kvproto::etcd::etcdserverpb::auth_client::AuthClient;
use kvproto::etcd::etcdserverpb::cluster_client::ClusterClient;
use kvproto::etcd::etcdserverpb::kv_client::KvClient;
use kvproto::etcd::etcdserverpb::lease_client::LeaseClient;
use kvproto::etcd::etcdserverpb::maintenance_client::MaintenanceClient;
use kvproto::etcd::etcdserverpb::watch_client::WatchClient;
use kvproto::etcd::etcdserverpb::{
    AuthUserListRequest, CompactionRequest, Compare, DeleteRangeRequest, LeaseGrantRequest,
    LeaseKeepAliveRequest, LeaseLeasesRequest, LeaseRevokeRequest, LeaseTimeToLiveRequest,
    MemberListRequest, PutRequest, RangeRequest, RequestOp, StatusRequest, TxnRequest,
    WatchCreateRequest, WatchRequest, WatchResponse, compare, range_request, request_op,
    response_op, watch_request,
};
use kvproto::etcd::mvccpb::event::EventType;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Code;
use tonic::transport::Channel;

/// How long a cluster may take to elect its first leader.
const LEADER_WAIT: Duration = Duration::from_secs(30);
/// How long any single answer may take (a loaded two-core machine).
pub(super) const ANSWER_WAIT: Duration = Duration::from_secs(30);
/// How long a lease may take to expire once nothing renews it (its TTL,
/// then the leader's expiry, commit and apply on a loaded machine).
const EXPIRY_WAIT: Duration = Duration::from_secs(30);

/// Each member's etcd port = its client port + this, in most clusters
/// here (as `kvnode local`'s); MemberList names each member's etcd port as
/// the member tells it, and one test puts them anywhere. The cluster's
/// loopback address is its own, so only its six random ports could take
/// the one chosen.
const ETCD_PORT_OFFSET: u16 = 1;

/// A three-member cluster with an etcd port each, its leader and a follower.
pub(super) async fn cluster(root: &std::path::Path) -> (LocalCluster, u64, u64) {
    cluster_configured(root, |_| {}).await
}

/// [`cluster`] with `configure` applied to each member's configuration too.
pub(super) async fn cluster_configured(
    root: &std::path::Path,
    mut configure: impl FnMut(&mut kvnode::NodeConfig),
) -> (LocalCluster, u64, u64) {
    let cluster = LocalCluster::start_configured(root, 3, |config| {
        let port = config.client_addr.port().checked_add(ETCD_PORT_OFFSET);
        config.etcd_addr = Some(SocketAddr::new(
            config.client_addr.ip(),
            port.expect("an ephemeral client port below 65535"),
        ));
        configure(config);
    })
    .await
    .expect("start the cluster");
    let leader = cluster
        .wait_for_leader(LEADER_WAIT)
        .await
        .expect("a leader");
    let follower = (1..=3).find(|id| *id != leader).expect("a follower");
    (cluster, leader, follower)
}

pub(super) fn etcd_addr(cluster: &LocalCluster, id: u64) -> SocketAddr {
    cluster
        .node(id)
        .expect("a running member")
        .etcd_addr()
        .expect("an etcd port")
}

/// A channel to member `id`'s etcd port whose calls time out after
/// [`ANSWER_WAIT`].
pub(super) async fn channel(cluster: &LocalCluster, id: u64) -> Channel {
    channel_with_timeout(cluster, id, Some(ANSWER_WAIT)).await
}

/// A channel to member `id`'s etcd port, its calls bounded by `timeout`
/// (`None`: by the caller, e.g. a lock that may wait).
pub(super) async fn channel_with_timeout(
    cluster: &LocalCluster,
    id: u64,
    timeout: Option<Duration>,
) -> Channel {
    let endpoint = Channel::from_shared(format!("http://{}", etcd_addr(cluster, id))).unwrap();
    let endpoint = match timeout {
        Some(timeout) => endpoint.timeout(timeout),
        None => endpoint,
    };
    endpoint.connect().await.expect("connect to the etcd port")
}

pub(super) fn put(key: &str, value: &str) -> PutRequest {
    PutRequest {
        key: key.as_bytes().to_vec().into(),
        value: value.as_bytes().to_vec().into(),
        ..Default::default()
    }
}

fn get(key: &str) -> RangeRequest {
    RangeRequest {
        key: key.as_bytes().to_vec().into(),
        ..Default::default()
    }
}

/// Every key starting with `prefix`, as etcdctl's `--prefix` asks.
pub(super) fn prefix(prefix: &str) -> RangeRequest {
    let mut end = prefix.as_bytes().to_vec();
    *end.last_mut().unwrap() += 1;
    RangeRequest {
        key: prefix.as_bytes().to_vec().into(),
        range_end: end.into(),
        ..Default::default()
    }
}

fn keys(kvs: &[kvproto::etcd::mvccpb::KeyValue]) -> Vec<String> {
    kvs.iter()
        .map(|kv| String::from_utf8_lossy(&kv.key).into_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kv_through_a_follower_answers_as_etcd() {
    let root = tempfile::tempdir().unwrap();
    let (cluster, leader, follower) = cluster(root.path()).await;
    let mut kv = KvClient::new(channel(&cluster, follower).await);
    let mut on_leader = KvClient::new(channel(&cluster, leader).await);

    let first = kv
        .put(put("fruit/apple", "red"))
        .await
        .unwrap()
        .into_inner();
    let header = first.header.expect("a header");
    assert_ne!(header.cluster_id, 0);
    assert_eq!(header.member_id, follower);
    assert!(header.raft_term > 0);
    let base = header.revision;
    assert!(base > 0);
    assert!(first.prev_kv.is_none());
    for (n, (key, value)) in [
        ("fruit/banana", "yellow"),
        ("fruit/cherry", "dark"),
        ("veg/kale", "green"),
    ]
    .into_iter()
    .enumerate()
    {
        let answer = kv.put(put(key, value)).await.unwrap().into_inner();
        // One write, one revision: forwarded exactly once.
        assert_eq!(answer.header.unwrap().revision, base + 1 + n as i64);
    }
    let again = kv
        .put(PutRequest {
            prev_kv: true,
            ..put("fruit/apple", "green")
        })
        .await
        .unwrap()
        .into_inner();
    let prev = again.prev_kv.expect("prev_kv");
    assert_eq!(&prev.value[..], b"red");
    assert_eq!(prev.version, 1);
    assert_eq!(prev.mod_revision, base);

    // A linearizable read on the follower sees the acknowledged write.
    let read = kv.range(get("fruit/apple")).await.unwrap().into_inner();
    assert_eq!(read.count, 1);
    let apple = &read.kvs[0];
    assert_eq!(&apple.value[..], b"green");
    assert_eq!(apple.version, 2);
    assert_eq!(apple.create_revision, base);
    assert_eq!(apple.mod_revision, base + 4);
    assert_eq!(read.header.unwrap().revision, base + 4);
    // The leader answers the same.
    let on_leader_read = on_leader
        .range(get("fruit/apple"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(on_leader_read.kvs, read.kvs);

    // Prefix, limit, sort, keys only, count only, serializable.
    let all = kv.range(prefix("fruit/")).await.unwrap().into_inner();
    assert_eq!(
        keys(&all.kvs),
        ["fruit/apple", "fruit/banana", "fruit/cherry"]
    );
    let limited = kv
        .range(RangeRequest {
            limit: 2,
            sort_order: range_request::SortOrder::Descend as i32,
            sort_target: range_request::SortTarget::Key as i32,
            ..prefix("fruit/")
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(keys(&limited.kvs), ["fruit/cherry", "fruit/banana"]);
    assert!(limited.more);
    assert_eq!(limited.count, 3);
    let keys_only = kv
        .range(RangeRequest {
            keys_only: true,
            ..prefix("fruit/")
        })
        .await
        .unwrap()
        .into_inner();
    assert!(keys_only.kvs.iter().all(|kv| kv.value.is_empty()));
    let count_only = kv
        .range(RangeRequest {
            count_only: true,
            ..prefix("fruit/")
        })
        .await
        .unwrap()
        .into_inner();
    assert!(count_only.kvs.is_empty());
    assert_eq!(count_only.count, 3);
    let serializable = kv
        .range(RangeRequest {
            serializable: true,
            ..get("veg/kale")
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(serializable.header.unwrap().member_id, follower);

    // Delete with prev_kv, then every key from "veg/" on ("\0").
    let deleted = kv
        .delete_range(DeleteRangeRequest {
            key: b"fruit/banana".to_vec().into(),
            prev_kv: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(deleted.deleted, 1);
    assert_eq!(&deleted.prev_kvs[0].value[..], b"yellow");
    let deleted = kv
        .delete_range(DeleteRangeRequest {
            key: b"veg/".to_vec().into(),
            range_end: b"\0".to_vec().into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(deleted.deleted, 1);
    let left = kv
        .range(RangeRequest {
            key: b"\0".to_vec().into(),
            range_end: b"\0".to_vec().into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(keys(&left.kvs), ["fruit/apple", "fruit/cherry"]);

    // etcd's errors, exactly.
    let empty = kv.put(put("", "x")).await.unwrap_err();
    assert_eq!(
        (empty.code(), empty.message()),
        (Code::InvalidArgument, "etcdserver: key is not provided")
    );
    let big = kv
        .put(put("big", &"x".repeat(1024 * 1024 + 1)))
        .await
        .unwrap_err();
    assert_eq!(
        (big.code(), big.message()),
        (Code::InvalidArgument, "etcdserver: request is too large")
    );
    let missing = kv
        .put(PutRequest {
            ignore_value: true,
            ..put("nothing-here", "")
        })
        .await
        .unwrap_err();
    assert_eq!(missing.message(), "etcdserver: key not found");
    cluster.shutdown().await;
}

fn txn_put(key: &str, value: &str) -> RequestOp {
    RequestOp {
        request: Some(request_op::Request::RequestPut(put(key, value))),
    }
}

fn txn_get(key: &str) -> RequestOp {
    RequestOp {
        request: Some(request_op::Request::RequestRange(get(key))),
    }
}

fn compare_value(key: &str, result: compare::CompareResult, value: &str) -> Compare {
    Compare {
        result: result as i32,
        target: compare::CompareTarget::Value as i32,
        key: key.as_bytes().to_vec().into(),
        target_union: Some(compare::TargetUnion::Value(
            value.as_bytes().to_vec().into(),
        )),
        range_end: Default::default(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn txn_runs_either_branch() {
    let root = tempfile::tempdir().unwrap();
    let (cluster, _leader, follower) = cluster(root.path()).await;
    let mut kv = KvClient::new(channel(&cluster, follower).await);
    let created = kv.put(put("account", "10")).await.unwrap().into_inner();
    let revision = created.header.unwrap().revision;

    let success = kv
        .txn(TxnRequest {
            compare: vec![
                compare_value("account", compare::CompareResult::Equal, "10"),
                Compare {
                    result: compare::CompareResult::Equal as i32,
                    target: compare::CompareTarget::Mod as i32,
                    key: b"account".to_vec().into(),
                    target_union: Some(compare::TargetUnion::ModRevision(revision)),
                    range_end: Default::default(),
                },
                Compare {
                    result: compare::CompareResult::Less as i32,
                    target: compare::CompareTarget::Version as i32,
                    key: b"account".to_vec().into(),
                    target_union: Some(compare::TargetUnion::Version(2)),
                    range_end: Default::default(),
                },
            ],
            success: vec![txn_put("account", "20"), txn_get("account")],
            failure: vec![txn_get("account")],
        })
        .await
        .unwrap()
        .into_inner();
    assert!(success.succeeded);
    assert_eq!(success.header.unwrap().revision, revision + 1);
    assert_eq!(success.responses.len(), 2);
    match &success.responses[1].response {
        Some(response_op::Response::ResponseRange(range)) => {
            assert_eq!(
                &range.kvs[0].value[..],
                b"20",
                "the branch sees its own put"
            );
        }
        other => panic!("expected a range answer, got {other:?}"),
    }

    let failure = kv
        .txn(TxnRequest {
            compare: vec![
                compare_value("account", compare::CompareResult::Equal, "10"),
                Compare {
                    result: compare::CompareResult::Greater as i32,
                    target: compare::CompareTarget::Create as i32,
                    key: b"account".to_vec().into(),
                    target_union: Some(compare::TargetUnion::CreateRevision(0)),
                    range_end: Default::default(),
                },
            ],
            success: vec![txn_put("account", "30")],
            failure: vec![txn_get("account"), txn_put("audit", "refused")],
        })
        .await
        .unwrap()
        .into_inner();
    assert!(!failure.succeeded);
    match &failure.responses[0].response {
        Some(response_op::Response::ResponseRange(range)) => {
            assert_eq!(&range.kvs[0].value[..], b"20");
        }
        other => panic!("expected a range answer, got {other:?}"),
    }
    assert!(matches!(
        failure.responses[1].response,
        Some(response_op::Response::ResponsePut(_))
    ));
    let audit = kv.range(get("audit")).await.unwrap().into_inner();
    assert_eq!(&audit.kvs[0].value[..], b"refused");
    let account = kv.range(get("account")).await.unwrap().into_inner();
    assert_eq!(
        &account.kvs[0].value[..],
        b"20",
        "the success branch did not run"
    );

    let too_many = kv
        .txn(TxnRequest {
            success: (0..129).map(|i| txn_put(&format!("k{i}"), "v")).collect(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(
        (too_many.code(), too_many.message()),
        (
            Code::InvalidArgument,
            "etcdserver: too many operations in txn request"
        )
    );
    let nested = kv
        .txn(TxnRequest {
            success: vec![RequestOp {
                request: Some(request_op::Request::RequestTxn(TxnRequest::default())),
            }],
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(nested.code(), Code::InvalidArgument);
    assert!(
        nested.message().contains("success[0].request_txn"),
        "{nested:?}"
    );
    cluster.shutdown().await;
}

/// A range op at `revision`, serializable or not, as clientv3's STM sends
/// its prefetches (`OpGet(k, WithRev(R), WithSerializable())`).
fn txn_get_at(key: &str, revision: i64, serializable: bool) -> RequestOp {
    RequestOp {
        request: Some(request_op::Request::RequestRange(RangeRequest {
            revision,
            serializable,
            ..get(key)
        })),
    }
}

/// The value (and mod revision) a range op answered, `None` for no key.
fn ranged(response: &kvproto::etcd::etcdserverpb::ResponseOp) -> Option<(String, i64)> {
    match &response.response {
        Some(response_op::Response::ResponseRange(range)) => range.kvs.first().map(|kv| {
            (
                String::from_utf8_lossy(&kv.value).into_owned(),
                kv.mod_revision,
            )
        }),
        other => panic!("expected a range answer, got {other:?}"),
    }
}

fn compare_mod(key: &str, result: compare::CompareResult, revision: i64) -> Compare {
    Compare {
        result: result as i32,
        target: compare::CompareTarget::Mod as i32,
        key: key.as_bytes().to_vec().into(),
        target_union: Some(compare::TargetUnion::ModRevision(revision)),
        range_end: Default::default(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_only_txns_read_past_revisions_as_etcd() {
    let root = tempfile::tempdir().unwrap();
    let (cluster, leader, follower) = cluster(root.path()).await;
    let mut kv = KvClient::new(channel(&cluster, follower).await);
    let mut on_leader = KvClient::new(channel(&cluster, leader).await);
    let mut revisions = Vec::new();
    for (key, value) in [
        ("stm/a", "1"),
        ("stm/b", "x"),
        ("stm/a", "2"),
        ("stm/a", "3"),
    ] {
        let answer = kv.put(put(key, value)).await.unwrap().into_inner();
        revisions.push(answer.header.unwrap().revision);
    }
    let [r1, r2, r3, r4] = revisions[..] else {
        unreachable!()
    };

    // Linearizable on a follower, after later writes: the compares and the
    // branch's ranges at one revision, each range at its own.
    let answer = kv
        .txn(TxnRequest {
            compare: vec![compare_mod("stm/a", compare::CompareResult::Equal, r4)],
            success: vec![
                txn_get_at("stm/a", r1, false),
                txn_get_at("stm/a", 0, false),
                txn_get_at("stm/b", r1, false),
                txn_get_at("stm/a", r3, false),
                txn_get_at("stm/a", r4, false),
            ],
            failure: vec![txn_get("stm/a")],
        })
        .await
        .expect("a read-only transaction at past revisions")
        .into_inner();
    assert!(answer.succeeded);
    assert_eq!(answer.header.unwrap().revision, r4, "the store revision");
    let values: Vec<_> = answer.responses.iter().map(ranged).collect();
    assert_eq!(
        values,
        [
            Some(("1".to_string(), r1)),
            Some(("3".to_string(), r4)),
            None,
            Some(("2".to_string(), r3)),
            Some(("3".to_string(), r4)),
        ]
    );
    for response in &answer.responses {
        let Some(response_op::Response::ResponseRange(range)) = &response.response else {
            unreachable!()
        };
        assert_eq!(range.header.as_ref().unwrap().revision, r4);
    }
    // The failure branch, read at a past revision, serializable (STM's
    // prefetch): this member has applied r4 (the read above waited for it).
    let answer = kv
        .txn(TxnRequest {
            compare: vec![compare_value(
                "stm/a",
                compare::CompareResult::Equal,
                "nope",
            )],
            success: vec![txn_get("stm/b")],
            failure: vec![txn_get_at("stm/a", r3, true), txn_get_at("stm/b", r2, true)],
        })
        .await
        .unwrap()
        .into_inner();
    assert!(!answer.succeeded);
    assert_eq!(answer.header.unwrap().revision, r4);
    let values: Vec<_> = answer.responses.iter().map(ranged).collect();
    assert_eq!(
        values,
        [Some(("2".to_string(), r3)), Some(("x".to_string(), r2))]
    );

    // A read-only transaction takes no revision: the next write takes r4 + 1.
    let next = on_leader.put(put("stm/a", "4")).await.unwrap().into_inner();
    let r5 = next.header.unwrap().revision;
    assert_eq!(r5, r4 + 1);
    // Linearizable through the follower's read index: it sees the write
    // the leader just acknowledged.
    let answer = kv
        .txn(TxnRequest {
            success: vec![txn_get("stm/a")],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(answer.header.unwrap().revision, r5);
    assert_eq!(ranged(&answer.responses[0]), Some(("4".to_string(), r5)));

    // Compacted and future revisions: etcd's errors.
    kv.compact(CompactionRequest {
        revision: r3,
        physical: true,
    })
    .await
    .expect("compaction through a follower");
    let compacted = kv
        .txn(TxnRequest {
            success: vec![
                txn_get_at("stm/a", r3, false),
                txn_get_at("stm/a", r1, false),
            ],
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(
        (compacted.code(), compacted.message()),
        (
            Code::OutOfRange,
            "etcdserver: mvcc: required revision has been compacted"
        )
    );
    let future = kv
        .txn(TxnRequest {
            success: vec![txn_get_at("stm/a", r5 + 1000, true)],
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(
        (future.code(), future.message()),
        (
            Code::OutOfRange,
            "etcdserver: mvcc: required revision is a future revision"
        )
    );
    // The compact revision itself is still served.
    let answer = kv
        .txn(TxnRequest {
            success: vec![txn_get_at("stm/a", r3, false)],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(ranged(&answer.responses[0]), Some(("2".to_string(), r3)));
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compacted_and_future_revisions_answer_etcds_errors() {
    let root = tempfile::tempdir().unwrap();
    let (cluster, _leader, follower) = cluster(root.path()).await;
    let mut kv = KvClient::new(channel(&cluster, follower).await);
    let mut revisions = Vec::new();
    for value in ["1", "2", "3", "4"] {
        let answer = kv.put(put("counter", value)).await.unwrap().into_inner();
        revisions.push(answer.header.unwrap().revision);
    }
    // Compact on a follower: the leader proposes it.
    kv.compact(CompactionRequest {
        revision: revisions[2],
        physical: true,
    })
    .await
    .expect("compaction through a follower");
    let compacted = kv
        .range(RangeRequest {
            revision: revisions[1],
            ..get("counter")
        })
        .await
        .unwrap_err();
    assert_eq!(
        (compacted.code(), compacted.message()),
        (
            Code::OutOfRange,
            "etcdserver: mvcc: required revision has been compacted"
        )
    );
    // The compact revision itself is still served, as etcd serves it.
    let at_compact = kv
        .range(RangeRequest {
            revision: revisions[2],
            ..get("counter")
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(&at_compact.kvs[0].value[..], b"3");
    let future = kv
        .range(RangeRequest {
            revision: revisions[3] + 1000,
            ..get("counter")
        })
        .await
        .unwrap_err();
    assert_eq!(
        (future.code(), future.message()),
        (
            Code::OutOfRange,
            "etcdserver: mvcc: required revision is a future revision"
        )
    );
    let again = kv
        .compact(CompactionRequest {
            revision: revisions[1],
            physical: false,
        })
        .await
        .unwrap_err();
    assert_eq!(
        again.message(),
        "etcdserver: mvcc: required revision has been compacted"
    );
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_keep_keys_alive_then_expire_them() {
    let root = tempfile::tempdir().unwrap();
    let (cluster, _leader, follower) = cluster(root.path()).await;
    let channel = channel(&cluster, follower).await;
    let mut kv = KvClient::new(channel.clone());
    let mut leases = LeaseClient::new(channel);

    let granted = leases
        .lease_grant(LeaseGrantRequest { ttl: 2, id: 0 })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(granted.ttl, 2);
    assert!(granted.id > 0);
    kv.put(PutRequest {
        lease: granted.id,
        ..put("session/owner", "me")
    })
    .await
    .unwrap();
    let listed = leases
        .lease_leases(LeaseLeasesRequest {})
        .await
        .unwrap()
        .into_inner();
    assert!(listed.leases.iter().any(|l| l.id == granted.id));
    let ttl = leases
        .lease_time_to_live(LeaseTimeToLiveRequest {
            id: granted.id,
            keys: true,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(ttl.granted_ttl, 2);
    assert!((0..=2).contains(&ttl.ttl), "{ttl:?}");
    assert_eq!(ttl.keys, vec![b"session/owner".to_vec()]);

    // Keep it alive through the follower for well past its TTL.
    let (requests, stream) = mpsc::channel(4);
    let mut answers = leases
        .lease_keep_alive(ReceiverStream::new(stream))
        .await
        .unwrap()
        .into_inner();
    let kept_until = Instant::now() + Duration::from_secs(6);
    while Instant::now() < kept_until {
        requests
            .send(LeaseKeepAliveRequest { id: granted.id })
            .await
            .unwrap();
        let answer = tokio::time::timeout(ANSWER_WAIT, answers.message())
            .await
            .expect("a keep-alive answer in time")
            .unwrap()
            .expect("the stream goes on");
        assert_eq!((answer.id, answer.ttl), (granted.id, 2));
        tokio::time::sleep(Duration::from_millis(400)).await;
    }
    let still = kv.range(get("session/owner")).await.unwrap().into_inner();
    assert_eq!(still.count, 1, "the renewed lease kept its key");

    // No more keep-alives: the lease expires and deletes its key.
    drop(requests);
    drop(answers);
    let deadline = Instant::now() + EXPIRY_WAIT;
    loop {
        let read = kv.range(get("session/owner")).await.unwrap().into_inner();
        if read.count == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the lease did not expire in {EXPIRY_WAIT:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let gone = leases
        .lease_time_to_live(LeaseTimeToLiveRequest {
            id: granted.id,
            keys: false,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(gone.ttl, -1);
    let revoke = leases
        .lease_revoke(LeaseRevokeRequest { id: granted.id })
        .await
        .unwrap_err();
    assert_eq!(
        (revoke.code(), revoke.message()),
        (Code::NotFound, "etcdserver: requested lease not found")
    );
    let attach = kv
        .put(PutRequest {
            lease: granted.id,
            ..put("orphan", "x")
        })
        .await
        .unwrap_err();
    assert_eq!(attach.message(), "etcdserver: requested lease not found");

    // A revoke deletes the keys at once.
    let second = leases
        .lease_grant(LeaseGrantRequest { ttl: 60, id: 0 })
        .await
        .unwrap()
        .into_inner();
    kv.put(PutRequest {
        lease: second.id,
        ..put("session/other", "x")
    })
    .await
    .unwrap();
    leases
        .lease_revoke(LeaseRevokeRequest { id: second.id })
        .await
        .unwrap();
    let read = kv.range(get("session/other")).await.unwrap().into_inner();
    assert_eq!(read.count, 0);
    let duplicate = leases
        .lease_grant(LeaseGrantRequest { ttl: 60, id: 77 })
        .await;
    assert!(duplicate.is_ok());
    let duplicate = leases
        .lease_grant(LeaseGrantRequest { ttl: 60, id: 77 })
        .await
        .unwrap_err();
    assert_eq!(
        (duplicate.code(), duplicate.message()),
        (Code::FailedPrecondition, "etcdserver: lease already exists")
    );
    cluster.shutdown().await;
}

/// A watch stream: its request sender and its answers.
pub(super) struct WatchStream {
    pub(super) requests: mpsc::Sender<WatchRequest>,
    answers: tonic::Streaming<WatchResponse>,
}

impl WatchStream {
    pub(super) async fn open(channel: Channel) -> WatchStream {
        let (requests, stream) = mpsc::channel(4);
        let answers = WatchClient::new(channel)
            .watch(ReceiverStream::new(stream))
            .await
            .unwrap()
            .into_inner();
        WatchStream { requests, answers }
    }

    pub(super) async fn create(&mut self, create: WatchCreateRequest) -> WatchResponse {
        self.requests
            .send(WatchRequest {
                request_union: Some(watch_request::RequestUnion::CreateRequest(create)),
            })
            .await
            .unwrap();
        let created = self.next().await;
        assert!(created.created, "{created:?}");
        created
    }

    pub(super) async fn next(&mut self) -> WatchResponse {
        tokio::time::timeout(ANSWER_WAIT, self.answers.message())
            .await
            .expect("a watch answer in time")
            .unwrap()
            .expect("the stream goes on")
    }

    /// The next `count` events as (type, key, value, mod revision).
    async fn events(&mut self, count: usize) -> Vec<(EventType, String, String, i64)> {
        let mut events = Vec::new();
        while events.len() < count {
            let answer = self.next().await;
            assert!(!answer.canceled, "{answer:?}");
            for event in answer.events {
                let kv = event.kv.unwrap();
                events.push((
                    EventType::try_from(event.r#type).unwrap(),
                    String::from_utf8_lossy(&kv.key).into_owned(),
                    String::from_utf8_lossy(&kv.value).into_owned(),
                    kv.mod_revision,
                ));
            }
        }
        assert_eq!(events.len(), count, "{events:?}");
        events
    }
}

pub(super) fn watch_prefix(key: &str, start_revision: i64) -> WatchCreateRequest {
    let range = prefix(key);
    WatchCreateRequest {
        key: range.key,
        range_end: range.range_end,
        start_revision,
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watches_see_puts_and_deletes_and_resume() {
    let root = tempfile::tempdir().unwrap();
    let (cluster, leader, follower) = cluster(root.path()).await;
    let mut kv = KvClient::new(channel(&cluster, leader).await);
    let mut watch = WatchStream::open(channel(&cluster, follower).await).await;
    watch.create(watch_prefix("w/", 0)).await;
    let a = kv.put(put("w/a", "1")).await.unwrap().into_inner();
    let ra = a.header.unwrap().revision;
    kv.put(put("other", "x")).await.unwrap();
    kv.put(put("w/b", "2")).await.unwrap();
    kv.delete_range(DeleteRangeRequest {
        key: b"w/a".to_vec().into(),
        ..Default::default()
    })
    .await
    .unwrap();
    let events = watch.events(3).await;
    assert_eq!(
        events,
        vec![
            (EventType::Put, "w/a".into(), "1".into(), ra),
            (EventType::Put, "w/b".into(), "2".into(), ra + 2),
            (EventType::Delete, "w/a".into(), String::new(), ra + 3),
        ]
    );

    // Resume on another member from the second event's revision.
    let mut resumed = WatchStream::open(channel(&cluster, leader).await).await;
    resumed.create(watch_prefix("w/", ra + 2)).await;
    let events = resumed.events(2).await;
    assert_eq!(events[0].3, ra + 2);
    assert_eq!(
        events[1],
        (EventType::Delete, "w/a".into(), String::new(), ra + 3)
    );

    // Compaction: below it the watch is cancelled naming it; from it, the
    // compact revision's own put comes first.
    let c = kv.put(put("w/c", "3")).await.unwrap().into_inner();
    let rc = c.header.unwrap().revision;
    kv.put(put("w/d", "4")).await.unwrap();
    kv.compact(CompactionRequest {
        revision: rc,
        physical: false,
    })
    .await
    .unwrap();
    let mut late = WatchStream::open(channel(&cluster, follower).await).await;
    late.requests
        .send(WatchRequest {
            request_union: Some(watch_request::RequestUnion::CreateRequest(watch_prefix(
                "w/",
                rc - 1,
            ))),
        })
        .await
        .unwrap();
    let mut cancelled = late.next().await;
    if !cancelled.canceled {
        assert!(cancelled.created);
        cancelled = late.next().await;
    }
    assert!(cancelled.canceled, "{cancelled:?}");
    assert_eq!(cancelled.compact_revision, rc);
    let mut from_compact = WatchStream::open(channel(&cluster, follower).await).await;
    from_compact.create(watch_prefix("w/", rc)).await;
    let events = from_compact.events(2).await;
    assert_eq!(
        events,
        vec![
            (EventType::Put, "w/c".into(), "3".into(), rc),
            (EventType::Put, "w/d".into(), "4".into(), rc + 1),
        ]
    );
    cluster.shutdown().await;
}

/// More keys than one range may visit (`RANGE_KEYS_MAX`): a prefix read
/// with a limit and a count-only read answer with the whole prefix's
/// count, as etcd's do (`etcdctl get --prefix --limit 1`, clientv3's
/// `WithFirstKey`, `--count-only`), linearizable through a follower and
/// serializable; a read of every key is refused naming the limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limit_or_count_only_answers_past_the_keys_a_range_visits() {
    use kvnode::server::etcd::ETCD_TXN_OPS_MAX;
    use kvstate::range::RANGE_KEYS_MAX;
    let root = tempfile::tempdir().unwrap();
    let (cluster, _leader, follower) = cluster(root.path()).await;
    let kv = KvClient::new(channel(&cluster, follower).await);
    let total = RANGE_KEYS_MAX + 3;
    let key = |i: usize| format!("many/{i:07}");
    // Four writers, each a share of the transactions of ETCD_TXN_OPS_MAX
    // puts (bounded: `total` keys, then they stop).
    let txns: Vec<Vec<usize>> = (0..total)
        .collect::<Vec<_>>()
        .chunks(ETCD_TXN_OPS_MAX)
        .map(<[usize]>::to_vec)
        .collect();
    let mut writers = Vec::new();
    for writer in 0..4 {
        let mut kv = kv.clone();
        let mine: Vec<Vec<usize>> = txns.iter().skip(writer).step_by(4).cloned().collect();
        writers.push(tokio::spawn(async move {
            for keys in mine {
                let success = keys
                    .iter()
                    .map(|&i| RequestOp {
                        request: Some(request_op::Request::RequestPut(put(&key(i), "v"))),
                    })
                    .collect();
                let answer = kv
                    .txn(TxnRequest {
                        success,
                        ..Default::default()
                    })
                    .await
                    .expect("a load transaction");
                assert!(answer.into_inner().succeeded);
            }
        }));
    }
    for writer in writers {
        writer.await.unwrap();
    }
    let prefix = |serializable| RangeRequest {
        key: b"many/".to_vec().into(),
        range_end: b"many0".to_vec().into(),
        serializable,
        ..Default::default()
    };
    for serializable in [false, true] {
        let first = kv
            .clone()
            .range(RangeRequest {
                limit: 1,
                ..prefix(serializable)
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(keys(&first.kvs), vec![key(0)]);
        assert!(first.more);
        assert_eq!(first.count, total as i64);
        let counted = kv
            .clone()
            .range(RangeRequest {
                count_only: true,
                ..prefix(serializable)
            })
            .await
            .unwrap()
            .into_inner();
        assert!(counted.kvs.is_empty());
        assert_eq!(counted.count, total as i64);
    }
    let whole = kv.clone().range(prefix(false)).await.unwrap_err();
    assert_eq!(whole.code(), Code::InvalidArgument, "{whole:?}");
    assert!(whole.message().contains("RANGE_KEYS_MAX"), "{whole:?}");
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn member_list_and_status_describe_the_cluster() {
    let root = tempfile::tempdir().unwrap();
    // Each etcd port wherever the system puts it: no offset from the client
    // port tells it, so MemberList names each as the member tells it.
    let (mut cluster, leader, follower) = cluster_configured(root.path(), |config| {
        config.etcd_addr = Some(SocketAddr::new(config.client_addr.ip(), 0));
    })
    .await;
    let channel = channel(&cluster, follower).await;
    let list = || async {
        let members = ClusterClient::new(channel.clone())
            .member_list(MemberListRequest {})
            .await
            .unwrap()
            .into_inner();
        assert_eq!(members.header.unwrap().member_id, follower);
        assert!(members.members.iter().all(|m| m.peer_ur_ls.len() == 1));
        let mut listed: Vec<(u64, Vec<String>, bool)> = members
            .members
            .iter()
            .map(|m| (m.id, m.client_ur_ls.clone(), m.is_learner))
            .collect();
        listed.sort();
        listed
    };
    let etcd_urls: Vec<String> = (1..=3)
        .map(|id| format!("http://{}", etcd_addr(&cluster, id)))
        .collect();
    let expected: Vec<(u64, Vec<String>, bool)> = (1..=3)
        .map(|id| (id, vec![etcd_urls[id as usize - 1].clone()], false))
        .collect();
    // The first MemberList asks each member (a new peer channel each, on
    // a loaded machine): wait for the told addresses, then hold them.
    let deadline = Instant::now() + ANSWER_WAIT;
    while list().await != expected && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(list().await, expected);
    // A member that stopped answering is named by what it told last, also
    // once that answer is no longer fresh (it is asked again, and is
    // silent).
    let stopped = (1..=3).find(|id| *id != leader && *id != follower).unwrap();
    assert!(cluster.kill(stopped).await);
    assert_eq!(list().await, expected);
    tokio::time::sleep(kvnode::server::etcd::peers::ETCD_ADDR_FRESH).await;
    assert_eq!(list().await, expected);

    let status = MaintenanceClient::new(channel.clone())
        .status(StatusRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(status.leader, leader);
    assert_eq!(status.version, "3.4.0");
    assert!(status.raft_index > 0 && status.raft_term > 0);
    assert!(status.raft_applied_index <= status.raft_index);
    assert!(!status.is_learner);
    assert_eq!(status.header.unwrap().member_id, follower);

    let users = tokio::time::timeout(
        ANSWER_WAIT,
        AuthClient::new(channel).user_list(AuthUserListRequest {}),
    )
    .await
    .expect("an answer, not a hang")
    .unwrap_err();
    assert_eq!(users.code(), Code::Unimplemented);
    assert!(users.message().contains("not served"), "{users:?}");
    cluster.shutdown().await;
}
