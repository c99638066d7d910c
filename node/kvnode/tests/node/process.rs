//! Real `kvnode` processes on a private loopback address, driven over gRPC with the kvproto
//! client:
//! - three `kvnode run` processes acknowledge writes; SIGKILL of the
//!   leader's process leaves the other two electing a new leader that takes
//!   writes; SIGKILL of every process and a restart on the same directories
//!   loses no acknowledged write (each read back with its value and version);
//! - `kvnode local --nodes 3` elects a leader and serves every member's
//!   admin port at client port + 200; SIGKILL of the leader's child
//!   (pid from its pid file) is reported by `local`, which keeps the others
//!   running, and they elect a leader and take writes; SIGTERM to `local`
//!   makes it exit 0 with no child left;
//! - SIGKILL of `kvnode local` stops its members too (parent-death signal);
//! - a follower whose wall clock is two days ahead (libfaketime) judges TTLs
//!   exactly like the others: it serves a fresh TTL key and, once cluster
//!   time passed the expiry, agrees the key is gone.
//!
//! Every process a test starts is SIGKILLed by a drop guard, so a failing
//! test leaves none behind; on failure the guard prints the tail of every
//! member's log.

use std::collections::BTreeMap;
use std::fs::File;
use std::net::{IpAddr, SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::free_port;
use crate::common::private_loopback;
use kvnode::server::convert::detail_of;
use kvproto::kv::v1::kv_client::KvClient;
use kvproto::kv::v1::{
    Consistency, GetRequest, GetResponse, PutRequest, error_detail, put_response,
};
use rustix::process::{Pid, Signal};
use tonic::transport::Channel;

/// Deadline for a condition (leader elected, process exited, ...).
const DEADLINE: Duration = Duration::from_secs(60);
/// Deadline of one RPC (a dead member must not hang the test).
const RPC_TIMEOUT: Duration = Duration::from_secs(5);
/// Pause between polls.
const POLL: Duration = Duration::from_millis(100);
/// Where Debian's libfaketime lives.
const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";
/// Lines of each member's log printed when a test fails.
const LOG_TAIL_LINES: usize = 30;

fn kvnode_exe() -> &'static str {
    env!("CARGO_BIN_EXE_kvnode")
}

/// One member's addresses and directory.
#[derive(Debug, Clone)]
struct Member {
    id: u64,
    client: SocketAddr,
    peer: SocketAddr,
    admin: SocketAddr,
    dir: PathBuf,
}

fn layout(root: &Path, count: u64) -> Vec<Member> {
    let host = private_loopback();
    (1..=count)
        .map(|id| Member {
            id,
            client: SocketAddr::from((host, free_port(host))),
            peer: SocketAddr::from((host, free_port(host))),
            admin: SocketAddr::from((host, free_port(host))),
            dir: root.join(format!("node{id}")),
        })
        .collect()
}

fn signal_pid(pid: u32, signal: Signal) -> rustix::io::Result<()> {
    let pid = i32::try_from(pid)
        .ok()
        .and_then(Pid::from_raw)
        .expect("a valid pid");
    rustix::process::kill_process(pid, signal)
}

/// Whether `pid` is a live process (a zombie — exited, not yet reaped by
/// whoever inherited it — counts as gone).
fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the parenthesised command name.
        Ok(stat) => !matches!(
            stat.rsplit_once(')')
                .map(|(_, rest)| rest.trim_start().chars().next()),
            Some(Some('Z' | 'X'))
        ),
        Err(_) => false,
    }
}

/// Prints the last lines of a log file (for a failing test).
fn print_tail(label: &str, path: &Path) {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    eprintln!(
        "---- {label}: {} (last {LOG_TAIL_LINES} lines)",
        path.display()
    );
    for line in &lines[lines.len().saturating_sub(LOG_TAIL_LINES)..] {
        eprintln!("{line}");
    }
}

/// Processes started by a test, SIGKILLed and reaped on drop; plus pids of
/// grandchildren (members started by `kvnode local`), SIGKILLed too if
/// still alive and still running kvnode.
#[derive(Debug, Default)]
struct Guard {
    children: Vec<(String, Child)>,
    grandchildren: Vec<u32>,
    logs: Vec<(String, PathBuf)>,
}

impl Drop for Guard {
    fn drop(&mut self) {
        if std::thread::panicking() {
            for (label, path) in &self.logs {
                print_tail(label, path);
            }
        }
        for (_, child) in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
        for pid in &self.grandchildren {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            if String::from_utf8_lossy(&cmdline).contains("kvnode") {
                let _ = signal_pid(*pid, Signal::KILL);
            }
        }
    }
}

/// A cluster of `kvnode run` processes.
#[derive(Debug)]
struct RunCluster {
    members: Vec<Member>,
    initial_cluster: String,
    /// Index = member id - 1; `None` when not running.
    processes: Vec<Option<Child>>,
    guard: Guard,
}

impl RunCluster {
    fn new(members: Vec<Member>) -> RunCluster {
        let initial_cluster = members
            .iter()
            .map(|m| format!("{}={}/{}", m.id, m.client, m.peer))
            .collect::<Vec<_>>()
            .join(",");
        let mut guard = Guard::default();
        for m in &members {
            std::fs::create_dir_all(&m.dir).unwrap();
            guard
                .logs
                .push((format!("member {}", m.id), m.dir.join("kvnode.log")));
        }
        let processes = members.iter().map(|_| None).collect();
        RunCluster {
            members,
            initial_cluster,
            processes,
            guard,
        }
    }

    /// Starts member `id` (`kvnode run`, output appended to its log), with
    /// extra environment variables.
    fn start(&mut self, id: u64, env: &[(&str, &str)]) {
        let m = &self.members[id as usize - 1];
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(m.dir.join("kvnode.log"))
            .unwrap();
        let mut command = Command::new(kvnode_exe());
        command
            .args(["run", "--id", &id.to_string(), "--data-dir"])
            .arg(&m.dir)
            .args(["--client-addr", &m.client.to_string()])
            .args(["--peer-addr", &m.peer.to_string()])
            .args(["--admin-addr", &m.admin.to_string()])
            .args(["--initial-cluster", &self.initial_cluster])
            .env("RUST_LOG", "info,openraft=warn")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log);
        if id == 1 {
            command.arg("--bootstrap");
        }
        let child = command.spawn().expect("start kvnode run");
        assert!(
            self.processes[id as usize - 1].is_none(),
            "member {id} started twice"
        );
        self.processes[id as usize - 1] = Some(child);
    }

    /// SIGKILLs member `id` and reaps it.
    fn kill(&mut self, id: u64) {
        let mut child = self.processes[id as usize - 1]
            .take()
            .expect("member is running");
        child.kill().unwrap();
        child.wait().unwrap();
    }

    fn client_addrs(&self, ids: &[u64]) -> Vec<(u64, SocketAddr)> {
        ids.iter()
            .map(|id| (*id, self.members[*id as usize - 1].client))
            .collect()
    }
}

impl Drop for RunCluster {
    fn drop(&mut self) {
        for (id, process) in self.processes.iter_mut().enumerate() {
            if let Some(child) = process.take() {
                self.guard
                    .children
                    .push((format!("member {}", id + 1), child));
            }
        }
    }
}

async fn connect(addr: SocketAddr) -> Option<KvClient<Channel>> {
    let endpoint = Channel::from_shared(format!("http://{addr}"))
        .ok()?
        .connect_timeout(RPC_TIMEOUT)
        .timeout(RPC_TIMEOUT);
    endpoint.connect().await.ok().map(KvClient::new)
}

async fn get(
    addr: SocketAddr,
    key: &str,
    consistency: Consistency,
    min_index: u64,
) -> Result<GetResponse, String> {
    let mut client = connect(addr).await.ok_or("connect failed")?;
    client
        .get(GetRequest {
            key: key.as_bytes().to_vec().into(),
            consistency: consistency as i32,
            min_index,
        })
        .await
        .map(|r| r.into_inner())
        .map_err(|status| format!("{status:?}"))
}

/// Polls the members until every one that answers names the same leader,
/// which is one of them and answers itself; returns its id.
async fn wait_for_leader(members: &[(u64, SocketAddr)], not: Option<u64>) -> u64 {
    let started = Instant::now();
    let mut last = Vec::new();
    while started.elapsed() < DEADLINE {
        let mut seen = Vec::new();
        for (id, addr) in members {
            if let Ok(response) = get(*addr, "probe", Consistency::Stale, 0).await {
                let leader = response.header.map(|h| h.leader_id).unwrap_or(0);
                seen.push((*id, leader));
            }
        }
        if let Some((_, leader)) = seen.first()
            && *leader != 0
            && Some(*leader) != not
            && seen.len() == members.len()
            && seen.iter().all(|(_, l)| l == leader)
        {
            return *leader;
        }
        last = seen;
        tokio::time::sleep(POLL).await;
    }
    panic!(
        "no agreed leader among {members:?} (other than {not:?}) within {DEADLINE:?}; last seen (member, leader): {last:?}"
    );
}

/// An acknowledged write: key, value, version and the applied index the
/// answer carried.
#[derive(Debug, Clone)]
struct Acked {
    key: String,
    value: String,
    version: u64,
    applied_index: u64,
}

/// Puts `key` until a leader acknowledges it, following NotLeader details
/// and re-polling for a leader after other errors; bounded by [`DEADLINE`].
async fn put_acked(
    members: &[(u64, SocketAddr)],
    leader: &mut u64,
    key: &str,
    value: &str,
    ttl_ms: u64,
) -> Acked {
    let started = Instant::now();
    let mut errors = Vec::new();
    while started.elapsed() < DEADLINE {
        let addr = members
            .iter()
            .find(|(id, _)| id == leader)
            .map(|(_, addr)| *addr);
        let result = match addr {
            Some(addr) => match connect(addr).await {
                Some(mut client) => client
                    .put(PutRequest {
                        key: key.as_bytes().to_vec().into(),
                        value: value.as_bytes().to_vec().into(),
                        ttl_ms,
                        ..Default::default()
                    })
                    .await
                    .map(|r| r.into_inner()),
                None => Err(tonic::Status::unavailable("connect failed")),
            },
            None => Err(tonic::Status::unavailable("leader not among the members")),
        };
        match result {
            Ok(response) => {
                let Some(put_response::Outcome::Seq(version)) = response.outcome else {
                    panic!("unconditional put of {key} answered {response:?}")
                };
                let applied_index = response.header.expect("a header").applied_index;
                return Acked {
                    key: key.to_string(),
                    value: value.to_string(),
                    version,
                    applied_index,
                };
            }
            Err(status) => {
                if let Some(error_detail::Detail::NotLeader(not_leader)) =
                    detail_of(&status).and_then(|d| d.detail)
                    && not_leader.leader_id != 0
                {
                    *leader = not_leader.leader_id;
                } else {
                    tokio::time::sleep(POLL).await;
                    *leader = wait_for_leader(members, None).await;
                }
                errors.push(format!("{}: {}", status.code(), status.message()));
            }
        }
    }
    panic!("put {key} not acknowledged within {DEADLINE:?}; errors: {errors:?}");
}

/// Every acknowledged write is readable with its value and version: a
/// linearizable read on the leader and a stale read (at least the highest
/// acknowledged index) on every member.
async fn check_acked(members: &[(u64, SocketAddr)], leader: u64, acked: &[Acked]) {
    let min_index = acked.iter().map(|a| a.applied_index).max().unwrap_or(0);
    let leader_addr = members.iter().find(|(id, _)| *id == leader).unwrap().1;
    for (id, addr) in members {
        for write in acked {
            let (consistency, min_index) = if *addr == leader_addr {
                (Consistency::Linearizable, 0)
            } else {
                (Consistency::Stale, min_index)
            };
            let got = get(*addr, &write.key, consistency, min_index)
                .await
                .unwrap_or_else(|err| panic!("member {id}: get {}: {err}", write.key));
            assert!(
                got.found,
                "member {id}: acknowledged write {write:?} is missing"
            );
            assert_eq!(
                (got.value.as_ref(), got.seq),
                (write.value.as_bytes(), write.version),
                "member {id}: {write:?}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_of_the_leader_and_of_everyone_loses_no_acknowledged_write() {
    let root = tempfile::tempdir().unwrap();
    let mut cluster = RunCluster::new(layout(root.path(), 3));
    for id in 1..=3 {
        cluster.start(id, &[]);
    }
    let all = cluster.client_addrs(&[1, 2, 3]);
    let mut leader = wait_for_leader(&all, None).await;
    let mut acked = Vec::new();
    for i in 0..20 {
        acked.push(
            put_acked(
                &all,
                &mut leader,
                &format!("before{i:02}"),
                &format!("v{i}"),
                0,
            )
            .await,
        );
    }

    // SIGKILL the leader: the other two elect a new one and take writes.
    let old_leader = leader;
    cluster.kill(old_leader);
    let survivors: Vec<u64> = (1..=3).filter(|id| *id != old_leader).collect();
    let rest = cluster.client_addrs(&survivors);
    leader = wait_for_leader(&rest, Some(old_leader)).await;
    assert_ne!(leader, old_leader);
    for i in 0..20 {
        acked.push(
            put_acked(
                &rest,
                &mut leader,
                &format!("after{i:02}"),
                &format!("w{i}"),
                0,
            )
            .await,
        );
    }
    check_acked(&rest, leader, &acked).await;

    // SIGKILL everyone, restart on the same directories (member 1 passes
    // --bootstrap again, which must not re-initialize).
    for id in survivors {
        cluster.kill(id);
    }
    for id in 1..=3 {
        cluster.start(id, &[]);
    }
    let leader = wait_for_leader(&all, None).await;
    check_acked(&all, leader, &acked).await;
}

/// A port base in a high range whose client, peer, admin and Redis ports
/// for `nodes` members are all free right now (bind-tested).
fn free_port_base(host: IpAddr, nodes: u16) -> u16 {
    let seed = u64::from(std::process::id()) ^ u64::from(free_port(host));
    for attempt in 0..200u64 {
        let base = 20_000 + ((seed + attempt * 7919) % 30_000) as u16;
        let ports: Vec<u16> = (0..nodes)
            .flat_map(|i| [base + i, base + i + 100, base + i + 200, base + i + 400])
            .collect();
        let bound: Vec<_> = ports
            .iter()
            .map_while(|p| TcpListener::bind((host, *p)).ok())
            .collect();
        if bound.len() == ports.len() {
            return base;
        }
    }
    panic!("no free port base found in 200 attempts");
}

/// A bare HTTP/1.0 GET (the admin port speaks plain HTTP); the whole
/// answer, bounded by [`RPC_TIMEOUT`].
async fn http_get(addr: SocketAddr, path: &str) -> String {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(addr).await?;
        stream
            .write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
            .await?;
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).await?;
        Ok::<_, std::io::Error>(String::from_utf8_lossy(&answer).into_owned())
    };
    match tokio::time::timeout(RPC_TIMEOUT, exchange).await {
        Ok(Ok(answer)) => answer,
        Ok(Err(err)) => format!("error: {err}"),
        Err(_) => "error: timed out".to_string(),
    }
}

fn read_pid(path: &Path) -> Option<u32> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kvnode_local_survives_the_leader_s_death_and_stops_on_sigterm() {
    let root = tempfile::tempdir().unwrap();
    let host = private_loopback();
    let base = free_port_base(host, 3);
    let mut guard = Guard::default();
    for id in 1..=3 {
        guard.logs.push((
            format!("member {id}"),
            root.path().join(format!("node{id}/kvnode.log")),
        ));
    }
    let out_path = root.path().join("local.out");
    let err_path = root.path().join("local.err");
    guard.logs.push(("local stdout".into(), out_path.clone()));
    guard.logs.push(("local stderr".into(), err_path.clone()));
    let local = Command::new(kvnode_exe())
        .args(["local", "--nodes", "3", "--dir"])
        .arg(root.path())
        .args(["--host", &host.to_string()])
        .args(["--port-base", &base.to_string()])
        .env("RUST_LOG", "info,openraft=warn")
        .stdin(Stdio::null())
        .stdout(File::create(&out_path).unwrap())
        .stderr(File::create(&err_path).unwrap())
        .spawn()
        .expect("start kvnode local");
    let local_pid = local.id();
    guard.children.push(("kvnode local".into(), local));

    // The members' pids, from the pid files `local` writes.
    let started = Instant::now();
    let pids: BTreeMap<u64, u32> = loop {
        let pids: BTreeMap<u64, u32> = (1..=3)
            .filter_map(|id| {
                read_pid(&root.path().join(format!("node{id}/kvnode.pid"))).map(|pid| (id, pid))
            })
            .collect();
        if pids.len() == 3 {
            break pids;
        }
        assert!(
            started.elapsed() < DEADLINE,
            "pid files not written: {pids:?}"
        );
        tokio::time::sleep(POLL).await;
    };
    guard.grandchildren.extend(pids.values());
    let table = std::fs::read_to_string(&out_path).unwrap();
    for (id, pid) in &pids {
        assert!(
            table.contains(&format!("{host}:{}", base + *id as u16 - 1))
                && table.contains(&pid.to_string()),
            "the table lacks member {id}'s client address or pid {pid}:\n{table}"
        );
    }

    let all: Vec<(u64, SocketAddr)> = (1..=3u64)
        .map(|id| (id, SocketAddr::from((host, base + id as u16 - 1))))
        .collect();
    let mut leader = wait_for_leader(&all, None).await;
    let first = put_acked(&all, &mut leader, "first", "1", 0).await;
    // Each member serves its admin port at client port + 200.
    for id in 1..=3u16 {
        let answer = http_get(SocketAddr::from((host, base + id - 1 + 200)), "/health").await;
        assert!(
            answer.starts_with("HTTP/1.")
                && answer.contains(" 200 OK")
                && answer.contains(&format!("ok member {id}")),
            "member {id}'s admin /health answered {answer:?}"
        );
    }

    // Kill the leader's process by pid: `local` reports it and keeps the
    // other two, which elect a leader and take writes.
    let old_leader = leader;
    signal_pid(pids[&old_leader], Signal::KILL).unwrap();
    let rest: Vec<(u64, SocketAddr)> = all
        .iter()
        .copied()
        .filter(|(id, _)| *id != old_leader)
        .collect();
    leader = wait_for_leader(&rest, Some(old_leader)).await;
    let second = put_acked(&rest, &mut leader, "second", "2", 0).await;
    check_acked(&rest, leader, &[first, second]).await;
    let report = format!(
        "member {old_leader} (pid {}) exited on its own",
        pids[&old_leader]
    );
    let started = Instant::now();
    while !std::fs::read_to_string(&err_path)
        .unwrap()
        .contains(&report)
    {
        assert!(
            started.elapsed() < DEADLINE,
            "`local` did not report {report:?}"
        );
        tokio::time::sleep(POLL).await;
    }
    assert!(alive(local_pid), "`local` exited after one member died");

    // SIGTERM stops `local` and every member; it exits 0.
    signal_pid(local_pid, Signal::TERM).unwrap();
    let (_, mut local) = guard.children.pop().unwrap();
    let started = Instant::now();
    let status = loop {
        if let Some(status) = local.try_wait().unwrap() {
            break status;
        }
        assert!(
            started.elapsed() < DEADLINE,
            "`local` did not exit after SIGTERM"
        );
        tokio::time::sleep(POLL).await;
    };
    assert!(status.success(), "`local` exited with {status}");
    for (id, pid) in &pids {
        assert!(!alive(*pid), "member {id} (pid {pid}) outlived `local`");
        if *id != old_leader {
            // Stopped by SIGTERM (a graceful shutdown), not killed.
            let log =
                std::fs::read_to_string(root.path().join(format!("node{id}/kvnode.log"))).unwrap();
            assert!(
                log.contains("shutting down"),
                "member {id} did not shut down gracefully"
            );
        }
        assert!(
            !root.path().join(format!("node{id}/kvnode.pid")).exists(),
            "member {id}'s pid file was left behind"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_of_kvnode_local_stop_when_it_is_killed() {
    // SIGKILL gives `local` no chance to stop its members: the kernel's
    // parent-death signal must.
    let root = tempfile::tempdir().unwrap();
    let host = private_loopback();
    let base = free_port_base(host, 1);
    let mut guard = Guard::default();
    let log = root.path().join("node1/kvnode.log");
    guard.logs.push(("member 1".into(), log.clone()));
    let local = Command::new(kvnode_exe())
        .args(["local", "--nodes", "1", "--dir"])
        .arg(root.path())
        .args(["--host", &host.to_string()])
        .args(["--port-base", &base.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start kvnode local");
    guard.children.push(("kvnode local".into(), local));
    let pid_file = root.path().join("node1/kvnode.pid");
    let started = Instant::now();
    let pid = loop {
        if let Some(pid) = read_pid(&pid_file) {
            break pid;
        }
        assert!(started.elapsed() < DEADLINE, "pid file not written");
        tokio::time::sleep(POLL).await;
    };
    guard.grandchildren.push(pid);
    let member = [(1, SocketAddr::from((host, base)))];
    assert_eq!(wait_for_leader(&member, None).await, 1);

    let (_, mut local) = guard.children.pop().unwrap();
    local.kill().unwrap();
    local.wait().unwrap();
    let started = Instant::now();
    while alive(pid) {
        assert!(
            started.elapsed() < DEADLINE,
            "member (pid {pid}) outlived the killed `local`"
        );
        tokio::time::sleep(POLL).await;
    }
    let log = std::fs::read_to_string(&log).unwrap();
    assert!(
        log.contains("shutting down"),
        "the member was not stopped by SIGTERM"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_with_a_wrong_wall_clock_judges_ttl_by_cluster_time() {
    assert!(
        Path::new(LIBFAKETIME).exists(),
        "this test needs libfaketime ({LIBFAKETIME}): install the Debian packages \
         `libfaketime` and `faketime` (test.sh does so when run as root)"
    );
    let faked: [(&str, &str); 3] = [
        ("LD_PRELOAD", LIBFAKETIME),
        ("FAKETIME", "+2d"),
        ("DONT_FAKE_MONOTONIC", "1"),
    ];
    // The fault must be real: a program under the same environment sees a
    // wall clock about two days ahead.
    let date = Command::new("date")
        .arg("+%s")
        .envs(faked)
        .output()
        .expect("run date");
    let faked_now: u64 = String::from_utf8_lossy(&date.stdout)
        .trim()
        .parse()
        .expect("date +%s");
    let real_now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    assert!(
        faked_now > real_now + 47 * 3600,
        "libfaketime did not shift the clock: {faked_now} vs {real_now}"
    );

    let root = tempfile::tempdir().unwrap();
    let mut cluster = RunCluster::new(layout(root.path(), 3));
    // Members 1 and 2 elect a leader first, so member 3 (two days ahead)
    // joins as a follower.
    cluster.start(1, &[]);
    cluster.start(2, &[]);
    let pair = cluster.client_addrs(&[1, 2]);
    let mut leader = wait_for_leader(&pair, None).await;
    cluster.start(3, &faked);
    let all = cluster.client_addrs(&[1, 2, 3]);
    assert_eq!(
        wait_for_leader(&all, None).await,
        leader,
        "the leader changed"
    );

    /// Long enough that the reads right after the put land before expiry
    /// even on a slow machine (tick entries advance cluster time without
    /// client writes).
    const TTL_MS: u64 = 8_000;
    let written = put_acked(&all, &mut leader, "ttl", "soon gone", TTL_MS).await;
    for (id, addr) in &all {
        let got = get(*addr, "ttl", Consistency::Stale, written.applied_index)
            .await
            .unwrap_or_else(|err| panic!("member {id}: {err}"));
        assert!(got.found, "member {id} does not see a fresh TTL key");
        assert!(
            got.ttl_ms_left > 0 && got.ttl_ms_left <= TTL_MS,
            "member {id}: ttl left {}",
            got.ttl_ms_left
        );
    }

    // Let the TTL pass, then write once more: the new entry's cluster time
    // is past the expiry. (Tick entries would advance cluster time too; the
    // write keeps this test about wall clocks, not about ticks, which have
    // their own test.)
    tokio::time::sleep(Duration::from_millis(TTL_MS + 500)).await;
    let later = put_acked(&all, &mut leader, "later", "x", 0).await;
    for (id, addr) in &all {
        let got = get(*addr, "ttl", Consistency::Stale, later.applied_index)
            .await
            .unwrap_or_else(|err| panic!("member {id}: {err}"));
        assert!(
            !got.found,
            "member {id} still serves the expired key: {got:?}"
        );
    }
    let leader_addr = all.iter().find(|(id, _)| *id == leader).unwrap().1;
    let got = get(leader_addr, "ttl", Consistency::Linearizable, 0)
        .await
        .unwrap();
    assert!(!got.found, "the leader still serves the expired key");
}
