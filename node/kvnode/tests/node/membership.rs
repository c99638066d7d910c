//! Membership through the Cluster service, on in-process members with a
//! writer running throughout:
//!
//! - bad requests are refused before anything changes: id 0 and a malformed
//!   or taken address are INVALID_ARGUMENT naming the field, an id in use or
//!   a non-member FAILED_PRECONDITION, any call on a follower NotLeader;
//! - the cluster grows 3 → 4 → 5: a member started late (no bootstrap) is
//!   added as a learner and, because the leader snapshotted and purged its
//!   log, catches up by snapshot before AddLearner (wait_caught_up) answers;
//!   Status on the leader shows it as LEARNER with its lag; then it is
//!   promoted to voter;
//! - it shrinks back: a follower is removed, then the leader removes itself —
//!   it steps down, the others elect a new leader, and the removed leader
//!   refuses writes and names no leader;
//! - a dead member is replaced: it is stopped, removed, and a new member
//!   under a new id is added and promoted;
//! - the dead member's id re-added with a wiped data directory is refused at
//!   once with FAILED_PRECONDITION naming the id and asking for a new id;
//! - every write acknowledged throughout is read back, linearizably, on
//!   every final member.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kvnode::raft::watch::MetricsWatch;
use kvnode::server::convert::detail_of;
use kvnode::{Node, NodeInfo};
use kvproto::cluster::v1::cluster_client::ClusterClient;
use kvproto::cluster::v1::{
    AddLearnerRequest, MemberListRequest, PromoteRequest, RemoveMemberRequest, Role, StatusRequest,
    TriggerSnapshotRequest,
};
use kvproto::kv::v1::kv_client::KvClient;
use kvproto::kv::v1::{Consistency, error_detail};
use tokio::sync::watch;
use tonic::Code;
use tonic::transport::{Channel, Endpoint};

use crate::cluster::{get, info, listeners, put, try_start};

/// How long any wait on a cluster condition may take.
const DEADLINE: Duration = Duration::from_secs(60);
/// Pause between two polls of a condition.
const POLL: Duration = Duration::from_millis(50);
/// Grace period for in-flight requests when a member shuts down.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);
/// Keys the background writer writes at most.
const WRITER_KEYS_MAX: usize = 100_000;
/// How long the writer keeps trying one key before moving on (a key never
/// acknowledged is not required at the end).
const WRITER_KEY_DEADLINE: Duration = Duration::from_secs(30);
/// Pause between two writes of the background writer.
const WRITER_PACE: Duration = Duration::from_millis(10);
/// Deadline of one request the writer or the checks send.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a refused re-add of a wiped member may take (it must not hang).
const REFUSAL_DEADLINE: Duration = Duration::from_secs(10);
/// Entries the leader writes before the first learner joins.
const EARLY_WRITES: usize = 100;

fn channel(addr: SocketAddr) -> Channel {
    Endpoint::from_shared(format!("http://{addr}"))
        .expect("endpoint")
        .connect_timeout(Duration::from_secs(1))
        .timeout(REQUEST_TIMEOUT)
        .connect_lazy()
}

fn admin(node: &Node) -> ClusterClient<Channel> {
    ClusterClient::new(channel(node.client_addr()))
}

fn is_not_leader(status: &tonic::Status) -> bool {
    status.code() == Code::FailedPrecondition
        && matches!(
            detail_of(status).and_then(|d| d.detail),
            Some(error_detail::Detail::NotLeader(_))
        )
}

/// Members by id: their directories and running nodes.
struct Members {
    dirs: BTreeMap<u64, tempfile::TempDir>,
    nodes: BTreeMap<u64, Node>,
    /// Client addresses the writer may try (running members of the cluster).
    addrs: Arc<Mutex<Vec<SocketAddr>>>,
}

impl Members {
    /// Starts member `id` on a fresh directory and fresh listeners;
    /// `initial` is its initial cluster (it is added to it).
    async fn start(&mut self, id: u64, initial: &BTreeMap<u64, NodeInfo>, bootstrap: bool) {
        let pair = listeners().await;
        let mut initial = initial.clone();
        initial.insert(id, info(&pair.0, &pair.1));
        let dir = tempfile::tempdir().expect("tempdir");
        let node = try_start(id, dir.path(), &initial, bootstrap, pair, |config| {
            config.snapshot_log_keep = 0;
        })
        .await
        .unwrap_or_else(|err| panic!("start member {id}: {err}"));
        self.addrs.lock().unwrap().push(node.client_addr());
        self.dirs.insert(id, dir);
        self.nodes.insert(id, node);
    }

    fn node(&self, id: u64) -> &Node {
        self.nodes
            .get(&id)
            .unwrap_or_else(|| panic!("member {id} is not running"))
    }

    fn info(&self, id: u64) -> NodeInfo {
        let node = self.node(id);
        NodeInfo {
            client_addr: node.client_addr().to_string(),
            peer_addr: node.peer_addr().to_string(),
        }
    }

    /// Stops member `id` (its directory stays until the test ends).
    async fn stop(&mut self, id: u64) {
        let node = self
            .nodes
            .remove(&id)
            .unwrap_or_else(|| panic!("member {id} is not running"));
        self.addrs
            .lock()
            .unwrap()
            .retain(|a| *a != node.client_addr());
        node.shutdown(SHUTDOWN_GRACE).await;
    }

    /// Waits until the running members in `among` agree on a leader among
    /// them; returns it.
    async fn leader(&self, among: &[u64]) -> u64 {
        let start = Instant::now();
        loop {
            let seen: Vec<Option<u64>> = among
                .iter()
                .map(|id| self.node(*id).raft().metrics().borrow().current_leader)
                .collect();
            if let Some(Some(leader)) = seen.first()
                && seen.iter().all(|l| *l == Some(*leader))
                && among.contains(leader)
                && self.node(*leader).raft().metrics().borrow().state
                    == openraft::ServerState::Leader
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

    /// The membership (voter?, by id) member `id` knows.
    async fn list(&self, id: u64) -> Vec<(u64, bool)> {
        admin(self.node(id))
            .member_list(MemberListRequest {})
            .await
            .expect("member list")
            .into_inner()
            .members
            .iter()
            .map(|m| (m.id, m.voter))
            .collect()
    }

    async fn add_learner(&self, leader: u64, id: u64) {
        let info = self.info(id);
        let reply = admin(self.node(leader))
            .add_learner(AddLearnerRequest {
                id,
                client_addr: info.client_addr,
                peer_addr: info.peer_addr,
                wait_caught_up: true,
            })
            .await
            .unwrap_or_else(|err| panic!("add learner {id} on {leader}: {err:?}"))
            .into_inner();
        let row = reply.members.iter().find(|m| m.id == id);
        assert!(row.is_some_and(|m| !m.voter), "{reply:?}");
    }

    async fn promote(&self, leader: u64, id: u64) {
        let reply = admin(self.node(leader))
            .promote(PromoteRequest { id })
            .await
            .unwrap_or_else(|err| panic!("promote {id} on {leader}: {err:?}"))
            .into_inner();
        let row = reply.members.iter().find(|m| m.id == id);
        assert!(row.is_some_and(|m| m.voter), "{reply:?}");
    }

    async fn remove(&self, leader: u64, id: u64) {
        let reply = admin(self.node(leader))
            .remove_member(RemoveMemberRequest { id })
            .await
            .unwrap_or_else(|err| panic!("remove {id} on {leader}: {err:?}"))
            .into_inner();
        assert!(reply.members.iter().all(|m| m.id != id), "{reply:?}");
    }
}

/// Writes `w<n>` keys one after another to whichever member leads, following
/// NotLeader hints; records the acknowledged ones.
struct Writer {
    acked: Arc<Mutex<Vec<(String, String)>>>,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Writer {
    fn spawn(addrs: Arc<Mutex<Vec<SocketAddr>>>) -> Writer {
        let acked = Arc::new(Mutex::new(Vec::new()));
        let (stop, mut stopped) = watch::channel(false);
        let record = acked.clone();
        let task = tokio::spawn(async move {
            let mut target: Option<SocketAddr> = None;
            let mut turn = 0usize;
            let mut clients: BTreeMap<SocketAddr, KvClient<Channel>> = BTreeMap::new();
            for n in 0..WRITER_KEYS_MAX {
                if *stopped.borrow() {
                    return;
                }
                let (key, value) = (format!("w{n:06}"), format!("value {n}"));
                let started = Instant::now();
                while started.elapsed() < WRITER_KEY_DEADLINE {
                    let addr = match target {
                        Some(addr) => addr,
                        None => {
                            let addrs = addrs.lock().unwrap().clone();
                            turn += 1;
                            addrs[turn % addrs.len()]
                        }
                    };
                    let kv = clients
                        .entry(addr)
                        .or_insert_with(|| KvClient::new(channel(addr)));
                    match kv.put(put(&key, &value)).await {
                        Ok(_) => {
                            record.lock().unwrap().push((key.clone(), value.clone()));
                            target = Some(addr);
                            break;
                        }
                        Err(status) => {
                            let hint = match detail_of(&status).and_then(|d| d.detail) {
                                Some(error_detail::Detail::NotLeader(hint)) => {
                                    hint.leader_client_addr.parse().ok()
                                }
                                _ => None,
                            };
                            target = hint.filter(|a| addrs.lock().unwrap().contains(a));
                            tokio::select! {
                                _ = tokio::time::sleep(POLL) => {}
                                _ = stopped.wait_for(|s| *s) => return,
                            }
                        }
                    }
                }
                tokio::select! {
                    _ = tokio::time::sleep(WRITER_PACE) => {}
                    _ = stopped.wait_for(|s| *s) => return,
                }
            }
        });
        Writer { acked, stop, task }
    }

    fn acked(&self) -> usize {
        self.acked.lock().unwrap().len()
    }

    /// Waits until `more` further writes are acknowledged (the cluster
    /// takes writes in its current shape).
    async fn progress(&self, more: usize, when: &str) {
        let target = self.acked() + more;
        let start = Instant::now();
        while self.acked() < target {
            assert!(
                start.elapsed() < DEADLINE,
                "{when}: the writer got only {} of {target} writes acknowledged",
                self.acked()
            );
            tokio::time::sleep(POLL).await;
        }
    }

    async fn finish(self) -> Vec<(String, String)> {
        let _ = self.stop.send(true);
        tokio::time::timeout(DEADLINE, self.task)
            .await
            .expect("the writer stops")
            .expect("the writer task");
        self.acked.lock().unwrap().clone()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grow_shrink_remove_the_leader_and_replace_a_dead_member() {
    crate::harness::init_logs();
    let mut members = Members {
        dirs: BTreeMap::new(),
        nodes: BTreeMap::new(),
        addrs: Arc::default(),
    };
    // Three members that know each other from the start.
    let mut pairs = BTreeMap::new();
    for id in 1..=3u64 {
        pairs.insert(id, listeners().await);
    }
    let initial: BTreeMap<u64, NodeInfo> =
        pairs.iter().map(|(id, (c, p))| (*id, info(c, p))).collect();
    for (id, pair) in pairs {
        let dir = tempfile::tempdir().expect("tempdir");
        let node = try_start(id, dir.path(), &initial, id == 1, pair, |config| {
            config.snapshot_log_keep = 0;
        })
        .await
        .unwrap_or_else(|err| panic!("start member {id}: {err}"));
        members.addrs.lock().unwrap().push(node.client_addr());
        members.dirs.insert(id, dir);
        members.nodes.insert(id, node);
    }
    let leader = members.leader(&[1, 2, 3]).await;
    let writer = Writer::spawn(members.addrs.clone());
    writer.progress(EARLY_WRITES, "three members").await;

    // Refusals that change nothing.
    let follower = [1, 2, 3].into_iter().find(|id| *id != leader).unwrap();
    let mut lead = admin(members.node(leader));
    let good = members.info(follower);
    let refused = |id: u64, client_addr: &str, peer_addr: &str| AddLearnerRequest {
        id,
        client_addr: client_addr.to_string(),
        peer_addr: peer_addr.to_string(),
        wait_caught_up: false,
    };
    let err = lead
        .add_learner(refused(0, "127.0.0.1:1", "127.0.0.1:2"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(err.message().contains("id"), "{err:?}");
    let err = lead
        .add_learner(refused(9, "no-port", "127.0.0.1:2"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(err.message().contains("client_addr"), "{err:?}");
    let err = lead
        .add_learner(refused(9, "127.0.0.1:1", &good.peer_addr))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(err.message().contains("peer_addr"), "{err:?}");
    let err = lead
        .add_learner(refused(follower, &good.client_addr, &good.peer_addr))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert!(err.message().contains("already a voter"), "{err:?}");
    let err = lead
        .add_learner(refused(9, "127.0.0.1:1", "127.0.0.1:2"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert!(err.message().contains("start the new member"), "{err:?}");
    for (what, err) in [
        (
            "promote",
            lead.promote(PromoteRequest { id: 9 }).await.unwrap_err(),
        ),
        (
            "remove",
            lead.remove_member(RemoveMemberRequest { id: 9 })
                .await
                .unwrap_err(),
        ),
    ] {
        assert_eq!(err.code(), Code::FailedPrecondition, "{what}: {err:?}");
        assert!(err.message().contains("member 9"), "{what}: {err:?}");
    }
    let on_follower = admin(members.node(follower))
        .remove_member(RemoveMemberRequest { id: leader })
        .await
        .unwrap_err();
    assert!(is_not_leader(&on_follower), "{on_follower:?}");
    assert_eq!(
        members.list(leader).await,
        vec![(1, true), (2, true), (3, true)]
    );

    // The leader snapshots and purges its log: a new member can only catch
    // up by snapshot.
    let snap = lead
        .trigger_snapshot(TriggerSnapshotRequest { purge_log: true })
        .await
        .expect("trigger snapshot")
        .into_inner();
    assert!(snap.last_log_index > EARLY_WRITES as u64, "{snap:?}");
    let purged = members.node(leader).raft().metrics().borrow().purged;
    assert!(purged.is_some_and(|p| p.index > 1), "{purged:?}");

    // Grow to 4: started with no initial members but itself.
    members.start(4, &BTreeMap::new(), false).await;
    members.add_learner(leader, 4).await;
    let four = members.node(4).raft().metrics().borrow().clone();
    assert!(
        four.snapshot
            .is_some_and(|s| s.index >= snap.last_log_index),
        "member 4 caught up without the snapshot: {:?}",
        four.snapshot
    );
    let status = lead
        .status(StatusRequest {})
        .await
        .expect("status")
        .into_inner();
    let row = status
        .members
        .iter()
        .find(|m| m.member.as_ref().is_some_and(|m| m.id == 4))
        .unwrap_or_else(|| panic!("no row for member 4: {status:?}"));
    assert_eq!(row.role, Role::Learner as i32, "{row:?}");
    assert!(
        row.lag_entries.is_some() && row.matched_index.is_some(),
        "{row:?}"
    );
    // Member 4's own view reaches the membership that names it soon.
    let start = Instant::now();
    loop {
        let mine = admin(members.node(4))
            .status(StatusRequest {})
            .await
            .expect("status on member 4")
            .into_inner();
        let me = mine.members.iter().find(|m| m.is_self);
        if me.is_some_and(|m| m.role == Role::Learner as i32) {
            break;
        }
        assert!(start.elapsed() < DEADLINE, "{mine:?}");
        tokio::time::sleep(POLL).await;
    }
    writer.progress(20, "with a learner").await;
    members.promote(leader, 4).await;
    writer.progress(20, "four voters").await;

    // Grow to 5: started knowing the current members.
    let current: BTreeMap<u64, NodeInfo> = [1, 2, 3, 4]
        .into_iter()
        .map(|id| (id, members.info(id)))
        .collect();
    members.start(5, &current, false).await;
    members.add_learner(leader, 5).await;
    members.promote(leader, 5).await;
    assert_eq!(
        members.list(leader).await,
        vec![(1, true), (2, true), (3, true), (4, true), (5, true)]
    );
    writer.progress(20, "five voters").await;

    // Shrink: remove a follower, then the leader removes itself.
    let gone = follower;
    members.remove(leader, gone).await;
    members.stop(gone).await;
    writer.progress(20, "four voters again").await;
    members.remove(leader, leader).await;
    let rest: Vec<u64> = [1, 2, 3, 4, 5]
        .into_iter()
        .filter(|id| *id != gone && *id != leader)
        .collect();
    let new_leader = members.leader(&rest).await;
    assert_ne!(new_leader, leader);
    // The removed leader stepped down: it refuses writes and names no
    // leader.
    let start = Instant::now();
    loop {
        let old = members.node(leader).raft().metrics().borrow().state;
        if old != openraft::ServerState::Leader {
            break;
        }
        assert!(start.elapsed() < DEADLINE, "member {leader} still leads");
        tokio::time::sleep(POLL).await;
    }
    let refused = KvClient::new(channel(members.node(leader).client_addr()))
        .put(put("after-removal", "x"))
        .await
        .unwrap_err();
    assert!(is_not_leader(&refused), "{refused:?}");
    let header = admin(members.node(leader))
        .status(StatusRequest {})
        .await
        .expect("status on the removed leader")
        .into_inner()
        .header
        .expect("header");
    assert_eq!(header.leader_id, 0, "{header:?}");
    members.stop(leader).await;
    writer
        .progress(20, "three voters after the leader left")
        .await;

    // Replace a dead member: one follower dies; it is removed and a new
    // member takes its place under a new id.
    let leader = new_leader;
    let dead = rest.iter().copied().find(|id| *id != leader).unwrap();
    let dead_peer = members.node(dead).peer_addr();
    members.stop(dead).await;
    writer.progress(20, "one of three dead").await;
    members.remove(leader, dead).await;
    let current: BTreeMap<u64, NodeInfo> = rest
        .iter()
        .filter(|id| **id != dead)
        .map(|id| (*id, members.info(*id)))
        .collect();
    members.start(6, &current, false).await;
    members.add_learner(leader, 6).await;
    members.promote(leader, 6).await;
    writer.progress(20, "after the replacement").await;

    // The dead member's id with a wiped directory: refused at once.
    members.dirs.remove(&dead);
    members.start(dead, &current, false).await;
    assert_ne!(members.node(dead).peer_addr(), dead_peer);
    let wiped = members.info(dead);
    let asked = Instant::now();
    let err = admin(members.node(leader))
        .add_learner(AddLearnerRequest {
            id: dead,
            client_addr: wiped.client_addr,
            peer_addr: wiped.peer_addr,
            wait_caught_up: true,
        })
        .await
        .unwrap_err();
    assert!(asked.elapsed() < REFUSAL_DEADLINE, "{:?}", asked.elapsed());
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert!(
        err.message().contains(&format!("member {dead} ")) && err.message().contains("new id"),
        "{err:?}"
    );
    members.stop(dead).await;

    // Every acknowledged write is on every final member.
    let acked = writer.finish().await;
    let finals: Vec<u64> = members.nodes.keys().copied().collect();
    let mut expected: Vec<u64> = current.keys().copied().chain([6]).collect();
    expected.sort_unstable();
    assert_eq!(finals, expected);
    assert_eq!(
        members.list(leader).await,
        expected.iter().map(|id| (*id, true)).collect::<Vec<_>>()
    );
    assert!(acked.len() > EARLY_WRITES + 100, "{} acked", acked.len());
    for id in &finals {
        let mut kv = KvClient::new(channel(members.node(*id).client_addr()));
        for (key, value) in &acked {
            let got = kv
                .get(get(key, Consistency::Linearizable, 0))
                .await
                .unwrap_or_else(|err| panic!("get {key} on member {id}: {err:?}"))
                .into_inner();
            assert_eq!(
                String::from_utf8_lossy(&got.value),
                value.as_str(),
                "{key} on member {id}"
            );
        }
    }
    for id in finals {
        members.stop(id).await;
    }
}
