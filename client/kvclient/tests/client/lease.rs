//! Proves the client's leases against a real three-member cluster:
//! - the calls: a grant (the cluster's id or one asked for; a short TTL
//!   raised to `LEASE_TTL_MS_MIN`; an id in use refused as
//!   `LeaseAlreadyExists`), puts attached to it (a missing lease refused as
//!   `LeaseNotFound` naming it; a conditional leased put's failed condition
//!   as `VersionMismatch`), time to live with the keys, the listing, a
//!   revoke deleting every attached key at one revision, and
//!   `LeaseNotFound` for every call naming a lease that is gone;
//! - a `LeaseKeeper` keeps a lease alive past several TTLs, follows the
//!   leader through a leadership move and a leader kill without losing
//!   it, reports a revoke as `Gone` to every handle, reports `Unrenewed`
//!   no earlier than the cluster's promise ends when no member answers,
//!   and once dropped lets the lease expire without revoking it.

use std::time::{Duration, Instant};

use kvclient::{Client, Error, LeaseLoss, PutOptions};
use kvproto::{LEASE_EARLY_BOUND_MS, LEASE_LATE_BOUND_MS, LEASE_TTL_MS_MIN};

use crate::harness::{Cluster, DEADLINE, POLL};

fn client(cluster: &Cluster) -> Client {
    Client::builder(cluster.endpoints())
        .request_timeout(Duration::from_secs(5))
        .operation_timeout(Duration::from_secs(60))
        .attempts(500)
        .build()
        .expect("client")
}

/// Polls `lease`'s time to live until it is gone; when it was first seen
/// gone (fails the test after `within`).
async fn wait_gone(client: &Client, lease: u64, within: Duration) -> Instant {
    let start = Instant::now();
    loop {
        let seen = client
            .lease_time_to_live(lease, false)
            .await
            .expect("time to live");
        if seen.is_none() {
            return Instant::now();
        }
        assert!(
            start.elapsed() < within,
            "lease {lease:x} still alive after {within:?}: {seen:?}"
        );
        tokio::time::sleep(POLL).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn grant_attach_inspect_list_and_revoke() {
    let cluster = Cluster::start().await;
    let client = client(&cluster);

    let picked = client
        .lease_grant(Duration::from_secs(60))
        .await
        .expect("grant");
    assert_ne!(picked.id, 0);
    assert_eq!(picked.ttl, Duration::from_secs(60));
    let short = client
        .lease_grant(Duration::from_millis(500))
        .await
        .expect("grant a short lease");
    assert_eq!(
        short.ttl,
        Duration::from_millis(LEASE_TTL_MS_MIN),
        "raised to the minimum, as etcd does"
    );
    let own = client
        .lease_grant_with_id(0x2a, Duration::from_secs(30))
        .await
        .expect("grant with an id");
    assert_eq!(own.id, 0x2a);
    let err = client
        .lease_grant_with_id(0x2a, Duration::from_secs(30))
        .await
        .expect_err("the id is in use");
    assert!(
        matches!(err, Error::LeaseAlreadyExists { id: 0x2a }),
        "{err:?}"
    );

    // Attach keys; a missing lease is refused, naming it.
    let a = client
        .put_with_lease("svc/a", "1", own.id)
        .await
        .expect("put a");
    let b = client
        .put_with(
            "svc/b",
            "2",
            PutOptions::default().lease(own.id).if_absent(),
        )
        .await
        .expect("put b if absent");
    assert!(b.revision > a.revision);
    let err = client
        .put_with(
            "svc/b",
            "3",
            PutOptions::default().lease(own.id).if_absent(),
        )
        .await
        .expect_err("b exists");
    assert!(
        matches!(
            err,
            Error::VersionMismatch {
                current_mod_revision,
                ..
            } if current_mod_revision == b.revision
        ),
        "{err:?}"
    );
    let err = client
        .put_with_lease("svc/c", "x", 0x7777)
        .await
        .expect_err("no such lease");
    assert!(
        matches!(err, Error::LeaseNotFound { id: 0x7777 }),
        "{err:?}"
    );
    assert_eq!(client.get("svc/c").await.expect("get c"), None);
    let entry = client.get("svc/a").await.expect("get a").expect("a exists");
    assert_eq!(entry.revisions.lease, own.id);

    let ttl = client
        .lease_time_to_live(own.id, true)
        .await
        .expect("time to live")
        .expect("the lease exists");
    assert_eq!(ttl.id, own.id);
    assert_eq!(ttl.granted, Duration::from_secs(30));
    assert!(
        ttl.remaining > Duration::ZERO && ttl.remaining <= ttl.granted,
        "{ttl:?}"
    );
    assert_eq!(ttl.keys, vec!["svc/a", "svc/b"]);
    let without_keys = client
        .lease_time_to_live(own.id, false)
        .await
        .expect("time to live")
        .expect("the lease exists");
    assert!(without_keys.keys.is_empty());

    let mut leases = client.lease_leases().await.expect("leases");
    let mut expected = vec![picked.id, short.id, own.id];
    expected.sort();
    leases.retain(|id| expected.contains(id));
    assert_eq!(leases, expected, "listed in id order");

    // Revoke: both keys at one revision.
    let revoked = client.lease_revoke(own.id).await.expect("revoke");
    assert_eq!(revoked.deleted, 2);
    assert!(revoked.revision > b.revision);
    for key in ["svc/a", "svc/b"] {
        let read = client
            .read(key, kvclient::Consistency::Linearizable)
            .await
            .expect("read");
        assert_eq!(read.entry, None, "{key} deleted with its lease");
    }
    let history = client
        .range(&kvclient::txn::Range::prefix("svc/").revision(revoked.revision - 1))
        .await
        .expect("read before the revoke");
    assert_eq!(
        history.count, 2,
        "both keys lived until the revoke's revision"
    );

    // Every call naming the gone lease.
    assert_eq!(
        client
            .lease_time_to_live(own.id, true)
            .await
            .expect("time to live"),
        None
    );
    assert!(
        !client
            .lease_leases()
            .await
            .expect("leases")
            .contains(&own.id)
    );
    let err = client.lease_revoke(own.id).await.expect_err("revoked");
    assert!(matches!(err, Error::LeaseNotFound { id: 0x2a }), "{err:?}");
    let err = client
        .lease_keep_alive_once(own.id)
        .await
        .expect_err("revoked");
    assert!(matches!(err, Error::LeaseNotFound { id: 0x2a }), "{err:?}");
    let err = client.keep_alive(own.id).await.expect_err("revoked");
    assert!(matches!(err, Error::LeaseNotFound { id: 0x2a }), "{err:?}");
    let err = client
        .put_with_lease("svc/a", "again", own.id)
        .await
        .expect_err("revoked");
    assert!(matches!(err, Error::LeaseNotFound { id: 0x2a }), "{err:?}");

    // Renewing once answers the TTL and when the renewal was sent.
    let before = Instant::now();
    let renewal = client
        .lease_keep_alive_once(picked.id)
        .await
        .expect("renew");
    assert_eq!(renewal.id, picked.id);
    assert_eq!(renewal.ttl, Duration::from_secs(60));
    assert!(renewal.sent >= before && renewal.sent <= Instant::now());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_kept_lease_outlives_its_ttl_and_expires_once_its_keeper_is_dropped() {
    let cluster = Cluster::start().await;
    let client = client(&cluster);
    let ttl = Duration::from_millis(LEASE_TTL_MS_MIN);
    let lease = client.lease_grant(ttl).await.expect("grant");
    client
        .put_with_lease("held", "me", lease.id)
        .await
        .expect("put");
    let mut keeper = client.keep_alive(lease.id).await.expect("keep alive");
    let first = keeper.renewed().await.expect("the first renewal");
    assert_eq!(first.ttl, ttl);

    // Three TTLs: without renewals the lease would be gone twice over.
    let held_until = Instant::now() + 3 * ttl;
    while Instant::now() < held_until {
        let renewal = tokio::time::timeout(ttl, keeper.renewed())
            .await
            .expect("a renewal within each TTL")
            .expect("not lost");
        assert!(renewal.sent > first.sent);
        assert!(
            client.get("held").await.expect("get").is_some(),
            "the key lives while the lease is kept"
        );
    }
    assert!(keeper.renewals() >= 6, "every third of the TTL: {keeper:?}");
    assert_eq!(keeper.loss(), None);

    // Dropping stops the renewals but does not revoke.
    let last_sent = keeper.last_acknowledged_sent();
    drop(keeper);
    let dropped = Instant::now();
    assert!(
        client
            .lease_time_to_live(lease.id, false)
            .await
            .expect("time to live")
            .is_some(),
        "dropping the keeper does not revoke"
    );
    let gone = wait_gone(&client, lease.id, DEADLINE).await;
    assert!(
        gone >= last_sent + ttl - Duration::from_millis(LEASE_EARLY_BOUND_MS),
        "the lease expired {:?} after its last acknowledged renewal was sent, before its TTL",
        gone - last_sent
    );
    assert!(
        gone - dropped < ttl + Duration::from_millis(LEASE_LATE_BOUND_MS) + Duration::from_secs(5),
        "the lease outlived its dropped keeper by {:?}",
        gone - dropped
    );
    assert_eq!(client.get("held").await.expect("get"), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_revoked_kept_lease_is_reported_gone_to_every_handle() {
    let cluster = Cluster::start().await;
    let client = client(&cluster);
    let lease = client
        .lease_grant(Duration::from_secs(3))
        .await
        .expect("grant");
    let mut first = client.keep_alive(lease.id).await.expect("keep alive");
    let second = client.clone().keep_alive(lease.id).await.expect("again");
    client.lease_revoke(lease.id).await.expect("revoke");
    // The next renewal (a third of the TTL at most) is answered TTL 0.
    let loss = tokio::time::timeout(DEADLINE, second.lost())
        .await
        .expect("the loss is reported");
    assert_eq!(loss, LeaseLoss::Gone);
    let mut seen = 0;
    let loss = loop {
        match first.renewed().await {
            Ok(_) => seen += 1,
            Err(loss) => break loss,
        }
        assert!(seen < 10, "renewals of a revoked lease");
    };
    assert_eq!(loss, LeaseLoss::Gone);
    assert_eq!(first.loss(), Some(LeaseLoss::Gone));
    // A lost lease is never renewed again.
    let renewals = first.renewals();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(first.renewals(), renewals);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_keeper_follows_the_leader_through_a_move_and_a_kill() {
    let mut cluster = Cluster::start().await;
    let client = client(&cluster);
    let ttl = Duration::from_secs(10);
    let lease = client.lease_grant(ttl).await.expect("grant");
    client
        .put_with_lease("held", "me", lease.id)
        .await
        .expect("put");
    let mut keeper = client.keep_alive(lease.id).await.expect("keep alive");
    keeper.renewed().await.expect("the first renewal");

    // A leadership move: the old leader ends the stream with NotLeader.
    let old = cluster.leader().await;
    let next = old % crate::harness::MEMBERS + 1;
    client.move_leader(next).await.expect("move leader");
    let moved = Instant::now();
    assert_eq!(cluster.leader().await, next);
    let renewal = tokio::time::timeout(ttl, async {
        loop {
            let renewal = keeper.renewed().await.expect("not lost");
            if renewal.sent > moved {
                break renewal;
            }
        }
    })
    .await
    .expect("renewed after the move");
    assert!(renewal.sent > moved);
    assert_eq!(client.leader(), Some(cluster.addr(next)));

    // A leader kill: the stream breaks, the keeper finds the next leader.
    cluster.kill(next).await;
    let killed = Instant::now();
    let renewal = tokio::time::timeout(ttl, async {
        loop {
            let renewal = keeper.renewed().await.expect("not lost");
            if renewal.sent > killed {
                break renewal;
            }
        }
    })
    .await
    .expect("renewed after the kill");
    assert!(renewal.sent > killed);
    let leader = cluster.leader().await;
    assert_ne!(leader, next);
    // Past the TTL since the kill, the lease and its key still live.
    while killed.elapsed() < ttl + Duration::from_secs(1) {
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(keeper.loss(), None);
    }
    assert!(
        client
            .lease_time_to_live(lease.id, false)
            .await
            .expect("time to live")
            .is_some()
    );
    assert!(client.get("held").await.expect("get").is_some());
    assert!(keeper.last_acknowledged_sent() > killed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_no_member_answering_the_lease_is_unrenewed_when_the_promise_ends() {
    let mut cluster = Cluster::start().await;
    let client = client(&cluster);
    let ttl = Duration::from_millis(LEASE_TTL_MS_MIN);
    let lease = client.lease_grant(ttl).await.expect("grant");
    let keeper = client.keep_alive(lease.id).await.expect("keep alive");
    for id in 1..=crate::harness::MEMBERS {
        cluster.kill(id).await;
    }
    let loss = tokio::time::timeout(DEADLINE, keeper.lost())
        .await
        .expect("the loss is reported");
    let reported = Instant::now();
    let LeaseLoss::Unrenewed {
        last_acknowledged_sent,
        ttl: lost_ttl,
    } = loss
    else {
        panic!("lost as unrenewed: {loss:?}");
    };
    assert_eq!(lost_ttl, ttl);
    assert_eq!(last_acknowledged_sent, keeper.last_acknowledged_sent());
    assert!(
        reported >= last_acknowledged_sent + ttl - Duration::from_millis(LEASE_EARLY_BOUND_MS),
        "reported {:?} after the last acknowledged renewal was sent, before the promise ended",
        reported - last_acknowledged_sent
    );
}

/// Leases one client keeps at once (all on its one keep-alive stream).
const MANY_LEASES: usize = 2_000;
/// `keep_alive` calls in flight while they are set up.
const SETUP_CONCURRENCY: usize = 200;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn thousands_of_leases_kept_by_one_client_all_live_past_their_ttl() {
    let cluster = Cluster::start().await;
    let client = client(&cluster);
    let ttl = Duration::from_millis(LEASE_TTL_MS_MIN);
    let mut keepers = Vec::with_capacity(MANY_LEASES);
    for _ in 0..MANY_LEASES.div_ceil(SETUP_CONCURRENCY) {
        let round: Vec<_> = (0..SETUP_CONCURRENCY)
            .map(|_| {
                let client = client.clone();
                tokio::spawn(async move {
                    let lease = client.lease_grant(ttl).await.expect("grant");
                    client.keep_alive(lease.id).await.expect("keep alive")
                })
            })
            .collect();
        for keeper in round {
            keepers.push(keeper.await.expect("setup task"));
        }
    }
    // Two and a half TTLs after the last was set up.
    tokio::time::sleep(ttl * 5 / 2).await;
    for keeper in &keepers {
        assert_eq!(keeper.loss(), None, "{keeper:?}");
        assert!(
            keeper.last_acknowledged_sent().elapsed() < ttl,
            "renewed within the last TTL: {keeper:?}"
        );
    }
    let mut live = client.lease_leases().await.expect("leases");
    live.sort();
    for keeper in &keepers {
        assert!(live.binary_search(&keeper.id()).is_ok(), "{keeper:?}");
    }
}
