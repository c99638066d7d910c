//! A small in-process three-node cluster (kvnode as a library on ephemeral
//! 127.0.0.1 ports) for the client scenarios: start, the current leader,
//! a member shut down, and the client addresses. Proves nothing by itself.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use kvnode::{Listeners, Node, NodeConfig, NodeInfo};
use tokio::net::TcpListener;

/// How long any wait on a cluster condition may take before the test fails.
pub const DEADLINE: Duration = Duration::from_secs(60);
/// Pause between two polls of a condition.
pub const POLL: Duration = Duration::from_millis(20);
/// Members in the test cluster.
pub const MEMBERS: u64 = 3;

/// Three running (or stopped) members; member 1 bootstraps. Data
/// directories live as long as the cluster.
pub struct Cluster {
    nodes: BTreeMap<u64, Option<Node>>,
    addrs: BTreeMap<u64, String>,
    _dirs: Vec<tempfile::TempDir>,
}

/// Logs on request (`RUST_LOG`), shown for a failing test.
fn init_logs() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
}

impl Cluster {
    /// Starts three members and waits until they agree on a leader.
    pub async fn start() -> Cluster {
        init_logs();
        let mut listeners = BTreeMap::new();
        for id in 1..=MEMBERS {
            let client = TcpListener::bind("127.0.0.1:0").await.expect("bind client");
            let peer = TcpListener::bind("127.0.0.1:0").await.expect("bind peer");
            listeners.insert(id, (client, peer));
        }
        let initial: BTreeMap<u64, NodeInfo> = listeners
            .iter()
            .map(|(id, (client, peer))| {
                let info = NodeInfo {
                    client_addr: client.local_addr().expect("addr").to_string(),
                    peer_addr: peer.local_addr().expect("addr").to_string(),
                };
                (*id, info)
            })
            .collect();
        let mut cluster = Cluster {
            nodes: BTreeMap::new(),
            addrs: initial
                .iter()
                .map(|(id, info)| (*id, info.client_addr.clone()))
                .collect(),
            _dirs: Vec::new(),
        };
        for (id, (client, peer)) in listeners {
            let dir = tempfile::tempdir().expect("tempdir");
            let mut config = NodeConfig::new(
                id,
                dir.path(),
                client.local_addr().expect("addr"),
                peer.local_addr().expect("addr"),
                initial.clone(),
            );
            config.bootstrap = id == 1;
            let node = Node::start_with_listeners(
                config,
                Listeners {
                    client,
                    peer,
                    admin: None,
                },
            )
            .await
            .unwrap_or_else(|err| panic!("start member {id}: {err}"));
            cluster._dirs.push(dir);
            cluster.nodes.insert(id, Some(node));
        }
        cluster.leader().await;
        cluster
    }

    /// Every member's client address (`host:port`), running or not.
    pub fn endpoints(&self) -> Vec<String> {
        self.addrs.values().cloned().collect()
    }

    /// One member's client address.
    pub fn addr(&self, id: u64) -> String {
        self.addrs[&id].clone()
    }

    /// Waits until every running member names the same running leader.
    pub async fn leader(&self) -> u64 {
        let start = Instant::now();
        loop {
            let running: Vec<&Node> = self.nodes.values().flatten().collect();
            let leaders: Vec<Option<u64>> = running
                .iter()
                .map(|n| n.raft().metrics().borrow().current_leader)
                .collect();
            if let Some(Some(leader)) = leaders.first()
                && leaders.iter().all(|l| *l == Some(*leader))
                && self.nodes.get(leader).is_some_and(Option::is_some)
            {
                return *leader;
            }
            assert!(
                start.elapsed() < DEADLINE,
                "no agreed leader in time: {leaders:?}"
            );
            tokio::time::sleep(POLL).await;
        }
    }

    /// Stops a member at once (in-flight requests are cut off).
    pub async fn kill(&mut self, id: u64) {
        let node = self
            .nodes
            .get_mut(&id)
            .and_then(Option::take)
            .unwrap_or_else(|| panic!("member {id} is not running"));
        node.shutdown(Duration::ZERO).await;
    }
}
