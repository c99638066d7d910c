//! Conversions between the gRPC protocol (kvproto) and the node's own
//! types: error statuses with their `ErrorDetail`, request limits, and
//! engine entries to protocol messages.

use kvproto::kv::v1::{
    ErrorDetail, IndexNotReached, LimitExceeded, NotLeader, OutcomeUnknown, error_detail,
};
use prost::Message;
use tonic::{Code, Status};

use kvstate::command::RESERVED_KEY_PREFIX;

pub use kvproto::{ERROR_DETAIL_KEY, KEY_SIZE_BYTES_MAX, VALUE_SIZE_BYTES_MAX};

/// A status with an [`ErrorDetail`] in its metadata.
pub fn status_with_detail(
    code: Code,
    message: impl Into<String>,
    detail: error_detail::Detail,
) -> Status {
    let mut status = Status::new(code, message.into());
    let bytes = ErrorDetail {
        detail: Some(detail),
    }
    .encode_to_vec();
    status.metadata_mut().insert_bin(
        ERROR_DETAIL_KEY,
        tonic::metadata::MetadataValue::from_bytes(&bytes),
    );
    status
}

/// FAILED_PRECONDITION with a `NotLeader` detail.
pub fn not_leader(leader_id: Option<u64>, leader_client_addr: Option<String>) -> Status {
    let leader_client_addr = leader_client_addr.unwrap_or_default();
    let message = match leader_id {
        Some(id) => format!("not the leader; the leader is member {id} at {leader_client_addr}"),
        None => "not the leader; no leader is known (an election may be under way)".to_string(),
    };
    status_with_detail(
        Code::FailedPrecondition,
        message,
        error_detail::Detail::NotLeader(NotLeader {
            leader_id: leader_id.unwrap_or(0),
            leader_client_addr,
        }),
    )
}

/// INVALID_ARGUMENT with a `LimitExceeded` detail naming the limit.
pub fn limit_exceeded(limit: &str, limit_value: u64, actual_value: u64) -> Status {
    status_with_detail(
        Code::InvalidArgument,
        format!("{limit} is {limit_value}; the request has {actual_value}"),
        error_detail::Detail::LimitExceeded(LimitExceeded {
            limit: limit.to_string(),
            limit_value,
            actual_value,
        }),
    )
}

/// UNAVAILABLE with an `IndexNotReached` detail.
pub fn index_not_reached(min_index: u64, applied_index: u64) -> Status {
    status_with_detail(
        Code::Unavailable,
        format!("min_index {min_index} not reached: applied index is {applied_index}"),
        error_detail::Detail::IndexNotReached(IndexNotReached {
            min_index,
            applied_index,
        }),
    )
}

/// UNAVAILABLE with an `OutcomeUnknown` detail.
pub fn outcome_unknown(message: impl Into<String>) -> Status {
    status_with_detail(
        Code::Unavailable,
        message,
        error_detail::Detail::OutcomeUnknown(OutcomeUnknown {}),
    )
}

/// Checks a user key: not reserved, not over [`KEY_SIZE_BYTES_MAX`].
#[allow(clippy::result_large_err)]
pub fn check_key(key: &[u8]) -> Result<(), Status> {
    if key.len() > KEY_SIZE_BYTES_MAX {
        return Err(limit_exceeded(
            "KEY_SIZE_BYTES_MAX",
            KEY_SIZE_BYTES_MAX as u64,
            key.len() as u64,
        ));
    }
    if key.starts_with(RESERVED_KEY_PREFIX) {
        return Err(Status::invalid_argument(
            "the key starts with the reserved prefix \\xff\\xffraftcask/",
        ));
    }
    Ok(())
}

/// Checks a value against [`VALUE_SIZE_BYTES_MAX`].
#[allow(clippy::result_large_err)]
pub fn check_value(value: &[u8]) -> Result<(), Status> {
    if value.len() > VALUE_SIZE_BYTES_MAX {
        return Err(limit_exceeded(
            "VALUE_SIZE_BYTES_MAX",
            VALUE_SIZE_BYTES_MAX as u64,
            value.len() as u64,
        ));
    }
    Ok(())
}

/// TTL left in ms of cluster time, rounded up; 0 = no TTL.
pub fn ttl_left(expiry_ms: u64, now_ms: u64) -> u64 {
    if expiry_ms == 0 {
        0
    } else {
        expiry_ms.saturating_sub(now_ms).max(1)
    }
}

/// Reads the [`ErrorDetail`] of a status, if it carries one.
pub fn detail_of(status: &Status) -> Option<ErrorDetail> {
    let value = status.metadata().get_bin(ERROR_DETAIL_KEY)?;
    let bytes = value.to_bytes().ok()?;
    ErrorDetail::decode(bytes).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn not_leader_detail_round_trips() {
        let status = not_leader(Some(2), Some("127.0.0.1:7002".into()));
        assert_eq!(status.code(), Code::FailedPrecondition);
        let detail = detail_of(&status).unwrap();
        assert_eq!(
            detail.detail,
            Some(error_detail::Detail::NotLeader(NotLeader {
                leader_id: 2,
                leader_client_addr: "127.0.0.1:7002".into()
            }))
        );
    }

    #[test]
    fn limits_name_themselves() {
        let status = check_key(&vec![0; KEY_SIZE_BYTES_MAX + 1]).unwrap_err();
        assert!(status.message().contains("KEY_SIZE_BYTES_MAX"));
        let status = check_value(&vec![0; VALUE_SIZE_BYTES_MAX + 1]).unwrap_err();
        assert!(status.message().contains("VALUE_SIZE_BYTES_MAX"));
        assert!(check_key(b"\xff\xffraftcask/x").is_err());
        assert!(check_key(b"ok").is_ok());
        assert_eq!(ttl_left(0, 5), 0);
        assert_eq!(ttl_left(10, 10), 1);
        assert_eq!(ttl_left(100, 10), 90);
    }
}
