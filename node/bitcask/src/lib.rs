//! # bitcask
//!
//! A Bitcask storage engine: data lives in append-only segment files (one
//! active, the rest sealed), an ordered in-memory key directory says where
//! each key's latest record is, hint files let a restart rebuild that
//! directory without reading values, and merge rewrites live records to
//! reclaim space. It is the state machine of every raftcask node and also
//! works on its own as an embedded store.
//!
//! Files are a deterministic function of the batches written: rotation
//! depends only on bytes written and names only on sequence numbers, so two
//! replicas fed the same batches hold byte-identical sealed files, which the
//! cluster ships between replicas as snapshots. See `FORMAT.md` for every
//! byte on disk and `ARCHITECTURE.md` at the repository root for how the
//! engine sits under Raft.
//!
//! ## Modules
//! - [`format`](mod@format): byte layout of headers, records and hint entries; file names.
//! - Every file access goes through the [`vfs`] crate's [`vfs::Vfs`] (the
//!   real disk in production; its simulated disks in tests).
//! - `keydir`: the key directory: slots (key, varint location and record
//!   meta) inline in a size-class slab (`keydir::slab`, layout in
//!   `keydir::slot`), found by a sharded hash index and in key order by
//!   `keydir::order`.
//! - `record_meta`: [`RecordMeta`], the opaque per-record bytes a put or
//!   tombstone may carry (kept in records, hints and the key directory).
//! - `hint`: writing and loading hint files.
//! - `recovery`: opening a directory (list, plan, load), torn-tail repair,
//!   merge leftovers.
//! - `merge`: deterministic merge (plan what history to retain, write
//!   parts, publish, swap in, retire).
//! - `walk`: the put and tombstone records of one data file with their
//!   offsets, from its hint or its data (listing and retaining merges).
//! - `engine`: the [`Engine`], one submodule a job:
//!   - `engine` (`mod.rs`): the handle and its shared state, open, close;
//!   - `engine::batch`: [`Batch`], [`Op`], [`Written`];
//!   - `engine::write`: the write path: validation, appending, rotation,
//!     sealing;
//!   - `engine::sync`: group commit, fsyncs, the sync thread, poisoning
//!     (through [`vfs::Poison`]);
//!   - `engine::read`: lookups, scans, the cache of open files and maps;
//!   - `engine::files`: the file API the Raft layer uses ([`FileInfo`],
//!     [`Pin`], checksums of the published prefix, retiring files);
//!   - `engine::records`: the engine side of a change history: listing
//!     every put and tombstone with its [`RecordLocation`]
//!     ([`Engine::records`], [`Engine::records_in`],
//!     [`Engine::for_each_record`]), reading one back
//!     ([`Engine::read_record`]), and [`Retain`], the predicate a merge
//!     keeps superseded records by;
//!   - `engine::stats`: [`Stats`], [`FileStats`];
//!   - `engine::merging`: merge entry points ([`MergeReport`]) and
//!     automatic merges.
//! - [`options`]: options, sync policies and every limit.
//! - [`error`]: the error type.
//!
//! ## Limits (defaults, configurable in [`Options`])
//! Key 4 KiB ([`KEY_SIZE_BYTES_MAX`]), value 16 MiB ([`VALUE_SIZE_BYTES_MAX`]),
//! batch 64 MiB ([`BATCH_SIZE_BYTES_MAX`]), commit metadata 64 KiB
//! ([`METADATA_SIZE_BYTES_MAX`]), record meta 48 bytes
//! ([`RECORD_META_BYTES_MAX`], fixed), segment rotation at 64 MiB
//! ([`SEGMENT_SIZE_BYTES_DEFAULT`]).
//!
//! ## Example
//! ```
//! use bitcask::{Batch, Engine, Options, RecordMeta, Scan, SyncPolicy};
//!
//! let dir = tempfile::tempdir().unwrap();
//! let engine = Engine::open(dir.path(), Options { sync: SyncPolicy::Never, ..Options::default() })?;
//! engine.put(b"user/1", b"ada")?;
//! // A record meta: opaque bytes kept with the record and in the key directory.
//! let revision = RecordMeta::new(&[7, 1])?;
//! engine.write_batch(&Batch::new().put_with_meta("user/3", "alan", 0, revision))?;
//! engine.write_batch(&Batch::new().put("user/2", "grace").delete("user/1").meta("log index 7"))?;
//! let now_ms = 0; // the engine owns no clock: expiry is judged against the caller's "now"
//! assert_eq!(engine.get(b"user/1", now_ms)?, None);
//! assert_eq!(engine.get(b"user/2", now_ms)?.unwrap().value, b"grace");
//! assert_eq!(engine.scan(&Scan::prefix("user/", 10), now_ms)?.len(), 2);
//! assert_eq!(engine.meta(b"user/3", now_ms).unwrap().meta.as_bytes(), &[7, 1]); // no disk read
//! engine.close()?;
//!
//! let engine = Engine::open(dir.path(), Options::default())?;
//! assert_eq!(engine.last_commit_meta().as_deref(), Some(&b"log index 7"[..]));
//! # Ok::<(), bitcask::Error>(())
//! ```

pub mod error;
pub mod format;
pub mod options;

mod engine;
mod hint;
mod keydir;
mod merge;
mod record_meta;
mod recovery;
mod walk;

pub use engine::{
    Batch, Counted, Engine, Entry, FileInfo, FileStats, Item, ItemMeta, ItemRef, KeyRange,
    MergeReport, Op, Pin, RecordLocation, RecordMeta, RecordView, Retain, Scan, Stats, StoredKind,
    StoredRecord, StoredValue, Written,
};
pub use error::{Error, Result};
pub use keydir::SLOT_HEADER_SIZE_BYTES;
pub use merge::MergeJob;
pub use options::{
    AutoMerge, BATCH_SIZE_BYTES_MAX, FILL_AHEAD_BYTES, KEY_SIZE_BYTES_MAX, METADATA_SIZE_BYTES_MAX,
    Options, PublishedPrefix, RECORD_META_BYTES_MAX, RECORD_SIZE_BYTES_MAX,
    SEGMENT_SIZE_BYTES_DEFAULT, SyncPolicy, VALUE_SIZE_BYTES_MAX,
};
