//! The client's one error enum, and the reading of a gRPC status (code plus
//! the `ErrorDetail` in the `raftcask-error-bin` metadata) into what the
//! retry loops do next.

use kvproto::kv::v1::{ErrorDetail, error_detail};
use prost::Message;
use tonic::{Code, Status};

// Binary metadata key carrying an encoded `ErrorDetail` (see kv.proto).
pub(crate) use kvproto::ERROR_DETAIL_KEY;

/// Result of every client call.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything a client call can fail with.
///
/// A missing key is not an error (`get` answers `Ok(None)`), and a write
/// whose fate is unknown is never reported as failed: it is
/// [`Error::OutcomeUnknown`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The builder was given an unusable setting; nothing was sent.
    #[error("invalid client configuration: {0}")]
    InvalidConfig(String),
    /// The server refused the request as malformed or over a limit; nothing
    /// was applied. `message` is the server's (it names the limit), `limit`
    /// the machine-readable detail when the server sent one.
    #[error("invalid argument: {message}")]
    InvalidArgument {
        /// The server's message.
        message: String,
        /// The exceeded limit, when the refusal was about one.
        limit: Option<LimitExceeded>,
    },
    /// A `mod_revision` condition did not hold; nothing was written.
    #[error(
        "revision mismatch: condition {condition_index} failed, the key's current mod_revision is {current_mod_revision}"
    )]
    VersionMismatch {
        /// Which condition failed (0 for put and delete; the index into the
        /// batch's conditions for a batch).
        condition_index: u32,
        /// The key's `mod_revision` when the condition was checked; 0 = absent.
        current_mod_revision: u64,
    },
    /// A batch's expire or persist named a missing key; nothing was applied.
    #[error("batch op {op_index} names a key that does not exist; nothing was applied")]
    KeyNotFound {
        /// The index of that op in the batch.
        op_index: u32,
    },
    /// The write was (or may have been) sent, and whether it applied is not
    /// known: it applied at most once. Read the key to find out.
    #[error("outcome unknown (the write may or may not have applied): {message}")]
    OutcomeUnknown {
        /// What happened last.
        message: String,
    },
    /// No member could serve the request within the retry budget. For a
    /// write, nothing was applied (otherwise it would be `OutcomeUnknown`).
    #[error("unavailable after {attempts} attempts: {message}")]
    Unavailable {
        /// Attempts made.
        attempts: u32,
        /// The last failure.
        message: String,
    },
    /// The server does not implement this call (an older server).
    #[error("not implemented by the server: {message}")]
    Unimplemented {
        /// The server's message.
        message: String,
    },
    /// The TLS handshake failed (a certificate was not trusted or was
    /// refused): nothing was sent, and retrying with the same settings will
    /// not help.
    #[error("TLS handshake failed: {message}")]
    Tls {
        /// What rustls reported.
        message: String,
    },
    /// Any other status from the server.
    #[error("the server answered {code:?}: {message}")]
    Rpc {
        /// The gRPC status code.
        code: Code,
        /// The server's message.
        message: String,
    },
    /// A watch's next revision is at or below the compact revision: the
    /// events it needs are gone. Re-read the keys, then watch again from
    /// `compact_revision + 1` or later.
    #[error(
        "mvcc: required revision has been compacted: the watch needed events the cluster no \
         longer holds; the compact revision is {compact_revision}"
    )]
    Compacted {
        /// The compact revision when the watch was cancelled.
        compact_revision: u64,
    },
    /// The lease a request named does not exist: it expired, was revoked,
    /// or never was (etcd's `ErrLeaseNotFound`). Nothing was applied. `id`
    /// is the lease named; 0 when a transaction naming several leases was
    /// refused (the cluster does not say which).
    #[error("etcdserver: requested lease not found (lease {id:016x})")]
    LeaseNotFound {
        /// The lease.
        id: u64,
    },
    /// A grant named a lease id that is in use. Nothing was applied.
    #[error("etcdserver: lease already exists (lease {id:016x})")]
    LeaseAlreadyExists {
        /// The lease id asked for.
        id: u64,
    },
    /// The server's answer broke the protocol (e.g. a missing outcome).
    #[error("malformed response: {0}")]
    Protocol(String),
}

/// A server limit a request exceeded (from the `LimitExceeded` detail).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LimitExceeded {
    /// The limit's name, e.g. `VALUE_SIZE_BYTES_MAX`.
    pub limit: String,
    /// The limit's value.
    pub limit_value: u64,
    /// The request's value that exceeded it.
    pub actual_value: u64,
}

/// What a retry loop does with a failed attempt.
#[derive(Debug)]
pub(crate) enum Verdict {
    /// Not the leader: nothing was applied; try the named leader address
    /// (`None`: no leader known, back off and try another member).
    NotLeader(Option<String>),
    /// The request may have been applied (outcome unknown, transport
    /// failure or timeout after sending); retry with the same session.
    MaybeApplied,
    /// Nothing was applied (or a read failed); try again elsewhere.
    Retry,
    /// The member refused the connection: nothing was sent; skip it for a
    /// while (and forget it as the leader).
    Unreachable,
    /// Stop and report this.
    Fatal(Error),
}

/// The `LimitExceeded` name of a member's in-flight cap (kvnode's
/// `limits::INFLIGHT_LIMIT`).
const INFLIGHT_LIMIT: &str = "CLIENT_INFLIGHT_MAX";

/// Decodes the `ErrorDetail` of a status, if it carries one.
pub(crate) fn detail_of(status: &Status) -> Option<error_detail::Detail> {
    let value = status.metadata().get_bin(ERROR_DETAIL_KEY)?;
    let bytes = value.to_bytes().ok()?;
    ErrorDetail::decode(bytes).ok()?.detail
}

/// Whether the status is SESSION_EXPIRED (ABORTED with a `SessionExpired`
/// detail): the cluster no longer holds the write's session.
pub(crate) fn is_session_expired(status: &Status) -> bool {
    status.code() == Code::Aborted
        && matches!(
            detail_of(status),
            Some(error_detail::Detail::SessionExpired(_))
        )
}

/// Whether the status is a refused connection: the request never left the
/// client, so it cannot have applied.
fn connect_refused(status: &Status) -> bool {
    let mut source = std::error::Error::source(status);
    let mut depth = 0;
    while let Some(err) = source {
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            return io.kind() == std::io::ErrorKind::ConnectionRefused;
        }
        depth += 1;
        if depth > ERROR_CHAIN_DEPTH_MAX {
            break;
        }
        source = err.source();
    }
    false
}

/// The rustls error in a status's chain of causes, if any: the handshake
/// failed on this side (an untrusted server certificate) or the server
/// refused ours (an alert).
fn tls_failure(status: &Status) -> Option<String> {
    let mut source = std::error::Error::source(status);
    let mut depth = 0;
    while let Some(err) = source {
        if let Some(tls) = err.downcast_ref::<rustls::Error>() {
            return Some(tls.to_string());
        }
        if let Some(tls) = (err.downcast_ref::<std::io::Error>())
            .and_then(|io| io.get_ref())
            .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        {
            return Some(tls.to_string());
        }
        depth += 1;
        if depth > ERROR_CHAIN_DEPTH_MAX {
            break;
        }
        source = err.source();
    }
    None
}

/// How deep [`connect_refused`] looks into a status's chain of causes.
const ERROR_CHAIN_DEPTH_MAX: usize = 16;

/// Reads a failed attempt's status.
pub(crate) fn classify(status: &Status) -> Verdict {
    if let Some(message) = tls_failure(status) {
        return Verdict::Fatal(Error::Tls { message });
    }
    match (status.code(), detail_of(status)) {
        (Code::FailedPrecondition, Some(error_detail::Detail::NotLeader(hint))) => {
            let addr = (hint.leader_id != 0 && !hint.leader_client_addr.is_empty())
                .then_some(hint.leader_client_addr);
            Verdict::NotLeader(addr)
        }
        (Code::Aborted, Some(error_detail::Detail::SessionExpired(_))) => {
            Verdict::Fatal(Error::OutcomeUnknown {
                message: format!(
                    "the server forgot the answer (session expired): {}",
                    status.message()
                ),
            })
        }
        (Code::InvalidArgument, detail) => {
            let limit = match detail {
                Some(error_detail::Detail::LimitExceeded(l)) => Some(LimitExceeded {
                    limit: l.limit,
                    limit_value: l.limit_value,
                    actual_value: l.actual_value,
                }),
                _ => None,
            };
            Verdict::Fatal(Error::InvalidArgument {
                message: status.message().to_string(),
                limit,
            })
        }
        (Code::Unimplemented, _) => Verdict::Fatal(Error::Unimplemented {
            message: status.message().to_string(),
        }),
        (Code::Unavailable, Some(error_detail::Detail::IndexNotReached(_))) => Verdict::Retry,
        // The member's in-flight cap refused the request before handling
        // it: nothing was applied, back off and retry. Other exhaustion
        // (the disk watermark) is reported: retrying soon will not help.
        (Code::ResourceExhausted, Some(error_detail::Detail::LimitExceeded(l)))
            if l.limit == INFLIGHT_LIMIT =>
        {
            Verdict::Retry
        }
        (Code::Unavailable, None) if connect_refused(status) => Verdict::Unreachable,
        // Transport failures and server-side "cannot serve now" alike: the
        // request may have reached a leader that proposed it. tonic reports
        // a connection torn down mid-call (a leader killed with the request
        // in flight) as INTERNAL "h2 protocol error", so INTERNAL counts too.
        (
            Code::Unavailable
            | Code::DeadlineExceeded
            | Code::Cancelled
            | Code::Unknown
            | Code::Internal,
            _,
        ) => Verdict::MaybeApplied,
        (code, _) => Verdict::Fatal(Error::Rpc {
            code,
            message: status.message().to_string(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvproto::kv::v1::{LimitExceeded as Limit, NotLeader, SessionExpired};

    fn with_detail(code: Code, detail: error_detail::Detail) -> Status {
        let mut status = Status::new(code, "x");
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

    #[test]
    fn statuses_classify() {
        let hint = with_detail(
            Code::FailedPrecondition,
            error_detail::Detail::NotLeader(NotLeader {
                leader_id: 2,
                leader_client_addr: "127.0.0.1:9".into(),
            }),
        );
        assert!(matches!(classify(&hint), Verdict::NotLeader(Some(a)) if a == "127.0.0.1:9"));
        let none = with_detail(
            Code::FailedPrecondition,
            error_detail::Detail::NotLeader(NotLeader::default()),
        );
        assert!(matches!(classify(&none), Verdict::NotLeader(None)));
        let expired = with_detail(
            Code::Aborted,
            error_detail::Detail::SessionExpired(SessionExpired::default()),
        );
        assert!(matches!(
            classify(&expired),
            Verdict::Fatal(Error::OutcomeUnknown { .. })
        ));
        assert!(matches!(
            classify(&Status::unavailable("gone")),
            Verdict::MaybeApplied
        ));
        // A connection torn down with the call in flight.
        assert!(matches!(
            classify(&Status::internal("h2 protocol error: http2 error")),
            Verdict::MaybeApplied
        ));
        assert!(matches!(
            classify(&Status::unimplemented("later")),
            Verdict::Fatal(Error::Unimplemented { .. })
        ));
        assert!(matches!(
            classify(&Status::invalid_argument("KEY_SIZE_BYTES_MAX")),
            Verdict::Fatal(Error::InvalidArgument { .. })
        ));
        let limit = |name: &str| {
            error_detail::Detail::LimitExceeded(Limit {
                limit: name.into(),
                limit_value: 1,
                actual_value: 2,
            })
        };
        let overloaded = with_detail(Code::ResourceExhausted, limit(INFLIGHT_LIMIT));
        assert!(matches!(classify(&overloaded), Verdict::Retry));
        let disk = with_detail(Code::ResourceExhausted, limit("DISK_FREE_MIN_BYTES"));
        assert!(matches!(
            classify(&disk),
            Verdict::Fatal(Error::Rpc {
                code: Code::ResourceExhausted,
                ..
            })
        ));
    }
}
