//! The values the client takes and gives: read consistency, a read key,
//! write acknowledgements, put options, the batch builder and scan options.

use std::time::Duration;

use kvproto::kv::v1 as pb;
use prost::bytes::Bytes;

/// How fresh a read must be.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Consistency {
    /// The read sees every write acknowledged before it was sent (any member
    /// can serve it; it confirms a read index with the leader).
    #[default]
    Linearizable,
    /// Answer from a member's applied state, which must have reached
    /// `min_index` (0 = no constraint). See [`crate::Client::read_your_writes`].
    Stale {
        /// The lowest applied log index acceptable.
        min_index: u64,
    },
}

impl Consistency {
    /// The protocol's (consistency, min_index) pair.
    pub(crate) fn to_proto(self) -> (i32, u64) {
        match self {
            Consistency::Linearizable => (pb::Consistency::Linearizable as i32, 0),
            Consistency::Stale { min_index } => (pb::Consistency::Stale as i32, min_index),
        }
    }
}

/// A key's revisions, as etcd names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Revisions {
    /// The revision that created the key.
    pub create_revision: u64,
    /// The revision that last changed it: what conditions compare.
    pub mod_revision: u64,
    /// Changes since the key was created (1 on create).
    pub version: u64,
    /// The lease it is attached to; 0 = none.
    pub lease: u64,
}

/// A key's value and metadata, as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The value.
    pub value: Bytes,
    /// The key's create / mod revision, version and lease.
    pub revisions: Revisions,
    /// The sequence number of the key's record (`log index × 65536 +
    /// position`; `seq >> 16` is the log index of the entry that wrote it).
    pub seq: u64,
    /// Time to live left (cluster time, rounded up); `None` = no TTL.
    pub ttl_left: Option<Duration>,
    /// The applied index of the member that answered.
    pub applied_index: u64,
    /// The store revision the answer reflects (at or above `mod_revision`).
    pub revision: u64,
}

/// A read of one key with what the answer's header said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Read {
    /// The key's value and metadata; `None` = absent.
    pub entry: Option<Entry>,
    /// The applied index of the member that answered.
    pub applied_index: u64,
    /// The store revision the answer reflects.
    pub revision: u64,
}

/// One key listed by a scan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyValue {
    /// The key.
    pub key: Bytes,
    /// The value (empty for a keys-only scan).
    pub value: Bytes,
    /// The key's create / mod revision, version and lease.
    pub revisions: Revisions,
    /// The sequence number of the key's record.
    pub seq: u64,
    /// Time to live left; `None` = no TTL.
    pub ttl_left: Option<Duration>,
}

/// An acknowledged write of one key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Written {
    /// The revision the write applied at: the key's new `mod_revision`.
    pub revision: u64,
    /// The sequence number of the key's new record.
    pub seq: u64,
    /// The leader's applied index, covering this write (use it as a
    /// `min_index` for read-your-writes).
    pub applied_index: u64,
}

/// An acknowledged delete.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Removed {
    /// Whether a live key was removed (false: it was already absent).
    pub found: bool,
    /// The delete's revision if it removed a key, else the store revision
    /// it saw.
    pub revision: u64,
    /// The leader's applied index, covering this delete.
    pub applied_index: u64,
}

/// A condition of a put.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Condition {
    /// The key's current `mod_revision` must be this (0 = absent).
    IfModRevision(u64),
    /// The key must be absent.
    IfAbsent,
}

/// Options of a put.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PutOptions {
    /// Time to live (cluster time, whole milliseconds); `None` = forever.
    pub ttl: Option<Duration>,
    /// A condition the write needs; `None` = unconditional.
    pub condition: Option<Condition>,
    /// The lease to attach the key to; `None` (or 0) = none. A put with a
    /// lease is sent as a one-op transaction (`TxnPut.lease`); a lease that
    /// does not exist is [`crate::Error::LeaseNotFound`].
    pub lease: Option<u64>,
}

impl PutOptions {
    /// With a time to live.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = Some(ttl);
        self
    }

    /// Only if the key's `mod_revision` is `revision` (0 = absent).
    pub fn if_mod_revision(mut self, revision: u64) -> Self {
        self.condition = Some(Condition::IfModRevision(revision));
        self
    }

    /// Only if the key is absent.
    pub fn if_absent(mut self) -> Self {
        self.condition = Some(Condition::IfAbsent);
        self
    }

    /// Attached to lease `id` (0 = none): the key is deleted when the
    /// lease is revoked or expires.
    pub fn lease(mut self, id: u64) -> Self {
        self.lease = Some(id);
        self
    }
}

/// Milliseconds of a TTL, at least 1 for a non-zero duration.
pub(crate) fn ttl_ms(ttl: Duration) -> u64 {
    u64::try_from(ttl.as_millis())
        .unwrap_or(u64::MAX)
        .max(u64::from(!ttl.is_zero()))
}

/// `None` for 0, else the duration.
pub(crate) fn ttl_left(ms: u64) -> Option<Duration> {
    (ms != 0).then(|| Duration::from_millis(ms))
}

/// An atomic batch: conditions (all must hold), then writes applied in order,
/// all or nothing. Send it with [`crate::Client::batch`].
#[derive(Debug, Clone, Default)]
pub struct Batch {
    pub(crate) conditions: Vec<pb::BatchCondition>,
    pub(crate) ops: Vec<pb::BatchOp>,
}

impl Batch {
    /// An empty batch.
    pub fn new() -> Self {
        Batch::default()
    }

    /// Requires `key` to be at `mod_revision` (0 = absent) before the batch.
    pub fn check_mod_revision(mut self, key: impl Into<Bytes>, mod_revision: u64) -> Self {
        self.conditions.push(pb::BatchCondition {
            key: key.into(),
            mod_revision,
            seq: 0,
        });
        self
    }

    /// Requires `key` to be absent before the batch.
    pub fn check_absent(self, key: impl Into<Bytes>) -> Self {
        self.check_mod_revision(key, 0)
    }

    /// Sets `key` (no TTL).
    pub fn put(self, key: impl Into<Bytes>, value: impl Into<Bytes>) -> Self {
        self.put_ttl(key, value, None)
    }

    /// Sets `key` with an optional TTL.
    pub fn put_ttl(
        mut self,
        key: impl Into<Bytes>,
        value: impl Into<Bytes>,
        ttl: Option<Duration>,
    ) -> Self {
        self.ops.push(pb::BatchOp {
            op: Some(pb::batch_op::Op::Put(pb::PutOp {
                key: key.into(),
                value: value.into(),
                ttl_ms: ttl.map_or(0, ttl_ms),
            })),
        });
        self
    }

    /// Deletes `key` (absent is fine).
    pub fn delete(mut self, key: impl Into<Bytes>) -> Self {
        self.ops.push(pb::BatchOp {
            op: Some(pb::batch_op::Op::Delete(pb::DeleteOp { key: key.into() })),
        });
        self
    }

    /// Gives an existing `key` a new TTL (a missing key fails the batch).
    pub fn expire(mut self, key: impl Into<Bytes>, ttl: Duration) -> Self {
        self.ops.push(pb::BatchOp {
            op: Some(pb::batch_op::Op::Expire(pb::ExpireOp {
                key: key.into(),
                ttl_ms: ttl_ms(ttl),
            })),
        });
        self
    }

    /// Removes an existing `key`'s TTL (a missing key fails the batch).
    pub fn persist(mut self, key: impl Into<Bytes>) -> Self {
        self.ops.push(pb::BatchOp {
            op: Some(pb::batch_op::Op::Persist(pb::PersistOp { key: key.into() })),
        });
        self
    }

    /// Number of writes in the batch.
    pub fn len(&self) -> usize {
        self.ops.len()
    }

    /// Whether the batch has no writes.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }
}

/// What one op of an applied batch did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpResult {
    /// The sequence number of the record the op wrote (0: a delete of an
    /// absent key, which writes nothing).
    pub seq: u64,
    /// Whether the key existed just before the op.
    pub found: bool,
}

/// An applied batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchApplied {
    /// One result per op, in op order.
    pub results: Vec<OpResult>,
    /// The revision the batch applied at (every key it wrote has it as its
    /// `mod_revision`).
    pub revision: u64,
    /// The leader's applied index, covering the batch.
    pub applied_index: u64,
}

/// Which keys a scan lists and how.
#[derive(Debug, Clone, Default)]
pub struct Scan {
    pub(crate) range: Option<pb::scan_request::Range>,
    pub(crate) page_size: u32,
    pub(crate) keys_only: bool,
    pub(crate) consistency: Option<Consistency>,
}

impl Scan {
    /// The whole key space.
    pub fn all() -> Self {
        Scan::default()
    }

    /// Keys starting with `prefix`.
    pub fn prefix(prefix: impl Into<Bytes>) -> Self {
        Scan {
            range: Some(pb::scan_request::Range::Prefix(prefix.into())),
            ..Scan::default()
        }
    }

    /// Keys in `[from, to)`; `to` = `None` runs to the end.
    pub fn range(from: impl Into<Bytes>, to: Option<Bytes>) -> Self {
        Scan {
            range: Some(pb::scan_request::Range::Between(pb::KeyRange {
                from: from.into(),
                to,
            })),
            ..Scan::default()
        }
    }

    /// Entries per page at most (0 = the server's default; the server may
    /// lower it).
    pub fn page_size(mut self, entries: u32) -> Self {
        self.page_size = entries;
        self
    }

    /// Keys and metadata only, no values.
    pub fn keys_only(mut self) -> Self {
        self.keys_only = true;
        self
    }

    /// The consistency of every page (default: the client's).
    pub fn consistency(mut self, consistency: Consistency) -> Self {
        self.consistency = Some(consistency);
        self
    }
}
