//! A small in-process three-node cluster (`kvnode::testing::LocalCluster`:
//! real members on a private 127.a.b.c address) on its own runtime, and a runner
//! of the real `kvctl` binary against it. Proves nothing by itself.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use kvnode::testing::LocalCluster;

/// How long any wait on a cluster condition may take before the test fails.
pub const DEADLINE: Duration = Duration::from_secs(60);
/// Pause between two polls of a condition.
pub const POLL: Duration = Duration::from_millis(20);
/// Members in the test cluster.
pub const MEMBERS: u64 = 3;

/// Three running members (member 1 bootstraps) on a runtime of their own;
/// dropped, it shuts them down.
pub struct Cluster {
    runtime: tokio::runtime::Runtime,
    members: Option<LocalCluster>,
    _root: tempfile::TempDir,
}

impl Cluster {
    /// Starts three members and waits until they agree on a leader.
    pub fn start() -> Cluster {
        Cluster::start_on(kvnode::testing::private_loopback(), |_| {})
    }

    /// [`Cluster::start`] on `ip`, `configure` adjusting each member's
    /// configuration (TLS, a token) before it starts.
    pub fn start_on(
        ip: std::net::IpAddr,
        configure: impl FnMut(&mut kvnode::NodeConfig),
    ) -> Cluster {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        let root = tempfile::tempdir().expect("tempdir");
        let members = runtime
            .block_on(LocalCluster::start_on(ip, root.path(), MEMBERS, configure))
            .unwrap_or_else(|err| panic!("start the cluster: {err}"));
        let cluster = Cluster {
            runtime,
            members: Some(members),
            _root: root,
        };
        cluster.leader();
        cluster
    }

    /// Starts member `id` outside the cluster (only itself as initial
    /// member): a process for `member add-learner`. Its client and peer
    /// addresses.
    pub fn start_new_member(&mut self, id: u64) -> (String, String) {
        let root = self._root.path().to_path_buf();
        let members = self
            .members
            .as_mut()
            .expect("the cluster runs until dropped");
        self.runtime
            .block_on(members.start_new_member(&root, id))
            .unwrap_or_else(|err| panic!("start member {id}: {err}"))
    }

    fn members(&self) -> &LocalCluster {
        self.members
            .as_ref()
            .expect("the cluster runs until dropped")
    }

    /// Every member's client address, comma-separated (for --endpoints).
    pub fn endpoints(&self) -> String {
        self.members().endpoints().join(",")
    }

    /// One member's client address.
    pub fn addr(&self, id: u64) -> String {
        self.members().addr(id)
    }

    /// Waits until every member names the same leader; returns it.
    pub fn leader(&self) -> u64 {
        self.runtime
            .block_on(self.members().wait_for_leader(DEADLINE))
            .unwrap_or_else(|err| panic!("{err}"))
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
        if let Some(members) = self.members.take() {
            self.runtime.block_on(members.shutdown());
        }
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
        .env_remove("RAFTCASK_CACERT")
        .env_remove("RAFTCASK_CERT")
        .env_remove("RAFTCASK_KEY")
        .env_remove("RAFTCASK_TOKEN")
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
