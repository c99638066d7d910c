//! Range reads outside the log (`kvstate::range::range`) against an engine
//! filled through the applier: etcd's limit / more / count, count-only and
//! keys-only, every sort target and order, every revision filter, and the
//! keys a range never lists (expired, reserved). What the expected answers
//! are is worked out from etcd v3.5's `applierV3backend.Range`.

use std::sync::Arc;

use bitcask::{Engine, Options, SyncPolicy};
use kvstate::apply::Applier;
use kvstate::command::{Command, Op, Proposal, RESERVED_KEY_PREFIX, Request, SessionRef};
use kvstate::range::{
    RANGE_KEYS_MAX, RangeError, RangeResult, RangeSpec, SortOrder, SortTarget, range,
};
use vfs::sim::SimFs;

fn engine(fs: &SimFs) -> Engine {
    let opts = Options {
        sync: SyncPolicy::Never,
        auto_merge: None,
        segment_size_bytes: 4096,
        vfs: Arc::new(fs.clone()),
        ..Options::default()
    };
    Engine::open("/sm", opts).unwrap()
}

fn put(key: &[u8], value: &str, ttl_ms: u64) -> Request {
    Request {
        session: None,
        conditions: Vec::new(),
        ops: vec![Op::Put {
            key: key.to_vec(),
            value: value.into(),
            ttl_ms,
        }],
    }
}

/// The time every read of the fixture happens at: "e" has expired.
const NOW_MS: u64 = 10;
/// The store revision after the fixture.
const REVISION: u64 = 9;

/// One request per revision:
///
/// | key | value | create | mod | version |
/// |-----|-------|--------|-----|---------|
/// | a   | 5     | 2      | 5   | 2       |
/// | b   | 8     | 3      | 8   | 3       |
/// | c   | 2     | 4      | 4   | 1       |
/// | d   | 4     | 6      | 6   | 1       |
///
/// "e" (revision 9) expires at 10 ms; a session record (a reserved key)
/// is stored too.
fn fixture(fs: &SimFs) -> Engine {
    let engine = engine(fs);
    let mut applier = Applier::default();
    let mut with_session = put(b"c", "2", 0);
    with_session.session = Some(SessionRef {
        client_id: 1,
        sequence: 1,
        lowest_unacked: 1,
        opens: true,
    });
    let requests = vec![
        put(b"a", "3", 0),
        put(b"b", "1", 0),
        with_session,
        put(b"a", "5", 0),
        put(b"d", "4", 0),
        put(b"b", "0", 0),
        put(b"b", "8", 0),
        put(b"e", "gone", 10),
    ];
    let response = applier
        .apply(
            &engine,
            1,
            &Proposal {
                time_ms: 0,
                command: Command::Writes(requests),
            },
            Vec::new(),
        )
        .unwrap();
    assert_eq!(response.revision, REVISION);
    engine
}

fn read(engine: &Engine, spec: RangeSpec) -> RangeResult {
    range(engine, &spec, NOW_MS, REVISION).unwrap()
}

fn keys(result: &RangeResult) -> String {
    result
        .kvs
        .iter()
        .map(|kv| String::from_utf8_lossy(&kv.key).into_owned())
        .collect()
}

fn all() -> RangeSpec {
    RangeSpec::between("\0", "\0")
}

#[test]
fn a_range_returns_values_and_revisions_and_counts_its_keys() {
    let fs = SimFs::new();
    let engine = fixture(&fs);
    let result = read(&engine, all());
    assert_eq!(
        keys(&result),
        "abcd",
        "e expired, the session record is reserved"
    );
    assert_eq!((result.count, result.more), (4, false));
    let a = &result.kvs[0];
    assert_eq!(
        (
            a.value.as_slice(),
            a.create_revision,
            a.mod_revision,
            a.version,
            a.lease
        ),
        (&b"5"[..], 2, 5, 2, 0)
    );
    // The three shapes of a range end.
    assert_eq!(keys(&read(&engine, RangeSpec::key("b"))), "b");
    assert_eq!(keys(&read(&engine, RangeSpec::key("bb"))), "");
    assert_eq!(keys(&read(&engine, RangeSpec::between("b", "d"))), "bc");
    assert_eq!(keys(&read(&engine, RangeSpec::between("c", "\0"))), "cd");
    assert_eq!(keys(&read(&engine, RangeSpec::between("d", "a"))), "");
    // An expired key is absent even when named alone.
    assert_eq!(read(&engine, RangeSpec::key("e")).count, 0);
}

#[test]
fn limit_more_count_count_only_and_keys_only() {
    let fs = SimFs::new();
    let engine = fixture(&fs);
    let limited = read(&engine, RangeSpec { limit: 2, ..all() });
    assert_eq!(
        (keys(&limited), limited.more, limited.count),
        ("ab".into(), true, 4)
    );
    let exact = read(&engine, RangeSpec { limit: 4, ..all() });
    assert_eq!((keys(&exact), exact.more), ("abcd".into(), false));
    let counted = read(
        &engine,
        RangeSpec {
            count_only: true,
            limit: 1,
            ..all()
        },
    );
    assert_eq!(
        counted,
        RangeResult {
            kvs: Vec::new(),
            more: false,
            count: 4
        }
    );
    let keys_only = read(
        &engine,
        RangeSpec {
            keys_only: true,
            ..all()
        },
    );
    assert_eq!(keys(&keys_only), "abcd");
    assert!(keys_only.kvs.iter().all(|kv| kv.value.is_empty()));
    assert_eq!(keys_only.kvs[1].mod_revision, 8, "revisions still there");
}

/// A store past the visit limit: a range with a limit in key order, or
/// count-only, visits its first keys and counts the rest from the key
/// directory, as etcd answers it (`get --prefix --limit 1`, `--count-only`,
/// clientv3's `WithFirstKey`); a read that must visit every key is still
/// refused naming the limit.
#[test]
fn a_limit_or_count_only_counts_past_the_visit_limit() {
    let fs = SimFs::new();
    let engine = engine(&fs);
    let mut applier = Applier::default();
    let keys_total = RANGE_KEYS_MAX + 5;
    let key = |i: usize| format!("p/{i:07}").into_bytes();
    for (index, chunk) in (0..keys_total)
        .collect::<Vec<_>>()
        .chunks(10_000)
        .enumerate()
    {
        let requests = chunk.iter().map(|&i| put(&key(i), "v", 0)).collect();
        applier
            .apply(
                &engine,
                index as u64 + 1,
                &Proposal {
                    time_ms: 0,
                    command: Command::Writes(requests),
                },
                Vec::new(),
            )
            .unwrap();
    }
    let revision = applier.header().revision;
    let prefix = RangeSpec::between("p/", "p0");
    let read = |spec: RangeSpec| range(&engine, &spec, NOW_MS, revision);
    let first = read(RangeSpec {
        limit: 1,
        ..prefix.clone()
    })
    .unwrap();
    assert_eq!(first.kvs.len(), 1);
    assert_eq!(first.kvs[0].key, key(0));
    assert_eq!(first.kvs[0].value, b"v");
    assert!(first.more);
    assert_eq!(first.count, keys_total as u64);
    let ascending = read(RangeSpec {
        limit: 2,
        sort_order: SortOrder::Ascend,
        sort_target: SortTarget::Key,
        ..prefix.clone()
    })
    .unwrap();
    assert_eq!(ascending.kvs.len(), 2);
    assert_eq!(ascending.kvs[1].key, key(1));
    assert_eq!(ascending.count, keys_total as u64);
    // Part of the range: the count is of the range, not of the store.
    let part = read(RangeSpec {
        key: key(keys_total - 3),
        range_end: b"p0".to_vec(),
        limit: 1,
        ..RangeSpec::default()
    })
    .unwrap();
    assert_eq!((part.count, part.more), (3, true));
    let counted = read(RangeSpec {
        count_only: true,
        ..prefix.clone()
    })
    .unwrap();
    assert_eq!(counted.count, keys_total as u64);
    assert!(counted.kvs.is_empty());
    // Every key, or a descending sort, visits every key: refused by name.
    for refused in [
        prefix.clone(),
        RangeSpec {
            limit: 1,
            sort_order: SortOrder::Descend,
            ..prefix.clone()
        },
    ] {
        let error = read(refused).unwrap_err();
        assert!(
            matches!(
                error,
                RangeError::TooManyKeys {
                    limit: "RANGE_KEYS_MAX",
                    ..
                }
            ),
            "{error}"
        );
    }
}

#[test]
fn every_sort_target_in_both_orders() {
    let fs = SimFs::new();
    let engine = fixture(&fs);
    let sorted = |target, order| {
        keys(&read(
            &engine,
            RangeSpec {
                sort_target: target,
                sort_order: order,
                ..all()
            },
        ))
    };
    use SortOrder::{Ascend, Descend};
    use SortTarget::{Create, Key, Mod, Value, Version};
    for (target, ascending, descending) in [
        (Key, "abcd", "dcba"),
        // c and d tie at version 1: they stay in key order both ways.
        (Version, "cdab", "bacd"),
        (Create, "abcd", "dcba"),
        (Mod, "cadb", "bdac"),
        (Value, "cdab", "badc"),
    ] {
        assert_eq!(sorted(target, Ascend), ascending, "{target:?} ascending");
        assert_eq!(sorted(target, Descend), descending, "{target:?} descending");
    }
    // No order: key order for the key, ascending for any other target.
    assert_eq!(sorted(Key, SortOrder::None), "abcd");
    assert_eq!(sorted(Mod, SortOrder::None), "cadb");
    // A sort order fetches every key before the limit: the two highest
    // mod revisions of all four keys.
    let top = read(
        &engine,
        RangeSpec {
            sort_target: Mod,
            sort_order: Descend,
            limit: 2,
            ..all()
        },
    );
    assert_eq!((keys(&top), top.more, top.count), ("bd".into(), true, 4));
}

/// etcd fetches every key only when a sort *order* (or a filter) is set:
/// with a target but no order it fetches `limit + 1` keys in key order
/// (a, b, c), sorts those ascending and cuts. Copied as it is.
#[test]
fn a_sort_target_without_an_order_sorts_only_the_keys_fetched() {
    let fs = SimFs::new();
    let engine = fixture(&fs);
    let result = read(
        &engine,
        RangeSpec {
            sort_target: SortTarget::Version,
            limit: 2,
            ..all()
        },
    );
    // Versions: a 2, b 3, c 1 (d, version 1, was not fetched).
    assert_eq!((keys(&result), result.more), ("ca".into(), true));
}

#[test]
fn every_revision_filter() {
    let fs = SimFs::new();
    let engine = fixture(&fs);
    let filtered = |spec: RangeSpec| {
        let result = read(&engine, spec);
        assert_eq!(result.count, 4, "count is before the filters");
        keys(&result)
    };
    assert_eq!(
        filtered(RangeSpec {
            min_mod_revision: 5,
            ..all()
        }),
        "abd"
    );
    assert_eq!(
        filtered(RangeSpec {
            max_mod_revision: 5,
            ..all()
        }),
        "ac"
    );
    assert_eq!(
        filtered(RangeSpec {
            min_create_revision: 4,
            ..all()
        }),
        "cd"
    );
    assert_eq!(
        filtered(RangeSpec {
            max_create_revision: 3,
            ..all()
        }),
        "ab"
    );
    assert_eq!(
        filtered(RangeSpec {
            min_mod_revision: 5,
            max_create_revision: 3,
            ..all()
        }),
        "ab"
    );
    // A filter fetches every key first, then cuts to the limit.
    let limited = read(
        &engine,
        RangeSpec {
            min_create_revision: 3,
            limit: 2,
            ..all()
        },
    );
    assert_eq!((keys(&limited), limited.more), ("bc".into(), true));
}

#[test]
fn reserved_keys_are_never_listed_but_keys_past_them_are() {
    let fs = SimFs::new();
    let engine = fixture(&fs);
    // A user key sorting after the reserved block.
    let past = vec![0xff, 0xff, b's'];
    Applier::load(&engine)
        .unwrap()
        .apply(
            &engine,
            2,
            &Proposal {
                time_ms: NOW_MS,
                command: Command::Writes(vec![put(&past, "p", 0)]),
            },
            Vec::new(),
        )
        .unwrap();
    let result = range(&engine, &all(), NOW_MS, REVISION + 1).unwrap();
    assert_eq!(result.count, 5);
    assert_eq!(result.kvs.last().unwrap().key, past);
    let reserved = [RESERVED_KEY_PREFIX, b"session/"].concat();
    assert!(result.kvs.iter().all(|kv| !kv.key.starts_with(&reserved)));
    // Naming a reserved key is refused, as every request does.
    let error = range(&engine, &RangeSpec::key(reserved), NOW_MS, REVISION + 1).unwrap_err();
    assert!(matches!(error, RangeError::ReservedKey { .. }), "{error}");
}

#[test]
fn revisions_other_than_the_current_one_and_empty_keys_are_refused() {
    let fs = SimFs::new();
    let engine = fixture(&fs);
    let at = |revision| range(&engine, &RangeSpec { revision, ..all() }, NOW_MS, REVISION);
    assert_eq!(at(REVISION).unwrap().count, 4);
    let future = at(REVISION + 1).unwrap_err();
    assert!(
        matches!(
            future,
            RangeError::FutureRevision {
                requested: 10,
                current: 9
            }
        ),
        "{future}"
    );
    assert!(future.to_string().contains("future revision"));
    assert!(matches!(at(3), Err(RangeError::PastRevision { .. })));
    let empty = range(&engine, &RangeSpec::key(""), NOW_MS, REVISION).unwrap_err();
    assert!(empty.to_string().contains("key is not provided"), "{empty}");
}
