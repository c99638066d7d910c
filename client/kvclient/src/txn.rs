//! etcd-style range reads, range deletes and transactions: [`Range`],
//! [`DeleteRange`], [`Compare`], [`TxnOp`] and the [`Txn`] builder, and
//! what they answer. The [`Client`](crate::Client) methods that send them
//! are `range`, `delete_range` and `txn`.
//!
//! ```
//! use kvclient::txn::{Compare, Range, Txn, TxnOp};
//!
//! // Take a lock: create the key only if nobody holds it, else read who does.
//! let txn = Txn::new()
//!     .when([Compare::create_revision("lock/a").eq(0)])
//!     .and_then([TxnOp::put("lock/a", "me")])
//!     .or_else([TxnOp::range(Range::key("lock/a"))]);
//! assert_eq!(txn.compare_count(), 1);
//! ```

use kvproto::kv::v1 as pb;
use prost::bytes::Bytes;

use crate::types::{Consistency, KeyValue, Revisions};

/// Keys a range, delete or compare covers: one key, a prefix, `[from, to)`,
/// or every key from one on (etcd's `key` + `range_end`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Keys {
    key: Bytes,
    range_end: Bytes,
}

impl Keys {
    /// Just `key`.
    pub fn key(key: impl Into<Bytes>) -> Keys {
        Keys {
            key: key.into(),
            range_end: Bytes::new(),
        }
    }

    /// Every key starting with `prefix` (etcd's `--prefix`). An empty
    /// prefix is every key.
    pub fn prefix(prefix: impl Into<Bytes>) -> Keys {
        let prefix: Bytes = prefix.into();
        if prefix.is_empty() {
            return Keys::from_key(vec![0u8]);
        }
        let range_end = prefix_end(&prefix);
        Keys {
            key: prefix,
            range_end,
        }
    }

    /// Keys in `[from, to)`.
    pub fn between(from: impl Into<Bytes>, to: impl Into<Bytes>) -> Keys {
        Keys {
            key: from.into(),
            range_end: to.into(),
        }
    }

    /// Every key at or after `key` (etcd's `--from-key`; an empty key is
    /// sent as `\0`, as etcdctl does, since the server refuses an empty key).
    pub fn from_key(key: impl Into<Bytes>) -> Keys {
        let key: Bytes = key.into();
        Keys {
            key: if key.is_empty() {
                Bytes::from_static(b"\0")
            } else {
                key
            },
            range_end: Bytes::from_static(b"\0"),
        }
    }
}

/// The first key after every key starting with `prefix` (etcd's
/// `GetPrefixRangeEnd`): the prefix with its last byte below 0xff
/// incremented; `\0` (to the end) if every byte is 0xff.
fn prefix_end(prefix: &[u8]) -> Bytes {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end.into();
        }
    }
    Bytes::from_static(b"\0")
}

/// How a range is ordered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SortOrder {
    /// Key order (ascending when a non-key target is set).
    #[default]
    None,
    /// Ascending.
    Ascend,
    /// Descending.
    Descend,
}

/// What a range is sorted by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SortTarget {
    /// The key.
    #[default]
    Key,
    /// The key's version.
    Version,
    /// Its create revision.
    Create,
    /// Its mod revision.
    Mod,
    /// Its value.
    Value,
}

/// A range read (etcd's `RangeRequest`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Range {
    keys: Keys,
    request: pb::RangeRequest,
    consistency: Option<Consistency>,
}

impl Range {
    /// Reads the keys `keys` names.
    pub fn new(keys: Keys) -> Range {
        Range {
            request: pb::RangeRequest {
                key: keys.key.clone(),
                range_end: keys.range_end.clone(),
                ..Default::default()
            },
            keys,
            consistency: None,
        }
    }

    /// Reads one key.
    pub fn key(key: impl Into<Bytes>) -> Range {
        Range::new(Keys::key(key))
    }

    /// Reads the keys starting with `prefix`.
    pub fn prefix(prefix: impl Into<Bytes>) -> Range {
        Range::new(Keys::prefix(prefix))
    }

    /// Keys returned at most (0 = no limit); `more` tells whether some
    /// were left out.
    pub fn limit(mut self, limit: u64) -> Range {
        self.request.limit = limit;
        self
    }

    /// Reads at this store revision (0 = the current one).
    pub fn revision(mut self, revision: u64) -> Range {
        self.request.revision = revision;
        self
    }

    /// Sorts by `target` in `order`.
    pub fn sort(mut self, target: SortTarget, order: SortOrder) -> Range {
        self.request.sort_target = match target {
            SortTarget::Key => pb::SortTarget::Key,
            SortTarget::Version => pb::SortTarget::Version,
            SortTarget::Create => pb::SortTarget::Create,
            SortTarget::Mod => pb::SortTarget::Mod,
            SortTarget::Value => pb::SortTarget::Value,
        } as i32;
        self.request.sort_order = match order {
            SortOrder::None => pb::SortOrder::None,
            SortOrder::Ascend => pb::SortOrder::Ascend,
            SortOrder::Descend => pb::SortOrder::Descend,
        } as i32;
        self
    }

    /// Keys and revisions only, no values.
    pub fn keys_only(mut self) -> Range {
        self.request.keys_only = true;
        self
    }

    /// Only the number of keys.
    pub fn count_only(mut self) -> Range {
        self.request.count_only = true;
        self
    }

    /// Leaves out keys whose mod revision is outside `[min, max]` (0 = no bound).
    pub fn mod_revisions(mut self, min: u64, max: u64) -> Range {
        self.request.min_mod_revision = min;
        self.request.max_mod_revision = max;
        self
    }

    /// Leaves out keys whose create revision is outside `[min, max]` (0 = no bound).
    pub fn create_revisions(mut self, min: u64, max: u64) -> Range {
        self.request.min_create_revision = min;
        self.request.max_create_revision = max;
        self
    }

    /// Reads with this consistency instead of the client's default
    /// (ignored inside a transaction).
    pub fn consistency(mut self, consistency: Consistency) -> Range {
        self.consistency = Some(consistency);
        self
    }

    /// The keys it reads.
    pub fn keys(&self) -> &Keys {
        &self.keys
    }

    pub(crate) fn request(&self, default: Consistency) -> pb::RangeRequest {
        let (consistency, min_index) = self.consistency.unwrap_or(default).to_proto();
        pb::RangeRequest {
            consistency,
            min_index,
            ..self.request.clone()
        }
    }

    pub(crate) fn bare(&self) -> pb::RangeRequest {
        self.request.clone()
    }
}

/// What a range read found.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RangeResult {
    /// The keys, in the order asked for (`seq` and `ttl_left` are not
    /// reported here: 0 and `None`).
    pub kvs: Vec<KeyValue>,
    /// Whether `limit` left keys out.
    pub more: bool,
    /// Keys in the range, before filters and `limit`.
    pub count: u64,
    /// The store revision read at (0 inside a transaction's results: the
    /// transaction's own is in [`TxnResponse::revision`]).
    pub revision: u64,
    /// The answering member's applied index (0 inside a transaction).
    pub applied_index: u64,
}

/// A range delete (etcd's `DeleteRangeRequest`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeleteRange {
    keys: Keys,
    prev_kv: bool,
}

impl DeleteRange {
    /// Deletes the keys `keys` names.
    pub fn new(keys: Keys) -> DeleteRange {
        DeleteRange {
            keys,
            prev_kv: false,
        }
    }

    /// Also returns the deleted keys as they were.
    pub fn prev_kv(mut self) -> DeleteRange {
        self.prev_kv = true;
        self
    }

    pub(crate) fn op(&self) -> pb::TxnDeleteRange {
        pb::TxnDeleteRange {
            key: self.keys.key.clone(),
            range_end: self.keys.range_end.clone(),
            prev_kv: self.prev_kv,
        }
    }
}

/// What a range delete did.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DeletedRange {
    /// Keys deleted.
    pub deleted: u64,
    /// With `prev_kv`: the deleted keys as they were.
    pub prev_kvs: Vec<KeyValue>,
    /// The delete's revision (the store's, unchanged, if nothing was deleted).
    pub revision: u64,
    /// The leader's applied index, covering the delete (0 inside a transaction).
    pub applied_index: u64,
}

/// One condition of a transaction, built as `Compare::<target>(key).<op>(value)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Compare {
    keys: Keys,
    target: pb::compare::Target,
    result: pb::CompareResult,
}

/// A compare waiting for its operator and value.
#[derive(Debug, Clone)]
pub struct CompareOn<T> {
    keys: Keys,
    target: fn(T) -> pb::compare::Target,
}

/// A compare's operator, for building compares from parsed text (the
/// methods `eq`, `ne`, `lt` and `gt` read better in code).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CompareOp {
    /// `=`
    Equal,
    /// `!=`
    NotEqual,
    /// `<`
    Less,
    /// `>`
    Greater,
}

impl<T> CompareOn<T> {
    /// Over every key of `keys` instead of the one key.
    pub fn over(mut self, keys: Keys) -> CompareOn<T> {
        self.keys = keys;
        self
    }

    /// The key's side relates to `value` as `op` says.
    pub fn op(self, op: CompareOp, value: T) -> Compare {
        let result = match op {
            CompareOp::Equal => pb::CompareResult::Equal,
            CompareOp::NotEqual => pb::CompareResult::NotEqual,
            CompareOp::Less => pb::CompareResult::Less,
            CompareOp::Greater => pb::CompareResult::Greater,
        };
        self.with(result, value)
    }

    fn with(self, result: pb::CompareResult, value: T) -> Compare {
        Compare {
            keys: self.keys,
            target: (self.target)(value),
            result,
        }
    }
}

/// Operators of a compare on a number (version, revisions, lease).
impl CompareOn<u64> {
    /// The key's side equals `value`.
    pub fn eq(self, value: u64) -> Compare {
        self.with(pb::CompareResult::Equal, value)
    }

    /// The key's side differs from `value`.
    pub fn ne(self, value: u64) -> Compare {
        self.with(pb::CompareResult::NotEqual, value)
    }

    /// The key's side is below `value`.
    pub fn lt(self, value: u64) -> Compare {
        self.with(pb::CompareResult::Less, value)
    }

    /// The key's side is above `value`.
    pub fn gt(self, value: u64) -> Compare {
        self.with(pb::CompareResult::Greater, value)
    }
}

/// Operators of a compare on the value (byte order).
impl CompareOn<Bytes> {
    /// The value equals `value`.
    pub fn eq(self, value: impl Into<Bytes>) -> Compare {
        self.with(pb::CompareResult::Equal, value.into())
    }

    /// The value differs from `value`.
    pub fn ne(self, value: impl Into<Bytes>) -> Compare {
        self.with(pb::CompareResult::NotEqual, value.into())
    }

    /// The value is below `value`.
    pub fn lt(self, value: impl Into<Bytes>) -> Compare {
        self.with(pb::CompareResult::Less, value.into())
    }

    /// The value is above `value`.
    pub fn gt(self, value: impl Into<Bytes>) -> Compare {
        self.with(pb::CompareResult::Greater, value.into())
    }
}

impl Compare {
    /// Compares the key's value (false when the key is absent).
    pub fn value(key: impl Into<Bytes>) -> CompareOn<Bytes> {
        CompareOn {
            keys: Keys::key(key),
            target: pb::compare::Target::Value,
        }
    }

    /// Compares the key's version (0 = absent).
    pub fn version(key: impl Into<Bytes>) -> CompareOn<u64> {
        CompareOn {
            keys: Keys::key(key),
            target: pb::compare::Target::Version,
        }
    }

    /// Compares the key's create revision (0 = absent).
    pub fn create_revision(key: impl Into<Bytes>) -> CompareOn<u64> {
        CompareOn {
            keys: Keys::key(key),
            target: pb::compare::Target::CreateRevision,
        }
    }

    /// Compares the key's mod revision (0 = absent).
    pub fn mod_revision(key: impl Into<Bytes>) -> CompareOn<u64> {
        CompareOn {
            keys: Keys::key(key),
            target: pb::compare::Target::ModRevision,
        }
    }

    /// Compares the key's lease (0 = none or absent).
    pub fn lease(key: impl Into<Bytes>) -> CompareOn<u64> {
        CompareOn {
            keys: Keys::key(key),
            target: pb::compare::Target::Lease,
        }
    }

    fn proto(&self) -> pb::Compare {
        pb::Compare {
            result: self.result as i32,
            key: self.keys.key.clone(),
            range_end: self.keys.range_end.clone(),
            target: Some(self.target.clone()),
        }
    }
}

/// One op of a transaction's branch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TxnOp {
    /// A put.
    Put(pb::TxnPut),
    /// A range delete.
    DeleteRange(DeleteRange),
    /// A range read (it sees the branch's earlier ops).
    Range(Range),
}

impl TxnOp {
    /// Sets `key` to `value`.
    pub fn put(key: impl Into<Bytes>, value: impl Into<Bytes>) -> TxnOp {
        TxnOp::Put(pb::TxnPut {
            key: key.into(),
            value: value.into(),
            ..Default::default()
        })
    }

    /// Sets `key` with a TTL (ms of cluster time), a lease id, and/or asks
    /// for the key as it was (`prev_kv`).
    pub fn put_with(
        key: impl Into<Bytes>,
        value: impl Into<Bytes>,
        ttl_ms: u64,
        lease: u64,
        prev_kv: bool,
    ) -> TxnOp {
        TxnOp::Put(pb::TxnPut {
            key: key.into(),
            value: value.into(),
            ttl_ms,
            lease,
            prev_kv,
            ..Default::default()
        })
    }

    /// Deletes the keys of `delete`.
    pub fn delete(delete: DeleteRange) -> TxnOp {
        TxnOp::DeleteRange(delete)
    }

    /// Reads `range`.
    pub fn range(range: Range) -> TxnOp {
        TxnOp::Range(range)
    }

    fn proto(&self) -> pb::TxnOp {
        use pb::txn_op::Op;
        pb::TxnOp {
            op: Some(match self {
                TxnOp::Put(put) => Op::Put(put.clone()),
                TxnOp::DeleteRange(delete) => Op::DeleteRange(delete.op()),
                TxnOp::Range(range) => Op::Range(range.bare()),
            }),
        }
    }
}

/// A transaction: compares, then the `and_then` ops if all hold, else the
/// `or_else` ops — atomically, at one revision.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Txn {
    compares: Vec<Compare>,
    success: Vec<TxnOp>,
    failure: Vec<TxnOp>,
}

impl Txn {
    /// An empty transaction (it succeeds and does nothing).
    pub fn new() -> Txn {
        Txn::default()
    }

    /// Adds compares (all must hold).
    pub fn when(mut self, compares: impl IntoIterator<Item = Compare>) -> Txn {
        self.compares.extend(compares);
        self
    }

    /// Adds ops to the branch run when every compare holds.
    pub fn and_then(mut self, ops: impl IntoIterator<Item = TxnOp>) -> Txn {
        self.success.extend(ops);
        self
    }

    /// Adds ops to the branch run otherwise.
    pub fn or_else(mut self, ops: impl IntoIterator<Item = TxnOp>) -> Txn {
        self.failure.extend(ops);
        self
    }

    /// Compares so far.
    pub fn compare_count(&self) -> usize {
        self.compares.len()
    }

    /// The one lease the transaction's puts name, or 0 (none, or several).
    pub(crate) fn sole_lease(&self) -> u64 {
        let mut leases = self
            .success
            .iter()
            .chain(&self.failure)
            .filter_map(|op| match op {
                TxnOp::Put(put) if put.lease != 0 => Some(put.lease),
                _ => None,
            });
        let Some(first) = leases.next() else {
            return 0;
        };
        if leases.all(|lease| lease == first) {
            first
        } else {
            0
        }
    }

    pub(crate) fn proto(&self, session: pb::Session) -> pb::TxnRequest {
        pb::TxnRequest {
            session: Some(session),
            compare: self.compares.iter().map(Compare::proto).collect(),
            success: self.success.iter().map(TxnOp::proto).collect(),
            failure: self.failure.iter().map(TxnOp::proto).collect(),
        }
    }
}

/// What one op of the branch that ran did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TxnResult {
    /// A put: the key as it was, if asked for and it existed.
    Put {
        /// The previous key.
        prev_kv: Option<KeyValue>,
    },
    /// A range delete.
    DeleteRange(DeletedRange),
    /// A range read.
    Range(RangeResult),
}

/// A transaction's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TxnResponse {
    /// Whether every compare held (the `and_then` branch ran).
    pub succeeded: bool,
    /// One per op of the branch that ran.
    pub results: Vec<TxnResult>,
    /// The transaction's revision (the store's, unchanged, if its branch
    /// wrote nothing).
    pub revision: u64,
    /// The leader's applied index, covering the transaction.
    pub applied_index: u64,
}

/// A key of a range or transaction answer.
pub(crate) fn key_value(kv: pb::KeyValue) -> KeyValue {
    KeyValue {
        key: kv.key,
        value: kv.value,
        revisions: Revisions {
            create_revision: kv.create_revision,
            mod_revision: kv.mod_revision,
            version: kv.version,
            lease: kv.lease,
        },
        seq: kv.seq,
        ttl_left: None,
    }
}

pub(crate) fn range_result(
    response: pb::RangeResponse,
    revision: u64,
    applied_index: u64,
) -> RangeResult {
    RangeResult {
        kvs: response.kvs.into_iter().map(key_value).collect(),
        more: response.more,
        count: response.count,
        revision,
        applied_index,
    }
}

pub(crate) fn deleted_range(
    response: pb::DeleteRangeResponse,
    revision: u64,
    applied_index: u64,
) -> DeletedRange {
    DeletedRange {
        deleted: response.deleted,
        prev_kvs: response.prev_kvs.into_iter().map(key_value).collect(),
        revision,
        applied_index,
    }
}

pub(crate) fn txn_results(results: Vec<pb::TxnOpResult>) -> Vec<TxnResult> {
    use pb::txn_op_result::Result as R;
    results
        .into_iter()
        .filter_map(|result| {
            Some(match result.result? {
                R::Put(put) => TxnResult::Put {
                    prev_kv: put.prev_kv.map(key_value),
                },
                R::DeleteRange(delete) => TxnResult::DeleteRange(deleted_range(delete, 0, 0)),
                R::Range(range) => TxnResult::Range(range_result(range, 0, 0)),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_ends_as_etcd_computes_them() {
        assert_eq!(prefix_end(b"abc"), Bytes::from_static(b"abd"));
        assert_eq!(prefix_end(b"a\xff"), Bytes::from_static(b"b"));
        assert_eq!(prefix_end(b"\xff\xff"), Bytes::from_static(b"\0"));
        assert_eq!(Keys::prefix(""), Keys::from_key(Bytes::from_static(b"\0")));
    }

    #[test]
    fn the_sole_lease_of_a_transaction_names_a_missing_lease() {
        let put = |lease| TxnOp::put_with("k", "v", 0, lease, false);
        assert_eq!(Txn::new().and_then([TxnOp::put("k", "v")]).sole_lease(), 0);
        assert_eq!(Txn::new().and_then([put(7), put(0)]).sole_lease(), 7);
        assert_eq!(
            Txn::new().and_then([put(7)]).or_else([put(7)]).sole_lease(),
            7
        );
        assert_eq!(
            Txn::new().and_then([put(7)]).or_else([put(8)]).sole_lease(),
            0
        );
    }

    #[test]
    fn a_compare_names_its_target_operator_and_keys() {
        let compare = Compare::mod_revision("k").over(Keys::prefix("k")).lt(7);
        let wire = compare.proto();
        assert_eq!(wire.result, pb::CompareResult::Less as i32);
        assert_eq!(wire.target, Some(pb::compare::Target::ModRevision(7)));
        assert_eq!(&wire.range_end[..], b"l");
    }
}
