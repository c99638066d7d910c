//! The `membership` nemesis: the cluster's voters rotate while the workload
//! runs, always keeping at least [`VOTERS_MIN`] voters.
//!
//! - Start: a fresh `kvnode` process in the spare slot (a NEW member id and
//!   an empty data directory: kvnode refuses an old id again), added as a
//!   learner (the leader waits until it caught up, by snapshot if needed)
//!   and promoted to voter — one voter more than before.
//! - Stop: one voter removed — the leader on half of the stops (it steps
//!   down once the change commits), a random member otherwise — and its
//!   process stopped; its slot becomes the spare for the next round. When
//!   the start could not promote, the stop removes the new member instead,
//!   so the voter count never drops below what the run started with.
//!
//! Every step goes through kvclient's membership API (`add_learner`,
//! `promote`, `remove_member`, `members`), as `kvctl member` does. A step
//! that fails is retried within its bound and reported in the fault's
//! detail; the run's checks then judge whether the cluster kept serving.

use std::time::Duration;

use anyhow::Context as _;
use rand::Rng as _;
use tokio::time::Instant;

use super::{Nemesis, Undo};
use crate::control::cluster::client_addr;

/// Voters the cluster keeps at least: a removal that would leave fewer is
/// not made.
pub const VOTERS_MIN: usize = 3;
/// Time one membership call may take in all (a learner's catch-up
/// included).
pub const MEMBERSHIP_CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// Time one attempt of a membership call may take.
const MEMBERSHIP_ATTEMPT_TIMEOUT: Duration = Duration::from_secs(10);
/// Attempts of each step (a leader change answers the first with an
/// error; the next goes to the new leader).
pub const MEMBERSHIP_STEP_ATTEMPTS: u32 = 5;
/// Pause between two attempts of a step.
const MEMBERSHIP_RETRY_PAUSE: Duration = Duration::from_millis(500);

impl Nemesis {
    /// A client for membership calls (long timeouts: catch-up).
    fn membership_client(&self) -> anyhow::Result<kvclient::Client> {
        kvclient::Client::builder(self.cluster.client_addrs())
            .connect_timeout(Duration::from_secs(1))
            .request_timeout(MEMBERSHIP_ATTEMPT_TIMEOUT)
            .operation_timeout(MEMBERSHIP_CALL_TIMEOUT)
            .build()
            .context("building the membership client")
    }

    /// The voters' and learners' kvnode ids, as the cluster reports them.
    async fn voters_and_learners(
        client: &kvclient::Client,
    ) -> anyhow::Result<(Vec<u64>, Vec<u64>)> {
        let members = client.members().await.context("listing the members")?;
        let voters = members.iter().filter(|m| m.voter).map(|m| m.id).collect();
        let learners = members.iter().filter(|m| !m.voter).map(|m| m.id).collect();
        Ok((voters, learners))
    }

    /// Starts a new member in the spare slot, adds it as a learner and
    /// promotes it. Returns what the stop must undo and the detail.
    pub(super) async fn start_membership(&mut self) -> anyhow::Result<(Undo, String)> {
        let Some(slot) = self.cluster.spare_slot() else {
            // An earlier removal failed: every slot is taken.
            return Ok((
                Undo::Membership(None),
                "no spare slot (an earlier removal failed): nothing changed".to_string(),
            ));
        };
        let raft_id = self.cluster.start_in_slot(slot)?;
        let client = self.membership_client()?;
        let (client_at, peer_at) = (client_addr(slot), self.cluster.advertised_peer_addr(slot));
        let mut last = String::new();
        let mut added = false;
        for _ in 0..MEMBERSHIP_STEP_ATTEMPTS {
            match client
                .add_learner(raft_id, &client_at, &peer_at, true)
                .await
            {
                Ok(_) => {
                    added = true;
                    break;
                }
                Err(err) => last = err.to_string(),
            }
            tokio::time::sleep(MEMBERSHIP_RETRY_PAUSE).await;
        }
        if !added {
            self.cluster.retire(slot)?;
            return Ok((
                Undo::Membership(None),
                format!("member {raft_id} (slot {slot}) NOT added as a learner: {last}"),
            ));
        }
        let mut promoted = false;
        for _ in 0..MEMBERSHIP_STEP_ATTEMPTS {
            match client.promote(raft_id).await {
                Ok(_) => {
                    promoted = true;
                    break;
                }
                Err(err) => last = err.to_string(),
            }
            tokio::time::sleep(MEMBERSHIP_RETRY_PAUSE).await;
        }
        let detail = if promoted {
            format!("member {raft_id} started in slot {slot}, added as a learner, promoted")
        } else {
            format!(
                "member {raft_id} started in slot {slot}, added as a learner, NOT promoted: {last}"
            )
        };
        Ok((Undo::Membership(Some((slot, promoted))), detail))
    }

    /// Removes one voter (the leader on half of the stops) and stops its
    /// process; or, when the start did not promote, the new member.
    pub(super) async fn stop_membership(
        &mut self,
        added: Option<(u64, bool)>,
    ) -> anyhow::Result<String> {
        let Some((added_slot, promoted)) = added else {
            return Ok("nothing to undo".to_string());
        };
        let client = self.membership_client()?;
        let (victim, how) = if !promoted {
            (added_slot, "the member that was not promoted".to_string())
        } else if self.rng.random_bool(0.5) {
            self.leader_or_random().await
        } else {
            let ids = self.cluster.ids();
            (self.random_member(&ids), "random".to_string())
        };
        let raft_id = self
            .cluster
            .raft_id(victim)
            .with_context(|| format!("slot {victim} hosts no member"))?;
        let (voters, _) = Self::voters_and_learners(&client).await?;
        if promoted && voters.len() <= VOTERS_MIN {
            return Ok(format!(
                "no member removed: only {} voters ({voters:?}), VOTERS_MIN is {VOTERS_MIN}",
                voters.len()
            ));
        }
        let started = Instant::now();
        let mut last = String::new();
        let mut removed = false;
        for _ in 0..MEMBERSHIP_STEP_ATTEMPTS {
            match client.remove_member(raft_id).await {
                Ok(_) => {
                    removed = true;
                    break;
                }
                Err(err) => last = err.to_string(),
            }
            // A leader that removed itself may have cut the answer off:
            // the membership says whether it happened.
            if let Ok((voters, learners)) = Self::voters_and_learners(&client).await
                && !voters.contains(&raft_id)
                && !learners.contains(&raft_id)
            {
                removed = true;
                break;
            }
            tokio::time::sleep(MEMBERSHIP_RETRY_PAUSE).await;
        }
        if !removed {
            self.unconfirmed_removals.push(victim);
            return Ok(format!(
                "member {raft_id} (slot {victim}, {how}) NOT removed after {:.1} s: {last}",
                started.elapsed().as_secs_f64()
            ));
        }
        self.cluster.retire(victim)?;
        Ok(format!(
            "member {raft_id} (slot {victim}, {how}) removed and stopped; slot {victim} is spare"
        ))
    }
}
