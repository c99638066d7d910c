//! Test machinery, compiled only with the `testing` feature (kvnode's own
//! tests enable it; so do the dev-dependencies of kvclient, kvctl and
//! bench, and the fault suite's `testing` build). The product reaches it
//! only through [`crate::hooks`].
//!
//! - this module: a cluster of real members in one process, each on its
//!   own ephemeral ports of a private loopback address, member 1
//!   bootstrapping ([`LocalCluster`]).
//! - [`faults`]: switches for lost write replies, cut peer links, a
//!   corrupted snapshot chunk.
//! - [`failpoints`]: crash points of a snapshot receive and install.
//! - [`stale_build`]: the stale-build fault of the fault suite's
//!   snapshot-choice control.

pub mod failpoints;
pub mod faults;
pub mod stale_build;

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::time::{Duration, Instant};

use tokio::net::TcpListener;

use crate::node::{Listeners, Node, NodeConfig, StartError};
use crate::raft::types::NodeInfo;
use crate::raft::watch::MetricsWatch;

/// How often [`LocalCluster::wait_for_leader`] looks.
pub const LEADER_POLL: Duration = Duration::from_millis(20);

/// A loopback address no other test uses: 127.a.b.c with `a` from the
/// process id and `b.c` from a counter. A member restarted on the same
/// port gets it back (on 127.0.0.1, any socket on the machine may take a
/// released port meanwhile); outgoing connections still leave from
/// 127.0.0.1, so only this cluster's listeners bind the address.
pub fn private_loopback() -> IpAddr {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let a = 1 + (std::process::id() % 250) as u8;
    let [_, _, b, c] = (n % 65_000 + 1).to_be_bytes();
    IpAddr::from([127, a, b, c])
}

/// Members of one in-process cluster, running or stopped.
pub struct LocalCluster {
    nodes: BTreeMap<u64, Option<Node>>,
    addrs: BTreeMap<u64, String>,
}

impl std::fmt::Debug for LocalCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let running: Vec<u64> = self
            .nodes
            .iter()
            .filter(|(_, n)| n.is_some())
            .map(|(id, _)| *id)
            .collect();
        f.debug_struct("LocalCluster")
            .field("addrs", &self.addrs)
            .field("running", &running)
            .finish()
    }
}

impl LocalCluster {
    /// Starts members `1..=members` with data under `root/node<i>`; member
    /// 1 bootstraps. Does not wait for a leader.
    pub async fn start(root: &Path, members: u64) -> Result<LocalCluster, StartError> {
        LocalCluster::start_configured(root, members, |_| {}).await
    }

    /// As [`LocalCluster::start`], with `configure` adjusting each member's
    /// configuration (addresses already set) before it starts: TLS
    /// material, a token.
    pub async fn start_configured(
        root: &Path,
        members: u64,
        configure: impl FnMut(&mut NodeConfig),
    ) -> Result<LocalCluster, StartError> {
        LocalCluster::start_on(private_loopback(), root, members, configure).await
    }

    /// As [`LocalCluster::start_configured`], every member on `ip` (one
    /// from [`private_loopback`], known before certificates naming it are
    /// made).
    pub async fn start_on(
        ip: IpAddr,
        root: &Path,
        members: u64,
        mut configure: impl FnMut(&mut NodeConfig),
    ) -> Result<LocalCluster, StartError> {
        let any_port = SocketAddr::new(ip, 0);
        let bind_error = |source| StartError::Bind {
            addr: any_port,
            source,
        };
        let mut listeners = BTreeMap::new();
        for id in 1..=members {
            let client = TcpListener::bind(any_port).await.map_err(bind_error)?;
            let peer = TcpListener::bind(any_port).await.map_err(bind_error)?;
            let addrs = (
                client.local_addr().map_err(bind_error)?,
                peer.local_addr().map_err(bind_error)?,
            );
            listeners.insert(id, (client, peer, addrs));
        }
        let initial: BTreeMap<u64, NodeInfo> = listeners
            .iter()
            .map(|(id, (_, _, (client, peer)))| {
                (
                    *id,
                    NodeInfo {
                        client_addr: client.to_string(),
                        peer_addr: peer.to_string(),
                    },
                )
            })
            .collect();
        let mut cluster = LocalCluster {
            nodes: BTreeMap::new(),
            addrs: initial
                .iter()
                .map(|(id, info)| (*id, info.client_addr.clone()))
                .collect(),
        };
        for (id, (client, peer, (client_addr, peer_addr))) in listeners {
            let mut config = NodeConfig::new(
                id,
                root.join(format!("node{id}")),
                client_addr,
                peer_addr,
                initial.clone(),
            );
            config.bootstrap = id == 1;
            configure(&mut config);
            let node = Node::start_with_listeners(
                config,
                Listeners {
                    client,
                    peer,
                    admin: None,
                },
            )
            .await?;
            cluster.nodes.insert(id, Some(node));
        }
        Ok(cluster)
    }

    /// Every member's client address (`host:port`), running or not.
    pub fn endpoints(&self) -> Vec<String> {
        self.addrs.values().cloned().collect()
    }

    /// One member's client address.
    pub fn addr(&self, id: u64) -> String {
        self.addrs[&id].clone()
    }

    /// A running member.
    pub fn node(&self, id: u64) -> Option<&Node> {
        self.nodes.get(&id).and_then(Option::as_ref)
    }

    /// Waits until every running member names the same running leader;
    /// `Err` with what each named when `deadline` passes first.
    pub async fn wait_for_leader(&self, deadline: Duration) -> Result<u64, String> {
        let start = Instant::now();
        loop {
            let leaders: Vec<Option<u64>> = self
                .nodes
                .values()
                .flatten()
                .map(|n| n.raft().metrics().borrow().current_leader)
                .collect();
            if let Some(Some(leader)) = leaders.first()
                && leaders.iter().all(|l| *l == Some(*leader))
                && self.node(*leader).is_some()
            {
                return Ok(*leader);
            }
            if start.elapsed() >= deadline {
                return Err(format!("no agreed leader within {deadline:?}: {leaders:?}"));
            }
            tokio::time::sleep(LEADER_POLL).await;
        }
    }

    /// Starts member `id` outside the cluster (data under `root/node<id>`,
    /// only itself as initial member, no bootstrap): a process for
    /// AddLearner to add. Returns its client and peer addresses.
    pub async fn start_new_member(
        &mut self,
        root: &Path,
        id: u64,
    ) -> Result<(String, String), StartError> {
        let any_port = SocketAddr::new(private_loopback(), 0);
        let bind_error = |source| StartError::Bind {
            addr: any_port,
            source,
        };
        let client = TcpListener::bind(any_port).await.map_err(bind_error)?;
        let peer = TcpListener::bind(any_port).await.map_err(bind_error)?;
        let client_addr = client.local_addr().map_err(bind_error)?;
        let peer_addr = peer.local_addr().map_err(bind_error)?;
        let itself = NodeInfo {
            client_addr: client_addr.to_string(),
            peer_addr: peer_addr.to_string(),
        };
        let config = NodeConfig::new(
            id,
            root.join(format!("node{id}")),
            client_addr,
            peer_addr,
            BTreeMap::from([(id, itself.clone())]),
        );
        let node = Node::start_with_listeners(
            config,
            Listeners {
                client,
                peer,
                admin: None,
            },
        )
        .await?;
        self.nodes.insert(id, Some(node));
        self.addrs.insert(id, itself.client_addr.clone());
        Ok((itself.client_addr, itself.peer_addr))
    }

    /// Stops a member at once (in-flight requests are cut off); `false` if
    /// it was not running.
    pub async fn kill(&mut self, id: u64) -> bool {
        match self.nodes.get_mut(&id).and_then(Option::take) {
            Some(node) => {
                node.shutdown(Duration::ZERO).await;
                true
            }
            None => false,
        }
    }

    /// Stops every running member.
    pub async fn shutdown(mut self) {
        for node in std::mem::take(&mut self.nodes).into_values().flatten() {
            node.shutdown(Duration::ZERO).await;
        }
    }
}
