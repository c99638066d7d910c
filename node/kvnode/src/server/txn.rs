//! Range reads, range deletes and transactions on the wire: the `Kv.Range`,
//! `Kv.DeleteRange` and `Kv.Txn` messages turned into kvstate's
//! [`RangeSpec`] and [`TxnRequest`] (every field checked, bad input named),
//! and kvstate's results turned back. The handlers are in `kv.rs`; what the
//! operations mean is kvstate's (`range.rs`, `txn.rs`).

use kvproto::kv::v1 as pb;
use tonic::Status;

use crate::server::convert::{check_key, check_value, limit_exceeded};
use kvstate::range::{KeyValue, RangeError, RangeResult, RangeSpec, SortOrder, SortTarget};
use kvstate::txn::{
    Compare, CompareResult, CompareTarget, TXN_OPS_MAX, TxnOp, TxnOpResult, TxnRequest,
};

/// A range request as kvstate evaluates it.
#[allow(clippy::result_large_err)]
pub fn range_spec(request: &pb::RangeRequest) -> Result<RangeSpec, Status> {
    check_key(&request.key)?;
    check_range_end(&request.range_end, "range_end")?;
    let sort_order = match pb::SortOrder::try_from(request.sort_order) {
        Ok(pb::SortOrder::None) => SortOrder::None,
        Ok(pb::SortOrder::Ascend) => SortOrder::Ascend,
        Ok(pb::SortOrder::Descend) => SortOrder::Descend,
        Err(_) => {
            return Err(Status::invalid_argument(format!(
                "sort_order {} is not a SortOrder",
                request.sort_order
            )));
        }
    };
    let sort_target = match pb::SortTarget::try_from(request.sort_target) {
        Ok(pb::SortTarget::Key) => SortTarget::Key,
        Ok(pb::SortTarget::Version) => SortTarget::Version,
        Ok(pb::SortTarget::Create) => SortTarget::Create,
        Ok(pb::SortTarget::Mod) => SortTarget::Mod,
        Ok(pb::SortTarget::Value) => SortTarget::Value,
        Err(_) => {
            return Err(Status::invalid_argument(format!(
                "sort_target {} is not a SortTarget",
                request.sort_target
            )));
        }
    };
    Ok(RangeSpec {
        key: request.key.to_vec(),
        range_end: request.range_end.to_vec(),
        limit: request.limit,
        keys_only: request.keys_only,
        count_only: request.count_only,
        sort_order,
        sort_target,
        min_mod_revision: request.min_mod_revision,
        max_mod_revision: request.max_mod_revision,
        min_create_revision: request.min_create_revision,
        max_create_revision: request.max_create_revision,
        revision: request.revision,
    })
}

/// A range end is a key bound: at most a key's size.
#[allow(clippy::result_large_err)]
fn check_range_end(range_end: &[u8], field: &str) -> Result<(), Status> {
    if range_end.len() > kvproto::KEY_SIZE_BYTES_MAX {
        return Err(limit_exceeded(
            &format!("KEY_SIZE_BYTES_MAX ({field})"),
            kvproto::KEY_SIZE_BYTES_MAX as u64,
            range_end.len() as u64,
        ));
    }
    Ok(())
}

/// A range read's failure as a status: a future or compacted revision is
/// OUT_OF_RANGE (as etcd answers both), a past one inside a transaction
/// FAILED_PRECONDITION, budgets and keys INVALID_ARGUMENT naming the limit.
pub fn range_error(err: RangeError) -> Status {
    match err {
        RangeError::FutureRevision { .. } | RangeError::History(_) => {
            Status::out_of_range(err.to_string())
        }
        RangeError::PastRevision { .. } => Status::failed_precondition(err.to_string()),
        RangeError::KeyEmpty
        | RangeError::ReservedKey { .. }
        | RangeError::TooManyKeys { .. }
        | RangeError::TooManyCounted { .. }
        | RangeError::TooManyBytes { .. }
        | RangeError::NotARead => Status::invalid_argument(err.to_string()),
        RangeError::KeyChanged { .. }
        | RangeError::Unstable
        | RangeError::HistoryUnstable { .. } => Status::unavailable(err.to_string()),
        RangeError::Engine(_) | RangeError::Revision(_) => Status::internal(err.to_string()),
    }
}

/// A key of a range or transaction answer on the wire (`seq` and
/// `ttl_ms_left` are not part of it: 0).
pub fn key_value(kv: KeyValue) -> pb::KeyValue {
    pb::KeyValue {
        key: kv.key.into(),
        value: kv.value.into(),
        seq: 0,
        ttl_ms_left: 0,
        create_revision: kv.create_revision,
        mod_revision: kv.mod_revision,
        version: kv.version,
        lease: kv.lease,
    }
}

/// A range result on the wire, under `header` (none inside a transaction).
pub fn range_response(result: RangeResult, header: Option<pb::Header>) -> pb::RangeResponse {
    pb::RangeResponse {
        header,
        kvs: result.kvs.into_iter().map(key_value).collect(),
        more: result.more,
        count: result.count,
    }
}

/// A transaction request as kvstate applies it. The op counts are checked
/// here too (kvstate checks them again in apply) so a large request is
/// refused before it reaches the log.
#[allow(clippy::result_large_err)]
pub fn txn_request(request: pb::TxnRequest) -> Result<TxnRequest, Status> {
    for (field, count) in [
        ("compare", request.compare.len()),
        ("success", request.success.len()),
        ("failure", request.failure.len()),
    ] {
        if count > TXN_OPS_MAX {
            return Err(limit_exceeded(
                &format!("TXN_OPS_MAX ({field})"),
                TXN_OPS_MAX as u64,
                count as u64,
            ));
        }
    }
    let compares = request
        .compare
        .into_iter()
        .enumerate()
        .map(|(index, compare)| compare_of(index, compare))
        .collect::<Result<Vec<_>, _>>()?;
    let ops = |branch: &str, ops: Vec<pb::TxnOp>| {
        ops.into_iter()
            .enumerate()
            .map(|(index, op)| txn_op_of(branch, index, op))
            .collect::<Result<Vec<_>, _>>()
    };
    let txn = TxnRequest {
        session: super::kv::session(request.session),
        compares,
        success: ops("success", request.success)?,
        failure: ops("failure", request.failure)?,
    };
    // Refused here, as etcd does before proposing, rather than in a log
    // entry (apply checks again).
    txn.check()
        .map_err(|error| Status::invalid_argument(error.to_string()))?;
    Ok(txn)
}

#[allow(clippy::result_large_err)]
fn compare_of(index: usize, compare: pb::Compare) -> Result<Compare, Status> {
    check_key(&compare.key)?;
    check_range_end(&compare.range_end, "compare.range_end")?;
    let result = match pb::CompareResult::try_from(compare.result) {
        Ok(pb::CompareResult::Equal) => CompareResult::Equal,
        Ok(pb::CompareResult::NotEqual) => CompareResult::NotEqual,
        Ok(pb::CompareResult::Less) => CompareResult::Less,
        Ok(pb::CompareResult::Greater) => CompareResult::Greater,
        Err(_) => {
            return Err(Status::invalid_argument(format!(
                "compare[{index}].result {} is not a CompareResult",
                compare.result
            )));
        }
    };
    use pb::compare::Target;
    let target = match compare.target {
        Some(Target::Version(v)) => CompareTarget::Version(v),
        Some(Target::CreateRevision(v)) => CompareTarget::CreateRevision(v),
        Some(Target::ModRevision(v)) => CompareTarget::ModRevision(v),
        Some(Target::Lease(v)) => CompareTarget::Lease(v),
        Some(Target::Value(v)) => {
            check_value(&v)?;
            CompareTarget::Value(v.to_vec())
        }
        None => {
            return Err(Status::invalid_argument(format!(
                "compare[{index}].target is not set"
            )));
        }
    };
    Ok(Compare {
        key: compare.key.to_vec(),
        range_end: compare.range_end.to_vec(),
        target,
        result,
    })
}

#[allow(clippy::result_large_err)]
fn txn_op_of(branch: &str, index: usize, op: pb::TxnOp) -> Result<TxnOp, Status> {
    use pb::txn_op::Op;
    match op.op {
        Some(Op::Range(range)) => Ok(TxnOp::Range(range_spec(&range)?)),
        Some(Op::Put(put)) => {
            check_key(&put.key)?;
            check_value(&put.value)?;
            Ok(TxnOp::Put {
                key: put.key.to_vec(),
                value: put.value.to_vec(),
                ttl_ms: put.ttl_ms,
                lease: put.lease,
                prev_kv: put.prev_kv,
                ignore_value: put.ignore_value,
                ignore_lease: put.ignore_lease,
            })
        }
        Some(Op::DeleteRange(delete)) => {
            check_key(&delete.key)?;
            check_range_end(&delete.range_end, "delete_range.range_end")?;
            Ok(TxnOp::DeleteRange {
                key: delete.key.to_vec(),
                range_end: delete.range_end.to_vec(),
                prev_kv: delete.prev_kv,
            })
        }
        None => Err(Status::invalid_argument(format!(
            "{branch}[{index}].op is not set"
        ))),
    }
}

/// What the branch that ran did, on the wire.
pub fn txn_results(results: Vec<TxnOpResult>) -> Vec<pb::TxnOpResult> {
    use pb::txn_op_result::Result as R;
    results
        .into_iter()
        .map(|result| pb::TxnOpResult {
            result: Some(match result {
                TxnOpResult::Put { prev_kv } => R::Put(pb::TxnPutResult {
                    prev_kv: prev_kv.map(key_value),
                }),
                TxnOpResult::DeleteRange { deleted, prev_kvs } => {
                    R::DeleteRange(pb::DeleteRangeResponse {
                        header: None,
                        deleted,
                        prev_kvs: prev_kvs.into_iter().map(key_value).collect(),
                    })
                }
                TxnOpResult::Range(range) => R::Range(range_response(range, None)),
            }),
        })
        .collect()
}
