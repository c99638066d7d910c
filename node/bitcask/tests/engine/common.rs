//! Helpers shared by the scenarios.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use bitcask::{Engine, Options, SyncPolicy};
use vfs::sim::SimFs;

/// The data directory used on a [`SimFs`].
pub fn sim_dir() -> PathBuf {
    PathBuf::from("/db")
}

/// Options for a test engine on `fs`: tiny segments so rotation and merge
/// happen often, no automatic merge unless a test asks for it.
pub fn sim_options(fs: &SimFs, sync: SyncPolicy, segment_size_bytes: u64) -> Options {
    Options {
        segment_size_bytes,
        sync,
        auto_merge: None,
        vfs: Arc::new(fs.clone()),
        ..Options::default()
    }
}

/// Opens an engine on `fs` at [`sim_dir`].
pub fn open_sim(fs: &SimFs, sync: SyncPolicy, segment_size_bytes: u64) -> Engine {
    Engine::open(sim_dir(), sim_options(fs, sync, segment_size_bytes))
        .expect("open engine on SimFs")
}

/// Every file in `dir` of `fs` with its bytes, sorted by name.
pub fn sim_files(fs: &SimFs, dir: &Path) -> Vec<(String, Vec<u8>)> {
    use vfs::Vfs;
    fs.list(dir)
        .expect("list")
        .into_iter()
        .map(|name| {
            let bytes = fs.read_file(&dir.join(&name)).expect("listed file exists");
            (name, bytes)
        })
        .collect()
}

/// A value that names its key and version, so a reader can tell garbage
/// from a real write.
pub fn value_for(key: &[u8], version: u64, len: usize) -> Vec<u8> {
    let mut value = format!("{}#{version}#", String::from_utf8_lossy(key)).into_bytes();
    while value.len() < len {
        value.push(b'a' + (value.len() % 26) as u8);
    }
    value
}

/// The first `len` bytes of an active segment's file `bytes`, after
/// checking that the rest is zeros the write path filled ahead (at most
/// three [`bitcask::FILL_AHEAD_BYTES`] blocks).
pub fn active_prefix(mut bytes: Vec<u8>, len: u64, what: &str) -> Vec<u8> {
    let len = usize::try_from(len).expect("length fits");
    assert!(
        bytes.len() >= len,
        "{what}: file of {} bytes, the engine says {len}",
        bytes.len()
    );
    let tail = &bytes[len..];
    assert!(
        tail.len() as u64 <= 3 * bitcask::FILL_AHEAD_BYTES,
        "{what}: {} bytes past the end",
        tail.len()
    );
    assert!(
        tail.iter().all(|&b| b == 0),
        "{what}: non-zero bytes past the end"
    );
    bytes.truncate(len);
    bytes
}
