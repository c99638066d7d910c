//! etcd's `Lock` service (`v3lockpb`): Lock and Unlock, with the meaning
//! etcd 3.4's server gives them (its `v3lock` over `concurrency.Mutex`),
//! built on this port's KV and Watch ([`super::recipe`]).
//!
//! `Lock(name, lease)`: one transaction puts the session's key
//! `name/<lease hex>` (value empty, attached to the lease) if it does not
//! exist, or reads it if it does (locking twice with one lease is one
//! hold), and reads the key under `name/` created first; if that is one's
//! own, the lock is held at once. Otherwise the call waits until every key
//! under `name/` created before one's own is deleted (watching the last
//! of them, never polling), then answers the header of the read that saw
//! so and the key. A lease 0 is given a new lease of
//! `RECIPE_SESSION_TTL_SECONDS`, as etcd's session does. A waiter whose
//! own key goes (its lease expired or was revoked) is answered
//! `mutex: session is expired`; a waiter whose client goes away, or whose
//! wait fails, has its key deleted (etcd's `Unlock` on a failed `Lock`).
//! `Unlock(key)` deletes the key.

use kvproto::etcd::etcdserverpb::kv_server::Kv;
use kvproto::etcd::etcdserverpb::{DeleteRangeRequest, TxnRequest};
use kvproto::etcd::v3lockpb::lock_server::Lock;
use kvproto::etcd::v3lockpb::{LockRequest, LockResponse, UnlockRequest, UnlockResponse};
use prost::bytes::Bytes;
use tonic::{Request, Response, Status};

use super::EtcdFrontEnd;
use super::errors::etcd_error;
use super::recipe::{
    SESSION_EXPIRED, Waited, Withdraw, created_at, delete_op, first_created_op, get_op, own_key,
    prefix_of, put_op, range_kvs, recipe_error,
};

#[tonic::async_trait]
impl Lock for EtcdFrontEnd {
    async fn lock(&self, request: Request<LockRequest>) -> Result<Response<LockResponse>, Status> {
        let _waiter = self.recipes.wait_place("Lock.Lock", &request)?;
        let request = request.into_inner();
        let lease = self.session_lease(request.lease).await?;
        let prefix = prefix_of(&request.name);
        let key = own_key(&prefix, lease);
        let txn = TxnRequest {
            compare: vec![created_at(&key, 0)],
            success: vec![put_op(&key, Bytes::new(), lease), first_created_op(&prefix)],
            failure: vec![get_op(&key), first_created_op(&prefix)],
        };
        let answer = self.recipe_txn(txn).await?;
        let header = answer.header.unwrap_or_default();
        let own_revision = if answer.succeeded {
            header.revision
        } else {
            let mine = range_kvs(answer.responses.first().and_then(|r| r.response.as_ref()));
            match mine.first() {
                Some(kv) => kv.create_revision,
                None => {
                    return Err(Status::internal(
                        "Lock: the key's create revision was not 0, yet reading it found nothing",
                    ));
                }
            }
        };
        let first = range_kvs(answer.responses.get(1).and_then(|r| r.response.as_ref()));
        if first
            .first()
            .is_none_or(|kv| kv.create_revision == own_revision)
        {
            return Ok(Response::new(LockResponse {
                header: Some(header),
                key,
            }));
        }
        // From here on, a call that ends unanswered takes its key back.
        let withdraw = Withdraw::new(
            self,
            TxnRequest {
                success: vec![delete_op(&key)],
                ..Default::default()
            },
        );
        match self.wait_deletes(&prefix, &key, own_revision).await? {
            Waited::First(header) => {
                withdraw.disarm();
                Ok(Response::new(LockResponse {
                    header: Some(header),
                    key,
                }))
            }
            Waited::OwnKeyGone => {
                // Nothing to take back (and a later hold of the same lease
                // must keep its key).
                withdraw.disarm();
                Err(etcd_error(
                    SESSION_EXPIRED,
                    &format!(
                        "Lock: the key {} went (its lease {lease} expired or was revoked, or \
                         it was deleted) while it waited",
                        String::from_utf8_lossy(&key)
                    ),
                ))
            }
        }
    }

    async fn unlock(
        &self,
        request: Request<UnlockRequest>,
    ) -> Result<Response<UnlockResponse>, Status> {
        let request = request.into_inner();
        let delete = DeleteRangeRequest {
            key: request.key,
            ..Default::default()
        };
        let answer = Kv::delete_range(self, Request::new(delete))
            .await
            .map_err(recipe_error)?
            .into_inner();
        Ok(Response::new(UnlockResponse {
            header: answer.header,
        }))
    }
}
