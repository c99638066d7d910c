//! Power-loss faults: SIGKILL one member (`power-loss`), a minority
//! (`power-loss-minority`) or every member (`power-loss-all`), then restart
//! them, against a kvnode built with the `lazy-disk` feature — whose file
//! writes since the last fsync live only in process memory, so the SIGKILL
//! drops exactly what a power cut would (a SIGKILL of a real-disk build
//! loses nothing: the page cache keeps it).
//!
//! The cut itself (`Nemesis::power_cut`) also checks each victim's saved
//! vote across it ([`super::vote`]).
//!
//! A run refuses these faults unless `kvnode --version` lists the
//! `lazy-disk` feature ([`require_lazy_disk`]): power loss must never run
//! silently on a real disk, where it would prove nothing.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use anyhow::{Context as _, bail};
use rand::Rng as _;
use rand::rngs::SmallRng;
use rand::seq::SliceRandom as _;

use super::{Fault, Nemesis, Undo, vote};

/// The kvnode cargo feature power-loss faults need.
pub const LAZY_DISK_FEATURE: &str = "lazy-disk";
/// How long the victims stay off: long enough that the survivors notice
/// (a power cut is not a quick restart), short enough that a run fits many
/// cycles — each cycle is a chance to lose what was not fsynced.
pub const POWER_OFF_HOLD: Duration = Duration::from_secs(2);
/// The marker before the feature list in `kvnode --version`.
const FEATURES_MARKER: &str = "features:";

/// Which members lose power.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// One member, at random.
    One,
    /// A random minority (at most half the members, rounded down, at least
    /// one).
    Minority,
    /// Every member at once.
    All,
}

/// The members that lose power in `scope`, ascending.
pub fn victims(scope: Scope, ids: &[u64], rng: &mut SmallRng) -> Vec<u64> {
    let mut shuffled = ids.to_vec();
    shuffled.shuffle(rng);
    let count = match scope {
        Scope::One => 1,
        Scope::Minority => {
            let most = (ids.len().saturating_sub(1) / 2).max(1);
            rng.random_range(1..=most)
        }
        Scope::All => ids.len(),
    };
    let mut chosen: Vec<u64> = shuffled.into_iter().take(count).collect();
    chosen.sort_unstable();
    chosen
}

/// The test-only features of a kvnode binary, from `kvnode --version`
/// (`kvnode 0.1.0 features: lazy-disk,nc-...`; `none` = a real build).
pub fn build_features(kvnode_bin: &Path) -> anyhow::Result<Vec<String>> {
    let output = Command::new(kvnode_bin)
        .arg("--version")
        .output()
        .with_context(|| format!("running {} --version", kvnode_bin.display()))?;
    if !output.status.success() {
        bail!(
            "{} --version failed ({}): an old kvnode that does not list its features?",
            kvnode_bin.display(),
            output.status
        );
    }
    let text = String::from_utf8_lossy(&output.stdout);
    let Some((_, list)) = text.split_once(FEATURES_MARKER) else {
        bail!(
            "{} --version printed {:?}, with no {FEATURES_MARKER:?}: cannot tell whether it \
             is a lazy-disk build",
            kvnode_bin.display(),
            text.trim()
        );
    };
    Ok(list
        .trim()
        .split(',')
        .map(str::trim)
        .filter(|f| !f.is_empty() && *f != "none")
        .map(str::to_string)
        .collect())
}

/// Fails unless `kvnode_bin` is a `lazy-disk` build.
pub fn require_lazy_disk(kvnode_bin: &Path) -> anyhow::Result<()> {
    let features = build_features(kvnode_bin)?;
    if !features.iter().any(|f| f == LAZY_DISK_FEATURE) {
        bail!(
            "power-loss faults need a kvnode built with the {LAZY_DISK_FEATURE} feature \
             (`cargo build -p kvnode --features {LAZY_DISK_FEATURE} --target-dir \
             target/jepsen-builds --config build.build-dir=target`, sharing what the \
             workspace's own builds compiled, or `jepsen suite` builds it); {} has features \
             [{}]: on a real disk a SIGKILL loses nothing and the fault would prove nothing",
            kvnode_bin.display(),
            features.join(",")
        );
    }
    Ok(())
}

/// kvnode's cargo feature that has the test hooks: the hidden `kvnode run
/// --test-*` flags and their `KVNODE_TEST_*` variables (lost replies, a short
/// session idle window, the stale-build fault).
pub const TESTING_FEATURE: &str = "testing";
/// The prefix of every variable only a [`TESTING_FEATURE`] build reads.
pub const TEST_ENV_PREFIX: &str = "KVNODE_TEST_";

/// Fails unless `kvnode_bin` is a `testing` build; `why` names the test
/// setting that needs it. A product build does not read `KVNODE_TEST_*`
/// at all, so the run would silently test without its fault.
pub fn require_testing(kvnode_bin: &Path, why: &str) -> anyhow::Result<()> {
    let features = build_features(kvnode_bin)?;
    if !features.iter().any(|f| f == TESTING_FEATURE) {
        bail!(
            "{why} needs a kvnode built with the {TESTING_FEATURE} feature (`cargo build -p \
             kvnode --features {TESTING_FEATURE} --target-dir target/jepsen-builds --config \
             build.build-dir=target`, sharing what the workspace's own builds compiled, or \
             `jepsen suite` builds it); {} has features [{}], and a product build ignores every \
             {TEST_ENV_PREFIX}* setting",
            kvnode_bin.display(),
            features.join(",")
        );
    }
    Ok(())
}

impl Nemesis {
    /// `power-loss`, `power-loss-minority`, `power-loss-all`: the victims
    /// SIGKILLed (lazy disk: un-fsynced writes lost); each victim's saved
    /// vote term as reported just before the cut and as left on disk after
    /// it ([`super::vote`]).
    pub(super) async fn power_cut(
        &mut self,
        fault: Fault,
        ids: &[u64],
    ) -> anyhow::Result<(Undo, String)> {
        let scope = match fault {
            Fault::PowerLoss => Scope::One,
            Fault::PowerLossMinority => Scope::Minority,
            _ => Scope::All,
        };
        let victims = victims(scope, ids, &mut self.rng);
        // Asked together, so the cut follows the answers closely.
        let reported = vote::reported_saved_terms(&victims).await;
        let at_ns = self.history.now_ns();
        for &victim in &victims {
            self.cluster.kill(victim)?;
        }
        // The processes are reaped: their files are what the cut left.
        let mut votes = Vec::new();
        for (&victim, reported) in victims.iter().zip(reported) {
            let durable = vote::durable_term(&self.cluster.data_dir(victim));
            votes.push(format!(
                "{victim}: {}→{}",
                reported.map_or("?".to_string(), |t| t.to_string()),
                durable
                    .as_ref()
                    .map_or("unreadable".to_string(), |t| t.to_string())
            ));
            if let Some(anomaly) = vote::check(victim, reported, durable, at_ns) {
                eprintln!("jepsen: DURABILITY: {}", anomaly.detail);
                self.durability.push(anomaly);
            }
        }
        Ok((
            Undo::RestartMany(victims.clone()),
            format!(
                "power cut (SIGKILL, lazy disk) of members {victims:?}; saved vote terms \
                 reported→durable: {}",
                votes.join(", ")
            ),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng as _;

    #[test]
    fn victims_by_scope() {
        let mut rng = SmallRng::seed_from_u64(7);
        let ids = [1, 2, 3, 4, 5];
        for _ in 0..50 {
            assert_eq!(victims(Scope::One, &ids, &mut rng).len(), 1);
            let minority = victims(Scope::Minority, &ids, &mut rng);
            assert!((1..=2).contains(&minority.len()), "{minority:?}");
            assert_eq!(victims(Scope::All, &ids, &mut rng), ids);
        }
        assert_eq!(victims(Scope::Minority, &[1, 2, 3], &mut rng).len(), 1);
    }
}
