//! `restart-after-idle`: the sequence that moves leadership between a
//! member that ran through an idle period and members restarted after it
//! (issue 15: a member's cluster clock that carried an idle period jumped
//! cluster time forward by that period when it became leader after a
//! restarted member, so TTL keys expired early).
//!
//! 1. The workload's writes stop (the [`WriteGate`] closes); the nemesis
//!    waits until no write is in flight, every TTL key the workload wrote
//!    has passed its TTL, and a linearizable scan of the TTL keys finds
//!    none (so the leader's tick loop has nothing left to expire and no
//!    entry is proposed: cluster time stands still).
//! 2. Idle for the run's idle period (`jepsen run --idle`, default
//!    [`IDLE_DEFAULT`]): no write, no tick.
//! 3. The survivor is the leader of the moment (or, with none known, a
//!    random member): it runs on. Every other member is restarted, one at
//!    a time (SIGKILL and start at once; `idle-restart`), each waited for.
//! 4. If the survivor still leads, it is stopped (SIGSTOP,
//!    `idle-pause`) until a restarted member leads, then continued.
//! 5. Writes resume under the restarted leader for [`WRITE_PHASE`] (TTL
//!    keys are stamped by its clock).
//! 6. The other restarted members are cut off from everyone
//!    (`idle-isolate`) until the survivor has applied an entry past the
//!    end of their logs; then the leader is killed (`idle-kill-leader`),
//!    the links are restored, and the leader is restarted once another
//!    member leads. Only the survivor can: the others' logs are behind its
//!    own. (openraft 0.9 draws a member's election timeout once per
//!    process; without the cut, a survivor that drew a long one lost every
//!    election to the freshly restarted members.) Repeated (at most
//!    [`KILL_ROUNDS_MAX`] times) until the survivor leads.
//!    With the bug, its first stamp jumps cluster time forward by the idle
//!    period, and every key written under the restarted leaders with a TTL
//!    shorter than that period is observed expired at once (early expiry).
//! 7. [`HOLD_AFTER`] for the reads to look.
//!
//! Each step is recorded as a fault of its own inside the
//! `restart-after-idle` window; the TTL checker counts the steps' windows
//! (plus its election allowance) as leaderless, not the outer one.

use std::time::Duration;

use anyhow::Context as _;
use kvclient::{Consistency, Scan};
use rand::Rng as _;
use tokio::time::Instant;

use super::Nemesis;
use crate::control::cluster::client_addr;
use crate::workload::{Phase, own_status};

/// Default idle period (no write, no tick) before the rolling restarts.
/// Longer than the suite's longest TTL ([`crate::suite::TTL_LEADER_CHANGE_TTL_MAX`]),
/// so the old clock's jump expires every key alive at the switch.
pub const IDLE_DEFAULT: Duration = Duration::from_secs(15);
/// Writes under a restarted leader before the leader kills start.
pub const WRITE_PHASE: Duration = Duration::from_secs(3);
/// Leader kills at most, waiting for the survivor to lead.
pub const KILL_ROUNDS_MAX: u32 = 6;
/// Time the survivor's log may take to pass the isolated members' (step
/// 6a; the writes go on meanwhile).
const ISOLATE_TIMEOUT: Duration = Duration::from_secs(10);
/// Wait after the cut before the isolated members' logs are read (what
/// was already on its way to them arrives).
const ISOLATE_SETTLE: Duration = Duration::from_millis(500);
/// Pause after each restart and each leader change (writes go on).
const STEP_PAUSE: Duration = Duration::from_secs(1);
/// Time a restarted member may take to answer again.
const BACK_TIMEOUT: Duration = Duration::from_secs(15);
/// Time an election may take before the step gives up.
const ELECTION_TIMEOUT: Duration = Duration::from_secs(12);
/// Time the in-flight writes and the TTL keys may take to be gone.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(60);
/// Pause between two probes (leader, TTL keys, member back).
const PROBE_PAUSE: Duration = Duration::from_millis(250);
/// Time one status probe of one member may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);
/// Time after the survivor took over during which the reads look.
pub const HOLD_AFTER: Duration = Duration::from_secs(3);
/// Pauses of the survivor at most (step 4).
const PAUSES_MAX: u32 = 3;
/// Margin beyond the last TTL before the keys are checked gone (two
/// kvnode ticks).
const TTL_MARGIN: Duration = Duration::from_millis(500);

/// A rough length of the whole sequence (the schedule starts it only when
/// this, and a quiet period, fit before the end): the TTL wait, the idle
/// period, two restarts, a pause, the write phase, two leader kills.
pub fn estimate(idle: Duration, ttl_max: Duration) -> Duration {
    ttl_max + idle + Duration::from_secs(35)
}

impl Nemesis {
    /// Runs the sequence (steps 1–7) and returns what happened. Whatever
    /// fails, the writes resume and every process runs again.
    pub(super) async fn restart_after_idle(&mut self, deadline: Instant) -> String {
        let result = self.idle_sequence(deadline).await;
        self.gate.set_closed(false);
        // A step that failed may have left step 6a's cut in place.
        let links = self.firewall.heal();
        let healed = self.cluster.heal_processes().and(links);
        let mut detail = match result {
            Ok(detail) => detail,
            Err(err) => format!("sequence stopped: {err:#}"),
        };
        if let Err(err) = healed {
            detail.push_str(&format!("; healing processes failed: {err:#}"));
        }
        detail
    }

    async fn idle_sequence(&mut self, deadline: Instant) -> anyhow::Result<String> {
        let mut log = Vec::new();
        // 1. Writes stop; wait for the TTL keys to be gone.
        self.gate.set_closed(true);
        let drained = Instant::now() + DRAIN_TIMEOUT;
        while self.gate.writes_in_flight() > 0 && Instant::now() < drained {
            tokio::time::sleep(PROBE_PAUSE).await;
        }
        tokio::time::sleep(self.gate.ttl_horizon_left() + TTL_MARGIN).await;
        let scan = Scan::prefix(crate::workload::ttl::PREFIX)
            .keys_only()
            .page_size(1)
            .consistency(Consistency::Linearizable);
        loop {
            match self.lookup.scan_page(&scan, None).await {
                Ok(page) if page.entries.is_empty() => break,
                Ok(_) | Err(_) if Instant::now() > drained => {
                    anyhow::bail!("TTL keys still present (or unreadable) after the drain timeout")
                }
                _ => tokio::time::sleep(PROBE_PAUSE).await,
            }
        }
        let waited = self.idle.as_secs_f64();
        log.push(format!("no TTL key left; idle {waited:.0} s"));
        // 2. Idle.
        tokio::time::sleep_until((Instant::now() + self.idle).min(deadline)).await;
        // 3. The survivor; rolling restarts of the others.
        let ids = self.cluster.ids();
        let survivor = match self.confirmed_leader(None).await {
            Some(leader) => leader,
            None => ids[self.rng.random_range(0..ids.len())],
        };
        log.push(format!("survivor member {survivor}"));
        for &member in ids.iter().filter(|&&id| id != survivor) {
            self.history.nemesis(
                "idle-restart",
                Phase::Start,
                format!("SIGKILL member {member}, started again at once"),
            )?;
            let back = self.restart_now(member).await;
            self.history.nemesis(
                "idle-restart",
                Phase::Stop,
                match &back {
                    Ok(()) => format!("member {member} answers again"),
                    Err(err) => format!("member {member}: {err:#}"),
                },
            )?;
            back?;
            tokio::time::sleep(STEP_PAUSE).await;
        }
        let restarted: Vec<u64> = ids.iter().copied().filter(|&id| id != survivor).collect();
        log.push(format!("restarted {restarted:?}"));
        // 4. A restarted member must lead.
        let mut leader = self.confirmed_leader(None).await;
        let mut pauses = 0;
        while leader == Some(survivor) && pauses < PAUSES_MAX && Instant::now() < deadline {
            pauses += 1;
            self.history.nemesis(
                "idle-pause",
                Phase::Start,
                format!("SIGSTOP member {survivor} (the survivor leads) until another leads"),
            )?;
            self.cluster.pause(survivor)?;
            let other = self.confirmed_leader(Some(survivor)).await;
            self.cluster.resume(survivor)?;
            self.history.nemesis(
                "idle-pause",
                Phase::Stop,
                format!("SIGCONT member {survivor}; leader {other:?}"),
            )?;
            tokio::time::sleep(STEP_PAUSE).await;
            leader = self.confirmed_leader(None).await;
        }
        log.push(format!("leader after the restarts: {leader:?}"));
        // 5. Writes resume under it.
        self.gate.set_closed(false);
        tokio::time::sleep_until((Instant::now() + WRITE_PHASE).min(deadline)).await;
        // 6. Kill leaders until the survivor leads.
        let mut leaders = vec![leader];
        let mut survivor_leads = false;
        for _ in 0..KILL_ROUNDS_MAX {
            let Some(current) = self.confirmed_leader(None).await else {
                break;
            };
            if current == survivor {
                survivor_leads = true;
                break;
            }
            if Instant::now() + ISOLATE_TIMEOUT + ELECTION_TIMEOUT > deadline {
                break;
            }
            let others: Vec<u64> = ids
                .iter()
                .copied()
                .filter(|&id| id != current && id != survivor)
                .collect();
            let isolated = self.survivor_log_ahead(survivor, &others).await?;
            self.history.nemesis(
                "idle-kill-leader",
                Phase::Start,
                format!("SIGKILL member {current} (leader, restarted); {isolated}"),
            )?;
            self.cluster.kill(current)?;
            let healed = self.firewall.heal();
            self.history.nemesis(
                "idle-isolate",
                Phase::Stop,
                format!("members {others:?} reconnected"),
            )?;
            healed?;
            let next = self.confirmed_leader(Some(current)).await;
            let restarted = self.cluster.restart(current);
            self.history.nemesis(
                "idle-kill-leader",
                Phase::Stop,
                format!("member {current} restarted; leader {next:?}"),
            )?;
            restarted?;
            leaders.push(next);
            tokio::time::sleep(STEP_PAUSE).await;
        }
        log.push(format!(
            "leaders {leaders:?}; the survivor leads: {}",
            if survivor_leads { "yes" } else { "NO" }
        ));
        // 7. Let the reads look.
        tokio::time::sleep_until((Instant::now() + HOLD_AFTER).min(deadline)).await;
        Ok(log.join("; "))
    }

    /// Step 6a: cuts `others` off from everyone (the writes go on) until
    /// the survivor has applied an entry past the end of every one of
    /// their logs. With the leader killed next, they cannot be elected
    /// (their logs are behind the survivor's, which refuses them) and they
    /// vote for the survivor once it asks: the survivor leads, whatever
    /// election timeouts the processes drew. openraft 0.9 draws a member's
    /// timeout once per process, so without this a survivor that drew a
    /// long one could lose every election to freshly restarted members.
    /// Returns what it saw; the links stay cut until the caller heals them.
    async fn survivor_log_ahead(
        &mut self,
        survivor: u64,
        others: &[u64],
    ) -> anyhow::Result<String> {
        self.history.nemesis(
            "idle-isolate",
            Phase::Start,
            format!("members {others:?} cut off from everyone until member {survivor}'s log passes theirs"),
        )?;
        let ids = self.cluster.ids();
        for &other in others {
            for &id in ids.iter().filter(|&&id| id != other) {
                self.firewall.cut(other, id)?;
                self.firewall.cut(id, other)?;
            }
        }
        // Whatever was on its way to them has arrived by now.
        tokio::time::sleep(ISOLATE_SETTLE).await;
        let mut their_last = 0;
        for &other in others {
            match own_status(&client_addr(other)).await {
                Some(row) => their_last = their_last.max(row.last_log_index.unwrap_or(0)),
                None => return Ok(format!("member {other}'s last log index unknown")),
            }
        }
        let until = Instant::now() + ISOLATE_TIMEOUT;
        let mut applied = 0;
        while Instant::now() < until {
            if let Some(row) = own_status(&client_addr(survivor)).await {
                applied = row.applied_index.unwrap_or(0);
                if applied > their_last {
                    return Ok(format!(
                        "member {survivor} applied {applied}, past {others:?}'s last log index {their_last}"
                    ));
                }
            }
            tokio::time::sleep(PROBE_PAUSE).await;
        }
        Ok(format!(
            "member {survivor} applied only {applied} of {others:?}'s last log index {their_last} in {} s",
            ISOLATE_TIMEOUT.as_secs()
        ))
    }

    /// SIGKILLs `member`, starts it again at once, waits until it answers.
    async fn restart_now(&mut self, member: u64) -> anyhow::Result<()> {
        self.cluster.kill(member)?;
        self.cluster.restart(member)?;
        let client = member_client(member)?;
        let until = Instant::now() + BACK_TIMEOUT;
        while Instant::now() < until {
            if let Ok(Ok(_)) = tokio::time::timeout(PROBE_TIMEOUT, client.status()).await {
                return Ok(());
            }
            tokio::time::sleep(PROBE_PAUSE).await;
        }
        anyhow::bail!("no answer within {} s", BACK_TIMEOUT.as_secs())
    }

    /// The leader (a slot) as the members report it: a running member that
    /// names itself leader, and, with more than one member answering, is
    /// named by another too; the highest term wins. Waits (up to
    /// [`ELECTION_TIMEOUT`]) for one other than `not`.
    pub(super) async fn confirmed_leader(&mut self, not: Option<u64>) -> Option<u64> {
        let until = Instant::now() + ELECTION_TIMEOUT;
        while Instant::now() < until {
            let mut claims = Vec::new();
            let mut named = Vec::new();
            for slot in self.cluster.ids() {
                if !self.cluster.is_running(slot) || Some(slot) == not {
                    continue;
                }
                let Ok(client) = member_client(slot) else {
                    continue;
                };
                let Ok(Ok(status)) = tokio::time::timeout(PROBE_TIMEOUT, client.status()).await
                else {
                    continue;
                };
                let Some(header) = status.header else {
                    continue;
                };
                named.push(header.leader_id);
                if header.leader_id != 0 && header.leader_id == header.member_id {
                    claims.push((header.raft_term, header.member_id));
                }
            }
            claims.sort_unstable();
            if let Some(&(_, raft_id)) = claims.last()
                && (named.len() < 2 || named.iter().filter(|&&l| l == raft_id).count() >= 2)
                && let Some(slot) = self
                    .cluster
                    .ids()
                    .into_iter()
                    .find(|&s| self.cluster.raft_id(s) == Some(raft_id))
                && Some(slot) != not
            {
                return Some(slot);
            }
            tokio::time::sleep(PROBE_PAUSE).await;
        }
        None
    }
}

/// A client of one member alone (status probes).
fn member_client(slot: u64) -> anyhow::Result<kvclient::Client> {
    kvclient::Client::builder([client_addr(slot)])
        .connect_timeout(PROBE_TIMEOUT)
        .request_timeout(PROBE_TIMEOUT)
        .operation_timeout(PROBE_TIMEOUT)
        .build()
        .context("building a member's status client")
}
