//! The change history (`kvstate::history`, `kvstate::range::range_at`):
//! a read at a past revision returns exactly what a read at that revision
//! returned when it was current — after more writes, after merges that
//! keep the window, after a restart that rebuilds the index from the
//! files, and after compactions; revisions below the window answer
//! "compacted" naming the oldest one served, above it "future revision".
//! A read-only transaction (`kvstate::read_txn`) reads each range at its
//! own revision, and judges its compares and reads its ranges at one store
//! revision while entries apply.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use bitcask::{Engine, Options, SyncPolicy};
use kvstate::apply::Applier;
use kvstate::command::{Command, Op, Outcome, Proposal, Request};
use kvstate::history::{History, HistoryError, HistoryWindow};
use kvstate::range::{RangeError, RangeResult, RangeSpec, range, range_at};
use kvstate::read_txn::{read_txn, try_read_txn};
use kvstate::txn::{Compare, CompareResult, CompareTarget, TxnOp, TxnRequest};
use vfs::sim::SimFs;

/// Small segments, so the workload seals many files for merges to take.
fn engine(fs: &SimFs) -> Arc<Engine> {
    let opts = Options {
        sync: SyncPolicy::Never,
        auto_merge: None,
        segment_size_bytes: 2048,
        vfs: Arc::new(fs.clone()),
        ..Options::default()
    };
    Arc::new(Engine::open("/sm", opts).unwrap())
}

fn write(op: Op) -> Request {
    Request {
        session: None,
        conditions: Vec::new(),
        ops: vec![op],
    }
}

fn put(key: &str, value: &str) -> Request {
    write(Op::Put {
        key: key.into(),
        value: value.into(),
        ttl_ms: 0,
    })
}

fn delete(key: &str) -> Request {
    write(Op::Delete { key: key.into() })
}

fn delete_prefix(prefix: &str) -> TxnRequest {
    let mut end = prefix.as_bytes().to_vec();
    *end.last_mut().unwrap() += 1;
    TxnRequest {
        session: None,
        compares: Vec::new(),
        success: vec![TxnOp::DeleteRange {
            key: prefix.into(),
            range_end: end,
            prev_kv: false,
        }],
        failure: Vec::new(),
    }
}

fn all() -> RangeSpec {
    RangeSpec::between("\0", "\0")
}

/// Applies entries one by one from log index 1; after each, the current
/// read of every key, by the revision it was read at.
struct Cluster {
    fs: SimFs,
    engine: Arc<Engine>,
    applier: Applier,
    index: u64,
    seen: BTreeMap<u64, RangeResult>,
}

impl Cluster {
    fn new() -> Cluster {
        let fs = SimFs::new();
        let engine = engine(&fs);
        Cluster {
            fs,
            engine,
            applier: Applier::default(),
            index: 0,
            seen: BTreeMap::new(),
        }
    }

    fn apply(&mut self, command: Command) -> Vec<Outcome> {
        self.index += 1;
        let proposal = Proposal {
            time_ms: self.index,
            command,
        };
        let response = self
            .applier
            .apply(&self.engine, self.index, &proposal, Vec::new())
            .unwrap();
        let revision = self.applier.header().revision;
        let now = range(&self.engine, &all(), self.index, revision).unwrap();
        self.seen.insert(revision, now);
        response.answers.into_iter().map(|a| a.outcome).collect()
    }

    fn history(&self) -> Arc<RwLock<History>> {
        self.applier.history()
    }

    fn read_at(&self, revision: u64) -> Result<RangeResult, RangeError> {
        let spec = RangeSpec { revision, ..all() };
        let engine = self.engine.clone();
        range_at(move || engine.clone(), &self.history(), &spec, self.index)
    }

    /// Every revision from `from` on reads as it read when current.
    fn check_window(&self, from: u64) {
        for (revision, expected) in self.seen.range(from..) {
            let read = self
                .read_at(*revision)
                .unwrap_or_else(|err| panic!("revision {revision}: {err}"));
            assert_eq!(&read, expected, "read at revision {revision}");
        }
    }

    /// Merges every sealed file keeping what the history names, then
    /// points the history at the outputs (what kvnode's merge thread does).
    fn merge(&self) -> bitcask::MergeReport {
        let inputs = self.engine.sealed_data_files();
        assert!(!inputs.is_empty(), "the workload sealed files");
        let named = self.history().read().unwrap().named();
        // With revisions on, merges judge no TTL (kvnode passes 0).
        let report = self
            .engine
            .merge_retaining(&inputs, 0, History::retain(named))
            .unwrap();
        let forgotten = self.relocate(&report);
        assert_eq!(
            forgotten, 0,
            "the merge kept every record the history names"
        );
        report
    }

    /// Points the history at a swapped-in merge's outputs (what kvnode's
    /// merge thread does); returns the versions it forgot.
    fn relocate(&self, report: &bitcask::MergeReport) -> usize {
        let in_inputs = self
            .history()
            .read()
            .unwrap()
            .in_files(&report.inputs)
            .unwrap();
        assert!(
            !in_inputs.is_empty(),
            "the history named records of the inputs"
        );
        let moved = History::moved_records(&self.engine, &report.outputs, &in_inputs).unwrap();
        self.history()
            .write()
            .unwrap()
            .relocate(&report.inputs, &moved)
            .unwrap()
    }

    /// Closes and reopens the engine, loading the applier (and with it the
    /// history) from the files.
    fn restart(&mut self) {
        let old = std::mem::replace(&mut self.engine, engine(&SimFs::new()));
        Arc::into_inner(old).unwrap().close().unwrap();
        self.engine = engine(&self.fs);
        self.applier = Applier::load(&self.engine).unwrap();
    }
}

/// Every key of a few, overwritten, deleted, recreated and range-deleted,
/// over 60 entries.
fn workload(cluster: &mut Cluster, rounds: usize) {
    for round in 0..rounds {
        let key = |i: usize| format!("k{}", (round * 7 + i) % 5);
        let value = format!("value {round} {}", "x".repeat(round % 40));
        cluster.apply(Command::Writes(vec![
            put(&key(0), &value),
            put(&key(1), &value),
        ]));
        if round % 3 == 0 {
            cluster.apply(Command::Writes(vec![delete(&key(2))]));
        }
        if round % 11 == 5 {
            cluster.apply(Command::Txns(vec![delete_prefix("k")]));
        }
    }
}

/// One version as (revision, sequence number, put or delete).
type VersionShape = (u64, u64, bool);

/// The index as a comparable value: each key's versions.
fn index_of(history: &History) -> Vec<(Vec<u8>, Vec<VersionShape>)> {
    history
        .keys_in_window()
        .map(|(key, versions)| {
            let versions = versions
                .iter()
                .map(|v| {
                    (
                        v.revision,
                        v.location.seq,
                        v.kind == bitcask::StoredKind::Put,
                    )
                })
                .collect();
            (key.to_vec(), versions)
        })
        .collect()
}

#[test]
fn a_read_at_each_past_revision_returns_what_it_returned_then() {
    let mut cluster = Cluster::new();
    workload(&mut cluster, 40);
    assert!(cluster.seen.len() > 50);
    cluster.check_window(1);
    // Writes after a revision do not change what it reads.
    let before = cluster.read_at(10).unwrap();
    workload(&mut cluster, 5);
    assert_eq!(cluster.read_at(10).unwrap(), before);
    // A key's own revisions travel with it.
    let at_10 = &cluster.seen[&10];
    assert!(at_10.kvs.iter().all(|kv| kv.mod_revision <= 10));
}

/// At every past revision, a read with a limit or count-only (which
/// visits only its first keys and counts the rest, the history's keys by
/// what they were then) agrees with the read of every key.
#[test]
fn a_past_read_with_a_limit_or_count_only_agrees_with_the_whole_read() {
    let mut cluster = Cluster::new();
    workload(&mut cluster, 40);
    let history = cluster.history();
    let read = |spec: &RangeSpec| {
        let engine = cluster.engine.clone();
        range_at(move || engine.clone(), &history, spec, cluster.index)
    };
    let mut limited_reads = 0;
    for revision in cluster.seen.keys().copied() {
        for (key, range_end) in [("\0", "\0"), ("k1", "k4"), ("k2", ""), ("k3", "\0")] {
            let base = RangeSpec {
                revision,
                ..RangeSpec::between(key, range_end)
            };
            let whole = read(&base).unwrap();
            let counted = read(&RangeSpec {
                count_only: true,
                ..base.clone()
            })
            .unwrap();
            assert_eq!(counted.count, whole.count, "count-only at {revision}");
            for limit in 1..=3usize {
                let limited = read(&RangeSpec {
                    limit: limit as u64,
                    ..base.clone()
                })
                .unwrap();
                let shown = whole.kvs.len().min(limit);
                assert_eq!(
                    limited.kvs,
                    whole.kvs[..shown],
                    "limit {limit} at {revision}"
                );
                assert_eq!(limited.count, whole.count, "limit {limit} at {revision}");
                assert_eq!(limited.more, whole.kvs.len() > limit);
                limited_reads += usize::from(limited.more);
            }
        }
    }
    assert!(limited_reads > 100, "the limits cut: {limited_reads}");
}

/// A read-only transaction with `ranges` in both branches (no compare).
fn read_only(ranges: Vec<RangeSpec>) -> TxnRequest {
    TxnRequest {
        session: None,
        compares: Vec::new(),
        success: ranges.iter().cloned().map(TxnOp::Range).collect(),
        failure: ranges.into_iter().map(TxnOp::Range).collect(),
    }
}

#[test]
fn a_read_only_txn_reads_each_range_at_its_own_revision() {
    let mut cluster = Cluster::new();
    workload(&mut cluster, 30);
    let current = cluster.applier.header().revision;
    let revisions: Vec<u64> = cluster.seen.keys().copied().filter(|r| *r > 0).collect();
    // Every past revision, the store revision and 0 in one transaction.
    let mut ranges: Vec<RangeSpec> = revisions
        .iter()
        .map(|&revision| RangeSpec { revision, ..all() })
        .collect();
    ranges.push(all());
    let engine = cluster.engine.clone();
    let answer = read_txn(
        move || engine.clone(),
        &cluster.history(),
        &read_only(ranges),
        cluster.index,
    )
    .unwrap();
    assert!(answer.succeeded);
    assert_eq!(answer.revision, current);
    for (range, revision) in answer.ranges.iter().zip(revisions.iter().chain([&current])) {
        assert_eq!(range, &cluster.seen[revision], "revision {revision}");
    }
    // Compacted and future revisions: the history's errors, naming the op.
    cluster.apply(Command::Compact {
        revision: current - 10,
    });
    let engine = cluster.engine.clone();
    for (revision, place) in [(current - 11, "success[1]"), (current + 1, "success[1]")] {
        let txn = read_only(vec![all(), RangeSpec { revision, ..all() }]);
        let err = read_txn(|| engine.clone(), &cluster.history(), &txn, 0).unwrap_err();
        assert!(matches!(err.error, RangeError::History(_)), "{err}");
        assert!(err.to_string().contains(place), "{err}");
    }
    // An op that writes is refused, not applied.
    let txn = TxnRequest {
        success: vec![TxnOp::DeleteRange {
            key: b"k".to_vec(),
            range_end: b"\0".to_vec(),
            prev_kv: false,
        }],
        ..read_only(Vec::new())
    };
    let err = read_txn(|| engine.clone(), &cluster.history(), &txn, 0).unwrap_err();
    assert!(matches!(err.error, RangeError::NotARead), "{err}");
}

#[test]
fn a_txn_of_single_keys_reads_inline_as_the_blocking_read_does() {
    let mut cluster = Cluster::new();
    workload(&mut cluster, 30);
    let revisions: Vec<u64> = cluster.seen.keys().copied().filter(|r| *r > 0).collect();
    let engine = cluster.engine.clone();
    let history = cluster.history();
    // Each key of the workload at every past revision and at 0, behind a
    // compare on one key, both ways round.
    for result in [CompareResult::Greater, CompareResult::Less] {
        let mut ranges = Vec::new();
        for key in ["k0", "k1", "k2", "k3", "k4", "absent"] {
            ranges.push(RangeSpec::key(key));
            for &revision in &revisions {
                ranges.push(RangeSpec {
                    revision,
                    ..RangeSpec::key(key)
                });
            }
        }
        let txn = TxnRequest {
            compares: vec![Compare {
                key: b"k1".to_vec(),
                range_end: Vec::new(),
                target: CompareTarget::Version(0),
                result,
            }],
            ..read_only(ranges)
        };
        assert!(txn.reads_single_keys());
        let inline = try_read_txn(|| engine.clone(), &history, &txn, cluster.index)
            .expect("the history is free")
            .unwrap();
        let blocking = read_txn(|| engine.clone(), &history, &txn, cluster.index).unwrap();
        assert_eq!(inline, blocking);
        assert_eq!(inline.succeeded, result == CompareResult::Greater);
    }
    // Errors are the blocking read's too.
    let future = read_only(vec![RangeSpec {
        revision: cluster.applier.header().revision + 1,
        ..RangeSpec::key("k0")
    }]);
    let inline = try_read_txn(|| engine.clone(), &history, &future, 0).expect("free");
    assert_eq!(
        inline.unwrap_err().to_string(),
        read_txn(|| engine.clone(), &history, &future, 0)
            .unwrap_err()
            .to_string()
    );
    // While an entry applies (it holds the write lock) nothing is read.
    let one = read_only(vec![RangeSpec::key("k0")]);
    {
        let _applying = history.write().unwrap();
        assert!(try_read_txn(|| engine.clone(), &history, &one, 0).is_none());
    }
    assert!(try_read_txn(|| engine.clone(), &history, &one, 0).is_some());
    // A range of several keys, or a compare over one, is not single keys.
    assert!(!read_only(vec![all()]).reads_single_keys());
    let over_a_range = TxnRequest {
        compares: vec![Compare {
            key: b"k".to_vec(),
            range_end: b"l".to_vec(),
            target: CompareTarget::Version(0),
            result: CompareResult::Greater,
        }],
        ..one.clone()
    };
    assert!(!over_a_range.reads_single_keys());
}

#[test]
fn a_read_only_txn_judges_its_compares_and_reads_at_one_revision() {
    // One key rewritten entry after entry while transactions compare its
    // mod revision with a moving bound and read it in either branch: the
    // branch taken always matches the state the range returns.
    let mut cluster = Cluster::new();
    cluster.apply(Command::Writes(vec![put("k", "0")]));
    let engine = cluster.engine.clone();
    let history = cluster.history();
    let writes = 400u64;
    let writer = std::thread::spawn(move || {
        for i in 1..=writes {
            cluster.apply(Command::Writes(vec![put("k", &i.to_string())]));
        }
        cluster
    });
    let check = |bound: u64| {
        let txn = TxnRequest {
            session: None,
            compares: vec![Compare {
                key: b"k".to_vec(),
                range_end: Vec::new(),
                target: CompareTarget::ModRevision(bound),
                result: CompareResult::Less,
            }],
            success: vec![TxnOp::Range(RangeSpec::key("k"))],
            failure: vec![TxnOp::Range(RangeSpec::key("k"))],
        };
        let answer = read_txn(|| engine.clone(), &history, &txn, 0).unwrap();
        let read = answer.ranges[0].kvs[0].mod_revision;
        assert_eq!(
            answer.succeeded,
            read < bound,
            "the compare and the range saw different states (bound {bound}, read {read}, \
             revision {})",
            answer.revision
        );
        assert_eq!(read, answer.revision, "k is the only key written");
        answer.revision
    };
    let mut checked = 0;
    let mut bound = 2;
    loop {
        // The next bound just above what was read: the race is close.
        bound = check(bound) + 1;
        checked += 1;
        if writer.is_finished() {
            break;
        }
    }
    let cluster = writer.join().unwrap();
    // The first put took revision 2, each later one the next.
    let last = cluster.applier.header().revision;
    assert_eq!(last, writes + 2);
    assert!(checked > 0);
    // Nothing applies now: the bound above the store revision holds.
    assert_eq!(check(last + 1), last);
}

#[test]
fn a_merge_keeps_the_window_and_a_plain_merge_would_not() {
    let mut cluster = Cluster::new();
    workload(&mut cluster, 40);
    let report = cluster.merge();
    assert!(report.records_retained > 0, "history was kept: {report:?}");
    cluster.check_window(1);
    // More writes, another merge over the first one's output.
    workload(&mut cluster, 20);
    cluster.merge();
    cluster.check_window(1);

    // The control: a merge that keeps no history loses past revisions.
    let mut control = Cluster::new();
    workload(&mut control, 40);
    let inputs = control.engine.sealed_data_files();
    let report = control.engine.merge(&inputs, control.index).unwrap();
    let forgotten = control.relocate(&report);
    assert!(forgotten > 0, "a plain merge drops superseded records");
}

#[test]
fn the_history_is_rebuilt_from_the_files_at_open_as_it_was_built_by_applying() {
    let mut cluster = Cluster::new();
    workload(&mut cluster, 30);
    cluster.merge();
    workload(&mut cluster, 10);
    let live = index_of(&cluster.history().read().unwrap());
    cluster.restart();
    let loaded = index_of(&cluster.history().read().unwrap());
    assert_eq!(loaded, live);
    cluster.check_window(1);
    // After a compaction too (bases from before the window).
    let revision = cluster.applier.header().revision;
    let outcomes = cluster.apply(Command::Compact {
        revision: revision - 20,
    });
    assert!(
        matches!(outcomes[..], [Outcome::Applied { .. }]),
        "{outcomes:?}"
    );
    workload(&mut cluster, 5);
    let live = index_of(&cluster.history().read().unwrap());
    cluster.restart();
    assert_eq!(index_of(&cluster.history().read().unwrap()), live);
    cluster.check_window(revision - 20);
}

#[test]
fn compaction_refuses_reads_below_it_and_keeps_serving_the_rest() {
    let mut cluster = Cluster::new();
    workload(&mut cluster, 30);
    let current = cluster.applier.header().revision;
    let compact = current - 15;
    let outcomes = cluster.apply(Command::Compact { revision: compact });
    assert!(
        matches!(outcomes[..], [Outcome::Applied { .. }]),
        "{outcomes:?}"
    );
    assert_eq!(cluster.applier.header().compact_revision, compact);
    assert_eq!(
        cluster.applier.header().revision,
        current,
        "compaction writes no revision"
    );
    match cluster.read_at(compact - 1) {
        Err(RangeError::History(HistoryError::Compacted {
            requested,
            compact_revision,
        })) => assert_eq!((requested, compact_revision), (compact - 1, compact)),
        other => panic!("{other:?}"),
    }
    let message = cluster.read_at(1).unwrap_err().to_string();
    assert!(
        message.contains("compacted") && message.contains(&compact.to_string()),
        "{message}"
    );
    match cluster.read_at(current + 1) {
        Err(RangeError::History(HistoryError::Future {
            requested,
            current: at,
        })) => {
            assert_eq!((requested, at), (current + 1, current));
        }
        other => panic!("{other:?}"),
    }
    cluster.check_window(compact);
    // A merge after the compaction keeps what the window needs (and lets
    // go of the rest), a restart rebuilds it.
    workload(&mut cluster, 10);
    cluster.merge();
    cluster.check_window(compact);
    cluster.restart();
    cluster.check_window(compact);
    assert!(cluster.read_at(compact - 1).is_err());

    // Compacting again at or below the compact revision, or past the store
    // revision, is refused with etcd's messages, and changes nothing.
    let current = cluster.applier.header().revision;
    for (revision, says) in [
        (compact, "has been compacted"),
        (compact - 3, "has been compacted"),
        (current + 1, "future revision"),
    ] {
        let outcomes = cluster.apply(Command::Compact { revision });
        match &outcomes[..] {
            [Outcome::Rejected { reason }] => assert!(reason.contains(says), "{reason}"),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(cluster.applier.header().compact_revision, compact);
}

#[test]
fn the_window_target_follows_revisions_and_bytes() {
    let mut cluster = Cluster::new();
    workload(&mut cluster, 30);
    let history = cluster.history();
    let history = history.read().unwrap();
    let revision = history.revision();
    let roomy = HistoryWindow {
        revisions: revision + 10,
        bytes: u64::MAX,
        records: u64::MAX,
    };
    assert_eq!(history.compaction_target(roomy), None);
    assert!(!history.is_over(roomy));
    let by_revisions = HistoryWindow {
        revisions: 10,
        ..roomy
    };
    assert_eq!(history.compaction_target(by_revisions), Some(revision - 10));
    assert!(history.is_over(by_revisions));
    let (records, bytes) = history.records();
    let by_bytes = HistoryWindow {
        bytes: bytes / 2,
        ..roomy
    };
    let target = history.compaction_target(by_bytes).unwrap();
    assert!(target > 1 && target < revision, "{target} of {revision}");
    let by_records = HistoryWindow {
        records: records as u64 / 2,
        ..roomy
    };
    let target = history.compaction_target(by_records).unwrap();
    assert!(target > 1 && target < revision, "{target} of {revision}");
    // Within an eighth over: not yet worth a compaction entry.
    let nearly = HistoryWindow {
        records: records as u64 - 1,
        ..roomy
    };
    assert!(history.compaction_target(nearly).is_some() && !history.is_over(nearly));
}

#[test]
fn a_read_at_the_store_revision_judges_ttls_as_a_current_read_does() {
    let mut cluster = Cluster::new();
    // More keys expire at once than one entry deletes: some wait, expired.
    let keys = kvstate::apply::EXPIRY_DELETES_PER_ENTRY_MAX + 4;
    let puts = (0..keys)
        .map(|i| {
            write(Op::Put {
                key: format!("t{i:05}").into(),
                value: "v".into(),
                ttl_ms: 1,
            })
        })
        .collect();
    cluster.apply(Command::Writes(puts));
    let written = cluster.applier.header().revision;
    while cluster.index < 2 {
        cluster.apply(Command::Advance);
    }
    let revision = cluster.applier.header().revision;
    let current = range(&cluster.engine, &all(), cluster.index, revision).unwrap();
    let at = cluster.read_at(revision).unwrap();
    assert_eq!(at, current);
    assert_eq!(at.count, 0, "every key expired");
    // Below the store revision TTLs are not judged: the keys were there.
    let before = cluster.read_at(written).unwrap();
    assert_eq!(before.count, keys as u64);
}

#[test]
fn compacting_the_revisions_of_a_hot_key_keeps_its_base() {
    let mut cluster = Cluster::new();
    for i in 0..500 {
        cluster.apply(Command::Writes(vec![put("hot", &i.to_string())]));
    }
    let revision = cluster.applier.header().revision;
    cluster.apply(Command::Compact {
        revision: revision - 10,
    });
    let history = cluster.history();
    let versions = history
        .read()
        .unwrap()
        .keys_in_window()
        .map(|(_, versions)| versions.len())
        .collect::<Vec<_>>();
    assert_eq!(versions, [11], "the base and the ten revisions after it");
    drop(history);
    cluster.check_window(revision - 10);
}

#[test]
fn a_key_first_written_while_a_merge_runs_keeps_its_base_through_the_merge() {
    let mut cluster = Cluster::new();
    cluster.apply(Command::Writes(vec![put("cold", "old")]));
    workload(&mut cluster, 30);
    // Compacted to now: "cold" leaves the index (its record is live).
    let compact = cluster.applier.header().revision;
    cluster.apply(Command::Compact { revision: compact });
    assert!(cluster.history().read().unwrap().keys() == 0);
    // A merge is captured; "cold" is written before it swaps its output in,
    // so its base is noted in a file the merge replaces.
    let inputs = cluster.engine.sealed_data_files();
    let named = cluster.history().read().unwrap().named();
    let job = cluster
        .engine
        .begin_merge_retaining(&inputs, 0, History::retain(named))
        .unwrap();
    cluster.apply(Command::Writes(vec![put("cold", "new")]));
    let report = job.run().unwrap();
    let forgotten = cluster.relocate(&report);
    assert_eq!(forgotten, 0);
    cluster.check_window(compact);
    let live = index_of(&cluster.history().read().unwrap());
    cluster.restart();
    assert_eq!(index_of(&cluster.history().read().unwrap()), live);
    cluster.check_window(compact);
}

/// Watch pages (`kvstate::watch`): what a watcher reads from the change
/// history, checked against the changes each revision made to the whole
/// key space (the current reads the cluster recorded after each entry).
mod watch {
    use super::*;
    use kvstate::range::KeyValue;
    use kvstate::watch::{
        Event, EventCursor, EventKind, EventsError, WATCH_PAGE_EVENTS_MAX, WatchSpec, events,
    };

    /// One entry of one request a step (so each revision is one entry and
    /// the recorded reads tell every revision's changes): puts, deletes,
    /// transactions of several puts, range deletes, from a fixed seed.
    fn one_revision_workload(cluster: &mut Cluster, steps: usize, seed: u64) {
        let mut state = seed;
        let mut next = move |below: u64| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (state >> 33) % below
        };
        for step in 0..steps {
            let key = |n: u64| format!("{}{}", ["a/", "b/", "c"][(n % 3) as usize], n % 7);
            let value = format!("v{step}");
            match next(10) {
                0..=4 => {
                    cluster.apply(Command::Writes(vec![put(&key(next(21)), &value)]));
                }
                5 | 6 => {
                    cluster.apply(Command::Writes(vec![delete(&key(next(21)))]));
                }
                7 | 8 => {
                    let first = next(21);
                    let keys: std::collections::BTreeSet<String> =
                        (0..3).map(|i| key(first + i * 5)).collect();
                    let success = keys
                        .iter()
                        .map(|k| TxnOp::Put {
                            key: k.clone().into(),
                            value: value.clone().into(),
                            ttl_ms: 0,
                            lease: 0,
                            prev_kv: false,
                            ignore_value: false,
                            ignore_lease: false,
                        })
                        .collect();
                    cluster.apply(Command::Txns(vec![TxnRequest {
                        session: None,
                        compares: Vec::new(),
                        success,
                        failure: Vec::new(),
                    }]));
                }
                _ => {
                    cluster.apply(Command::Txns(vec![delete_prefix(["a/", "b/"][step % 2])]));
                }
            }
        }
    }

    /// Every event after `from`, by the recorded reads: per revision, the
    /// keys whose state changed (in key order), with their previous state.
    fn expected(cluster: &Cluster, from: u64) -> Vec<Shape> {
        let mut events = Vec::new();
        let revisions: Vec<&u64> = cluster.seen.keys().collect();
        for pair in revisions.windows(2) {
            let (before, after) = (&cluster.seen[pair[0]], &cluster.seen[pair[1]]);
            if *pair[1] < from {
                continue;
            }
            assert!(*pair[1] - *pair[0] <= 1, "one revision per entry");
            let old: BTreeMap<&[u8], &KeyValue> =
                before.kvs.iter().map(|kv| (&kv.key[..], kv)).collect();
            let new: BTreeMap<&[u8], &KeyValue> =
                after.kvs.iter().map(|kv| (&kv.key[..], kv)).collect();
            let keys: std::collections::BTreeSet<&[u8]> =
                old.keys().chain(new.keys()).copied().collect();
            for key in keys {
                match (old.get(key), new.get(key)) {
                    (prev, Some(kv)) if prev != Some(kv) => {
                        events.push((EventKind::Put, (*kv).clone(), prev.map(|p| (*p).clone())))
                    }
                    (Some(prev), None) => events.push((
                        EventKind::Delete,
                        KeyValue {
                            key: key.to_vec(),
                            mod_revision: *pair[1],
                            ..KeyValue::default()
                        },
                        Some((*prev).clone()),
                    )),
                    _ => {}
                }
            }
        }
        events
    }

    /// Reads every page of `spec` from `from` to the store revision,
    /// `step` revisions at a time (as a watcher woken every `step`
    /// revisions does).
    fn read_all(
        cluster: &Cluster,
        spec: &WatchSpec,
        from: u64,
        step: u64,
    ) -> Result<Vec<Event>, EventsError> {
        let engine = cluster.engine.clone();
        let history = cluster.history();
        let current = cluster.applier.header().revision;
        let mut cursor = EventCursor::at(from);
        let mut through = from.saturating_sub(1);
        let mut all = Vec::new();
        while cursor.revision <= current {
            through = (through + step).min(current);
            loop {
                let page = events(|| engine.clone(), &history, spec, cursor, through)?;
                assert!(page.events.len() <= WATCH_PAGE_EVENTS_MAX);
                assert!(page.next > cursor || page.events.is_empty() && page.next == cursor);
                if page.next.skip > 0 {
                    // Cut inside a revision: the page holds only it.
                    assert!(
                        page.events
                            .iter()
                            .all(|e| e.revision() == page.next.revision),
                        "a page cut inside revision {} holds only it",
                        page.next.revision
                    );
                }
                let done = page.next.revision > through;
                all.extend(page.events);
                cursor = page.next;
                if done {
                    break;
                }
            }
        }
        Ok(all)
    }

    /// Events as (kind, key value, prev) and their order: by revision,
    /// then by record within it.
    fn shapes(events: &[Event]) -> Vec<Shape> {
        for pair in events.windows(2) {
            assert!(
                (pair[0].revision(), pair[0].seq) < (pair[1].revision(), pair[1].seq),
                "events in order: {pair:?}"
            );
        }
        events
            .iter()
            .map(|e| (e.kind, e.kv.clone(), e.prev_kv.clone()))
            .collect()
    }

    /// In key order within each revision, as `expected` lists them.
    fn by_key(mut events: Vec<Shape>) -> Vec<Shape> {
        events.sort_by(|a, b| (a.1.mod_revision, &a.1.key).cmp(&(b.1.mod_revision, &b.1.key)));
        events
    }

    type Shape = (EventKind, KeyValue, Option<KeyValue>);

    /// A new cluster with its first state (empty, revision 1) recorded too.
    fn fresh() -> Cluster {
        let mut cluster = Cluster::new();
        let revision = cluster.applier.header().revision;
        let empty = range(&cluster.engine, &all(), 0, revision).unwrap();
        assert_eq!(empty.count, 0);
        cluster.seen.insert(revision, empty);
        cluster
    }

    /// Equal lists, or a panic naming the first difference.
    fn same_events(got: &[Shape], want: &[Shape], what: &str) {
        if let Some(at) = (0..got.len().max(want.len())).find(|&i| got.get(i) != want.get(i)) {
            panic!(
                "{what}: {} events, {} expected; first difference at {at}:\n got {:?}\nwant {:?}",
                got.len(),
                want.len(),
                got.get(at),
                want.get(at)
            );
        }
    }

    fn with_prev(key: &str, range_end: &str) -> WatchSpec {
        WatchSpec {
            prev_kv: true,
            ..WatchSpec::new(key.as_bytes(), range_end.as_bytes())
        }
    }

    /// Every start revision of the window, several wake-up steps, with and
    /// without prev_kv.
    fn check_every_start(cluster: &Cluster, first: u64) {
        let everything = with_prev("\0", "\0");
        let current = cluster.applier.header().revision;
        for from in first..=current + 1 {
            let want = expected(cluster, from);
            for step in [1, 7, 1000] {
                let got = by_key(shapes(&read_all(cluster, &everything, from, step).unwrap()));
                same_events(
                    &got,
                    &want,
                    &format!("events from revision {from}, step {step}"),
                );
            }
        }
        // Without prev_kv, none is sent.
        let plain = WatchSpec::new(b"\0", b"\0");
        let got = read_all(cluster, &plain, first, 3).unwrap();
        assert!(got.iter().all(|e| e.prev_kv.is_none()));
        assert_eq!(got.len(), expected(cluster, first).len());
    }

    #[test]
    fn pages_from_every_revision_carry_each_change_once_in_order_through_merges_and_restart() {
        let mut cluster = fresh();
        one_revision_workload(&mut cluster, 120, 7);
        check_every_start(&cluster, 1);
        cluster.merge();
        check_every_start(&cluster, 1);
        one_revision_workload(&mut cluster, 40, 8);
        cluster.restart();
        check_every_start(&cluster, 1);
    }

    #[test]
    fn ranges_prefixes_and_filters_select_their_events() {
        let mut cluster = fresh();
        one_revision_workload(&mut cluster, 150, 11);
        let all = expected(&cluster, 1);
        let puts = all.iter().filter(|e| e.0 == EventKind::Put).count();
        let deletes = all.len() - puts;
        assert!(puts > 20 && deletes > 20, "{puts} puts, {deletes} deletes");
        for (spec, keep) in [
            (
                with_prev("a/", "a0"),
                Box::new(|kv: &KeyValue| kv.key.starts_with(b"a/"))
                    as Box<dyn Fn(&KeyValue) -> bool>,
            ),
            (
                with_prev("b/3", ""),
                Box::new(|kv: &KeyValue| kv.key == b"b/3"),
            ),
            (
                with_prev("b/", "\0"),
                Box::new(|kv: &KeyValue| kv.key.as_slice() >= b"b/".as_slice()),
            ),
        ] {
            let want: Vec<_> = all.iter().filter(|e| keep(&e.1)).cloned().collect();
            assert!(!want.is_empty());
            let got = by_key(shapes(&read_all(&cluster, &spec, 1, 5).unwrap()));
            same_events(&got, &want, &format!("{spec:?}"));
        }
        let no_put = WatchSpec {
            no_put: true,
            ..with_prev("\0", "\0")
        };
        let got = read_all(&cluster, &no_put, 1, 5).unwrap();
        assert_eq!(got.len(), deletes);
        assert!(got.iter().all(|e| e.kind == EventKind::Delete));
        let no_delete = WatchSpec {
            no_delete: true,
            ..with_prev("\0", "\0")
        };
        let got = read_all(&cluster, &no_delete, 1, 5).unwrap();
        assert_eq!(got.len(), puts);
        assert!(got.iter().all(|e| e.kind == EventKind::Put));
    }

    #[test]
    fn a_start_at_or_below_the_compact_revision_is_refused_naming_it() {
        let mut cluster = fresh();
        one_revision_workload(&mut cluster, 60, 3);
        let current = cluster.applier.header().revision;
        let compact = current - 20;
        cluster.apply(Command::Compact { revision: compact });
        for from in [1, compact - 1, compact] {
            match read_all(&cluster, &with_prev("\0", "\0"), from, 5) {
                Err(EventsError::Compacted {
                    requested,
                    compact_revision,
                }) => assert_eq!((requested, compact_revision), (from, compact)),
                other => panic!("from {from}: {other:?}"),
            }
        }
        let message = read_all(&cluster, &with_prev("\0", "\0"), 2, 5)
            .unwrap_err()
            .to_string();
        assert!(
            message.contains("compacted") && message.contains(&compact.to_string()),
            "{message}"
        );
        check_every_start(&cluster, compact + 1);
        // A merge after the compaction keeps what the window serves.
        one_revision_workload(&mut cluster, 30, 4);
        cluster.merge();
        check_every_start(&cluster, compact + 1);
    }

    #[test]
    fn keys_compaction_forgot_and_written_again_carry_their_events() {
        // Deleted keys whose every version leaves the window are forgotten
        // (their places in the index reused by keys written after): the
        // events after each compaction stay those of the recorded reads.
        let mut cluster = fresh();
        let mut compact = 0;
        for (round, seed) in [21, 22, 23, 24].into_iter().enumerate() {
            one_revision_workload(&mut cluster, 50, seed);
            let current = cluster.applier.header().revision;
            compact = current - 5 - round as u64;
            cluster.apply(Command::Compact { revision: compact });
            check_every_start(&cluster, compact + 1);
        }
        one_revision_workload(&mut cluster, 30, 25);
        cluster.merge();
        check_every_start(&cluster, compact + 1);
        cluster.restart();
        check_every_start(&cluster, compact + 1);
    }

    #[test]
    fn a_revision_larger_than_a_page_is_cut_and_resumed_inside_it() {
        let mut cluster = fresh();
        let keys = WATCH_PAGE_EVENTS_MAX * 2 + 17;
        let puts = (0..keys)
            .map(|i| Op::Put {
                key: format!("p{i:05}").into(),
                value: "v".into(),
                ttl_ms: 0,
            })
            .collect();
        cluster.apply(Command::Writes(vec![Request {
            session: None,
            conditions: Vec::new(),
            ops: puts,
        }]));
        cluster.apply(Command::Txns(vec![delete_prefix("p")]));
        let revision = cluster.applier.header().revision;
        let engine = cluster.engine.clone();
        let history = cluster.history();
        let spec = WatchSpec::new(b"p", b"q");
        let first = events(
            || engine.clone(),
            &history,
            &spec,
            EventCursor::at(1),
            revision,
        )
        .unwrap();
        assert_eq!(first.events.len(), WATCH_PAGE_EVENTS_MAX);
        assert_eq!(
            first.next.skip, WATCH_PAGE_EVENTS_MAX,
            "cut inside the revision"
        );
        // The revision's last events start a page; the next revision, too
        // large to follow them, starts the one after.
        let third = events(
            || engine.clone(),
            &history,
            &spec,
            EventCursor {
                revision: revision - 1,
                skip: 2 * WATCH_PAGE_EVENTS_MAX,
            },
            revision,
        )
        .unwrap();
        assert_eq!(third.events.len(), 17);
        assert_eq!(third.next, EventCursor::at(revision));
        let got = read_all(&cluster, &spec, 1, 1000).unwrap();
        shapes(&got);
        assert_eq!(got.len(), 2 * keys);
        let (puts, deletes) = got.split_at(keys);
        assert!(puts.iter().all(|e| e.kind == EventKind::Put));
        assert!(deletes.iter().all(|e| e.kind == EventKind::Delete));
        assert_eq!(puts[0].revision(), revision - 1);
        assert!(puts.iter().all(|e| e.revision() == revision - 1));
        assert!(deletes.iter().all(|e| e.revision() == revision));
    }

    #[test]
    fn a_key_written_twice_at_one_revision_gives_two_events_and_expiry_gives_a_delete() {
        let mut cluster = fresh();
        cluster.apply(Command::Writes(vec![Request {
            session: None,
            conditions: Vec::new(),
            ops: vec![
                Op::Put {
                    key: "twice".into(),
                    value: "one".into(),
                    ttl_ms: 0,
                },
                Op::Put {
                    key: "twice".into(),
                    value: "two".into(),
                    ttl_ms: 0,
                },
                Op::Put {
                    key: "brief".into(),
                    value: "gone soon".into(),
                    ttl_ms: 2,
                },
            ],
        }]));
        let written = cluster.applier.header().revision;
        while cluster.applier.header().revision == written {
            assert!(cluster.index < 10, "the TTL's delete came");
            cluster.apply(Command::Advance);
        }
        let got = read_all(&cluster, &with_prev("\0", "\0"), 1, 1).unwrap();
        let shown: Vec<(EventKind, &[u8], &[u8], u64)> = got
            .iter()
            .map(|e| (e.kind, &e.kv.key[..], &e.kv.value[..], e.revision()))
            .collect();
        assert_eq!(
            shown,
            vec![
                (EventKind::Put, &b"twice"[..], &b"one"[..], written),
                (EventKind::Put, &b"twice"[..], &b"two"[..], written),
                (EventKind::Put, &b"brief"[..], &b"gone soon"[..], written),
                (EventKind::Delete, &b"brief"[..], &b""[..], written + 1),
            ]
        );
        // The second write's previous state is the first's.
        assert_eq!(got[1].prev_kv.as_ref().unwrap().value, b"one");
        assert_eq!(got[3].prev_kv.as_ref().unwrap().value, b"gone soon");
    }
}
