//! The engine side of a change history: "the history is the segments
//! themselves". Every put and tombstone record in the engine's files, live
//! or superseded, can be listed with a [`RecordLocation`] and read back by
//! it; a merge given a [`Retain`] predicate keeps the superseded records
//! the predicate asks for (`crate::merge`). The engine never interprets a
//! record's meta: the caller decides what to keep and how to index it.
//!
//! Listing snapshots the file list (holding the writer and file-set locks
//! only for that), pins the files so a concurrent merge cannot delete them
//! mid-read, and reads without any engine lock: from hints where they
//! exist, from data files otherwise (`crate::walk`). The active segment is
//! listed up to its published length only (`Shared::active_published`), as
//! `get` sees it.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::read::RecordBytes;
use super::{Engine, lock, read};
use crate::error::{Error, Result};
use crate::format::{FileId, RecordKind, decode_record_header, record_size, verify_record};
use crate::options::RECORD_SIZE_BYTES_MAX;
use crate::record_meta::RecordMeta;
use crate::walk::{Walked, walk_file};

/// Whether a listed record is a put or a tombstone (commit records, which
/// end batches, are never listed).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum StoredKind {
    /// The key got a value.
    Put,
    /// The key was deleted.
    Tombstone,
}

/// What a record says about itself, without its value: what listing
/// reports and what a merge's [`Retain`] predicate judges.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecordView<'a> {
    /// The key.
    pub key: &'a [u8],
    /// Put or tombstone.
    pub kind: StoredKind,
    /// Sequence number of the record.
    pub seq: u64,
    /// Expiry in ms of the caller's clock; 0 = never (tombstones: 0).
    pub expiry_ms: u64,
    /// Length of the value in bytes (tombstones: 0).
    pub value_len: u32,
    /// The record's meta ([`RecordMeta::EMPTY`] if it has none).
    pub meta: RecordMeta,
}

/// Where one record is: its data file, offset and size, and its sequence
/// number (so a read can never return another record). Valid until its file
/// leaves the engine — a merge replaces its inputs — after which
/// [`Engine::read_record`] answers [`Error::LocationGone`]; list the merge's
/// outputs ([`Engine::records_in`] with [`crate::MergeReport::outputs`]) for
/// the new locations. A file name can come back: a crash that leaves an
/// active segment with no complete batch deletes it at open, and a later
/// batch with the same first sequence creates it again. What holds instead:
/// a location carries its record's sequence number and a read checks it
/// (and the record's size), so a location into a reused name never returns
/// a record with another sequence number: it gets [`Error::InvalidLocation`]
/// or the record it named. Only published records are listed, so with
/// `SyncPolicy::Always` a listed record was fsynced and its sequence number
/// is never written again; with a weaker policy a listed write the crash
/// lost may have its sequence number reused by the next write, which its
/// location then reads (as `get` would).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RecordLocation {
    /// The data file (its name is [`RecordLocation::file_name`]).
    pub file: FileId,
    /// Offset of the record in the file.
    pub offset: u32,
    /// Size of the whole record in bytes (header, meta, key and value).
    pub len: u32,
    /// Sequence number of the record.
    pub seq: u64,
}

impl RecordLocation {
    /// Name of the data file the record is in.
    pub fn file_name(&self) -> String {
        self.file.data_name()
    }
}

/// A listed record (owned): what it says and where it is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredRecord {
    /// The key.
    pub key: Vec<u8>,
    /// Put or tombstone.
    pub kind: StoredKind,
    /// Sequence number.
    pub seq: u64,
    /// Expiry in ms of the caller's clock; 0 = never.
    pub expiry_ms: u64,
    /// Length of the value in bytes.
    pub value_len: u32,
    /// The record's meta.
    pub meta: RecordMeta,
    /// Where to read it ([`Engine::read_record`]).
    pub location: RecordLocation,
}

impl StoredRecord {
    /// The record as a [`RecordView`] (what a retention predicate sees).
    pub fn view(&self) -> RecordView<'_> {
        RecordView {
            key: &self.key,
            kind: self.kind,
            seq: self.seq,
            expiry_ms: self.expiry_ms,
            value_len: self.value_len,
            meta: self.meta,
        }
    }
}

/// A record read back at its location, checked against its checksum.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredValue {
    /// The key.
    pub key: Vec<u8>,
    /// The value (empty for a tombstone).
    pub value: Vec<u8>,
    /// Put or tombstone.
    pub kind: StoredKind,
    /// Sequence number.
    pub seq: u64,
    /// Expiry in ms of the caller's clock; 0 = never.
    pub expiry_ms: u64,
    /// The record's meta.
    pub meta: RecordMeta,
}

/// A merge's retention predicate: it says which of the records the merge
/// would otherwise drop (superseded puts, superseded and final tombstones,
/// expired puts) to keep in the merge output. It is called once for every
/// put and tombstone of the merge's inputs (with a sequence number from
/// [`Retain::min_seq`] on), in file order. A live put that has not expired
/// at the merge's "now" is copied whatever it answers; an expired live put
/// is one it would drop, so its answer matters there: keeping it writes it
/// (and, with it, the key stays in the key directory, expired).
/// It is captured with the merge ([`Engine::begin_merge_retaining`]), so it
/// must be a pure function of the record and of values fixed at capture
/// (say, the compaction floor as of that point of the write stream):
/// replicas that capture the same merge at the same point then write the
/// same bytes. It is called on the thread that runs the merge.
///
/// Kept history is not live: [`Engine::stats`] counts it as dead bytes, so
/// a file full of retained history looks like a merge candidate. And a
/// retaining merge reads, and checks against their checksums, superseded
/// records a plain merge never reads (the records it keeps, and in data
/// files without a valid hint, every record it walks): bit rot in a dead
/// record can fail a retaining merge with [`Error::Corruption`] on the one
/// replica whose disk rotted, while a plain merge there, and the retaining
/// merges of the other replicas, succeed.
///
/// [`Retain::with_min_seq`] adds a promise that makes merges cheaper: no
/// record below a sequence number is kept, so the merge neither asks about
/// those nor reads input files that hold nothing newer.
#[derive(Clone)]
pub struct Retain {
    keep: Arc<dyn Fn(&RecordView<'_>) -> bool + Send + Sync>,
    /// No record with a lower sequence number is kept (0: no promise).
    min_seq: u64,
}

impl Retain {
    /// A predicate from a closure.
    pub fn new(keep: impl Fn(&RecordView<'_>) -> bool + Send + Sync + 'static) -> Retain {
        Retain {
            keep: Arc::new(keep),
            min_seq: 0,
        }
    }

    /// This predicate, except that it keeps no record with a sequence
    /// number below `min_seq` (and is not asked about those). A caller
    /// whose floor is a revision passes the lowest sequence number of a
    /// record above that revision; when every input is below it, the merge
    /// costs what a merge without a predicate costs.
    pub fn with_min_seq(self, min_seq: u64) -> Retain {
        Retain { min_seq, ..self }
    }

    /// The sequence number below which nothing is kept (0 if none was set).
    pub fn min_seq(&self) -> u64 {
        self.min_seq
    }

    /// Whether the predicate keeps `record`.
    pub fn keeps(&self, record: &RecordView<'_>) -> bool {
        record.seq >= self.min_seq && (self.keep)(record)
    }
}

impl From<Arc<dyn Fn(&RecordView<'_>) -> bool + Send + Sync>> for Retain {
    fn from(keep: Arc<dyn Fn(&RecordView<'_>) -> bool + Send + Sync>) -> Retain {
        Retain { keep, min_seq: 0 }
    }
}

impl std::fmt::Debug for Retain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Retain")
            .field("min_seq", &self.min_seq)
            .finish_non_exhaustive()
    }
}

/// A file to list, as snapshotted.
struct Listed {
    id: FileId,
    /// Bytes to read: the whole sealed file, or the active segment's
    /// published prefix at the snapshot (batches whose key-directory
    /// updates were applied; with `SyncPolicy::Always`, fsynced ones).
    len: u64,
    sealed: bool,
}

impl Engine {
    /// Where `key`'s live record is, from the key directory alone (expired
    /// or not): what a change history notes as a key's state before it
    /// overwrites the key. `None` if the key is absent. The location is
    /// valid until a merge moves the record (see [`RecordLocation`]).
    pub fn locate(&self, key: &[u8]) -> Option<StoredRecord> {
        let shared = &self.shared;
        let files = read(&shared.files);
        let location = read(&shared.keydir).get(key)?;
        // Every file the key directory can point at has a path, merge
        // outputs too while they are being swapped in (files before keydir
        // is the engine's lock order).
        let file = files
            .paths
            .get(&location.file)
            .and_then(|path| path.file_stem())
            .and_then(|stem| FileId::parse_stem(&stem.to_string_lossy()))?;
        let len = record_size(key.len(), location.value_len as usize, location.meta.len());
        Some(StoredRecord {
            key: key.to_vec(),
            kind: StoredKind::Put,
            seq: location.seq,
            expiry_ms: location.expiry_ms,
            value_len: location.value_len,
            meta: location.meta,
            location: RecordLocation {
                file,
                offset: location.offset,
                len: len as u32,
                seq: location.seq,
            },
        })
    }

    /// Every put and tombstone record in the engine's files — live and
    /// superseded, sealed files and the active segment (every batch `get`
    /// sees: with `SyncPolicy::Always`, not one still awaiting its fsync) —
    /// with where it is, in file order (merge parts, then
    /// segments; records in each file in order). See
    /// [`Engine::for_each_record`].
    pub fn records(&self) -> Result<Vec<StoredRecord>> {
        self.collect_records(None)
    }

    /// The records of the data files named `files` only (names as
    /// [`Engine::sealed_data_files`] or [`crate::MergeReport::outputs`] give
    /// them), in file order; [`Error::UnknownFile`] if one is not the
    /// engine's (any more).
    pub fn records_in(&self, files: &[String]) -> Result<Vec<StoredRecord>> {
        self.collect_records(Some(files))
    }

    /// Calls `f` for every put and tombstone record of the engine's files
    /// (`None`) or of the data files named in `files`, in file order, with
    /// its location. Sealed files are read from their hints (no value is
    /// read) or, without a valid hint, from their data; the active segment
    /// from its data, up to the end of the last batch published when the
    /// call began (whose key-directory updates were applied, so `get` shows
    /// it: with `SyncPolicy::Always`, once an fsync covered it). The file
    /// list is snapshotted and the files pinned (a merge
    /// meanwhile defers deleting them); no engine lock is held while
    /// reading, so writers and readers carry on.
    ///
    /// In a key's records in file order, sequence numbers increase, and the
    /// last one is the key's state (the key directory's record, or its
    /// final tombstone); earlier ones are history a merge was told to keep,
    /// or not yet merged away.
    pub fn for_each_record(
        &self,
        files: Option<&[String]>,
        mut f: impl FnMut(&RecordView<'_>, RecordLocation),
    ) -> Result<()> {
        let (listed, _pin) = self.snapshot_files(files)?;
        let shared = &self.shared;
        for file in &listed {
            let id = file.id;
            walk_file(
                shared.opts.vfs.as_ref(),
                &shared.dir,
                &id,
                file.len,
                file.sealed,
                &mut |walked: &Walked<'_>| {
                    f(
                        &walked.view,
                        RecordLocation {
                            file: id,
                            offset: walked.offset,
                            len: walked.size,
                            seq: walked.view.seq,
                        },
                    );
                    Ok(())
                },
            )?;
        }
        Ok(())
    }

    fn collect_records(&self, files: Option<&[String]>) -> Result<Vec<StoredRecord>> {
        let mut out = Vec::new();
        self.for_each_record(files, |view, location| {
            out.push(StoredRecord {
                key: view.key.to_vec(),
                kind: view.kind,
                seq: view.seq,
                expiry_ms: view.expiry_ms,
                value_len: view.value_len,
                meta: view.meta,
                location,
            });
        })?;
        Ok(out)
    }

    /// The files to list (all, or those named) and a pin on them. Holds the
    /// writer lock only to read the file list and the active segment's
    /// published length between batches (the active segment may be sealed
    /// right after).
    ///
    /// The active segment is the file set's, not the writer's: a seal that
    /// fails midway (its fsync, or the hint after it) has taken the segment
    /// from the writer but left it the active file, which `get` goes on
    /// reading (up to the published length, which the key directory
    /// matches: the failed seal published all or nothing).
    fn snapshot_files(&self, names: Option<&[String]>) -> Result<(Vec<Listed>, super::Pin)> {
        let shared = &self.shared;
        let writer = lock(&shared.writer);
        let files = read(&shared.files);
        let mut listed: Vec<Listed> = files
            .sealed
            .iter()
            .map(|meta| Listed {
                id: meta.id,
                len: meta.len,
                sealed: true,
            })
            .collect();
        if let Some((_, id)) = files.active {
            listed.push(Listed {
                id,
                // Read under `files`: this segment's.
                len: shared.active_published.load(Ordering::SeqCst),
                sealed: false,
            });
        }
        drop(writer);
        if let Some(names) = names {
            if let Some(unknown) = names
                .iter()
                .find(|name| !listed.iter().any(|file| file.id.data_name() == **name))
            {
                return Err(Error::UnknownFile(unknown.clone()));
            }
            listed.retain(|file| names.contains(&file.id.data_name()));
        }
        let pinned: Vec<String> = listed
            .iter()
            .flat_map(|file| {
                let hint = file.sealed.then(|| file.id.hint_name());
                std::iter::once(file.id.data_name()).chain(hint)
            })
            .collect();
        // Pinned while the file list is still read-locked: a merge removes
        // its inputs from the list before it retires them.
        let pin = shared.pin_known(pinned);
        drop(files);
        Ok((listed, pin))
    }

    /// Reads the record at `location` (from [`Engine::records`] and kin):
    /// its key and value, checked against the record's checksum and the
    /// location's size and sequence number. [`Error::LocationGone`] if its
    /// file is no longer one of the engine's (merged away);
    /// [`Error::InvalidLocation`] if no such record is there (a location
    /// not made by this engine, one longer than any record can be
    /// ([`crate::RECORD_SIZE_BYTES_MAX`], refused before anything is read or
    /// allocated), or one past the file's published end: in the active
    /// segment, batches still awaiting their fsync are not readable yet);
    /// [`Error::Corruption`] if the bytes fail their checksum.
    pub fn read_record(&self, location: &RecordLocation) -> Result<StoredValue> {
        let shared = &self.shared;
        let name = location.file_name();
        // The file and its readable length: a sealed file's whole length,
        // the active segment's published prefix (read under `files`, so it
        // is this segment's).
        let found = {
            let files = read(&shared.files);
            files
                .sealed
                .iter()
                .find(|meta| meta.id == location.file)
                .map(|meta| (meta.num, meta.len))
                .or_else(|| {
                    files
                        .active
                        .filter(|(_, id)| *id == location.file)
                        .map(|(num, _)| (num, shared.active_published.load(Ordering::SeqCst)))
                })
        };
        let gone = || Error::LocationGone { file: name.clone() };
        let Some((num, readable_len)) = found else {
            return Err(gone());
        };
        let offset = u64::from(location.offset);
        let invalid = |reason: String| Error::InvalidLocation {
            file: name.clone(),
            offset,
            reason,
        };
        // Checked before any byte is read (or a buffer allocated for them):
        // a made-up location must not make the engine allocate gigabytes.
        if location.len as usize > RECORD_SIZE_BYTES_MAX {
            return Err(invalid(format!(
                "the location says {} bytes, more than any record can be \
                 (RECORD_SIZE_BYTES_MAX, {RECORD_SIZE_BYTES_MAX})",
                location.len
            )));
        }
        if offset + u64::from(location.len) > readable_len {
            return Err(invalid(format!(
                "a {}-byte record there runs past the {readable_len} bytes written \
                 and published in the file",
                location.len
            )));
        }
        let read = shared.with_bytes(num, offset, location.len as usize, |record, _| {
            // A record of the location's size must start there; only then
            // is a checksum mismatch corruption rather than a bad location.
            match decode_record_header(record, record.len() as u64) {
                Ok(header) if header.record_size() == record.len() => {}
                Ok(header) => {
                    return Err(invalid(format!(
                        "the record there is {} bytes, the location says {}",
                        header.record_size(),
                        record.len()
                    )));
                }
                Err(fault) => return Err(invalid(format!("no record starts there: {fault:?}"))),
            }
            let header = verify_record(record).map_err(|fault| Error::Corruption {
                file: name.clone(),
                offset,
                reason: format!("{fault:?}"),
            })?;
            let kind = match header.kind {
                RecordKind::Put => StoredKind::Put,
                RecordKind::Tombstone => StoredKind::Tombstone,
                RecordKind::Commit => {
                    return Err(invalid("a commit record is there".to_string()));
                }
            };
            if header.seq != location.seq {
                return Err(invalid(format!(
                    "the record there has sequence {}, the location names {}",
                    header.seq, location.seq
                )));
            }
            let (meta, key, value) = header.split(record);
            Ok(StoredValue {
                key: key.to_vec(),
                value: value.to_vec(),
                kind,
                seq: header.seq,
                expiry_ms: header.expiry_ms,
                meta: RecordMeta::new(meta)?,
            })
        })?;
        match read {
            RecordBytes::Gone => Err(gone()),
            RecordBytes::OutOfRange { file_len } => Err(invalid(format!(
                "a {}-byte record there runs past the end of the {file_len}-byte file",
                location.len
            ))),
            RecordBytes::Read(value) => value,
        }
    }
}
