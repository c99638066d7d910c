//! Leases on the wire (`Kv.LeaseGrant`, `LeaseRevoke`, `LeaseKeepAlive`,
//! `LeaseTimeToLive`, `LeaseLeases`) and the leader's renewal coalescer.
//!
//! Grants and revokes are writes (through the batcher, exactly once with a
//! session). Keep-alives come on a stream to the leader; each one is handed
//! to the member's [`Renewals`] task, which gathers the renewals that
//! arrive within [`LEASE_RENEW_INTERVAL`] of the previous proposal into
//! one `LeaseOp::Renew` write (at most `LEASE_RENEW_IDS_MAX` leases), so
//! ten thousand leases renewed every second cost about ten entries a
//! second. A keep-alive is answered only once its renewal applied: the
//! renewal is then in the log, stamped after the keep-alive was sent,
//! which is what the lease promise rests on (`kvstate::lease`). Renewals
//! whose callers have all gone are not proposed. Time-to-live and listing
//! are reads of the applied state at the asked consistency.

use std::collections::{BTreeMap, VecDeque};
use std::pin::Pin;
use std::time::Duration;

use kvproto::kv::v1::{
    LeaseGrantRequest, LeaseGrantResponse, LeaseKeepAliveRequest, LeaseKeepAliveResponse,
    LeaseLeasesRequest, LeaseLeasesResponse, LeaseRevokeRequest, LeaseRevokeResponse, LeaseStatus,
    LeaseTimeToLiveRequest, LeaseTimeToLiveResponse,
};
use kvstate::command::{LeaseRequest, Outcome};
use kvstate::lease::{LEASE_ID_MAX, LEASE_RENEW_IDS_MAX, LEASE_TTL_MS_MAX, LeaseAnswer, LeaseOp};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tokio_stream::Stream;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Status, Streaming};

use crate::server::convert;
use crate::server::kv::{KvService, session};

// The wire's lease constants are kvstate's (kvstate does not link the
// protocol).
const _: () = assert!(kvproto::LEASE_TTL_MS_MIN == kvstate::lease::LEASE_TTL_MS_MIN);
const _: () = assert!(kvproto::LEASE_TTL_MS_MAX == LEASE_TTL_MS_MAX);
const _: () = assert!(kvproto::LEASE_ID_MAX == LEASE_ID_MAX);

/// Renewals arriving within this of the previous renewal entry share the
/// next one: at most ten renewal entries a second per member, whatever the
/// number of keep-alives. A keep-alive after a quiet interval is proposed
/// at once.
pub const LEASE_RENEW_INTERVAL: Duration = Duration::from_millis(100);
/// Keep-alives waiting for a renewal entry on one member at most; beyond
/// it a keep-alive is answered RESOURCE_EXHAUSTED.
pub const LEASE_RENEWALS_QUEUED_MAX: usize = 100_000;
/// Keep-alives of one stream waiting for their answers at most: the stream
/// reads no further request until the oldest is answered.
pub const LEASE_STREAM_IN_FLIGHT_MAX: usize = 16_384;
/// Bytes of attached keys a `LeaseTimeToLive` with `keys` lists at most
/// (a lease may hold `LEASE_KEYS_MAX` keys of up to 4 KiB): beyond it the
/// request is refused naming this limit; list the keys with a range read.
pub const LEASE_KEYS_LISTED_BYTES_MAX: usize = 4 * 1024 * 1024;
/// Answers buffered for a keep-alive stream's client.
const LEASE_STREAM_RESPONSES_BUFFERED: usize = 1024;

/// The response stream `Kv.LeaseKeepAlive` returns.
pub type KeepAliveStream =
    Pin<Box<dyn Stream<Item = Result<LeaseKeepAliveResponse, Status>> + Send>>;

/// A renewal's answer: the lease's TTL in ms (0 = no such lease).
type RenewReply = oneshot::Sender<Result<u64, Status>>;

/// The member's renewal coalescer (see the module doc).
#[derive(Clone, Debug)]
pub struct Renewals {
    queue: mpsc::Sender<(u64, RenewReply)>,
}

impl Renewals {
    /// Starts the coalescer, proposing through `service`; it stops with
    /// the service's shutdown.
    pub(crate) fn start(service: KvService) -> Renewals {
        let (queue, incoming) = mpsc::channel(LEASE_RENEWALS_QUEUED_MAX);
        tokio::spawn(run_renewals(service, incoming));
        Renewals { queue }
    }

    /// Asks for lease `id` to be renewed; the receiver gets its TTL once
    /// the renewal applied.
    pub(crate) fn renew(&self, id: u64) -> oneshot::Receiver<Result<u64, Status>> {
        let (reply, answer) = oneshot::channel();
        if let Err(mpsc::error::TrySendError::Full((_, reply))) = self.queue.try_send((id, reply)) {
            let _ = reply.send(Err(Status::resource_exhausted(format!(
                "LEASE_RENEWALS_QUEUED_MAX ({LEASE_RENEWALS_QUEUED_MAX}) keep-alives wait for a \
                 renewal on this member; retry"
            ))));
        }
        answer
    }
}

/// Keep-alives waiting for a renewal entry, by lease, in the order their
/// leases first came (each renewal entry takes the oldest: no lease waits
/// behind ids that keep coming).
#[derive(Default)]
struct Pending {
    replies: BTreeMap<u64, Vec<RenewReply>>,
    order: VecDeque<u64>,
    waiting: usize,
}

impl Pending {
    fn add(&mut self, id: u64, reply: RenewReply) {
        let replies = self.replies.entry(id).or_default();
        if replies.is_empty() {
            self.order.push_back(id);
        }
        replies.push(reply);
        self.waiting += 1;
    }

    fn is_empty(&self) -> bool {
        self.replies.is_empty()
    }

    /// Whether it may take more keep-alives ([`LEASE_RENEWALS_QUEUED_MAX`];
    /// beyond it they stay in the channel, and new ones are refused).
    fn has_room(&self) -> bool {
        self.waiting < LEASE_RENEWALS_QUEUED_MAX
    }

    /// The oldest ids whose callers are still there, at most
    /// `LEASE_RENEW_IDS_MAX`; callers that gave up are dropped.
    fn take_ids(&mut self) -> Vec<u64> {
        let mut ids = Vec::new();
        while ids.len() < LEASE_RENEW_IDS_MAX
            && let Some(id) = self.order.pop_front()
        {
            let Some(replies) = self.replies.get_mut(&id) else {
                continue;
            };
            let before = replies.len();
            replies.retain(|reply| !reply.is_closed());
            self.waiting -= before - replies.len();
            if replies.is_empty() {
                self.replies.remove(&id);
            } else {
                ids.push(id);
            }
        }
        ids
    }

    /// The replies waiting for `id`.
    fn remove(&mut self, id: u64) -> Vec<RenewReply> {
        let replies = self.replies.remove(&id).unwrap_or_default();
        self.waiting -= replies.len();
        replies
    }
}

async fn run_renewals(service: KvService, mut incoming: mpsc::Receiver<(u64, RenewReply)>) {
    let mut pending = Pending::default();
    let mut next_at = Instant::now();
    let stop = service.stopped();
    tokio::pin!(stop);
    // NEGATIVE CONTROL (feature nc-lease-leader-memory): keep-alives are
    // answered from this member's memory; renewals reach the log only
    // shortly before a lease would expire.
    let leader_memory = cfg!(feature = "nc-lease-leader-memory");
    let mut memory = nc::Memory::default();
    loop {
        if pending.is_empty() {
            tokio::select! {
                renewal = incoming.recv() => match renewal {
                    Some((id, reply)) => pending.add(id, reply),
                    None => return,
                },
                () = tokio::time::sleep(crate::node::TICK_INTERVAL), if leader_memory => {}
                () = &mut stop => return,
            }
        }
        if leader_memory {
            memory.answer(&service, &mut pending).await;
            memory.flush(&service).await;
            continue;
        }
        let deadline = next_at.max(Instant::now());
        loop {
            let room = pending.has_room();
            tokio::select! {
                renewal = incoming.recv(), if room => match renewal {
                    Some((id, reply)) => pending.add(id, reply),
                    None => return,
                },
                () = tokio::time::sleep_until(deadline) => break,
                () = &mut stop => return,
            }
        }
        let ids = pending.take_ids();
        if ids.is_empty() {
            continue;
        }
        next_at = Instant::now() + LEASE_RENEW_INTERVAL;
        let answered = renew_now(&service, ids.clone()).await;
        for (position, id) in ids.iter().enumerate() {
            for reply in pending.remove(*id) {
                let _ = reply.send(match &answered {
                    Ok(ttls) => Ok(ttls.get(position).copied().unwrap_or(0)),
                    Err(status) => Err(status.clone()),
                });
            }
        }
    }
}

/// Proposes one renewal of `ids`: each one's TTL (0 = no such lease).
async fn renew_now(service: &KvService, ids: Vec<u64>) -> Result<Vec<u64>, Status> {
    let renewals = ids.len() as u64;
    let request = LeaseRequest {
        session: None,
        op: LeaseOp::Renew { ids },
    };
    // A renewal is proposed even when the disk is low on space: refusing
    // it would expire leases, and it writes a few bytes per lease.
    let answer = service.write_essential(request).await?;
    if let Some(metrics) = service.metrics() {
        metrics.lease_renewal_entry(renewals);
    }
    match answer.outcome {
        Outcome::Lease(LeaseAnswer::Renewed { ttls_ms }) => Ok(ttls_ms),
        other => Err(Status::internal(format!(
            "a renewal was answered {other:?}"
        ))),
    }
}

impl KvService {
    pub(crate) async fn grant_lease(
        &self,
        request: LeaseGrantRequest,
    ) -> Result<LeaseGrantResponse, Status> {
        if request.ttl_ms > LEASE_TTL_MS_MAX {
            return Err(convert::limit_exceeded(
                "LEASE_TTL_MS_MAX (ttl_ms)",
                LEASE_TTL_MS_MAX,
                request.ttl_ms,
            ));
        }
        if request.id > LEASE_ID_MAX {
            return Err(convert::limit_exceeded(
                "LEASE_ID_MAX (id)",
                LEASE_ID_MAX,
                request.id,
            ));
        }
        let answer = self
            .write_lease(LeaseRequest {
                session: session(request.session),
                op: LeaseOp::Grant {
                    id: request.id,
                    ttl_ms: request.ttl_ms,
                },
            })
            .await?;
        match answer.outcome {
            Outcome::Lease(LeaseAnswer::Granted { id, ttl_ms }) => Ok(LeaseGrantResponse {
                header: Some(self.write_header(answer.revision)),
                id,
                ttl_ms,
            }),
            other => Err(crate::server::kv::unexpected(other)),
        }
    }

    pub(crate) async fn revoke_lease(
        &self,
        request: LeaseRevokeRequest,
    ) -> Result<LeaseRevokeResponse, Status> {
        // A revoke frees space: allowed when the disk is low.
        let answer = self
            .write_essential(LeaseRequest {
                session: session(request.session),
                op: LeaseOp::Revoke { id: request.id },
            })
            .await?;
        match answer.outcome {
            Outcome::Lease(LeaseAnswer::Revoked { deleted }) => Ok(LeaseRevokeResponse {
                header: Some(self.write_header(answer.revision)),
                deleted,
            }),
            other => Err(crate::server::kv::unexpected(other)),
        }
    }

    pub(crate) async fn lease_time_to_live(
        &self,
        request: LeaseTimeToLiveRequest,
    ) -> Result<LeaseTimeToLiveResponse, Status> {
        let consistency = crate::server::kv::consistency_of(request.consistency)?;
        self.prepare_read(consistency, 0).await?;
        let state_machine = self.state_machine().clone();
        let (id, keys) = (request.id, request.keys);
        let found = tokio::task::spawn_blocking(move || {
            state_machine.with_leases(|leases, now_ms| {
                let lease = leases.get(id)?;
                let expiry = leases.expiry_ms(id).unwrap_or(0);
                let keys = if keys {
                    leases.keys_of_within(id, LEASE_KEYS_LISTED_BYTES_MAX)
                } else {
                    Ok(Vec::new())
                };
                Some((lease.ttl_ms, expiry.saturating_sub(now_ms), keys))
            })
        })
        .await
        .map_err(|err| Status::internal(format!("lease read: {err}")))?;
        let header = Some(self.read_header());
        let found = match found {
            Some((granted, remaining, Ok(keys))) => Some((granted, remaining, keys)),
            Some((_, _, Err(bytes))) => {
                return Err(convert::limit_exceeded(
                    "LEASE_KEYS_LISTED_BYTES_MAX (keys)",
                    LEASE_KEYS_LISTED_BYTES_MAX as u64,
                    bytes as u64,
                ));
            }
            None => None,
        };
        Ok(match found {
            Some((granted, remaining, keys)) => LeaseTimeToLiveResponse {
                header,
                id,
                ttl_ms: i64::try_from(remaining).unwrap_or(i64::MAX),
                granted_ttl_ms: granted,
                keys: keys.into_iter().map(Into::into).collect(),
            },
            None => LeaseTimeToLiveResponse {
                header,
                id,
                ttl_ms: -1,
                granted_ttl_ms: 0,
                keys: Vec::new(),
            },
        })
    }

    pub(crate) async fn lease_list(
        &self,
        request: LeaseLeasesRequest,
    ) -> Result<LeaseLeasesResponse, Status> {
        let consistency = crate::server::kv::consistency_of(request.consistency)?;
        self.prepare_read(consistency, 0).await?;
        let state_machine = self.state_machine().clone();
        let ids = tokio::task::spawn_blocking(move || {
            state_machine.with_leases(|leases, _| leases.ids())
        })
        .await
        .map_err(|err| Status::internal(format!("lease read: {err}")))?;
        Ok(LeaseLeasesResponse {
            header: Some(self.read_header()),
            leases: ids.into_iter().map(|id| LeaseStatus { id }).collect(),
        })
    }

    /// Serves one keep-alive stream (leader only).
    pub(crate) fn keep_alive(
        &self,
        requests: Streaming<LeaseKeepAliveRequest>,
    ) -> Result<KeepAliveStream, Status> {
        self.require_leader()?;
        let (out, responses) = mpsc::channel(LEASE_STREAM_RESPONSES_BUFFERED);
        let service = self.clone();
        let renewals = self.renewals();
        tokio::spawn(async move {
            let result = service.run_keep_alive(requests, &renewals, &out).await;
            if let Err(status) = result {
                let _ = out.send(Err(status)).await;
            }
        });
        Ok(Box::pin(ReceiverStream::new(responses)))
    }

    /// Answers a stream's keep-alives in the order they came, each once
    /// its renewal applied; ends when the client goes, the member stops or
    /// a renewal fails (this member lost leadership, say).
    async fn run_keep_alive(
        &self,
        mut requests: Streaming<LeaseKeepAliveRequest>,
        renewals: &Renewals,
        out: &mpsc::Sender<Result<LeaseKeepAliveResponse, Status>>,
    ) -> Result<(), Status> {
        let mut waiting: VecDeque<(u64, oneshot::Receiver<Result<u64, Status>>)> = VecDeque::new();
        let mut reading = true;
        let stop = self.stopped();
        tokio::pin!(stop);
        loop {
            let room = waiting.len() < LEASE_STREAM_IN_FLIGHT_MAX;
            let front = async {
                match waiting.front_mut() {
                    Some((_, answer)) => answer.await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                request = requests.message(), if reading && room => {
                    match request {
                        Ok(Some(request)) => {
                            if let Some(metrics) = self.metrics() {
                                metrics.lease_keep_alive();
                            }
                            waiting.push_back((request.id, renewals.renew(request.id)));
                        }
                        // The client closed its side: answer what it sent.
                        Ok(None) | Err(_) => reading = false,
                    }
                }
                answer = front => {
                    let (id, _) = waiting.pop_front().expect("awaited the front");
                    // One header for every answer ready now (building one
                    // takes the apply lock): a renewal entry answers many.
                    let header = self.write_header(self.state_machine().revision());
                    let mut ready = vec![(id, answer.map_err(|_| ()))];
                    while let Some((_, next)) = waiting.front_mut() {
                        match next.try_recv() {
                            Ok(answer) => {
                                let (id, _) = waiting.pop_front().expect("just seen");
                                ready.push((id, Ok(answer)));
                            }
                            Err(oneshot::error::TryRecvError::Empty) => break,
                            Err(oneshot::error::TryRecvError::Closed) => {
                                let (id, _) = waiting.pop_front().expect("just seen");
                                ready.push((id, Err(())));
                            }
                        }
                    }
                    for (id, answer) in ready {
                        let ttl_ms = match answer {
                            Ok(Ok(ttl_ms)) => ttl_ms,
                            Ok(Err(status)) => return Err(status),
                            Err(_) => return Err(Status::unavailable("the member is stopping")),
                        };
                        let response = LeaseKeepAliveResponse {
                            header: Some(header),
                            id,
                            ttl_ms,
                        };
                        if out.send(Ok(response)).await.is_err() {
                            return Ok(());
                        }
                    }
                }
                () = out.closed() => return Ok(()),
                () = &mut stop => {
                    return Err(Status::unavailable(
                        "the member is stopping; keep the lease alive on the new leader",
                    ));
                }
            }
            if !reading && waiting.is_empty() {
                return Ok(());
            }
        }
    }
}

/// NEGATIVE CONTROL (feature nc-lease-leader-memory): the leader's memory of
/// renewals, flushed to the log only near a lease's expiry (used only in
/// that build).
mod nc {
    use std::collections::BTreeSet;

    use super::*;

    /// How close to its expiry (ms of cluster time) a lease renewed in
    /// memory gets its renewal written.
    const FLUSH_MARGIN_MS: u64 = 750;

    #[derive(Default)]
    pub(super) struct Memory {
        renewed: BTreeSet<u64>,
    }

    impl Memory {
        /// Answers the waiting keep-alives at once from the applied leases.
        pub(super) async fn answer(&mut self, service: &KvService, pending: &mut Pending) {
            let ids: Vec<u64> = pending.replies.keys().copied().collect();
            let state_machine = service.state_machine().clone();
            let ttls = tokio::task::spawn_blocking(move || {
                state_machine.with_leases(|leases, _| {
                    ids.iter()
                        .map(|id| (*id, leases.get(*id).map_or(0, |lease| lease.ttl_ms)))
                        .collect::<Vec<_>>()
                })
            })
            .await
            .unwrap_or_default();
            for (id, ttl_ms) in ttls {
                if ttl_ms != 0 {
                    self.renewed.insert(id);
                }
                for reply in pending.remove(id) {
                    let _ = reply.send(Ok(ttl_ms));
                }
                pending.order.retain(|queued| *queued != id);
            }
        }

        /// Writes the renewals of leases close to their expiry; forgets
        /// everything when this member is not the leader.
        pub(super) async fn flush(&mut self, service: &KvService) {
            if service.require_leader().is_err() {
                self.renewed.clear();
                return;
            }
            let renewed: Vec<u64> = self.renewed.iter().copied().collect();
            let state_machine = service.state_machine().clone();
            let due = tokio::task::spawn_blocking(move || {
                state_machine.with_leases(|leases, now_ms| {
                    renewed
                        .into_iter()
                        .filter(|id| {
                            leases.expiry_ms(*id).is_some_and(|expiry| {
                                expiry.saturating_sub(now_ms) <= FLUSH_MARGIN_MS
                            })
                        })
                        .collect::<Vec<_>>()
                })
            })
            .await
            .unwrap_or_default();
            if due.is_empty() {
                return;
            }
            for id in &due {
                self.renewed.remove(id);
            }
            // In the background: a leader cut off from its quorum keeps
            // answering keep-alives from memory while its flush waits.
            let service = service.clone();
            tokio::spawn(async move {
                let _ = renew_now(&service, due).await;
            });
        }
    }
}
