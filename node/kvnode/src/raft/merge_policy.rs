//! Background policies of a member that keep its files in shape: the
//! leader's merge policy and the snapshot-by-bytes trigger.
//!
//! Merges are decided through Raft (DESIGN §3): only the leader looks at
//! its engine's dead bytes, and when the sealed files hold enough of them it
//! proposes a `Command::Merge` entry naming its sealed data files (a prefix
//! of the sealed sequence that includes every earlier merge output). Every
//! replica captures the live records of those inputs while applying the
//! entry and runs the engine's deterministic merge in the background, so the
//! replicas' files stay identical. At most one merge proposed by this
//! leader is in flight: the next is proposed only once the engine's sealed
//! files no longer start with the last one's first input (the merge
//! finished) or [`MERGE_IN_FLIGHT_MAX`] has passed.
//!
//! Snapshots: openraft builds one every `snapshot_every_entries` applied
//! entries (`SnapshotPolicy::LogsSinceLast`); on top of that every member
//! asks openraft for one when its engine holds
//! [`SnapshotPolicy::every_bytes`] of file bytes the current snapshot does
//! not (growth of the active segment, new segments, merge output). openraft
//! purges the log after each snapshot, keeping `snapshot_log_keep` entries.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bitcask::Stats;
use tokio::sync::watch;

use crate::raft::types::NodeRaft;
use crate::raft::watch::MetricsWatch;
use crate::state_machine::StateMachine;

/// How often the leader looks at its engine's dead bytes.
pub const MERGE_CHECK_INTERVAL: Duration = Duration::from_secs(1);
/// Default of [`MergePolicy::dead_ratio_min`]: merge when half of the sealed
/// files' bytes are dead (the engine's own default).
pub const MERGE_DEAD_RATIO_MIN_DEFAULT: f64 = 0.5;
/// Default of [`MergePolicy::dead_bytes_min`]: ... and at least this many
/// bytes are dead, so small stores are not rewritten for nothing.
pub const MERGE_DEAD_BYTES_MIN_DEFAULT: u64 = 64 * 1024 * 1024;
/// How long one proposed merge may stay unfinished before the policy
/// proposes again (a merge that failed on this member leaves its inputs in
/// place).
pub const MERGE_IN_FLIGHT_MAX: Duration = Duration::from_secs(10 * 60);

/// How often a member compares its engine with its current snapshot.
pub const SNAPSHOT_CHECK_INTERVAL: Duration = Duration::from_secs(1);
/// Default of [`SnapshotPolicy::every_entries`] (openraft's own default).
pub const SNAPSHOT_EVERY_ENTRIES_DEFAULT: u64 = 5000;
/// Default of [`SnapshotPolicy::every_bytes`].
pub const SNAPSHOT_EVERY_BYTES_DEFAULT: u64 = 256 * 1024 * 1024;
/// How long a requested snapshot may take before it is requested again.
pub const SNAPSHOT_REQUEST_WAIT: Duration = Duration::from_secs(60);

/// When the leader proposes a merge.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MergePolicy {
    /// Off: this member never proposes a merge (tests that need files
    /// untouched by merges turn it off).
    pub enabled: bool,
    /// Merge when dead bytes / total bytes of the sealed files reach this.
    pub dead_ratio_min: f64,
    /// ... and the sealed files' dead bytes are at least this many.
    pub dead_bytes_min: u64,
    /// How often the leader looks.
    pub check_interval: Duration,
}

impl Default for MergePolicy {
    fn default() -> Self {
        MergePolicy {
            enabled: true,
            dead_ratio_min: MERGE_DEAD_RATIO_MIN_DEFAULT,
            dead_bytes_min: MERGE_DEAD_BYTES_MIN_DEFAULT,
            check_interval: MERGE_CHECK_INTERVAL,
        }
    }
}

/// When a member snapshots.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SnapshotPolicy {
    /// Snapshot after this many entries since the last one; 0 = never by
    /// entries (`--snapshot-every-entries`).
    pub every_entries: u64,
    /// Snapshot when the engine holds this many file bytes the current
    /// snapshot does not; 0 = never by bytes (`--snapshot-every-bytes`).
    pub every_bytes: u64,
}

impl Default for SnapshotPolicy {
    fn default() -> Self {
        SnapshotPolicy {
            every_entries: SNAPSHOT_EVERY_ENTRIES_DEFAULT,
            every_bytes: SNAPSHOT_EVERY_BYTES_DEFAULT,
        }
    }
}

impl SnapshotPolicy {
    /// openraft's policy for the entries trigger.
    pub fn openraft(&self) -> openraft::SnapshotPolicy {
        match self.every_entries {
            0 => openraft::SnapshotPolicy::Never,
            n => openraft::SnapshotPolicy::LogsSinceLast(n),
        }
    }
}

/// The merge the policy would propose now: every sealed data file, when
/// the sealed files' dead bytes pass both thresholds; `None` otherwise.
/// `kept_bytes` of the dead bytes are change history a merge keeps (the
/// engine counts superseded records as dead whether or not a merge may drop
/// them): they do not count, or the policy would propose a merge that frees
/// nothing, again and again.
pub fn merge_inputs(stats: &Stats, policy: &MergePolicy, kept_bytes: u64) -> Option<Vec<String>> {
    let sealed: Vec<_> = stats.files.iter().filter(|f| f.sealed).collect();
    let total: u64 = sealed.iter().map(|f| f.total_bytes).sum();
    let dead: u64 = sealed
        .iter()
        .map(|f| f.dead_bytes)
        .sum::<u64>()
        .saturating_sub(kept_bytes);
    if sealed.is_empty() || dead < policy.dead_bytes_min || total == 0 {
        return None;
    }
    if (dead as f64) < policy.dead_ratio_min * total as f64 {
        return None;
    }
    Some(sealed.iter().map(|f| f.name.clone()).collect())
}

/// Proposes a merge entry naming these inputs (through `client_write` with
/// the leader's cluster-time stamp); `Err` says why it was not applied.
pub type ProposeMerge = Arc<
    dyn Fn(Vec<String>) -> Pin<Box<dyn Future<Output = Result<(), String>> + Send>> + Send + Sync,
>;

/// The leader's merge loop: runs on every member, acts only while this
/// member leads.
pub async fn merge_loop(
    id: u64,
    policy: MergePolicy,
    raft: NodeRaft,
    state_machine: StateMachine,
    propose: ProposeMerge,
    mut stop: watch::Receiver<bool>,
) {
    if !policy.enabled {
        return;
    }
    let mut interval = tokio::time::interval(policy.check_interval);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The first input of the merge in flight, when it was proposed, and the
    // engine's merge count then.
    let mut in_flight: Option<(String, Instant, u64)> = None;
    loop {
        tokio::select! {
            _ = interval.tick() => {}
            _ = stop.wait_for(|s| *s) => return,
        }
        let leader = raft.metrics().borrow().current_leader;
        if leader != Some(id) {
            in_flight = None;
            continue;
        }
        let engine = state_machine.engine();
        let stats = engine.stats();
        if let Some((first, at, merges)) = &in_flight {
            let sealed = engine.sealed_data_files();
            let running = sealed.first() == Some(first)
                && stats.merges == *merges
                && at.elapsed() < MERGE_IN_FLIGHT_MAX;
            if running {
                continue;
            }
            in_flight = None;
        }
        // The history's in-window records (live ones too: an over-count
        // that only delays a merge, by at most the window's bytes).
        let kept_bytes = state_machine
            .history()
            .try_read()
            .map_or(u64::MAX, |history| history.records().1);
        let Some(inputs) = merge_inputs(&stats, &policy, kept_bytes) else {
            continue;
        };
        let first = inputs[0].clone();
        let count = inputs.len();
        let proposed_at = Instant::now();
        let merges_before = stats.merges;
        match propose(inputs).await {
            Ok(()) => {
                tracing::info!(
                    id,
                    first = %first,
                    inputs = count,
                    dead_bytes = stats.dead_bytes,
                    "merge proposed"
                );
                in_flight = Some((first, proposed_at, merges_before));
            }
            Err(err) => tracing::debug!(id, error = %err, "merge not proposed"),
        }
    }
}

/// Engine file bytes the current snapshot does not hold: each data file's
/// length beyond what the snapshot lists of it (all of it when unlisted).
pub fn bytes_since_snapshot(stats: &Stats, snapshot_files: &BTreeMap<String, u64>) -> u64 {
    stats
        .files
        .iter()
        .map(|f| {
            f.total_bytes
                .saturating_sub(snapshot_files.get(&f.name).copied().unwrap_or(0))
        })
        .sum()
}

/// The snapshot-by-bytes loop of one member.
pub async fn snapshot_bytes_loop(
    id: u64,
    every_bytes: u64,
    raft: NodeRaft,
    state_machine: StateMachine,
    mut stop: watch::Receiver<bool>,
) {
    if every_bytes == 0 {
        return;
    }
    let mut interval = tokio::time::interval(SNAPSHOT_CHECK_INTERVAL);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The snapshot index when a snapshot was requested, and when.
    let mut requested: Option<(Option<u64>, Instant)> = None;
    loop {
        tokio::select! {
            _ = interval.tick() => {}
            _ = stop.wait_for(|s| *s) => return,
        }
        let snapshot_index = raft.metrics().borrow().snapshot.map(|l| l.index);
        if let Some((index, at)) = requested {
            if index == snapshot_index && at.elapsed() < SNAPSHOT_REQUEST_WAIT {
                continue;
            }
            requested = None;
        }
        let snapshot_files: BTreeMap<String, u64> = state_machine
            .current_snapshot()
            .and_then(|s| s.snapshot.read_manifest().ok())
            .map(|m| m.files.into_iter().map(|f| (f.name, f.len)).collect())
            .unwrap_or_default();
        let pending = bytes_since_snapshot(&state_machine.engine().stats(), &snapshot_files);
        if pending < every_bytes {
            continue;
        }
        match raft.trigger().snapshot().await {
            Ok(()) => {
                tracing::info!(id, pending_bytes = pending, "snapshot requested by bytes");
                requested = Some((snapshot_index, Instant::now()));
            }
            Err(err) => {
                tracing::debug!(id, error = %err, "snapshot not requested");
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bitcask::FileStats;

    fn stats(files: &[(&str, bool, u64, u64)]) -> Stats {
        let files: Vec<FileStats> = files
            .iter()
            .map(|(name, sealed, total, dead)| FileStats {
                name: name.to_string(),
                sealed: *sealed,
                total_bytes: *total,
                live_bytes: total - dead,
                dead_bytes: *dead,
            })
            .collect();
        Stats {
            keys: 0,
            key_bytes: 0,
            live_bytes: files.iter().map(|f| f.live_bytes).sum(),
            dead_bytes: files.iter().map(|f| f.dead_bytes).sum(),
            files,
            last_seq: 0,
            merges: 0,
        }
    }

    #[test]
    fn merges_every_sealed_file_once_both_thresholds_pass() {
        let policy = MergePolicy {
            dead_ratio_min: 0.5,
            dead_bytes_min: 100,
            ..MergePolicy::default()
        };
        // The active segment's dead bytes do not count.
        let s = stats(&[
            ("a", true, 100, 40),
            ("b", true, 100, 50),
            ("c", false, 500, 500),
        ]);
        assert_eq!(merge_inputs(&s, &policy, 0), None, "ratio 0.45");
        let s = stats(&[
            ("a", true, 100, 50),
            ("b", true, 100, 60),
            ("c", false, 5, 0),
        ]);
        assert_eq!(
            merge_inputs(&s, &policy, 0),
            Some(vec!["a".to_string(), "b".to_string()])
        );
        let s = stats(&[("a", true, 100, 90)]);
        assert_eq!(merge_inputs(&s, &policy, 0), None, "90 dead bytes < 100");
        assert_eq!(merge_inputs(&stats(&[]), &policy, 0), None);
        // Dead bytes the change history keeps do not count.
        let s = stats(&[("a", true, 100, 60), ("b", true, 100, 60)]);
        assert!(merge_inputs(&s, &policy, 0).is_some());
        assert_eq!(merge_inputs(&s, &policy, 30), None, "90 of 200 bytes free");
    }

    #[test]
    fn bytes_since_snapshot_counts_growth_and_new_files() {
        let s = stats(&[("a", true, 100, 0), ("b", false, 70, 0), ("m", true, 30, 0)]);
        let snap = BTreeMap::from([("a".to_string(), 100), ("b".to_string(), 50)]);
        assert_eq!(bytes_since_snapshot(&s, &snap), 20 + 30);
        assert_eq!(bytes_since_snapshot(&s, &BTreeMap::new()), 200);
    }

    #[test]
    fn entries_zero_means_never() {
        let never = SnapshotPolicy {
            every_entries: 0,
            every_bytes: 0,
        };
        assert_eq!(never.openraft(), openraft::SnapshotPolicy::Never);
        assert_eq!(
            SnapshotPolicy::default().openraft(),
            openraft::SnapshotPolicy::LogsSinceLast(SNAPSHOT_EVERY_ENTRIES_DEFAULT)
        );
    }
}
