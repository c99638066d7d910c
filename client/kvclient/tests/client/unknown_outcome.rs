//! Proves, against a fake Kv server that misbehaves on purpose: a write that
//! timed out after it was sent, one answered "outcome unknown", and one whose
//! session answer was forgotten (SESSION_EXPIRED) are all reported as
//! `Error::OutcomeUnknown`, never as failed; every retry of one write reuses
//! its session (same client id and sequence), and SESSION_EXPIRED is not
//! retried under the same id (a write none of whose attempts may have
//! applied runs once more under a fresh id).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use kvclient::{Client, Error};
use kvproto::kv::v1 as pb;
use kvproto::kv::v1::kv_server::{Kv, KvServer};
use prost::Message;
use tokio::net::TcpListener;
use tonic::{Code, Request, Response, Status};

/// How the fake answers a put.
#[derive(Clone, Copy)]
enum Mode {
    /// Never answers in time.
    Hang,
    /// UNAVAILABLE with an `OutcomeUnknown` detail.
    Unknown,
    /// ABORTED with a `SessionExpired` detail.
    Expired,
    /// SESSION_EXPIRED for the first put, then success.
    ExpiredOnce,
    /// Outcome unknown for the first put, then SESSION_EXPIRED.
    UnknownThenExpired,
    /// No answer in time for the first put (the client gives the attempt
    /// up), then SESSION_EXPIRED.
    HangThenExpired,
}

#[derive(Clone)]
struct Fake {
    mode: Mode,
    sessions: Arc<Mutex<Vec<pb::Session>>>,
}

fn with_detail(code: Code, detail: pb::error_detail::Detail) -> Status {
    let mut status = Status::new(code, "fake");
    let bytes = pb::ErrorDetail {
        detail: Some(detail),
    }
    .encode_to_vec();
    status.metadata_mut().insert_bin(
        "raftcask-error-bin",
        tonic::metadata::MetadataValue::from_bytes(&bytes),
    );
    status
}

#[tonic::async_trait]
impl Kv for Fake {
    async fn get(&self, _: Request<pb::GetRequest>) -> Result<Response<pb::GetResponse>, Status> {
        Err(Status::unimplemented("fake"))
    }
    async fn put(
        &self,
        request: Request<pb::PutRequest>,
    ) -> Result<Response<pb::PutResponse>, Status> {
        let session = request.into_inner().session.unwrap_or_default();
        let call = {
            let mut sessions = self.sessions.lock().expect("lock");
            sessions.push(session);
            sessions.len()
        };
        let expired = || {
            with_detail(
                Code::Aborted,
                pb::error_detail::Detail::SessionExpired(pb::SessionExpired {
                    client_id: session.client_id,
                    sequence: session.sequence,
                }),
            )
        };
        let unknown = || {
            with_detail(
                Code::Unavailable,
                pb::error_detail::Detail::OutcomeUnknown(pb::OutcomeUnknown {}),
            )
        };
        match self.mode {
            Mode::ExpiredOnce if call == 1 => return Err(expired()),
            Mode::ExpiredOnce => {
                return Ok(Response::new(pb::PutResponse {
                    header: None,
                    outcome: Some(pb::put_response::Outcome::Seq(1 << 16)),
                }));
            }
            Mode::UnknownThenExpired if call == 1 => return Err(unknown()),
            Mode::UnknownThenExpired => return Err(expired()),
            Mode::HangThenExpired if call == 1 => {
                tokio::time::sleep(Duration::from_secs(30)).await;
                return Err(Status::internal("too late"));
            }
            Mode::HangThenExpired => return Err(expired()),
            _ => {}
        }
        match self.mode {
            Mode::Hang => {
                tokio::time::sleep(Duration::from_secs(30)).await;
                Err(Status::internal("too late"))
            }
            Mode::Unknown => Err(unknown()),
            Mode::Expired
            | Mode::ExpiredOnce
            | Mode::UnknownThenExpired
            | Mode::HangThenExpired => Err(expired()),
        }
    }
    async fn delete(
        &self,
        _: Request<pb::DeleteRequest>,
    ) -> Result<Response<pb::DeleteResponse>, Status> {
        Err(Status::unimplemented("fake"))
    }
    async fn expire(
        &self,
        _: Request<pb::ExpireRequest>,
    ) -> Result<Response<pb::ExpireResponse>, Status> {
        Err(Status::unimplemented("fake"))
    }
    async fn persist(
        &self,
        _: Request<pb::PersistRequest>,
    ) -> Result<Response<pb::PersistResponse>, Status> {
        Err(Status::unimplemented("fake"))
    }
    async fn scan(
        &self,
        _: Request<pb::ScanRequest>,
    ) -> Result<Response<pb::ScanResponse>, Status> {
        Err(Status::unimplemented("fake"))
    }
    async fn batch(
        &self,
        _: Request<pb::BatchRequest>,
    ) -> Result<Response<pb::BatchResponse>, Status> {
        Err(Status::unimplemented("fake"))
    }
    async fn range(
        &self,
        _: Request<pb::RangeRequest>,
    ) -> Result<Response<pb::RangeResponse>, Status> {
        Err(Status::unimplemented("fake"))
    }
    async fn delete_range(
        &self,
        _: Request<pb::DeleteRangeRequest>,
    ) -> Result<Response<pb::DeleteRangeResponse>, Status> {
        Err(Status::unimplemented("fake"))
    }
    async fn txn(&self, _: Request<pb::TxnRequest>) -> Result<Response<pb::TxnResponse>, Status> {
        Err(Status::unimplemented("fake"))
    }
    async fn compact(
        &self,
        _: Request<pb::CompactRequest>,
    ) -> Result<Response<pb::CompactResponse>, Status> {
        Err(Status::unimplemented("fake"))
    }
    type WatchStream = tokio_stream::Empty<Result<pb::WatchResponse, Status>>;
    async fn watch(
        &self,
        _: Request<tonic::Streaming<pb::WatchRequest>>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        Err(Status::unimplemented("fake"))
    }
    async fn lease_grant(
        &self,
        _: Request<pb::LeaseGrantRequest>,
    ) -> Result<Response<pb::LeaseGrantResponse>, Status> {
        Err(Status::unimplemented("fake"))
    }
    async fn lease_revoke(
        &self,
        _: Request<pb::LeaseRevokeRequest>,
    ) -> Result<Response<pb::LeaseRevokeResponse>, Status> {
        Err(Status::unimplemented("fake"))
    }
    type LeaseKeepAliveStream = tokio_stream::Empty<Result<pb::LeaseKeepAliveResponse, Status>>;
    async fn lease_keep_alive(
        &self,
        _: Request<tonic::Streaming<pb::LeaseKeepAliveRequest>>,
    ) -> Result<Response<Self::LeaseKeepAliveStream>, Status> {
        Err(Status::unimplemented("fake"))
    }
    async fn lease_time_to_live(
        &self,
        _: Request<pb::LeaseTimeToLiveRequest>,
    ) -> Result<Response<pb::LeaseTimeToLiveResponse>, Status> {
        Err(Status::unimplemented("fake"))
    }
    async fn lease_leases(
        &self,
        _: Request<pb::LeaseLeasesRequest>,
    ) -> Result<Response<pb::LeaseLeasesResponse>, Status> {
        Err(Status::unimplemented("fake"))
    }
}

/// Starts a fake on an ephemeral port; returns its address and the sessions
/// it saw. The server task ends with the test's runtime.
async fn fake(mode: Mode) -> (String, Arc<Mutex<Vec<pb::Session>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr").to_string();
    let sessions = Arc::new(Mutex::new(Vec::new()));
    let service = KvServer::new(Fake {
        mode,
        sessions: Arc::clone(&sessions),
    });
    tokio::spawn(async move {
        let incoming = tonic::transport::server::TcpIncoming::from(listener);
        let _ = tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming(incoming)
            .await;
    });
    (addr, sessions)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_fates_are_reported_as_outcome_unknown() {
    for (mode, attempts, expect_calls) in [(Mode::Hang, 2, 2), (Mode::Unknown, 4, 4)] {
        let (addr, sessions) = fake(mode).await;
        let client = Client::builder([addr])
            .request_timeout(Duration::from_millis(300))
            .attempts(attempts)
            .build()
            .expect("client");
        // A first write to move the sequence past 1 (after SESSION_EXPIRED
        // the client moves to a fresh id, whose first sequence is 1).
        let _ = client.put("k0", "v").await;
        sessions.lock().expect("lock").clear();
        let id = client.client_id();
        let result = client.put("k", "v").await;
        assert!(
            matches!(result, Err(Error::OutcomeUnknown { .. })),
            "{result:?}"
        );
        let sequence = 2;
        let seen = sessions.lock().expect("lock").clone();
        assert_eq!(seen.len(), expect_calls, "{seen:?}");
        for s in &seen {
            assert_eq!(s.client_id, id);
            assert_eq!(s.sequence, sequence, "every retry reuses the sequence");
            assert_eq!(
                s.lowest_unacked_sequence, sequence,
                "earlier ones were given up"
            );
            assert!(
                s.opens,
                "no answer arrived for this id: the write opens its session"
            );
        }
        assert_eq!(client.client_id(), id);
    }
}

/// One put against a fake in `mode`: the client id it began with, the
/// result, and the sessions the fake saw; and the client.
async fn one_put(
    mode: Mode,
) -> (
    u64,
    kvclient::Result<kvclient::Written>,
    Vec<pb::Session>,
    Client,
) {
    let (addr, sessions) = fake(mode).await;
    let client = Client::builder([addr])
        .request_timeout(Duration::from_millis(300))
        .attempts(4)
        .build()
        .expect("client");
    let id = client.client_id();
    let result = client.put("k", "v").await;
    let seen = sessions.lock().expect("lock").clone();
    (id, result, seen, client)
}

/// SESSION_EXPIRED is not retried under the same id: the write is run once
/// more under a fresh id only when no attempt of it may have applied, and
/// reported outcome unknown when that is refused too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_expired_is_never_retried_under_the_same_id() {
    let (id, result, seen, client) = one_put(Mode::Expired).await;
    assert!(
        matches!(result, Err(Error::OutcomeUnknown { .. })),
        "{result:?}"
    );
    assert_eq!(seen.len(), 2, "one attempt per id: {seen:?}");
    assert_eq!((seen[0].client_id, seen[0].sequence), (id, 1));
    assert_ne!(seen[1].client_id, id, "the second run has a fresh id");
    assert_eq!(seen[1].sequence, 1);
    assert!(seen.iter().all(|s| s.opens));
    assert_ne!(client.client_id(), seen[1].client_id);
}

/// A client idle past the session window: its session was evicted, the
/// write's only attempt is refused SESSION_EXPIRED and certainly did not
/// apply, so the client runs it again under a fresh id and succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_refused_before_it_could_apply_runs_again_under_a_fresh_id() {
    let (id, written, seen, client) = one_put(Mode::ExpiredOnce).await;
    assert!(written.is_ok(), "{written:?}");
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert_eq!(seen[0].client_id, id);
    assert_ne!(seen[1].client_id, id);
    assert!(
        seen[1].opens,
        "the fresh id's first write opens its session"
    );
    assert_eq!(client.client_id(), seen[1].client_id);
}

/// With `rerun_after_expiry(false)` the same refusal is reported outcome
/// unknown and nothing runs again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_rerun_after_expiry_when_turned_off() {
    let (addr, sessions) = fake(Mode::ExpiredOnce).await;
    let client = Client::builder([addr])
        .request_timeout(Duration::from_millis(300))
        .attempts(4)
        .rerun_after_expiry(false)
        .build()
        .expect("client");
    let result = client.put("k", "v").await;
    assert!(
        matches!(result, Err(Error::OutcomeUnknown { .. })),
        "{result:?}"
    );
    assert_eq!(sessions.lock().expect("lock").len(), 1);
}

/// An attempt that may have applied before the expiry (answered "outcome
/// unknown", or given up by the client's per-attempt timeout while the
/// server held it): the outcome is unknown, and the write is not run again
/// under a fresh id. The timed-out case is the one the fault suite's
/// exactly-once scenario caught applying twice: the leader applied the
/// first attempt and was killed before answering, the slow retry found the
/// session evicted, and the write ran again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expiry_after_an_attempt_that_may_have_applied_is_outcome_unknown() {
    for mode in [Mode::UnknownThenExpired, Mode::HangThenExpired] {
        let (id, result, seen, _client) = one_put(mode).await;
        assert!(
            matches!(result, Err(Error::OutcomeUnknown { .. })),
            "{result:?}"
        );
        assert_eq!(seen.len(), 2, "{seen:?}");
        assert!(seen.iter().all(|s| s.client_id == id && s.sequence == 1));
    }
}
