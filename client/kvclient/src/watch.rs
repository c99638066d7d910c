//! Watches: a [`WatchStream`] of the changes to a key, a prefix or a range,
//! that resumes by itself on another member when its member fails.
//!
//! [`Client::watch`](crate::Client::watch) opens a `Kv.Watch` stream on a
//! member (round-robin, or the one named with
//! [`Client::watch_on`](crate::Client::watch_on)), waits for the server's
//! `created`, and hands back the stream. A task of its own reads the
//! server's messages into a bounded queue ([`WATCH_QUEUE_BATCHES`]): a
//! caller that reads slowly holds the server's watcher back, which then
//! reads its backlog from the change history, never from memory.
//!
//! Resuming: the stream knows the next revision whose events it has not
//! all delivered (and, for a revision the server split over several
//! messages, how many of its events it has). When the member's stream
//! ends or fails, it opens a watch on another member from that revision
//! and drops the events of that revision it already delivered: every
//! member sends the same events in the same order, so the caller gets each
//! event exactly once, in revision order. It keeps trying, with backoff,
//! for [`WATCH_RESUME_WINDOW`]; then the stream yields
//! [`Error::Unavailable`] and ends. A watch whose next revision was
//! compacted yields [`Error::Compacted`] and ends.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use kvproto::kv::v1 as pb;
use prost::bytes::Bytes;
use tokio::sync::mpsc;
use tokio_stream::Stream;
use tokio_stream::wrappers::ReceiverStream;

use crate::error::{Error, Result};
use crate::router::{Router, Target};
use crate::txn::key_value;
use crate::types::{Consistency, KeyValue};

/// Batches a watch stream holds for its caller before it stops reading
/// from the server.
pub const WATCH_QUEUE_BATCHES: usize = 16;
/// How long a watch keeps trying to resume on some member before it gives
/// up with [`Error::Unavailable`].
pub const WATCH_RESUME_WINDOW: Duration = Duration::from_secs(30);
/// How long a member has to answer a watch's create.
pub const WATCH_CREATE_TIMEOUT: Duration = Duration::from_secs(10);

/// What to watch, and how.
#[derive(Debug, Clone)]
pub struct Watch {
    key: Bytes,
    range_end: Bytes,
    start_revision: u64,
    prev_kv: bool,
    no_put: bool,
    no_delete: bool,
    progress_notify: bool,
    consistency: Option<Consistency>,
}

/// `prefix` with its last byte that is not 0xff incremented: the first key
/// after every key with the prefix (`"\0"` = no end when there is none).
pub(crate) fn prefix_end(prefix: &[u8]) -> Bytes {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return Bytes::from(end);
        }
    }
    Bytes::from_static(b"\0")
}

impl Watch {
    fn new(key: Bytes, range_end: Bytes) -> Watch {
        Watch {
            key,
            range_end,
            start_revision: 0,
            prev_kv: false,
            no_put: false,
            no_delete: false,
            progress_notify: false,
            consistency: None,
        }
    }

    /// One key.
    pub fn key(key: impl Into<Bytes>) -> Watch {
        Watch::new(key.into(), Bytes::new())
    }

    /// Every key that starts with `prefix` (an empty prefix: every key).
    pub fn prefix(prefix: impl Into<Bytes>) -> Watch {
        let prefix = prefix.into();
        let end = prefix_end(&prefix);
        Watch::new(prefix, end)
    }

    /// Keys from `from` (included) to `to` (excluded; `None` = no end).
    pub fn range(from: impl Into<Bytes>, to: Option<Bytes>) -> Watch {
        Watch::new(from.into(), to.unwrap_or(Bytes::from_static(b"\0")))
    }

    /// Events from this revision on; 0 (the default) = after the current
    /// revision.
    pub fn start_revision(mut self, revision: u64) -> Watch {
        self.start_revision = revision;
        self
    }

    /// Each event carries the key's previous state.
    pub fn prev_kv(mut self) -> Watch {
        self.prev_kv = true;
        self
    }

    /// Leave out puts.
    pub fn no_put(mut self) -> Watch {
        self.no_put = true;
        self
    }

    /// Leave out deletes.
    pub fn no_delete(mut self) -> Watch {
        self.no_delete = true;
        self
    }

    /// Ask the server for periodic progress notifications (empty batches)
    /// while the watch is caught up.
    pub fn progress_notify(mut self) -> Watch {
        self.progress_notify = true;
        self
    }

    /// How a start from "now" finds the current revision (the client's
    /// default otherwise): linearizable (a read index) or stale.
    pub fn consistency(mut self, consistency: Consistency) -> Watch {
        self.consistency = Some(consistency);
        self
    }
}

/// Put or delete.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventKind {
    /// The key got a value.
    Put,
    /// The key was deleted (by a delete, a range delete or its TTL).
    Delete,
}

/// One change of one key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchEvent {
    /// Put or delete.
    pub kind: EventKind,
    /// The key after a put; for a delete, the key with `mod_revision` =
    /// the delete's revision and every other field zero.
    pub kv: KeyValue,
    /// With [`Watch::prev_kv`]: the key before the change, if it existed.
    pub prev_kv: Option<KeyValue>,
}

impl WatchEvent {
    /// The change's revision.
    pub fn revision(&self) -> u64 {
        self.kv.revisions.mod_revision
    }
}

/// One message of a watch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchBatch {
    /// The member that sent it.
    pub member_id: u64,
    /// With events: the store revision when they were read. Without (a
    /// progress notification): every event up to it has been delivered.
    pub revision: u64,
    /// The events, in revision order; empty for a progress notification.
    pub events: Vec<WatchEvent>,
}

/// The changes of a [`Watch`], batch by batch; resumes on another member
/// by itself (see the module's documentation).
pub struct WatchStream {
    batches: ReceiverStream<Result<WatchBatch>>,
    state: Arc<std::sync::Mutex<Cursor>>,
    created_revision: u64,
    task: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for WatchStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WatchStream")
            .field("created_revision", &self.created_revision)
            .field("next_revision", &self.next_revision())
            .finish_non_exhaustive()
    }
}

impl WatchStream {
    /// The revision the watch started after: its events are those above
    /// it.
    pub fn created_revision(&self) -> u64 {
        self.created_revision
    }

    /// The next revision whose events have not all been delivered: where
    /// a new watch would resume. (When the server split that revision
    /// over several messages, some of its events may have been delivered
    /// already; this stream drops them when it resumes by itself, a new
    /// watch from here would send them again.)
    pub fn next_revision(&self) -> u64 {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .next_revision
    }
}

impl Drop for WatchStream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Stream for WatchStream {
    type Item = Result<WatchBatch>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        Pin::new(&mut self.batches).poll_next(cx)
    }
}

/// Where a watch is: every event below `next_revision` delivered, and the
/// first `delivered_in_next` events of `next_revision` (a split revision).
#[derive(Debug, Clone, Copy, Default)]
struct Cursor {
    next_revision: u64,
    delivered_in_next: usize,
}

impl Cursor {
    /// Takes one message's events, in order: drops those delivered before
    /// (below the cursor, and the first `to_skip` of the cursor's revision,
    /// which a stream resumed inside a split revision sends again), returns
    /// the rest, and moves past what the message sent whole: after a
    /// progress notification (no events) its header's revision, after a
    /// message that does not split a revision its last event's.
    fn absorb(
        &mut self,
        to_skip: &mut usize,
        received: Vec<WatchEvent>,
        fragment: bool,
        header_revision: u64,
    ) -> Vec<WatchEvent> {
        let whole_through = match received.last() {
            None => Some(header_revision),
            Some(last) if !fragment => Some(last.revision()),
            Some(_) => None,
        };
        let mut events = Vec::with_capacity(received.len());
        for event in received {
            let revision = event.revision();
            if revision < self.next_revision {
                continue;
            }
            if revision == self.next_revision && *to_skip > 0 {
                *to_skip -= 1;
                continue;
            }
            if revision == self.next_revision {
                self.delivered_in_next += 1;
            } else {
                // Past the split revision: nothing of it is owed again.
                *to_skip = 0;
                *self = Cursor {
                    next_revision: revision,
                    delivered_in_next: 1,
                };
            }
            events.push(event);
        }
        if let Some(through) = whole_through
            && through >= self.next_revision
        {
            *to_skip = 0;
            *self = Cursor {
                next_revision: through + 1,
                delivered_in_next: 0,
            };
        }
        events
    }
}

/// How one member's stream ended.
enum Ended {
    /// The caller is gone.
    Caller,
    /// The watch cannot go on anywhere (compacted, refused).
    Fatal(Error),
    /// The member failed or went away: resume elsewhere.
    Member(String),
}

fn event_of(event: pb::Event) -> Result<WatchEvent> {
    let kind = match pb::EventType::try_from(event.r#type) {
        Ok(pb::EventType::Put) => EventKind::Put,
        Ok(pb::EventType::Delete) => EventKind::Delete,
        Err(_) => {
            return Err(Error::Protocol(format!(
                "Event.type {} is not a known event type",
                event.r#type
            )));
        }
    };
    let kv = event
        .kv
        .ok_or_else(|| Error::Protocol("Event.kv is missing".into()))?;
    Ok(WatchEvent {
        kind,
        kv: key_value(kv),
        prev_kv: event.prev_kv.map(key_value),
    })
}

struct Watcher {
    router: Arc<Router>,
    watch: Watch,
    consistency: i32,
    cursor: Arc<std::sync::Mutex<Cursor>>,
    out: mpsc::Sender<Result<WatchBatch>>,
}

impl Watcher {
    fn cursor(&self) -> Cursor {
        *self
            .cursor
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn set_cursor(&self, cursor: Cursor) {
        *self
            .cursor
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = cursor;
    }

    /// Opens the watch on `addr`'s channel from the cursor (or from the
    /// watch's own start the first time): the server's response stream,
    /// after its `created`, with the created revision. The request sender
    /// must live as long as the stream.
    async fn open(
        &self,
        channel: crate::router::Channel,
        start_revision: u64,
    ) -> Result<(
        tonic::Streaming<pb::WatchResponse>,
        mpsc::Sender<pb::WatchRequest>,
        u64,
    )> {
        let (requests, request_stream) = mpsc::channel(1);
        let create = pb::WatchRequest {
            request: Some(pb::watch_request::Request::Create(pb::WatchCreateRequest {
                key: self.watch.key.clone(),
                range_end: self.watch.range_end.clone(),
                start_revision,
                progress_notify: self.watch.progress_notify,
                no_put: self.watch.no_put,
                no_delete: self.watch.no_delete,
                prev_kv: self.watch.prev_kv,
                watch_id: 0,
                consistency: self.consistency,
            })),
        };
        requests
            .send(create)
            .await
            .map_err(|_| Error::Protocol("the watch request stream closed".into()))?;
        let opened = async {
            let mut responses = crate::client::kv(channel)
                .watch(ReceiverStream::new(request_stream))
                .await
                .map_err(status_error)?
                .into_inner();
            let first = responses
                .message()
                .await
                .map_err(status_error)?
                .ok_or_else(|| Error::Protocol("the watch stream ended before `created`".into()))?;
            Ok::<_, Error>((responses, first))
        };
        let (responses, first) = tokio::time::timeout(WATCH_CREATE_TIMEOUT, opened)
            .await
            .map_err(|_| Error::Unavailable {
                attempts: 1,
                message: format!("no watch created within {WATCH_CREATE_TIMEOUT:?}"),
            })??;
        if !first.created {
            return Err(Error::Protocol(
                "the first message of a watch is not `created`".into(),
            ));
        }
        if first.canceled {
            return Err(cancel_error(&first));
        }
        let revision = first.header.map_or(0, |h| h.revision);
        Ok((responses, requests, revision))
    }

    /// Reads one member's stream until it ends.
    async fn follow(
        &self,
        mut responses: tonic::Streaming<pb::WatchResponse>,
        member_id: &mut u64,
        healthy: &mut Instant,
    ) -> Ended {
        // Events of the cursor's revision this stream re-sends first.
        let mut to_skip = self.cursor().delivered_in_next;
        loop {
            let response = match responses.message().await {
                Ok(Some(response)) => response,
                Ok(None) => return Ended::Member("the member ended the watch stream".into()),
                Err(status) => {
                    return Ended::Member(format!("{:?}: {}", status.code(), status.message()));
                }
            };
            *healthy = Instant::now();
            if response.canceled {
                return if response.unavailable {
                    Ended::Member(format!(
                        "the member could not serve the watch: {}",
                        response.cancel_reason
                    ))
                } else {
                    Ended::Fatal(cancel_error(&response))
                };
            }
            let header = response.header.unwrap_or_default();
            *member_id = header.member_id;
            let sent = !response.events.is_empty();
            let received: Result<Vec<WatchEvent>> =
                response.events.into_iter().map(event_of).collect();
            let received = match received {
                Ok(received) => received,
                Err(err) => return Ended::Fatal(err),
            };
            let mut cursor = self.cursor();
            let events = cursor.absorb(&mut to_skip, received, response.fragment, header.revision);
            self.set_cursor(cursor);
            if sent && events.is_empty() {
                continue; // every event of it was delivered before
            }
            let batch = WatchBatch {
                member_id: header.member_id,
                revision: header.revision,
                events,
            };
            if self.out.send(Ok(batch)).await.is_err() {
                return Ended::Caller;
            }
        }
    }

    /// Follows the watch over members until the caller goes or it cannot
    /// go on.
    async fn run(
        self,
        first: (
            tonic::Streaming<pb::WatchResponse>,
            mpsc::Sender<pb::WatchRequest>,
            String,
        ),
    ) {
        let settings = self.router.settings().clone();
        let (mut responses, mut requests, mut addr) = first;
        let mut member_id = 0;
        let mut healthy = Instant::now();
        let mut backoff = settings.backoff_base;
        loop {
            let ended = self.follow(responses, &mut member_id, &mut healthy).await;
            drop(requests);
            let mut last = match ended {
                Ended::Caller => return,
                Ended::Fatal(err) => {
                    let _ = self.out.send(Err(err)).await;
                    return;
                }
                Ended::Member(why) => format!("{addr}: {why}"),
            };
            self.router.mark(&addr, false);
            // Resume on another member, from the cursor.
            loop {
                if healthy.elapsed() > WATCH_RESUME_WINDOW {
                    let _ = self
                        .out
                        .send(Err(Error::Unavailable {
                            attempts: 0,
                            message: format!(
                                "no member resumed the watch within {WATCH_RESUME_WINDOW:?} (the \
                                 limit WATCH_RESUME_WINDOW); last: {last}"
                            ),
                        }))
                        .await;
                    return;
                }
                tokio::select! {
                    () = tokio::time::sleep(backoff) => {}
                    () = self.out.closed() => return,
                }
                backoff = (backoff * 2).min(settings.backoff_cap);
                let (next, channel) = match self.router.pick(Target::Any) {
                    Ok(picked) => picked,
                    Err(err) => {
                        let _ = self.out.send(Err(err)).await;
                        return;
                    }
                };
                let start = self.cursor().next_revision;
                match self.open(channel, start).await {
                    Ok((stream, sender, _)) => {
                        tracing::debug!(member = %next, start, "watch resumed");
                        self.router.mark(&next, true);
                        (responses, requests, addr) = (stream, sender, next);
                        healthy = Instant::now();
                        backoff = settings.backoff_base;
                        break;
                    }
                    Err(err @ Error::Compacted { .. }) => {
                        let _ = self.out.send(Err(err)).await;
                        return;
                    }
                    Err(err) => {
                        self.router.mark(&next, false);
                        last = format!("{next}: {err}");
                    }
                }
            }
        }
    }
}

fn status_error(status: tonic::Status) -> Error {
    match crate::error::classify(&status) {
        crate::error::Verdict::Fatal(err) => err,
        _ => Error::Rpc {
            code: status.code(),
            message: status.message().to_string(),
        },
    }
}

/// A cancel as an error: compacted; this member could not serve it (try
/// another); or the create was refused (its reason names the field or
/// limit: no member will take it).
fn cancel_error(response: &pb::WatchResponse) -> Error {
    if response.compact_revision != 0 {
        Error::Compacted {
            compact_revision: response.compact_revision,
        }
    } else if response.unavailable {
        Error::Unavailable {
            attempts: 1,
            message: format!(
                "the member could not serve the watch: {}",
                response.cancel_reason
            ),
        }
    } else {
        Error::InvalidArgument {
            message: format!("the watch was refused: {}", response.cancel_reason),
            limit: None,
        }
    }
}

/// Opens `watch` on `addr` (or a member picked round-robin), then follows
/// it on its own task.
pub(crate) async fn start(
    router: Arc<Router>,
    watch: Watch,
    addr: Option<&str>,
) -> Result<WatchStream> {
    let consistency = match watch.consistency.unwrap_or(router.settings().consistency) {
        Consistency::Stale { .. } => pb::Consistency::Stale,
        _ => pb::Consistency::Linearizable,
    } as i32;
    let (out, batches) = mpsc::channel(WATCH_QUEUE_BATCHES);
    let cursor = Arc::new(std::sync::Mutex::new(Cursor::default()));
    let watcher = Watcher {
        router: router.clone(),
        watch: watch.clone(),
        consistency,
        cursor: cursor.clone(),
        out,
    };
    // The first member: the one named, or the first that creates it.
    let attempts = router.settings().attempts.max(1);
    let mut last = None;
    for _ in 0..attempts {
        let (member, channel) = match addr {
            Some(addr) => router.channel_to(addr)?,
            None => router.pick(Target::Any)?,
        };
        match watcher.open(channel, watch.start_revision).await {
            Ok((responses, requests, created)) => {
                watcher.set_cursor(Cursor {
                    next_revision: created + 1,
                    delivered_in_next: 0,
                });
                let task = tokio::spawn(watcher.run((responses, requests, member)));
                return Ok(WatchStream {
                    batches: ReceiverStream::new(batches),
                    state: cursor,
                    created_revision: created,
                    task,
                });
            }
            Err(err @ (Error::Compacted { .. } | Error::InvalidArgument { .. })) => {
                return Err(err);
            }
            Err(err) => {
                router.mark(&member, false);
                last = Some(err);
                if addr.is_some() {
                    break;
                }
            }
        }
    }
    Err(last.unwrap_or(Error::Unavailable {
        attempts,
        message: "no member created the watch".into(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::Revisions;

    fn event(revision: u64, n: usize) -> WatchEvent {
        WatchEvent {
            kind: EventKind::Put,
            kv: KeyValue {
                key: Bytes::from(format!("k{n}")),
                value: Bytes::new(),
                revisions: Revisions {
                    mod_revision: revision,
                    ..Revisions::default()
                },
                seq: 0,
                ttl_left: None,
            },
            prev_kv: None,
        }
    }

    fn names(events: &[WatchEvent]) -> Vec<(u64, String)> {
        events
            .iter()
            .map(|e| {
                (
                    e.revision(),
                    String::from_utf8_lossy(&e.kv.key).into_owned(),
                )
            })
            .collect()
    }

    /// Revision 5 holds events k0..k5, split over messages of 4 and 2.
    fn revision_five(from: usize, to: usize) -> Vec<WatchEvent> {
        (from..to).map(|n| event(5, n)).collect()
    }

    #[test]
    fn a_resume_inside_a_split_revision_delivers_the_rest_of_it_once() {
        let mut cursor = Cursor {
            next_revision: 4,
            delivered_in_next: 0,
        };
        let mut to_skip = 0;
        let mut first = vec![event(4, 9)];
        first.extend(revision_five(0, 3));
        // The first message ends inside revision 5 (a fragment).
        let got = cursor.absorb(&mut to_skip, first, true, 7);
        assert_eq!(got.len(), 4);
        assert_eq!((cursor.next_revision, cursor.delivered_in_next), (5, 3));
        // The member fails; another resumes from revision 5, from its
        // start: the 3 events already delivered are dropped.
        let mut to_skip = cursor.delivered_in_next;
        let got = cursor.absorb(&mut to_skip, revision_five(0, 4), true, 7);
        assert_eq!(names(&got), vec![(5, "k3".to_string())]);
        let mut rest = revision_five(4, 6);
        rest.push(event(6, 0));
        let got = cursor.absorb(&mut to_skip, rest, false, 7);
        assert_eq!(
            names(&got),
            vec![(5, "k4".into()), (5, "k5".into()), (6, "k0".into())]
        );
        assert_eq!((cursor.next_revision, cursor.delivered_in_next), (7, 0));
    }

    #[test]
    fn events_below_the_cursor_are_dropped_and_progress_moves_it() {
        let mut cursor = Cursor {
            next_revision: 10,
            delivered_in_next: 0,
        };
        let mut to_skip = 0;
        let got = cursor.absorb(&mut to_skip, vec![event(8, 0), event(9, 1)], false, 12);
        assert!(got.is_empty());
        assert_eq!(cursor.next_revision, 10);
        // A progress notification at 14: nothing up to 14 is missing.
        let got = cursor.absorb(&mut to_skip, Vec::new(), false, 14);
        assert!(got.is_empty());
        assert_eq!(cursor.next_revision, 15);
        // A progress below the cursor does not move it back.
        cursor.absorb(&mut to_skip, Vec::new(), false, 3);
        assert_eq!(cursor.next_revision, 15);
        let got = cursor.absorb(&mut to_skip, vec![event(15, 0), event(16, 0)], false, 16);
        assert_eq!(got.len(), 2);
        assert_eq!(cursor.next_revision, 17);
    }
}
