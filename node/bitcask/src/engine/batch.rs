//! The write input: a [`Batch`] of [`Op`]s, and the sequence numbers it
//! received ([`Written`]).

pub use crate::record_meta::RecordMeta;

/// One write in a batch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// Set `key` to `value`, expiring at `expiry_ms` (0 = never).
    Put {
        /// The key.
        key: Vec<u8>,
        /// The value.
        value: Vec<u8>,
        /// Expiry in ms of the caller's clock; 0 = never.
        expiry_ms: u64,
        /// Opaque caller bytes stored with the record, returned by reads
        /// and kept in the key directory ([`RecordMeta::EMPTY`]: none).
        meta: RecordMeta,
    },
    /// Delete `key` (a tombstone is written even if the key is absent).
    Delete {
        /// The key.
        key: Vec<u8>,
        /// Opaque caller bytes stored with the tombstone (kept in its hint
        /// entry; the key directory forgets deleted keys).
        meta: RecordMeta,
    },
}

/// An atomic group of writes plus opaque metadata stored in its commit record.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Batch {
    /// The writes, applied in order.
    pub ops: Vec<Op>,
    /// Caller metadata, returned by
    /// [`Engine::last_commit_meta`](crate::Engine::last_commit_meta) after a
    /// restart.
    pub meta: Vec<u8>,
    /// First sequence number: op `i` gets `seq + i`, the commit record
    /// `seq + ops.len()`. `None` lets the engine continue from its last one.
    pub seq: Option<u64>,
}

impl Batch {
    /// An empty batch.
    pub fn new() -> Batch {
        Batch::default()
    }
    /// Adds a put without expiry.
    pub fn put(self, key: impl Into<Vec<u8>>, value: impl Into<Vec<u8>>) -> Batch {
        self.put_with_meta(key, value, 0, RecordMeta::EMPTY)
    }
    /// Adds a put that expires at `expiry_ms`.
    pub fn put_with_expiry(
        self,
        key: impl Into<Vec<u8>>,
        value: impl Into<Vec<u8>>,
        expiry_ms: u64,
    ) -> Batch {
        self.put_with_meta(key, value, expiry_ms, RecordMeta::EMPTY)
    }
    /// Adds a put that expires at `expiry_ms` (0 = never) and carries `meta`.
    pub fn put_with_meta(
        mut self,
        key: impl Into<Vec<u8>>,
        value: impl Into<Vec<u8>>,
        expiry_ms: u64,
        meta: RecordMeta,
    ) -> Batch {
        self.ops.push(Op::Put {
            key: key.into(),
            value: value.into(),
            expiry_ms,
            meta,
        });
        self
    }
    /// Adds a delete.
    pub fn delete(self, key: impl Into<Vec<u8>>) -> Batch {
        self.delete_with_meta(key, RecordMeta::EMPTY)
    }
    /// Adds a delete whose tombstone carries `meta`.
    pub fn delete_with_meta(mut self, key: impl Into<Vec<u8>>, meta: RecordMeta) -> Batch {
        self.ops.push(Op::Delete {
            key: key.into(),
            meta,
        });
        self
    }
    /// Sets the commit metadata.
    pub fn meta(mut self, meta: impl Into<Vec<u8>>) -> Batch {
        self.meta = meta.into();
        self
    }
    /// Sets the first sequence number.
    pub fn seq(mut self, seq: u64) -> Batch {
        self.seq = Some(seq);
        self
    }

    /// This batch as the write path reads it, over `ops` (its ops, borrowed).
    pub(crate) fn lend<'a>(&'a self, ops: &'a [OpRef<'a>]) -> BatchRef<'a> {
        BatchRef {
            ops,
            meta: &self.meta,
            seq: self.seq,
        }
    }
}

/// One op of a batch as the write path reads it: borrowed, so a single put
/// ([`crate::Engine::put`]) is written without copying its value into a
/// [`Batch`] first.
#[derive(Clone, Copy, Debug)]
pub(crate) enum OpRef<'a> {
    Put {
        key: &'a [u8],
        value: &'a [u8],
        expiry_ms: u64,
        meta: RecordMeta,
    },
    Delete {
        key: &'a [u8],
        meta: RecordMeta,
    },
}

impl<'a> From<&'a Op> for OpRef<'a> {
    fn from(op: &'a Op) -> OpRef<'a> {
        match op {
            Op::Put {
                key,
                value,
                expiry_ms,
                meta,
            } => OpRef::Put {
                key,
                value,
                expiry_ms: *expiry_ms,
                meta: *meta,
            },
            Op::Delete { key, meta } => OpRef::Delete { key, meta: *meta },
        }
    }
}

/// A batch as the write path reads it (see [`OpRef`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct BatchRef<'a> {
    pub(crate) ops: &'a [OpRef<'a>],
    pub(crate) meta: &'a [u8],
    pub(crate) seq: Option<u64>,
}

/// Sequence numbers a batch received.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Written {
    /// Sequence of the first op (equal to `commit` for an empty batch).
    pub first_seq: u64,
    /// Sequence of the commit record, the batch's highest.
    pub commit_seq: u64,
}
