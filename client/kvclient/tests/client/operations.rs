//! Proves the calls and their errors against a live cluster: a missing key
//! is `Ok(None)`; put with TTL reports the TTL left; if-version / if-absent
//! mismatches carry the key's current version; conditional delete; expire
//! and persist (and `Ok(None)` for a missing key); batches with conditions
//! (failed condition index, missing key op index); an over-limit key is
//! InvalidArgument naming `KEY_SIZE_BYTES_MAX`; membership and saved
//! snapshots surface the server's UNIMPLEMENTED; status lists the members;
//! a client with no reachable member (connection refused) reports
//! Unavailable for a read and for a write (nothing was sent).

use std::time::Duration;

use kvclient::{Batch, Client, Error, PutOptions};

use crate::harness::{Cluster, MEMBERS};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn calls_and_errors() {
    let cluster = Cluster::start().await;
    let client = Client::connect(cluster.endpoints()).await.expect("connect");
    let leader = cluster.leader().await;
    assert_eq!(client.leader(), Some(cluster.addr(leader)));

    assert_eq!(client.get("missing").await.expect("get"), None);

    let a = client
        .put_with(
            "a",
            "1",
            PutOptions::default().ttl(Duration::from_secs(600)),
        )
        .await
        .expect("put");
    let entry = client.get("a").await.expect("get").expect("a exists");
    assert_eq!(entry.seq, a.seq);
    assert_eq!(entry.revisions.mod_revision, a.revision);
    assert_eq!(entry.revisions.create_revision, a.revision);
    assert_eq!(entry.revisions.version, 1);
    assert!(entry.revision >= a.revision);
    let ttl = entry.ttl_left.expect("a has a TTL");
    assert!(ttl > Duration::from_secs(500) && ttl <= Duration::from_secs(600));

    match client
        .put_with(
            "a",
            "2",
            PutOptions::default().if_mod_revision(a.revision + 1),
        )
        .await
    {
        Err(Error::VersionMismatch {
            condition_index: 0,
            current_mod_revision,
        }) => assert_eq!(current_mod_revision, a.revision),
        other => panic!("expected a revision mismatch, got {other:?}"),
    }
    match client
        .put_with("a", "2", PutOptions::default().if_absent())
        .await
    {
        Err(Error::VersionMismatch {
            current_mod_revision,
            ..
        }) => assert_eq!(current_mod_revision, a.revision),
        other => panic!("expected a revision mismatch, got {other:?}"),
    }
    let a2 = client
        .put_with("a", "2", PutOptions::default().if_mod_revision(a.revision))
        .await
        .expect("conditional put");
    assert!(a2.seq > a.seq);
    assert_eq!(a2.revision, a.revision + 1);

    let persisted = client.persist("a").await.expect("persist").expect("found");
    let entry = client.get("a").await.expect("get").expect("a exists");
    assert_eq!(entry.ttl_left, None);
    assert_eq!(entry.seq, persisted.seq);
    assert_eq!(
        (entry.revisions.create_revision, entry.revisions.version),
        (a.revision, 3),
        "a persist is a change of the key"
    );
    let expired = client
        .expire("a", Duration::from_secs(100))
        .await
        .expect("expire")
        .expect("found");
    assert!(expired.seq > persisted.seq);
    assert_eq!(expired.revision, persisted.revision + 1);
    assert!(
        client
            .get("a")
            .await
            .expect("get")
            .expect("a")
            .ttl_left
            .is_some()
    );
    assert_eq!(
        client
            .expire("nope", Duration::from_secs(1))
            .await
            .expect("expire"),
        None
    );
    assert_eq!(client.persist("nope").await.expect("persist"), None);

    assert!(matches!(
        client.delete_if_mod_revision("a", 1).await,
        Err(Error::VersionMismatch { current_mod_revision, .. }) if current_mod_revision == expired.revision
    ));
    let removed = client
        .delete_if_mod_revision("a", expired.revision)
        .await
        .expect("delete");
    assert!(removed.found);
    assert_eq!(removed.revision, expired.revision + 1);
    let again = client.delete("a").await.expect("delete");
    assert!(!again.found);
    assert_eq!(
        again.revision, removed.revision,
        "a delete of nothing changes nothing"
    );

    let applied = client
        .batch(
            Batch::new()
                .check_absent("b")
                .put("b", "1")
                .put("c", "2")
                .delete("zz"),
        )
        .await
        .expect("batch");
    assert_eq!(applied.results.len(), 3);
    assert_eq!(
        applied.results[2].seq, 0,
        "deleting an absent key writes nothing"
    );
    assert!(matches!(
        client
            .batch(Batch::new().check_absent("x").check_absent("b").put("d", "1"))
            .await,
        Err(Error::VersionMismatch { condition_index: 1, current_mod_revision }) if current_mod_revision == applied.revision
    ));
    assert!(matches!(
        client
            .batch(Batch::new().put("d", "1").persist("nope"))
            .await,
        Err(Error::KeyNotFound { op_index: 1 })
    ));
    assert_eq!(client.get("d").await.expect("get"), None, "nothing applied");

    match client.put(vec![b'k'; 4097], "v").await {
        Err(Error::InvalidArgument { message, limit }) => {
            assert!(message.contains("KEY_SIZE_BYTES_MAX"), "{message}");
            assert_eq!(limit.expect("limit detail").limit, "KEY_SIZE_BYTES_MAX");
        }
        other => panic!("expected invalid argument, got {other:?}"),
    }

    assert!(matches!(
        client
            .add_learner(0, "127.0.0.1:1", "127.0.0.1:2", false)
            .await,
        Err(Error::InvalidArgument { .. })
    ));
    assert!(matches!(
        client.remove_member(99).await,
        Err(Error::Rpc {
            code: tonic::Code::FailedPrecondition,
            ..
        })
    ));
    // A saved snapshot: the manifest first, then every listed file's bytes
    // in order, chunk offsets contiguous.
    {
        use kvclient::kvproto::cluster::v1::save_snapshot_response::Part;
        use tokio_stream::StreamExt as _;
        let mut stream = client.save_snapshot(true).await.expect("save snapshot");
        let first = stream.next().await.expect("a first message").expect("ok");
        let Some(Part::Manifest(manifest)) = first.part else {
            panic!("the first message is not the manifest: {first:?}");
        };
        assert!(!manifest.files.is_empty() && !manifest.encoded.is_empty());
        let mut received: Vec<(String, u64)> = Vec::new();
        while let Some(message) = stream.next().await {
            let Some(Part::Chunk(chunk)) = message.expect("chunk").part else {
                panic!("a second manifest");
            };
            match received.last_mut() {
                Some((name, len)) if *name == chunk.file_name => {
                    assert_eq!(chunk.offset_bytes, *len, "chunks of {name} in order");
                    *len += chunk.data.len() as u64;
                }
                _ => {
                    assert_eq!(chunk.offset_bytes, 0, "{} starts at 0", chunk.file_name);
                    received.push((chunk.file_name.clone(), chunk.data.len() as u64));
                }
            }
        }
        let listed: Vec<(String, u64)> = manifest
            .files
            .iter()
            .map(|f| (f.name.clone(), f.length_bytes))
            .filter(|(_, len)| *len > 0)
            .collect();
        received.retain(|(_, len)| *len > 0);
        assert_eq!(received, listed, "every listed file, whole, in order");
    }

    let status = client.status().await.expect("status");
    assert_eq!(status.members.len(), MEMBERS as usize);
    assert_eq!(
        client.members().await.expect("members").len(),
        MEMBERS as usize
    );

    // Nobody listens on this port (bound, then released).
    let dead = {
        let socket = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        socket.local_addr().expect("addr").to_string()
    };
    let lonely = Client::builder([dead])
        .attempts(3)
        .operation_timeout(Duration::from_secs(10))
        .build()
        .expect("client");
    assert!(matches!(
        lonely.get("a").await,
        Err(Error::Unavailable { attempts: 3, .. })
    ));
    // A refused connection sent nothing: the write surely did not apply.
    let r = lonely.put("a", "1").await;
    assert!(
        matches!(r, Err(Error::Unavailable { attempts: 3, .. })),
        "{r:?}"
    );
}
