//! One operation's attempts: the two RPCs (raftcask's kvproto calls, or
//! etcd's), the retry rules (follow a NotLeader hint, move the leader guess
//! on and back off after a failure another member may not have), and the
//! short name an error is counted under.

use std::time::Duration;

use kvproto::ERROR_DETAIL_KEY;
#[cfg(feature = "etcd")]
use kvproto::kv::v1::Consistency;
use kvproto::kv::v1::kv_client::KvClient;
use kvproto::kv::v1::{ErrorDetail, GetRequest, PutRequest, error_detail, put_response};
use prost::Message as _;
use prost::bytes::Bytes;

use crate::client::Tally;
use crate::config::{ReadTarget, System};
#[cfg(feature = "etcd")]
use crate::etcd;
use crate::shared::Shared;

/// Attempts of one write (or leader read) before it counts as failed
/// (redirects and retries after errors together). With the pauses below,
/// the retries of one operation span about 20 s: well past an election
/// after the leader stops or restarts. openraft 0.9 has no leader transfer,
/// and a restarted leader comes back as a follower that must win a new term
/// (its committed index is not durable), so for up to two election
/// timeouts (3 s each) the others may still name it while it names no one:
/// redirects go round in a circle, which is why a repeated redirect pauses
/// too ([`REDIRECT_PAUSE`]).
pub const ATTEMPTS_MAX: u32 = 40;
/// Pause before following a redirect that is not the operation's first:
/// members that point at each other during an election must not use up
/// the attempts in a few milliseconds.
pub const REDIRECT_PAUSE: Duration = Duration::from_millis(50);
/// First pause before retrying after an error other than a redirect;
/// doubled on each retry up to [`RETRY_PAUSE_MAX`].
pub const RETRY_PAUSE: Duration = Duration::from_millis(50);
/// Longest pause between two retries of one operation.
pub const RETRY_PAUSE_MAX: Duration = Duration::from_secs(1);

/// The error detail a status carries (raftcask's; etcd sends none).
fn detail(status: &tonic::Status) -> Option<error_detail::Detail> {
    let value = status.metadata().get_bin(ERROR_DETAIL_KEY)?;
    let bytes = value.to_bytes().ok()?;
    ErrorDetail::decode(bytes).ok()?.detail
}

/// A short name for an error: the gRPC code and the detail's kind.
pub(crate) fn error_kind(status: &tonic::Status) -> String {
    let code = format!("{:?}", status.code());
    match detail(status) {
        Some(error_detail::Detail::NotLeader(_)) => format!("{code}/NotLeader"),
        Some(error_detail::Detail::LimitExceeded(l)) => format!("{code}/LimitExceeded {}", l.limit),
        Some(error_detail::Detail::IndexNotReached(_)) => format!("{code}/IndexNotReached"),
        Some(error_detail::Detail::OutcomeUnknown(_)) => format!("{code}/OutcomeUnknown"),
        Some(error_detail::Detail::SessionExpired(_)) => format!("{code}/SessionExpired"),
        None => code,
    }
}

/// After a failed attempt at `addr`: follows a NotLeader detail, or moves
/// the leader guess on after a failure another member may not have (no
/// leader known, unreachable, unavailable) and pauses; `false` when a retry
/// would not help (outcome unknown, limits, ...: counted, not retried).
async fn retry_elsewhere(
    shared: &Shared,
    addr: &str,
    status: &tonic::Status,
    tally: &mut Tally,
    attempt: u32,
) -> bool {
    match detail(status) {
        Some(error_detail::Detail::NotLeader(not_leader))
            if !not_leader.leader_client_addr.is_empty() =>
        {
            tally.redirects += 1;
            shared.follow_hint(addr, not_leader.leader_client_addr);
            if attempt > 0 {
                tokio::time::sleep(REDIRECT_PAUSE).await;
            }
            true
        }
        Some(error_detail::Detail::NotLeader(_)) | None
            if matches!(
                status.code(),
                tonic::Code::FailedPrecondition
                    | tonic::Code::Unavailable
                    | tonic::Code::Unknown
                    | tonic::Code::Internal
                    | tonic::Code::Cancelled
            ) =>
        {
            // Unknown / Internal / Cancelled: the connection went away
            // mid-call (a member restarting); the benchmark's writes are
            // plain overwrites, so retrying one is harmless.
            shared.next_leader(addr);
            let pause = RETRY_PAUSE
                .saturating_mul(1 << attempt.min(16))
                .min(RETRY_PAUSE_MAX);
            tokio::time::sleep(pause).await;
            true
        }
        _ => false,
    }
}

/// One put at `addr`: the version (raftcask) or nothing (etcd).
async fn put_at(
    shared: &Shared,
    addr: &str,
    client: usize,
    key: &Bytes,
    value: &Bytes,
) -> Result<Option<u64>, tonic::Status> {
    match shared.system {
        System::Raftcask => {
            let channel = shared.pool.channel(addr, client)?;
            let request = PutRequest {
                key: key.clone(),
                value: value.clone(),
                ..Default::default()
            };
            let response = KvClient::new(channel).put(request).await?.into_inner();
            match response.outcome {
                Some(put_response::Outcome::Seq(seq)) => Ok(Some(seq)),
                other => Err(tonic::Status::internal(format!(
                    "unconditional put answered {other:?}"
                ))),
            }
        }
        #[cfg(feature = "etcd")]
        System::Etcd => {
            let kv = shared.etcd.kv(addr, client)?;
            etcd::put(kv, key, value).await.map(|()| None)
        }
    }
}

/// One get at `addr` with the run's consistency.
async fn get_at(
    shared: &Shared,
    addr: &str,
    client: usize,
    key: &Bytes,
) -> Result<(), tonic::Status> {
    let consistency = shared.config.consistency;
    match shared.system {
        System::Raftcask => {
            let channel = shared.pool.channel(addr, client)?;
            let request = GetRequest {
                key: key.clone(),
                consistency: consistency as i32,
                min_index: 0,
            };
            KvClient::new(channel).get(request).await.map(|_| ())
        }
        #[cfg(feature = "etcd")]
        System::Etcd => {
            let kv = shared.etcd.kv(addr, client)?;
            etcd::get(kv, key, consistency == Consistency::Stale).await
        }
    }
}

/// One put, to the leader guess, with the retry rules.
pub(crate) async fn put_once(
    shared: &Shared,
    client: usize,
    key: Bytes,
    value: Bytes,
    tally: &mut Tally,
) -> Result<Option<u64>, tonic::Status> {
    let mut last = None;
    for attempt in 0..ATTEMPTS_MAX {
        let addr = shared.leader();
        match put_at(shared, &addr, client, &key, &value).await {
            Ok(version) => return Ok(version),
            Err(status) => {
                if !retry_elsewhere(shared, &addr, &status, tally, attempt).await {
                    return Err(status);
                }
                last = Some(status);
            }
        }
    }
    Err(last.unwrap_or_else(|| tonic::Status::unavailable("no attempt made")))
}

/// One get with the run's consistency and read target (retried like a
/// put when it goes to the leader).
pub(crate) async fn get_once(
    shared: &Shared,
    client: usize,
    key: Bytes,
    tally: &mut Tally,
) -> Result<(), tonic::Status> {
    let config = &shared.config;
    if config.read_target == ReadTarget::Spread {
        let addr = &config.endpoints[client % config.endpoints.len()];
        return get_at(shared, addr, client, &key).await;
    }
    // To the leader: a failure (no leader known, unreachable, ...) moves
    // the shared guess on, like a write.
    let mut last = None;
    for attempt in 0..ATTEMPTS_MAX {
        let addr = shared.leader();
        match get_at(shared, &addr, client, &key).await {
            Ok(()) => return Ok(()),
            Err(status) => {
                if !retry_elsewhere(shared, &addr, &status, tally, attempt).await {
                    return Err(status);
                }
                last = Some(status);
            }
        }
    }
    Err(last.unwrap_or_else(|| tonic::Status::unavailable("no attempt made")))
}
