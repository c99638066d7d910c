//! How long a counted scan holds the key directory: loads `KEYS` keys
//! (25-byte keys as `engine-compare`'s, 8-byte values, random order, no
//! fsync), then times `ROUNDS` passes of `Engine::scan_counted` over every
//! key with a limit of one (what etcd's `get --prefix --limit 1` and
//! `--count-only` cost the node), first counted from the order (no key
//! carries an expiry), then walked (after one put with an expiry), and
//! prints each with the time per million keys.
//! `kvstate::range::RANGE_COUNT_KEYS_MAX` bounds the walk from it.
//!
//! ```sh
//! cargo build --release -p bitcask --example count_profile
//! target/release/examples/count_profile DIR 1000000 5
//! ```

use std::path::PathBuf;
use std::time::Instant;

use bitcask::{Counted, Engine, Options, Scan, SyncPolicy};
use rand::SeedableRng;
use rand::rngs::SmallRng;
use rand::seq::SliceRandom;

/// Length of every key (as `kvbench::workload::KEY_SIZE_BYTES`).
const KEY_SIZE_BYTES: usize = 25;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, dir, keys, rounds] = &args[..] else {
        eprintln!("usage: count_profile DIR KEYS ROUNDS");
        std::process::exit(2);
    };
    let dir = PathBuf::from(dir);
    let keys: u64 = keys.parse().expect("KEYS");
    let rounds: u32 = rounds.parse().expect("ROUNDS");
    let _ = std::fs::remove_dir_all(&dir);
    let opts = Options {
        sync: SyncPolicy::Never,
        auto_merge: None,
        ..Options::default()
    };
    let engine = Engine::open(&dir, opts).expect("open");
    let mut order: Vec<u64> = (0..keys).collect();
    order.shuffle(&mut SmallRng::seed_from_u64(7));
    for id in &order {
        let key = format!("user:{id:020}");
        assert_eq!(key.len(), KEY_SIZE_BYTES);
        engine.put(key.as_bytes(), &id.to_le_bytes()).expect("put");
    }
    let scan = Scan {
        keys_only: true,
        ..Scan::all(1)
    };
    let limit = usize::try_from(keys).expect("KEYS fits a usize");
    let time = |what: &str, now_ms: u64, walked: bool, keys: usize| {
        for round in 1..=rounds {
            let started = Instant::now();
            let (first, count) = engine.scan_counted(&scan, now_ms, keys).expect("scan");
            let took = started.elapsed();
            assert_eq!(first.len(), 1);
            assert_eq!(count, Some(Counted { keys, walked }));
            println!(
                "{what}, round {round}: {keys} keys in {:.3} ms ({:.3} ms per million keys)",
                took.as_secs_f64() * 1e3,
                took.as_secs_f64() * 1e9 / keys as f64
            );
        }
    };
    time("from the order", 1, false, limit);
    // One key with an expiry: from now on a count at a clock above 0 walks.
    engine
        .put_with_expiry(b"~expiring", b"", u64::MAX)
        .expect("put");
    time("walked", 1, true, limit + 1);
    drop(engine);
    let _ = std::fs::remove_dir_all(&dir);
}
