//! The cluster load generator: concurrent clients issuing put / get / mixed
//! operations to a raftcask cluster over gRPC (the kvproto client), bounded
//! by an operation count and a duration, with latencies in a histogram,
//! errors counted by kind, and the mean number of operations per Raft entry.
//!
//! Used by the `cluster-load` binary and by `kvctl bench`, which also
//! watches a [`Progress`] while the run goes and plots the run's
//! [`LoadReport::timeline`] (latency over time).
//!
//! - Writes go to the leader: a client starts at an endpoint, follows a
//!   `NotLeader` detail (metadata `raftcask-error-bin`) to the leader's
//!   client address, and shares what it learned with the other clients.
//!   Any other failure moves the shared guess to the next endpoint.
//! - Reads go to client `i`'s endpoint `i mod n` ([`ReadTarget::Spread`]) or
//!   to the leader ([`ReadTarget::Leader`]).
//! - Latency of an operation is what its caller sees, redirects included.
//! - Ops per Raft entry: an acknowledged write's version is `log index ×
//!   65536 + position`, so the distinct `version >> 16` values are the
//!   entries that carried the run's writes; acknowledged writes divided by
//!   that count is the mean batching factor the proposal batcher achieved.
//! - [`System`]: the same loop drives etcd's v3 API instead (feature `etcd`,
//!   module `etcd`): same clients, connections (one tonic channel each,
//!   built the same way), keys, values, bounds and retry rules; only the
//!   two RPCs differ. etcd has no redirects (its members forward writes to
//!   the leader); the load generator finds etcd's leader once at the start
//!   so writes and leader reads take the same one hop as raftcask's.

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use kvproto::kv::v1::kv_client::KvClient;
use kvproto::kv::v1::{
    Consistency, ErrorDetail, GetRequest, PutRequest, error_detail, put_response,
};
use prost::Message as _;
use prost::bytes::Bytes;
use rand::rngs::SmallRng;
use rand::{Rng as _, RngCore as _, SeedableRng as _};
use tonic::transport::{Channel, Endpoint};

use crate::report::{Table, count};

#[cfg(feature = "etcd")]
mod etcd;

/// The system a run drives. Everything but the two RPCs (put, get) is the
/// same code for each.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum System {
    /// A raftcask cluster (kvproto's gRPC API).
    #[default]
    Raftcask,
    /// An etcd v3 cluster (`etcd-client` on the same tonic channels).
    /// Stale reads are etcd's serializable reads; a put acknowledges no
    /// Raft entry, so `ops/entry` stays empty.
    #[cfg(feature = "etcd")]
    Etcd,
}

impl System {
    /// Its lower-case name (table columns, plot legends).
    pub fn name(self) -> &'static str {
        match self {
            System::Raftcask => "raftcask",
            #[cfg(feature = "etcd")]
            System::Etcd => "etcd",
        }
    }
}

/// Most concurrent clients (tasks) in one run.
pub const CLIENTS_MAX: usize = 4096;
/// Most gRPC connections per endpoint (clients share them round-robin).
pub const CONNECTIONS_MAX: usize = 256;
/// Most operations in one run.
pub const OPS_MAX: u64 = 100_000_000;
/// Longest run.
pub const DURATION_MAX: Duration = Duration::from_secs(3600);
/// Largest key (the cluster's key limit, DESIGN §4).
pub const KEY_SIZE_BYTES_MAX: usize = 4 * 1024;
/// Largest value (the cluster's default value limit, DESIGN §4).
pub const VALUE_SIZE_BYTES_MAX: usize = 1024 * 1024;
/// Attempts of one write (or leader read) before it counts as failed
/// (redirects and retries after errors together). With the pauses below,
/// the retries of one operation span about 20 s: well past an election
/// after the leader stops or restarts. openraft 0.9 has no leader transfer,
/// and a restarted leader comes back as a follower that must win a new term
/// (its committed index is not durable), so for up to two election
/// timeouts (3 s each) the others may still name it while it names no one:
/// redirects go round in a circle, which is why a repeated redirect pauses
/// too ([`REDIRECT_PAUSE`]).
pub const ATTEMPTS_MAX: u32 = 40;
/// Pause before following a redirect that is not the operation's first:
/// members that point at each other during an election must not use up
/// the attempts in a few milliseconds.
pub const REDIRECT_PAUSE: Duration = Duration::from_millis(50);
/// First pause before retrying after an error other than a redirect;
/// doubled on each retry up to [`RETRY_PAUSE_MAX`].
pub const RETRY_PAUSE: Duration = Duration::from_millis(50);
/// Longest pause between two retries of one operation.
pub const RETRY_PAUSE_MAX: Duration = Duration::from_secs(1);
/// Deadline of one RPC and of one connection attempt.
pub const RPC_TIMEOUT: Duration = Duration::from_secs(10);
/// Latencies above this are recorded as this (histogram bound), in µs.
pub const LATENCY_US_MAX: u64 = 60_000_000;
/// Metadata key of the error detail (see `kvproto`).
pub const ERROR_DETAIL_KEY: &str = "raftcask-error-bin";
/// Size of the random buffer values are cut from.
const VALUE_POOL_SIZE_BYTES: usize = 4 * 1024 * 1024;
/// Most (time, latency) samples a run keeps for its timeline, over all
/// clients (8 bytes each). A client that fills its share keeps every other
/// sample and halves its sampling rate, so the timeline stays spread over
/// the whole run.
pub const TIMELINE_SAMPLES_MAX: usize = 1_000_000;

/// Operations finished so far, readable while a run goes (for a progress
/// bar). Pass one to [`run_observed`].
#[derive(Debug, Default)]
pub struct Progress {
    ok: AtomicU64,
    failed: AtomicU64,
}

impl Progress {
    /// Operations that succeeded so far.
    pub fn ok(&self) -> u64 {
        self.ok.load(Ordering::Relaxed)
    }

    /// Operations that failed so far.
    pub fn failed(&self) -> u64 {
        self.failed.load(Ordering::Relaxed)
    }

    /// Operations finished so far, either way.
    pub fn finished(&self) -> u64 {
        self.ok() + self.failed()
    }
}

/// One successful operation of the timeline: when it finished and how long
/// it took.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sample {
    /// When it finished, in ms since the run began.
    pub at_ms: u32,
    /// Its latency in µs (at most [`LATENCY_US_MAX`]).
    pub latency_us: u32,
}

/// A client's bounded share of the timeline (see [`TIMELINE_SAMPLES_MAX`]).
#[derive(Debug)]
struct Sampler {
    samples: Vec<Sample>,
    capacity: usize,
    /// Keep one operation in `stride`.
    stride: u64,
    seen: u64,
}

impl Sampler {
    fn new(capacity: usize) -> Sampler {
        Sampler {
            samples: Vec::new(),
            capacity: capacity.max(2),
            stride: 1,
            seen: 0,
        }
    }

    fn record(&mut self, sample: Sample) {
        self.seen += 1;
        if !self.seen.is_multiple_of(self.stride) {
            return;
        }
        self.samples.push(sample);
        if self.samples.len() >= self.capacity {
            // Kept: operations number 2, 4, 6, ... × stride, so the next one
            // kept (number len × 2 × stride + 2 × stride) continues the grid.
            let mut position = 0;
            self.samples.retain(|_| {
                position += 1;
                position % 2 == 0
            });
            self.stride = self.stride.saturating_mul(2);
        }
    }
}

/// What each operation is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpKind {
    /// Every operation a put.
    Put,
    /// Every operation a get.
    Get,
    /// Gets with this probability in percent (0..=100), puts otherwise.
    Mixed {
        /// Percent of operations that are gets.
        read_percent: u8,
    },
}

/// Where reads go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadTarget {
    /// Client `i` reads from endpoint `i mod n`.
    Spread,
    /// Every read goes to the (discovered) leader.
    Leader,
}

/// One run's settings. [`LoadConfig::validate`] checks every bound.
#[derive(Clone, Debug)]
pub struct LoadConfig {
    /// Client addresses of members (`host:port`, or an `http://` URL).
    pub endpoints: Vec<String>,
    /// Concurrent clients (one task each, one operation in flight each).
    pub clients: usize,
    /// gRPC connections per endpoint.
    pub connections: usize,
    /// Stop after this many operations (over all clients)...
    pub ops: u64,
    /// ...or after this long, whichever comes first.
    pub duration: Duration,
    /// Key length; keys are zero-padded decimal ids.
    pub key_size_bytes: usize,
    /// Value length (incompressible bytes).
    pub value_size_bytes: usize,
    /// Keys are drawn uniformly from `0..key_space`.
    pub key_space: u64,
    /// The operation mix.
    pub op: OpKind,
    /// Read consistency.
    pub consistency: Consistency,
    /// Where reads go.
    pub read_target: ReadTarget,
    /// Seed of the key choice and the values.
    pub seed: u64,
}

impl Default for LoadConfig {
    fn default() -> LoadConfig {
        LoadConfig {
            endpoints: vec![
                "127.0.0.1:7001".into(),
                "127.0.0.1:7002".into(),
                "127.0.0.1:7003".into(),
            ],
            clients: 1,
            connections: 1,
            ops: 10_000,
            duration: Duration::from_secs(20),
            key_size_bytes: 16,
            value_size_bytes: 100,
            key_space: 100_000,
            op: OpKind::Put,
            consistency: Consistency::Linearizable,
            read_target: ReadTarget::Spread,
            seed: 1,
        }
    }
}

/// A setting out of bounds, naming the setting and the bound.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{field} = {value}: {rule}")]
pub struct ConfigError {
    /// The setting.
    pub field: &'static str,
    /// Its value.
    pub value: String,
    /// What it must be.
    pub rule: String,
}

fn check(
    field: &'static str,
    value: impl ToString,
    ok: bool,
    rule: String,
) -> Result<(), ConfigError> {
    if ok {
        Ok(())
    } else {
        Err(ConfigError {
            field,
            value: value.to_string(),
            rule,
        })
    }
}

impl LoadConfig {
    /// Checks every setting against its bound.
    pub fn validate(&self) -> Result<(), ConfigError> {
        check(
            "endpoints",
            self.endpoints.join(","),
            !self.endpoints.is_empty(),
            "at least one endpoint".into(),
        )?;
        check(
            "clients",
            self.clients,
            (1..=CLIENTS_MAX).contains(&self.clients),
            format!("1..={CLIENTS_MAX} (CLIENTS_MAX)"),
        )?;
        check(
            "connections",
            self.connections,
            (1..=CONNECTIONS_MAX).contains(&self.connections),
            format!("1..={CONNECTIONS_MAX} (CONNECTIONS_MAX)"),
        )?;
        check(
            "ops",
            self.ops,
            (1..=OPS_MAX).contains(&self.ops),
            format!("1..={OPS_MAX} (OPS_MAX)"),
        )?;
        check(
            "duration",
            format!("{:?}", self.duration),
            !self.duration.is_zero() && self.duration <= DURATION_MAX,
            format!("above zero and at most {DURATION_MAX:?} (DURATION_MAX)"),
        )?;
        check(
            "key_space",
            self.key_space,
            self.key_space >= 1,
            "at least 1".into(),
        )?;
        let digits = (self.key_space - 1).max(1).ilog10() as usize + 1;
        check(
            "key_size_bytes",
            self.key_size_bytes,
            (digits..=KEY_SIZE_BYTES_MAX).contains(&self.key_size_bytes),
            format!(
                "{digits}..={KEY_SIZE_BYTES_MAX} (the key space's digits up to KEY_SIZE_BYTES_MAX)"
            ),
        )?;
        check(
            "value_size_bytes",
            self.value_size_bytes,
            self.value_size_bytes <= VALUE_SIZE_BYTES_MAX,
            format!("at most {VALUE_SIZE_BYTES_MAX} (VALUE_SIZE_BYTES_MAX)"),
        )?;
        if let OpKind::Mixed { read_percent } = self.op {
            check(
                "read_percent",
                read_percent,
                read_percent <= 100,
                "0..=100".into(),
            )?;
        }
        Ok(())
    }
}

/// The outcome of a run.
#[derive(Debug)]
pub struct LoadReport {
    /// Operations that succeeded (a get that found nothing counts).
    pub ops_ok: u64,
    /// Failed operations by kind (gRPC code, plus the detail when there is one).
    pub errors: BTreeMap<String, u64>,
    /// NotLeader redirects followed (not failures).
    pub redirects: u64,
    /// Wall time of the run.
    pub elapsed: Duration,
    /// Latency of successful operations, µs.
    pub latency_us: Histogram<u64>,
    /// Acknowledged writes.
    pub writes_acked: u64,
    /// Distinct Raft entries (log indexes) that carried acknowledged writes.
    pub write_entries: u64,
    /// Successful operations over time, ascending by `at_ms`: all of them,
    /// or an even thinning to at most [`TIMELINE_SAMPLES_MAX`].
    pub timeline: Vec<Sample>,
}

impl LoadReport {
    /// Failed operations.
    pub fn errors_total(&self) -> u64 {
        self.errors.values().sum()
    }

    /// Successful operations per second.
    pub fn ops_per_second(&self) -> f64 {
        self.ops_ok as f64 / self.elapsed.as_secs_f64().max(f64::MIN_POSITIVE)
    }

    /// Acknowledged writes per Raft entry that carried them; `None` without
    /// writes.
    pub fn ops_per_entry(&self) -> Option<f64> {
        (self.write_entries > 0).then(|| self.writes_acked as f64 / self.write_entries as f64)
    }

    /// The headers of [`LoadReport::row`].
    pub const HEADERS: [&'static str; 13] = [
        "op",
        "clients",
        "ops",
        "seconds",
        "ops/s",
        "p50 ms",
        "p90 ms",
        "p99 ms",
        "p99.9 ms",
        "max ms",
        "errors",
        "redirects",
        "ops/entry",
    ];

    /// One table row (see [`LoadReport::HEADERS`]).
    pub fn row(&self, op: &str, clients: usize) -> Vec<String> {
        let ms = |q: f64| {
            format!(
                "{:.2}",
                self.latency_us.value_at_quantile(q) as f64 / 1000.0
            )
        };
        vec![
            op.to_string(),
            clients.to_string(),
            count(self.ops_ok as f64),
            format!("{:.1}", self.elapsed.as_secs_f64()),
            count(self.ops_per_second()),
            ms(0.5),
            ms(0.9),
            ms(0.99),
            ms(0.999),
            format!("{:.2}", self.latency_us.max() as f64 / 1000.0),
            count(self.errors_total() as f64),
            count(self.redirects as f64),
            self.ops_per_entry()
                .map(|v| format!("{v:.2}"))
                .unwrap_or_else(|| "n/a".into()),
        ]
    }

    /// A one-row table plus a note per error kind.
    pub fn table(&self, title: &str, op: &str, clients: usize) -> Table {
        let mut table = Table::new(title, &Self::HEADERS);
        table.row(self.row(op, clients));
        for (kind, n) in &self.errors {
            table.note(format!("- errors {kind}: {n}"));
        }
        table
    }
}

fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, LATENCY_US_MAX, 3).expect("valid histogram bounds")
}

fn url(endpoint: &str) -> String {
    if endpoint.starts_with("http://") || endpoint.starts_with("https://") {
        endpoint.to_string()
    } else {
        format!("http://{endpoint}")
    }
}

/// Lazily connected channels per endpoint address, shared by every client.
#[derive(Debug)]
struct Pool {
    connections: usize,
    channels: Mutex<BTreeMap<String, Vec<Channel>>>,
}

impl Pool {
    fn channel(&self, addr: &str, client: usize) -> Result<Channel, tonic::Status> {
        let mut channels = self.channels.lock().unwrap_or_else(|p| p.into_inner());
        if !channels.contains_key(addr) {
            let endpoint = Endpoint::from_shared(url(addr))
                .map_err(|err| {
                    tonic::Status::invalid_argument(format!("endpoint {addr:?}: {err}"))
                })?
                .connect_timeout(RPC_TIMEOUT)
                .timeout(RPC_TIMEOUT)
                .tcp_nodelay(true);
            let list = (0..self.connections)
                .map(|_| endpoint.connect_lazy())
                .collect();
            channels.insert(addr.to_string(), list);
        }
        let list = &channels[addr];
        Ok(list[client % list.len()].clone())
    }
}

/// State the clients share.
#[derive(Debug)]
struct Shared {
    config: LoadConfig,
    pool: Pool,
    /// The leader's client address as last learned (or guessed).
    leader: Mutex<String>,
    /// Operations started, for the count bound.
    started: AtomicU64,
    began: Instant,
    deadline: Instant,
    values: Bytes,
    progress: Arc<Progress>,
    system: System,
    /// One etcd client per channel of the pool (built before the clients start).
    #[cfg(feature = "etcd")]
    etcd: etcd::Clients,
}

impl Shared {
    fn leader(&self) -> String {
        self.leader
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn set_leader(&self, addr: String) {
        *self.leader.lock().unwrap_or_else(|p| p.into_inner()) = addr;
    }

    /// Follows a NotLeader hint from `from`. The hint is the leader's
    /// address as the members know it, which the load generator may not be
    /// able to reach (a compose network's `node2:7001` seen from the host):
    /// with several endpoints given and the hint not among them, the next
    /// given endpoint is tried instead (the leader is one of them).
    fn follow_hint(&self, from: &str, hint: String) {
        let endpoints = &self.config.endpoints;
        if endpoints.contains(&hint) || endpoints.len() < 2 {
            self.set_leader(hint);
        } else {
            self.next_leader(from);
        }
    }

    /// Moves the guess to the endpoint after `failed` (if it is still the
    /// guess).
    fn next_leader(&self, failed: &str) {
        let mut leader = self.leader.lock().unwrap_or_else(|p| p.into_inner());
        if *leader == failed {
            let endpoints = &self.config.endpoints;
            let position = endpoints.iter().position(|e| e == failed);
            let next = position.map(|p| (p + 1) % endpoints.len()).unwrap_or(0);
            *leader = endpoints[next].clone();
        }
    }
}

/// One client's tallies.
#[derive(Debug)]
struct Tally {
    ops_ok: u64,
    errors: BTreeMap<String, u64>,
    redirects: u64,
    latency_us: Histogram<u64>,
    writes_acked: u64,
    entries: HashSet<u64>,
    sampler: Sampler,
}

fn detail(status: &tonic::Status) -> Option<error_detail::Detail> {
    let value = status.metadata().get_bin(ERROR_DETAIL_KEY)?;
    let bytes = value.to_bytes().ok()?;
    ErrorDetail::decode(bytes).ok()?.detail
}

/// A short name for an error: the gRPC code and the detail's kind.
fn error_kind(status: &tonic::Status) -> String {
    let code = format!("{:?}", status.code());
    match detail(status) {
        Some(error_detail::Detail::NotLeader(_)) => format!("{code}/NotLeader"),
        Some(error_detail::Detail::LimitExceeded(l)) => format!("{code}/LimitExceeded {}", l.limit),
        Some(error_detail::Detail::IndexNotReached(_)) => format!("{code}/IndexNotReached"),
        Some(error_detail::Detail::OutcomeUnknown(_)) => format!("{code}/OutcomeUnknown"),
        Some(error_detail::Detail::SessionExpired(_)) => format!("{code}/SessionExpired"),
        None => code,
    }
}

fn key(config: &LoadConfig, id: u64) -> Bytes {
    Bytes::from(format!("{id:0>width$}", width = config.key_size_bytes))
}

/// After a failed attempt at `addr`: follows a NotLeader detail, or moves
/// the leader guess on after a failure another member may not have (no
/// leader known, unreachable, unavailable) and pauses; `false` when a retry
/// would not help (outcome unknown, limits, ...: counted, not retried).
async fn retry_elsewhere(
    shared: &Shared,
    addr: &str,
    status: &tonic::Status,
    tally: &mut Tally,
    attempt: u32,
) -> bool {
    match detail(status) {
        Some(error_detail::Detail::NotLeader(not_leader))
            if !not_leader.leader_client_addr.is_empty() =>
        {
            tally.redirects += 1;
            shared.follow_hint(addr, not_leader.leader_client_addr);
            if attempt > 0 {
                tokio::time::sleep(REDIRECT_PAUSE).await;
            }
            true
        }
        Some(error_detail::Detail::NotLeader(_)) | None
            if matches!(
                status.code(),
                tonic::Code::FailedPrecondition
                    | tonic::Code::Unavailable
                    | tonic::Code::Unknown
                    | tonic::Code::Internal
                    | tonic::Code::Cancelled
            ) =>
        {
            // Unknown / Internal / Cancelled: the connection went away
            // mid-call (a member restarting); the benchmark's writes are
            // plain overwrites, so retrying one is harmless.
            shared.next_leader(addr);
            let pause = RETRY_PAUSE
                .saturating_mul(1 << attempt.min(16))
                .min(RETRY_PAUSE_MAX);
            tokio::time::sleep(pause).await;
            true
        }
        _ => false,
    }
}

/// One put at `addr`: the version (raftcask) or nothing (etcd).
async fn put_at(
    shared: &Shared,
    addr: &str,
    client: usize,
    key: &Bytes,
    value: &Bytes,
) -> Result<Option<u64>, tonic::Status> {
    match shared.system {
        System::Raftcask => {
            let channel = shared.pool.channel(addr, client)?;
            let request = PutRequest {
                key: key.clone(),
                value: value.clone(),
                ..Default::default()
            };
            let response = KvClient::new(channel).put(request).await?.into_inner();
            match response.outcome {
                Some(put_response::Outcome::Version(version)) => Ok(Some(version)),
                other => Err(tonic::Status::internal(format!(
                    "unconditional put answered {other:?}"
                ))),
            }
        }
        #[cfg(feature = "etcd")]
        System::Etcd => {
            let kv = shared.etcd.kv(addr, client)?;
            etcd::put(kv, key, value).await.map(|()| None)
        }
    }
}

/// One get at `addr` with the run's consistency.
async fn get_at(
    shared: &Shared,
    addr: &str,
    client: usize,
    key: &Bytes,
) -> Result<(), tonic::Status> {
    let consistency = shared.config.consistency;
    match shared.system {
        System::Raftcask => {
            let channel = shared.pool.channel(addr, client)?;
            let request = GetRequest {
                key: key.clone(),
                consistency: consistency as i32,
                min_index: 0,
            };
            KvClient::new(channel).get(request).await.map(|_| ())
        }
        #[cfg(feature = "etcd")]
        System::Etcd => {
            let kv = shared.etcd.kv(addr, client)?;
            etcd::get(kv, key, consistency == Consistency::Stale).await
        }
    }
}

async fn put_once(
    shared: &Shared,
    client: usize,
    key: Bytes,
    value: Bytes,
    tally: &mut Tally,
) -> Result<Option<u64>, tonic::Status> {
    let mut last = None;
    for attempt in 0..ATTEMPTS_MAX {
        let addr = shared.leader();
        match put_at(shared, &addr, client, &key, &value).await {
            Ok(version) => return Ok(version),
            Err(status) => {
                if !retry_elsewhere(shared, &addr, &status, tally, attempt).await {
                    return Err(status);
                }
                last = Some(status);
            }
        }
    }
    Err(last.unwrap_or_else(|| tonic::Status::unavailable("no attempt made")))
}

async fn get_once(
    shared: &Shared,
    client: usize,
    key: Bytes,
    tally: &mut Tally,
) -> Result<(), tonic::Status> {
    let config = &shared.config;
    if config.read_target == ReadTarget::Spread {
        let addr = &config.endpoints[client % config.endpoints.len()];
        return get_at(shared, addr, client, &key).await;
    }
    // To the leader: a failure (no leader known, unreachable, ...) moves
    // the shared guess on, like a write.
    let mut last = None;
    for attempt in 0..ATTEMPTS_MAX {
        let addr = shared.leader();
        match get_at(shared, &addr, client, &key).await {
            Ok(()) => return Ok(()),
            Err(status) => {
                if !retry_elsewhere(shared, &addr, &status, tally, attempt).await {
                    return Err(status);
                }
                last = Some(status);
            }
        }
    }
    Err(last.unwrap_or_else(|| tonic::Status::unavailable("no attempt made")))
}

async fn client_loop(shared: Arc<Shared>, client: usize) -> Tally {
    let config = &shared.config;
    let mut rng =
        SmallRng::seed_from_u64(config.seed ^ (client as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let mut tally = Tally {
        ops_ok: 0,
        errors: BTreeMap::new(),
        redirects: 0,
        latency_us: new_histogram(),
        writes_acked: 0,
        entries: HashSet::new(),
        sampler: Sampler::new(TIMELINE_SAMPLES_MAX / config.clients.max(1)),
    };
    let value_span = shared.values.len() - config.value_size_bytes;
    loop {
        if Instant::now() >= shared.deadline
            || shared.started.fetch_add(1, Ordering::Relaxed) >= config.ops
        {
            break;
        }
        let key = key(config, rng.random_range(0..config.key_space));
        let is_read = match config.op {
            OpKind::Put => false,
            OpKind::Get => true,
            OpKind::Mixed { read_percent } => rng.random_range(0..100u8) < read_percent,
        };
        let began = Instant::now();
        let result = if is_read {
            get_once(&shared, client, key, &mut tally)
                .await
                .map(|()| None)
        } else {
            let offset = rng.random_range(0..=value_span);
            let value = shared
                .values
                .slice(offset..offset + config.value_size_bytes);
            put_once(&shared, client, key, value, &mut tally).await
        };
        let micros = (began.elapsed().as_micros() as u64).clamp(1, LATENCY_US_MAX);
        match result {
            Ok(version) => {
                tally.ops_ok += 1;
                tally.latency_us.saturating_record(micros);
                shared.progress.ok.fetch_add(1, Ordering::Relaxed);
                let at_ms = shared.began.elapsed().as_millis();
                tally.sampler.record(Sample {
                    at_ms: u32::try_from(at_ms).unwrap_or(u32::MAX),
                    latency_us: u32::try_from(micros).unwrap_or(u32::MAX),
                });
                if let Some(version) = version {
                    tally.writes_acked += 1;
                    tally.entries.insert(version >> 16);
                }
            }
            Err(status) => {
                shared.progress.failed.fetch_add(1, Ordering::Relaxed);
                *tally.errors.entry(error_kind(&status)).or_default() += 1;
            }
        }
    }
    tally
}

/// The etcd endpoint among `endpoints` that answers etcd's `Status` call
/// as the leader (the one the etcd backend sends writes and leader reads
/// to), or `None` when none does.
#[cfg(feature = "etcd")]
pub async fn etcd_leader(endpoints: &[String]) -> Result<Option<String>, ConfigError> {
    let pool = Pool {
        connections: 1,
        channels: Mutex::new(BTreeMap::new()),
    };
    etcd::Clients::connect(&pool, endpoints)
        .await
        .map(|(_, leader)| leader)
}

/// Runs the load described by `config` (validated first).
pub async fn run(config: LoadConfig) -> Result<LoadReport, ConfigError> {
    run_observed(config, Arc::new(Progress::default())).await
}

/// [`run`], counting finished operations in `progress` as they finish.
pub async fn run_observed(
    config: LoadConfig,
    progress: Arc<Progress>,
) -> Result<LoadReport, ConfigError> {
    run_system(config, System::Raftcask, progress).await
}

/// [`run_observed`] against `system`.
pub async fn run_system(
    config: LoadConfig,
    system: System,
    progress: Arc<Progress>,
) -> Result<LoadReport, ConfigError> {
    config.validate()?;
    let pool = Pool {
        connections: config.connections,
        channels: Mutex::new(BTreeMap::new()),
    };
    // The first leader guess: etcd's is asked for; raftcask's clients
    // follow redirects from the first endpoint.
    #[cfg(feature = "etcd")]
    let (etcd, leader) = match system {
        System::Etcd => {
            let (clients, leader) = etcd::Clients::connect(&pool, &config.endpoints).await?;
            (
                clients,
                leader.unwrap_or_else(|| config.endpoints[0].clone()),
            )
        }
        System::Raftcask => (etcd::Clients::default(), config.endpoints[0].clone()),
    };
    #[cfg(not(feature = "etcd"))]
    let leader = config.endpoints[0].clone();
    let mut values = vec![0u8; VALUE_POOL_SIZE_BYTES.max(config.value_size_bytes * 2)];
    SmallRng::seed_from_u64(config.seed).fill_bytes(&mut values);
    let began = Instant::now();
    let shared = Arc::new(Shared {
        pool,
        leader: Mutex::new(leader),
        started: AtomicU64::new(0),
        began,
        deadline: began + config.duration,
        values: Bytes::from(values),
        progress,
        system,
        #[cfg(feature = "etcd")]
        etcd,
        config,
    });
    let tasks: Vec<_> = (0..shared.config.clients)
        .map(|client| tokio::spawn(client_loop(shared.clone(), client)))
        .collect();
    let mut report = LoadReport {
        ops_ok: 0,
        errors: BTreeMap::new(),
        redirects: 0,
        elapsed: Duration::ZERO,
        latency_us: new_histogram(),
        writes_acked: 0,
        write_entries: 0,
        timeline: Vec::new(),
    };
    let mut entries = HashSet::new();
    for task in tasks {
        match task.await {
            Ok(tally) => {
                report.ops_ok += tally.ops_ok;
                report.redirects += tally.redirects;
                report.writes_acked += tally.writes_acked;
                // Same bounds on both sides, so adding cannot fail.
                let _ = report.latency_us.add(&tally.latency_us);
                for (kind, n) in tally.errors {
                    *report.errors.entry(kind).or_default() += n;
                }
                entries.extend(tally.entries);
                report.timeline.extend(tally.sampler.samples);
            }
            Err(err) => {
                *report
                    .errors
                    .entry(format!("client task: {err}"))
                    .or_default() += 1
            }
        }
    }
    report.elapsed = began.elapsed();
    report.write_entries = entries.len() as u64;
    report.timeline.sort_by_key(|s| s.at_ms);
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_name_the_setting() {
        assert_eq!(LoadConfig::default().validate(), Ok(()));
        let err = LoadConfig {
            clients: 0,
            ..LoadConfig::default()
        }
        .validate()
        .unwrap_err();
        assert_eq!(err.field, "clients");
        assert!(err.to_string().contains("CLIENTS_MAX"), "{err}");
        let err = LoadConfig {
            key_size_bytes: 3,
            key_space: 100_000,
            ..LoadConfig::default()
        }
        .validate()
        .unwrap_err();
        assert_eq!(err.field, "key_size_bytes");
        let err = LoadConfig {
            duration: Duration::ZERO,
            ..LoadConfig::default()
        }
        .validate()
        .unwrap_err();
        assert_eq!(err.field, "duration");
    }

    #[test]
    fn sampler_thins_evenly_and_stays_bounded() {
        let mut sampler = Sampler::new(8);
        for at_ms in 0..1000 {
            sampler.record(Sample {
                at_ms,
                latency_us: 1,
            });
        }
        assert!(sampler.samples.len() <= 8, "{:?}", sampler.samples);
        assert!(sampler.samples.len() >= 4, "{:?}", sampler.samples);
        // Spread over the whole run, not just its start.
        let last = sampler.samples.last().map(|s| s.at_ms);
        assert!(last.is_some_and(|t| t >= 500), "{:?}", sampler.samples);
        let gaps: Vec<u32> = sampler
            .samples
            .windows(2)
            .map(|w| w[1].at_ms - w[0].at_ms)
            .collect();
        assert!(gaps.iter().all(|g| *g == gaps[0]), "{gaps:?}");
    }

    #[test]
    fn keys_have_the_configured_size() {
        let config = LoadConfig::default();
        assert_eq!(&key(&config, 42)[..], b"0000000000000042");
    }

    #[test]
    fn ops_per_entry_counts_distinct_entries() {
        let report = LoadReport {
            ops_ok: 6,
            errors: BTreeMap::new(),
            redirects: 0,
            elapsed: Duration::from_secs(2),
            latency_us: new_histogram(),
            writes_acked: 6,
            write_entries: 2,
            timeline: Vec::new(),
        };
        assert_eq!(report.ops_per_entry(), Some(3.0));
        assert_eq!(report.ops_per_second(), 3.0);
    }
}
