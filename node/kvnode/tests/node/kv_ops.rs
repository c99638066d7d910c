//! Expire, Persist and Batch end-to-end over real gRPC on 127.0.0.1
//! (ephemeral ports), on a single-node cluster through the kvproto
//! `KvClient`: Expire gives an existing key a TTL that its Get reports
//! (`ttl_ms_left` > 0) and Persist removes it again, each with a new
//! version; Expire / Persist of a missing key answer `found` false and
//! change nothing; invalid inputs (ttl 0, reserved or oversized keys, an
//! unset batch op) are INVALID_ARGUMENT. A Batch with a holding condition
//! and two ops on one key applies atomically with consecutive versions; a
//! Batch whose condition fails applies nothing and names the failed
//! condition; a Batch that expires a missing key applies nothing and names
//! the op.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use kvnode::raft::watch::MetricsWatch;
use kvnode::{Listeners, Node, NodeConfig, NodeInfo, node};
use kvproto::kv::v1::kv_client::KvClient;
use kvproto::kv::v1::{
    BatchCondition, BatchOp, BatchRequest, BatchResponse, ConditionFailed, Consistency, ExpireOp,
    ExpireRequest, GetRequest, GetResponse, KeyNotFound, PersistRequest, PutOp, PutRequest,
    batch_op, batch_response, put_response,
};
use tokio::net::TcpListener;
use tonic::Code;
use tonic::transport::Channel;

const DEADLINE: Duration = Duration::from_secs(30);
const POLL: Duration = Duration::from_millis(50);
const TTL_MS: u64 = 10 * 60 * 1000;

/// Starts a bootstrapped single-node cluster on ephemeral 127.0.0.1 ports,
/// waits until it leads and connects a client.
async fn single_node(dir: &Path) -> (Node, KvClient<Channel>) {
    let host = crate::common::private_loopback();
    let client = TcpListener::bind((host, 0)).await.unwrap();
    let peer = TcpListener::bind((host, 0)).await.unwrap();
    let info = NodeInfo {
        client_addr: client.local_addr().unwrap().to_string(),
        peer_addr: peer.local_addr().unwrap().to_string(),
    };
    let mut config = NodeConfig::new(
        1,
        dir,
        client.local_addr().unwrap(),
        peer.local_addr().unwrap(),
        BTreeMap::from([(1, info)]),
    );
    config.bootstrap = true;
    let listeners = Listeners {
        client,
        peer,
        admin: None,
    };
    let node = Node::start_with_listeners(config, listeners)
        .await
        .expect("start node");
    let start = Instant::now();
    while node.raft().metrics().borrow().current_leader != Some(1) {
        assert!(start.elapsed() < DEADLINE, "the node did not become leader");
        tokio::time::sleep(POLL).await;
    }
    let kv = KvClient::connect(format!("http://{}", node.client_addr()))
        .await
        .expect("connect");
    (node, kv)
}

async fn put(kv: &mut KvClient<Channel>, key: &str, value: &str) -> u64 {
    let reply = kv
        .put(PutRequest {
            key: key.as_bytes().to_vec().into(),
            value: value.as_bytes().to_vec().into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    match reply.outcome {
        Some(put_response::Outcome::Seq(version)) => version,
        other => panic!("put {key}: {other:?}"),
    }
}

async fn get(kv: &mut KvClient<Channel>, key: &str) -> GetResponse {
    kv.get(GetRequest {
        key: key.as_bytes().to_vec().into(),
        consistency: Consistency::Linearizable as i32,
        min_index: 0,
    })
    .await
    .unwrap()
    .into_inner()
}

fn expire_req(key: &[u8], ttl_ms: u64) -> ExpireRequest {
    ExpireRequest {
        key: key.to_vec().into(),
        ttl_ms,
        ..Default::default()
    }
}

fn persist_req(key: &str) -> PersistRequest {
    PersistRequest {
        key: key.as_bytes().to_vec().into(),
        ..Default::default()
    }
}

fn put_op(key: &str, value: &str) -> BatchOp {
    BatchOp {
        op: Some(batch_op::Op::Put(PutOp {
            key: key.as_bytes().to_vec().into(),
            value: value.as_bytes().to_vec().into(),
            ttl_ms: 0,
        })),
    }
}

fn expire_op(key: &str, ttl_ms: u64) -> BatchOp {
    BatchOp {
        op: Some(batch_op::Op::Expire(ExpireOp {
            key: key.as_bytes().to_vec().into(),
            ttl_ms,
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
    kv: &mut KvClient<Channel>,
    conditions: Vec<BatchCondition>,
    ops: Vec<BatchOp>,
) -> BatchResponse {
    kv.batch(BatchRequest {
        session: None,
        conditions,
        ops,
    })
    .await
    .unwrap()
    .into_inner()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expire_and_persist_set_and_clear_a_ttl() {
    let dir = tempfile::tempdir().unwrap();
    let (node, mut kv) = single_node(dir.path()).await;

    let v1 = put(&mut kv, "k", "value").await;
    assert_eq!(get(&mut kv, "k").await.ttl_ms_left, 0);

    let expired = kv
        .expire(expire_req(b"k", TTL_MS))
        .await
        .unwrap()
        .into_inner();
    assert!(expired.found, "{expired:?}");
    assert!(expired.seq > v1, "{expired:?}");
    assert!(expired.header.unwrap().applied_index >= expired.seq / 65_536);
    let got = get(&mut kv, "k").await;
    assert!(got.found);
    assert_eq!(&got.value[..], b"value");
    assert_eq!(got.seq, expired.seq);
    assert!(got.ttl_ms_left > 0 && got.ttl_ms_left <= TTL_MS, "{got:?}");

    let persisted = kv.persist(persist_req("k")).await.unwrap().into_inner();
    assert!(persisted.found, "{persisted:?}");
    assert!(persisted.seq > expired.seq, "{persisted:?}");
    let got = get(&mut kv, "k").await;
    assert!(got.found);
    assert_eq!(&got.value[..], b"value");
    assert_eq!(got.seq, persisted.seq);
    assert_eq!(got.ttl_ms_left, 0, "{got:?}");

    // A missing key: not found, nothing written.
    let missing = kv
        .expire(expire_req(b"missing", TTL_MS))
        .await
        .unwrap()
        .into_inner();
    assert!(!missing.found, "{missing:?}");
    assert_eq!(missing.seq, 0);
    let missing = kv
        .persist(persist_req("missing"))
        .await
        .unwrap()
        .into_inner();
    assert!(!missing.found, "{missing:?}");
    assert_eq!(missing.seq, 0);
    assert!(!get(&mut kv, "missing").await.found);
    let got = get(&mut kv, "k").await;
    assert_eq!(got.seq, persisted.seq);
    assert_eq!(got.ttl_ms_left, 0);

    // Invalid inputs.
    let zero = kv.expire(expire_req(b"k", 0)).await.unwrap_err();
    assert_eq!(zero.code(), Code::InvalidArgument, "{zero:?}");
    assert!(zero.message().contains("ttl_ms"), "{zero:?}");
    let reserved = kv
        .expire(expire_req(b"\xff\xffraftcask/x", TTL_MS))
        .await
        .unwrap_err();
    assert_eq!(reserved.code(), Code::InvalidArgument);
    let big = kv
        .persist(PersistRequest {
            key: vec![b'x'; 4 * 1024 + 1].into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(big.code(), Code::InvalidArgument);
    assert!(big.message().contains("KEY_SIZE_BYTES_MAX"), "{big:?}");
    assert_eq!(get(&mut kv, "k").await.seq, persisted.seq);

    node.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_applies_all_or_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (node, mut kv) = single_node(dir.path()).await;
    let va = put(&mut kv, "a", "one").await;
    let ra = get(&mut kv, "a").await.mod_revision;

    // A holding condition, two ops on one key: atomic, consecutive versions.
    let reply = batch(
        &mut kv,
        vec![condition("a", ra), condition("b", 0)],
        vec![put_op("b", "two"), expire_op("b", TTL_MS)],
    )
    .await;
    let Some(batch_response::Outcome::Applied(applied)) = reply.outcome else {
        panic!("{reply:?}")
    };
    let results = applied.results;
    assert_eq!(results.len(), 2, "{results:?}");
    assert!(results[0].seq > va);
    assert_eq!(results[1].seq, results[0].seq + 1);
    assert!(!results[0].found, "b was absent before the put");
    assert!(results[1].found, "the expire sees the batch's put");
    let got = get(&mut kv, "b").await;
    assert!(got.found);
    assert_eq!(&got.value[..], b"two");
    assert_eq!(got.seq, results[1].seq);
    assert!(got.ttl_ms_left > 0 && got.ttl_ms_left <= TTL_MS, "{got:?}");
    let vb = results[1].seq;
    let rb = got.mod_revision;
    assert_eq!(
        rb,
        reply.header.as_ref().unwrap().revision,
        "the batch's revision"
    );

    // The second condition fails: nothing applies, and it is named.
    let reply = batch(
        &mut kv,
        vec![condition("a", ra), condition("b", 0)],
        vec![put_op("a", "changed"), put_op("c", "new")],
    )
    .await;
    assert_eq!(
        reply.outcome,
        Some(batch_response::Outcome::ConditionFailed(ConditionFailed {
            condition_index: 1,
            current_mod_revision: rb,
        }))
    );
    let a = get(&mut kv, "a").await;
    assert_eq!((&a.value[..], a.seq, a.mod_revision), (&b"one"[..], va, ra));
    assert!(!get(&mut kv, "c").await.found);

    // An expire of a missing key: nothing applies, and the op is named.
    let reply = batch(
        &mut kv,
        vec![],
        vec![put_op("c", "new"), expire_op("missing", TTL_MS)],
    )
    .await;
    assert_eq!(
        reply.outcome,
        Some(batch_response::Outcome::KeyNotFound(KeyNotFound {
            op_index: 1
        }))
    );
    assert!(!get(&mut kv, "c").await.found);
    assert!(!get(&mut kv, "missing").await.found);

    // Invalid batches are refused before anything applies.
    let unset = kv
        .batch(BatchRequest {
            session: None,
            conditions: vec![],
            ops: vec![put_op("c", "new"), BatchOp { op: None }],
        })
        .await
        .unwrap_err();
    assert_eq!(unset.code(), Code::InvalidArgument, "{unset:?}");
    let zero = kv
        .batch(BatchRequest {
            session: None,
            conditions: vec![],
            ops: vec![put_op("c", "new"), expire_op("a", 0)],
        })
        .await
        .unwrap_err();
    assert_eq!(zero.code(), Code::InvalidArgument, "{zero:?}");
    assert!(!get(&mut kv, "c").await.found);
    assert_eq!(get(&mut kv, "a").await.seq, va);
    assert_eq!(get(&mut kv, "b").await.seq, vb);

    node.shutdown(Duration::from_secs(5)).await;
}

/// Ticks: with no client writes after a short-TTL put, the leader's tick
/// entries advance cluster time, so the key expires on its own (the applied
/// index moves past the put's without any other write); a key without TTL
/// stays. Without ticks, cluster time would stop at the put's entry and the
/// key would never expire.
#[tokio::test]
async fn ticks_expire_keys_without_client_writes() {
    let dir = tempfile::tempdir().unwrap();
    let (node, mut kv) = single_node(dir.path()).await;
    put(&mut kv, "stays", "v").await;
    let reply = kv
        .put(PutRequest {
            key: b"short".to_vec().into(),
            value: b"v".to_vec().into(),
            ttl_ms: 300,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let Some(put_response::Outcome::Seq(version)) = reply.outcome else {
        panic!("ttl put: {reply:?}");
    };
    let put_index = version >> 16;
    let start = Instant::now();
    loop {
        let got = get(&mut kv, "short").await;
        if !got.found {
            break;
        }
        assert!(
            start.elapsed() < DEADLINE,
            "a 300 ms TTL key is still there after {DEADLINE:?}: {got:?}"
        );
        tokio::time::sleep(POLL).await;
    }
    let applied = node.raft().metrics().borrow().last_applied.unwrap().index;
    assert!(
        applied > put_index,
        "expiry came from entries after the put"
    );
    assert!(get(&mut kv, "stays").await.found);
    // Ticks stop once nothing is left to expire: the log stays put.
    let settled = node.raft().metrics().borrow().last_log_index;
    tokio::time::sleep(node::TICK_INTERVAL * 4).await;
    assert_eq!(
        node.raft().metrics().borrow().last_log_index,
        settled,
        "ticks went on with nothing left to expire"
    );
    node.shutdown(Duration::from_secs(5)).await;
}
