//! etcd's `Watch` service over the native watch machinery
//! (`server/watch.rs`): the client's messages are translated one by one
//! into native watch requests and fed to one native watch stream; its
//! answers are translated back. Three differences are bridged here:
//!
//! - A watch from the compact revision itself: etcd serves it (the
//!   compacted state keeps that revision's writes), while the native
//!   history's window starts above it. The watch is created natively from
//!   the revision after, and the events of the compact revision itself —
//!   the puts whose `mod_revision` it is, read at that revision — are sent
//!   first, right after `created`. (etcd no longer has that revision's
//!   deletes either.)
//! - `fragment`: the native stream splits a revision larger than a page
//!   over several messages; a watch created without `fragment` gets each
//!   revision's events in one message, as etcd sends them, up to
//!   [`ETCD_WATCH_JOINED_BYTES_MAX`] per watch and
//!   [`ETCD_WATCH_STREAM_JOINED_BYTES_MAX`] per stream (beyond them in
//!   several, see there).
//! - Filters: etcd's `NOPUT` / `NODELETE` list becomes the native flags.

use std::collections::{HashMap, VecDeque};
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};

use kvproto::etcd::etcdserverpb::watch_server::Watch;
use kvproto::etcd::etcdserverpb::{
    ResponseHeader, WatchCreateRequest, WatchRequest, WatchResponse, watch_create_request,
    watch_request,
};
use kvproto::etcd::mvccpb;
use kvproto::kv::v1 as native;
use kvproto::kv::v1::kv_server::Kv as NativeKv;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::{Stream, StreamExt as _};
use tonic::{Request, Response, Status, Streaming};

use super::kv::key_value;
use super::{EtcdFrontEnd, non_negative, revision_i64};

/// Translated requests waiting for the native stream.
const WATCH_REQUESTS_BUFFERED: usize = 16;
/// Translated answers buffered for the client.
const WATCH_RESPONSES_BUFFERED: usize = 4;
/// Bytes of one revision's events joined into one message at most, for a
/// watch created without `fragment` (encoded events). A revision larger
/// than this (thousands of large keys written by one transaction) reaches
/// such a watch in several messages without the `fragment` flag, each at
/// most this large or one native page (`WATCH_PAGE_BYTES_MAX` beyond its
/// first event), instead of one message above the port's response limit
/// ([`super::ETCD_RESPONSE_BYTES_MAX`], which would end the whole stream);
/// it is also what one watcher holds in memory while joining. etcd sends
/// such a revision whole whatever its size.
pub const ETCD_WATCH_JOINED_BYTES_MAX: usize = 4 * 1024 * 1024;
const _: () = assert!(ETCD_WATCH_JOINED_BYTES_MAX < super::ETCD_RESPONSE_BYTES_MAX);
/// Bytes one watch stream holds while joining, across all its watches: a
/// stream of many watches each joining a large revision would otherwise
/// hold [`ETCD_WATCH_JOINED_BYTES_MAX`] per watch. Past it, what the
/// watches hold goes out as it is (in several messages, as past the
/// per-watch bound).
pub const ETCD_WATCH_STREAM_JOINED_BYTES_MAX: usize = 2 * ETCD_WATCH_JOINED_BYTES_MAX;

/// The events held back for watches that did not ask for fragments,
/// joined until their revision's last page, within
/// [`ETCD_WATCH_JOINED_BYTES_MAX`] per watch and
/// [`ETCD_WATCH_STREAM_JOINED_BYTES_MAX`] per stream.
#[derive(Debug, Default)]
struct Joined {
    /// Per watch: its held events, their encoded size, and the header of
    /// the last page held (at or after every held event's revision).
    held: HashMap<i64, Held>,
    /// The sum of the held sizes.
    total: usize,
}

/// One watch's held events (see [`Joined`]).
#[derive(Debug, Default)]
struct Held {
    events: Vec<mvccpb::Event>,
    bytes: usize,
    header: Option<ResponseHeader>,
}

/// A message [`Joined::add`] sends out before holding a page.
type Flushed = (i64, Vec<mvccpb::Event>, Option<ResponseHeader>);

impl Joined {
    /// Whether `id` holds events.
    fn holds(&self, id: i64) -> bool {
        self.held.contains_key(&id)
    }

    /// Forgets what `id` holds (its watch was cancelled).
    fn forget(&mut self, id: i64) {
        if let Some(held) = self.held.remove(&id) {
            self.total -= held.bytes;
        }
    }

    /// Takes what `id` holds.
    fn take(&mut self, id: i64) -> Vec<mvccpb::Event> {
        self.take_held(id).1
    }

    fn take_held(&mut self, id: i64) -> Flushed {
        match self.held.remove(&id) {
            Some(held) => {
                self.total -= held.bytes;
                (id, held.events, held.header)
            }
            None => (id, Vec::new(), None),
        }
    }

    /// Adds a page of `id`'s events, answered with `header`. Returns what
    /// must go out before it, each with its own last header: `id`'s held
    /// events when the page would pass the watch's bound or the stream's,
    /// then, while the stream's bound is still passed, the other watches'
    /// held events, the largest first (so a small revision stays whole
    /// unless it alone is left to give way).
    fn add(
        &mut self,
        id: i64,
        events: Vec<mvccpb::Event>,
        header: Option<ResponseHeader>,
    ) -> Vec<Flushed> {
        let bytes: usize = events.iter().map(prost::Message::encoded_len).sum();
        let mut out = Vec::new();
        let own = self.held.get(&id).map_or(0, |held| held.bytes);
        if own > 0
            && (own + bytes > ETCD_WATCH_JOINED_BYTES_MAX
                || self.total + bytes > ETCD_WATCH_STREAM_JOINED_BYTES_MAX)
        {
            out.push(self.take_held(id));
        }
        while self.total + bytes > ETCD_WATCH_STREAM_JOINED_BYTES_MAX {
            let Some(largest) = self
                .held
                .iter()
                .max_by_key(|(other, held)| (held.bytes, std::cmp::Reverse(**other)))
                .map(|(other, _)| *other)
            else {
                break;
            };
            out.push(self.take_held(largest));
        }
        let held = self.held.entry(id).or_default();
        held.events.extend(events);
        held.bytes += bytes;
        held.header = header;
        self.total += bytes;
        out
    }
}

/// The response stream of `Watch.Watch`.
pub type WatchStream = Pin<Box<dyn Stream<Item = Result<WatchResponse, Status>> + Send>>;

/// What a create asked for that the native answers do not carry.
#[derive(Clone, Debug)]
struct Created {
    /// Events split over messages are passed on as they are.
    fragment: bool,
    /// Send the compact revision's own events first: (revision, the native
    /// range of the watch, whether puts are filtered out).
    compact_start: Option<(u64, native::RangeRequest)>,
}

/// The native create of an etcd one, and what to remember of it.
fn native_create(
    create: WatchCreateRequest,
    compact_revision: u64,
) -> (native::WatchCreateRequest, Created) {
    let no_put = create
        .filters
        .contains(&(watch_create_request::FilterType::Noput as i32));
    let no_delete = create
        .filters
        .contains(&(watch_create_request::FilterType::Nodelete as i32));
    let mut start = non_negative(create.start_revision);
    let mut compact_start = None;
    if start != 0 && start == compact_revision {
        start += 1;
        if !no_put {
            // A range read needs a key: "" (every key, with range_end
            // "\0", as etcd's watches take it) reads from "\0", the
            // first possible key.
            let key = if create.key.is_empty() {
                vec![0u8].into()
            } else {
                create.key.clone()
            };
            compact_start = Some((
                compact_revision,
                native::RangeRequest {
                    key,
                    range_end: create.range_end.clone(),
                    revision: compact_revision,
                    min_mod_revision: compact_revision,
                    max_mod_revision: compact_revision,
                    consistency: native::Consistency::Stale as i32,
                    ..Default::default()
                },
            ));
        }
    }
    (
        native::WatchCreateRequest {
            key: create.key,
            range_end: create.range_end,
            start_revision: start,
            progress_notify: create.progress_notify,
            no_put,
            no_delete,
            prev_kv: create.prev_kv,
            watch_id: create.watch_id,
            consistency: native::Consistency::Linearizable as i32,
        },
        Created {
            fragment: create.fragment,
            compact_start,
        },
    )
}

fn event(event: native::Event) -> mvccpb::Event {
    let kind = match native::EventType::try_from(event.r#type) {
        Ok(native::EventType::Delete) => mvccpb::event::EventType::Delete,
        _ => mvccpb::event::EventType::Put,
    };
    mvccpb::Event {
        r#type: kind as i32,
        kv: event.kv.map(key_value),
        prev_kv: event.prev_kv.map(key_value),
    }
}

impl EtcdFrontEnd {
    /// Reads the client's messages, translated, into `native`; remembers
    /// each create's extras in `creates` (in create order, as the native
    /// stream answers them).
    async fn translate_requests(
        self,
        mut requests: Streaming<WatchRequest>,
        native: mpsc::Sender<Result<native::WatchRequest, Status>>,
        creates: Arc<Mutex<VecDeque<Created>>>,
    ) {
        loop {
            let request = match requests.message().await {
                Ok(Some(request)) => request,
                // The client closed its side: the native stream keeps its
                // watches (as etcd does) until the client goes.
                Ok(None) => {
                    native.closed().await;
                    return;
                }
                Err(_) => return,
            };
            let translated = match request.request_union {
                Some(watch_request::RequestUnion::CreateRequest(create)) => {
                    let compact_revision = self
                        .kv
                        .state_machine()
                        .history()
                        .read()
                        .unwrap_or_else(PoisonError::into_inner)
                        .compact_revision();
                    let (create, created) = native_create(create, compact_revision);
                    creates
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .push_back(created);
                    native::watch_request::Request::Create(create)
                }
                Some(watch_request::RequestUnion::CancelRequest(cancel)) => {
                    native::watch_request::Request::Cancel(native::WatchCancelRequest {
                        watch_id: cancel.watch_id,
                    })
                }
                Some(watch_request::RequestUnion::ProgressRequest(_)) => {
                    native::watch_request::Request::Progress(native::WatchProgressRequest {})
                }
                // etcd 3.4 ignores a request with nothing set; so does this
                // port (ending the stream would end its other watches).
                None => continue,
            };
            let message = native::WatchRequest {
                request: Some(translated),
            };
            if native.send(Ok(message)).await.is_err() {
                return;
            }
        }
    }

    /// The compact revision's own puts in a watch's range (see the module
    /// doc), or why they could not be read.
    async fn compact_revision_events(
        &self,
        range: native::RangeRequest,
    ) -> Result<Vec<mvccpb::Event>, Status> {
        let answer = NativeKv::range(&self.kv, Request::new(range))
            .await?
            .into_inner();
        Ok(answer
            .kvs
            .into_iter()
            .map(|kv| mvccpb::Event {
                r#type: mvccpb::event::EventType::Put as i32,
                kv: Some(key_value(kv)),
                prev_kv: None,
            })
            .collect())
    }

    /// Translates the native answers for the client.
    async fn translate_responses(
        self,
        mut answers: crate::server::watch::WatchStream,
        out: mpsc::Sender<Result<WatchResponse, Status>>,
        creates: Arc<Mutex<VecDeque<Created>>>,
    ) {
        let mut watches: HashMap<i64, Created> = HashMap::new();
        // Fragments held back for watches that did not ask for them.
        let mut joined = Joined::default();
        loop {
            let answer = tokio::select! {
                answer = answers.next() => answer,
                () = out.closed() => return,
            };
            let answer = match answer {
                Some(Ok(answer)) => answer,
                Some(Err(status)) => {
                    let _ = out.send(Err(super::errors::to_etcd(status))).await;
                    return;
                }
                None => return,
            };
            let id = answer.watch_id;
            let header = EtcdFrontEnd::header_of(answer.header);
            let mut compact_start = None;
            if answer.created {
                let created = creates
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .pop_front();
                if let Some(created) = created
                    && !answer.canceled
                {
                    compact_start = created.compact_start.clone();
                    watches.insert(id, created);
                }
            }
            if answer.canceled {
                watches.remove(&id);
                joined.forget(id);
            }
            let fragment_allowed = watches.get(&id).is_some_and(|w| w.fragment);
            let mut events: Vec<mvccpb::Event> = answer.events.into_iter().map(event).collect();
            if !fragment_allowed && !answer.canceled && (answer.fragment || joined.holds(id)) {
                // Too large to join: what is held goes out on its own.
                for (watch_id, events, header) in joined.add(id, events, header) {
                    let message = WatchResponse {
                        header,
                        watch_id,
                        events,
                        ..Default::default()
                    };
                    if out.send(Ok(message)).await.is_err() {
                        return;
                    }
                }
                if answer.fragment {
                    continue;
                }
                events = joined.take(id);
            }
            let message = WatchResponse {
                header,
                watch_id: id,
                created: answer.created,
                canceled: answer.canceled,
                compact_revision: revision_i64(answer.compact_revision),
                cancel_reason: answer.cancel_reason,
                fragment: fragment_allowed && answer.fragment,
                events,
            };
            if out.send(Ok(message)).await.is_err() {
                return;
            }
            if let Some((revision, range)) = compact_start {
                let message = match self.compact_revision_events(range).await {
                    Ok(events) if events.is_empty() => continue,
                    Ok(events) => WatchResponse {
                        header: Some(self.header()),
                        watch_id: id,
                        events,
                        ..Default::default()
                    },
                    // Not readable (compacted further meanwhile, or too
                    // many keys): the watch is cancelled as compacted, so
                    // the client re-reads and watches again.
                    Err(status) => WatchResponse {
                        header: Some(self.header()),
                        watch_id: id,
                        canceled: true,
                        compact_revision: revision_i64(revision),
                        cancel_reason: status.message().to_string(),
                        ..Default::default()
                    },
                };
                if out.send(Ok(message)).await.is_err() {
                    return;
                }
            }
        }
    }
}

#[tonic::async_trait]
impl Watch for EtcdFrontEnd {
    type WatchStream = WatchStream;

    async fn watch(
        &self,
        request: Request<Streaming<WatchRequest>>,
    ) -> Result<Response<WatchStream>, Status> {
        let (native_requests, native_stream) = mpsc::channel(WATCH_REQUESTS_BUFFERED);
        let (out, responses) = mpsc::channel(WATCH_RESPONSES_BUFFERED);
        let creates = Arc::new(Mutex::new(VecDeque::new()));
        let answers = self.kv.watch_stream(ReceiverStream::new(native_stream));
        tokio::spawn(self.clone().translate_requests(
            request.into_inner(),
            native_requests,
            creates.clone(),
        ));
        tokio::spawn(self.clone().translate_responses(answers, out, creates));
        Ok(Response::new(Box::pin(ReceiverStream::new(responses))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A page of `n` put events of `value_bytes` each.
    fn page(n: usize, value_bytes: usize) -> Vec<mvccpb::Event> {
        (0..n)
            .map(|i| mvccpb::Event {
                r#type: mvccpb::event::EventType::Put as i32,
                kv: Some(mvccpb::KeyValue {
                    key: format!("k{i}").into_bytes().into(),
                    value: vec![b'v'; value_bytes].into(),
                    ..Default::default()
                }),
                prev_kv: None,
            })
            .collect()
    }

    fn header(revision: i64) -> Option<ResponseHeader> {
        Some(ResponseHeader {
            revision,
            ..Default::default()
        })
    }

    #[test]
    fn joining_is_bounded_per_watch_and_per_stream() {
        const MIB: usize = 1024 * 1024;
        let mut joined = Joined::default();
        // Below both bounds: held, nothing goes out.
        assert!(joined.add(1, page(3, MIB), header(10)).is_empty());
        assert!(joined.holds(1));
        // Past the watch's own bound: its 3 MiB go out first, with the
        // header they came with.
        let out = joined.add(1, page(2, MIB), header(11));
        assert_eq!(out.len(), 1);
        assert_eq!((out[0].0, out[0].1.len(), out[0].2), (1, 3, header(10)));
        // Other watches fill the stream: each below its own bound.
        assert!(joined.add(2, page(3, MIB), header(12)).is_empty());
        assert!(joined.add(3, page(1, MIB / 2), header(13)).is_empty());
        assert!(joined.total <= ETCD_WATCH_STREAM_JOINED_BYTES_MAX);
        // Past the stream's bound (within watch 3's own): watch 3's held
        // events go out, and as that is not enough, the largest other's
        // (watch 2's 3 MiB), not watch 1's 2 MiB.
        let out = joined.add(3, page(3, MIB), header(9));
        let ids: Vec<i64> = out.iter().map(|(id, ..)| *id).collect();
        assert_eq!(ids, [3, 2]);
        assert_eq!(out[1].2, header(12), "a flushed watch keeps its own header");
        assert!(joined.holds(1), "a smaller revision stays whole");
        assert!(joined.total <= ETCD_WATCH_STREAM_JOINED_BYTES_MAX);
        assert_eq!(joined.take(3).len(), 3);
        assert_eq!(joined.take(1).len(), 2);
        assert_eq!(joined.total, 0);
        // A cancelled watch's held events are forgotten with their bytes.
        assert!(joined.add(4, page(1, MIB), header(14)).is_empty());
        joined.forget(4);
        assert_eq!(joined.total, 0);
    }

    /// A small revision held over two pages stays whole while large ones
    /// of other watches make room.
    #[test]
    fn a_small_revision_stays_whole_under_stream_pressure() {
        const MIB: usize = 1024 * 1024;
        let mut joined = Joined::default();
        assert!(joined.add(1, page(39, MIB / 10), header(1)).is_empty());
        assert!(joined.add(2, page(39, MIB / 10), header(2)).is_empty());
        assert!(joined.add(3, page(1, 50 * 1024), header(3)).is_empty());
        // A fourth watch's page passes the stream's bound: one of the
        // large ones gives way, and that is enough.
        let out = joined.add(4, page(3, MIB / 10), header(4));
        let ids: Vec<i64> = out.iter().map(|(id, ..)| *id).collect();
        assert_eq!(ids, [1]);
        assert!(joined.total <= ETCD_WATCH_STREAM_JOINED_BYTES_MAX);
        assert!(joined.holds(3));
    }

    #[test]
    fn a_watch_from_the_compact_revision_starts_after_it_and_reads_it() {
        let create = WatchCreateRequest {
            key: "a".into(),
            start_revision: 5,
            filters: vec![watch_create_request::FilterType::Nodelete as i32],
            ..Default::default()
        };
        let (native, created) = native_create(create.clone(), 5);
        assert_eq!(native.start_revision, 6);
        assert!(native.no_delete && !native.no_put);
        let (revision, range) = created.compact_start.expect("reads revision 5");
        assert_eq!(revision, 5);
        assert_eq!((range.min_mod_revision, range.max_mod_revision), (5, 5));
        // Below or above the compact revision: as asked.
        let (native, created) = native_create(create.clone(), 4);
        assert_eq!(native.start_revision, 5);
        assert!(created.compact_start.is_none());
        let (native, _) = native_create(create, 7);
        assert_eq!(native.start_revision, 5);
        // Every key ("" to "\0"): the compact revision's read starts at "\0".
        let every = WatchCreateRequest {
            key: Vec::new().into(),
            range_end: vec![0u8].into(),
            start_revision: 5,
            ..Default::default()
        };
        let (native, created) = native_create(every, 5);
        assert!(native.key.is_empty());
        let (_, range) = created.compact_start.expect("reads revision 5");
        assert_eq!(
            (&range.key[..], &range.range_end[..]),
            (&[0u8][..], &[0u8][..])
        );
    }
}
