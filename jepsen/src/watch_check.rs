//! The watch checker (the `watch` workload, [`crate::workload::watch`]):
//! judges what every watcher received against every other watcher, the
//! writes' outcomes and acknowledged revisions, and the linearizable reads.
//!
//! A watcher's **covered span** is what it vouches for: each of its streams
//! covers `[start, next - 1]`, from the stream's first revision (the asked
//! start, or the created revision + 1 for a start at "now") to the highest
//! `next_revision` the client reported on it (every event below it was
//! delivered). Claims, each an anomaly kind when broken:
//!
//! - *out-of-order*: a watcher's events are not in revision order (an
//!   event below one it already had, or below its stream's start);
//! - *duplicate*: a watcher received one event twice, or one put (its
//!   unique value) at two revisions;
//! - *missing-event*: a revision inside a watcher's span at which another
//!   watcher received events and this one none (a skipped event);
//! - *disagreement*: two watchers received different events at one
//!   revision (a watcher whose span ends inside that revision only has to
//!   hold a prefix);
//! - *acknowledged-missing*: an acknowledged put (or a delete that removed
//!   a key) whose revision lies in a watcher's span, absent from that
//!   watcher's events at that revision;
//! - *revision-mismatch*: a put's event at a revision other than the one
//!   its write was acknowledged with;
//! - *phantom*: a put event whose value no put wrote, or only a failed one;
//! - *event-before-invoke*: a put's event at a revision at or below one
//!   the linearizable history had already shown (a write acknowledged, or a
//!   linearizable read answered, before the put was invoked);
//! - *unexplained-delete*: a delete event that neither a delete of that key
//!   (acknowledged at that revision, or of unknown outcome) nor the expiry
//!   of the put it removed (a put with a TTL) explains;
//! - *prev-mismatch*: an event's `prev_kv`, `version` or `create_revision`
//!   disagrees with the key's previous event (checked only where the
//!   watchers' spans cover every revision between the two);
//! - *read-mismatch*: an ok linearizable read whose answer (value and
//!   `mod_revision`, or absent) disagrees with the key's events up to the
//!   read's header revision (checked where the spans cover that stretch);
//! - *revision-gap* (when every revision of the run is a change of the
//!   watched keys, as in the watch workload): a revision inside a span at
//!   which no watcher received anything and no write was acknowledged —
//!   every revision is a change, so every one has an event.
//!
//! The run's shortfalls ([`shortfalls`]) are not anomalies: no event at
//! all, no watcher that moved to another member (the resume path never
//! ran), or a watcher whose span ends below the final read's revision.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde::Serialize;

use crate::workload::{EventKind, Function, Op, Outcome, Record, WatchEventRecord};

/// Anomalies listed in full in the report (the counts are always exact).
pub const ANOMALIES_LISTED_MAX: usize = 50;

/// What went wrong.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum WatchAnomalyKind {
    /// An event below one the watcher already had, or below its stream's start.
    OutOfOrder,
    /// One event twice, or one put at two revisions, in one watcher.
    Duplicate,
    /// A revision in the watcher's span with events elsewhere, none here.
    MissingEvent,
    /// Two watchers' events differ at one revision.
    Disagreement,
    /// An acknowledged write missing at its revision in a covering watcher.
    AcknowledgedMissing,
    /// A put's event at a revision other than its acknowledged one.
    RevisionMismatch,
    /// A put event no invoked, not-failed put explains.
    Phantom,
    /// A put's event at or below a revision seen before the put was invoked.
    EventBeforeInvoke,
    /// A delete event no delete and no expiry explains.
    UnexplainedDelete,
    /// `prev_kv`, `version` or `create_revision` against the key's previous event.
    PrevMismatch,
    /// A linearizable read that disagrees with the events.
    ReadMismatch,
    /// A covered revision with no event anywhere and no write acknowledged.
    RevisionGap,
}

impl WatchAnomalyKind {
    /// Every kind, in report order.
    pub const ALL: [WatchAnomalyKind; 12] = [
        Self::OutOfOrder,
        Self::Duplicate,
        Self::MissingEvent,
        Self::Disagreement,
        Self::AcknowledgedMissing,
        Self::RevisionMismatch,
        Self::Phantom,
        Self::EventBeforeInvoke,
        Self::UnexplainedDelete,
        Self::PrevMismatch,
        Self::ReadMismatch,
        Self::RevisionGap,
    ];

    /// The kebab-case name (as in `checker.json`).
    pub fn name(self) -> &'static str {
        match self {
            Self::OutOfOrder => "out-of-order",
            Self::Duplicate => "duplicate",
            Self::MissingEvent => "missing-event",
            Self::Disagreement => "disagreement",
            Self::AcknowledgedMissing => "acknowledged-missing",
            Self::RevisionMismatch => "revision-mismatch",
            Self::Phantom => "phantom",
            Self::EventBeforeInvoke => "event-before-invoke",
            Self::UnexplainedDelete => "unexplained-delete",
            Self::PrevMismatch => "prev-mismatch",
            Self::ReadMismatch => "read-mismatch",
            Self::RevisionGap => "revision-gap",
        }
    }
}

/// One anomaly.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct WatchAnomaly {
    /// What went wrong.
    pub kind: WatchAnomalyKind,
    /// The watcher it was seen in, when one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub watcher: Option<u64>,
    /// The revision.
    pub revision: u64,
    /// The key, when one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// Ids of the operations involved (writes, reads, watch records).
    pub ops: Vec<u64>,
    /// A sentence with the numbers.
    pub detail: String,
}

/// The watch checker's report.
#[derive(Debug, Clone, Default, Serialize)]
pub struct WatchReport {
    /// `valid` or `not-valid`.
    pub verdict: String,
    /// No anomaly.
    pub valid: bool,
    /// Watchers seen.
    pub watchers: usize,
    /// Streams opened (a watcher opens a new one after its stream ended).
    pub streams: usize,
    /// Streams that ended with an error.
    pub stream_errors: usize,
    /// Times a watcher's batches came from another member than its
    /// previous batch (the client resumed elsewhere, or a new stream).
    pub member_switches: usize,
    /// Events received, all watchers.
    pub events: usize,
    /// Distinct revisions with events.
    pub revisions_with_events: usize,
    /// Revisions inside some watcher's span.
    pub revisions_covered: u64,
    /// Each watcher's span: (watcher, first, last) per stream.
    pub spans: Vec<(u64, u64, u64)>,
    /// Puts and deletes acknowledged / failed / of unknown outcome.
    pub writes_ok: usize,
    /// Writes that definitely did not apply.
    pub writes_failed: usize,
    /// Writes of unknown outcome.
    pub writes_unknown: usize,
    /// Acknowledged writes (with a revision) inside some watcher's span:
    /// each was looked for in every watcher covering it.
    pub acknowledged_checked: usize,
    /// Delete events explained only by the expiry of a TTL put.
    pub expiry_deletes: usize,
    /// Linearizable reads compared with the events.
    pub reads_checked: usize,
    /// The final read's header revision, when there is one.
    pub final_revision: Option<u64>,
    /// Whether every covered revision had to have an event (revision-gap).
    pub every_revision_watched: bool,
    /// Anomalies by kind (every kind, zeros included).
    pub anomalies_by_kind: BTreeMap<String, usize>,
    /// The first [`ANOMALIES_LISTED_MAX`] anomalies.
    pub anomalies: Vec<WatchAnomaly>,
}

impl WatchReport {
    /// Anomalies of one kind.
    pub fn count(&self, kind: WatchAnomalyKind) -> usize {
        self.anomalies_by_kind
            .get(kind.name())
            .copied()
            .unwrap_or(0)
    }

    /// A short human verdict.
    pub fn summary(&self) -> String {
        let mut out = format!(
            "watch: {}: {} watchers, {} streams ({} ended with an error), {} member switches, \
             {} events over {} revisions covered; writes {} ok / {} failed / {} unknown, {} \
             acknowledged checked, {} expiry deletes, {} reads checked\n",
            if self.valid { "VALID" } else { "NOT VALID" },
            self.watchers,
            self.streams,
            self.stream_errors,
            self.member_switches,
            self.events,
            self.revisions_covered,
            self.writes_ok,
            self.writes_failed,
            self.writes_unknown,
            self.acknowledged_checked,
            self.expiry_deletes,
            self.reads_checked,
        );
        for (kind, count) in self.anomalies_by_kind.iter().filter(|(_, n)| **n > 0) {
            out.push_str(&format!("  {kind}: {count}\n"));
        }
        for anomaly in self.anomalies.iter().take(10) {
            out.push_str(&format!(
                "  {} at revision {}{}: {} (ops {:?})\n",
                anomaly.kind.name(),
                anomaly.revision,
                anomaly
                    .watcher
                    .map_or(String::new(), |w| format!(" (watcher {w})")),
                anomaly.detail,
                anomaly.ops
            ));
        }
        out
    }
}

/// One watcher's view, built from its records in history order.
#[derive(Debug, Default)]
struct Watcher<'a> {
    id: u64,
    /// Events by revision, in arrival order, with the record's op id.
    by_revision: BTreeMap<u64, Vec<(&'a WatchEventRecord, u64)>>,
    /// Stream -> (start, highest next_revision).
    streams: BTreeMap<u64, (u64, u64)>,
}

impl Watcher<'_> {
    /// Spans `[first, last]` of its streams (empty ones left out).
    fn spans(&self) -> Vec<(u64, u64)> {
        self.streams
            .values()
            .filter(|(start, next)| *next > *start)
            .map(|&(start, next)| (start, next - 1))
            .collect()
    }

    fn covers(&self, revision: u64) -> bool {
        self.streams
            .values()
            .any(|&(start, next)| start <= revision && revision < next)
    }

    fn events_at(&self, revision: u64) -> Vec<&WatchEventRecord> {
        self.by_revision
            .get(&revision)
            .map(|events| events.iter().map(|(e, _)| *e).collect())
            .unwrap_or_default()
    }
}

/// Merged spans of every watcher: sorted, disjoint, non-adjacent.
#[derive(Debug, Default)]
struct Coverage(Vec<(u64, u64)>);

impl Coverage {
    fn new(mut spans: Vec<(u64, u64)>) -> Self {
        spans.sort_unstable();
        let mut merged: Vec<(u64, u64)> = Vec::new();
        for (first, last) in spans {
            match merged.last_mut() {
                Some(prev) if first <= prev.1.saturating_add(1) => prev.1 = prev.1.max(last),
                _ => merged.push((first, last)),
            }
        }
        Self(merged)
    }

    /// Whether every revision of `[first, last]` is in some span.
    fn contains_all(&self, first: u64, last: u64) -> bool {
        first > last || self.0.iter().any(|&(a, b)| a <= first && last <= b)
    }

    fn revisions(&self) -> u64 {
        self.0.iter().map(|(a, b)| b - a + 1).sum()
    }
}

/// The events of one key by revision, from the reference lists.
type KeyTimeline<'a> = BTreeMap<u64, &'a WatchEventRecord>;

struct Checker<'a> {
    ops: Vec<&'a Op>,
    watchers: BTreeMap<u64, Watcher<'a>>,
    /// Revision -> the reference events (the longest list; a covering
    /// watcher's when one covers it).
    reference: BTreeMap<u64, Vec<&'a WatchEventRecord>>,
    coverage: Coverage,
    /// (key, value) -> the put of it (values are unique).
    puts: HashMap<(&'a str, &'a str), &'a Op>,
    /// key -> its deletes.
    deletes: HashMap<&'a str, Vec<&'a Op>>,
    anomalies: Vec<WatchAnomaly>,
}

/// Checks a watch history. `every_revision_watched`: every store revision
/// of the run is a change of a watched key (the workload writes nothing
/// else), so a covered revision without any event is a gap.
pub fn check(records: &[Record], every_revision_watched: bool) -> WatchReport {
    let ops: Vec<&Op> = records
        .iter()
        .filter_map(|r| match r {
            Record::Op(op) => Some(op),
            Record::Nemesis(_) => None,
        })
        .collect();
    let mut report = WatchReport {
        every_revision_watched,
        ..WatchReport::default()
    };
    let mut checker = Checker {
        ops,
        watchers: BTreeMap::new(),
        reference: BTreeMap::new(),
        coverage: Coverage::default(),
        puts: HashMap::new(),
        deletes: HashMap::new(),
        anomalies: Vec::new(),
    };
    checker.index_writes(&mut report);
    checker.build_watchers(&mut report);
    checker.build_reference();
    checker.check_agreement();
    checker.check_acknowledged(&mut report);
    checker.check_puts();
    checker.check_deletes(&mut report);
    checker.check_prev();
    checker.check_reads(&mut report);
    if every_revision_watched {
        checker.check_gaps();
    }
    report.revisions_with_events = checker.reference.len();
    report.revisions_covered = checker.coverage.revisions();
    report.final_revision = checker
        .ops
        .iter()
        .filter(|op| op.final_read && op.f == Function::Read && op.outcome == Outcome::Ok)
        .filter_map(|op| op.revision)
        .max();
    finish(report, checker.anomalies)
}

impl<'a> Checker<'a> {
    fn anomaly(
        &mut self,
        kind: WatchAnomalyKind,
        watcher: Option<u64>,
        revision: u64,
        key: Option<&str>,
        ops: Vec<u64>,
        detail: String,
    ) {
        self.anomalies.push(WatchAnomaly {
            kind,
            watcher,
            revision,
            key: key.map(str::to_string),
            ops,
            detail,
        });
    }

    fn index_writes(&mut self, report: &mut WatchReport) {
        for op in self.ops.iter().copied() {
            match op.f {
                Function::Write => {
                    if let Some(value) = &op.value {
                        self.puts.insert((op.key.as_str(), value.as_str()), op);
                    }
                }
                Function::Delete => self.deletes.entry(op.key.as_str()).or_default().push(op),
                _ => continue,
            }
            match op.outcome {
                Outcome::Ok => report.writes_ok += 1,
                Outcome::Fail => report.writes_failed += 1,
                Outcome::Info => report.writes_unknown += 1,
            }
        }
    }

    /// Each watcher's events in arrival order: order and duplicates are
    /// judged here, spans and member switches counted.
    fn build_watchers(&mut self, report: &mut WatchReport) {
        let mut last_member: HashMap<u64, u64> = HashMap::new();
        let mut last_revision: HashMap<u64, u64> = HashMap::new();
        // (watcher, key, value) -> revision of the put's first event.
        let mut put_seen: HashMap<(u64, &str, &str), u64> = HashMap::new();
        let ops = self.ops.clone();
        for op in ops {
            let Some(record) = op.watch.as_ref().filter(|_| op.f.is_watch()) else {
                continue;
            };
            let id = record.watcher;
            let watcher = self.watchers.entry(id).or_insert_with(|| Watcher {
                id,
                ..Watcher::default()
            });
            if op.f == Function::WatchOpen {
                if op.outcome == Outcome::Ok {
                    report.streams += 1;
                    let start = record.start_revision.unwrap_or(record.next_revision);
                    watcher
                        .streams
                        .insert(record.stream, (start, record.next_revision.max(start)));
                }
                continue;
            }
            if op.outcome != Outcome::Ok {
                report.stream_errors += 1;
                continue;
            }
            let Some(&(start, _)) = watcher.streams.get(&record.stream) else {
                continue;
            };
            if let Some(member) = op.member
                && last_member.insert(id, member).is_some_and(|m| m != member)
            {
                report.member_switches += 1;
            }
            let mut found = Vec::new();
            for event in &record.events {
                report.events += 1;
                let last = last_revision.get(&id).copied().unwrap_or(0);
                let list = watcher.by_revision.entry(event.revision).or_default();
                let again = list.iter().any(|(e, _)| *e == event);
                if again {
                    found.push((
                        WatchAnomalyKind::Duplicate,
                        event,
                        "received twice".to_string(),
                    ));
                    continue;
                }
                if event.revision < last || event.revision < start {
                    found.push((
                        WatchAnomalyKind::OutOfOrder,
                        event,
                        format!("after revision {last}, in a stream that started at {start}"),
                    ));
                }
                list.push((event, op.id));
                last_revision.insert(id, last.max(event.revision));
                if event.kind == EventKind::Put
                    && let Some(value) = &event.value
                    && let Some(first) =
                        put_seen.insert((id, event.key.as_str(), value.as_str()), event.revision)
                    && first != event.revision
                {
                    found.push((
                        WatchAnomalyKind::Duplicate,
                        event,
                        format!("the put of {value:?} was delivered at revision {first} too"),
                    ));
                }
            }
            let stream = watcher
                .streams
                .entry(record.stream)
                .or_insert((start, start));
            stream.1 = stream.1.max(record.next_revision);
            for (kind, event, detail) in found {
                self.anomaly(
                    kind,
                    Some(id),
                    event.revision,
                    Some(&event.key),
                    vec![op.id],
                    format!("{}: {detail}", describe(event)),
                );
            }
        }
        report.watchers = self.watchers.len();
        let mut spans = Vec::new();
        for watcher in self.watchers.values() {
            for (first, last) in watcher.spans() {
                spans.push((first, last));
                report.spans.push((watcher.id, first, last));
            }
        }
        self.coverage = Coverage::new(spans);
    }

    /// The reference events of each revision: a covering watcher's list
    /// when one covers it, else the longest.
    fn build_reference(&mut self) {
        let mut reference: BTreeMap<u64, (bool, Vec<&'a WatchEventRecord>)> = BTreeMap::new();
        for watcher in self.watchers.values() {
            for (&revision, events) in &watcher.by_revision {
                let covered = watcher.covers(revision);
                let list: Vec<_> = events.iter().map(|(e, _)| *e).collect();
                match reference.get(&revision) {
                    Some((had_cover, had)) if (*had_cover, had.len()) >= (covered, list.len()) => {}
                    _ => {
                        reference.insert(revision, (covered, list));
                    }
                }
            }
        }
        self.reference = reference
            .into_iter()
            .map(|(revision, (_, list))| (revision, list))
            .collect();
    }

    /// Every watcher holds the reference events of each revision in its
    /// span (a prefix of them outside it), and none where it has none.
    fn check_agreement(&mut self) {
        let mut found = Vec::new();
        for watcher in self.watchers.values() {
            for (&revision, reference) in &self.reference {
                let mine = watcher.events_at(revision);
                let covered = watcher.covers(revision);
                // The records of this revision; for a skipped one, the
                // record of the watcher's next event (it went past it).
                let mut ops: Vec<u64> = watcher
                    .by_revision
                    .range(revision..)
                    .next()
                    .map(|(_, l)| l.iter().map(|(_, op)| *op).collect())
                    .unwrap_or_default();
                ops.dedup();
                if mine.is_empty() {
                    if covered {
                        found.push((
                            WatchAnomalyKind::MissingEvent,
                            watcher.id,
                            revision,
                            reference[0].key.clone(),
                            ops,
                            format!(
                                "inside the watcher's span, it received nothing at this \
                                 revision; another watcher received {}",
                                describe_all(reference)
                            ),
                        ));
                    }
                    continue;
                }
                let agrees = if covered {
                    mine == *reference
                } else {
                    reference.starts_with(&mine)
                };
                if !agrees {
                    found.push((
                        WatchAnomalyKind::Disagreement,
                        watcher.id,
                        revision,
                        mine[0].key.clone(),
                        ops,
                        format!(
                            "received {}; another watcher received {}",
                            describe_all(&mine),
                            describe_all(reference)
                        ),
                    ));
                }
            }
        }
        for (kind, watcher, revision, key, ops, detail) in found {
            self.anomaly(kind, Some(watcher), revision, Some(&key), ops, detail);
        }
    }

    /// Every acknowledged put, and every acknowledged delete that removed
    /// a key, is at its revision in every watcher whose span holds it.
    fn check_acknowledged(&mut self, report: &mut WatchReport) {
        let mut found = Vec::new();
        for op in self.ops.iter().copied() {
            let kind = match op.f {
                Function::Write => EventKind::Put,
                Function::Delete if op.found == Some(true) => EventKind::Delete,
                _ => continue,
            };
            let (Outcome::Ok, Some(revision)) = (op.outcome, op.revision) else {
                continue;
            };
            let mut checked = false;
            for watcher in self.watchers.values().filter(|w| w.covers(revision)) {
                checked = true;
                let events = watcher.events_at(revision);
                let there = events.iter().any(|e| {
                    e.kind == kind
                        && e.key == op.key
                        && (kind == EventKind::Delete || e.value == op.value)
                });
                if !there {
                    found.push((
                        watcher.id,
                        op,
                        revision,
                        format!(
                            "the {} of {} acknowledged at revision {revision} is not there: \
                             the watcher received {}",
                            if kind == EventKind::Put {
                                "put"
                            } else {
                                "delete"
                            },
                            op.key,
                            if events.is_empty() {
                                "nothing at this revision".to_string()
                            } else {
                                describe_all(&events)
                            }
                        ),
                    ));
                }
            }
            report.acknowledged_checked += usize::from(checked);
        }
        for (watcher, op, revision, detail) in found {
            self.anomaly(
                WatchAnomalyKind::AcknowledgedMissing,
                Some(watcher),
                revision,
                Some(&op.key),
                vec![op.id],
                detail,
            );
        }
    }

    /// Every distinct put event: an invoked put that did not fail wrote
    /// it, at its acknowledged revision, above every revision the history
    /// showed before the put was invoked.
    fn check_puts(&mut self) {
        // (complete_ns, revision) of every ok write and linearizable read,
        // by completion; with the running maximum of revisions.
        let mut seen: Vec<(u64, u64, u64)> = self
            .ops
            .iter()
            .filter(|op| op.outcome == Outcome::Ok && !op.f.is_watch())
            .filter(|op| op.f.is_write() || op.stale_min_index.is_none())
            .filter_map(|op| op.revision.map(|r| (op.complete_ns, r, op.id)))
            .collect();
        seen.sort_unstable();
        let mut running = Vec::with_capacity(seen.len());
        let mut highest = (0, 0);
        for &(complete_ns, revision, id) in &seen {
            if revision > highest.0 {
                highest = (revision, id);
            }
            running.push((complete_ns, highest));
        }
        let mut events: BTreeSet<(u64, &'a str, &'a str)> = BTreeSet::new();
        for watcher in self.watchers.values() {
            for events_at in watcher.by_revision.values() {
                for (event, _) in events_at {
                    if event.kind == EventKind::Put
                        && let Some(value) = &event.value
                    {
                        events.insert((event.revision, event.key.as_str(), value.as_str()));
                    }
                }
            }
        }
        for (revision, key, value) in events {
            let Some(put) = self.puts.get(&(key, value)).copied() else {
                self.anomaly(
                    WatchAnomalyKind::Phantom,
                    None,
                    revision,
                    Some(key),
                    Vec::new(),
                    format!("a put of {value:?} that no write invoked"),
                );
                continue;
            };
            if put.outcome == Outcome::Fail {
                self.anomaly(
                    WatchAnomalyKind::Phantom,
                    None,
                    revision,
                    Some(key),
                    vec![put.id],
                    format!(
                        "the put of {value:?} failed ({})",
                        put.error.as_deref().unwrap_or("")
                    ),
                );
                continue;
            }
            if put.outcome == Outcome::Ok
                && let Some(acknowledged) = put.revision
                && acknowledged != revision
            {
                self.anomaly(
                    WatchAnomalyKind::RevisionMismatch,
                    None,
                    revision,
                    Some(key),
                    vec![put.id],
                    format!("the put of {value:?} was acknowledged at revision {acknowledged}"),
                );
            }
            let before = running.partition_point(|(complete_ns, _)| *complete_ns < put.invoke_ns);
            if before > 0 {
                let (floor, by) = running[before - 1].1;
                if revision <= floor {
                    self.anomaly(
                        WatchAnomalyKind::EventBeforeInvoke,
                        None,
                        revision,
                        Some(key),
                        vec![put.id, by],
                        format!(
                            "the put of {value:?} was invoked after op {by} had shown revision \
                             {floor}"
                        ),
                    );
                }
            }
        }
    }

    /// Every distinct delete event: a delete of the key acknowledged at
    /// that revision, or one of unknown outcome, or the expiry of the put
    /// it removed.
    fn check_deletes(&mut self, report: &mut WatchReport) {
        let mut events: BTreeSet<(u64, &'a str)> = BTreeSet::new();
        let mut prev_values: HashMap<(u64, &'a str), &'a str> = HashMap::new();
        for watcher in self.watchers.values() {
            for events_at in watcher.by_revision.values() {
                for (event, _) in events_at {
                    if event.kind == EventKind::Delete {
                        events.insert((event.revision, event.key.as_str()));
                        if let Some(prev) = &event.prev_value {
                            prev_values.insert((event.revision, event.key.as_str()), prev);
                        }
                    }
                }
            }
        }
        let timelines = self.timelines();
        for (revision, key) in events {
            let by_delete = self.deletes.get(key).into_iter().flatten().any(|op| {
                op.outcome == Outcome::Info
                    || (op.outcome == Outcome::Ok
                        && op.found == Some(true)
                        && op.revision == Some(revision))
            });
            if by_delete {
                continue;
            }
            // The put it removed: from prev_kv, or the key's previous event.
            let removed = prev_values.get(&(revision, key)).copied().or_else(|| {
                timelines
                    .get(key)
                    .and_then(|t| t.range(..revision).next_back())
                    .filter(|(_, e)| e.kind == EventKind::Put)
                    .and_then(|(_, e)| e.value.as_deref())
            });
            let put = removed.and_then(|value| self.puts.get(&(key, value)).copied());
            if put.is_some_and(|p| p.ttl_ms.is_some() && p.outcome != Outcome::Fail) {
                report.expiry_deletes += 1;
                continue;
            }
            let ops = put.map(|p| vec![p.id]).unwrap_or_default();
            self.anomaly(
                WatchAnomalyKind::UnexplainedDelete,
                None,
                revision,
                Some(key),
                ops,
                format!(
                    "no delete of the key explains it, and the put it removed ({}) had no TTL",
                    removed.map_or("unknown".to_string(), |v| format!("{v:?}"))
                ),
            );
        }
    }

    /// Key -> its reference events by revision.
    fn timelines(&self) -> HashMap<&'a str, KeyTimeline<'a>> {
        let mut timelines: HashMap<&'a str, KeyTimeline<'a>> = HashMap::new();
        for (&revision, events) in &self.reference {
            for &event in events {
                timelines
                    .entry(event.key.as_str())
                    .or_default()
                    .insert(revision, event);
            }
        }
        timelines
    }

    /// Each event's prev_kv, version and create_revision against the key's
    /// previous event, where every revision between them is covered.
    fn check_prev(&mut self) {
        let timelines = self.timelines();
        let mut found = Vec::new();
        for (key, timeline) in &timelines {
            let mut previous: Option<&WatchEventRecord> = None;
            for (&revision, &event) in timeline {
                let before = previous.replace(event);
                if event.kind == EventKind::Put
                    && event.version == Some(1)
                    && event.create_revision.is_some_and(|c| c != revision)
                {
                    found.push((revision, *key, "version 1 with another create_revision"));
                }
                let Some(before) = before else { continue };
                if !self.coverage.contains_all(before.revision, revision) {
                    continue;
                }
                let expected_prev = match before.kind {
                    EventKind::Put => before.value.as_deref(),
                    EventKind::Delete => None,
                };
                if event.prev_value.as_deref() != expected_prev {
                    found.push((revision, *key, "prev_kv is not the previous event's value"));
                }
                if event.kind != EventKind::Put {
                    continue;
                }
                let (version, create) = match before.kind {
                    EventKind::Put => (before.version.map(|v| v + 1), before.create_revision),
                    EventKind::Delete => (Some(1), Some(revision)),
                };
                if event.version.is_some() && version.is_some() && event.version != version
                    || event.create_revision.is_some()
                        && create.is_some()
                        && event.create_revision != create
                {
                    found.push((
                        revision,
                        *key,
                        "version or create_revision does not follow the previous event",
                    ));
                }
            }
        }
        for (revision, key, detail) in found {
            self.anomaly(
                WatchAnomalyKind::PrevMismatch,
                None,
                revision,
                Some(key),
                Vec::new(),
                detail.to_string(),
            );
        }
    }

    /// Every ok linearizable read with a header revision H against the
    /// key's events up to H.
    fn check_reads(&mut self, report: &mut WatchReport) {
        let timelines = self.timelines();
        let empty = KeyTimeline::new();
        let mut found = Vec::new();
        for op in self.ops.iter().copied() {
            let (Function::Read, Outcome::Ok, None, Some(header)) =
                (op.f, op.outcome, op.stale_min_index, op.revision)
            else {
                continue;
            };
            let timeline = timelines.get(op.key.as_str()).unwrap_or(&empty);
            let mut checked = false;
            if let (Some(value), Some(mod_revision)) = (&op.value, op.mod_revision)
                && self.coverage.contains_all(mod_revision, mod_revision)
            {
                checked = true;
                let there = timeline
                    .get(&mod_revision)
                    .is_some_and(|e| e.kind == EventKind::Put && e.value.as_ref() == Some(value));
                if !there {
                    found.push((op, mod_revision, format!(
                        "read {value:?} at mod_revision {mod_revision}; the events at that revision say otherwise"
                    )));
                }
            }
            if let Some((&last, event)) = timeline.range(..=header).next_back()
                && self.coverage.contains_all(last, header)
            {
                checked = true;
                let agrees = match (&op.value, event.kind) {
                    (Some(value), EventKind::Put) => {
                        op.mod_revision == Some(last) && event.value.as_ref() == Some(value)
                    }
                    (None, EventKind::Delete) => true,
                    _ => false,
                };
                if !agrees {
                    found.push((
                        op,
                        header,
                        format!(
                            "read {} (mod_revision {:?}) at revision {header}; the key's last \
                             event by then is {}",
                            op.value
                                .as_deref()
                                .map_or("absent".to_string(), |v| format!("{v:?}")),
                            op.mod_revision,
                            describe(event)
                        ),
                    ));
                }
            }
            report.reads_checked += usize::from(checked);
        }
        for (op, revision, detail) in found {
            self.anomaly(
                WatchAnomalyKind::ReadMismatch,
                None,
                revision,
                Some(&op.key),
                vec![op.id],
                detail,
            );
        }
    }

    /// Every covered revision has events somewhere, or an acknowledged
    /// write (whose absence is already an anomaly of its own).
    fn check_gaps(&mut self) {
        let acknowledged: BTreeSet<u64> = self
            .ops
            .iter()
            .filter(|op| op.outcome == Outcome::Ok)
            .filter(|op| {
                op.f == Function::Write || (op.f == Function::Delete && op.found == Some(true))
            })
            .filter_map(|op| op.revision)
            .collect();
        let mut found = Vec::new();
        for &(first, last) in &self.coverage.0 {
            for revision in first..=last {
                if self.reference.contains_key(&revision) || acknowledged.contains(&revision) {
                    continue;
                }
                let covering: Vec<u64> = self
                    .watchers
                    .values()
                    .filter(|w| w.covers(revision))
                    .map(|w| w.id)
                    .collect();
                found.push((revision, covering));
            }
        }
        for (revision, covering) in found {
            self.anomaly(
                WatchAnomalyKind::RevisionGap,
                covering.first().copied(),
                revision,
                None,
                Vec::new(),
                format!(
                    "no watcher received an event at this revision (covered by watchers \
                     {covering:?}), and every revision of the run is a change of a watched key"
                ),
            );
        }
    }
}

fn describe(event: &WatchEventRecord) -> String {
    match event.kind {
        EventKind::Put => format!(
            "put {} = {:?} at {}",
            event.key,
            event.value.as_deref().unwrap_or(""),
            event.revision
        ),
        EventKind::Delete => format!("delete {} at {}", event.key, event.revision),
    }
}

fn describe_all(events: &[&WatchEventRecord]) -> String {
    events
        .iter()
        .map(|e| describe(e))
        .collect::<Vec<_>>()
        .join(", ")
}

fn finish(mut report: WatchReport, mut anomalies: Vec<WatchAnomaly>) -> WatchReport {
    anomalies.sort_by_key(|a| (a.revision, a.kind));
    for kind in WatchAnomalyKind::ALL {
        report.anomalies_by_kind.insert(
            kind.name().to_string(),
            anomalies.iter().filter(|a| a.kind == kind).count(),
        );
    }
    report.valid = anomalies.is_empty();
    report.verdict = if report.valid { "valid" } else { "not-valid" }.to_string();
    anomalies.truncate(ANOMALIES_LISTED_MAX);
    report.anomalies = anomalies;
    report
}

/// Why a run proves too little about watches (not anomalies): no event,
/// no watcher that moved to another member (the resume path never ran),
/// no acknowledged write checked, or a watcher whose span ends below the
/// final read's revision (it did not catch up).
pub fn shortfalls(report: &WatchReport) -> Vec<String> {
    let mut problems = Vec::new();
    if report.events == 0 {
        problems.push("no watcher received an event".to_string());
    }
    if report.member_switches == 0 {
        problems.push("no watcher moved to another member: the resume path never ran".to_string());
    }
    if report.acknowledged_checked == 0 {
        problems.push("no acknowledged write lay inside a watcher's span".to_string());
    }
    if let Some(final_revision) = report.final_revision {
        let mut last: BTreeMap<u64, u64> = BTreeMap::new();
        for &(watcher, _, end) in &report.spans {
            let entry = last.entry(watcher).or_default();
            *entry = (*entry).max(end);
        }
        for (watcher, end) in last {
            if end < final_revision {
                problems.push(format!(
                    "watcher {watcher} covered revisions only up to {end}, below the final \
                     read's revision {final_revision}"
                ));
            }
        }
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::WatchRecord;

    fn op(id: u64, f: Function, key: &str, outcome: Outcome, at: (u64, u64)) -> Op {
        Op {
            id,
            process: id,
            f,
            key: key.to_string(),
            value: None,
            expected_version: None,
            values: None,
            outcome,
            version: None,
            index: None,
            revision: None,
            mod_revision: None,
            expected_mod_revision: None,
            error: None,
            invoke_wall_us: at.0,
            invoke_ns: at.0,
            complete_wall_us: at.1,
            complete_ns: at.1,
            ttl_ms: None,
            stale_min_index: None,
            member: None,
            versions: None,
            final_read: false,
            found: None,
            watch: None,
            lease: None,
            expected: None,
        }
    }

    fn put(id: u64, key: &str, value: &str, outcome: Outcome, revision: Option<u64>) -> Op {
        let mut op = op(id, Function::Write, key, outcome, (id * 10, id * 10 + 5));
        op.value = Some(value.to_string());
        op.revision = revision.filter(|_| outcome == Outcome::Ok);
        op
    }

    fn delete(id: u64, key: &str, revision: u64) -> Op {
        let mut op = op(
            id,
            Function::Delete,
            key,
            Outcome::Ok,
            (id * 10, id * 10 + 5),
        );
        op.found = Some(true);
        op.revision = Some(revision);
        op
    }

    fn read(id: u64, key: &str, value: Option<(&str, u64)>, header: u64, at: (u64, u64)) -> Op {
        let mut op = op(id, Function::Read, key, Outcome::Ok, at);
        op.value = value.map(|(v, _)| v.to_string());
        op.mod_revision = value.map(|(_, m)| m);
        op.revision = Some(header);
        op
    }

    fn ev_put(
        revision: u64,
        key: &str,
        value: &str,
        create: u64,
        version: u64,
    ) -> WatchEventRecord {
        WatchEventRecord {
            revision,
            key: key.to_string(),
            kind: EventKind::Put,
            value: Some(value.to_string()),
            create_revision: Some(create),
            version: Some(version),
            prev_value: None,
        }
    }

    fn ev_delete(revision: u64, key: &str, prev: &str) -> WatchEventRecord {
        WatchEventRecord {
            revision,
            key: key.to_string(),
            kind: EventKind::Delete,
            value: None,
            create_revision: None,
            version: None,
            prev_value: Some(prev.to_string()),
        }
    }

    /// A watcher's records: `open(stream, start, member)` and
    /// `batch(stream, member, next, events)`, ids from 1000 on.
    struct Log {
        watcher: u64,
        ops: Vec<Op>,
    }

    impl Log {
        fn new(watcher: u64) -> Self {
            Self {
                watcher,
                ops: Vec::new(),
            }
        }

        fn record(&mut self, f: Function, outcome: Outcome, member: u64, watch: WatchRecord) {
            let id = 1000 * (self.watcher + 1) + self.ops.len() as u64;
            let mut op = op(id, f, "w/", outcome, (id, id));
            op.process = 100 + self.watcher;
            op.member = Some(member);
            op.watch = Some(watch);
            self.ops.push(op);
        }

        fn open(mut self, stream: u64, start: u64, member: u64) -> Self {
            let watch = WatchRecord {
                watcher: self.watcher,
                stream,
                start_revision: Some(start),
                next_revision: start,
                events: Vec::new(),
            };
            self.record(Function::WatchOpen, Outcome::Ok, member, watch);
            self
        }

        fn batch(
            mut self,
            stream: u64,
            member: u64,
            next: u64,
            events: Vec<WatchEventRecord>,
        ) -> Self {
            let watch = WatchRecord {
                watcher: self.watcher,
                stream,
                start_revision: None,
                next_revision: next,
                events,
            };
            self.record(Function::Watch, Outcome::Ok, member, watch);
            self
        }

        fn error(mut self, stream: u64, member: u64, next: u64) -> Self {
            let watch = WatchRecord {
                watcher: self.watcher,
                stream,
                start_revision: None,
                next_revision: next,
                events: Vec::new(),
            };
            self.record(Function::Watch, Outcome::Fail, member, watch);
            self
        }
    }

    /// The events of revisions 10..=14: put a, put b (TTL), delete a,
    /// b expires, put a (unknown outcome).
    fn events() -> Vec<WatchEventRecord> {
        let mut e14 = ev_put(14, "w/a", "v3", 14, 1);
        e14.prev_value = None;
        vec![
            ev_put(10, "w/a", "v1", 10, 1),
            ev_put(11, "w/b", "v2", 11, 1),
            ev_delete(12, "w/a", "v1"),
            ev_delete(13, "w/b", "v2"),
            e14,
        ]
    }

    fn writes() -> Vec<Op> {
        let mut ttl = put(2, "w/b", "v2", Outcome::Ok, Some(11));
        ttl.ttl_ms = Some(1000);
        vec![
            put(1, "w/a", "v1", Outcome::Ok, Some(10)),
            ttl,
            delete(3, "w/a", 12),
            put(4, "w/a", "v3", Outcome::Info, None),
            put(5, "w/c", "v4", Outcome::Fail, None),
            read(6, "w/a", Some(("v3", 14)), 14, (80, 90)),
        ]
    }

    /// Watcher 0 on member 1, its stream ends after revision 12 and a new
    /// one goes on from 13 on member 3; watcher 1 on member 2 sees it all.
    fn watchers(events: &[WatchEventRecord]) -> (Log, Log) {
        let zero = Log::new(0)
            .open(0, 10, 1)
            .batch(0, 1, 12, events[..2].to_vec())
            .batch(0, 1, 13, events[2..3].to_vec())
            .error(0, 1, 13)
            .open(1, 13, 3)
            .batch(1, 3, 15, events[3..].to_vec());
        let one = Log::new(1).open(0, 10, 2).batch(0, 2, 15, events.to_vec());
        (zero, one)
    }

    fn run(writes: Vec<Op>, logs: (Log, Log)) -> WatchReport {
        let records: Vec<Record> = writes
            .into_iter()
            .chain(logs.0.ops)
            .chain(logs.1.ops)
            .map(Record::Op)
            .collect();
        check(&records, true)
    }

    /// The kinds found, with their counts.
    fn found(report: &WatchReport) -> Vec<(&str, usize)> {
        report
            .anomalies_by_kind
            .iter()
            .filter(|(_, n)| **n > 0)
            .map(|(k, n)| (k.as_str(), *n))
            .collect()
    }

    #[test]
    fn a_correct_history_is_valid() {
        let report = run(writes(), watchers(&events()));
        assert!(report.valid, "{}", report.summary());
        assert_eq!(report.verdict, "valid");
        assert_eq!(report.watchers, 2);
        assert_eq!(report.streams, 3);
        assert_eq!(report.stream_errors, 1);
        assert_eq!(report.member_switches, 1);
        assert_eq!(report.events, 10);
        assert_eq!(report.revisions_covered, 5);
        assert_eq!(report.acknowledged_checked, 3);
        assert_eq!(report.expiry_deletes, 1);
        assert_eq!(report.reads_checked, 1);
        assert!(shortfalls(&report).is_empty(), "{:?}", shortfalls(&report));
    }

    #[test]
    fn a_skipped_event_on_resume_is_missing() {
        let events = events();
        let (mut zero, one) = watchers(&events);
        // The new stream's member drops the first event it would send.
        zero.ops.pop();
        let zero = zero.batch(1, 3, 15, events[4..].to_vec());
        let report = run(writes(), (zero, one));
        assert_eq!(
            found(&report),
            vec![("missing-event", 1)],
            "{}",
            report.summary()
        );
        assert_eq!(report.anomalies[0].watcher, Some(0));
        assert_eq!(report.anomalies[0].revision, 13);
    }

    #[test]
    fn an_event_no_watcher_received_is_a_gap_when_every_revision_is_watched() {
        let mut events = events();
        events.remove(3);
        let logs = (
            Log::new(0).open(0, 10, 1).batch(0, 1, 15, events.clone()),
            Log::new(1).open(0, 10, 2).batch(0, 2, 15, events),
        );
        let records: Vec<Record> = writes()
            .into_iter()
            .chain(logs.0.ops)
            .chain(logs.1.ops)
            .map(Record::Op)
            .collect();
        let report = check(&records, true);
        assert_eq!(
            found(&report),
            vec![("revision-gap", 1)],
            "{}",
            report.summary()
        );
        assert_eq!(report.anomalies[0].revision, 13);
        // Without the promise that every revision is watched, nothing
        // shows it (the expiry was nobody's acknowledged write).
        assert!(check(&records, false).valid);
    }

    #[test]
    fn a_duplicate_event_is_found() {
        let events = events();
        let (zero, mut one) = watchers(&events);
        one.ops.pop();
        let one = one
            .batch(0, 2, 13, events[..3].to_vec())
            .batch(0, 2, 15, events[2..].to_vec());
        let report = run(writes(), (zero, one));
        assert_eq!(
            found(&report),
            vec![("duplicate", 1)],
            "{}",
            report.summary()
        );
        assert_eq!(report.anomalies[0].revision, 12);
    }

    #[test]
    fn a_put_delivered_at_two_revisions_is_a_duplicate() {
        let mut events = events();
        // Revision 15: the put of v1 again (applied twice).
        events.push(ev_put(15, "w/a", "v1", 14, 2));
        events[5].prev_value = Some("v3".into());
        let logs = (
            Log::new(0).open(0, 10, 1).batch(0, 1, 16, events.clone()),
            Log::new(1).open(0, 10, 2).batch(0, 2, 16, events),
        );
        let report = run(writes(), logs);
        assert_eq!(
            found(&report),
            vec![("duplicate", 2), ("revision-mismatch", 1)],
            "{}",
            report.summary()
        );
    }

    #[test]
    fn events_out_of_order_are_found() {
        let mut events = events();
        events.swap(1, 2);
        let (zero, _) = watchers(&self::events());
        let one = Log::new(1).open(0, 10, 2).batch(0, 2, 15, events);
        let report = run(writes(), (zero, one));
        assert_eq!(
            found(&report),
            vec![("out-of-order", 1)],
            "{}",
            report.summary()
        );
        assert_eq!(report.anomalies[0].watcher, Some(1));
    }

    #[test]
    fn a_phantom_value_is_found() {
        for (value, detail) in [("v4", "failed"), ("v9", "no write invoked")] {
            let mut events = events();
            events.push(ev_put(15, "w/c", value, 15, 1));
            let logs = (
                Log::new(0).open(0, 10, 1).batch(0, 1, 16, events.clone()),
                Log::new(1).open(0, 10, 2).batch(0, 2, 16, events),
            );
            let report = run(writes(), logs);
            assert_eq!(found(&report), vec![("phantom", 1)], "{}", report.summary());
            assert!(
                report.anomalies[0].detail.contains(detail),
                "{}",
                report.summary()
            );
        }
    }

    #[test]
    fn an_acknowledged_write_missing_is_found() {
        let mut events = events();
        events.remove(0);
        let logs = (
            Log::new(0).open(0, 10, 1).batch(0, 1, 15, events.clone()),
            Log::new(1).open(0, 10, 2).batch(0, 2, 15, events),
        );
        let report = run(writes(), logs);
        // In both watchers; the revision has an acknowledged write, so it
        // is not counted as a gap too.
        assert_eq!(
            found(&report),
            vec![("acknowledged-missing", 2)],
            "{}",
            report.summary()
        );
        assert_eq!(report.anomalies[0].revision, 10);
    }

    #[test]
    fn a_revision_other_than_the_acknowledged_one_is_found() {
        let mut writes = writes();
        writes[0].revision = Some(9);
        let report = run(writes, watchers(&events()));
        assert_eq!(
            found(&report),
            vec![("revision-mismatch", 1)],
            "{}",
            report.summary()
        );
    }

    #[test]
    fn two_watchers_that_disagree_are_found() {
        let mut writes = writes();
        writes.push(put(7, "w/a", "v5", Outcome::Info, None));
        let mut other = events();
        other[4] = ev_put(14, "w/a", "v5", 14, 1);
        let (zero, _) = watchers(&events());
        let one = Log::new(1).open(0, 10, 2).batch(0, 2, 15, other);
        let report = run(writes, (zero, one));
        assert_eq!(
            found(&report),
            vec![("disagreement", 1)],
            "{}",
            report.summary()
        );
        assert_eq!(report.anomalies[0].watcher, Some(1));
        assert_eq!(report.anomalies[0].revision, 14);
    }

    #[test]
    fn a_watcher_whose_span_ends_inside_a_revision_holds_a_prefix() {
        let mut events = events();
        // Revision 15: one transaction writing two keys; watcher 0's span
        // ends at 14 with the first of them delivered.
        let mut writes = writes();
        writes.push(put(7, "w/c", "v6", Outcome::Info, None));
        writes.push(put(8, "w/d", "v7", Outcome::Info, None));
        events.push(ev_put(15, "w/c", "v6", 15, 1));
        events.push(ev_put(15, "w/d", "v7", 15, 1));
        let zero = Log::new(0)
            .open(0, 10, 1)
            .batch(0, 1, 15, events[..6].to_vec());
        let one = Log::new(1).open(0, 10, 2).batch(0, 2, 16, events.clone());
        let report = run(writes.clone(), (zero, one));
        assert!(report.valid, "{}", report.summary());
        // The other event first is not a prefix.
        let mut swapped = events[..5].to_vec();
        swapped.push(events[6].clone());
        let zero = Log::new(0).open(0, 10, 1).batch(0, 1, 15, swapped);
        let one = Log::new(1).open(0, 10, 2).batch(0, 2, 16, events);
        let report = run(writes, (zero, one));
        assert_eq!(
            found(&report),
            vec![("disagreement", 1)],
            "{}",
            report.summary()
        );
    }

    #[test]
    fn a_delete_nothing_explains_is_found() {
        let mut writes = writes();
        // No delete of w/a was invoked, and its put had no TTL.
        writes.remove(2);
        let report = run(writes, watchers(&events()));
        assert_eq!(
            found(&report),
            vec![("unexplained-delete", 1)],
            "{}",
            report.summary()
        );
        assert_eq!(report.anomalies[0].revision, 12);
    }

    #[test]
    fn a_read_that_disagrees_with_the_events_is_found() {
        let mut writes = writes();
        writes[5] = read(6, "w/a", Some(("v1", 10)), 14, (80, 90));
        let report = run(writes, watchers(&events()));
        assert_eq!(
            found(&report),
            vec![("read-mismatch", 1)],
            "{}",
            report.summary()
        );
        // Absent at 13 agrees (deleted at 12); present at 11 agrees too.
        let mut writes = self::writes();
        writes[5] = read(6, "w/a", None, 13, (80, 90));
        writes.push(read(7, "w/a", Some(("v1", 10)), 11, (91, 92)));
        let report = run(writes, watchers(&events()));
        assert!(report.valid, "{}", report.summary());
        assert_eq!(report.reads_checked, 2);
    }

    #[test]
    fn an_event_below_a_revision_seen_before_the_write_is_found() {
        let mut writes = writes();
        // A linearizable read answered at revision 14 before the put of
        // v3 (revision 14) was invoked.
        writes[3].invoke_ns = 95;
        writes[3].complete_ns = 99;
        writes.push(read(7, "w/b", None, 14, (91, 92)));
        let report = run(writes, watchers(&events()));
        assert_eq!(
            found(&report),
            vec![("event-before-invoke", 1)],
            "{}",
            report.summary()
        );
    }

    #[test]
    fn a_wrong_prev_kv_is_found() {
        let mut events = events();
        events[4].prev_value = Some("v1".into());
        let logs = (
            Log::new(0).open(0, 10, 1).batch(0, 1, 15, events.clone()),
            Log::new(1).open(0, 10, 2).batch(0, 2, 15, events),
        );
        let report = run(writes(), logs);
        assert_eq!(
            found(&report),
            vec![("prev-mismatch", 1)],
            "{}",
            report.summary()
        );
    }

    #[test]
    fn a_run_without_a_resume_or_a_caught_up_watcher_falls_short() {
        let events = events();
        let mut writes = writes();
        let mut last = read(8, "w/a", Some(("v3", 14)), 20, (200, 210));
        last.final_read = true;
        writes.push(last);
        let logs = (
            Log::new(0).open(0, 10, 1).batch(0, 1, 15, events.clone()),
            Log::new(1).open(0, 10, 2).batch(0, 2, 15, events),
        );
        let report = run(writes, logs);
        assert!(report.valid, "{}", report.summary());
        let problems = shortfalls(&report);
        assert_eq!(problems.len(), 3, "{problems:?}");
        assert!(problems[0].contains("resume path"), "{problems:?}");
        assert!(problems[1].contains("watcher 0"), "{problems:?}");
    }
}
