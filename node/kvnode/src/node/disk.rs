//! Disk full: the free-space watermark and storage poisoning.
//!
//! - [`Watermark`]: free bytes of the data directory's filesystem (statvfs,
//!   cached for [`FREE_SPACE_REFRESH`]), checked by the kv service before
//!   it proposes a write. Below the watermark writes are answered
//!   RESOURCE_EXHAUSTED naming the free bytes and the watermark; reads keep
//!   working, and so does replication (a follower never refuses entries
//!   its leader committed).
//! - [`wait_storage_failure`]: when the Raft log or the engine fails a
//!   write (ENOSPC, EROFS, EIO), the storage layer poisons itself and
//!   openraft stops the member (its `running_state` turns to a fatal
//!   error). The `kvnode` binary waits for that and exits with
//!   [`STORAGE_FAILURE_EXIT_CODE`] and a message saying what failed: a
//!   member that can no longer write must not linger half-alive. Nothing
//!   acknowledged is lost: a write is acknowledged only after the log
//!   holding it was fsynced, and a restart (once space is freed or the
//!   filesystem is writable again) recovers from the log.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tonic::Status;

use crate::raft::types::NodeRaft;
use crate::raft::watch::MetricsWatch;

/// Default watermark (`--disk-free-min-bytes`): below this many free bytes
/// on the data directory's filesystem, writes are refused. Room for the
/// writes already in flight, a snapshot's hint files and the log's next
/// segment.
pub const DISK_FREE_MIN_BYTES_DEFAULT: u64 = 256 * 1024 * 1024;
/// How long a free-space reading is reused before statvfs runs again.
pub const FREE_SPACE_REFRESH: Duration = Duration::from_millis(250);
/// The `LimitExceeded` name of the watermark in RESOURCE_EXHAUSTED answers
/// (its `actual_value` is the free bytes).
pub const WATERMARK_LIMIT: &str = "DISK_FREE_MIN_BYTES";
/// Exit code of the `kvnode` binary when its storage failed (EX_IOERR).
pub const STORAGE_FAILURE_EXIT_CODE: i32 = 74;

/// Free bytes available to an unprivileged writer on `dir`'s filesystem.
pub fn free_bytes(dir: &Path) -> std::io::Result<u64> {
    let stat = rustix::fs::statvfs(dir)?;
    Ok(stat.f_bavail.saturating_mul(stat.f_frsize))
}

/// The free-space watermark of one data directory (cheap to clone).
#[derive(Clone, Debug)]
pub struct Watermark {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    dir: PathBuf,
    min_free: u64,
    /// The last reading: when, and the free bytes.
    last: Mutex<Option<(Instant, u64)>>,
}

impl Watermark {
    /// Writes need `min_free` free bytes on `dir`'s filesystem (0 = never
    /// refuse).
    pub fn new(dir: impl Into<PathBuf>, min_free: u64) -> Watermark {
        Watermark {
            inner: Arc::new(Inner {
                dir: dir.into(),
                min_free,
                last: Mutex::new(None),
            }),
        }
    }

    /// The watermark in bytes.
    pub fn min_free(&self) -> u64 {
        self.inner.min_free
    }

    /// Free bytes now, from a reading at most [`FREE_SPACE_REFRESH`] old.
    pub fn free(&self) -> std::io::Result<u64> {
        let mut last = self.inner.last.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((at, free)) = *last
            && at.elapsed() < FREE_SPACE_REFRESH
        {
            return Ok(free);
        }
        let free = free_bytes(&self.inner.dir)?;
        *last = Some((Instant::now(), free));
        Ok(free)
    }

    /// Whether a write may be proposed: RESOURCE_EXHAUSTED naming the free
    /// bytes and the watermark when below it. A failed statvfs lets the
    /// write through (the storage layer still catches a real ENOSPC).
    #[allow(clippy::result_large_err)]
    pub fn check_write(&self) -> Result<(), Status> {
        if self.inner.min_free == 0 {
            return Ok(());
        }
        match self.free() {
            Ok(free) if free < self.inner.min_free => {
                Err(crate::server::convert::status_with_detail(
                    tonic::Code::ResourceExhausted,
                    format!(
                        "disk almost full: the data directory {} has {free} bytes free, below the \
                     watermark {WATERMARK_LIMIT} (--disk-free-min-bytes) of {} bytes; writes are \
                     refused until space is freed, reads still work",
                        self.inner.dir.display(),
                        self.inner.min_free
                    ),
                    kvproto::kv::v1::error_detail::Detail::LimitExceeded(
                        kvproto::kv::v1::LimitExceeded {
                            limit: WATERMARK_LIMIT.to_string(),
                            limit_value: self.inner.min_free,
                            actual_value: free,
                        },
                    ),
                ))
            }
            Ok(_) => Ok(()),
            Err(err) => {
                tracing::warn!(dir = %self.inner.dir.display(), error = %err, "statvfs failed; not checking the free-space watermark");
                Ok(())
            }
        }
    }
}

/// Waits until openraft stopped this member because of a fatal error
/// (storage failure, panic) and returns its description; pending forever
/// while the member runs. Also returns if the Raft handle is gone.
pub async fn wait_storage_failure(raft: NodeRaft) -> String {
    let mut metrics = raft.metrics();
    loop {
        if let Err(fatal) = &metrics.borrow().running_state {
            return fatal.to_string();
        }
        if metrics.changed().await.is_err() {
            return "the Raft core stopped".to_string();
        }
    }
}

/// A one-line cause for an operator: what the error text says about the
/// disk (or that the Raft core panicked: the process then exits, as on a
/// storage failure, and a restart recovers).
pub fn describe_storage_failure(error: &str) -> &'static str {
    if error.contains("os error 28") || error.contains("No space left") {
        "the disk is full (ENOSPC): free space on the data directory's filesystem, then restart \
         this member"
    } else if error.contains("os error 30") || error.contains("Read-only file system") {
        "the filesystem is read-only (EROFS): make it writable (check the kernel log for I/O \
         errors that caused a read-only remount), then restart this member"
    } else if error.contains("panicked") {
        "the Raft core panicked (a bug; its message is in this member's log): restart this \
         member, it recovers from what is durable on disk"
    } else {
        "storage failed: check the data directory and the kernel log, then restart this member"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watermark_refuses_below_and_names_the_limit() {
        let dir = tempfile::tempdir().unwrap();
        assert!(free_bytes(dir.path()).unwrap() > 0);
        assert!(Watermark::new(dir.path(), 0).check_write().is_ok());
        assert!(Watermark::new(dir.path(), 1).check_write().is_ok());
        let status = Watermark::new(dir.path(), u64::MAX)
            .check_write()
            .unwrap_err();
        assert_eq!(status.code(), tonic::Code::ResourceExhausted);
        assert!(
            status.message().contains("DISK_FREE_MIN_BYTES"),
            "{status:?}"
        );
        assert!(status.message().contains("bytes free"), "{status:?}");
    }

    #[test]
    fn storage_failures_are_described() {
        assert!(
            describe_storage_failure("No space left on device (os error 28)").contains("ENOSPC")
        );
        assert!(describe_storage_failure("Read-only file system (os error 30)").contains("EROFS"));
        assert!(describe_storage_failure("bad").contains("storage failed"));
        // openraft's Fatal::Panicked displays as "panicked".
        assert!(describe_storage_failure("panicked").contains("Raft core panicked"));
    }
}
