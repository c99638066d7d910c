//! One small interface over the engines compared: put, point reads, make
//! durable, reclaim space, close.
//!
//! Every engine is opened with one of two per-operation durability levels
//! ([`Durability`]); the module of each engine says how it maps them.
//! bitcask is always available; redb and fjall need the `compare` feature.

use std::path::Path;

use anyhow::Result;

pub mod bitcask_store;
#[cfg(feature = "compare")]
pub mod fjall_store;
#[cfg(feature = "compare")]
pub mod redb_store;

/// What a write has to reach before it returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Durability {
    /// Handed to the OS (or the engine's memory, for redb) without fsync.
    NoSync,
    /// Durable: an fsync (or fdatasync) covers the write before it returns.
    SyncEachOp,
}

/// The engines the benchmark knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EngineKind {
    /// This repository's engine.
    Bitcask,
    /// redb: copy-on-write B-tree, one writer at a time.
    Redb,
    /// fjall: LSM-tree, values inline in the tree (its default).
    Fjall,
    /// fjall with key-value separation (values >= 1 KiB in blob files), its
    /// documented setting for large values.
    FjallKvSep,
}

impl EngineKind {
    /// Every engine, in report order.
    pub const ALL: [EngineKind; 4] = [
        EngineKind::Bitcask,
        EngineKind::Redb,
        EngineKind::Fjall,
        EngineKind::FjallKvSep,
    ];

    /// The name in tables and on the command line.
    pub fn label(self) -> &'static str {
        match self {
            EngineKind::Bitcask => "bitcask",
            EngineKind::Redb => "redb",
            EngineKind::Fjall => "fjall",
            EngineKind::FjallKvSep => "fjall-kvsep",
        }
    }

    /// The engine with this label.
    pub fn parse(label: &str) -> Option<EngineKind> {
        EngineKind::ALL
            .into_iter()
            .find(|kind| kind.label() == label)
    }

    /// Whether this build can open it (redb and fjall need `compare`).
    pub fn available(self) -> bool {
        self == EngineKind::Bitcask || cfg!(feature = "compare")
    }
}

/// A key-value engine under test. Shared between threads by reference.
pub trait Store: Send + Sync {
    /// Stores `key` → `value` with the durability the store was opened with.
    fn put(&self, key: &[u8], value: &[u8]) -> Result<()>;
    /// A point reader for one thread.
    fn reader(&self) -> Result<Box<dyn Reader + '_>>;
    /// Makes every write so far durable.
    fn flush(&self) -> Result<()>;
    /// Waits (bounded) until background work started by earlier writes
    /// (memtable flushes, compactions) is done; a no-op for most engines.
    fn settle(&self) -> Result<()> {
        Ok(())
    }
    /// Reclaims the space of overwritten data (bitcask merge of every sealed
    /// file, redb compaction, fjall major compaction); blocks until done.
    fn compact(&mut self) -> Result<()>;
    /// Closes cleanly (everything durable, files released).
    fn close(self: Box<Self>) -> Result<()>;
}

/// Point reads from one thread.
pub trait Reader {
    /// Length of the value of `key`, having touched its first and last byte;
    /// `None` if absent.
    fn get(&mut self, key: &[u8]) -> Result<Option<usize>>;
}

/// Opens (creating if needed) `kind` in directory `dir`.
pub fn open(kind: EngineKind, dir: &Path, durability: Durability) -> Result<Box<dyn Store>> {
    std::fs::create_dir_all(dir)?;
    match kind {
        EngineKind::Bitcask => Ok(Box::new(bitcask_store::BitcaskStore::open(
            dir, durability,
        )?)),
        #[cfg(feature = "compare")]
        EngineKind::Redb => Ok(Box::new(redb_store::RedbStore::open(dir, durability)?)),
        #[cfg(feature = "compare")]
        EngineKind::Fjall => Ok(Box::new(fjall_store::FjallStore::open(
            dir, durability, false,
        )?)),
        #[cfg(feature = "compare")]
        EngineKind::FjallKvSep => Ok(Box::new(fjall_store::FjallStore::open(
            dir, durability, true,
        )?)),
        #[cfg(not(feature = "compare"))]
        other => anyhow::bail!("{} needs the `compare` feature", other.label()),
    }
}

/// Touches the first and last byte of a value read (so no engine can skip
/// materialising it) and returns its length.
pub(crate) fn touch(value: &[u8]) -> usize {
    if let (Some(first), Some(last)) = (value.first(), value.last()) {
        std::hint::black_box((*first, *last));
    }
    value.len()
}
