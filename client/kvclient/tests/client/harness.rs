//! A small in-process three-node cluster for the client scenarios
//! (`kvnode::testing::LocalCluster`: real members on a private loopback
//! address, member 1 bootstrapping): start, the current leader, a member
//! shut down, and the client addresses. Proves nothing by itself.

use std::time::Duration;

use kvnode::testing::LocalCluster;

/// How long any wait on a cluster condition may take before the test fails.
pub const DEADLINE: Duration = Duration::from_secs(60);
/// Pause between two polls of a condition.
pub const POLL: Duration = Duration::from_millis(20);
/// Members in the test cluster.
pub const MEMBERS: u64 = 3;

/// Three running (or stopped) members. Data directories live as long as
/// the cluster.
pub struct Cluster {
    members: LocalCluster,
    _root: tempfile::TempDir,
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
        let root = tempfile::tempdir().expect("tempdir");
        let members = LocalCluster::start(root.path(), MEMBERS)
            .await
            .unwrap_or_else(|err| panic!("start the cluster: {err}"));
        let cluster = Cluster {
            members,
            _root: root,
        };
        cluster.leader().await;
        cluster
    }

    /// Every member's client address (`host:port`), running or not.
    pub fn endpoints(&self) -> Vec<String> {
        self.members.endpoints()
    }

    /// One member's client address.
    pub fn addr(&self, id: u64) -> String {
        self.members.addr(id)
    }

    /// Waits until every running member names the same running leader.
    pub async fn leader(&self) -> u64 {
        self.members
            .wait_for_leader(DEADLINE)
            .await
            .unwrap_or_else(|err| panic!("{err}"))
    }

    /// Stops a member at once (in-flight requests are cut off).
    pub async fn kill(&mut self, id: u64) {
        assert!(self.members.kill(id).await, "member {id} is not running");
    }
}
