//! The Prometheus metrics of one member (names in DESIGN §6, every metric
//! described in `METRICS.md`).
//!
//! [`Metrics`] is per node, not a process global: tests run several nodes
//! in one process, and each serves its own `/metrics`. It is cheap to clone
//! (one `Arc`). Counters and histograms are updated where things happen
//! (log fsync, proposal, request, snapshot chunk); the gauges of Raft and
//! engine state are filled at scrape time from a [`ScrapeView`] the admin
//! server gathers, so they never go stale and cost nothing between scrapes.
//! The exposition is the OpenMetrics text format (which Prometheus scrapes
//! natively), encoded by `prometheus-client`.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// Prefix of every metric name (DESIGN §6).
pub const METRIC_PREFIX: &str = "raftcask";

/// Content type of the `/metrics` answer: OpenMetrics text 1.0, which
/// `prometheus-client` writes and Prometheus scrapes.
pub const METRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Upper bound of the first log-fsync bucket, in seconds (50 µs: a fast
/// NVMe fdatasync).
pub const LOG_FSYNC_BUCKET_FIRST_SECONDS: f64 = 50e-6;
/// Log-fsync buckets, doubling from the first: the last finite bound is
/// 50 µs × 2^15 ≈ 1.6 s, past the 1 s a sick disk may take.
pub const LOG_FSYNC_BUCKETS: u16 = 16;

/// Upper bound of the first request bucket, in seconds (100 µs: a local
/// read).
pub const REQUEST_BUCKET_FIRST_SECONDS: f64 = 100e-6;
/// Request buckets, doubling from the first: the last finite bound is
/// 100 µs × 2^17 ≈ 13 s, past the 10 s write timeout.
pub const REQUEST_BUCKETS: u16 = 18;

/// Upper bound of the first proposal-size bucket, in ops (a lone request).
pub const PROPOSAL_BATCH_BUCKET_FIRST_OPS: f64 = 1.0;
/// Proposal-size buckets, doubling from 1 op: the last finite bound is
/// 2^16 = 65536 ops, above the most user ops one entry may carry.
pub const PROPOSAL_BATCH_BUCKETS: u16 = 17;

/// The reasons `raftcask_watch_cancellations` is labelled with.
pub const WATCH_CANCEL_REASONS: [&str; 5] =
    ["client", "compacted", "refused", "unavailable", "error"];

/// The `result` label values of `raftcask_forwarded_writes_total`.
pub const FORWARD_RESULTS: [&str; 4] = ["answered", "refused", "not_written", "unknown"];

/// The command families `raftcask_redis_commands` is labelled with
/// (label `family`; Redis's own groups, `unknown` for a command the front
/// end does not know).
pub const REDIS_COMMAND_FAMILIES: [&str; 7] = [
    "string",
    "generic",
    "hash",
    "transactions",
    "connection",
    "server",
    "unknown",
];

/// The client operations `raftcask_request_seconds` is labelled with
/// (label `op`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RequestOp {
    /// `Kv.Get`.
    Get,
    /// `Kv.Put`.
    Put,
    /// `Kv.Delete`.
    Delete,
    /// `Kv.Expire`.
    Expire,
    /// `Kv.Persist`.
    Persist,
    /// `Kv.Scan`.
    Scan,
    /// `Kv.Batch`.
    Batch,
    /// `Kv.Range`.
    Range,
    /// `Kv.DeleteRange`.
    DeleteRange,
    /// `Kv.Txn`.
    Txn,
    /// `Kv.LeaseGrant`.
    LeaseGrant,
    /// `Kv.LeaseRevoke`.
    LeaseRevoke,
}

impl RequestOp {
    /// Every op, in label order.
    pub const ALL: [RequestOp; 12] = [
        RequestOp::Get,
        RequestOp::Put,
        RequestOp::Delete,
        RequestOp::Expire,
        RequestOp::Persist,
        RequestOp::Scan,
        RequestOp::Batch,
        RequestOp::Range,
        RequestOp::DeleteRange,
        RequestOp::Txn,
        RequestOp::LeaseGrant,
        RequestOp::LeaseRevoke,
    ];

    /// The value of the `op` label.
    pub fn as_str(self) -> &'static str {
        match self {
            RequestOp::Get => "get",
            RequestOp::Put => "put",
            RequestOp::Delete => "delete",
            RequestOp::Expire => "expire",
            RequestOp::Persist => "persist",
            RequestOp::Scan => "scan",
            RequestOp::Batch => "batch",
            RequestOp::Range => "range",
            RequestOp::DeleteRange => "delete_range",
            RequestOp::Txn => "txn",
            RequestOp::LeaseGrant => "lease_grant",
            RequestOp::LeaseRevoke => "lease_revoke",
        }
    }
}

/// The state a scrape reports, gathered by the admin server just before
/// encoding.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ScrapeView {
    /// openraft's current term.
    pub term: u64,
    /// Whether this member is the leader it knows of.
    pub is_leader: bool,
    /// The leader this member knows of (0 = none).
    pub leader_id: u64,
    /// Index of the last entry in this member's log (0 = empty).
    pub last_log_index: u64,
    /// Index of the last applied entry (0 = none).
    pub applied_index: u64,
    /// The commit index this member knows (`None` if the Raft core did not
    /// answer in time; the gauge is then left out of the scrape's update).
    pub commit_index: Option<u64>,
    /// Engine stats (`None` if they could not be read).
    pub engine: Option<EngineView>,
    /// The change history's window (`None` if its lock was busy).
    pub history: Option<HistoryView>,
    /// The leases of the applied state.
    pub leases: LeaseView,
}

/// The lease part of a [`ScrapeView`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LeaseView {
    /// Leases that exist.
    pub leases: u64,
    /// Keys attached to them.
    pub keys: u64,
    /// Leases this process's state machine revoked by expiry so far.
    pub expired: u64,
    /// Leases it revoked at a client's request so far.
    pub revoked: u64,
}

/// The change history part of a [`ScrapeView`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HistoryView {
    /// The compact revision: the oldest revision reads and watches serve.
    pub compact_revision: u64,
    /// The store revision the history holds.
    pub revision: u64,
    /// Records the history's index names within the window.
    pub records: u64,
    /// Bytes of the records the history names (bases included).
    pub bytes: u64,
}

/// The engine part of a [`ScrapeView`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EngineView {
    /// Keys in the key directory (reserved session keys and expired but not
    /// yet merged keys included).
    pub keys: u64,
    /// Bytes of live records over all data files.
    pub live_bytes: u64,
    /// Bytes of dead records over all data files.
    pub dead_bytes: u64,
}

/// The metrics of one member; cheap to clone.
#[derive(Clone)]
pub struct Metrics {
    inner: Arc<Inner>,
}

impl fmt::Debug for Metrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Metrics")
            .field("member_id", &self.inner.member_id)
            .finish_non_exhaustive()
    }
}

/// The label set of `raftcask_request_seconds`: `op`.
type OpLabel = [(&'static str, &'static str); 1];

struct Inner {
    member_id: u64,
    registry: Registry,
    /// Held across "fill the gauges, encode" so concurrent scrapes each see
    /// one consistent view.
    scrape: Mutex<()>,
    raft_term: Gauge,
    raft_is_leader: Gauge,
    raft_leader_id: Gauge,
    raft_last_log_index: Gauge,
    raft_applied_index: Gauge,
    raft_commit_index: Gauge,
    engine_keys: Gauge,
    engine_live_bytes: Gauge,
    engine_dead_bytes: Gauge,
    snapshot_bytes_sent: Counter,
    snapshot_bytes_received: Counter,
    snapshot_files_skipped: Counter,
    snapshot_files_refetched: Counter,
    log_fsync_seconds: Histogram,
    proposal_batch_ops: Histogram,
    /// One histogram per [`RequestOp`] (in [`RequestOp::ALL`] order), all
    /// members of the registered family.
    request_seconds: Vec<Histogram>,
    history_compact_revision: Gauge,
    history_revision: Gauge,
    history_records: Gauge,
    history_bytes: Gauge,
    watchers: Gauge,
    watchers_catching_up: Gauge,
    watch_events_sent: Counter,
    watch_cancellations: Family<ReasonLabel, Counter>,
    leases: Gauge,
    lease_keys: Gauge,
    lease_keep_alives: Counter,
    lease_renewal_entries: Counter,
    lease_renewals: Counter,
    lease_expiries: Counter,
    lease_revokes: Counter,
    /// (expired, revoked) as the last scrape saw them: the counters above
    /// advance by the difference.
    lease_seen: Mutex<(u64, u64)>,
    redis_connections: Gauge,
    redis_connections_refused: Counter,
    redis_commands: Family<RedisLabel, Counter>,
    forwarded_writes: Family<ReasonLabel, Counter>,
    forward_retries: Counter,
}

/// The label set of `raftcask_redis_commands`: `family`, `result`.
type RedisLabel = [(&'static str, &'static str); 2];

/// One open Redis connection, counted in `raftcask_redis_connections`
/// until it drops.
#[derive(Debug)]
pub struct RedisConnection {
    connections: Gauge,
}

impl Drop for RedisConnection {
    fn drop(&mut self) {
        self.connections.dec();
    }
}

/// The label set of `raftcask_watch_cancellations`: `reason`.
type ReasonLabel = [(&'static str, &'static str); 1];

/// One watch, counted in `raftcask_watchers` (and, while it reads a
/// backlog, `raftcask_watchers_catching_up`) until it drops.
#[derive(Debug)]
pub struct Watcher {
    watchers: Gauge,
    catching_up: Gauge,
    behind: bool,
}

impl Watcher {
    /// Whether the watch is reading a backlog (more than one page behind
    /// the store revision) rather than waiting for the next revision.
    pub fn set_behind(&mut self, behind: bool) {
        if behind != self.behind {
            self.behind = behind;
            if behind {
                self.catching_up.inc();
            } else {
                self.catching_up.dec();
            }
        }
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.set_behind(false);
        self.watchers.dec();
    }
}

/// A gauge value from an unsigned count (saturating: gauges are `i64`).
fn gauge_value(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

impl Metrics {
    /// The metrics of member `member_id` (the id is exported as
    /// `raftcask_member_id`).
    pub fn new(member_id: u64) -> Metrics {
        let mut registry = Registry::with_prefix(METRIC_PREFIX);
        let member = Gauge::<i64>::default();
        member.set(gauge_value(member_id));
        registry.register("member_id", "This member's id", member);

        let gauge = |registry: &mut Registry, name: &str, help: &str| {
            let gauge = Gauge::<i64>::default();
            registry.register(name, help, gauge.clone());
            gauge
        };
        let counter = |registry: &mut Registry, name: &str, help: &str| {
            let counter = Counter::<u64>::default();
            // The encoder appends `_total` to counter names.
            registry.register(name, help, counter.clone());
            counter
        };
        let raft_term = gauge(&mut registry, "raft_term", "Current Raft term");
        let raft_is_leader = gauge(
            &mut registry,
            "raft_is_leader",
            "1 if this member is the leader, else 0",
        );
        let raft_leader_id = gauge(
            &mut registry,
            "raft_leader_id",
            "The leader this member knows of (0 = none)",
        );
        let raft_last_log_index = gauge(
            &mut registry,
            "raft_last_log_index",
            "Index of the last entry in this member's Raft log",
        );
        let raft_applied_index = gauge(
            &mut registry,
            "raft_applied_index",
            "Index of the last entry applied to the state machine",
        );
        let raft_commit_index = gauge(
            &mut registry,
            "raft_commit_index",
            "The commit index this member knows",
        );
        let engine_keys = gauge(
            &mut registry,
            "engine_keys",
            "Keys in the engine's key directory (session keys included)",
        );
        let engine_live_bytes = gauge(
            &mut registry,
            "engine_live_bytes",
            "Bytes of live records in the engine's data files",
        );
        let engine_dead_bytes = gauge(
            &mut registry,
            "engine_dead_bytes",
            "Bytes of dead records in the engine's data files (reclaimed by merge)",
        );
        let snapshot_bytes_sent = counter(
            &mut registry,
            "snapshot_bytes_sent",
            "Snapshot file bytes sent to followers",
        );
        let snapshot_bytes_received = counter(
            &mut registry,
            "snapshot_bytes_received",
            "Snapshot file bytes received from a leader",
        );
        let snapshot_files_skipped = counter(
            &mut registry,
            "snapshot_files_skipped",
            "Snapshot files a receiver already held and did not transfer",
        );
        let snapshot_files_refetched = counter(
            &mut registry,
            "snapshot_files_refetched",
            "Snapshot files a receiver asked for again because a chunk or the assembled file did not match its crc32",
        );
        let log_fsync_seconds = Histogram::new(exponential_buckets(
            LOG_FSYNC_BUCKET_FIRST_SECONDS,
            2.0,
            LOG_FSYNC_BUCKETS,
        ));
        registry.register(
            "log_fsync_seconds",
            "Duration of each Raft log fsync covering appended entries",
            log_fsync_seconds.clone(),
        );
        let proposal_batch_ops = Histogram::new(exponential_buckets(
            PROPOSAL_BATCH_BUCKET_FIRST_OPS,
            2.0,
            PROPOSAL_BATCH_BUCKETS,
        ));
        registry.register(
            "proposal_batch_ops",
            "User ops in each Raft entry the proposal batcher proposes",
            proposal_batch_ops.clone(),
        );
        let family = Family::<OpLabel, Histogram, fn() -> Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(
                REQUEST_BUCKET_FIRST_SECONDS,
                2.0,
                REQUEST_BUCKETS,
            ))
        });
        // Created up front so every op is exported (count 0) from the start.
        let request_seconds = RequestOp::ALL
            .iter()
            .map(|op| family.get_or_create_owned(&[("op", op.as_str())]))
            .collect();
        registry.register(
            "request_seconds",
            "Duration of each client request, by operation, errors included",
            family,
        );
        let history_compact_revision = gauge(
            &mut registry,
            "history_compact_revision",
            "The change history's compact revision: the oldest revision past reads and watches are served from",
        );
        let history_revision = gauge(
            &mut registry,
            "history_revision",
            "The store revision the change history holds",
        );
        let history_records = gauge(
            &mut registry,
            "history_records",
            "Records the change history names within its window",
        );
        let history_bytes = gauge(
            &mut registry,
            "history_bytes",
            "Bytes of the records the change history names (bases included)",
        );
        let watchers = gauge(&mut registry, "watchers", "Watches open on this member");
        let watchers_catching_up = gauge(
            &mut registry,
            "watchers_catching_up",
            "Watches reading a backlog from the change history (behind the store revision by more than a page)",
        );
        let watch_events_sent = counter(
            &mut registry,
            "watch_events_sent",
            "Events this member sent to watchers",
        );
        let watch_cancellations = Family::<ReasonLabel, Counter>::default();
        for reason in WATCH_CANCEL_REASONS {
            drop(watch_cancellations.get_or_create(&[("reason", reason)]));
        }
        registry.register(
            "watch_cancellations",
            "Watches ended by this member, by reason: client (cancelled by the client), compacted (fell below the compact revision), refused (a create over a limit or malformed), unavailable (no current revision for a watch from now), error",
            watch_cancellations.clone(),
        );
        let leases = gauge(&mut registry, "leases", "Leases in the applied state");
        let lease_keys = gauge(
            &mut registry,
            "lease_keys",
            "Keys attached to leases in the applied state",
        );
        let lease_keep_alives = counter(
            &mut registry,
            "lease_keep_alives",
            "Keep-alive requests this member received (as leader)",
        );
        let lease_renewal_entries = counter(
            &mut registry,
            "lease_renewal_entries",
            "Renewal writes this member proposed, each carrying every keep-alive gathered since the previous one",
        );
        let lease_renewals = counter(
            &mut registry,
            "lease_renewals",
            "Leases renewed by this member's renewal writes",
        );
        let lease_expiries = counter(
            &mut registry,
            "lease_expiries",
            "Leases this member's state machine revoked because they expired",
        );
        let lease_revokes = counter(
            &mut registry,
            "lease_revokes",
            "Leases this member's state machine revoked at a client's request",
        );
        let redis_connections = gauge(
            &mut registry,
            "redis_connections",
            "Connections open on this member's Redis port",
        );
        let redis_connections_refused = counter(
            &mut registry,
            "redis_connections_refused",
            "Connections to the Redis port closed at once because REDIS_CONNECTIONS_MAX were open",
        );
        let redis_commands = Family::<RedisLabel, Counter>::default();
        for family in REDIS_COMMAND_FAMILIES {
            for result in ["ok", "error"] {
                drop(redis_commands.get_or_create(&[("family", family), ("result", result)]));
            }
        }
        registry.register(
            "redis_commands",
            "Commands the Redis port answered, by command family (Redis's groups; unknown for a command it does not know) and result (error: an error reply)",
            redis_commands.clone(),
        );
        let forwarded_writes = Family::<ReasonLabel, Counter>::default();
        for result in FORWARD_RESULTS {
            drop(forwarded_writes.get_or_create(&[("result", result)]));
        }
        registry.register(
            "forwarded_writes",
            "Front-end writes this member took without leading and sent to the leader, by result (answered, refused by the leader, not_written: no leader reached in time, unknown: the outcome)",
            forwarded_writes.clone(),
        );
        let forward_retries = counter(
            &mut registry,
            "forward_retries",
            "Attempts of forwarded writes that were tried again (no leader known, not the leader, or no answer)",
        );
        Metrics {
            inner: Arc::new(Inner {
                forwarded_writes,
                forward_retries,
                redis_connections,
                redis_connections_refused,
                redis_commands,
                leases,
                lease_keys,
                lease_keep_alives,
                lease_renewal_entries,
                lease_renewals,
                lease_expiries,
                lease_revokes,
                lease_seen: Mutex::new((0, 0)),
                history_compact_revision,
                history_revision,
                history_records,
                history_bytes,
                watchers,
                watchers_catching_up,
                watch_events_sent,
                watch_cancellations,
                member_id,
                registry,
                scrape: Mutex::new(()),
                raft_term,
                raft_is_leader,
                raft_leader_id,
                raft_last_log_index,
                raft_applied_index,
                raft_commit_index,
                engine_keys,
                engine_live_bytes,
                engine_dead_bytes,
                snapshot_bytes_sent,
                snapshot_bytes_received,
                snapshot_files_skipped,
                snapshot_files_refetched,
                log_fsync_seconds,
                proposal_batch_ops,
                request_seconds,
            }),
        }
    }

    /// Counts one watch until the guard drops.
    pub fn watcher(&self) -> Watcher {
        self.inner.watchers.inc();
        Watcher {
            watchers: self.inner.watchers.clone(),
            catching_up: self.inner.watchers_catching_up.clone(),
            behind: false,
        }
    }

    /// Counts events sent to watchers.
    pub fn watch_events_sent(&self, events: u64) {
        self.inner.watch_events_sent.inc_by(events);
    }

    /// Counts a watch this member ended, by reason (one of
    /// [`WATCH_CANCEL_REASONS`]).
    pub fn watch_cancelled(&self, reason: &'static str) {
        self.inner
            .watch_cancellations
            .get_or_create(&[("reason", reason)])
            .inc();
    }

    /// Counts one open Redis connection until the guard drops.
    pub fn redis_connection(&self) -> RedisConnection {
        self.inner.redis_connections.inc();
        RedisConnection {
            connections: self.inner.redis_connections.clone(),
        }
    }

    /// Counts one Redis connection refused over the cap.
    pub fn redis_connection_refused(&self) {
        self.inner.redis_connections_refused.inc();
    }

    /// Counts one answered Redis command of `family` (one of
    /// [`REDIS_COMMAND_FAMILIES`]).
    pub fn redis_command(&self, family: &'static str, error: bool) {
        let result = if error { "error" } else { "ok" };
        self.inner
            .redis_commands
            .get_or_create(&[("family", family), ("result", result)])
            .inc();
    }

    /// Counts one forwarded write by its result (one of
    /// [`FORWARD_RESULTS`]).
    pub fn forwarded_write(&self, result: &'static str) {
        self.inner
            .forwarded_writes
            .get_or_create(&[("result", result)])
            .inc();
    }

    /// Counts one forwarded write's attempt that is tried again.
    pub fn forward_retry(&self) {
        self.inner.forward_retries.inc();
    }

    /// Attempts of forwarded writes tried again so far.
    pub fn forward_retries(&self) -> u64 {
        self.inner.forward_retries.get()
    }

    /// Counts one keep-alive request.
    pub fn lease_keep_alive(&self) {
        self.inner.lease_keep_alives.inc();
    }

    /// Counts one renewal write of `leases` leases.
    pub fn lease_renewal_entry(&self, leases: u64) {
        self.inner.lease_renewal_entries.inc();
        self.inner.lease_renewals.inc_by(leases);
    }

    /// The member these metrics belong to.
    pub fn member_id(&self) -> u64 {
        self.inner.member_id
    }

    /// Records one Raft log fsync.
    pub fn observe_log_fsync(&self, took: Duration) {
        self.inner.log_fsync_seconds.observe(took.as_secs_f64());
    }

    /// Records one proposed entry of `ops` user ops.
    pub fn observe_proposal(&self, ops: usize) {
        self.inner.proposal_batch_ops.observe(ops as f64);
    }

    /// Starts timing one client request; the time is recorded when the
    /// returned guard drops (so errors and early returns count too).
    pub fn request_timer(&self, op: RequestOp) -> RequestTimer {
        let index = RequestOp::ALL.iter().position(|o| *o == op).unwrap_or(0);
        RequestTimer {
            histogram: self.inner.request_seconds[index].clone(),
            started: Instant::now(),
        }
    }

    /// Counts snapshot bytes sent to a follower.
    pub fn add_snapshot_bytes_sent(&self, bytes: u64) {
        self.inner.snapshot_bytes_sent.inc_by(bytes);
    }

    /// Counts snapshot bytes received from a leader.
    pub fn add_snapshot_bytes_received(&self, bytes: u64) {
        self.inner.snapshot_bytes_received.inc_by(bytes);
    }

    /// Counts snapshot files a receiver already held (not transferred).
    pub fn add_snapshot_files_skipped(&self, files: u64) {
        self.inner.snapshot_files_skipped.inc_by(files);
    }

    /// Counts snapshot files a receiver asked for again (a bad chunk or a
    /// mismatching assembled file).
    pub fn add_snapshot_files_refetched(&self, files: u64) {
        self.inner.snapshot_files_refetched.inc_by(files);
    }

    /// Snapshot files asked for again so far.
    pub fn snapshot_files_refetched(&self) -> u64 {
        self.inner.snapshot_files_refetched.get()
    }

    /// Snapshot bytes sent so far.
    pub fn snapshot_bytes_sent(&self) -> u64 {
        self.inner.snapshot_bytes_sent.get()
    }

    /// Snapshot bytes received so far.
    pub fn snapshot_bytes_received(&self) -> u64 {
        self.inner.snapshot_bytes_received.get()
    }

    /// Snapshot files skipped (already held) so far.
    pub fn snapshot_files_skipped(&self) -> u64 {
        self.inner.snapshot_files_skipped.get()
    }

    /// The log-fsync hook for the log store.
    pub fn log_fsync_observer(&self) -> crate::log_store::FsyncObserver {
        let metrics = self.clone();
        Arc::new(move |took| metrics.observe_log_fsync(took))
    }

    /// The per-proposal hook for the batcher.
    pub fn proposal_observer(&self) -> crate::raft::batcher::ProposalObserver {
        let metrics = self.clone();
        Arc::new(move |ops| metrics.observe_proposal(ops))
    }

    /// Fills the gauges from `view` and encodes every metric (OpenMetrics
    /// text, ending `# EOF`).
    pub fn encode(&self, view: &ScrapeView) -> String {
        let inner = &*self.inner;
        let _scrape = inner.scrape.lock().unwrap_or_else(|p| p.into_inner());
        inner.raft_term.set(gauge_value(view.term));
        inner.raft_is_leader.set(i64::from(view.is_leader));
        inner.raft_leader_id.set(gauge_value(view.leader_id));
        inner
            .raft_last_log_index
            .set(gauge_value(view.last_log_index));
        inner
            .raft_applied_index
            .set(gauge_value(view.applied_index));
        if let Some(commit_index) = view.commit_index {
            inner.raft_commit_index.set(gauge_value(commit_index));
        }
        if let Some(history) = view.history {
            inner
                .history_compact_revision
                .set(gauge_value(history.compact_revision));
            inner.history_revision.set(gauge_value(history.revision));
            inner.history_records.set(gauge_value(history.records));
            inner.history_bytes.set(gauge_value(history.bytes));
        }
        inner.leases.set(gauge_value(view.leases.leases));
        inner.lease_keys.set(gauge_value(view.leases.keys));
        {
            let mut seen = inner.lease_seen.lock().unwrap_or_else(|p| p.into_inner());
            inner
                .lease_expiries
                .inc_by(view.leases.expired.saturating_sub(seen.0));
            inner
                .lease_revokes
                .inc_by(view.leases.revoked.saturating_sub(seen.1));
            *seen = (
                seen.0.max(view.leases.expired),
                seen.1.max(view.leases.revoked),
            );
        }
        if let Some(engine) = view.engine {
            inner.engine_keys.set(gauge_value(engine.keys));
            inner.engine_live_bytes.set(gauge_value(engine.live_bytes));
            inner.engine_dead_bytes.set(gauge_value(engine.dead_bytes));
        }
        let mut text = String::new();
        // Writing into a String cannot fail; the encoder's error type is
        // fmt::Error only because it is generic over writers.
        if let Err(err) = encode(&mut text, &inner.registry) {
            tracing::error!(error = %err, "encoding metrics");
        }
        text
    }
}

/// Times one client request; records on drop.
#[derive(Debug)]
#[must_use = "the request is timed until the guard drops"]
pub struct RequestTimer {
    histogram: Histogram,
    started: Instant,
}

impl Drop for RequestTimer {
    fn drop(&mut self) {
        self.histogram.observe(self.started.elapsed().as_secs_f64());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value_of(text: &str, series: &str) -> Option<f64> {
        text.lines()
            .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
            .and_then(|v| v.parse().ok())
    }

    #[test]
    fn encodes_the_design_names_with_scrape_values() {
        let metrics = Metrics::new(3);
        metrics.observe_log_fsync(Duration::from_micros(120));
        metrics.observe_proposal(5);
        drop(metrics.request_timer(RequestOp::Put));
        drop(metrics.request_timer(RequestOp::Put));
        metrics.add_snapshot_bytes_sent(10);
        drop(metrics.watcher());
        let mut watcher = metrics.watcher();
        watcher.set_behind(true);
        metrics.watch_events_sent(3);
        metrics.watch_cancelled("compacted");
        metrics.lease_keep_alive();
        metrics.lease_renewal_entry(7);
        let text = metrics.encode(&ScrapeView {
            term: 4,
            is_leader: true,
            leader_id: 3,
            last_log_index: 9,
            applied_index: 8,
            commit_index: Some(8),
            engine: Some(EngineView {
                keys: 2,
                live_bytes: 100,
                dead_bytes: 7,
            }),
            history: Some(HistoryView {
                compact_revision: 5,
                revision: 11,
                records: 6,
                bytes: 300,
            }),
            leases: LeaseView {
                leases: 4,
                keys: 9,
                expired: 2,
                revoked: 1,
            },
        });
        let expect = [
            ("raftcask_member_id", 3.0),
            ("raftcask_raft_term", 4.0),
            ("raftcask_raft_is_leader", 1.0),
            ("raftcask_raft_leader_id", 3.0),
            ("raftcask_raft_last_log_index", 9.0),
            ("raftcask_raft_applied_index", 8.0),
            ("raftcask_raft_commit_index", 8.0),
            ("raftcask_engine_keys", 2.0),
            ("raftcask_engine_live_bytes", 100.0),
            ("raftcask_engine_dead_bytes", 7.0),
            ("raftcask_snapshot_bytes_sent_total", 10.0),
            ("raftcask_snapshot_bytes_received_total", 0.0),
            ("raftcask_snapshot_files_skipped_total", 0.0),
            ("raftcask_log_fsync_seconds_count", 1.0),
            ("raftcask_proposal_batch_ops_count", 1.0),
            ("raftcask_proposal_batch_ops_sum", 5.0),
            ("raftcask_request_seconds_count{op=\"put\"}", 2.0),
            ("raftcask_request_seconds_count{op=\"get\"}", 0.0),
            ("raftcask_history_compact_revision", 5.0),
            ("raftcask_history_revision", 11.0),
            ("raftcask_history_records", 6.0),
            ("raftcask_history_bytes", 300.0),
            ("raftcask_leases", 4.0),
            ("raftcask_lease_keys", 9.0),
            ("raftcask_lease_expiries_total", 2.0),
            ("raftcask_lease_revokes_total", 1.0),
            ("raftcask_lease_renewal_entries_total", 1.0),
            ("raftcask_lease_renewals_total", 7.0),
            ("raftcask_lease_keep_alives_total", 1.0),
            ("raftcask_watchers", 1.0),
            ("raftcask_watchers_catching_up", 1.0),
            ("raftcask_watch_events_sent_total", 3.0),
            (
                "raftcask_watch_cancellations_total{reason=\"compacted\"}",
                1.0,
            ),
            ("raftcask_watch_cancellations_total{reason=\"client\"}", 0.0),
        ];
        for (series, value) in expect {
            assert_eq!(value_of(&text, series), Some(value), "{series} in\n{text}");
        }
        assert!(text.ends_with("# EOF\n"));
    }

    #[test]
    fn members_do_not_share_metrics() {
        let one = Metrics::new(1);
        let two = Metrics::new(2);
        one.observe_proposal(1);
        let text = two.encode(&ScrapeView::default());
        assert_eq!(
            value_of(&text, "raftcask_proposal_batch_ops_count"),
            Some(0.0)
        );
    }
}
