//! Limits under load on one in-process member (private loopback address):
//! - a flood of 2000 idle TCP connections: the ones past the client port's
//!   connection cap are closed at once, the rest once the handshake
//!   deadline passes, and a normal put and get succeed within the deadline;
//! - oversized messages: a message over the kv service's decoding limit is
//!   refused naming the limit in bytes, a value over VALUE_SIZE_BYTES_MAX
//!   is refused naming it, an oversized header list is refused, and the
//!   member keeps serving;
//! - in-flight overload: with the client port's in-flight cap taken by
//!   requests that wait, more requests are answered RESOURCE_EXHAUSTED at
//!   once (naming CLIENT_INFLIGHT_MAX), and the member serves normally
//!   once they finish.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use kvnode::server::limits::Limits;
use kvnode::{Node, NodeConfig, NodeInfo};
use kvproto::kv::v1::kv_client::KvClient;
use kvproto::kv::v1::{Consistency, GetRequest, PutRequest, error_detail};
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;
use tonic::Code;
use tonic::transport::Channel;

use crate::common::private_loopback;

/// Deadline of any wait on the member.
const DEADLINE: Duration = Duration::from_secs(30);
/// Pause between polls.
const POLL: Duration = Duration::from_millis(50);
/// Idle connections the flood opens.
const FLOOD_CONNECTIONS: usize = 2000;
/// The client port's connection cap in the flood test.
const FLOOD_CAP: usize = 200;
/// The handshake deadline in the flood test.
const FLOOD_HANDSHAKE: Duration = Duration::from_secs(5);
/// How long the member gets to close the connections past its cap.
const FLOOD_SETTLE: Duration = Duration::from_millis(500);
/// The in-flight cap in the overload test.
const INFLIGHT_CAP: usize = 4;
/// Requests sent at once in the overload test.
const OVERLOAD_REQUESTS: usize = 40;

/// A bootstrapped one-member cluster with `limits`, in `dir`.
pub async fn single_member(dir: &std::path::Path, limits: Limits) -> Node {
    single_member_configured(dir, limits, |_| {}).await
}

/// [`single_member`], its configuration changed by `configure` last.
pub async fn single_member_configured(
    dir: &std::path::Path,
    limits: Limits,
    configure: impl FnOnce(&mut NodeConfig),
) -> Node {
    let host = private_loopback();
    let client = tokio::net::TcpListener::bind((host, 0)).await.unwrap();
    let peer = tokio::net::TcpListener::bind((host, 0)).await.unwrap();
    let (client_addr, peer_addr) = (client.local_addr().unwrap(), peer.local_addr().unwrap());
    let info = NodeInfo {
        client_addr: client_addr.to_string(),
        peer_addr: peer_addr.to_string(),
    };
    let mut config = NodeConfig::new(1, dir, client_addr, peer_addr, BTreeMap::from([(1, info)]));
    config.bootstrap = true;
    config.limits = limits;
    configure(&mut config);
    Node::start_with_listeners(
        config,
        kvnode::Listeners {
            client,
            peer,
            admin: None,
        },
    )
    .await
    .expect("start the member")
}

/// A kv client of `addr` (each call a fresh connection).
pub async fn kv(addr: SocketAddr) -> Result<KvClient<Channel>, String> {
    Channel::from_shared(format!("http://{addr}"))
        .map_err(|err| err.to_string())?
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(15))
        .connect()
        .await
        .map(|channel| {
            KvClient::new(channel)
                .max_encoding_message_size(64 * 1024 * 1024)
                .max_decoding_message_size(64 * 1024 * 1024)
        })
        .map_err(|err| format!("connect {addr}: {err}"))
}

pub fn put_request(key: &str, value: Vec<u8>) -> PutRequest {
    PutRequest {
        key: key.as_bytes().to_vec().into(),
        value: value.into(),
        ..Default::default()
    }
}

/// Puts `key` = `value` and reads it back (linearizable), retrying on any
/// error until [`DEADLINE`]: the member is responsive.
pub async fn put_and_get(addr: SocketAddr, key: &str, value: &str) {
    let started = Instant::now();
    let mut last = String::new();
    while started.elapsed() < DEADLINE {
        let attempt = async {
            let mut client = kv(addr).await?;
            client
                .put(put_request(key, value.as_bytes().to_vec()))
                .await
                .map_err(|s| format!("put: {s:?}"))?;
            let got = client
                .get(GetRequest {
                    key: key.as_bytes().to_vec().into(),
                    consistency: Consistency::Linearizable as i32,
                    min_index: 0,
                })
                .await
                .map_err(|s| format!("get: {s:?}"))?
                .into_inner();
            Ok::<_, String>(got.value)
        };
        match attempt.await {
            Ok(got) if got.as_ref() == value.as_bytes() => return,
            Ok(got) => panic!("{key} read back {got:?}, wrote {value:?}"),
            Err(err) => last = err,
        }
        tokio::time::sleep(POLL).await;
    }
    panic!("the member did not take a put and get of {key} within {DEADLINE:?}: {last}");
}

/// Whether the server has closed `stream` (EOF or reset) by now, without
/// waiting.
fn closed_now(stream: &TcpStream) -> bool {
    let mut buf = [0u8; 64];
    for _ in 0..16 {
        match stream.try_read(&mut buf) {
            Ok(0) => return true,
            // The server's HTTP/2 settings, if it sent any: read on.
            Ok(_) => continue,
            Err(err) if err.kind() == std::io::ErrorKind::WouldBlock => return false,
            Err(_) => return true,
        }
    }
    false
}

/// Whether the server closed `stream` (EOF or reset) within `wait`.
async fn closed_within(stream: &mut TcpStream, wait: Duration) -> bool {
    let mut buf = [0u8; 64];
    loop {
        match tokio::time::timeout(wait, stream.read(&mut buf)).await {
            Err(_) => return false,
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            // The server's HTTP/2 settings, if it sent any: keep reading.
            Ok(Ok(_)) => continue,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn connection_flood_leaves_the_member_responsive() {
    let dir = tempfile::tempdir().unwrap();
    let node = single_member(
        dir.path(),
        Limits {
            client_connections_max: FLOOD_CAP,
            handshake_timeout: FLOOD_HANDSHAKE,
            ..Limits::default()
        },
    )
    .await;
    let addr = node.client_addr();
    put_and_get(addr, "before", "flood").await;

    // The flood: connect, send nothing.
    let started = Instant::now();
    let mut flood = Vec::with_capacity(FLOOD_CONNECTIONS);
    for i in 0..FLOOD_CONNECTIONS {
        assert!(
            started.elapsed() < DEADLINE,
            "opening {FLOOD_CONNECTIONS} connections took over {DEADLINE:?} (at {i})"
        );
        match tokio::time::timeout(Duration::from_secs(5), TcpStream::connect(addr)).await {
            Ok(Ok(stream)) => flood.push(stream),
            Ok(Err(err)) => panic!("flood connection {i}: {err}"),
            Err(_) => panic!("flood connection {i} did not connect within 5 s"),
        }
    }
    // Past the cap, connections are closed at once (well before the
    // handshake deadline).
    tokio::time::sleep(FLOOD_SETTLE).await;
    let closed_at_once = flood.iter().filter(|stream| closed_now(stream)).count();
    assert!(
        started.elapsed() < FLOOD_HANDSHAKE,
        "the flood took {:?}, longer than the handshake deadline: cannot tell the cap's closes apart",
        started.elapsed()
    );
    assert!(
        closed_at_once >= FLOOD_CONNECTIONS - FLOOD_CAP - 50,
        "only {closed_at_once} of {FLOOD_CONNECTIONS} idle connections were closed at once; the \
         cap is {FLOOD_CAP}"
    );
    // The responsive member: a put and get get through (once silent
    // connections lose their slot at the handshake deadline).
    put_and_get(addr, "during", "flood").await;
    // Every silent connection is closed by the handshake deadline.
    let mut open = 0;
    for stream in &mut flood {
        if !closed_within(stream, FLOOD_HANDSHAKE * 3).await {
            open += 1;
        }
    }
    assert_eq!(
        open, 0,
        "{open} silent connections still open after the handshake deadline"
    );
    drop(flood);
    put_and_get(addr, "after", "flood").await;
    node.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_messages_are_refused_naming_the_limit() {
    let dir = tempfile::tempdir().unwrap();
    let node = single_member(dir.path(), Limits::default()).await;
    let addr = node.client_addr();
    put_and_get(addr, "before", "big").await;
    let mut client = kv(addr).await.unwrap();

    // Over the message limit: refused by the decoder, naming its bytes.
    let message_max = kvnode::server::kv::CLIENT_MESSAGE_BYTES_MAX;
    let status = client
        .put(put_request("huge", vec![7; message_max + 1024]))
        .await
        .expect_err("a message over CLIENT_MESSAGE_BYTES_MAX must be refused");
    assert_eq!(status.code(), Code::OutOfRange, "{status:?}");
    assert!(
        status.message().contains(&message_max.to_string()),
        "the error names the limit of {message_max} bytes: {status:?}"
    );

    // Over the value limit but within the message: named by the kv service.
    let value_max = kvnode::server::convert::VALUE_SIZE_BYTES_MAX;
    let status = client
        .put(put_request("big", vec![7; value_max + 1]))
        .await
        .expect_err("a value over VALUE_SIZE_BYTES_MAX must be refused");
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(
        status.message().contains("VALUE_SIZE_BYTES_MAX"),
        "{status:?}"
    );

    // Metadata well within HEADER_LIST_BYTES_MAX passes; a header list
    // over it is refused.
    let header_max = kvnode::server::limits::HEADER_LIST_BYTES_MAX as usize;
    let mut request = tonic::Request::new(put_request("headers", b"v".to_vec()));
    let filler = "h".repeat(header_max / 2);
    request
        .metadata_mut()
        .insert("x-filler", filler.parse().unwrap());
    client
        .put(request)
        .await
        .expect("metadata of half HEADER_LIST_BYTES_MAX is accepted");
    let mut request = tonic::Request::new(put_request("headers", b"v".to_vec()));
    let filler = "h".repeat(header_max + 1);
    request
        .metadata_mut()
        .insert("x-filler", filler.parse().unwrap());
    let status = kv(addr)
        .await
        .unwrap()
        .put(request)
        .await
        .expect_err("a header list over HEADER_LIST_BYTES_MAX must be refused");
    assert_ne!(status.code(), Code::Ok, "{status:?}");

    put_and_get(addr, "after", "big").await;
    node.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inflight_overload_answers_resource_exhausted() {
    let dir = tempfile::tempdir().unwrap();
    let node = single_member(
        dir.path(),
        Limits {
            client_inflight_max: INFLIGHT_CAP,
            ..Limits::default()
        },
    )
    .await;
    let addr = node.client_addr();
    put_and_get(addr, "before", "overload").await;

    // Stale reads of an index far ahead each wait MIN_INDEX_WAIT, holding
    // their slot; sent together, all but INFLIGHT_CAP are refused at once.
    let client = kv(addr).await.unwrap();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..OVERLOAD_REQUESTS {
        let mut client = client.clone();
        tasks.spawn(async move {
            let started = Instant::now();
            let result = client
                .get(GetRequest {
                    key: b"before".to_vec().into(),
                    consistency: Consistency::Stale as i32,
                    min_index: u64::MAX,
                })
                .await;
            (result.map(|_| ()), started.elapsed())
        });
    }
    let mut exhausted = 0;
    let mut waited = 0;
    while let Some(joined) = tasks.join_next().await {
        let (result, took) = joined.unwrap();
        let status = result.expect_err("min_index u64::MAX is never reached");
        match status.code() {
            Code::ResourceExhausted => {
                assert!(
                    status.message().contains("CLIENT_INFLIGHT_MAX"),
                    "{status:?}"
                );
                assert!(
                    matches!(
                        kvnode::server::convert::detail_of(&status).and_then(|d| d.detail),
                        Some(error_detail::Detail::LimitExceeded(l))
                            if l.limit == kvnode::server::limits::INFLIGHT_LIMIT
                    ),
                    "the answer carries the LimitExceeded detail kvclient retries on: {status:?}"
                );
                assert!(took < Duration::from_secs(2), "refused only after {took:?}");
                exhausted += 1;
            }
            Code::Unavailable => waited += 1,
            _ => panic!("unexpected answer {status:?}"),
        }
    }
    assert!(
        waited <= INFLIGHT_CAP,
        "{waited} requests were handled at once; the cap is {INFLIGHT_CAP}"
    );
    assert!(
        exhausted >= OVERLOAD_REQUESTS - INFLIGHT_CAP,
        "only {exhausted} of {OVERLOAD_REQUESTS} were refused RESOURCE_EXHAUSTED"
    );
    put_and_get(addr, "after", "overload").await;
    node.shutdown(Duration::from_secs(5)).await;
}
