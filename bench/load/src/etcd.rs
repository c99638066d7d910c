//! The etcd v3 side of the load generator (feature `etcd`): one
//! `etcd-client` KV client on each tonic channel of the load generator's
//! pool (so connections are built exactly as for raftcask), the leader
//! found once through the maintenance `Status` call, and the two RPCs the
//! load loop issues. Errors come back as `tonic::Status` so the loop's retry
//! rules and error kinds apply unchanged.

use std::collections::BTreeMap;

use etcd_client::{Client, GetOptions, KvClient};
use prost::bytes::Bytes;

use crate::config::ConfigError;
use crate::pool::Pool;

/// One KV client per pooled channel, by endpoint address.
#[derive(Default)]
pub(crate) struct Clients {
    by_addr: BTreeMap<String, Vec<KvClient>>,
}

impl std::fmt::Debug for Clients {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map()
            .entries(self.by_addr.iter().map(|(addr, list)| (addr, list.len())))
            .finish()
    }
}

/// A `tonic::Status` for an etcd client error (its gRPC status when it has
/// one; UNAVAILABLE otherwise, so the loop retries elsewhere).
fn status(err: etcd_client::Error) -> tonic::Status {
    match err {
        etcd_client::Error::GRpcStatus(status) => status,
        other => tonic::Status::unavailable(format!("etcd client: {other}")),
    }
}

impl Clients {
    /// Builds a client on every channel the pool holds for `endpoints` and
    /// asks each endpoint for the leader: returns the clients and the
    /// endpoint that is the leader (None when no endpoint answered with one;
    /// the loop then starts at the first endpoint, which forwards writes).
    pub(crate) async fn connect(
        pool: &Pool,
        endpoints: &[String],
    ) -> Result<(Clients, Option<String>), ConfigError> {
        let mut by_addr = BTreeMap::new();
        let mut leader = None;
        for addr in endpoints {
            let mut list = Vec::with_capacity(pool.connections);
            for connection in 0..pool.connections {
                let channel = pool.channel(addr, connection).map_err(|err| ConfigError {
                    field: "endpoints",
                    value: addr.clone(),
                    rule: format!("an etcd client address: {}", err.message()),
                })?;
                let client = Client::from_channel(etcd_client::Channel::Tonic(channel), None)
                    .await
                    .map_err(|err| ConfigError {
                        field: "endpoints",
                        value: addr.clone(),
                        rule: format!("an etcd client address: {err}"),
                    })?;
                if connection == 0 && leader.is_none() {
                    // Best effort: a member that does not answer is simply
                    // not taken for the leader.
                    if let Ok(answer) = client.clone().status().await {
                        let member = answer.header().map(|h| h.member_id());
                        if member == Some(answer.leader()) {
                            leader = Some(addr.clone());
                        }
                    }
                }
                list.push(client.kv_client());
            }
            by_addr.insert(addr.clone(), list);
        }
        Ok((Clients { by_addr }, leader))
    }

    /// The KV client of `client` at `addr` (round-robin over the
    /// connections, like the raftcask side's channels).
    pub(crate) fn kv(&self, addr: &str, client: usize) -> Result<KvClient, tonic::Status> {
        let list = self
            .by_addr
            .get(addr)
            .filter(|list| !list.is_empty())
            .ok_or_else(|| {
                tonic::Status::unavailable(format!(
                    "etcd address {addr:?} is not among the endpoints"
                ))
            })?;
        Ok(list[client % list.len()].clone())
    }
}

/// One unconditional put.
pub(crate) async fn put(mut kv: KvClient, key: &Bytes, value: &Bytes) -> Result<(), tonic::Status> {
    kv.put(key.to_vec(), value.to_vec(), None)
        .await
        .map(|_| ())
        .map_err(status)
}

/// One get: linearizable (etcd's default, a read index round through the
/// leader) or serializable (the member's local state: raftcask's stale).
pub(crate) async fn get(
    mut kv: KvClient,
    key: &Bytes,
    serializable: bool,
) -> Result<(), tonic::Status> {
    let options = serializable.then(|| GetOptions::new().with_serializable());
    kv.get(key.to_vec(), options)
        .await
        .map(|_| ())
        .map_err(status)
}
