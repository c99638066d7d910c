//! Proves that one load loop drives all three contenders: the
//! raftcask-vs-etcd matrix (`kvbench::versus`) against a real single-member
//! etcd (child process on a private loopback address) and an in-process
//! three-member raftcask cluster, driven both natively and through its
//! etcd ports, completes every cell on each with no errors, the order
//! rotates, CPU per operation is measured for the process ids given (this
//! process, which hosts the raftcask members, and etcd's), etcd's leader is
//! found (by its `Status` answer), and an etcd backend pointed at nothing
//! counts every failure (so "no errors" means etcd answered).
//!
//! Needs `etcd` on PATH: panics with a clear message when it is missing.

use std::net::{IpAddr, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kvbench::load::{LoadConfig, OpKind, Progress, ReadTarget, System, etcd_leader, run_system};
use kvbench::versus::{Contender, MatrixConfig, WORKLOADS, run_matrix};
use kvnode::testing::{LocalCluster, private_loopback};
use kvproto::kv::v1::Consistency;

/// How long etcd and the raftcask cluster get to come up.
const READY_DEADLINE: Duration = Duration::from_secs(60);
/// etcd's client port on the test's private address.
const ETCD_CLIENT_PORT: u16 = 2379;
/// etcd's peer port on the test's private address.
const ETCD_PEER_PORT: u16 = 2380;

/// A single-member etcd, killed (and reaped) on drop.
struct Etcd {
    child: Child,
    endpoint: String,
}

impl Drop for Etcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Etcd {
    fn start(ip: IpAddr, dir: &Path) -> Etcd {
        let client = format!("http://{ip}:{ETCD_CLIENT_PORT}");
        let peer = format!("http://{ip}:{ETCD_PEER_PORT}");
        let log = std::fs::File::create(dir.join("etcd.log")).expect("etcd log file");
        let child = Command::new("etcd")
            .arg("--name=t1")
            .arg(format!("--data-dir={}", dir.join("data").display()))
            .arg(format!("--listen-client-urls={client}"))
            .arg(format!("--advertise-client-urls={client}"))
            .arg(format!("--listen-peer-urls={peer}"))
            .arg(format!("--initial-advertise-peer-urls={peer}"))
            .arg(format!("--initial-cluster=t1={peer}"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("etcd log file"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|err| {
                panic!(
                    "this test needs the `etcd` binary on PATH (Debian etcd-server; \
                     deploy/bench/compare-etcd.sh installs it): {err}"
                )
            });
        let etcd = Etcd {
            child,
            endpoint: format!("{ip}:{ETCD_CLIENT_PORT}"),
        };
        let began = Instant::now();
        while TcpStream::connect(&etcd.endpoint).is_err() {
            assert!(
                began.elapsed() < READY_DEADLINE,
                "etcd did not listen on {} within {READY_DEADLINE:?}; see {}",
                etcd.endpoint,
                dir.join("etcd.log").display()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        etcd
    }
}

/// Puts until one succeeds (etcd elects itself shortly after listening).
async fn wait_for_writes(system: System, endpoints: &[String]) {
    let began = Instant::now();
    loop {
        let config = LoadConfig {
            endpoints: endpoints.to_vec(),
            ops: 1,
            duration: Duration::from_secs(10),
            ..LoadConfig::default()
        };
        let report = run_system(config, system, Arc::new(Progress::default()))
            .await
            .expect("valid settings");
        if report.ops_ok == 1 {
            return;
        }
        assert!(
            began.elapsed() < READY_DEADLINE,
            "{system:?} took no write within {READY_DEADLINE:?}: {:?}",
            report.errors
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_matrix_runs_against_etcd_and_raftcask() {
    let dir = tempfile::tempdir().expect("temp dir");
    let etcd = Etcd::start(private_loopback(), dir.path());
    // Every member with an etcd port on its own address (port 0: any free).
    let raftcask = LocalCluster::start_configured(&dir.path().join("raftcask"), 3, |config| {
        config.etcd_addr = Some(std::net::SocketAddr::new(config.client_addr.ip(), 0));
    })
    .await
    .expect("raftcask cluster");
    raftcask
        .wait_for_leader(READY_DEADLINE)
        .await
        .expect("raftcask leader");
    let etcd_endpoints = vec![etcd.endpoint.clone()];
    wait_for_writes(System::Etcd, &etcd_endpoints).await;
    // The one member is the leader; an address that is not etcd is not.
    let nowhere = format!("{}:1", private_loopback());
    assert_eq!(
        etcd_leader(&[nowhere, etcd.endpoint.clone()]).await,
        Ok(Some(etcd.endpoint.clone()))
    );
    wait_for_writes(System::Raftcask, &raftcask.endpoints()).await;
    let raftcask_etcd: Vec<String> = (1..=3)
        .map(|id| {
            let node = raftcask.node(id).expect("a running member");
            node.etcd_addr().expect("an etcd port").to_string()
        })
        .collect();
    wait_for_writes(System::Etcd, &raftcask_etcd).await;

    let matrix = MatrixConfig {
        raftcask: raftcask.endpoints(),
        raftcask_etcd,
        etcd: etcd_endpoints.clone(),
        raftcask_pids: vec![std::process::id()],
        etcd_pids: vec![etcd.child.id()],
        clients: vec![1, 4],
        duration: Duration::from_millis(400),
        connections: 2,
        key_size_bytes: 16,
        key_space: 100,
        seed: 7,
    };
    let cells = run_matrix(&matrix, |_| {}).await.expect("valid matrix");
    assert_eq!(cells.len(), WORKLOADS.len() * 2);
    for cell in &cells {
        for contender in Contender::ALL {
            let summary = cell.summary(contender);
            assert!(
                summary.ops_per_second > 0.0
                    && summary.errors == 0
                    && summary.cpu_us_per_op.is_some(),
                "{} on {}: {summary:?}",
                cell.label(),
                contender.name()
            );
        }
    }
    // The order rotates: each contender runs first in one of three cells.
    let firsts: Vec<Contender> = cells.iter().take(3).map(|c| c.first()).collect();
    for contender in Contender::ALL {
        assert!(firsts.contains(&contender), "{firsts:?}");
    }

    // Gets against an address that is not etcd fail (counted, not hidden),
    // so a get cell with no errors really reached etcd.
    let config = LoadConfig {
        endpoints: vec![format!("{}:1", private_loopback())],
        ops: 3,
        duration: Duration::from_secs(5),
        op: OpKind::Get,
        consistency: Consistency::Stale,
        read_target: ReadTarget::Spread,
        ..LoadConfig::default()
    };
    let report = run_system(config, System::Etcd, Arc::new(Progress::default()))
        .await
        .expect("valid settings");
    assert_eq!(report.ops_ok, 0, "{report:?}");
    assert_eq!(report.errors_total(), 3, "{report:?}");
    raftcask.shutdown().await;
    drop(etcd);
}
