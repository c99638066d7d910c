//! Nemeses: the faults a run injects, each with a start and a stop recorded
//! in the history.
//!
//! - Partitions with iptables inside the run's namespace:
//!   `partition-leader` (the leader cut off from everyone),
//!   `partition-half` (a random minority from the majority),
//!   `partition-one-way` (the leader's packets to the others dropped, theirs
//!   to it delivered), `partition-bridge` and `partition-ring` (five or more
//!   members: two halves joined only through one member; each member sees
//!   only its two ring neighbours).
//! - `loss`: a fraction of the packets between every two members dropped.
//! - `kill` / `kill-leader`: SIGKILL, restarted at the stop.
//! - `pause` / `pause-leader`: SIGSTOP for longer than the election
//!   timeout, SIGCONT at the stop.
//! - `clock`: one member's wall clock jumps by an hour (libfaketime; its
//!   monotonic clock is untouched), back at the stop.
//! - `partition-follower`: one member that is not the leader cut off from
//!   everyone (reads sent to it must not be stale).
//! - `power-loss`, `power-loss-minority`, `power-loss-all`: SIGKILL of a
//!   lazy-disk build (un-fsynced writes lost), restart at the stop
//!   ([`power`]); each victim's saved vote is checked not to go back
//!   across the cut ([`vote`]).
//! - `membership` ([`membership`]): a new member added and promoted, then
//!   a voter (sometimes the leader) removed; at least three voters always.
//! - `restart-after-idle` ([`idle`]): a sequence, not a hold: writes stop
//!   until no TTL key is left, an idle period, rolling restarts of every
//!   member but one, then leader kills until that one leads.
//!
//! [`Nemesis::run_schedule`] alternates quiet periods and faults, in the
//! order given, and never starts a fault that could not be healed and
//! followed by a quiet period before the deadline.

pub mod power;

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, bail};
use rand::rngs::SmallRng;
use rand::seq::SliceRandom as _;
use rand::{Rng as _, SeedableRng as _};
use tokio::time::Instant;

pub mod combined;
pub mod idle;
pub mod membership;
pub mod vote;

use crate::control::{Cluster, Firewall};
use crate::workload::{History, Phase, WriteGate};

/// Share of packets the `loss` fault drops on every member-to-member link.
pub const LOSS_PROBABILITY: f64 = 0.3;
/// How far the `clock` fault moves a member's wall clock.
pub const CLOCK_JUMP_SECONDS: i64 = 3600;
/// Shortest SIGSTOP of `pause`: above kvnode's largest election timeout
/// (3 s), so the others elect a new leader while it is stopped.
pub const PAUSE_HOLD_MIN: Duration = Duration::from_secs(5);
/// Time a leader lookup may take before the fault picks a member at random
/// (a failover takes about 5 s; a lookup right after a heal may wait out
/// the end of an election).
const LEADER_LOOKUP_TIMEOUT: Duration = Duration::from_secs(6);
/// Time one probe of the leader lookup may take.
const LEADER_PROBE_TIMEOUT: Duration = Duration::from_secs(1);
/// Pause between two probes of the leader lookup.
const LEADER_PROBE_PAUSE: Duration = Duration::from_millis(250);
/// Members `partition-bridge` and `partition-ring` need.
pub const BRIDGE_RING_NODES_MIN: u64 = 5;

/// One kind of fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The leader cut off from every other member.
    PartitionLeader,
    /// A random minority cut off from the majority.
    PartitionHalf,
    /// Packets from the leader to the others dropped (one way).
    PartitionOneWay,
    /// Two halves connected only through one bridge member (5+ members).
    PartitionBridge,
    /// Each member connected only to its two ring neighbours (5+ members).
    PartitionRing,
    /// Random packet loss between every two members.
    Loss,
    /// SIGKILL a random member; restart it at the stop.
    Kill,
    /// SIGKILL the leader; restart it at the stop.
    KillLeader,
    /// SIGSTOP a random member; SIGCONT at the stop.
    Pause,
    /// SIGSTOP the leader; SIGCONT at the stop.
    PauseLeader,
    /// Jump one member's wall clock; back at the stop.
    Clock,
    /// A member that is not the leader cut off from every other member.
    PartitionFollower,
    /// Power cut of one member (lazy-disk build); restart at the stop.
    PowerLoss,
    /// Power cut of a random minority (lazy-disk build).
    PowerLossMinority,
    /// Power cut of every member at once (lazy-disk build).
    PowerLossAll,
    /// Add and promote a new member; at the stop remove a voter.
    Membership,
    /// Writes stop, idle, rolling restarts, leader kills until the member
    /// that was not restarted leads ([`idle`]).
    RestartAfterIdle,
    /// `combined` / `all`: stands for a seeded random mix of every fault
    /// the run allows ([`combined::expand`] replaces it before the run).
    Combined,
}

/// Every fault, in the order `--help` lists them.
pub const ALL_FAULTS: [Fault; 17] = [
    Fault::PartitionLeader,
    Fault::PartitionHalf,
    Fault::PartitionOneWay,
    Fault::PartitionBridge,
    Fault::PartitionRing,
    Fault::Loss,
    Fault::Kill,
    Fault::KillLeader,
    Fault::Pause,
    Fault::PauseLeader,
    Fault::Clock,
    Fault::PartitionFollower,
    Fault::PowerLoss,
    Fault::PowerLossMinority,
    Fault::PowerLossAll,
    Fault::Membership,
    Fault::RestartAfterIdle,
];

impl Fault {
    /// The fault's name on the command line and in the history.
    pub fn name(self) -> &'static str {
        match self {
            Self::PartitionLeader => "partition-leader",
            Self::PartitionHalf => "partition-half",
            Self::PartitionOneWay => "partition-one-way",
            Self::PartitionBridge => "partition-bridge",
            Self::PartitionRing => "partition-ring",
            Self::Loss => "loss",
            Self::Kill => "kill",
            Self::KillLeader => "kill-leader",
            Self::Pause => "pause",
            Self::PauseLeader => "pause-leader",
            Self::Clock => "clock",
            Self::PartitionFollower => "partition-follower",
            Self::PowerLoss => "power-loss",
            Self::PowerLossMinority => "power-loss-minority",
            Self::PowerLossAll => "power-loss-all",
            Self::Membership => "membership",
            Self::RestartAfterIdle => "restart-after-idle",
            Self::Combined => "combined",
        }
    }

    /// Members the fault needs at least.
    pub fn nodes_min(self) -> u64 {
        match self {
            Self::PartitionBridge | Self::PartitionRing => BRIDGE_RING_NODES_MIN,
            Self::Membership | Self::Combined | Self::RestartAfterIdle => {
                membership::VOTERS_MIN as u64
            }
            _ => 2,
        }
    }

    /// Whether the run must keep a spare slot (address) for new members.
    pub fn needs_spare_slot(self) -> bool {
        matches!(self, Self::Membership | Self::Combined)
    }

    /// Whether the members must run under libfaketime.
    pub fn needs_faketime(self) -> bool {
        matches!(self, Self::Clock | Self::Combined)
    }

    /// Whether the kvnode binary must be a `lazy-disk` build.
    pub fn needs_lazy_disk(self) -> bool {
        matches!(
            self,
            Self::PowerLoss | Self::PowerLossMinority | Self::PowerLossAll
        )
    }

    /// Whether the fault is a sequence that runs to its end when started
    /// (no hold): `restart-after-idle`.
    pub fn is_sequence(self) -> bool {
        matches!(self, Self::RestartAfterIdle)
    }

    /// How long the fault lasts, given the run's default hold.
    pub fn hold(self, hold: Duration) -> Duration {
        match self {
            Self::Pause | Self::PauseLeader => hold.max(PAUSE_HOLD_MIN),
            Self::PowerLoss | Self::PowerLossMinority | Self::PowerLossAll => {
                hold.min(power::POWER_OFF_HOLD)
            }
            _ => hold,
        }
    }
}

impl FromStr for Fault {
    type Err = String;

    fn from_str(name: &str) -> Result<Self, Self::Err> {
        // `partition-majority` is the tracker's name for the same fault.
        if name == "partition-majority" || name == "partition-minority" {
            return Ok(Self::PartitionHalf);
        }
        if name == "combined" || name == "all" {
            return Ok(Self::Combined);
        }
        ALL_FAULTS
            .into_iter()
            .find(|f| f.name() == name)
            .ok_or_else(|| {
                let names: Vec<_> = ALL_FAULTS.iter().map(|f| f.name()).collect();
                format!("unknown nemesis {name:?}; known: {}", names.join(", "))
            })
    }
}

/// The faults of a run, injected in this order (round robin).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FaultList(pub Vec<Fault>);

impl FaultList {
    /// Parses a comma-separated list of faults (`none` or empty = no fault).
    pub fn parse(list: &str) -> Result<Self, String> {
        list.split(',')
            .map(str::trim)
            .filter(|name| !name.is_empty() && *name != "none")
            .map(Fault::from_str)
            .collect::<Result<Vec<_>, _>>()
            .map(Self)
    }
}

/// What stopping the current fault must undo.
#[derive(Debug)]
enum Undo {
    Firewall,
    Restart(u64),
    Resume(u64),
    Clock(u64),
    RestartMany(Vec<u64>),
    /// The slot of the member the start added, and whether it was promoted.
    Membership(Option<(u64, bool)>),
    /// A sequence that ran to its end at the start; what it did.
    Sequence(String),
}

/// Timing of [`Nemesis::run_schedule`].
#[derive(Debug, Clone, Copy)]
pub struct Schedule {
    /// Default fault length (pauses last at least [`PAUSE_HOLD_MIN`]).
    pub hold: Duration,
    /// Calm before the first fault and after every heal.
    pub quiet: Duration,
    /// No fault may still be on (nor its quiet period running) after this.
    pub end: Instant,
}

/// Injects and heals faults on a cluster, recording each in the history.
#[derive(Debug)]
pub struct Nemesis {
    cluster: Cluster,
    firewall: Firewall,
    history: Arc<History>,
    rng: SmallRng,
    lookup: kvclient::Client,
    active: Option<(Fault, Undo)>,
    /// The workload's write gate (`restart-after-idle` closes it).
    gate: Arc<WriteGate>,
    /// `restart-after-idle`'s idle period.
    idle: Duration,
    /// The longest TTL the workload writes (the sequence's estimate).
    ttl_max: Duration,
    /// When a sequence must be over (the schedule's end less a quiet
    /// period).
    sequence_deadline: Option<Instant>,
    /// Saved votes a power cut took back or left unreadable ([`vote`]).
    durability: Vec<crate::durability::DurabilityAnomaly>,
    /// Slots whose member's removal was never confirmed (left running;
    /// the convergence check passes them over).
    unconfirmed_removals: Vec<u64>,
}

impl Nemesis {
    /// A nemesis over this cluster.
    pub fn new(
        cluster: Cluster,
        firewall: Firewall,
        history: Arc<History>,
        seed: u64,
    ) -> anyhow::Result<Self> {
        let lookup = kvclient::Client::builder(cluster.client_addrs())
            .connect_timeout(Duration::from_secs(1))
            .request_timeout(Duration::from_secs(1))
            .operation_timeout(LEADER_PROBE_TIMEOUT)
            .build()
            .context("building the nemesis's client")?;
        Ok(Self {
            cluster,
            firewall,
            history,
            rng: SmallRng::seed_from_u64(seed),
            lookup,
            active: None,
            gate: WriteGate::new(),
            idle: idle::IDLE_DEFAULT,
            ttl_max: crate::workload::ttl::TTL_MAX,
            sequence_deadline: None,
            durability: Vec::new(),
            unconfirmed_removals: Vec::new(),
        })
    }

    /// Connects the workload's write gate and sets `restart-after-idle`'s
    /// idle period and the workload's longest TTL.
    pub fn set_idle(&mut self, gate: Arc<WriteGate>, idle: Duration, ttl_max: Duration) {
        self.gate = gate;
        self.idle = idle;
        self.ttl_max = ttl_max;
    }

    /// How long `fault` is planned to last (a sequence: its estimate).
    fn planned(&self, fault: Fault, hold: Duration) -> Duration {
        if fault.is_sequence() {
            idle::estimate(self.idle, self.ttl_max)
        } else {
            fault.hold(hold)
        }
    }

    /// The cluster (to check on members).
    pub fn cluster_mut(&mut self) -> &mut Cluster {
        &mut self.cluster
    }

    /// Gives the cluster back (dropping it stops every member).
    pub fn into_cluster(self) -> Cluster {
        self.cluster
    }

    /// Faults in `faults`' order, round robin, each followed by a heal and
    /// a quiet period, until the schedule's end.
    pub async fn run_schedule(
        &mut self,
        faults: &[Fault],
        schedule: Schedule,
    ) -> anyhow::Result<()> {
        if faults.is_empty() {
            return Ok(());
        }
        tokio::time::sleep_until((Instant::now() + schedule.quiet).min(schedule.end)).await;
        for fault in faults.iter().cycle() {
            let hold = self.planned(*fault, schedule.hold);
            if Instant::now() + hold + schedule.quiet > schedule.end {
                break;
            }
            self.sequence_deadline = schedule.end.checked_sub(schedule.quiet);
            let started = self.start(*fault).await;
            if started.is_ok() && !fault.is_sequence() {
                // A slow leader lookup delays the start; the heal and its
                // quiet period must still fit before the end.
                let latest = schedule
                    .end
                    .checked_sub(schedule.quiet)
                    .unwrap_or(schedule.end);
                tokio::time::sleep_until((Instant::now() + hold).min(latest)).await;
            }
            let stopped = self.stop().await;
            started?;
            stopped?;
            tokio::time::sleep(schedule.quiet).await;
        }
        Ok(())
    }

    /// Injects one fault (none may be active).
    pub async fn start(&mut self, fault: Fault) -> anyhow::Result<()> {
        if let Some((active, _)) = &self.active {
            bail!("fault {} is still active", active.name());
        }
        let ids = self.cluster.ids();
        if (ids.len() as u64) < fault.nodes_min() {
            bail!(
                "nemesis {} needs at least {} members, the run has {}",
                fault.name(),
                fault.nodes_min(),
                ids.len()
            );
        }
        let (undo, detail) = match fault {
            Fault::PartitionLeader => self.isolate_leader(&ids).await?,
            Fault::PartitionHalf => self.partition_half(&ids)?,
            Fault::PartitionOneWay => self.partition_one_way(&ids).await?,
            Fault::PartitionBridge => self.partition_bridge(&ids)?,
            Fault::PartitionRing => self.partition_ring(&ids)?,
            Fault::Loss => self.drop_packets(&ids)?,
            Fault::Kill | Fault::KillLeader => {
                let (victim, how) = if fault == Fault::Kill {
                    (self.random_member(&ids), "random".to_string())
                } else {
                    self.leader_or_random().await
                };
                self.cluster.kill(victim)?;
                (
                    Undo::Restart(victim),
                    format!("SIGKILL member {victim} ({how})"),
                )
            }
            Fault::Pause | Fault::PauseLeader => {
                let (victim, how) = if fault == Fault::Pause {
                    (self.random_member(&ids), "random".to_string())
                } else {
                    self.leader_or_random().await
                };
                self.cluster.pause(victim)?;
                (
                    Undo::Resume(victim),
                    format!("SIGSTOP member {victim} ({how})"),
                )
            }
            Fault::Clock => {
                let victim = self.random_member(&ids);
                let offset = if self.rng.random_bool(0.5) {
                    CLOCK_JUMP_SECONDS
                } else {
                    -CLOCK_JUMP_SECONDS
                };
                self.cluster.set_clock_offset(victim, offset)?;
                (
                    Undo::Clock(victim),
                    format!("member {victim}'s wall clock {offset:+} s"),
                )
            }
            Fault::PartitionFollower => self.isolate_follower(&ids).await?,
            Fault::PowerLoss | Fault::PowerLossMinority | Fault::PowerLossAll => {
                self.power_cut(fault, &ids).await?
            }
            Fault::Membership => self.start_membership().await?,
            Fault::RestartAfterIdle => {
                self.begin_restart_after_idle(fault).await?;
                return Ok(());
            }
            Fault::Combined => bail!("`combined` must be expanded before the run"),
        };
        self.active = Some((fault, undo));
        self.history.nemesis(fault.name(), Phase::Start, detail)
    }

    /// `partition-leader`: the leader (or a random member) cut off from
    /// everyone.
    async fn isolate_leader(&mut self, ids: &[u64]) -> anyhow::Result<(Undo, String)> {
        let (leader, how) = self.leader_or_random().await;
        for &other in ids.iter().filter(|&&id| id != leader) {
            self.firewall.cut(leader, other)?;
            self.firewall.cut(other, leader)?;
        }
        Ok((Undo::Firewall, format!("isolated member {leader} ({how})")))
    }

    /// `partition-half`: a random minority cut off from the majority.
    fn partition_half(&mut self, ids: &[u64]) -> anyhow::Result<(Undo, String)> {
        let mut shuffled = ids.to_vec();
        shuffled.shuffle(&mut self.rng);
        let (minority, majority) = shuffled.split_at(ids.len() / 2);
        self.cut_between(minority, majority)?;
        Ok((
            Undo::Firewall,
            format!("minority {minority:?} | majority {majority:?}"),
        ))
    }

    /// `partition-one-way`: the leader's packets to the others dropped.
    async fn partition_one_way(&mut self, ids: &[u64]) -> anyhow::Result<(Undo, String)> {
        let (leader, how) = self.leader_or_random().await;
        for &other in ids.iter().filter(|&&id| id != leader) {
            self.firewall.cut(leader, other)?;
        }
        Ok((
            Undo::Firewall,
            format!("packets from member {leader} ({how}) to the others dropped"),
        ))
    }

    /// `partition-bridge`: two halves joined only through one member.
    fn partition_bridge(&mut self, ids: &[u64]) -> anyhow::Result<(Undo, String)> {
        let mut shuffled = ids.to_vec();
        shuffled.shuffle(&mut self.rng);
        let half = ids.len() / 2;
        let (left, rest) = shuffled.split_at(half);
        let (bridge, right) = rest.split_at(1);
        self.cut_between(left, right)?;
        Ok((
            Undo::Firewall,
            format!("{left:?} | bridge {bridge:?} | {right:?}"),
        ))
    }

    /// `partition-ring`: each member sees only its two ring neighbours.
    fn partition_ring(&mut self, ids: &[u64]) -> anyhow::Result<(Undo, String)> {
        let mut ring = ids.to_vec();
        ring.shuffle(&mut self.rng);
        let n = ring.len();
        for i in 0..n {
            for j in 0..n {
                let adjacent = (i + 1) % n == j || (j + 1) % n == i;
                if i != j && !adjacent {
                    self.firewall.cut(ring[i], ring[j])?;
                }
            }
        }
        Ok((Undo::Firewall, format!("ring {ring:?} (neighbours only)")))
    }

    /// `loss`: a share of the packets between every two members dropped.
    fn drop_packets(&mut self, ids: &[u64]) -> anyhow::Result<(Undo, String)> {
        for &a in ids {
            for &b in ids.iter().filter(|&&b| b != a) {
                self.firewall.lossy(a, b, LOSS_PROBABILITY)?;
            }
        }
        Ok((
            Undo::Firewall,
            format!("{LOSS_PROBABILITY} of packets dropped between every two members"),
        ))
    }

    /// `partition-follower`: one member that is not the leader cut off
    /// from everyone.
    async fn isolate_follower(&mut self, ids: &[u64]) -> anyhow::Result<(Undo, String)> {
        let (leader, how) = self.leader_or_random().await;
        let followers: Vec<u64> = ids.iter().copied().filter(|&id| id != leader).collect();
        let victim = self.random_member(&followers);
        for &other in ids.iter().filter(|&&id| id != victim) {
            self.firewall.cut(victim, other)?;
            self.firewall.cut(other, victim)?;
        }
        Ok((
            Undo::Firewall,
            format!("isolated member {victim} (not the {how} {leader})"),
        ))
    }

    /// `restart-after-idle`: opens its window, runs the sequence and
    /// leaves it active (its steps are recorded inside the window).
    async fn begin_restart_after_idle(&mut self, fault: Fault) -> anyhow::Result<()> {
        // The window opens before the sequence runs: its steps are
        // recorded inside it.
        self.history.nemesis(
            fault.name(),
            Phase::Start,
            format!(
                "writes stopped; idle {} s after the last TTL key",
                self.idle.as_secs()
            ),
        )?;
        let deadline = self
            .sequence_deadline
            .unwrap_or_else(|| Instant::now() + idle::estimate(self.idle, self.ttl_max));
        let detail = self.restart_after_idle(deadline).await;
        self.active = Some((fault, Undo::Sequence(detail)));
        Ok(())
    }

    /// Heals the active fault, if any.
    pub async fn stop(&mut self) -> anyhow::Result<()> {
        let Some((fault, undo)) = self.active.take() else {
            return Ok(());
        };
        let detail = match undo {
            Undo::Firewall => {
                self.firewall.heal()?;
                "every link restored".to_string()
            }
            Undo::Restart(id) => {
                self.cluster.restart(id)?;
                format!("member {id} restarted")
            }
            Undo::Resume(id) => {
                self.cluster.resume(id)?;
                format!("SIGCONT member {id}")
            }
            Undo::Clock(id) => {
                self.cluster.set_clock_offset(id, 0)?;
                format!("member {id}'s wall clock back")
            }
            Undo::RestartMany(ids) => {
                for &id in &ids {
                    self.cluster.restart(id)?;
                }
                format!("members {ids:?} powered on")
            }
            Undo::Membership(added) => self.stop_membership(added).await?,
            Undo::Sequence(detail) => detail,
        };
        self.history.nemesis(fault.name(), Phase::Stop, detail)
    }

    /// Saved votes that power cuts took back or left unreadable.
    pub fn durability_anomalies(&self) -> &[crate::durability::DurabilityAnomaly] {
        &self.durability
    }

    /// Slots whose member's removal was never confirmed (the removal may
    /// have happened: such a member need not keep up).
    pub fn unconfirmed_removals(&self) -> &[u64] {
        &self.unconfirmed_removals
    }

    /// Heals everything, whatever state a failure left behind.
    pub async fn heal_all(&mut self) -> anyhow::Result<()> {
        let stopped = self.stop().await;
        self.firewall.heal()?;
        self.cluster.heal_processes()?;
        stopped
    }

    fn cut_between(&self, a: &[u64], b: &[u64]) -> anyhow::Result<()> {
        for &x in a {
            for &y in b {
                self.firewall.cut(x, y)?;
                self.firewall.cut(y, x)?;
            }
        }
        Ok(())
    }

    fn random_member(&mut self, ids: &[u64]) -> u64 {
        ids[self.rng.random_range(0..ids.len())]
    }

    /// The current leader, or a random member if none is known in time;
    /// with a word saying which. Asks again (bounded) while the cluster is
    /// between leaders, e.g. just after a heal.
    async fn leader_or_random(&mut self) -> (u64, String) {
        let started = Instant::now();
        while started.elapsed() < LEADER_LOOKUP_TIMEOUT {
            let found =
                tokio::time::timeout(LEADER_PROBE_TIMEOUT, self.lookup.discover_leader()).await;
            if let Ok(Ok(Some(addr))) = found
                && let Some(id) = self.cluster.id_of_client_addr(&addr)
                && self.cluster.is_running(id)
            {
                return (id, "leader".to_string());
            }
            tokio::time::sleep(LEADER_PROBE_PAUSE).await;
        }
        let ids = self.cluster.ids();
        (
            self.random_member(&ids),
            "no leader known: random".to_string(),
        )
    }
}
