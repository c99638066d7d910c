//! TTL expiry is agreed by every replica of a three-node in-process cluster.
//! A key put with a TTL is served by every member (stale reads through each
//! member's client port, `min_index` = the write's index) with `ttl_ms_left`
//! in (0, TTL]. Once the TTL has run out in cluster time, every member
//! answers "not found" (version 0) and its scans no longer list the key,
//! while keys without a TTL or with a long one stay. Meanwhile the test
//! probes each member's state machine in process and keeps only exact
//! observations (applied index unchanged across reading the cluster time and
//! the key): the cluster time at each applied index is the same on every
//! member, each observation agrees with "present iff time < expiry", and
//! the key is present at every index below one point and gone at every
//! index from it, on all members alike — so every replica drops it at the
//! same applied index.
//!
//! Two ways for cluster time to pass: with no client write at all (the
//! leader's tick entries must advance it; this test waits for ticks), and
//! with follow-up client writes.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use kvnode::StateMachineOptions;
use kvproto::kv::v1::{PutRequest, put_response};

use crate::harness::{Cluster, POLL};

/// Versions per log index (DESIGN §3): `version = index × 65536 + position`.
const VERSIONS_PER_INDEX: u64 = 65_536;
/// The TTL under test.
const TTL_MS: u64 = 2_000;
/// A TTL that does not run out during the test.
const TTL_LONG_MS: u64 = 10 * 60 * 1000;
/// How long the key may take to expire everywhere (cluster time is the
/// leader's monotonic clock, so about `TTL_MS` plus a tick or a write).
const EXPIRY_DEADLINE: Duration = Duration::from_secs(30);
/// Attempts at one exact observation of a member (an apply in between
/// makes an attempt inexact).
const PROBE_ATTEMPTS_MAX: usize = 100;
/// Pause between follow-up writes.
const WRITE_INTERVAL: Duration = Duration::from_millis(200);

/// One exact observation of the key on one member.
#[derive(Clone, Copy, Debug)]
struct Observation {
    member: u64,
    index: u64,
    time_ms: u64,
    /// `Some(expiry_ms)` when the key was present.
    present: Option<u64>,
}

/// Exact observations of one key since the entry that wrote it.
struct History {
    key: Vec<u8>,
    /// The entry that put the key; earlier states are not of interest.
    written_index: u64,
    observations: Vec<Observation>,
}

impl History {
    /// Observes every running member once, exactly: the applied index is
    /// the same before and after reading the cluster time and the key (the
    /// state machine updates both under one lock, per entry).
    fn probe(&mut self, cluster: &Cluster) {
        for member in cluster.running() {
            let sm = cluster.node(member).state_machine();
            let mut exact = None;
            for _ in 0..PROBE_ATTEMPTS_MAX {
                let before = sm.applied().0.map(|l| l.index);
                let time_ms = sm.cluster_time_ms();
                let item = sm
                    .engine()
                    .get(&self.key, time_ms)
                    .unwrap_or_else(|err| panic!("member {member}: engine get: {err}"));
                let after = sm.applied().0.map(|l| l.index);
                if let Some(index) = before
                    && before == after
                {
                    exact = Some(Observation {
                        member,
                        index,
                        time_ms,
                        present: item.map(|item| item.expiry_ms),
                    });
                    break;
                }
            }
            let observation =
                exact.unwrap_or_else(|| panic!("member {member}: no exact observation"));
            if observation.index >= self.written_index {
                self.observations.push(observation);
            }
        }
    }

    /// The first index at which `member` was seen without the key.
    fn gone_at(&self, member: u64) -> Option<u64> {
        self.observations
            .iter()
            .filter(|o| o.member == member && o.present.is_none())
            .map(|o| o.index)
            .min()
    }

    /// Checks that the members agree (see the module comment); returns
    /// (last index seen present, first index seen gone).
    fn check(&self, expiry_ms: u64) -> (u64, u64) {
        let mut times: BTreeMap<u64, (u64, u64)> = BTreeMap::new();
        let mut states: BTreeMap<u64, (bool, u64)> = BTreeMap::new();
        for o in &self.observations {
            let (time_ms, member) = *times.entry(o.index).or_insert((o.time_ms, o.member));
            assert_eq!(
                o.time_ms, time_ms,
                "cluster time at index {}: member {} has {} ms, member {member} {time_ms} ms",
                o.index, o.member, o.time_ms
            );
            if let Some(expiry) = o.present {
                assert_eq!(expiry, expiry_ms, "member {}: expiry", o.member);
            }
            assert_eq!(
                o.present.is_some(),
                o.time_ms < expiry_ms,
                "member {} at index {} (time {} ms, expiry {expiry_ms} ms)",
                o.member,
                o.index,
                o.time_ms
            );
            let (present, member) = *states
                .entry(o.index)
                .or_insert((o.present.is_some(), o.member));
            assert_eq!(
                o.present.is_some(),
                present,
                "at index {}: member {} sees the key {}, member {member} does not",
                o.index,
                o.member,
                if present { "gone" } else { "present" }
            );
        }
        let last_present = states
            .iter()
            .filter(|(_, (present, _))| *present)
            .map(|(index, _)| *index)
            .max()
            .expect("the key was observed present");
        let first_gone = states
            .iter()
            .filter(|(_, (present, _))| !*present)
            .map(|(index, _)| *index)
            .min()
            .expect("the key was observed gone");
        assert!(
            last_present < first_gone,
            "present at index {last_present} but gone at {first_gone}: {:?}",
            self.observations
        );
        (last_present, first_gone)
    }
}

async fn put(cluster: &Cluster, key: &str, ttl_ms: u64) -> (u64, u64) {
    let request = PutRequest {
        key: key.as_bytes().to_vec().into(),
        value: format!("value of {key}").into_bytes().into(),
        ttl_ms,
        ..Default::default()
    };
    let reply = cluster
        .write("put", move |mut kv| {
            let request = request.clone();
            async move { kv.put(request).await }
        })
        .await;
    let Some(put_response::Outcome::Seq(version)) = reply.outcome else {
        panic!("put {key}: {reply:?}")
    };
    (version, reply.header.expect("header").applied_index)
}

/// Starts the cluster, writes the TTL key and two others, checks every
/// member serves the TTL key; returns the cluster and the history.
async fn setup() -> (Cluster, History) {
    let cluster = Cluster::start(|_| StateMachineOptions::default()).await;
    put(&cluster, "keep", 0).await;
    put(&cluster, "long", TTL_LONG_MS).await;
    let (version, index) = put(&cluster, "t", TTL_MS).await;
    for member in cluster.running() {
        let got = cluster.stale_get(member, b"t", index).await;
        assert!(got.found, "member {member} does not serve the TTL key");
        assert_eq!(got.seq, version, "member {member}");
        assert!(
            got.ttl_ms_left > 0 && got.ttl_ms_left <= TTL_MS,
            "member {member}: {got:?}"
        );
    }
    let history = History {
        key: b"t".to_vec(),
        written_index: version / VERSIONS_PER_INDEX,
        observations: Vec::new(),
    };
    (cluster, history)
}

/// Checks the end state after expiry on every member (reads through each
/// client port at `min_index`, and scans) and the agreement of the history.
async fn check_expired(cluster: &Cluster, history: &mut History, min_index: u64) {
    history.probe(cluster);
    let expiry_ms = history
        .observations
        .iter()
        .find_map(|o| o.present)
        .expect("the key was observed present");
    let (last_present, first_gone) = history.check(expiry_ms);
    for member in cluster.running() {
        let gone = history
            .gone_at(member)
            .unwrap_or_else(|| panic!("member {member} was never seen without the key"));
        assert!(gone >= first_gone);
        let got = cluster.stale_get(member, b"t", min_index).await;
        assert!(!got.found, "member {member} still serves the key: {got:?}");
        assert_eq!(got.seq, 0);
        let keys: Vec<Vec<u8>> = cluster
            .stale_scan(member, min_index)
            .await
            .into_iter()
            .map(|(key, ..)| key)
            .collect();
        assert_eq!(
            keys,
            vec![b"keep".to_vec(), b"long".to_vec()],
            "member {member} lists"
        );
    }
    eprintln!(
        "the key expired between applied index {last_present} and {first_gone} on every member ({} exact observations)",
        history.observations.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ttl_expires_on_every_replica_without_client_writes() {
    let (cluster, mut history) = setup().await;
    // No client write from here on: only the leader's tick entries can move
    // cluster time.
    let start = Instant::now();
    loop {
        history.probe(&cluster);
        if cluster
            .running()
            .into_iter()
            .all(|member| history.gone_at(member).is_some())
        {
            break;
        }
        assert!(
            start.elapsed() < EXPIRY_DEADLINE,
            "the TTL key did not expire on every member within {EXPIRY_DEADLINE:?} without client writes: cluster time did not advance (no tick entries?); applied indexes {:?}, cluster times {:?}",
            cluster
                .running()
                .into_iter()
                .map(|m| cluster.applied(m))
                .collect::<Vec<_>>(),
            cluster
                .running()
                .into_iter()
                .map(|m| cluster.node(m).state_machine().cluster_time_ms())
                .collect::<Vec<_>>()
        );
        tokio::time::sleep(POLL).await;
    }
    let min_index = history
        .observations
        .iter()
        .map(|o| o.index)
        .max()
        .expect("observations");
    check_expired(&cluster, &mut history, min_index).await;
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ttl_expires_on_every_replica_after_a_follow_up_write() {
    let (cluster, mut history) = setup().await;
    let start = Instant::now();
    let mut round = 0u64;
    let min_index = loop {
        history.probe(&cluster);
        // A follow-up write on another key; once the key is gone at the
        // write's index on the leader, it is gone there on every member.
        let (_, index) = put(&cluster, &format!("clock{round:04}"), 0).await;
        round += 1;
        let leader = cluster.leader().await;
        if !cluster.stale_get(leader, b"t", index).await.found {
            break index;
        }
        assert!(
            start.elapsed() < EXPIRY_DEADLINE,
            "the TTL key did not expire within {EXPIRY_DEADLINE:?} of follow-up writes"
        );
        history.probe(&cluster);
        tokio::time::sleep(WRITE_INTERVAL).await;
    };
    history.probe(&cluster);
    // The follow-up keys are listed too: drop them before the scan check.
    for r in 0..round {
        let key = format!("clock{r:04}");
        cluster
            .write("delete", move |mut kv| {
                let key = key.clone();
                async move {
                    kv.delete(kvproto::kv::v1::DeleteRequest {
                        key: key.into_bytes().into(),
                        ..Default::default()
                    })
                    .await
                }
            })
            .await;
    }
    let min_index = min_index.max(cluster.wait_applied_equal().await);
    check_expired(&cluster, &mut history, min_index).await;
    cluster.shutdown().await;
}
