//! A read loop to profile the engine's point reads on their own: loads
//! `KEYS` keys with 4 KiB values (the `engine-compare` read data set: 25-byte
//! keys, values cut from a random pool, no fsync, random order), reads every
//! key once, then
//! runs `READS` uniform random `get_with`s over `THREADS` threads and prints
//! the rate. Run it under `perf record` to see where a read goes:
//!
//! ```sh
//! cargo build --release -p bitcask --example read_profile
//! perf record -g target/release/examples/read_profile DIR 200000 5000000 1
//! ```

use std::path::PathBuf;
use std::time::Instant;

use bitcask::{Engine, Options, SyncPolicy};
use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::{Rng, RngCore, SeedableRng};

/// Length of every key (as `kvbench::workload::KEY_SIZE_BYTES`).
const KEY_SIZE_BYTES: usize = 25;
/// Length of every value.
const VALUE_SIZE_BYTES: usize = 4096;
/// The random bytes values are cut from.
const VALUE_POOL_BYTES: usize = 64 << 20;

fn key(id: u64) -> [u8; KEY_SIZE_BYTES] {
    let mut key = [0u8; KEY_SIZE_BYTES];
    key.copy_from_slice(format!("user:{id:020}").as_bytes());
    key
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, dir, keys, reads, threads] = &args[..] else {
        eprintln!("usage: read_profile DIR KEYS READS THREADS");
        std::process::exit(2);
    };
    let dir = PathBuf::from(dir);
    let keys: u64 = keys.parse().expect("KEYS");
    let reads: u64 = reads.parse().expect("READS");
    let threads: u64 = threads.parse().expect("THREADS");
    let _ = std::fs::remove_dir_all(&dir);
    let opts = Options {
        sync: SyncPolicy::Never,
        auto_merge: None,
        ..Options::default()
    };
    let engine = Engine::open(&dir, opts).expect("open");
    let mut rng = SmallRng::seed_from_u64(7);
    let mut order: Vec<u64> = (0..keys).collect();
    order.shuffle(&mut rng);
    // Values are windows of a random pool, as `engine-compare` makes them.
    let mut pool = vec![0u8; VALUE_POOL_BYTES];
    rng.fill_bytes(&mut pool);
    let loading = Instant::now();
    for id in &order {
        let at = rng.random_range(0..VALUE_POOL_BYTES - VALUE_SIZE_BYTES);
        engine
            .put(&key(*id), &pool[at..at + VALUE_SIZE_BYTES])
            .expect("put");
    }
    let secs = loading.elapsed().as_secs_f64();
    println!(
        "{keys} puts in {secs:.3} s = {:.0} ops/s",
        keys as f64 / secs
    );
    for id in 0..keys {
        assert!(engine.get(&key(id), 0).expect("get").is_some());
    }
    let started = Instant::now();
    std::thread::scope(|scope| {
        for t in 0..threads {
            let engine = &engine;
            scope.spawn(move || {
                let mut rng = SmallRng::seed_from_u64(100 + t);
                let mut sum = 0usize;
                for _ in 0..reads / threads {
                    let id = rng.random_range(0..keys);
                    sum += engine
                        .get_with(&key(id), 0, |item| {
                            item.value.len() + usize::from(item.value[0])
                        })
                        .expect("get")
                        .expect("present");
                }
                std::hint::black_box(sum);
            });
        }
    });
    let secs = started.elapsed().as_secs_f64();
    println!(
        "{reads} reads over {threads} threads in {secs:.3} s = {:.0} ops/s",
        reads as f64 / secs
    );
    engine.close().expect("close");
    let _ = std::fs::remove_dir_all(&dir);
}
