//! The Redis (RESP) port end to end, on in-process clusters of real
//! members, through a small RESP client written here (its parser is
//! independent of the node's):
//! - strings, keys and hashes answer as Redis does (exact reply bytes);
//! - a pipeline of 200 commands on one connection is answered in order, a
//!   GET after a SET in the same pipeline seeing it; inline commands
//!   (telnet, nc) work;
//! - RESP3 after `HELLO 3` (maps, nulls), and back to RESP2;
//! - errors: unknown commands, arity, syntax, and a request over a limit
//!   (answered `-ERR` naming it, then the connection closes); the member
//!   keeps serving after random bytes from the network;
//! - a follower forwards writes to the leader (SET, INCRBY, WATCH and
//!   MULTI/EXEC), serves linearizable reads of what the leader
//!   acknowledged, and with READONLY reads stale yet sees its connection's
//!   own writes; forwarded writes apply exactly once when the leader's
//!   replies are lost, also 2400 of them in flight from 600 connections;
//!   a removed leader refuses writes without spinning;
//! - MULTI/EXEC applied as one unit, EXECABORT after a queue-time error,
//!   WATCH making EXEC answer nil when another connection wrote the key
//!   or its TTL ran out, a block of reads answered by a follower,
//!   and a counter incremented under WATCH by eight clients ends exact;
//! - AUTH with the cluster's token, HELLO AUTH, NOAUTH before;
//! - the connection cap answers `-ERR max number of clients reached`;
//! - SCAN with a small COUNT visits every key once, KEYS globs, TTLs,
//!   WAIT counts the followers holding the write, CLIENT and INFO;
//! - every command of the table, sent 3000 times with arguments drawn from
//!   a vocabulary of edge cases (empty, huge, negative, overflowing,
//!   reserved-prefix keys, glob characters, options), gets a reply and
//!   leaves the connection serving;
//! - a deleted hash larger than one entry's housekeeping loses all its
//!   field records with no client write after the DEL (the leader's tick
//!   loop proposes entries while housekeeping is due);
//! - with TLS on the member, the Redis port speaks TLS with the node's
//!   certificate (and with client certificates demanded, a client without
//!   one gets no session).

use std::net::SocketAddr;
use std::time::Duration;

use kvnode::testing::LocalCluster;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

/// How long any reply may take before the test fails.
const REPLY_TIMEOUT: Duration = Duration::from_secs(20);
/// How long a cluster may take to elect its first leader.
const LEADER_WAIT: Duration = Duration::from_secs(30);

/// A decoded reply (RESP2 and RESP3).
#[derive(Clone, Debug, PartialEq)]
enum R {
    Simple(String),
    Error(String),
    Int(i64),
    Bulk(Vec<u8>),
    Nil,
    Array(Vec<R>),
    NilArray,
    Map(Vec<(R, R)>),
    Set(Vec<R>),
    Verbatim(String),
}

fn bulk(text: &str) -> R {
    R::Bulk(text.as_bytes().to_vec())
}

fn ok() -> R {
    R::Simple("OK".into())
}

/// A RESP client over one connection.
struct Client {
    stream: TcpStream,
    buf: Vec<u8>,
}

impl Client {
    async fn connect(addr: SocketAddr) -> Client {
        let stream = TcpStream::connect(addr)
            .await
            .expect("connect to the Redis port");
        stream.set_nodelay(true).unwrap();
        Client {
            stream,
            buf: Vec::new(),
        }
    }

    fn encode(args: &[&[u8]]) -> Vec<u8> {
        let mut out = format!("*{}\r\n", args.len()).into_bytes();
        for arg in args {
            out.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
            out.extend_from_slice(arg);
            out.extend_from_slice(b"\r\n");
        }
        out
    }

    async fn send_raw(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).await.expect("send");
    }

    async fn call(&mut self, args: &[&str]) -> R {
        let args: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
        self.send_raw(&Self::encode(&args)).await;
        self.read().await
    }

    /// The next reply; panics on a closed connection.
    async fn read(&mut self) -> R {
        self.try_read()
            .await
            .expect("a reply, not a closed connection")
    }

    /// The next reply, `None` once the server closed the connection.
    async fn try_read(&mut self) -> Option<R> {
        loop {
            if let Some((reply, used)) = parse(&self.buf) {
                self.buf.drain(..used);
                return Some(reply);
            }
            let mut chunk = [0u8; 64 * 1024];
            let n = tokio::time::timeout(REPLY_TIMEOUT, self.stream.read(&mut chunk))
                .await
                .expect("a reply in time")
                .unwrap_or(0);
            if n == 0 {
                return None;
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }
}

/// One reply from the front of `buf` and the bytes it took.
fn parse(buf: &[u8]) -> Option<(R, usize)> {
    let end = buf.windows(2).position(|w| w == b"\r\n")?;
    let line = std::str::from_utf8(&buf[1..end]).ok()?;
    let rest = end + 2;
    let number = || line.parse::<i64>().ok();
    let aggregate = |count: usize, buf: &[u8]| -> Option<(Vec<R>, usize)> {
        let mut items = Vec::new();
        let mut used = rest;
        for _ in 0..count {
            let (item, n) = parse(&buf[used..])?;
            items.push(item);
            used += n;
        }
        Some((items, used))
    };
    Some(match buf[0] {
        b'+' => (R::Simple(line.to_string()), rest),
        b'-' => (R::Error(line.to_string()), rest),
        b':' => (R::Int(number()?), rest),
        b'_' => (R::Nil, rest),
        b'$' | b'=' => {
            let len = number()?;
            if len < 0 {
                return Some((R::Nil, rest));
            }
            let len = len as usize;
            if buf.len() < rest + len + 2 {
                return None;
            }
            let data = buf[rest..rest + len].to_vec();
            if buf[0] == b'=' {
                (
                    R::Verbatim(String::from_utf8_lossy(&data[4..]).into_owned()),
                    rest + len + 2,
                )
            } else {
                (R::Bulk(data), rest + len + 2)
            }
        }
        b'*' | b'~' => {
            let count = number()?;
            if count < 0 {
                return Some((R::NilArray, rest));
            }
            let (items, used) = aggregate(count as usize, buf)?;
            if buf[0] == b'~' {
                (R::Set(items), used)
            } else {
                (R::Array(items), used)
            }
        }
        b'%' => {
            let count = number()? as usize;
            let (items, used) = aggregate(2 * count, buf)?;
            let mut pairs = Vec::new();
            let mut items = items.into_iter();
            while let (Some(k), Some(v)) = (items.next(), items.next()) {
                pairs.push((k, v));
            }
            (R::Map(pairs), used)
        }
        other => panic!("unexpected reply type byte {other:?} in {buf:?}"),
    })
}

/// A cluster of `members` with a Redis port each, and its leader.
async fn cluster(root: &std::path::Path, members: u64) -> (LocalCluster, u64) {
    cluster_configured(root, members, |_| {}).await
}

async fn cluster_configured(
    root: &std::path::Path,
    members: u64,
    mut configure: impl FnMut(&mut kvnode::NodeConfig),
) -> (LocalCluster, u64) {
    let cluster = LocalCluster::start_configured(root, members, |config| {
        config.redis_addr = Some(SocketAddr::new(config.client_addr.ip(), 0));
        configure(config);
    })
    .await
    .expect("start the cluster");
    let leader = cluster
        .wait_for_leader(LEADER_WAIT)
        .await
        .expect("a leader");
    (cluster, leader)
}

/// A three-member cluster, its leader, and each member's fault switches.
async fn cluster_with_faults(
    root: &std::path::Path,
) -> (
    LocalCluster,
    u64,
    std::collections::BTreeMap<u64, kvnode::Faults>,
) {
    let faults = std::sync::Mutex::new(std::collections::BTreeMap::new());
    let (cluster, leader) = cluster_configured(root, 3, |config| {
        faults
            .lock()
            .unwrap()
            .insert(config.id, config.faults.clone());
    })
    .await;
    (cluster, leader, faults.into_inner().unwrap())
}

fn redis_addr(cluster: &LocalCluster, id: u64) -> SocketAddr {
    cluster
        .node(id)
        .expect("a running member")
        .redis_addr()
        .expect("a Redis port")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strings_keys_and_hashes_answer_as_redis() {
    let root = tempfile::tempdir().unwrap();
    let (cluster, leader) = cluster(root.path(), 1).await;
    let mut c = Client::connect(redis_addr(&cluster, leader)).await;
    assert_eq!(c.call(&["PING"]).await, R::Simple("PONG".into()));
    assert_eq!(c.call(&["SET", "greeting", "hello"]).await, ok());
    assert_eq!(c.call(&["GET", "greeting"]).await, bulk("hello"));
    assert_eq!(c.call(&["GET", "missing"]).await, R::Nil);
    assert_eq!(c.call(&["SET", "greeting", "hi", "NX"]).await, R::Nil);
    assert_eq!(
        c.call(&["SET", "greeting", "hi", "XX", "GET"]).await,
        bulk("hello")
    );
    assert_eq!(c.call(&["APPEND", "greeting", "!"]).await, R::Int(3));
    assert_eq!(c.call(&["STRLEN", "greeting"]).await, R::Int(3));
    assert_eq!(
        c.call(&["GETRANGE", "greeting", "0", "-2"]).await,
        bulk("hi")
    );
    assert_eq!(c.call(&["INCR", "n"]).await, R::Int(1));
    assert_eq!(c.call(&["INCRBY", "n", "41"]).await, R::Int(42));
    assert_eq!(c.call(&["DECRBY", "n", "2"]).await, R::Int(40));
    assert_eq!(c.call(&["INCRBYFLOAT", "f", "1.5"]).await, bulk("1.5"));
    assert_eq!(
        c.call(&["INCR", "greeting"]).await,
        R::Error("ERR value is not an integer or out of range".into())
    );
    assert_eq!(c.call(&["MSET", "a", "1", "b", "2"]).await, ok());
    assert_eq!(
        c.call(&["MGET", "a", "b", "nope"]).await,
        R::Array(vec![bulk("1"), bulk("2"), R::Nil])
    );
    assert_eq!(c.call(&["MSETNX", "a", "9", "c", "3"]).await, R::Int(0));
    assert_eq!(c.call(&["EXISTS", "a", "b", "c", "a"]).await, R::Int(3));
    assert_eq!(
        c.call(&["HSET", "h", "f1", "v1", "f2", "v2"]).await,
        R::Int(2)
    );
    assert_eq!(c.call(&["HGET", "h", "f1"]).await, bulk("v1"));
    assert_eq!(c.call(&["HLEN", "h"]).await, R::Int(2));
    assert_eq!(
        c.call(&["HGETALL", "h"]).await,
        R::Array(vec![bulk("f1"), bulk("v1"), bulk("f2"), bulk("v2")])
    );
    assert_eq!(c.call(&["HINCRBY", "h", "n", "5"]).await, R::Int(5));
    assert_eq!(c.call(&["TYPE", "h"]).await, R::Simple("hash".into()));
    assert_eq!(c.call(&["TYPE", "a"]).await, R::Simple("string".into()));
    assert_eq!(c.call(&["TYPE", "nope"]).await, R::Simple("none".into()));
    assert_eq!(
        c.call(&["GET", "h"]).await,
        R::Error("WRONGTYPE Operation against a key holding the wrong kind of value".into())
    );
    assert_eq!(c.call(&["RENAME", "a", "a2"]).await, ok());
    assert_eq!(c.call(&["GET", "a2"]).await, bulk("1"));
    assert_eq!(
        c.call(&["RENAME", "a", "a3"]).await,
        R::Error("ERR no such key".into())
    );
    assert_eq!(c.call(&["DEL", "a2", "b", "nope"]).await, R::Int(2));
    assert_eq!(c.call(&["SET", "t", "v", "EX", "100"]).await, ok());
    match c.call(&["TTL", "t"]).await {
        R::Int(ttl) => assert!((99..=100).contains(&ttl), "TTL {ttl}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(c.call(&["PERSIST", "t"]).await, R::Int(1));
    assert_eq!(c.call(&["TTL", "t"]).await, R::Int(-1));
    assert_eq!(c.call(&["TTL", "nope"]).await, R::Int(-2));
    // EXPIREAT in the past deletes the key, as in Redis.
    assert_eq!(c.call(&["EXPIREAT", "t", "1"]).await, R::Int(1));
    assert_eq!(c.call(&["EXISTS", "t"]).await, R::Int(0));
    let expiretime = {
        c.call(&["SET", "e", "v"]).await;
        c.call(&["EXPIREAT", "e", "4102444800"]).await;
        c.call(&["EXPIRETIME", "e"]).await
    };
    assert_eq!(expiretime, R::Int(4_102_444_800));
    assert_eq!(c.call(&["SELECT", "0"]).await, ok());
    assert_eq!(
        c.call(&["SELECT", "1"]).await,
        R::Error("ERR DB index is out of range".into())
    );
    assert_eq!(c.call(&["FLUSHALL"]).await, ok());
    assert_eq!(c.call(&["DBSIZE"]).await, R::Int(0));
    assert_eq!(c.call(&["RANDOMKEY"]).await, R::Nil);
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelines_are_answered_in_order_and_inline_commands_work() {
    let root = tempfile::tempdir().unwrap();
    let (cluster, leader) = cluster(root.path(), 3).await;
    let mut c = Client::connect(redis_addr(&cluster, leader)).await;
    // 200 commands in one write: SET k<i> then GET k<i>, INCR between.
    let mut pipeline = Vec::new();
    for i in 0..50 {
        let key = format!("k{i}");
        let value = format!("v{i}");
        pipeline.extend(Client::encode(&[b"SET", key.as_bytes(), value.as_bytes()]));
        pipeline.extend(Client::encode(&[b"GET", key.as_bytes()]));
        pipeline.extend(Client::encode(&[b"INCR", b"counter"]));
        pipeline.extend(Client::encode(&[b"PING"]));
    }
    c.send_raw(&pipeline).await;
    for i in 0..50 {
        assert_eq!(c.read().await, ok(), "SET {i}");
        assert_eq!(c.read().await, bulk(&format!("v{i}")), "GET {i}");
        assert_eq!(c.read().await, R::Int(i + 1), "INCR {i}");
        assert_eq!(c.read().await, R::Simple("PONG".into()), "PING {i}");
    }
    // Inline commands, as telnet and nc send them.
    c.send_raw(b"PING\r\nSET spaced \"a b\"\r\nGET spaced\nECHO 'it''s'\r\n")
        .await;
    assert_eq!(c.read().await, R::Simple("PONG".into()));
    assert_eq!(c.read().await, ok());
    assert_eq!(c.read().await, bulk("a b"));
    assert_eq!(
        c.read().await,
        R::Error("ERR Protocol error: unbalanced quotes in request".into())
    );
    assert_eq!(c.try_read().await, None, "a protocol error closes");
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resp3_after_hello_3_and_errors_as_redis_words_them() {
    let root = tempfile::tempdir().unwrap();
    let (cluster, leader) = cluster(root.path(), 1).await;
    let mut c = Client::connect(redis_addr(&cluster, leader)).await;
    c.call(&["HSET", "h", "f", "v"]).await;
    let hello = c.call(&["HELLO", "3"]).await;
    let R::Map(fields) = hello else {
        panic!("HELLO 3 answers a map: {hello:?}")
    };
    assert!(fields.contains(&(bulk("proto"), R::Int(3))), "{fields:?}");
    assert!(
        fields.contains(&(bulk("server"), bulk("redis"))),
        "{fields:?}"
    );
    assert_eq!(c.call(&["GET", "missing"]).await, R::Nil);
    assert_eq!(
        c.call(&["HGETALL", "h"]).await,
        R::Map(vec![(bulk("f"), bulk("v"))])
    );
    assert!(
        matches!(c.call(&["CLIENT", "INFO"]).await, R::Verbatim(text) if text.contains("resp=3"))
    );
    assert!(matches!(c.call(&["HELLO", "2"]).await, R::Array(_)));
    assert_eq!(
        c.call(&["HGETALL", "h"]).await,
        R::Array(vec![bulk("f"), bulk("v")])
    );
    assert_eq!(
        c.call(&["HELLO", "4"]).await,
        R::Error("NOPROTO unsupported protocol version".into())
    );
    assert_eq!(
        c.call(&["FOO", "a", "b"]).await,
        R::Error("ERR unknown command 'FOO', with args beginning with: 'a' 'b' ".into())
    );
    assert_eq!(
        c.call(&["GET"]).await,
        R::Error("ERR wrong number of arguments for 'get' command".into())
    );
    assert_eq!(
        c.call(&["SET", "k", "v", "NX", "XX"]).await,
        R::Error("ERR syntax error".into())
    );
    assert_eq!(
        c.call(&["CLIENT", "NOPE"]).await,
        R::Error("ERR unknown subcommand 'NOPE'. Try CLIENT HELP.".into())
    );
    assert_eq!(
        c.call(&["CLIENT", "SETNAME"]).await,
        R::Error("ERR wrong number of arguments for 'client|setname' command".into())
    );
    // A request over a limit is answered naming it, then the connection closes.
    c.send_raw(b"*2\r\n$3\r\nGET\r\n$999999999\r\n").await;
    match c.read().await {
        R::Error(message) => assert!(
            message.starts_with("ERR Protocol error: invalid bulk length")
                && message.contains("ARGUMENT_BYTES_MAX"),
            "{message}"
        ),
        other => panic!("{other:?}"),
    }
    assert_eq!(c.try_read().await, None);
    // Random bytes from the network: the member answers or closes, and
    // keeps serving.
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    for round in 0..40 {
        let mut noise = Client::connect(redis_addr(&cluster, leader)).await;
        let bytes: Vec<u8> = (0..512)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                // Mostly protocol characters, so the parser goes deep.
                b"*$\r\n0123456789-+:abcSETGET \"'\\x"[(seed % 31) as usize]
            })
            .collect();
        noise.send_raw(&bytes).await;
        noise.send_raw(b"\r\n*1\r\n$4\r\nPING\r\n").await;
        let _ = tokio::time::timeout(Duration::from_millis(200), noise.try_read()).await;
        drop(noise);
        let mut check = Client::connect(redis_addr(&cluster, leader)).await;
        assert_eq!(
            check.call(&["PING"]).await,
            R::Simple("PONG".into()),
            "round {round}"
        );
    }
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_forwards_writes_and_reads_linearizably() {
    let root = tempfile::tempdir().unwrap();
    let (cluster, leader) = cluster(root.path(), 3).await;
    let follower = (1..=3).find(|id| *id != leader).unwrap();
    let mut on_leader = Client::connect(redis_addr(&cluster, leader)).await;
    let mut on_follower = Client::connect(redis_addr(&cluster, follower)).await;
    assert_eq!(on_leader.call(&["SET", "k", "from-leader"]).await, ok());
    // A linearizable read on the follower sees the acknowledged write.
    assert_eq!(on_follower.call(&["GET", "k"]).await, bulk("from-leader"));
    // A write on the follower is forwarded: the leader sees it.
    assert_eq!(on_follower.call(&["SET", "k", "x"]).await, ok());
    assert_eq!(on_leader.call(&["GET", "k"]).await, bulk("x"));
    assert_eq!(on_follower.call(&["INCRBY", "n", "5"]).await, R::Int(5));
    // MULTI/EXEC under WATCH through the follower.
    assert_eq!(on_follower.call(&["WATCH", "k"]).await, ok());
    assert_eq!(on_follower.call(&["MULTI"]).await, ok());
    on_follower.call(&["INCR", "n"]).await;
    on_follower.call(&["SET", "k", "y"]).await;
    assert_eq!(
        on_follower.call(&["EXEC"]).await,
        R::Array(vec![R::Int(6), ok()])
    );
    assert_eq!(
        on_leader.call(&["MGET", "k", "n"]).await,
        R::Array(vec![bulk("y"), bulk("6")])
    );
    // A block of reads only is answered by the follower itself.
    assert_eq!(on_follower.call(&["MULTI"]).await, ok());
    on_follower.call(&["GET", "k"]).await;
    on_follower.call(&["EXISTS", "k", "nope"]).await;
    assert_eq!(
        on_follower.call(&["EXEC"]).await,
        R::Array(vec![bulk("y"), R::Int(1)])
    );
    // Stale reads on the follower still see the connection's own
    // forwarded writes (they wait for the leader's index of the write).
    assert_eq!(on_follower.call(&["READONLY"]).await, ok());
    for round in 0..20 {
        let value = format!("stale-{round}");
        assert_eq!(on_follower.call(&["SET", "k", &value]).await, ok());
        assert_eq!(on_follower.call(&["GET", "k"]).await, bulk(&value));
    }
    assert_eq!(on_follower.call(&["READWRITE"]).await, ok());
    // WAIT on a follower counts itself once it holds its last write.
    assert_eq!(on_follower.call(&["WAIT", "1", "5000"]).await, R::Int(1));
    // WAIT on the leader: both followers hold the connection's last write.
    assert_eq!(on_leader.call(&["SET", "w", "1"]).await, ok());
    assert_eq!(on_leader.call(&["WAIT", "2", "5000"]).await, R::Int(2));
    let info = on_follower.call(&["INFO", "replication"]).await;
    match info {
        R::Bulk(text) => {
            let text = String::from_utf8_lossy(&text);
            assert!(text.contains("role:slave"), "{text}");
            assert!(
                text.contains(&format!("raftcask_leader_id:{leader}")),
                "{text}"
            );
        }
        other => panic!("{other:?}"),
    }
    cluster.shutdown().await;
}

/// Forwarded writes apply exactly once: with every other reply of the
/// leader's lost after its write applied, the follower retries each lost
/// one under the same session sequence and gets the first application's
/// answer, so 40 INCRs through the follower answer 1..=40 and leave 40
/// (without the member's session each lost reply's retry would apply
/// again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwarded_writes_apply_once_when_the_leaders_replies_are_lost() {
    let root = tempfile::tempdir().unwrap();
    let (cluster, leader, faults) = cluster_with_faults(root.path()).await;
    let follower = (1..=3).find(|id| *id != leader).unwrap();
    let mut on_follower = Client::connect(redis_addr(&cluster, follower)).await;
    assert_eq!(on_follower.call(&["SET", "c", "0"]).await, ok());
    faults[&leader].set_drop_write_reply_percent(50);
    for expected in 1..=40 {
        assert_eq!(on_follower.call(&["INCR", "c"]).await, R::Int(expected));
    }
    faults[&leader].set_drop_write_reply_percent(0);
    let mut on_leader = Client::connect(redis_addr(&cluster, leader)).await;
    assert_eq!(on_leader.call(&["GET", "c"]).await, bulk("40"));
    cluster.shutdown().await;
}

/// Many forwarded writes in flight at once, some replies lost: each still
/// gets its own answer. 600 connections to a follower each send 4 INCRs
/// while the leader loses one reply in ten after applying; every INCR is
/// answered with a distinct value, 1..=2400, and the counter ends at 2400
/// (one session per write in flight: many writes under one session would
/// push the oldest answers — the lost ones — out of the session's window,
/// and their retries would be answered outcome unknown).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_concurrent_forwarded_writes_each_get_their_answer() {
    const CONNECTIONS: usize = 600;
    const INCRS: usize = 4;
    let root = tempfile::tempdir().unwrap();
    let (cluster, leader, faults) = cluster_with_faults(root.path()).await;
    let follower = (1..=3).find(|id| *id != leader).unwrap();
    let addr = redis_addr(&cluster, follower);
    faults[&leader].set_drop_write_reply_percent(10);
    let mut tasks = Vec::new();
    for _ in 0..CONNECTIONS {
        tasks.push(tokio::spawn(async move {
            let mut client = Client::connect(addr).await;
            let mut replies = Vec::new();
            for _ in 0..INCRS {
                replies.push(client.call(&["INCR", "c"]).await);
            }
            replies
        }));
    }
    let mut values = Vec::new();
    for task in tasks {
        for reply in task.await.unwrap() {
            match reply {
                R::Int(value) => values.push(value),
                other => panic!("an INCR through the follower got {other:?}"),
            }
        }
    }
    faults[&leader].set_drop_write_reply_percent(0);
    values.sort_unstable();
    let total = (CONNECTIONS * INCRS) as i64;
    assert_eq!(values, (1..=total).collect::<Vec<_>>());
    let mut on_leader = Client::connect(redis_addr(&cluster, leader)).await;
    assert_eq!(
        on_leader.call(&["GET", "c"]).await,
        bulk(&total.to_string())
    );
    assert!(
        cluster.node(follower).unwrap().metrics().forward_retries() > 0,
        "no reply was lost: the test proved nothing"
    );
    cluster.shutdown().await;
}

/// A member that knows no leader it may forward to (a leader removed from
/// the membership: openraft still names itself, a non-voter) pauses
/// between attempts instead of spinning, and answers CLUSTERDOWN saying
/// nothing was written once the forwarding deadline passed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_leader_refuses_writes_without_spinning() {
    use kvnode::raft::watch::MetricsWatch as _;
    let root = tempfile::tempdir().unwrap();
    let (cluster, leader) = cluster(root.path(), 3).await;
    let node = cluster.node(leader).unwrap();
    let mut admin = kvproto::cluster::v1::cluster_client::ClusterClient::connect(format!(
        "http://{}",
        node.client_addr()
    ))
    .await
    .unwrap();
    admin
        .remove_member(kvproto::cluster::v1::RemoveMemberRequest { id: leader })
        .await
        .unwrap();
    let start = std::time::Instant::now();
    while node
        .raft()
        .metrics()
        .borrow()
        .membership_config
        .membership()
        .voter_ids()
        .any(|id| id == leader)
    {
        assert!(start.elapsed() < LEADER_WAIT, "the removal never applied");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let before = node.metrics().forward_retries();
    let mut client = Client::connect(redis_addr(&cluster, leader)).await;
    let reply = client.call(&["SET", "k", "v"]).await;
    let retries = node.metrics().forward_retries() - before;
    match reply {
        R::Error(message) => assert!(
            message.starts_with("CLUSTERDOWN") && message.contains("nothing was written"),
            "{message}"
        ),
        // The removed member learned the new leader after all.
        R::Simple(ok) => assert_eq!(ok, "OK"),
        other => panic!("{other:?}"),
    }
    // One attempt per pause at most (15 s / 50 ms = 300).
    assert!(retries < 1000, "{retries} retries: the forwarder spun");
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn multi_exec_and_watch_are_optimistic_transactions() {
    let root = tempfile::tempdir().unwrap();
    let (cluster, leader) = cluster(root.path(), 3).await;
    let addr = redis_addr(&cluster, leader);
    let mut c = Client::connect(addr).await;
    let mut other = Client::connect(addr).await;
    assert_eq!(c.call(&["MULTI"]).await, ok());
    assert_eq!(c.call(&["SET", "x", "1"]).await, R::Simple("QUEUED".into()));
    assert_eq!(c.call(&["INCR", "x"]).await, R::Simple("QUEUED".into()));
    assert_eq!(c.call(&["GET", "x"]).await, R::Simple("QUEUED".into()));
    assert_eq!(
        c.call(&["SET", "y", "v", "NX", "XX"]).await,
        R::Simple("QUEUED".into())
    );
    assert_eq!(c.call(&["PING"]).await, R::Simple("QUEUED".into()));
    assert_eq!(
        c.call(&["EXEC"]).await,
        R::Array(vec![
            ok(),
            R::Int(2),
            bulk("2"),
            R::Error("ERR syntax error".into()),
            R::Simple("PONG".into())
        ])
    );
    // A queue-time error aborts the whole block.
    c.call(&["MULTI"]).await;
    c.call(&["SET", "x", "9"]).await;
    assert!(matches!(c.call(&["NOPE"]).await, R::Error(_)));
    assert_eq!(
        c.call(&["EXEC"]).await,
        R::Error("EXECABORT Transaction discarded because of previous errors.".into())
    );
    assert_eq!(c.call(&["GET", "x"]).await, bulk("2"));
    // WATCH: another connection's write makes EXEC answer nil.
    assert_eq!(c.call(&["WATCH", "x"]).await, ok());
    assert_eq!(other.call(&["SET", "x", "3"]).await, ok());
    c.call(&["MULTI"]).await;
    c.call(&["SET", "x", "4"]).await;
    assert_eq!(c.call(&["EXEC"]).await, R::NilArray);
    assert_eq!(c.call(&["GET", "x"]).await, bulk("3"));
    // Unchanged: it applies.
    c.call(&["WATCH", "x"]).await;
    c.call(&["MULTI"]).await;
    c.call(&["SET", "x", "4"]).await;
    assert_eq!(c.call(&["EXEC"]).await, R::Array(vec![ok()]));
    assert_eq!(
        c.call(&["EXEC"]).await,
        R::Error("ERR EXEC without MULTI".into())
    );
    // A watched key whose TTL runs out aborts the block (Redis >= 6.0.9).
    assert_eq!(c.call(&["SET", "short", "v", "PX", "100"]).await, ok());
    assert_eq!(c.call(&["WATCH", "short"]).await, ok());
    tokio::time::sleep(Duration::from_millis(600)).await;
    c.call(&["MULTI"]).await;
    c.call(&["SET", "short", "again"]).await;
    assert_eq!(c.call(&["EXEC"]).await, R::NilArray);

    // Eight clients each add 1 to a counter 25 times under WATCH (read,
    // MULTI, SET, EXEC, retry on nil): it ends exactly at 200.
    const CLIENTS: usize = 8;
    const ADDS: i64 = 25;
    let mut tasks = Vec::new();
    for _ in 0..CLIENTS {
        tasks.push(tokio::spawn(async move {
            let mut c = Client::connect(addr).await;
            let mut retries = 0;
            for _ in 0..ADDS {
                loop {
                    c.call(&["WATCH", "counter"]).await;
                    let current = match c.call(&["GET", "counter"]).await {
                        R::Bulk(bytes) => String::from_utf8(bytes).unwrap().parse::<i64>().unwrap(),
                        R::Nil => 0,
                        other => panic!("{other:?}"),
                    };
                    c.call(&["MULTI"]).await;
                    c.call(&["SET", "counter", &(current + 1).to_string()])
                        .await;
                    match c.call(&["EXEC"]).await {
                        R::Array(_) => break,
                        R::NilArray => retries += 1,
                        other => panic!("{other:?}"),
                    }
                }
            }
            retries
        }));
    }
    let mut retries = 0;
    for task in tasks {
        retries += task.await.unwrap();
    }
    assert_eq!(
        c.call(&["GET", "counter"]).await,
        bulk(&(CLIENTS as i64 * ADDS).to_string()),
        "after {retries} retried transactions"
    );
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_with_the_cluster_token_and_the_connection_cap() {
    const TOKEN: &str = "a-token-of-sixteen-bytes-or-more";
    let root = tempfile::tempdir().unwrap();
    let (cluster, leader) = cluster_configured(root.path(), 1, |config| {
        config.security.auth_token = Some(kvnode::server::security::AuthToken::new(TOKEN).unwrap());
        config.limits.redis_connections_max = 3;
    })
    .await;
    let addr = redis_addr(&cluster, leader);
    let mut c = Client::connect(addr).await;
    assert_eq!(
        c.call(&["GET", "k"]).await,
        R::Error("NOAUTH Authentication required.".into())
    );
    assert_eq!(
        c.call(&["AUTH", "wrong-password-wrong-password"]).await,
        R::Error("WRONGPASS invalid username-password pair or user is disabled.".into())
    );
    assert_eq!(c.call(&["AUTH", TOKEN]).await, ok());
    assert_eq!(c.call(&["SET", "k", "v"]).await, ok());
    let mut d = Client::connect(addr).await;
    assert!(matches!(
        d.call(&["HELLO", "3", "AUTH", "default", TOKEN]).await,
        R::Map(_)
    ));
    assert_eq!(d.call(&["GET", "k"]).await, bulk("v"));
    assert_eq!(d.call(&["RESET"]).await, R::Simple("RESET".into()));
    assert_eq!(
        d.call(&["GET", "k"]).await,
        R::Error("NOAUTH Authentication required.".into())
    );
    // The cap: three connections are open; a fourth is told and closed.
    let mut e = Client::connect(addr).await;
    assert_eq!(
        e.call(&["PING"]).await,
        R::Error("NOAUTH Authentication required.".into())
    );
    let mut f = Client::connect(addr).await;
    assert_eq!(
        f.read().await,
        R::Error("ERR max number of clients reached".into())
    );
    assert_eq!(f.try_read().await, None);
    drop(e);
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scan_visits_every_key_and_keys_globs() {
    let root = tempfile::tempdir().unwrap();
    let (cluster, leader) = cluster(root.path(), 1).await;
    let mut c = Client::connect(redis_addr(&cluster, leader)).await;
    let mut expected = Vec::new();
    for i in 0..57 {
        let key = format!("user:{i:03}");
        c.call(&["SET", &key, "x"]).await;
        expected.push(key);
    }
    c.call(&["HSET", "user:hash", "f", "v"]).await;
    c.call(&["SET", "other", "y"]).await;
    expected.push("user:hash".to_string());
    expected.sort();
    let mut seen = Vec::new();
    let mut cursor = "0".to_string();
    let mut calls = 0;
    loop {
        calls += 1;
        let R::Array(items) = c
            .call(&["SCAN", &cursor, "MATCH", "user:*", "COUNT", "7"])
            .await
        else {
            panic!("SCAN answers an array")
        };
        let [R::Bulk(next), R::Array(keys)] = &items[..] else {
            panic!("{items:?}")
        };
        for key in keys {
            let R::Bulk(key) = key else { panic!("{key:?}") };
            seen.push(String::from_utf8(key.clone()).unwrap());
        }
        cursor = String::from_utf8(next.clone()).unwrap();
        if cursor == "0" {
            break;
        }
    }
    seen.sort();
    assert_eq!(seen, expected);
    assert!(
        calls >= 8,
        "COUNT 7 over 59 keys takes several calls: {calls}"
    );
    match c.call(&["SCAN", "0", "TYPE", "hash"]).await {
        R::Array(items) => {
            assert_eq!(items[1], R::Array(vec![]), "the first 10 keys hold no hash");
            assert_ne!(items[0], bulk("0"), "more keys follow");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        c.call(&["SCAN", "12345"]).await,
        R::Error("ERR invalid cursor".into())
    );
    assert_eq!(
        c.call(&["KEYS", "user:00[0-2]"]).await,
        R::Array(vec![bulk("user:000"), bulk("user:001"), bulk("user:002")])
    );
    assert_eq!(c.call(&["DBSIZE"]).await, R::Int(59));
    assert!(matches!(c.call(&["RANDOMKEY"]).await, R::Bulk(_)));
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_info_config_and_command_answer() {
    let root = tempfile::tempdir().unwrap();
    let (cluster, leader) = cluster(root.path(), 1).await;
    let mut c = Client::connect(redis_addr(&cluster, leader)).await;
    assert_eq!(c.call(&["CLIENT", "GETNAME"]).await, R::Nil);
    assert_eq!(c.call(&["CLIENT", "SETNAME", "tester"]).await, ok());
    assert_eq!(c.call(&["CLIENT", "GETNAME"]).await, bulk("tester"));
    assert_eq!(
        c.call(&["CLIENT", "SETNAME", "has space"]).await,
        R::Error("ERR Client names cannot contain spaces, newlines or special characters.".into())
    );
    let R::Int(id) = c.call(&["CLIENT", "ID"]).await else {
        panic!("CLIENT ID answers an integer")
    };
    match c.call(&["CLIENT", "LIST"]).await {
        R::Bulk(text) => {
            let text = String::from_utf8(text).unwrap();
            assert!(text.contains(&format!("id={id} ")), "{text}");
            assert!(text.contains("name=tester"), "{text}");
        }
        other => panic!("{other:?}"),
    }
    match c.call(&["INFO"]).await {
        R::Bulk(text) => {
            let text = String::from_utf8(text).unwrap();
            assert!(text.contains("redis_version:7."), "{text}");
            assert!(text.contains("raftcask_version:"), "{text}");
            assert!(text.contains("role:master"), "{text}");
            assert!(text.contains("# Keyspace"), "{text}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        c.call(&["CONFIG", "GET", "appendonly"]).await,
        R::Array(vec![bulk("appendonly"), bulk("yes")])
    );
    match c.call(&["CONFIG", "GET", "save", "databases"]).await {
        R::Array(items) => assert_eq!(items.len(), 4, "{items:?}"),
        other => panic!("{other:?}"),
    }
    match c.call(&["COMMAND", "COUNT"]).await {
        R::Int(n) => assert!(n > 70, "{n}"),
        other => panic!("{other:?}"),
    }
    match c.call(&["COMMAND", "DOCS", "set"]).await {
        R::Array(items) => {
            assert_eq!(items[0], bulk("set"));
            let R::Array(doc) = &items[1] else {
                panic!("{items:?}")
            };
            assert!(doc.contains(&bulk("arguments")), "{doc:?}");
            assert!(doc.contains(&bulk("summary")), "{doc:?}");
        }
        other => panic!("{other:?}"),
    }
    match c.call(&["TIME"]).await {
        R::Array(items) => assert_eq!(items.len(), 2),
        other => panic!("{other:?}"),
    }
    assert_eq!(c.call(&["QUIT"]).await, ok());
    assert_eq!(c.try_read().await, None);
    cluster.shutdown().await;
}

/// A TLS client configuration trusting `ca`, presenting `identity` if any.
fn tls_client(
    ca: &kvcerts::DevCa,
    identity: Option<&kvcerts::IssuedCert>,
) -> tokio_rustls::TlsConnector {
    use rustls::pki_types::pem::PemObject as _;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca.cert_pem().as_bytes()) {
        roots.add(cert.unwrap()).unwrap();
    }
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    let config = match identity {
        Some(cert) => builder
            .with_client_auth_cert(
                CertificateDer::pem_slice_iter(cert.cert_pem.as_bytes())
                    .collect::<Result<Vec<_>, _>>()
                    .unwrap(),
                PrivateKeyDer::from_pem_slice(cert.key_pem.as_bytes()).unwrap(),
            )
            .unwrap(),
        None => builder.with_no_client_auth(),
    };
    tokio_rustls::TlsConnector::from(std::sync::Arc::new(config))
}

/// PING over TLS: the reply's bytes, or why there was none.
async fn ping_over_tls(
    addr: SocketAddr,
    connector: &tokio_rustls::TlsConnector,
) -> Result<Vec<u8>, String> {
    let exchange = async {
        let stream = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
        let name = rustls::pki_types::ServerName::IpAddress(addr.ip().into());
        let mut tls = connector
            .connect(name, stream)
            .await
            .map_err(|e| format!("handshake: {e}"))?;
        tls.write_all(b"*1\r\n$4\r\nPING\r\n")
            .await
            .map_err(|e| format!("write: {e}"))?;
        let mut reply = vec![0u8; 64];
        let n = tls
            .read(&mut reply)
            .await
            .map_err(|e| format!("read: {e}"))?;
        reply.truncate(n);
        Ok(reply)
    };
    tokio::time::timeout(REPLY_TIMEOUT, exchange)
        .await
        .unwrap_or_else(|_| Err("timed out".to_string()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_redis_port_speaks_tls_when_the_member_has_it() {
    let root = tempfile::tempdir().unwrap();
    let ca = kvcerts::DevCa::new("raftcask redis test CA").unwrap();
    let ip = kvnode::testing::private_loopback();
    let node_cert = ca.node_cert("node1", &[ip.to_string()]).unwrap();
    let material = kvnode::server::security::TlsMaterial::from_pem(
        node_cert.cert_pem.clone(),
        node_cert.key_pem.clone(),
        ca.cert_pem(),
    )
    .unwrap();
    let cluster = LocalCluster::start_on(ip, root.path(), 1, |config| {
        config.redis_addr = Some(SocketAddr::new(ip, 0));
        config.security.tls = Some(material.clone());
        config.security.client_cert_auth = true;
    })
    .await
    .unwrap();
    let leader = cluster.wait_for_leader(LEADER_WAIT).await.unwrap();
    let addr = redis_addr(&cluster, leader);
    let client_cert = ca.client_cert("redis-client").unwrap();
    assert_eq!(
        ping_over_tls(addr, &tls_client(&ca, Some(&client_cert))).await,
        Ok(b"+PONG\r\n".to_vec())
    );
    // Client certificates are demanded, as on the client port.
    let without = ping_over_tls(addr, &tls_client(&ca, None)).await;
    assert!(without.is_err(), "{without:?}");
    // Plain RESP to the TLS port gets no RESP answer.
    let mut plain = Client::connect(addr).await;
    plain.send_raw(b"*1\r\n$4\r\nPING\r\n").await;
    let mut buf = [0u8; 64];
    let answer = tokio::time::timeout(REPLY_TIMEOUT, plain.stream.read(&mut buf)).await;
    assert!(
        !matches!(answer, Ok(Ok(n)) if buf[..n].starts_with(b"+PONG")),
        "plain TCP must not get a RESP answer: {answer:?}"
    );
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_big_hash_is_cleaned_up_without_client_writes() {
    // More fields than three entries' housekeeping removes.
    const FIELDS: usize = 3 * kvstate::redis::CLEANUP_RECORDS_PER_ENTRY_MAX + 100;
    const FIELDS_PER_HSET: usize = 2000;
    let root = tempfile::tempdir().unwrap();
    let (cluster, leader) = cluster(root.path(), 1).await;
    let mut c = Client::connect(redis_addr(&cluster, leader)).await;
    let mut next = 0;
    while next < FIELDS {
        let end = (next + FIELDS_PER_HSET).min(FIELDS);
        let fields: Vec<String> = (next..end).map(|i| format!("field{i}")).collect();
        let mut args = vec!["HSET", "big"];
        for field in &fields {
            args.push(field);
            args.push("v");
        }
        assert_eq!(c.call(&args).await, R::Int((end - next) as i64));
        next = end;
    }
    assert_eq!(c.call(&["HLEN", "big"]).await, R::Int(FIELDS as i64));
    assert_eq!(c.call(&["DEL", "big"]).await, R::Int(1));
    assert_eq!(c.call(&["EXISTS", "big"]).await, R::Int(0));
    let node = cluster.node(leader).unwrap();
    let started = std::time::Instant::now();
    loop {
        let state_machine = node.state_machine();
        let due = kvstate::redis::housekeeping_due(
            &state_machine.engine(),
            state_machine.cluster_time_ms(),
        )
        .unwrap();
        if !due {
            break;
        }
        assert!(
            started.elapsed() < LEADER_WAIT,
            "the deleted hash's fields are still stored after {LEADER_WAIT:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_command_with_edge_case_arguments_gets_a_reply() {
    const ROUNDS: usize = 3000;
    let root = tempfile::tempdir().unwrap();
    let (cluster, leader) = cluster(root.path(), 1).await;
    let mut c = Client::connect(redis_addr(&cluster, leader)).await;
    let long = "x".repeat(5000);
    let vocabulary: Vec<&[u8]> = vec![
        b"",
        b"0",
        b"1",
        b"2",
        b"-1",
        b"100",
        b"9223372036854775807",
        b"-9223372036854775808",
        b"99999999999999999999",
        b"abc",
        b"k",
        b"h",
        b"s",
        b"*",
        b"[",
        b"a*[^b-",
        b"\\",
        b"EX",
        b"PX",
        b"EXAT",
        b"NX",
        b"XX",
        b"GT",
        b"LT",
        b"GET",
        b"KEEPTTL",
        b"PERSIST",
        b"1.5",
        b"inf",
        b"-inf",
        b"nan",
        b"1e400",
        b"0x10",
        b"MATCH",
        b"COUNT",
        b"TYPE",
        b"hash",
        b"string",
        b"AUTH",
        b"SETNAME",
        b"default",
        b"\xff\xffraftcask/secret",
        long.as_bytes(),
        b"\r\n",
        b"3",
    ];
    let specs: Vec<&kvnode::server::redis::command::Spec> =
        kvnode::server::redis::command::COMMANDS
            .iter()
            // QUIT closes; WAIT with timeout 0 may wait for followers a
            // single member does not have.
            .filter(|spec| !matches!(spec.name, "quit" | "wait"))
            .collect();
    let mut seed: u64 = 0x2545_f491_4f6c_dd1d;
    let mut next = move |n: usize| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed % n as u64) as usize
    };
    let mut replies = 0;
    for round in 0..ROUNDS {
        let spec = specs[next(specs.len())];
        let name = spec.name;
        let mut args: Vec<&[u8]> = vec![name.as_bytes()];
        // Mostly an argument count the arity allows (so the command gets
        // past its arity check), sometimes any.
        let count = match (next(5), spec.arity) {
            (0, _) => next(6),
            (_, arity) if arity > 0 => arity as usize - 1,
            (_, arity) => (-arity) as usize - 1 + next(4),
        };
        if !spec.subcommands.is_empty() && count > 0 {
            args.push(
                spec.subcommands[next(spec.subcommands.len())]
                    .name
                    .as_bytes(),
            );
        }
        while args.len() < count + 1 {
            args.push(vocabulary[next(vocabulary.len())]);
        }
        c.send_raw(&Client::encode(&args)).await;
        let reply = c.try_read().await;
        assert!(
            reply.is_some(),
            "round {round}: {:?} closed the connection",
            args.iter()
                .map(|a| String::from_utf8_lossy(a))
                .collect::<Vec<_>>()
        );
        replies += 1;
        if round % 100 == 0 {
            // Leave any MULTI, and check the connection serves.
            c.call(&["DISCARD"]).await;
            assert_eq!(c.call(&["PING"]).await, R::Simple("PONG".into()));
        }
    }
    assert_eq!(replies, ROUNDS);
    let mut fresh = Client::connect(redis_addr(&cluster, leader)).await;
    assert_eq!(fresh.call(&["PING"]).await, R::Simple("PONG".into()));
    cluster.shutdown().await;
}
