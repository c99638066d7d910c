//! etcd's `KV` service: Range, Put, DeleteRange, Txn, Compact.
//!
//! A Range is the native `Kv.Range` (`serializable` = a stale read of this
//! member's applied state; otherwise linearizable through the read index,
//! on a follower too). A Txn whose branches hold only ranges is a read, as
//! etcd serves it: after the read index unless every range is
//! `serializable`, its compares and ranges judged at one store revision
//! under the change history's read lock (`kvstate::read_txn`; a range's own
//! `revision` read through the history). Put, DeleteRange and any other
//! Txn each become one native transaction (`Write::Txn`: a put or a range
//! delete is a transaction of one op, as etcd applies it) sent down
//! [`KvService::write_from_front_end`]: a follower forwards it to the
//! leader exactly once. Compact is the native compaction, proposed by the
//! leader (a follower asks the leader's client port).

use kvproto::etcd::etcdserverpb::kv_server::Kv;
use kvproto::etcd::etcdserverpb::{
    CompactionRequest, CompactionResponse, Compare, DeleteRangeRequest, DeleteRangeResponse,
    PutRequest, PutResponse, RangeRequest, RangeResponse, RequestOp, ResponseHeader, ResponseOp,
    TxnRequest, TxnResponse, compare, request_op, response_op,
};
use kvproto::etcd::mvccpb;
use kvproto::kv::v1 as native;
use kvproto::kv::v1::Consistency;
use kvproto::kv::v1::kv_server::Kv as NativeKv;
use kvstate::command::Outcome;
use tonic::{Request, Response, Status};

use super::errors::{self, etcd_error, to_etcd};
use super::{ETCD_REQUEST_BYTES_MAX, ETCD_TXN_OPS_MAX, EtcdFrontEnd, non_negative, revision_i64};

/// A native key in etcd's shape.
pub(crate) fn key_value(kv: native::KeyValue) -> mvccpb::KeyValue {
    mvccpb::KeyValue {
        key: kv.key,
        create_revision: revision_i64(kv.create_revision),
        mod_revision: revision_i64(kv.mod_revision),
        version: revision_i64(kv.version),
        value: kv.value,
        lease: revision_i64(kv.lease),
    }
}

/// etcd refuses an empty key before anything else.
#[allow(clippy::result_large_err)]
fn check_key_given(key: &[u8], field: &str) -> Result<(), Status> {
    if key.is_empty() {
        return Err(etcd_error(
            errors::KEY_NOT_PROVIDED,
            &format!("field `{field}` is empty"),
        ));
    }
    Ok(())
}

/// etcd's request size limit, on the request as encoded.
#[allow(clippy::result_large_err)]
fn check_size(request: &impl prost::Message, what: &str) -> Result<(), Status> {
    let size = request.encoded_len();
    if size > ETCD_REQUEST_BYTES_MAX {
        return Err(etcd_error(
            errors::REQUEST_TOO_LARGE,
            &format!(
                "the {what} encodes to {size} bytes, above ETCD_REQUEST_BYTES_MAX \
                 ({ETCD_REQUEST_BYTES_MAX})"
            ),
        ));
    }
    Ok(())
}

/// A lease id from etcd's `int64`: a negative one names no lease there is.
#[allow(clippy::result_large_err)]
fn lease_id(lease: i64) -> Result<u64, Status> {
    u64::try_from(lease).map_err(|_| {
        etcd_error(
            errors::LEASE_NOT_FOUND,
            &format!("field `lease` is {lease}: lease ids are positive"),
        )
    })
}

/// An etcd range request as the native one (`consistency` ignored inside
/// a transaction).
pub(crate) fn native_range(request: &RangeRequest) -> native::RangeRequest {
    native::RangeRequest {
        key: request.key.clone(),
        range_end: request.range_end.clone(),
        limit: non_negative(request.limit),
        revision: non_negative(request.revision),
        // The two enums number their values alike.
        sort_order: request.sort_order,
        sort_target: request.sort_target,
        consistency: if request.serializable {
            native::Consistency::Stale as i32
        } else {
            native::Consistency::Linearizable as i32
        },
        min_index: 0,
        keys_only: request.keys_only,
        count_only: request.count_only,
        min_mod_revision: non_negative(request.min_mod_revision),
        max_mod_revision: non_negative(request.max_mod_revision),
        min_create_revision: non_negative(request.min_create_revision),
        max_create_revision: non_negative(request.max_create_revision),
    }
}

fn range_response(answer: native::RangeResponse, header: ResponseHeader) -> RangeResponse {
    RangeResponse {
        header: Some(header),
        kvs: answer.kvs.into_iter().map(key_value).collect(),
        more: answer.more,
        count: revision_i64(answer.count),
    }
}

#[allow(clippy::result_large_err)]
fn native_put(request: PutRequest) -> Result<native::TxnOp, Status> {
    Ok(native::TxnOp {
        op: Some(native::txn_op::Op::Put(native::TxnPut {
            key: request.key,
            value: request.value,
            lease: lease_id(request.lease)?,
            prev_kv: request.prev_kv,
            ignore_value: request.ignore_value,
            ignore_lease: request.ignore_lease,
            ttl_ms: 0,
        })),
    })
}

fn native_delete(request: DeleteRangeRequest) -> native::TxnOp {
    native::TxnOp {
        op: Some(native::txn_op::Op::DeleteRange(native::TxnDeleteRange {
            key: request.key,
            range_end: request.range_end,
            prev_kv: request.prev_kv,
        })),
    }
}

/// One compare: etcd's `target` says which value is compared (an unset
/// union compares with zero, as etcd does).
#[allow(clippy::result_large_err)]
fn native_compare(index: usize, compare: Compare) -> Result<native::Compare, Status> {
    use compare::{CompareTarget, TargetUnion};
    use native::compare::Target;
    let union = compare.target_union;
    // Stored versions, revisions and lease ids are never negative: a
    // negative operand is refused (clamping it to 0 would turn `> -1` false
    // and `= -1` true, where etcd answers the other way).
    let operand = |field: &str, value: i64| {
        u64::try_from(value).map_err(|_| {
            Status::invalid_argument(format!(
                "compare[{index}].{field} is {value}: raftcask compares only with values \
                 of 0 or more (stored ones never are negative)"
            ))
        })
    };
    let target = match CompareTarget::try_from(compare.target) {
        Ok(CompareTarget::Version) => Target::Version(match union {
            Some(TargetUnion::Version(v)) => operand("version", v)?,
            _ => 0,
        }),
        Ok(CompareTarget::Create) => Target::CreateRevision(match union {
            Some(TargetUnion::CreateRevision(v)) => operand("create_revision", v)?,
            _ => 0,
        }),
        Ok(CompareTarget::Mod) => Target::ModRevision(match union {
            Some(TargetUnion::ModRevision(v)) => operand("mod_revision", v)?,
            _ => 0,
        }),
        Ok(CompareTarget::Value) => Target::Value(match union {
            Some(TargetUnion::Value(v)) => v,
            _ => Default::default(),
        }),
        Ok(CompareTarget::Lease) => Target::Lease(match union {
            Some(TargetUnion::Lease(v)) => operand("lease", v)?,
            _ => 0,
        }),
        Err(_) => {
            return Err(Status::invalid_argument(format!(
                "compare[{index}].target {} is not a CompareTarget (0 VERSION .. 4 LEASE)",
                compare.target
            )));
        }
    };
    Ok(native::Compare {
        // The two enums number their values alike.
        result: compare.result,
        key: compare.key,
        range_end: compare.range_end,
        target: Some(target),
    })
}

#[allow(clippy::result_large_err)]
fn native_op(branch: &str, index: usize, op: RequestOp) -> Result<native::TxnOp, Status> {
    match op.request {
        Some(request_op::Request::RequestRange(range)) => Ok(native::TxnOp {
            op: Some(native::txn_op::Op::Range(native_range(&range))),
        }),
        Some(request_op::Request::RequestPut(put)) => native_put(put),
        Some(request_op::Request::RequestDeleteRange(delete)) => Ok(native_delete(delete)),
        Some(request_op::Request::RequestTxn(_)) => Err(Status::invalid_argument(format!(
            "{branch}[{index}].request_txn: nested transactions are not served by raftcask's \
             etcd port (its transactions are one level deep); flatten the transaction"
        ))),
        None => Err(Status::invalid_argument(format!(
            "{branch}[{index}].request is not set"
        ))),
    }
}

/// An etcd transaction as the native one; the op limits first, as etcd
/// checks them.
#[allow(clippy::result_large_err)]
fn native_txn(request: TxnRequest) -> Result<native::TxnRequest, Status> {
    for (field, count) in [
        ("compare", request.compare.len()),
        ("success", request.success.len()),
        ("failure", request.failure.len()),
    ] {
        if count > ETCD_TXN_OPS_MAX {
            return Err(etcd_error(
                errors::TOO_MANY_OPS,
                &format!(
                    "field `{field}` holds {count}, above ETCD_TXN_OPS_MAX ({ETCD_TXN_OPS_MAX})"
                ),
            ));
        }
    }
    let compare = request
        .compare
        .into_iter()
        .enumerate()
        .map(|(index, compare)| native_compare(index, compare))
        .collect::<Result<Vec<_>, _>>()?;
    let ops = |branch: &str, ops: Vec<RequestOp>| {
        ops.into_iter()
            .enumerate()
            .map(|(index, op)| native_op(branch, index, op))
            .collect::<Result<Vec<_>, _>>()
    };
    Ok(native::TxnRequest {
        session: None,
        compare,
        success: ops("success", request.success)?,
        failure: ops("failure", request.failure)?,
    })
}

/// Whether etcd serves the transaction as a read: every op of both
/// branches is a range (etcd's `isTxnReadonly`).
fn is_read_only(request: &TxnRequest) -> bool {
    request
        .success
        .iter()
        .chain(&request.failure)
        .all(|op| matches!(op.request, Some(request_op::Request::RequestRange(_))))
}

/// Whether a read-only transaction may be answered from this member's
/// applied state: every range is `serializable` (etcd's
/// `isTxnSerializable`; a transaction without ops is).
fn is_serializable(request: &TxnRequest) -> bool {
    request.success.iter().chain(&request.failure).all(|op| {
        matches!(&op.request, Some(request_op::Request::RequestRange(range)) if range.serializable)
    })
}

impl EtcdFrontEnd {
    /// A read-only transaction (see [`is_read_only`]) answered as a read:
    /// linearizable through the read index (on a follower too) unless
    /// every range is serializable, then judged and read at one store
    /// revision (`kvstate::read_txn`): whether it succeeded, one range
    /// result per op of the branch read, and that revision.
    async fn read_txn(
        &self,
        request: TxnRequest,
    ) -> Result<(bool, Vec<native::TxnOpResult>, u64), Status> {
        let consistency = if is_serializable(&request) {
            Consistency::Stale
        } else {
            Consistency::Linearizable
        };
        let txn = crate::server::txn::txn_request(native_txn(request)?).map_err(to_etcd)?;
        self.kv
            .prepare_read(consistency, 0)
            .await
            .map_err(to_etcd)?;
        let state_machine = self.kv.state_machine().clone();
        let now = state_machine.cluster_time_ms();
        // Single keys only (clientv3's multi-key get, STM's prefetch): at
        // most one key per compare and op, read on this worker while no
        // entry applies, as a one-key Range is.
        let inline = txn
            .reads_single_keys()
            .then(|| {
                kvstate::read_txn::try_read_txn(
                    || state_machine.engine(),
                    state_machine.history(),
                    &txn,
                    now,
                )
            })
            .flatten();
        // Otherwise up to READ_TXN_KEYS_MAX keys under the history's read
        // lock: off the async workers.
        let answer = match inline {
            Some(answer) => answer,
            None => tokio::task::spawn_blocking(move || {
                kvstate::read_txn::read_txn(
                    || state_machine.engine(),
                    state_machine.history(),
                    &txn,
                    now,
                )
            })
            .await
            .map_err(|err| Status::internal(format!("the transaction's read failed: {err}")))?,
        }
        .map_err(|err| {
            let message = err.to_string();
            let code = crate::server::txn::range_error(err.error).code();
            to_etcd(Status::new(code, message))
        })?;
        let results = answer
            .ranges
            .into_iter()
            .map(|range| native::TxnOpResult {
                result: Some(native::txn_op_result::Result::Range(
                    crate::server::txn::range_response(range, None),
                )),
            })
            .collect();
        Ok((answer.succeeded, results, answer.revision))
    }

    /// Runs a native transaction down the front ends' write path: whether
    /// it succeeded, what its ops answered, and its revision.
    async fn run_txn(
        &self,
        txn: native::TxnRequest,
    ) -> Result<(bool, Vec<native::TxnOpResult>, u64), Status> {
        let txn = crate::server::txn::txn_request(txn).map_err(to_etcd)?;
        let (answer, _) = self
            .kv
            .write_from_front_end(txn.into())
            .await
            .map_err(to_etcd)?;
        match answer.outcome {
            Outcome::Txn { succeeded, results } => Ok((
                succeeded,
                crate::server::txn::txn_results(results),
                answer.revision,
            )),
            other => Err(crate::server::kv::unexpected(other)),
        }
    }
}

/// What one op answered, in etcd's shape; nested answers carry a header
/// with the revision only, as etcd's do.
fn response_op(result: native::TxnOpResult, revision: u64) -> ResponseOp {
    use native::txn_op_result::Result as R;
    let header = || {
        Some(ResponseHeader {
            revision: revision_i64(revision),
            ..ResponseHeader::default()
        })
    };
    let response = result.result.map(|result| match result {
        R::Range(range) => response_op::Response::ResponseRange(RangeResponse {
            header: header(),
            kvs: range.kvs.into_iter().map(key_value).collect(),
            more: range.more,
            count: revision_i64(range.count),
        }),
        R::Put(put) => response_op::Response::ResponsePut(PutResponse {
            header: header(),
            prev_kv: put.prev_kv.map(key_value),
        }),
        R::DeleteRange(deleted) => {
            response_op::Response::ResponseDeleteRange(DeleteRangeResponse {
                header: header(),
                deleted: revision_i64(deleted.deleted),
                prev_kvs: deleted.prev_kvs.into_iter().map(key_value).collect(),
            })
        }
    });
    ResponseOp { response }
}

#[tonic::async_trait]
impl Kv for EtcdFrontEnd {
    async fn range(
        &self,
        request: Request<RangeRequest>,
    ) -> Result<Response<RangeResponse>, Status> {
        let request = request.into_inner();
        check_key_given(&request.key, "key")?;
        let answer = NativeKv::range(&self.kv, Request::new(native_range(&request)))
            .await
            .map_err(to_etcd)?
            .into_inner();
        let header = super::EtcdFrontEnd::header_of(answer.header).unwrap_or_default();
        Ok(Response::new(range_response(answer, header)))
    }

    async fn put(&self, request: Request<PutRequest>) -> Result<Response<PutResponse>, Status> {
        let request = request.into_inner();
        check_key_given(&request.key, "key")?;
        check_size(&request, "put")?;
        let txn = native::TxnRequest {
            success: vec![native_put(request)?],
            ..Default::default()
        };
        let (_, results, revision) = self.run_txn(txn).await?;
        let prev_kv = match results.into_iter().next().and_then(|r| r.result) {
            Some(native::txn_op_result::Result::Put(put)) => put.prev_kv.map(key_value),
            _ => return Err(Status::internal("a put's transaction answered no put")),
        };
        Ok(Response::new(PutResponse {
            header: Some(self.write_header(revision)),
            prev_kv,
        }))
    }

    async fn delete_range(
        &self,
        request: Request<DeleteRangeRequest>,
    ) -> Result<Response<DeleteRangeResponse>, Status> {
        let request = request.into_inner();
        check_key_given(&request.key, "key")?;
        check_size(&request, "delete")?;
        let txn = native::TxnRequest {
            success: vec![native_delete(request)],
            ..Default::default()
        };
        let (_, results, revision) = self.run_txn(txn).await?;
        let Some(native::txn_op_result::Result::DeleteRange(deleted)) =
            results.into_iter().next().and_then(|r| r.result)
        else {
            return Err(Status::internal(
                "a delete's transaction answered no delete",
            ));
        };
        Ok(Response::new(DeleteRangeResponse {
            header: Some(self.write_header(revision)),
            deleted: revision_i64(deleted.deleted),
            prev_kvs: deleted.prev_kvs.into_iter().map(key_value).collect(),
        }))
    }

    async fn txn(&self, request: Request<TxnRequest>) -> Result<Response<TxnResponse>, Status> {
        let request = request.into_inner();
        check_size(&request, "transaction")?;
        let (succeeded, results, revision) = if is_read_only(&request) {
            self.read_txn(request).await?
        } else {
            self.run_txn(native_txn(request)?).await?
        };
        Ok(Response::new(TxnResponse {
            header: Some(self.write_header(revision)),
            succeeded,
            responses: results
                .into_iter()
                .map(|result| response_op(result, revision))
                .collect(),
        }))
    }

    async fn compact(
        &self,
        request: Request<CompactionRequest>,
    ) -> Result<Response<CompactionResponse>, Status> {
        let request = request.into_inner();
        let native_request = native::CompactRequest {
            revision: non_negative(request.revision),
        };
        let answer = match NativeKv::compact(&self.kv, Request::new(native_request)).await {
            Ok(answer) => answer.into_inner(),
            // Not the leader: the leader's client port proposes it.
            Err(status) if status.code() == tonic::Code::FailedPrecondition => self
                .compact_on_leader(native_request)
                .await
                .map_err(to_etcd)?,
            Err(status) => return Err(to_etcd(status)),
        };
        Ok(Response::new(CompactionResponse {
            header: EtcdFrontEnd::header_of(answer.header),
        }))
    }
}

impl EtcdFrontEnd {
    /// A compaction taken by a follower, asked of the leader's client port
    /// (a compaction is not a write the forwarder carries). With TLS or a
    /// token on the client port the follower presents the port's own
    /// token; a leader it cannot reach is etcd's "no leader".
    async fn compact_on_leader(
        &self,
        request: native::CompactRequest,
    ) -> Result<native::CompactResponse, Status> {
        let (leader, addr) = self.kv.leader();
        let (Some(leader), Some(addr)) = (leader, addr) else {
            return Err(etcd_error(errors::NO_LEADER, "no leader is known"));
        };
        if leader == self.member_id() {
            return Err(etcd_error(
                errors::NO_LEADER,
                "this member leads but refused the compaction as not the leader",
            ));
        }
        let Some(endpoint) = self.leader_endpoint(&addr) else {
            return Err(etcd_error(
                errors::NOT_LEADER,
                &format!(
                    "compactions are proposed by the leader (member {leader} at {addr}); this \
                     member cannot reach its client port with TLS on: compact there"
                ),
            ));
        };
        let channel = endpoint
            .connect()
            .await
            .map_err(|err| Status::unavailable(format!("the leader at {addr}: {err}")))?;
        let mut client = native::kv_client::KvClient::new(channel);
        let mut request = Request::new(request);
        if let Some(token) = &self.token {
            let value = format!("Bearer {}", token.expose());
            if let Ok(value) = value.parse() {
                request.metadata_mut().insert("authorization", value);
            }
        }
        Ok(client.compact(request).await?.into_inner())
    }

    /// The leader's client port as an endpoint (plain TCP only).
    fn leader_endpoint(&self, addr: &str) -> Option<tonic::transport::Endpoint> {
        if self.tls {
            return None;
        }
        tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .ok()
            .map(|endpoint| {
                endpoint
                    .connect_timeout(std::time::Duration::from_secs(2))
                    .timeout(crate::server::kv::WRITE_TIMEOUT)
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn txn_limits_and_nested_txns_are_refused_with_a_reason() {
        let put = RequestOp {
            request: Some(request_op::Request::RequestPut(PutRequest {
                key: "k".into(),
                ..Default::default()
            })),
        };
        let too_many = TxnRequest {
            success: vec![put.clone(); ETCD_TXN_OPS_MAX + 1],
            ..Default::default()
        };
        let status = native_txn(too_many).unwrap_err();
        assert_eq!(status.message(), errors::TOO_MANY_OPS.1);
        let at_limit = TxnRequest {
            success: vec![put; ETCD_TXN_OPS_MAX],
            ..Default::default()
        };
        assert!(native_txn(at_limit).is_ok());
        let nested = TxnRequest {
            failure: vec![RequestOp {
                request: Some(request_op::Request::RequestTxn(TxnRequest::default())),
            }],
            ..Default::default()
        };
        let status = native_txn(nested).unwrap_err();
        assert!(
            status.message().contains("failure[0].request_txn"),
            "{status:?}"
        );
    }

    #[test]
    fn only_ranges_make_a_read_and_serializable_ones_a_local_read() {
        let range = |serializable| RequestOp {
            request: Some(request_op::Request::RequestRange(RangeRequest {
                key: "k".into(),
                revision: 3,
                serializable,
                ..Default::default()
            })),
        };
        let put = RequestOp {
            request: Some(request_op::Request::RequestPut(PutRequest {
                key: "k".into(),
                ..Default::default()
            })),
        };
        let stm_prefetch = TxnRequest {
            success: vec![range(true), range(true)],
            ..Default::default()
        };
        assert!(is_read_only(&stm_prefetch) && is_serializable(&stm_prefetch));
        let mixed = TxnRequest {
            success: vec![range(true)],
            failure: vec![range(false)],
            ..Default::default()
        };
        assert!(is_read_only(&mixed) && !is_serializable(&mixed));
        let writes = TxnRequest {
            success: vec![range(true)],
            failure: vec![put],
            ..Default::default()
        };
        assert!(!is_read_only(&writes));
        // As etcd: no ops at all is a serializable read.
        assert!(is_read_only(&TxnRequest::default()));
        assert!(is_serializable(&TxnRequest::default()));
    }

    #[test]
    fn a_compare_takes_the_value_its_target_names() {
        let compare = Compare {
            result: compare::CompareResult::Greater as i32,
            target: compare::CompareTarget::Mod as i32,
            key: "k".into(),
            target_union: Some(compare::TargetUnion::ModRevision(7)),
            range_end: Default::default(),
        };
        let converted = native_compare(0, compare).unwrap();
        assert_eq!(
            converted.target,
            Some(native::compare::Target::ModRevision(7))
        );
        assert_eq!(converted.result, native::CompareResult::Greater as i32);
        // Target VERSION with no value: compared with 0.
        let compare = Compare {
            target: compare::CompareTarget::Version as i32,
            key: "k".into(),
            ..Default::default()
        };
        assert_eq!(
            native_compare(0, compare).unwrap().target,
            Some(native::compare::Target::Version(0))
        );
    }
}
