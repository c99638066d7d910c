//! The [`Client`]: key-value calls (get, put, delete, expire, persist, scan,
//! batch) and cluster calls (status, membership, snapshots), each run
//! through the router's retry loop; writes carry the client's session so a
//! retry applies at most once.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use crate::router::Channel;
use kvproto::cluster::v1 as cpb;
use kvproto::cluster::v1::cluster_client::ClusterClient;
use kvproto::kv::v1 as pb;
use kvproto::kv::v1::kv_client::KvClient;
use prost::bytes::Bytes;
use tokio_stream::{Stream, StreamExt};
use tonic::Status;

use crate::builder::{ClientBuilder, Settings};
use crate::error::{Error, Result};
use crate::keeper::Lessor;
use crate::router::{Router, Target};
use crate::txn::{DeleteRange, DeletedRange, Range, RangeResult, Txn, TxnResponse};
use crate::types::{
    Batch, BatchApplied, Condition, Consistency, Entry, KeyValue, OpResult, PutOptions, Read,
    Removed, Revisions, Scan, Written, ttl_left, ttl_ms,
};
use crate::watch::{Watch, WatchStream};
use kvproto::session::Sessions;

/// Largest response the client accepts, in bytes (a scan page or a value of
/// the largest size, with room to spare).
pub const RESPONSE_SIZE_BYTES_MAX: usize = 64 * 1024 * 1024;

/// Longest one attempt of [`Client::add_learner`] with `wait_caught_up` may
/// take: the server's catch-up wait (120 s) plus a margin.
pub const CATCH_UP_ATTEMPT_TIMEOUT: Duration = Duration::from_secs(130);
/// Runs of one write at most: a second only when the first was refused
/// SESSION_EXPIRED before any attempt of it may have applied.
pub const WRITE_ROUNDS_MAX: u32 = 2;

/// A raftcask client. Cheap to clone (clones share connections, the leader
/// cache and the session); calls may run concurrently.
#[derive(Debug, Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    router: Arc<Router>,
    sessions: Arc<Sessions>,
    last_write_index: AtomicU64,
    /// Renews the leases this client keeps alive.
    lessor: Arc<Lessor>,
}

pub(crate) fn kv(channel: Channel) -> KvClient<Channel> {
    KvClient::new(channel).max_decoding_message_size(RESPONSE_SIZE_BYTES_MAX)
}

fn cluster(channel: Channel) -> ClusterClient<Channel> {
    ClusterClient::new(channel).max_decoding_message_size(RESPONSE_SIZE_BYTES_MAX)
}

fn applied(header: Option<&pb::Header>) -> u64 {
    header.map_or(0, |h| h.applied_index)
}

fn revision(header: Option<&pb::Header>) -> u64 {
    header.map_or(0, |h| h.revision)
}

impl Client {
    /// A builder for these member addresses (`host:port`).
    pub fn builder<I, S>(endpoints: I) -> ClientBuilder
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        ClientBuilder::new(endpoints)
    }

    /// A client with default settings that has found the leader through any
    /// of `endpoints` (fails with [`Error::Unavailable`] if none answers).
    pub async fn connect<I, S>(endpoints: I) -> Result<Client>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let client = ClientBuilder::new(endpoints).build()?;
        client.discover_leader().await?;
        Ok(client)
    }

    pub(crate) fn from_settings(settings: Settings) -> Client {
        let router = Arc::new(Router::new(settings));
        Client {
            inner: Arc::new(Inner {
                lessor: Arc::new(Lessor::new(router.clone())),
                router,
                sessions: Arc::new(Sessions::new()),
                last_write_index: AtomicU64::new(0),
            }),
        }
    }

    pub(crate) fn router(&self) -> &Router {
        &self.inner.router
    }

    pub(crate) fn lessor(&self) -> &Arc<Lessor> {
        &self.inner.lessor
    }

    /// Asks any member for the cluster status and caches the leader it
    /// names; returns the leader's client address if one is known.
    pub async fn discover_leader(&self) -> Result<Option<String>> {
        let status = self.status().await?;
        let leader_id = status.header.as_ref().map_or(0, |h| h.leader_id);
        let leader = status
            .members
            .iter()
            .filter_map(|m| m.member.as_ref())
            .find(|m| leader_id != 0 && m.id == leader_id && !m.client_addr.is_empty())
            .map(|m| m.client_addr.clone());
        if let Some(addr) = &leader {
            self.inner.router.set_leader(addr);
        }
        Ok(leader)
    }

    /// The cached leader address (`None` until a write or
    /// [`Client::discover_leader`] found it).
    pub fn leader(&self) -> Option<String> {
        self.inner.router.leader()
    }

    /// This client's session id (random, non-zero).
    pub fn client_id(&self) -> u64 {
        self.inner.sessions.client_id()
    }

    /// The highest applied index acknowledged to a write of this client.
    pub fn last_write_index(&self) -> u64 {
        self.inner.last_write_index.load(Ordering::Acquire)
    }

    /// A consistency that sees this client's acknowledged writes on any
    /// member without a trip to the leader: a stale read with `min_index` =
    /// [`Client::last_write_index`].
    pub fn read_your_writes(&self) -> Consistency {
        Consistency::Stale {
            min_index: self.last_write_index(),
        }
    }

    pub(crate) fn note_write(&self, header: Option<&pb::Header>) -> u64 {
        let index = applied(header);
        self.inner
            .last_write_index
            .fetch_max(index, Ordering::AcqRel);
        index
    }

    /// Runs a write on the leader with a fresh session sequence, reused by
    /// every retry. A write refused SESSION_EXPIRED before any attempt of
    /// it may have applied (every earlier attempt was refused by a member
    /// that is not the leader, or never sent) is run once more under the
    /// fresh client id: it certainly did not apply, so there is nothing
    /// unknown to report — the case of a client idle for longer than the
    /// session window, whose session the cluster evicted.
    pub(crate) async fn write<T, F, Fut>(&self, mut call: F) -> Result<T>
    where
        F: FnMut(Channel, pb::Session) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, Status>>,
    {
        let mut rounds = 0;
        loop {
            rounds += 1;
            let ticket = self.inner.sessions.begin();
            let ticket = &ticket;
            // Attempts that may have applied: each counts from the moment
            // it is sent and is let off only by an answer proving it did
            // not apply. An attempt the router gave up on (its per-attempt
            // timeout drops the future before any answer) stays counted:
            // the leader may have applied it and lost the reply.
            let in_doubt = AtomicU32::new(0);
            let expired = AtomicBool::new(false);
            let (in_doubt, expired) = (&in_doubt, &expired);
            let result = self
                .inner
                .router
                .run(Target::Leader, true, |channel| {
                    in_doubt.fetch_add(1, Ordering::SeqCst);
                    let attempt = call(channel, ticket.session());
                    async move {
                        let answer = attempt.await;
                        if let Err(status) = &answer {
                            if crate::error::is_session_expired(status) {
                                ticket.session_expired();
                                expired.store(true, Ordering::SeqCst);
                                in_doubt.fetch_sub(1, Ordering::SeqCst);
                            } else if !matches!(
                                crate::error::classify(status),
                                crate::error::Verdict::MaybeApplied
                            ) {
                                in_doubt.fetch_sub(1, Ordering::SeqCst);
                            }
                        }
                        answer
                    }
                })
                .await;
            if result.is_ok() {
                ticket.answered();
            }
            let unapplied_expiry = result.is_err()
                && expired.load(Ordering::SeqCst)
                && in_doubt.load(Ordering::SeqCst) == 0;
            if unapplied_expiry
                && rounds < WRITE_ROUNDS_MAX
                && self.inner.router.settings().rerun_after_expiry
            {
                tracing::debug!("session expired before the write could apply: again, fresh id");
                continue;
            }
            return result;
        }
    }

    pub(crate) fn consistency(&self, consistency: Option<Consistency>) -> (i32, u64) {
        consistency
            .unwrap_or(self.inner.router.settings().consistency)
            .to_proto()
    }

    /// Reads `key` with the default consistency; `Ok(None)` if absent.
    pub async fn get(&self, key: impl Into<Bytes>) -> Result<Option<Entry>> {
        Ok(self.get_inner(key.into(), None).await?.entry)
    }

    /// Reads `key` with the given consistency; `Ok(None)` if absent.
    pub async fn get_with(
        &self,
        key: impl Into<Bytes>,
        consistency: Consistency,
    ) -> Result<Option<Entry>> {
        Ok(self.get_inner(key.into(), Some(consistency)).await?.entry)
    }

    /// Reads `key` like [`Client::get_with`] and also returns the applied
    /// index of the member that answered, which `Ok(None)` would otherwise
    /// hide (the fault suite orders observations of an expired key by it).
    pub async fn get_with_index(
        &self,
        key: impl Into<Bytes>,
        consistency: Consistency,
    ) -> Result<(Option<Entry>, u64)> {
        let read = self.get_inner(key.into(), Some(consistency)).await?;
        Ok((read.entry, read.applied_index))
    }

    /// Reads `key` like [`Client::get_with`], with what the answer's header
    /// said (applied index and store revision) also when the key is absent.
    pub async fn read(&self, key: impl Into<Bytes>, consistency: Consistency) -> Result<Read> {
        self.get_inner(key.into(), Some(consistency)).await
    }

    async fn get_inner(&self, key: Bytes, consistency: Option<Consistency>) -> Result<Read> {
        let (consistency, min_index) = self.consistency(consistency);
        let response = self
            .inner
            .router
            .run(Target::Any, false, |channel| {
                let request = pb::GetRequest {
                    key: key.clone(),
                    consistency,
                    min_index,
                };
                async move { kv(channel).get(request).await }
            })
            .await?;
        let applied_index = applied(response.header.as_ref());
        let header_revision = revision(response.header.as_ref());
        if !response.found {
            return Ok(Read {
                entry: None,
                applied_index,
                revision: header_revision,
            });
        }
        let entry = Entry {
            value: response.value,
            revisions: Revisions {
                create_revision: response.create_revision,
                mod_revision: response.mod_revision,
                version: response.version,
                lease: response.lease,
            },
            seq: response.seq,
            ttl_left: ttl_left(response.ttl_ms_left),
            applied_index,
            revision: header_revision,
        };
        Ok(Read {
            entry: Some(entry),
            applied_index,
            revision: header_revision,
        })
    }

    /// Writes `key` unconditionally, without a TTL.
    pub async fn put(&self, key: impl Into<Bytes>, value: impl Into<Bytes>) -> Result<Written> {
        self.put_with(key, value, PutOptions::default()).await
    }

    /// Writes `key` with a TTL, a condition and/or a lease; a failed
    /// condition is [`Error::VersionMismatch`], a lease that does not exist
    /// [`Error::LeaseNotFound`]. A put with a lease goes as a one-op
    /// transaction, whose answer has no record sequence number:
    /// [`Written::seq`] is 0 then.
    pub async fn put_with(
        &self,
        key: impl Into<Bytes>,
        value: impl Into<Bytes>,
        options: PutOptions,
    ) -> Result<Written> {
        let (key, value) = (key.into(), value.into());
        let ttl_ms = options.ttl.map_or(0, ttl_ms);
        if let Some(lease) = options.lease.filter(|lease| *lease != 0) {
            return self
                .put_leased(key, value, ttl_ms, options.condition, lease)
                .await;
        }
        let condition = options.condition.map(|c| match c {
            Condition::IfModRevision(v) => pb::put_request::Condition::IfModRevision(v),
            Condition::IfAbsent => pb::put_request::Condition::IfAbsent(pb::IfAbsent {}),
        });
        let response = self
            .write(|channel, session| {
                let request = pb::PutRequest {
                    session: Some(session),
                    key: key.clone(),
                    value: value.clone(),
                    ttl_ms,
                    condition,
                };
                async move { kv(channel).put(request).await }
            })
            .await?;
        let applied_index = self.note_write(response.header.as_ref());
        match response.outcome {
            Some(pb::put_response::Outcome::Seq(seq)) => Ok(Written {
                revision: revision(response.header.as_ref()),
                seq,
                applied_index,
            }),
            Some(pb::put_response::Outcome::ConditionFailed(c)) => Err(mismatch(c)),
            None => Err(Error::Protocol("PutResponse.outcome is missing".into())),
        }
    }

    /// Deletes `key` (absent is fine: `found` false).
    pub async fn delete(&self, key: impl Into<Bytes>) -> Result<Removed> {
        self.delete_inner(key.into(), None).await
    }

    /// Deletes `key` only if its `mod_revision` is `mod_revision` (0 = absent).
    pub async fn delete_if_mod_revision(
        &self,
        key: impl Into<Bytes>,
        mod_revision: u64,
    ) -> Result<Removed> {
        self.delete_inner(key.into(), Some(mod_revision)).await
    }

    async fn delete_inner(&self, key: Bytes, if_mod_revision: Option<u64>) -> Result<Removed> {
        let response = self
            .write(|channel, session| {
                let request = pb::DeleteRequest {
                    session: Some(session),
                    key: key.clone(),
                    if_mod_revision,
                    if_seq: None,
                };
                async move { kv(channel).delete(request).await }
            })
            .await?;
        let applied_index = self.note_write(response.header.as_ref());
        match response.outcome {
            Some(pb::delete_response::Outcome::Deleted(d)) => Ok(Removed {
                found: d.found,
                revision: revision(response.header.as_ref()),
                applied_index,
            }),
            Some(pb::delete_response::Outcome::ConditionFailed(c)) => Err(mismatch(c)),
            None => Err(Error::Protocol("DeleteResponse.outcome is missing".into())),
        }
    }

    /// Gives an existing `key` a new TTL; `Ok(None)` if the key is absent.
    pub async fn expire(&self, key: impl Into<Bytes>, ttl: Duration) -> Result<Option<Written>> {
        let key = key.into();
        let ttl_ms = ttl_ms(ttl);
        let response = self
            .write(|channel, session| {
                let request = pb::ExpireRequest {
                    session: Some(session),
                    key: key.clone(),
                    ttl_ms,
                };
                async move { kv(channel).expire(request).await }
            })
            .await?;
        let applied_index = self.note_write(response.header.as_ref());
        Ok(response.found.then_some(Written {
            revision: revision(response.header.as_ref()),
            seq: response.seq,
            applied_index,
        }))
    }

    /// Removes an existing `key`'s TTL; `Ok(None)` if the key is absent.
    pub async fn persist(&self, key: impl Into<Bytes>) -> Result<Option<Written>> {
        let key = key.into();
        let response = self
            .write(|channel, session| {
                let request = pb::PersistRequest {
                    session: Some(session),
                    key: key.clone(),
                };
                async move { kv(channel).persist(request).await }
            })
            .await?;
        let applied_index = self.note_write(response.header.as_ref());
        Ok(response.found.then_some(Written {
            revision: revision(response.header.as_ref()),
            seq: response.seq,
            applied_index,
        }))
    }

    /// Applies a [`Batch`] atomically. A failed condition is
    /// [`Error::VersionMismatch`], a missing key for expire/persist is
    /// [`Error::KeyNotFound`]; in both cases nothing was applied.
    pub async fn batch(&self, batch: Batch) -> Result<BatchApplied> {
        let response = self
            .write(|channel, session| {
                let request = pb::BatchRequest {
                    session: Some(session),
                    conditions: batch.conditions.clone(),
                    ops: batch.ops.clone(),
                };
                async move { kv(channel).batch(request).await }
            })
            .await?;
        let applied_index = self.note_write(response.header.as_ref());
        match response.outcome {
            Some(pb::batch_response::Outcome::Applied(a)) => Ok(BatchApplied {
                results: a
                    .results
                    .into_iter()
                    .map(|r| OpResult {
                        seq: r.seq,
                        found: r.found,
                    })
                    .collect(),
                revision: revision(response.header.as_ref()),
                applied_index,
            }),
            Some(pb::batch_response::Outcome::ConditionFailed(c)) => Err(mismatch(c)),
            Some(pb::batch_response::Outcome::KeyNotFound(k)) => Err(Error::KeyNotFound {
                op_index: k.op_index,
            }),
            None => Err(Error::Protocol("BatchResponse.outcome is missing".into())),
        }
    }

    /// Watches `watch`'s keys from a member picked round-robin: returns
    /// once the member has created the watch. The stream resumes on
    /// another member by itself (see [`crate::watch`]).
    pub async fn watch(&self, watch: Watch) -> Result<WatchStream> {
        crate::watch::start(self.inner.router.clone(), watch, None).await
    }

    /// [`Client::watch`], started on the member at `addr` (`host:port`);
    /// it resumes on any member of the client.
    pub async fn watch_on(&self, addr: &str, watch: Watch) -> Result<WatchStream> {
        crate::watch::start(self.inner.router.clone(), watch, Some(addr)).await
    }

    /// One page of a scan, resuming after `after` (exclusive).
    pub async fn scan_page(&self, scan: &Scan, after: Option<Bytes>) -> Result<ScanPage> {
        let (consistency, min_index) = self.consistency(scan.consistency);
        let response = self
            .inner
            .router
            .run(Target::Any, false, |channel| {
                let request = pb::ScanRequest {
                    range: scan.range.clone(),
                    limit: scan.page_size,
                    after: after.clone(),
                    keys_only: scan.keys_only,
                    consistency,
                    min_index,
                };
                async move { kv(channel).scan(request).await }
            })
            .await?;
        let next_after = if response.more {
            if response.next_after.is_empty() {
                return Err(Error::Protocol(
                    "ScanResponse.more is set but next_after is empty".into(),
                ));
            }
            if after.as_ref().is_some_and(|a| response.next_after <= *a) {
                return Err(Error::Protocol(
                    "ScanResponse.next_after does not advance past the request's after".into(),
                ));
            }
            Some(response.next_after)
        } else {
            None
        };
        Ok(ScanPage {
            entries: response
                .entries
                .into_iter()
                .map(|e| KeyValue {
                    key: e.key,
                    value: e.value,
                    revisions: Revisions {
                        create_revision: e.create_revision,
                        mod_revision: e.mod_revision,
                        version: e.version,
                        lease: e.lease,
                    },
                    seq: e.seq,
                    ttl_left: ttl_left(e.ttl_ms_left),
                })
                .collect(),
            next_after,
            applied_index: applied(response.header.as_ref()),
            revision: revision(response.header.as_ref()),
        })
    }

    /// Reads the keys of `range` in one consistent state (etcd's Range),
    /// with the range's consistency or the client's default.
    pub async fn range(&self, range: &Range) -> Result<RangeResult> {
        let default = self.inner.router.settings().consistency;
        let response = self
            .inner
            .router
            .run(Target::Any, false, |channel| {
                let request = range.request(default);
                async move { kv(channel).range(request).await }
            })
            .await?;
        let (revision, applied_index) = (
            revision(response.header.as_ref()),
            applied(response.header.as_ref()),
        );
        Ok(crate::txn::range_result(response, revision, applied_index))
    }

    /// Deletes the keys of `delete` at one revision (etcd's DeleteRange).
    pub async fn delete_range(&self, delete: &DeleteRange) -> Result<DeletedRange> {
        let op = delete.op();
        let response = self
            .write(|channel, session| {
                let request = pb::DeleteRangeRequest {
                    session: Some(session),
                    key: op.key.clone(),
                    range_end: op.range_end.clone(),
                    prev_kv: op.prev_kv,
                };
                async move { kv(channel).delete_range(request).await }
            })
            .await?;
        let applied_index = self.note_write(response.header.as_ref());
        let revision = revision(response.header.as_ref());
        Ok(crate::txn::deleted_range(response, revision, applied_index))
    }

    /// Runs a transaction (etcd's Txn): compares, then one branch,
    /// atomically at one revision. A transaction refused before it applied
    /// (too many ops, two writes of one key, a bad field) is
    /// [`Error::InvalidArgument`] naming the field and limit; one whose put
    /// names a lease that does not exist is [`Error::LeaseNotFound`] (with
    /// that lease's id when the transaction names one lease, else 0).
    pub async fn txn(&self, txn: &Txn) -> Result<TxnResponse> {
        let response = self
            .write(|channel, session| {
                let request = txn.proto(session);
                async move { kv(channel).txn(request).await }
            })
            .await
            .map_err(|err| crate::lease::lease_error(err, txn.sole_lease()))?;
        let applied_index = self.note_write(response.header.as_ref());
        Ok(TxnResponse {
            succeeded: response.succeeded,
            results: crate::txn::txn_results(response.responses),
            revision: revision(response.header.as_ref()),
            applied_index,
        })
    }

    /// Compacts the change history to revision `to` (etcd's Compact): reads at
    /// a revision below it are refused from then on. Answers the store
    /// revision when it applied. A revision at or below the compact
    /// revision, or above the store revision, is [`Error::Rpc`] with code
    /// `OutOfRange` and etcd's message (naming the oldest revision served,
    /// or the store revision). A retry after an unknown outcome may answer
    /// "has been compacted": the first attempt applied.
    pub async fn compact(&self, to: u64) -> Result<u64> {
        let response = self
            .inner
            .router
            .run(Target::Leader, true, |channel| async move {
                kv(channel)
                    .compact(pb::CompactRequest { revision: to })
                    .await
            })
            .await?;
        Ok(revision(response.header.as_ref()))
    }

    /// Every key of `scan` as a stream, fetched page by page on demand (each
    /// page is a read of its own, not one snapshot). After an error the
    /// stream ends.
    pub fn scan(&self, scan: Scan) -> ScanStream {
        ScanStream {
            client: self.clone(),
            scan,
            buffer: VecDeque::new(),
            after: None,
            done: false,
            pending: None,
        }
    }

    /// The cluster status as seen by any member.
    pub async fn status(&self) -> Result<cpb::StatusResponse> {
        self.inner
            .router
            .run(Target::Any, false, |channel| async move {
                cluster(channel).status(cpb::StatusRequest {}).await
            })
            .await
    }

    /// The members as seen by any member.
    pub async fn members(&self) -> Result<Vec<cpb::Member>> {
        let response = self
            .inner
            .router
            .run(Target::Any, false, |channel| async move {
                cluster(channel)
                    .member_list(cpb::MemberListRequest {})
                    .await
            })
            .await?;
        Ok(response.members)
    }

    /// Adds a learner (on the leader), which must already run. With
    /// `wait_caught_up` the leader answers once the learner holds the log up
    /// to the change (by snapshot if needed), so one attempt may take up to
    /// [`CATCH_UP_ATTEMPT_TIMEOUT`] instead of the request timeout.
    pub async fn add_learner(
        &self,
        id: u64,
        client_addr: &str,
        peer_addr: &str,
        wait_caught_up: bool,
    ) -> Result<Vec<cpb::Member>> {
        let request = cpb::AddLearnerRequest {
            id,
            client_addr: client_addr.to_string(),
            peer_addr: peer_addr.to_string(),
            wait_caught_up,
        };
        let settings = self.inner.router.settings();
        let (attempt, overall) = if wait_caught_up {
            (
                CATCH_UP_ATTEMPT_TIMEOUT,
                settings.operation_timeout.max(CATCH_UP_ATTEMPT_TIMEOUT),
            )
        } else {
            (settings.request_timeout, settings.operation_timeout)
        };
        let response = self
            .inner
            .router
            .run_for(Target::Leader, true, attempt, overall, |channel| {
                let request = request.clone();
                async move { cluster(channel).add_learner(request).await }
            })
            .await?;
        Ok(response.members)
    }

    /// Promotes a learner to voter (on the leader); refused while the
    /// learner is far behind.
    pub async fn promote(&self, id: u64) -> Result<Vec<cpb::Member>> {
        let response = self
            .inner
            .router
            .run(Target::Leader, true, |channel| async move {
                cluster(channel).promote(cpb::PromoteRequest { id }).await
            })
            .await?;
        Ok(response.members)
    }

    /// Removes a voter or learner (the leader included: it steps down once
    /// the change commits). The removed member's process keeps running
    /// until its operator stops it.
    pub async fn remove_member(&self, id: u64) -> Result<Vec<cpb::Member>> {
        let response = self
            .inner
            .router
            .run(Target::Leader, true, |channel| async move {
                cluster(channel)
                    .remove_member(cpb::RemoveMemberRequest { id })
                    .await
            })
            .await?;
        Ok(response.members)
    }

    /// Hands leadership to voter `id` (the leader's leader transfer): answers
    /// once `id` leads. Retried on another member after a leader change, a
    /// move that already happened answers at once (the new leader is `id`).
    pub async fn move_leader(&self, id: u64) -> Result<cpb::MoveLeaderResponse> {
        self.inner
            .router
            .run(Target::Leader, true, |channel| async move {
                cluster(channel)
                    .move_leader(cpb::MoveLeaderRequest { id })
                    .await
            })
            .await
    }

    /// Makes a member build a snapshot (and purge its log up to it with
    /// `purge_log`): the cached leader, or else the first member that
    /// answers.
    pub async fn trigger_snapshot(&self, purge_log: bool) -> Result<cpb::TriggerSnapshotResponse> {
        self.inner
            .router
            .run(Target::Leader, false, |channel| async move {
                cluster(channel)
                    .trigger_snapshot(cpb::TriggerSnapshotRequest { purge_log })
                    .await
            })
            .await
    }

    /// Streams the leader's snapshot (manifest, then chunks): a fresh one
    /// with `build_new`, else its latest. The leader has applied every
    /// write it acknowledged, so a backup taken from it holds each write
    /// acknowledged before the call; a follower's could lag. (When no
    /// leader can be found, the first member that answers serves it.)
    pub async fn save_snapshot(
        &self,
        build_new: bool,
    ) -> Result<impl Stream<Item = Result<cpb::SaveSnapshotResponse>> + Send + Unpin + use<>> {
        // Refresh the cached leader, so the stream comes from it.
        let _ = self.discover_leader().await;
        let streaming = self
            .inner
            .router
            .run(Target::Leader, false, |channel| async move {
                cluster(channel)
                    .save_snapshot(cpb::SaveSnapshotRequest { build_new })
                    .await
            })
            .await?;
        Ok(streaming.map(|item| {
            item.map_err(|status| Error::Rpc {
                code: status.code(),
                message: status.message().to_string(),
            })
        }))
    }
}

fn mismatch(c: pb::ConditionFailed) -> Error {
    Error::VersionMismatch {
        condition_index: c.condition_index,
        current_mod_revision: c.current_mod_revision,
    }
}

/// One page of a scan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScanPage {
    /// The entries, ascending by key.
    pub entries: Vec<KeyValue>,
    /// Where the next page starts (pass as `after`); `None` = the last page.
    pub next_after: Option<Bytes>,
    /// The applied index of the member that answered.
    pub applied_index: u64,
    /// The store revision the page reflects (at or above the
    /// `mod_revision` of every entry in it).
    pub revision: u64,
}

type PageFuture = Pin<Box<dyn Future<Output = Result<ScanPage>> + Send>>;

/// The stream of [`Client::scan`]: entries in key order, one page fetched
/// at a time when the previous one is used up.
pub struct ScanStream {
    client: Client,
    scan: Scan,
    buffer: VecDeque<KeyValue>,
    after: Option<Bytes>,
    done: bool,
    pending: Option<PageFuture>,
}

impl std::fmt::Debug for ScanStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScanStream")
            .field("scan", &self.scan)
            .field("buffered", &self.buffer.len())
            .field("after", &self.after)
            .field("done", &self.done)
            .finish_non_exhaustive()
    }
}

impl Stream for ScanStream {
    type Item = Result<KeyValue>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        loop {
            if let Some(entry) = this.buffer.pop_front() {
                return Poll::Ready(Some(Ok(entry)));
            }
            if this.done {
                return Poll::Ready(None);
            }
            let pending = this.pending.get_or_insert_with(|| {
                let client = this.client.clone();
                let scan = this.scan.clone();
                let after = this.after.clone();
                Box::pin(async move { client.scan_page(&scan, after).await })
            });
            let page = match pending.as_mut().poll(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(page) => page,
            };
            this.pending = None;
            match page {
                Err(err) => {
                    this.done = true;
                    return Poll::Ready(Some(Err(err)));
                }
                Ok(page) => {
                    this.buffer.extend(page.entries);
                    match page.next_after {
                        Some(next) => this.after = Some(next),
                        None => this.done = true,
                    }
                }
            }
        }
    }
}
