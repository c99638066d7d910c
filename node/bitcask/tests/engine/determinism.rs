//! Determinism: files are a function of the batches written, and of nothing
//! else — not the sync policy, not when the engine was reopened, not a power
//! cut (after `sync`), not the wall clock, not randomness.
//!
//! How: a deterministic pseudo-random stream of batches (caller-supplied,
//! gapped sequence numbers via `Batch::seq`, a mix of puts, deletes and
//! expiring puts, a third of them carrying a record meta of 1–12 bytes
//! (record and hint kinds 4 and 5), empty batches, metadata) is fed to two engines on two
//! separate `SimFs` disks with the same `segment_size_bytes` but different
//! sync policies (Always / EveryMs / Never) and different reopen points
//! (every 7 batches, every 13, never), one of them optionally power-cut
//! (after `sync`) and reopened at a few points.
//!
//! 1. While replica B lags a few batches behind A: every sealed file of B
//!    (data and hint) is byte-identical to A's file of that name and B's
//!    sealed list is a prefix of A's; B's active segment is a byte prefix of
//!    A's file of that name. Once B catches up: the sealed lists
//!    (`sealed_files()`: name, length, crc) are equal, every sealed `.data` /
//!    `.hint` file is byte-identical, the active segments are equal, the
//!    directories hold the same names, and stats and contents agree.
//! 2. Both run the same merge (`merge(&sealed_data_files(), now)`): the
//!    reports and the outputs (names, data and hint bytes) are identical, and
//!    the names carry the cut-off (the last commit sequence) and part index.
//! 3. More batches (both keep their reopen schedules), a second merge at a
//!    later "now" (so some expiring puts are dropped), compared again; then
//!    both are reopened and compared again (recovery changes no file).
//! 4. Running the whole scenario twice yields the same file names and bytes,
//!    and every name is derived from a sequence number: `seg-<first seq of a
//!    batch>` or `merge-<cut-off>-<part>`.

use std::collections::BTreeSet;

use bitcask::{Batch, Engine, FileInfo, MergeReport, RecordMeta, Scan, Stats, SyncPolicy, format};
use vfs::sim::{SimFs, Torn};

use crate::common;

/// Rotation threshold shared by both replicas.
const SEGMENT_SIZE_BYTES: u64 = 1024;
/// Expiring puts expire in this window of the caller's clock.
const EXPIRY_BASE_MS: u64 = 10_000;
const EXPIRY_SPAN_MS: u64 = 1_000;
/// "now" of the first merge (some expiring puts are dead by then) and the second.
const FIRST_MERGE_NOW_MS: u64 = EXPIRY_BASE_MS + 300;
const SECOND_MERGE_NOW_MS: u64 = EXPIRY_BASE_MS + 700;

// ---------------------------------------------------------------------------
// The batch stream
// ---------------------------------------------------------------------------

/// splitmix64: a tiny deterministic generator, the same on every platform.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    /// No record meta two times in three, else 1–12 pseudo-random bytes.
    fn record_meta(&mut self) -> RecordMeta {
        if self.below(3) != 0 {
            return RecordMeta::EMPTY;
        }
        let bytes: Vec<u8> = (0..1 + self.below(12)).map(|_| self.next() as u8).collect();
        RecordMeta::new(&bytes).expect("12 bytes fit")
    }
}

/// `count` batches starting at sequence `next_seq` (gaps between batches, as
/// Raft log indexes may have); returns them and the next free sequence.
fn make_batches(seed: u64, count: usize, mut next_seq: u64) -> (Vec<Batch>, u64) {
    let mut rng = Rng(seed);
    let mut batches = Vec::with_capacity(count);
    for i in 0..count {
        let seq = next_seq + rng.below(3);
        let mut batch = Batch::new().seq(seq);
        let ops = match rng.below(10) {
            0 => 0, // an empty batch: just a commit record
            _ => 1 + rng.below(5),
        };
        for _ in 0..ops {
            let key = format!("key/{:02}", rng.below(40));
            match rng.below(20) {
                0..=11 => {
                    let len = rng.below(120) as usize;
                    let value = common::value_for(key.as_bytes(), seq, len);
                    batch = batch.put_with_meta(key, value, 0, rng.record_meta());
                }
                12..=15 => {
                    let len = rng.below(80) as usize;
                    let expiry = EXPIRY_BASE_MS + rng.below(EXPIRY_SPAN_MS);
                    batch = batch.put_with_meta(
                        key.clone(),
                        common::value_for(key.as_bytes(), seq, len),
                        expiry,
                        rng.record_meta(),
                    );
                }
                _ => batch = batch.delete_with_meta(key, rng.record_meta()),
            }
        }
        if rng.below(4) != 0 {
            batch = batch.meta(format!("raft index {seq}, batch {i}, seed {seed}"));
        }
        next_seq = seq + batch.ops.len() as u64 + 1;
        batches.push(batch);
    }
    (batches, next_seq)
}

// ---------------------------------------------------------------------------
// A replica: one engine on its own disk, with its reopen and crash schedule
// ---------------------------------------------------------------------------

#[derive(Clone, Debug)]
struct Plan {
    sync: SyncPolicy,
    /// Close and reopen after every this many batches.
    reopen_every: Option<usize>,
    /// Power cut (after `sync`) and reopen after these batch counts.
    crash_after: Vec<usize>,
    /// Power cut (after `sync`) and reopen right after each merge.
    crash_after_merge: bool,
}

struct Replica {
    name: &'static str,
    plan: Plan,
    fs: SimFs,
    engine: Option<Engine>,
    fed: usize,
    /// First sequence number of every batch fed (segment names must be among them).
    first_seqs: BTreeSet<u64>,
}

/// The files of a replica: sealed (data then hints, in engine order) and active.
#[derive(Debug)]
struct Snapshot {
    sealed: Vec<(FileInfo, Vec<u8>)>,
    active: Option<(FileInfo, Vec<u8>)>,
    /// Names in the directory except `*.tmp` (work in progress).
    names: Vec<String>,
}

impl Replica {
    fn new(name: &'static str, plan: Plan) -> Replica {
        let fs = SimFs::new();
        let engine = common::open_sim(&fs, plan.sync, SEGMENT_SIZE_BYTES);
        Replica {
            name,
            plan,
            fs,
            engine: Some(engine),
            fed: 0,
            first_seqs: BTreeSet::new(),
        }
    }

    fn engine(&self) -> &Engine {
        self.engine.as_ref().expect("engine is open")
    }

    fn feed(&mut self, batch: &Batch) {
        let written = self.engine().write_batch(batch).expect("write_batch");
        let seq = batch.seq.expect("batches carry their sequence");
        assert_eq!(written.first_seq, seq, "{}: first sequence", self.name);
        assert_eq!(
            written.commit_seq,
            seq + batch.ops.len() as u64,
            "{}: commit sequence",
            self.name
        );
        self.first_seqs.insert(seq);
        self.fed += 1;
        if self.plan.crash_after.contains(&self.fed) {
            self.crash();
        } else if self
            .plan
            .reopen_every
            .is_some_and(|n| self.fed.is_multiple_of(n))
        {
            self.reopen();
        }
    }

    fn reopen(&mut self) {
        let engine = self.engine.take().expect("engine is open");
        let (last_seq, meta) = (engine.last_seq(), engine.last_commit_meta());
        engine.close().expect("close");
        self.engine = Some(common::open_sim(
            &self.fs,
            self.plan.sync,
            SEGMENT_SIZE_BYTES,
        ));
        assert_eq!(
            self.engine().last_seq(),
            last_seq,
            "{}: last_seq after reopen",
            self.name
        );
        assert_eq!(
            self.engine().last_commit_meta(),
            meta,
            "{}: metadata after reopen",
            self.name
        );
    }

    fn crash(&mut self) {
        let engine = self.engine.take().expect("engine is open");
        engine.sync().expect("sync before the power cut");
        let (last_seq, meta) = (engine.last_seq(), engine.last_commit_meta());
        let after = self.fs.power_cut(Torn::Nothing);
        drop(engine);
        self.fs = after;
        self.engine = Some(common::open_sim(
            &self.fs,
            self.plan.sync,
            SEGMENT_SIZE_BYTES,
        ));
        assert_eq!(
            self.engine().last_seq(),
            last_seq,
            "{}: last_seq after power cut",
            self.name
        );
        assert_eq!(
            self.engine().last_commit_meta(),
            meta,
            "{}: metadata after power cut",
            self.name
        );
    }

    fn read(&self, name: &str) -> Vec<u8> {
        self.fs
            .read_file(&common::sim_dir().join(name))
            .unwrap_or_else(|| {
                panic!(
                    "{}: {name} is listed by the engine but not on disk",
                    self.name
                )
            })
    }

    fn snapshot(&self) -> Snapshot {
        let engine = self.engine();
        let sealed: Vec<(FileInfo, Vec<u8>)> = engine
            .sealed_files()
            .into_iter()
            .map(|info| {
                let bytes = self.read(&info.name);
                assert_eq!(
                    bytes.len() as u64,
                    info.len,
                    "{}: length of {}",
                    self.name,
                    info.name
                );
                assert_eq!(
                    crc32fast::hash(&bytes),
                    info.crc,
                    "{}: crc of {}",
                    self.name,
                    info.name
                );
                (info, bytes)
            })
            .collect();
        let data = sealed
            .iter()
            .filter(|(i, _)| i.name.ends_with(".data"))
            .count();
        let hints = sealed
            .iter()
            .filter(|(i, _)| i.name.ends_with(".hint"))
            .count();
        assert_eq!(
            data, hints,
            "{}: every sealed data file has a hint: {sealed:?}",
            self.name
        );
        let active = engine.active_file().map(|info| {
            let bytes = common::active_prefix(
                self.read(&info.name),
                info.len,
                &format!("{}: the active {}", self.name, info.name),
            );
            assert_eq!(
                crc32fast::hash(&bytes),
                info.crc,
                "{}: crc of the active {}",
                self.name,
                info.name
            );
            (info, bytes)
        });
        let names = common::sim_files(&self.fs, &common::sim_dir())
            .into_iter()
            .map(|(name, _)| name)
            .filter(|name| !name.ends_with(".tmp"))
            .collect();
        Snapshot {
            sealed,
            active,
            names,
        }
    }

    fn contents(&self, now_ms: u64) -> Vec<bitcask::Entry> {
        self.engine()
            .scan(&Scan::all(usize::MAX), now_ms)
            .expect("scan")
    }

    fn merge(&mut self, now_ms: u64) -> MergeReport {
        let inputs = self.engine().sealed_data_files();
        self.merge_files(&inputs, now_ms)
    }

    fn merge_files(&mut self, inputs: &[String], now_ms: u64) -> MergeReport {
        assert!(
            inputs.len() >= 2,
            "{}: too few sealed files to merge: {inputs:?}",
            self.name
        );
        let report = self
            .engine()
            .merge(inputs, now_ms)
            .unwrap_or_else(|e| panic!("{}: merge failed: {e}", self.name));
        if self.plan.crash_after_merge {
            self.crash();
        }
        report
    }

    fn close(mut self) -> SimFs {
        self.engine
            .take()
            .expect("engine is open")
            .close()
            .expect("close");
        self.fs
    }
}

/// Stats that must agree between replicas (the merge counter resets at open).
fn comparable(stats: Stats) -> Stats {
    Stats { merges: 0, ..stats }
}

fn names(files: &[(FileInfo, Vec<u8>)]) -> Vec<&str> {
    files.iter().map(|(i, _)| i.name.as_str()).collect()
}

/// Both replicas fed the same batches: everything is identical.
fn assert_identical(a: &Replica, b: &Replica, when: &str) {
    assert_eq!(a.fed, b.fed);
    let (sa, sb) = (a.snapshot(), b.snapshot());
    assert_eq!(
        names(&sa.sealed),
        names(&sb.sealed),
        "sealed file lists differ {when}"
    );
    for ((ia, ba), (ib, bb)) in sa.sealed.iter().zip(&sb.sealed) {
        assert_eq!(ia, ib, "sealed file info differs {when}");
        assert!(
            ba == bb,
            "sealed {} differs between {} and {} {when}",
            ia.name,
            a.name,
            b.name
        );
    }
    match (&sa.active, &sb.active) {
        (None, None) => {}
        (Some((ia, ba)), Some((ib, bb))) => {
            assert_eq!(ia, ib, "active segment differs {when}");
            assert!(ba == bb, "active {} bytes differ {when}", ia.name);
        }
        (x, y) => panic!(
            "{when}: one replica has an active segment, the other not: {:?} vs {:?}",
            x.as_ref().map(|(i, _)| i),
            y.as_ref().map(|(i, _)| i)
        ),
    }
    assert_eq!(sa.names, sb.names, "directory listings differ {when}");
    let (ea, eb) = (a.engine(), b.engine());
    assert_eq!(ea.last_seq(), eb.last_seq(), "last_seq differs {when}");
    assert_eq!(
        ea.last_commit_meta(),
        eb.last_commit_meta(),
        "last metadata differs {when}"
    );
    assert_eq!(
        comparable(ea.stats()),
        comparable(eb.stats()),
        "stats differ {when}"
    );
    for now in [0, FIRST_MERGE_NOW_MS, SECOND_MERGE_NOW_MS] {
        assert_eq!(
            a.contents(now),
            b.contents(now),
            "contents at now {now} differ {when}"
        );
    }
}

/// `behind` was fed a prefix of what `ahead` was fed: its files are a prefix.
fn assert_prefix(ahead: &Replica, behind: &Replica, when: &str) {
    assert!(behind.fed <= ahead.fed);
    let (sa, sb) = (ahead.snapshot(), behind.snapshot());
    let split = |s: &Snapshot, suffix: &str| -> Vec<String> {
        s.sealed
            .iter()
            .filter(|(i, _)| i.name.ends_with(suffix))
            .map(|(i, _)| i.name.clone())
            .collect()
    };
    for suffix in [".data", ".hint"] {
        let (la, lb) = (split(&sa, suffix), split(&sb, suffix));
        assert!(
            la.starts_with(&lb),
            "{when}: sealed {suffix} files of {} {lb:?} are not a prefix of {}'s {la:?}",
            behind.name,
            ahead.name
        );
    }
    let bytes_in = |s: &Snapshot, name: &str| -> Option<Vec<u8>> {
        s.sealed
            .iter()
            .chain(s.active.iter())
            .find(|(i, _)| i.name == name)
            .map(|(_, b)| b.clone())
    };
    for (info, bytes) in &sb.sealed {
        let other = bytes_in(&sa, &info.name).expect("checked above");
        assert!(other == *bytes, "{when}: sealed {} differs", info.name);
    }
    if let Some((info, bytes)) = &sb.active {
        let other = bytes_in(&sa, &info.name).unwrap_or_else(|| {
            panic!(
                "{when}: {}'s active {} is unknown to {}",
                behind.name, info.name, ahead.name
            )
        });
        assert!(
            other.len() >= bytes.len() && other[..bytes.len()] == bytes[..],
            "{when}: {}'s active {} ({} bytes) is not a prefix of {}'s ({} bytes)",
            behind.name,
            info.name,
            bytes.len(),
            ahead.name,
            other.len()
        );
    }
}

/// The file names carry only sequence numbers: `seg-<first seq of a batch>`
/// and `merge-<cut-off>-<part>` with a cut-off some merge reported.
fn assert_names_from_sequences(replica: &Replica, cutoffs: &[u64]) {
    for name in replica.snapshot().names {
        let stem = name
            .strip_suffix(".data")
            .or_else(|| name.strip_suffix(".hint"))
            .unwrap_or_else(|| panic!("unexpected file {name}"));
        if let Some(seq) = stem.strip_prefix("seg-") {
            assert_eq!(seq.len(), 20, "{name}");
            let seq: u64 = seq.parse().unwrap_or_else(|_| panic!("{name}"));
            assert!(
                replica.first_seqs.contains(&seq),
                "{name} is not named after the first sequence of a batch"
            );
        } else if let Some(rest) = stem.strip_prefix("merge-") {
            let (cutoff, part) = rest.split_once('-').unwrap_or_else(|| panic!("{name}"));
            assert_eq!((cutoff.len(), part.len()), (20, 4), "{name}");
            let cutoff: u64 = cutoff.parse().unwrap_or_else(|_| panic!("{name}"));
            assert!(
                cutoffs.contains(&cutoff),
                "{name} is not named after a merge cut-off {cutoffs:?}"
            );
        } else {
            panic!("unexpected file {name}");
        }
    }
}

fn assert_same_merge(
    a: &Replica,
    b: &Replica,
    ra: &MergeReport,
    rb: &MergeReport,
    last_commit: u64,
    when: &str,
) {
    assert_eq!(ra, rb, "merge reports differ {when}");
    assert_eq!(
        ra.cutoff, last_commit,
        "the cut-off is the last commit sequence {when}"
    );
    assert!(
        ra.outputs.len() >= 2,
        "expected a multi-part merge output {when}: {ra:?}"
    );
    for (part, name) in ra.outputs.iter().enumerate() {
        assert_eq!(
            *name,
            format!("merge-{:020}-{part:04}.data", ra.cutoff),
            "{when}"
        );
    }
    assert!(
        ra.bytes_after < ra.bytes_before,
        "the merge reclaimed nothing {when}: {ra:?}"
    );
    assert!(
        a.engine().sealed_data_files().starts_with(&ra.outputs),
        "{when}"
    );
    // Outputs (data and hints) are byte-identical on both disks.
    for name in &ra.outputs {
        let hint = name.replace(".data", ".hint");
        for file in [name, &hint] {
            assert!(
                a.read(file) == b.read(file),
                "merge output {file} differs {when}"
            );
        }
    }
    assert_identical(a, b, when);
}

/// The kind bytes of every entry in the replica's sealed hint files.
fn sealed_hint_kinds(replica: &Replica) -> BTreeSet<u8> {
    let mut kinds = BTreeSet::new();
    for (info, bytes) in replica.snapshot().sealed {
        if !info.name.ends_with(".hint") {
            continue;
        }
        let mut rest =
            &bytes[format::FILE_HEADER_SIZE_BYTES..bytes.len() - format::HINT_TRAILER_SIZE_BYTES];
        while !rest.is_empty() {
            let (_, size) = format::decode_hint_entry(rest).expect("a sealed hint decodes");
            kinds.insert(rest[format::HINT_KIND_OFFSET]);
            rest = &rest[size..];
        }
    }
    kinds
}

/// Feeds both replicas, merges, feeds more, merges again; returns the final
/// directory of replica A (names and bytes) after a last reopen.
fn scenario(seed: u64, plan_a: Plan, plan_b: Plan) -> Vec<(String, Vec<u8>)> {
    const LAG: usize = 5;
    let mut a = Replica::new("A", plan_a);
    let mut b = Replica::new("B", plan_b);
    let (first, next_seq) = make_batches(seed, 120, 1);
    let (second, _) = make_batches(seed ^ 0xdead_beef, 100, next_seq);
    let commit_of = |batch: &Batch| batch.seq.unwrap() + batch.ops.len() as u64;

    // 1. B lags behind A, then catches up.
    for (i, batch) in first.iter().enumerate() {
        a.feed(batch);
        if i >= LAG {
            b.feed(&first[i - LAG]);
        }
        assert_prefix(
            &a,
            &b,
            &format!("with B {} batches behind at batch {i}", a.fed - b.fed),
        );
    }
    for batch in &first[first.len() - LAG..] {
        b.feed(batch);
    }
    assert_identical(&a, &b, "after the first batches");
    let kinds = sealed_hint_kinds(&a);
    assert!(
        kinds.contains(&format::KIND_PUT_WITH_META)
            && kinds.contains(&format::KIND_TOMBSTONE_WITH_META),
        "the stream should write records with meta (kinds 4 and 5); hints hold kinds {kinds:?}"
    );

    // 2. The same merge on both.
    let (ra, rb) = (a.merge(FIRST_MERGE_NOW_MS), b.merge(FIRST_MERGE_NOW_MS));
    assert_same_merge(
        &a,
        &b,
        &ra,
        &rb,
        commit_of(first.last().unwrap()),
        "after the first merge",
    );

    // 3. More batches in lockstep, a second merge, then a reopen of both.
    for (i, batch) in second.iter().enumerate() {
        a.feed(batch);
        b.feed(batch);
        if i % 10 == 9 {
            assert_identical(&a, &b, &format!("at batch {i} after the first merge"));
        }
    }
    assert_identical(&a, &b, "after the second batches");
    let (ra2, rb2) = (a.merge(SECOND_MERGE_NOW_MS), b.merge(SECOND_MERGE_NOW_MS));
    assert!(
        sealed_hint_kinds(&a).contains(&format::KIND_PUT_WITH_META),
        "merge outputs keep records with meta"
    );
    assert!(
        ra2.inputs.starts_with(&ra.outputs),
        "the second merge takes in the first one's output"
    );
    assert_same_merge(
        &a,
        &b,
        &ra2,
        &rb2,
        commit_of(second.last().unwrap()),
        "after the second merge",
    );
    a.reopen();
    b.reopen();
    assert_identical(&a, &b, "after reopening both");
    assert_names_from_sequences(&a, &[ra.cutoff, ra2.cutoff]);
    assert_names_from_sequences(&b, &[ra.cutoff, ra2.cutoff]);
    let dir = common::sim_dir();
    drop(b.close());
    let fs = a.close();
    common::sim_files(&fs, &dir)
        .into_iter()
        .filter(|(name, _)| !name.ends_with(".tmp"))
        .collect()
}

fn plan(sync: SyncPolicy, reopen_every: Option<usize>, crash_after: &[usize]) -> Plan {
    Plan {
        sync,
        reopen_every,
        crash_after: crash_after.to_vec(),
        crash_after_merge: false,
    }
}

fn crashing_after_merges(plan: Plan) -> Plan {
    Plan {
        crash_after_merge: true,
        ..plan
    }
}

#[test]
fn always_reopening_every_7_matches_never_without_reopen() {
    scenario(
        1,
        plan(SyncPolicy::Always, Some(7), &[]),
        plan(SyncPolicy::Never, None, &[]),
    );
}

#[test]
fn every_ms_reopening_every_7_matches_never_reopening_every_13() {
    scenario(
        2,
        plan(SyncPolicy::EveryMs(5), Some(7), &[]),
        plan(SyncPolicy::Never, Some(13), &[]),
    );
}

#[test]
fn power_cut_and_reopen_mid_way_changes_no_file() {
    // B loses power (after sync) before, between and after the merges.
    scenario(
        3,
        plan(SyncPolicy::Always, Some(7), &[]),
        plan(SyncPolicy::Never, Some(13), &[30, 77, 150, 200]),
    );
    // B also loses power right after each merge, before any further write.
    scenario(
        4,
        plan(SyncPolicy::EveryMs(5), None, &[1, 2, 64]),
        crashing_after_merges(plan(SyncPolicy::Always, None, &[119, 121, 219])),
    );
}

/// Merge history does not show in the files: a replica that merged three
/// times along the way (a partial merge, then everything, each at an earlier
/// "now") ends up with the same merge output, byte for byte, as one that
/// merges once at the end with the same cut-off and "now". A replica that
/// installs a snapshot therefore matches one that merged on its own.
#[test]
fn merge_history_does_not_change_the_merged_files() {
    let mut a = Replica::new("A", plan(SyncPolicy::Never, Some(13), &[]));
    let mut b = Replica::new("B", plan(SyncPolicy::Always, Some(7), &[50]));
    let (batches, _) = make_batches(7, 150, 1);
    let mut earlier = Vec::new();
    for (i, batch) in batches.iter().enumerate() {
        a.feed(batch);
        b.feed(batch);
        if i == 39 {
            // A partial merge: the first half of the sealed files.
            let sealed = a.engine().sealed_data_files();
            let half = sealed[..sealed.len() / 2].to_vec();
            let report = a.merge_files(&half, EXPIRY_BASE_MS + 100);
            assert!(a.engine().sealed_data_files().len() > report.outputs.len());
            earlier.push(report.cutoff);
        }
        if i == 89 {
            earlier.push(a.merge(EXPIRY_BASE_MS + 200).cutoff);
        }
    }
    let (ra, rb) = (a.merge(FIRST_MERGE_NOW_MS), b.merge(FIRST_MERGE_NOW_MS));
    assert_eq!(ra.outputs, rb.outputs);
    assert!(ra.inputs != rb.inputs, "the histories should differ");
    assert_eq!(
        (ra.cutoff, ra.records_kept, ra.bytes_after),
        (rb.cutoff, rb.records_kept, rb.bytes_after)
    );
    assert_identical(&a, &b, "after merging with different histories");
    earlier.push(ra.cutoff);
    assert_names_from_sequences(&a, &earlier);
}

#[test]
fn names_and_bytes_do_not_depend_on_time_or_randomness() {
    let first = scenario(
        5,
        plan(SyncPolicy::Always, Some(7), &[]),
        plan(SyncPolicy::Never, Some(13), &[]),
    );
    std::thread::sleep(std::time::Duration::from_millis(20));
    let second = scenario(
        5,
        plan(SyncPolicy::EveryMs(5), Some(13), &[40]),
        plan(SyncPolicy::Never, None, &[]),
    );
    let names =
        |files: &[(String, Vec<u8>)]| files.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>();
    assert_eq!(
        names(&first),
        names(&second),
        "file names differ between two runs"
    );
    assert!(first == second, "file bytes differ between two runs");
    assert!(
        first.iter().any(|(n, _)| n.starts_with("merge-"))
            && first.iter().any(|(n, _)| n.starts_with("seg-"))
    );
    // A different stream gives different files: the comparison can fail.
    let other = scenario(
        6,
        plan(SyncPolicy::Never, None, &[]),
        plan(SyncPolicy::Never, None, &[]),
    );
    assert!(other != first, "different batches produced the same files");
}

/// Batches whose sequence numbers are skipped produce segments named after
/// the batch's first sequence, and merge outputs named after the cut-off,
/// not after any counter: the name set is exactly what the sequence says.
#[test]
fn file_names_follow_the_batch_sequence_numbers() {
    let fs = SimFs::new();
    let engine = common::open_sim(&fs, SyncPolicy::Never, 64);
    // Each batch is larger than 64 bytes, so each one fills a segment.
    for seq in [5u64, 40, 41_000, 1 << 40] {
        engine
            .write_batch(
                &Batch::new()
                    .put("k", vec![7u8; 50])
                    .meta(format!("{seq}"))
                    .seq(seq),
            )
            .unwrap();
    }
    let expected: Vec<String> = [5u64, 40, 41_000, 1 << 40]
        .iter()
        .map(|s| format!("seg-{s:020}.data"))
        .collect();
    assert_eq!(engine.sealed_data_files(), expected);
    let report = engine.merge(&engine.sealed_data_files(), 0).unwrap();
    assert_eq!(report.cutoff, (1 << 40) + 1);
    assert_eq!(
        report.outputs,
        vec![format!("merge-{:020}-0000.data", (1u64 << 40) + 1)]
    );
    engine.close().unwrap();
    let listed: Vec<String> = common::sim_files(&fs, &common::sim_dir())
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    let want = report.outputs[0].replace(".data", ".hint");
    assert_eq!(listed, vec![report.outputs[0].clone(), want]);
}
