//! `jepsen run`: one fault-injection run.
//!
//! In a private network namespace (needs root), starts N real `kvnode`
//! members, waits until the cluster takes a write, then runs a workload
//! for `--time` while the nemeses inject and heal faults; heals everything,
//! does the workload's final read, stops every member, and writes
//! `OUT/history.jsonl` and `OUT/summary.txt`.
//!
//! The exit code says whether the run did enough to prove anything
//! (DESIGN §7): at least `--min-ok-writes` acknowledged writes and
//! `--min-ok-reads` ok reads, an ok operation invoked after every heal, a
//! well-formed history, and no member that exited on its own. Whether the
//! history is correct is the checkers' verdict, not this one's.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context as _, bail};
use tokio::time::Instant;

use crate::control::cluster::NODES_MAX;
use crate::control::{Cluster, ClusterConfig, Firewall, Namespace};
use crate::nemesis::{Fault, FaultList, Nemesis, Schedule};
use crate::workload::{self, History, Record, WorkloadConfig, check_well_formed};

mod outcome;
pub use outcome::check_minimums;
use outcome::summary;

/// Longest `--time` accepted.
pub const RUN_TIME_MAX: Duration = Duration::from_secs(3600);
/// Most concurrent workers (the machine has two cores).
pub const CONCURRENCY_MAX: usize = 64;
/// Highest total rate accepted (ops per second).
pub const RATE_PER_SECOND_MAX: u32 = 10_000;
/// How long the cluster may take to elect a leader and take a first write.
pub const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// Pause between two readiness probes.
const READY_PROBE_PAUSE: Duration = Duration::from_millis(200);
/// Members when `--nodes` is not given and no fault needs more.
pub const NODES_DEFAULT: u64 = 3;

/// Which workload a run drives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum WorkloadKind {
    /// Reads, writes and compare-and-sets over many keys.
    Register,
    /// Unique adds, then a final read of every element.
    Set,
    /// Keys written once with a TTL, read around their expiry from every
    /// member (under `clock`, or leader changes: `restart-after-idle`,
    /// `kill-leader`, partitions, `membership`).
    Ttl,
    /// Unique put-if-absent adds retried across lost replies and leader
    /// kills, then a final scan with versions: no element applied twice,
    /// none acknowledged and lost.
    ExactlyOnce,
    /// Puts (some with a TTL), deletes and linearizable reads of a few
    /// keys while one watcher per member watches them all, resuming on
    /// other members under faults: every watcher sees exactly the
    /// writes' events, in revision order, and they all agree.
    Watch,
    /// Leases granted, keys attached, kept alive by keep-alives, then
    /// revoked or left to expire, read by linearizable ranges and watched:
    /// no lease expires early after an acknowledged keep-alive, none
    /// outlives its TTL + bound once nothing renews it, a revoke or
    /// expiry removes all its keys at once (`--ttl-min` / `--ttl-max`: the
    /// leases' TTLs).
    Lease,
    /// The register workload through each member's Redis (RESP) port:
    /// SET, GET, and WATCH / GET / MULTI / SET / EXEC as a compare-and-set
    /// by value, one connection per client process; checked as a
    /// cas-register (by value) with the same linearizability checker.
    RedisRegister,
    /// The register workload through each member's etcd v3 port (the
    /// workload of Jepsen's etcd test): Range, Put, and a Txn comparing
    /// the value as a compare-and-set, one gRPC channel per client
    /// process; checked as a cas-register (by value) with the same
    /// linearizability checker, and by the revision checks.
    EtcdRegister,
}

/// Flags of `jepsen run`.
#[derive(Debug, Clone, clap::Args)]
pub struct RunArgs {
    /// The workload.
    #[arg(long, value_enum, default_value = "register")]
    pub workload: WorkloadKind,
    /// Faults, comma-separated, injected in turn: partition-leader,
    /// partition-half, partition-one-way, partition-bridge, partition-ring,
    /// loss, kill, kill-leader, pause, pause-leader, clock,
    /// partition-follower, power-loss, power-loss-minority, power-loss-all
    /// (power loss: lazy-disk kvnode builds only), membership,
    /// restart-after-idle (a sequence: writes stop, idle, rolling restarts,
    /// leader kills); `combined` (or `all`) for a seeded random mix; `none`
    /// for none.
    #[arg(long, default_value = "none", value_parser = FaultList::parse)]
    pub nemesis: FaultList,
    /// How long the workload runs (e.g. 30s, 2m, 500ms).
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub time: Duration,
    /// Members (default 3, or 5 when a bridge or ring partition is asked).
    #[arg(long)]
    pub nodes: Option<u64>,
    /// Output directory (created; must not hold an earlier run).
    #[arg(long)]
    pub out: PathBuf,
    /// The kvnode executable (default: `kvnode` next to this executable, or
    /// one directory up from a test binary in `deps/`).
    #[arg(long, env = "KVNODE_BIN")]
    pub kvnode_bin: Option<PathBuf>,
    /// Concurrent client workers.
    #[arg(long, default_value_t = 4)]
    pub concurrency: usize,
    /// Total operations per second, all workers together, at most.
    #[arg(long, default_value_t = 100)]
    pub rate: u32,
    /// Seed of every random choice (default: from the clock).
    #[arg(long)]
    pub seed: Option<u64>,
    /// How long each fault lasts (pauses: at least 5 s). The default
    /// outlasts a kvnode failover (about 5 s: election timeout plus the
    /// leader lease), so a leader fault forces a new election.
    #[arg(long, default_value = "6s", value_parser = parse_duration)]
    pub fault_hold: Duration,
    /// Calm before the first fault and after each heal.
    #[arg(long, default_value = "3s", value_parser = parse_duration)]
    pub quiet: Duration,
    /// Acknowledged writes the run needs to count, per 30 s of `--time`
    /// (invoked before the final reads).
    #[arg(long, default_value_t = 20)]
    pub min_ok_writes: usize,
    /// Ok reads the run needs to count, per 30 s of `--time` (invoked
    /// before the final reads).
    #[arg(long, default_value_t = 20)]
    pub min_ok_reads: usize,
    /// Shortest TTL the `ttl` workload writes (`watch`: its TTL puts;
    /// `lease`: its leases, at least kvnode's 2 s minimum).
    #[arg(long, default_value = "1500ms", value_parser = parse_duration)]
    pub ttl_min: Duration,
    /// Longest TTL the `ttl` workload writes (`watch`, `lease`: as above).
    #[arg(long, default_value = "4000ms", value_parser = parse_duration)]
    pub ttl_max: Duration,
    /// `restart-after-idle`'s idle period (no write, no TTL key).
    #[arg(long, default_value = "15s", value_parser = parse_duration)]
    pub idle: Duration,
    /// kvnode's session idle window in ms (`kvnode run
    /// --test-session-idle-ms`, passed to every member as
    /// KVNODE_TEST_SESSION_IDLE_MS); the exactly-once workload's slow
    /// workers retry after longer than this. Default: kvnode's own.
    #[arg(long, env = SESSION_IDLE_ENV)]
    pub session_idle_ms: Option<u64>,
}

/// kvnode's variable for its session idle window (test builds of the
/// suite only shorten it).
pub const SESSION_IDLE_ENV: &str = "KVNODE_TEST_SESSION_IDLE_MS";
/// The schedule length the minimum counts are given for.
pub const MINIMUM_PER: Duration = Duration::from_secs(30);

/// A per-[`MINIMUM_PER`] minimum scaled to a schedule of `time` (rounded
/// up, never below `per_30s`).
pub fn minimum_for(per_30s: usize, time: Duration) -> usize {
    let scaled = (per_30s as f64 * time.as_secs_f64() / MINIMUM_PER.as_secs_f64()).ceil();
    (scaled as usize).max(per_30s)
}

/// Parses `500ms`, `30s`, `2m`, `1h`, or bare seconds.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let (number, unit) = match text.find(|c: char| !c.is_ascii_digit()) {
        Some(at) => text.split_at(at),
        None => (text, "s"),
    };
    let number: u64 = number
        .parse()
        .map_err(|_| format!("duration {text:?}: expected a number then ms, s, m or h"))?;
    let duration = match unit {
        "ms" => Duration::from_millis(number),
        "s" => Duration::from_secs(number),
        "m" => Duration::from_secs(number.saturating_mul(60)),
        "h" => Duration::from_secs(number.saturating_mul(3600)),
        _ => return Err(format!("duration {text:?}: unit must be ms, s, m or h")),
    };
    if duration > RUN_TIME_MAX {
        return Err(format!(
            "duration {text:?} is over RUN_TIME_MAX ({} s)",
            RUN_TIME_MAX.as_secs()
        ));
    }
    Ok(duration)
}

/// Runs `jepsen run`: exit 0 when the run did enough, 1 when it did not.
/// The work happens on a thread of its own inside a private network
/// namespace (namespaces belong to threads), with its own runtime.
pub async fn run(args: RunArgs) -> anyhow::Result<ExitCode> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("jepsen-run".into())
        .spawn(move || {
            let _ = tx.send(run_on_own_thread(args));
        })
        .context("starting the run thread")?;
    rx.await.context("the run thread panicked")?
}

/// The variable that forces the no-root proxy mode (for tests as root).
pub const FORCE_PROXY_ENV: &str = "JEPSEN_FORCE_PROXY";

/// Whether this run uses the userspace peer proxies: not root, or
/// [`FORCE_PROXY_ENV`]`=1`.
pub fn proxy_mode() -> bool {
    !rustix::process::geteuid().is_root() || std::env::var(FORCE_PROXY_ENV).is_ok_and(|v| v == "1")
}

/// Whether proxy mode can inject `fault` (no packet loss, no clock).
pub fn proxy_mode_supports(fault: Fault) -> bool {
    !matches!(fault, Fault::Loss | Fault::Clock)
}

fn run_on_own_thread(args: RunArgs) -> anyhow::Result<ExitCode> {
    let args = Checked::new(args)?;
    // Kept alive for the whole run (dropping it ends the namespace).
    let _namespace = if args.proxy_mode {
        eprintln!(
            "jepsen run: NOT ROOT (or {FORCE_PROXY_ENV}=1): partitions through userspace \
             proxies; loss/clock unavailable; members on the host's loopback"
        );
        None
    } else {
        let namespace = Namespace::create()?;
        namespace.enter_current_thread()?;
        Some(namespace)
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("building the run's runtime")?;
    runtime.block_on(run_inside(args))
}

/// The flags, checked, with defaults filled in.
#[derive(Debug)]
struct Checked {
    args: RunArgs,
    nodes: u64,
    seed: u64,
    kvnode_bin: PathBuf,
    proxy_mode: bool,
}

impl Checked {
    fn new(args: RunArgs) -> anyhow::Result<Self> {
        let nodes_needed = args
            .nemesis
            .0
            .iter()
            .map(|f| f.nodes_min())
            .max()
            .unwrap_or(1);
        let nodes = args.nodes.unwrap_or(NODES_DEFAULT.max(nodes_needed));
        if nodes == 0 || nodes > NODES_MAX {
            bail!("--nodes {nodes}: must be 1 ..= NODES_MAX ({NODES_MAX})");
        }
        for fault in &args.nemesis.0 {
            if nodes < fault.nodes_min() {
                bail!(
                    "--nemesis {} needs --nodes >= {}, got {nodes}",
                    fault.name(),
                    fault.nodes_min()
                );
            }
        }
        if args.concurrency == 0 || args.concurrency > CONCURRENCY_MAX {
            bail!(
                "--concurrency {}: must be 1 ..= CONCURRENCY_MAX ({CONCURRENCY_MAX})",
                args.concurrency
            );
        }
        if args.rate == 0 || args.rate > RATE_PER_SECOND_MAX {
            bail!(
                "--rate {}: must be 1 ..= RATE_PER_SECOND_MAX ({RATE_PER_SECOND_MAX})",
                args.rate
            );
        }
        if args.time.is_zero() {
            bail!("--time must be above zero");
        }
        if args.ttl_min.is_zero() || args.ttl_min > args.ttl_max {
            bail!(
                "--ttl-min {:?} / --ttl-max {:?}: need 0 < min <= max",
                args.ttl_min,
                args.ttl_max
            );
        }
        let kvnode_bin = match &args.kvnode_bin {
            Some(path) => path.clone(),
            None => default_kvnode_bin()?,
        };
        if args.nemesis.0.iter().any(|f| f.needs_lazy_disk()) {
            crate::nemesis::power::require_lazy_disk(&kvnode_bin)?;
        }
        // A test setting from this process's environment, or
        // `--session-idle-ms` (passed to the members as one).
        let test_env = std::env::vars()
            .map(|(name, _)| name)
            .find(|name| name.starts_with(crate::nemesis::power::TEST_ENV_PREFIX))
            .or_else(|| {
                args.session_idle_ms
                    .map(|_| "--session-idle-ms".to_string())
            });
        if let Some(name) = test_env {
            crate::nemesis::power::require_testing(&kvnode_bin, &name)?;
        }
        let seed = args.seed.unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64)
        });
        // `combined`: the seeded random mix this member count allows.
        let combined = args.nemesis.0.contains(&Fault::Combined);
        let mut nemesis = crate::nemesis::combined::expand(&args.nemesis, nodes, seed);
        let proxy_mode = proxy_mode();
        if proxy_mode {
            if combined {
                nemesis.0.retain(|&f| proxy_mode_supports(f));
            } else if let Some(fault) = nemesis.0.iter().find(|&&f| !proxy_mode_supports(f)) {
                bail!(
                    "--nemesis {}: not root, so partitions go through userspace proxies; \
                     loss and clock faults are unavailable (run as root)",
                    fault.name()
                );
            }
        }
        let args = RunArgs { nemesis, ..args };
        Ok(Self {
            args,
            nodes,
            seed,
            kvnode_bin,
            proxy_mode,
        })
    }
}

/// `kvnode` next to the current executable, or one directory up (a test
/// binary lives in `target/<profile>/deps/`).
pub fn default_kvnode_bin() -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe().context("finding the current executable")?;
    let dir = exe.parent().unwrap_or(Path::new("."));
    let candidates = [dir.join("kvnode"), dir.join("..").join("kvnode")];
    candidates
        .iter()
        .find(|p| p.is_file())
        .cloned()
        .with_context(|| {
            format!(
                "no kvnode binary at {:?}: build it (`cargo build -p kvnode`) or pass \
                 --kvnode-bin / KVNODE_BIN",
                candidates
            )
        })
}

async fn run_inside(checked: Checked) -> anyhow::Result<ExitCode> {
    let Checked {
        args,
        nodes,
        seed,
        kvnode_bin,
        proxy_mode,
    } = checked;
    prepare_out(&args.out)?;
    let (firewall, cluster) = start_cluster(&args, nodes, kvnode_bin, proxy_mode)?;
    let endpoints = cluster.client_addrs();
    let front_ends = FrontEnds {
        redis: cluster.redis_addrs(),
        etcd: cluster.etcd_addrs(),
    };
    wait_ready(&endpoints).await?;
    let ran =
        run_workload_and_faults(&args, seed, cluster, firewall, &endpoints, &front_ends).await?;

    let records = ran.history.records();
    let mut problems = run_problems(&args, &records, &ran);
    // The verdict: the workload's checker on the run's history.
    let (checker_json, checker_text, checker_name, checker_passes) =
        workload_verdict(&args, &records, &mut problems)?;
    // Durability: a saved vote a power cut took back, a member that did
    // not come back, fail the verdict whatever the history shows.
    let (checker_json, checker_text, checker_passes) =
        crate::durability::apply(checker_json, checker_text, checker_passes, &ran.durability)?;
    std::fs::write(
        args.out.join("checker.json"),
        serde_json::to_string_pretty(&checker_json)?,
    )
    .context("writing checker.json")?;
    if !checker_passes {
        problems.push(format!(
            "the {checker_name} checker does not pass: {}",
            checker_text.lines().next().unwrap_or("")
        ));
    }
    let mut summary = summary(&args, nodes, seed, &records, &problems);
    summary.push_str("\nchecker:\n");
    summary.push_str(&checker_text);
    summary.push_str(&crate::report::write(&args.out, &records, &checker_json)?);
    std::fs::write(args.out.join("summary.txt"), &summary).context("writing summary.txt")?;
    print!("{summary}");
    Ok(if problems.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// Creates `--out`, refusing one that holds an earlier run.
fn prepare_out(out: &Path) -> anyhow::Result<()> {
    if out.join("history.jsonl").exists() || out.join("node1").exists() {
        bail!(
            "--out {} holds an earlier run: give a new directory",
            out.display()
        );
    }
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    Ok(())
}

/// Starts the members (behind userspace proxies in proxy mode) and the
/// firewall, with a spare slot when a fault adds members.
fn start_cluster(
    args: &RunArgs,
    nodes: u64,
    kvnode_bin: PathBuf,
    proxy_mode: bool,
) -> anyhow::Result<(Firewall, Cluster)> {
    let config = ClusterConfig {
        kvnode_bin,
        dir: args.out.clone(),
        nodes,
        faketime: args.nemesis.0.iter().any(|f| f.needs_faketime()),
        env: args
            .session_idle_ms
            .map(|ms| (SESSION_IDLE_ENV.to_string(), ms.to_string()))
            .into_iter()
            .collect(),
    };
    let (firewall, mut cluster) = if proxy_mode {
        let proxies = crate::control::proxy::ProxyNet::start(NODES_MAX)?;
        (
            Firewall::with_proxies(proxies),
            Cluster::start_behind_proxies(config)?,
        )
    } else {
        (Firewall::new()?, Cluster::start(config)?)
    };
    if args.nemesis.0.iter().any(|f| f.needs_spare_slot()) {
        cluster.reserve_spare_slots(1)?;
    }
    Ok((firewall, cluster))
}

/// The members' other front ends, in slot order like the client
/// endpoints.
struct FrontEnds {
    /// Redis (RESP) addresses.
    redis: Vec<String>,
    /// etcd v3 addresses.
    etcd: Vec<String>,
}

/// What the run phase leaves for the checks.
struct Ran {
    /// The run's history (flushed).
    history: std::sync::Arc<History>,
    /// Members that exited on their own: id and exit status.
    exited: Vec<(u64, String)>,
    /// Saved votes taken back, members that did not come back.
    durability: Vec<crate::durability::DurabilityAnomaly>,
    /// Whether the scan final read succeeded (set, exactly-once; watch:
    /// the final read of the store revision; lease: the final read of
    /// every lease).
    final_read_ok: Option<bool>,
    /// Keys whose final read never succeeded (register, redis-register,
    /// etcd-register).
    unread: Vec<String>,
}

/// Runs the workload and the nemesis schedule until the deadline, heals
/// every fault, does the workload's final read, checks that the members
/// converged, and stops them.
async fn run_workload_and_faults(
    args: &RunArgs,
    seed: u64,
    cluster: Cluster,
    firewall: Firewall,
    endpoints: &[String],
    front_ends: &FrontEnds,
) -> anyhow::Result<Ran> {
    let history = History::create(&args.out.join("history.jsonl"))?;
    let deadline = Instant::now() + args.time;
    let mut nemesis = Nemesis::new(cluster, firewall, history.clone(), seed)?;
    let gate = workload::WriteGate::new();
    nemesis.set_idle(gate.clone(), args.idle, args.ttl_max);
    let config = WorkloadConfig {
        endpoints: endpoints.to_vec(),
        redis_endpoints: front_ends.redis.clone(),
        etcd_endpoints: front_ends.etcd.clone(),
        concurrency: args.concurrency,
        rate_per_second: args.rate,
        deadline,
        seed,
        gate,
        ttl_range: (args.ttl_min, args.ttl_max),
        session_idle: args.session_idle_ms.map(Duration::from_millis),
    };
    let schedule = Schedule {
        hold: args.fault_hold,
        quiet: args.quiet,
        end: deadline,
    };
    let watchers = workload::watch::Watchers::new();
    let workload_run = async {
        match args.workload {
            WorkloadKind::Register => workload::register::run(config, history.clone()).await,
            WorkloadKind::Set => workload::set::run(config, history.clone()).await,
            WorkloadKind::Ttl => workload::ttl::run(config, history.clone()).await,
            WorkloadKind::ExactlyOnce => workload::exactly_once::run(config, history.clone()).await,
            WorkloadKind::Watch => {
                workload::watch::run(config, history.clone(), watchers.clone()).await
            }
            WorkloadKind::Lease => {
                workload::lease::run(config, history.clone(), watchers.clone()).await
            }
            WorkloadKind::RedisRegister => {
                workload::redis_register::run(config, history.clone()).await
            }
            WorkloadKind::EtcdRegister => {
                workload::etcd_register::run(config, history.clone()).await
            }
        }
    };
    let (worked, nemesis_ran) = tokio::join!(
        workload_run,
        nemesis.run_schedule(&args.nemesis.0, schedule)
    );
    let healed = nemesis.heal_all().await;
    let final_read_ok = match args.workload {
        WorkloadKind::Set => Some(workload::set::final_read(endpoints, &history).await?),
        WorkloadKind::ExactlyOnce => {
            Some(workload::exactly_once::final_read(endpoints, &history).await?)
        }
        // The watchers run until here: the final read, their catch-up.
        WorkloadKind::Watch => Some(workload::watch::finish(endpoints, &history, &watchers).await?),
        // The last leases expire, a final read of every one; the
        // watchers' catch-up.
        WorkloadKind::Lease => {
            Some(workload::lease::finish(endpoints, &history, &watchers, args.ttl_max).await?)
        }
        WorkloadKind::Register
        | WorkloadKind::Ttl
        | WorkloadKind::RedisRegister
        | WorkloadKind::EtcdRegister => None,
    };
    let unread = match args.workload {
        WorkloadKind::Register => workload::register::final_reads(endpoints, &history).await?,
        WorkloadKind::RedisRegister => {
            workload::redis_register::final_reads(&front_ends.redis, &history).await?
        }
        WorkloadKind::EtcdRegister => {
            workload::etcd_register::final_reads(&front_ends.etcd, &history).await?
        }
        WorkloadKind::Set
        | WorkloadKind::Ttl
        | WorkloadKind::ExactlyOnce
        | WorkloadKind::Watch
        | WorkloadKind::Lease => Vec::new(),
    };
    let exited = nemesis.cluster_mut().exited_on_their_own();
    let mut durability = nemesis.durability_anomalies().to_vec();
    let unconfirmed = nemesis.unconfirmed_removals().to_vec();
    durability.extend(
        crate::durability::converged(
            nemesis.cluster_mut(),
            &exited,
            &unconfirmed,
            &history.records(),
        )
        .await,
    );
    drop(nemesis.into_cluster());
    history.flush()?;
    worked.context("the workload failed")?;
    nemesis_ran.context("the nemesis failed")?;
    healed.context("healing the faults failed")?;
    Ok(Ran {
        history,
        exited,
        durability,
        final_read_ok,
        unread,
    })
}

/// What the run lacked to count: the minimums, a well-formed history,
/// no member exited on its own, the final reads.
fn run_problems(args: &RunArgs, records: &[Record], ran: &Ran) -> Vec<String> {
    let mut problems = check_minimums(
        records,
        minimum_for(args.min_ok_writes, args.time),
        minimum_for(args.min_ok_reads, args.time),
    );
    problems.extend(check_well_formed(records));
    for (id, status) in &ran.exited {
        problems.push(format!("member {id} exited on its own: {status}"));
    }
    if ran.final_read_ok == Some(false) {
        problems.push("the final read never succeeded".to_string());
    }
    if !ran.unread.is_empty() {
        problems.push(format!(
            "the final read of {} key(s) never succeeded: {}",
            ran.unread.len(),
            ran.unread.join(", ")
        ));
    }
    problems
}

/// The workload's checker on the run's history: its JSON report, its
/// text, its name and whether it passes; its shortfalls (TTL,
/// exactly-once) go to `problems`.
fn workload_verdict(
    args: &RunArgs,
    records: &[Record],
    problems: &mut Vec<String>,
) -> anyhow::Result<(serde_json::Value, String, String, bool)> {
    Ok(if args.workload == WorkloadKind::Ttl {
        let report = crate::ttl_check::check(records);
        problems.extend(crate::ttl_check::shortfalls(&report));
        let json = serde_json::to_value(&report)?;
        (json, report.summary(), "ttl".to_string(), report.valid)
    } else if args.workload == WorkloadKind::ExactlyOnce {
        let report = crate::exactly_once::check(records);
        problems.extend(crate::exactly_once::shortfalls(&report));
        let json = serde_json::to_value(&report)?;
        (
            json,
            report.summary(),
            "exactly-once".to_string(),
            report.valid,
        )
    } else if args.workload == WorkloadKind::Watch {
        // Nothing but the workload writes during the run: every revision
        // after the watchers' start is a change of a watched key.
        let report = crate::watch_check::check(records, true);
        problems.extend(crate::watch_check::shortfalls(&report));
        let json = serde_json::to_value(&report)?;
        (json, report.summary(), "watch".to_string(), report.valid)
    } else if args.workload == WorkloadKind::Lease {
        let report = crate::lease_check::check(records);
        problems.extend(crate::lease_check::shortfalls(&report));
        let json = serde_json::to_value(&report)?;
        (json, report.summary(), "lease".to_string(), report.valid)
    } else {
        let report = crate::verdict::check_run(records, args.workload)?;
        let json = serde_json::to_value(&report)?;
        let name = format!("{:?}", crate::verdict::model_of(args.workload));
        (json, report.summary(), name, report.exit_code() == 0)
    })
}

/// Waits until the cluster takes a write (not recorded in the history).
async fn wait_ready(endpoints: &[String]) -> anyhow::Result<()> {
    let client = workload::client(endpoints)?;
    let started = Instant::now();
    let mut last = String::new();
    while started.elapsed() < READY_TIMEOUT {
        match client.put("jepsen/ready", "1").await {
            Ok(_) => return Ok(()),
            Err(err) => last = err.to_string(),
        }
        tokio::time::sleep(READY_PROBE_PAUSE).await;
    }
    bail!(
        "the cluster took no write within READY_TIMEOUT ({} s): {last}",
        READY_TIMEOUT.as_secs()
    )
}
