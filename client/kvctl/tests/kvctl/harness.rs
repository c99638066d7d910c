//! A small in-process three-node cluster (kvnode as a library on ephemeral
//! ports of a private 127.a.b.c address) on its own runtime, and a runner
//! of the real `kvctl` binary against it. Proves nothing by itself.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use kvnode::{Listeners, Node, NodeConfig, NodeInfo};
use tokio::net::TcpListener;

/// How long any wait on a cluster condition may take before the test fails.
pub const DEADLINE: Duration = Duration::from_secs(60);
/// Pause between two polls of a condition.
pub const POLL: Duration = Duration::from_millis(20);
/// Members in the test cluster.
pub const MEMBERS: u64 = 3;

/// A loopback address private to this call (127.a.b.c, `a` from the
/// process id), so a port seen free is not taken by a parallel test.
pub fn private_loopback() -> std::net::IpAddr {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let a = 1 + (std::process::id() % 250) as u8;
    let [_, _, b, c] = (n % 65_000 + 1).to_be_bytes();
    std::net::IpAddr::from([127, a, b, c])
}

/// Three running members (member 1 bootstraps) on a runtime of their own;
/// dropped, it shuts them down.
pub struct Cluster {
    runtime: tokio::runtime::Runtime,
    nodes: BTreeMap<u64, Node>,
    addrs: BTreeMap<u64, String>,
    _dirs: Vec<tempfile::TempDir>,
}

impl Cluster {
    /// Starts three members and waits until they agree on a leader.
    pub fn start() -> Cluster {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        let (nodes, addrs, dirs) = runtime.block_on(async {
            let ip = private_loopback();
            let mut listeners = BTreeMap::new();
            for id in 1..=MEMBERS {
                let client = TcpListener::bind((ip, 0)).await.expect("bind client");
                let peer = TcpListener::bind((ip, 0)).await.expect("bind peer");
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
            let addrs: BTreeMap<u64, String> = initial
                .iter()
                .map(|(id, info)| (*id, info.client_addr.clone()))
                .collect();
            let mut nodes = BTreeMap::new();
            let mut dirs = Vec::new();
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
                dirs.push(dir);
                nodes.insert(id, node);
            }
            (nodes, addrs, dirs)
        });
        let cluster = Cluster {
            runtime,
            nodes,
            addrs,
            _dirs: dirs,
        };
        cluster.leader();
        cluster
    }

    /// Every member's client address, comma-separated (for --endpoints).
    pub fn endpoints(&self) -> String {
        self.addrs.values().cloned().collect::<Vec<_>>().join(",")
    }

    /// One member's client address.
    pub fn addr(&self, id: u64) -> String {
        self.addrs[&id].clone()
    }

    /// Waits until every member names the same leader; returns it.
    pub fn leader(&self) -> u64 {
        let start = Instant::now();
        loop {
            let leaders: Vec<Option<u64>> = self
                .nodes
                .values()
                .map(|n| n.raft().metrics().borrow().current_leader)
                .collect();
            if let Some(Some(leader)) = leaders.first()
                && leaders.iter().all(|l| *l == Some(*leader))
            {
                return *leader;
            }
            assert!(
                start.elapsed() < DEADLINE,
                "no agreed leader in time: {leaders:?}"
            );
            std::thread::sleep(POLL);
        }
    }

    /// Runs kvctl with `--endpoints` set to every member.
    pub fn kvctl(&self, args: &[&str]) -> Run {
        let endpoints = self.endpoints();
        let mut all = vec!["--endpoints", endpoints.as_str()];
        all.extend_from_slice(args);
        kvctl(&all, None)
    }

    /// Runs kvctl with `--endpoints` and `input` on standard input.
    pub fn kvctl_stdin(&self, args: &[&str], input: &[u8]) -> Run {
        let endpoints = self.endpoints();
        let mut all = vec!["--endpoints", endpoints.as_str()];
        all.extend_from_slice(args);
        kvctl(&all, Some(input))
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let nodes = std::mem::take(&mut self.nodes);
        self.runtime.block_on(async {
            for node in nodes.into_values() {
                node.shutdown(Duration::ZERO).await;
            }
        });
    }
}

/// One finished kvctl run.
#[derive(Debug)]
pub struct Run {
    /// The exit code.
    pub code: i32,
    /// Standard output.
    pub stdout: Vec<u8>,
    /// Standard error, as text.
    pub stderr: String,
}

impl Run {
    /// Standard output as text.
    pub fn out(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }

    /// Standard output parsed as one JSON object.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.stdout)
            .unwrap_or_else(|err| panic!("stdout is not one JSON value ({err}): {self:?}"))
    }

    /// Asserts the exit code, showing the output if it differs.
    #[track_caller]
    pub fn expect_code(&self, code: i32) -> &Run {
        assert_eq!(
            self.code,
            code,
            "exit code; stdout: {:?}; stderr: {:?}",
            self.out(),
            self.stderr
        );
        self
    }
}

/// Runs the kvctl binary (no colours: NO_COLOR set, and output is a pipe).
pub fn kvctl(args: &[&str], input: Option<&[u8]>) -> Run {
    kvctl_in(args, input, None)
}

/// [`kvctl`] in a working directory.
pub fn kvctl_in(args: &[&str], input: Option<&[u8]>, dir: Option<&Path>) -> Run {
    let mut command = Command::new(env!("CARGO_BIN_EXE_kvctl"));
    command
        .args(args)
        .env("NO_COLOR", "1")
        .env_remove("KVCTL_ENDPOINTS")
        .stdin(if input.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(dir) = dir {
        command.current_dir(dir);
    }
    let child = command.spawn().expect("spawn kvctl");
    let mut guard = ChildGuard(Some(child));
    let child = guard.0.as_mut().expect("child");
    if let Some(input) = input {
        use std::io::Write as _;
        let mut stdin = child.stdin.take().expect("stdin");
        stdin.write_all(input).expect("write stdin");
    }
    let read = |mut pipe: Box<dyn std::io::Read + Send>| {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            let _ = pipe.read_to_end(&mut bytes);
            bytes
        })
    };
    let stdout = read(Box::new(child.stdout.take().expect("stdout")));
    let stderr = read(Box::new(child.stderr.take().expect("stderr")));
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for kvctl") {
            break status;
        }
        assert!(
            start.elapsed() < KVCTL_DEADLINE,
            "kvctl {args:?} still running after {KVCTL_DEADLINE:?}"
        );
        std::thread::sleep(POLL);
    };
    guard.0 = None;
    Run {
        code: status.code().expect("kvctl ended by a signal"),
        stdout: stdout.join().expect("stdout reader"),
        stderr: String::from_utf8_lossy(&stderr.join().expect("stderr reader")).into_owned(),
    }
}

/// Longest a kvctl run may take in a test.
pub const KVCTL_DEADLINE: Duration = Duration::from_secs(90);

/// Kills (by its own handle, i.e. PID) and reaps a kvctl still running when
/// a test fails.
struct ChildGuard(Option<std::process::Child>);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if let Some(child) = self.0.as_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
