//! The cluster under test: N real `kvnode run` child processes, member i
//! on its own loopback address 127.0.0.(10+i) (client port
//! [`CLIENT_PORT`], peer port [`PEER_PORT`], Redis (RESP) port
//! [`REDIS_PORT`], etcd v3 port [`ETCD_PORT`]), data in `DIR/node<i>/data`,
//! output appended to `DIR/node<i>/kvnode.log`.
//!
//! Faults on processes go through here: SIGKILL and restart (same data
//! directory, same addresses), SIGSTOP / SIGCONT, and the wall-clock offset
//! of a member started under libfaketime.
//!
//! Membership changes work on **slots**: slot i is the address
//! 127.0.0.(10+i), and the harness (nemeses, firewall, endpoints) names
//! members by slot. Slot i first hosts kvnode member id i; spare slots
//! ([`Cluster::reserve_spare_slots`]) host nobody until
//! [`Cluster::start_in_slot`] starts a fresh member there under a NEW
//! kvnode id (kvnode refuses an old id again) with its own data directory;
//! [`Cluster::retire`] stops a removed member and frees its slot. Client
//! endpoints list every slot, so they stay valid as members rotate. Every child is killed by its pid
//! when the [`Cluster`] is dropped, and each asks the kernel for SIGTERM if
//! the thread that started it dies.

use std::fs::{self, OpenOptions};
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use anyhow::{Context as _, bail};
use rustix::process::{Pid, Signal};

/// Port of every member's client service (each member has its own address).
pub const CLIENT_PORT: u16 = 7001;
/// Port of every member's peer (Raft) service.
pub const PEER_PORT: u16 = 7101;
/// Port of every member's Redis (RESP) front end (`kvnode run
/// --redis-addr`), on the member's own address like the others (7201 is the
/// no-root mode's peer proxy).
pub const REDIS_PORT: u16 = 7301;
/// Port of every member's etcd v3 gRPC front end (`kvnode run
/// --etcd-addr`), on the member's own address like the others.
pub const ETCD_PORT: u16 = 7401;
/// Most members a run starts (addresses 127.0.0.11 ..= 127.0.0.19).
pub const NODES_MAX: u64 = 9;
/// Where Debian's libfaketime lives (package `libfaketime`).
pub const LIBFAKETIME_PATH: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";
/// How often (seconds) a member under libfaketime re-reads its offset file;
/// re-reading it on every clock call would cost too much CPU on two cores.
const FAKETIME_CACHE_SECONDS: u32 = 1;
/// kvnode's variable naming the process that started it: the member asks for
/// SIGTERM when that parent goes away (kvnode's `follow_parent`).
const PARENT_PID_ENV: &str = "KVNODE_LOCAL_PARENT_PID";

/// The loopback address of member `id` (from 1).
pub fn node_ip(id: u64) -> Ipv4Addr {
    let last = u8::try_from(10 + id.min(NODES_MAX)).unwrap_or(u8::MAX);
    Ipv4Addr::new(127, 0, 0, last)
}

/// The client address (`ip:port`) of member `id`.
pub fn client_addr(id: u64) -> String {
    format!("{}:{CLIENT_PORT}", node_ip(id))
}

/// The peer address (`ip:port`) of member `id`.
pub fn peer_addr(id: u64) -> String {
    format!("{}:{PEER_PORT}", node_ip(id))
}

/// The Redis (RESP) address (`ip:port`) of member `id`.
pub fn redis_addr(id: u64) -> String {
    format!("{}:{REDIS_PORT}", node_ip(id))
}

/// The etcd v3 address (`ip:port`) of member `id`.
pub fn etcd_addr(id: u64) -> String {
    format!("{}:{ETCD_PORT}", node_ip(id))
}

/// How to start the cluster.
#[derive(Debug, Clone)]
pub struct ClusterConfig {
    /// The `kvnode` executable.
    pub kvnode_bin: PathBuf,
    /// The run's directory; members get `node<i>/` under it.
    pub dir: PathBuf,
    /// Number of members (1 ..= [`NODES_MAX`]).
    pub nodes: u64,
    /// Start every member under libfaketime, with a per-member offset file
    /// (for the clock nemesis).
    pub faketime: bool,
    /// Extra environment of every member (e.g. kvnode's test knobs).
    pub env: Vec<(String, String)>,
}

/// One slot's process state.
#[derive(Debug)]
struct Member {
    /// The slot (address 127.0.0.(10+id)).
    id: u64,
    /// The kvnode member id the slot hosts now.
    raft_id: u64,
    /// A spare slot hosts no member (no process, not in `ids()`).
    spare: bool,
    child: Option<Child>,
    paused: bool,
}

/// The running members.
#[derive(Debug)]
pub struct Cluster {
    config: ClusterConfig,
    members: Vec<Member>,
    /// The kvnode id the next [`Cluster::start_in_slot`] uses.
    next_raft_id: u64,
    /// Members advertise their peer proxy ([`super::proxy`]) as their
    /// peer address (no-root mode).
    behind_proxies: bool,
}

impl Cluster {
    /// Starts every member (node 1 bootstraps the cluster).
    pub fn start(config: ClusterConfig) -> anyhow::Result<Self> {
        Self::start_with(config, false)
    }

    /// Like [`Cluster::start`], but every member advertises its peer proxy
    /// ([`super::proxy::proxy_addr`]) as its peer address, so Raft traffic
    /// goes through the proxies (the no-root fallback).
    pub fn start_behind_proxies(config: ClusterConfig) -> anyhow::Result<Self> {
        Self::start_with(config, true)
    }

    /// The peer address member `id` is known by to the others.
    pub fn advertised_peer_addr(&self, id: u64) -> String {
        if self.behind_proxies {
            super::proxy::proxy_addr(id)
        } else {
            peer_addr(id)
        }
    }

    fn start_with(config: ClusterConfig, behind_proxies: bool) -> anyhow::Result<Self> {
        if config.nodes == 0 || config.nodes > NODES_MAX {
            bail!(
                "nodes = {}: must be 1 ..= NODES_MAX ({NODES_MAX})",
                config.nodes
            );
        }
        if !config.kvnode_bin.is_file() {
            bail!(
                "the kvnode binary {} does not exist: build it (`cargo build -p kvnode`) or \
                 pass --kvnode-bin / KVNODE_BIN",
                config.kvnode_bin.display()
            );
        }
        if config.faketime && !Path::new(LIBFAKETIME_PATH).exists() {
            bail!(
                "the clock nemesis needs libfaketime at {LIBFAKETIME_PATH} \
                 (apt-get install libfaketime)"
            );
        }
        let mut cluster = Self {
            members: (1..=config.nodes)
                .map(|id| Member {
                    id,
                    raft_id: id,
                    spare: false,
                    child: None,
                    paused: false,
                })
                .collect(),
            next_raft_id: config.nodes + 1,
            behind_proxies,
            config,
        };
        for id in 1..=cluster.config.nodes {
            let dir = cluster.node_dir(id);
            fs::create_dir_all(dir.join("data"))
                .with_context(|| format!("creating {}", dir.display()))?;
            if cluster.config.faketime {
                cluster.set_clock_offset(id, 0)?;
            }
            cluster.restart(id)?;
        }
        Ok(cluster)
    }

    /// Member ids (slots hosting a member), ascending.
    pub fn ids(&self) -> Vec<u64> {
        self.members
            .iter()
            .filter(|m| !m.spare)
            .map(|m| m.id)
            .collect()
    }

    /// Every slot's client address (a spare slot refuses connections until
    /// a member starts there).
    pub fn client_addrs(&self) -> Vec<String> {
        self.members.iter().map(|m| client_addr(m.id)).collect()
    }

    /// Every slot's Redis address, in slot order like
    /// [`Cluster::client_addrs`].
    pub fn redis_addrs(&self) -> Vec<String> {
        self.members.iter().map(|m| redis_addr(m.id)).collect()
    }

    /// Every slot's etcd v3 address, in slot order like
    /// [`Cluster::client_addrs`].
    pub fn etcd_addrs(&self) -> Vec<String> {
        self.members.iter().map(|m| etcd_addr(m.id)).collect()
    }

    /// Adds `count` spare slots after the last one (at most [`NODES_MAX`]
    /// slots in all), for membership changes. Call before taking
    /// [`Cluster::client_addrs`] for the workload.
    pub fn reserve_spare_slots(&mut self, count: u64) -> anyhow::Result<()> {
        let slots = self.members.len() as u64;
        if slots + count > NODES_MAX {
            bail!("{slots} members and {count} spare slots exceed NODES_MAX ({NODES_MAX}) slots");
        }
        for id in slots + 1..=slots + count {
            fs::create_dir_all(self.node_dir(id))
                .with_context(|| format!("creating {}", self.node_dir(id).display()))?;
            if self.config.faketime {
                self.set_clock_offset(id, 0)?;
            }
            self.members.push(Member {
                id,
                raft_id: 0,
                spare: true,
                child: None,
                paused: false,
            });
        }
        self.next_raft_id = self.next_raft_id.max(slots + count + 1);
        Ok(())
    }

    /// A spare slot, if any (the lowest).
    pub fn spare_slot(&self) -> Option<u64> {
        self.members.iter().find(|m| m.spare).map(|m| m.id)
    }

    /// The kvnode member id slot `id` hosts.
    pub fn raft_id(&self, id: u64) -> Option<u64> {
        self.member(id).filter(|m| !m.spare).map(|m| m.raft_id)
    }

    /// Starts a new kvnode member (a fresh id and data directory, only
    /// itself as initial member, no bootstrap) in spare slot `id`, ready to
    /// be added as a learner. Returns its kvnode id.
    pub fn start_in_slot(&mut self, id: u64) -> anyhow::Result<u64> {
        let raft_id = self.next_raft_id;
        let member = self.member_mut(id)?;
        if !member.spare {
            bail!("slot {id} hosts member {} already", member.raft_id);
        }
        member.spare = false;
        member.raft_id = raft_id;
        self.next_raft_id += 1;
        let data = self.data_dir(id);
        fs::create_dir_all(&data).with_context(|| format!("creating {}", data.display()))?;
        self.restart(id)?;
        Ok(raft_id)
    }

    /// Stops the member in slot `id` (removed from the cluster) and frees
    /// the slot; its data directory stays for the report.
    pub fn retire(&mut self, id: u64) -> anyhow::Result<()> {
        self.resume(id)?;
        self.kill(id)?;
        self.member_mut(id)?.spare = true;
        Ok(())
    }

    /// The member whose client address is `addr`.
    pub fn id_of_client_addr(&self, addr: &str) -> Option<u64> {
        self.members
            .iter()
            .map(|m| m.id)
            .find(|&id| client_addr(id) == addr.trim_start_matches("http://"))
    }

    /// Whether member `id`'s process is running (not killed).
    pub fn is_running(&self, id: u64) -> bool {
        self.member(id).is_some_and(|m| m.child.is_some())
    }

    /// The members whose process exited without being killed by us.
    pub fn exited_on_their_own(&mut self) -> Vec<(u64, String)> {
        let mut exited = Vec::new();
        for member in &mut self.members {
            if let Some(child) = member.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                exited.push((member.id, status.to_string()));
                member.child = None;
            }
        }
        exited
    }

    /// Starts member `id` if it is not running (same data and addresses).
    pub fn restart(&mut self, id: u64) -> anyhow::Result<()> {
        if self.is_running(id) {
            return Ok(());
        }
        if self.member(id).is_some_and(|m| m.spare) {
            bail!("slot {id} is spare: no member to start");
        }
        let child = self.spawn(id)?;
        let member = self.member_mut(id)?;
        member.child = Some(child);
        member.paused = false;
        Ok(())
    }

    /// SIGKILLs member `id` and reaps it (a no-op if it is not running).
    pub fn kill(&mut self, id: u64) -> anyhow::Result<()> {
        let member = self.member_mut(id)?;
        if let Some(mut child) = member.child.take() {
            kill_child(&mut child);
        }
        member.paused = false;
        Ok(())
    }

    /// SIGSTOPs member `id`.
    pub fn pause(&mut self, id: u64) -> anyhow::Result<()> {
        self.signal(id, Signal::STOP)?;
        self.member_mut(id)?.paused = true;
        Ok(())
    }

    /// SIGCONTs member `id` if paused.
    pub fn resume(&mut self, id: u64) -> anyhow::Result<()> {
        if self.member(id).is_some_and(|m| m.paused) {
            self.signal(id, Signal::CONT)?;
            self.member_mut(id)?.paused = false;
        }
        Ok(())
    }

    /// Sets member `id`'s wall-clock offset (libfaketime reads the file
    /// within [`FAKETIME_CACHE_SECONDS`]); monotonic clocks are not faked.
    pub fn set_clock_offset(&self, id: u64, offset_seconds: i64) -> anyhow::Result<()> {
        if !self.config.faketime {
            bail!("member {id} was not started under libfaketime");
        }
        let path = self.clock_file(id);
        let tmp = path.with_extension("tmp");
        fs::write(&tmp, format!("{offset_seconds:+}\n"))
            .with_context(|| format!("writing {}", tmp.display()))?;
        fs::rename(&tmp, &path).with_context(|| format!("renaming to {}", path.display()))
    }

    /// Resumes every paused member and restarts every stopped one.
    pub fn heal_processes(&mut self) -> anyhow::Result<()> {
        for id in self.ids() {
            self.resume(id)?;
            self.restart(id)?;
        }
        Ok(())
    }

    fn node_dir(&self, id: u64) -> PathBuf {
        self.config.dir.join(format!("node{id}"))
    }

    /// Slot `id`'s data directory for the member it hosts: `data` for the
    /// slot's first member, `data-id<N>` for a later one.
    pub fn data_dir(&self, id: u64) -> PathBuf {
        match self.member(id).map(|m| m.raft_id) {
            Some(raft_id) if raft_id != id => self.node_dir(id).join(format!("data-id{raft_id}")),
            _ => self.node_dir(id).join("data"),
        }
    }

    fn clock_file(&self, id: u64) -> PathBuf {
        self.node_dir(id).join("faketime")
    }

    fn member(&self, id: u64) -> Option<&Member> {
        self.members.iter().find(|m| m.id == id)
    }

    fn member_mut(&mut self, id: u64) -> anyhow::Result<&mut Member> {
        self.members
            .iter_mut()
            .find(|m| m.id == id)
            .with_context(|| format!("no member {id}"))
    }

    fn signal(&self, id: u64, signal: Signal) -> anyhow::Result<()> {
        let pid = self
            .member(id)
            .and_then(|m| m.child.as_ref())
            .and_then(|c| i32::try_from(c.id()).ok())
            .and_then(Pid::from_raw)
            .with_context(|| format!("member {id} is not running"))?;
        rustix::process::kill_process(pid, signal)
            .with_context(|| format!("sending {signal:?} to member {id} (pid {pid:?})"))
    }

    fn spawn(&self, id: u64) -> anyhow::Result<Child> {
        let dir = self.node_dir(id);
        let log_path = dir.join("kvnode.log");
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .with_context(|| format!("opening {}", log_path.display()))?;
        let log_err = log.try_clone()?;
        let raft_id = self.member(id).map_or(id, |m| m.raft_id);
        // A member added later knows only itself; the cluster adds it.
        let initial_cluster = if raft_id == id {
            (1..=self.config.nodes)
                .map(|m| format!("{m}={}/{}", client_addr(m), self.advertised_peer_addr(m)))
                .collect::<Vec<_>>()
                .join(",")
        } else {
            format!(
                "{raft_id}={}/{}",
                client_addr(id),
                self.advertised_peer_addr(id)
            )
        };
        let mut command = Command::new(&self.config.kvnode_bin);
        command
            .arg("run")
            .args(["--id", &raft_id.to_string()])
            .arg("--data-dir")
            .arg(self.data_dir(id))
            .args(["--client-addr", &client_addr(id)])
            .args(["--peer-addr", &peer_addr(id)])
            .args(["--redis-addr", &redis_addr(id)])
            .args(["--etcd-addr", &etcd_addr(id)])
            .args(["--initial-cluster", &initial_cluster])
            .env(PARENT_PID_ENV, std::process::id().to_string())
            .env("RUST_LOG", "info,openraft=warn")
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_err);
        if raft_id == 1 {
            command.arg("--bootstrap");
        }
        command.envs(self.config.env.iter().map(|(k, v)| (k, v)));
        if self.config.faketime {
            command
                .env("LD_PRELOAD", LIBFAKETIME_PATH)
                .env("FAKETIME_TIMESTAMP_FILE", self.clock_file(id))
                .env(
                    "FAKETIME_CACHE_DURATION",
                    FAKETIME_CACHE_SECONDS.to_string(),
                )
                .env("DONT_FAKE_MONOTONIC", "1");
        }
        command
            .spawn()
            .with_context(|| format!("starting member {id}: {}", self.config.kvnode_bin.display()))
    }
}

/// SIGKILLs a child and reaps it.
fn kill_child(child: &mut Child) {
    let _ = child.kill();
    let _ = child.wait();
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for member in &mut self.members {
            if let Some(mut child) = member.child.take() {
                kill_child(&mut child);
            }
        }
    }
}
