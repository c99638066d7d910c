//! What the `Lock` and `Election` services share: etcd 3.4 builds both on
//! its `clientv3/concurrency` package (a session's key `NAME/<lease hex>`
//! under the name's prefix; the key created first holds the lock or leads),
//! and so does this port, on its own KV and Watch services:
//!
//! - every read and write is an etcd call of this front end (`KV.Range`,
//!   `KV.Txn`, `KV.DeleteRange` in `kv.rs`, so a follower forwards each
//!   write to the leader exactly once), and a wait is one native watch
//!   stream (`server/watch.rs`) on the keys it waits for;
//! - [`EtcdFrontEnd::wait_deletes`]: wait until every key under a prefix
//!   created before one's own is deleted (etcd's `waitDeletes`), watching
//!   the last of them, and one's own key: a waiter whose key goes (its
//!   lease expired or was revoked) is told at once;
//! - [`Withdraw`]: a waiter whose client goes away (the handler's future is
//!   dropped) takes its key back, as etcd's server does when the call's
//!   context is cancelled;
//! - [`recipe_error`]: how errors reach the client. etcd's lock and
//!   election servers return plain Go errors (their own, or clientv3's
//!   `EtcdError`, which has no gRPC status), which gRPC sends with code
//!   UNKNOWN and the error's text; so do these services, word for word.

use std::sync::Arc;

use kvproto::etcd::etcdserverpb::kv_server::Kv;
use kvproto::etcd::etcdserverpb::lease_server::Lease;
use kvproto::etcd::etcdserverpb::{
    Compare, DeleteRangeRequest, LeaseGrantRequest, PutRequest, RangeRequest, RangeResponse,
    RequestOp, ResponseHeader, TxnRequest, TxnResponse, compare, range_request, request_op,
    response_op,
};
use kvproto::etcd::mvccpb;
use kvproto::kv::v1 as native;
use prost::bytes::Bytes;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio_stream::StreamExt as _;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Code, Request, Status};

use super::EtcdFrontEnd;
use super::errors::{self, etcd_error};

/// The TTL (seconds) of the lease a `Lock` or `Campaign` (or `Proclaim`)
/// with lease 0 is given: etcd's server opens a `concurrency.Session`,
/// which grants a lease of its default TTL (60 s) when none is named.
pub const RECIPE_SESSION_TTL_SECONDS: i64 = 60;
/// `Lock` and `Campaign` calls one member serves at once (each holds a
/// watch stream while it waits); one more is refused with etcd's
/// `etcdserver: too many requests` (the detail names this limit), so a
/// crowd of waiters cannot exhaust the member's tasks and watches.
pub const RECIPE_WAITERS_MAX: usize = 10_000;
/// The calls that wait for as long as their client does, as etcd's do
/// (`Lock` until the lock is free, `Campaign` until elected): once
/// decoded and holding a waiter's place ([`RecipeLimits::wait_place`]),
/// not counted against the port's `--max-inflight` cap and not cut by its
/// handler timeout; [`RECIPE_WAITERS_MAX`] bounds them instead.
pub const RECIPE_WAIT_PATHS: &[&str] = &["/v3lockpb.Lock/Lock", "/v3electionpb.Election/Campaign"];
/// `Election.Observe` streams one member serves at once (each holds a
/// task and a watch stream for as long as its client stays); one more is
/// refused like a waiter beyond [`RECIPE_WAITERS_MAX`].
pub const RECIPE_OBSERVERS_MAX: usize = 1_000;
/// Answers an `Observe` stream holds for a slow client before its task
/// waits (and its watch with it: the native watch reads on when it sends).
pub const OBSERVE_RESPONSES_BUFFERED: usize = 4;

/// etcd's lock and election errors (`clientv3/concurrency`,
/// `etcdserver/api/v3election`): code UNKNOWN, these exact messages.
pub const ELECTION_NOT_LEADER: (Code, &str) = (Code::Unknown, "election: not leader");
pub const ELECTION_NO_LEADER: (Code, &str) = (Code::Unknown, "election: no leader");
pub const MISSING_LEADER_KEY: (Code, &str) = (Code::Unknown, "\"leader\" field must be provided");
/// A `Lock` whose own key went while it waited (its lease expired or was
/// revoked): etcd 3.5's mutex error. (etcd 3.4 answered the lock as held,
/// with the key gone; this port refuses, as etcd does since.)
pub const SESSION_EXPIRED: (Code, &str) = (Code::Unknown, "mutex: session is expired");

/// What the member's recipe services share: their limits.
#[derive(Debug)]
pub(crate) struct RecipeLimits {
    waiters: Arc<Semaphore>,
    observers: Arc<Semaphore>,
}

impl RecipeLimits {
    pub(crate) fn new() -> RecipeLimits {
        RecipeLimits {
            waiters: Arc::new(Semaphore::new(RECIPE_WAITERS_MAX)),
            observers: Arc::new(Semaphore::new(RECIPE_OBSERVERS_MAX)),
        }
    }

    /// A place for one `Lock` or `Campaign`, or etcd's "too many requests".
    #[allow(clippy::result_large_err)]
    pub(crate) fn waiter(&self, call: &str) -> Result<OwnedSemaphorePermit, Status> {
        self.waiters.clone().try_acquire_owned().map_err(|_| {
            etcd_error(
                errors::TOO_MANY_REQUESTS,
                &format!(
                    "{call}: this member serves RECIPE_WAITERS_MAX ({RECIPE_WAITERS_MAX}) Lock \
                     and Campaign calls already; retry later or on another member"
                ),
            )
        })
    }

    /// A waiter's place ([`RecipeLimits::waiter`]); holding it, the call
    /// leaves the port's in-flight count and handler timeout
    /// ([`crate::server::limits::AdmissionRelease`]): its wait is bounded
    /// by the places instead ([`RECIPE_WAIT_PATHS`]).
    #[allow(clippy::result_large_err)]
    pub(crate) fn wait_place<T>(
        &self,
        call: &str,
        request: &tonic::Request<T>,
    ) -> Result<OwnedSemaphorePermit, Status> {
        let place = self.waiter(call)?;
        if let Some(admission) = request
            .extensions()
            .get::<crate::server::limits::AdmissionRelease>()
        {
            admission.release();
        }
        Ok(place)
    }

    /// A place for one `Observe` stream, or etcd's "too many requests".
    #[allow(clippy::result_large_err)]
    pub(crate) fn observer(&self) -> Result<OwnedSemaphorePermit, Status> {
        self.observers.clone().try_acquire_owned().map_err(|_| {
            etcd_error(
                errors::TOO_MANY_REQUESTS,
                &format!(
                    "Election.Observe: this member serves RECIPE_OBSERVERS_MAX \
                     ({RECIPE_OBSERVERS_MAX}) Observe streams already; retry later or on \
                     another member"
                ),
            )
        })
    }
}

/// An error of the KV calls a recipe makes, as etcd's recipe servers
/// answer it: code UNKNOWN, etcd's message (and raftcask's detail) kept.
/// The port's own limits ([`RecipeLimits`]) keep their code.
pub(crate) fn recipe_error(status: Status) -> Status {
    Status::with_metadata(
        Code::Unknown,
        status.message().to_string(),
        status.metadata().clone(),
    )
}

/// The keys of the lock or election `name`: everything under `name/`.
pub(crate) fn prefix_of(name: &[u8]) -> Bytes {
    let mut prefix = name.to_vec();
    prefix.push(b'/');
    prefix.into()
}

/// The end of the range of keys starting with `prefix` (clientv3's
/// `GetPrefixRangeEnd`): its last byte below 0xff raised by one, the 0xff
/// bytes after it dropped; "\0" (every key from `prefix` on) when all are.
pub(crate) fn prefix_end(prefix: &[u8]) -> Bytes {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end.into();
        }
    }
    Bytes::from_static(b"\0")
}

/// A session's key under `prefix`: the lease id in lower-case hex, as Go's
/// `%x` prints an `int64` (a negative id with a minus sign; such a lease
/// never exists, so its put is refused).
pub(crate) fn own_key(prefix: &[u8], lease: i64) -> Bytes {
    let hex = if lease < 0 {
        format!("-{:x}", lease.unsigned_abs())
    } else {
        format!("{lease:x}")
    };
    let mut key = prefix.to_vec();
    key.extend_from_slice(hex.as_bytes());
    key.into()
}

/// The compare "`key` was created at `revision`" (0: it does not exist).
pub(crate) fn created_at(key: &Bytes, revision: i64) -> Compare {
    Compare {
        result: compare::CompareResult::Equal as i32,
        target: compare::CompareTarget::Create as i32,
        key: key.clone(),
        range_end: Bytes::new(),
        target_union: Some(compare::TargetUnion::CreateRevision(revision)),
    }
}

pub(crate) fn put_op(key: &Bytes, value: Bytes, lease: i64) -> RequestOp {
    RequestOp {
        request: Some(request_op::Request::RequestPut(PutRequest {
            key: key.clone(),
            value,
            lease,
            ..Default::default()
        })),
    }
}

pub(crate) fn get_op(key: &Bytes) -> RequestOp {
    RequestOp {
        request: Some(request_op::Request::RequestRange(RangeRequest {
            key: key.clone(),
            ..Default::default()
        })),
    }
}

pub(crate) fn delete_op(key: &Bytes) -> RequestOp {
    RequestOp {
        request: Some(request_op::Request::RequestDeleteRange(
            DeleteRangeRequest {
                key: key.clone(),
                ..Default::default()
            },
        )),
    }
}

/// The key under `prefix` created first (clientv3's `WithFirstCreate`):
/// the lock's holder, the election's leader.
pub(crate) fn first_created(prefix: &Bytes) -> RangeRequest {
    RangeRequest {
        key: prefix.clone(),
        range_end: prefix_end(prefix),
        limit: 1,
        sort_order: range_request::SortOrder::Ascend as i32,
        sort_target: range_request::SortTarget::Create as i32,
        ..Default::default()
    }
}

/// [`first_created`] as a transaction op.
pub(crate) fn first_created_op(prefix: &Bytes) -> RequestOp {
    RequestOp {
        request: Some(request_op::Request::RequestRange(first_created(prefix))),
    }
}

/// The keys a range op of a transaction answered (none for another op).
pub(crate) fn range_kvs(response: Option<&response_op::Response>) -> &[mvccpb::KeyValue] {
    match response {
        Some(response_op::Response::ResponseRange(range)) => &range.kvs,
        _ => &[],
    }
}

/// How a wait for the keys created before one's own ended.
#[derive(Debug)]
pub(crate) enum Waited {
    /// None is left: one's own key is the first (the header of the read
    /// that found so).
    First(ResponseHeader),
    /// One's own key is gone (deleted, or its lease ended).
    OwnKeyGone,
}

/// How one round of watching ended.
enum Watched {
    /// The key watched with this watch id was deleted.
    Deleted(i64),
    /// The watch could not go on from where it started (compacted past
    /// it): read again.
    Again,
}

/// The watch id of the wait's watch on the last key before one's own.
const WATCH_BEFORE: i64 = 1;
/// The watch id of the wait's watch on one's own key.
const WATCH_OWN: i64 = 2;

/// A native watch stream a recipe opened with its creates; closed (every
/// watch ended) when dropped.
pub(crate) struct RecipeWatch {
    /// Kept so the stream keeps reading: it ends when the answers go.
    _requests: mpsc::Sender<Result<native::WatchRequest, Status>>,
    answers: crate::server::watch::WatchStream,
}

impl RecipeWatch {
    pub(crate) fn open(front: &EtcdFrontEnd, creates: Vec<native::WatchCreateRequest>) -> Self {
        let (requests, stream) = mpsc::channel(creates.len().max(1));
        for create in creates {
            // The channel holds every create: nothing is dropped.
            let _ = requests.try_send(Ok(native::WatchRequest {
                request: Some(native::watch_request::Request::Create(create)),
            }));
        }
        RecipeWatch {
            _requests: requests,
            answers: front.kv.watch_stream(ReceiverStream::new(stream)),
        }
    }

    /// The next answer; the stream's end is an error (the member stops).
    pub(crate) async fn next(&mut self) -> Result<native::WatchResponse, Status> {
        match self.answers.next().await {
            Some(Ok(answer)) => Ok(answer),
            Some(Err(status)) => Err(recipe_error(super::errors::to_etcd(status))),
            None => Err(recipe_error(etcd_error(
                errors::STOPPED,
                "the watch of a lock or election wait ended",
            ))),
        }
    }
}

/// A native watch of one key (or a range) from `start_revision`.
pub(crate) fn watch_of(
    watch_id: i64,
    key: &Bytes,
    range_end: Bytes,
    start_revision: u64,
) -> native::WatchCreateRequest {
    native::WatchCreateRequest {
        key: key.clone(),
        range_end,
        start_revision,
        watch_id,
        ..Default::default()
    }
}

/// Whether a cancelled watch answer says to read again (the history was
/// compacted past its start) or is an error.
#[allow(clippy::result_large_err)]
pub(crate) fn cancelled(answer: &native::WatchResponse) -> Result<(), Status> {
    if answer.compact_revision > 0 {
        return Ok(());
    }
    Err(recipe_error(Status::unavailable(format!(
        "the watch of a lock or election wait was cancelled: {}",
        answer.cancel_reason
    ))))
}

impl EtcdFrontEnd {
    /// A recipe's transaction through this port's `KV.Txn`.
    pub(crate) async fn recipe_txn(&self, txn: TxnRequest) -> Result<TxnResponse, Status> {
        Kv::txn(self, Request::new(txn))
            .await
            .map(tonic::Response::into_inner)
            .map_err(recipe_error)
    }

    /// A recipe's read through this port's `KV.Range`.
    pub(crate) async fn recipe_range(&self, range: RangeRequest) -> Result<RangeResponse, Status> {
        Kv::range(self, Request::new(range))
            .await
            .map(tonic::Response::into_inner)
            .map_err(recipe_error)
    }

    /// The lease a session of a request is attached to: `lease`, or for 0
    /// a new one of [`RECIPE_SESSION_TTL_SECONDS`], as etcd's session gives.
    pub(crate) async fn session_lease(&self, lease: i64) -> Result<i64, Status> {
        if lease != 0 {
            return Ok(lease);
        }
        let grant = LeaseGrantRequest {
            ttl: RECIPE_SESSION_TTL_SECONDS,
            id: 0,
        };
        Lease::lease_grant(self, Request::new(grant))
            .await
            .map(|granted| granted.into_inner().id)
            .map_err(recipe_error)
    }

    /// Waits until no key under `prefix` created before `own_revision` is
    /// left (etcd's `waitDeletes`), or `own_key` (created at
    /// `own_revision`) is gone. Each round reads the state at one revision
    /// (one's own key linearizably, then the last key created before it at
    /// that revision) and watches both keys from the revision after: the
    /// last one's delete starts the next round, one's own ends the wait.
    pub(crate) async fn wait_deletes(
        &self,
        prefix: &Bytes,
        own_key: &Bytes,
        own_revision: i64,
    ) -> Result<Waited, Status> {
        loop {
            let own = self
                .recipe_range(RangeRequest {
                    key: own_key.clone(),
                    ..Default::default()
                })
                .await?;
            let header = own.header.unwrap_or_default();
            if !own.kvs.iter().any(|kv| kv.create_revision == own_revision) {
                return Ok(Waited::OwnKeyGone);
            }
            // `max_create_revision` 0 would mean no bound: at revision 1
            // nothing was created before.
            if own_revision <= 1 {
                return Ok(Waited::First(header));
            }
            let at = header.revision;
            let before = RangeRequest {
                key: prefix.clone(),
                range_end: prefix_end(prefix),
                limit: 1,
                sort_order: range_request::SortOrder::Descend as i32,
                sort_target: range_request::SortTarget::Create as i32,
                max_create_revision: own_revision - 1,
                revision: at,
                serializable: true,
                ..Default::default()
            };
            let before = match self.recipe_range(before).await {
                Ok(before) => before,
                // Compacted past `at` meanwhile: read again, now.
                Err(status) if status.message() == errors::COMPACTED.1 => continue,
                Err(status) => return Err(status),
            };
            let Some(last) = before.kvs.into_iter().next() else {
                return Ok(Waited::First(header));
            };
            let from = super::non_negative(at) + 1;
            let watch = RecipeWatch::open(
                self,
                vec![
                    watch_of(WATCH_BEFORE, &last.key, Bytes::new(), from),
                    watch_of(WATCH_OWN, own_key, Bytes::new(), from),
                ],
            );
            match Self::deleted(watch).await? {
                Watched::Deleted(WATCH_OWN) => return Ok(Waited::OwnKeyGone),
                Watched::Deleted(_) | Watched::Again => continue,
            }
        }
    }

    /// The first delete one of `watch`'s keys sees.
    async fn deleted(mut watch: RecipeWatch) -> Result<Watched, Status> {
        loop {
            let answer = watch.next().await?;
            if answer.canceled {
                cancelled(&answer)?;
                return Ok(Watched::Again);
            }
            let delete = native::EventType::Delete as i32;
            if answer.events.iter().any(|event| event.r#type == delete) {
                return Ok(Watched::Deleted(answer.watch_id));
            }
        }
    }
}

/// Takes a waiter's key back when its call ends without an answer (the
/// client went away and the handler's future was dropped, or the wait
/// failed), unless [`Withdraw::disarm`]ed: the transaction runs on its own
/// task, since the call's future is gone (not if the member is stopping).
pub(crate) struct Withdraw {
    front: Option<EtcdFrontEnd>,
    txn: TxnRequest,
}

impl Withdraw {
    pub(crate) fn new(front: &EtcdFrontEnd, txn: TxnRequest) -> Withdraw {
        Withdraw {
            front: Some(front.clone()),
            txn,
        }
    }

    /// The call answered: the key stays.
    pub(crate) fn disarm(mut self) {
        self.front = None;
    }
}

impl Drop for Withdraw {
    fn drop(&mut self) {
        let Some(front) = self.front.take() else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let txn = std::mem::take(&mut self.txn);
        // Not while the member stops: the task would hold the member's
        // state up to a write timeout (the key goes with its lease).
        let stopped = front.kv.stopped();
        runtime.spawn(async move {
            tokio::select! {
                biased;
                () = stopped => {}
                taken = front.recipe_txn(txn) => if let Err(status) = taken {
                    tracing::debug!(%status, "a lock or election waiter's key was not taken back");
                },
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_named_as_clientv3_names_them() {
        let prefix = prefix_of(b"lock");
        assert_eq!(&prefix[..], b"lock/");
        assert_eq!(&own_key(&prefix, 0x694d_7a1c)[..], b"lock/694d7a1c");
        assert_eq!(&own_key(&prefix, -26)[..], b"lock/-1a");
        assert_eq!(&prefix_end(&prefix)[..], b"lock0");
        assert_eq!(&prefix_end(b"a\xff\xff")[..], b"b");
        assert_eq!(&prefix_end(b"\xff")[..], b"\0");
    }

    #[test]
    fn recipe_errors_reach_the_client_as_etcds_do() {
        let lease = etcd_error(errors::LEASE_NOT_FOUND, "lease 7");
        let answered = recipe_error(lease);
        assert_eq!(answered.code(), Code::Unknown);
        assert_eq!(answered.message(), errors::LEASE_NOT_FOUND.1);
        assert!(answered.metadata().get(errors::DETAIL_KEY).is_some());
    }
}
