//! Random transactions against a model: a `BTreeMap` of keys with etcd's
//! revisions, where a transaction is worked out in the most direct way
//! (copy the map, apply the branch, keep the copy if it changed). Several
//! transactions share each entry (so reads go through the entry's pending
//! writes as well as the transaction's), and the applier is reloaded from
//! the engine now and then (a restart). After every entry the engine must
//! hold exactly the model's keys, and every answer must be the model's.
//! Seeded, so a failure replays.

use std::collections::BTreeMap;
use std::sync::Arc;

use bitcask::{Engine, Options, SyncPolicy};
use kvstate::apply::Applier;
use kvstate::command::{Command, Outcome, Proposal};
use kvstate::range::{KeyValue, RangeResult, RangeSpec, SortOrder, SortTarget, range};
use kvstate::txn::{Compare, CompareResult, CompareTarget, TxnOp, TxnOpResult, TxnRequest};
use vfs::sim::SimFs;

/// xorshift64*: a few lines, and the same numbers on every machine.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn chance(&mut self, one_in: u64) -> bool {
        self.below(one_in) == 0
    }
}

const KEYS: [&str; 8] = ["a", "b", "ba", "c", "d", "e", "f", "g"];

fn key(rng: &mut Rng) -> Vec<u8> {
    KEYS[rng.below(KEYS.len() as u64) as usize].into()
}

fn range_end(rng: &mut Rng) -> Vec<u8> {
    match rng.below(4) {
        0 | 1 => Vec::new(),
        2 => vec![0],
        _ => key(rng),
    }
}

fn spec(rng: &mut Rng) -> RangeSpec {
    let revision_bound = |rng: &mut Rng| if rng.chance(3) { rng.below(40) } else { 0 };
    RangeSpec {
        key: key(rng),
        range_end: range_end(rng),
        limit: rng.below(4),
        keys_only: rng.chance(4),
        count_only: rng.chance(8),
        sort_order: [SortOrder::None, SortOrder::Ascend, SortOrder::Descend][rng.below(3) as usize],
        sort_target: [
            SortTarget::Key,
            SortTarget::Version,
            SortTarget::Create,
            SortTarget::Mod,
            SortTarget::Value,
        ][rng.below(5) as usize],
        min_mod_revision: revision_bound(rng),
        max_mod_revision: revision_bound(rng),
        min_create_revision: revision_bound(rng),
        max_create_revision: revision_bound(rng),
        revision: 0,
    }
}

fn op(rng: &mut Rng) -> TxnOp {
    match rng.below(5) {
        0 | 1 => {
            let ignore_value = rng.chance(6);
            let ignore_lease = rng.chance(6);
            TxnOp::Put {
                key: key(rng),
                value: if ignore_value {
                    Vec::new()
                } else {
                    format!("{}", rng.below(100)).into_bytes()
                },
                ttl_ms: 0,
                lease: if ignore_lease { 0 } else { rng.below(3) },
                prev_kv: rng.chance(2),
                ignore_value,
                ignore_lease,
            }
        }
        2 => TxnOp::DeleteRange {
            key: key(rng),
            range_end: range_end(rng),
            prev_kv: rng.chance(2),
        },
        _ => TxnOp::Range(spec(rng)),
    }
}

fn compare(rng: &mut Rng) -> Compare {
    let number = rng.below(12);
    Compare {
        key: key(rng),
        range_end: if rng.chance(3) {
            range_end(rng)
        } else {
            Vec::new()
        },
        target: match rng.below(5) {
            0 => CompareTarget::Value(format!("{}", rng.below(100)).into_bytes()),
            1 => CompareTarget::Version(number % 4),
            2 => CompareTarget::CreateRevision(number),
            3 => CompareTarget::ModRevision(number),
            _ => CompareTarget::Lease(number % 3),
        },
        result: [
            CompareResult::Equal,
            CompareResult::NotEqual,
            CompareResult::Less,
            CompareResult::Greater,
        ][rng.below(4) as usize],
    }
}

fn txn(rng: &mut Rng) -> TxnRequest {
    let ops = |rng: &mut Rng| (0..rng.below(4)).map(|_| op(rng)).collect();
    TxnRequest {
        session: None,
        compares: (0..rng.below(3)).map(|_| compare(rng)).collect(),
        success: ops(rng),
        failure: ops(rng),
    }
}

/// etcd's key ranges, written out again for the model.
fn within(key: &[u8], start: &[u8], end: &[u8]) -> bool {
    match end {
        [] => key == start,
        [0] => key >= start,
        end => key >= start && key < end,
    }
}

#[derive(Clone, Debug, Default)]
struct Model {
    kvs: BTreeMap<Vec<u8>, KeyValue>,
}

impl Model {
    fn in_range(&self, start: &[u8], end: &[u8]) -> Vec<KeyValue> {
        self.kvs
            .values()
            .filter(|kv| within(&kv.key, start, end))
            .cloned()
            .collect()
    }

    fn range(&self, spec: &RangeSpec) -> RangeResult {
        let mut kvs = self.in_range(&spec.key, &spec.range_end);
        let count = kvs.len() as u64;
        if spec.count_only {
            return RangeResult {
                kvs: Vec::new(),
                more: false,
                count,
            };
        }
        let filtered = spec.min_mod_revision != 0
            || spec.max_mod_revision != 0
            || spec.min_create_revision != 0
            || spec.max_create_revision != 0;
        let limit = spec.limit as usize;
        if spec.sort_order == SortOrder::None && !filtered && limit > 0 {
            kvs.truncate(limit + 1);
        }
        kvs.retain(|kv| {
            (spec.max_mod_revision == 0 || kv.mod_revision <= spec.max_mod_revision)
                && (spec.min_mod_revision == 0 || kv.mod_revision >= spec.min_mod_revision)
                && (spec.max_create_revision == 0 || kv.create_revision <= spec.max_create_revision)
                && (spec.min_create_revision == 0 || kv.create_revision >= spec.min_create_revision)
        });
        let order = match spec.sort_order {
            SortOrder::None if spec.sort_target != SortTarget::Key => SortOrder::Ascend,
            order => order,
        };
        if order != SortOrder::None {
            kvs.sort_by(|a, b| {
                let ordering = match spec.sort_target {
                    SortTarget::Key => a.key.cmp(&b.key),
                    SortTarget::Version => a.version.cmp(&b.version),
                    SortTarget::Create => a.create_revision.cmp(&b.create_revision),
                    SortTarget::Mod => a.mod_revision.cmp(&b.mod_revision),
                    SortTarget::Value => a.value.cmp(&b.value),
                };
                if order == SortOrder::Descend {
                    ordering.reverse()
                } else {
                    ordering
                }
            });
        }
        let more = limit > 0 && kvs.len() > limit;
        kvs.truncate(if limit > 0 { limit } else { kvs.len() });
        if spec.keys_only {
            for kv in &mut kvs {
                kv.value.clear();
            }
        }
        RangeResult { kvs, more, count }
    }

    fn holds(&self, compare: &Compare) -> bool {
        let kvs = self.in_range(&compare.key, &compare.range_end);
        if kvs.is_empty() && matches!(compare.target, CompareTarget::Value(_)) {
            return false;
        }
        let zero = [KeyValue::default()];
        let kvs = if kvs.is_empty() { &zero[..] } else { &kvs[..] };
        kvs.iter().all(|kv| {
            let ordering = match &compare.target {
                CompareTarget::Value(value) => kv.value.cmp(value),
                CompareTarget::Version(version) => kv.version.cmp(version),
                CompareTarget::CreateRevision(revision) => kv.create_revision.cmp(revision),
                CompareTarget::ModRevision(revision) => kv.mod_revision.cmp(revision),
                CompareTarget::Lease(lease) => kv.lease.cmp(lease),
            };
            match compare.result {
                CompareResult::Equal => ordering.is_eq(),
                CompareResult::NotEqual => ordering.is_ne(),
                CompareResult::Less => ordering.is_lt(),
                CompareResult::Greater => ordering.is_gt(),
            }
        })
    }

    /// Whether etcd refuses a branch for a duplicate key.
    fn duplicate(ops: &[TxnOp]) -> bool {
        let puts: Vec<&[u8]> = ops
            .iter()
            .filter_map(|op| match op {
                TxnOp::Put { key, .. } => Some(key.as_slice()),
                _ => None,
            })
            .collect();
        puts.iter().enumerate().any(|(i, put)| {
            puts[..i].contains(put)
                || ops.iter().any(|op| match op {
                    TxnOp::DeleteRange { key, range_end, .. } => within(put, key, range_end),
                    _ => false,
                })
        })
    }

    /// The outcome of `txn` at store revision `revision` (`None`: refused),
    /// and whether it changed anything.
    fn txn(&mut self, txn: &TxnRequest, revision: u64) -> (Option<Outcome>, bool) {
        if Model::duplicate(&txn.success) || Model::duplicate(&txn.failure) {
            return (None, false);
        }
        let succeeded = txn.compares.iter().all(|compare| self.holds(compare));
        let ops = if succeeded {
            &txn.success
        } else {
            &txn.failure
        };
        let mut next = self.clone();
        let mut changed = false;
        let mut results = Vec::new();
        for op in ops {
            results.push(match op {
                TxnOp::Range(spec) => TxnOpResult::Range(next.range(spec)),
                TxnOp::DeleteRange {
                    key,
                    range_end,
                    prev_kv,
                } => {
                    let gone = next.in_range(key, range_end);
                    for kv in &gone {
                        next.kvs.remove(&kv.key);
                    }
                    changed |= !gone.is_empty();
                    TxnOpResult::DeleteRange {
                        deleted: gone.len() as u64,
                        prev_kvs: if *prev_kv { gone } else { Vec::new() },
                    }
                }
                TxnOp::Put {
                    key,
                    value,
                    lease,
                    prev_kv,
                    ignore_value,
                    ignore_lease,
                    ..
                } => {
                    let old = next.kvs.get(key).cloned();
                    if old.is_none() && (*ignore_value || *ignore_lease) {
                        return (None, false);
                    }
                    let new = KeyValue {
                        key: key.clone(),
                        value: match &old {
                            Some(old) if *ignore_value => old.value.clone(),
                            _ => value.clone(),
                        },
                        create_revision: old.as_ref().map_or(revision + 1, |o| o.create_revision),
                        mod_revision: revision + 1,
                        version: old.as_ref().map_or(1, |o| o.version + 1),
                        lease: match &old {
                            Some(old) if *ignore_lease => old.lease,
                            _ => *lease,
                        },
                    };
                    next.kvs.insert(key.clone(), new);
                    changed = true;
                    TxnOpResult::Put {
                        prev_kv: old.filter(|_| *prev_kv),
                    }
                }
            });
        }
        if changed {
            *self = next;
        }
        (Some(Outcome::Txn { succeeded, results }), changed)
    }
}

#[test]
fn random_transactions_answer_and_store_as_the_model_does() {
    for seed in [1u64, 2, 3, 0x5eed] {
        let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
        let fs = SimFs::new();
        let options = Options {
            sync: SyncPolicy::Never,
            auto_merge: None,
            segment_size_bytes: 4096,
            vfs: Arc::new(fs.clone()),
            ..Options::default()
        };
        let engine = Engine::open("/sm", options).unwrap();
        let mut applier = Applier::default();
        let mut model = Model::default();
        let mut revision = 1;
        let (mut succeeded, mut refused) = (0, 0);
        // The leases the puts name (1 and 2) exist for the whole run; a
        // grant takes no revision.
        let grants = kvstate::command::Command::Leases(
            [1, 2]
                .map(|id| kvstate::command::LeaseRequest {
                    session: None,
                    op: kvstate::lease::LeaseOp::Grant {
                        id,
                        ttl_ms: 1 << 40,
                    },
                })
                .to_vec(),
        );
        let proposal = Proposal {
            time_ms: 0,
            command: grants,
        };
        applier.apply(&engine, 1, &proposal, Vec::new()).unwrap();
        for index in 2..=151u64 {
            let txns: Vec<TxnRequest> = (0..1 + rng.below(4)).map(|_| txn(&mut rng)).collect();
            let proposal = Proposal {
                time_ms: index,
                command: Command::Txns(txns.clone()),
            };
            let response = applier
                .apply(&engine, index, &proposal, Vec::new())
                .unwrap();
            for (txn, answer) in txns.iter().zip(&response.answers) {
                let (expected, changed) = model.txn(txn, revision);
                revision += u64::from(changed);
                let context = format!("seed {seed}, entry {index}, {txn:?}");
                match expected {
                    Some(outcome) => {
                        succeeded += usize::from(matches!(
                            outcome,
                            Outcome::Txn {
                                succeeded: true,
                                ..
                            }
                        ));
                        assert_eq!(answer.outcome, outcome, "{context}");
                    }
                    None => {
                        refused += 1;
                        assert!(
                            matches!(answer.outcome, Outcome::Rejected { .. }),
                            "{context}: {answer:?}"
                        );
                    }
                }
                assert_eq!(answer.revision, revision, "{context}");
            }
            let everything = RangeSpec::between("\0", "\0");
            let stored = range(&engine, &everything, index, revision).unwrap();
            let modelled: Vec<KeyValue> = model.kvs.values().cloned().collect();
            assert_eq!(stored.kvs, modelled, "seed {seed}, after entry {index}");
            if rng.chance(10) {
                applier = Applier::load(&engine).unwrap();
            }
        }
        assert!(succeeded > 50 && refused > 5, "{succeeded} {refused}");
    }
}
