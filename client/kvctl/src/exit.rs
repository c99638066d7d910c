//! Exit codes and the one failure type of kvctl: how each kvclient error,
//! bad input and local I/O problem becomes a message and an exit code
//! (the mapping is in `kvctl --help` and the crate docs).

use kvclient::Error;
use tonic::Code;

/// etcdctl's message for a lease that does not exist.
pub const LEASE_NOT_FOUND: &str = "etcdserver: requested lease not found";
/// etcdctl's message for a grant of an id in use.
pub const LEASE_ALREADY_EXISTS: &str = "etcdserver: lease already exists";

/// What a command ended with; the process exit code is its value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// 0: done.
    Ok = 0,
    /// 1: the key does not exist.
    NotFound = 1,
    /// 2: bad usage, a limit, a local file, or a call the server does not
    /// implement.
    Usage = 2,
    /// 3: no member answered (or the server failed the call).
    Unavailable = 3,
    /// 4: a condition did not hold.
    ConditionFailed = 4,
    /// 5: a write may or may not have applied.
    OutcomeUnknown = 5,
}

impl Exit {
    /// The process exit code.
    pub fn code(self) -> i32 {
        self as i32
    }

    /// A short stable name for JSON output.
    pub fn kind(self) -> &'static str {
        match self {
            Exit::Ok => "ok",
            Exit::NotFound => "not_found",
            Exit::Usage => "usage",
            Exit::Unavailable => "unavailable",
            Exit::ConditionFailed => "condition_failed",
            Exit::OutcomeUnknown => "outcome_unknown",
        }
    }
}

/// A command that did not succeed: the exit code and what to tell the user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// The exit code.
    pub exit: Exit,
    /// The message (one line, naming what was wrong).
    pub message: String,
    /// The command already printed its JSON object (e.g. `"found": false`),
    /// so no `{"error": ...}` object follows it: one object per command.
    pub json_printed: bool,
}

impl Failure {
    /// A failure with this exit code.
    pub fn new(exit: Exit, message: impl Into<String>) -> Failure {
        Failure {
            exit,
            message: message.into(),
            json_printed: false,
        }
    }

    /// Marks the command's JSON object as printed already.
    pub fn json_printed(mut self) -> Failure {
        self.json_printed = true;
        self
    }

    /// Bad usage (exit 2).
    pub fn usage(message: impl Into<String>) -> Failure {
        Failure::new(Exit::Usage, message)
    }

    /// A kvclient error of a call to `endpoints` (named when none answered).
    pub fn from_client(err: Error, endpoints: &[String]) -> Failure {
        let tried = || endpoints.join(", ");
        match err {
            Error::InvalidConfig(message) => Failure::usage(message),
            Error::InvalidArgument { message, limit } => {
                let message = match limit {
                    Some(l) => format!(
                        "refused by the cluster: {} is {}, over its limit {} ({message})",
                        l.limit, l.actual_value, l.limit_value
                    ),
                    None => format!("refused by the cluster: {message}"),
                };
                Failure::usage(message)
            }
            Error::VersionMismatch {
                current_mod_revision,
                ..
            } => Failure::new(
                Exit::ConditionFailed,
                format!(
                    "condition failed: the key's current mod_revision is {current_mod_revision}{}; nothing was written",
                    if current_mod_revision == 0 {
                        " (absent)"
                    } else {
                        ""
                    }
                ),
            ),
            Error::KeyNotFound { .. } => Failure::new(Exit::NotFound, "key not found"),
            // etcdctl's words exactly (scripts match them).
            Error::LeaseNotFound { .. } => Failure::new(Exit::NotFound, LEASE_NOT_FOUND),
            Error::LeaseAlreadyExists { .. } => {
                Failure::new(Exit::ConditionFailed, LEASE_ALREADY_EXISTS)
            }
            Error::OutcomeUnknown { message } => Failure::new(
                Exit::OutcomeUnknown,
                format!(
                    "outcome unknown: the write may or may not have applied (at most once); read the key to find out ({message})"
                ),
            ),
            Error::Unavailable { attempts, message } => Failure::new(
                Exit::Unavailable,
                format!(
                    "cluster unavailable: no member answered after {attempts} attempts (tried {}): {message}",
                    tried()
                ),
            ),
            Error::Unimplemented { message } => Failure::usage(format!(
                "the server does not implement this call yet (UNIMPLEMENTED): {message}"
            )),
            Error::Tls { message } => Failure::usage(format!(
                "TLS handshake with the cluster failed: {message} (check --cacert, --cert and \
                 --key; tried {})",
                tried()
            )),
            Error::Rpc {
                code: code @ (Code::Unauthenticated | Code::PermissionDenied),
                message,
            } => Failure::usage(format!(
                "the cluster refused the credentials ({code:?}): {message} (check --token, \
                 --cert and --key)"
            )),
            Error::Rpc { code, message } => {
                let exit = match code {
                    Code::FailedPrecondition | Code::AlreadyExists | Code::Aborted => {
                        Exit::ConditionFailed
                    }
                    Code::NotFound => Exit::NotFound,
                    Code::InvalidArgument | Code::OutOfRange => Exit::Usage,
                    Code::Unimplemented => Exit::Usage,
                    _ => Exit::Unavailable,
                };
                Failure::new(exit, format!("the cluster answered {code:?}: {message}"))
            }
            // As a read at a compacted revision (OUT_OF_RANGE): exit 2.
            err @ Error::Compacted { .. } => Failure::usage(err.to_string()),
            Error::Protocol(message) => Failure::new(
                Exit::Unavailable,
                format!("malformed answer from {}: {message}", tried()),
            ),
            other => Failure::new(Exit::Unavailable, other.to_string()),
        }
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_errors_map_to_the_documented_codes() {
        let endpoints = vec!["127.0.0.9:1".to_string(), "127.0.0.9:2".to_string()];
        let exit = |err| Failure::from_client(err, &endpoints).exit;
        assert_eq!(exit(Error::InvalidConfig("x".into())), Exit::Usage);
        assert_eq!(
            exit(Error::InvalidArgument {
                message: "x".into(),
                limit: None
            }),
            Exit::Usage
        );
        assert_eq!(
            exit(Error::VersionMismatch {
                condition_index: 0,
                current_mod_revision: 3
            }),
            Exit::ConditionFailed
        );
        assert_eq!(exit(Error::KeyNotFound { op_index: 0 }), Exit::NotFound);
        let lease = Failure::from_client(Error::LeaseNotFound { id: 0x2a }, &endpoints);
        assert_eq!(lease.exit, Exit::NotFound);
        assert_eq!(lease.message, "etcdserver: requested lease not found");
        assert_eq!(
            exit(Error::LeaseAlreadyExists { id: 0x2a }),
            Exit::ConditionFailed
        );
        assert_eq!(
            exit(Error::OutcomeUnknown {
                message: "x".into()
            }),
            Exit::OutcomeUnknown
        );
        assert_eq!(
            exit(Error::Unimplemented {
                message: "x".into()
            }),
            Exit::Usage
        );
        let unavailable = Failure::from_client(
            Error::Unavailable {
                attempts: 3,
                message: "refused".into(),
            },
            &endpoints,
        );
        assert_eq!(unavailable.exit, Exit::Unavailable);
        assert!(unavailable.message.contains("127.0.0.9:1, 127.0.0.9:2"));
        assert_eq!(Exit::OutcomeUnknown.code(), 5);
        assert_eq!(Exit::NotFound.code(), 1);
    }
}
