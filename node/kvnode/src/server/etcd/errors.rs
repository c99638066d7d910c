//! Native statuses as etcd's gRPC errors. etcd's client libraries tell
//! errors apart by code and exact message (clientv3's `rpctypes` looks the
//! message up in a table), so an error etcd has is answered with etcd's
//! code and message, word for word; raftcask's own explanation (naming
//! the field and the limit) rides along in the [`DETAIL_KEY`] metadata.
//! A native error etcd has no counterpart for keeps its code and message.

use kvproto::kv::v1::error_detail::Detail;
use tonic::metadata::MetadataValue;
use tonic::{Code, Status};

use crate::server::convert;

/// ASCII gRPC metadata key carrying raftcask's own message when an error
/// is answered with etcd's exact one.
pub const DETAIL_KEY: &str = "raftcask-detail";

/// etcd's errors this front end answers: (code, exact message).
pub const KEY_NOT_PROVIDED: (Code, &str) =
    (Code::InvalidArgument, "etcdserver: key is not provided");
pub const KEY_NOT_FOUND: (Code, &str) = (Code::InvalidArgument, "etcdserver: key not found");
pub const VALUE_PROVIDED: (Code, &str) = (Code::InvalidArgument, "etcdserver: value is provided");
pub const LEASE_PROVIDED: (Code, &str) = (Code::InvalidArgument, "etcdserver: lease is provided");
pub const TOO_MANY_OPS: (Code, &str) = (
    Code::InvalidArgument,
    "etcdserver: too many operations in txn request",
);
pub const DUPLICATE_KEY: (Code, &str) = (
    Code::InvalidArgument,
    "etcdserver: duplicate key given in txn request",
);
pub const COMPACTED: (Code, &str) = (
    Code::OutOfRange,
    "etcdserver: mvcc: required revision has been compacted",
);
pub const FUTURE_REVISION: (Code, &str) = (
    Code::OutOfRange,
    "etcdserver: mvcc: required revision is a future revision",
);
pub const NO_SPACE: (Code, &str) = (
    Code::ResourceExhausted,
    "etcdserver: mvcc: database space exceeded",
);
pub const LEASE_NOT_FOUND: (Code, &str) = (Code::NotFound, "etcdserver: requested lease not found");
pub const LEASE_EXISTS: (Code, &str) =
    (Code::FailedPrecondition, "etcdserver: lease already exists");
pub const LEASE_TTL_TOO_LARGE: (Code, &str) = (Code::OutOfRange, "etcdserver: too large lease TTL");
pub const MEMBER_NOT_FOUND: (Code, &str) = (Code::NotFound, "etcdserver: member not found");
pub const REQUEST_TOO_LARGE: (Code, &str) =
    (Code::InvalidArgument, "etcdserver: request is too large");
pub const TOO_MANY_REQUESTS: (Code, &str) =
    (Code::ResourceExhausted, "etcdserver: too many requests");
pub const NO_LEADER: (Code, &str) = (Code::Unavailable, "etcdserver: no leader");
pub const NOT_LEADER: (Code, &str) = (Code::FailedPrecondition, "etcdserver: not leader");
pub const STOPPED: (Code, &str) = (Code::Unavailable, "etcdserver: server stopped");
pub const TIMEOUT: (Code, &str) = (Code::Unavailable, "etcdserver: request timed out");
pub const BAD_LEADER_TRANSFEREE: (Code, &str) = (
    Code::FailedPrecondition,
    "etcdserver: bad leader transferee",
);
pub const AUTH_NOT_ENABLED: (Code, &str) = (
    Code::FailedPrecondition,
    "etcdserver: authentication is not enabled",
);

/// The errors whose messages native statuses may start with (kvstate
/// words its transaction errors after etcd's, then adds the details).
const PREFIXED: [(Code, &str); 9] = [
    KEY_NOT_PROVIDED,
    KEY_NOT_FOUND,
    VALUE_PROVIDED,
    LEASE_PROVIDED,
    TOO_MANY_OPS,
    DUPLICATE_KEY,
    COMPACTED,
    FUTURE_REVISION,
    LEASE_NOT_FOUND,
];

/// etcd's error `(code, message)`, with `detail` (raftcask's own words)
/// in the [`DETAIL_KEY`] metadata.
pub fn etcd_error((code, message): (Code, &str), detail: &str) -> Status {
    let mut status = Status::new(code, message);
    // Metadata values are visible ASCII: anything else is left out.
    let printable: String = detail
        .chars()
        .map(|c| {
            if c.is_ascii_graphic() || c == ' ' {
                c
            } else {
                '?'
            }
        })
        .collect();
    if let Ok(value) = MetadataValue::try_from(printable.as_str()) {
        status.metadata_mut().insert(DETAIL_KEY, value);
    }
    status
}

/// A native status as etcd would answer it.
pub fn to_etcd(status: Status) -> Status {
    let message = status.message();
    let bare = message.strip_prefix("etcdserver: ").unwrap_or(message);
    for error in PREFIXED {
        let etcd_bare = error.1.trim_start_matches("etcdserver: ");
        if bare.starts_with(etcd_bare) {
            return etcd_error(error, message);
        }
    }
    let detail = convert::detail_of(&status).and_then(|d| d.detail);
    match (status.code(), detail) {
        // Key, value and entry limits: etcd's "request is too large".
        (Code::InvalidArgument, Some(Detail::LimitExceeded(limit)))
            if limit.limit.contains("SIZE_BYTES_MAX") =>
        {
            etcd_error(REQUEST_TOO_LARGE, message)
        }
        (Code::InvalidArgument, Some(Detail::LimitExceeded(limit)))
            if limit.limit.starts_with("TXN_OPS_MAX") =>
        {
            etcd_error(TOO_MANY_OPS, message)
        }
        (Code::NotFound, _) => etcd_error(LEASE_NOT_FOUND, message),
        (Code::AlreadyExists, _) => etcd_error(LEASE_EXISTS, message),
        (Code::ResourceExhausted, Some(Detail::LimitExceeded(_))) => etcd_error(NO_SPACE, message),
        (Code::ResourceExhausted, _) => etcd_error(TOO_MANY_REQUESTS, message),
        // A forwarded write that found no leader in time: nothing written.
        (Code::FailedPrecondition, Some(Detail::NotLeader(_))) => etcd_error(NO_LEADER, message),
        // The write may have applied: etcd's clients treat a timeout so.
        (Code::Unavailable, Some(Detail::OutcomeUnknown(_)))
        | (Code::Aborted, Some(Detail::SessionExpired(_)))
        | (Code::DeadlineExceeded, _) => etcd_error(TIMEOUT, message),
        (Code::Unavailable, _) if message.contains("shutting down") => etcd_error(STOPPED, message),
        (Code::Unavailable, _) if message.contains("no leader") => etcd_error(NO_LEADER, message),
        (Code::Unavailable, _) => etcd_error(TIMEOUT, message),
        _ => status,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn native_errors_become_etcds_exact_messages() {
        let compacted = Status::out_of_range(
            "mvcc: required revision has been compacted: field `revision` is 3, the store is \
             compacted at 5",
        );
        let answered = to_etcd(compacted);
        assert_eq!(answered.code(), Code::OutOfRange);
        assert_eq!(answered.message(), COMPACTED.1);
        assert!(
            answered
                .metadata()
                .get(DETAIL_KEY)
                .is_some_and(|v| v.to_str().unwrap().contains("compacted at 5"))
        );
        let future = to_etcd(Status::out_of_range(
            "mvcc: required revision is a future revision: field `revision` is 9",
        ));
        assert_eq!(future.message(), FUTURE_REVISION.1);
        let lease = to_etcd(Status::not_found("no lease 7"));
        assert_eq!(
            (lease.code(), lease.message()),
            (Code::NotFound, LEASE_NOT_FOUND.1)
        );
        let exists = to_etcd(Status::already_exists("lease 7 exists"));
        assert_eq!(
            (exists.code(), exists.message()),
            (Code::FailedPrecondition, LEASE_EXISTS.1)
        );
        let big = to_etcd(convert::limit_exceeded("VALUE_SIZE_BYTES_MAX", 1, 2));
        assert_eq!(big.message(), REQUEST_TOO_LARGE.1);
        let ops = to_etcd(Status::invalid_argument(
            "etcdserver: too many operations in txn request: field `success` holds 129",
        ));
        assert_eq!(ops.message(), TOO_MANY_OPS.1);
        let unknown = to_etcd(convert::outcome_unknown("lost"));
        assert_eq!(
            (unknown.code(), unknown.message()),
            (Code::Unavailable, TIMEOUT.1)
        );
        let no_leader = to_etcd(convert::not_leader(None, None));
        assert_eq!(
            (no_leader.code(), no_leader.message()),
            (Code::Unavailable, NO_LEADER.1)
        );
        // Nothing etcd has: unchanged.
        let other = to_etcd(Status::invalid_argument("sort_order 9 is not a SortOrder"));
        assert_eq!(other.message(), "sort_order 9 is not a SortOrder");
    }
}
