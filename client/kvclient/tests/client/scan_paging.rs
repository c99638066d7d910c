//! Proves: scans page correctly across thousands of keys — every key of the
//! range exactly once, in byte order, over many pages (small and odd page
//! sizes), for the whole space, a prefix, a `[from, to)` range and a
//! keys-only scan; and a stale scan with read-your-writes on each member.

use kvclient::{Batch, Client, KeyValue, Scan};
use prost::bytes::Bytes;
use tokio_stream::StreamExt;

use crate::harness::{Cluster, MEMBERS};

/// Keys written (in batches).
const KEYS: usize = 3000;
/// Keys per batch.
const BATCH_KEYS: usize = 250;

fn key(i: usize) -> String {
    format!("k/{i:05}")
}

async fn collect(client: &Client, scan: Scan) -> Vec<KeyValue> {
    let mut out = Vec::new();
    let mut stream = client.scan(scan);
    while let Some(kv) = stream.next().await {
        out.push(kv.expect("scan"));
        assert!(out.len() <= KEYS * 2, "the scan does not end");
    }
    out
}

fn keys(entries: &[KeyValue]) -> Vec<String> {
    entries
        .iter()
        .map(|e| String::from_utf8(e.key.to_vec()).expect("utf-8"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn scans_page_across_thousands_of_keys() {
    let cluster = Cluster::start().await;
    let client = Client::builder(cluster.endpoints())
        .build()
        .expect("client");
    for chunk in (0..KEYS).collect::<Vec<_>>().chunks(BATCH_KEYS) {
        let mut batch = Batch::new();
        for i in chunk {
            batch = batch.put(key(*i), format!("v{i}"));
        }
        client.batch(batch).await.expect("batch");
    }
    client.put("other", "x").await.expect("put");
    let expected: Vec<String> = (0..KEYS).map(key).collect();

    let all = collect(&client, Scan::all().page_size(97)).await;
    let mut want = expected.clone();
    want.push("other".into());
    assert_eq!(keys(&all), want);
    for (i, e) in all.iter().take(KEYS).enumerate() {
        assert_eq!(e.value, format!("v{i}").as_bytes());
    }

    let prefix = collect(&client, Scan::prefix("k/").page_size(100)).await;
    assert_eq!(keys(&prefix), expected);

    let ranged = collect(
        &client,
        Scan::range(key(1234), Some(Bytes::from(key(2345)))).page_size(7),
    )
    .await;
    assert_eq!(keys(&ranged), expected[1234..2345].to_vec());

    let keys_only = collect(&client, Scan::prefix("k/").keys_only().page_size(500)).await;
    assert_eq!(keys(&keys_only), expected);
    assert!(keys_only.iter().all(|e| e.value.is_empty()));

    // Pages by hand: many pages, each resuming after the last.
    let scan = Scan::prefix("k/").page_size(256);
    let mut after = None;
    let mut pages = 0;
    let mut seen = 0;
    loop {
        let page = client.scan_page(&scan, after).await.expect("page");
        pages += 1;
        seen += page.entries.len();
        assert!(pages <= KEYS, "too many pages");
        match page.next_after {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    assert_eq!(seen, KEYS);
    assert!(pages >= KEYS / 256, "only {pages} pages");

    // A stale scan with read-your-writes on every member sees everything.
    for id in 1..=MEMBERS {
        let reader = Client::builder([cluster.addr(id)]).build().expect("client");
        let got = collect(
            &reader,
            Scan::prefix("k/")
                .page_size(1000)
                .consistency(client.read_your_writes()),
        )
        .await;
        assert_eq!(got.len(), KEYS, "member {id}");
    }
}
