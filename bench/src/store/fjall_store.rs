//! fjall under the [`Store`] interface (feature `compare`).
//!
//! One keyspace. [`Durability::NoSync`] is fjall's default write path: each
//! insert is appended to the journal and flushed to the OS (`PersistMode::
//! Buffer`), no fsync, like bitcask's `Never`. [`Durability::SyncEachOp`]
//! adds `Database::persist(PersistMode::SyncData)` (fdatasync, as bitcask
//! uses) after every insert; fjall has no group commit, so concurrent
//! writers each call it. Block cache: 4 GiB (fjall's default is 32 MiB),
//! enough to hold the whole 4 KiB data set, as the OS page cache holds it
//! for bitcask. Optionally key-value separation with its defaults (values of
//! 1 KiB and more go to blob files), fjall's documented mode for large values.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use fjall::{Database, Keyspace, KeyspaceCreateOptions, KvSeparationOptions, PersistMode};

use super::{Durability, Reader, Store, touch};

/// Block cache given to fjall.
pub const CACHE_SIZE_BYTES: u64 = 4 * 1024 * 1024 * 1024;
/// Longest wait for background flushes and compactions in [`Store::settle`].
pub const SETTLE_TIME_MAX: Duration = Duration::from_secs(120);

/// A fjall database with one keyspace, opened for the benchmark.
pub struct FjallStore {
    db: Database,
    keyspace: Keyspace,
    sync_each_op: bool,
}

impl std::fmt::Debug for FjallStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FjallStore")
            .field("sync_each_op", &self.sync_each_op)
            .finish_non_exhaustive()
    }
}

impl FjallStore {
    /// Opens (or creates) the database in `dir`.
    pub fn open(dir: &Path, durability: Durability, kv_separation: bool) -> Result<FjallStore> {
        let db = Database::builder(dir)
            .cache_size(CACHE_SIZE_BYTES)
            .open()
            .context("opening fjall")?;
        let keyspace = db.keyspace("kv", || {
            let options = KeyspaceCreateOptions::default();
            if kv_separation {
                options.with_kv_separation(Some(KvSeparationOptions::default()))
            } else {
                options
            }
        })?;
        Ok(FjallStore {
            db,
            keyspace,
            sync_each_op: durability == Durability::SyncEachOp,
        })
    }
}

impl Store for FjallStore {
    fn put(&self, key: &[u8], value: &[u8]) -> Result<()> {
        self.keyspace.insert(key, value)?;
        if self.sync_each_op {
            self.db.persist(PersistMode::SyncData)?;
        }
        Ok(())
    }

    fn reader(&self) -> Result<Box<dyn Reader + '_>> {
        Ok(Box::new(FjallReader {
            keyspace: &self.keyspace,
        }))
    }

    fn flush(&self) -> Result<()> {
        Ok(self.db.persist(PersistMode::SyncData)?)
    }

    fn settle(&self) -> Result<()> {
        let started = Instant::now();
        while started.elapsed() < SETTLE_TIME_MAX {
            if self.db.outstanding_flushes() == 0 && self.db.active_compactions() == 0 {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }

    fn compact(&mut self) -> Result<()> {
        self.keyspace.rotate_memtable_and_wait()?;
        self.keyspace.major_compact()?;
        self.settle()
    }

    fn close(self: Box<Self>) -> Result<()> {
        self.db.persist(PersistMode::SyncAll)?;
        let FjallStore { db, keyspace, .. } = *self;
        drop(keyspace);
        drop(db);
        Ok(())
    }
}

struct FjallReader<'a> {
    keyspace: &'a Keyspace,
}

impl Reader for FjallReader<'_> {
    fn get(&mut self, key: &[u8]) -> Result<Option<usize>> {
        Ok(self.keyspace.get(key)?.map(|value| touch(&value)))
    }
}
