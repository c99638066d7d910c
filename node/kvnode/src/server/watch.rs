//! `Kv.Watch`: change streams served from this member's applied state.
//!
//! One gRPC stream carries any number of watches. The stream's task reads
//! the client's messages (create, cancel, progress) and runs one task per
//! watch; every watch task sends into the stream's one bounded response
//! channel ([`WATCH_STREAM_RESPONSES_BUFFERED`]).
//!
//! A watch task keeps a cursor (the next revision whose events it has not
//! all sent) and reads its events page by page from the change history
//! (`kvstate::watch::events`): nothing is buffered per watcher and nothing
//! runs on the apply path. A watcher that keeps up reads a new page as
//! soon as a change it may care about is applied (the member's
//! [`WatchHub`] wakes it); one whose client reads slowly
//! waits on the response channel, falls behind, and later reads its
//! backlog from the history the same way (etcd's "unsynced" watchers).
//! Memory per watcher is one page at most. A watcher is cancelled only when
//! its cursor falls to or below the compact revision; the cancel names the
//! compact revision, so the client re-reads and resumes.
//!
//! Every replica's history is the same, so is every page: a watcher that
//! resumes on another member with `start_revision` = last seen + 1 gets
//! every later event exactly once, in order.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use kvproto::kv::v1::{
    Event as PbEvent, EventType, Header, KeyValue as PbKeyValue, WatchCreateRequest, WatchRequest,
    WatchResponse, watch_request,
};
use kvstate::range::KeyValue;
use kvstate::watch::{
    Event, EventCursor, EventKind, EventPage, EventsError, WatchSpec, events, page_in,
};
use tokio::sync::{Semaphore, mpsc, oneshot, watch};
use tokio::task::JoinHandle;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::{Stream, StreamExt as _};
use tonic::Status;

use crate::node::identity::Identity;
use crate::raft::read_index::ReadRounds;
use crate::raft::types::NodeRaft;
use crate::raft::watch::MetricsWatch;
use crate::server::cluster;
use crate::server::convert::check_key;
use crate::server::metrics::Metrics;
use crate::server::watch_hub::WatchHub;
use crate::state_machine::StateMachine;

/// Responses a watch stream holds for its client before its watch tasks
/// wait (each response is one page at most: `WATCH_PAGE_EVENTS_MAX` events,
/// `WATCH_PAGE_BYTES_MAX` bytes).
pub const WATCH_STREAM_RESPONSES_BUFFERED: usize = 4;
/// Watches one stream may hold at once; a create beyond it is answered
/// cancelled, naming the limit.
pub const WATCH_STREAM_WATCHES_MAX: usize = 10_000;
/// How often a watch created with `progress_notify` gets a progress
/// notification while it is caught up.
pub const WATCH_PROGRESS_INTERVAL: Duration = Duration::from_secs(10);
/// A watcher with this many history records (or fewer) to read reads its
/// page on the async worker when the history's lock is free; with more,
/// the read moves to a blocking thread.
pub const WATCH_INLINE_RECORDS_MAX: usize = 64;
/// Pages a stream's watches may hold at once, read and not yet handed to
/// the response channel (each one at most `WATCH_PAGE_BYTES_MAX` bytes and
/// an event): with the channel's [`WATCH_STREAM_RESPONSES_BUFFERED`], what
/// bounds a stream's memory however many watches it carries and however
/// slowly its client reads.
pub const WATCH_STREAM_PAGES_IN_FLIGHT: usize = 4;
/// The watch id of a refused create that named an id in use (etcd's
/// `InvalidWatchID`).
pub const INVALID_WATCH_ID: i64 = -1;

/// What a watch stream needs of its member.
#[derive(Clone)]
pub(crate) struct WatchContext {
    pub(crate) raft: NodeRaft,
    pub(crate) state_machine: StateMachine,
    pub(crate) reads: ReadRounds,
    pub(crate) identity: Identity,
    pub(crate) metrics: Option<Metrics>,
    /// Turns true when the member stops (`None`: never).
    pub(crate) shutdown: Option<watch::Receiver<bool>>,
    /// Wakes caught-up watches when a change concerns them.
    pub(crate) hub: Arc<WatchHub>,
}

/// Resolves once `shutdown` turns true (or its sender is gone); never
/// without one.
pub(crate) async fn stopped(shutdown: Option<watch::Receiver<bool>>) {
    match shutdown {
        Some(mut shutdown) => {
            let _ = shutdown.wait_for(|stop| *stop).await;
        }
        None => std::future::pending().await,
    }
}

/// The response stream `Kv.Watch` returns.
pub type WatchStream = Pin<Box<dyn Stream<Item = Result<WatchResponse, Status>> + Send>>;

type Out = mpsc::Sender<Result<WatchResponse, Status>>;

/// Where a watch stands with its `created` message, which a cancel must
/// not overtake: a client may cancel a watch it named (`watch_id` set)
/// before its `created` went out, and etcd's clients pair each `created`
/// with their creates in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Announced {
    /// `created` has not gone out yet.
    Pending,
    /// It has: a cancel ends the task and answers at once.
    Yes,
    /// A cancel came first: the task sends `created`, then `canceled`, and
    /// ends.
    CancelAsked,
}

/// A live watch of a stream: its task and whether its `created` is out.
struct LiveWatch {
    task: JoinHandle<()>,
    announced: Arc<Mutex<Announced>>,
}

impl WatchContext {
    /// A message's header. The metrics are cloned, not borrowed: building
    /// the header takes the apply lock (`StateMachine::applied`), and a
    /// borrow held meanwhile would hold up openraft's metrics updates.
    fn header(&self, revision: u64) -> Header {
        let metrics = self.raft.metrics().borrow().clone();
        Header {
            revision,
            ..cluster::header(&self.identity, &self.state_machine, &metrics)
        }
    }

    fn response(&self, watch_id: i64, revision: u64) -> WatchResponse {
        WatchResponse {
            header: Some(self.header(revision)),
            watch_id,
            ..WatchResponse::default()
        }
    }

    /// Starts serving one watch stream: the client's messages as `Kv.Watch`
    /// receives them, or as a front end translated them.
    pub(crate) fn serve<S>(self, requests: S) -> WatchStream
    where
        S: Stream<Item = Result<WatchRequest, Status>> + Send + Unpin + 'static,
    {
        let (out, responses) = mpsc::channel(WATCH_STREAM_RESPONSES_BUFFERED);
        tokio::spawn(self.run_stream(requests, out));
        Box::pin(ReceiverStream::new(responses))
    }

    /// Reads the client's messages until the client goes or the member
    /// stops; then stops every watch of the stream. (A client that closes
    /// its side keeps its watches, as etcd does.)
    async fn run_stream<S>(self, mut requests: S, out: Out)
    where
        S: Stream<Item = Result<WatchRequest, Status>> + Send + Unpin + 'static,
    {
        let mut watches: HashMap<i64, LiveWatch> = HashMap::new();
        // Ids the server picks only increase: a late cancel of an ended
        // watch never reaches a new one.
        let mut next_id: i64 = 0;
        let (progress, _) = watch::channel(0u64);
        let pages = Arc::new(Semaphore::new(WATCH_STREAM_PAGES_IN_FLIGHT));
        // Each create's answer waits for the previous create's: `created`
        // messages come in the order of the creates, as etcd's clients
        // pair them.
        let mut previous_created: Option<oneshot::Receiver<()>> = None;
        let stop = stopped(self.shutdown.clone());
        tokio::pin!(stop);
        let mut reading = true;
        loop {
            let request = tokio::select! {
                request = requests.next(), if reading => request.transpose(),
                () = out.closed() => break,
                () = &mut stop => {
                    let status = Status::unavailable(format!(
                        "member {} is stopping; resume the watch on another member",
                        self.identity.member_id()
                    ));
                    let _ = out.try_send(Err(status));
                    break;
                }
            };
            let request = match request {
                Ok(Some(request)) => request,
                Ok(None) => {
                    reading = false;
                    continue;
                }
                Err(status) => {
                    tracing::debug!(%status, "watch stream ended");
                    break;
                }
            };
            watches.retain(|_, watch| !watch.task.is_finished());
            match request.request {
                Some(watch_request::Request::Create(create)) => {
                    let (created, created_rx) = oneshot::channel();
                    let after = previous_created.replace(created_rx);
                    let id = if create.watch_id != 0 {
                        create.watch_id
                    } else {
                        while watches.contains_key(&next_id) {
                            next_id += 1;
                        }
                        next_id
                    };
                    let refused = if watches.contains_key(&id) || id < 0 {
                        Some((
                            INVALID_WATCH_ID,
                            format!(
                                "WatchCreateRequest.watch_id {id} is in use on this stream or negative"
                            ),
                        ))
                    } else if watches.len() >= WATCH_STREAM_WATCHES_MAX {
                        Some((
                            id,
                            format!(
                                "the stream holds {WATCH_STREAM_WATCHES_MAX} watches (the limit \
                                 WATCH_STREAM_WATCHES_MAX); cancel one or open another stream"
                            ),
                        ))
                    } else {
                        check_create(&create)
                            .err()
                            .map(|s| (id, s.message().to_string()))
                    };
                    if create.watch_id == 0 && refused.is_none() {
                        next_id += 1;
                    }
                    let task = match refused {
                        Some((id, reason)) => {
                            self.count_cancel("refused");
                            let response = WatchResponse {
                                created: true,
                                canceled: true,
                                cancel_reason: reason,
                                ..self.response(id, self.state_machine.revision())
                            };
                            let out = out.clone();
                            tokio::spawn(async move {
                                if let Some(after) = after {
                                    let _ = after.await;
                                }
                                let _ = out.send(Ok(response)).await;
                                let _ = created.send(());
                            })
                        }
                        None => {
                            let announced = Arc::new(Mutex::new(Announced::Pending));
                            let sending = Sending {
                                out: out.clone(),
                                pages: pages.clone(),
                                after,
                                created,
                                announced: announced.clone(),
                            };
                            let task = tokio::spawn(self.clone().run_watch(
                                id,
                                create,
                                sending,
                                progress.subscribe(),
                            ));
                            watches.insert(id, LiveWatch { task, announced });
                            continue;
                        }
                    };
                    // A refusal's task: ends by itself (a refused id in use
                    // keeps its live watch).
                    drop(task);
                }
                Some(watch_request::Request::Cancel(cancel)) => {
                    let id = cancel.watch_id;
                    if let Some(watch) = watches.remove(&id) {
                        let answered_by_task = {
                            let mut announced = watch
                                .announced
                                .lock()
                                .unwrap_or_else(PoisonError::into_inner);
                            match *announced {
                                // Its task answers the cancel after its
                                // `created`, in the order of the creates.
                                Announced::Pending => {
                                    *announced = Announced::CancelAsked;
                                    true
                                }
                                Announced::CancelAsked => true,
                                Announced::Yes => false,
                            }
                        };
                        if answered_by_task {
                            // Still counted against WATCH_STREAM_WATCHES_MAX
                            // (and its id in use) until its task ends.
                            watches.insert(id, watch);
                            continue;
                        }
                        watch.task.abort();
                        self.count_cancel("client");
                        let response = WatchResponse {
                            canceled: true,
                            ..self.response(id, self.state_machine.revision())
                        };
                        if out.send(Ok(response)).await.is_err() {
                            break;
                        }
                    }
                }
                Some(watch_request::Request::Progress(_)) => {
                    progress.send_modify(|asked| *asked += 1);
                }
                None => {
                    let status = Status::invalid_argument(
                        "WatchRequest.request is not set: one of create, cancel, progress",
                    );
                    let _ = out.send(Err(status)).await;
                    break;
                }
            }
        }
        for (_, watch) in watches {
            watch.task.abort();
        }
    }

    fn count_cancel(&self, reason: &'static str) {
        if let Some(metrics) = &self.metrics {
            metrics.watch_cancelled(reason);
        }
    }

    /// One watch: where it starts, then pages until the client goes, the
    /// watch is cancelled, or it falls below the compact revision.
    async fn run_watch(
        self,
        id: i64,
        create: WatchCreateRequest,
        sending: Sending,
        mut progress: watch::Receiver<u64>,
    ) {
        let Sending {
            out,
            pages,
            after,
            created,
            announced,
        } = sending;
        let mut watching = self.metrics.as_ref().map(Metrics::watcher);
        let start = self.start_revision(&create).await;
        if let Some(after) = after {
            let _ = after.await;
        }
        let start = match start {
            Ok(start) => start,
            Err(status) => {
                let response = WatchResponse {
                    created: true,
                    canceled: true,
                    unavailable: true,
                    cancel_reason: status.message().to_string(),
                    ..self.response(id, self.state_machine.revision())
                };
                self.count_cancel("unavailable");
                let _ = out.send(Ok(response)).await;
                let _ = created.send(());
                return;
            }
        };
        // Every event below `start` is "sent" (none is owed); a future
        // start names the store revision instead.
        let message = WatchResponse {
            created: true,
            ..self.response(id, (start - 1).min(self.history_revision()))
        };
        let mut sent = out.send(Ok(message)).await;
        let cancel_asked = {
            let mut announced = announced.lock().unwrap_or_else(PoisonError::into_inner);
            let asked = *announced == Announced::CancelAsked;
            *announced = Announced::Yes;
            asked
        };
        if cancel_asked && sent.is_ok() {
            // Before the next create's `created`: the cancel came before it.
            self.count_cancel("client");
            let response = WatchResponse {
                canceled: true,
                ..self.response(id, self.state_machine.revision())
            };
            sent = out.send(Ok(response)).await;
        }
        let _ = created.send(());
        if sent.is_err() || cancel_asked {
            return;
        }
        let spec = Arc::new(WatchSpec {
            prev_kv: create.prev_kv,
            no_put: create.no_put,
            no_delete: create.no_delete,
            ..WatchSpec::new(&create.key, &create.range_end)
        });
        // NEGATIVE CONTROL (feature nc-watch-skip): a watch that resumes
        // (an explicit start revision) loses its first event.
        let mut skip_one = cfg!(feature = "nc-watch-skip") && create.start_revision != 0;
        let mut cursor = EventCursor::at(start);
        let registration = self.hub.register(spec.clone());
        let mut ticker = tokio::time::interval(WATCH_PROGRESS_INTERVAL);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticker.reset();
        let mut progress_wanted = false;
        progress.borrow_and_update();
        loop {
            // The page is held until the channel takes it: at most
            // WATCH_STREAM_PAGES_IN_FLIGHT of the stream's watches hold one.
            let Ok(page_permit) = pages.acquire().await else {
                return;
            };
            let page = match self.read_page(&spec, cursor).await {
                Ok(page) => page,
                Err(err) => {
                    let (compact_revision, reason) = match &err {
                        EventsError::Compacted {
                            compact_revision, ..
                        } => (*compact_revision, "compacted"),
                        _ => (0, "error"),
                    };
                    self.count_cancel(reason);
                    let response = WatchResponse {
                        canceled: true,
                        compact_revision,
                        unavailable: compact_revision == 0,
                        cancel_reason: err.to_string(),
                        ..self.response(id, self.state_machine.revision())
                    };
                    let _ = out.send(Ok(response)).await;
                    return;
                }
            };
            let mut page_events = page.events;
            if skip_one && !page_events.is_empty() {
                page_events.remove(0);
                skip_one = false;
            }
            if !page_events.is_empty() {
                if let Some(metrics) = &self.metrics {
                    metrics.watch_events_sent(page_events.len() as u64);
                }
                let response = WatchResponse {
                    fragment: page.next.skip > 0,
                    events: page_events.into_iter().map(event_pb).collect(),
                    ..self.response(id, page.revision)
                };
                if out.send(Ok(response)).await.is_err() {
                    return;
                }
            }
            drop(page_permit);
            cursor = page.next;
            if cursor.revision <= page.revision {
                // Behind: the next page at once (letting other tasks run:
                // an inline page read does not wait).
                if let Some(watching) = &mut watching {
                    watching.set_behind(true);
                }
                tokio::task::consume_budget().await;
                continue;
            }
            if let Some(watching) = &mut watching {
                watching.set_behind(false);
            }
            // Caught up: every event up to `cursor.revision - 1` is sent.
            if progress_wanted {
                progress_wanted = false;
                let through = (cursor.revision - 1).min(page.revision);
                if out.send(Ok(self.response(id, through))).await.is_err() {
                    return;
                }
            }
            if !registration.arm(cursor.revision) {
                // Newer revisions were applied meanwhile.
                tokio::task::consume_budget().await;
                continue;
            }
            tokio::select! {
                () = registration.woken() => {}
                _ = ticker.tick(), if create.progress_notify => progress_wanted = true,
                asked = progress.changed() => {
                    if asked.is_err() {
                        return;
                    }
                    progress_wanted = true;
                }
                () = out.closed() => return,
            }
        }
    }

    /// The store revision the change history holds.
    fn history_revision(&self) -> u64 {
        self.state_machine
            .history()
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .revision()
    }

    /// The first revision a new watch sends: the one asked for, or for 0,
    /// the revision after "now" (a read index's, unless stale).
    async fn start_revision(&self, create: &WatchCreateRequest) -> Result<u64, Status> {
        if create.start_revision != 0 {
            return Ok(create.start_revision);
        }
        let stale = create.consistency == kvproto::kv::v1::Consistency::Stale as i32;
        if !stale && !cfg!(feature = "nc-local-reads") {
            let unavailable = |err| {
                Status::unavailable(format!(
                    "member {} cannot find the current revision for a watch from now: {err}; \
                     retry, or watch with stale consistency",
                    self.identity.member_id()
                ))
            };
            let index = self.reads.read_index().await.map_err(unavailable)?;
            self.reads.wait_applied(index).await.map_err(unavailable)?;
        }
        Ok(self.history_revision() + 1)
    }

    /// The next page from `cursor`: on this worker when the watcher is
    /// close behind and the history's lock is free, otherwise (or when a
    /// merge moved a record under it) on a blocking thread.
    async fn read_page(
        &self,
        spec: &Arc<WatchSpec>,
        cursor: EventCursor,
    ) -> Result<EventPage, EventsError> {
        if let Some(page) = self.try_page_inline(spec, cursor) {
            return page;
        }
        let state_machine = self.state_machine.clone();
        let spec = spec.clone();
        tokio::task::spawn_blocking(move || {
            events(
                || state_machine.engine(),
                state_machine.history(),
                &spec,
                cursor,
                u64::MAX,
            )
        })
        .await
        .unwrap_or_else(|err| {
            Err(EventsError::Engine(bitcask::Error::Corruption {
                file: String::new(),
                offset: 0,
                reason: format!("the watch page task failed: {err}"),
            }))
        })
    }
}

impl WatchContext {
    /// [`WatchContext::read_page`] on this worker, if the watcher is close
    /// behind and the lock is free; `None`: read it on a blocking thread.
    fn try_page_inline(
        &self,
        spec: &WatchSpec,
        cursor: EventCursor,
    ) -> Option<Result<EventPage, EventsError>> {
        let history = self.state_machine.history().try_read().ok()?;
        let records = history
            .records_from(cursor.revision)
            .take(WATCH_INLINE_RECORDS_MAX + 1)
            .count();
        if records > WATCH_INLINE_RECORDS_MAX {
            return None;
        }
        match page_in(
            &self.state_machine.engine(),
            &history,
            spec,
            cursor,
            u64::MAX,
        ) {
            Err(EventsError::Engine(bitcask::Error::LocationGone { .. })) => None,
            other => Some(other),
        }
    }
}

/// A create's keys within the key limits, and a known consistency; the
/// refusal names the field.
fn check_create(create: &WatchCreateRequest) -> Result<(), Status> {
    let named = |field: &str, status: Status| {
        Status::invalid_argument(format!("WatchCreateRequest.{field}: {}", status.message()))
    };
    check_key(&create.key).map_err(|status| named("key", status))?;
    if create.range_end.as_ref() != b"\0" {
        check_key(&create.range_end).map_err(|status| named("range_end", status))?;
    }
    if kvproto::kv::v1::Consistency::try_from(create.consistency).is_err() {
        return Err(Status::invalid_argument(format!(
            "WatchCreateRequest.consistency {} is not a known consistency \
             (0 = LINEARIZABLE, 1 = STALE)",
            create.consistency
        )));
    }
    Ok(())
}

/// How a watch task sends: the stream's channel and page budget, and the
/// order of `created` messages (wait for `after`, then signal `created`).
struct Sending {
    out: Out,
    pages: Arc<Semaphore>,
    after: Option<oneshot::Receiver<()>>,
    created: oneshot::Sender<()>,
    /// Shared with the stream's task, which may ask for a cancel before
    /// `created` is out.
    announced: Arc<Mutex<Announced>>,
}

fn kv_pb(kv: KeyValue) -> PbKeyValue {
    PbKeyValue {
        key: kv.key.into(),
        value: kv.value.into(),
        create_revision: kv.create_revision,
        mod_revision: kv.mod_revision,
        version: kv.version,
        lease: kv.lease,
        ..PbKeyValue::default()
    }
}

fn event_pb(event: Event) -> PbEvent {
    let kind = match event.kind {
        EventKind::Put => EventType::Put,
        EventKind::Delete => EventType::Delete,
    };
    let seq = event.seq;
    PbEvent {
        r#type: kind as i32,
        kv: Some(PbKeyValue {
            seq,
            ..kv_pb(event.kv)
        }),
        prev_kv: event.prev_kv.map(kv_pb),
    }
}
