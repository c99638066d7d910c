//! Test hooks for the cluster tests: a write whose reply is lost after it
//! committed, and peer links cut in both directions. Every hook is off by
//! default and costs one atomic load (or an uncontended lock) when off;
//! nothing outside the tests turns them on.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Shared switches; clones see the same state.
#[derive(Clone, Debug, Default)]
pub struct Faults {
    inner: Arc<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    drop_write_replies: AtomicBool,
    /// Share (percent) of applied writes whose reply is dropped, evenly
    /// spaced; 0 = off.
    drop_write_reply_percent: AtomicU8,
    /// Applied-write replies seen while the percentage was on.
    write_replies_seen: AtomicU64,
    cut_peers: Mutex<BTreeSet<u64>>,
    /// 0 = off; 1 = flip a byte of the next snapshot chunk sent (its crc32
    /// left stale); 2 = flip it and send the crc32 of the flipped bytes.
    corrupt_snapshot_chunk: AtomicU8,
}

impl Faults {
    /// While on, a write that committed and applied answers the client with
    /// an error instead of its outcome (the reply is "lost").
    pub fn set_drop_write_replies(&self, on: bool) {
        self.inner.drop_write_replies.store(on, Ordering::SeqCst);
    }

    /// Drops this percentage (0..=100) of applied-write replies, evenly
    /// spaced (the fault suite's lost replies: `kvnode run
    /// --test-drop-write-reply-percent`). 0 turns it off.
    pub fn set_drop_write_reply_percent(&self, percent: u8) {
        self.inner
            .drop_write_reply_percent
            .store(percent.min(100), Ordering::SeqCst);
    }

    /// Whether the reply of the applied write being answered now is
    /// dropped (called once per applied write).
    pub fn drop_write_replies(&self) -> bool {
        if self.inner.drop_write_replies.load(Ordering::SeqCst) {
            return true;
        }
        let percent = u64::from(self.inner.drop_write_reply_percent.load(Ordering::SeqCst));
        if percent == 0 {
            return false;
        }
        let n = self.inner.write_replies_seen.fetch_add(1, Ordering::SeqCst);
        (n * percent) / 100 != ((n + 1) * percent) / 100
    }

    /// Cuts (or restores) the links to and from these peers: outgoing RPCs
    /// fail as unreachable and incoming ones are refused.
    pub fn set_cut_peers(&self, peers: impl IntoIterator<Item = u64>) {
        let mut cut = self
            .inner
            .cut_peers
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        *cut = peers.into_iter().collect();
    }

    /// Whether the link with `peer` is cut.
    pub fn is_cut(&self, peer: u64) -> bool {
        let cut = self
            .inner
            .cut_peers
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        !cut.is_empty() && cut.contains(&peer)
    }

    /// Flips one byte of the next snapshot chunk this member sends, once;
    /// with `fix_crc` the chunk carries the crc32 of the flipped bytes, so
    /// only the whole-file check can catch it.
    pub fn corrupt_next_snapshot_chunk(&self, fix_crc: bool) {
        let mode = if fix_crc { 2 } else { 1 };
        self.inner
            .corrupt_snapshot_chunk
            .store(mode, Ordering::SeqCst);
    }

    /// Takes the chunk corruption armed by
    /// [`Faults::corrupt_next_snapshot_chunk`]: `Some(fix_crc)` once.
    pub fn take_snapshot_chunk_corruption(&self) -> Option<bool> {
        match self.inner.corrupt_snapshot_chunk.swap(0, Ordering::SeqCst) {
            0 => None,
            mode => Some(mode == 2),
        }
    }
}
