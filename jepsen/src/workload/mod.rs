//! Workloads and the history they record.
//!
//! A run's history is a JSON-lines file of [`Record`]s: one [`Op`] per
//! client operation (its invoke and completion times, wall and monotonic,
//! and its outcome) and one [`NemesisEvent`] per fault start or stop. An
//! operation whose fate is unknown (a write that may or may not have
//! applied) is `info`; its process never issues another operation (the
//! worker continues as a new process), as in Jepsen.
//!
//! Workloads ([`register`], [`set`], [`ttl`], [`exactly_once`], [`watch`],
//! [`lease`], [`redis_register`], [`etcd_register`]) run a bounded number
//! of concurrent workers, each one kvclient session (`redis_register`: one
//! connection to a member's Redis port; `etcd_register`: one gRPC channel
//! to a member's etcd port), paced to a total rate sized for two cores,
//! until a deadline.
//!
//! This record type is the harness's own until it is mapped onto the
//! checker's history type.

pub mod etcd_register;
pub mod exactly_once;
pub mod lease;
pub mod redis_register;
pub mod register;
pub mod set;
pub mod ttl;
pub mod watch;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs::File;
use std::io::{BufWriter, Write as _};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context as _;
use serde::{Deserialize, Serialize};

/// What an operation does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Function {
    /// A linearizable read of one key.
    Read,
    /// An unconditional write of a unique value.
    Write,
    /// A write of a unique value if the key has `expected_version`.
    Cas,
    /// A set workload's add of one unique element (a key of its own).
    Add,
    /// The set workload's final read of every element.
    ReadAll,
    /// A delete of one key (the watch workload).
    Delete,
    /// A watch stream opened (ok: created, from `watch.start_revision`)
    /// or not (fail).
    WatchOpen,
    /// What one watch stream delivered: ok = one batch of events (or a
    /// progress notification), fail = the stream ended with this error.
    Watch,
    /// A lease granted (the lease workload; [`LeaseRecord`]).
    LeaseGrant,
    /// One keep-alive of a lease (ok: answered, `LeaseRecord::ttl_ms` 0 =
    /// the lease is gone).
    LeaseKeepAlive,
    /// A lease revoked.
    LeaseRevoke,
    /// A linearizable range read of every key under `key` (a prefix) at
    /// one revision: `LeaseRecord::present` lists the keys found.
    LeaseRead,
}

impl Function {
    /// Whether the operation writes.
    pub fn is_write(self) -> bool {
        matches!(
            self,
            Self::Write
                | Self::Cas
                | Self::Add
                | Self::Delete
                | Self::LeaseGrant
                | Self::LeaseKeepAlive
                | Self::LeaseRevoke
        )
    }

    /// Whether it is a watcher's record (neither a read nor a write: the
    /// run's minimums do not count it).
    pub fn is_watch(self) -> bool {
        matches!(self, Self::WatchOpen | Self::Watch)
    }
}

/// How an operation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Outcome {
    /// It took effect (or, for a read, returned this).
    Ok,
    /// It definitely did not take effect.
    Fail,
    /// Unknown: a write that may take effect, now or later.
    Info,
}

/// One client operation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Op {
    /// Unique in the run, in invoke order.
    pub id: u64,
    /// The logical process: sequential; retired after an `info`.
    pub process: u64,
    /// What it does.
    pub f: Function,
    /// The key (for `read-all`: the prefix).
    pub key: String,
    /// Written value (write, cas, add), or the value read (`None` = absent).
    pub value: Option<String>,
    /// The version a `cas` required (0 = absent), in histories before
    /// revisions.
    pub expected_version: Option<u64>,
    /// The `mod_revision` a `cas` required (0 = absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected_mod_revision: Option<u64>,
    /// Elements a `read-all` returned.
    pub values: Option<Vec<String>>,
    /// How it ended.
    pub outcome: Outcome,
    /// Version written or read (0 = the key was absent).
    pub version: Option<u64>,
    /// Applied index the answer carried.
    pub index: Option<u64>,
    /// The store revision the answer reflects: an ok read's header
    /// revision, an ok write's applied revision (see
    /// [`Op::record_read_revisions`], [`Op::record_write_revision`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<u64>,
    /// The key's `mod_revision` an ok read returned (absent key: none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mod_revision: Option<u64>,
    /// The client's error, for fail / info.
    pub error: Option<String>,
    /// Invoke time, microseconds since the Unix epoch.
    pub invoke_wall_us: u64,
    /// Invoke time, nanoseconds since the run started (monotonic).
    pub invoke_ns: u64,
    /// Completion time, microseconds since the Unix epoch.
    pub complete_wall_us: u64,
    /// Completion time, nanoseconds since the run started (monotonic).
    pub complete_ns: u64,
    /// A write's time to live in ms (the `ttl` workload); absent = none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_ms: Option<u64>,
    /// A stale read's `min_index` (absent = a linearizable read).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stale_min_index: Option<u64>,
    /// The member a read was sent to, when pinned to one (the
    /// `redis-register` and `etcd-register` workloads: every operation's
    /// member).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub member: Option<u64>,
    /// Versions a `read-all` returned, one per element in `values` (the
    /// exactly-once workload's final read).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub versions: Option<Vec<u64>>,
    /// A final read done after the schedule ended and every fault was
    /// healed: it does not count towards the run's minimum work.
    #[serde(default, skip_serializing_if = "is_false")]
    pub final_read: bool,
    /// An ok delete's answer: whether it removed a live key (false: the
    /// key was already absent, no revision was taken).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub found: Option<bool>,
    /// A watcher's record (`watch-open`, `watch`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub watch: Option<WatchRecord>,
    /// The lease workload's record (its grants, keep-alives, revokes,
    /// attaching writes and range reads).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease: Option<LeaseRecord>,
    /// The value a `cas` compared with, by value (the `redis-register`
    /// workload: WATCH, GET, MULTI / SET / EXEC; `etcd-register`: a Txn
    /// comparing the value); absent for a cas by revision.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected: Option<String>,
}

/// What a lease workload operation recorded.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseRecord {
    /// The workload's number of the lease: its keys are
    /// `l/<number>/<k>` ([`lease::key_name`]). 0 for a read of several
    /// leases (the final read).
    pub lease: u64,
    /// The server's id of the lease (0 = not known: a grant that failed
    /// or whose outcome is unknown, a read).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub id: u64,
    /// `lease-grant`: the TTL granted in ms (the op's `ttl_ms` is the one
    /// asked for). `lease-keep-alive`: the TTL answered in ms, 0 = there
    /// is no such lease any more.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_ms: Option<u64>,
    /// An acknowledged `lease-keep-alive`: when the request the answer
    /// belongs to was sent (ns since the run started; kvclient's
    /// `LeaseRenewal::sent`, taken before the request left the process:
    /// a retried keep-alive's last attempt, at or after the invoke).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sent_ns: Option<u64>,
    /// `lease-revoke`: the keys deleted with the lease.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deleted: Option<u64>,
    /// `lease-read`: every key found under the prefix, with its value
    /// (one revision: the op's `revision`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub present: Option<BTreeMap<String, String>>,
}

fn is_zero(value: &u64) -> bool {
    *value == 0
}

/// Put or delete, as a watch event says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum EventKind {
    /// The key was written.
    Put,
    /// The key was deleted (by a request or by its TTL).
    Delete,
}

/// One event a watcher received.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct WatchEventRecord {
    /// The event's revision (the key's `mod_revision` after the change).
    pub revision: u64,
    /// The key.
    pub key: String,
    /// Put or delete.
    pub kind: EventKind,
    /// A put's value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    /// A put's `create_revision`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub create_revision: Option<u64>,
    /// A put's `version` (changes since creation).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<u64>,
    /// The value before the change (`prev_kv`), when the key existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prev_value: Option<String>,
}

/// What a watcher recorded with one `watch-open` or `watch` operation.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WatchRecord {
    /// The watcher (one per member at the start).
    pub watcher: u64,
    /// The watcher's stream (0, 1, ...: a new one after a stream ended).
    pub stream: u64,
    /// `watch-open`: the first revision the stream covers (the asked
    /// start, or the created revision + 1 for a start at "now").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_revision: Option<u64>,
    /// After this record: the revision the stream would resume from
    /// (`WatchStream::next_revision`): every event below it was delivered.
    pub next_revision: u64,
    /// The events delivered, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub events: Vec<WatchEventRecord>,
}

impl Op {
    /// Records the revisions an ok read returned: the store revision of
    /// the response header, and the key's `mod_revision` (`None` or 0: the
    /// key is absent — no write ever has revision 0, the store starts at 1).
    /// The register workload calls it beside `version` / `index` once
    /// kvclient returns revisions.
    pub fn record_read_revisions(&mut self, header_revision: u64, mod_revision: Option<u64>) {
        self.revision = Some(header_revision);
        self.mod_revision = mod_revision.filter(|&revision| revision != 0);
    }

    /// Records the store revision an ok write (or cas) was applied at.
    pub fn record_write_revision(&mut self, revision: u64) {
        self.revision = Some(revision);
        self.mod_revision = None;
    }
}

fn is_false(value: &bool) -> bool {
    !*value
}

/// Whether a nemesis event starts or ends a fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Phase {
    /// The fault was injected.
    Start,
    /// The fault was healed.
    Stop,
}

/// A fault injected or healed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NemesisEvent {
    /// The fault's name (`partition-leader`, `kill`, ...).
    pub fault: String,
    /// Start or stop.
    pub phase: Phase,
    /// What exactly was done (which members, which links).
    pub detail: String,
    /// When (done), microseconds since the Unix epoch.
    pub wall_us: u64,
    /// When (done), nanoseconds since the run started (monotonic).
    pub time_ns: u64,
}

/// One line of `history.jsonl`.
// Nearly every record is an `Op` (nemesis events are a handful per run), so
// boxing the large variant would add an allocation per operation and save
// nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "kebab-case")]
pub enum Record {
    /// A client operation.
    Op(Op),
    /// A fault start or stop.
    Nemesis(NemesisEvent),
}

/// An operation in flight: [`History::invoke`] makes it,
/// [`History::complete`] records it.
#[derive(Debug)]
pub struct Pending {
    op: Op,
}

impl Pending {
    /// The operation's fields so far.
    pub fn op_mut(&mut self) -> &mut Op {
        &mut self.op
    }
}

/// The run's history: kept in memory and appended to `history.jsonl` as
/// records complete.
#[derive(Debug)]
pub struct History {
    started: Instant,
    next_op_id: AtomicU64,
    next_process: AtomicU64,
    inner: Mutex<HistoryInner>,
}

#[derive(Debug)]
struct HistoryInner {
    records: Vec<Record>,
    file: BufWriter<File>,
}

impl History {
    /// A new history written to `path`.
    pub fn create(path: &Path) -> anyhow::Result<Arc<Self>> {
        let file = File::create(path).with_context(|| format!("creating {}", path.display()))?;
        Ok(Arc::new(Self {
            started: Instant::now(),
            next_op_id: AtomicU64::new(0),
            next_process: AtomicU64::new(0),
            inner: Mutex::new(HistoryInner {
                records: Vec::new(),
                file: BufWriter::new(file),
            }),
        }))
    }

    /// Nanoseconds since the run started at `at` (0 before it).
    pub fn ns_at(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.started).as_nanos()).unwrap_or(u64::MAX)
    }

    /// A fresh logical process id.
    pub fn new_process(&self) -> u64 {
        self.next_process.fetch_add(1, Ordering::Relaxed)
    }

    /// Nanoseconds since the run started.
    pub fn now_ns(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// Starts an operation now.
    pub fn invoke(&self, process: u64, f: Function, key: impl Into<String>) -> Pending {
        Pending {
            op: Op {
                id: self.next_op_id.fetch_add(1, Ordering::Relaxed),
                process,
                f,
                key: key.into(),
                value: None,
                expected_version: None,
                values: None,
                outcome: Outcome::Info,
                version: None,
                index: None,
                revision: None,
                mod_revision: None,
                expected_mod_revision: None,
                error: None,
                invoke_wall_us: wall_us(),
                invoke_ns: self.now_ns(),
                complete_wall_us: 0,
                complete_ns: 0,
                ttl_ms: None,
                stale_min_index: None,
                member: None,
                versions: None,
                final_read: false,
                found: None,
                watch: None,
                lease: None,
                expected: None,
            },
        }
    }

    /// Completes an operation now with this outcome.
    pub fn complete(&self, mut pending: Pending, outcome: Outcome) -> anyhow::Result<Op> {
        pending.op.outcome = outcome;
        pending.op.complete_wall_us = wall_us();
        pending.op.complete_ns = self.now_ns();
        let op = pending.op;
        self.append(Record::Op(op.clone()))?;
        Ok(op)
    }

    /// Records a nemesis event now.
    pub fn nemesis(&self, fault: &str, phase: Phase, detail: String) -> anyhow::Result<()> {
        self.append(Record::Nemesis(NemesisEvent {
            fault: fault.to_string(),
            phase,
            detail,
            wall_us: wall_us(),
            time_ns: self.now_ns(),
        }))
    }

    /// Every record so far, in completion order.
    pub fn records(&self) -> Vec<Record> {
        self.inner
            .lock()
            .map(|inner| inner.records.clone())
            .unwrap_or_default()
    }

    /// Flushes the file.
    pub fn flush(&self) -> anyhow::Result<()> {
        let mut inner = self
            .inner
            .lock()
            .map_err(|_| anyhow::anyhow!("history lock poisoned"))?;
        inner.file.flush().context("flushing history.jsonl")
    }

    fn append(&self, record: Record) -> anyhow::Result<()> {
        let line = serde_json::to_string(&record)?;
        let mut inner = self
            .inner
            .lock()
            .map_err(|_| anyhow::anyhow!("history lock poisoned"))?;
        writeln!(inner.file, "{line}").context("writing history.jsonl")?;
        inner.records.push(record);
        Ok(())
    }
}

fn wall_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

/// Reads a `history.jsonl`.
pub fn read_history(path: &Path) -> anyhow::Result<Vec<Record>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    text.lines()
        .enumerate()
        .filter(|(_, line)| !line.trim().is_empty())
        .map(|(n, line)| {
            serde_json::from_str(line).with_context(|| format!("{} line {}", path.display(), n + 1))
        })
        .collect()
}

/// Structural problems of a history: duplicate op ids, a completion before
/// its invoke, overlapping operations of one process, an operation of a
/// process after its `info`, a fault stopped that was not started or
/// started twice, a fault left unhealed. Empty = well-formed.
pub fn check_well_formed(records: &[Record]) -> Vec<String> {
    let mut problems = Vec::new();
    let mut ids = BTreeSet::new();
    let mut by_process: BTreeMap<u64, Vec<&Op>> = BTreeMap::new();
    let mut open_faults: HashMap<&str, u64> = HashMap::new();
    for record in records {
        match record {
            Record::Op(op) => {
                if !ids.insert(op.id) {
                    problems.push(format!("op id {} appears twice", op.id));
                }
                if op.complete_ns < op.invoke_ns || op.complete_wall_us < op.invoke_wall_us {
                    problems.push(format!("op {} completes before it was invoked", op.id));
                }
                by_process.entry(op.process).or_default().push(op);
            }
            Record::Nemesis(event) => {
                let open = open_faults.entry(event.fault.as_str()).or_default();
                match event.phase {
                    Phase::Start if *open > 0 => {
                        problems.push(format!("fault {} started twice", event.fault));
                    }
                    Phase::Start => *open += 1,
                    Phase::Stop if *open == 0 => {
                        problems.push(format!("fault {} stopped but not started", event.fault));
                    }
                    Phase::Stop => *open -= 1,
                }
            }
        }
    }
    for (fault, open) in open_faults {
        if open > 0 {
            problems.push(format!("fault {fault} never healed"));
        }
    }
    for (process, mut ops) in by_process {
        ops.sort_by_key(|op| op.invoke_ns);
        for pair in ops.windows(2) {
            let (a, b) = (pair[0], pair[1]);
            if b.invoke_ns < a.complete_ns {
                problems.push(format!(
                    "process {process}: op {} invoked before op {} completed",
                    b.id, a.id
                ));
            }
            if a.outcome == Outcome::Info {
                problems.push(format!(
                    "process {process}: op {} follows op {} whose outcome was unknown",
                    b.id, a.id
                ));
            }
        }
    }
    problems
}

/// Settings every workload shares.
#[derive(Debug, Clone)]
pub struct WorkloadConfig {
    /// Member client addresses.
    pub endpoints: Vec<String>,
    /// Member Redis (RESP) addresses, in the same slot order (the
    /// `redis-register` workload).
    pub redis_endpoints: Vec<String>,
    /// Member etcd v3 addresses, in the same slot order (the
    /// `etcd-register` workload).
    pub etcd_endpoints: Vec<String>,
    /// Concurrent workers.
    pub concurrency: usize,
    /// Total operations per second, all workers together (at most).
    pub rate_per_second: u32,
    /// When workers stop invoking new operations.
    pub deadline: tokio::time::Instant,
    /// Seed of the workers' random choices.
    pub seed: u64,
    /// The nemesis's switch that stops the workload's writes (the
    /// `restart-after-idle` fault's idle period).
    pub gate: Arc<WriteGate>,
    /// TTLs the `ttl` workload writes, lowest and highest.
    pub ttl_range: (Duration, Duration),
    /// The exactly-once workload's session idle window (kvnode's
    /// `--test-session-idle-ms`), when shortened: its slow-retry workers
    /// wait longer than this before retrying a write.
    pub session_idle: Option<Duration>,
}

/// The nemesis's switch over the workload's writes: while closed, workers
/// invoke no write (reads go on). The workload reports the latest instant
/// at which a TTL key it wrote (or may have written) can still be alive, and
/// whether a write is in flight, so the nemesis knows when no TTL key is
/// left.
#[derive(Debug, Default)]
pub struct WriteGate {
    closed: std::sync::atomic::AtomicBool,
    in_flight: AtomicU64,
    /// Monotonic instant (ns since the gate was made) by which every TTL
    /// key written so far has expired, by real time.
    ttl_horizon_ns: AtomicU64,
    origin: std::sync::OnceLock<Instant>,
}

impl WriteGate {
    /// A new, open gate.
    pub fn new() -> Arc<Self> {
        let gate = Self::default();
        let _ = gate.origin.set(Instant::now());
        Arc::new(gate)
    }

    fn now_ns(&self) -> u64 {
        let origin = self.origin.get_or_init(Instant::now);
        u64::try_from(origin.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// Stops (true) or resumes (false) the writes.
    pub fn set_closed(&self, closed: bool) {
        self.closed.store(closed, Ordering::SeqCst);
    }

    /// Whether writes are stopped.
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    /// Starts a write if the gate is open: the guard counts it in flight.
    pub fn begin_write(self: &Arc<Self>) -> Option<WriteGuard> {
        if self.is_closed() {
            return None;
        }
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        if self.is_closed() {
            self.in_flight.fetch_sub(1, Ordering::SeqCst);
            return None;
        }
        Some(WriteGuard { gate: self.clone() })
    }

    /// Writes in flight now.
    pub fn writes_in_flight(&self) -> u64 {
        self.in_flight.load(Ordering::SeqCst)
    }

    /// A TTL key written now (or possibly written: unknown outcomes too)
    /// with this TTL may live until `ttl` from now.
    pub fn note_ttl(&self, ttl: Duration) {
        let until = self
            .now_ns()
            .saturating_add(u64::try_from(ttl.as_nanos()).unwrap_or(u64::MAX));
        self.ttl_horizon_ns.fetch_max(until, Ordering::SeqCst);
    }

    /// How long until every TTL key noted so far has expired (by real
    /// time; zero when none is left).
    pub fn ttl_horizon_left(&self) -> Duration {
        let horizon = self.ttl_horizon_ns.load(Ordering::SeqCst);
        Duration::from_nanos(horizon.saturating_sub(self.now_ns()))
    }
}

/// One write in flight through an open [`WriteGate`].
#[derive(Debug)]
pub struct WriteGuard {
    gate: Arc<WriteGate>,
}

impl Drop for WriteGuard {
    fn drop(&mut self) {
        self.gate.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

impl WorkloadConfig {
    /// The pause each worker takes between two of its operations.
    pub fn worker_pause(&self) -> Duration {
        let per_worker = f64::from(self.rate_per_second.max(1)) / self.concurrency.max(1) as f64;
        Duration::from_secs_f64(1.0 / per_worker)
    }
}

/// Time one client call may take in total, retries included: short, so a
/// run ends soon after its deadline and unknown outcomes are recorded.
pub const OPERATION_TIMEOUT: Duration = Duration::from_secs(5);
/// Time one attempt (one RPC) may take.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);
/// Time to open a connection to one member (a partitioned or paused member
/// should not hold a worker long).
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// A client for one worker (its own session).
pub fn client(endpoints: &[String]) -> anyhow::Result<kvclient::Client> {
    client_builder(endpoints)
        .build()
        .context("building a kvclient")
}

/// [`client`]'s settings, for a caller that adds its own.
pub fn client_builder(endpoints: &[String]) -> kvclient::ClientBuilder {
    kvclient::Client::builder(endpoints.iter().cloned())
        .operation_timeout(OPERATION_TIMEOUT)
        .request_timeout(REQUEST_TIMEOUT)
        .connect_timeout(CONNECT_TIMEOUT)
}

/// Time a call to one pinned member may take in total (a stale read of
/// one member): a member that is down, cut off or not in the cluster
/// (the membership nemesis's spare) fails the read soon instead of
/// holding its worker for [`OPERATION_TIMEOUT`].
pub const MEMBER_OPERATION_TIMEOUT: Duration = Duration::from_secs(1);

/// A client of one member alone, for reads pinned to it.
pub fn member_client(endpoint: &str) -> anyhow::Result<kvclient::Client> {
    kvclient::Client::builder([endpoint.to_string()])
        .operation_timeout(MEMBER_OPERATION_TIMEOUT)
        .request_timeout(MEMBER_OPERATION_TIMEOUT)
        .connect_timeout(CONNECT_TIMEOUT)
        .build()
        .context("building a kvclient of one member")
}

/// Member `endpoint`'s own row of its status, if it answers within
/// [`MEMBER_OPERATION_TIMEOUT`].
pub async fn own_status(endpoint: &str) -> Option<kvclient::kvproto::cluster::v1::MemberStatus> {
    let client = member_client(endpoint).ok()?;
    let status = tokio::time::timeout(MEMBER_OPERATION_TIMEOUT, client.status())
        .await
        .ok()?
        .ok()?;
    status.members.into_iter().find(|m| m.is_self)
}

/// The outcome of a failed write: definitely not applied (`fail`) only when
/// the client says so; otherwise unknown (`info`).
pub fn write_error_outcome(err: &kvclient::Error) -> Outcome {
    use kvclient::Error;
    match err {
        Error::VersionMismatch { .. }
        | Error::Unavailable { .. }
        | Error::InvalidArgument { .. }
        | Error::InvalidConfig(_)
        | Error::KeyNotFound { .. }
        | Error::Unimplemented { .. } => Outcome::Fail,
        _ => Outcome::Info,
    }
}

/// A client builder whose retries wait `pause` ..= 2 × `pause` between attempts
/// (kvclient's backoff: half the current backoff plus jitter up to it),
/// within `operation_timeout`: the exactly-once workload's slow retries.
pub fn slow_retry_builder(
    endpoints: &[String],
    pause: Duration,
    operation_timeout: Duration,
) -> kvclient::ClientBuilder {
    client_builder(endpoints)
        .operation_timeout(operation_timeout)
        .backoff(pause * 2, pause * 2)
}
