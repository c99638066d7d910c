//! openraft's network over tonic: one lazily connected, cached [`Channel`]
//! per peer (dialled at `NodeInfo::peer_addr`), openraft's AppendEntries and
//! Vote as codec payloads inside the raft.proto messages, and full snapshots
//! over `TransferSnapshot` (the sending side is [`crate::snapshot::send`]:
//! only the files and file tails the follower asks for, in crc32-checked
//! chunks, with bounded memory and per-chunk deadlines); openraft's cancel
//! signal drops the stream.
//!
//! Errors: a transport failure or an UNAVAILABLE status is openraft's
//! `Unreachable` (openraft backs off); a deadline is `Timeout`; a payload
//! that does not decode, or any other status, is a `NetworkError`.

// The error types are openraft's (its `RaftNetwork` trait fixes them); they
// are large, and boxing them is not ours to choose.
#![allow(clippy::result_large_err)]

use std::collections::HashMap;
use std::future::Future;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kvproto::raft::v1::raft_client::RaftClient;
use kvproto::raft::v1::{
    AppendEntriesRequest as PbAppendEntries, ForwardRequest, IdentifyRequest, IdentifyResponse,
    Identity as PbIdentity, ReadIndexRequest, TransferLeaderRequest as PbTransferLeader,
    VoteRequest as PbVote,
};
use openraft::OptionalSend;
use openraft::errors::{
    NetworkError, RPCError, RaftError, ReplicationClosed, StreamingError, Timeout, Unreachable,
};
use openraft::network::{RPCOption, RPCTypes, RaftNetworkFactory, RaftNetworkV2};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, TransferLeaderRequest,
    TransferLeaderResponse, VoteRequest, VoteResponse,
};
use tonic::transport::{Channel, ClientTlsConfig, Endpoint};

use crate::codec;
use crate::hooks::Faults;
use crate::node::identity::Identity;
use crate::raft::read_index::ReadIndexError;
use crate::raft::types::{NodeEntry, NodeInfo, NodeSnapshot, NodeVote, TypeConfig};
use crate::server::metrics::Metrics;
use crate::server::security::{SecurityError, TlsMaterial};
use crate::snapshot::SnapshotHandle;

/// Largest gRPC message a peer sends or accepts, in bytes: above one Raft
/// entry (4 MiB) times the entries openraft packs into one AppendEntries.
pub const PEER_MESSAGE_BYTES_MAX: usize = 64 * 1024 * 1024;
/// Largest encoded AppendEntries payload sent in one message: a larger
/// request carries only the entries that fit, and its success is reported
/// to openraft as a partial success up to the last entry sent (openraft then
/// sends the rest). One entry is at most 4 MiB, so a single entry always
/// fits.
pub const APPEND_PAYLOAD_BYTES_MAX: usize = PEER_MESSAGE_BYTES_MAX - 1024 * 1024;

/// Room kept in an AppendEntries payload for what is not an entry (vote,
/// previous log id, commit index, length prefixes): far more than they take,
/// so a resend of [`entries_that_fit`] entries is never refused again.
const APPEND_NON_ENTRY_BYTES: usize = 64 * 1024;

/// How many leading entries fit in [`APPEND_PAYLOAD_BYTES_MAX`] with room
/// for the rest of the message (at least 1).
fn entries_that_fit(entries: &[NodeEntry]) -> u64 {
    let mut total = APPEND_NON_ENTRY_BYTES;
    let mut fit = 0u64;
    for entry in entries {
        total += codec::encode(entry).len();
        if total > APPEND_PAYLOAD_BYTES_MAX {
            break;
        }
        fit += 1;
    }
    fit.max(1)
}

/// How long a peer connection attempt may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

pub(crate) type RpcErr = RPCError<TypeConfig>;

/// openraft's network factory: hands out clients sharing cached channels.
#[derive(Clone, Debug)]
pub struct Network {
    id: u64,
    identity: Identity,
    /// Outgoing connections bind to this address (the node's own peer
    /// address, so per-address firewall rules see the real source).
    local_ip: Option<IpAddr>,
    faults: Faults,
    channels: Arc<Mutex<HashMap<u64, (String, Channel)>>>,
    metrics: Option<Metrics>,
    /// TLS of outgoing peer connections (`None` = plain TCP).
    tls: Option<ClientTlsConfig>,
}

impl Network {
    /// The network of the member with `identity`; outgoing connections
    /// bind to `local_ip` (unspecified = let the kernel choose).
    pub fn new(identity: Identity, local_ip: IpAddr, faults: Faults) -> Network {
        Network {
            id: identity.member_id(),
            identity,
            local_ip: (!local_ip.is_unspecified()).then_some(local_ip),
            faults,
            channels: Arc::default(),
            metrics: None,
            tls: None,
        }
    }

    /// Dials peers over TLS with `tls` (the cluster CA verifies them, this
    /// member's certificate identifies it); `None` = plain TCP.
    pub fn with_tls(mut self, tls: Option<TlsMaterial>) -> Result<Network, SecurityError> {
        self.tls = tls.map(|tls| tls.peer_channel_tls());
        // Catch a configuration tonic refuses at start, not at first dial.
        if let Some(tls) = &self.tls {
            Endpoint::from_static("https://peer.invalid:1")
                .tls_config(tls.clone())
                .map_err(|err| SecurityError::Tls(format!("peer channel TLS: {err}")))?;
        }
        Ok(self)
    }

    /// Counts snapshot bytes sent into `metrics`.
    pub fn with_metrics(mut self, metrics: Metrics) -> Network {
        self.metrics = Some(metrics);
        self
    }

    /// The one place outgoing peer connections are configured (https and
    /// this member's certificate when TLS is on).
    fn channel(&self, target: u64, addr: &str) -> Result<Channel, String> {
        let mut channels = self.channels.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((cached, channel)) = channels.get(&target)
            && cached == addr
        {
            return Ok(channel.clone());
        }
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        let mut endpoint = Endpoint::from_shared(format!("{scheme}://{addr}"))
            .map_err(|err| format!("bad peer address {addr:?}: {err}"))?
            .connect_timeout(CONNECT_TIMEOUT)
            .local_address(self.local_ip)
            .tcp_nodelay(true);
        if let Some(tls) = &self.tls {
            endpoint = endpoint
                .tls_config(tls.clone())
                .map_err(|err| format!("peer {addr:?} TLS: {err}"))?;
        }
        let channel = endpoint.connect_lazy();
        channels.insert(target, (addr.to_string(), channel.clone()));
        Ok(channel)
    }

    fn client(&self, target: u64, node: &NodeInfo) -> PeerClient {
        PeerClient {
            from: self.id,
            target,
            identity: self.identity.clone(),
            faults: self.faults.clone(),
            metrics: self.metrics.clone(),
            client: self.channel(target, &node.peer_addr).map(|channel| {
                RaftClient::new(channel)
                    .max_decoding_message_size(PEER_MESSAGE_BYTES_MAX)
                    .max_encoding_message_size(PEER_MESSAGE_BYTES_MAX)
            }),
        }
    }

    /// Asks the leader for a read index (one `ReadIndex` RPC within
    /// `timeout`); any failure to get one is reported, never guessed.
    pub async fn read_index(
        &self,
        leader: u64,
        node: &NodeInfo,
        timeout: Duration,
    ) -> Result<u64, ReadIndexError> {
        let peer = self.client(leader, node);
        let mut client = peer
            .client()
            .map_err(|err| ReadIndexError::Unavailable(err.to_string()))?;
        let mut request = tonic::Request::new(ReadIndexRequest {
            identity: Some(peer.identity()),
        });
        request.set_timeout(timeout);
        match tokio::time::timeout(timeout, client.read_index(request)).await {
            Err(_) => Err(ReadIndexError::Unavailable(format!(
                "the leader {leader} did not answer a read index request within {timeout:?}"
            ))),
            Ok(Err(status)) if status.code() == tonic::Code::FailedPrecondition => {
                Err(ReadIndexError::NotLeader {
                    me: leader,
                    leader: None,
                })
            }
            Ok(Err(status)) => Err(ReadIndexError::Unavailable(format!(
                "read index from the leader {leader}: {}",
                status.message()
            ))),
            Ok(Ok(response)) => Ok(response.into_inner().read_index),
        }
    }
}

impl Network {
    /// Sends a client write to the leader (one `Forward` RPC within
    /// `timeout`): its answer and the leader's applied index then, or the
    /// status the leader (or the transport) gave. A link cut by a test fault or a peer address that does not
    /// parse is UNAVAILABLE before anything was sent.
    pub async fn forward(
        &self,
        leader: u64,
        node: &NodeInfo,
        write: &kvstate::command::Write,
        timeout: Duration,
    ) -> Result<(kvstate::command::Answer, u64), tonic::Status> {
        let peer = self.client(leader, node);
        let mut client = peer
            .client()
            .map_err(|err| tonic::Status::unavailable(err.to_string()))?;
        let mut request = tonic::Request::new(ForwardRequest {
            identity: Some(peer.identity()),
            write: codec::encode(write).into(),
        });
        request.set_timeout(timeout);
        match tokio::time::timeout(timeout, client.forward(request)).await {
            Err(_) => Err(tonic::Status::deadline_exceeded(format!(
                "the leader {leader} did not answer a forwarded write within {timeout:?}"
            ))),
            Ok(Err(status)) => Err(status),
            Ok(Ok(response)) => {
                let response = response.into_inner();
                let answer = codec::decode(&response.answer).map_err(|err| {
                    tonic::Status::internal(format!(
                        "the leader {leader}'s answer to a forwarded write does not decode: {err}"
                    ))
                })?;
                Ok((answer, response.applied_index))
            }
        }
    }

    /// Asks a peer who it is (`Identify`): its (cluster id, member id,
    /// incarnation), or why it did not answer within `timeout`.
    pub async fn identify(
        &self,
        target: u64,
        node: &NodeInfo,
        timeout: Duration,
    ) -> Result<(u64, u64, u64), String> {
        let who = self.ask_identify(target, node, timeout).await?;
        Ok((who.cluster_id, who.member_id, who.incarnation))
    }

    /// Asks a peer where its etcd port is (`Identify`'s `etcd_addr`):
    /// `None` when it answers with none (no etcd port, or a build before
    /// the field), with one no URL can carry ([`host_port`]), or is not
    /// `target` as this member knows it (another member id, another
    /// cluster, another incarnation than the one learned).
    pub async fn identify_etcd_addr(
        &self,
        target: u64,
        node: &NodeInfo,
        timeout: Duration,
    ) -> Result<Option<String>, String> {
        let who = self.ask_identify(target, node, timeout).await?;
        let ours = self.identity.cluster_id();
        let known = self.identity.peer_incarnation(target);
        let same = who.member_id == target
            && (ours == 0 || who.cluster_id == ours)
            && (known == 0 || who.incarnation == known);
        Ok((same && host_port(&who.etcd_addr)).then_some(who.etcd_addr))
    }

    async fn ask_identify(
        &self,
        target: u64,
        node: &NodeInfo,
        timeout: Duration,
    ) -> Result<IdentifyResponse, String> {
        let peer = self.client(target, node);
        let mut client = peer.client().map_err(|err| err.to_string())?;
        let mut request = tonic::Request::new(IdentifyRequest {
            identity: Some(peer.identity()),
        });
        request.set_timeout(timeout);
        match tokio::time::timeout(timeout, client.identify(request)).await {
            Err(_) => Err(format!("no answer within {timeout:?}")),
            Ok(Err(status)) => Err(status.message().to_string()),
            Ok(Ok(response)) => Ok(response.into_inner()),
        }
    }
}

/// Whether `addr` is `host:port` within `NODE_ADDR_BYTES_MAX` that a URL
/// can carry as it is: the host a name or IPv4 address (letters, digits,
/// `.`, `-`, `_`) or an IPv6 address in brackets, the port decimal digits
/// only.
fn host_port(addr: &str) -> bool {
    let Some((host, port)) = addr.rsplit_once(':') else {
        return false;
    };
    let port_ok =
        !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()) && port.parse::<u16>().is_ok();
    let host_ok = match host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        Some(v6) => v6.parse::<std::net::Ipv6Addr>().is_ok(),
        None => {
            !host.is_empty()
                && host
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b".-_".contains(&b))
        }
    };
    addr.len() <= crate::raft::types::NODE_ADDR_BYTES_MAX && port_ok && host_ok
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = PeerClient;

    async fn new_client(&mut self, target: u64, node: &NodeInfo) -> PeerClient {
        self.client(target, node)
    }
}

/// openraft's client for one peer.
#[derive(Debug)]
pub struct PeerClient {
    from: u64,
    target: u64,
    identity: Identity,
    pub(crate) faults: Faults,
    pub(crate) metrics: Option<Metrics>,
    client: Result<RaftClient<Channel>, String>,
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(crate) struct Msg(pub(crate) String);

pub(crate) fn status_error(status: &tonic::Status) -> RpcErr {
    match status.code() {
        tonic::Code::Unavailable | tonic::Code::Unknown | tonic::Code::Cancelled => {
            RPCError::Unreachable(Unreachable::new(status))
        }
        _ => RPCError::Network(NetworkError::new(status)),
    }
}

impl PeerClient {
    /// What every request says about sender and target: the cluster id (0
    /// while this member has not learned it), this incarnation, and the
    /// target's incarnation as far as this member knows it (0 = unknown).
    pub(crate) fn identity(&self) -> PbIdentity {
        PbIdentity {
            cluster_id: self.identity.cluster_id(),
            from_id: self.from,
            from_incarnation: self.identity.incarnation(),
            to_id: self.target,
            to_incarnation: self.identity.peer_incarnation(self.target),
            protocol_version: kvproto::PEER_PROTOCOL_VERSION,
        }
    }

    pub(crate) fn client(&self) -> Result<RaftClient<Channel>, RpcErr> {
        if self.faults.is_cut(self.target) {
            return Err(RPCError::Unreachable(Unreachable::new(&Msg(format!(
                "the link to member {} is cut (test fault)",
                self.target
            )))));
        }
        self.client
            .clone()
            .map_err(|err| RPCError::Unreachable(Unreachable::new(&Msg(err))))
    }

    pub(crate) fn timeout(&self, action: RPCTypes, ttl: Duration) -> RpcErr {
        RPCError::Timeout(Timeout {
            action,
            id: self.from,
            target: self.target,
            timeout: ttl,
        })
    }

    fn decode_result<T: serde::de::DeserializeOwned>(&self, payload: &[u8]) -> Result<T, RpcErr> {
        let result: Result<T, RaftError<TypeConfig>> =
            codec::decode(payload).map_err(|err| RPCError::Network(NetworkError::new(&err)))?;
        // The only error a peer's Raft answers with is fatal (it is stopping
        // or its storage failed): for this member, the peer is unreachable.
        result.map_err(|err| {
            RPCError::Unreachable(Unreachable::new(&Msg(format!(
                "member {}: {err}",
                self.target
            ))))
        })
    }
}

impl PeerClient {
    /// One unary peer RPC within `ttl`: the deadline travels with the
    /// request and bounds the wait here too; UNAVAILABLE and transport
    /// failures are `Unreachable`, a deadline `Timeout` (see the module docs).
    async fn unary<T, F, Fut>(&self, action: RPCTypes, ttl: Duration, call: F) -> Result<T, RpcErr>
    where
        F: FnOnce(RaftClient<Channel>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let client = self.client()?;
        match tokio::time::timeout(ttl, call(client)).await {
            Err(_) => Err(self.timeout(action, ttl)),
            Ok(Err(status)) if status.code() == tonic::Code::DeadlineExceeded => {
                Err(self.timeout(action, ttl))
            }
            Ok(Err(status)) => Err(status_error(&status)),
            Ok(Ok(response)) => Ok(response.into_inner()),
        }
    }

    /// A request message: this member's identity and openraft's request,
    /// encoded, with the deadline set.
    fn request<M>(&self, make: impl FnOnce(PbIdentity) -> M, ttl: Duration) -> tonic::Request<M> {
        let mut request = tonic::Request::new(make(self.identity()));
        request.set_timeout(ttl);
        request
    }
}

/// Which of the two vote RPCs a request goes to.
#[derive(Clone, Copy, Debug)]
enum Ballot {
    Vote,
    PreVote,
}

impl PeerClient {
    /// A Vote or PreVote RPC (same messages; a pre-vote persists nothing).
    async fn vote_rpc(
        &self,
        rpc: &VoteRequest<TypeConfig>,
        option: RPCOption,
        ballot: Ballot,
    ) -> Result<VoteResponse<TypeConfig>, RpcErr> {
        let ttl = option.hard_ttl();
        let request = self.request(
            |identity| PbVote {
                identity: Some(identity),
                payload: codec::encode(rpc).into(),
            },
            ttl,
        );
        let response = self
            .unary(RPCTypes::Vote, ttl, |mut client| async move {
                match ballot {
                    Ballot::Vote => client.vote(request).await,
                    Ballot::PreVote => client.pre_vote(request).await,
                }
            })
            .await?;
        self.decode_result(&response.payload)
    }
}

impl RaftNetworkV2<TypeConfig> for PeerClient {
    type SnapshotData = SnapshotHandle;

    async fn append_entries(
        &mut self,
        mut rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<TypeConfig>, RpcErr> {
        let ttl = option.hard_ttl();
        let mut payload = codec::encode(&rpc);
        // Too large for one message: send the entries that fit; a success
        // then covers only them (openraft sends the rest next).
        let mut cut_after = None;
        if payload.len() > APPEND_PAYLOAD_BYTES_MAX && rpc.entries.len() > 1 {
            rpc.entries
                .truncate(entries_that_fit(&rpc.entries) as usize);
            cut_after = rpc.entries.last().map(|entry| entry.log_id);
            payload = codec::encode(&rpc);
        }
        let request = self.request(
            |identity| PbAppendEntries {
                identity: Some(identity),
                payload: payload.into(),
            },
            ttl,
        );
        let response = self
            .unary(RPCTypes::AppendEntries, ttl, |mut client| async move {
                client.append_entries(request).await
            })
            .await?;
        let answer: AppendEntriesResponse<TypeConfig> = self.decode_result(&response.payload)?;
        Ok(match (answer, cut_after) {
            (AppendEntriesResponse::Success, Some(last)) => {
                AppendEntriesResponse::PartialSuccess(Some(last))
            }
            (answer, _) => answer,
        })
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RpcErr> {
        self.vote_rpc(&rpc, option, Ballot::Vote).await
    }

    /// Asks the peer itself (openraft's default would answer "granted"
    /// without asking, which makes pre-vote a plain election).
    async fn pre_vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RpcErr> {
        self.vote_rpc(&rpc, option, Ballot::PreVote).await
    }

    /// Tells the target to take over (openraft's default would report it
    /// unreachable without asking, and the target would wait out an
    /// election timeout).
    async fn transfer_leader(
        &mut self,
        req: TransferLeaderRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<TransferLeaderResponse<TypeConfig>, RpcErr> {
        let ttl = option.hard_ttl();
        let request = self.request(
            |identity| PbTransferLeader {
                identity: Some(identity),
                payload: codec::encode(&req).into(),
            },
            ttl,
        );
        let response = self
            .unary(RPCTypes::TransferLeader, ttl, |mut client| async move {
                client.transfer_leader(request).await
            })
            .await?;
        let answer: Result<TransferLeaderResponse<TypeConfig>, String> =
            codec::decode(&response.payload)
                .map_err(|err| RPCError::Network(NetworkError::new(&err)))?;
        answer.map_err(|err| {
            RPCError::Unreachable(Unreachable::new(&Msg(format!(
                "member {} could not take the leadership transfer: {err}",
                self.target
            ))))
        })
    }

    async fn full_snapshot(
        &mut self,
        vote: NodeVote,
        snapshot: NodeSnapshot,
        cancel: impl Future<Output = ReplicationClosed> + OptionalSend + 'static,
        option: RPCOption,
    ) -> Result<SnapshotResponse<TypeConfig>, StreamingError<TypeConfig>> {
        let transfer = self.send_snapshot(vote, snapshot.snapshot, option.hard_ttl());
        tokio::select! {
            closed = cancel => Err(StreamingError::Closed(closed)),
            result = transfer => result,
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn only_addresses_a_url_carries_as_they_are_pass() {
        use super::host_port;
        for good in [
            "node-2:2379",
            "10.0.0.5:2379",
            "[fd00::2]:2379",
            "a_b.example:1",
        ] {
            assert!(host_port(good), "{good}");
        }
        for bad in [
            "",
            "node",
            ":2379",
            "node:",
            "node:+80",
            "node:65536",
            "fd00::2:2379",
            "[:1",
            "a]b:1",
            "[zz]:1",
            "a/b:1",
            "user@host:1",
            "h st:1",
            "h%20:1",
        ] {
            assert!(!host_port(bad), "{bad}");
        }
        let long = format!("{}:1", "a".repeat(crate::raft::types::NODE_ADDR_BYTES_MAX));
        assert!(!host_port(&long));
    }

    use openraft::{Entry, EntryPayload};

    use super::*;
    use crate::raft::types::log_id;
    use kvstate::command::{Command, Op, Proposal, Request};

    /// An entry carrying one put of a `value_bytes` value.
    fn entry(index: u64, value_bytes: usize) -> NodeEntry {
        Entry {
            log_id: log_id(1, 1, index),
            payload: EntryPayload::Normal(Proposal {
                time_ms: index,
                command: Command::Requests(vec![Request {
                    session: None,
                    conditions: Vec::new(),
                    ops: vec![Op::Put {
                        key: index.to_be_bytes().to_vec(),
                        value: vec![7; value_bytes],
                        ttl_ms: 0,
                    }],
                }]),
            }),
        }
    }

    #[test]
    fn an_oversized_append_is_cut_to_the_entries_that_fit() {
        const MIB: usize = 1024 * 1024;
        // 80 entries of ~1 MiB: more than one message may carry.
        let entries: Vec<_> = (1..=80).map(|i| entry(i, MIB)).collect();
        let fit = entries_that_fit(&entries) as usize;
        assert!(fit > 1 && fit < entries.len(), "{fit}");
        let size = |n: usize| codec::encode(&entries[..n].to_vec()).len();
        assert!(
            size(fit) + APPEND_NON_ENTRY_BYTES <= APPEND_PAYLOAD_BYTES_MAX,
            "{}",
            size(fit)
        );
        assert!(size(fit + 1) + APPEND_NON_ENTRY_BYTES > APPEND_PAYLOAD_BYTES_MAX);
        // A single entry always goes, whatever its size.
        assert_eq!(entries_that_fit(&entries[..1]), 1);
    }
}
