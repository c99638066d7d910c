//! The admin HTTP port of a real single-node cluster (ephemeral 127.0.0.1
//! ports, a raw HTTP/1.1 client over a tokio `TcpStream`): `/health`
//! answers 200 at once; `/ready` answers 200 once the node leads and has
//! applied its commit index, and 503 "no known leader" on a member that has
//! no leader (never bootstrapped). After puts and gets over gRPC,
//! `/metrics` is well-formed exposition text (every sample line
//! `name{labels} value`, OpenMetrics content type, `# EOF` last) carrying
//! every DESIGN §6 name with values that follow from what was done: term
//! ≥ 1, is_leader 1, applied ≥ the last put's applied index, a request
//! count per op at least the requests made, one proposal op per put, at
//! least one log fsync, and exactly the keys written in the engine. In a
//! three-member cluster, a member that joins after the leader snapshotted
//! and purged its log is caught up by a snapshot transfer whose bytes the
//! leader counts as sent and the new member as received.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use kvnode::raft::types::NodeMetrics;
use kvnode::raft::watch::MetricsWatch;
use kvnode::{Listeners, Node, NodeConfig, NodeInfo};
use kvproto::kv::v1::kv_client::KvClient;
use kvproto::kv::v1::{Consistency, GetRequest, PutRequest, put_response};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const DEADLINE: Duration = Duration::from_secs(30);
const POLL: Duration = Duration::from_millis(50);
/// Largest admin answer this client reads.
const RESPONSE_BYTES_MAX: usize = 1024 * 1024;
const PUTS: u64 = 5;
const GETS: u64 = 3;

/// The DESIGN §6 metric names (histograms by their base name).
const DESIGN_NAMES: [&str; 13] = [
    "raftcask_raft_term",
    "raftcask_raft_is_leader",
    "raftcask_raft_last_log_index",
    "raftcask_raft_applied_index",
    "raftcask_snapshot_bytes_sent_total",
    "raftcask_snapshot_bytes_received_total",
    "raftcask_snapshot_files_skipped_total",
    "raftcask_engine_keys",
    "raftcask_engine_live_bytes",
    "raftcask_engine_dead_bytes",
    "raftcask_log_fsync_seconds",
    "raftcask_request_seconds",
    "raftcask_proposal_batch_ops",
];

struct HttpResponse {
    status: u16,
    headers: HashMap<String, String>,
    body: String,
}

/// One `GET` with `Connection: close`, read to the end.
async fn http_get(addr: SocketAddr, path: &str) -> HttpResponse {
    let exchange = async {
        let mut stream = TcpStream::connect(addr).await.expect("connect admin port");
        let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await.expect("send");
        let mut raw = Vec::new();
        (&mut stream)
            .take(RESPONSE_BYTES_MAX as u64 + 1)
            .read_to_end(&mut raw)
            .await
            .expect("read answer");
        assert!(raw.len() <= RESPONSE_BYTES_MAX, "answer too large");
        raw
    };
    let raw = tokio::time::timeout(DEADLINE, exchange)
        .await
        .unwrap_or_else(|_| panic!("GET {path}: no answer within {DEADLINE:?}"));
    let text = String::from_utf8(raw).expect("answer is UTF-8");
    let (head, body) = text.split_once("\r\n\r\n").expect("header end");
    let mut lines = head.split("\r\n");
    let status_line = lines.next().expect("status line");
    let status: u16 = status_line
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("bad status line {status_line:?}"));
    let headers: HashMap<String, String> = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(name, value)| (name.trim().to_ascii_lowercase(), value.trim().to_string()))
        .collect();
    let body = if headers
        .get("transfer-encoding")
        .is_some_and(|te| te.eq_ignore_ascii_case("chunked"))
    {
        dechunk(body)
    } else {
        body.to_string()
    };
    HttpResponse {
        status,
        headers,
        body,
    }
}

/// Decodes a chunked body (bounded by its own length).
fn dechunk(mut rest: &str) -> String {
    let mut body = String::new();
    for _ in 0..=rest.len() {
        let (size, after) = rest.split_once("\r\n").expect("chunk size line");
        let size = usize::from_str_radix(size.trim(), 16).expect("chunk size");
        if size == 0 {
            return body;
        }
        body.push_str(&after[..size]);
        rest = &after[size + 2..];
    }
    panic!("chunked body does not end");
}

/// The three listeners of one member, bound to ephemeral ports.
struct Ports {
    client: TcpListener,
    peer: TcpListener,
    admin: TcpListener,
}

async fn ports() -> Ports {
    let host = crate::common::private_loopback();
    Ports {
        client: TcpListener::bind((host, 0)).await.unwrap(),
        peer: TcpListener::bind((host, 0)).await.unwrap(),
        admin: TcpListener::bind((host, 0)).await.unwrap(),
    }
}

fn info(ports: &Ports) -> NodeInfo {
    NodeInfo {
        client_addr: ports.client.local_addr().unwrap().to_string(),
        peer_addr: ports.peer.local_addr().unwrap().to_string(),
    }
}

/// Starts member `id` with an admin listener; returns it and the admin
/// address.
async fn start_member(
    id: u64,
    dir: &Path,
    cluster: &BTreeMap<u64, NodeInfo>,
    bootstrap: bool,
    ports: Ports,
) -> (Node, SocketAddr) {
    let admin_addr = ports.admin.local_addr().unwrap();
    let mut config = NodeConfig::new(
        id,
        dir,
        ports.client.local_addr().unwrap(),
        ports.peer.local_addr().unwrap(),
        cluster.clone(),
    );
    config.bootstrap = bootstrap;
    config.admin_addr = Some(admin_addr);
    let listeners = Listeners {
        client: ports.client,
        peer: ports.peer,
        admin: Some(ports.admin),
    };
    let node = Node::start_with_listeners(config, listeners)
        .await
        .expect("start node");
    (node, admin_addr)
}

/// Starts member 1 of a one-member cluster (bootstrapping if `bootstrap`).
async fn start(dir: &Path, bootstrap: bool) -> (Node, SocketAddr) {
    let ports = ports().await;
    let cluster = BTreeMap::from([(1, info(&ports))]);
    start_member(1, dir, &cluster, bootstrap, ports).await
}

/// Splits a sample line `name{labels} value` into (series, value); `None`
/// if the line is not one.
fn sample(line: &str) -> Option<(&str, f64)> {
    let (series, value) = line.rsplit_once(' ')?;
    let value: f64 = value.parse().ok()?;
    let name_end = series.find('{').unwrap_or(series.len());
    let name = &series[..name_end];
    let name_ok = !name.is_empty()
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':');
    if !name_ok {
        return None;
    }
    if name_end < series.len() {
        let labels = series[name_end..].strip_prefix('{')?.strip_suffix('}')?;
        for label in labels.split(',') {
            let (key, quoted) = label.split_once('=')?;
            let key_ok =
                !key.is_empty() && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            if !key_ok || quoted.len() < 2 || !quoted.starts_with('"') || !quoted.ends_with('"') {
                return None;
            }
        }
    }
    Some((series, value))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_health_and_ready_of_a_single_node() {
    let dir = tempfile::tempdir().unwrap();
    let (node, admin) = start(dir.path(), true).await;

    let health = http_get(admin, "/health").await;
    assert_eq!(health.status, 200, "/health: {}", health.body);
    assert_eq!(health.body, "ok member 1\n");

    // Ready once the node leads and has applied what it knows committed.
    let start = Instant::now();
    let ready = loop {
        let ready = http_get(admin, "/ready").await;
        if ready.status == 200 {
            break ready;
        }
        assert_eq!(ready.status, 503, "/ready: {}", ready.body);
        assert!(
            start.elapsed() < DEADLINE,
            "not ready within {DEADLINE:?}: {}",
            ready.body
        );
        tokio::time::sleep(POLL).await;
    };
    assert!(
        ready.body.starts_with("ready: member 1, leader 1"),
        "{}",
        ready.body
    );
    assert_eq!(node.raft().metrics().borrow().current_leader, Some(1));

    let mut kv = KvClient::connect(format!("http://{}", node.client_addr()))
        .await
        .expect("connect");
    let mut last_applied = 0;
    for i in 0..PUTS {
        let reply = kv
            .put(PutRequest {
                key: format!("key{i}").into_bytes().into(),
                value: b"value".to_vec().into(),
                ..Default::default()
            })
            .await
            .expect("put")
            .into_inner();
        assert!(matches!(reply.outcome, Some(put_response::Outcome::Seq(_))));
        last_applied = reply.header.expect("header").applied_index;
    }
    for i in 0..GETS {
        let reply = kv
            .get(GetRequest {
                key: format!("key{i}").into_bytes().into(),
                consistency: Consistency::Linearizable as i32,
                min_index: 0,
            })
            .await
            .expect("get")
            .into_inner();
        assert!(reply.found);
    }

    let scrape = http_get(admin, "/metrics").await;
    assert_eq!(scrape.status, 200);
    let content_type = scrape.headers.get("content-type").expect("content type");
    assert!(
        content_type.starts_with("application/openmetrics-text"),
        "content type {content_type}"
    );
    let text = scrape.body;
    assert!(text.ends_with("# EOF\n"), "no `# EOF` at the end:\n{text}");
    let mut samples: HashMap<&str, f64> = HashMap::new();
    for line in text.lines() {
        if line.starts_with('#') {
            continue;
        }
        let (series, value) =
            sample(line).unwrap_or_else(|| panic!("not a sample line: {line:?}\n{text}"));
        assert!(
            samples.insert(series, value).is_none(),
            "series twice: {series}"
        );
    }
    let value = |series: &str| -> f64 {
        *samples
            .get(series)
            .unwrap_or_else(|| panic!("no series {series} in\n{text}"))
    };
    for name in DESIGN_NAMES {
        let present = samples.keys().any(|series| {
            series.strip_prefix(name).is_some_and(|rest| {
                rest.is_empty()
                    || rest.starts_with('{')
                    || ["_bucket", "_count", "_sum"]
                        .iter()
                        .any(|s| rest.starts_with(s))
            })
        });
        assert!(present, "metric {name} missing:\n{text}");
        assert!(
            text.contains(&format!("# HELP {}", name.trim_end_matches("_total"))),
            "no HELP for {name}"
        );
    }
    assert!(value("raftcask_raft_term") >= 1.0);
    assert_eq!(value("raftcask_raft_is_leader"), 1.0);
    assert!(value("raftcask_raft_applied_index") >= last_applied as f64);
    assert!(value("raftcask_raft_last_log_index") >= value("raftcask_raft_applied_index"));
    assert!(value("raftcask_raft_commit_index") >= last_applied as f64);
    assert_eq!(value("raftcask_engine_keys"), PUTS as f64);
    assert!(value("raftcask_engine_live_bytes") > 0.0);
    assert!(value("raftcask_engine_dead_bytes") >= 0.0);
    assert_eq!(value("raftcask_snapshot_bytes_sent_total"), 0.0);
    assert_eq!(value("raftcask_snapshot_bytes_received_total"), 0.0);
    assert_eq!(value("raftcask_snapshot_files_skipped_total"), 0.0);
    assert!(value("raftcask_log_fsync_seconds_count") >= 1.0);
    assert!(value("raftcask_log_fsync_seconds_sum") > 0.0);
    assert!(value("raftcask_request_seconds_count{op=\"put\"}") >= PUTS as f64);
    assert!(value("raftcask_request_seconds_count{op=\"get\"}") >= GETS as f64);
    assert_eq!(value("raftcask_request_seconds_count{op=\"scan\"}"), 0.0);
    assert!(value("raftcask_proposal_batch_ops_count") >= 1.0);
    // Every put is one request of one op, and only client requests go
    // through the batcher.
    assert_eq!(value("raftcask_proposal_batch_ops_sum"), PUTS as f64);
    assert_eq!(
        value("raftcask_proposal_batch_ops_bucket{le=\"+Inf\"}"),
        value("raftcask_proposal_batch_ops_count")
    );

    let missing = http_get(admin, "/nothing").await;
    assert_eq!(missing.status, 404);

    node.shutdown(Duration::from_secs(5)).await;
    // The admin port closed with the node.
    assert!(
        TcpStream::connect(admin).await.is_err(),
        "the admin port still accepts after shutdown"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_without_a_leader_is_healthy_but_not_ready() {
    let dir = tempfile::tempdir().unwrap();
    // Never bootstrapped: no log, no leader, ever.
    let (node, admin) = start(dir.path(), false).await;
    let health = http_get(admin, "/health").await;
    assert_eq!(health.status, 200, "/health: {}", health.body);
    let ready = http_get(admin, "/ready").await;
    assert_eq!(ready.status, 503, "/ready: {}", ready.body);
    assert_eq!(ready.body, "not ready: no known leader\n");
    let scrape = http_get(admin, "/metrics").await;
    assert_eq!(scrape.status, 200);
    assert!(
        scrape.body.contains("\nraftcask_raft_is_leader 0\n"),
        "{}",
        scrape.body
    );
    node.shutdown(Duration::from_secs(5)).await;
}

/// Polls `check` on a node's Raft metrics until it holds.
async fn wait_raft(node: &Node, what: &str, check: impl Fn(&NodeMetrics) -> bool) {
    let start = Instant::now();
    while !check(&node.raft().metrics().borrow()) {
        assert!(
            start.elapsed() < DEADLINE,
            "member {}: {what} not reached within {DEADLINE:?}",
            node.id()
        );
        tokio::time::sleep(POLL).await;
    }
}

/// The value of an unlabelled series in a scrape.
fn scraped(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|value| value.parse().ok())
        .unwrap_or_else(|| panic!("no series {series} in\n{text}"))
}

/// A member that joins after the leader snapshotted and purged its log is
/// caught up by a snapshot transfer: the leader counts the bytes it sent,
/// the new member the bytes it received (also on its `/metrics`), and no
/// member counts the other direction.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshot_transfer_bytes_are_counted_on_both_sides() {
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let mut all_ports = Vec::new();
    for _ in 0..3 {
        all_ports.push(ports().await);
    }
    let cluster: BTreeMap<u64, NodeInfo> = all_ports
        .iter()
        .enumerate()
        .map(|(i, ports)| (i as u64 + 1, info(ports)))
        .collect();
    let third = all_ports.pop().unwrap();
    let mut nodes = Vec::new();
    for (i, ports) in all_ports.into_iter().enumerate() {
        let id = i as u64 + 1;
        nodes.push(start_member(id, dirs[i].path(), &cluster, id == 1, ports).await);
    }
    // Both members agree on a leader.
    let start = Instant::now();
    let leader_id = loop {
        let leaders: Vec<_> = nodes
            .iter()
            .map(|(n, _)| n.raft().metrics().borrow().current_leader)
            .collect();
        if let Some(Some(leader)) = leaders.first()
            && leaders.iter().all(|l| *l == Some(*leader))
        {
            break *leader;
        }
        assert!(start.elapsed() < DEADLINE, "no agreed leader: {leaders:?}");
        tokio::time::sleep(POLL).await;
    };
    let (leader, _) = nodes.iter().find(|(n, _)| n.id() == leader_id).unwrap();
    let mut kv = KvClient::connect(format!("http://{}", leader.client_addr()))
        .await
        .expect("connect");
    // Two rounds of writes, each followed by a snapshot and a purge, so the
    // late member cannot catch up from the log.
    let mut applied = 0;
    for round in 0..2 {
        for i in round * 10..(round + 1) * 10 {
            let reply = kv
                .put(PutRequest {
                    key: format!("key{i:02}").into_bytes().into(),
                    value: vec![b'v'; 1000].into(),
                    ..Default::default()
                })
                .await
                .expect("put")
                .into_inner();
            applied = reply.header.expect("header").applied_index;
        }
        leader.raft().trigger().snapshot().await.unwrap();
        wait_raft(leader, "snapshot", |m| {
            m.snapshot.map_or(0, |s| s.index) >= applied
        })
        .await;
        let snapshot_index = leader.raft().metrics().borrow().snapshot.unwrap().index;
        leader
            .raft()
            .trigger()
            .purge_log(snapshot_index)
            .await
            .unwrap();
        wait_raft(leader, "purge", |m| {
            m.purged.map_or(0, |p| p.index) >= snapshot_index
        })
        .await;
    }
    assert_eq!(
        leader.metrics().snapshot_bytes_sent(),
        0,
        "nothing sent yet"
    );

    nodes.push(start_member(3, dirs[2].path(), &cluster, false, third).await);
    let (late, late_admin) = nodes.last().unwrap();
    wait_raft(late, "snapshot installed and applied", |m| {
        m.snapshot.is_some() && m.last_applied.map_or(0, |l| l.index) >= applied
    })
    .await;
    let (leader, _) = nodes.iter().find(|(n, _)| n.id() == leader_id).unwrap();
    let sent = leader.metrics().snapshot_bytes_sent();
    let received = late.metrics().snapshot_bytes_received();
    // 20 values of 1000 bytes live in the snapshot's files.
    assert!(received >= 20 * 1000, "received {received} bytes");
    assert!(sent >= received, "sent {sent} < received {received}");
    assert_eq!(leader.metrics().snapshot_bytes_received(), 0);
    assert_eq!(late.metrics().snapshot_bytes_sent(), 0);
    let scrape = http_get(*late_admin, "/metrics").await;
    assert_eq!(
        scraped(&scrape.body, "raftcask_snapshot_bytes_received_total"),
        received as f64
    );
    assert_eq!(
        scraped(&scrape.body, "raftcask_engine_keys"),
        20.0,
        "the late member holds every key"
    );

    drop(kv);
    for (node, _) in nodes {
        node.shutdown(Duration::from_secs(5)).await;
    }
}
