//! The register workload through the etcd v3 API (the workload Jepsen's
//! etcd test runs): the `register` workload's keys
//! ([`super::register::Keys`], each retired after
//! [`super::register::KEY_OPS_MAX`] operations), unique values
//! (`p<process>-<n>`) and mix of reads, writes and compare-and-sets, but
//! every client process speaks etcd's gRPC API to one member's etcd port
//! (`kvnode run --etcd-addr`, [`crate::control::cluster::ETCD_PORT`])
//! through the tonic clients generated into `kvproto::etcd`:
//!
//! - read: `KV.Range` of the key (linearizable: `serializable` unset);
//! - write: `KV.Put`;
//! - cas: `KV.Txn` with one compare, `value(k) == expected`, a `Put` of
//!   the new value on success and a `Range` of the key on failure (so the
//!   worker learns the current value, as a read would; it is not recorded
//!   as a read).
//!
//! A cas compares with the last value its worker saw of the key (read,
//! found by a failed cas, or written by itself); a worker that has seen no
//! value of the key writes instead (etcd's value compare on an absent key
//! is always false). Every value is written once, so the history is
//! checked by value, with the same linearizability checker (the
//! `cas-register` model) as `redis-register`, and, since every answer
//! carries etcd's response header, with the revision checks: a read
//! records the header's `revision` and the key's `mod_revision`, an ok
//! put or cas the header's `revision` (the revision it applied at).
//! After the heal, [`final_reads`] reads every written key once more
//! through the etcd ports, so an acknowledged write the cluster lost shows
//! as a non-linearizable key.
//!
//! Worker `w` is pinned to member slot `w % members` (every member accepts
//! every request; a follower forwards writes to the leader and serves
//! linearizable reads through the read index). Each worker owns one gRPC
//! channel, opened on its first operation and opened anew after a
//! transport error or a timeout.
//!
//! Outcomes:
//! - a read that fails, however, is `fail` (a read has no effect);
//! - a channel that could not be opened is `fail` (nothing was sent);
//! - a put or cas answered with an error that says it was refused before
//!   anything was proposed ([`status_outcome`]: an invalid request, a
//!   precondition, a limit, or raftcask's detail "nothing was written") is
//!   `fail`; a timeout, a transport error or any other error after sending
//!   (`etcdserver: request timed out`, `etcdserver: no leader`, ...) is
//!   `info`;
//! - a cas whose compare did not hold is `fail` (`value-mismatch`).
//!
//! Every request has a timeout ([`REQUEST_TIMEOUT`]); every loop ends by
//! the run's deadline or a fixed count.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use kvclient::kvproto::etcd::etcdserverpb::compare::{CompareResult, CompareTarget, TargetUnion};
use kvclient::kvproto::etcd::etcdserverpb::kv_client::KvClient;
use kvclient::kvproto::etcd::etcdserverpb::request_op::Request as EtcdRequest;
use kvclient::kvproto::etcd::etcdserverpb::response_op::Response as EtcdResponse;
use kvclient::kvproto::etcd::etcdserverpb::{
    Compare, PutRequest, RangeRequest, RangeResponse, RequestOp, ResponseHeader, TxnRequest,
};
use rand::SeedableRng as _;
use rand::rngs::SmallRng;
use tonic::codegen::Bytes;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Status};

pub use super::register::ValueRequest as Request;
use super::register::{FINAL_READ_ATTEMPTS_MAX, FINAL_READ_PAUSE, Keys, written_keys};
use super::{CONNECT_TIMEOUT, Function, History, Op, Outcome, REQUEST_TIMEOUT, WorkloadConfig};

/// The gRPC metadata key in which kvnode's etcd port carries its own
/// explanation of an error (etcd's message is fixed word for word).
pub const DETAIL_KEY: &str = "raftcask-detail";

/// How one operation ended, and what to record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Done {
    /// ok / fail / info.
    pub outcome: Outcome,
    /// The key's value this operation learnt (`Some(None)`: absent): an ok
    /// read's, a failed cas's, an ok write's own.
    pub seen: Option<Option<String>>,
    /// An ok read: the response header's revision; an ok write or cas:
    /// the revision it applied at (the header's).
    pub revision: Option<u64>,
    /// An ok read of a present key: its `mod_revision`.
    pub mod_revision: Option<u64>,
    /// Why it failed, or its outcome is unknown.
    pub error: Option<String>,
}

impl Done {
    fn failed(outcome: Outcome, error: String) -> Self {
        Self {
            outcome,
            seen: None,
            revision: None,
            mod_revision: None,
            error: Some(error),
        }
    }

    /// Fills an operation's record from this (the value read, revisions,
    /// error); the outcome is the caller's to complete with.
    pub fn record(&self, op: &mut Op) {
        if op.f == Function::Read
            && self.outcome == Outcome::Ok
            && let Some(value) = &self.seen
        {
            op.value = value.clone();
        }
        if self.outcome == Outcome::Ok
            && let Some(revision) = self.revision
        {
            if op.f == Function::Read {
                op.record_read_revisions(revision, self.mod_revision);
            } else {
                op.record_write_revision(revision);
            }
        }
        op.error = self.error.clone();
    }
}

/// The outcome of a put or cas answered with `status`: `fail` only when
/// the status says nothing was proposed — an invalid request, a failed
/// precondition (`etcdserver: not leader` included), a limit, or
/// kvnode's detail saying "nothing was written" — else `info` (a timeout,
/// `etcdserver: request timed out`, a transport error, a member that
/// stopped, `etcdserver: no leader` without that detail).
pub fn status_outcome(status: &Status) -> Outcome {
    let refused = matches!(
        status.code(),
        Code::InvalidArgument
            | Code::FailedPrecondition
            | Code::OutOfRange
            | Code::NotFound
            | Code::AlreadyExists
            | Code::PermissionDenied
            | Code::Unauthenticated
            | Code::Unimplemented
            | Code::ResourceExhausted
    );
    let detail_says_not_written = status
        .metadata()
        .get(DETAIL_KEY)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|detail| detail.contains("nothing was written"));
    if refused || detail_says_not_written {
        Outcome::Fail
    } else {
        Outcome::Info
    }
}

/// A status and kvnode's detail, as one line.
fn describe(status: &Status) -> String {
    let detail = status
        .metadata()
        .get(DETAIL_KEY)
        .and_then(|v| v.to_str().ok())
        .map(|d| format!(" ({d})"))
        .unwrap_or_default();
    format!("{:?}: {}{detail}", status.code(), status.message())
}

/// Whether the channel is to be dropped after `status`: the transport
/// broke, or the request timed out (a paused or cut-off member).
fn breaks_channel(status: &Status) -> bool {
    matches!(
        status.code(),
        Code::Unavailable
            | Code::DeadlineExceeded
            | Code::Cancelled
            | Code::Unknown
            | Code::Internal
    ) && !status.message().starts_with("etcdserver:")
}

/// A revision from the wire (never negative from a correct server; a
/// negative one reads as 0, which the revision checks flag).
fn revision_u64(revision: i64) -> u64 {
    u64::try_from(revision).unwrap_or(0)
}

fn header_revision(header: Option<&ResponseHeader>) -> Option<u64> {
    header.map(|h| revision_u64(h.revision))
}

/// The key's value and `mod_revision` in a range answer (`None`: absent).
fn found(range: &RangeResponse) -> Option<(String, u64)> {
    range.kvs.first().map(|kv| {
        (
            String::from_utf8_lossy(&kv.value).into_owned(),
            revision_u64(kv.mod_revision),
        )
    })
}

/// Runs the workload until the deadline; every operation goes into
/// `history`.
pub async fn run(config: WorkloadConfig, history: Arc<History>) -> anyhow::Result<()> {
    if config.etcd_endpoints.is_empty() {
        anyhow::bail!("the etcd-register workload needs the members' etcd addresses");
    }
    super::register::run_workers(config, history, worker_loop).await
}

async fn worker_loop(
    worker: u64,
    config: WorkloadConfig,
    history: Arc<History>,
    keys: Arc<Mutex<Keys>>,
) -> anyhow::Result<()> {
    let slot = worker as usize % config.etcd_endpoints.len();
    let member = slot as u64 + 1;
    let addr = config.etcd_endpoints[slot].clone();
    let mut rng = SmallRng::seed_from_u64(config.seed ^ (worker.wrapping_mul(0x9e37_79b9)));
    let mut process = history.new_process();
    let mut written = 0_u64;
    // The value this worker last saw per key (a cas's expected value).
    let mut seen: HashMap<u64, Option<String>> = HashMap::new();
    let mut client: Option<KvClient<Channel>> = None;
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
        let done = perform(&mut client, &addr, &key, &request).await;
        if let Some(value) = &done.seen {
            seen.insert(k, value.clone());
        }
        done.record(pending.op_mut());
        let outcome = history.complete(pending, done.outcome)?.outcome;
        drop(write_guard);
        if outcome == Outcome::Info {
            process = history.new_process();
        }
        tokio::time::sleep(pause).await;
    }
    Ok(())
}

/// Opens a channel to `addr` within [`CONNECT_TIMEOUT`].
async fn connect(addr: &str) -> Result<KvClient<Channel>, String> {
    let endpoint = Endpoint::from_shared(format!("http://{addr}"))
        .map_err(|err| format!("{addr}: {err}"))?
        .connect_timeout(CONNECT_TIMEOUT)
        .timeout(REQUEST_TIMEOUT);
    match tokio::time::timeout(CONNECT_TIMEOUT, endpoint.connect()).await {
        Ok(Ok(channel)) => Ok(KvClient::new(channel)),
        Ok(Err(err)) => Err(format!("{addr}: {err}")),
        Err(_) => Err(format!(
            "{addr}: no connection within {} ms",
            CONNECT_TIMEOUT.as_millis()
        )),
    }
}

/// One operation: opens the channel if there is none, sends the request
/// (within [`REQUEST_TIMEOUT`]) and drops the channel when the transport
/// is in doubt.
pub async fn perform(
    client: &mut Option<KvClient<Channel>>,
    addr: &str,
    key: &str,
    request: &Request,
) -> Done {
    if client.is_none() {
        match connect(addr).await {
            Ok(opened) => *client = Some(opened),
            // Nothing was sent: no write can have applied.
            Err(err) => return Done::failed(Outcome::Fail, format!("connect: {err}")),
        }
    }
    let Some(kv) = client.as_mut() else {
        return Done::failed(Outcome::Fail, "no channel".to_string());
    };
    let answer = tokio::time::timeout(REQUEST_TIMEOUT, send(kv, key, request)).await;
    match answer {
        Ok(Ok(done)) => done,
        Ok(Err(status)) => {
            if breaks_channel(&status) {
                *client = None;
            }
            let outcome = match request {
                Request::Read => Outcome::Fail,
                Request::Write { .. } | Request::Cas { .. } => status_outcome(&status),
            };
            Done::failed(outcome, describe(&status))
        }
        Err(_) => {
            *client = None;
            let outcome = match request {
                Request::Read => Outcome::Fail,
                Request::Write { .. } | Request::Cas { .. } => Outcome::Info,
            };
            Done::failed(
                outcome,
                format!("timed out after {} ms", REQUEST_TIMEOUT.as_millis()),
            )
        }
    }
}

/// Sends one request and reads its answer.
async fn send(kv: &mut KvClient<Channel>, key: &str, request: &Request) -> Result<Done, Status> {
    let range = || RangeRequest {
        key: Bytes::copy_from_slice(key.as_bytes()),
        ..RangeRequest::default()
    };
    match request {
        Request::Read => {
            let answer = kv.range(range()).await?.into_inner();
            let current = found(&answer);
            Ok(Done {
                outcome: Outcome::Ok,
                revision: header_revision(answer.header.as_ref()),
                mod_revision: current.as_ref().map(|(_, m)| *m),
                seen: Some(current.map(|(value, _)| value)),
                error: None,
            })
        }
        Request::Write { value } => {
            let answer = kv
                .put(PutRequest {
                    key: Bytes::copy_from_slice(key.as_bytes()),
                    value: Bytes::copy_from_slice(value.as_bytes()),
                    ..PutRequest::default()
                })
                .await?
                .into_inner();
            Ok(Done {
                outcome: Outcome::Ok,
                seen: Some(Some(value.clone())),
                revision: header_revision(answer.header.as_ref()),
                mod_revision: None,
                error: None,
            })
        }
        Request::Cas { expected, value } => {
            let txn = TxnRequest {
                compare: vec![Compare {
                    result: CompareResult::Equal as i32,
                    target: CompareTarget::Value as i32,
                    key: Bytes::copy_from_slice(key.as_bytes()),
                    target_union: Some(TargetUnion::Value(Bytes::copy_from_slice(
                        expected.as_bytes(),
                    ))),
                    range_end: Bytes::new(),
                }],
                success: vec![RequestOp {
                    request: Some(EtcdRequest::RequestPut(PutRequest {
                        key: Bytes::copy_from_slice(key.as_bytes()),
                        value: Bytes::copy_from_slice(value.as_bytes()),
                        ..PutRequest::default()
                    })),
                }],
                failure: vec![RequestOp {
                    request: Some(EtcdRequest::RequestRange(range())),
                }],
            };
            let answer = kv.txn(txn).await?.into_inner();
            if answer.succeeded {
                return Ok(Done {
                    outcome: Outcome::Ok,
                    seen: Some(Some(value.clone())),
                    revision: header_revision(answer.header.as_ref()),
                    mod_revision: None,
                    error: None,
                });
            }
            let current = answer.responses.first().and_then(|r| match &r.response {
                Some(EtcdResponse::ResponseRange(range)) => Some(found(range)),
                _ => None,
            });
            let error = match &current {
                Some(Some((found, _))) => format!("value-mismatch: found {found:?}"),
                Some(None) => "value-mismatch: the key is absent".to_string(),
                None => "value-mismatch (no range answer)".to_string(),
            };
            Ok(Done {
                outcome: Outcome::Fail,
                seen: current.map(|c| c.map(|(value, _)| value)),
                revision: None,
                mod_revision: None,
                error: Some(error),
            })
        }
    }
}

/// The final reads: once every fault is healed, one linearizable `Range`
/// of each key any write was invoked on, through the members' etcd ports
/// in turn, retried (at most [`FINAL_READ_ATTEMPTS_MAX`] attempts a key)
/// until it succeeds. Each read is recorded like any other (marked
/// `final_read`). Returns the keys whose read never succeeded.
pub async fn final_reads(
    etcd_endpoints: &[String],
    history: &History,
) -> anyhow::Result<Vec<String>> {
    if etcd_endpoints.is_empty() {
        anyhow::bail!("no etcd address to read from");
    }
    let mut process = history.new_process();
    let mut slot = 0_usize;
    let mut client: Option<KvClient<Channel>> = None;
    let mut unread = Vec::new();
    for key in written_keys(history) {
        let mut read = false;
        for attempt in 1..=FINAL_READ_ATTEMPTS_MAX {
            let index = slot % etcd_endpoints.len();
            let mut pending = history.invoke(process, Function::Read, &key);
            pending.op_mut().final_read = true;
            pending.op_mut().member = Some(index as u64 + 1);
            let mut done = perform(&mut client, &etcd_endpoints[index], &key, &Request::Read).await;
            if done.outcome == Outcome::Ok {
                done.record(pending.op_mut());
                history.complete(pending, Outcome::Ok)?;
                read = true;
                break;
            }
            done.error = done
                .error
                .map(|error| format!("final read attempt {attempt}: {error}"));
            done.record(pending.op_mut());
            history.complete(pending, Outcome::Fail)?;
            // A failed read has no effect, but a fresh process keeps the
            // history's one-operation-per-process rule obvious; the next
            // attempt goes to the next member.
            process = history.new_process();
            client = None;
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
    use tonic::metadata::MetadataValue;

    /// An operation of function `f`, invoked and not yet filled in.
    fn new_op(f: Function) -> Op {
        serde_json::from_value(serde_json::json!({
            "id": 1, "process": 0, "f": f, "key": "r/000000", "outcome": "ok",
            "invoke_wall_us": 0, "invoke_ns": 0, "complete_wall_us": 0, "complete_ns": 0,
        }))
        .expect("a minimal operation")
    }

    #[test]
    fn only_refusals_before_proposing_are_definite_failures() {
        for status in [
            Status::invalid_argument("etcdserver: request is too large"),
            Status::failed_precondition("etcdserver: not leader"),
            Status::resource_exhausted("etcdserver: too many requests"),
        ] {
            assert_eq!(status_outcome(&status), Outcome::Fail, "{status:?}");
        }
        let mut no_leader = Status::unavailable("etcdserver: no leader");
        assert_eq!(
            status_outcome(&no_leader),
            Outcome::Info,
            "no leader, without kvnode's word that nothing was written"
        );
        no_leader.metadata_mut().insert(
            DETAIL_KEY,
            MetadataValue::from_static("no leader in time (last: x); nothing was written"),
        );
        assert_eq!(status_outcome(&no_leader), Outcome::Fail);
        for status in [
            Status::unavailable("etcdserver: request timed out"),
            Status::unavailable("transport error"),
            Status::deadline_exceeded("timeout expired"),
            Status::unknown("h2 protocol error"),
            Status::unavailable("etcdserver: server stopped"),
        ] {
            assert_eq!(status_outcome(&status), Outcome::Info, "{status:?}");
        }
    }

    #[test]
    fn a_transport_failure_drops_the_channel_and_an_etcd_error_keeps_it() {
        assert!(breaks_channel(&Status::unavailable("transport error")));
        assert!(breaks_channel(&Status::deadline_exceeded("timeout")));
        assert!(!breaks_channel(&Status::unavailable(
            "etcdserver: request timed out"
        )));
        assert!(!breaks_channel(&Status::invalid_argument("bad")));
    }

    #[test]
    fn an_ok_answer_records_the_header_and_mod_revisions() {
        let mut op = new_op(Function::Read);
        Done {
            outcome: Outcome::Ok,
            seen: Some(Some("p1-1".to_string())),
            revision: Some(9),
            mod_revision: Some(7),
            error: None,
        }
        .record(&mut op);
        assert_eq!(
            (op.value.as_deref(), op.revision, op.mod_revision),
            (Some("p1-1"), Some(9), Some(7))
        );
        let mut absent = new_op(Function::Read);
        Done {
            outcome: Outcome::Ok,
            seen: Some(None),
            revision: Some(9),
            mod_revision: None,
            error: None,
        }
        .record(&mut absent);
        assert_eq!(
            (absent.value, absent.revision, absent.mod_revision),
            (None, Some(9), None)
        );
        let mut write = new_op(Function::Cas);
        Done {
            outcome: Outcome::Ok,
            seen: Some(Some("p1-2".to_string())),
            revision: Some(10),
            mod_revision: None,
            error: None,
        }
        .record(&mut write);
        assert_eq!((write.revision, write.mod_revision), (Some(10), None));
        // A failure records no revision.
        let mut failed = new_op(Function::Write);
        Done::failed(Outcome::Info, "timed out".to_string()).record(&mut failed);
        assert_eq!(
            (failed.revision, failed.error.as_deref()),
            (None, Some("timed out"))
        );
    }
}
