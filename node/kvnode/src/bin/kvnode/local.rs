//! `kvnode local`: a cluster of N real `kvnode run` child processes on one
//! host (DESIGN §6).
//!
//! Node i (from 1) gets client port `port-base + i - 1`, peer port that
//! `+ 100`, admin port that `+ 200`, etcd port that `+ 300`, Redis port
//! that `+ 400` (DESIGN §6), and data directory `DIR/node<i>`, where
//! its output goes to `kvnode.log` (appended) and its process id to
//! `kvnode.pid`. Node 1 passes `--bootstrap`, which never re-initializes an
//! existing directory, so running again on the same `DIR` restarts the same
//! cluster. A child that exits on its own is reported in one line and the
//! others keep running (killing the leader's process leaves a working
//! cluster); SIGINT or SIGTERM stops every child (SIGTERM, a bounded wait,
//! then SIGKILL) and exits 0. Only when every child has exited does `local`
//! exit on its own, with an error. If `local` itself dies (even by SIGKILL),
//! the kernel sends every member SIGTERM ([`follow_parent`]).

use std::fs::{self, File, OpenOptions};
use std::io::Write as _;
use std::net::{IpAddr, SocketAddr};
use std::os::unix::process::ExitStatusExt as _;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use rustix::process::{Pid, Signal};
use tokio::signal::unix::{SignalKind, signal};

/// Most members `kvnode local` runs (a local cluster is for trying things
/// out; the port layout leaves room for at most 100).
pub const LOCAL_NODES_MAX: u16 = 9;
/// Peer port = client port + this.
pub const PEER_PORT_OFFSET: u16 = 100;
/// Admin port = client port + this.
pub const ADMIN_PORT_OFFSET: u16 = 200;
/// etcd v3 port = client port + this.
pub const ETCD_PORT_OFFSET: u16 = 300;
/// Redis (RESP) port = client port + this (the highest offset: the port
/// layout is checked against it).
pub const REDIS_PORT_OFFSET: u16 = 400;
/// How often the children are checked for having exited.
const CHILD_POLL: Duration = Duration::from_millis(200);
/// How long the children get to stop after SIGTERM before SIGKILL (a
/// member's own shutdown grace is 5 s).
const STOP_DEADLINE: Duration = Duration::from_secs(10);
/// A child's log file inside its data directory.
pub const LOG_FILE: &str = "kvnode.log";
/// A child's pid file inside its data directory (removed once it exited).
pub const PID_FILE: &str = "kvnode.pid";
/// Environment variable that tells a member the pid of the `kvnode local`
/// that started it (see [`follow_parent`]).
pub const PARENT_PID_ENV: &str = "KVNODE_LOCAL_PARENT_PID";

/// In a member started by `kvnode local` (it sets [`PARENT_PID_ENV`]): asks
/// the kernel for SIGTERM when `local` dies, even by SIGKILL, so no member
/// outlives it. Elsewhere does nothing.
pub fn follow_parent() -> anyhow::Result<()> {
    let Ok(parent) = std::env::var(PARENT_PID_ENV) else {
        return Ok(());
    };
    let parent: i32 = parent
        .parse()
        .with_context(|| format!("{PARENT_PID_ENV}={parent:?}: expected a pid"))?;
    rustix::process::set_parent_process_death_signal(Some(Signal::TERM))
        .context("asking for a signal when `kvnode local` exits")?;
    // `local` may have died before the request: then no signal would come.
    if rustix::process::getppid().map(Pid::as_raw_pid) != Some(parent) {
        bail!("the `kvnode local` (pid {parent}) that started this member is gone");
    }
    Ok(())
}

/// Flags of `kvnode local`.
#[derive(Debug, clap::Args)]
pub struct LocalArgs {
    /// Number of members (1 to 9).
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..=i64::from(LOCAL_NODES_MAX)))]
    nodes: u16,
    /// Parent of the members' data directories (`DIR/node<i>`).
    #[arg(long, default_value = "./data")]
    dir: PathBuf,
    /// Address every member binds.
    #[arg(long, default_value = "127.0.0.1")]
    host: IpAddr,
    /// Client port of node 1; node i uses port-base + i - 1 (peer +100,
    /// admin +200, etcd +300, Redis +400).
    #[arg(long, default_value_t = 7001, value_parser = clap::value_parser!(u16).range(1..))]
    port_base: u16,
    /// Runtime threads of each member (`kvnode run --worker-threads`);
    /// default: the CPU cores divided among the members, at least 1 (the
    /// members share one machine; more threads than cores only adds
    /// context switches).
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..=i64::from(crate::WORKER_THREADS_MAX)))]
    worker_threads: Option<u16>,
}

/// Runtime threads per member: `--worker-threads`, else the cores divided
/// among `nodes` members, at least 1.
fn worker_threads(args: &LocalArgs) -> u16 {
    args.worker_threads.unwrap_or_else(|| {
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        u16::try_from(cores / usize::from(args.nodes)).map_or(u16::MAX, |n| n.max(1))
    })
}

/// One member's place in the layout.
#[derive(Debug, Clone)]
struct Member {
    id: u64,
    client: SocketAddr,
    peer: SocketAddr,
    admin: SocketAddr,
    etcd: SocketAddr,
    redis: SocketAddr,
    data_dir: PathBuf,
}

/// The members' addresses and directories, or an error naming the flag
/// whose value does not fit.
fn layout(args: &LocalArgs) -> anyhow::Result<Vec<Member>> {
    let highest =
        u32::from(args.port_base) + u32::from(args.nodes) - 1 + u32::from(REDIS_PORT_OFFSET);
    if highest > u32::from(u16::MAX) {
        bail!(
            "--port-base {} with --nodes {}: node {}'s Redis port would be {highest}, above {}",
            args.port_base,
            args.nodes,
            args.nodes,
            u16::MAX
        );
    }
    Ok((0..args.nodes)
        .map(|i| {
            let client_port = args.port_base + i;
            Member {
                id: u64::from(i) + 1,
                client: SocketAddr::new(args.host, client_port),
                peer: SocketAddr::new(args.host, client_port + PEER_PORT_OFFSET),
                admin: SocketAddr::new(args.host, client_port + ADMIN_PORT_OFFSET),
                etcd: SocketAddr::new(args.host, client_port + ETCD_PORT_OFFSET),
                redis: SocketAddr::new(args.host, client_port + REDIS_PORT_OFFSET),
                data_dir: args.dir.join(format!("node{}", i + 1)),
            }
        })
        .collect())
}

/// A running child and where it belongs.
#[derive(Debug)]
struct Slot {
    member: Member,
    /// `None` once it exited and was reaped.
    child: Option<Child>,
}

/// The children; SIGKILLs every one still running when dropped, so an
/// error in `local` itself never leaves members behind.
#[derive(Debug, Default)]
struct Children {
    slots: Vec<Slot>,
}

fn send(child: &Child, signal: Signal) {
    if let Some(pid) = i32::try_from(child.id()).ok().and_then(Pid::from_raw) {
        // ESRCH: it exited in between (not reaped yet); nothing to do.
        let _ = rustix::process::kill_process(pid, signal);
    }
}

fn describe(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit code {code}"),
        (None, Some(signal)) => format!("signal {signal}"),
        _ => status.to_string(),
    }
}

impl Children {
    fn spawn(
        &mut self,
        exe: &std::path::Path,
        members: &[Member],
        worker_threads: u16,
    ) -> anyhow::Result<()> {
        let initial_cluster = members
            .iter()
            .map(|m| format!("{}={}/{}", m.id, m.client, m.peer))
            .collect::<Vec<_>>()
            .join(",");
        for member in members {
            fs::create_dir_all(&member.data_dir)
                .with_context(|| format!("creating {}", member.data_dir.display()))?;
            let log_path = member.data_dir.join(LOG_FILE);
            let log = OpenOptions::new()
                .create(true)
                .append(true)
                .open(&log_path)
                .with_context(|| format!("opening {}", log_path.display()))?;
            let log_err = log
                .try_clone()
                .with_context(|| format!("opening {}", log_path.display()))?;
            let mut command = Command::new(exe);
            command
                .arg("run")
                .arg("--id")
                .arg(member.id.to_string())
                .arg("--data-dir")
                .arg(&member.data_dir)
                .arg("--client-addr")
                .arg(member.client.to_string())
                .arg("--peer-addr")
                .arg(member.peer.to_string())
                .arg("--admin-addr")
                .arg(member.admin.to_string())
                .arg("--redis-addr")
                .arg(member.redis.to_string())
                .arg("--etcd-addr")
                .arg(member.etcd.to_string())
                .arg("--initial-cluster")
                .arg(&initial_cluster)
                .arg("--worker-threads")
                .arg(worker_threads.to_string())
                .env(PARENT_PID_ENV, std::process::id().to_string())
                .stdin(Stdio::null())
                .stdout(log)
                .stderr(log_err);
            if member.id == 1 {
                command.arg("--bootstrap");
            }
            let child = command
                .spawn()
                .with_context(|| format!("starting member {}", member.id))?;
            let pid_path = member.data_dir.join(PID_FILE);
            let pid = child.id();
            self.slots.push(Slot {
                member: member.clone(),
                child: Some(child),
            });
            write_pid_file(&pid_path, pid)?;
        }
        Ok(())
    }

    fn print_table(&self) {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(
            out,
            "{:>3}  {:<21}  {:<21}  {:<21}  {:<21}  {:<21}  {:>8}  data dir",
            "id", "client", "peer", "admin", "etcd", "redis", "pid"
        );
        for slot in &self.slots {
            let m = &slot.member;
            let pid = slot.child.as_ref().map(Child::id).unwrap_or(0);
            let _ = writeln!(
                out,
                "{:>3}  {:<21}  {:<21}  {:<21}  {:<21}  {:<21}  {:>8}  {}",
                m.id,
                m.client.to_string(),
                m.peer.to_string(),
                m.admin.to_string(),
                m.etcd.to_string(),
                m.redis.to_string(),
                pid,
                m.data_dir.display()
            );
        }
        let _ = writeln!(
            out,
            "each member logs to <data dir>/{LOG_FILE} and its pid is in <data dir>/{PID_FILE}; \
             Ctrl-C or SIGTERM stops them all"
        );
        let endpoints: Vec<String> = self
            .slots
            .iter()
            .map(|slot| slot.member.client.to_string())
            .collect();
        let _ = writeln!(
            out,
            "try: KVCTL_ENDPOINTS={} kvctl status",
            endpoints.join(",")
        );
        let etcd_endpoints: Vec<String> = self
            .slots
            .iter()
            .map(|slot| slot.member.etcd.to_string())
            .collect();
        let _ = writeln!(
            out,
            "try: ETCDCTL_API=3 etcdctl --endpoints {} member list (any member takes writes)",
            etcd_endpoints.join(",")
        );
        if let Some(first) = self.slots.first() {
            let redis = first.member.redis;
            let _ = writeln!(
                out,
                "try: redis-cli -h {} -p {} (each member's Redis port is in the table; any \
                 member takes writes)",
                redis.ip(),
                redis.port()
            );
        }
        let _ = out.flush();
    }

    /// Reaps children that exited on their own, reporting each in one line.
    fn reap(&mut self) {
        for slot in &mut self.slots {
            let Some(child) = slot.child.as_mut() else {
                continue;
            };
            match child.try_wait() {
                Ok(Some(status)) => {
                    let m = &slot.member;
                    tracing::warn!(
                        "member {} (pid {}) exited on its own ({}); the others keep running; log: {}",
                        m.id,
                        child.id(),
                        describe(status),
                        m.data_dir.join(LOG_FILE).display()
                    );
                    let _ = fs::remove_file(m.data_dir.join(PID_FILE));
                    slot.child = None;
                }
                Ok(None) => {}
                Err(err) => {
                    tracing::warn!(member = slot.member.id, error = %err, "waiting on a member")
                }
            }
        }
    }

    fn running(&self) -> usize {
        self.slots.iter().filter(|s| s.child.is_some()).count()
    }

    /// SIGTERM to every child, a wait bounded by [`STOP_DEADLINE`], then
    /// SIGKILL to whoever is left.
    async fn stop(&mut self) {
        for slot in &self.slots {
            if let Some(child) = &slot.child {
                send(child, Signal::TERM);
            }
        }
        let started = Instant::now();
        while started.elapsed() < STOP_DEADLINE {
            for slot in &mut self.slots {
                if let Some(child) = slot.child.as_mut()
                    && let Ok(Some(status)) = child.try_wait()
                {
                    tracing::info!(
                        "member {} (pid {}) stopped ({})",
                        slot.member.id,
                        child.id(),
                        describe(status)
                    );
                    let _ = fs::remove_file(slot.member.data_dir.join(PID_FILE));
                    slot.child = None;
                }
            }
            if self.running() == 0 {
                return;
            }
            tokio::time::sleep(CHILD_POLL).await;
        }
        for slot in &mut self.slots {
            if let Some(mut child) = slot.child.take() {
                tracing::warn!(
                    "member {} (pid {}) did not stop within {:?}; killing it",
                    slot.member.id,
                    child.id(),
                    STOP_DEADLINE
                );
                let _ = child.kill();
                let _ = child.wait();
                let _ = fs::remove_file(slot.member.data_dir.join(PID_FILE));
            }
        }
    }
}

impl Drop for Children {
    fn drop(&mut self) {
        for slot in &mut self.slots {
            if let Some(mut child) = slot.child.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

fn write_pid_file(path: &std::path::Path, pid: u32) -> anyhow::Result<()> {
    let mut file = File::create(path).with_context(|| format!("writing {}", path.display()))?;
    writeln!(file, "{pid}").with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

/// Runs `kvnode local` until SIGINT / SIGTERM (exit 0) or until every
/// member has exited (an error).
pub async fn run(args: LocalArgs) -> anyhow::Result<()> {
    let members = layout(&args)?;
    let exe = std::env::current_exe().context("finding the kvnode executable")?;
    // Signal handlers first: a SIGTERM that arrives while the children
    // start must still stop them.
    let mut interrupt = signal(SignalKind::interrupt())?;
    let mut terminate = signal(SignalKind::terminate())?;
    let mut children = Children::default();
    children.spawn(&exe, &members, worker_threads(&args))?;
    children.print_table();
    let mut poll = tokio::time::interval(CHILD_POLL);
    loop {
        tokio::select! {
            _ = interrupt.recv() => break,
            _ = terminate.recv() => break,
            _ = poll.tick() => {
                children.reap();
                if children.running() == 0 {
                    bail!("every member exited; see the logs under {}", args.dir.display());
                }
            }
        }
    }
    tracing::info!("stopping {} member(s)", children.running());
    children.stop().await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(nodes: u16, port_base: u16) -> LocalArgs {
        LocalArgs {
            nodes,
            dir: PathBuf::from("d"),
            host: "127.0.0.1".parse().unwrap(),
            port_base,
            worker_threads: None,
        }
    }

    #[test]
    fn members_share_the_cores() {
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        assert_eq!(
            usize::from(worker_threads(&args(1, 7001))),
            cores.min(usize::from(u16::MAX))
        );
        assert_eq!(worker_threads(&args(9, 7001)), (cores / 9).max(1) as u16);
        let given = LocalArgs {
            worker_threads: Some(3),
            ..args(3, 7001)
        };
        assert_eq!(worker_threads(&given), 3);
    }

    #[test]
    fn layout_follows_the_port_plan() {
        let members = layout(&args(3, 7001)).unwrap();
        let ports: Vec<_> = members
            .iter()
            .map(|m| {
                (
                    m.id,
                    m.client.port(),
                    m.peer.port(),
                    m.admin.port(),
                    m.etcd.port(),
                    m.redis.port(),
                )
            })
            .collect();
        assert_eq!(
            ports,
            vec![
                (1, 7001, 7101, 7201, 7301, 7401),
                (2, 7002, 7102, 7202, 7302, 7402),
                (3, 7003, 7103, 7203, 7303, 7403)
            ]
        );
        assert_eq!(members[2].data_dir, PathBuf::from("d/node3"));
    }

    #[test]
    fn ports_past_the_top_are_refused() {
        assert!(layout(&args(3, 65_133)).is_ok());
        let err = layout(&args(3, 65_134)).unwrap_err().to_string();
        assert!(
            err.contains("--port-base 65134") && err.contains("65536"),
            "{err}"
        );
    }
}
