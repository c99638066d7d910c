//! Proves: after each acknowledged write, a read with the writer's
//! `read_your_writes()` consistency sees it on every member (each read by a
//! client pinned to that one member), and so does a linearizable read; a
//! client given only a follower's address finds the leader from the
//! not-leader hint and writes through it.

use kvclient::{Client, Consistency};

use crate::harness::{Cluster, MEMBERS};

/// Writes checked, each on every member.
const WRITES: usize = 40;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reads_after_writes_see_them_on_every_replica() {
    let cluster = Cluster::start().await;
    let leader = cluster.leader().await;
    let follower = (1..=MEMBERS).find(|id| *id != leader).expect("a follower");
    // Only a follower's address: the first write is refused with NotLeader
    // and redirected.
    let writer = Client::builder([cluster.addr(follower)])
        .build()
        .expect("client");
    let readers: Vec<(u64, Client)> = (1..=MEMBERS)
        .map(|id| {
            let client = Client::builder([cluster.addr(id)]).build().expect("client");
            (id, client)
        })
        .collect();
    for i in 0..WRITES {
        let key = format!("ryw/{i}");
        let value = format!("value {i}");
        let written = writer.put(key.clone(), value.clone()).await.expect("put");
        assert_eq!(writer.last_write_index(), written.applied_index);
        let consistency = writer.read_your_writes();
        assert_eq!(
            consistency,
            Consistency::Stale {
                min_index: written.applied_index
            }
        );
        for (id, reader) in &readers {
            for consistency in [consistency, Consistency::Linearizable] {
                let entry = reader
                    .get_with(key.clone(), consistency)
                    .await
                    .unwrap_or_else(|err| panic!("member {id}: {err}"))
                    .unwrap_or_else(|| panic!("member {id} misses {key} ({consistency:?})"));
                assert_eq!(entry.value, value.as_bytes());
                assert_eq!(entry.seq, written.seq);
                assert_eq!(entry.revisions.mod_revision, written.revision);
                assert!(entry.applied_index >= written.applied_index);
            }
        }
    }
    assert_eq!(writer.leader(), Some(cluster.addr(leader)));
}
