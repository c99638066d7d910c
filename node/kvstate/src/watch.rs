//! Change events read from the change history: what a watcher of a key, a
//! prefix or a range is sent, page by page, from any revision inside the
//! window ([`events`]).
//!
//! The history already holds, for every key changed within the window,
//! each version with where its record is ([`crate::history`]); a watcher's
//! events are those versions in revision order, read back from the
//! segments on demand. Nothing here runs on the apply path, and nothing is
//! buffered per watcher: a watcher that fell behind reads its backlog from
//! the history exactly as one that keeps up reads the last entry's events,
//! so a slow watcher costs memory only for the page it is being sent.
//!
//! Order: by revision; within a revision (one request or one transaction),
//! in the order the apply wrote the records (their sequence numbers). The
//! history is the same on every replica, so is every page: a watcher that
//! resumes on another member from `last seen revision + 1` receives every
//! later event exactly once.
//!
//! A page never starts below the window: events at or below the compact
//! revision are gone (their versions were forgotten), and a read from there
//! is refused as compacted, naming the compact revision, so the watcher
//! re-reads and resumes from there (etcd cancels such a watch the same way).

use std::collections::HashMap;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::{Duration, Instant};

use bitcask::{Engine, StoredKind};

use crate::history::{History, Version};
use crate::range::{HISTORY_READ_WAIT_MAX, KeyBounds, KeyValue};

/// Events one page carries at most (a page may end inside a revision; see
/// [`EventCursor`]).
pub const WATCH_PAGE_EVENTS_MAX: usize = 1000;
/// Bytes of keys and values (prev values included) one page carries at
/// most, beyond its first event: below the 8 MiB client message.
pub const WATCH_PAGE_BYTES_MAX: usize = 4 * 1024 * 1024;
/// History records one page examines at most, matching or not: what bounds
/// the time a page holds the history's read lock (and so the apply) when a
/// narrow watcher reads a long stretch of other keys' changes.
pub const WATCH_PAGE_SCAN_RECORDS_MAX: usize = 100_000;
/// First wait before a page is read again after a merge moved a record.
const RETRY_WAIT: Duration = Duration::from_millis(1);
/// Longest wait between two attempts.
const RETRY_WAIT_MAX: Duration = Duration::from_millis(100);

/// What a watcher watches.
#[derive(Clone, Debug)]
pub struct WatchSpec {
    /// The keys: etcd's reading of a key and a range end (empty: the key
    /// alone; `"\0"`: every key from `key` on; else `[key, range_end)`).
    pub bounds: KeyBounds,
    /// Send each event's previous state of the key, when it had one.
    pub prev_kv: bool,
    /// Leave out puts (etcd's `NOPUT` filter).
    pub no_put: bool,
    /// Leave out deletes (etcd's `NODELETE` filter).
    pub no_delete: bool,
}

impl WatchSpec {
    /// A watch of `key` / `range_end` (etcd's meanings), every option off.
    pub fn new(key: &[u8], range_end: &[u8]) -> WatchSpec {
        WatchSpec {
            bounds: KeyBounds::new(key, range_end),
            prev_kv: false,
            no_put: false,
            no_delete: false,
        }
    }

    /// Whether a change of `key` concerns this watcher (reserved keys never
    /// do; the history holds none).
    pub fn matches(&self, key: &[u8]) -> bool {
        !key.starts_with(crate::command::RESERVED_KEY_PREFIX) && self.bounds.contains(key)
    }

    fn wants(&self, kind: EventKind) -> bool {
        match kind {
            EventKind::Put => !self.no_put,
            EventKind::Delete => !self.no_delete,
        }
    }
}

/// A put or a delete (etcd's `mvccpb.Event.EventType`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EventKind {
    /// The key got a value.
    Put,
    /// The key was deleted (by a delete, a range delete or its TTL).
    Delete,
}

/// One change of one key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    /// Put or delete.
    pub kind: EventKind,
    /// The key after the change: for a put, its value and revisions; for a
    /// delete, the key with `mod_revision` = the delete's revision and
    /// every other field zero (as etcd sends it).
    pub kv: KeyValue,
    /// The sequence number of the change's record.
    pub seq: u64,
    /// With [`WatchSpec::prev_kv`]: the key before the change, if it
    /// existed then.
    pub prev_kv: Option<KeyValue>,
}

impl Event {
    /// The change's revision.
    pub fn revision(&self) -> u64 {
        self.kv.mod_revision
    }

    /// Bytes of keys and values the event carries.
    pub fn bytes(&self) -> usize {
        self.kv.key.len()
            + self.kv.value.len()
            + self
                .prev_kv
                .as_ref()
                .map_or(0, |prev| prev.key.len() + prev.value.len())
    }
}

/// Where a watcher is: the next revision whose events it has not all had,
/// and how many of that revision's (filtered) events it has had already (a
/// page may end inside a large revision).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct EventCursor {
    /// The revision.
    pub revision: u64,
    /// Events of `revision` already delivered.
    pub skip: usize,
}

impl EventCursor {
    /// The start of `revision`'s events.
    pub fn at(revision: u64) -> EventCursor {
        EventCursor { revision, skip: 0 }
    }
}

/// One page of events.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EventPage {
    /// The events, in order.
    pub events: Vec<Event>,
    /// Where the next page starts. Every event before it up to the page's
    /// end has been returned: with `next.skip == 0`, every event at
    /// revisions below `next.revision`.
    pub next: EventCursor,
    /// The store revision of the history the page was read from.
    pub revision: u64,
}

/// Why a page could not be read.
#[derive(Debug, thiserror::Error)]
pub enum EventsError {
    /// The page would start at or below the compact revision: those events
    /// are gone (etcd cancels the watch with its `compact_revision`).
    #[error(
        "mvcc: required revision has been compacted: the watch needs revision {requested}, the \
         history serves events above revision {compact_revision}"
    )]
    Compacted {
        /// The revision the page would start at.
        requested: u64,
        /// The compact revision.
        compact_revision: u64,
    },
    /// An event's record could not be read.
    #[error("engine: {0}")]
    Engine(#[from] bitcask::Error),
    /// Merges kept moving the page's records for
    /// [`HISTORY_READ_WAIT_MAX`].
    #[error(
        "the change history's records kept moving for {HISTORY_READ_WAIT_MAX:?} (the limit \
         HISTORY_READ_WAIT_MAX); retry"
    )]
    HistoryUnstable,
}

/// The next page of `spec`'s events from `from`, up to revision `through`
/// (at most the history's revision): whole revisions while they fit in
/// [`WATCH_PAGE_EVENTS_MAX`] events and [`WATCH_PAGE_BYTES_MAX`] bytes (by
/// the records' stored sizes); a revision larger than that alone is cut
/// (the page holds only it, `next.skip` > 0, and the next page goes on
/// inside it); at most [`WATCH_PAGE_SCAN_RECORDS_MAX`] records examined.
/// Reads under the history's read lock (the apply waits for it: that is
/// what the bounds are for), taking the engine (`engine`) under it; starts
/// over when a merge moved a record, for up to [`HISTORY_READ_WAIT_MAX`].
/// Blocking: run it off the async workers.
pub fn events(
    engine: impl Fn() -> Arc<Engine>,
    history: &RwLock<History>,
    spec: &WatchSpec,
    from: EventCursor,
    through: u64,
) -> Result<EventPage, EventsError> {
    let mut wait = RETRY_WAIT;
    let deadline = Instant::now() + HISTORY_READ_WAIT_MAX;
    loop {
        let attempt = {
            let history = history.read().unwrap_or_else(PoisonError::into_inner);
            page_in(&engine(), &history, spec, from, through)
        };
        match attempt {
            Err(EventsError::Engine(bitcask::Error::LocationGone { .. }))
                if Instant::now() < deadline =>
            {
                std::thread::sleep(wait);
                wait = (wait * 2).min(RETRY_WAIT_MAX);
            }
            Err(EventsError::Engine(bitcask::Error::LocationGone { .. })) => {
                return Err(EventsError::HistoryUnstable);
            }
            other => return other,
        }
    }
}

/// One attempt at [`events`] with the history's read lock held by the
/// caller (`engine` taken under it): what a caller that tries the lock
/// without waiting uses. A record a merge moved is
/// `EventsError::Engine(bitcask::Error::LocationGone)`: retry, or call
/// [`events`].
pub fn page_in(
    engine: &Engine,
    history: &History,
    spec: &WatchSpec,
    from: EventCursor,
    through: u64,
) -> Result<EventPage, EventsError> {
    let through = through.min(history.revision());
    let mut page = EventPage {
        events: Vec::new(),
        next: from,
        revision: history.revision(),
    };
    if from.revision > through {
        return Ok(page);
    }
    if from.revision <= history.compact_revision() {
        return Err(EventsError::Compacted {
            requested: from.revision,
            compact_revision: history.compact_revision(),
        });
    }
    let mut bytes = 0;
    let mut scanned = 0;
    let mut records = history.records_from(from.revision).peekable();
    while let Some(&(revision, _)) = records.peek() {
        if revision > through {
            break;
        }
        if scanned >= WATCH_PAGE_SCAN_RECORDS_MAX {
            // At a revision boundary: nothing between the last revision
            // examined and this one changed.
            page.next = EventCursor::at(revision);
            return Ok(page);
        }
        // One revision's matching versions, in the order they were written.
        // A request may write one key twice at one revision (a batch's put
        // and delete): its records are then consecutive versions, and its
        // n-th record at the revision is the n-th of them.
        let mut changes: Vec<(&[u8], usize, &[Version])> = Vec::new();
        let mut seen_at_revision: HashMap<&[u8], usize> = HashMap::new();
        while let Some(&(at, key)) = records.peek() {
            if at != revision {
                break;
            }
            records.next();
            scanned += 1;
            if !spec.matches(key) {
                continue;
            }
            let nth = seen_at_revision.entry(key).or_insert(0);
            let versions = history.versions(key).unwrap_or(&[]);
            let position = versions.partition_point(|v| v.revision < revision) + *nth;
            *nth += 1;
            if versions
                .get(position)
                .is_none_or(|v| v.revision != revision)
            {
                return Err(EventsError::Engine(bitcask::Error::Corruption {
                    file: String::new(),
                    offset: 0,
                    reason: format!(
                        "the change history lost {} at revision {revision}",
                        crate::range::shown(key)
                    ),
                }));
            }
            let kind = event_kind(versions[position].kind);
            if spec.wants(kind) {
                changes.push((key, position, versions));
            }
        }
        changes.sort_by_key(|(_, position, versions)| versions[*position].location.seq);
        let skip = if revision == from.revision {
            from.skip
        } else {
            0
        };
        // A revision is cut only when it alone is larger than a page: one
        // that does not fit after others starts the next page.
        if !page.events.is_empty() {
            let rest = changes.get(skip..).unwrap_or(&[]);
            let estimate: usize = rest
                .iter()
                .map(|(_, position, versions)| {
                    let prev = match position.checked_sub(1) {
                        Some(before) if spec.prev_kv => versions[before].location.len,
                        _ => 0,
                    };
                    (versions[*position].location.len + prev) as usize
                })
                .sum();
            if page.events.len() + rest.len() > WATCH_PAGE_EVENTS_MAX
                || bytes + estimate > WATCH_PAGE_BYTES_MAX
            {
                page.next = EventCursor { revision, skip };
                return Ok(page);
            }
        }
        for (done, (key, position, versions)) in changes.iter().enumerate().skip(skip) {
            if page.events.len() >= WATCH_PAGE_EVENTS_MAX || bytes >= WATCH_PAGE_BYTES_MAX {
                // Cut inside the revision: the next page resumes here.
                page.next = EventCursor {
                    revision,
                    skip: done,
                };
                return Ok(page);
            }
            let event = read_event(engine, spec, key, &versions[..=*position])?;
            bytes += event.bytes();
            page.events.push(event);
        }
        page.next = EventCursor::at(revision + 1);
        if page.events.len() >= WATCH_PAGE_EVENTS_MAX || bytes >= WATCH_PAGE_BYTES_MAX {
            return Ok(page);
        }
    }
    // Every record up to `through` was examined.
    page.next = EventCursor::at(through + 1);
    Ok(page)
}

fn event_kind(kind: StoredKind) -> EventKind {
    match kind {
        StoredKind::Put => EventKind::Put,
        StoredKind::Tombstone => EventKind::Delete,
    }
}

/// The event of the last of `versions` (the earlier ones are the key's
/// states before it), its values read from the engine.
fn read_event(
    engine: &Engine,
    spec: &WatchSpec,
    key: &[u8],
    versions: &[Version],
) -> Result<Event, EventsError> {
    let (version, before) = versions
        .split_last()
        .expect("the change's version is there");
    let kv = match version.kind {
        StoredKind::Put => KeyValue::from_meta(
            key.to_vec(),
            engine.read_record(&version.location)?.value,
            &version.meta,
        ),
        StoredKind::Tombstone => KeyValue {
            key: key.to_vec(),
            mod_revision: version.revision,
            ..KeyValue::default()
        },
    };
    let prev_kv = match before.last() {
        Some(prev) if spec.prev_kv && prev.kind == StoredKind::Put => Some(KeyValue::from_meta(
            key.to_vec(),
            engine.read_record(&prev.location)?.value,
            &prev.meta,
        )),
        _ => None,
    };
    Ok(Event {
        kind: event_kind(version.kind),
        kv,
        seq: version.location.seq,
        prev_kv,
    })
}
