//! Replicas hold identical files. A three-node in-process cluster with small
//! engine segments runs a workload that seals at least five segments and
//! includes overwrites, deletes, TTL puts, an atomic batch, failed
//! conditions (a Put and a Batch), a leader change (the leader is stopped,
//! the others elect a new one, the old one restarts and rejoins as a
//! follower) and a follower restart (stopped while writes go on, restarted on the same
//! directory and addresses, caught up from the log). Once every member has
//! applied the leader's last log index, every member's sealed segments and
//! hints (in `DATA/state/engine-<gen>/`) have the same names, lengths and
//! CRC-32s, read from disk by the test, and every member lists the same keys,
//! values and versions. The active segment is left out: its length may
//! legitimately differ. A negative control gives one member a different
//! segment size and requires the comparison to report a differing file.

use std::collections::BTreeMap;
use std::path::Path;

use bitcask::Options;
use kvnode::StateMachineOptions;
use kvproto::kv::v1::{
    BatchCondition, BatchOp, BatchRequest, DeleteOp, DeleteRequest, ExpireOp, PersistOp, PutOp,
    PutRequest, batch_op, batch_response, delete_response, put_request, put_response,
};

use crate::harness::{Cluster, POLL};

/// Engine segment size on every member: small, so the workload seals many
/// segments.
const SEGMENT_SIZE_BYTES: u64 = 16 * 1024;
/// The segment size the negative control gives one member.
const SEGMENT_SIZE_BYTES_OTHER: u64 = 20 * 1024;
/// Sealed segments the workload must produce at least (tracker issue 3).
const SEALED_SEGMENTS_MIN: usize = 5;
/// Distinct keys the puts cycle through (so most puts overwrite).
const KEYS: usize = 40;
/// Attempts at reading every member's files while no entry applies (the
/// leader may append ticks at any time).
const QUIET_READ_ATTEMPTS_MAX: usize = 200;
/// A TTL that runs out during the test.
const TTL_SHORT_MS: u64 = 1_500;
/// A TTL that does not run out during the test.
const TTL_LONG_MS: u64 = 10 * 60 * 1000;

fn options(segment_size_bytes: u64) -> StateMachineOptions {
    StateMachineOptions {
        engine: Options {
            segment_size_bytes,
            ..Options::default()
        },
        ..StateMachineOptions::default()
    }
}

fn key(i: usize) -> Vec<u8> {
    format!("key{:03}", i % KEYS).into_bytes()
}

/// A value of 300..1300 bytes that differs per write.
fn value(i: usize) -> Vec<u8> {
    let len = 300 + (i * 7919) % 1000;
    let mut value = format!("value {i} ").into_bytes();
    value.extend((0..len).map(|j| b'a' + ((i + j) % 26) as u8));
    value
}

fn put_request(key: Vec<u8>, value: Vec<u8>, ttl_ms: u64) -> PutRequest {
    PutRequest {
        key: key.into(),
        value: value.into(),
        ttl_ms,
        ..Default::default()
    }
}

async fn put(cluster: &Cluster, request: PutRequest) -> put_response::Outcome {
    let reply = cluster
        .write("put", move |mut kv| {
            let request = request.clone();
            async move { kv.put(request).await }
        })
        .await;
    reply.outcome.expect("put outcome")
}

async fn put_version(cluster: &Cluster, request: PutRequest) -> u64 {
    match put(cluster, request).await {
        put_response::Outcome::Seq(version) => version,
        other => panic!("put: {other:?}"),
    }
}

async fn puts(cluster: &Cluster, range: std::ops::Range<usize>) {
    for i in range {
        put_version(cluster, put_request(key(i), value(i), 0)).await;
    }
}

async fn delete(cluster: &Cluster, key: Vec<u8>) {
    let request = DeleteRequest {
        key: key.into(),
        ..Default::default()
    };
    let reply = cluster
        .write("delete", move |mut kv| {
            let request = request.clone();
            async move { kv.delete(request).await }
        })
        .await;
    assert!(
        matches!(reply.outcome, Some(delete_response::Outcome::Deleted(_))),
        "{reply:?}"
    );
}

async fn batch(cluster: &Cluster, request: BatchRequest) -> batch_response::Outcome {
    let reply = cluster
        .write("batch", move |mut kv| {
            let request = request.clone();
            async move { kv.batch(request).await }
        })
        .await;
    reply.outcome.expect("batch outcome")
}

fn op(op: batch_op::Op) -> BatchOp {
    BatchOp { op: Some(op) }
}

/// Name → (length, CRC-32) of the sealed data files and their hints in an
/// engine directory, read from disk. A sealed file is a data file with a
/// hint; at most one data file (the active segment) may lack one. `Err`
/// when a file other than the active segment's growing hint is being
/// written (`*.tmp`): read again later.
pub(crate) fn sealed_files(dir: &Path) -> Result<BTreeMap<String, (u64, u32)>, String> {
    let mut names = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(|e| format!("list {}: {e}", dir.display()))? {
        let entry = entry.map_err(|e| format!("list {}: {e}", dir.display()))?;
        names.push(entry.file_name().to_string_lossy().into_owned());
    }
    let hinted: Vec<&str> = names
        .iter()
        .filter_map(|n| n.strip_suffix(".hint"))
        .collect();
    let unhinted: Vec<&String> = names
        .iter()
        .filter(|n| {
            n.strip_suffix(".data")
                .is_some_and(|stem| !hinted.contains(&stem))
        })
        .collect();
    assert!(
        unhinted.len() <= 1,
        "{}: more than one data file without a hint: {unhinted:?}",
        dir.display()
    );
    // The active segment's hint grows as `<stem>.hint.tmp`; any other
    // temporary file is a merge output or a hint being finished.
    let active_hint = unhinted
        .first()
        .and_then(|n| n.strip_suffix(".data"))
        .map(|stem| format!("{stem}.hint.tmp"));
    if let Some(tmp) = names
        .iter()
        .find(|n| n.ends_with(".tmp") && Some(*n) != active_hint.as_ref())
    {
        return Err(format!("{tmp} is being written"));
    }
    let mut files = BTreeMap::new();
    for stem in hinted {
        for name in [format!("{stem}.data"), format!("{stem}.hint")] {
            let path = dir.join(&name);
            let bytes =
                std::fs::read(&path).map_err(|e| format!("read {}: {e}", path.display()))?;
            files.insert(name, (bytes.len() as u64, crc32fast::hash(&bytes)));
        }
    }
    Ok(files)
}

/// Compares every member's sealed files with member 1's: `Err` names the
/// first differing file (in name order) and what each member holds of it.
fn compare(files: &BTreeMap<u64, BTreeMap<String, (u64, u32)>>) -> Result<usize, String> {
    let mut names: Vec<&String> = files.values().flat_map(|f| f.keys()).collect();
    names.sort();
    names.dedup();
    for name in &names {
        let held: Vec<(u64, Option<(u64, u32)>)> = files
            .iter()
            .map(|(id, f)| (*id, f.get(*name).copied()))
            .collect();
        if held.iter().any(|(_, h)| *h != held[0].1) {
            let held: Vec<String> = held
                .iter()
                .map(|(id, h)| match h {
                    Some((len, crc)) => format!("member {id}: {len} bytes, crc32 {crc:08x}"),
                    None => format!("member {id}: missing"),
                })
                .collect();
            return Err(format!(
                "first differing sealed file {name}: {}",
                held.join("; ")
            ));
        }
    }
    Ok(names.len())
}

/// Waits until every member has applied the leader's whole log and reads
/// every member's sealed files while nothing applies (the applied indexes
/// are the same before and after the read). Returns the index and the files.
async fn quiet_files(cluster: &Cluster) -> (u64, BTreeMap<u64, BTreeMap<String, (u64, u32)>>) {
    let mut last_reason = String::new();
    for _ in 0..QUIET_READ_ATTEMPTS_MAX {
        let index = cluster.wait_applied_equal().await;
        let mut files = BTreeMap::new();
        let mut reason = None;
        for id in cluster.running() {
            match sealed_files(&cluster.engine_dir(id)) {
                Ok(f) => {
                    files.insert(id, f);
                }
                Err(why) => reason = Some(format!("member {id}: {why}")),
            }
        }
        let still = cluster
            .running()
            .into_iter()
            .all(|id| cluster.applied(id) == Some(index));
        match reason {
            None if still => return (index, files),
            None => last_reason = format!("an entry applied after index {index}"),
            Some(why) => last_reason = why,
        }
        tokio::time::sleep(POLL).await;
    }
    panic!(
        "no quiet moment to read the files in {QUIET_READ_ATTEMPTS_MAX} attempts: {last_reason}"
    );
}

/// The full workload of the test (ends with every member caught up).
async fn workload(cluster: &mut Cluster) {
    // Overwrites: 120 puts over 40 keys.
    puts(cluster, 0..120).await;

    // Deletes, one of a key that does not exist.
    for i in [3, 7, 11, 19] {
        delete(cluster, key(i)).await;
    }
    delete(cluster, b"never-written".to_vec()).await;

    // TTL puts: some run out during the test, some do not.
    for i in 0..6 {
        let ttl_ms = if i % 2 == 0 {
            TTL_SHORT_MS
        } else {
            TTL_LONG_MS
        };
        let request = put_request(format!("ttl{i}").into_bytes(), value(1000 + i), ttl_ms);
        put_version(cluster, request).await;
    }

    // A batch whose conditions hold: put, delete, expire and persist.
    put_version(cluster, put_request(key(20), value(2000), 0)).await;
    // The leader applied the put before it answered.
    let leader = cluster.leader().await;
    let r20 = cluster.stale_get(leader, &key(20), 0).await.mod_revision;
    let applied = batch(
        cluster,
        BatchRequest {
            session: None,
            conditions: vec![
                BatchCondition {
                    key: key(20).into(),
                    mod_revision: r20,
                    seq: 0,
                },
                BatchCondition {
                    key: key(3).into(),
                    mod_revision: 0,
                    seq: 0,
                },
            ],
            ops: vec![
                op(batch_op::Op::Put(PutOp {
                    key: key(3).into(),
                    value: value(2001).into(),
                    ttl_ms: 0,
                })),
                op(batch_op::Op::Delete(DeleteOp {
                    key: key(21).into(),
                })),
                op(batch_op::Op::Expire(ExpireOp {
                    key: key(20).into(),
                    ttl_ms: TTL_LONG_MS,
                })),
                op(batch_op::Op::Persist(PersistOp {
                    key: key(22).into(),
                })),
            ],
        },
    )
    .await;
    assert!(
        matches!(applied, batch_response::Outcome::Applied(_)),
        "{applied:?}"
    );

    // Failed conditions: a Put and a Batch. Each is still a log entry.
    let failed = put(
        cluster,
        PutRequest {
            condition: Some(put_request::Condition::IfModRevision(r20)),
            ..put_request(key(20), value(2002), 0)
        },
    )
    .await;
    assert!(
        matches!(failed, put_response::Outcome::ConditionFailed(_)),
        "{failed:?}"
    );
    let failed = batch(
        cluster,
        BatchRequest {
            session: None,
            conditions: vec![BatchCondition {
                key: key(3).into(),
                mod_revision: 0,
                seq: 0,
            }],
            ops: vec![op(batch_op::Op::Put(PutOp {
                key: key(4).into(),
                value: value(2003).into(),
                ttl_ms: 0,
            }))],
        },
    )
    .await;
    assert!(
        matches!(failed, batch_response::Outcome::ConditionFailed(_)),
        "{failed:?}"
    );

    // A leader change, then writes through the new leader.
    let old = cluster.leader().await;
    let new = cluster.change_leader().await;
    assert_ne!(old, new);
    puts(cluster, 120..180).await;

    // A follower restart: writes go on while it is down; it catches up from
    // the log after it comes back on the same directory and addresses.
    let leader = cluster.leader().await;
    let follower = cluster
        .running()
        .into_iter()
        .find(|id| *id != leader)
        .expect("a follower");
    cluster.stop(follower).await;
    puts(cluster, 180..240).await;
    cluster.restart(follower).await;
    puts(cluster, 240..300).await;
    cluster.wait_applied_equal().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_hold_identical_sealed_files() {
    let mut cluster = Cluster::start(|_| options(SEGMENT_SIZE_BYTES)).await;
    workload(&mut cluster).await;

    let (index, files) = quiet_files(&cluster).await;
    assert_eq!(files.len(), 3, "every member's files were read");
    let sealed_segments = files[&1]
        .keys()
        .filter(|name| name.ends_with(".data"))
        .count();
    assert!(
        sealed_segments >= SEALED_SEGMENTS_MIN,
        "the workload sealed {sealed_segments} segments; at least {SEALED_SEGMENTS_MIN} wanted"
    );
    match compare(&files) {
        Ok(compared) => eprintln!(
            "{compared} sealed files ({sealed_segments} segments) identical on every member at applied index {index}"
        ),
        Err(difference) => panic!("replicas differ at applied index {index}: {difference}"),
    }

    // The same keys, values and versions on every member.
    let mut listings = BTreeMap::new();
    for id in cluster.running() {
        listings.insert(id, cluster.stale_scan(id, index).await);
    }
    assert!(!listings[&1].is_empty());
    for (id, listing) in &listings {
        assert!(
            listing == &listings[&1],
            "member {id} lists different keys, values or versions than member 1"
        );
    }
    cluster.shutdown().await;
}

/// The comparison can fail: one member with another segment size seals
/// other files, and the first differing one is named.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_with_another_segment_size_is_caught() {
    let cluster = Cluster::start(|id| {
        options(if id == 3 {
            SEGMENT_SIZE_BYTES_OTHER
        } else {
            SEGMENT_SIZE_BYTES
        })
    })
    .await;
    puts(&cluster, 0..80).await;
    let (_, files) = quiet_files(&cluster).await;
    let difference = compare(&files).expect_err("the files must differ");
    assert!(
        difference.starts_with("first differing sealed file seg-"),
        "{difference}"
    );
    assert!(difference.contains("member 3"), "{difference}");
    eprintln!("negative control, as expected: {difference}");
    cluster.shutdown().await;
}
