//! The file API the Raft layer builds snapshots from: a replica assembled
//! from another engine's sealed files plus a prefix of its active segment
//! (opened with that prefix as the published prefix) holds exactly the
//! state the source had at that point, and after the same later batches it
//! holds byte-identical files. Pins keep the listed files alive across a
//! merge while they are being copied.

use bitcask::{Batch, Engine, Options, PublishedPrefix, Scan, SyncPolicy};
use vfs::sim::SimFs;

use crate::common::{sim_dir, sim_files, sim_options, value_for};

const SEGMENT_BYTES: u64 = 1024;

fn batch(n: u64) -> Batch {
    let key = format!("k{}", n % 23).into_bytes();
    let mut batch = Batch::new().seq(n << 16).meta(n.to_le_bytes().to_vec());
    batch = batch.put(key.clone(), value_for(&key, n, 90));
    if n.is_multiple_of(5) {
        batch = batch.delete(format!("k{}", (n + 3) % 23));
    }
    batch
}

fn contents(engine: &Engine) -> Vec<(Vec<u8>, Vec<u8>, u64)> {
    engine
        .scan(&Scan::all(usize::MAX), 0)
        .unwrap()
        .into_iter()
        .map(|e| (e.key, e.value.unwrap(), e.seq))
        .collect()
}

#[test]
fn a_replica_assembled_from_listed_files_matches_the_source() {
    let source_fs = SimFs::new();
    let source = Engine::open(
        sim_dir(),
        sim_options(&source_fs, SyncPolicy::Never, SEGMENT_BYTES),
    )
    .unwrap();
    for n in 1..=60 {
        source.write_batch(&batch(n)).unwrap();
    }
    source.sync().unwrap();

    // What a snapshot manifest would name: sealed files and the active prefix.
    let sealed = source.sealed_files();
    let active = source.active_file().expect("an active segment");
    let names: Vec<String> = sealed
        .iter()
        .map(|f| f.name.clone())
        .chain([active.name.clone()])
        .collect();
    let pin = source.pin(&names).unwrap();
    let expected = contents(&source);
    let expected_seq = source.last_seq();

    // The source keeps going (and merges) while the files are "shipped".
    for n in 61..=90 {
        source.write_batch(&batch(n)).unwrap();
    }
    source.merge(&source.sealed_data_files(), 0).unwrap();

    let replica_fs = SimFs::new();
    for file in &sealed {
        let bytes = source_fs
            .read_file(&sim_dir().join(&file.name))
            .expect("pinned file still on disk");
        assert_eq!(crc32fast::hash(&bytes), file.crc, "{}", file.name);
        replica_fs.write_file(&sim_dir().join(&file.name), &bytes);
    }
    let active_bytes = source_fs.read_file(&sim_dir().join(&active.name)).unwrap();
    let prefix = &active_bytes[..active.len as usize];
    assert_eq!(crc32fast::hash(prefix), active.crc);
    replica_fs.write_file(&sim_dir().join(&active.name), prefix);
    drop(pin);

    let published = PublishedPrefix {
        file: active.name.clone(),
        len: active.len,
    };
    let opts = Options {
        published_prefix: Some(published),
        ..sim_options(&replica_fs, SyncPolicy::Never, SEGMENT_BYTES)
    };
    let replica = Engine::open(sim_dir(), opts).unwrap();
    assert_eq!(contents(&replica), expected);
    assert_eq!(replica.last_seq(), expected_seq);
    assert_eq!(replica.last_commit_meta().unwrap(), 60u64.to_le_bytes());

    // Fed the same later batches and the same merge, the files are identical.
    for n in 61..=90 {
        replica.write_batch(&batch(n)).unwrap();
    }
    replica.merge(&replica.sealed_data_files(), 0).unwrap();
    for n in 91..=120 {
        source.write_batch(&batch(n)).unwrap();
        replica.write_batch(&batch(n)).unwrap();
    }
    assert_eq!(replica.sealed_files(), source.sealed_files());
    assert_eq!(replica.active_file(), source.active_file());
    assert_eq!(contents(&replica), contents(&source));
    source.sync().unwrap();
    replica.sync().unwrap();
    let strip_tmp = |files: Vec<(String, Vec<u8>)>| -> Vec<(String, Vec<u8>)> {
        files
            .into_iter()
            .filter(|(name, _)| !name.ends_with(".tmp"))
            .collect()
    };
    assert_eq!(
        strip_tmp(sim_files(&replica_fs, &sim_dir())),
        strip_tmp(sim_files(&source_fs, &sim_dir()))
    );
}
