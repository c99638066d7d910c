//! The tunables of a [`crate::LogStore`] and the fsync observer hook.

use std::sync::Arc;
use std::time::Duration;

use crate::limits::{LOG_CACHE_BYTES_MAX, LOG_SEGMENT_SIZE_BYTES};

/// Tunables of a [`LogStore`](crate::LogStore); the defaults are the named constants.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LogStoreOptions {
    /// Segment rotation size in bytes ([`LOG_SEGMENT_SIZE_BYTES`]).
    pub segment_size_bytes: u64,
    /// Bytes of fsynced entry payloads kept in memory ([`LOG_CACHE_BYTES_MAX`]).
    pub cache_bytes_max: usize,
    /// Whether `save_committed` makes the committed log id durable (default
    /// `false`). openraft (0.9 and 0.10) calls it every time the commit index moves,
    /// awaited on the Raft core's path before the apply, so persisting it
    /// costs a file fsync and a directory fsync per commit (half of a
    /// one-client put's latency). With `false` it is kept in memory only:
    /// after a restart openraft takes the state machine's applied id and
    /// learns the rest from the leader. That is safe only because [`LogStore::open`](crate::LogStore::open)
    /// never hands back a committed vote (see there), so a member that led
    /// before a restart must win a new election, with a fresh no-op entry,
    /// before it serves a linearizable read.
    pub persist_committed: bool,
}

/// Called with the duration of every fsync that covers appended entries
/// (success or failure), on the writer thread: it must be quick. The node
/// feeds it to its metrics; the store itself knows nothing of them.
pub type FsyncObserver = Arc<dyn Fn(Duration) + Send + Sync>;

impl Default for LogStoreOptions {
    fn default() -> Self {
        LogStoreOptions {
            segment_size_bytes: LOG_SEGMENT_SIZE_BYTES,
            cache_bytes_max: LOG_CACHE_BYTES_MAX,
            persist_committed: false,
        }
    }
}
