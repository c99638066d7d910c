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

use crate::common::{open_sim, sim_dir, sim_options, value_for};

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

/// Under `SyncPolicy::Never`, the background write-back fsyncs the active
/// segment every `writeback_interval_bytes`: after a power cut, what was
/// written more than about one interval before it survives, although no
/// segment was sealed and nobody called `sync`. (Polls for the background
/// thread, up to a bound; without the write-back nothing would survive.)
#[test]
fn the_background_write_back_makes_unsynced_writes_durable() {
    use std::time::{Duration, Instant};

    const INTERVAL_BYTES: u64 = 64 * 1024;
    const VALUE_LEN: usize = 1000;
    const PUTS: u32 = 400; // about 400 KiB: six intervals
    const WAIT_MAX: Duration = Duration::from_secs(20);
    let fs = SimFs::new();
    let options = bitcask::Options {
        writeback_interval_bytes: Some(INTERVAL_BYTES),
        ..sim_options(&fs, SyncPolicy::Never, 64 << 20)
    };
    let engine = Engine::open(sim_dir(), options).unwrap();
    for i in 0..PUTS {
        engine
            .put(format!("k{i:04}").as_bytes(), &[7u8; VALUE_LEN])
            .unwrap();
    }
    // Every key but those of the last interval (plus one batch) must be durable.
    let puts_per_interval = INTERVAL_BYTES as u32 / VALUE_LEN as u32 + 1;
    let durable_min = u64::from(PUTS - puts_per_interval - 1);
    let started = Instant::now();
    let survived = loop {
        let after = fs.power_cut(Torn::Nothing);
        let survived = open_sim(&after, SyncPolicy::Never, 64 << 20).stats().keys;
        if survived >= durable_min || started.elapsed() > WAIT_MAX {
            break survived;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(
        survived >= durable_min,
        "{survived} keys survived the power cut, expected at least {durable_min}"
    );
    drop(engine);
}
