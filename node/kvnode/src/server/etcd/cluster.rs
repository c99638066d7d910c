//! etcd's `Cluster` service over the native membership.
//!
//! MemberList answers the native membership: ids, `name` "member-<id>",
//! peer URLs (the peer ports) and client URLs (the members' etcd ports,
//! which clientv3's endpoint sync and `etcdctl --cluster` dial), each as
//! the member itself tells it in `Identify` ([`super::peers`]); a member
//! that never told one is taken to have its etcd port at the same offset
//! from its client port as this member's (true for `kvnode local` and for
//! members started alike).
//!
//! MemberRemove and MemberPromote are the native calls (on the leader, as
//! the native ones; another member answers `etcdserver: not leader`).
//! MemberAdd and MemberUpdate are refused with a message: a raftcask
//! member joins with an id and a client address that etcd's request does
//! not carry, and its addresses do not change in place.

use std::collections::HashMap;
use std::net::SocketAddr;

use kvproto::cluster::v1 as native;
use kvproto::cluster::v1::cluster_server::Cluster as NativeCluster;
use kvproto::etcd::etcdserverpb::cluster_server::Cluster;
use kvproto::etcd::etcdserverpb::{
    Member, MemberAddRequest, MemberAddResponse, MemberListRequest, MemberListResponse,
    MemberPromoteRequest, MemberPromoteResponse, MemberRemoveRequest, MemberRemoveResponse,
    MemberUpdateRequest, MemberUpdateResponse,
};
use kvproto::kv::v1::error_detail::Detail;
use tonic::{Code, Request, Response, Status};

use super::EtcdFrontEnd;
use super::errors::{self, etcd_error, to_etcd};
use crate::raft::types::NodeInfo;
use crate::server::convert;

/// A membership error as etcd answers it.
pub(crate) fn membership_error(status: Status) -> Status {
    match (
        status.code(),
        convert::detail_of(&status).and_then(|d| d.detail),
    ) {
        (Code::FailedPrecondition, Some(Detail::NotLeader(_))) => {
            etcd_error(errors::NOT_LEADER, status.message())
        }
        (Code::NotFound, _) => etcd_error(errors::MEMBER_NOT_FOUND, status.message()),
        (Code::InvalidArgument, _) if status.message().contains("not a member") => {
            etcd_error(errors::MEMBER_NOT_FOUND, status.message())
        }
        _ => to_etcd(status),
    }
}

impl EtcdFrontEnd {
    fn scheme(&self) -> &'static str {
        if self.tls { "https" } else { "http" }
    }

    /// The etcd address of each of `members`, by id: this member's own, the
    /// others' as they told it ([`super::peers::EtcdPeers`]), else guessed
    /// ([`EtcdFrontEnd::guessed_etcd_addr`]).
    pub(crate) async fn etcd_addrs(&self, members: &[(u64, NodeInfo)]) -> HashMap<u64, String> {
        let me = self.member_id();
        let others: Vec<(u64, NodeInfo)> = members
            .iter()
            .filter(|(id, _)| *id != me)
            .cloned()
            .collect();
        let mut addrs = match &self.peers {
            Some(peers) if !others.is_empty() => peers.etcd_addrs(&others).await,
            _ => HashMap::new(),
        };
        for (id, node) in members {
            addrs
                .entry(*id)
                .or_insert_with(|| self.guessed_etcd_addr(*id, &node.client_addr));
        }
        addrs
    }

    /// The etcd address of the member whose client address is
    /// `client_addr` when it has not told one: this member's own, or the
    /// same offset from the client port as this member's (module doc).
    pub(crate) fn guessed_etcd_addr(&self, id: u64, client_addr: &str) -> String {
        if id == self.member_id() && !self.listen_addr.ip().is_unspecified() {
            return self.listen_addr.to_string();
        }
        let offset = i32::from(self.listen_addr.port()) - i32::from(self.client_addr.port());
        match client_addr.parse::<SocketAddr>() {
            Ok(addr) => {
                let port = i32::from(addr.port()) + offset;
                match u16::try_from(port) {
                    Ok(port) => SocketAddr::new(addr.ip(), port).to_string(),
                    Err(_) => client_addr.to_string(),
                }
            }
            // host:port with a host name.
            Err(_) => match client_addr.rsplit_once(':') {
                Some((host, port)) => match port
                    .parse::<i32>()
                    .ok()
                    .and_then(|p| u16::try_from(p + offset).ok())
                {
                    Some(port) => format!("{host}:{port}"),
                    None => client_addr.to_string(),
                },
                None => client_addr.to_string(),
            },
        }
    }

    /// The native members in etcd's shape.
    async fn members(&self, members: Vec<native::Member>) -> Vec<Member> {
        let nodes: Vec<(u64, NodeInfo)> = members
            .iter()
            .map(|m| {
                let node = NodeInfo {
                    client_addr: m.client_addr.clone(),
                    peer_addr: m.peer_addr.clone(),
                };
                (m.id, node)
            })
            .collect();
        let mut etcd_addrs = self.etcd_addrs(&nodes).await;
        let scheme = self.scheme();
        members
            .into_iter()
            .map(|member| {
                let etcd_addr = etcd_addrs.remove(&member.id).unwrap_or_default();
                Member {
                    id: member.id,
                    name: format!("member-{}", member.id),
                    peer_ur_ls: vec![format!("{scheme}://{}", member.peer_addr)],
                    client_ur_ls: vec![format!("{scheme}://{etcd_addr}")],
                    is_learner: !member.voter,
                }
            })
            .collect()
    }
}

#[tonic::async_trait]
impl Cluster for EtcdFrontEnd {
    async fn member_add(
        &self,
        request: Request<MemberAddRequest>,
    ) -> Result<Response<MemberAddResponse>, Status> {
        let request = request.into_inner();
        Err(Status::unimplemented(format!(
            "MemberAdd (peerURLs {:?}) is not served by raftcask's etcd port: a raftcask member \
             joins with an id and a client address the request does not carry; add it with \
             `kvctl member add-learner ID CLIENT_ADDR PEER_ADDR`, then MemberPromote it",
            request.peer_ur_ls
        )))
    }

    async fn member_remove(
        &self,
        request: Request<MemberRemoveRequest>,
    ) -> Result<Response<MemberRemoveResponse>, Status> {
        let id = request.into_inner().id;
        let answer = NativeCluster::remove_member(
            &self.cluster,
            Request::new(native::RemoveMemberRequest { id }),
        )
        .await
        .map_err(membership_error)?
        .into_inner();
        Ok(Response::new(MemberRemoveResponse {
            header: Some(self.header()),
            members: self.members(answer.members).await,
        }))
    }

    async fn member_update(
        &self,
        request: Request<MemberUpdateRequest>,
    ) -> Result<Response<MemberUpdateResponse>, Status> {
        let id = request.into_inner().id;
        Err(Status::unimplemented(format!(
            "MemberUpdate (member {id}) is not served by raftcask's etcd port: a member's \
             addresses do not change in place; remove the member and add it again"
        )))
    }

    async fn member_list(
        &self,
        _request: Request<MemberListRequest>,
    ) -> Result<Response<MemberListResponse>, Status> {
        let answer =
            NativeCluster::member_list(&self.cluster, Request::new(native::MemberListRequest {}))
                .await
                .map_err(to_etcd)?
                .into_inner();
        Ok(Response::new(MemberListResponse {
            header: Some(self.header()),
            members: self.members(answer.members).await,
        }))
    }

    async fn member_promote(
        &self,
        request: Request<MemberPromoteRequest>,
    ) -> Result<Response<MemberPromoteResponse>, Status> {
        let id = request.into_inner().id;
        let answer =
            NativeCluster::promote(&self.cluster, Request::new(native::PromoteRequest { id }))
                .await
                .map_err(membership_error)?
                .into_inner();
        Ok(Response::new(MemberPromoteResponse {
            header: Some(self.header()),
            members: self.members(answer.members).await,
        }))
    }
}
