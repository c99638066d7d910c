//! The Redis (RESP) front end: redis-cli, redis-benchmark and Redis client
//! libraries talk to a member on its Redis port (`--redis-addr`). It only
//! translates: a write command becomes one `Write::Redis` request sent
//! down the member's one write path (the proposal batcher, [`RedisFrontEnd::write`]),
//! applied atomically by `kvstate::redis`; a read becomes a local read after
//! the same read-index step as `Kv.Get` (`prepare_read`), judged at the
//! applied cluster time.
//!
//! - this file: the listener, the connection cap, TLS, the member's shared
//!   state (clients, SCAN cursors, counters) and the write path.
//! - [`resp`]: the wire format (RESP2 / RESP3 replies, multibulk and inline
//!   requests, their limits).
//! - [`connection`]: one connection: pipelined requests answered in order,
//!   AUTH, HELLO, READONLY, MULTI / EXEC / WATCH, the connection and server
//!   commands.
//! - [`command`]: the command table (arity, flags, key positions, docs) and
//!   COMMAND's answers.
//! - [`strings`], [`keys`], [`hashes`]: a file per command family: the
//!   request each command becomes and the reads each answers.
//! - [`glob`]: Redis's glob matcher (KEYS, SCAN MATCH).
//!
//! Limits: at most [`REDIS_CONNECTIONS_MAX`] connections (one more is told
//! `-ERR max number of clients reached` and closed); no idle timeout
//! (Redis's `timeout 0`: pooled clients keep connections open for hours);
//! each request within [`resp`]'s limits; replies of a pipeline written
//! every [`connection::PIPELINE_COMMANDS_MAX`] commands at most.

pub mod command;
pub mod connection;
pub mod glob;
pub mod hashes;
pub mod keys;
pub mod resp;
pub mod strings;

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::AsyncWriteExt as _;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, watch};

use kvstate::command::{Answer, Write};
use kvstate::redis::{RedisCommand, RedisReply};

use crate::raft::types::NodeRaft;
use crate::raft::watch::MetricsWatch;
use crate::server::kv::KvService;
use crate::server::security::{AuthToken, TLS_HANDSHAKE_TIMEOUT};

// The Redis limits are the cluster's: a value or key the `Kv` port takes,
// the Redis port takes too.
const _: () = assert!(kvstate::redis::STRING_BYTES_MAX == kvproto::VALUE_SIZE_BYTES_MAX);
const _: () = assert!(kvstate::redis::KEY_BYTES_MAX == kvproto::KEY_SIZE_BYTES_MAX);

/// Connections open at once at most (Redis's `maxclients` is 10 000; a
/// member shares its open-files limit with its client and peer ports).
pub const REDIS_CONNECTIONS_MAX: usize = 4096;
/// SCAN and HSCAN cursors a member remembers at most (the oldest is
/// forgotten first; a forgotten cursor is answered `-ERR invalid cursor`).
pub const SCAN_CURSORS_MAX: usize = 16 * 1024;
/// Connections over the cap being told so at once at most; beyond, one
/// more is closed without a word (a flood must not pile up tasks).
const REFUSALS_IN_FLIGHT_MAX: usize = 64;
/// Pause after a failed `accept` (for example out of file descriptors).
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(100);
/// How long a stopping member waits for its Redis connections to end.
const CONNECTIONS_STOP_WAIT: Duration = Duration::from_secs(2);
/// The Redis version the front end reports (`INFO`'s `redis_version`,
/// `HELLO`'s `version`): the version whose commands and replies it
/// follows. Clients read it to decide which commands they may send.
pub const REDIS_COMPATIBLE_VERSION: &str = "7.0.0";

/// What every connection of one member shares: the kv service (its write
/// path, its read step, the state machine), the security settings, the
/// client list, SCAN cursors and counters.
#[derive(Clone)]
pub struct RedisFrontEnd {
    kv: KvService,
    raft: NodeRaft,
    member_id: u64,
    token: Option<AuthToken>,
    tls: bool,
    listen_addr: SocketAddr,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for RedisFrontEnd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisFrontEnd")
            .field("member_id", &self.member_id)
            .field("listen_addr", &self.listen_addr)
            .finish_non_exhaustive()
    }
}

/// The member-wide state behind [`RedisFrontEnd`].
#[derive(Debug)]
struct Shared {
    started: Instant,
    next_client_id: AtomicU64,
    clients: Mutex<BTreeMap<u64, ClientInfo>>,
    cursors: Mutex<Cursors>,
    stats: Stats,
}

/// Counters `INFO stats` reports.
#[derive(Debug, Default)]
pub(crate) struct Stats {
    pub(crate) connections_received: AtomicU64,
    pub(crate) connections_rejected: AtomicU64,
    pub(crate) commands_processed: AtomicU64,
    pub(crate) errors: AtomicU64,
}

/// What `CLIENT LIST` and `CLIENT INFO` show of one connection.
#[derive(Clone, Debug)]
pub(crate) struct ClientInfo {
    pub(crate) id: u64,
    pub(crate) addr: SocketAddr,
    pub(crate) local_addr: SocketAddr,
    pub(crate) name: Vec<u8>,
    pub(crate) created: Instant,
    pub(crate) last_command_at: Instant,
    pub(crate) last_command: &'static str,
    pub(crate) protocol: i64,
    /// Commands queued by MULTI (-1 outside a transaction).
    pub(crate) multi: i64,
    pub(crate) readonly: bool,
}

impl ClientInfo {
    /// One line of `CLIENT LIST` (Redis's fields, with what raftcask knows).
    pub(crate) fn line(&self, now: Instant) -> String {
        let mut flags = String::new();
        if self.multi >= 0 {
            flags.push('x');
        }
        if self.readonly {
            flags.push('r');
        }
        if flags.is_empty() {
            flags.push('N');
        }
        format!(
            "id={} addr={} laddr={} fd=-1 name={} age={} idle={} flags={} db=0 sub=0 psub=0 \
             ssub=0 multi={} qbuf=0 qbuf-free=0 argv-mem=0 multi-mem=0 rbs=0 rbp=0 obl=0 oll=0 \
             omem=0 tot-mem=0 events=r cmd={} user=default redir=-1 resp={}",
            self.id,
            self.addr,
            self.local_addr,
            String::from_utf8_lossy(&self.name),
            now.duration_since(self.created).as_secs(),
            now.duration_since(self.last_command_at).as_secs(),
            flags,
            self.multi,
            if self.last_command.is_empty() {
                "NULL"
            } else {
                self.last_command
            },
            self.protocol
        )
    }
}

/// SCAN / HSCAN cursors: a cursor number stands for the key (or field)
/// the next page starts after, remembered by the member that answered.
#[derive(Debug, Default)]
struct Cursors {
    by_id: HashMap<u64, Vec<u8>>,
    order: VecDeque<u64>,
    next: u64,
}

impl RedisFrontEnd {
    /// The front end of one member, over its kv service.
    pub fn new(
        kv: KvService,
        raft: NodeRaft,
        token: Option<AuthToken>,
        tls: bool,
        listen_addr: SocketAddr,
    ) -> RedisFrontEnd {
        let member_id = raft.metrics().borrow().id;
        // Cursor numbers start at a random-looking place so numbers from
        // another member or an earlier run are unlikely to name a cursor.
        let seed = {
            use std::hash::{BuildHasher as _, Hasher as _};
            let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
            hasher.write_u64(member_id);
            hasher.finish() >> 16
        };
        RedisFrontEnd {
            kv,
            raft,
            member_id,
            token,
            tls,
            listen_addr,
            shared: Arc::new(Shared {
                started: Instant::now(),
                next_client_id: AtomicU64::new(1),
                clients: Mutex::new(BTreeMap::new()),
                cursors: Mutex::new(Cursors {
                    next: seed.max(1),
                    ..Cursors::default()
                }),
                stats: Stats::default(),
            }),
        }
    }

    /// The kv service (read step, state machine, write path).
    pub(crate) fn kv(&self) -> &KvService {
        &self.kv
    }

    /// openraft's handle.
    pub(crate) fn raft(&self) -> &NodeRaft {
        &self.raft
    }

    /// This member's id.
    pub(crate) fn member_id(&self) -> u64 {
        self.member_id
    }

    /// The token AUTH must present, if the cluster has one.
    pub(crate) fn token(&self) -> Option<&AuthToken> {
        self.token.as_ref()
    }

    /// Whether the port speaks TLS.
    pub(crate) fn tls(&self) -> bool {
        self.tls
    }

    /// The address the port listens on.
    pub(crate) fn listen_addr(&self) -> SocketAddr {
        self.listen_addr
    }

    /// Seconds since the front end started.
    pub(crate) fn uptime(&self) -> Duration {
        self.shared.started.elapsed()
    }

    pub(crate) fn stats(&self) -> &Stats {
        &self.shared.stats
    }

    /// A new connection id (`CLIENT ID`), never reused by this member.
    fn next_client_id(&self) -> u64 {
        self.shared.next_client_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Updates (or adds) a connection's entry in the client list.
    pub(crate) fn update_client(&self, info: &ClientInfo) {
        let mut clients = self
            .shared
            .clients
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        clients.insert(info.id, info.clone());
    }

    fn remove_client(&self, id: u64) {
        let mut clients = self
            .shared
            .clients
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        clients.remove(&id);
    }

    /// Every connection's entry, by id.
    pub(crate) fn clients(&self) -> Vec<ClientInfo> {
        let clients = self
            .shared
            .clients
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        clients.values().cloned().collect()
    }

    /// Remembers `after` as the start of a next page: the cursor number
    /// to answer.
    pub(crate) fn remember_cursor(&self, after: Vec<u8>) -> u64 {
        let mut cursors = self
            .shared
            .cursors
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let id = cursors.next;
        // Never 0 (the end), never a number in use.
        cursors.next = cursors.next.wrapping_add(1).max(1);
        cursors.by_id.insert(id, after);
        cursors.order.push_back(id);
        while cursors.order.len() > SCAN_CURSORS_MAX {
            if let Some(old) = cursors.order.pop_front() {
                cursors.by_id.remove(&old);
            }
        }
        id
    }

    /// Where the page of cursor `id` starts (`None`: not a cursor this
    /// member remembers).
    pub(crate) fn cursor(&self, id: u64) -> Option<Vec<u8>> {
        let cursors = self
            .shared
            .cursors
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        cursors.by_id.get(&id).cloned()
    }

    /// The one write path of the front end: every write command (and
    /// every EXEC) goes through here, proposed on this member when it
    /// leads and forwarded to the leader otherwise
    /// ([`KvService::write_from_front_end`]). The answer, and a log index
    /// at or after the write's entry.
    pub(crate) async fn write(&self, write: Write) -> Result<(Answer, u64), WriteRefused> {
        self.kv
            .write_from_front_end(write)
            .await
            .map_err(WriteRefused::Status)
    }
}

/// Why a write got no answer from the state machine.
#[derive(Debug)]
pub(crate) enum WriteRefused {
    /// The write path's refusal or an unknown outcome.
    Status(tonic::Status),
}

impl WriteRefused {
    /// The error reply a client sees.
    pub(crate) fn reply(&self) -> resp::Reply {
        match self {
            WriteRefused::Status(status) => {
                let message = status.message();
                let detail = crate::server::convert::detail_of(status).and_then(|d| d.detail);
                match detail {
                    Some(kvproto::kv::v1::error_detail::Detail::OutcomeUnknown(_)) => {
                        resp::Reply::err(format!(
                            "raftcask: the write's outcome is unknown (it may or may not have \
                             applied): {message}"
                        ))
                    }
                    // No leader could be reached (an election), or this
                    // member stopped leading before proposing: refused
                    // before anything was proposed.
                    Some(kvproto::kv::v1::error_detail::Detail::NotLeader(_))
                        if message.contains("nothing was written") =>
                    {
                        resp::Reply::Error(format!("CLUSTERDOWN raftcask: {message}; retry"))
                    }
                    Some(kvproto::kv::v1::error_detail::Detail::NotLeader(_)) => {
                        resp::Reply::Error(format!(
                            "CLUSTERDOWN raftcask: {message}; nothing was written, retry"
                        ))
                    }
                    Some(kvproto::kv::v1::error_detail::Detail::LimitExceeded(limit)) => {
                        resp::Reply::err(format!(
                            "the request is over {} ({}; it has {})",
                            limit.limit, limit.limit_value, limit.actual_value
                        ))
                    }
                    _ => match status.code() {
                        tonic::Code::ResourceExhausted => resp::Reply::Error(format!(
                            "OOM command not allowed: raftcask: {message}"
                        )),
                        tonic::Code::Unavailable => resp::Reply::Error(format!(
                            "CLUSTERDOWN raftcask: {message}; nothing is known to have been \
                             written"
                        )),
                        _ => resp::Reply::err(format!("raftcask: {message}")),
                    },
                }
            }
        }
    }
}

/// Serves the Redis port until `stop` turns true: one task per connection,
/// at most `connections_max` at once ([`REDIS_CONNECTIONS_MAX`] unless a
/// test lowers it), TLS when `tls` is given.
pub async fn serve(
    listener: TcpListener,
    front_end: RedisFrontEnd,
    tls: Option<Arc<rustls::ServerConfig>>,
    connections_max: usize,
    mut stop: watch::Receiver<bool>,
) {
    let permits = Arc::new(Semaphore::new(connections_max));
    let refusals = Arc::new(Semaphore::new(REFUSALS_IN_FLIGHT_MAX));
    let acceptor = tls.map(tokio_rustls::TlsAcceptor::from);
    let mut connections = tokio::task::JoinSet::new();
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = stop.wait_for(|stopping| *stopping) => break,
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
        };
        let (stream, addr) = match accepted {
            Ok(accepted) => accepted,
            Err(err) => {
                tracing::warn!(error = %err, "redis port: accept failed");
                tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        front_end
            .stats()
            .connections_received
            .fetch_add(1, Ordering::Relaxed);
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            front_end
                .stats()
                .connections_rejected
                .fetch_add(1, Ordering::Relaxed);
            if let Some(metrics) = front_end.kv.metrics() {
                metrics.redis_connection_refused();
            }
            if let Ok(refusal) = refusals.clone().try_acquire_owned() {
                let acceptor = acceptor.clone();
                connections.spawn(async move {
                    let _refusal = refusal;
                    refuse(stream, acceptor).await
                });
            }
            continue;
        };
        let front_end = front_end.clone();
        let acceptor = acceptor.clone();
        let stop = stop.clone();
        connections.spawn(async move {
            let _permit = permit;
            let local_addr = stream.local_addr().unwrap_or(front_end.listen_addr);
            let id = front_end.next_client_id();
            let _gauge = front_end.kv.metrics().map(|m| m.redis_connection());
            match acceptor {
                None => {
                    connection::run(stream, id, addr, local_addr, front_end.clone(), stop).await
                }
                Some(acceptor) => {
                    match tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await
                    {
                        Ok(Ok(tls)) => {
                            connection::run(tls, id, addr, local_addr, front_end.clone(), stop)
                                .await
                        }
                        Ok(Err(err)) => {
                            tracing::debug!(error = %err, %addr, "redis port: TLS handshake failed")
                        }
                        Err(_) => tracing::debug!(%addr, "redis port: TLS handshake timed out"),
                    }
                }
            }
            front_end.remove_client(id);
        });
    }
    // Connections see the same stop signal and end; wait for them a little
    // (each holds the state machine, which a stopping member releases).
    let _ = tokio::time::timeout(CONNECTIONS_STOP_WAIT, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    connections.abort_all();
}

/// A data command, parsed: what the connection runs for it.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Parsed {
    /// A command of the state machine: a write goes down the write path;
    /// a read ([`RedisCommand::is_read`]) is answered locally by
    /// `kvstate::redis::read` after the read step.
    Command(RedisCommand),
    /// EXPIRETIME / PEXPIRETIME: a PTTL read plus this member's wall clock.
    ExpireTime { key: Vec<u8>, milliseconds: bool },
    /// KEYS (`None`: every key).
    Keys { pattern: Option<Vec<u8>> },
    /// SCAN.
    Scan(keys::ScanArgs),
    /// HSCAN.
    HScan { key: Vec<u8>, scan: keys::ScanArgs },
    /// DBSIZE.
    DbSize,
    /// RANDOMKEY.
    RandomKey,
}

impl Parsed {
    /// Whether it changes the store (goes down the write path).
    pub(crate) fn is_write(&self) -> bool {
        matches!(self, Parsed::Command(command) if !command.is_read())
    }
}

/// Parses the data command `name` (lowercase, arity checked) with its
/// arguments (the name excluded); `None` if no data family knows it.
pub(crate) fn parse(name: &str, args: &[Vec<u8>]) -> Option<Result<Parsed, resp::Reply>> {
    strings::parse(name, args)
        .or_else(|| keys::parse(name, args))
        .or_else(|| hashes::parse(name, args))
}

/// An integer argument, or Redis's error for one that is not.
pub(crate) fn integer(argument: &[u8]) -> Result<i64, resp::Reply> {
    resp::parse_i64(argument)
        .ok_or_else(|| resp::Reply::err("value is not an integer or out of range"))
}

/// Redis's `-ERR syntax error`.
pub(crate) fn syntax_error() -> resp::Reply {
    resp::Reply::err("syntax error")
}

/// This member's wall clock, in unix ms (EXAT, EXPIREAT, EXPIRETIME, TIME).
pub(crate) fn unix_time_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| since.as_millis() as i64)
}

/// The reply to a read that failed outside the state machine's answers.
pub(crate) fn read_error(err: kvstate::redis::RedisError) -> resp::Reply {
    match err {
        kvstate::redis::RedisError::Limit(message) => resp::Reply::err(message),
        other => resp::Reply::err(format!("raftcask: the read failed: {other}")),
    }
}

/// A state machine reply as the wire's.
pub(crate) fn reply_of(reply: RedisReply) -> resp::Reply {
    match reply {
        RedisReply::Nil => resp::Reply::Nil,
        RedisReply::Integer(n) => resp::Reply::Integer(n),
        RedisReply::Bulk(bytes) => resp::Reply::Bulk(bytes),
        RedisReply::Status(text) => resp::Reply::Simple(text),
        RedisReply::Array(items) => resp::Reply::Array(items.into_iter().map(reply_of).collect()),
        RedisReply::Map(pairs) => resp::Reply::Map(
            pairs
                .into_iter()
                .map(|(key, value)| (reply_of(key), reply_of(value)))
                .collect(),
        ),
        RedisReply::Double(text) => match text.parse::<f64>() {
            Ok(value) => resp::Reply::Double(value),
            Err(_) => resp::Reply::Bulk(text.into_bytes()),
        },
        RedisReply::Error(text) => resp::Reply::Error(text),
    }
}

/// Tells a connection over the cap so, as Redis does, and closes it.
async fn refuse(stream: TcpStream, acceptor: Option<tokio_rustls::TlsAcceptor>) {
    const MESSAGE: &[u8] = b"-ERR max number of clients reached\r\n";
    match acceptor {
        None => {
            let mut stream = stream;
            let _ = stream.write_all(MESSAGE).await;
            let _ = stream.shutdown().await;
        }
        Some(acceptor) => {
            if let Ok(Ok(mut tls)) =
                tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await
            {
                let _ = tls.write_all(MESSAGE).await;
                let _ = tls.shutdown().await;
            }
        }
    }
}
