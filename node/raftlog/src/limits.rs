//! The size limits of the log store; [`crate::LogStoreOptions`] takes its
//! defaults from them.

/// A segment rotates when the next batch would take it past this many bytes
/// (a single batch larger than this still goes into one segment).
pub const LOG_SEGMENT_SIZE_BYTES: u64 = 64 * 1024 * 1024;

/// Largest record body (encoded log id + encoded entry), in bytes. The
/// cluster caps one Raft entry's payload at 4 MiB (DESIGN §4); this leaves
/// room for the entry's framing and for membership entries. An append with a
/// larger entry fails; recovery treats a larger length field as damage.
pub const LOG_ENTRY_SIZE_BYTES_MAX: usize = 8 * 1024 * 1024;

/// Bytes of recent, already fsynced entry payloads kept in memory so that
/// replication of fresh entries does not read the disk. Entries not yet
/// fsynced are always in memory, on top of this budget.
pub const LOG_CACHE_BYTES_MAX: usize = 64 * 1024 * 1024;

/// Largest metadata file (vote, committed, purge point) accepted at open, in
/// bytes.
pub const META_FILE_BYTES_MAX: u64 = 64 * 1024;

/// Most queued append batches one fsync covers (group commit in the writer
/// thread). Bounds the work between two callbacks.
pub const GROUP_COMMIT_BATCHES_MAX: usize = 256;

/// Zeros the writer keeps written (and fsynced with the records) past the
/// end of the active segment: an append into space that already holds
/// zeros leaves the file's size and blocks as they were, so its fdatasync
/// flushes data only, not the filesystem's journal (about a third faster
/// and a quarter cheaper in CPU on ext4 here: `deploy/bench/fsync-modes.py`).
/// The file grows by this much at a time, inside the fsync of the batch that
/// reached the end of the zeros.
pub const LOG_FILL_AHEAD_BYTES: u64 = 256 * 1024;
