//! A small in-process three-node cluster for the scenario tests
//! (`replica_files`, `conditions`, `ttl`): three `Node`s on ephemeral
//! 127.0.0.1 ports, leader discovery, a member stopped and restarted on the
//! same data directory and the same addresses, kv clients per member, writes
//! that follow the leader, and a wait until every member has applied the
//! leader's whole log. This file proves nothing by itself.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use kvnode::raft::watch::MetricsWatch;
use kvnode::server::convert::detail_of;
use kvnode::{Faults, Listeners, Node, NodeConfig, NodeInfo, StateMachineOptions};
use kvproto::kv::v1::kv_client::KvClient;
use kvproto::kv::v1::{Consistency, GetRequest, GetResponse, ScanRequest, error_detail};
use tokio::net::TcpListener;
use tonic::transport::Channel;

/// How long any wait on a cluster condition may take before the test fails.
pub const DEADLINE: Duration = Duration::from_secs(60);
/// Pause between two polls of a condition.
pub const POLL: Duration = Duration::from_millis(20);
/// Grace period for in-flight requests when a member shuts down.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);
/// Members in the test cluster.
pub const MEMBERS: u64 = 3;
/// Attempts of a write that is refused with NotLeader (or finds no leader)
/// before the test fails; each one re-finds the leader.
pub const WRITE_ATTEMPTS_MAX: usize = 20;
/// Pages a full scan may take before the test fails.
pub const SCAN_PAGES_MAX: usize = 10_000;

/// One member: its fixed identity, directory and addresses, and the running
/// node (`None` while stopped).
struct Member {
    dir: tempfile::TempDir,
    client_addr: SocketAddr,
    peer_addr: SocketAddr,
    options: StateMachineOptions,
    /// The member's test hooks (kept across restarts).
    faults: Faults,
    node: Option<Node>,
}

/// Three members 1..=3; member 1 bootstraps.
pub struct Cluster {
    members: BTreeMap<u64, Member>,
    initial: BTreeMap<u64, NodeInfo>,
}

/// Logs on request (`RUST_LOG`), shown for a failing test.
pub fn init_logs() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
}

impl Cluster {
    /// Starts three members; `options(id)` gives each member's state machine
    /// options (they must agree where they shape files). Waits for a leader.
    pub async fn start(options: impl Fn(u64) -> StateMachineOptions) -> Cluster {
        init_logs();
        let mut listeners = BTreeMap::new();
        for id in 1..=MEMBERS {
            let host = crate::common::private_loopback();
            let client = TcpListener::bind((host, 0)).await.expect("bind client");
            let peer = TcpListener::bind((host, 0)).await.expect("bind peer");
            listeners.insert(id, (client, peer));
        }
        let initial: BTreeMap<u64, NodeInfo> = listeners
            .iter()
            .map(|(id, (client, peer))| {
                let info = NodeInfo {
                    client_addr: client.local_addr().unwrap().to_string(),
                    peer_addr: peer.local_addr().unwrap().to_string(),
                };
                (*id, info)
            })
            .collect();
        let mut cluster = Cluster {
            members: BTreeMap::new(),
            initial,
        };
        for (id, (client, peer)) in listeners {
            let member = Member {
                dir: tempfile::tempdir().expect("tempdir"),
                client_addr: client.local_addr().unwrap(),
                peer_addr: peer.local_addr().unwrap(),
                options: options(id),
                faults: Faults::default(),
                node: None,
            };
            cluster.members.insert(id, member);
            let node = cluster.start_member(id, client, peer).await;
            cluster.member_mut(id).node = Some(node);
        }
        cluster.leader().await;
        cluster
    }

    fn member(&self, id: u64) -> &Member {
        self.members
            .get(&id)
            .unwrap_or_else(|| panic!("no member {id}"))
    }

    fn member_mut(&mut self, id: u64) -> &mut Member {
        self.members
            .get_mut(&id)
            .unwrap_or_else(|| panic!("no member {id}"))
    }

    async fn start_member(&self, id: u64, client: TcpListener, peer: TcpListener) -> Node {
        let member = self.member(id);
        let mut config = NodeConfig::new(
            id,
            member.dir.path(),
            member.client_addr,
            member.peer_addr,
            self.initial.clone(),
        );
        config.bootstrap = id == 1;
        config.state_machine = member.options.clone();
        config.faults = member.faults.clone();
        Node::start_with_listeners(
            config,
            Listeners {
                client,
                peer,
                admin: None,
            },
        )
        .await
        .unwrap_or_else(|err| panic!("start member {id}: {err}"))
    }

    /// The ids of the running members.
    pub fn running(&self) -> Vec<u64> {
        self.members
            .iter()
            .filter(|(_, m)| m.node.is_some())
            .map(|(id, _)| *id)
            .collect()
    }

    /// A running member's node.
    pub fn node(&self, id: u64) -> &Node {
        self.member(id)
            .node
            .as_ref()
            .unwrap_or_else(|| panic!("member {id} is not running"))
    }

    /// A member's test hooks (the same across its restarts).
    pub fn faults(&self, id: u64) -> &Faults {
        &self.member(id).faults
    }

    /// A member's state-machine engine directory (`DATA/state/engine-<gen>`).
    pub fn engine_dir(&self, id: u64) -> std::path::PathBuf {
        self.node(id).state_machine().engine().dir().to_path_buf()
    }

    /// Waits until every running member names the same leader (itself one
    /// of the running members); returns its id.
    pub async fn leader(&self) -> u64 {
        self.leader_among(&self.running()).await
    }

    /// Waits until the members `among` name the same leader, one of them
    /// (the others may be cut off); returns its id.
    pub async fn leader_among(&self, among: &[u64]) -> u64 {
        let start = Instant::now();
        loop {
            let seen: Vec<Option<u64>> = among
                .iter()
                .map(|id| self.node(*id).raft().metrics().borrow().current_leader)
                .collect();
            if let Some(Some(leader)) = seen.first()
                && seen.iter().all(|l| *l == Some(*leader))
                && among.contains(leader)
            {
                return *leader;
            }
            assert!(
                start.elapsed() < DEADLINE,
                "no agreed leader among {among:?} in time: {seen:?}"
            );
            tokio::time::sleep(POLL).await;
        }
    }

    /// A kv client on a running member's client port.
    pub async fn kv(&self, id: u64) -> KvClient<Channel> {
        KvClient::connect(format!("http://{}", self.node(id).client_addr()))
            .await
            .unwrap_or_else(|err| panic!("connect to member {id}: {err}"))
    }

    /// Sends a write to the leader, re-finding it while the write is refused
    /// with NotLeader (which means it was not applied). Any other error fails
    /// the test.
    pub async fn write<T, F, Fut>(&self, what: &str, mut send: F) -> T
    where
        F: FnMut(KvClient<Channel>) -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        for _ in 0..WRITE_ATTEMPTS_MAX {
            let leader = self.leader().await;
            match send(self.kv(leader).await).await {
                Ok(reply) => return reply.into_inner(),
                Err(status)
                    if matches!(
                        detail_of(&status).and_then(|d| d.detail),
                        Some(error_detail::Detail::NotLeader(_))
                    ) =>
                {
                    tokio::time::sleep(POLL).await;
                }
                Err(status) => panic!("{what} on member {leader}: {status:?}"),
            }
        }
        panic!("{what}: refused with NotLeader {WRITE_ATTEMPTS_MAX} times");
    }

    /// Changes the leader: stops it, waits until the two others agree on a
    /// new one, then restarts the old leader (on its directory and
    /// addresses; it rejoins as a follower). Returns the new leader.
    ///
    /// (`trigger().elect()` on a follower is not used: the other members
    /// refuse its vote while the leader's lease holds, so it may never win.)
    pub async fn change_leader(&mut self) -> u64 {
        let old = self.leader().await;
        self.stop(old).await;
        let new = self.leader().await;
        assert_ne!(new, old, "a stopped member cannot lead");
        self.restart(old).await;
        self.leader().await;
        new
    }

    /// Stops a member (graceful shutdown); its directory stays.
    pub async fn stop(&mut self, id: u64) {
        let node = self
            .member_mut(id)
            .node
            .take()
            .unwrap_or_else(|| panic!("member {id} is not running"));
        node.shutdown(SHUTDOWN_GRACE).await;
    }

    /// Starts a stopped member again on its directory and its addresses,
    /// retrying while the ports (or the engine's directory lock) are not yet
    /// released by the previous incarnation.
    pub async fn restart(&mut self, id: u64) {
        let (client_addr, peer_addr) = {
            let member = self.member(id);
            assert!(member.node.is_none(), "member {id} is still running");
            (member.client_addr, member.peer_addr)
        };
        let (client, peer) = crate::cluster::rebind((client_addr, peer_addr)).await;
        let node = self.start_member(id, client, peer).await;
        self.member_mut(id).node = Some(node);
    }

    /// Has member `id` build a snapshot covering at least `applied` and
    /// purge its log through it (a member away meanwhile catches up by
    /// snapshot install).
    pub async fn snapshot_and_purge(&self, id: u64, applied: u64) {
        let node = self.node(id);
        node.raft().trigger().snapshot().await.unwrap();
        let deadline = Instant::now() + DEADLINE;
        while node
            .raft()
            .metrics()
            .borrow()
            .snapshot
            .map_or(0, |s| s.index)
            < applied
        {
            assert!(Instant::now() < deadline, "no snapshot built");
            tokio::time::sleep(POLL).await;
        }
        let index = node.raft().metrics().borrow().snapshot.unwrap().index;
        node.raft().trigger().purge_log(index).await.unwrap();
        while node.raft().metrics().borrow().purged.map_or(0, |p| p.index) < index {
            assert!(Instant::now() < deadline, "log not purged");
            tokio::time::sleep(POLL).await;
        }
    }

    /// Waits until every running member has applied the leader's last log
    /// index (and they agree on the leader); returns that index.
    pub async fn wait_applied_equal(&self) -> u64 {
        let start = Instant::now();
        loop {
            let leader = self.leader().await;
            let last = self.node(leader).raft().metrics().borrow().last_log_index;
            let applied: Vec<(u64, Option<u64>)> = self
                .running()
                .into_iter()
                .map(|id| (id, self.applied(id)))
                .collect();
            if let Some(last) = last
                && applied.iter().all(|(_, a)| *a == Some(last))
            {
                return last;
            }
            assert!(
                start.elapsed() < DEADLINE,
                "applied indexes {applied:?} did not reach the leader's last log index {last:?} in time"
            );
            tokio::time::sleep(POLL).await;
        }
    }

    /// A running member's applied index, from its state machine.
    pub fn applied(&self, id: u64) -> Option<u64> {
        self.node(id)
            .state_machine()
            .applied()
            .0
            .map(|log_id| log_id.index)
    }

    /// A stale read on member `id` once it has applied `min_index`.
    pub async fn stale_get(&self, id: u64, key: &[u8], min_index: u64) -> GetResponse {
        self.kv(id)
            .await
            .get(GetRequest {
                key: key.to_vec().into(),
                consistency: Consistency::Stale as i32,
                min_index,
            })
            .await
            .unwrap_or_else(|err| panic!("stale get on member {id}: {err:?}"))
            .into_inner()
    }

    /// Every user key on member `id` as (key, value, seq, has TTL), by
    /// paged stale scans once it has applied `min_index`.
    pub async fn stale_scan(&self, id: u64, min_index: u64) -> Vec<(Vec<u8>, Vec<u8>, u64, bool)> {
        let mut kv = self.kv(id).await;
        stale_scan_all(&mut kv, id, min_index)
            .await
            .into_iter()
            .map(|e| (e.key.to_vec(), e.value.to_vec(), e.seq, e.ttl_ms_left > 0))
            .collect()
    }

    /// Stops every running member.
    pub async fn shutdown(mut self) {
        for id in self.running() {
            self.stop(id).await;
        }
    }
}

/// Every user key member `id` (reached through `kv`) holds, by paged stale
/// scans once it has applied `min_index`.
pub async fn stale_scan_all(
    kv: &mut KvClient<Channel>,
    id: u64,
    min_index: u64,
) -> Vec<kvproto::kv::v1::KeyValue> {
    let mut listed = Vec::new();
    let mut after = None;
    for _ in 0..SCAN_PAGES_MAX {
        let page = kv
            .scan(ScanRequest {
                after: after.clone(),
                consistency: Consistency::Stale as i32,
                min_index,
                ..Default::default()
            })
            .await
            .unwrap_or_else(|err| panic!("stale scan on member {id}: {err:?}"))
            .into_inner();
        listed.extend(page.entries);
        if !page.more {
            return listed;
        }
        after = Some(page.next_after);
    }
    panic!("member {id}: the scan took more than {SCAN_PAGES_MAX} pages");
}
