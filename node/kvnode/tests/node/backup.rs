//! Backup and restore. A three-node in-process cluster (small segments, so
//! the snapshot holds many sealed files and an active prefix) takes
//! a leader change, overwrites and deletes, then a writer keeps putting fresh keys while a
//! backup is streamed from the leader (`SaveSnapshot`, build_new) into an
//! archive with `backup::ArchiveWriter`. The archive is restored with
//! `backup::restore` (what `kvnode restore` calls) into three new data
//! directories on new addresses, which start as a new three-member cluster
//! without bootstrapping: every key acknowledged before the backup began is
//! read back (linearizably, from the new leader) with its value, deleted
//! keys stay deleted, the new cluster has a new cluster id and takes writes.
//! A corrupted archive (one flipped byte in a file's contents) and a
//! truncated one are refused before anything is written, and a non-empty
//! data directory is refused.
//!
//! Also the mini-cluster helpers `merges` uses (members on given
//! directories, configured per member).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use bitcask::Options;
use kvnode::raft::watch::MetricsWatch;
use kvnode::snapshot::backup::{ArchiveWriter, BackupError, RestoreOptions, restore};
use kvnode::{Listeners, Node, NodeConfig, NodeInfo, StateMachineOptions};
use kvproto::cluster::v1::cluster_client::ClusterClient;
use kvproto::cluster::v1::{SaveSnapshotRequest, StatusRequest, save_snapshot_response};
use kvproto::kv::v1::kv_client::KvClient;
use kvproto::kv::v1::{Consistency, DeleteRequest, GetRequest, PutRequest, put_response};
use tokio::net::TcpListener;
use tonic::transport::Channel;

use crate::harness::{Cluster, DEADLINE, POLL, SHUTDOWN_GRACE};

/// Engine segment size of every member: small, so the backup holds many
/// sealed files.
pub const SEGMENT_SIZE_BYTES: u64 = 16 * 1024;
/// Attempts of one write or read against a cluster before the test fails.
pub const ATTEMPTS_MAX: usize = 50;
/// Keys the preload overwrites.
const PRELOAD_KEYS: usize = 50;
/// Puts of the preload.
const PRELOAD_PUTS: usize = 200;
/// Keys the background writer must have acknowledged before the backup
/// starts (so the backup is taken under load).
const LOAD_ACKED_BEFORE_BACKUP_MIN: usize = 30;
/// Upper bound on the background writer's puts.
const LOAD_PUTS_MAX: usize = 100_000;

/// State-machine options with small segments.
pub fn small_segments() -> StateMachineOptions {
    StateMachineOptions {
        engine: Options {
            segment_size_bytes: SEGMENT_SIZE_BYTES,
            ..Options::default()
        },
        ..StateMachineOptions::default()
    }
}

/// Running members of a cluster the test started on directories it chose.
pub struct Members {
    pub nodes: BTreeMap<u64, Node>,
}

/// Binds a client and a peer listener per member on private loopback
/// addresses; returns them and the membership naming them.
pub async fn bind_members(
    count: u64,
) -> (
    BTreeMap<u64, (TcpListener, TcpListener)>,
    BTreeMap<u64, NodeInfo>,
) {
    let mut listeners = BTreeMap::new();
    for id in 1..=count {
        let host = crate::common::private_loopback();
        let client = TcpListener::bind((host, 0)).await.expect("bind client");
        let peer = TcpListener::bind((host, 0)).await.expect("bind peer");
        listeners.insert(id, (client, peer));
    }
    let initial = listeners
        .iter()
        .map(|(id, (client, peer))| {
            (
                *id,
                NodeInfo {
                    client_addr: client.local_addr().unwrap().to_string(),
                    peer_addr: peer.local_addr().unwrap().to_string(),
                },
            )
        })
        .collect();
    (listeners, initial)
}

impl Members {
    /// Starts a member per listener pair on `dirs[id]`; `configure` adjusts
    /// each member's configuration (bootstrap, policies, options).
    pub async fn start(
        listeners: BTreeMap<u64, (TcpListener, TcpListener)>,
        initial: &BTreeMap<u64, NodeInfo>,
        dirs: &BTreeMap<u64, PathBuf>,
        configure: impl Fn(u64, &mut NodeConfig),
    ) -> Members {
        crate::harness::init_logs();
        let mut nodes = BTreeMap::new();
        for (id, (client, peer)) in listeners {
            let mut config = NodeConfig::new(
                id,
                &dirs[&id],
                client.local_addr().unwrap(),
                peer.local_addr().unwrap(),
                initial.clone(),
            );
            configure(id, &mut config);
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
            nodes.insert(id, node);
        }
        Members { nodes }
    }

    /// Waits until every member names the same leader; returns it.
    pub async fn leader(&self) -> u64 {
        let start = Instant::now();
        loop {
            let seen: Vec<Option<u64>> = self
                .nodes
                .values()
                .map(|n| n.raft().metrics().borrow().current_leader)
                .collect();
            if let Some(Some(leader)) = seen.first()
                && seen.iter().all(|l| *l == Some(*leader))
                && self.nodes.contains_key(leader)
            {
                return *leader;
            }
            assert!(
                start.elapsed() < DEADLINE,
                "no agreed leader in time: {seen:?}"
            );
            tokio::time::sleep(POLL).await;
        }
    }

    /// A kv client on member `id`.
    pub async fn kv(&self, id: u64) -> KvClient<Channel> {
        KvClient::connect(format!("http://{}", self.nodes[&id].client_addr()))
            .await
            .unwrap_or_else(|err| panic!("connect to member {id}: {err}"))
    }

    /// Puts through the leader, retrying refusals (bounded); returns the
    /// version.
    pub async fn put(&self, key: &[u8], value: &[u8], ttl_ms: u64) -> u64 {
        let mut last = String::new();
        for _ in 0..ATTEMPTS_MAX {
            let leader = self.leader().await;
            let reply = self
                .kv(leader)
                .await
                .put(PutRequest {
                    key: key.to_vec().into(),
                    value: value.to_vec().into(),
                    ttl_ms,
                    ..Default::default()
                })
                .await;
            match reply.map(|r| r.into_inner().outcome) {
                Ok(Some(put_response::Outcome::Seq(version))) => return version,
                Ok(other) => panic!("put: {other:?}"),
                Err(status) => last = format!("{status:?}"),
            }
            tokio::time::sleep(POLL).await;
        }
        panic!("put refused {ATTEMPTS_MAX} times; last: {last}");
    }

    /// Deletes through the leader (bounded retries).
    pub async fn delete(&self, key: &[u8]) {
        let mut last = String::new();
        for _ in 0..ATTEMPTS_MAX {
            let leader = self.leader().await;
            let reply = self
                .kv(leader)
                .await
                .delete(DeleteRequest {
                    key: key.to_vec().into(),
                    ..Default::default()
                })
                .await;
            match reply {
                Ok(_) => return,
                Err(status) => last = format!("{status:?}"),
            }
            tokio::time::sleep(POLL).await;
        }
        panic!("delete refused {ATTEMPTS_MAX} times; last: {last}");
    }

    /// A linearizable read on the leader: `Some(value)` or `None`.
    pub async fn get(&self, key: &[u8]) -> Option<Vec<u8>> {
        let mut last = String::new();
        for _ in 0..ATTEMPTS_MAX {
            let leader = self.leader().await;
            let reply = self
                .kv(leader)
                .await
                .get(GetRequest {
                    key: key.to_vec().into(),
                    consistency: Consistency::Linearizable as i32,
                    min_index: 0,
                })
                .await;
            match reply {
                Ok(reply) => {
                    let reply = reply.into_inner();
                    return reply.found.then(|| reply.value.to_vec());
                }
                Err(status) => last = format!("{status:?}"),
            }
            tokio::time::sleep(POLL).await;
        }
        panic!("get refused {ATTEMPTS_MAX} times; last: {last}");
    }

    /// Waits until every member has applied the leader's last log index.
    pub async fn wait_applied_equal(&self) -> u64 {
        let start = Instant::now();
        loop {
            let leader = self.leader().await;
            let last = self.nodes[&leader].raft().metrics().borrow().last_log_index;
            let applied: Vec<Option<u64>> = self
                .nodes
                .values()
                .map(|n| n.state_machine().applied().0.map(|l| l.index))
                .collect();
            if let Some(last) = last
                && applied.iter().all(|a| *a == Some(last))
            {
                return last;
            }
            assert!(
                start.elapsed() < DEADLINE,
                "applied {applied:?} did not reach {last:?} in time"
            );
            tokio::time::sleep(POLL).await;
        }
    }

    /// Stops every member.
    pub async fn shutdown(self) {
        for (_, node) in self.nodes {
            node.shutdown(SHUTDOWN_GRACE).await;
        }
    }
}

/// A key and its value.
type KeyValue = (Vec<u8>, Vec<u8>);

fn key(i: usize) -> Vec<u8> {
    format!("pre{:03}", i % PRELOAD_KEYS).into_bytes()
}

fn value(i: usize) -> Vec<u8> {
    let mut v = format!("value {i} ").into_bytes();
    v.extend((0..200 + (i * 31) % 400).map(|j| b'a' + ((i + j) % 26) as u8));
    v
}

/// Saves the member's snapshot through `SaveSnapshot` into an archive file.
async fn save_backup(client_addr: std::net::SocketAddr, path: &Path) -> (u64, u64) {
    let mut cluster = ClusterClient::connect(format!("http://{client_addr}"))
        .await
        .expect("connect cluster service");
    let mut stream = cluster
        .save_snapshot(SaveSnapshotRequest { build_new: true })
        .await
        .expect("SaveSnapshot")
        .into_inner();
    let first = stream
        .message()
        .await
        .expect("first message")
        .expect("a manifest");
    let Some(save_snapshot_response::Part::Manifest(manifest)) = first.part else {
        panic!("the first message is not the manifest: {first:?}");
    };
    let header = manifest.header.expect("header");
    let file = std::fs::File::create(path).expect("create archive");
    let mut writer =
        ArchiveWriter::new(std::io::BufWriter::new(file), &manifest.encoded).expect("manifest");
    assert_eq!(writer.manifest().files.len(), manifest.files.len());
    let mut chunks = 0usize;
    while let Some(message) = stream.message().await.expect("stream") {
        match message.part {
            Some(save_snapshot_response::Part::Chunk(chunk)) => {
                writer
                    .write_chunk(&chunk.file_name, chunk.offset_bytes, &chunk.data)
                    .expect("chunk");
                chunks += 1;
            }
            other => panic!("a second manifest or an empty message: {other:?}"),
        }
    }
    assert_eq!(writer.file_bytes_written(), writer.file_bytes_total());
    let files = writer.manifest().files.len();
    assert!(files > 4, "only {files} files in the snapshot");
    assert!(chunks >= files, "{chunks} chunks for {files} files");
    writer
        .finish()
        .expect("finish")
        .into_inner()
        .expect("flush")
        .sync_all()
        .expect("fsync");
    (manifest.last_log_index, header.cluster_id)
}

fn restore_options(
    archive: &Path,
    data_dir: &Path,
    id: u64,
    initial: &BTreeMap<u64, NodeInfo>,
) -> RestoreOptions {
    RestoreOptions {
        archive: archive.to_path_buf(),
        data_dir: data_dir.to_path_buf(),
        member_id: id,
        initial_cluster: initial.clone(),
        cluster_token: String::new(),
        state_machine: small_segments(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backup_under_load_restores_into_a_new_cluster() {
    let work = tempfile::tempdir().expect("tempdir");
    let mut source = Cluster::start(|_| small_segments()).await;
    // A leader change first: the backup's entries are of a later term than
    // a new cluster's first election would reach on its own.
    source.change_leader().await;

    // Preload: overwrites and deletes.
    let mut expected: BTreeMap<Vec<u8>, Option<Vec<u8>>> = BTreeMap::new();
    for i in 0..PRELOAD_PUTS {
        let (k, v) = (key(i), value(i));
        source
            .write("put", |mut kv| {
                let (k, v) = (k.clone(), v.clone());
                async move {
                    kv.put(PutRequest {
                        key: k.into(),
                        value: v.into(),
                        ..Default::default()
                    })
                    .await
                }
            })
            .await;
        expected.insert(k, Some(v));
    }
    for i in [1, 5, 9, 13] {
        let k = key(i);
        source
            .write("delete", |mut kv| {
                let k = k.clone();
                async move {
                    kv.delete(DeleteRequest {
                        key: k.into(),
                        ..Default::default()
                    })
                    .await
                }
            })
            .await;
        expected.insert(key(i), None);
    }

    // The load: fresh keys, each recorded once acknowledged.
    let leader = source.leader().await;
    let leader_addr = source.node(leader).client_addr();
    let acked: Arc<Mutex<Vec<KeyValue>>> = Arc::default();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let load = {
        let (acked, stop) = (acked.clone(), stop.clone());
        tokio::spawn(async move {
            let mut kv = KvClient::connect(format!("http://{leader_addr}"))
                .await
                .expect("connect");
            for n in 0..LOAD_PUTS_MAX {
                if stop.load(std::sync::atomic::Ordering::SeqCst) {
                    return;
                }
                let (k, v) = (format!("load{n:06}").into_bytes(), value(10_000 + n));
                let reply = kv
                    .put(PutRequest {
                        key: k.clone().into(),
                        value: v.clone().into(),
                        ..Default::default()
                    })
                    .await;
                if let Ok(reply) = reply
                    && matches!(
                        reply.into_inner().outcome,
                        Some(put_response::Outcome::Seq(_))
                    )
                {
                    acked.lock().unwrap().push((k, v));
                } else {
                    tokio::time::sleep(POLL).await;
                }
            }
        })
    };
    let start = Instant::now();
    while acked.lock().unwrap().len() < LOAD_ACKED_BEFORE_BACKUP_MIN {
        assert!(start.elapsed() < DEADLINE, "the load made no progress");
        tokio::time::sleep(POLL).await;
    }

    // The backup, while the load goes on.
    let acked_before: Vec<KeyValue> = acked.lock().unwrap().clone();
    let archive = work.path().join("backup.rcbk");
    let (backup_index, source_cluster) = save_backup(leader_addr, &archive).await;
    let acked_during = acked.lock().unwrap().len() - acked_before.len();
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    tokio::time::timeout(DEADLINE, load)
        .await
        .expect("the load stops")
        .expect("the load task");
    eprintln!(
        "backup at index {backup_index}: {} load keys acknowledged before it began, {acked_during} while it was taken",
        acked_before.len()
    );
    source.shutdown().await;

    // New members, new addresses.
    let (listeners, initial) = bind_members(3).await;
    let dirs: BTreeMap<u64, PathBuf> = (1..=3)
        .map(|id| (id, work.path().join(format!("restored{id}"))))
        .collect();

    // A corrupted archive and a truncated one are refused; nothing written.
    let bytes = std::fs::read(&archive).expect("read archive");
    let mut flipped = bytes.clone();
    let at = bytes.len() / 2;
    flipped[at] ^= 0x40;
    let corrupt = work.path().join("corrupt.rcbk");
    std::fs::write(&corrupt, &flipped).expect("write corrupt archive");
    let truncated = work.path().join("truncated.rcbk");
    std::fs::write(&truncated, &bytes[..bytes.len() - 7]).expect("write truncated archive");
    for bad in [&corrupt, &truncated] {
        let refused = restore(restore_options(bad, &dirs[&1], 1, &initial)).await;
        match refused {
            Err(BackupError::Format(reason)) => eprintln!("refused as expected: {reason}"),
            other => panic!("{} was not refused: {other:?}", bad.display()),
        }
        assert!(
            !dirs[&1].exists(),
            "a refused restore wrote {}",
            dirs[&1].display()
        );
    }

    // The restore proper.
    let mut cluster_ids = Vec::new();
    let mut backup_term = 0;
    for (id, dir) in &dirs {
        let restored = restore(restore_options(&archive, dir, *id, &initial))
            .await
            .unwrap_or_else(|err| panic!("restore member {id}: {err}"));
        assert_eq!(restored.snapshot_last_log_id.index, backup_index);
        backup_term = restored.snapshot_last_log_id.leader_id.term;
        assert_eq!(restored.last_log_id.index, backup_index + 1);
        assert_eq!(restored.source_cluster_id, source_cluster);
        cluster_ids.push(restored.cluster_id);
    }
    assert!(cluster_ids.iter().all(|c| *c == cluster_ids[0]));
    assert_ne!(cluster_ids[0], source_cluster, "a new cluster id");
    let again = restore(restore_options(&archive, &dirs[&1], 1, &initial)).await;
    assert!(
        matches!(again, Err(BackupError::Config(_))),
        "a non-empty data directory must be refused: {again:?}"
    );

    assert!(
        backup_term >= 2,
        "the backup's last entry is of term {backup_term}"
    );
    let members = Members::start(listeners, &initial, &dirs, |_, config| {
        config.state_machine = small_segments();
    })
    .await;
    let leader = members.leader().await;
    let mut status =
        ClusterClient::connect(format!("http://{}", members.nodes[&leader].client_addr()))
            .await
            .expect("connect")
            .status(StatusRequest {})
            .await
            .expect("status")
            .into_inner();
    let header = status.header.take().expect("header");
    assert_eq!(header.cluster_id, cluster_ids[0]);
    assert!(header.applied_index > backup_index, "{header:?}");
    assert_eq!(status.members.len(), 3);

    for (k, v) in &expected {
        assert_eq!(
            &members.get(k).await,
            v,
            "preloaded key {:?}",
            String::from_utf8_lossy(k)
        );
    }
    for (k, v) in &acked_before {
        assert_eq!(
            members.get(k).await.as_ref(),
            Some(v),
            "load key {:?} was acknowledged before the backup began",
            String::from_utf8_lossy(k)
        );
    }
    members.put(b"after-restore", b"works", 0).await;
    assert_eq!(members.get(b"after-restore").await, Some(b"works".to_vec()));
    members.wait_applied_equal().await;
    members.shutdown().await;
}
