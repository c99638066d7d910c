//! Shared test helpers: a test Raft type config and log-store shortcuts.

use std::net::{IpAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use kvnode::raft::types::NodeLogId;
use kvnode::{LogStore, LogStoreOptions};
use openraft::storage::{RaftLogStorage, RaftLogStorageExt};
use openraft::{EntryPayload, RaftLogReader};
use vfs::Vfs;
use vfs::sim::SimFs;

openraft::declare_raft_types!(
    /// A test type config: string payloads, the default u64 node ids.
    pub TestConfig:
        D = String,
        R = String,
);

pub type Store = LogStore<TestConfig>;
/// A log entry of the test type config.
pub type TestEntry = openraft::alias::EntryOf<TestConfig>;

/// The log directory used with `SimFs`.
pub fn sim_dir() -> PathBuf {
    PathBuf::from("/node/raft-log")
}

/// Options with tiny segments, so a few entries rotate.
pub fn small_segments() -> LogStoreOptions {
    LogStoreOptions {
        segment_size_bytes: 512,
        ..LogStoreOptions::default()
    }
}

pub fn open_sim(fs: &SimFs, options: LogStoreOptions) -> Store {
    LogStore::open_with(Arc::new(fs.clone()), sim_dir(), options).expect("open log store")
}

pub fn log_id(term: u64, index: u64) -> NodeLogId {
    kvnode::raft::types::log_id(term, 1, index)
}

/// A normal entry whose payload names its term and index (and pads a bit).
pub fn entry(term: u64, index: u64) -> TestEntry {
    TestEntry {
        log_id: log_id(term, index),
        payload: EntryPayload::Normal(payload(term, index)),
    }
}

pub fn payload(term: u64, index: u64) -> String {
    format!(
        "term {term} index {index} {}",
        "x".repeat((index % 17) as usize * 5)
    )
}

pub fn entries(term: u64, indexes: std::ops::Range<u64>) -> Vec<TestEntry> {
    indexes.map(|index| entry(term, index)).collect()
}

/// Appends and waits for the flush callback (i.e. for the fsync).
pub async fn append(store: &mut Store, batch: Vec<TestEntry>) {
    store.blocking_append(batch).await.expect("append");
}

pub async fn all(store: &mut Store) -> Vec<TestEntry> {
    store.try_get_log_entries(..).await.expect("read entries")
}

pub async fn indexes(store: &mut Store) -> Vec<u64> {
    all(store).await.iter().map(|e| e.log_id.index).collect()
}

pub async fn last_log_id(store: &mut Store) -> Option<NodeLogId> {
    store.get_log_state().await.unwrap().last_log_id
}

/// Names of the segment files in `dir`.
pub fn segments(vfs: &dyn Vfs, dir: &Path) -> Vec<String> {
    vfs.list(dir)
        .unwrap()
        .into_iter()
        .filter(|name| name.ends_with(".seg"))
        .collect()
}

/// Checks that every entry carries the payload `entry()` gives it.
pub fn assert_payloads(found: &[TestEntry], term_of: impl Fn(u64) -> u64) {
    for e in found {
        let index = e.log_id.index;
        match &e.payload {
            EntryPayload::Normal(text) => {
                assert_eq!(text, &payload(term_of(index), index), "payload of {index}")
            }
            other => panic!("entry {index} has payload {other:?}"),
        }
    }
}

/// A loopback address no other test uses (see the function's docs).
pub use kvnode::testing::private_loopback;

/// A port of `host` (a test's own loopback address) that was free a moment
/// ago, for a member started later.
pub fn free_port(host: IpAddr) -> u16 {
    // Below the kernel's ephemeral range (32768 and up by default): a port
    // picked from that range can be taken by an outgoing connection of an
    // already running member before the member it was picked for binds it.
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let seed = std::process::id()
        ^ std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
    for _ in 0..1000 {
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let port = 20_000 + (seed.wrapping_add(n.wrapping_mul(7919)) % 12_000) as u16;
        if TcpListener::bind((host, port)).is_ok() {
            return port;
        }
    }
    panic!("no free port below the ephemeral range on {host} in 1000 attempts");
}
