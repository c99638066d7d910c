//! Power loss through the I/O trait: the SimFs keeps only what was fsynced
//! (and, with `Torn::Prefix`, a random piece of what was not, like a write
//! cut in the middle). After every cut, recovery must return exactly the
//! state after some whole number of batches k, where k is at least the
//! number of batches known durable (all acknowledged ones with sync=always;
//! those before the last explicit `sync()` otherwise) and at most the number
//! written. Batch metadata carries the batch number, so k is read back from
//! `last_commit_meta`.

use std::collections::BTreeMap;

use bitcask::{Batch, Engine, Scan, SyncPolicy};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use vfs::sim::{SimFs, Torn};

use crate::common::{open_sim, value_for};

type Model = BTreeMap<Vec<u8>, Vec<u8>>;

fn contents(engine: &Engine) -> Model {
    engine
        .scan(&Scan::all(usize::MAX), 0)
        .unwrap()
        .into_iter()
        .map(|entry| (entry.key, entry.value.unwrap()))
        .collect()
}

fn batch_number(engine: &Engine) -> usize {
    engine.last_commit_meta().map_or(0, |meta| {
        u64::from_le_bytes(meta.try_into().unwrap()) as usize
    })
}

fn run(seed: u64, sync: SyncPolicy) {
    const SEGMENT_BYTES: u64 = 700;
    const CUTS: usize = 12;
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut fs = SimFs::new();
    let mut engine = open_sim(&fs, sync, SEGMENT_BYTES);
    let mut models: Vec<Model> = vec![Model::new()];
    let mut durable = 0usize;
    for cut in 0..CUTS {
        for _ in 0..rng.random_range(1..30) {
            let number = models.len() as u64;
            let mut model = models.last().unwrap().clone();
            let mut batch = Batch::new().meta(number.to_le_bytes().to_vec());
            for _ in 0..rng.random_range(1..5) {
                let key = format!("k{}", rng.random_range(0..16)).into_bytes();
                if rng.random_bool(0.2) {
                    model.remove(&key);
                    batch = batch.delete(key);
                } else {
                    let value = value_for(&key, number, rng.random_range(0..120));
                    model.insert(key.clone(), value.clone());
                    batch = batch.put(key, value);
                }
            }
            engine.write_batch(&batch).unwrap();
            models.push(model);
            if sync == SyncPolicy::Always {
                durable = models.len() - 1;
            } else if rng.random_bool(0.15) {
                engine.sync().unwrap();
                durable = models.len() - 1;
            }
        }
        let torn = if rng.random_bool(0.5) {
            Torn::Prefix(rng.random())
        } else {
            Torn::Nothing
        };
        let after = fs.power_cut(torn);
        drop(engine);
        fs = after;
        engine = open_sim(&fs, sync, SEGMENT_BYTES);
        let k = batch_number(&engine);
        let written = models.len() - 1;
        assert!(
            k >= durable && k <= written,
            "seed {seed} cut {cut}: recovered {k} batches; {durable} were durable, {written} written"
        );
        assert_eq!(
            contents(&engine),
            models[k],
            "seed {seed} cut {cut}: state is not exactly batch {k}"
        );
        models.truncate(k + 1);
        durable = k;
    }
}

#[test]
fn sync_always_loses_no_acknowledged_batch() {
    for seed in 0..8 {
        run(seed, SyncPolicy::Always);
    }
}

#[test]
fn sync_never_recovers_a_whole_batch_prefix_at_least_up_to_the_last_sync() {
    for seed in 100..108 {
        run(seed, SyncPolicy::Never);
    }
}
