//! Merge: rewrite the live records of a prefix of the sealed files into new
//! files, then swap them in.
//!
//! The input is (the input files, the records of theirs that are live at the
//! cut-off, the "now" for expiry, and optionally a retention predicate).
//! The output is a function of that input alone: live records are copied
//! byte for byte in key order, parts rotate at the same size threshold as
//! segments, and the last part ends with the commit record of the inputs'
//! last batch (so the highest sequence and the last metadata survive).
//! Because the inputs are a prefix that includes all earlier merge output,
//! every older version of a key in them is in them too, so tombstones and
//! expired records are simply dropped — unless the predicate keeps them.
//!
//! Retention ([`Retain`]): the merge walks the inputs' records (hints, no
//! values) and asks the predicate about each; of those it would drop, the
//! ones kept are copied byte for byte too, in (key, sequence) order, a
//! key's history before its live record. Recovery replays files in order
//! and the last record of a key wins, so sequence order within a key keeps
//! the live record the winner. One more rule makes that hold whatever the
//! predicate says, so a kept older put can never come back to life: when
//! anything of a key is kept and its live record is in the inputs, that
//! record is copied even if it expired (it stays in the key directory then,
//! expired, as it does after a restart); when its live record is not in the
//! inputs (the key is deleted, or lives in a later file), the key's last
//! tombstone in the inputs is kept if it is newer than every kept record of
//! the key. A later file needs nothing: it is replayed after the merge
//! output.
//! Without a predicate, or when it keeps nothing, the output is byte for
//! byte what it was before retention existed.
//!
//! Crash safety: parts are written as `*.tmp`, fsynced, renamed from the
//! last part down to part 1, the directory fsynced, then part 0 renamed and
//! the directory fsynced again. Recovery treats a generation without part 0
//! as never having happened, and one with part 0 as complete. Inputs are
//! deleted only after that, and a pinned input only at its last unpin.

use std::collections::HashSet;
use std::ops::Range;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use crate::engine::{
    Check, FileMeta, MergeReport, RecordBytes, Retain, Shared, StoredKind, lock, read, write,
};
use crate::error::{Error, Result};
use crate::format::{
    DATA_MAGIC, FileId, HintEntry, RECORD_HEADER_SIZE_BYTES, RecordKind, TEMP_SUFFIX,
    encode_record, path_in, verify_record,
};
use crate::hint::HintWriter;
use crate::keydir::Location;
use crate::options::MERGE_SWAP_CHUNK_KEYS;
use crate::walk::{Walked, walk_file};
use vfs::VfsFile;

/// Output bytes buffered before a write.
const MERGE_WRITE_BUFFER_BYTES: usize = 1 << 20;
/// Records handled between two checks whether the engine was closed.
const CLOSED_CHECK_EVERY_RECORDS: usize = 1024;

struct Part {
    id: FileId,
    tmp_path: PathBuf,
    file: Arc<dyn VfsFile>,
    len: u64,
    buf: Vec<u8>,
    hasher: crc32fast::Hasher,
    hint: HintWriter,
    max_seq: u64,
}

impl Part {
    fn flush(&mut self) -> Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let written = self.len - self.buf.len() as u64;
        self.file
            .write_all_at(&self.buf, written)
            .map_err(|e| Error::io(&self.tmp_path, e))?;
        self.hasher.update(&self.buf);
        self.buf.clear();
        Ok(())
    }
}

/// A record copied into the output: where it went.
struct Moved {
    index: usize,
    part: usize,
    offset: u32,
}

/// A merge whose input is captured: the inputs and the records of theirs
/// that were live at the cut-off. [`MergeJob::run`] writes the output and
/// swaps it in, on any thread, while reads and writes go on. Only one merge
/// exists at a time: capturing another waits for this one to finish or drop
/// (under [`MergeJob::run_then`], for its follow-up to return).
#[derive(Debug)]
pub struct MergeJob {
    shared: Arc<Shared>,
    /// Taken out by [`MergeJob::run_then`] to outlive the run.
    slot: Option<MergeSlot>,
    input_metas: Vec<Arc<FileMeta>>,
    live: Vec<(Vec<u8>, Location)>,
    cutoff: u64,
    boundary: u64,
    last_commit_seq: u64,
    last_commit_meta: Vec<u8>,
    now_ms: u64,
    retain: Option<Retain>,
}

/// The right to run the one merge; released on drop.
#[derive(Debug)]
struct MergeSlot(Arc<Shared>);

impl MergeSlot {
    fn take(shared: &Arc<Shared>) -> MergeSlot {
        let mut running = lock(&shared.merge_running);
        while *running {
            running = shared
                .merge_done
                .wait(running)
                .unwrap_or_else(|poisoned| poisoned.into_inner());
        }
        *running = true;
        MergeSlot(shared.clone())
    }
}

impl Drop for MergeSlot {
    fn drop(&mut self) {
        *lock(&self.0.merge_running) = false;
        self.0.merge_done.notify_all();
    }
}

/// Captures and runs a merge in the calling thread.
pub(crate) fn merge(
    shared: &Arc<Shared>,
    inputs: &[String],
    now_ms: u64,
    retain: Option<Retain>,
) -> Result<MergeReport> {
    begin(shared, inputs, now_ms, retain)?.run()
}

/// Captures a merge of `inputs` at the engine's current state (see
/// [`MergeJob`]), keeping what `retain` asks for of what it would drop.
pub(crate) fn begin(
    shared: &Arc<Shared>,
    inputs: &[String],
    now_ms: u64,
    retain: Option<Retain>,
) -> Result<MergeJob> {
    let slot = MergeSlot::take(shared);
    shared.check_poison()?;

    // 1. Inputs: a non-empty prefix of the sealed files covering every merge part.
    let input_metas: Vec<Arc<FileMeta>> = {
        let files = read(&shared.files);
        let sealed = &files.sealed;
        if inputs.is_empty() || inputs.len() > sealed.len() {
            return Err(Error::MergeInput(format!(
                "{} inputs given; there are {} sealed files",
                inputs.len(),
                sealed.len()
            )));
        }
        for (given, meta) in inputs.iter().zip(sealed.iter()) {
            if *given != meta.id.data_name() {
                return Err(Error::MergeInput(format!(
                    "inputs must be a prefix of the sealed files in order; expected {}, got {given}",
                    meta.id.data_name()
                )));
            }
        }
        if let Some(meta) = sealed.get(inputs.len())
            && matches!(meta.id, FileId::Merge { .. })
        {
            return Err(Error::MergeInput(format!(
                "inputs must include every part of the earlier merge; {} is missing",
                meta.id.data_name()
            )));
        }
        sealed[..inputs.len()].to_vec()
    };
    let input_nums: HashSet<u32> = input_metas.iter().map(|meta| meta.num).collect();
    let (last_commit_seq, last_commit_meta) = input_metas
        .last()
        .and_then(|meta| meta.last_commit.clone())
        .ok_or_else(|| Error::MergeInput("the last input holds no commit record".to_string()))?;
    let boundary = input_metas
        .iter()
        .map(|meta| meta.max_seq)
        .max()
        .unwrap_or(0)
        .saturating_add(1);

    // 2. Capture the live records at the cut-off.
    let (cutoff, live): (u64, Vec<(Vec<u8>, Location)>) = {
        let keydir = read(&shared.keydir);
        let live = keydir
            .iter()
            .filter(|(_, location)| input_nums.contains(&location.file))
            .map(|(key, location)| (key.to_vec(), location))
            .collect();
        (keydir.applied_seq(), live)
    };
    let earlier_cutoff = input_metas.iter().find_map(|meta| match meta.id {
        FileId::Merge {
            cutoff: earlier, ..
        } if earlier >= cutoff => Some(earlier),
        _ => None,
    });
    if let Some(earlier) = earlier_cutoff {
        return Err(Error::MergeInput(format!(
            "nothing was written since the merge at cut-off {earlier}; merging again would change nothing"
        )));
    }

    Ok(MergeJob {
        shared: shared.clone(),
        slot: Some(slot),
        input_metas,
        live,
        cutoff,
        boundary,
        last_commit_seq,
        last_commit_meta,
        now_ms,
        retain,
    })
}

impl MergeJob {
    /// The cut-off sequence: the output is named after it.
    pub fn cutoff(&self) -> u64 {
        self.cutoff
    }

    /// [`MergeJob::run`], then `then` with its outcome while the merge is
    /// still the one that exists: capturing the next merge waits for
    /// `then` too. A caller that must read the outputs, or repoint its own
    /// index at them, before a next merge can swap them away does it here.
    /// `then` must not capture a merge on this engine, nor wait for a thread
    /// that may be capturing one (that thread waits for `then`: deadlock).
    /// A panic in `run` or `then` lets the slot go as it unwinds.
    pub fn run_then<T>(mut self, then: impl FnOnce(Result<MergeReport>) -> T) -> T {
        let slot = self.slot.take();
        let answer = then(self.run());
        drop(slot);
        answer
    }

    /// Writes the output, swaps it in and retires the inputs.
    pub fn run(self) -> Result<MergeReport> {
        let MergeJob {
            shared,
            slot: _,
            input_metas,
            live,
            cutoff,
            boundary,
            last_commit_seq,
            last_commit_meta,
            now_ms,
            retain,
        } = self;
        let shared = &shared;
        shared.check_poison()?;
        let vfs = shared.opts.vfs.as_ref();
        // Make the cut-off durable before any output names it: otherwise a power
        // cut could leave a merge generation named after sequence numbers the
        // write stream no longer holds, and they would be handed out again.
        let written = lock(&shared.writer).written_total;
        shared.sync_to(written)?;
        let last_commit = (last_commit_seq, last_commit_meta);
        // 3. Plan what history to keep (nothing without a predicate), then
        //    write the output parts.
        let history = match &retain {
            None => History::default(),
            Some(retain) => plan_history(shared, &input_metas, &live, now_ms, retain)?,
        };
        let mut output = Output::default();
        let result = write_parts(
            shared,
            &mut output,
            &live,
            &history,
            cutoff,
            boundary,
            now_ms,
            &last_commit,
        );
        let Output {
            parts,
            moved,
            dropped,
            retained,
        } = output;
        if let Err(e) = result {
            for part in parts {
                let _ = vfs.remove(&part.tmp_path);
                part.hint.discard(vfs);
            }
            return Err(e);
        }
        // 4. Publish: hints, parts n-1..1, directory fsync, part 0, directory fsync.
        let outputs = publish(shared, parts, &last_commit)?;
        // 5. Swap: register the outputs, repoint the keys chunk by chunk, then
        //    replace the inputs in the sealed list.
        let new_metas = swap_in(shared, outputs, &live, &moved, &dropped, &input_metas);
        retire_inputs(shared, &input_metas);
        shared.merges.fetch_add(1, Ordering::SeqCst);
        let report = MergeReport {
            cutoff,
            inputs: input_metas.iter().map(|meta| meta.id.data_name()).collect(),
            outputs: new_metas.iter().map(|meta| meta.id.data_name()).collect(),
            records_kept: moved.len() as u64,
            records_retained: retained,
            bytes_before: input_metas.iter().map(|meta| meta.len).sum(),
            bytes_after: new_metas.iter().map(|meta| meta.len).sum(),
        };
        tracing::info!(
            cutoff,
            inputs = report.inputs.len(),
            outputs = report.outputs.len(),
            bytes_before = report.bytes_before,
            bytes_after = report.bytes_after,
            records_retained = report.records_retained,
            "merge swapped in"
        );
        Ok(report)
    }
}

/// What step 3 wrote: the parts (as `*.tmp` files), where each copied
/// live record went, the records dropped as expired (indices into `live`),
/// and how many history records were copied.
#[derive(Default)]
struct Output {
    parts: Vec<Part>,
    moved: Vec<Moved>,
    dropped: Vec<usize>,
    retained: u64,
}

/// What a retaining merge keeps besides the live records (nothing without
/// a predicate).
#[derive(Default)]
struct History {
    /// The keys of `records`, back to back.
    keys: Vec<u8>,
    /// Superseded puts and tombstones to copy, in (key, sequence) order.
    records: Vec<Retained>,
    /// Indices into `live` of expired records to keep, ascending.
    expired_kept: Vec<usize>,
}

impl History {
    /// The key of `record`.
    fn key(&self, record: &Retained) -> &[u8] {
        &self.keys[record.key.clone()]
    }
}

/// A record of the inputs the plan looked at: where it is, and where its
/// key is in the plan's key bytes.
#[derive(Clone)]
struct Retained {
    key: Range<usize>,
    kind: StoredKind,
    seq: u64,
    /// Engine file number of the input holding it.
    num: u32,
    offset: u32,
    size: u32,
}

/// Step 3a: walks the inputs' records in file order (hints; a data file
/// only where its hint is missing), asks `retain` about each, and returns
/// what to keep besides the live records: the kept superseded records by
/// key and sequence, and the kept expired live ones. Applies the rule that
/// keeps a record newer than those kept where one is needed (see the module
/// documentation).
///
/// Cheap when the predicate keeps little: a record costs its hint entry's
/// decoding and one predicate call. The plan remembers only the kept
/// records and, once something is kept, the tombstones (which the rule may
/// need); it sorts them by key and sequence and matches them against `live`
/// in one pass. Inputs whose records are all below [`Retain::min_seq`] are
/// not read at all.
fn plan_history(
    shared: &Shared,
    input_metas: &[Arc<FileMeta>],
    live: &[(Vec<u8>, Location)],
    now_ms: u64,
    retain: &Retain,
) -> Result<History> {
    let vfs = shared.opts.vfs.as_ref();
    let mut keys: Vec<u8> = Vec::new();
    // (record, whether the predicate kept it)
    let mut seen: Vec<(Retained, bool)> = Vec::new();
    let mut walked = 0usize;
    // Nothing below `min_seq` is kept, and any record that a kept one needs
    // is newer than it: records below it need no look, files holding
    // nothing else no read.
    let min_seq = retain.min_seq();
    for meta in input_metas.iter().filter(|meta| meta.max_seq >= min_seq) {
        let num = meta.num;
        walk_file(
            vfs,
            &shared.dir,
            &meta.id,
            meta.len,
            true,
            &mut |record: &Walked<'_>| {
                walked += 1;
                if walked.is_multiple_of(CLOSED_CHECK_EVERY_RECORDS)
                    && shared.closed.load(Ordering::SeqCst)
                {
                    return Err(Error::Closed);
                }
                let view = &record.view;
                if view.seq < min_seq {
                    return Ok(());
                }
                // Asked about live records too: the answer does not matter
                // for those, and telling them apart takes a look at `live`
                // that asking first spares every record it does not keep.
                let kept = retain.keeps(view);
                // A tombstone matters only after a kept record of its key;
                // until something is kept, none does.
                let tombstone_after_kept = view.kind == StoredKind::Tombstone && !seen.is_empty();
                if kept || tombstone_after_kept {
                    let start = keys.len();
                    keys.extend_from_slice(view.key);
                    seen.push((
                        Retained {
                            key: start..keys.len(),
                            kind: view.kind,
                            seq: view.seq,
                            num,
                            offset: record.offset,
                            size: record.size,
                        },
                        kept,
                    ));
                }
                Ok(())
            },
        )?;
    }
    seen.sort_unstable_by(|(a, _), (b, _)| {
        keys[a.key.clone()]
            .cmp(&keys[b.key.clone()])
            .then(a.seq.cmp(&b.seq))
    });
    let mut history = History::default();
    // `seen` and `live` are both in key order: one pass over each.
    let mut live_cursor = 0;
    for group in seen.chunk_by(|(a, _), (b, _)| keys[a.key.clone()] == keys[b.key.clone()]) {
        // Tombstones of a key with nothing kept need nothing.
        let Some(last_kept) = group.iter().rposition(|(_, kept)| *kept) else {
            continue;
        };
        let key = &keys[group[0].0.key.clone()];
        while live
            .get(live_cursor)
            .is_some_and(|(live_key, _)| live_key.as_slice() < key)
        {
            live_cursor += 1;
        }
        let live_index = live
            .get(live_cursor)
            .is_some_and(|(live_key, _)| live_key.as_slice() == key)
            .then_some(live_cursor);
        let kept = group[..=last_kept]
            .iter()
            .filter(|(_, kept)| *kept)
            .map(|(record, _)| record);
        let start = history.records.len();
        match live_index {
            // The key's directory record is in the inputs: it is the key's
            // latest record there and is copied with the live records
            // (expired or not, now that something older of the key stays).
            Some(index) => {
                let live_seq = live[index].1.seq;
                if live[index].1.expired(now_ms) {
                    history.expired_kept.push(index);
                }
                history.records.extend(
                    kept.filter(|record| {
                        !(record.kind == StoredKind::Put && record.seq == live_seq)
                    })
                    .cloned(),
                );
            }
            // Deleted (in the inputs or later), or live in a later file: the
            // last tombstone after the kept records (if any) keeps them from
            // coming back.
            None => {
                history.records.extend(kept.cloned());
                if last_kept + 1 < group.len() {
                    let (tombstone, _) = &group[group.len() - 1];
                    history.records.push(tombstone.clone());
                }
            }
        }
        // Point the records at the history's own copy of the key.
        let key_start = history.keys.len();
        history.keys.extend_from_slice(key);
        for record in &mut history.records[start..] {
            record.key = key_start..history.keys.len();
        }
    }
    history.expired_kept.sort_unstable();
    Ok(history)
}

/// A part written and fsynced under its temporary name: what the swap
/// registers once it has its final name.
struct WrittenPart {
    id: FileId,
    tmp_path: PathBuf,
    len: u64,
    crc: u32,
    max_seq: u64,
    last_commit: Option<(u64, Vec<u8>)>,
}

/// Step 3b: copies the live records of `live` (those not expired at
/// `now_ms`, and the expired ones `history` keeps) in key order into parts
/// named after `cutoff`, each key's kept history just before it, rotating
/// at the segment size; ends the last part with the inputs' last commit
/// record, and fsyncs every part. On error the caller deletes what
/// `output` holds.
#[allow(clippy::too_many_arguments)]
fn write_parts(
    shared: &Shared,
    output: &mut Output,
    live: &[(Vec<u8>, Location)],
    history: &History,
    cutoff: u64,
    boundary: u64,
    now_ms: u64,
    (last_commit_seq, last_commit_meta): &(u64, Vec<u8>),
) -> Result<()> {
    let Output {
        parts,
        moved,
        dropped,
        retained,
    } = output;
    moved.reserve(live.len());
    parts.push(new_part(shared, cutoff, 0, boundary)?);
    let mut history_records = history.records.iter().peekable();
    let mut expired_kept = history.expired_kept.iter().copied().peekable();
    for (index, (key, location)) in live.iter().enumerate() {
        if index.is_multiple_of(CLOSED_CHECK_EVERY_RECORDS) && shared.closed.load(Ordering::SeqCst)
        {
            return Err(Error::Closed);
        }
        // The kept history of the keys up to this one (a key's history
        // has lower sequence numbers than its live record: it goes first).
        while let Some(record) =
            history_records.next_if(|record| history.key(record) <= key.as_slice())
        {
            copy_retained(shared, parts, cutoff, boundary, history, record)?;
            *retained += 1;
        }
        let keep_expired = expired_kept.next_if_eq(&index).is_some();
        if location.expired(now_ms) && !keep_expired {
            dropped.push(index);
            continue;
        }
        current_part(shared, parts, cutoff, boundary)?;
        let part_index = parts.len() - 1;
        let part = parts.last_mut().expect("one part at least");
        let offset = part.len as u32;
        // Byte for byte: a record with meta (kind 4) carries it along.
        let copied = shared.with_record(key.len(), location, Check::Always, |_, record| {
            part.buf.extend_from_slice(record);
            record.len() as u64
        })?;
        let Some(copied) = copied else {
            return Err(vanished(location.file, location.offset));
        };
        part.len += copied;
        part.max_seq = part.max_seq.max(location.seq);
        part.hint.add(&HintEntry {
            kind: RecordKind::Put,
            key,
            value_len: location.value_len,
            offset,
            seq: location.seq,
            expiry_ms: location.expiry_ms,
            meta: location.meta.as_bytes(),
        })?;
        moved.push(Moved {
            index,
            part: part_index,
            offset,
        });
        if part.buf.len() >= MERGE_WRITE_BUFFER_BYTES {
            part.flush()?;
        }
    }
    for (count, record) in history_records.enumerate() {
        if count.is_multiple_of(CLOSED_CHECK_EVERY_RECORDS) && shared.closed.load(Ordering::SeqCst)
        {
            return Err(Error::Closed);
        }
        copy_retained(shared, parts, cutoff, boundary, history, record)?;
        *retained += 1;
    }
    let part = parts.last_mut().expect("one part at least");
    let offset = part.len as u32;
    let before = part.buf.len();
    encode_record(
        &mut part.buf,
        RecordKind::Commit,
        *last_commit_seq,
        0,
        &[],
        &[],
        last_commit_meta,
    );
    part.len += (part.buf.len() - before) as u64;
    part.max_seq = part.max_seq.max(*last_commit_seq);
    part.hint.commit(last_commit_meta, offset, *last_commit_seq);
    for part in parts.iter_mut() {
        part.flush()?;
        let name = part
            .tmp_path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        shared.sync_file(part.file.as_ref(), name)?;
    }
    Ok(())
}

/// The part the next record goes into: the last one, or a new one once the
/// last reached the segment size.
#[inline]
fn current_part<'a>(
    shared: &Shared,
    parts: &'a mut Vec<Part>,
    cutoff: u64,
    boundary: u64,
) -> Result<&'a mut Part> {
    if parts.last().expect("one part at least").len >= shared.opts.segment_size_bytes {
        let next = parts.len() as u32;
        parts.push(new_part(shared, cutoff, next, boundary)?);
    }
    Ok(parts.last_mut().expect("one part at least"))
}

/// Copies one kept history record byte for byte into the current part, with
/// the hint entry a scan of the output would write for it.
fn copy_retained(
    shared: &Shared,
    parts: &mut Vec<Part>,
    cutoff: u64,
    boundary: u64,
    history: &History,
    record: &Retained,
) -> Result<()> {
    let part = current_part(shared, parts, cutoff, boundary)?;
    let offset = part.len;
    let corruption = |reason: String| Error::Corruption {
        file: shared.file_name(record.num),
        offset: u64::from(record.offset),
        reason,
    };
    let copied = shared.with_bytes(
        record.num,
        u64::from(record.offset),
        record.size as usize,
        |bytes, _| -> Result<()> {
            let header = verify_record(bytes).map_err(|fault| corruption(format!("{fault:?}")))?;
            let (meta, key, _) = header.split(bytes);
            let kind = match record.kind {
                StoredKind::Put => RecordKind::Put,
                StoredKind::Tombstone => RecordKind::Tombstone,
            };
            if header.kind != kind || header.seq != record.seq || key != history.key(record) {
                return Err(corruption(
                    "record is not the one the merge's walk of its hint found".to_string(),
                ));
            }
            part.buf.extend_from_slice(bytes);
            part.hint
                .add(&HintEntry::of_record(&header, meta, key, offset))
        },
    )?;
    match copied {
        RecordBytes::Read(result) => result?,
        RecordBytes::Gone => return Err(vanished(record.num, record.offset)),
        RecordBytes::OutOfRange { file_len } => {
            return Err(corruption(format!(
                "record runs past the end of the {file_len}-byte file"
            )));
        }
    }
    part.len += u64::from(record.size);
    part.max_seq = part.max_seq.max(record.seq);
    if part.buf.len() >= MERGE_WRITE_BUFFER_BYTES {
        part.flush()?;
    }
    Ok(())
}

/// The error for an input that left the engine during its merge (only the
/// merge itself retires inputs, so this is a bug or tampering).
fn vanished(num: u32, offset: u32) -> Error {
    Error::Corruption {
        file: format!("file #{num}"),
        offset: u64::from(offset),
        reason: "merge input vanished during the merge".to_string(),
    }
}

/// Step 4: finishes the parts' hints, then renames parts n-1..1 to their
/// final names, fsyncs the directory, renames part 0 and fsyncs again (part
/// 0 makes the generation complete). A failure poisons the engine.
fn publish(
    shared: &Shared,
    parts: Vec<Part>,
    last_commit: &(u64, Vec<u8>),
) -> Result<Vec<WrittenPart>> {
    let vfs = shared.opts.vfs.as_ref();
    let dir = &shared.dir;
    let mut outputs = Vec::with_capacity(parts.len());
    let last_part = parts.len() - 1;
    for (index, part) in parts.into_iter().enumerate() {
        let crc = part.hasher.clone().finalize();
        part.hint
            .finish(vfs, part.len, crc)
            .map_err(|e| shared.poison(e))?;
        outputs.push(WrittenPart {
            id: part.id,
            tmp_path: part.tmp_path,
            len: part.len,
            crc,
            max_seq: part.max_seq,
            last_commit: (index == last_part).then(|| last_commit.clone()),
        });
    }
    let sync_dir = || {
        vfs.sync_dir(dir)
            .map_err(|e| shared.poison(Error::io(dir, e)))
    };
    for output in outputs.iter().skip(1).rev() {
        vfs.rename(&output.tmp_path, &path_in(dir, &output.id.data_name()))
            .map_err(|e| shared.poison(Error::io(&output.tmp_path, e)))?;
    }
    sync_dir()?;
    let first = &outputs[0];
    vfs.rename(&first.tmp_path, &path_in(dir, &first.id.data_name()))
        .map_err(|e| shared.poison(Error::io(&first.tmp_path, e)))?;
    sync_dir()?;
    Ok(outputs)
}

/// Step 5: registers the outputs, repoints the moved keys and removes the
/// dropped ones chunk by chunk (readers and writers wait at most one
/// chunk), then replaces the inputs in the sealed list. Returns the
/// outputs' metadata.
fn swap_in(
    shared: &Shared,
    outputs: Vec<WrittenPart>,
    live: &[(Vec<u8>, Location)],
    moved: &[Moved],
    dropped: &[usize],
    input_metas: &[Arc<FileMeta>],
) -> Vec<Arc<FileMeta>> {
    let new_metas: Vec<Arc<FileMeta>> = {
        let mut files = write(&shared.files);
        outputs
            .into_iter()
            .map(|output| {
                let num = files.allocate(path_in(&shared.dir, &output.id.data_name()));
                Arc::new(FileMeta {
                    id: output.id,
                    num,
                    len: output.len,
                    crc: output.crc,
                    max_seq: output.max_seq,
                    last_commit: output.last_commit,
                })
            })
            .collect()
    };
    for chunk in moved.chunks(MERGE_SWAP_CHUNK_KEYS) {
        let mut keydir = write(&shared.keydir);
        for item in chunk {
            let (key, location) = &live[item.index];
            keydir.repoint(key, location.seq, new_metas[item.part].num, item.offset);
        }
    }
    for chunk in dropped.chunks(MERGE_SWAP_CHUNK_KEYS) {
        let mut keydir = write(&shared.keydir);
        for index in chunk {
            let (key, location) = &live[*index];
            keydir.remove_if_seq(key, location.seq);
        }
    }
    {
        let mut files = write(&shared.files);
        let rest = files.sealed.split_off(input_metas.len());
        files.sealed = new_metas.iter().cloned().chain(rest).collect();
        for meta in input_metas {
            files.paths.remove(&meta.num);
        }
        let mut keydir = write(&shared.keydir);
        for meta in input_metas {
            keydir.drop_file(meta.num);
        }
    }
    new_metas
}

/// Deletes the swapped-out inputs (a pinned one at its last unpin).
fn retire_inputs(shared: &Shared, input_metas: &[Arc<FileMeta>]) {
    for meta in input_metas {
        shared.forget_handle(meta.num);
        shared.retire_file(&meta.id.hint_name());
        shared.retire_file(&meta.id.data_name());
    }
    if let Err(e) = shared.opts.vfs.sync_dir(&shared.dir) {
        // The swap already happened; a later open deletes leftovers anyway.
        tracing::warn!(error = %e, "directory fsync after deleting merge inputs failed");
    }
}

fn new_part(shared: &Shared, cutoff: u64, part: u32, boundary: u64) -> Result<Part> {
    let vfs = shared.opts.vfs.as_ref();
    let id = FileId::Merge { cutoff, part };
    let tmp_path = path_in(&shared.dir, &format!("{}{TEMP_SUFFIX}", id.data_name()));
    let file = vfs.create(&tmp_path).map_err(|e| Error::io(&tmp_path, e))?;
    let header = id.header(boundary);
    let bytes = header.encode(DATA_MAGIC);
    let hint = HintWriter::create(vfs, &shared.dir, &id, &header)?;
    let mut buf = Vec::with_capacity(MERGE_WRITE_BUFFER_BYTES + RECORD_HEADER_SIZE_BYTES);
    buf.extend_from_slice(&bytes);
    Ok(Part {
        id,
        tmp_path,
        file,
        len: bytes.len() as u64,
        buf,
        hasher: crc32fast::Hasher::new(),
        hint,
        max_seq: 0,
    })
}
