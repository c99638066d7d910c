//! etcd v3 transactions (`TxnRequest` / `TxnResponse`, server v3.4/v3.5):
//! what one carries, the checks etcd makes before it applies one, and how a
//! compare is judged. The apply itself is in [`crate::apply`].
//!
//! A transaction's compares are judged against the state before it; if all
//! hold its `success` ops apply, else its `failure` ops, in order, each
//! seeing the ones before it. All or nothing: a transaction refused for any
//! reason (a check below, a read over its budget, a put with
//! `ignore_value` on an absent key) changes nothing. If the ops it applies
//! change anything, the transaction takes exactly one store revision: every
//! key it writes gets that `mod_revision`, and its version goes up by one.
//!
//! Checked before anything is judged, on both branches (etcd checks them
//! before it proposes): at most [`TXN_OPS_MAX`] compares and ops per
//! branch; no empty key; no reserved key; no key written twice by one
//! branch; no value with `ignore_value`, no lease with `ignore_lease`.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::command::{ENTRY_OPS_MAX, RESERVED_KEY_PREFIX, SessionRef};
use crate::range::{KeyBounds, KeyValue, RangeError, RangeResult, RangeSpec, shown};

/// Compares, and ops per branch, in one transaction at most: etcd's
/// default `--max-txn-ops`.
pub const TXN_OPS_MAX: usize = 128;
/// Keys one transaction's compares, ranges and range deletes may visit in
/// all. The apply is the one thread every write waits behind: this bounds
/// the time one transaction holds it.
pub const TXN_READ_KEYS_MAX: usize = 10_000;
/// Bytes one transaction's reads may visit or return in all: keys visited,
/// values compared, values returned (ranges, `prev_kv`s). Bounds the
/// memory of the apply and the size of the answer.
pub const TXN_READ_BYTES_MAX: usize = 4 * 1024 * 1024;
/// Bytes the transactions of one entry may read and return in all (their
/// answers live in memory until the entry is answered, on every replica):
/// a transaction that would pass it is refused, naming it, and may be sent
/// again (it will land in another entry).
pub const ENTRY_TXN_READ_BYTES_MAX: usize = 16 * 1024 * 1024;
/// A transaction is refused if its writes would take its entry's engine
/// batch past this many bytes: half the engine's default
/// [`bitcask::BATCH_SIZE_BYTES_MAX`], the rest left for the session records
/// and the commit record the entry writes after its requests (a put with
/// `ignore_value` rewrites a value the request does not carry, so the
/// request's size does not bound the batch).
pub const TXN_ENTRY_BATCH_BYTES_MAX: usize = bitcask::BATCH_SIZE_BYTES_MAX / 2;

/// One transaction, field for field etcd's `TxnRequest` (without nested
/// transactions), with raftcask's exactly-once session.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TxnRequest {
    /// Exactly-once bookkeeping, if the client uses a session.
    pub session: Option<SessionRef>,
    /// Judged against the state before the transaction; all must hold for
    /// `success` to apply.
    pub compares: Vec<Compare>,
    /// Applied in order when every compare holds.
    pub success: Vec<TxnOp>,
    /// Applied in order when a compare does not hold.
    pub failure: Vec<TxnOp>,
}

/// One condition of a transaction (etcd's `Compare`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Compare {
    /// The key, or the first key of the range.
    #[serde(with = "serde_bytes")]
    pub key: Vec<u8>,
    /// As [`RangeSpec::range_end`]: empty = `key` alone, `"\0"` = every key
    /// at or after `key`, otherwise `[key, range_end)`. Over a range every
    /// key in it must satisfy the compare.
    #[serde(with = "serde_bytes")]
    pub range_end: Vec<u8>,
    /// What is compared, and with what.
    pub target: CompareTarget,
    /// How the key's side compares with the target's value.
    pub result: CompareResult,
}

/// What a compare reads of a key, and the value it compares it with.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum CompareTarget {
    /// The value, byte by byte. Never holds when no key is there.
    Value(#[serde(with = "serde_bytes")] Vec<u8>),
    /// The version (0 when no key is there).
    Version(u64),
    /// The create revision (0 when no key is there).
    CreateRevision(u64),
    /// The mod revision (0 when no key is there).
    ModRevision(u64),
    /// The lease (0 when no key is there).
    Lease(u64),
}

/// How a compare's key side must relate to its target value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum CompareResult {
    /// Equal.
    Equal,
    /// Not equal.
    NotEqual,
    /// The key's side is less.
    Less,
    /// The key's side is greater.
    Greater,
}

/// One op of a transaction's branch (etcd's `RequestOp`, without nested
/// transactions).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum TxnOp {
    /// Set a key (etcd's `PutRequest`, plus a TTL).
    Put {
        /// The key.
        #[serde(with = "serde_bytes")]
        key: Vec<u8>,
        /// The value; must be empty with `ignore_value`.
        #[serde(with = "serde_bytes")]
        value: Vec<u8>,
        /// Time to live in ms of cluster time; 0 = never expires. Applies
        /// as given with `ignore_value` too (it is not the value).
        ttl_ms: u64,
        /// The lease the key is attached to (0 = none; it must exist,
        /// [`crate::lease`]); must be 0 with `ignore_lease`.
        lease: u64,
        /// Return the key as it was before the put.
        prev_kv: bool,
        /// Keep the key's current value; refused if the key is absent.
        ignore_value: bool,
        /// Keep the key's current lease; refused if the key is absent.
        ignore_lease: bool,
    },
    /// Delete a key or a range of keys (etcd's `DeleteRangeRequest`).
    DeleteRange {
        /// The key, or the first key of the range.
        #[serde(with = "serde_bytes")]
        key: Vec<u8>,
        /// As [`RangeSpec::range_end`].
        #[serde(with = "serde_bytes")]
        range_end: Vec<u8>,
        /// Return the keys deleted, as they were.
        prev_kv: bool,
    },
    /// Read a range (etcd's `RangeRequest`); sees the branch's earlier ops
    /// (unless it names the store revision from before the transaction).
    Range(RangeSpec),
}

/// What one op of the branch that applied did (etcd's `ResponseOp`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum TxnOpResult {
    /// A put.
    Put {
        /// The key before the put, if asked for and the key was there.
        prev_kv: Option<KeyValue>,
    },
    /// A delete.
    DeleteRange {
        /// Keys deleted.
        deleted: u64,
        /// The keys deleted, as they were, if asked for.
        prev_kvs: Vec<KeyValue>,
    },
    /// A range read.
    Range(RangeResult),
}

/// Where in a transaction something is, for error messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TxnPlace {
    /// The compare at this index.
    Compare(usize),
    /// The `success` op at this index.
    Success(usize),
    /// The `failure` op at this index.
    Failure(usize),
}

impl TxnPlace {
    /// The op at `index` of the branch `success` (true) or `failure`.
    pub fn op(success: bool, index: usize) -> TxnPlace {
        if success {
            TxnPlace::Success(index)
        } else {
            TxnPlace::Failure(index)
        }
    }
}

impl fmt::Display for TxnPlace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TxnPlace::Compare(index) => write!(f, "compares[{index}]"),
            TxnPlace::Success(index) => write!(f, "success[{index}]"),
            TxnPlace::Failure(index) => write!(f, "failure[{index}]"),
        }
    }
}

/// Why a transaction was refused; it changed nothing. Each message starts
/// with etcd's own where etcd has one, so a front end can map it to etcd's
/// error, and then names the field and the limit.
#[derive(Debug, thiserror::Error)]
pub enum TxnError {
    /// More than [`TXN_OPS_MAX`] compares or ops in a branch.
    #[error(
        "etcdserver: too many operations in txn request: field `{field}` holds {count}, \
         the limit TXN_OPS_MAX is {TXN_OPS_MAX}"
    )]
    TooManyOps {
        /// `compares`, `success` or `failure`.
        field: &'static str,
        /// How many it holds.
        count: usize,
    },
    /// A compare or an op has an empty key.
    #[error("etcdserver: key is not provided: field `key` of {at} is empty")]
    KeyEmpty {
        /// Which.
        at: TxnPlace,
    },
    /// A compare or an op names a key under [`RESERVED_KEY_PREFIX`].
    #[error("key {} of {at} starts with the reserved prefix RESERVED_KEY_PREFIX", shown(.key))]
    ReservedKey {
        /// Which.
        at: TxnPlace,
        /// The key.
        key: Vec<u8>,
    },
    /// A put's key is written by another put of the branch, or lies in a
    /// range a delete of the branch deletes.
    #[error(
        "etcdserver: duplicate key given in txn request: {at} puts key {}, which another \
         put or a delete of the same branch also writes",
        shown(.key)
    )]
    DuplicateKey {
        /// The put.
        at: TxnPlace,
        /// The key.
        key: Vec<u8>,
    },
    /// A put with `ignore_value` carries a value.
    #[error(
        "etcdserver: value is provided: {at} sets `ignore_value` and carries a {bytes}-byte `value`"
    )]
    ValueProvided {
        /// The put.
        at: TxnPlace,
        /// The value's length.
        bytes: usize,
    },
    /// A put with `ignore_lease` carries a lease.
    #[error("etcdserver: lease is provided: {at} sets `ignore_lease` and carries `lease` {lease}")]
    LeaseProvided {
        /// The put.
        at: TxnPlace,
        /// The lease.
        lease: u64,
    },
    /// A put attaches its key to a lease that does not exist.
    #[error("etcdserver: requested lease not found: {at} attaches its key to lease {lease:016x}")]
    LeaseNotFound {
        /// The put.
        at: TxnPlace,
        /// The lease.
        lease: u64,
    },
    /// A put would attach more keys to a lease than
    /// [`crate::lease::LEASE_KEYS_MAX`].
    #[error(
        "{at} attaches its key to lease {lease:016x}, which would hold more than \
         LEASE_KEYS_MAX ({}) keys",
        crate::lease::LEASE_KEYS_MAX
    )]
    LeaseKeys {
        /// The put.
        at: TxnPlace,
        /// The lease.
        lease: u64,
    },
    /// A put with `ignore_value` or `ignore_lease` names an absent key.
    #[error(
        "etcdserver: key not found: {at} sets `ignore_value` or `ignore_lease` but key {} is absent",
        shown(.key)
    )]
    KeyNotFound {
        /// The put.
        at: TxnPlace,
        /// The key.
        key: Vec<u8>,
    },
    /// A range, a compare or a delete could not be read (a revision other
    /// than the current one, over [`TXN_READ_KEYS_MAX`] or
    /// [`TXN_READ_BYTES_MAX`]).
    #[error("{at}: {source}")]
    Read {
        /// Which.
        at: TxnPlace,
        /// Why.
        source: RangeError,
    },
    /// The transaction's writes would take its entry past [`ENTRY_OPS_MAX`].
    #[error(
        "the transaction writes {writes} keys, which would take its entry's {batched} records \
         past ENTRY_OPS_MAX ({ENTRY_OPS_MAX})"
    )]
    EntryOps {
        /// Keys the transaction writes.
        writes: usize,
        /// Records the entry holds before it.
        batched: usize,
    },
    /// The transaction's writes would take its entry's batch past
    /// [`TXN_ENTRY_BATCH_BYTES_MAX`].
    #[error(
        "the transaction writes {bytes} bytes, which would take its entry's {batched}-byte \
         batch past TXN_ENTRY_BATCH_BYTES_MAX ({TXN_ENTRY_BATCH_BYTES_MAX})"
    )]
    EntryBytes {
        /// Bytes of the records the transaction writes.
        bytes: usize,
        /// Bytes the entry's batch holds before it.
        batched: usize,
    },
}

impl TxnRequest {
    /// The checks etcd makes before it proposes a transaction
    /// (`checkTxnRequest`, `checkIntervals`), on both branches.
    pub fn check(&self) -> Result<(), TxnError> {
        for (field, count) in [
            ("compares", self.compares.len()),
            ("success", self.success.len()),
            ("failure", self.failure.len()),
        ] {
            if count > TXN_OPS_MAX {
                return Err(TxnError::TooManyOps { field, count });
            }
        }
        for (index, compare) in self.compares.iter().enumerate() {
            check_key(TxnPlace::Compare(index), &compare.key)?;
        }
        for (success, branch) in [(true, &self.success), (false, &self.failure)] {
            check_branch(success, branch)?;
        }
        Ok(())
    }
}

fn check_key(at: TxnPlace, key: &[u8]) -> Result<(), TxnError> {
    if key.is_empty() {
        return Err(TxnError::KeyEmpty { at });
    }
    if key.starts_with(RESERVED_KEY_PREFIX) {
        return Err(TxnError::ReservedKey {
            at,
            key: key.to_vec(),
        });
    }
    Ok(())
}

/// One branch's keys and flags, and etcd's duplicate rule: a put's key may
/// be neither another put's of the branch nor in any of its delete ranges
/// (deletes may overlap each other).
fn check_branch(success: bool, ops: &[TxnOp]) -> Result<(), TxnError> {
    let mut deletes = Vec::new();
    for (index, op) in ops.iter().enumerate() {
        let at = TxnPlace::op(success, index);
        match op {
            TxnOp::Put {
                key,
                value,
                lease,
                ignore_value,
                ignore_lease,
                ..
            } => {
                check_key(at, key)?;
                if *ignore_value && !value.is_empty() {
                    return Err(TxnError::ValueProvided {
                        at,
                        bytes: value.len(),
                    });
                }
                if *ignore_lease && *lease != 0 {
                    return Err(TxnError::LeaseProvided { at, lease: *lease });
                }
            }
            TxnOp::DeleteRange { key, range_end, .. } => {
                check_key(at, key)?;
                deletes.push(KeyBounds::new(key, range_end));
            }
            TxnOp::Range(spec) => check_key(at, &spec.key)?,
        }
    }
    let mut puts = BTreeMap::new();
    for (index, op) in ops.iter().enumerate() {
        if let TxnOp::Put { key, .. } = op {
            let again = puts.insert(key.as_slice(), index).is_some();
            if again || deletes.iter().any(|bounds| bounds.contains(key)) {
                return Err(TxnError::DuplicateKey {
                    at: TxnPlace::op(success, index),
                    key: key.clone(),
                });
            }
        }
    }
    Ok(())
}

impl Compare {
    /// Whether the compare holds over `kvs`, the keys present in its range
    /// (with their values for a [`CompareTarget::Value`] compare), as etcd
    /// judges it (`applyCompare`): every key must satisfy it; with no key,
    /// a value compare fails and any other compares against zero.
    pub fn holds(&self, kvs: &[KeyValue]) -> bool {
        if kvs.is_empty() {
            return match self.target {
                CompareTarget::Value(_) => false,
                _ => self.holds_for(&KeyValue::default()),
            };
        }
        kvs.iter().all(|kv| self.holds_for(kv))
    }

    /// Whether judging it needs the values of the keys.
    pub fn reads_values(&self) -> bool {
        matches!(self.target, CompareTarget::Value(_))
    }

    fn holds_for(&self, kv: &KeyValue) -> bool {
        let ordering = match &self.target {
            CompareTarget::Value(value) => kv.value.as_slice().cmp(value.as_slice()),
            CompareTarget::Version(version) => kv.version.cmp(version),
            CompareTarget::CreateRevision(revision) => kv.create_revision.cmp(revision),
            CompareTarget::ModRevision(revision) => kv.mod_revision.cmp(revision),
            CompareTarget::Lease(lease) => kv.lease.cmp(lease),
        };
        match self.result {
            CompareResult::Equal => ordering.is_eq(),
            CompareResult::NotEqual => ordering.is_ne(),
            CompareResult::Less => ordering.is_lt(),
            CompareResult::Greater => ordering.is_gt(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(key: &str) -> TxnOp {
        TxnOp::Put {
            key: key.into(),
            value: b"v".to_vec(),
            ttl_ms: 0,
            lease: 0,
            prev_kv: false,
            ignore_value: false,
            ignore_lease: false,
        }
    }

    fn delete(key: &str, range_end: &str) -> TxnOp {
        TxnOp::DeleteRange {
            key: key.into(),
            range_end: range_end.into(),
            prev_kv: false,
        }
    }

    fn success(ops: Vec<TxnOp>) -> TxnRequest {
        TxnRequest {
            success: ops,
            ..TxnRequest::default()
        }
    }

    #[test]
    fn a_key_written_twice_by_a_branch_is_a_duplicate_as_etcd_counts_it() {
        let duplicate = |ops| matches!(success(ops).check(), Err(TxnError::DuplicateKey { .. }));
        assert!(duplicate(vec![put("a"), put("a")]));
        // A put inside a delete range, before or after it.
        assert!(duplicate(vec![put("b"), delete("a", "c")]));
        assert!(duplicate(vec![delete("a", "\0"), put("zz")]));
        assert!(duplicate(vec![delete("k", ""), put("k")]));
        // Deletes may overlap; a put next to a range is fine; reads too.
        assert!(
            success(vec![delete("a", "c"), delete("b", "c"), put("c")])
                .check()
                .is_ok()
        );
        assert!(
            success(vec![put("a"), TxnOp::Range(RangeSpec::key("a")), put("b")])
                .check()
                .is_ok()
        );
        // The same key in the two branches is fine.
        let both = TxnRequest {
            failure: vec![put("a")],
            ..success(vec![put("a")])
        };
        assert!(both.check().is_ok());
        // The branch that would not apply is checked too.
        let failure = TxnRequest {
            failure: vec![put("x"), put("x")],
            ..TxnRequest::default()
        };
        let error = failure.check().unwrap_err().to_string();
        assert!(
            error.starts_with("etcdserver: duplicate key given in txn request")
                && error.contains("failure[1]"),
            "{error}"
        );
    }

    #[test]
    fn more_than_txn_ops_max_compares_or_ops_are_refused_by_name() {
        let compare = Compare {
            key: b"k".to_vec(),
            range_end: Vec::new(),
            target: CompareTarget::Version(0),
            result: CompareResult::Equal,
        };
        let at_limit = TxnRequest {
            compares: vec![compare.clone(); TXN_OPS_MAX],
            success: (0..TXN_OPS_MAX).map(|i| put(&format!("k{i}"))).collect(),
            failure: vec![TxnOp::Range(RangeSpec::key("k")); TXN_OPS_MAX],
            session: None,
        };
        assert!(at_limit.check().is_ok());
        for field in ["compares", "success", "failure"] {
            let mut over = at_limit.clone();
            match field {
                "compares" => over.compares.push(compare.clone()),
                "success" => over.success.push(put("new")),
                _ => over.failure.push(TxnOp::Range(RangeSpec::key("k"))),
            }
            let error = over.check().unwrap_err().to_string();
            assert!(
                error.contains("too many operations in txn request")
                    && error.contains(field)
                    && error.contains("TXN_OPS_MAX is 128"),
                "{error}"
            );
        }
    }

    #[test]
    fn empty_and_reserved_keys_and_ignore_flags_with_values_are_refused() {
        let reserved = [RESERVED_KEY_PREFIX, b"x"].concat();
        let refused = |txn: TxnRequest, expected: &str| {
            let error = txn.check().unwrap_err().to_string();
            assert!(error.contains(expected), "{error}");
        };
        refused(success(vec![put("")]), "key is not provided");
        refused(
            success(vec![TxnOp::Range(RangeSpec::key(reserved.clone()))]),
            "reserved prefix",
        );
        refused(
            TxnRequest {
                compares: vec![Compare {
                    key: reserved,
                    range_end: Vec::new(),
                    target: CompareTarget::Lease(0),
                    result: CompareResult::Equal,
                }],
                ..TxnRequest::default()
            },
            "compares[0]",
        );
        let ignore = |value: &[u8], lease, ignore_value, ignore_lease| {
            success(vec![TxnOp::Put {
                key: b"k".to_vec(),
                value: value.to_vec(),
                ttl_ms: 0,
                lease,
                prev_kv: false,
                ignore_value,
                ignore_lease,
            }])
        };
        refused(
            ignore(b"v", 0, true, false),
            "etcdserver: value is provided",
        );
        refused(ignore(b"", 7, false, true), "etcdserver: lease is provided");
        assert!(ignore(b"", 0, true, true).check().is_ok());
    }

    #[test]
    fn compares_judge_every_key_and_absent_keys_as_etcd_does() {
        let compare = |target, result| Compare {
            key: b"k".to_vec(),
            range_end: Vec::new(),
            target,
            result,
        };
        let kv = |version, value: &str| KeyValue {
            key: b"k".to_vec(),
            value: value.into(),
            create_revision: 2,
            mod_revision: 5,
            version,
            lease: 0,
        };
        let newer = compare(CompareTarget::Version(2), CompareResult::Greater);
        assert!(newer.holds(&[kv(3, "a"), kv(4, "b")]));
        assert!(
            !newer.holds(&[kv(3, "a"), kv(2, "b")]),
            "every key must hold"
        );
        // No key: versions and revisions are zeros; a value never holds.
        assert!(compare(CompareTarget::Version(0), CompareResult::Equal).holds(&[]));
        assert!(compare(CompareTarget::ModRevision(1), CompareResult::Less).holds(&[]));
        for result in [
            CompareResult::Equal,
            CompareResult::NotEqual,
            CompareResult::Less,
            CompareResult::Greater,
        ] {
            assert!(!compare(CompareTarget::Value(b"x".to_vec()), result).holds(&[]));
        }
        let value = compare(CompareTarget::Value(b"b".to_vec()), CompareResult::Less);
        assert!(value.holds(&[kv(1, "a")]) && !value.holds(&[kv(1, "ba")]));
    }
}
