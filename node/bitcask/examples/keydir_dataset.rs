//! Writes the data set on which `engine-probe` (crate `kvbench`) measures
//! the key directory's memory per key, optionally with a record meta on
//! every put, so the figure can be taken with and without metas:
//!
//! ```sh
//! cargo run --release -p bitcask --example keydir_dataset -- DIR KEYS META_BYTES
//! target/release/engine-probe --engine bitcask --dir DIR
//! ```
//!
//! The data set is the one `engine-compare` builds for its restart and
//! memory sections: `KEYS` keys of 25 bytes (`user:` and a zero-padded
//! 20-digit id) with 100-byte values, one put a batch, in the same seeded
//! random order, no fsync, default 64 MiB segments; here each put also
//! carries a `META_BYTES`-byte record meta (0: none, as `engine-compare`).

use std::path::PathBuf;

use bitcask::{Batch, Engine, Options, RecordMeta, SyncPolicy};
use rand::SeedableRng;
use rand::rngs::SmallRng;
use rand::seq::SliceRandom;

/// Length of every key (as `kvbench::workload::KEY_SIZE_BYTES`).
const KEY_SIZE_BYTES: usize = 25;
/// Length of every value (as `engine-compare`'s restart data set).
const VALUE_SIZE_BYTES: usize = 100;
/// The shuffle seed `engine-compare` uses for that data set (`0x5eed ^ 0xb16`).
const SHUFFLE_SEED: u64 = 0x5eed ^ 0xb16;

fn key(id: u64) -> [u8; KEY_SIZE_BYTES] {
    let mut out = [b'0'; KEY_SIZE_BYTES];
    out[..5].copy_from_slice(b"user:");
    let digits = id.to_string();
    out[KEY_SIZE_BYTES - digits.len()..].copy_from_slice(digits.as_bytes());
    out
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [dir, keys, meta_bytes] = args.as_slice() else {
        return Err("usage: keydir_dataset DIR KEYS META_BYTES".into());
    };
    let dir = PathBuf::from(dir);
    let keys: u64 = keys.parse()?;
    let meta_bytes: usize = meta_bytes.parse()?;
    if dir.exists() {
        return Err(format!("{} exists; give a new directory", dir.display()).into());
    }
    let engine = Engine::open(
        &dir,
        Options {
            sync: SyncPolicy::Never,
            auto_merge: None,
            ..Options::default()
        },
    )?;
    let mut ids: Vec<u64> = (0..keys).collect();
    ids.shuffle(&mut SmallRng::seed_from_u64(SHUFFLE_SEED));
    let value: Vec<u8> = (0..VALUE_SIZE_BYTES)
        .map(|i| b'a' + (i % 26) as u8)
        .collect();
    for id in ids {
        // Stand-in revisions: distinct per key, exactly `meta_bytes` long.
        let bytes: Vec<u8> = (0..meta_bytes)
            .map(|i| (id >> (8 * (i % 8))) as u8)
            .collect();
        let meta = RecordMeta::new(&bytes)?;
        engine.write_batch(&Batch::new().put_with_meta(
            key(id).to_vec(),
            value.clone(),
            0,
            meta,
        ))?;
    }
    let stats = engine.stats();
    engine.close()?;
    println!(
        "wrote {} keys ({} key bytes), {meta_bytes}-byte metas, into {}",
        stats.keys,
        stats.key_bytes,
        dir.display()
    );
    Ok(())
}
