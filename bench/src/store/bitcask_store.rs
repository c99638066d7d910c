//! bitcask under the [`Store`] interface.
//!
//! [`Durability::NoSync`] is `SyncPolicy::Never` (each put is one `pwrite`
//! to the active segment; fsync only at segment rotation), and
//! [`Durability::SyncEachOp`] is `SyncPolicy::Always` (each put returns after
//! an fdatasync covering it; concurrent puts share one). Automatic merging is
//! off so the benchmark decides when merges run.

use std::path::Path;

use anyhow::Result;
use bitcask::{Engine, Options, SyncPolicy};

use super::{Durability, Reader, Store, touch};

/// A bitcask engine opened for the benchmark.
#[derive(Debug)]
pub struct BitcaskStore {
    engine: Engine,
}

/// The options the benchmark opens bitcask with.
pub fn options(durability: Durability) -> Options {
    let sync = match durability {
        Durability::NoSync => SyncPolicy::Never,
        Durability::SyncEachOp => SyncPolicy::Always,
    };
    Options {
        sync,
        auto_merge: None,
        ..Options::default()
    }
}

impl BitcaskStore {
    /// Opens the engine in `dir`.
    pub fn open(dir: &Path, durability: Durability) -> Result<BitcaskStore> {
        Ok(BitcaskStore {
            engine: Engine::open(dir, options(durability))?,
        })
    }

    /// Wraps an engine opened with other options.
    pub fn from_engine(engine: Engine) -> BitcaskStore {
        BitcaskStore { engine }
    }

    /// The engine itself (for merges and stats).
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// Merges every sealed data file; `None` when there is none.
    pub fn merge_sealed(&self) -> Result<Option<bitcask::MergeReport>> {
        let inputs = self.engine.sealed_data_files();
        if inputs.is_empty() {
            return Ok(None);
        }
        Ok(Some(self.engine.merge(&inputs, 0)?))
    }
}

impl Store for BitcaskStore {
    fn put(&self, key: &[u8], value: &[u8]) -> Result<()> {
        self.engine.put(key, value)?;
        Ok(())
    }

    fn reader(&self) -> Result<Box<dyn Reader + '_>> {
        Ok(Box::new(BitcaskReader {
            engine: &self.engine,
        }))
    }

    fn flush(&self) -> Result<()> {
        Ok(self.engine.sync()?)
    }

    fn compact(&mut self) -> Result<()> {
        self.merge_sealed()?;
        Ok(())
    }

    fn close(self: Box<Self>) -> Result<()> {
        Ok(self.engine.close()?)
    }
}

struct BitcaskReader<'a> {
    engine: &'a Engine,
}

impl Reader for BitcaskReader<'_> {
    fn get(&mut self, key: &[u8]) -> Result<Option<usize>> {
        Ok(self.engine.get_with(key, 0, |item| touch(item.value))?)
    }
}
