//! etcd's `Maintenance` service.
//!
//! - Status: this member's view — the version it follows
//!   ([`ETCD_COMPATIBLE_VERSION`](super::ETCD_COMPATIBLE_VERSION)), the
//!   engine's bytes (`dbSize` all data files, `dbSizeInUse` the live
//!   bytes), the leader it knows, its last log index and term, its applied
//!   index, and whether it is a learner.
//! - Alarm: raftcask raises no etcd alarms (a low disk refuses writes with
//!   `etcdserver: mvcc: database space exceeded` instead): every action
//!   answers an empty list.
//! - MoveLeader: the native leader transfer (on the leader, as etcd's;
//!   to the current leader it succeeds at once). Its answer carries no
//!   header, as etcd 3.4's does not.
//! - Defragment, Hash, HashKV and Snapshot: UNIMPLEMENTED with a message
//!   naming what to use instead (not built yet).

use std::pin::Pin;

use kvproto::cluster::v1 as native;
use kvproto::cluster::v1::cluster_server::Cluster as NativeCluster;
use kvproto::etcd::etcdserverpb::maintenance_server::Maintenance;
use kvproto::etcd::etcdserverpb::{
    AlarmRequest, AlarmResponse, DefragmentRequest, DefragmentResponse, HashKvRequest,
    HashKvResponse, HashRequest, HashResponse, MoveLeaderRequest, MoveLeaderResponse,
    SnapshotRequest, SnapshotResponse, StatusRequest, StatusResponse,
};
use tokio_stream::Stream;
use tonic::{Request, Response, Status};

use super::EtcdFrontEnd;
use super::cluster::membership_error;
use super::errors::{self, etcd_error};
use crate::raft::watch::MetricsWatch as _;

/// The response stream of `Maintenance.Snapshot`.
pub type SnapshotStream = Pin<Box<dyn Stream<Item = Result<SnapshotResponse, Status>> + Send>>;

#[tonic::async_trait]
impl Maintenance for EtcdFrontEnd {
    async fn alarm(
        &self,
        _request: Request<AlarmRequest>,
    ) -> Result<Response<AlarmResponse>, Status> {
        Ok(Response::new(AlarmResponse {
            header: Some(self.header()),
            alarms: Vec::new(),
        }))
    }

    async fn status(
        &self,
        _request: Request<StatusRequest>,
    ) -> Result<Response<StatusResponse>, Status> {
        let metrics = self.raft.metrics().borrow().clone();
        let stats = self.kv.state_machine().engine().stats();
        let leader = crate::raft::membership::known_leader(&metrics).unwrap_or(0);
        let is_learner = !metrics
            .membership_config
            .membership()
            .voter_ids()
            .any(|voter| voter == metrics.id);
        let bytes = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        Ok(Response::new(StatusResponse {
            header: Some(self.header()),
            version: super::ETCD_COMPATIBLE_VERSION.to_string(),
            db_size: bytes(stats.live_bytes + stats.dead_bytes),
            leader,
            raft_index: metrics.last_log_index.unwrap_or(0),
            raft_term: metrics.current_term,
            raft_applied_index: metrics.last_applied.map(|l| l.index).unwrap_or(0),
            errors: Vec::new(),
            db_size_in_use: bytes(stats.live_bytes),
            is_learner,
        }))
    }

    async fn defragment(
        &self,
        _request: Request<DefragmentRequest>,
    ) -> Result<Response<DefragmentResponse>, Status> {
        Err(Status::unimplemented(
            "Defragment is not served by raftcask's etcd port yet: the leader merges data files \
             on its own (the merge policy, --merge-* flags)",
        ))
    }

    async fn hash(&self, _request: Request<HashRequest>) -> Result<Response<HashResponse>, Status> {
        Err(Status::unimplemented(
            "Hash is not served by raftcask's etcd port yet",
        ))
    }

    async fn hash_kv(
        &self,
        _request: Request<HashKvRequest>,
    ) -> Result<Response<HashKvResponse>, Status> {
        Err(Status::unimplemented(
            "HashKV is not served by raftcask's etcd port yet",
        ))
    }

    type SnapshotStream = SnapshotStream;

    async fn snapshot(
        &self,
        _request: Request<SnapshotRequest>,
    ) -> Result<Response<SnapshotStream>, Status> {
        Err(Status::unimplemented(
            "Snapshot is not served by raftcask's etcd port yet: take a backup with `kvctl \
             backup` on the client port",
        ))
    }

    async fn move_leader(
        &self,
        request: Request<MoveLeaderRequest>,
    ) -> Result<Response<MoveLeaderResponse>, Status> {
        let target = request.into_inner().target_id;
        let leader = crate::raft::membership::known_leader(&self.raft.metrics().borrow());
        if leader == Some(target) {
            return Ok(Response::new(MoveLeaderResponse { header: None }));
        }
        NativeCluster::move_leader(
            &self.cluster,
            Request::new(native::MoveLeaderRequest { id: target }),
        )
        .await
        .map_err(|status| {
            if status.code() == tonic::Code::InvalidArgument {
                etcd_error(errors::BAD_LEADER_TRANSFEREE, status.message())
            } else {
                membership_error(status)
            }
        })?;
        Ok(Response::new(MoveLeaderResponse { header: None }))
    }
}
