//! The read path: lookups, scans and the bounded cache of open files and
//! memory maps they read through.

use std::collections::HashMap;
use std::ops::Bound;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use vfs::{Mapping, VfsFile};

use super::{Engine, Shared, read, write};
use crate::error::{Error, Result};
use crate::format::{RECORD_HEADER_SIZE_BYTES, RecordHeader, decode_record_header, verify_record};
use crate::keydir::Location;
use crate::record_meta::RecordMeta;

/// Attempts of a read whose file a concurrent merge removed (the key
/// directory points at the merge output by the next attempt).
const READ_ATTEMPTS_MAX: usize = 8;

/// A value read back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Item {
    /// The value.
    pub value: Vec<u8>,
    /// Sequence number of the write that stored it (its version).
    pub seq: u64,
    /// Expiry in ms of the caller's clock; 0 = never.
    pub expiry_ms: u64,
    /// The record meta the write stored ([`RecordMeta::EMPTY`] if none).
    pub meta: RecordMeta,
}

/// A value read in place ([`Engine::get_with`]): borrowed for the length of
/// the callback.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ItemRef<'a> {
    /// The value.
    pub value: &'a [u8],
    /// Sequence number of the write that stored it (its version).
    pub seq: u64,
    /// Expiry in ms of the caller's clock; 0 = never.
    pub expiry_ms: u64,
    /// The record meta the write stored ([`RecordMeta::EMPTY`] if none).
    pub meta: RecordMeta,
}

/// What the key directory knows of a live key, without its value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ItemMeta {
    /// Sequence number of the write that stored it (its version).
    pub seq: u64,
    /// Expiry in ms of the caller's clock; 0 = never.
    pub expiry_ms: u64,
    /// Length of the value in bytes.
    pub value_len: u32,
    /// The record meta the write stored, from the key directory.
    pub meta: RecordMeta,
}

/// One entry of a scan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// The key.
    pub key: Vec<u8>,
    /// The value (`None` for a keys-only scan).
    pub value: Option<Vec<u8>>,
    /// Sequence number of the write that stored it.
    pub seq: u64,
    /// Expiry, 0 = never.
    pub expiry_ms: u64,
    /// The record meta the write stored (keys-only scans too: it comes
    /// from the key directory).
    pub meta: RecordMeta,
}

/// What [`Engine::scan_counted`] counted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Counted {
    /// Unexpired keys in the range.
    pub keys: usize,
    /// Whether every key was visited to count them (some key may have
    /// expired), rather than counted from the order's chunk lengths.
    pub walked: bool,
}

/// Which keys a scan visits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeyRange {
    /// Every key.
    All,
    /// Keys starting with these bytes.
    Prefix(Vec<u8>),
    /// Keys between two bounds.
    Range(Bound<Vec<u8>>, Bound<Vec<u8>>),
}

/// A scan request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Scan {
    /// Keys to visit.
    pub range: KeyRange,
    /// Resume strictly after this key (the last key of the previous page).
    pub after: Option<Vec<u8>>,
    /// Largest number of entries returned.
    pub limit: usize,
    /// Return keys and versions without reading values.
    pub keys_only: bool,
}

impl Scan {
    /// A scan of every key, at most `limit` entries.
    pub fn all(limit: usize) -> Scan {
        Scan {
            range: KeyRange::All,
            after: None,
            limit,
            keys_only: false,
        }
    }
    /// A scan of keys with `prefix`, at most `limit` entries.
    pub fn prefix(prefix: impl Into<Vec<u8>>, limit: usize) -> Scan {
        Scan {
            range: KeyRange::Prefix(prefix.into()),
            after: None,
            limit,
            keys_only: false,
        }
    }
}

/// What [`Shared::with_bytes`] found.
pub(crate) enum RecordBytes<T> {
    /// The file left the engine (a merge swapped it out).
    Gone,
    /// The bytes asked for run past the end of the file.
    OutOfRange {
        /// The file's length.
        file_len: u64,
    },
    /// What the callback made of the bytes.
    Read(T),
}

/// How a file is read: sealed files through a memory map, the active one
/// (still growing) with positioned reads.
#[derive(Clone)]
pub(crate) enum Handle {
    Map(Arc<Mapped>),
    File(Arc<dyn VfsFile>),
}

impl std::fmt::Debug for Handle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Handle::Map(mapped) => write!(f, "Map({} bytes)", mapped.bytes().len()),
            Handle::File(file) => write!(f, "File({file:?})"),
        }
    }
}

/// Bytes of a sealed file per bit of [`Mapped::checked`]: smaller than the
/// smallest record, so no two records share a bit.
const CHECKED_GRAIN_BYTES: usize = 16;
const _: () = assert!(CHECKED_GRAIN_BYTES < RECORD_HEADER_SIZE_BYTES);

/// A sealed file's memory map, and which of its records a read has already
/// checked against their CRC since the map was made (one bit per
/// [`CHECKED_GRAIN_BYTES`] of file: 0.8 % of the file's size). The bits live
/// as long as the map stays in the handle cache; a map made again (after
/// eviction, or in a new process) checks every record again on first read.
pub(crate) struct Mapped {
    map: Mapping,
    checked: Box<[AtomicU64]>,
}

impl Mapped {
    fn new(map: Mapping) -> Mapped {
        let grains = map.as_ref().as_ref().len().div_ceil(CHECKED_GRAIN_BYTES);
        Mapped {
            checked: (0..grains.div_ceil(64))
                .map(|_| AtomicU64::new(0))
                .collect(),
            map,
        }
    }

    fn bytes(&self) -> &[u8] {
        self.map.as_ref().as_ref()
    }
}

/// Whether the record a read is handed was already checked in full (CRC
/// included) by an earlier read of the same map, and the way to say it now
/// has been. Records read with `pread` (the active segment) are never
/// remembered: they are checked on every read.
pub(crate) struct Seen<'a>(Option<(&'a AtomicU64, u64)>);

impl Seen<'_> {
    /// The record was checked before (through this map).
    #[inline]
    pub(crate) fn checked(&self) -> bool {
        self.0
            .is_some_and(|(word, bit)| word.load(Ordering::Relaxed) & bit != 0)
    }

    /// Notes that the record passed every check.
    #[inline]
    pub(crate) fn mark(&self) {
        if let Some((word, bit)) = self.0 {
            word.fetch_or(bit, Ordering::Relaxed);
        }
    }
}

/// How much of a record [`Shared::with_record`] checks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Check {
    /// Everything, CRC included, every time (a merge copying the record).
    Always,
    /// Everything the first time through a map; afterwards the header
    /// against the key directory, but not the CRC (reads).
    Once,
}

/// The bounded cache of open files and maps. Reads take it shared, so
/// concurrent readers do not contend; a miss evicts the longest-cached entry
/// when `open_files_max` is reached (a reader still holding it keeps it
/// alive until done).
#[derive(Debug, Default)]
pub(crate) struct Handles {
    open: HashMap<u32, (Handle, u64)>,
    inserted: u64,
}

impl Handles {
    pub(super) fn insert(&mut self, num: u32, handle: Handle, capacity: usize) {
        if self.open.len() >= capacity && !self.open.contains_key(&num) {
            let oldest = self
                .open
                .iter()
                .min_by_key(|(_, (_, at))| *at)
                .map(|(num, _)| *num);
            if let Some(oldest) = oldest {
                self.open.remove(&oldest);
            }
        }
        self.inserted += 1;
        self.open.insert(num, (handle, self.inserted));
    }
}

impl Engine {
    /// Looks up `key`; an expired value (expiry ≤ `now_ms`) is absent.
    pub fn get(&self, key: &[u8], now_ms: u64) -> Result<Option<Item>> {
        self.get_with(key, now_ms, |item| Item {
            value: item.value.to_vec(),
            seq: item.seq,
            expiry_ms: item.expiry_ms,
            meta: item.meta,
        })
    }

    /// [`Engine::get`] without copying the value: `f` sees it in place (in
    /// the sealed file's memory map, or in the buffer a read of the active
    /// segment filled) and its answer is returned. `f` runs at most once,
    /// holding no engine lock.
    pub fn get_with<T>(
        &self,
        key: &[u8],
        now_ms: u64,
        f: impl FnOnce(ItemRef<'_>) -> T,
    ) -> Result<Option<T>> {
        self.shared.note_now(now_ms);
        let mut f = Some(f);
        for _ in 0..READ_ATTEMPTS_MAX {
            let Some(location) = read(&self.shared.keydir).get(key) else {
                return Ok(None);
            };
            if location.expired(now_ms) {
                return Ok(None);
            }
            let found = self.shared.with_value(key, &location, |value| {
                let f = f.take().expect("called at most once");
                f(ItemRef {
                    value,
                    seq: location.seq,
                    expiry_ms: location.expiry_ms,
                    meta: location.meta,
                })
            })?;
            if let Some(answer) = found {
                return Ok(Some(answer));
            }
        }
        Err(Error::Corruption {
            file: String::new(),
            offset: 0,
            reason: format!(
                "key {:?} kept pointing at removed files",
                String::from_utf8_lossy(key)
            ),
        })
    }

    /// `key`'s version, expiry and record meta from the key directory alone: no disk
    /// read (what a write needs to check a condition or to know whether it
    /// replaced a key). An expired key is absent, as in [`Engine::get`].
    pub fn meta(&self, key: &[u8], now_ms: u64) -> Option<ItemMeta> {
        self.shared.note_now(now_ms);
        let location = read(&self.shared.keydir).get(key)?;
        if location.expired(now_ms) {
            return None;
        }
        Some(ItemMeta {
            seq: location.seq,
            expiry_ms: location.expiry_ms,
            value_len: location.value_len,
            meta: location.meta,
        })
    }

    /// Visits keys in order. Expired entries are skipped.
    pub fn scan(&self, scan: &Scan, now_ms: u64) -> Result<Vec<Entry>> {
        Ok(self.scan_inner(scan, now_ms, None)?.0)
    }

    /// [`Engine::scan`], and under the same hold of the key directory (one
    /// consistent state) the number of unexpired keys in the whole range
    /// after `scan.after`, past `scan.limit` too. Counting reads no record.
    /// When no key can have expired at `now_ms` (none carries an expiry,
    /// or `now_ms` is 0) the count comes from the order's chunk lengths, at
    /// a cost that does not grow with the range. Otherwise every key in the
    /// range is visited under the key directory's read lock (writers wait;
    /// ~0.25 s per million keys, `examples/count_profile.rs`), so such a
    /// count stops past `walk_max` keys and answers `None`.
    pub fn scan_counted(
        &self,
        scan: &Scan,
        now_ms: u64,
        walk_max: usize,
    ) -> Result<(Vec<Entry>, Option<Counted>)> {
        let (entries, count) = self.scan_inner(scan, now_ms, Some(walk_max))?;
        let count = count.expect("asked to count");
        Ok((
            entries,
            Some(count).filter(|c| !c.walked || c.keys <= walk_max),
        ))
    }

    /// The scan, counting when asked (a walk stops one key past `walk_max`).
    fn scan_inner(
        &self,
        scan: &Scan,
        now_ms: u64,
        walk_max: Option<usize>,
    ) -> Result<(Vec<Entry>, Option<Counted>)> {
        self.shared.note_now(now_ms);
        let (start, end) = bounds(&scan.range);
        let start = match (&scan.after, start) {
            (Some(after), Bound::Unbounded) => Bound::Excluded(after.clone()),
            (Some(after), Bound::Included(s) | Bound::Excluded(s)) if *after >= s => {
                Bound::Excluded(after.clone())
            }
            (_, start) => start,
        };
        // A merge may retire a file between collecting locations and reading
        // them; then the page is collected again, so a page never mixes
        // records from before and after a batch.
        'attempt: for _ in 0..READ_ATTEMPTS_MAX {
            let (found, count): (Vec<(Vec<u8>, Location)>, Option<Counted>) = {
                let keydir = read(&self.shared.keydir);
                if range_is_empty(&start, &end) {
                    let none = Counted {
                        keys: 0,
                        walked: false,
                    };
                    return Ok((Vec::new(), walk_max.map(|_| none)));
                }
                let (from, to) = (as_ref_bound(&start), as_ref_bound(&end));
                let mut live = keydir
                    .range(from, to)
                    .filter(|(_, location)| !location.expired(now_ms));
                let found: Vec<_> = live
                    .by_ref()
                    .take(scan.limit)
                    .map(|(key, location)| (key.to_vec(), location))
                    .collect();
                let none_expired = now_ms == 0 || keydir.expiring_keys() == 0;
                let count = walk_max.map(|max| {
                    if none_expired {
                        Counted {
                            keys: keydir.count_range(from, to),
                            walked: false,
                        }
                    } else {
                        // One past the most asked for tells there are more.
                        let rest = max.saturating_add(1).saturating_sub(found.len());
                        Counted {
                            keys: found.len() + live.take(rest).count(),
                            walked: true,
                        }
                    }
                });
                (found, count)
            };
            let mut out = Vec::with_capacity(found.len());
            for (key, location) in found {
                let value = if scan.keys_only {
                    None
                } else {
                    match self.shared.with_value(&key, &location, <[u8]>::to_vec)? {
                        Some(value) => Some(value),
                        None => continue 'attempt,
                    }
                };
                out.push(Entry {
                    key,
                    value,
                    seq: location.seq,
                    expiry_ms: location.expiry_ms,
                    meta: location.meta,
                });
            }
            return Ok((out, count));
        }
        Err(Error::Corruption {
            file: String::new(),
            offset: 0,
            reason: "scan kept finding records in removed files".to_string(),
        })
    }

    /// The latest expiry (ms) any put since open carried, 0 = none: while
    /// the caller's clock is below it, some key may still be due to expire
    /// (a high-water mark: deletes and overwrites do not lower it, so it may
    /// be too high, never too low). At open it is the latest expiry of the
    /// live keys (expired or not) only: overwritten or deleted puts, and
    /// puts a retaining merge kept as history, do not count.
    pub fn expiry_high_water_ms(&self) -> u64 {
        read(&self.shared.keydir).expiry_high_ms()
    }
}

fn bounds(range: &KeyRange) -> (Bound<Vec<u8>>, Bound<Vec<u8>>) {
    match range {
        KeyRange::All => (Bound::Unbounded, Bound::Unbounded),
        KeyRange::Prefix(prefix) => (
            Bound::Included(prefix.clone()),
            prefix_end(prefix).map_or(Bound::Unbounded, Bound::Excluded),
        ),
        KeyRange::Range(start, end) => (start.clone(), end.clone()),
    }
}

/// The smallest key greater than every key starting with `prefix`.
fn prefix_end(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < u8::MAX {
            end.push(last + 1);
            return Some(end);
        }
    }
    None
}

fn as_ref_bound(bound: &Bound<Vec<u8>>) -> Bound<&[u8]> {
    match bound {
        Bound::Included(key) => Bound::Included(key.as_slice()),
        Bound::Excluded(key) => Bound::Excluded(key.as_slice()),
        Bound::Unbounded => Bound::Unbounded,
    }
}

/// BTreeMap::range panics on inverted bounds; such a range is simply empty.
fn range_is_empty(start: &Bound<Vec<u8>>, end: &Bound<Vec<u8>>) -> bool {
    match (start, end) {
        (Bound::Included(s), Bound::Included(e)) => s > e,
        (Bound::Included(s), Bound::Excluded(e))
        | (Bound::Excluded(s), Bound::Included(e))
        | (Bound::Excluded(s), Bound::Excluded(e)) => s >= e,
        _ => false,
    }
}

impl Shared {
    /// A way to read file `num`, or `None` if the file left the engine:
    /// sealed files are memory-mapped, the active one is read with pread.
    fn handle(&self, num: u32) -> Result<Option<Handle>> {
        if let Some((handle, _)) = read(&self.handles).open.get(&num) {
            return Ok(Some(handle.clone()));
        }
        let (path, active) = {
            let files = read(&self.files);
            let Some(path) = files.paths.get(&num).cloned() else {
                return Ok(None);
            };
            (path, files.active.is_some_and(|(active, _)| active == num))
        };
        let file = match self.opts.vfs.open(&path) {
            Ok(file) => file,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(Error::io(&path, e)),
        };
        let handle = if active {
            Handle::File(file)
        } else {
            Handle::Map(Arc::new(Mapped::new(
                file.map().map_err(|e| Error::io(&path, e))?,
            )))
        };
        write(&self.handles).insert(num, handle.clone(), self.opts.open_files_max);
        // A merge may have retired the file while it was being opened: do
        // not keep a stale map of it (it would pin its disk space).
        if !read(&self.files).paths.contains_key(&num) {
            self.forget_handle(num);
        }
        Ok(Some(handle))
    }

    pub(crate) fn forget_handle(&self, num: u32) {
        write(&self.handles).open.remove(&num);
    }

    pub(crate) fn file_name(&self, num: u32) -> String {
        read(&self.files)
            .paths
            .get(&num)
            .and_then(|p| p.file_name()?.to_str().map(str::to_string))
            .unwrap_or_else(|| format!("file #{num}"))
    }

    /// Hands the `size` bytes at `offset` of file `num` to `f`, with what
    /// earlier reads through the same map checked of the record starting
    /// there: [`RecordBytes::Gone`] if the file left the engine meanwhile (a
    /// merge swapped it out), [`RecordBytes::OutOfRange`] if the file is
    /// shorter.
    #[inline]
    pub(crate) fn with_bytes<T>(
        &self,
        num: u32,
        offset: u64,
        size: usize,
        f: impl FnOnce(&[u8], Seen<'_>) -> T,
    ) -> Result<RecordBytes<T>> {
        let Some(handle) = self.handle(num)? else {
            return Ok(RecordBytes::Gone);
        };
        match &handle {
            Handle::Map(mapped) => {
                let bytes = mapped.bytes();
                let range = usize::try_from(offset)
                    .ok()
                    .and_then(|start| Some(start..start.checked_add(size)?));
                match range.and_then(|range| bytes.get(range)) {
                    Some(record) => {
                        let grain = offset as usize / CHECKED_GRAIN_BYTES;
                        let seen = Seen(
                            mapped
                                .checked
                                .get(grain / 64)
                                .map(|word| (word, 1u64 << (grain % 64))),
                        );
                        Ok(RecordBytes::Read(f(record, seen)))
                    }
                    None => Ok(RecordBytes::OutOfRange {
                        file_len: bytes.len() as u64,
                    }),
                }
            }
            Handle::File(file) => {
                let mut bytes = vec![0u8; size];
                match file.read_exact_at(&mut bytes, offset) {
                    Ok(()) => Ok(RecordBytes::Read(f(&bytes, Seen(None)))),
                    Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                        Ok(RecordBytes::OutOfRange {
                            file_len: file.len().unwrap_or(0),
                        })
                    }
                    Err(e) => Err(Error::Corruption {
                        file: self.file_name(num),
                        offset,
                        reason: format!("record unreadable: {e}"),
                    }),
                }
            }
        }
    }

    /// Hands the whole record at `location` and its decoded header, checked
    /// against the key directory (sequence, key length, value length, meta)
    /// and, as `check` says, against its CRC, to `f`; `None` if its file
    /// left the engine meanwhile (a merge swapped it out: look the key up
    /// again).
    pub(crate) fn with_record<T>(
        &self,
        key_len: usize,
        location: &Location,
        check: Check,
        f: impl FnOnce(&RecordHeader, &[u8]) -> T,
    ) -> Result<Option<T>> {
        let size = location.record_size(key_len);
        let offset = u64::from(location.offset);
        let corruption = |reason: String| Error::Corruption {
            file: self.file_name(location.file),
            offset,
            reason,
        };
        let checked = self.with_bytes(location.file, offset, size, |record, seen| {
            let skip_crc = check == Check::Once && seen.checked();
            let header = if skip_crc {
                decode_record_header(record, record.len() as u64)
            } else {
                verify_record(record)
            };
            match header {
                Ok(header)
                    if header.kind == crate::format::RecordKind::Put
                        && header.record_size() == record.len()
                        && header.seq == location.seq
                        && header.key_len as usize == key_len
                        && header.value_len == location.value_len
                        && header.split(record).0 == location.meta.as_bytes() =>
                {
                    if !skip_crc {
                        seen.mark();
                    }
                    Ok(f(&header, record))
                }
                Ok(_) => Err(corruption(
                    "record is not the one the key directory names".to_string(),
                )),
                Err(fault) => Err(corruption(format!("{fault:?}"))),
            }
        })?;
        match checked {
            RecordBytes::Gone => Ok(None),
            RecordBytes::OutOfRange { file_len } => Err(corruption(format!(
                "record runs past the end of the {file_len}-byte file"
            ))),
            RecordBytes::Read(result) => result.map(Some),
        }
    }

    /// Hands the value of `key`'s record at `location` to `f`; `None` if the
    /// file left the engine meanwhile (look the key up again).
    fn with_value<T>(
        &self,
        key: &[u8],
        location: &Location,
        f: impl FnOnce(&[u8]) -> T,
    ) -> Result<Option<T>> {
        let value = self.with_record(key.len(), location, Check::Once, |header, record| {
            let (_, found_key, value) = header.split(record);
            (found_key == key).then(|| f(value))
        })?;
        match value {
            Some(Some(answer)) => Ok(Some(answer)),
            Some(None) => Err(Error::Corruption {
                file: self.file_name(location.file),
                offset: location.offset as u64,
                reason: "record holds another key".to_string(),
            }),
            None => Ok(None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_end_skips_trailing_max_bytes() {
        assert_eq!(prefix_end(b"ab"), Some(b"ac".to_vec()));
        assert_eq!(prefix_end(&[1, 0xff]), Some(vec![2]));
        assert_eq!(prefix_end(&[0xff, 0xff]), None);
    }
}
