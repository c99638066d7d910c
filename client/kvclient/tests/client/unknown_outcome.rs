//! Proves, against a fake Kv server that misbehaves on purpose: a write that
//! timed out after it was sent, one answered "outcome unknown", and one whose
//! session answer was forgotten (SESSION_EXPIRED) are all reported as
//! `Error::OutcomeUnknown`, never as failed; every retry of one write reuses
//! its session (same client id and sequence), and SESSION_EXPIRED is not
//! retried.

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
        self.sessions.lock().expect("lock").push(session);
        match self.mode {
            Mode::Hang => {
                tokio::time::sleep(Duration::from_secs(30)).await;
                Err(Status::internal("too late"))
            }
            Mode::Unknown => Err(with_detail(
                Code::Unavailable,
                pb::error_detail::Detail::OutcomeUnknown(pb::OutcomeUnknown {}),
            )),
            Mode::Expired => Err(with_detail(
                Code::Aborted,
                pb::error_detail::Detail::SessionExpired(pb::SessionExpired {
                    client_id: session.client_id,
                    sequence: session.sequence,
                }),
            )),
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
    for (mode, attempts, expect_calls) in [
        (Mode::Hang, 2, 2),
        (Mode::Unknown, 4, 4),
        (Mode::Expired, 4, 1),
    ] {
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
        let sequence = if matches!(mode, Mode::Expired) { 1 } else { 2 };
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
        if matches!(mode, Mode::Expired) {
            assert_ne!(client.client_id(), id, "a fresh id after SESSION_EXPIRED");
        } else {
            assert_eq!(client.client_id(), id);
        }
    }
}
