//! etcd's `Lease` service over the native lease commands. etcd counts
//! seconds where raftcask counts milliseconds: a grant of `TTL` seconds is
//! a native grant of `TTL × 1000` ms (raised to `LEASE_TTL_MS_MIN`, 2 s, as
//! etcd raises a TTL below its minimum), and every TTL answered is whole
//! seconds, rounded down as etcd rounds them (a lease granted 30 s reads
//! `remaining 29` a moment later).
//!
//! Grant and revoke are writes down [`KvService::write_from_front_end`]
//! (forwarded by a follower). A keep-alive stream is served by any member:
//! on the leader each renewal goes to the member's renewal coalescer (many
//! keep-alives share one Raft entry), on a follower each is forwarded to
//! the leader as one renewal write. Answers come in request order; a
//! renewal of a lease that no longer exists answers TTL 0, as etcd's.

use std::pin::Pin;

use kvproto::etcd::etcdserverpb::lease_server::Lease;
use kvproto::etcd::etcdserverpb::{
    LeaseGrantRequest, LeaseGrantResponse, LeaseKeepAliveRequest, LeaseKeepAliveResponse,
    LeaseLeasesRequest, LeaseLeasesResponse, LeaseRevokeRequest, LeaseRevokeResponse, LeaseStatus,
    LeaseTimeToLiveRequest, LeaseTimeToLiveResponse,
};
use kvproto::kv::v1 as native;
use kvstate::command::{LeaseRequest, Outcome};
use kvstate::lease::{LEASE_TTL_MS_MAX, LeaseAnswer, LeaseOp};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_stream::Stream;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use super::errors::{self, etcd_error, to_etcd};
use super::{EtcdFrontEnd, revision_i64};
use crate::server::lease::LEASE_STREAM_IN_FLIGHT_MAX;

/// Milliseconds in one of etcd's TTL seconds.
const MS_PER_SECOND: u64 = 1000;
/// Answers buffered for a keep-alive stream's client.
const KEEP_ALIVE_RESPONSES_BUFFERED: usize = 64;

/// The response stream of `Lease.LeaseKeepAlive`.
pub type KeepAliveStream =
    Pin<Box<dyn Stream<Item = Result<LeaseKeepAliveResponse, Status>> + Send>>;

/// Whole seconds of `ms`, rounded down (etcd's `int64(d.Seconds())`).
fn seconds(ms: u64) -> i64 {
    revision_i64(ms / MS_PER_SECOND)
}

impl EtcdFrontEnd {
    /// One lease command down the front ends' write path.
    async fn lease_write(&self, op: LeaseOp) -> Result<(LeaseAnswer, u64), Status> {
        let (answer, _) = self
            .kv
            .write_from_front_end(LeaseRequest { session: None, op }.into())
            .await
            .map_err(to_etcd)?;
        match answer.outcome {
            Outcome::Lease(lease) => Ok((lease, answer.revision)),
            other => Err(crate::server::kv::unexpected(other)),
        }
    }

    /// Renews lease `id`: its TTL in ms, 0 = there is no such lease.
    async fn renew(&self, id: u64) -> Result<u64, Status> {
        if self.kv.require_leader().is_ok() {
            match self.kv.renewals().renew(id).await {
                Ok(Ok(ttl_ms)) => return Ok(ttl_ms),
                // Lost leadership meanwhile: forward it instead.
                Ok(Err(status)) if status.code() == tonic::Code::FailedPrecondition => {}
                Ok(Err(status)) => return Err(to_etcd(status)),
                Err(_) => return Err(etcd_error(errors::STOPPED, "the member is stopping")),
            }
        }
        match self.lease_write(LeaseOp::Renew { ids: vec![id] }).await? {
            (LeaseAnswer::Renewed { ttls_ms }, _) => Ok(ttls_ms.first().copied().unwrap_or(0)),
            (other, _) => Err(Status::internal(format!(
                "a renewal was answered {other:?}"
            ))),
        }
    }

    /// Reads a stream's keep-alives; each renewal runs in its own task,
    /// answered in request order by [`EtcdFrontEnd::answer_keep_alives`].
    async fn run_keep_alive(
        self,
        mut requests: Streaming<LeaseKeepAliveRequest>,
        out: mpsc::Sender<Result<LeaseKeepAliveResponse, Status>>,
    ) {
        let (pending, renewals) = mpsc::channel(LEASE_STREAM_IN_FLIGHT_MAX);
        let answering = tokio::spawn(self.clone().answer_keep_alives(renewals, out.clone()));
        loop {
            let request = tokio::select! {
                request = requests.message() => request,
                () = out.closed() => break,
            };
            let id = match request {
                Ok(Some(request)) => request.id,
                // The client closed its side (or went): answer what it sent.
                Ok(None) | Err(_) => break,
            };
            let front_end = self.clone();
            let renewal: JoinHandle<Result<u64, Status>> = tokio::spawn(async move {
                match u64::try_from(id) {
                    Ok(id) => front_end.renew(id).await,
                    // No lease has a negative id: etcd answers TTL 0.
                    Err(_) => Ok(0),
                }
            });
            if pending.send((id, renewal)).await.is_err() {
                break;
            }
        }
        drop(pending);
        let _ = answering.await;
    }

    /// Answers a stream's renewals in request order. It takes the next
    /// renewal off `renewals` only once the previous one is answered, so
    /// the channel's capacity ([`LEASE_STREAM_IN_FLIGHT_MAX`]) is what one
    /// stream has in flight at most: beyond it [`Self::run_keep_alive`]
    /// reads no further keep-alive (on a follower each is a forwarded
    /// renewal write, so this caps what one client can queue there).
    async fn answer_keep_alives(
        self,
        mut renewals: mpsc::Receiver<(i64, JoinHandle<Result<u64, Status>>)>,
        out: mpsc::Sender<Result<LeaseKeepAliveResponse, Status>>,
    ) {
        while let Some((id, renewal)) = renewals.recv().await {
            let answer = match renewal.await {
                Ok(Ok(ttl_ms)) => Ok(LeaseKeepAliveResponse {
                    header: Some(self.header()),
                    id,
                    ttl: seconds(ttl_ms),
                }),
                Ok(Err(status)) => Err(status),
                Err(_) => Err(etcd_error(errors::STOPPED, "the renewal's task ended")),
            };
            let failed = answer.is_err();
            if out.send(answer).await.is_err() || failed {
                return;
            }
        }
    }
}

#[tonic::async_trait]
impl Lease for EtcdFrontEnd {
    async fn lease_grant(
        &self,
        request: Request<LeaseGrantRequest>,
    ) -> Result<Response<LeaseGrantResponse>, Status> {
        let request = request.into_inner();
        let ttl_seconds = super::non_negative(request.ttl);
        if ttl_seconds > LEASE_TTL_MS_MAX / MS_PER_SECOND {
            return Err(etcd_error(
                errors::LEASE_TTL_TOO_LARGE,
                &format!(
                    "field `TTL` is {ttl_seconds} s, above LEASE_TTL_MS_MAX ({LEASE_TTL_MS_MAX} ms)"
                ),
            ));
        }
        let Ok(id) = u64::try_from(request.id) else {
            return Err(Status::invalid_argument(format!(
                "field `ID` is {}: a lease id is positive (0 = the server picks one)",
                request.id
            )));
        };
        let (answer, revision) = self
            .lease_write(LeaseOp::Grant {
                id,
                ttl_ms: ttl_seconds * MS_PER_SECOND,
            })
            .await?;
        match answer {
            LeaseAnswer::Granted { id, ttl_ms } => Ok(Response::new(LeaseGrantResponse {
                header: Some(self.write_header(revision)),
                id: revision_i64(id),
                ttl: seconds(ttl_ms),
                error: String::new(),
            })),
            other => Err(Status::internal(format!("a grant was answered {other:?}"))),
        }
    }

    async fn lease_revoke(
        &self,
        request: Request<LeaseRevokeRequest>,
    ) -> Result<Response<LeaseRevokeResponse>, Status> {
        let id = request.into_inner().id;
        let Ok(id) = u64::try_from(id) else {
            return Err(etcd_error(
                errors::LEASE_NOT_FOUND,
                &format!("field `ID` is {id}: lease ids are positive"),
            ));
        };
        let (answer, revision) = self.lease_write(LeaseOp::Revoke { id }).await?;
        match answer {
            LeaseAnswer::Revoked { .. } => Ok(Response::new(LeaseRevokeResponse {
                header: Some(self.write_header(revision)),
            })),
            other => Err(Status::internal(format!("a revoke was answered {other:?}"))),
        }
    }

    type LeaseKeepAliveStream = KeepAliveStream;

    async fn lease_keep_alive(
        &self,
        request: Request<Streaming<LeaseKeepAliveRequest>>,
    ) -> Result<Response<KeepAliveStream>, Status> {
        let (out, responses) = mpsc::channel(KEEP_ALIVE_RESPONSES_BUFFERED);
        tokio::spawn(self.clone().run_keep_alive(request.into_inner(), out));
        Ok(Response::new(Box::pin(ReceiverStream::new(responses))))
    }

    async fn lease_time_to_live(
        &self,
        request: Request<LeaseTimeToLiveRequest>,
    ) -> Result<Response<LeaseTimeToLiveResponse>, Status> {
        let request = request.into_inner();
        let Ok(id) = u64::try_from(request.id) else {
            return Ok(Response::new(LeaseTimeToLiveResponse {
                header: Some(self.header()),
                id: request.id,
                ttl: -1,
                ..Default::default()
            }));
        };
        let answer = self
            .kv
            .lease_time_to_live(native::LeaseTimeToLiveRequest {
                id,
                keys: request.keys,
                consistency: native::Consistency::Linearizable as i32,
            })
            .await
            .map_err(to_etcd)?;
        Ok(Response::new(LeaseTimeToLiveResponse {
            header: EtcdFrontEnd::header_of(answer.header),
            id: request.id,
            ttl: if answer.ttl_ms < 0 {
                -1
            } else {
                seconds(answer.ttl_ms.unsigned_abs())
            },
            granted_ttl: seconds(answer.granted_ttl_ms),
            keys: answer.keys,
        }))
    }

    async fn lease_leases(
        &self,
        _request: Request<LeaseLeasesRequest>,
    ) -> Result<Response<LeaseLeasesResponse>, Status> {
        let answer = self
            .kv
            .lease_list(native::LeaseLeasesRequest {
                consistency: native::Consistency::Linearizable as i32,
            })
            .await
            .map_err(to_etcd)?;
        Ok(Response::new(LeaseLeasesResponse {
            header: EtcdFrontEnd::header_of(answer.header),
            leases: answer
                .leases
                .into_iter()
                .map(|lease| LeaseStatus {
                    id: revision_i64(lease.id),
                })
                .collect(),
        }))
    }
}
