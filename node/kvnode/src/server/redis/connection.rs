//! One Redis connection: requests read in pipelines, run in order, and
//! answered in order.
//!
//! Every request a read brought in (up to [`PIPELINE_COMMANDS_MAX`]) is
//! decoded first; then the commands run in order, consecutive ones of one
//! kind together: a run of writes goes down the write path as one
//! `RedisRequest` (its commands applied in order, atomically — a client's
//! pipeline of SETs costs one proposal, not one each), a run of reads
//! shares one read step (`prepare_read`) and then reads the local state.
//! A write waits for the reads before it, a read for the writes before it,
//! so each command sees everything its connection sent earlier. Commands
//! that answer from the connection itself (PING, CLIENT, INFO, ...) need
//! no wait unless they change how later replies are encoded (HELLO,
//! RESET) or read the store.
//!
//! MULTI queues commands (a syntax error is queued as its error, an
//! unknown command or a wrong arity makes EXEC answer EXECABORT, as in
//! Redis); EXEC sends them as one `RedisRequest` with the WATCHed keys and
//! the revisions WATCH read for them, applied atomically at one point of
//! the log or not at all (a changed watched key: EXEC answers nil). A
//! block of reads only is answered locally, the watched revisions checked
//! in the same read.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};
use tokio::sync::watch;

use kvproto::kv::v1::Consistency;
use kvstate::command::{Answer, Outcome, Write};
use kvstate::redis::{RedisAnswer, RedisCommand, RedisReply, RedisRequest};

use super::command::{self, Kind, Spec};
use super::resp::{self, Decoder, Protocol, Reply};
use super::{
    ClientInfo, Parsed, REDIS_COMPATIBLE_VERSION, REDIS_CONNECTIONS_MAX, RedisFrontEnd, keys,
    reply_of, unix_time_ms,
};
use crate::raft::watch::MetricsWatch;

/// Requests decoded from the read buffer and run before their replies are
/// written, at most (a longer pipeline is served in rounds).
pub const PIPELINE_COMMANDS_MAX: usize = 1024;
/// Bytes asked of the socket per read.
pub const READ_CHUNK_BYTES: usize = 16 * 1024;
/// Pipelined write commands sent as one request at most.
pub const WRITE_REQUEST_COMMANDS_MAX: usize = 64;
/// Argument bytes of the write commands sent as one request at most (a
/// larger command goes alone).
pub const WRITE_REQUEST_BYTES_MAX: usize = 256 * 1024;
/// Engine records a write command may write and still share a request
/// with others (a bigger one — FLUSHALL, a large MSET — goes alone, so a
/// request refused whole for a limit refuses only itself).
pub const WRITE_REQUEST_SHARED_RECORDS_MAX: usize = 1024;
/// Pipelined read commands answered after one read step at most (their
/// replies are then written out before more are read).
pub const READ_RUN_COMMANDS_MAX: usize = 64;
/// Reply bytes gathered before they are written to the socket.
pub const OUTPUT_WRITE_BYTES: usize = 64 * 1024;
/// Commands one MULTI may queue at most.
pub const MULTI_COMMANDS_MAX: usize = 10_000;
/// Keys one connection may WATCH at most.
pub const WATCH_KEYS_MAX: usize = 10_000;
/// Byte length of a client name at most (CLIENT SETNAME, HELLO SETNAME).
pub const CLIENT_NAME_BYTES_MAX: usize = 256;

/// One command waiting in a run.
#[derive(Debug)]
struct Pending {
    /// Its reply's place.
    slot: usize,
    parsed: Parsed,
    /// Bytes of its arguments.
    bytes: usize,
}

/// A run of commands of one kind, run together when a command of another
/// kind (or the end of the pipeline) comes.
#[derive(Debug, Default)]
enum Run {
    #[default]
    Empty,
    Writes(Vec<Pending>),
    Reads(Vec<Pending>),
}

/// A command queued by MULTI.
#[derive(Debug)]
enum Queued {
    /// Run by the state machine as part of the block.
    Command(RedisCommand),
    /// EXPIRETIME / PEXPIRETIME: a PTTL in the block, then the wall clock.
    ExpireTime(RedisCommand, bool),
    /// A syntax error found at queue time: EXEC answers it in its place.
    Error(Reply),
    /// A connection or server command, answered at EXEC.
    Local(&'static Spec, Vec<Vec<u8>>),
    /// A listing read (KEYS, SCAN, ...), answered right after the block.
    Listing(Parsed),
}

struct Connection<S> {
    stream: S,
    front_end: RedisFrontEnd,
    info: ClientInfo,
    stop: watch::Receiver<bool>,
    protocol: Protocol,
    authenticated: bool,
    /// READONLY: reads are stale (answered from this member's state).
    stale_reads: bool,
    multi: Option<Vec<Queued>>,
    /// A queued command was refused (EXEC answers EXECABORT).
    multi_failed: bool,
    watched: Vec<(Vec<u8>, u64)>,
    /// A log index at or after this connection's last write (WAIT, and
    /// `min_index` of stale reads).
    last_write_index: u64,
    close: bool,
    /// Replies not written yet, in order.
    out: Vec<u8>,
    /// Replies not encoded yet: (reply once known, command family).
    slots: VecDeque<(Option<Reply>, &'static str)>,
    /// The number of the first of `slots`.
    first_slot: usize,
    run: Run,
}

/// Serves one connection until the client leaves, QUIT, a protocol error
/// or the member stops.
pub(super) async fn run<S>(
    stream: S,
    id: u64,
    addr: SocketAddr,
    local_addr: SocketAddr,
    front_end: RedisFrontEnd,
    stop: watch::Receiver<bool>,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send,
{
    let now = Instant::now();
    let info = ClientInfo {
        id,
        addr,
        local_addr,
        name: Vec::new(),
        created: now,
        last_command_at: now,
        last_command: "",
        protocol: 2,
        multi: -1,
        readonly: false,
    };
    front_end.update_client(&info);
    let mut connection = Connection {
        stream,
        authenticated: front_end.token().is_none(),
        front_end,
        info,
        stop,
        protocol: Protocol::Resp2,
        stale_reads: false,
        multi: None,
        multi_failed: false,
        watched: Vec::new(),
        last_write_index: 0,
        close: false,
        out: Vec::new(),
        slots: VecDeque::new(),
        first_slot: 0,
        run: Run::Empty,
    };
    if let Err(err) = connection.serve().await {
        tracing::debug!(error = %err, %addr, "redis connection ended");
    }
}

impl<S> Connection<S>
where
    S: AsyncRead + AsyncWrite + Unpin + Send,
{
    async fn serve(&mut self) -> std::io::Result<()> {
        let mut buf: Vec<u8> = Vec::with_capacity(READ_CHUNK_BYTES);
        let mut pos = 0;
        let mut decoder = Decoder::default();
        loop {
            let mut requests = Vec::new();
            let mut protocol_error = None;
            // Until a client authenticates, one request at a time: AUTH
            // changes the limits the next one is decoded with.
            let batch_max = if self.authenticated {
                PIPELINE_COMMANDS_MAX
            } else {
                1
            };
            while requests.len() < batch_max {
                match decoder.decode(&buf, &mut pos, self.authenticated) {
                    Ok(Some(args)) if args.is_empty() => {}
                    Ok(Some(args)) => requests.push(args),
                    Ok(None) => break,
                    Err(err) => {
                        protocol_error = Some(err);
                        break;
                    }
                }
            }
            // Drop what was consumed once it is most of the buffer.
            if pos > 0 && (pos == buf.len() || pos >= READ_CHUNK_BYTES) {
                buf.drain(..pos);
                pos = 0;
            }
            if requests.is_empty() && protocol_error.is_none() {
                buf.reserve(READ_CHUNK_BYTES);
                let read = tokio::select! {
                    read = self.stream.read_buf(&mut buf) => read?,
                    _ = self.stop.wait_for(|stopping| *stopping) => return Ok(()),
                };
                if read == 0 {
                    return Ok(());
                }
                continue;
            }
            for args in requests {
                self.handle(args).await;
                if self.out.len() >= OUTPUT_WRITE_BYTES {
                    self.write_out().await?;
                }
                if self.close {
                    break;
                }
            }
            self.finish_run().await;
            if let Some(err) = protocol_error {
                self.emit_now(Reply::err(err.0), "unknown");
                self.close = true;
            }
            self.info.last_command_at = Instant::now();
            self.info.protocol = self.protocol.version();
            self.info.multi = self.multi.as_ref().map_or(-1, |q| q.len() as i64);
            self.info.readonly = self.stale_reads;
            self.front_end.update_client(&self.info);
            self.write_out().await?;
            if self.close {
                let _ = self.stream.shutdown().await;
                return Ok(());
            }
        }
    }

    async fn write_out(&mut self) -> std::io::Result<()> {
        if !self.out.is_empty() {
            self.stream.write_all(&self.out).await?;
            self.stream.flush().await?;
            self.out.clear();
        }
        Ok(())
    }

    /// Takes a place for a reply.
    fn take_slot(&mut self, family: &'static str) -> usize {
        self.slots.push_back((None, family));
        self.first_slot + self.slots.len() - 1
    }

    /// Gives slot `slot` its reply, and encodes every reply now known in
    /// order.
    fn fill(&mut self, slot: usize, reply: Reply) {
        if let Some(entry) = self.slots.get_mut(slot - self.first_slot) {
            entry.0 = Some(reply);
        }
        while let Some((Some(_), _)) = self.slots.front() {
            let Some((Some(reply), family)) = self.slots.pop_front() else {
                break;
            };
            self.first_slot += 1;
            self.count(family, reply.is_error());
            resp::encode(&reply, self.protocol, &mut self.out);
        }
    }

    /// A reply known now, in order after the ones waiting.
    fn emit_now(&mut self, reply: Reply, family: &'static str) {
        let slot = self.take_slot(family);
        self.fill(slot, reply);
    }

    fn count(&self, family: &'static str, error: bool) {
        let stats = self.front_end.stats();
        stats.commands_processed.fetch_add(1, Ordering::Relaxed);
        if error {
            stats.errors.fetch_add(1, Ordering::Relaxed);
        }
        if let Some(metrics) = self.front_end.kv().metrics() {
            metrics.redis_command(family, error);
        }
    }

    /// The metrics family of a command's group.
    fn family(spec: &Spec) -> &'static str {
        match spec.group {
            "cluster" => "connection",
            group => group,
        }
    }

    /// Runs the commands waiting in the current run.
    async fn finish_run(&mut self) {
        match std::mem::take(&mut self.run) {
            Run::Empty => {}
            Run::Writes(writes) => self.run_writes(writes).await,
            Run::Reads(reads) => self.run_reads(reads).await,
        }
    }

    /// One request.
    async fn handle(&mut self, args: Vec<Vec<u8>>) {
        let Some(spec) = command::lookup(&args[0]) else {
            if self.multi.is_some() {
                self.multi_failed = true;
            }
            self.emit_now(command::unknown_command(&args), "unknown");
            return;
        };
        let family = Self::family(spec);
        self.info.last_command = spec.name;
        if let Err(reply) = command::check_arity(spec, args.len(), spec.name) {
            if self.multi.is_some() {
                self.multi_failed = true;
            }
            self.emit_now(reply, family);
            return;
        }
        if !self.authenticated && !spec.flags.contains(&"no_auth") {
            if self.multi.is_some() {
                self.multi_failed = true;
            }
            self.emit_now(
                Reply::Error("NOAUTH Authentication required.".to_string()),
                family,
            );
            return;
        }
        if self.multi.is_some()
            && !matches!(
                spec.name,
                "exec" | "discard" | "multi" | "watch" | "quit" | "reset"
            )
        {
            let reply = self.queue(spec, args);
            self.emit_now(reply, family);
            return;
        }
        match spec.kind {
            Kind::Read | Kind::Write => {
                let bytes = args.iter().map(Vec::len).sum();
                match super::parse(spec.name, &args[1..]) {
                    None => self.emit_now(command::unknown_command(&args), family),
                    Some(Err(reply)) => self.emit_now(reply, family),
                    Some(Ok(parsed)) => self.push(parsed, bytes, family).await,
                }
            }
            Kind::Local => {
                let reply = self.local(spec, args).await;
                self.emit_now(reply, family);
            }
        }
    }

    /// Adds a data command to the current run (running the run first when
    /// it holds the other kind, or is full).
    async fn push(&mut self, parsed: Parsed, bytes: usize, family: &'static str) {
        let is_write = parsed.is_write();
        let full = match &self.run {
            Run::Empty => false,
            Run::Writes(writes) => !is_write || writes.len() >= WRITE_REQUEST_COMMANDS_MAX,
            Run::Reads(reads) => is_write || reads.len() >= READ_RUN_COMMANDS_MAX,
        };
        if full {
            self.finish_run().await;
        }
        let slot = self.take_slot(family);
        let pending = Pending {
            slot,
            parsed,
            bytes,
        };
        match &mut self.run {
            Run::Writes(writes) => writes.push(pending),
            Run::Reads(reads) => reads.push(pending),
            run @ Run::Empty => {
                *run = if is_write {
                    Run::Writes(vec![pending])
                } else {
                    Run::Reads(vec![pending])
                };
            }
        }
    }

    /// Sends a run of writes: one request per group that fits the
    /// request bounds, in order.
    async fn run_writes(&mut self, writes: Vec<Pending>) {
        let mut group: Vec<(usize, RedisCommand)> = Vec::new();
        let mut group_bytes = 0;
        for pending in writes {
            let Parsed::Command(command) = pending.parsed else {
                self.fill(pending.slot, Reply::err("raftcask: not a write"));
                continue;
            };
            let alone = pending.bytes > WRITE_REQUEST_BYTES_MAX
                || command.records() > WRITE_REQUEST_SHARED_RECORDS_MAX;
            if !group.is_empty() && (alone || group_bytes + pending.bytes > WRITE_REQUEST_BYTES_MAX)
            {
                self.send_writes(std::mem::take(&mut group)).await;
                group_bytes = 0;
            }
            group_bytes += pending.bytes;
            group.push((pending.slot, command));
            if alone {
                self.send_writes(std::mem::take(&mut group)).await;
                group_bytes = 0;
            }
        }
        if !group.is_empty() {
            self.send_writes(group).await;
        }
    }

    /// One request of write commands; each slot gets its command's reply.
    async fn send_writes(&mut self, group: Vec<(usize, RedisCommand)>) {
        let (slots, commands): (Vec<usize>, Vec<RedisCommand>) = group.into_iter().unzip();
        let count = commands.len();
        let request = RedisRequest {
            session: None,
            watched: Vec::new(),
            commands,
        };
        let replies = match self.submit(request).await {
            Ok(RedisAnswer::Replies(replies)) if replies.len() == count => {
                replies.into_iter().map(reply_of).collect()
            }
            Ok(other) => {
                vec![
                    Reply::err(format!("raftcask: unexpected answer to a write: {other:?}"));
                    count
                ]
            }
            Err(reply) => vec![reply; count],
        };
        for (slot, reply) in slots.into_iter().zip(replies) {
            self.fill(slot, reply);
        }
    }

    /// Sends one request down the front end's write path; remembers the
    /// log index it applied at (at or after, for WAIT).
    async fn submit(&mut self, request: RedisRequest) -> Result<RedisAnswer, Reply> {
        match self.front_end.write(Write::Redis(request)).await {
            Ok((
                Answer {
                    outcome: Outcome::Redis(answer),
                    ..
                },
                index,
            )) => {
                // At or after the write's entry: a stale read of this
                // connection waits until the member applied that far.
                self.last_write_index = self.last_write_index.max(index);
                Ok(answer)
            }
            Ok((
                Answer {
                    outcome: Outcome::Rejected { reason },
                    ..
                },
                _,
            )) => Err(Reply::err(reason)),
            Ok((answer, _)) => Err(Reply::err(format!(
                "raftcask: unexpected answer to a write: {:?}",
                answer.outcome
            ))),
            Err(refused) => Err(refused.reply()),
        }
    }

    /// The read step for this connection's consistency: `Err` is the reply
    /// every read waiting on it gets.
    async fn prepare_read(&self) -> Result<(), Reply> {
        let (consistency, min_index) = if self.stale_reads {
            (Consistency::Stale, self.last_write_index)
        } else {
            (Consistency::Linearizable, 0)
        };
        self.front_end
            .kv()
            .prepare_read(consistency, min_index)
            .await
            .map_err(|status| {
                Reply::Error(format!(
                    "CLUSTERDOWN raftcask: {}",
                    status.message().replace(['\r', '\n'], " ")
                ))
            })
    }

    /// Answers a run of reads after one read step.
    async fn run_reads(&mut self, reads: Vec<Pending>) {
        if let Err(reply) = self.prepare_read().await {
            for pending in reads {
                self.fill(pending.slot, reply.clone());
            }
            return;
        }
        let (slots, parsed): (Vec<usize>, Vec<Parsed>) =
            reads.into_iter().map(|p| (p.slot, p.parsed)).unzip();
        let replies = self.read_locally(parsed).await;
        for (slot, reply) in slots.into_iter().zip(replies) {
            self.fill(slot, reply);
        }
    }

    /// Answers reads from the local state (after the read step): small
    /// ones on this thread when no entry is applying, the rest on a
    /// blocking thread.
    async fn read_locally(&self, reads: Vec<Parsed>) -> Vec<Reply> {
        let state_machine = self.front_end.kv().state_machine().clone();
        let now_ms = state_machine.cluster_time_ms();
        let small = reads.iter().all(|read| {
            matches!(read, Parsed::Command(command) if !matches!(command, RedisCommand::HGetAll { .. } | RedisCommand::MGet { .. } | RedisCommand::HMGet { .. }))
        });
        if small
            && let Some((replies, _)) = state_machine.try_read_exact(|engine| {
                reads
                    .iter()
                    .map(|read| read_one(engine, now_ms, read))
                    .collect::<Vec<_>>()
            })
        {
            return replies;
        }
        let front_end = self.front_end.clone();
        let count = reads.len();
        match tokio::task::spawn_blocking(move || {
            reads
                .iter()
                .map(|read| read_blocking(&front_end, &state_machine, now_ms, read))
                .collect::<Vec<_>>()
        })
        .await
        {
            Ok(replies) => replies,
            Err(err) => vec![Reply::err(format!("raftcask: the read failed: {err}")); count],
        }
    }

    /// Queues a command of a MULTI block; answers `+QUEUED` (or an error
    /// that makes EXEC abort).
    fn queue(&mut self, spec: &'static Spec, args: Vec<Vec<u8>>) -> Reply {
        let Some(queue) = self.multi.as_mut() else {
            return Reply::err("raftcask: no MULTI");
        };
        if queue.len() >= MULTI_COMMANDS_MAX {
            self.multi_failed = true;
            return Reply::err(format!(
                "the transaction is over MULTI_COMMANDS_MAX ({MULTI_COMMANDS_MAX} commands)"
            ));
        }
        let queued = match spec.kind {
            Kind::Local => Queued::Local(spec, args),
            Kind::Read | Kind::Write => match super::parse(spec.name, &args[1..]) {
                None => Queued::Error(command::unknown_command(&args)),
                Some(Err(reply)) => Queued::Error(reply),
                Some(Ok(Parsed::Command(command))) => Queued::Command(command),
                Some(Ok(Parsed::ExpireTime { key, milliseconds })) => Queued::ExpireTime(
                    RedisCommand::Ttl {
                        key,
                        milliseconds: true,
                    },
                    milliseconds,
                ),
                Some(Ok(listing)) => Queued::Listing(listing),
            },
        };
        queue.push(queued);
        Reply::Simple("QUEUED".to_string())
    }

    /// EXEC: the queued block as one request (or one local read).
    async fn exec(&mut self) -> Reply {
        let Some(queue) = self.multi.take() else {
            return Reply::err("EXEC without MULTI");
        };
        let watched = std::mem::take(&mut self.watched);
        if std::mem::take(&mut self.multi_failed) {
            return Reply::Error(
                "EXECABORT Transaction discarded because of previous errors.".to_string(),
            );
        }
        self.finish_run().await;
        let commands: Vec<RedisCommand> = queue
            .iter()
            .filter_map(|queued| match queued {
                Queued::Command(command) | Queued::ExpireTime(command, _) => Some(command.clone()),
                _ => None,
            })
            .collect();
        let count = commands.len();
        let answer = if commands.iter().all(RedisCommand::is_read) {
            self.exec_reads(watched, commands).await
        } else {
            self.submit(RedisRequest {
                session: None,
                watched,
                commands,
            })
            .await
            .and_then(|answer| match answer {
                RedisAnswer::Replies(replies) if replies.len() == count => Ok(Some(replies)),
                RedisAnswer::WatchFailed => Ok(None),
                other => Err(Reply::err(format!(
                    "raftcask: unexpected answer to EXEC: {other:?}"
                ))),
            })
        };
        let replies = match answer {
            Err(reply) => return reply,
            Ok(None) => return Reply::NilArray,
            Ok(Some(replies)) => replies,
        };
        let mut replies = replies.into_iter();
        let mut out = Vec::with_capacity(queue.len());
        for queued in queue {
            out.push(match queued {
                Queued::Command(_) => replies.next().map_or(Reply::Nil, reply_of),
                Queued::ExpireTime(_, milliseconds) => replies
                    .next()
                    .map_or(Reply::Nil, |pttl| keys::expire_time(pttl, milliseconds)),
                Queued::Error(reply) => reply,
                Queued::Local(spec, args) => Box::pin(self.local(spec, args)).await,
                Queued::Listing(parsed) => self
                    .read_locally(vec![parsed])
                    .await
                    .pop()
                    .unwrap_or(Reply::Nil),
            });
        }
        Reply::Array(out)
    }

    /// A block of reads only: answered from the local state after the
    /// read step, the watched keys checked in the same read. `Ok(None)`:
    /// a watched key changed.
    async fn exec_reads(
        &mut self,
        watched: Vec<(Vec<u8>, u64)>,
        commands: Vec<RedisCommand>,
    ) -> Result<Option<Vec<RedisReply>>, Reply> {
        if commands.is_empty() && watched.is_empty() {
            return Ok(Some(Vec::new()));
        }
        self.prepare_read().await?;
        let state_machine = self.front_end.kv().state_machine().clone();
        let now_ms = state_machine.cluster_time_ms();
        let read = tokio::task::spawn_blocking(move || {
            state_machine.read_exact(|engine| {
                for (key, revision) in &watched {
                    match kvstate::redis::watch_revision(engine, key, now_ms) {
                        Ok(current) if current == *revision => {}
                        Ok(_) => return Ok(None),
                        Err(err) => return Err(super::read_error(err)),
                    }
                }
                Ok(Some(
                    commands
                        .iter()
                        .map(|command| {
                            kvstate::redis::read(engine, now_ms, command)
                                .unwrap_or_else(read_error_reply)
                        })
                        .collect(),
                ))
            })
        })
        .await;
        match read {
            Ok((result, _)) => result,
            Err(err) => Err(Reply::err(format!("raftcask: the read failed: {err}"))),
        }
    }

    /// WATCH: the revision of each key, read after the read step.
    async fn watch(&mut self, keys: &[Vec<u8>]) -> Reply {
        if self.multi.is_some() {
            return Reply::err("WATCH inside MULTI is not allowed");
        }
        self.finish_run().await;
        if self.watched.len() + keys.len() > WATCH_KEYS_MAX {
            return Reply::err(format!(
                "a connection watches WATCH_KEYS_MAX ({WATCH_KEYS_MAX}) keys at most"
            ));
        }
        if let Err(reply) = self.prepare_read().await {
            return reply;
        }
        let state_machine = self.front_end.kv().state_machine().clone();
        let now_ms = state_machine.cluster_time_ms();
        let keys = keys.to_vec();
        let read = tokio::task::spawn_blocking(move || {
            state_machine.read_exact(|engine| {
                keys.into_iter()
                    .map(|key| {
                        kvstate::redis::watch_revision(engine, &key, now_ms)
                            .map(|revision| (key, revision))
                    })
                    .collect::<Result<Vec<_>, _>>()
            })
        })
        .await;
        match read {
            Ok((Ok(revisions), _)) => {
                for (key, revision) in revisions {
                    // A key watched already keeps its first revision.
                    if !self.watched.iter().any(|(watched, _)| *watched == key) {
                        self.watched.push((key, revision));
                    }
                }
                Reply::ok()
            }
            Ok((Err(err), _)) => super::read_error(err),
            Err(err) => Reply::err(format!("raftcask: the read failed: {err}")),
        }
    }

    /// A connection or server command.
    async fn local(&mut self, spec: &'static Spec, args: Vec<Vec<u8>>) -> Reply {
        match spec.name {
            "ping" => match args.len() {
                1 => Reply::Simple("PONG".to_string()),
                2 => Reply::Bulk(args[1].clone()),
                _ => Reply::err("wrong number of arguments for 'ping' command"),
            },
            "echo" => Reply::Bulk(args[1].clone()),
            "quit" => {
                self.finish_run().await;
                self.close = true;
                Reply::ok()
            }
            "reset" => {
                self.finish_run().await;
                self.multi = None;
                self.multi_failed = false;
                self.watched.clear();
                self.protocol = Protocol::Resp2;
                self.info.name.clear();
                self.stale_reads = false;
                self.authenticated = self.front_end.token().is_none();
                Reply::Simple("RESET".to_string())
            }
            "select" => match super::integer(&args[1]) {
                Err(reply) => reply,
                Ok(0) => Reply::ok(),
                Ok(_) => Reply::err("DB index is out of range"),
            },
            "auth" => self.auth(&args[1..]),
            "hello" => {
                self.finish_run().await;
                self.hello(&args[1..])
            }
            "readonly" | "readwrite" => {
                // Reads already waiting keep the consistency they were
                // sent with.
                self.finish_run().await;
                self.stale_reads = spec.name == "readonly";
                Reply::ok()
            }
            "multi" => {
                if self.multi.is_some() {
                    return Reply::err("MULTI calls can not be nested");
                }
                self.multi = Some(Vec::new());
                self.multi_failed = false;
                Reply::ok()
            }
            "exec" => self.exec().await,
            "discard" => {
                if self.multi.take().is_none() {
                    return Reply::err("DISCARD without MULTI");
                }
                self.multi_failed = false;
                self.watched.clear();
                Reply::ok()
            }
            "watch" => self.watch(&args[1..]).await,
            "unwatch" => {
                self.watched.clear();
                Reply::ok()
            }
            "time" => {
                let micros = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |since| since.as_micros());
                Reply::Array(vec![
                    Reply::text((micros / 1_000_000).to_string()),
                    Reply::text((micros % 1_000_000).to_string()),
                ])
            }
            "wait" => {
                self.finish_run().await;
                self.wait(&args[1], &args[2]).await
            }
            "info" => {
                self.finish_run().await;
                self.info_command(&args[1..]).await
            }
            "command" | "client" | "config" => self.container(spec, &args).await,
            other => Reply::err(format!("raftcask: no handler for '{other}'")),
        }
    }

    /// CLIENT, CONFIG and COMMAND: a subcommand, its arity checked.
    async fn container(&mut self, spec: &'static Spec, args: &[Vec<u8>]) -> Reply {
        if spec.name == "command" && args.len() == 1 {
            return command::command(&[]);
        }
        let Some(sub) = command::subcommand(spec, &args[1]) else {
            return command::unknown_subcommand(spec.name, &args[1]);
        };
        let full_name = format!("{}|{}", spec.name, sub.name);
        if let Err(reply) = command::check_arity(sub, args.len(), &full_name) {
            return reply;
        }
        match spec.name {
            "command" => command::command(&args[1..]),
            "client" => self.client(sub.name, &args[2..]),
            _ => self.config(sub.name, &args[2..]),
        }
    }

    fn auth(&mut self, args: &[Vec<u8>]) -> Reply {
        if args.len() > 2 {
            return super::syntax_error();
        }
        let (user, password) = match args {
            [password] => {
                if self.front_end.token().is_none() {
                    return Reply::err(
                        "AUTH <password> called without any password configured for the \
                         default user. Are you sure your configuration is correct?",
                    );
                }
                (&b"default"[..], password.as_slice())
            }
            [user, password] => (user.as_slice(), password.as_slice()),
            _ => return super::syntax_error(),
        };
        if self.credentials_match(user, password) {
            self.authenticated = true;
            Reply::ok()
        } else {
            wrong_password()
        }
    }

    /// The only user is `default`; its password is the cluster's token
    /// (any password when the cluster has none, as Redis's `nopass`).
    fn credentials_match(&self, user: &[u8], password: &[u8]) -> bool {
        user == b"default"
            && self
                .front_end
                .token()
                .is_none_or(|token| token.matches(password))
    }

    fn hello(&mut self, args: &[Vec<u8>]) -> Reply {
        let mut version = None;
        if let Some(first) = args.first() {
            match super::integer(first) {
                Ok(v @ 2..=3) => version = Some(v),
                Ok(_) => {
                    return Reply::Error("NOPROTO unsupported protocol version".to_string());
                }
                Err(_) => {
                    return Reply::err("Protocol version is not an integer or out of range");
                }
            }
        }
        let mut credentials = None;
        let mut name = None;
        let mut i = 1;
        while i < args.len() {
            let more = args.len() - 1 - i;
            let option = args[i].to_ascii_uppercase();
            if option == b"AUTH" && more >= 2 {
                credentials = Some((args[i + 1].clone(), args[i + 2].clone()));
                i += 3;
            } else if option == b"SETNAME" && more >= 1 {
                name = Some(args[i + 1].clone());
                i += 2;
            } else {
                return Reply::err(format!(
                    "Syntax error in HELLO option '{}'",
                    String::from_utf8_lossy(&args[i])
                ));
            }
        }
        if let Some((user, password)) = credentials {
            if !self.credentials_match(&user, &password) {
                return wrong_password();
            }
            self.authenticated = true;
        }
        if !self.authenticated {
            return Reply::Error(
                "NOAUTH HELLO must be called with the client already authenticated, otherwise \
                 the HELLO <proto> AUTH <user> <pass> option can be used to authenticate the \
                 client and select the RESP protocol version at the same time"
                    .to_string(),
            );
        }
        if let Some(name) = name
            && let Err(reply) = self.set_name(name)
        {
            return reply;
        }
        if let Some(version) = version {
            self.protocol = if version == 3 {
                Protocol::Resp3
            } else {
                Protocol::Resp2
            };
        }
        let leads = self.front_end.kv().leads();
        Reply::Map(vec![
            (Reply::text("server"), Reply::text("redis")),
            (
                Reply::text("version"),
                Reply::text(REDIS_COMPATIBLE_VERSION),
            ),
            (
                Reply::text("proto"),
                Reply::Integer(self.protocol.version()),
            ),
            (Reply::text("id"), Reply::Integer(self.info.id as i64)),
            (Reply::text("mode"), Reply::text("standalone")),
            (
                Reply::text("role"),
                Reply::text(if leads { "master" } else { "replica" }),
            ),
            (Reply::text("modules"), Reply::Array(Vec::new())),
        ])
    }

    fn set_name(&mut self, name: Vec<u8>) -> Result<(), Reply> {
        if name.len() > CLIENT_NAME_BYTES_MAX {
            return Err(Reply::err(format!(
                "the client name is over CLIENT_NAME_BYTES_MAX ({CLIENT_NAME_BYTES_MAX} bytes)"
            )));
        }
        if name.iter().any(|b| !(b'!'..=b'~').contains(b)) {
            return Err(Reply::err(
                "Client names cannot contain spaces, newlines or special characters.",
            ));
        }
        self.info.name = name;
        Ok(())
    }

    fn client(&mut self, sub: &str, args: &[Vec<u8>]) -> Reply {
        match sub {
            "setname" => match self.set_name(args[0].clone()) {
                Ok(()) => Reply::ok(),
                Err(reply) => reply,
            },
            "getname" if self.info.name.is_empty() => Reply::Nil,
            "getname" => Reply::Bulk(self.info.name.clone()),
            "id" => Reply::Integer(self.info.id as i64),
            "info" => {
                self.info.protocol = self.protocol.version();
                self.info.last_command = "client|info";
                Reply::Verbatim(format!("{}\n", self.info.line(Instant::now())))
            }
            "list" => {
                self.info.last_command = "client|list";
                self.front_end.update_client(&self.info);
                let mut ids: Option<Vec<u64>> = None;
                let mut only_normal = true;
                let mut i = 0;
                while i < args.len() {
                    let option = args[i].to_ascii_uppercase();
                    if option == b"TYPE" && i + 1 < args.len() {
                        let kind = args[i + 1].to_ascii_lowercase();
                        if !matches!(
                            kind.as_slice(),
                            b"normal" | b"master" | b"replica" | b"slave" | b"pubsub"
                        ) {
                            return Reply::err(format!(
                                "Unknown client type '{}'",
                                String::from_utf8_lossy(&args[i + 1])
                            ));
                        }
                        only_normal = kind == b"normal";
                        i += 2;
                    } else if option == b"ID" && i + 1 < args.len() {
                        let mut list = Vec::new();
                        for id in &args[i + 1..] {
                            match super::integer(id) {
                                Ok(id) if id > 0 => list.push(id as u64),
                                _ => return Reply::err("Invalid client ID"),
                            }
                        }
                        ids = Some(list);
                        i = args.len();
                    } else {
                        return super::syntax_error();
                    }
                }
                let now = Instant::now();
                let text: String = self
                    .front_end
                    .clients()
                    .iter()
                    .filter(|client| {
                        only_normal && ids.as_ref().is_none_or(|ids| ids.contains(&client.id))
                    })
                    .map(|client| format!("{}\n", client.line(now)))
                    .collect();
                Reply::Verbatim(text)
            }
            "setinfo" => {
                let attribute = args[0].to_ascii_uppercase();
                if attribute != b"LIB-NAME" && attribute != b"LIB-VER" {
                    return Reply::err(format!(
                        "Unrecognized option '{}'",
                        String::from_utf8_lossy(&args[0])
                    ));
                }
                Reply::ok()
            }
            _ => help(&[
                "CLIENT <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
                "GETNAME",
                "    Return the name of the current connection.",
                "ID",
                "    Return the ID of the current connection.",
                "INFO",
                "    Return information about the current client connection.",
                "LIST [TYPE <type>] [ID <id> [<id> ...]]",
                "    Return information about client connections.",
                "SETNAME <name>",
                "    Assign the name <name> to the current connection.",
                "SETINFO <option> <value>",
                "    Set client meta attr (accepted, not kept).",
                "HELP",
                "    Print this help.",
            ]),
        }
    }

    fn config(&mut self, sub: &str, args: &[Vec<u8>]) -> Reply {
        match sub {
            "get" => {
                let entries = self.config_entries();
                let mut pairs = Vec::new();
                for (name, value) in &entries {
                    let wanted = args.iter().any(|pattern| {
                        let pattern = pattern.to_ascii_lowercase();
                        pattern == b"*"
                            || pattern == name.as_bytes()
                            || super::glob::matches(&pattern, name.as_bytes())
                    });
                    if wanted {
                        pairs.push((Reply::text(*name), Reply::text(value.clone())));
                    }
                }
                Reply::Map(pairs)
            }
            "set" => Reply::err(
                "raftcask does not change its configuration at run time (CONFIG SET); restart \
                 the member with the flag instead",
            ),
            "resetstat" => {
                let stats = self.front_end.stats();
                stats.commands_processed.store(0, Ordering::Relaxed);
                stats.errors.store(0, Ordering::Relaxed);
                stats.connections_received.store(0, Ordering::Relaxed);
                stats.connections_rejected.store(0, Ordering::Relaxed);
                Reply::ok()
            }
            _ => help(&[
                "CONFIG <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
                "GET <pattern>",
                "    Return parameters matching the glob-like <pattern> and their values.",
                "RESETSTAT",
                "    Reset statistics reported by the INFO command.",
                "HELP",
                "    Print this help.",
            ]),
        }
    }

    /// What CONFIG GET answers: the settings clients and redis-benchmark
    /// ask about, as raftcask has them (never the token).
    fn config_entries(&self) -> Vec<(&'static str, String)> {
        let addr = self.front_end.listen_addr();
        vec![
            ("appendfsync", "always".to_string()),
            ("appendonly", "yes".to_string()),
            ("bind", addr.ip().to_string()),
            ("cluster-enabled", "no".to_string()),
            ("databases", "1".to_string()),
            (
                "hash-max-listpack-entries",
                super::hashes::HSCAN_WHOLE_FIELDS_MAX.to_string(),
            ),
            (
                "hash-max-ziplist-entries",
                super::hashes::HSCAN_WHOLE_FIELDS_MAX.to_string(),
            ),
            ("maxclients", REDIS_CONNECTIONS_MAX.to_string()),
            ("maxmemory", "0".to_string()),
            ("maxmemory-policy", "noeviction".to_string()),
            ("notify-keyspace-events", String::new()),
            ("port", addr.port().to_string()),
            (
                "proto-max-bulk-len",
                super::resp::ARGUMENT_BYTES_MAX.to_string(),
            ),
            ("replica-read-only", "yes".to_string()),
            ("save", String::new()),
            ("slave-read-only", "yes".to_string()),
            ("tcp-keepalive", "0".to_string()),
            ("timeout", "0".to_string()),
        ]
    }

    /// WAIT: how many followers hold this connection's last write, waiting
    /// up to `timeout` ms (0: until enough do) for `numreplicas` of them.
    /// On a follower: 1 once this member applied it (it sees no other).
    async fn wait(&mut self, numreplicas: &[u8], timeout: &[u8]) -> Reply {
        let wanted = match super::integer(numreplicas) {
            Ok(n) => n,
            Err(reply) => return reply,
        };
        let timeout_ms = match super::resp::parse_i64(timeout) {
            None => return Reply::err("timeout is not an integer or out of range"),
            Some(ms) if ms < 0 => return Reply::err("timeout is negative"),
            Some(ms) => ms as u64,
        };
        let index = self.last_write_index;
        let me = self.front_end.member_id();
        let holding = |metrics: &crate::raft::types::NodeMetrics| -> i64 {
            match &metrics.replication {
                Some(replication) => replication
                    .iter()
                    .filter(|(id, matched)| {
                        **id != me && matched.as_ref().is_some_and(|log_id| log_id.index >= index)
                    })
                    .count() as i64,
                // A follower knows only itself: it holds the write once it
                // applied that far (its log alone may still hold entries of
                // an old term at that index).
                None => i64::from(metrics.last_applied.is_some_and(|l| l.index >= index)),
            }
        };
        // A follower never sees more than itself: it answers once it holds
        // the write, rather than wait for a count it cannot see.
        let wanted = if self
            .front_end
            .raft()
            .metrics()
            .borrow()
            .replication
            .is_none()
        {
            wanted.min(1)
        } else {
            wanted
        };
        let mut watch = self.front_end.raft().metrics();
        let deadline = (timeout_ms > 0).then(|| Instant::now() + Duration::from_millis(timeout_ms));
        loop {
            let count = holding(&watch.borrow());
            if count >= wanted {
                return Reply::Integer(count);
            }
            let changed = async {
                match deadline {
                    Some(deadline) => {
                        tokio::time::timeout_at(deadline.into(), watch.changed()).await
                    }
                    None => Ok(watch.changed().await),
                }
            };
            let mut stop = self.stop.clone();
            tokio::select! {
                changed = changed => match changed {
                    Ok(Ok(())) => {}
                    _ => return Reply::Integer(holding(&watch.borrow())),
                },
                _ = stop.wait_for(|stopping| *stopping) => {
                    return Reply::Integer(holding(&watch.borrow()));
                }
            }
        }
    }

    /// INFO [section ...].
    async fn info_command(&mut self, sections: &[Vec<u8>]) -> Reply {
        let wanted: Vec<String> = sections
            .iter()
            .map(|s| String::from_utf8_lossy(s).to_ascii_lowercase())
            .collect();
        let everything = wanted.is_empty()
            || wanted
                .iter()
                .any(|s| s == "all" || s == "everything" || s == "default");
        let want = |name: &str| everything || wanted.iter().any(|s| s == name);
        let mut text = String::new();
        let front_end = &self.front_end;
        let metrics = front_end.raft().metrics().borrow().clone();
        let me = front_end.member_id();
        let (leader, leader_addr) = front_end.kv().leader();
        if want("server") {
            let uptime = front_end.uptime().as_secs();
            text.push_str(&format!(
                "# Server\r\nredis_version:{REDIS_COMPATIBLE_VERSION}\r\nraftcask_version:{}\r\n\
                 redis_mode:standalone\r\nos:{}\r\narch_bits:64\r\nprocess_id:{}\r\n\
                 tcp_port:{}\r\nserver_time_usec:{}\r\nuptime_in_seconds:{uptime}\r\n\
                 uptime_in_days:{}\r\nraftcask_member_id:{me}\r\nraftcask_tls:{}\r\n\r\n",
                env!("CARGO_PKG_VERSION"),
                std::env::consts::OS,
                std::process::id(),
                front_end.listen_addr().port(),
                unix_time_ms() * 1000,
                uptime / 86_400,
                if front_end.tls() { "yes" } else { "no" },
            ));
        }
        if want("clients") {
            text.push_str(&format!(
                "# Clients\r\nconnected_clients:{}\r\nmaxclients:{REDIS_CONNECTIONS_MAX}\r\n\
                 blocked_clients:0\r\n\r\n",
                front_end.clients().len()
            ));
        }
        if want("memory") {
            // A member keeps its keys in memory (the key directory) and its
            // values on disk: used_memory is the keys' bytes.
            let stats = front_end.kv().state_machine().engine().stats();
            text.push_str(&format!(
                "# Memory\r\nused_memory:{}\r\nused_memory_human:{}\r\nmaxmemory:0\r\n\
                 maxmemory_policy:noeviction\r\nraftcask_used_memory_is:the key directory's \
                 key bytes (values stay on disk)\r\nraftcask_engine_keys:{}\r\n\
                 raftcask_engine_live_bytes:{}\r\nraftcask_engine_dead_bytes:{}\r\n\r\n",
                stats.key_bytes,
                human_bytes(stats.key_bytes),
                stats.keys,
                stats.live_bytes,
                stats.dead_bytes,
            ));
        }
        if want("persistence") {
            text.push_str(
                "# Persistence\r\nloading:0\r\naof_enabled:1\r\nraftcask_durability:every \
                 acknowledged write is in the fsynced Raft log of a majority\r\n\r\n",
            );
        }
        if want("stats") {
            let stats = front_end.stats();
            text.push_str(&format!(
                "# Stats\r\ntotal_connections_received:{}\r\ntotal_commands_processed:{}\r\n\
                 rejected_connections:{}\r\ntotal_error_replies:{}\r\n\r\n",
                stats.connections_received.load(Ordering::Relaxed),
                stats.commands_processed.load(Ordering::Relaxed),
                stats.connections_rejected.load(Ordering::Relaxed),
                stats.errors.load(Ordering::Relaxed),
            ));
        }
        if want("replication") {
            let leads = leader == Some(me);
            text.push_str("# Replication\r\n");
            if leads {
                let followers: Vec<(u64, u64)> = metrics
                    .replication
                    .iter()
                    .flatten()
                    .filter(|(id, _)| **id != me)
                    .map(|(id, matched)| (*id, matched.as_ref().map_or(0, |l| l.index)))
                    .collect();
                text.push_str(&format!(
                    "role:master\r\nconnected_slaves:{}\r\n",
                    followers.len()
                ));
                for (n, (id, matched)) in followers.iter().enumerate() {
                    let addr = metrics
                        .membership_config
                        .membership()
                        .get_node(id)
                        .map(|node| node.client_addr.clone())
                        .unwrap_or_default();
                    text.push_str(&format!(
                        "slave{n}:raftcask_member={id},addr={addr},state=online,offset={matched}\r\n"
                    ));
                }
            } else {
                text.push_str(&format!(
                    "role:slave\r\nmaster_link_status:{}\r\n",
                    if leader.is_some() { "up" } else { "down" }
                ));
            }
            text.push_str(&format!(
                "raftcask_leader_id:{}\r\nraftcask_leader_client_addr:{}\r\nraftcask_term:{}\r\n\
                 raftcask_last_log_index:{}\r\nraftcask_applied_index:{}\r\n\r\n",
                leader.unwrap_or(0),
                leader_addr.unwrap_or_default(),
                metrics.current_term,
                metrics.last_log_index.unwrap_or(0),
                metrics.last_applied.as_ref().map_or(0, |l| l.index),
            ));
        }
        if want("keyspace") {
            let state_machine = front_end.kv().state_machine().clone();
            let now_ms = state_machine.cluster_time_ms();
            let count = tokio::task::spawn_blocking(move || {
                kvstate::redis::key_count(&state_machine.engine(), now_ms)
            })
            .await;
            text.push_str("# Keyspace\r\n");
            if let Ok(Ok(keys)) = count
                && keys > 0
            {
                text.push_str(&format!("db0:keys={keys}\r\n"));
            }
        }
        Reply::Verbatim(text)
    }
}

/// Bytes as Redis's INFO prints them (`1.44M`).
fn human_bytes(bytes: u64) -> String {
    const UNITS: [(&str, f64); 4] = [
        ("T", 1024.0 * 1024.0 * 1024.0 * 1024.0),
        ("G", 1024.0 * 1024.0 * 1024.0),
        ("M", 1024.0 * 1024.0),
        ("K", 1024.0),
    ];
    for (unit, size) in UNITS {
        if bytes as f64 >= size {
            return format!("{:.2}{unit}", bytes as f64 / size);
        }
    }
    format!("{bytes}B")
}

/// Redis's answer to a wrong user or password.
fn wrong_password() -> Reply {
    Reply::Error("WRONGPASS invalid username-password pair or user is disabled.".to_string())
}

/// A HELP answer.
fn help(lines: &[&str]) -> Reply {
    Reply::Array(
        lines
            .iter()
            .map(|line| Reply::Simple(line.to_string()))
            .collect(),
    )
}

fn read_error_reply(err: kvstate::redis::RedisError) -> RedisReply {
    match err {
        kvstate::redis::RedisError::Limit(message) => RedisReply::Error(format!("ERR {message}")),
        other => RedisReply::Error(format!("ERR raftcask: the read failed: {other}")),
    }
}

/// A single-command read against `engine` (under the caller's lock).
fn read_one(engine: &bitcask::Engine, now_ms: u64, read: &Parsed) -> Reply {
    match read {
        Parsed::Command(command) => match kvstate::redis::read(engine, now_ms, command) {
            Ok(reply) => reply_of(reply),
            Err(err) => super::read_error(err),
        },
        _ => Reply::err("raftcask: not a single-command read"),
    }
}

/// Any read, on a blocking thread.
fn read_blocking(
    front_end: &RedisFrontEnd,
    state_machine: &crate::state_machine::StateMachine,
    now_ms: u64,
    read: &Parsed,
) -> Reply {
    match read {
        Parsed::Command(_) => {
            state_machine
                .read_exact(|engine| read_one(engine, now_ms, read))
                .0
        }
        Parsed::ExpireTime { key, milliseconds } => {
            let pttl = state_machine
                .read_exact(|engine| {
                    kvstate::redis::read(
                        engine,
                        now_ms,
                        &RedisCommand::Ttl {
                            key: key.clone(),
                            milliseconds: true,
                        },
                    )
                })
                .0;
            match pttl {
                Ok(pttl) => keys::expire_time(pttl, *milliseconds),
                Err(err) => super::read_error(err),
            }
        }
        Parsed::Keys { pattern } => keys::keys(state_machine, now_ms, pattern.as_deref()),
        Parsed::Scan(scan) => keys::scan(front_end, state_machine, now_ms, scan),
        Parsed::HScan { key, scan } => {
            state_machine
                .read_exact(|engine| super::hashes::hscan(front_end, engine, now_ms, key, scan))
                .0
        }
        Parsed::DbSize => keys::dbsize(&state_machine.engine(), now_ms),
        Parsed::RandomKey => keys::random_key(state_machine, now_ms),
    }
}
