//! The etcd port's `Lock` and `Election` services end to end, on
//! in-process three-member clusters, with the tonic clients generated from
//! etcd's wire format:
//! - Lock: two holders of one name through different members, the second
//!   answered only after the first unlocks (its answer's revision is at or
//!   after the unlock's); locking again with one's lease is the same hold;
//!   a waiter whose client goes away has its key taken back; waiters hold
//!   no slot of the port's in-flight cap (more waiters than the cap, and
//!   the holder's Unlock still gets through);
//! - Lock and leases: revoking the holder's lease passes the lock on; a
//!   waiter whose own lease is revoked is answered `mutex: session is
//!   expired`; lease 0 is given a new lease; an unknown lease is etcd's
//!   lease-not-found, with code UNKNOWN as etcd's lock server sends it;
//! - Election: Leader of an empty election, Observe from before the first
//!   candidate, Campaign, a second candidate waiting, Proclaim seen by
//!   Observe, Proclaim by a non-leader and without a leader key, Resign
//!   handing over, a campaign again with a new value, each error with
//!   etcd's code and message.

use std::future::Future;
use std::time::{Duration, Instant};

use kvnode::testing::LocalCluster;
use kvproto::etcd::etcdserverpb::kv_client::KvClient;
use kvproto::etcd::etcdserverpb::lease_client::LeaseClient;
use kvproto::etcd::etcdserverpb::{
    LeaseGrantRequest, LeaseRevokeRequest, LeaseTimeToLiveRequest, RangeRequest,
};
use kvproto::etcd::v3electionpb::election_client::ElectionClient;
use kvproto::etcd::v3electionpb::{
    CampaignRequest, LeaderKey, LeaderRequest, LeaderResponse, ProclaimRequest, ResignRequest,
};
use kvproto::etcd::v3lockpb::lock_client::LockClient;
use kvproto::etcd::v3lockpb::{LockRequest, UnlockRequest};
use tonic::transport::Channel;
use tonic::{Code, Streaming};

use super::etcd::{channel_with_timeout, cluster, cluster_configured};

/// How long any answer or awaited condition may take (a loaded two-core
/// machine).
const ANSWER_WAIT: Duration = Duration::from_secs(30);
/// How often a condition is checked while waiting for it.
const POLL: Duration = Duration::from_millis(20);

/// A channel to member `id`'s etcd port, without a per-call timeout (a
/// lock may wait): every call here is bounded by [`answer`] instead.
async fn channel(cluster: &LocalCluster, id: u64) -> Channel {
    channel_with_timeout(cluster, id, None).await
}

/// `call`'s answer within [`ANSWER_WAIT`].
async fn answer<T>(call: impl Future<Output = T>) -> T {
    tokio::time::timeout(ANSWER_WAIT, call)
        .await
        .expect("an answer within ANSWER_WAIT")
}

/// Waits (checking every [`POLL`]) until `condition` holds.
async fn wait_until<F, Fut>(what: &str, mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + ANSWER_WAIT;
    while !condition().await {
        assert!(Instant::now() < deadline, "waited too long for {what}");
        tokio::time::sleep(POLL).await;
    }
}

async fn grant(lease: &mut LeaseClient<Channel>) -> i64 {
    answer(lease.lease_grant(LeaseGrantRequest { ttl: 60, id: 0 }))
        .await
        .unwrap()
        .into_inner()
        .id
}

async fn revoke(lease: &mut LeaseClient<Channel>, id: i64) -> i64 {
    answer(lease.lease_revoke(LeaseRevokeRequest { id }))
        .await
        .unwrap()
        .into_inner()
        .header
        .unwrap()
        .revision
}

/// The keys under `prefix` (a linearizable read).
async fn keys_under(kv: &mut KvClient<Channel>, prefix: &str) -> Vec<String> {
    let mut end = prefix.as_bytes().to_vec();
    *end.last_mut().unwrap() += 1;
    let range = RangeRequest {
        key: prefix.as_bytes().to_vec().into(),
        range_end: end.into(),
        ..Default::default()
    };
    answer(kv.range(range))
        .await
        .unwrap()
        .into_inner()
        .kvs
        .iter()
        .map(|kv| String::from_utf8_lossy(&kv.key).into_owned())
        .collect()
}

fn lock(name: &str, lease: i64) -> LockRequest {
    LockRequest {
        name: name.as_bytes().to_vec().into(),
        lease,
    }
}

/// The key clientv3 names for `lease` under `name`.
fn key_of(name: &str, lease: i64) -> String {
    format!("{name}/{lease:x}")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_locker_waits_until_the_first_unlocks() {
    let root = tempfile::tempdir().unwrap();
    let (cluster, leader, follower) = cluster(root.path()).await;
    let on_follower = channel(&cluster, follower).await;
    let on_leader = channel(&cluster, leader).await;
    let mut locks = LockClient::new(on_follower.clone());
    let mut kv = KvClient::new(on_follower.clone());
    let mut lease = LeaseClient::new(on_follower.clone());
    let (first, second, third) = (
        grant(&mut lease).await,
        grant(&mut lease).await,
        grant(&mut lease).await,
    );

    // Uncontended, through a follower: held at once.
    let held = answer(locks.lock(lock("jobs", first)))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(text(&held.key), key_of("jobs", first));
    let held_header = held.header.unwrap();
    assert_eq!(held_header.member_id, follower);
    assert!(held_header.revision > 0);
    // Locking again with the same lease is the same hold.
    let again = answer(locks.lock(lock("jobs", first)))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(again.key, held.key);

    // A second locker, on the leader, waits.
    let mut on_leader_locks = LockClient::new(on_leader.clone());
    let waiting = tokio::spawn(async move { on_leader_locks.lock(lock("jobs", second)).await });
    wait_until("the second locker's key", || {
        let mut kv = kv.clone();
        async move { keys_under(&mut kv, "jobs/").await.len() == 2 }
    })
    .await;
    assert!(!waiting.is_finished(), "the second locker did not wait");

    // A third waits behind it, and gives up: its key is taken back.
    let mut third_locks = LockClient::new(on_follower.clone());
    let gives_up = tokio::spawn(async move { third_locks.lock(lock("jobs", third)).await });
    wait_until("the third locker's key", || {
        let mut kv = kv.clone();
        async move { keys_under(&mut kv, "jobs/").await.len() == 3 }
    })
    .await;
    assert!(!gives_up.is_finished(), "the third locker did not wait");
    gives_up.abort();
    let third_key = key_of("jobs", third);
    wait_until("the third locker's key to be taken back", || {
        let mut kv = kv.clone();
        let third_key = third_key.clone();
        async move { !keys_under(&mut kv, "jobs/").await.contains(&third_key) }
    })
    .await;
    assert!(!waiting.is_finished(), "the second locker went on early");

    let unlocked = answer(locks.unlock(UnlockRequest { key: held.key }))
        .await
        .unwrap()
        .into_inner()
        .header
        .unwrap()
        .revision;
    let granted = answer(waiting)
        .await
        .unwrap()
        .expect("the second locker holds the lock")
        .into_inner();
    assert_eq!(text(&granted.key), key_of("jobs", second));
    let granted_header = granted.header.unwrap();
    assert_eq!(granted_header.member_id, leader);
    assert!(
        granted_header.revision >= unlocked,
        "answered at {} before the unlock at {unlocked}",
        granted_header.revision
    );
    assert_eq!(keys_under(&mut kv, "jobs/").await, [key_of("jobs", second)]);
    cluster.shutdown().await;
}

/// Waiting lockers are not requests in flight (etcd's wait without bound):
/// with the port's cap at [`INFLIGHT_CAP`], more waiters than that wait,
/// and the holder's Unlock and a read still get through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_lockers_hold_no_slot_of_the_inflight_cap() {
    const INFLIGHT_CAP: usize = 3;
    let root = tempfile::tempdir().unwrap();
    let (cluster, _leader, follower) = cluster_configured(root.path(), |config| {
        config.limits.client_inflight_max = INFLIGHT_CAP;
    })
    .await;
    let on_follower = channel(&cluster, follower).await;
    let mut locks = LockClient::new(on_follower.clone());
    let mut kv = KvClient::new(on_follower.clone());
    let mut lease = LeaseClient::new(on_follower.clone());
    let holder = grant(&mut lease).await;
    let held = answer(locks.lock(lock("crowd", holder)))
        .await
        .unwrap()
        .into_inner();
    let mut waiters = Vec::new();
    for _ in 0..INFLIGHT_CAP + 2 {
        let id = grant(&mut lease).await;
        let mut locks = LockClient::new(on_follower.clone());
        waiters.push(tokio::spawn(
            async move { locks.lock(lock("crowd", id)).await },
        ));
    }
    wait_until("every waiter's key", || {
        let mut kv = kv.clone();
        async move { keys_under(&mut kv, "crowd/").await.len() == INFLIGHT_CAP + 3 }
    })
    .await;
    for waiter in &waiters {
        assert!(!waiter.is_finished(), "a waiter was answered: {waiter:?}");
    }
    answer(locks.unlock(UnlockRequest { key: held.key }))
        .await
        .expect("the holder's unlock is not refused by the in-flight cap");
    // Exactly one waiter is granted the lock; the others still wait.
    wait_until("a waiter granted the lock", || {
        let done = waiters.iter().any(|w| w.is_finished());
        async move { done }
    })
    .await;
    let granted = waiters.swap_remove(
        waiters
            .iter()
            .position(|w| w.is_finished())
            .expect("one finished"),
    );
    answer(granted)
        .await
        .unwrap()
        .expect("the first waiter holds the lock");
    assert_eq!(keys_under(&mut kv, "crowd/").await.len(), INFLIGHT_CAP + 2);
    for waiter in waiters {
        waiter.abort();
    }
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_follows_its_holders_lease() {
    let root = tempfile::tempdir().unwrap();
    let (cluster, _leader, follower) = cluster(root.path()).await;
    let on_follower = channel(&cluster, follower).await;
    let mut locks = LockClient::new(on_follower.clone());
    let mut kv = KvClient::new(on_follower.clone());
    let mut lease = LeaseClient::new(on_follower.clone());
    let (holder, next, doomed) = (
        grant(&mut lease).await,
        grant(&mut lease).await,
        grant(&mut lease).await,
    );

    answer(locks.lock(lock("db", holder))).await.unwrap();
    let mut next_locks = locks.clone();
    let waiting = tokio::spawn(async move { next_locks.lock(lock("db", next)).await });
    let mut doomed_locks = locks.clone();
    let expiring = tokio::spawn(async move { doomed_locks.lock(lock("db", doomed)).await });
    wait_until("both waiters' keys", || {
        let mut kv = kv.clone();
        async move { keys_under(&mut kv, "db/").await.len() == 3 }
    })
    .await;
    assert!(!waiting.is_finished() && !expiring.is_finished());

    // The waiter at the back loses its lease: told at once, with etcd's
    // error (code UNKNOWN, as etcd's lock server sends every error).
    revoke(&mut lease, doomed).await;
    let expired = answer(expiring).await.unwrap().unwrap_err();
    assert_eq!(
        (expired.code(), expired.message()),
        (Code::Unknown, "mutex: session is expired")
    );
    assert!(!waiting.is_finished(), "the next locker went on early");

    // The holder's lease goes: the lock passes on.
    let revoked = revoke(&mut lease, holder).await;
    let granted = answer(waiting)
        .await
        .unwrap()
        .expect("the next locker holds the lock")
        .into_inner();
    assert_eq!(text(&granted.key), key_of("db", next));
    assert!(granted.header.unwrap().revision >= revoked);

    // Lease 0: a lease of etcd's session TTL is granted for the lock.
    let solo = answer(locks.lock(lock("solo", 0)))
        .await
        .unwrap()
        .into_inner();
    let hex = text(&solo.key)
        .strip_prefix("solo/")
        .expect("a key under solo/")
        .to_string();
    let id = i64::from_str_radix(&hex, 16).expect("the lease id in hex");
    let ttl = answer(lease.lease_time_to_live(LeaseTimeToLiveRequest { id, keys: true }))
        .await
        .unwrap()
        .into_inner();
    assert!(ttl.ttl > 0 && ttl.granted_ttl == 60, "{ttl:?}");
    assert_eq!(ttl.keys, std::slice::from_ref(&solo.key));

    // A lease that does not exist: etcd's message, code UNKNOWN.
    let unknown = answer(locks.lock(lock("solo2", 0x7777_7777)))
        .await
        .unwrap_err();
    assert_eq!(
        (unknown.code(), unknown.message()),
        (Code::Unknown, "etcdserver: requested lease not found")
    );
    assert!(keys_under(&mut kv, "solo2/").await.is_empty());
    cluster.shutdown().await;
}

fn campaign(name: &str, lease: i64, value: &str) -> CampaignRequest {
    CampaignRequest {
        name: name.as_bytes().to_vec().into(),
        lease,
        value: value.as_bytes().to_vec().into(),
    }
}

fn leader_of(name: &str) -> LeaderRequest {
    LeaderRequest {
        name: name.as_bytes().to_vec().into(),
    }
}

/// The next message of an Observe stream: (key, value).
async fn observed(stream: &mut Streaming<LeaderResponse>) -> (String, String) {
    let message = answer(stream.message())
        .await
        .expect("an observation")
        .expect("the stream goes on");
    assert!(message.header.is_some_and(|h| h.revision > 0));
    let kv = message.kv.expect("the leader's key-value");
    (text(&kv.key), text(&kv.value))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_election_is_won_observed_proclaimed_and_handed_over() {
    let root = tempfile::tempdir().unwrap();
    let (cluster, leader, follower) = cluster(root.path()).await;
    let on_follower = channel(&cluster, follower).await;
    let on_leader = channel(&cluster, leader).await;
    let mut election = ElectionClient::new(on_follower.clone());
    let mut on_leader_election = ElectionClient::new(on_leader.clone());
    let kv = KvClient::new(on_follower.clone());
    let mut lease = LeaseClient::new(on_follower.clone());
    let (first, second) = (grant(&mut lease).await, grant(&mut lease).await);

    // No candidate: etcd's "no leader".
    let none = answer(election.leader(leader_of("svc"))).await.unwrap_err();
    assert_eq!(
        (none.code(), none.message()),
        (Code::Unknown, "election: no leader")
    );
    // Observed from before the first candidate, on the leader.
    let mut observing = answer(on_leader_election.observe(leader_of("svc")))
        .await
        .unwrap()
        .into_inner();

    let won = answer(election.campaign(campaign("svc", first, "a")))
        .await
        .unwrap()
        .into_inner();
    let first_key = won.leader.expect("a leader key");
    assert_eq!(
        (text(&first_key.name), text(&first_key.key), first_key.lease),
        ("svc".to_string(), key_of("svc", first), first)
    );
    assert_eq!(first_key.rev, won.header.unwrap().revision);
    assert_eq!(
        observed(&mut observing).await,
        (key_of("svc", first), "a".to_string())
    );
    let now = answer(on_leader_election.leader(leader_of("svc")))
        .await
        .unwrap()
        .into_inner()
        .kv
        .unwrap();
    assert_eq!(
        (text(&now.key), text(&now.value)),
        (key_of("svc", first), "a".into())
    );
    assert_eq!(now.create_revision, first_key.rev);

    // A second candidate waits.
    let mut second_election = election.clone();
    let waiting =
        tokio::spawn(async move { second_election.campaign(campaign("svc", second, "b")).await });
    wait_until("the second candidate's key", || {
        let mut kv = kv.clone();
        async move { keys_under(&mut kv, "svc/").await.len() == 2 }
    })
    .await;
    assert!(!waiting.is_finished(), "the second candidate did not wait");

    // The leader proclaims; Observe sees it.
    answer(election.proclaim(ProclaimRequest {
        leader: Some(first_key.clone()),
        value: b"a2".to_vec().into(),
    }))
    .await
    .unwrap();
    assert_eq!(
        observed(&mut observing).await,
        (key_of("svc", first), "a2".to_string())
    );
    // A non-leader's proclaim (its key was not created at that revision).
    let pretender = LeaderKey {
        key: key_of("svc", second).into_bytes().into(),
        lease: second,
        ..first_key.clone()
    };
    let refused = answer(election.proclaim(ProclaimRequest {
        leader: Some(pretender),
        value: b"mine".to_vec().into(),
    }))
    .await
    .unwrap_err();
    assert_eq!(
        (refused.code(), refused.message()),
        (Code::Unknown, "election: not leader")
    );
    let missing = answer(election.proclaim(ProclaimRequest {
        leader: None,
        value: b"x".to_vec().into(),
    }))
    .await
    .unwrap_err();
    assert_eq!(
        (missing.code(), missing.message()),
        (Code::Unknown, "\"leader\" field must be provided")
    );
    assert!(!waiting.is_finished(), "the second candidate went on early");

    // The leader resigns: the second candidate leads, Observe follows.
    let resigned = answer(election.resign(ResignRequest {
        leader: Some(first_key.clone()),
    }))
    .await
    .unwrap()
    .into_inner()
    .header
    .unwrap()
    .revision;
    let second_won = answer(waiting)
        .await
        .unwrap()
        .expect("the second candidate leads")
        .into_inner();
    let second_key = second_won.leader.unwrap();
    assert_eq!(text(&second_key.key), key_of("svc", second));
    assert!(second_key.rev > first_key.rev && second_key.rev < resigned);
    assert_eq!(
        observed(&mut observing).await,
        (key_of("svc", second), "b".to_string())
    );
    // Resigning with the old key again changes nothing.
    answer(election.resign(ResignRequest {
        leader: Some(first_key),
    }))
    .await
    .unwrap();
    // Campaigning again with the leader's lease and a new value: the same
    // key and revision, the value proclaimed.
    let again = answer(election.campaign(campaign("svc", second, "b2")))
        .await
        .unwrap()
        .into_inner()
        .leader
        .unwrap();
    assert_eq!(
        (again.key.clone(), again.rev),
        (second_key.key.clone(), second_key.rev)
    );
    assert_eq!(
        observed(&mut observing).await,
        (key_of("svc", second), "b2".to_string())
    );
    let now = answer(election.leader(leader_of("svc")))
        .await
        .unwrap()
        .into_inner()
        .kv
        .unwrap();
    assert_eq!(
        (text(&now.key), text(&now.value)),
        (key_of("svc", second), "b2".into())
    );
    // Its lease revoked, the election is empty again.
    revoke(&mut lease, second).await;
    let none = answer(election.leader(leader_of("svc"))).await.unwrap_err();
    assert_eq!(none.message(), "election: no leader");
    cluster.shutdown().await;
}
