//! [`LogError`], and its conversion to `io::Error` (openraft's storage error)
//! at the trait boundary.

use std::io;
use std::path::{Path, PathBuf};

/// What went wrong in the log store. Converted to an
/// [`io::Error`] at the trait boundary (openraft then stops the node).
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    /// A file operation failed.
    #[error("raft log: {op} {}: {source}", path.display())]
    Io {
        /// The operation (`write`, `fsync`, `rename`, ...).
        op: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The error from the file system.
        #[source]
        source: io::Error,
    },
    /// Another log store (in this process or another) has the directory
    /// open: its `LOCK` file is held.
    #[error(
        "raft log directory {} is in use by another log store (its LOCK file is held)",
        path.display()
    )]
    DirectoryInUse {
        /// The log directory.
        path: PathBuf,
    },
    /// The data on disk is damaged (or from an incompatible format).
    #[error("raft log corrupt: {} at offset {offset}: {reason}", path.display())]
    Corrupt {
        /// The damaged file.
        path: PathBuf,
        /// Byte offset of the damaged record or field.
        offset: u64,
        /// What is wrong.
        reason: String,
    },
    /// An earlier write or fsync failed; the store refuses further writes.
    #[error(
        "raft log is poisoned by an earlier write/fsync failure ({cause}); it refuses further \
         writes until the node restarts and recovers from the durable state"
    )]
    Poisoned {
        /// The failure that poisoned the store.
        cause: String,
    },
    /// An entry is too large to store.
    #[error(
        "raft log entry {index} encodes to {size} bytes, above LOG_ENTRY_SIZE_BYTES_MAX ({max} bytes)"
    )]
    EntryTooLarge {
        /// Its log index.
        index: u64,
        /// Its encoded size (log id + entry + framing) in bytes.
        size: usize,
        /// The limit in bytes.
        max: usize,
    },
    /// Appended entries do not continue the log.
    #[error("raft log append out of order: expected index {expected}, got {got}")]
    NotContiguous {
        /// The next index of the log.
        expected: u64,
        /// The first index of the batch.
        got: u64,
    },
    /// The writer thread is gone (the store is shutting down, or it panicked).
    #[error("raft log writer thread is gone")]
    WriterGone,
}

impl LogError {
    pub(crate) fn io(op: &'static str, path: &Path, source: io::Error) -> LogError {
        LogError::Io {
            op,
            path: path.to_path_buf(),
            source,
        }
    }
}

/// At openraft's trait boundary a [`LogError`] becomes an [`io::Error`]
/// (openraft 0.10's storage error type): the kind says what class of
/// failure it was, and the whole `LogError` travels as its source, so the
/// message openraft logs when it stops the node names the file, offset or
/// limit.
impl From<LogError> for io::Error {
    fn from(err: LogError) -> io::Error {
        let kind = match &err {
            LogError::Io { source, .. } => source.kind(),
            LogError::DirectoryInUse { .. } => io::ErrorKind::WouldBlock,
            LogError::Corrupt { .. } => io::ErrorKind::InvalidData,
            LogError::Poisoned { .. } => io::ErrorKind::Other,
            LogError::EntryTooLarge { .. } | LogError::NotContiguous { .. } => {
                io::ErrorKind::InvalidInput
            }
            LogError::WriterGone => io::ErrorKind::BrokenPipe,
        };
        io::Error::new(kind, err)
    }
}
