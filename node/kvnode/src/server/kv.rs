//! The client `Kv` gRPC service: Put, Delete, Expire, Persist, Get, Scan,
//! Batch, and etcd's Range, DeleteRange and Txn (their wire conversions in
//! `txn.rs`), and Watch (served by `watch.rs`).
//!
//! Writes go through the proposal batcher on the leader; a follower fails
//! them fast with FAILED_PRECONDITION + `NotLeader`. Linearizable reads get
//! a read index from a shared round ([`ReadRounds`]: on the leader a quorum
//! round, on a follower the leader's answer), wait until applied that far,
//! and read locally; when no round succeeds they answer UNAVAILABLE, never a
//! possibly stale value. Stale reads answer locally, honouring `min_index`.

use std::ops::Bound;
use std::time::Duration;

use bitcask::{KeyRange, Scan};
use kvproto::kv::v1::kv_server::{Kv, KvServer};
use kvproto::kv::v1::{
    BatchApplied, BatchRequest, BatchResponse, ConditionFailed, Consistency, DeleteRequest,
    DeleteResponse, Deleted, ExpireRequest, ExpireResponse, GetRequest, GetResponse, Header,
    KeyNotFound, KeyValue, OpResult, PersistRequest, PersistResponse, PutRequest, PutResponse,
    ScanRequest, ScanResponse, SessionExpired, batch_op, batch_response, delete_response,
    error_detail, put_request, put_response, scan_request,
};
use kvproto::kv::v1::{
    CompactRequest, CompactResponse, DeleteRangeRequest, DeleteRangeResponse, RangeRequest,
    RangeResponse, TxnDeleteRange, TxnOp as PbTxnOp, TxnRequest, TxnResponse, txn_op,
    txn_op_result,
};
use tonic::{Code, Request, Response, Status};

use crate::hooks::Faults;
use crate::node::identity::Identity;
use crate::raft::batcher::{Batcher, ProposeError};
use crate::raft::read_index::{ReadIndexError, ReadRounds};
use crate::raft::types::NodeRaft;
use crate::raft::watch::MetricsWatch;
use crate::server::cluster;
use crate::server::convert::{self, check_key, check_value};
use crate::server::metrics::{Metrics, RequestOp, RequestTimer};
use crate::server::txn;
use crate::state_machine::StateMachine;
use kvstate::command::{
    self, Answer, Command, Condition, LeaseRequest, Op, Outcome, RESERVED_KEY_PREFIX, SessionRef,
    Write,
};
use kvstate::revision::KeyMeta;

/// Largest client request or response message, in bytes: above the largest
/// legal value plus its key and framing.
pub const CLIENT_MESSAGE_BYTES_MAX: usize = 8 * 1024 * 1024;
/// How long a write may wait for its outcome before answering "unknown".
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a stale read waits for `min_index` at most.
pub const MIN_INDEX_WAIT: Duration = Duration::from_secs(5);
/// Entries of a scan page by default.
pub const SCAN_LIMIT_DEFAULT: usize = 100;
/// Entries of a scan page at most.
pub const SCAN_LIMIT_MAX: usize = 1000;
/// Engine scans one page may take at most (reserved keys are skipped).
pub const SCAN_ROUNDS_MAX: usize = 16;
/// Bytes of a scan page at most (keys and values).
pub const SCAN_PAGE_BYTES_MAX: usize = 4 * 1024 * 1024;

/// The client service of one member.
#[derive(Clone)]
pub struct KvService {
    id: u64,
    raft: NodeRaft,
    state_machine: StateMachine,
    batcher: Batcher,
    reads: ReadRounds,
    identity: Identity,
    faults: Faults,
    metrics: Option<Metrics>,
    watermark: Option<crate::node::disk::Watermark>,
    /// Proposes a compaction (`Kv.Compact`); `None`: refused.
    compactor: Option<crate::raft::propose::ProposeCommand>,
    /// Turns true when the member stops: watch streams end then (they
    /// hold the state machine, which a stopping member waits to release).
    shutdown: Option<tokio::sync::watch::Receiver<bool>>,
    /// The member's lease renewal coalescer, started by the first
    /// keep-alive stream.
    renewals: std::sync::Arc<std::sync::OnceLock<crate::server::lease::Renewals>>,
    /// The member's watch hub, started by the first watch.
    watch_hub:
        std::sync::Arc<std::sync::OnceLock<std::sync::Arc<crate::server::watch_hub::WatchHub>>>,
    /// Sends front ends' writes to the leader when this member does not
    /// lead; `None`: they are refused NotLeader like the `Kv` port's.
    forwarder: Option<crate::server::forward::Forwarder>,
}

impl std::fmt::Debug for KvService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KvService")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

/// Whether a write must go through even while the disk is low on space:
/// lease renewals and revokes (refusing them would keep or expire leases
/// against their owners' will), as [`KvService::write_essential`] does for
/// the native port's; the front ends' and forwarded writes ask here.
fn essential(request: &Write) -> bool {
    matches!(
        request,
        Write::Lease(kvstate::command::LeaseRequest {
            op: kvstate::lease::LeaseOp::Renew { .. } | kvstate::lease::LeaseOp::Revoke { .. },
            ..
        })
    )
}

impl KvService {
    /// The service for member `id`.
    pub fn new(
        raft: NodeRaft,
        state_machine: StateMachine,
        batcher: Batcher,
        reads: ReadRounds,
        identity: Identity,
        faults: Faults,
    ) -> KvService {
        KvService {
            id: identity.member_id(),
            raft,
            state_machine,
            batcher,
            reads,
            identity,
            faults,
            metrics: None,
            watermark: None,
            compactor: None,
            shutdown: None,
            renewals: Default::default(),
            watch_hub: Default::default(),
            forwarder: None,
        }
    }

    /// Forwards front ends' writes to the leader through `forwarder`
    /// ([`crate::server::forward`]).
    pub fn with_forwarder(mut self, forwarder: crate::server::forward::Forwarder) -> KvService {
        self.forwarder = Some(forwarder);
        self
    }

    /// Ends every watch stream when `shutdown` turns true.
    pub fn with_shutdown(mut self, shutdown: tokio::sync::watch::Receiver<bool>) -> KvService {
        self.shutdown = Some(shutdown);
        self
    }

    /// Times every request into `metrics` (`raftcask_request_seconds`).
    pub fn with_metrics(mut self, metrics: Metrics) -> KvService {
        self.metrics = Some(metrics);
        self
    }

    /// Serves `Kv.Compact` by proposing through `propose`.
    pub fn with_compactor(mut self, propose: crate::raft::propose::ProposeCommand) -> KvService {
        self.compactor = Some(propose);
        self
    }

    /// Refuses writes while the data directory's free space is below
    /// `watermark` ([`crate::node::disk`]).
    pub fn with_watermark(mut self, watermark: crate::node::disk::Watermark) -> KvService {
        self.watermark = Some(watermark);
        self
    }

    /// Times one request until the guard drops (nothing without metrics).
    fn request_timer(&self, op: RequestOp) -> Option<RequestTimer> {
        self.metrics
            .as_ref()
            .map(|metrics| metrics.request_timer(op))
    }

    /// The tonic server with raised message limits.
    pub fn into_server(self) -> KvServer<KvService> {
        KvServer::new(self)
            .max_decoding_message_size(CLIENT_MESSAGE_BYTES_MAX)
            .max_encoding_message_size(CLIENT_MESSAGE_BYTES_MAX)
    }

    pub(crate) fn applied_index(&self) -> u64 {
        self.state_machine.applied_index()
    }

    /// Every answer's header. Takes neither the apply lock nor a copy of
    /// openraft's metrics: the metrics are borrowed for two fields.
    fn header(&self) -> Header {
        cluster::header(
            &self.identity,
            &self.state_machine,
            &self.raft.metrics().borrow(),
        )
    }

    /// Serves one watch stream of `requests` (`Kv.Watch`'s, or a front
    /// end's translated ones) with the member's watch machinery.
    pub(crate) fn watch_stream<S>(&self, requests: S) -> crate::server::watch::WatchStream
    where
        S: tokio_stream::Stream<Item = Result<kvproto::kv::v1::WatchRequest, Status>>
            + Send
            + Unpin
            + 'static,
    {
        let context = crate::server::watch::WatchContext {
            raft: self.raft.clone(),
            state_machine: self.state_machine.clone(),
            reads: self.reads.clone(),
            identity: self.identity.clone(),
            metrics: self.metrics.clone(),
            shutdown: self.shutdown.clone(),
            hub: self
                .watch_hub
                .get_or_init(|| {
                    crate::server::watch_hub::WatchHub::start(
                        self.state_machine.clone(),
                        self.shutdown.clone(),
                    )
                })
                .clone(),
        };
        context.serve(requests)
    }

    /// The lease renewal coalescer, started on first use.
    pub(crate) fn renewals(&self) -> crate::server::lease::Renewals {
        self.renewals
            .get_or_init(|| crate::server::lease::Renewals::start(self.clone()))
            .clone()
    }

    /// Resolves when the member stops (never without a shutdown signal).
    pub(crate) fn stopped(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let shutdown = self.shutdown.clone();
        async move {
            match shutdown {
                Some(mut shutdown) => {
                    let _ = shutdown.wait_for(|stop| *stop).await;
                }
                None => std::future::pending().await,
            }
        }
    }

    /// The metrics, if the member has them.
    pub(crate) fn metrics(&self) -> Option<&Metrics> {
        self.metrics.as_ref()
    }

    /// The member's state machine.
    pub(crate) fn state_machine(&self) -> &StateMachine {
        &self.state_machine
    }

    /// The header of a read's answer: the store revision read after the
    /// state it describes.
    pub(crate) fn read_header(&self) -> Header {
        Header {
            revision: self.state_machine.revision(),
            ..self.header()
        }
    }

    /// A lease write (grant), refused while the disk is low on space.
    pub(crate) async fn write_lease(&self, request: LeaseRequest) -> Result<Answer, Status> {
        self.write(request).await
    }

    /// A write that must go through even while the disk is low on space
    /// (lease renewals and revokes: refusing them would keep or expire
    /// leases against their owners' will).
    pub(crate) async fn write_essential(
        &self,
        request: impl Into<Write>,
    ) -> Result<Answer, Status> {
        self.write_checked(request.into(), false).await
    }

    /// The header of a write's answer: the revision is the answer's.
    pub(crate) fn write_header(&self, revision: u64) -> Header {
        Header {
            revision,
            ..self.header()
        }
    }

    /// The known leader and its client address (a leader that is no longer
    /// a voter of this member's membership is not named: a removed leader
    /// must not send clients back to itself).
    pub(crate) fn leader(&self) -> (Option<u64>, Option<String>) {
        let receiver = self.raft.metrics();
        let metrics = receiver.borrow();
        let leader = crate::raft::membership::known_leader(&metrics);
        let addr = leader.and_then(|id| {
            metrics
                .membership_config
                .membership()
                .get_node(&id)
                .map(|node| node.client_addr.clone())
        });
        (leader, addr)
    }

    #[allow(clippy::result_large_err)]
    pub(crate) fn require_leader(&self) -> Result<(), Status> {
        if self.leads() {
            return Ok(());
        }
        let (leader, addr) = self.leader();
        if leader == Some(self.id) {
            Ok(())
        } else {
            Err(convert::not_leader(leader, addr))
        }
    }

    /// Whether the leader this member knows is itself (what [`Self::leader`]
    /// names, without copying an address: every write asks).
    pub(crate) fn leads(&self) -> bool {
        crate::raft::membership::known_leader(&self.raft.metrics().borrow()) == Some(self.id)
    }

    async fn write(&self, request: impl Into<Write>) -> Result<Answer, Status> {
        self.write_checked(request.into(), true).await
    }

    /// A write of another front end (the Redis port): proposed here, down
    /// the same path as the service's own writes (leader check, free-space
    /// watermark, batcher, outcome mapping), when this member leads; sent
    /// to the leader otherwise ([`crate::server::forward`]). Its answer,
    /// and a log index at or after its entry.
    pub(crate) async fn write_from_front_end(
        &self,
        request: Write,
    ) -> Result<(Answer, u64), Status> {
        match &self.forwarder {
            Some(forwarder) if !self.leads() => forwarder.write(self, request).await,
            _ => {
                let check_space = !essential(&request);
                let answer = self.write_checked(request, check_space).await?;
                Ok((answer, self.applied_index()))
            }
        }
    }

    /// A write another member forwarded (peer `Forward`), or this member's
    /// own forwarder's once it leads: proposed here, never forwarded again.
    pub(crate) async fn write_forwarded(&self, request: Write) -> Result<Answer, Status> {
        let check_space = !essential(&request);
        self.write_checked(request, check_space).await
    }

    /// Proposes `request` on the leader (refused while the disk is low on
    /// space when `check_space`) and maps its outcome to a status.
    async fn write_checked(&self, request: Write, check_space: bool) -> Result<Answer, Status> {
        self.require_leader()?;
        if check_space && let Some(watermark) = &self.watermark {
            watermark.check_write()?;
        }
        let session = request.session();
        // NEGATIVE CONTROL (feature nc-ack-before-commit): a write not
        // committed in time is acknowledged anyway, with a guessed version.
        #[cfg(feature = "nc-ack-before-commit")]
        let submitted = match self.ack_before_commit(request).await {
            Ok(submitted) => submitted,
            Err(early) => return Ok(early),
        };
        #[cfg(not(feature = "nc-ack-before-commit"))]
        let submitted = tokio::time::timeout(WRITE_TIMEOUT, self.batcher.submit(request)).await;
        match submitted {
            Err(_) => Err(convert::outcome_unknown(
                "the write's outcome was not known in time; retry with the same session sequence",
            )),
            Ok(Ok(Answer {
                outcome: Outcome::SessionExpired,
                ..
            })) => {
                let session = session.unwrap_or(SessionRef {
                    client_id: 0,
                    sequence: 0,
                    lowest_unacked: 0,
                    opens: false,
                });
                Err(convert::status_with_detail(
                    Code::Aborted,
                    "the retried write's answer was forgotten: outcome unknown",
                    error_detail::Detail::SessionExpired(SessionExpired {
                        client_id: session.client_id,
                        sequence: session.sequence,
                    }),
                ))
            }
            Ok(Ok(Answer {
                outcome: Outcome::Rejected { reason },
                ..
            })) => Err(Status::invalid_argument(reason)),
            Ok(Ok(Answer {
                outcome: Outcome::LeaseNotFound { reason },
                ..
            })) => Err(Status::not_found(reason)),
            Ok(Ok(Answer {
                outcome: Outcome::LeaseExists { reason },
                ..
            })) => Err(Status::already_exists(reason)),
            Ok(Ok(_)) if self.faults.drop_write_replies() => Err(Status::unavailable(
                "the write was applied but its reply was dropped (test fault)",
            )),
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(ProposeError::NotApplied(_))) => {
                let (leader, addr) = self.leader();
                Err(convert::not_leader(
                    leader.filter(|l| *l != self.id),
                    addr.filter(|_| leader != Some(self.id)),
                ))
            }
            Ok(Err(ProposeError::Unknown(reason))) => Err(convert::outcome_unknown(format!(
                "the write's outcome is unknown: {reason}"
            ))),
            Ok(Err(ProposeError::Stopped)) => Err(Status::unavailable("the node is shutting down")),
            Ok(Err(ProposeError::TooLarge { len, max })) => Err(convert::limit_exceeded(
                "ENTRY_SIZE_BYTES_MAX",
                max as u64,
                len as u64,
            )),
            Ok(Err(ProposeError::TooManyOps { ops, max })) => Err(convert::limit_exceeded(
                "ENTRY_USER_OPS_MAX",
                max as u64,
                ops as u64,
            )),
        }
    }

    /// NEGATIVE CONTROL (feature nc-ack-before-commit): proposes the write;
    /// if it has not committed within `ACK_EARLY_AFTER`, answers "applied"
    /// at once (`Err`), with versions guessed from the log's end (the
    /// proposal goes on, and may never commit).
    #[cfg(feature = "nc-ack-before-commit")]
    async fn ack_before_commit(
        &self,
        request: Write,
    ) -> Result<Result<Result<Answer, ProposeError>, tokio::time::error::Elapsed>, Answer> {
        /// How long a write may take to commit before it is acknowledged anyway.
        const ACK_EARLY_AFTER: Duration = Duration::from_millis(100);
        let ops = request.ops();
        let submit = tokio::time::timeout(WRITE_TIMEOUT, self.batcher.submit(request));
        tokio::pin!(submit);
        match tokio::time::timeout(ACK_EARLY_AFTER, &mut submit).await {
            Ok(submitted) => Ok(submitted),
            Err(_) => {
                let last = self.raft.metrics().borrow().last_log_index.unwrap_or(0);
                let version = (last + 1) << 16;
                Err(Answer {
                    outcome: Outcome::Applied {
                        versions: vec![version; ops],
                        existed: vec![true; ops],
                    },
                    revision: self.state_machine.revision() + 1,
                })
            }
        }
    }

    /// Makes the local state fit for a read of `consistency`; returns the
    /// cluster time to judge expiry against.
    pub(crate) async fn prepare_read(
        &self,
        consistency: Consistency,
        min_index: u64,
    ) -> Result<(), Status> {
        match consistency {
            // NEGATIVE CONTROL (feature nc-local-reads): no read index, the
            // local state as it is; an isolated member serves stale reads.
            Consistency::Linearizable if cfg!(feature = "nc-local-reads") => Ok(()),
            Consistency::Linearizable => {
                let unavailable = |err: ReadIndexError| {
                    Status::unavailable(format!(
                        "member {} cannot serve a linearizable read now: {err}; retry, or read \
                         with stale consistency",
                        self.id
                    ))
                };
                let index = self.reads.read_index().await.map_err(unavailable)?;
                self.reads.wait_applied(index).await.map_err(unavailable)?;
                Ok(())
            }
            Consistency::Stale => {
                if min_index == 0 || self.applied_index() >= min_index {
                    return Ok(());
                }
                let mut metrics = self.raft.metrics();
                let reached = tokio::time::timeout(
                    MIN_INDEX_WAIT,
                    metrics.wait_for(|m| m.last_applied.map(|l| l.index).unwrap_or(0) >= min_index),
                )
                .await;
                match reached {
                    Ok(Ok(_)) if self.applied_index() >= min_index => Ok(()),
                    _ => Err(convert::index_not_reached(min_index, self.applied_index())),
                }
            }
        }
    }
}

pub(crate) fn session(session: Option<kvproto::kv::v1::Session>) -> Option<SessionRef> {
    session.filter(|s| s.client_id != 0).map(|s| SessionRef {
        client_id: s.client_id,
        sequence: s.sequence,
        lowest_unacked: s.lowest_unacked_sequence,
        opens: s.opens,
    })
}

fn engine_error(err: bitcask::Error) -> Status {
    Status::internal(format!("engine: {err}"))
}

/// A record's revisions (create, mod, version, lease) as the state machine
/// stored them.
#[allow(clippy::result_large_err)]
fn key_meta(meta: &bitcask::RecordMeta) -> Result<KeyMeta, Status> {
    KeyMeta::decode(meta).map_err(|err| Status::internal(format!("engine: {err}")))
}

pub(crate) fn consistency_of(value: i32) -> Result<Consistency, Status> {
    Consistency::try_from(value)
        .map_err(|_| Status::invalid_argument(format!("unknown consistency {value}")))
}

/// Checks an expire's TTL: it must be > 0 (Persist removes a TTL).
#[allow(clippy::result_large_err)]
fn check_expire_ttl(ttl_ms: u64) -> Result<(), Status> {
    if ttl_ms == 0 {
        return Err(Status::invalid_argument(
            "ttl_ms must be > 0 for an expire; use Persist to remove a TTL",
        ));
    }
    Ok(())
}

/// Validates one batch op and turns it into a command op.
#[allow(clippy::result_large_err)]
fn batch_op_of(index: usize, op: kvproto::kv::v1::BatchOp) -> Result<Op, Status> {
    let op = match op.op {
        None => {
            return Err(Status::invalid_argument(format!(
                "ops[{index}] has no op set"
            )));
        }
        Some(batch_op::Op::Put(put)) => {
            check_key(&put.key)?;
            check_value(&put.value)?;
            Op::Put {
                key: put.key.to_vec(),
                value: put.value.to_vec(),
                ttl_ms: put.ttl_ms,
            }
        }
        Some(batch_op::Op::Delete(delete)) => {
            check_key(&delete.key)?;
            Op::Delete {
                key: delete.key.to_vec(),
            }
        }
        Some(batch_op::Op::Expire(expire)) => {
            check_key(&expire.key)?;
            check_expire_ttl(expire.ttl_ms)?;
            Op::Expire {
                key: expire.key.to_vec(),
                ttl_ms: expire.ttl_ms,
            }
        }
        Some(batch_op::Op::Persist(persist)) => {
            check_key(&persist.key)?;
            Op::Persist {
                key: persist.key.to_vec(),
            }
        }
    };
    Ok(op)
}

/// The `(found, version)` of a single expire or persist.
#[allow(clippy::result_large_err)]
fn single_key_op_result(outcome: Outcome) -> Result<(bool, u64), Status> {
    match outcome {
        Outcome::Applied { versions, .. } if versions.len() == 1 => Ok((true, versions[0])),
        Outcome::KeyNotFound { index: 0 } => Ok((false, 0)),
        other => Err(unexpected(other)),
    }
}

pub(crate) fn unexpected(outcome: Outcome) -> Status {
    Status::new(
        Code::Internal,
        format!("unexpected outcome for the write: {outcome:?}"),
    )
}

#[tonic::async_trait]
impl Kv for KvService {
    async fn get(&self, request: Request<GetRequest>) -> Result<Response<GetResponse>, Status> {
        let request = request.into_inner();
        let _timer = self.request_timer(RequestOp::Get);
        check_key(&request.key)?;
        self.prepare_read(consistency_of(request.consistency)?, request.min_index)
            .await?;
        let now = self.state_machine.cluster_time_ms();
        // The revision is exactly the state read (no entry applies under
        // the read). An entry applying (its engine write may fsync a sealed
        // segment) moves the read off the async workers.
        let (item, revision) = match self
            .state_machine
            .try_read_exact(|engine| engine.get(&request.key, now))
        {
            Some(read) => read,
            None => {
                let state_machine = self.state_machine.clone();
                let key = request.key.clone();
                tokio::task::spawn_blocking(move || {
                    state_machine.read_exact(|engine| engine.get(&key, now))
                })
                .await
                .map_err(|err| Status::internal(format!("the read failed: {err}")))?
            }
        };
        let item = item.map_err(engine_error)?;
        // After the read, so the applied index it reports is at least the
        // state read and passing it on as `min_index` keeps reads
        // monotonic. The index is published after an entry's engine write
        // (and after the history's lock the read held is released), so a
        // value an entry just wrote may be read before its index is: the
        // header then names that entry (the value's sequence number is its
        // log index × VERSIONS_PER_INDEX + position).
        let header = Header {
            revision,
            ..self.header()
        };
        Ok(Response::new(match item {
            Some(item) => {
                let meta = key_meta(&item.meta)?;
                let written_at = item.seq / kvstate::apply::VERSIONS_PER_INDEX;
                GetResponse {
                    header: Some(Header {
                        applied_index: header.applied_index.max(written_at),
                        ..header
                    }),
                    found: true,
                    value: item.value.into(),
                    seq: item.seq,
                    ttl_ms_left: convert::ttl_left(item.expiry_ms, now),
                    create_revision: meta.create_revision,
                    mod_revision: meta.mod_revision,
                    version: meta.version,
                    lease: meta.lease,
                }
            }
            None => GetResponse {
                header: Some(header),
                ..Default::default()
            },
        }))
    }

    async fn put(&self, request: Request<PutRequest>) -> Result<Response<PutResponse>, Status> {
        let request = request.into_inner();
        let _timer = self.request_timer(RequestOp::Put);
        check_key(&request.key)?;
        check_value(&request.value)?;
        let key = request.key.to_vec();
        let conditions = match request.condition {
            None => Vec::new(),
            Some(put_request::Condition::IfModRevision(version)) => vec![Condition {
                key: key.clone(),
                version,
            }],
            Some(put_request::Condition::IfSeq(_)) => return Err(seq_condition_refused("if_seq")),
            Some(put_request::Condition::IfAbsent(_)) => vec![Condition {
                key: key.clone(),
                version: 0,
            }],
        };
        let answer = self
            .write(command::Request {
                session: session(request.session),
                conditions,
                ops: vec![Op::Put {
                    key,
                    value: request.value.to_vec(),
                    ttl_ms: request.ttl_ms,
                }],
            })
            .await?;
        let outcome = match answer.outcome {
            Outcome::Applied { versions, .. } if versions.len() == 1 => {
                put_response::Outcome::Seq(versions[0])
            }
            Outcome::ConditionFailed {
                index,
                current_version,
            } => put_response::Outcome::ConditionFailed(ConditionFailed {
                condition_index: index as u32,
                current_mod_revision: current_version,
            }),
            other => return Err(unexpected(other)),
        };
        Ok(Response::new(PutResponse {
            header: Some(self.write_header(answer.revision)),
            outcome: Some(outcome),
        }))
    }

    async fn delete(
        &self,
        request: Request<DeleteRequest>,
    ) -> Result<Response<DeleteResponse>, Status> {
        let request = request.into_inner();
        let _timer = self.request_timer(RequestOp::Delete);
        check_key(&request.key)?;
        if request.if_seq.is_some() {
            return Err(seq_condition_refused("if_seq"));
        }
        let key = request.key.to_vec();
        let conditions = request
            .if_mod_revision
            .map(|version| {
                vec![Condition {
                    key: key.clone(),
                    version,
                }]
            })
            .unwrap_or_default();
        let answer = self
            .write(command::Request {
                session: session(request.session),
                conditions,
                ops: vec![Op::Delete { key }],
            })
            .await?;
        let outcome = match answer.outcome {
            Outcome::Applied { existed, .. } if existed.len() == 1 => {
                delete_response::Outcome::Deleted(Deleted { found: existed[0] })
            }
            Outcome::ConditionFailed {
                index,
                current_version,
            } => delete_response::Outcome::ConditionFailed(ConditionFailed {
                condition_index: index as u32,
                current_mod_revision: current_version,
            }),
            other => return Err(unexpected(other)),
        };
        Ok(Response::new(DeleteResponse {
            header: Some(self.write_header(answer.revision)),
            outcome: Some(outcome),
        }))
    }

    async fn expire(
        &self,
        request: Request<ExpireRequest>,
    ) -> Result<Response<ExpireResponse>, Status> {
        let request = request.into_inner();
        let _timer = self.request_timer(RequestOp::Expire);
        check_key(&request.key)?;
        check_expire_ttl(request.ttl_ms)?;
        let answer = self
            .write(command::Request {
                session: session(request.session),
                conditions: Vec::new(),
                ops: vec![Op::Expire {
                    key: request.key.to_vec(),
                    ttl_ms: request.ttl_ms,
                }],
            })
            .await?;
        let (found, seq) = single_key_op_result(answer.outcome)?;
        Ok(Response::new(ExpireResponse {
            header: Some(self.write_header(answer.revision)),
            found,
            seq,
        }))
    }

    async fn persist(
        &self,
        request: Request<PersistRequest>,
    ) -> Result<Response<PersistResponse>, Status> {
        let request = request.into_inner();
        let _timer = self.request_timer(RequestOp::Persist);
        check_key(&request.key)?;
        let answer = self
            .write(command::Request {
                session: session(request.session),
                conditions: Vec::new(),
                ops: vec![Op::Persist {
                    key: request.key.to_vec(),
                }],
            })
            .await?;
        let (found, seq) = single_key_op_result(answer.outcome)?;
        Ok(Response::new(PersistResponse {
            header: Some(self.write_header(answer.revision)),
            found,
            seq,
        }))
    }

    async fn scan(&self, request: Request<ScanRequest>) -> Result<Response<ScanResponse>, Status> {
        let request = request.into_inner();
        let _timer = self.request_timer(RequestOp::Scan);
        let range = match request.range {
            None => KeyRange::All,
            Some(scan_request::Range::Prefix(prefix)) => KeyRange::Prefix(prefix.to_vec()),
            Some(scan_request::Range::Between(between)) => KeyRange::Range(
                Bound::Included(between.from.to_vec()),
                match between.to {
                    Some(to) => Bound::Excluded(to.to_vec()),
                    None => Bound::Unbounded,
                },
            ),
        };
        let limit = match request.limit as usize {
            0 => SCAN_LIMIT_DEFAULT,
            n => n.min(SCAN_LIMIT_MAX),
        };
        self.prepare_read(consistency_of(request.consistency)?, request.min_index)
            .await?;
        let now = self.state_machine.cluster_time_ms();
        let engine = self.state_machine.engine();
        // Reserved keys are skipped, so a page may take several engine
        // scans; one extra entry tells whether more follow.
        let mut cursor = request.after.map(|a| a.to_vec());
        let mut entries: Vec<KeyValue> = Vec::new();
        let mut bytes = 0usize;
        let mut more = false;
        let mut next_after = None;
        let mut exhausted = false;
        'rounds: for _ in 0..SCAN_ROUNDS_MAX {
            let want = limit + 1 - entries.len();
            let scan = Scan {
                range: range.clone(),
                after: cursor.clone(),
                limit: want,
                keys_only: request.keys_only,
            };
            let found = engine.scan(&scan, now).map_err(engine_error)?;
            exhausted = found.len() < want;
            for entry in found {
                cursor = Some(entry.key.clone());
                if entry.key.starts_with(RESERVED_KEY_PREFIX) {
                    continue;
                }
                let size = entry.key.len() + entry.value.as_ref().map_or(0, Vec::len);
                if entries.len() == limit
                    || (!entries.is_empty() && bytes + size > SCAN_PAGE_BYTES_MAX)
                {
                    more = true;
                    next_after = entries.last().map(|e| e.key.clone());
                    break 'rounds;
                }
                bytes += size;
                let meta = key_meta(&entry.meta)?;
                entries.push(KeyValue {
                    key: entry.key.into(),
                    value: entry.value.unwrap_or_default().into(),
                    seq: entry.seq,
                    ttl_ms_left: convert::ttl_left(entry.expiry_ms, now),
                    create_revision: meta.create_revision,
                    mod_revision: meta.mod_revision,
                    version: meta.version,
                    lease: meta.lease,
                });
            }
            if exhausted {
                break;
            }
        }
        if !more && !exhausted {
            // Out of rounds (many reserved keys): resume after the last key seen.
            more = true;
            next_after = cursor.map(Into::into);
        }
        let next_after = if more {
            next_after.unwrap_or_default()
        } else {
            Default::default()
        };
        // After the reads (see `get`).
        let header = self.header();
        Ok(Response::new(ScanResponse {
            header: Some(header),
            entries,
            more,
            next_after,
        }))
    }

    async fn range(
        &self,
        request: Request<RangeRequest>,
    ) -> Result<Response<RangeResponse>, Status> {
        let request = request.into_inner();
        let _timer = self.request_timer(RequestOp::Range);
        let spec = txn::range_spec(&request)?;
        self.prepare_read(consistency_of(request.consistency)?, request.min_index)
            .await?;
        let now = self.state_machine.cluster_time_ms();
        // One key at the current revision (what etcd clients' `get KEY`
        // sends) visits and counts at most one key: read on this worker, as
        // a Get is, while no entry applies (`try_read_exact`).
        let inline = (spec.revision == 0 && spec.range_end.is_empty())
            .then(|| {
                self.state_machine
                    .try_read_exact(|engine| kvstate::range::range(engine, &spec, now, 0))
            })
            .flatten();
        let state_machine = self.state_machine.clone();
        // Otherwise up to RANGE_KEYS_MAX keys and a sort: off the async
        // workers. The current revision is read while no entry applies, so
        // its header revision is exactly the state read (and no key changes
        // under it); a past revision goes through the change history, and
        // its header reports the store revision, as etcd's does.
        let (result, revision) = match inline {
            Some(read) => read,
            None => tokio::task::spawn_blocking(move || {
                if spec.revision == 0 {
                    state_machine.read_exact(|engine| kvstate::range::range(engine, &spec, now, 0))
                } else {
                    let result = state_machine.range_at(&spec, now);
                    (result, state_machine.revision())
                }
            })
            .await
            .map_err(|err| Status::internal(format!("the range read failed: {err}")))?,
        };
        let result = result.map_err(txn::range_error)?;
        // After the read (see `get`).
        let header = Header {
            revision,
            ..self.header()
        };
        Ok(Response::new(txn::range_response(result, Some(header))))
    }

    async fn delete_range(
        &self,
        request: Request<DeleteRangeRequest>,
    ) -> Result<Response<DeleteRangeResponse>, Status> {
        let request = request.into_inner();
        let _timer = self.request_timer(RequestOp::DeleteRange);
        // A transaction of one range delete: one revision for every key.
        let txn = txn::txn_request(TxnRequest {
            session: request.session,
            compare: Vec::new(),
            success: vec![PbTxnOp {
                op: Some(txn_op::Op::DeleteRange(TxnDeleteRange {
                    key: request.key,
                    range_end: request.range_end,
                    prev_kv: request.prev_kv,
                })),
            }],
            failure: Vec::new(),
        })?;
        let answer = self.write(txn).await?;
        let Outcome::Txn { results, .. } = answer.outcome else {
            return Err(unexpected(answer.outcome));
        };
        let Some(txn_op_result::Result::DeleteRange(deleted)) = txn::txn_results(results)
            .into_iter()
            .next()
            .and_then(|result| result.result)
        else {
            return Err(Status::internal(
                "a range delete's transaction answered no range delete",
            ));
        };
        Ok(Response::new(DeleteRangeResponse {
            header: Some(self.write_header(answer.revision)),
            ..deleted
        }))
    }

    async fn compact(
        &self,
        request: Request<CompactRequest>,
    ) -> Result<Response<CompactResponse>, Status> {
        let revision = request.into_inner().revision;
        self.require_leader()?;
        let Some(propose) = &self.compactor else {
            return Err(Status::unimplemented(
                "this member does not propose compactions",
            ));
        };
        if revision == 0 {
            return Err(Status::invalid_argument(
                "field `revision` is 0: a compaction names a revision of 1 or more",
            ));
        }
        // Checked here too, so a bad revision is not proposed at all (the
        // apply checks it again, at its place in the log); never waits for
        // the index's lock on the async workers.
        if let Ok(history) = self.state_machine.history().try_read() {
            if revision <= history.compact_revision() {
                return Err(Status::out_of_range(format!(
                    "mvcc: required revision has been compacted: field `revision` is {revision}, \
                     the store is compacted at {}",
                    history.compact_revision()
                )));
            }
            if revision > history.revision() {
                return Err(Status::out_of_range(format!(
                    "mvcc: required revision is a future revision: field `revision` is \
                     {revision}, the store revision is {}",
                    history.revision()
                )));
            }
        }
        let answer = tokio::time::timeout(WRITE_TIMEOUT, propose(Command::Compact { revision }))
            .await
            .map_err(|_| {
                convert::outcome_unknown("the compaction's outcome was not known in time")
            })?;
        match answer {
            Ok(Answer {
                outcome: Outcome::Applied { .. },
                revision,
            }) => Ok(Response::new(CompactResponse {
                header: Some(self.write_header(revision)),
            })),
            Ok(Answer {
                outcome: Outcome::Rejected { reason },
                ..
            }) => Err(Status::out_of_range(reason)),
            Ok(answer) => Err(unexpected(answer.outcome)),
            Err(ProposeError::NotApplied(_)) => {
                let (leader, addr) = self.leader();
                Err(convert::not_leader(
                    leader.filter(|l| *l != self.id),
                    addr.filter(|_| leader != Some(self.id)),
                ))
            }
            Err(err) => Err(convert::outcome_unknown(format!(
                "the compaction's outcome is unknown: {err:?}"
            ))),
        }
    }

    type WatchStream = crate::server::watch::WatchStream;

    async fn watch(
        &self,
        request: Request<tonic::Streaming<kvproto::kv::v1::WatchRequest>>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        Ok(Response::new(self.watch_stream(request.into_inner())))
    }

    async fn txn(&self, request: Request<TxnRequest>) -> Result<Response<TxnResponse>, Status> {
        let request = request.into_inner();
        let _timer = self.request_timer(RequestOp::Txn);
        let txn = txn::txn_request(request)?;
        let answer = self.write(txn).await?;
        let Outcome::Txn { succeeded, results } = answer.outcome else {
            return Err(unexpected(answer.outcome));
        };
        Ok(Response::new(TxnResponse {
            header: Some(self.write_header(answer.revision)),
            succeeded,
            responses: txn::txn_results(results),
        }))
    }

    async fn batch(
        &self,
        request: Request<BatchRequest>,
    ) -> Result<Response<BatchResponse>, Status> {
        let request = request.into_inner();
        let _timer = self.request_timer(RequestOp::Batch);
        let mut conditions = Vec::with_capacity(request.conditions.len());
        for condition in request.conditions {
            check_key(&condition.key)?;
            if condition.seq != 0 {
                return Err(seq_condition_refused("conditions.seq"));
            }
            conditions.push(Condition {
                key: condition.key.to_vec(),
                version: condition.mod_revision,
            });
        }
        let op_count = request.ops.len();
        let ops = request
            .ops
            .into_iter()
            .enumerate()
            .map(|(index, op)| batch_op_of(index, op))
            .collect::<Result<Vec<_>, _>>()?;
        let answer = self
            .write(command::Request {
                session: session(request.session),
                conditions,
                ops,
            })
            .await?;
        let outcome = match answer.outcome {
            Outcome::Applied { versions, existed }
                if versions.len() == op_count && existed.len() == op_count =>
            {
                batch_response::Outcome::Applied(BatchApplied {
                    results: versions
                        .into_iter()
                        .zip(existed)
                        .map(|(seq, found)| OpResult { seq, found })
                        .collect(),
                })
            }
            Outcome::ConditionFailed {
                index,
                current_version,
            } => batch_response::Outcome::ConditionFailed(ConditionFailed {
                condition_index: index as u32,
                current_mod_revision: current_version,
            }),
            Outcome::KeyNotFound { index } => batch_response::Outcome::KeyNotFound(KeyNotFound {
                op_index: index as u32,
            }),
            other => return Err(unexpected(other)),
        };
        Ok(Response::new(BatchResponse {
            header: Some(self.write_header(answer.revision)),
            outcome: Some(outcome),
        }))
    }
    async fn lease_grant(
        &self,
        request: Request<kvproto::kv::v1::LeaseGrantRequest>,
    ) -> Result<Response<kvproto::kv::v1::LeaseGrantResponse>, Status> {
        let _timer = self.request_timer(RequestOp::LeaseGrant);
        Ok(Response::new(self.grant_lease(request.into_inner()).await?))
    }
    async fn lease_revoke(
        &self,
        request: Request<kvproto::kv::v1::LeaseRevokeRequest>,
    ) -> Result<Response<kvproto::kv::v1::LeaseRevokeResponse>, Status> {
        let _timer = self.request_timer(RequestOp::LeaseRevoke);
        Ok(Response::new(
            self.revoke_lease(request.into_inner()).await?,
        ))
    }
    type LeaseKeepAliveStream = crate::server::lease::KeepAliveStream;
    async fn lease_keep_alive(
        &self,
        request: Request<tonic::Streaming<kvproto::kv::v1::LeaseKeepAliveRequest>>,
    ) -> Result<Response<Self::LeaseKeepAliveStream>, Status> {
        Ok(Response::new(self.keep_alive(request.into_inner())?))
    }
    async fn lease_time_to_live(
        &self,
        request: Request<kvproto::kv::v1::LeaseTimeToLiveRequest>,
    ) -> Result<Response<kvproto::kv::v1::LeaseTimeToLiveResponse>, Status> {
        Ok(Response::new(
            self.lease_time_to_live(request.into_inner()).await?,
        ))
    }
    async fn lease_leases(
        &self,
        request: Request<kvproto::kv::v1::LeaseLeasesRequest>,
    ) -> Result<Response<kvproto::kv::v1::LeaseLeasesResponse>, Status> {
        Ok(Response::new(self.lease_list(request.into_inner()).await?))
    }
}

/// The refusal of a condition field that compared sequence numbers before
/// revisions (a client built before them): naming the field and its
/// replacement, so the write is neither applied unconditionally nor compared
/// in the wrong number space.
fn seq_condition_refused(field: &str) -> Status {
    Status::invalid_argument(format!(
        "{field}: conditions on sequence numbers are no longer served; \
         compare mod_revision (if_mod_revision / mod_revision) instead \
         (a client built before revisions: upgrade it)"
    ))
}
