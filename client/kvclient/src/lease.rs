//! Leases, as etcd has them: a time to live that the keys attached to it
//! share. [`Client::lease_grant`] makes one, a put attaches keys to it
//! ([`Client::put_with_lease`], or [`PutOptions::lease`](crate::PutOptions::lease)),
//! [`Client::lease_revoke`] deletes it and its keys at one revision, and
//! when nothing renews it for its TTL the cluster expires it the same way.
//! [`Client::keep_alive`] returns a [`LeaseKeeper`](crate::LeaseKeeper)
//! that renews it in the background ([`crate::keeper`]);
//! [`Client::lease_keep_alive_once`] renews it once.
//!
//! Grant and revoke are writes: they go to the leader with the client's
//! session, so a retry applies at most once (a retried grant answers the
//! same id). Renewals are idempotent and carry no session. Time to live and
//! the listing are reads with a [`Consistency`], served by any member.
//!
//! A lease that does not exist is [`Error::LeaseNotFound`]; a grant of an
//! id in use is [`Error::LeaseAlreadyExists`].
//!
//! ```no_run
//! use std::time::Duration;
//! use kvclient::{Client, LeaseLoss};
//!
//! # async fn demo() -> kvclient::Result<()> {
//! let client = Client::connect(["127.0.0.1:7001"]).await?;
//! let lease = client.lease_grant(Duration::from_secs(10)).await?;
//! client.put_with_lease("service/a", "10.0.0.1:80", lease.id).await?;
//! let keeper = client.keep_alive(lease.id).await?;
//! // ... serve; the key lives while the keeper renews the lease ...
//! match keeper.lost().await {
//!     LeaseLoss::Gone => println!("expired or revoked"),
//!     other => println!("lost: {other}"),
//! }
//! # Ok(())
//! # }
//! ```

use std::time::{Duration, Instant};

use kvproto::kv::v1 as pb;
use kvproto::{LEASE_ID_MAX, LEASE_TTL_MS_MAX};
use prost::bytes::Bytes;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use crate::client::{Client, kv};
use crate::error::{Error, LimitExceeded, Result};
use crate::keeper::LeaseKeeper;
use crate::router::Target;
use crate::txn::{Compare, Range, Txn, TxnOp, TxnResult};
use crate::types::{Condition, Consistency, PutOptions, Written, ttl_ms};

/// A granted lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseGrant {
    /// Its id.
    pub id: u64,
    /// Its time to live (at least `kvproto::LEASE_TTL_MS_MIN`: the cluster
    /// raises a shorter one, as etcd does).
    pub ttl: Duration,
    /// The store revision when it was granted (a grant changes no key).
    pub revision: u64,
    /// The leader's applied index, covering the grant.
    pub applied_index: u64,
}

/// A revoked lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseRevoked {
    /// Keys deleted with it (all at `revision`).
    pub deleted: u64,
    /// The revision of those deletes (the store's, unchanged, when it had
    /// no key).
    pub revision: u64,
    /// The leader's applied index, covering the revoke.
    pub applied_index: u64,
}

/// An acknowledged renewal of a lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseRenewal {
    /// The lease.
    pub id: u64,
    /// Its time to live from the renewal on.
    pub ttl: Duration,
    /// When the request this answers was sent (no later than it left this
    /// process): the lease lives at least until `sent + ttl -
    /// LEASE_EARLY_BOUND_MS` (kv.proto, `LeaseGrantRequest`).
    pub sent: Instant,
    /// The store revision when the renewal applied.
    pub revision: u64,
}

/// A lease's time to live, as the answering member's applied state judges it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseTimeToLive {
    /// The lease.
    pub id: u64,
    /// The time to live it was granted.
    pub granted: Duration,
    /// What is left of it (cluster time).
    pub remaining: Duration,
    /// With `keys`: the keys attached to it, in key order.
    pub keys: Vec<Bytes>,
    /// The store revision the answer reflects.
    pub revision: u64,
    /// The applied index of the member that answered.
    pub applied_index: u64,
}

/// A lease error of a call naming lease `id`: the cluster's NOT_FOUND and
/// ALREADY_EXISTS (kv.proto uses them for leases only) as their own
/// variants.
pub(crate) fn lease_error(err: Error, id: u64) -> Error {
    match err {
        Error::Rpc {
            code: tonic::Code::NotFound,
            ..
        } => Error::LeaseNotFound { id },
        Error::Rpc {
            code: tonic::Code::AlreadyExists,
            ..
        } => Error::LeaseAlreadyExists { id },
        other => other,
    }
}

/// Refuses an id that cannot be a lease before anything is sent.
fn check_id(field: &str, id: u64) -> Result<()> {
    if id == 0 || id > LEASE_ID_MAX {
        return Err(Error::InvalidArgument {
            message: format!(
                "{field}: lease id {id:#x} is outside 1..={LEASE_ID_MAX:#x} (LEASE_ID_MAX: an etcd \
                 lease id is a positive int64)"
            ),
            limit: (id > LEASE_ID_MAX).then(|| LimitExceeded {
                limit: "LEASE_ID_MAX".into(),
                limit_value: LEASE_ID_MAX,
                actual_value: id,
            }),
        });
    }
    Ok(())
}

/// Refuses a TTL over the cluster's limit before anything is sent.
fn check_ttl(ttl: Duration) -> Result<u64> {
    let ms = ttl_ms(ttl);
    if ms > LEASE_TTL_MS_MAX {
        return Err(Error::InvalidArgument {
            message: format!(
                "ttl: {ms} ms is over LEASE_TTL_MS_MAX ({LEASE_TTL_MS_MAX} ms, etcd's MaxLeaseTTL)"
            ),
            limit: Some(LimitExceeded {
                limit: "LEASE_TTL_MS_MAX".into(),
                limit_value: LEASE_TTL_MS_MAX,
                actual_value: ms,
            }),
        });
    }
    Ok(ms)
}

impl Client {
    /// Grants a lease of time to live `ttl` (at least
    /// `kvproto::LEASE_TTL_MS_MIN`; the cluster raises a shorter one); the
    /// cluster picks its id.
    pub async fn lease_grant(&self, ttl: Duration) -> Result<LeaseGrant> {
        self.grant(0, ttl).await
    }

    /// Grants a lease with this id (1 ..= `kvproto::LEASE_ID_MAX`); an id
    /// in use is [`Error::LeaseAlreadyExists`].
    pub async fn lease_grant_with_id(&self, id: u64, ttl: Duration) -> Result<LeaseGrant> {
        check_id("id", id)?;
        self.grant(id, ttl).await
    }

    async fn grant(&self, id: u64, ttl: Duration) -> Result<LeaseGrant> {
        let ttl_ms = check_ttl(ttl)?;
        let response = self
            .write(|channel, session| {
                let request = pb::LeaseGrantRequest {
                    session: Some(session),
                    ttl_ms,
                    id,
                };
                async move { kv(channel).lease_grant(request).await }
            })
            .await
            .map_err(|err| lease_error(err, id))?;
        let applied_index = self.note_write(response.header.as_ref());
        if response.id == 0 || (id != 0 && response.id != id) {
            return Err(Error::Protocol(format!(
                "LeaseGrantResponse.id is {} for a grant of id {id}",
                response.id
            )));
        }
        Ok(LeaseGrant {
            id: response.id,
            ttl: Duration::from_millis(response.ttl_ms),
            revision: response.header.map_or(0, |h| h.revision),
            applied_index,
        })
    }

    /// Revokes lease `id`: deletes it and every key attached to it at one
    /// revision. A lease that does not exist is [`Error::LeaseNotFound`].
    pub async fn lease_revoke(&self, id: u64) -> Result<LeaseRevoked> {
        let response = self
            .write(|channel, session| {
                let request = pb::LeaseRevokeRequest {
                    session: Some(session),
                    id,
                };
                async move { kv(channel).lease_revoke(request).await }
            })
            .await
            .map_err(|err| lease_error(err, id))?;
        let applied_index = self.note_write(response.header.as_ref());
        Ok(LeaseRevoked {
            deleted: response.deleted,
            revision: response.header.map_or(0, |h| h.revision),
            applied_index,
        })
    }

    /// Renews lease `id` once, on the leader (a stream of one request); a
    /// lease that does not exist is [`Error::LeaseNotFound`]. A renewal is
    /// idempotent, so every failed attempt is simply tried again.
    pub async fn lease_keep_alive_once(&self, id: u64) -> Result<LeaseRenewal> {
        let (response, sent) = self
            .router()
            .run(Target::Leader, false, |channel| async move {
                let (requests, request_stream) = mpsc::channel(1);
                let sent = Instant::now();
                requests
                    .send(pb::LeaseKeepAliveRequest { id })
                    .await
                    .map_err(|_| tonic::Status::internal("the request stream closed"))?;
                let mut responses = kv(channel)
                    .lease_keep_alive(ReceiverStream::new(request_stream))
                    .await?
                    .into_inner();
                let answer = responses.message().await?;
                // The request side stays open until the answer came.
                drop(requests);
                match answer {
                    Some(answer) => Ok(tonic::Response::new((answer, sent))),
                    None => Err(tonic::Status::unavailable(
                        "the keep-alive stream ended before its answer",
                    )),
                }
            })
            .await?;
        renewal(id, &response, sent)
    }

    /// Keeps lease `id` alive in the background until the returned
    /// [`LeaseKeeper`] is dropped (dropping does not revoke it); the
    /// keeper reports the lease's loss ([`LeaseKeeper::lost`]). Renews it
    /// once first: a lease that does not exist is
    /// [`Error::LeaseNotFound`]. Every lease kept by this client (and its
    /// clones) is renewed over one stream to the leader.
    pub async fn keep_alive(&self, id: u64) -> Result<LeaseKeeper> {
        let first = self.lease_keep_alive_once(id).await?;
        Ok(self.lessor().keep(first))
    }

    /// Lease `id`'s granted and remaining time to live, with its keys if
    /// `keys`, read with the client's default consistency; `Ok(None)` if
    /// there is no such lease.
    pub async fn lease_time_to_live(&self, id: u64, keys: bool) -> Result<Option<LeaseTimeToLive>> {
        self.lease_time_to_live_with(id, keys, None).await
    }

    /// [`Client::lease_time_to_live`] with this consistency (`None`: the
    /// client's default).
    pub async fn lease_time_to_live_with(
        &self,
        id: u64,
        keys: bool,
        consistency: Option<Consistency>,
    ) -> Result<Option<LeaseTimeToLive>> {
        let (consistency, _) = self.consistency(consistency);
        let response = self
            .router()
            .run(Target::Any, false, |channel| async move {
                kv(channel)
                    .lease_time_to_live(pb::LeaseTimeToLiveRequest {
                        id,
                        keys,
                        consistency,
                    })
                    .await
            })
            .await?;
        if response.ttl_ms < 0 {
            return Ok(None);
        }
        let header = response.header.unwrap_or_default();
        Ok(Some(LeaseTimeToLive {
            id,
            granted: Duration::from_millis(response.granted_ttl_ms),
            remaining: Duration::from_millis(response.ttl_ms.unsigned_abs()),
            keys: response.keys,
            revision: header.revision,
            applied_index: header.applied_index,
        }))
    }

    /// Every lease's id, ascending, read with the client's default
    /// consistency.
    pub async fn lease_leases(&self) -> Result<Vec<u64>> {
        self.lease_leases_with(None).await
    }

    /// [`Client::lease_leases`] with this consistency (`None`: the
    /// client's default).
    pub async fn lease_leases_with(&self, consistency: Option<Consistency>) -> Result<Vec<u64>> {
        let (consistency, _) = self.consistency(consistency);
        let response = self
            .router()
            .run(Target::Any, false, |channel| async move {
                kv(channel)
                    .lease_leases(pb::LeaseLeasesRequest { consistency })
                    .await
            })
            .await?;
        Ok(response.leases.into_iter().map(|l| l.id).collect())
    }
}

impl Client {
    /// Writes `key` attached to lease `lease` (0 = none, a plain put): the
    /// key is deleted when the lease is revoked or expires. A lease that
    /// does not exist is [`Error::LeaseNotFound`]. Sent as a one-op
    /// transaction, so [`Written::seq`] is 0; see [`Client::put_with`] and
    /// [`PutOptions::lease`](crate::PutOptions::lease) for a TTL or a
    /// condition as well.
    pub async fn put_with_lease(
        &self,
        key: impl Into<Bytes>,
        value: impl Into<Bytes>,
        lease: u64,
    ) -> Result<Written> {
        self.put_with(key, value, PutOptions::default().lease(lease))
            .await
    }

    /// A put with a lease as a transaction: the condition as a compare of
    /// the key's mod revision (0 = absent), the put (`TxnPut.lease`), and
    /// on a failed compare a keys-only read of the key for its current mod
    /// revision.
    pub(crate) async fn put_leased(
        &self,
        key: Bytes,
        value: Bytes,
        ttl_ms: u64,
        condition: Option<Condition>,
        lease: u64,
    ) -> Result<Written> {
        let put = TxnOp::put_with(key.clone(), value, ttl_ms, lease, false);
        let mut txn = Txn::new().and_then([put]);
        if let Some(condition) = condition {
            let mod_revision = match condition {
                Condition::IfModRevision(revision) => revision,
                Condition::IfAbsent => 0,
            };
            txn = txn
                .when([Compare::mod_revision(key.clone()).eq(mod_revision)])
                .or_else([TxnOp::range(Range::key(key).keys_only())]);
        }
        let response = self.txn(&txn).await?;
        if response.succeeded {
            return Ok(Written {
                revision: response.revision,
                seq: 0,
                applied_index: response.applied_index,
            });
        }
        let current_mod_revision = match response.results.first() {
            Some(TxnResult::Range(read)) => {
                read.kvs.first().map_or(0, |kv| kv.revisions.mod_revision)
            }
            _ => {
                return Err(Error::Protocol(
                    "a failed conditional put answered no read of its key".into(),
                ));
            }
        };
        Err(Error::VersionMismatch {
            condition_index: 0,
            current_mod_revision,
        })
    }
}

/// A renewal's answer: `Ok` with its TTL, or [`Error::LeaseNotFound`] for
/// TTL 0 (the lease expired or was revoked).
pub(crate) fn renewal(
    id: u64,
    response: &pb::LeaseKeepAliveResponse,
    sent: Instant,
) -> Result<LeaseRenewal> {
    if response.id != id {
        return Err(Error::Protocol(format!(
            "LeaseKeepAliveResponse.id is {} for a renewal of {id}",
            response.id
        )));
    }
    if response.ttl_ms == 0 {
        return Err(Error::LeaseNotFound { id });
    }
    Ok(LeaseRenewal {
        id,
        ttl: Duration::from_millis(response.ttl_ms),
        sent,
        revision: response.header.as_ref().map_or(0, |h| h.revision),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn not_found_and_already_exists_become_lease_errors() {
        let not_found = Error::Rpc {
            code: tonic::Code::NotFound,
            message: "etcdserver: requested lease not found".into(),
        };
        assert!(matches!(
            lease_error(not_found, 7),
            Error::LeaseNotFound { id: 7 }
        ));
        let exists = Error::Rpc {
            code: tonic::Code::AlreadyExists,
            message: "etcdserver: lease already exists".into(),
        };
        assert!(matches!(
            lease_error(exists, 9),
            Error::LeaseAlreadyExists { id: 9 }
        ));
        // Anything else passes through.
        let other = lease_error(
            Error::Unimplemented {
                message: "x".into(),
            },
            7,
        );
        assert!(matches!(other, Error::Unimplemented { .. }));
        // etcd's words, for kvctl and logs.
        assert!(
            Error::LeaseNotFound { id: 0x2a }
                .to_string()
                .starts_with("etcdserver: requested lease not found")
        );
    }

    #[test]
    fn ids_and_ttls_are_checked_before_sending() {
        assert!(check_id("id", 0).is_err());
        assert!(check_id("id", 1).is_ok());
        assert!(check_id("id", LEASE_ID_MAX).is_ok());
        let err = check_id("id", LEASE_ID_MAX + 1).unwrap_err();
        assert!(
            matches!(&err, Error::InvalidArgument { limit: Some(l), .. } if l.limit == "LEASE_ID_MAX"),
            "{err:?}"
        );
        assert_eq!(check_ttl(Duration::from_secs(5)).unwrap(), 5_000);
        assert!(check_ttl(Duration::from_millis(LEASE_TTL_MS_MAX)).is_ok());
        assert!(check_ttl(Duration::from_millis(LEASE_TTL_MS_MAX + 1)).is_err());
    }

    #[test]
    fn a_renewal_answered_with_ttl_zero_is_lease_not_found() {
        let now = Instant::now();
        let answer = |id, ttl_ms| pb::LeaseKeepAliveResponse {
            header: Some(pb::Header {
                revision: 12,
                ..Default::default()
            }),
            id,
            ttl_ms,
        };
        let ok = renewal(5, &answer(5, 3_000), now).unwrap();
        assert_eq!(
            ok,
            LeaseRenewal {
                id: 5,
                ttl: Duration::from_secs(3),
                sent: now,
                revision: 12
            }
        );
        assert!(matches!(
            renewal(5, &answer(5, 0), now),
            Err(Error::LeaseNotFound { id: 5 })
        ));
        assert!(matches!(
            renewal(5, &answer(6, 3_000), now),
            Err(Error::Protocol(_))
        ));
    }
}
