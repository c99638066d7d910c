//! The register workload through the Redis protocol: the `register`
//! workload's keys ([`super::register::Keys`], each retired after
//! [`super::register::KEY_OPS_MAX`] operations), unique values
//! (`p<process>-<n>`) and mix of reads, writes and compare-and-sets, but
//! every client process talks RESP to one member's Redis port (`kvnode run
//! --redis-addr`, [`crate::control::cluster::REDIS_PORT`]) through a Redis
//! client nobody here wrote (the `redis` crate's blocking connection, run
//! on tokio's blocking threads):
//!
//! - write: `SET k v`;
//! - read: `GET k` (linearizable: raftcask's default on the Redis port);
//! - cas: `WATCH k`, `GET k`; if the value is the expected one, `MULTI`,
//!   `SET k new`, `EXEC` (an array reply: ok; nil: a watched key changed,
//!   the block did not apply: fail), else `UNWATCH` and fail.
//!
//! The Redis port returns no versions, so the history is checked by value:
//! the same linearizability checker with the `cas-register` model (every
//! value is written once, so a value names its write). A cas compares with
//! the last value its worker saw of the key (read, found by a cas, or
//! written by itself); a worker that has seen no value of the key writes
//! instead. After the heal, [`final_reads`] reads every written key once
//! more through the Redis ports, so an acknowledged write lost by the
//! cluster shows as a non-linearizable key.
//!
//! Worker `w` is pinned to member slot `w % members` (clients spread over
//! the members: every member takes writes, a follower forwarding them to
//! the leader; a build without forwarding answers `-READONLY` on a
//! follower, a definite failure). Each worker owns one connection (WATCH is per connection, so
//! connections are never shared), opened on its first operation; it is
//! dropped and opened anew after a transport error or a timeout, and after
//! a cas that failed before EXEC (its WATCH may still be set).
//!
//! Outcomes:
//! - a read that fails, however, is `fail` (a read has no effect);
//! - a write's `SET` or a cas's `EXEC` answered by an error reply that
//!   starts with `READONLY` or says "nothing was written" did not apply:
//!   `fail` ([`reply_says_not_written`]); a transport error, a timeout or
//!   any other error reply (`-ERR raftcask: the write's outcome is unknown
//!   ...`, `-CLUSTERDOWN ... nothing is known to have been written`,
//!   `-EXECABORT`) is `info` ([`write_failure_outcome`]);
//! - a connection that could not be opened, or a cas that failed before
//!   its EXEC was sent (WATCH, GET, MULTI or the queued SET), is `fail`:
//!   no command that writes reached the member (a queued SET applies only
//!   at EXEC, and closing the connection discards the queue).
//!
//! Every request has a timeout (at most [`REQUEST_TIMEOUT`], within the
//! operation's [`OPERATION_TIMEOUT`]); every loop ends by the run's deadline
//! or a fixed count.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use rand::SeedableRng as _;
use rand::rngs::SmallRng;
use redis::{ConnectionLike as _, Value};

use super::register::ValueRequest as Request;
use super::register::{FINAL_READ_ATTEMPTS_MAX, FINAL_READ_PAUSE, Keys};
use super::{
    CONNECT_TIMEOUT, Function, History, OPERATION_TIMEOUT, Outcome, REQUEST_TIMEOUT, WorkloadConfig,
};

/// The shortest socket timeout a request is given (a zero timeout means
/// "none" to the socket, so a request made at the operation's deadline
/// still gets this much).
const REQUEST_TIMEOUT_MIN: Duration = Duration::from_millis(10);

/// Why a request got no usable reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// No connection, an I/O error, a timeout, or a reply of the wrong
    /// shape: the connection is dropped, and whether a write applied is
    /// unknown.
    Transport(String),
    /// An error reply: its text (`CODE message`).
    Reply(String),
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Transport(text) => write!(f, "transport: {text}"),
            Self::Reply(text) => write!(f, "-{text}"),
        }
    }
}

/// Whether an error reply says the write did not apply: Redis's
/// `READONLY` (a replica refuses writes) or raftcask's "nothing was
/// written" (e.g. `-CLUSTERDOWN raftcask: member 2 knows no leader ...;
/// nothing was written, retry`). Anything else is no such promise.
pub fn reply_says_not_written(text: &str) -> bool {
    text.starts_with("READONLY") || text.contains("nothing was written")
}

/// The outcome of a write's `SET` or a cas's `EXEC` that failed: `fail`
/// only when the reply says nothing was written, else `info`.
pub fn write_failure_outcome(failure: &Failure) -> Outcome {
    match failure {
        Failure::Reply(text) if reply_says_not_written(text) => Outcome::Fail,
        Failure::Reply(_) | Failure::Transport(_) => Outcome::Info,
    }
}

/// The outcome of a failed read: `fail` whatever the failure (a read
/// has no effect).
pub fn read_failure_outcome(_failure: &Failure) -> Outcome {
    Outcome::Fail
}

/// How one operation ended.
#[derive(Debug, Clone)]
struct Done {
    outcome: Outcome,
    /// The key's value this operation learnt (`Some(None)`: absent): an ok
    /// read's, a cas's GET, an ok write's own.
    seen: Option<Option<String>>,
    error: Option<String>,
}

impl Done {
    fn ok(seen: Option<Option<String>>) -> Self {
        Self {
            outcome: Outcome::Ok,
            seen,
            error: None,
        }
    }

    fn failed(outcome: Outcome, error: String) -> Self {
        Self {
            outcome,
            seen: None,
            error: Some(error),
        }
    }
}

/// Runs the workload until the deadline; every operation goes into
/// `history`.
pub async fn run(config: WorkloadConfig, history: Arc<History>) -> anyhow::Result<()> {
    if config.redis_endpoints.is_empty() {
        anyhow::bail!("the redis-register workload needs the members' Redis addresses");
    }
    super::register::run_workers(config, history, worker_loop).await
}

async fn worker_loop(
    worker: u64,
    config: WorkloadConfig,
    history: Arc<History>,
    keys: Arc<Mutex<Keys>>,
) -> anyhow::Result<()> {
    let slot = worker as usize % config.redis_endpoints.len();
    let member = slot as u64 + 1;
    let addr = config.redis_endpoints[slot].clone();
    let mut rng = SmallRng::seed_from_u64(config.seed ^ (worker.wrapping_mul(0x9e37_79b9)));
    let mut process = history.new_process();
    let mut written = 0_u64;
    // The value this worker last saw per key (a cas's expected value).
    let mut seen: HashMap<u64, Option<String>> = HashMap::new();
    let mut connection: Option<redis::Connection> = None;
    let pause = config.worker_pause();
    while tokio::time::Instant::now() < config.deadline {
        let (k, key, dice, write_guard) = super::register::next_pick(&mut rng, &keys, &config)?;
        let request = Request::pick(
            write_guard.is_some(),
            dice,
            seen.get(&k),
            process,
            &mut written,
        );
        let mut pending = request.invoke(&history, process, &key, Some(member));
        let (kept, done) = perform_blocking(connection.take(), addr.clone(), key, request).await?;
        connection = kept;
        if let Some(value) = &done.seen {
            seen.insert(k, value.clone());
            if pending.op_mut().f == Function::Read {
                pending.op_mut().value = value.clone();
            }
        }
        pending.op_mut().error = done.error;
        let outcome = history.complete(pending, done.outcome)?.outcome;
        drop(write_guard);
        if outcome == Outcome::Info {
            process = history.new_process();
        }
        tokio::time::sleep(pause).await;
    }
    Ok(())
}

/// Runs one operation on a blocking thread (the connection is a blocking
/// one) and hands the connection back (`None`: dropped).
async fn perform_blocking(
    connection: Option<redis::Connection>,
    addr: String,
    key: String,
    request: Request,
) -> anyhow::Result<(Option<redis::Connection>, Done)> {
    tokio::task::spawn_blocking(move || {
        let mut connection = connection;
        let done = perform(&mut connection, &addr, &key, &request);
        (connection, done)
    })
    .await
    .context("a Redis operation's thread panicked")
}

/// One operation: opens the connection if there is none, runs the
/// request, and drops the connection when it is in doubt.
fn perform(
    connection: &mut Option<redis::Connection>,
    addr: &str,
    key: &str,
    request: &Request,
) -> Done {
    let deadline = Instant::now() + OPERATION_TIMEOUT;
    if connection.is_none() {
        match connect(addr) {
            Ok(opened) => *connection = Some(opened),
            // Nothing was sent: no write can have applied.
            Err(failure) => return Done::failed(Outcome::Fail, format!("connect: {failure}")),
        }
    }
    let Some(conn) = connection.as_mut() else {
        return Done::failed(Outcome::Fail, "no connection".to_string());
    };
    let (done, keep) = match request {
        Request::Read => read(conn, deadline, key),
        Request::Write { value } => write(conn, deadline, key, value),
        Request::Cas { expected, value } => cas(conn, deadline, key, expected, value),
    };
    if !keep {
        *connection = None;
    }
    done
}

/// Opens a connection to `addr` within [`CONNECT_TIMEOUT`] (the client's
/// own set-up commands included).
fn connect(addr: &str) -> Result<redis::Connection, Failure> {
    let client = redis::Client::open(format!("redis://{addr}/"))
        .map_err(|err| Failure::Transport(format!("{addr}: {err}")))?;
    client
        .get_connection_with_timeout(CONNECT_TIMEOUT)
        .map_err(|err| Failure::Transport(format!("{addr}: {err}")))
}

/// Sends one command and reads its reply, within [`REQUEST_TIMEOUT`] and
/// what is left before `deadline`.
fn call(
    conn: &mut redis::Connection,
    deadline: Instant,
    cmd: &redis::Cmd,
) -> Result<Value, Failure> {
    let timeout = REQUEST_TIMEOUT
        .min(deadline.saturating_duration_since(Instant::now()))
        .max(REQUEST_TIMEOUT_MIN);
    let transport = |err: redis::RedisError| {
        if err.is_timeout() {
            Failure::Transport(format!(
                "timed out after {} ms ({err})",
                timeout.as_millis()
            ))
        } else {
            Failure::Transport(err.to_string())
        }
    };
    conn.set_read_timeout(Some(timeout)).map_err(transport)?;
    conn.set_write_timeout(Some(timeout)).map_err(transport)?;
    match conn.req_packed_command(&cmd.get_packed_command()) {
        Ok(Value::ServerError(err)) => Err(Failure::Reply(reply_text(
            err.code(),
            err.details().unwrap_or(""),
        ))),
        Ok(value) => Ok(value),
        // An error reply the client turned into an error keeps its code.
        Err(err) => match err.code() {
            Some(code) => Err(Failure::Reply(reply_text(code, err.detail().unwrap_or("")))),
            None => Err(transport(err)),
        },
    }
}

/// An error reply's text as the server sent it (without the `-`).
fn reply_text(code: &str, detail: &str) -> String {
    if detail.is_empty() {
        code.to_string()
    } else {
        format!("{code} {detail}")
    }
}

/// A reply of the wrong shape: the connection is out of step.
fn unexpected(what: &str, value: &Value) -> Failure {
    Failure::Transport(format!("unexpected reply to {what}: {value:?}"))
}

/// A bulk string reply as text; nil as `None`.
fn string_reply(what: &str, value: Value) -> Result<Option<String>, Failure> {
    match value {
        Value::Nil => Ok(None),
        Value::BulkString(bytes) => Ok(Some(String::from_utf8_lossy(&bytes).into_owned())),
        Value::SimpleString(text) => Ok(Some(text)),
        other => Err(unexpected(what, &other)),
    }
}

/// `GET k`. Returns how it ended and whether the connection is kept.
fn read(conn: &mut redis::Connection, deadline: Instant, key: &str) -> (Done, bool) {
    match call(conn, deadline, redis::cmd("GET").arg(key)).and_then(|v| string_reply("GET", v)) {
        Ok(value) => (Done::ok(Some(value)), true),
        Err(failure) => {
            let keep = matches!(failure, Failure::Reply(_));
            (
                Done::failed(read_failure_outcome(&failure), failure.to_string()),
                keep,
            )
        }
    }
}

/// `SET k v`.
fn write(conn: &mut redis::Connection, deadline: Instant, key: &str, value: &str) -> (Done, bool) {
    let answer =
        call(conn, deadline, redis::cmd("SET").arg(key).arg(value)).and_then(|reply| match reply {
            Value::Okay => Ok(()),
            Value::SimpleString(text) if text == "OK" => Ok(()),
            other => Err(unexpected("SET", &other)),
        });
    match answer {
        Ok(()) => (Done::ok(Some(Some(value.to_string()))), true),
        Err(failure) => {
            let keep = matches!(failure, Failure::Reply(_));
            (
                Done::failed(write_failure_outcome(&failure), failure.to_string()),
                keep,
            )
        }
    }
}

/// Expects `+OK` (WATCH, MULTI) or `+QUEUED` (a command inside MULTI).
fn status_reply(what: &str, value: Value, expected: &str) -> Result<(), Failure> {
    match value {
        Value::Okay if expected == "OK" => Ok(()),
        Value::SimpleString(text) if text == expected => Ok(()),
        other => Err(unexpected(what, &other)),
    }
}

/// A cas up to its EXEC: `WATCH k`, `GET k`, and if the value is
/// `expected`, `MULTI` and `SET k v` (queued). `Ok(None)`: queued, EXEC
/// next; `Ok(Some(current))`: the key holds another value (still watched).
fn watch_and_queue(
    conn: &mut redis::Connection,
    deadline: Instant,
    key: &str,
    expected: &str,
    value: &str,
) -> Result<Option<Option<String>>, Failure> {
    call(conn, deadline, redis::cmd("WATCH").arg(key))
        .and_then(|v| status_reply("WATCH", v, "OK"))?;
    let current =
        call(conn, deadline, redis::cmd("GET").arg(key)).and_then(|v| string_reply("GET", v))?;
    if current.as_deref() != Some(expected) {
        return Ok(Some(current));
    }
    call(conn, deadline, &redis::cmd("MULTI")).and_then(|v| status_reply("MULTI", v, "OK"))?;
    call(conn, deadline, redis::cmd("SET").arg(key).arg(value))
        .and_then(|v| status_reply("SET (queued)", v, "QUEUED"))?;
    Ok(None)
}

/// `WATCH k`, `GET k`, then `MULTI`, `SET k v`, `EXEC` if the value is
/// `expected`, else `UNWATCH`.
fn cas(
    conn: &mut redis::Connection,
    deadline: Instant,
    key: &str,
    expected: &str,
    value: &str,
) -> (Done, bool) {
    // Before EXEC: a failure leaves nothing applied (a queued SET applies
    // only at EXEC, and dropping the connection discards the queue and the
    // watch).
    match watch_and_queue(conn, deadline, key, expected, value) {
        Err(failure) => {
            return (
                Done::failed(
                    Outcome::Fail,
                    format!("before EXEC (nothing that writes was sent): {failure}"),
                ),
                false,
            );
        }
        Ok(Some(current)) => {
            let unwatched = call(conn, deadline, &redis::cmd("UNWATCH"))
                .and_then(|v| status_reply("UNWATCH", v, "OK"))
                .is_ok();
            let error = format!("value-mismatch: found {current:?}");
            return (
                Done {
                    outcome: Outcome::Fail,
                    seen: Some(current),
                    error: Some(error),
                },
                unwatched,
            );
        }
        Ok(None) => {}
    }
    match call(conn, deadline, &redis::cmd("EXEC")) {
        // Applied: the watched key was unchanged since WATCH, when it held
        // `expected` (the GET after WATCH saw it).
        Ok(Value::Array(replies))
            if replies
                .iter()
                .all(|r| matches!(r, Value::Okay) || *r == Value::SimpleString("OK".into())) =>
        {
            (Done::ok(Some(Some(value.to_string()))), true)
        }
        // A watched key changed: the block was not applied.
        Ok(Value::Nil) => (
            Done::failed(
                Outcome::Fail,
                "exec-aborted: the watched key changed".to_string(),
            ),
            true,
        ),
        Ok(other) => (
            Done::failed(Outcome::Info, unexpected("EXEC", &other).to_string()),
            false,
        ),
        Err(failure) => {
            let keep = matches!(failure, Failure::Reply(_));
            (
                Done::failed(write_failure_outcome(&failure), format!("EXEC: {failure}")),
                keep,
            )
        }
    }
}

/// The final reads: once every fault is healed, one `GET` of each key any
/// write was invoked on, through the members' Redis ports in turn, retried
/// (at most [`FINAL_READ_ATTEMPTS_MAX`] attempts a key) until it succeeds.
/// Each read is recorded like any other (marked `final_read`). Returns the
/// keys whose read never succeeded.
pub async fn final_reads(
    redis_endpoints: &[String],
    history: &History,
) -> anyhow::Result<Vec<String>> {
    if redis_endpoints.is_empty() {
        anyhow::bail!("no Redis address to read from");
    }
    let written = super::register::written_keys(history);
    let mut process = history.new_process();
    let mut slot = 0_usize;
    let mut connection: Option<redis::Connection> = None;
    let mut unread = Vec::new();
    for key in written {
        let mut read = false;
        for attempt in 1..=FINAL_READ_ATTEMPTS_MAX {
            let addr = redis_endpoints[slot % redis_endpoints.len()].clone();
            let mut pending = history.invoke(process, Function::Read, &key);
            pending.op_mut().final_read = true;
            pending.op_mut().member = Some((slot % redis_endpoints.len()) as u64 + 1);
            let (kept, done) =
                perform_blocking(connection.take(), addr, key.clone(), Request::Read).await?;
            connection = kept;
            if done.outcome == Outcome::Ok {
                pending.op_mut().value = done.seen.flatten();
                history.complete(pending, Outcome::Ok)?;
                read = true;
                break;
            }
            pending.op_mut().error = done
                .error
                .map(|error| format!("final read attempt {attempt}: {error}"));
            history.complete(pending, Outcome::Fail)?;
            // A failed read has no effect, but a fresh process keeps the
            // history's one-operation-per-process rule obvious; the next
            // attempt goes to the next member.
            process = history.new_process();
            connection = None;
            slot += 1;
            tokio::time::sleep(FINAL_READ_PAUSE).await;
        }
        if !read {
            unread.push(key);
        }
    }
    Ok(unread)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_readonly_and_nothing_was_written_are_definite_failures() {
        let reply = |text: &str| write_failure_outcome(&Failure::Reply(text.to_string()));
        // kvnode's refusals that promise nothing was written.
        assert_eq!(
            reply(
                "READONLY You can't write against a read only replica. (raftcask: member 2 is \
                 not the leader; the leader is member 1, client address 127.0.0.11:7001; send \
                 writes to its Redis port)"
            ),
            Outcome::Fail
        );
        assert_eq!(
            reply(
                "CLUSTERDOWN raftcask: member 3 knows no leader (an election may be under \
                 way); nothing was written, retry"
            ),
            Outcome::Fail
        );
        // Everything else may have applied.
        for text in [
            "ERR raftcask: the write's outcome is unknown (it may or may not have applied): \
             timed out",
            "CLUSTERDOWN raftcask: leadership lost; nothing is known to have been written",
            "ERR raftcask: something else",
            "EXECABORT Transaction discarded because of previous errors.",
            "OOM command not allowed: raftcask: the disk is nearly full",
            // READONLY only counts at the start (Redis's error code).
            "ERR READONLY in the middle",
            "",
        ] {
            assert_eq!(reply(text), Outcome::Info, "{text:?}");
        }
        // A transport error or a timeout: unknown, whatever it says.
        for text in ["timed out", "nothing was written", "READONLY"] {
            assert_eq!(
                write_failure_outcome(&Failure::Transport(text.to_string())),
                Outcome::Info,
                "{text:?}"
            );
        }
        // A read that failed had no effect, whatever the failure.
        for failure in [
            Failure::Transport("timed out".into()),
            Failure::Reply("ERR raftcask: the write's outcome is unknown".into()),
            Failure::Reply("CLUSTERDOWN raftcask: no read index".into()),
        ] {
            assert_eq!(read_failure_outcome(&failure), Outcome::Fail);
        }
    }

    #[test]
    fn an_error_reply_keeps_its_code_and_text() {
        assert_eq!(
            reply_text("READONLY", "You can't write"),
            "READONLY You can't write"
        );
        assert_eq!(reply_text("EXECABORT", ""), "EXECABORT");
        assert_eq!(
            Failure::Reply("ERR x".into()).to_string(),
            "-ERR x",
            "shown as the wire shows it"
        );
    }

    #[test]
    fn replies_of_the_wrong_shape_are_transport_failures() {
        assert_eq!(
            string_reply("GET", Value::BulkString(b"p1-2".to_vec())),
            Ok(Some("p1-2".to_string()))
        );
        assert_eq!(string_reply("GET", Value::Nil), Ok(None));
        assert!(matches!(
            string_reply("GET", Value::Int(3)),
            Err(Failure::Transport(_))
        ));
        assert_eq!(status_reply("WATCH", Value::Okay, "OK"), Ok(()));
        assert_eq!(
            status_reply("SET", Value::SimpleString("QUEUED".into()), "QUEUED"),
            Ok(())
        );
        assert!(status_reply("SET", Value::Okay, "QUEUED").is_err());
    }
}
