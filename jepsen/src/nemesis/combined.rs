//! The `combined` schedule (`--nemesis combined`, or `all`): a seeded
//! random sequence of every fault the run's member count allows, injected
//! one at a time like any list.
//!
//! Left out: `partition-bridge` / `partition-ring` below five members,
//! `membership` when no slot is left for a spare member, and any power-loss
//! fault (its name starts with [`POWER_FAULT_PREFIX`]): power loss is only
//! meaningful with a lazy-disk build of kvnode, so a combined run does not
//! pick it; name it explicitly with such a build. Nor `restart-after-idle`
//! (a sequence that stops the writes for half a minute; name it).

use rand::SeedableRng as _;
use rand::rngs::SmallRng;
use rand::seq::IndexedRandom as _;

use super::{ALL_FAULTS, Fault, FaultList};
use crate::control::cluster::NODES_MAX;

/// Faults in a combined sequence; the schedule cycles through it, so a
/// run shorter than this many faults never repeats the sequence.
pub const COMBINED_FAULTS: usize = 256;
/// Names of faults a combined schedule never picks (power loss needs a
/// lazy-disk kvnode build).
pub const POWER_FAULT_PREFIX: &str = "power";
/// A seed's salt, so the fault sequence differs from the workload's
/// random choices made from the same seed.
const SEED_SALT: u64 = 0xc0b1_7ed5;

/// Whether a combined schedule over `nodes` members may pick `fault`.
pub fn allowed(fault: Fault, nodes: u64) -> bool {
    if fault.name().starts_with(POWER_FAULT_PREFIX)
        || fault.is_sequence()
        || nodes < fault.nodes_min()
    {
        return false;
    }
    !(fault.needs_spare_slot() && nodes + 1 > NODES_MAX)
}

/// The faults of `list` with every `combined` placeholder replaced by a
/// seeded random sequence of the allowed faults ([`COMBINED_FAULTS`]
/// long, no fault twice in a row).
pub fn expand(list: &FaultList, nodes: u64, seed: u64) -> FaultList {
    if !list.0.contains(&Fault::Combined) {
        return list.clone();
    }
    let pool: Vec<Fault> = ALL_FAULTS
        .into_iter()
        .filter(|&f| allowed(f, nodes))
        .collect();
    let mut rng = SmallRng::seed_from_u64(seed ^ SEED_SALT);
    let mut out = Vec::new();
    for &fault in &list.0 {
        if fault != Fault::Combined {
            out.push(fault);
            continue;
        }
        for _ in 0..COMBINED_FAULTS {
            let previous = out.last().copied();
            let candidates: Vec<Fault> = pool
                .iter()
                .copied()
                .filter(|&f| Some(f) != previous || pool.len() == 1)
                .collect();
            if let Some(&next) = candidates.choose(&mut rng) {
                out.push(next);
            }
        }
    }
    FaultList(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn combined_is_seeded_and_mixes_every_allowed_fault() {
        let list = FaultList::parse("combined").expect("parses");
        let a = expand(&list, 3, 1);
        assert_eq!(a, expand(&list, 3, 1), "same seed, same schedule");
        assert_ne!(a, expand(&list, 3, 2), "another seed, another schedule");
        assert_eq!(a.0.len(), COMBINED_FAULTS);
        for fault in ALL_FAULTS {
            let expected = allowed(fault, 3);
            assert_eq!(a.0.contains(&fault), expected, "{}", fault.name());
        }
        assert!(!a.0.contains(&Fault::PartitionRing), "needs 5 members");
        assert!(expand(&list, 5, 1).0.contains(&Fault::PartitionRing));
        assert!(
            a.0.windows(2).all(|w| w[0] != w[1]),
            "no fault twice in a row"
        );
        assert_eq!(FaultList::parse("all").expect("parses"), list);
    }
}
