//! redb under the [`Store`] interface (feature `compare`).
//!
//! One write transaction per put. [`Durability::NoSync`] commits with
//! `redb::Durability::None` (redb has no "write to the OS, no fsync" level;
//! `None` keeps the commit in redb's own memory until the next durable
//! commit, which is weaker than bitcask's `Never` and so favours redb);
//! [`Durability::SyncEachOp`] commits with `Durability::Immediate` (durable
//! when `commit` returns). redb runs one write transaction at a time, so
//! concurrent writers queue and each commit syncs on its own. Cache: 4 GiB
//! (redb's default is 1 GiB), enough to hold the whole 4 KiB data set (a
//! 4 KiB value takes two 4 KiB pages in redb), as the OS page cache holds
//! it for bitcask. Readers reuse one read transaction for
//! [`READS_PER_TRANSACTION`] gets, which is kinder to redb than one
//! transaction per get.

use std::path::Path;

use anyhow::{Context, Result};
use redb::{Builder, Database, ReadableDatabase, TableDefinition};

use super::{Durability, Reader, Store, touch};

const TABLE: TableDefinition<'_, &[u8], &[u8]> = TableDefinition::new("kv");
/// Gets served by one read transaction before it is renewed.
pub const READS_PER_TRANSACTION: usize = 1024;
/// Page cache given to redb.
pub const CACHE_SIZE_BYTES: usize = 4 * 1024 * 1024 * 1024;
/// File name of the database inside the store directory.
pub const FILE_NAME: &str = "bench.redb";
/// Compaction passes at most (each returns whether it changed anything).
const COMPACT_PASSES_MAX: usize = 16;

/// A redb database opened for the benchmark.
#[derive(Debug)]
pub struct RedbStore {
    db: Database,
    durability: redb::Durability,
}

impl RedbStore {
    /// Opens (or creates) the database file in `dir`.
    pub fn open(dir: &Path, durability: Durability) -> Result<RedbStore> {
        let db = Builder::new()
            .set_cache_size(CACHE_SIZE_BYTES)
            .create(dir.join(FILE_NAME))
            .context("opening redb")?;
        let durability = match durability {
            Durability::NoSync => redb::Durability::None,
            Durability::SyncEachOp => redb::Durability::Immediate,
        };
        let store = RedbStore { db, durability };
        // Create the table once so readers always find it.
        let txn = store.db.begin_write()?;
        txn.open_table(TABLE)?;
        txn.commit()?;
        Ok(store)
    }

    fn commit_empty_durable(&self) -> Result<()> {
        let mut txn = self.db.begin_write()?;
        txn.set_durability(redb::Durability::Immediate)?;
        txn.commit()?;
        Ok(())
    }
}

impl Store for RedbStore {
    fn put(&self, key: &[u8], value: &[u8]) -> Result<()> {
        let mut txn = self.db.begin_write()?;
        txn.set_durability(self.durability)?;
        {
            let mut table = txn.open_table(TABLE)?;
            table.insert(key, value)?;
        }
        txn.commit()?;
        Ok(())
    }

    fn reader(&self) -> Result<Box<dyn Reader + '_>> {
        Ok(Box::new(RedbReader {
            db: &self.db,
            table: None,
            served: 0,
        }))
    }

    fn flush(&self) -> Result<()> {
        self.commit_empty_durable()
    }

    fn compact(&mut self) -> Result<()> {
        self.commit_empty_durable()?;
        for _ in 0..COMPACT_PASSES_MAX {
            if !self.db.compact()? {
                break;
            }
        }
        Ok(())
    }

    fn close(self: Box<Self>) -> Result<()> {
        self.commit_empty_durable()?;
        self.db.close()?;
        Ok(())
    }
}

struct RedbReader<'a> {
    db: &'a Database,
    table: Option<redb::ReadOnlyTable<&'static [u8], &'static [u8]>>,
    served: usize,
}

impl Reader for RedbReader<'_> {
    fn get(&mut self, key: &[u8]) -> Result<Option<usize>> {
        if self.served.is_multiple_of(READS_PER_TRANSACTION) {
            self.table = None;
        }
        self.served += 1;
        let table = match &mut self.table {
            Some(table) => table,
            slot => slot.insert(self.db.begin_read()?.open_table(TABLE)?),
        };
        Ok(table.get(key)?.map(|guard| touch(guard.value())))
    }
}
