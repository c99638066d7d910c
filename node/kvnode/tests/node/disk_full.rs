//! Disk full and read-only disks, on small mounted data directories (these
//! tests need root to mount; CI runs as root; without root they panic
//! saying so):
//! - watermark (in-process member, tmpfs): once free space is below
//!   `--disk-free-min-bytes`, writes are answered RESOURCE_EXHAUSTED naming
//!   the free bytes and DISK_FREE_MIN_BYTES, linearizable reads are still
//!   served, and writes succeed again once space is freed;
//! - ENOSPC (a real `kvnode run` process, tmpfs, watermark 0): writes run
//!   the filesystem full, the process exits with code 74 and a message
//!   naming ENOSPC; after the filler is deleted, a restart serves every
//!   acknowledged write with its value;
//! - EROFS (a real process, ext4 on a loop device): the filesystem is
//!   forced read-only under the running member (`remount,abort`, what ext4
//!   does on an I/O error with errors=remount-ro), the next write makes the
//!   process exit with code 74 and a message naming the failure; after a
//!   fresh mount, a restart serves every acknowledged write.
//!
//! Every mount is unmounted and every process SIGKILLed by drop guards.

use std::io::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use kvnode::node::disk::{FREE_SPACE_REFRESH, STORAGE_FAILURE_EXIT_CODE, free_bytes};
use kvnode::server::limits::Limits;
use kvproto::kv::v1::{Consistency, GetRequest, error_detail};
use tonic::Code;

use crate::common::free_port;
use crate::common::private_loopback;
use crate::limits::{kv, put_and_get, put_request, single_member, single_member_configured};

/// Deadline of any wait (a leader, an exit, a restart).
const DEADLINE: Duration = Duration::from_secs(60);
/// Pause between polls.
const POLL: Duration = Duration::from_millis(100);
/// Bytes of one filler write.
const FILL_CHUNK: usize = 1024 * 1024;
/// Bytes of one value in the ENOSPC and EROFS tests.
const VALUE_BYTES: usize = 32 * 1024;
/// Writes the ENOSPC test sends at most (far more than fit).
const WRITES_MAX: usize = 4000;

fn require_root() {
    assert!(
        rustix::process::geteuid().is_root(),
        "this test needs root: it mounts a small tmpfs / loop filesystem as the data directory \
         (CI runs the tests as root)"
    );
}

fn run(program: &str, args: &[&str]) {
    let output = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|err| panic!("run {program}: {err} (this test needs {program})"));
    assert!(
        output.status.success(),
        "{program} {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// A small filesystem mounted on a temporary directory, unmounted on drop.
struct Mount {
    /// The mount point.
    point: tempfile::TempDir,
    /// The loop image, if any (in its own temporary directory).
    image: Option<(tempfile::TempDir, PathBuf)>,
    mounted: bool,
}

impl Mount {
    /// A tmpfs of `size` bytes.
    fn tmpfs(size: u64) -> Mount {
        require_root();
        let point = tempfile::tempdir().unwrap();
        let options = format!("size={size}");
        run(
            "mount",
            &[
                "-t",
                "tmpfs",
                "-o",
                &options,
                "tmpfs",
                path_str(point.path()),
            ],
        );
        Mount {
            point,
            image: None,
            mounted: true,
        }
    }

    /// An ext4 filesystem of `size` bytes in a loop image, remounting
    /// read-only on errors.
    fn ext4(size: u64) -> Mount {
        require_root();
        let image_dir = tempfile::tempdir().unwrap();
        let image = image_dir.path().join("fs.img");
        std::fs::File::create(&image)
            .unwrap()
            .set_len(size)
            .unwrap();
        run("mkfs.ext4", &["-q", "-F", path_str(&image)]);
        let mut mount = Mount {
            point: tempfile::tempdir().unwrap(),
            image: Some((image_dir, image)),
            mounted: false,
        };
        mount.mount_image();
        mount
    }

    fn mount_image(&mut self) {
        let (_, image) = self.image.as_ref().expect("an image");
        run(
            "mount",
            &[
                "-o",
                "loop,errors=remount-ro",
                path_str(image),
                path_str(self.point.path()),
            ],
        );
        self.mounted = true;
    }

    fn path(&self) -> &Path {
        self.point.path()
    }

    /// Forces the (ext4) filesystem read-only under its open files.
    fn abort(&self) {
        run("mount", &["-o", "remount,abort", path_str(self.path())]);
    }

    fn unmount(&mut self) {
        if self.mounted {
            let point = path_str(self.point.path()).to_string();
            let ok = Command::new("umount")
                .arg(&point)
                .status()
                .is_ok_and(|s| s.success());
            if !ok {
                eprintln!("umount {point} failed; unmounting lazily");
                let _ = Command::new("umount").args(["-l", &point]).status();
            }
            self.mounted = false;
        }
    }

    /// Unmounts and mounts the image again (a fresh, writable mount).
    fn remount_image(&mut self) {
        self.unmount();
        self.mount_image();
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        self.unmount();
    }
}

fn path_str(path: &Path) -> &str {
    path.to_str().expect("a UTF-8 temporary path")
}

/// Writes a filler file in `dir` until the filesystem has fewer than
/// `free_below` bytes free (or is full).
fn fill(dir: &Path, free_below: u64) -> PathBuf {
    let path = dir.join("filler");
    let mut file = std::fs::File::create(&path).unwrap();
    let chunk = vec![0x5a; FILL_CHUNK];
    let chunks_max = free_bytes(dir).unwrap() as usize / FILL_CHUNK + 2;
    for _ in 0..chunks_max {
        let free = free_bytes(dir).unwrap();
        if free < free_below {
            break;
        }
        let len = (free - free_below / 2).min(FILL_CHUNK as u64) as usize;
        if file.write_all(&chunk[..len.max(1)]).is_err() {
            break;
        }
        let _ = file.flush();
    }
    assert!(
        free_bytes(dir).unwrap() < free_below,
        "could not fill {} below {free_below} free bytes",
        dir.display()
    );
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn below_the_watermark_writes_are_refused_and_reads_served() {
    const SIZE: u64 = 96 * 1024 * 1024;
    const WATERMARK: u64 = 32 * 1024 * 1024;
    let mount = Mount::tmpfs(SIZE);
    let data = mount.path().join("data");
    let node = single_member(
        &data,
        Limits {
            disk_free_min_bytes: WATERMARK,
            ..Limits::default()
        },
    )
    .await;
    let addr = node.client_addr();
    put_and_get(addr, "before", "watermark").await;

    let filler = fill(mount.path(), WATERMARK / 2);
    tokio::time::sleep(FREE_SPACE_REFRESH * 2).await;
    let mut client = kv(addr).await.unwrap();
    let status = client
        .put(put_request("below", b"x".to_vec()))
        .await
        .expect_err("a write below the watermark must be refused");
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert!(
        status.message().contains("DISK_FREE_MIN_BYTES")
            && status.message().contains(&WATERMARK.to_string())
            && status.message().contains("bytes free"),
        "the error names the free bytes and the watermark: {status:?}"
    );
    assert!(
        matches!(
            kvnode::server::convert::detail_of(&status).and_then(|d| d.detail),
            Some(error_detail::Detail::LimitExceeded(l))
                if l.limit == kvnode::node::disk::WATERMARK_LIMIT && l.limit_value == WATERMARK
        ),
        "{status:?}"
    );
    let got = client
        .get(GetRequest {
            key: b"before".to_vec().into(),
            consistency: Consistency::Linearizable as i32,
            min_index: 0,
        })
        .await
        .expect("reads are served below the watermark")
        .into_inner();
    assert_eq!(got.value.as_ref(), b"watermark");

    std::fs::remove_file(&filler).unwrap();
    put_and_get(addr, "after", "space freed").await;
    node.shutdown(Duration::from_secs(5)).await;
}

/// The etcd port below the watermark: a put is refused with etcd's
/// "database space exceeded", but a lease revoke goes through (a front
/// end's renewals and revokes are essential writes, as the native port's
/// are: refusing them would keep or expire leases against their owners'
/// will).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn below_the_watermark_the_etcd_port_still_revokes_leases() {
    use kvproto::etcd::etcdserverpb::kv_client::KvClient as EtcdKv;
    use kvproto::etcd::etcdserverpb::lease_client::LeaseClient;
    use kvproto::etcd::etcdserverpb::{LeaseGrantRequest, LeaseRevokeRequest, PutRequest};
    const SIZE: u64 = 96 * 1024 * 1024;
    const WATERMARK: u64 = 32 * 1024 * 1024;
    let mount = Mount::tmpfs(SIZE);
    let data = mount.path().join("data");
    let node = single_member_configured(
        &data,
        Limits {
            disk_free_min_bytes: WATERMARK,
            ..Limits::default()
        },
        |config| config.etcd_addr = Some(SocketAddr::new(config.client_addr.ip(), 0)),
    )
    .await;
    let etcd = node.etcd_addr().expect("an etcd port");
    let channel = tonic::transport::Channel::from_shared(format!("http://{etcd}"))
        .unwrap()
        .timeout(Duration::from_secs(15))
        .connect()
        .await
        .expect("connect to the etcd port");
    let mut leases = LeaseClient::new(channel.clone());
    let mut kv = EtcdKv::new(channel);
    let grant = |id| LeaseGrantRequest { ttl: 60, id };
    leases.lease_grant(grant(7)).await.expect("grant lease 7");

    let filler = fill(mount.path(), WATERMARK / 2);
    tokio::time::sleep(FREE_SPACE_REFRESH * 2).await;
    let status = kv
        .put(PutRequest {
            key: b"below".to_vec().into(),
            value: b"x".to_vec().into(),
            ..PutRequest::default()
        })
        .await
        .expect_err("a put below the watermark must be refused");
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    leases
        .lease_revoke(LeaseRevokeRequest { id: 7 })
        .await
        .expect("a revoke below the watermark goes through");
    std::fs::remove_file(&filler).unwrap();
    node.shutdown(Duration::from_secs(5)).await;
}

/// One `kvnode run` member (single-node cluster) on `data`, its log in
/// `log`; SIGKILLed and reaped on drop.
struct Process {
    data: PathBuf,
    log: PathBuf,
    client: SocketAddr,
    peer: SocketAddr,
    child: Option<Child>,
}

impl Process {
    fn new(data: PathBuf, log: PathBuf) -> Process {
        let host = private_loopback();
        Process {
            data,
            log,
            client: SocketAddr::from((host, free_port(host))),
            peer: SocketAddr::from((host, free_port(host))),
            child: None,
        }
    }

    fn start(&mut self) {
        assert!(self.child.is_none(), "started twice");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_kvnode"))
            .args(["run", "--id", "1", "--bootstrap", "--data-dir"])
            .arg(&self.data)
            .args(["--client-addr", &self.client.to_string()])
            .args(["--peer-addr", &self.peer.to_string()])
            .args([
                "--initial-cluster",
                &format!("1={}/{}", self.client, self.peer),
            ])
            .args(["--disk-free-min-bytes", "0"])
            .env("RUST_LOG", "info,openraft=warn")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start kvnode run");
        self.child = Some(child);
    }

    /// Waits until the process exits on its own.
    async fn wait_exit(&mut self) -> ExitStatus {
        let started = Instant::now();
        let child = self.child.as_mut().expect("running");
        while started.elapsed() < DEADLINE {
            if let Some(status) = child.try_wait().unwrap() {
                self.child = None;
                return status;
            }
            tokio::time::sleep(POLL).await;
        }
        panic!(
            "kvnode did not exit within {DEADLINE:?} after its storage failed; log:\n{}",
            self.log_text()
        );
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        if std::thread::panicking() {
            eprintln!(
                "---- kvnode log {}:\n{}",
                self.log.display(),
                self.log_text()
            );
        }
    }
}

fn value(i: usize) -> Vec<u8> {
    let mut value = format!("value {i} ").into_bytes();
    value.resize(VALUE_BYTES, b'0' + (i % 10) as u8);
    value
}

/// Puts `key-{i}` for i from `from` until a put fails or `count` were
/// acknowledged; returns the acknowledged indexes and the first failure.
async fn put_until_failure(
    addr: SocketAddr,
    from: usize,
    count: usize,
) -> (Vec<usize>, Option<tonic::Status>) {
    let mut client = kv(addr).await.unwrap();
    let mut acked = Vec::new();
    for i in from..from + count {
        match client.put(put_request(&format!("key-{i}"), value(i))).await {
            Ok(_) => acked.push(i),
            Err(status) => return (acked, Some(status)),
        }
    }
    (acked, None)
}

/// Reads every acknowledged key back (linearizable) with its value.
async fn assert_all_there(addr: SocketAddr, acked: &[usize]) {
    let mut client = kv(addr).await.unwrap();
    for i in acked {
        let got = client
            .get(GetRequest {
                key: format!("key-{i}").into_bytes().into(),
                consistency: Consistency::Linearizable as i32,
                min_index: 0,
            })
            .await
            .unwrap_or_else(|s| panic!("read key-{i} after the restart: {s:?}"))
            .into_inner();
        assert!(got.found, "acknowledged key-{i} is lost");
        assert!(
            got.value.as_ref() == value(*i).as_slice(),
            "key-{i} has another value"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enospc_stops_the_member_and_a_restart_loses_nothing() {
    const SIZE: u64 = 48 * 1024 * 1024;
    let logs = tempfile::tempdir().unwrap();
    let mount = Mount::tmpfs(SIZE);
    let mut member = Process::new(mount.path().join("data"), logs.path().join("kvnode.log"));
    member.start();
    put_and_get(member.client, "before", "enospc").await;
    let mut acked = Vec::new();
    let (first, failure) = put_until_failure(member.client, 0, 20).await;
    assert!(failure.is_none(), "writes before the fill: {failure:?}");
    acked.extend(first);

    let filler = fill(mount.path(), 4 * 1024 * 1024);
    let (more, failure) = put_until_failure(member.client, 20, WRITES_MAX).await;
    acked.extend(more);
    let failure = failure.expect("the filesystem never filled up");
    eprintln!(
        "{} writes acknowledged; the first failure: {failure:?}",
        acked.len()
    );
    let status = member.wait_exit().await;
    assert_eq!(
        status.code(),
        Some(STORAGE_FAILURE_EXIT_CODE),
        "exit status {status:?}; log:\n{}",
        member.log_text()
    );
    let log = member.log_text();
    for line in log.lines().filter(|line| line.contains("stopped")) {
        eprintln!("kvnode: {line}");
    }
    assert!(
        log.contains("ENOSPC") && log.contains("member 1 stopped"),
        "the log says the disk is full:\n{log}"
    );

    std::fs::remove_file(&filler).unwrap();
    member.start();
    put_and_get(member.client, "after", "space freed").await;
    assert_all_there(member.client, &acked).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn erofs_stops_the_member_and_a_restart_loses_nothing() {
    const SIZE: u64 = 64 * 1024 * 1024;
    let logs = tempfile::tempdir().unwrap();
    let mut mount = Mount::ext4(SIZE);
    let mut member = Process::new(mount.path().join("data"), logs.path().join("kvnode.log"));
    member.start();
    put_and_get(member.client, "before", "erofs").await;
    let (acked, failure) = put_until_failure(member.client, 0, 50).await;
    assert!(failure.is_none(), "writes before the abort: {failure:?}");

    mount.abort();
    let (more, failure) = put_until_failure(member.client, 50, 10).await;
    assert!(
        more.is_empty(),
        "writes acknowledged on a read-only filesystem: {more:?}"
    );
    assert!(
        failure.is_some(),
        "no write failed on a read-only filesystem"
    );
    let status = member.wait_exit().await;
    assert_eq!(
        status.code(),
        Some(STORAGE_FAILURE_EXIT_CODE),
        "exit status {status:?}; log:\n{}",
        member.log_text()
    );
    let log = member.log_text();
    for line in log.lines().filter(|line| line.contains("stopped")) {
        eprintln!("kvnode: {line}");
    }
    assert!(
        log.contains("member 1 stopped")
            && (log.contains("EROFS") || log.contains("storage failed")),
        "the log says the storage failed:\n{log}"
    );

    mount.remount_image();
    member.start();
    put_and_get(member.client, "after", "writable again").await;
    assert_all_there(member.client, &acked).await;
}
