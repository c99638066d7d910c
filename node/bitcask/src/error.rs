//! The engine's one error type.
//!
//! Expected outcomes (a key that is absent, an expired value) are values,
//! not errors. Every variant below is a failure the caller must act on.

use std::path::PathBuf;

/// Result with the engine's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in the engine.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A key is larger than the configured limit.
    #[error("key is {len} bytes; the limit key_size_bytes_max is {max} bytes")]
    KeyTooLarge {
        /// Size of the rejected key.
        len: usize,
        /// The limit in force.
        max: usize,
    },
    /// Keys must not be empty.
    #[error("key is empty; keys must be 1 to key_size_bytes_max bytes")]
    KeyEmpty,
    /// A value is larger than the configured limit.
    #[error("value is {len} bytes; the limit value_size_bytes_max is {max} bytes")]
    ValueTooLarge {
        /// Size of the rejected value.
        len: usize,
        /// The limit in force.
        max: usize,
    },
    /// A batch (records plus commit metadata) is larger than the limit.
    #[error("batch is {len} bytes on disk; the limit batch_size_bytes_max is {max} bytes")]
    BatchTooLarge {
        /// Encoded size of the rejected batch.
        len: usize,
        /// The limit in force.
        max: usize,
    },
    /// Batch metadata is larger than the limit.
    #[error("batch metadata is {len} bytes; the limit METADATA_SIZE_BYTES_MAX is {max} bytes")]
    MetadataTooLarge {
        /// Size of the rejected metadata.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// A per-record meta is longer than the limit.
    #[error("record meta is {len} bytes; the limit RECORD_META_BYTES_MAX is {max} bytes")]
    RecordMetaTooLarge {
        /// Size of the rejected meta.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// A caller-supplied sequence number does not increase.
    #[error("sequence number {given} is not above the highest stored sequence {last}")]
    SequenceNotIncreasing {
        /// The sequence the caller gave.
        given: u64,
        /// The highest sequence already stored.
        last: u64,
    },
    /// An option is out of range.
    #[error("option {name}: {reason}")]
    InvalidOption {
        /// The option's field name.
        name: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// An earlier write or fsync failed; the engine refuses writes until it is
    /// reopened (an fsync is never retried: the kernel may have dropped the
    /// dirty pages it failed to write).
    #[error("engine is poisoned by an earlier I/O failure ({cause}); reopen it to recover")]
    Poisoned {
        /// The failure that poisoned the engine.
        cause: String,
    },
    /// A file holds bytes that are not what the engine wrote.
    #[error("corruption in {file} at offset {offset}: {reason}")]
    Corruption {
        /// File name inside the data directory.
        file: String,
        /// Byte offset of the bad record or header.
        offset: u64,
        /// What is wrong.
        reason: String,
    },
    /// An operating-system I/O error.
    #[error("I/O error on {}: {source}", path.display())]
    Io {
        /// The file or directory involved.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// Merge inputs must be a non-empty prefix of the sealed files.
    #[error("invalid merge input: {0}")]
    MergeInput(String),
    /// A file named by the caller is not one of the engine's.
    #[error("unknown file {0}")]
    UnknownFile(String),
    /// A record location names a file that is no longer one of the
    /// engine's: a merge replaced it (list the merge's outputs again).
    #[error(
        "record location in {file}: the file is no longer the engine's (merged away); list the records again"
    )]
    LocationGone {
        /// The data file the location names.
        file: String,
    },
    /// A record location does not name a record of its file (it was not
    /// made by this engine, or altered).
    #[error("record location {file} at offset {offset} names no record: {reason}")]
    InvalidLocation {
        /// The data file the location names.
        file: String,
        /// The offset it names.
        offset: u64,
        /// What is there instead.
        reason: String,
    },
    /// Another engine (in this or another process) has the directory open.
    #[error("data directory {} is in use by another engine (its LOCK file is held)", path.display())]
    DirectoryInUse {
        /// The data directory.
        path: PathBuf,
    },
    /// The engine was closed.
    #[error("engine is closed")]
    Closed,
}

impl Error {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Error {
        Error::Io {
            path: path.into(),
            source,
        }
    }
}
