//! The etcd port's Maintenance and Auth calls and its HTTP endpoints, on
//! in-process three-member clusters:
//! - Hash and HashKV: equal on all three members once they applied the
//!   same writes; a write changes the hash; HashKV at an old revision keeps
//!   its value after later writes (and a compaction below it), a future
//!   revision and a compacted one answer etcd's errors, `compact_revision`
//!   follows the compaction; a Defragment changes no hash;
//! - Defragment through a follower: the merge runs on every member (their
//!   merge counts rise, the sealed files named are gone) and the data
//!   reads back unchanged;
//! - Snapshot: the stream counts `remaining_bytes` down in etcd's 32 KiB
//!   messages, ends with the SHA-256 of what came before, which is a
//!   multiple of 512 bytes (as `etcdctl snapshot save` demands): a backup
//!   archive the native restore accepts, then zero padding;
//! - Auth: without a token on the port Authenticate answers etcd's "not
//!   enabled"; with one, a call without a token, with a wrong `token` or a
//!   wrong bearer is refused, Authenticate refuses a wrong password and
//!   hands back a token the port then takes as `token` metadata;
//! - `GET /version` and `GET /health` over plain HTTP/1.1 (a TcpStream),
//!   with etcd's bodies and status codes (open without a token), and 405
//!   for another method.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use kvnode::NodeInfo;
use kvnode::server::security::AuthToken;
use kvnode::snapshot::backup::{RestoreOptions, restore};
use kvnode::testing::LocalCluster;
use kvproto::etcd::etcdserverpb::auth_client::AuthClient;
use kvproto::etcd::etcdserverpb::kv_client::KvClient;
use kvproto::etcd::etcdserverpb::maintenance_client::MaintenanceClient;
use kvproto::etcd::etcdserverpb::{
    AuthenticateRequest, CompactionRequest, DefragmentRequest, HashKvRequest, HashRequest,
    PutRequest, RangeRequest, SnapshotRequest,
};
use sha2::Digest as _;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tonic::Code;
use tonic::transport::Channel;

use super::etcd::{channel_with_timeout, cluster_configured as cluster, etcd_addr};

/// How long any single answer, or members catching up, may take (a loaded
/// two-core machine).
const ANSWER_WAIT: Duration = Duration::from_secs(60);
/// The cluster token of the auth test.
const TOKEN: &str = "etcd-maintenance-test-token-0123456789";

async fn channel(cluster: &LocalCluster, id: u64) -> Channel {
    channel_with_timeout(cluster, id, Some(ANSWER_WAIT)).await
}

fn put(key: &str, value: &[u8]) -> PutRequest {
    PutRequest {
        key: key.as_bytes().to_vec().into(),
        value: value.to_vec().into(),
        ..Default::default()
    }
}

/// Every key (etcdctl's `get "" --from-key`, as `"\0"`..`"\0"`).
fn everything() -> RangeRequest {
    RangeRequest {
        key: vec![0].into(),
        range_end: vec![0].into(),
        ..Default::default()
    }
}

/// HashKV(`revision`) on every member once all three report `store`
/// revision; their hashes must agree. Returns the hash.
async fn agreed_hash(cluster: &LocalCluster, revision: i64, store: i64) -> u32 {
    let deadline = Instant::now() + ANSWER_WAIT;
    loop {
        let mut answers = Vec::new();
        for id in 1..=3 {
            let mut maintenance = MaintenanceClient::new(channel(cluster, id).await);
            let answer = maintenance
                .hash_kv(HashKvRequest { revision })
                .await
                .expect("HashKV")
                .into_inner();
            answers.push(answer);
        }
        if answers
            .iter()
            .all(|a| a.header.as_ref().unwrap().revision == store)
        {
            let hashes: Vec<u32> = answers.iter().map(|a| a.hash).collect();
            assert!(
                hashes.iter().all(|h| *h == hashes[0]),
                "members that applied revision {store} disagree: {hashes:?}"
            );
            let members: Vec<u64> = answers
                .iter()
                .map(|a| a.header.as_ref().unwrap().member_id)
                .collect();
            assert_eq!(members.len(), 3);
            return hashes[0];
        }
        assert!(
            Instant::now() < deadline,
            "the members did not all reach revision {store}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// One HTTP/1.1 request on a plain TcpStream: the status code and body.
async fn http(addr: SocketAddr, method: &str, path: &str) -> (u16, String) {
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
        let request =
            format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await.expect("send");
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).await.expect("read");
        String::from_utf8(answer).expect("a text answer")
    };
    let answer = tokio::time::timeout(ANSWER_WAIT, exchange)
        .await
        .expect("an HTTP answer in time");
    let (head, body) = answer.split_once("\r\n\r\n").expect("a header block");
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {head:?}"));
    (status, body.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hashes_follow_the_applied_state_and_http_answers_as_etcd() {
    let root = tempfile::tempdir().unwrap();
    let (cluster, leader, follower) = cluster(root.path(), |_| {}).await;
    let mut kv = KvClient::new(channel(&cluster, leader).await);
    let mut last = 0;
    for i in 0..20 {
        let answer = kv
            .put(put(&format!("hash/{i:02}"), format!("v{i}").as_bytes()))
            .await
            .expect("put")
            .into_inner();
        last = answer.header.unwrap().revision;
    }
    let at_twenty = agreed_hash(&cluster, 0, last).await;
    assert_eq!(agreed_hash(&cluster, last, last).await, at_twenty);

    // Hash is the same digest at the store revision.
    let mut maintenance = MaintenanceClient::new(channel(&cluster, follower).await);
    let hash = maintenance
        .hash(HashRequest {})
        .await
        .expect("Hash")
        .into_inner();
    assert_eq!(hash.header.unwrap().revision, last);
    assert_eq!(hash.hash, at_twenty);

    // A write changes the hash; the old revision's hash stays.
    let changed = kv
        .put(put("hash/05", b"changed"))
        .await
        .expect("put")
        .into_inner()
        .header
        .unwrap()
        .revision;
    let after = agreed_hash(&cluster, 0, changed).await;
    assert_ne!(after, at_twenty, "a write did not change the hash");
    assert_eq!(agreed_hash(&cluster, last, changed).await, at_twenty);

    // Compaction: compact_revision follows it, below it is compacted,
    // above the store is a future revision.
    kv.compact(CompactionRequest {
        revision: last - 5,
        physical: true,
    })
    .await
    .expect("compact");
    // HashKV answers from the member's own applied state (as etcd's): the
    // follower reports the compaction once it has applied it.
    let deadline = Instant::now() + ANSWER_WAIT;
    let answer = loop {
        let answer = maintenance
            .hash_kv(HashKvRequest { revision: last })
            .await
            .expect("HashKV above the compaction")
            .into_inner();
        if answer.compact_revision == last - 5 {
            break answer;
        }
        assert!(
            Instant::now() < deadline,
            "the follower did not apply the compaction: {answer:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(answer.hash, at_twenty);
    let compacted = maintenance
        .hash_kv(HashKvRequest { revision: 2 })
        .await
        .expect_err("a compacted revision");
    assert_eq!(
        (compacted.code(), compacted.message()),
        (
            Code::OutOfRange,
            "etcdserver: mvcc: required revision has been compacted"
        )
    );
    let future = maintenance
        .hash_kv(HashKvRequest {
            revision: changed + 100,
        })
        .await
        .expect_err("a future revision");
    assert_eq!(
        (future.code(), future.message()),
        (
            Code::OutOfRange,
            "etcdserver: mvcc: required revision is a future revision"
        )
    );

    // No token on this port: Authenticate is etcd's "not enabled".
    let mut auth = AuthClient::new(channel(&cluster, follower).await);
    let refused = auth
        .authenticate(AuthenticateRequest {
            name: "root".into(),
            password: "anything".into(),
        })
        .await
        .expect_err("auth is not enabled");
    assert_eq!(
        (refused.code(), refused.message()),
        (
            Code::FailedPrecondition,
            "etcdserver: authentication is not enabled"
        )
    );

    // HTTP/1.1 on the same port.
    let addr = etcd_addr(&cluster, follower);
    assert_eq!(
        http(addr, "GET", "/version").await,
        (
            200,
            r#"{"etcdserver":"3.4.0","etcdcluster":"3.4.0"}"#.to_string()
        )
    );
    assert_eq!(
        http(addr, "GET", "/health").await,
        (200, r#"{"health":"true"}"#.to_string())
    );
    assert_eq!(
        http(addr, "POST", "/health").await,
        (405, "Method Not Allowed\n".to_string())
    );
    // gRPC still works after the HTTP/1.1 requests.
    let all = kv.range(everything()).await.expect("range").into_inner();
    assert_eq!(all.count, 20);
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn defragment_merges_everywhere_and_snapshot_streams_a_restorable_archive() {
    let root = tempfile::tempdir().unwrap();
    let (cluster, leader, follower) = cluster(root.path(), |config| {
        config.state_machine = crate::backup::small_segments();
        // Only the Defragment merges.
        config.merge_policy.enabled = false;
        // Etcd ports wherever the system puts them: the follower reaches
        // the leader's only by the address the leader tells.
        config.etcd_addr = Some(std::net::SocketAddr::new(config.client_addr.ip(), 0));
    })
    .await;
    let mut kv = KvClient::new(channel(&cluster, follower).await);
    let value = vec![b'x'; 1024];
    let mut last = 0;
    // Overwrites: the sealed files hold dead records for a merge to drop.
    for round in 0..4 {
        for i in 0..30 {
            let mut value = value.clone();
            value[0] = b'a' + round;
            last = kv
                .put(put(&format!("defrag/{i:02}"), &value))
                .await
                .expect("put")
                .into_inner()
                .header
                .unwrap()
                .revision;
        }
    }
    let before = agreed_hash(&cluster, 0, last).await;
    let state = |id: u64| {
        let engine = cluster.node(id).unwrap().state_machine().engine();
        (engine.sealed_data_files(), engine.stats().merges)
    };
    let sealed: BTreeMap<u64, (Vec<String>, u64)> = (1..=3).map(|id| (id, state(id))).collect();
    assert!(
        sealed.values().all(|(files, _)| files.len() > 2),
        "too few sealed files for a merge: {sealed:?}"
    );
    let mut maintenance = MaintenanceClient::new(channel(&cluster, follower).await);
    // A Defragment marked as already forwarded is not forwarded again by
    // a member that does not lead (one hop at most).
    let mut forwarded = tonic::Request::new(DefragmentRequest {});
    forwarded.metadata_mut().insert(
        kvnode::server::etcd::maintenance::DEFRAGMENT_FORWARDED_METADATA,
        tonic::metadata::MetadataValue::from_static("1"),
    );
    let refused = maintenance
        .defragment(forwarded)
        .await
        .expect_err("a forwarded Defragment on a follower");
    assert!(
        refused.message().starts_with("etcdserver: not leader"),
        "{refused:?}"
    );
    let detail = refused
        .metadata()
        .get(kvnode::server::etcd::errors::DETAIL_KEY)
        .and_then(|d| d.to_str().ok())
        .unwrap_or_default();
    assert!(
        detail.contains("not forwarded again") && !detail.contains("  "),
        "{detail:?}"
    );
    assert_eq!(state(follower), sealed[&follower], "nothing merged yet");
    let answer = maintenance
        .defragment(DefragmentRequest {})
        .await
        .expect("Defragment through a follower")
        .into_inner();
    assert!(answer.header.is_none(), "etcd 3.4's answer has no header");
    // Done on the follower when it answers; the others merge the same files.
    let merged = |id: u64| {
        let (files, merges) = state(id);
        let (old_files, old_merges) = &sealed[&id];
        merges > *old_merges && !files.iter().any(|f| old_files.contains(f))
    };
    let (files, merges) = state(follower);
    assert!(
        merges > sealed[&follower].1 || !files.iter().any(|f| sealed[&follower].0.contains(f)),
        "the follower answered before its merge: {files:?}, {merges} merges"
    );
    let deadline = Instant::now() + ANSWER_WAIT;
    while !(1..=3).all(merged) {
        assert!(Instant::now() < deadline, "not every member merged");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let all = kv.range(everything()).await.expect("range").into_inner();
    assert_eq!(all.count, 30);
    assert!(
        all.kvs
            .iter()
            .all(|kv| kv.value[0] == b'd' && kv.version == 4)
    );
    assert_eq!(
        agreed_hash(&cluster, 0, last).await,
        before,
        "a merge changed the hash"
    );

    // Snapshot on the leader.
    let mut maintenance = MaintenanceClient::new(channel(&cluster, leader).await);
    let mut stream = maintenance
        .snapshot(SnapshotRequest {})
        .await
        .expect("Snapshot")
        .into_inner();
    let mut messages = Vec::new();
    while let Some(message) = stream.message().await.expect("the snapshot stream") {
        messages.push(message);
    }
    let (sha, archive_messages) = messages.split_last().expect("messages");
    assert_eq!(sha.remaining_bytes, 0);
    let archive: Vec<u8> = archive_messages
        .iter()
        .flat_map(|m| m.blob.iter().copied())
        .collect();
    let mut sent = 0u64;
    for (i, message) in archive_messages.iter().enumerate() {
        sent += message.blob.len() as u64;
        assert_eq!(message.remaining_bytes, archive.len() as u64 - sent);
        if i + 1 < archive_messages.len() {
            assert_eq!(message.blob.len(), 32 * 1024, "message {i}");
        }
    }
    assert_eq!(sha.blob.to_vec(), sha2::Sha256::digest(&archive).to_vec());
    // What `etcdctl snapshot save` checks: 512-byte multiples, then the
    // SHA-256.
    assert_eq!(archive.len() % 512, 0);
    // The archive ends with its end magic and CRC-32, then zero padding.
    let end = archive
        .windows(8)
        .rposition(|w| w == b"RCBKDONE")
        .expect("the archive's end magic")
        + 12;
    assert!(archive.len() - end < 512);
    assert!(archive[end..].iter().all(|b| *b == 0));
    let work = tempfile::tempdir().unwrap();
    let path = work.path().join("etcd-snapshot.rcbk");
    std::fs::write(&path, &archive[..end]).unwrap();
    let initial: BTreeMap<u64, NodeInfo> = [(
        1,
        NodeInfo {
            client_addr: "127.0.0.1:1".to_string(),
            peer_addr: "127.0.0.1:2".to_string(),
        },
    )]
    .into();
    let restored = restore(RestoreOptions {
        archive: path,
        data_dir: work.path().join("restored"),
        member_id: 1,
        initial_cluster: initial,
        cluster_token: String::new(),
        state_machine: crate::backup::small_segments(),
    })
    .await
    .expect("the native restore takes the Snapshot stream's archive");
    assert!(restored.snapshot_last_log_id.index > 0);
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn authenticate_as_root_with_the_cluster_token() {
    let root = tempfile::tempdir().unwrap();
    let (cluster, _leader, follower) = cluster(root.path(), |config| {
        config.security.auth_token = Some(AuthToken::new(TOKEN).unwrap());
    })
    .await;
    let channel = channel(&cluster, follower).await;
    let mut kv = KvClient::new(channel.clone());
    let refused = kv.range(everything()).await.expect_err("no token");
    assert_eq!(
        (refused.code(), refused.message()),
        (Code::InvalidArgument, "etcdserver: user name is empty")
    );
    let mut auth = AuthClient::new(channel.clone());
    let wrong = auth
        .authenticate(AuthenticateRequest {
            name: "root".into(),
            password: "not-the-token".into(),
        })
        .await
        .expect_err("a wrong password");
    assert_eq!(
        (wrong.code(), wrong.message()),
        (
            Code::InvalidArgument,
            "etcdserver: authentication failed, invalid user ID or password"
        )
    );
    let other_user = auth
        .authenticate(AuthenticateRequest {
            name: "alice".into(),
            password: TOKEN.into(),
        })
        .await
        .expect_err("a user other than root");
    assert_eq!(other_user.code(), Code::InvalidArgument);
    let token = auth
        .authenticate(AuthenticateRequest {
            name: "root".into(),
            password: TOKEN.into(),
        })
        .await
        .expect("Authenticate as root")
        .into_inner()
        .token;
    let with = |metadata: (&'static str, &str)| {
        let mut request = tonic::Request::new(everything());
        request
            .metadata_mut()
            .insert(metadata.0, metadata.1.parse().unwrap());
        request
    };
    kv.range(with(("token", &token)))
        .await
        .expect("the token Authenticate handed back");
    let bad = kv
        .range(with(("token", "some-other-token-of-enough-length")))
        .await
        .expect_err("a wrong token");
    assert_eq!(
        (bad.code(), bad.message()),
        (Code::Unauthenticated, "etcdserver: invalid auth token")
    );
    kv.range(with(("authorization", &format!("Bearer {TOKEN}"))))
        .await
        .expect("the client port's bearer form");
    let bad_bearer = kv
        .range(with((
            "authorization",
            "Bearer some-other-token-of-enough-length",
        )))
        .await
        .expect_err("a wrong bearer");
    assert_eq!(bad_bearer.code(), Code::Unauthenticated);
    // The HTTP endpoints are open, as etcd's.
    let addr = etcd_addr(&cluster, follower);
    assert_eq!(http(addr, "GET", "/version").await.0, 200);
    assert_eq!(http(addr, "GET", "/health").await.0, 200);
    cluster.shutdown().await;
}
