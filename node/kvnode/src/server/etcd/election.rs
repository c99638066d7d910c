//! etcd's `Election` service (`v3electionpb`): Campaign, Proclaim, Leader,
//! Observe and Resign, with the meaning etcd 3.4's server gives them (its
//! `v3election` over `concurrency.Election`), built on this port's KV and
//! Watch ([`super::recipe`]). The candidates of election `name` are the
//! keys under `name/`; the one created first leads.
//!
//! - `Campaign(name, lease, value)`: puts `name/<lease hex>` = value on the
//!   lease if it does not exist (else reads it, and if its value differs,
//!   proclaims the new one), then waits like `Lock` until every candidate
//!   created before it is deleted; answers the first transaction's header
//!   and `LeaderKey{name, key, rev = its create revision, lease}`. A client
//!   that goes away while it waits resigns; a candidate whose key goes
//!   while it waits is answered `election: not leader`.
//! - `Proclaim(leader, value)`: puts the value on the leader's key only if
//!   its create revision is still `leader.rev`, else `election: not
//!   leader`.
//! - `Leader(name)`: the candidate created first, else `election: no
//!   leader`.
//! - `Observe(name)`: a stream of the leader's key-value, sent when a
//!   leader is found and each time its value changes; when the leader's
//!   key goes, the next leader (or, with none, the first candidate put).
//! - `Resign(leader)`: deletes the leader's key if its create revision is
//!   still `leader.rev` (no error if not).
//!
//! A lease 0 (Campaign, Proclaim) is given a new lease of
//! `RECIPE_SESSION_TTL_SECONDS`, as etcd's session does; Resign, which
//! would only leak one in etcd, grants none.

use std::pin::Pin;

use kvproto::etcd::etcdserverpb::{ResponseHeader, TxnRequest};
use kvproto::etcd::mvccpb;
use kvproto::etcd::v3electionpb::election_server::Election;
use kvproto::etcd::v3electionpb::{
    CampaignRequest, CampaignResponse, LeaderKey, LeaderRequest, LeaderResponse, ProclaimRequest,
    ProclaimResponse, ResignRequest, ResignResponse,
};
use kvproto::kv::v1 as native;
use prost::bytes::Bytes;
use tokio::sync::mpsc;
use tokio_stream::Stream;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use super::EtcdFrontEnd;
use super::errors::etcd_error;
use super::kv::key_value;
use super::recipe::{
    ELECTION_NO_LEADER, ELECTION_NOT_LEADER, MISSING_LEADER_KEY, OBSERVE_RESPONSES_BUFFERED,
    RecipeWatch, Waited, Withdraw, cancelled, created_at, delete_op, first_created, get_op,
    own_key, prefix_end, prefix_of, put_op, range_kvs, watch_of,
};

/// The response stream of `Election.Observe`.
pub type ObserveStream = Pin<Box<dyn Stream<Item = Result<LeaderResponse, Status>> + Send>>;

/// The watch id of Observe's watches (one at a time per stream).
const OBSERVE_WATCH: i64 = 1;

/// The transaction that resigns `key` if it was created at `revision`.
fn resign_txn(key: &Bytes, revision: i64) -> TxnRequest {
    TxnRequest {
        compare: vec![created_at(key, revision)],
        success: vec![delete_op(key)],
        failure: Vec::new(),
    }
}

/// The transaction that proclaims `value` on `key` if it was created at
/// `revision`.
fn proclaim_txn(key: &Bytes, revision: i64, value: Bytes, lease: i64) -> TxnRequest {
    TxnRequest {
        compare: vec![created_at(key, revision)],
        success: vec![put_op(key, value, lease)],
        failure: Vec::new(),
    }
}

fn not_leader(key: &[u8], revision: i64) -> Status {
    etcd_error(
        ELECTION_NOT_LEADER,
        &format!(
            "the key {} is gone or was created again (not at revision {revision})",
            String::from_utf8_lossy(key)
        ),
    )
}

#[allow(clippy::result_large_err)]
fn leader_given(leader: Option<LeaderKey>, call: &str) -> Result<LeaderKey, Status> {
    leader.ok_or_else(|| {
        etcd_error(
            MISSING_LEADER_KEY,
            &format!("{call}: field `leader` is not set (send Campaign's LeaderKey)"),
        )
    })
}

#[tonic::async_trait]
impl Election for EtcdFrontEnd {
    async fn campaign(
        &self,
        request: Request<CampaignRequest>,
    ) -> Result<Response<CampaignResponse>, Status> {
        let _waiter = self.recipes.wait_place("Election.Campaign", &request)?;
        let request = request.into_inner();
        let lease = self.session_lease(request.lease).await?;
        let prefix = prefix_of(&request.name);
        let key = own_key(&prefix, lease);
        let txn = TxnRequest {
            compare: vec![created_at(&key, 0)],
            success: vec![put_op(&key, request.value.clone(), lease)],
            failure: vec![get_op(&key)],
        };
        let answer = self.recipe_txn(txn).await?;
        let header = answer.header.unwrap_or_default();
        let mut own_revision = header.revision;
        if !answer.succeeded {
            let mine = range_kvs(answer.responses.first().and_then(|r| r.response.as_ref()));
            let Some(kv) = mine.first() else {
                return Err(Status::internal(
                    "Campaign: the key's create revision was not 0, yet reading it found nothing",
                ));
            };
            own_revision = kv.create_revision;
            if kv.value != request.value {
                let proclaim = proclaim_txn(&key, own_revision, request.value.clone(), lease);
                let proclaimed = self.recipe_txn(proclaim).await;
                if !proclaimed.as_ref().is_ok_and(|answer| answer.succeeded) {
                    // etcd resigns, and answers the proclaim's error.
                    let _ = self.recipe_txn(resign_txn(&key, own_revision)).await;
                    proclaimed?;
                    return Err(not_leader(&key, own_revision));
                }
            }
        }
        // A client that goes away while waiting resigns.
        let withdraw = Withdraw::new(self, resign_txn(&key, own_revision));
        let waited = self.wait_deletes(&prefix, &key, own_revision).await;
        // Any other end of the wait leaves the key, as etcd's does.
        withdraw.disarm();
        match waited? {
            Waited::First(_) => Ok(Response::new(CampaignResponse {
                header: Some(header),
                leader: Some(LeaderKey {
                    name: request.name,
                    key,
                    rev: own_revision,
                    lease,
                }),
            })),
            Waited::OwnKeyGone => Err(not_leader(&key, own_revision)),
        }
    }

    async fn proclaim(
        &self,
        request: Request<ProclaimRequest>,
    ) -> Result<Response<ProclaimResponse>, Status> {
        let request = request.into_inner();
        let leader = leader_given(request.leader, "Proclaim")?;
        let lease = self.session_lease(leader.lease).await?;
        let txn = proclaim_txn(&leader.key, leader.rev, request.value, lease);
        let answer = self.recipe_txn(txn).await?;
        if !answer.succeeded {
            return Err(not_leader(&leader.key, leader.rev));
        }
        Ok(Response::new(ProclaimResponse {
            header: answer.header,
        }))
    }

    async fn leader(
        &self,
        request: Request<LeaderRequest>,
    ) -> Result<Response<LeaderResponse>, Status> {
        let prefix = prefix_of(&request.into_inner().name);
        let answer = self.recipe_range(first_created(&prefix)).await?;
        let Some(kv) = answer.kvs.into_iter().next() else {
            return Err(etcd_error(
                ELECTION_NO_LEADER,
                &format!(
                    "no key under {} (no candidate)",
                    String::from_utf8_lossy(&prefix)
                ),
            ));
        };
        Ok(Response::new(LeaderResponse {
            header: answer.header,
            kv: Some(kv),
        }))
    }

    type ObserveStream = ObserveStream;

    async fn observe(
        &self,
        request: Request<LeaderRequest>,
    ) -> Result<Response<ObserveStream>, Status> {
        let prefix = prefix_of(&request.into_inner().name);
        let permit = self.recipes.observer()?;
        let (out, answers) = mpsc::channel(OBSERVE_RESPONSES_BUFFERED);
        let front = self.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let stopped = front.kv.stopped();
            let ended = tokio::select! {
                ended = front.observe_leaders(&prefix, &out) => ended,
                () = out.closed() => return,
                () = stopped => Err(etcd_error(
                    super::errors::STOPPED,
                    "the member stops: observe on another member",
                )),
            };
            if let Err(status) = ended {
                let _ = out.send(Err(status)).await;
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(answers))))
    }

    async fn resign(
        &self,
        request: Request<ResignRequest>,
    ) -> Result<Response<ResignResponse>, Status> {
        let leader = leader_given(request.into_inner().leader, "Resign")?;
        let answer = self.recipe_txn(resign_txn(&leader.key, leader.rev)).await?;
        Ok(Response::new(ResignResponse {
            header: answer.header,
        }))
    }
}

type Out = mpsc::Sender<Result<LeaderResponse, Status>>;

impl EtcdFrontEnd {
    /// Sends the leader of the election under `prefix` each time it or its
    /// value changes, until the client goes (`Ok`) or a read or watch
    /// fails (the error, which ends the stream).
    async fn observe_leaders(&self, prefix: &Bytes, out: &Out) -> Result<(), Status> {
        loop {
            let first = self.recipe_range(first_created(prefix)).await?;
            let header = first.header.unwrap_or_default();
            let found = match first.kvs.into_iter().next() {
                Some(kv) => Some((header, kv)),
                None => self.first_put(prefix, header.revision).await?,
            };
            // None: the watch was compacted past its start; read again.
            let Some((header, kv)) = found else {
                continue;
            };
            let from = super::non_negative(header.revision) + 1;
            let key = kv.key.clone();
            if out.send(Ok(leader_response(header, kv))).await.is_err() {
                return Ok(());
            }
            // The leader's puts until its key goes.
            let mut watch = RecipeWatch::open(
                self,
                vec![watch_of(OBSERVE_WATCH, &key, Bytes::new(), from)],
            );
            'leader: loop {
                let answer = watch.next().await?;
                if answer.canceled {
                    cancelled(&answer)?;
                    break 'leader;
                }
                let header = EtcdFrontEnd::header_of(answer.header).unwrap_or_default();
                for event in answer.events {
                    if event.r#type == native::EventType::Delete as i32 {
                        break 'leader;
                    }
                    let Some(kv) = event.kv else { continue };
                    let message = leader_response(header, key_value(kv));
                    if out.send(Ok(message)).await.is_err() {
                        return Ok(());
                    }
                }
            }
        }
    }

    /// With no candidate at `revision`: the first one put after it, with
    /// a header at its revision (as etcd's Observe sends it); `None` if the
    /// watch was compacted past `revision`.
    async fn first_put(
        &self,
        prefix: &Bytes,
        revision: i64,
    ) -> Result<Option<(ResponseHeader, mvccpb::KeyValue)>, Status> {
        let from = super::non_negative(revision).max(1);
        let mut watch = RecipeWatch::open(
            self,
            vec![watch_of(OBSERVE_WATCH, prefix, prefix_end(prefix), from)],
        );
        loop {
            let answer = watch.next().await?;
            if answer.canceled {
                cancelled(&answer)?;
                return Ok(None);
            }
            let put = native::EventType::Put as i32;
            if let Some(kv) = answer
                .events
                .into_iter()
                .find(|event| event.r#type == put)
                .and_then(|event| event.kv)
            {
                let kv = key_value(kv);
                let header = ResponseHeader {
                    revision: kv.mod_revision,
                    ..EtcdFrontEnd::header_of(answer.header).unwrap_or_default()
                };
                return Ok(Some((header, kv)));
            }
        }
    }
}

fn leader_response(header: ResponseHeader, kv: mvccpb::KeyValue) -> LeaderResponse {
    LeaderResponse {
        header: Some(header),
        kv: Some(kv),
    }
}
