//! Keeping leases alive: the [`LeaseKeeper`] handle that
//! [`Client::keep_alive`](crate::Client::keep_alive) returns, and the one
//! background task per client (the lessor, as etcd's clientv3 calls it)
//! that renews every kept lease over one `Kv.LeaseKeepAlive` stream to the
//! leader.
//!
//! **Cadence.** Each lease is renewed every third of its TTL, counted from
//! the previous send (etcd's clientv3 does the same), so one TTL holds
//! three tries. Requests go out as they fall due, up to
//! [`KEEP_ALIVE_REQUESTS_BUFFERED`] waiting for the stream and
//! [`KEEP_ALIVE_IN_FLIGHT_MAX`] unanswered per lease.
//!
//! **Following the leader.** The stream goes to the cached leader. A
//! member that is not the leader (or stops being it) ends the stream with a
//! `NotLeader` hint, which the router follows; a stream that fails, ends,
//! or leaves a renewal unanswered for a third of the lease's TTL (at least
//! [`KEEP_ALIVE_ANSWER_TIMEOUT_MIN`], at most the request timeout: a leader
//! cut off from its quorum accepts renewals it cannot apply) is dropped,
//! and the lessor opens another after a backoff, renewing at once every
//! lease whose renewal went unanswered.
//!
//! **Loss.** A lease is lost, reported once to its handles
//! ([`LeaseKeeper::lost`]) and no longer renewed, when
//! - the cluster answers a renewal with TTL 0: it expired or was revoked
//!   ([`LeaseLoss::Gone`]);
//! - no renewal was acknowledged for a whole TTL: from `sent + TTL -
//!   LEASE_EARLY_BOUND_MS` of the last acknowledged renewal on, the
//!   cluster no longer promises the lease is alive
//!   ([`LeaseLoss::Unrenewed`]);
//! - the cluster refused the stream in a way retrying cannot fix
//!   ([`LeaseLoss::Failed`]).
//!
//! After a loss nothing renews the lease again, even if it turns out to
//! live: an owner that may have lost its lease must not carry on as if it
//! held it (it grants a new one). Dropping the last handle of a lease stops
//! its renewals without revoking it (it expires a TTL later); when no lease
//! is kept, the task ends and the stream closes.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use kvproto::LEASE_EARLY_BOUND_MS;
use kvproto::kv::v1 as pb;
use tokio::sync::{Notify, mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Code, Status};

use crate::error::{Error, Verdict, classify};
use crate::lease::LeaseRenewal;
use crate::router::{Router, Target, jittered};

/// Renewal requests waiting for the stream at most (the lessor's channel
/// to tonic): when it is full, due renewals wait for room instead of
/// piling up in memory.
pub const KEEP_ALIVE_REQUESTS_BUFFERED: usize = 1024;
/// Unanswered renewals of one lease at most: renewals go out every third
/// of the TTL and a TTL without an answer loses the lease, so more than a
/// few would mean a stream that answers nothing (it is replaced before).
pub const KEEP_ALIVE_IN_FLIGHT_MAX: usize = 4;
/// The shortest pause between two renewals of one lease, whatever TTL the
/// cluster states (its own minimum is `LEASE_TTL_MS_MIN`, 2 s).
pub const KEEP_ALIVE_INTERVAL_MIN: Duration = Duration::from_millis(100);
/// The shortest time a renewal may stay unanswered before its stream is
/// replaced (answers come once the renewal applied through Raft).
pub const KEEP_ALIVE_ANSWER_TIMEOUT_MIN: Duration = Duration::from_millis(500);

/// Why a kept lease is lost.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseLoss {
    /// The cluster answered a renewal with TTL 0: the lease expired or was
    /// revoked, and its keys are deleted.
    Gone,
    /// No renewal was acknowledged for a whole TTL: the lease may have
    /// expired (the cluster promised it only until `last_acknowledged_sent
    /// + ttl - LEASE_EARLY_BOUND_MS`).
    Unrenewed {
        /// When the last acknowledged renewal was sent.
        last_acknowledged_sent: Instant,
        /// The TTL it was renewed for.
        ttl: Duration,
    },
    /// The cluster refused the keep-alive stream in a way retrying cannot
    /// fix (it does not serve leases, or refused the credentials), or the
    /// keeper's task stopped.
    Failed {
        /// What happened.
        message: String,
    },
}

impl std::fmt::Display for LeaseLoss {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LeaseLoss::Gone => f.write_str("the lease expired or was revoked"),
            LeaseLoss::Unrenewed {
                last_acknowledged_sent,
                ttl,
            } => write!(
                f,
                "no renewal was acknowledged for a whole TTL ({ttl:?}; the last acknowledged one \
                 was sent {:?} ago): the lease may have expired",
                last_acknowledged_sent.elapsed()
            ),
            LeaseLoss::Failed { message } => write!(f, "the keep-alive stopped: {message}"),
        }
    }
}

/// What the handles of one kept lease see.
#[derive(Debug, Clone)]
struct KeeperStatus {
    /// The last acknowledged renewal.
    last: LeaseRenewal,
    /// Acknowledged renewals so far (the one `keep_alive` made included).
    renewals: u64,
    /// Set once, when the lease is lost.
    loss: Option<LeaseLoss>,
}

type StatusSender = Arc<watch::Sender<KeeperStatus>>;

/// The renewal bookkeeping of one kept lease.
#[derive(Debug)]
struct Slot {
    status: StatusSender,
    /// Handles of this lease alive.
    handles: usize,
    ttl: Duration,
    last_acknowledged_sent: Instant,
    next_send: Instant,
    /// When the cluster's promise of the last acknowledged renewal ends.
    deadline: Instant,
    /// Send times of the unanswered renewals, oldest first (answers come in
    /// the order of the requests).
    in_flight: VecDeque<Instant>,
}

/// `at + by`, or far in the future when that does not fit in an
/// `Instant` (a TTL of years).
fn later(at: Instant, by: Duration) -> Instant {
    at.checked_add(by)
        .unwrap_or_else(|| at + Duration::from_secs(100 * 365 * 86_400))
}

fn interval(ttl: Duration) -> Duration {
    (ttl / 3).max(KEEP_ALIVE_INTERVAL_MIN)
}

fn deadline(sent: Instant, ttl: Duration) -> Instant {
    later(
        sent,
        ttl.saturating_sub(Duration::from_millis(LEASE_EARLY_BOUND_MS)),
    )
}

/// Every kept lease's renewal schedule: which renewal falls due when,
/// which answer is overdue, which lease's promise ran out. No I/O and no
/// clock of its own (the lessor passes `now`), so it is tested alone.
#[derive(Debug)]
struct Schedule {
    slots: HashMap<u64, Slot>,
    /// (next send, lease).
    sends: BTreeSet<(Instant, u64)>,
    /// (deadline, lease).
    deadlines: BTreeSet<(Instant, u64)>,
    /// (time by which the oldest unanswered renewal must be answered, lease).
    answers: BTreeSet<(Instant, u64)>,
    /// The longest a renewal may wait for its answer (the request timeout).
    answer_timeout_max: Duration,
}

impl Schedule {
    fn new(answer_timeout_max: Duration) -> Schedule {
        Schedule {
            slots: HashMap::new(),
            sends: BTreeSet::new(),
            deadlines: BTreeSet::new(),
            answers: BTreeSet::new(),
            answer_timeout_max: answer_timeout_max.max(KEEP_ALIVE_ANSWER_TIMEOUT_MIN),
        }
    }

    fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    fn answer_by(&self, sent: Instant, ttl: Duration) -> Instant {
        later(
            sent,
            interval(ttl).clamp(KEEP_ALIVE_ANSWER_TIMEOUT_MIN, self.answer_timeout_max),
        )
    }

    /// A new handle of `first.id`, whose renewal `first` was just
    /// acknowledged: a new slot, or one more handle of the lease's slot.
    fn register(&mut self, first: LeaseRenewal) -> StatusSender {
        let id = first.id;
        if let Some(slot) = self.slots.get_mut(&id) {
            slot.handles += 1;
            let status = slot.status.clone();
            if first.sent > slot.last_acknowledged_sent {
                self.acknowledged(id, first);
            }
            return status;
        }
        let status = Arc::new(watch::Sender::new(KeeperStatus {
            last: first,
            renewals: 1,
            loss: None,
        }));
        let slot = Slot {
            status: status.clone(),
            handles: 1,
            ttl: first.ttl,
            last_acknowledged_sent: first.sent,
            next_send: later(first.sent, interval(first.ttl)),
            deadline: deadline(first.sent, first.ttl),
            in_flight: VecDeque::new(),
        };
        self.sends.insert((slot.next_send, id));
        self.deadlines.insert((slot.deadline, id));
        self.slots.insert(id, slot);
        status
    }

    /// A handle of `id` is gone; the lease is no longer renewed once its
    /// last one is (a lost lease's handles find their slot gone).
    fn unregister(&mut self, id: u64, status: &StatusSender) {
        let Some(slot) = self.slots.get_mut(&id) else {
            return;
        };
        if !Arc::ptr_eq(&slot.status, status) {
            return; // a later slot of the same id; this handle's was lost
        }
        slot.handles -= 1;
        if slot.handles == 0 {
            self.remove(id);
        }
    }

    fn remove(&mut self, id: u64) -> Option<Slot> {
        let slot = self.slots.remove(&id)?;
        self.sends.remove(&(slot.next_send, id));
        self.deadlines.remove(&(slot.deadline, id));
        if let Some(front) = slot.in_flight.front() {
            self.answers.remove(&(self.answer_by(*front, slot.ttl), id));
        }
        Some(slot)
    }

    /// Lease `id` is lost: its handles hear why, nothing renews it again.
    fn lose(&mut self, id: u64, loss: LeaseLoss) {
        if let Some(slot) = self.remove(id) {
            slot.status.send_modify(|status| status.loss = Some(loss));
        }
    }

    /// Every lease is lost the same way.
    fn lose_all(&mut self, loss: &LeaseLoss) {
        let ids: Vec<u64> = self.slots.keys().copied().collect();
        for id in ids {
            self.lose(id, loss.clone());
        }
    }

    /// Loses the leases whose promise ran out by `now`.
    fn expire(&mut self, now: Instant) {
        while let Some(&(at, id)) = self.deadlines.first() {
            if at > now {
                break;
            }
            let slot = &self.slots[&id];
            let loss = LeaseLoss::Unrenewed {
                last_acknowledged_sent: slot.last_acknowledged_sent,
                ttl: slot.ttl,
            };
            self.lose(id, loss);
        }
    }

    /// Whether a renewal is due by `now`.
    fn due(&self, now: Instant) -> bool {
        self.sends.first().is_some_and(|(at, _)| *at <= now)
    }

    /// Whether an unanswered renewal is overdue by `now`: the stream is
    /// not serving (a leader cut off from its quorum).
    fn stalled(&self, now: Instant) -> bool {
        self.answers.first().is_some_and(|(at, _)| *at <= now)
    }

    /// The next time something is to be done (a send, a deadline, an
    /// overdue answer).
    fn next_wake(&self) -> Option<Instant> {
        [
            self.sends.first(),
            self.deadlines.first(),
            self.answers.first(),
        ]
        .into_iter()
        .flatten()
        .map(|(at, _)| *at)
        .min()
    }

    /// Sends the renewals due by `now` through `send` until it refuses one
    /// (no room: that one stays due). A lease with
    /// [`KEEP_ALIVE_IN_FLIGHT_MAX`] renewals unanswered skips its turn.
    fn send_due(&mut self, now: Instant, mut send: impl FnMut(u64) -> bool) {
        while let Some(&(at, id)) = self.sends.first() {
            if at > now {
                break;
            }
            let full = self.slots[&id].in_flight.len() >= KEEP_ALIVE_IN_FLIGHT_MAX;
            if !full && !send(id) {
                break;
            }
            self.sends.remove(&(at, id));
            let answer_timeout_max = self.answer_timeout_max;
            let slot = self
                .slots
                .get_mut(&id)
                .expect("a scheduled lease has a slot");
            slot.next_send = later(now, interval(slot.ttl));
            self.sends.insert((slot.next_send, id));
            if !full {
                if slot.in_flight.is_empty() {
                    let by = later(
                        now,
                        interval(slot.ttl).clamp(KEEP_ALIVE_ANSWER_TIMEOUT_MIN, answer_timeout_max),
                    );
                    self.answers.insert((by, id));
                }
                slot.in_flight.push_back(now);
            }
        }
    }

    /// The answer to lease `id`'s oldest unanswered renewal: TTL 0 loses
    /// it, any other TTL renews it.
    fn answered(&mut self, id: u64, ttl_ms: u64, revision: u64) {
        let Some(slot) = self.slots.get_mut(&id) else {
            return; // no longer kept
        };
        let Some(sent) = slot.in_flight.pop_front() else {
            tracing::debug!(id, "a renewal answer with no renewal unanswered: ignored");
            return;
        };
        let ttl = slot.ttl;
        let next_front = slot.in_flight.front().copied();
        self.answers.remove(&(self.answer_by(sent, ttl), id));
        if let Some(front) = next_front {
            self.answers.insert((self.answer_by(front, ttl), id));
        }
        if ttl_ms == 0 {
            self.lose(id, LeaseLoss::Gone);
            return;
        }
        self.acknowledged(
            id,
            LeaseRenewal {
                id,
                ttl: Duration::from_millis(ttl_ms),
                sent,
                revision,
            },
        );
    }

    /// Lease `id` was renewed by a request sent at `renewal.sent`.
    fn acknowledged(&mut self, id: u64, renewal: LeaseRenewal) {
        let slot = self.slots.get_mut(&id).expect("a kept lease has a slot");
        if renewal.sent < slot.last_acknowledged_sent {
            return;
        }
        if slot.ttl != renewal.ttl {
            // Answer deadlines follow the TTL: re-key the pending one.
            if let Some(front) = slot.in_flight.front().copied() {
                let old = later(
                    front,
                    interval(slot.ttl)
                        .clamp(KEEP_ALIVE_ANSWER_TIMEOUT_MIN, self.answer_timeout_max),
                );
                let new = later(
                    front,
                    interval(renewal.ttl)
                        .clamp(KEEP_ALIVE_ANSWER_TIMEOUT_MIN, self.answer_timeout_max),
                );
                self.answers.remove(&(old, id));
                self.answers.insert((new, id));
            }
        }
        self.deadlines.remove(&(slot.deadline, id));
        slot.ttl = renewal.ttl;
        slot.last_acknowledged_sent = renewal.sent;
        slot.deadline = deadline(renewal.sent, renewal.ttl);
        self.deadlines.insert((slot.deadline, id));
        slot.status.send_modify(|status| {
            status.last = renewal;
            status.renewals += 1;
        });
    }

    /// The stream is gone, and with it the answers to its renewals: every
    /// lease that had one unanswered is renewed at once on the next stream.
    fn disconnected(&mut self, now: Instant) {
        self.answers.clear();
        for (id, slot) in &mut self.slots {
            if slot.in_flight.is_empty() {
                continue;
            }
            slot.in_flight.clear();
            self.sends.remove(&(slot.next_send, *id));
            slot.next_send = now;
            self.sends.insert((now, *id));
        }
    }
}

/// The keep-alive task's shared state.
#[derive(Debug)]
struct LessorState {
    schedule: Schedule,
    /// Whether the task runs (it ends when no lease is kept).
    running: bool,
}

/// Renews the leases a client keeps, over one stream to the leader.
#[derive(Debug)]
pub(crate) struct Lessor {
    router: Arc<Router>,
    state: Mutex<LessorState>,
    /// Wakes the task: a lease was kept or released.
    wake: Notify,
}

/// The stream's state.
enum Link {
    /// No stream; open one at `retry_at`.
    Idle { retry_at: Instant },
    /// Opening one to `addr`.
    Opening {
        addr: String,
        open: Pin<Box<dyn Future<Output = OpenResult> + Send>>,
    },
    /// A stream to `addr`.
    Open {
        addr: String,
        responses: Box<tonic::Streaming<pb::LeaseKeepAliveResponse>>,
    },
}

type OpenResult = Result<
    Result<tonic::Response<tonic::Streaming<pb::LeaseKeepAliveResponse>>, Status>,
    tokio::time::error::Elapsed,
>;

/// What woke the task.
enum Event {
    /// A time, a registration or room for requests: look again.
    Look,
    Opened(Box<OpenResult>),
    Message(Result<Option<pb::LeaseKeepAliveResponse>, Status>),
}

/// Marks every lease lost if the task ends with leases still kept (it
/// panicked), so no handle waits for a loss that nobody would report.
struct StopGuard<'a>(&'a Lessor);

impl Drop for StopGuard<'_> {
    fn drop(&mut self) {
        let mut state = self.0.lock();
        state.running = false;
        state.schedule.lose_all(&LeaseLoss::Failed {
            message: "the keep-alive task stopped".into(),
        });
    }
}

/// Whether a refusal of the stream is final: retrying (elsewhere, later)
/// cannot fix it.
fn final_refusal(err: &Error) -> bool {
    matches!(
        err,
        Error::Unimplemented { .. }
            | Error::Tls { .. }
            | Error::InvalidArgument { .. }
            | Error::InvalidConfig(_)
            | Error::Rpc {
                code: Code::Unauthenticated | Code::PermissionDenied,
                ..
            }
    )
}

impl Lessor {
    pub(crate) fn new(router: Arc<Router>) -> Lessor {
        let answer_timeout_max = router.settings().request_timeout;
        Lessor {
            router,
            state: Mutex::new(LessorState {
                schedule: Schedule::new(answer_timeout_max),
                running: false,
            }),
            wake: Notify::new(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, LessorState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Keeps `first.id` alive from its acknowledged renewal `first` on.
    pub(crate) fn keep(self: &Arc<Self>, first: LeaseRenewal) -> LeaseKeeper {
        let id = first.id;
        let status = {
            let mut state = self.lock();
            let status = state.schedule.register(first);
            if !state.running {
                state.running = true;
                tokio::spawn(self.clone().run());
            }
            status
        };
        self.wake.notify_one();
        let receiver = status.subscribe();
        LeaseKeeper {
            id,
            lessor: self.clone(),
            status,
            receiver,
            seen: 0,
        }
    }

    fn release(&self, id: u64, status: &StatusSender) {
        self.lock().schedule.unregister(id, status);
        self.wake.notify_one();
    }

    /// The task: renews due leases, reads answers, follows the leader;
    /// ends when no lease is kept.
    async fn run(self: Arc<Self>) {
        let guard = StopGuard(&self);
        let settings = self.router.settings().clone();
        let mut backoff = settings.backoff_base;
        let mut link = Link::Idle {
            retry_at: Instant::now(),
        };
        let mut requests: Option<mpsc::Sender<pb::LeaseKeepAliveRequest>> = None;
        loop {
            let now = Instant::now();
            let (next_wake, due, stalled) = {
                let mut state = self.lock();
                state.schedule.expire(now);
                if state.schedule.is_empty() {
                    state.running = false;
                    std::mem::forget(guard);
                    return;
                }
                if let Some(requests) = &requests {
                    state.schedule.send_due(now, |id| {
                        requests.try_send(pb::LeaseKeepAliveRequest { id }).is_ok()
                    });
                }
                let schedule = &state.schedule;
                (
                    schedule.next_wake(),
                    schedule.due(now),
                    schedule.stalled(now),
                )
            };
            if stalled && let Link::Open { addr, .. } | Link::Opening { addr, .. } = &link {
                let status = Status::deadline_exceeded("a renewal went unanswered on the stream");
                let addr = addr.clone();
                self.failed(&addr, &status, &mut link, &mut requests, &mut backoff);
                continue;
            }
            if let Link::Idle { retry_at } = link
                && retry_at <= now
            {
                match self.router.pick(Target::Leader) {
                    Ok((addr, channel)) => {
                        let (sender, receiver) = mpsc::channel(KEEP_ALIVE_REQUESTS_BUFFERED);
                        let open = tokio::time::timeout(settings.request_timeout, async move {
                            crate::client::kv(channel)
                                .lease_keep_alive(ReceiverStream::new(receiver))
                                .await
                        });
                        requests = Some(sender);
                        link = Link::Opening {
                            addr,
                            open: Box::pin(open),
                        };
                    }
                    Err(err) => {
                        let mut state = self.lock();
                        state.schedule.lose_all(&LeaseLoss::Failed {
                            message: err.to_string(),
                        });
                        state.running = false;
                        std::mem::forget(guard);
                        return;
                    }
                }
                continue;
            }
            let wake_at = match link {
                Link::Idle { retry_at } => Some(next_wake.map_or(retry_at, |t| t.min(retry_at))),
                _ => next_wake,
            };
            let event = {
                let sleep = async {
                    match wake_at {
                        Some(at) => tokio::time::sleep_until(at.into()).await,
                        None => std::future::pending().await,
                    }
                };
                let room = async {
                    match (&requests, due) {
                        // A closed channel: the stream failed, its event
                        // comes from the stream branch.
                        (Some(requests), true) if !requests.is_closed() => {
                            drop(requests.reserve().await)
                        }
                        _ => std::future::pending().await,
                    }
                };
                let stream = async {
                    match &mut link {
                        Link::Idle { .. } => std::future::pending().await,
                        Link::Opening { open, .. } => Event::Opened(Box::new(open.await)),
                        Link::Open { responses, .. } => Event::Message(responses.message().await),
                    }
                };
                tokio::select! {
                    event = stream => event,
                    () = sleep => Event::Look,
                    () = self.wake.notified() => Event::Look,
                    () = room => Event::Look,
                }
            };
            match event {
                Event::Look => {}
                Event::Opened(opened) => {
                    let Link::Opening { addr, .. } = &link else {
                        unreachable!("opened while opening")
                    };
                    let addr = addr.clone();
                    match *opened {
                        Ok(Ok(response)) => {
                            self.router.mark(&addr, true);
                            self.router.set_leader(&addr);
                            link = Link::Open {
                                addr,
                                responses: Box::new(response.into_inner()),
                            };
                        }
                        Ok(Err(status)) => {
                            self.failed(&addr, &status, &mut link, &mut requests, &mut backoff)
                        }
                        Err(_) => {
                            let status = Status::deadline_exceeded(format!(
                                "the keep-alive stream did not open within {:?}",
                                settings.request_timeout
                            ));
                            self.failed(&addr, &status, &mut link, &mut requests, &mut backoff);
                        }
                    }
                }
                Event::Message(message) => {
                    let Link::Open { addr, .. } = &link else {
                        unreachable!("a message while open")
                    };
                    let addr = addr.clone();
                    match message {
                        Ok(Some(answer)) => {
                            backoff = settings.backoff_base;
                            let revision = answer.header.as_ref().map_or(0, |h| h.revision);
                            self.lock()
                                .schedule
                                .answered(answer.id, answer.ttl_ms, revision);
                        }
                        Ok(None) => {
                            let status = Status::unavailable("the member ended the stream");
                            self.failed(&addr, &status, &mut link, &mut requests, &mut backoff);
                        }
                        Err(status) => {
                            self.failed(&addr, &status, &mut link, &mut requests, &mut backoff)
                        }
                    }
                }
            }
        }
    }

    /// The stream to `addr` failed with `status`: follow what it says
    /// about the leader and open another after a backoff, or lose every
    /// lease if retrying cannot help.
    fn failed(
        &self,
        addr: &str,
        status: &Status,
        link: &mut Link,
        requests: &mut Option<mpsc::Sender<pb::LeaseKeepAliveRequest>>,
        backoff: &mut Duration,
    ) {
        tracing::debug!(%addr, code = ?status.code(), message = status.message(), "keep-alive stream failed");
        *requests = None;
        let now = Instant::now();
        let verdict = classify(status);
        let mut state = self.lock();
        state.schedule.disconnected(now);
        if let Verdict::Fatal(err) = &verdict
            && final_refusal(err)
        {
            state.schedule.lose_all(&LeaseLoss::Failed {
                message: format!("{addr}: {err}"),
            });
            *link = Link::Idle { retry_at: now };
            return;
        }
        let pause = self.router.learn(addr, &verdict) || matches!(verdict, Verdict::Fatal(_));
        let retry_at = if pause {
            let at = later(now, jittered(*backoff));
            *backoff = (*backoff * 2).min(self.router.settings().backoff_cap);
            at
        } else {
            now
        };
        *link = Link::Idle { retry_at };
    }
}

/// Keeps one lease alive until dropped (dropping does not revoke it).
/// Made by [`Client::keep_alive`](crate::Client::keep_alive); see the
/// module's documentation for the cadence and what counts as a loss.
pub struct LeaseKeeper {
    id: u64,
    lessor: Arc<Lessor>,
    status: StatusSender,
    receiver: watch::Receiver<KeeperStatus>,
    /// Renewals [`LeaseKeeper::renewed`] has handed out.
    seen: u64,
}

impl std::fmt::Debug for LeaseKeeper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let status = self.receiver.borrow();
        f.debug_struct("LeaseKeeper")
            .field("id", &self.id)
            .field("ttl", &status.last.ttl)
            .field("renewals", &status.renewals)
            .field("loss", &status.loss)
            .finish_non_exhaustive()
    }
}

impl LeaseKeeper {
    /// The lease.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The TTL of the last acknowledged renewal.
    pub fn ttl(&self) -> Duration {
        self.receiver.borrow().last.ttl
    }

    /// When the last acknowledged renewal was sent: the cluster promises
    /// the lease lives until this + [`LeaseKeeper::ttl`] -
    /// `LEASE_EARLY_BOUND_MS`.
    pub fn last_acknowledged_sent(&self) -> Instant {
        self.receiver.borrow().last.sent
    }

    /// The last acknowledged renewal.
    pub fn last_renewal(&self) -> LeaseRenewal {
        self.receiver.borrow().last
    }

    /// Acknowledged renewals so far, the first (made by `keep_alive`)
    /// included.
    pub fn renewals(&self) -> u64 {
        self.receiver.borrow().renewals
    }

    /// Why the lease was lost, if it was.
    pub fn loss(&self) -> Option<LeaseLoss> {
        self.receiver.borrow().loss.clone()
    }

    /// Waits until the lease is lost; why.
    pub async fn lost(&self) -> LeaseLoss {
        let mut receiver = self.receiver.clone();
        match receiver.wait_for(|status| status.loss.is_some()).await {
            Ok(status) => status.loss.clone().expect("waited for a loss"),
            // The sender lives in `self.status`: it cannot be dropped.
            Err(_) => LeaseLoss::Failed {
                message: "the keep-alive stopped".into(),
            },
        }
    }

    /// The next acknowledged renewal this handle has not handed out yet
    /// (the first call answers the renewal `keep_alive` made; renewals
    /// acknowledged while nobody asked are skipped to the latest), or the
    /// loss.
    pub async fn renewed(&mut self) -> Result<LeaseRenewal, LeaseLoss> {
        loop {
            {
                let status = self.receiver.borrow_and_update();
                if let Some(loss) = &status.loss {
                    return Err(loss.clone());
                }
                if status.renewals > self.seen {
                    self.seen = status.renewals;
                    return Ok(status.last);
                }
            }
            if self.receiver.changed().await.is_err() {
                return Err(LeaseLoss::Failed {
                    message: "the keep-alive stopped".into(),
                });
            }
        }
    }
}

impl Drop for LeaseKeeper {
    fn drop(&mut self) {
        self.lessor.release(self.id, &self.status);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TTL: Duration = Duration::from_secs(3);

    fn renewal(id: u64, sent: Instant) -> LeaseRenewal {
        LeaseRenewal {
            id,
            ttl: TTL,
            sent,
            revision: 1,
        }
    }

    fn loss(status: &StatusSender) -> Option<LeaseLoss> {
        status.borrow().loss.clone()
    }

    /// Sends what is due at `now`, returning the ids sent.
    fn send(schedule: &mut Schedule, now: Instant) -> Vec<u64> {
        let mut sent = Vec::new();
        schedule.send_due(now, |id| {
            sent.push(id);
            true
        });
        sent
    }

    #[test]
    fn a_lease_is_renewed_every_third_of_its_ttl_from_the_last_send() {
        let t0 = Instant::now();
        let mut schedule = Schedule::new(Duration::from_secs(10));
        let status = schedule.register(renewal(7, t0));
        assert!(!schedule.due(t0));
        assert_eq!(schedule.next_wake(), Some(t0 + TTL / 3));
        assert!(send(&mut schedule, t0 + TTL / 3 - Duration::from_millis(1)).is_empty());
        let t1 = t0 + TTL / 3;
        assert_eq!(send(&mut schedule, t1), vec![7]);
        assert!(!schedule.due(t1));
        schedule.answered(7, 3_000, 9);
        let status = status.borrow();
        assert_eq!(status.renewals, 2);
        assert_eq!(status.last.sent, t1, "the ack's send time, not its arrival");
        assert_eq!(status.last.revision, 9);
        assert!(status.loss.is_none());
        drop(status);
        assert_eq!(
            schedule.next_wake(),
            Some(t1 + TTL / 3),
            "the next send, before the deadline"
        );
    }

    #[test]
    fn no_acknowledged_renewal_for_a_ttl_loses_the_lease_at_the_promise_end() {
        let t0 = Instant::now();
        let mut schedule = Schedule::new(Duration::from_secs(10));
        let status = schedule.register(renewal(7, t0));
        // Three sends, none answered (a stream that never answers is
        // replaced; here only the deadline is looked at).
        for k in 1..=2 {
            assert_eq!(send(&mut schedule, t0 + TTL / 3 * k), vec![7]);
        }
        let end = t0 + TTL - Duration::from_millis(LEASE_EARLY_BOUND_MS);
        schedule.expire(end - Duration::from_millis(1));
        assert_eq!(loss(&status), None, "alive until the promise ends");
        schedule.expire(end);
        assert_eq!(
            loss(&status),
            Some(LeaseLoss::Unrenewed {
                last_acknowledged_sent: t0,
                ttl: TTL
            })
        );
        assert!(schedule.is_empty());
        assert_eq!(schedule.next_wake(), None);
        // A late answer changes nothing: a lost lease stays lost.
        schedule.answered(7, 3_000, 1);
        assert!(schedule.is_empty());
    }

    #[test]
    fn ttl_zero_answers_lose_the_lease_as_gone() {
        let t0 = Instant::now();
        let mut schedule = Schedule::new(Duration::from_secs(10));
        let a = schedule.register(renewal(1, t0));
        let b = schedule.register(renewal(2, t0));
        let t1 = t0 + TTL / 3;
        let mut sent = send(&mut schedule, t1);
        sent.sort();
        assert_eq!(sent, vec![1, 2]);
        schedule.answered(2, 0, 5);
        assert_eq!(loss(&b), Some(LeaseLoss::Gone));
        assert_eq!(loss(&a), None);
        schedule.answered(1, 3_000, 5);
        assert_eq!(a.borrow().renewals, 2);
        assert_eq!(schedule.slots.len(), 1);
    }

    #[test]
    fn answers_pair_with_requests_in_order_and_overdue_ones_stall_the_stream() {
        let t0 = Instant::now();
        let mut schedule = Schedule::new(Duration::from_secs(10));
        let status = schedule.register(renewal(3, t0));
        let t1 = t0 + TTL / 3;
        let t2 = t1 + TTL / 3;
        assert_eq!(send(&mut schedule, t1), vec![3]);
        assert!(!schedule.stalled(t1));
        assert!(
            schedule.stalled(t1 + TTL / 3),
            "unanswered for a third of the TTL"
        );
        assert_eq!(send(&mut schedule, t2), vec![3]);
        schedule.answered(3, 3_000, 1);
        assert_eq!(status.borrow().last.sent, t1);
        assert!(
            !schedule.stalled(t2),
            "the next one is judged from its own send"
        );
        schedule.answered(3, 3_000, 2);
        assert_eq!(status.borrow().last.sent, t2);
        assert!(schedule.answers.is_empty());
    }

    #[test]
    fn a_lost_stream_renews_at_once_the_leases_it_left_unanswered() {
        let t0 = Instant::now();
        let mut schedule = Schedule::new(Duration::from_secs(10));
        schedule.register(renewal(1, t0));
        let t1 = t0 + Duration::from_millis(100);
        schedule.register(renewal(2, t1));
        assert_eq!(send(&mut schedule, t0 + TTL / 3), vec![1]);
        let t2 = t0 + TTL / 3 + Duration::from_millis(10);
        schedule.disconnected(t2);
        assert!(
            schedule.due(t2),
            "lease 1's renewal was lost with the stream"
        );
        assert_eq!(send(&mut schedule, t2), vec![1]);
        assert!(!schedule.due(t2), "lease 2 keeps its turn");
        assert_eq!(schedule.slots[&1].in_flight.len(), 1);
    }

    #[test]
    fn renewals_wait_for_room_and_the_in_flight_cap() {
        let t0 = Instant::now();
        let mut schedule = Schedule::new(Duration::from_secs(10));
        schedule.register(renewal(1, t0));
        schedule.register(renewal(2, t0));
        let t1 = t0 + TTL / 3;
        // No room: nothing leaves, both stay due.
        schedule.send_due(t1, |_| false);
        assert!(schedule.due(t1));
        assert!(schedule.slots.values().all(|s| s.in_flight.is_empty()));
        // Room for one.
        let mut room = 1;
        schedule.send_due(t1, |_| {
            room -= 1;
            room >= 0
        });
        assert_eq!(
            schedule
                .slots
                .values()
                .map(|s| s.in_flight.len())
                .sum::<usize>(),
            1
        );
        assert!(schedule.due(t1));
        // An unanswering stream: each lease stops at the cap.
        let mut now = t1;
        for _ in 0..10 {
            send(&mut schedule, now);
            now += TTL / 3;
        }
        assert!(
            schedule
                .slots
                .values()
                .all(|s| s.in_flight.len() == KEEP_ALIVE_IN_FLIGHT_MAX)
        );
    }

    #[test]
    fn handles_share_a_lease_and_the_last_one_stops_its_renewals() {
        let t0 = Instant::now();
        let mut schedule = Schedule::new(Duration::from_secs(10));
        let first = schedule.register(renewal(4, t0));
        let t1 = t0 + Duration::from_millis(200);
        let second = schedule.register(renewal(4, t1));
        assert!(Arc::ptr_eq(&first, &second));
        assert_eq!(first.borrow().renewals, 2);
        assert_eq!(schedule.slots[&4].last_acknowledged_sent, t1);
        schedule.unregister(4, &first);
        assert_eq!(schedule.slots.len(), 1);
        schedule.unregister(4, &second);
        assert!(schedule.is_empty());
        assert!(schedule.sends.is_empty() && schedule.deadlines.is_empty());
        // A handle of a lost slot does not touch a later slot of that id.
        let old = schedule.register(renewal(4, t1));
        schedule.lose(4, LeaseLoss::Gone);
        let new = schedule.register(renewal(4, t1));
        schedule.unregister(4, &old);
        assert_eq!(schedule.slots[&4].handles, 1);
        assert_eq!(loss(&new), None);
    }
}
