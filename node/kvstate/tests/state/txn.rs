//! Transactions applied through `Applier::apply` (`Command::Txns`), checked
//! against what etcd v3.5 answers: every compare operator on every target,
//! both branches, compares over ranges and absent keys, range deletes,
//! reads that see the transaction's earlier writes, one revision per
//! changing transaction, etcd's refusals (duplicate keys, too many ops,
//! ignore_value on an absent key), the read budgets, exactly-once retries,
//! TTLs and reserved keys, and byte-identical replicas.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bitcask::{Engine, Options, SyncPolicy};
use kvstate::apply::Applier;
use kvstate::command::{
    Answer, Command, ENTRY_OPS_MAX, EntryResponse, LeaseRequest, Op, Outcome, Proposal,
    RESERVED_KEY_PREFIX, Request, SESSION_ANSWER_BYTES_MAX, SessionRef,
};
use kvstate::lease::LeaseOp;
use kvstate::range::{KeyValue, RangeResult, RangeSpec, range};
use kvstate::revision::KeyMeta;
use kvstate::txn::{
    Compare, CompareResult, CompareTarget, TXN_OPS_MAX, TXN_READ_BYTES_MAX, TXN_READ_KEYS_MAX,
    TxnOp, TxnOpResult, TxnRequest,
};
use vfs::sim::SimFs;

fn options(fs: &SimFs) -> Options {
    Options {
        sync: SyncPolicy::Never,
        auto_merge: None,
        segment_size_bytes: 4096,
        vfs: Arc::new(fs.clone()),
        ..Options::default()
    }
}

/// An engine and its applier, applying one entry after another.
struct Store {
    engine: Engine,
    applier: Applier,
    index: u64,
    time_ms: u64,
}

impl Store {
    fn new(fs: &SimFs) -> Store {
        Store {
            engine: Engine::open("/sm", options(fs)).unwrap(),
            applier: Applier::default(),
            index: 0,
            time_ms: 0,
        }
    }

    fn apply(&mut self, command: Command) -> EntryResponse {
        self.index += 1;
        let proposal = Proposal {
            time_ms: self.time_ms,
            command,
        };
        self.applier
            .apply(&self.engine, self.index, &proposal, Vec::new())
            .unwrap()
    }

    fn txns(&mut self, txns: Vec<TxnRequest>) -> Vec<Answer> {
        self.apply(Command::Txns(txns)).answers
    }

    fn txn(&mut self, txn: TxnRequest) -> Answer {
        self.txns(vec![txn]).remove(0)
    }

    fn writes(&mut self, ops: Vec<Op>) -> u64 {
        self.apply(Command::Writes(vec![Request {
            session: None,
            conditions: Vec::new(),
            ops,
        }]))
        .revision
    }

    fn revision(&self) -> u64 {
        self.applier.header().revision
    }

    /// Grants lease `id` (a grant takes no revision).
    fn grant(&mut self, id: u64) {
        let answers = self.apply(grant(id)).answers;
        assert!(
            matches!(answers[0].outcome, Outcome::Lease(_)),
            "{answers:?}"
        );
    }

    fn get(&self, key: &str) -> Option<KeyValue> {
        let spec = RangeSpec::key(key);
        range(&self.engine, &spec, self.time_ms, self.revision())
            .unwrap()
            .kvs
            .pop()
    }

    fn value(&self, key: &str) -> Option<String> {
        self.get(key).map(|kv| String::from_utf8(kv.value).unwrap())
    }
}

/// An entry granting lease `id` for a long time.
fn grant(id: u64) -> Command {
    Command::Leases(vec![LeaseRequest {
        session: None,
        op: LeaseOp::Grant {
            id,
            ttl_ms: 1 << 40,
        },
    }])
}

fn op_put(key: &str, value: &str) -> Op {
    Op::Put {
        key: key.into(),
        value: value.into(),
        ttl_ms: 0,
    }
}

/// A put's fields, to set a few with `..put_op(key, value)`.
#[derive(Clone, Debug)]
struct PutOp {
    key: String,
    value: String,
    ttl_ms: u64,
    lease: u64,
    prev_kv: bool,
    ignore_value: bool,
    ignore_lease: bool,
}

impl PutOp {
    fn op(self) -> TxnOp {
        TxnOp::Put {
            key: self.key.into(),
            value: self.value.into(),
            ttl_ms: self.ttl_ms,
            lease: self.lease,
            prev_kv: self.prev_kv,
            ignore_value: self.ignore_value,
            ignore_lease: self.ignore_lease,
        }
    }
}

fn put_op(key: &str, value: &str) -> PutOp {
    PutOp {
        key: key.into(),
        value: value.into(),
        ttl_ms: 0,
        lease: 0,
        prev_kv: false,
        ignore_value: false,
        ignore_lease: false,
    }
}

fn put(key: &str, value: &str) -> TxnOp {
    put_op(key, value).op()
}

fn delete(key: &str, range_end: &str, prev_kv: bool) -> TxnOp {
    TxnOp::DeleteRange {
        key: key.into(),
        range_end: range_end.into(),
        prev_kv,
    }
}

fn get(key: &str, range_end: &str) -> TxnOp {
    TxnOp::Range(RangeSpec::between(key, range_end))
}

fn compare(key: &str, range_end: &str, target: CompareTarget, result: CompareResult) -> Compare {
    Compare {
        key: key.into(),
        range_end: range_end.into(),
        target,
        result,
    }
}

fn txn(compares: Vec<Compare>, success: Vec<TxnOp>, failure: Vec<TxnOp>) -> TxnRequest {
    TxnRequest {
        session: None,
        compares,
        success,
        failure,
    }
}

/// The branch taken and the results of a transaction that applied.
fn applied(answer: &Answer) -> (bool, &[TxnOpResult]) {
    match &answer.outcome {
        Outcome::Txn { succeeded, results } => (*succeeded, results),
        other => panic!("expected a transaction's outcome, got {other:?}"),
    }
}

fn rejected(answer: &Answer) -> &str {
    match &answer.outcome {
        Outcome::Rejected { reason } => reason,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

fn range_result(result: &TxnOpResult) -> &RangeResult {
    match result {
        TxnOpResult::Range(result) => result,
        other => panic!("expected a range result, got {other:?}"),
    }
}

fn keys(kvs: &[KeyValue]) -> String {
    kvs.iter()
        .map(|kv| String::from_utf8_lossy(&kv.key).into_owned())
        .collect()
}

#[test]
fn every_compare_operator_on_every_target() {
    let fs = SimFs::new();
    let mut store = Store::new(&fs);
    store.writes(vec![op_put("k", "old")]); // revision 2: created
    store.writes(vec![op_put("other", "x")]); // 3
    store.grant(7);
    let leased = PutOp {
        lease: 7,
        ..put_op("k", "m")
    }
    .op();
    store.txn(txn(vec![], vec![leased], vec![])); // 4: k modified
    let k = store.get("k").unwrap();
    assert_eq!(
        (k.create_revision, k.mod_revision, k.version, k.lease),
        (2, 4, 2, 7)
    );
    use CompareResult::{Equal, Greater, Less, NotEqual};
    // (target with a value below k's, k's own, one above)
    let targets: Vec<[CompareTarget; 3]> = vec![
        [
            CompareTarget::Value(b"l".to_vec()),
            CompareTarget::Value(b"m".to_vec()),
            CompareTarget::Value(b"ma".to_vec()),
        ],
        [
            CompareTarget::Version(1),
            CompareTarget::Version(2),
            CompareTarget::Version(3),
        ],
        [
            CompareTarget::CreateRevision(1),
            CompareTarget::CreateRevision(2),
            CompareTarget::CreateRevision(3),
        ],
        [
            CompareTarget::ModRevision(3),
            CompareTarget::ModRevision(4),
            CompareTarget::ModRevision(5),
        ],
        [
            CompareTarget::Lease(6),
            CompareTarget::Lease(7),
            CompareTarget::Lease(8),
        ],
    ];
    // k's side against (below, equal, above).
    let expected = [
        (Equal, [false, true, false]),
        (NotEqual, [true, false, true]),
        (Less, [false, false, true]),
        (Greater, [true, false, false]),
    ];
    let mut txns = Vec::new();
    let mut wanted = Vec::new();
    for target in &targets {
        for (result, holds) in &expected {
            for (value, holds) in target.iter().zip(holds) {
                txns.push(txn(
                    vec![compare("k", "", value.clone(), *result)],
                    vec![get("k", "")],
                    vec![],
                ));
                wanted.push((value.clone(), *result, *holds));
            }
        }
    }
    let answers = store.txns(txns);
    assert_eq!(answers.len(), 5 * 4 * 3);
    for (answer, (target, result, holds)) in answers.iter().zip(wanted) {
        let (succeeded, results) = applied(answer);
        assert_eq!(succeeded, holds, "{target:?} {result:?}");
        assert_eq!(results.len(), usize::from(holds), "only success has ops");
        assert_eq!(answer.revision, 4, "read-only: the revision stays");
    }
}

#[test]
fn both_branches_apply_their_own_ops() {
    let fs = SimFs::new();
    let mut store = Store::new(&fs);
    store.writes(vec![op_put("k", "v")]);
    let guarded = |value: &str| {
        txn(
            vec![compare(
                "k",
                "",
                CompareTarget::Value(value.into()),
                CompareResult::Equal,
            )],
            vec![put("then", value)],
            vec![put("else", value), get("k", "")],
        )
    };
    let answers = store.txns(vec![guarded("v"), guarded("w")]);
    assert!(applied(&answers[0]).0);
    assert_eq!(
        applied(&answers[0]).1,
        &[TxnOpResult::Put { prev_kv: None }]
    );
    let (succeeded, results) = applied(&answers[1]);
    assert!(!succeeded);
    assert_eq!(keys(&range_result(&results[1]).kvs), "k");
    assert_eq!(store.value("then").as_deref(), Some("v"));
    assert_eq!(store.value("else").as_deref(), Some("w"));
    assert_eq!(
        answers.iter().map(|a| a.revision).collect::<Vec<_>>(),
        vec![3, 4]
    );
}

#[test]
fn compares_over_a_range_need_every_key_and_absent_keys_compare_as_zeros() {
    let fs = SimFs::new();
    let mut store = Store::new(&fs);
    store.writes(vec![op_put("a1", "x"), op_put("a2", "x")]); // 2
    store.writes(vec![op_put("a3", "y")]); // 3
    let holds = |store: &mut Store, compare: Compare| {
        applied(&store.txn(txn(vec![compare], vec![], vec![]))).0
    };
    let value = |v: &str| CompareTarget::Value(v.into());
    use CompareResult::{Equal, Greater, Less, NotEqual};
    assert!(
        !holds(&mut store, compare("a", "b", value("x"), Equal)),
        "a3 is y"
    );
    assert!(holds(&mut store, compare("a", "a3", value("x"), Equal)));
    assert!(holds(
        &mut store,
        compare("a", "\0", CompareTarget::CreateRevision(1), Greater)
    ));
    assert!(!holds(
        &mut store,
        compare("a", "\0", CompareTarget::ModRevision(3), Less)
    ));
    // No key there: a value compare never holds, whatever the operator ...
    for result in [Equal, NotEqual, Less, Greater] {
        assert!(!holds(&mut store, compare("none", "", value(""), result)));
        assert!(!holds(&mut store, compare("b", "c", value("x"), result)));
    }
    // ... and the rest compare zeros: "the key does not exist" is version 0.
    assert!(holds(
        &mut store,
        compare("none", "", CompareTarget::Version(0), Equal)
    ));
    assert!(holds(
        &mut store,
        compare("none", "", CompareTarget::CreateRevision(1), Less)
    ));
    assert!(holds(
        &mut store,
        compare("b", "c", CompareTarget::ModRevision(0), Equal)
    ));
    assert!(holds(
        &mut store,
        compare("none", "", CompareTarget::Lease(0), Equal)
    ));
    assert!(!holds(
        &mut store,
        compare("none", "", CompareTarget::Version(0), Greater)
    ));
    assert_eq!(store.revision(), 3);
}

#[test]
fn a_range_delete_returns_what_it_deleted() {
    let fs = SimFs::new();
    let mut store = Store::new(&fs);
    store.writes(vec![op_put("a", "1"), op_put("b", "2"), op_put("c", "3")]); // 2
    store.writes(vec![op_put("b", "22")]); // 3
    let answer = store.txn(txn(
        vec![],
        vec![
            delete("a", "c", true),
            delete("zzz", "", true),
            delete("b", "\0", false),
        ],
        vec![],
    ));
    let (_, results) = applied(&answer);
    let TxnOpResult::DeleteRange { deleted, prev_kvs } = &results[0] else {
        panic!("{results:?}");
    };
    assert_eq!(*deleted, 2);
    assert_eq!(
        prev_kvs,
        &vec![
            KeyValue {
                key: b"a".to_vec(),
                value: b"1".to_vec(),
                create_revision: 2,
                mod_revision: 2,
                version: 1,
                lease: 0,
            },
            KeyValue {
                key: b"b".to_vec(),
                value: b"22".to_vec(),
                create_revision: 2,
                mod_revision: 3,
                version: 2,
                lease: 0,
            },
        ]
    );
    assert_eq!(
        results[1],
        TxnOpResult::DeleteRange {
            deleted: 0,
            prev_kvs: vec![]
        }
    );
    // Deletes may overlap: b is gone already, c is what is left.
    assert_eq!(
        results[2],
        TxnOpResult::DeleteRange {
            deleted: 1,
            prev_kvs: vec![]
        }
    );
    assert_eq!(answer.revision, 4, "three deletes, one revision");
    for key in ["a", "b", "c"] {
        assert_eq!(store.get(key), None, "{key}");
    }
}

#[test]
fn reads_inside_a_transaction_see_its_earlier_writes() {
    let fs = SimFs::new();
    let mut store = Store::new(&fs);
    store.writes(vec![op_put("a", "1"), op_put("b", "2")]); // 2
    // The store revision once the entry's first request wrote c.
    let before = TxnOp::Range(RangeSpec {
        revision: 3,
        ..RangeSpec::between("a", "\0")
    });
    let answers = store.txns(vec![
        // An earlier request of the same entry writes c.
        txn(vec![], vec![put("c", "3")], vec![]),
        txn(
            vec![],
            vec![
                get("a", "\0"),
                put("a", "10"),
                delete("b", "", false),
                get("a", "\0"),
                before,
            ],
            vec![],
        ),
    ]);
    let (_, results) = applied(&answers[1]);
    let first = range_result(&results[0]);
    assert_eq!(keys(&first.kvs), "abc", "sees the entry's earlier request");
    let after = range_result(&results[3]);
    assert_eq!(keys(&after.kvs), "ac");
    assert_eq!(after.count, 2);
    assert_eq!(after.kvs[0].value, b"10");
    assert_eq!(
        (after.kvs[0].mod_revision, after.kvs[0].version),
        (4, 2),
        "the transaction's own revision"
    );
    // The revision before the transaction reads the state before it.
    let before = range_result(&results[4]);
    assert_eq!(keys(&before.kvs), "abc");
    assert_eq!(before.kvs[0].value, b"1");
    // A revision past that one is a future revision: all refused.
    let future = TxnOp::Range(RangeSpec {
        revision: 5,
        ..RangeSpec::key("a")
    });
    let answer = store.txn(txn(vec![], vec![put("x", "1"), future], vec![]));
    let reason = rejected(&answer);
    assert!(
        reason.contains("success[1]")
            && reason.contains("future revision")
            && reason.contains("is 5")
            && reason.contains("store revision is 4"),
        "{reason}"
    );
    assert_eq!(store.get("x"), None);
    assert_eq!(answer.revision, 4);
}

#[test]
fn a_changing_transaction_takes_one_revision_and_others_take_none() {
    let fs = SimFs::new();
    let mut store = Store::new(&fs);
    let gauge = Arc::new(AtomicU64::new(0));
    store.applier = Applier::default().with_published_revision(gauge.clone());
    store.writes(vec![op_put("a", "1")]); // 2
    let three = txn(
        vec![],
        vec![put("a", "2"), put("b", "1"), put("c", "1")],
        vec![],
    );
    let read_only = txn(vec![], vec![get("a", "\0")], vec![]);
    let failed = txn(
        vec![compare(
            "a",
            "",
            CompareTarget::Version(9),
            CompareResult::Equal,
        )],
        vec![put("a", "never")],
        vec![get("a", "")],
    );
    let nothing_deleted = txn(vec![], vec![delete("none", "\0", false)], vec![]);
    let failed_with_writes = txn(
        vec![compare(
            "a",
            "",
            CompareTarget::Version(9),
            CompareResult::Equal,
        )],
        vec![],
        vec![put("d", "1")],
    );
    let response = store.apply(Command::Txns(vec![
        three,
        read_only,
        failed,
        nothing_deleted,
        failed_with_writes,
    ]));
    assert_eq!(
        response
            .answers
            .iter()
            .map(|a| a.revision)
            .collect::<Vec<_>>(),
        vec![3, 3, 3, 3, 4]
    );
    assert_eq!((response.revision, gauge.load(Ordering::SeqCst)), (4, 4));
    let meta = |key: &str| {
        let kv = store.get(key).unwrap();
        KeyMeta {
            create_revision: kv.create_revision,
            mod_revision: kv.mod_revision,
            version: kv.version,
            lease: kv.lease,
        }
    };
    assert_eq!(
        meta("a"),
        KeyMeta {
            create_revision: 2,
            mod_revision: 3,
            version: 2,
            lease: 0
        }
    );
    assert_eq!(meta("b"), KeyMeta::created(3, 0));
    assert_eq!(meta("c"), KeyMeta::created(3, 0));
    assert_eq!(meta("d"), KeyMeta::created(4, 0));
    // The revision is in the commit record: a reloaded applier goes on from it.
    assert_eq!(Applier::load(&store.engine).unwrap().header().revision, 4);
}

#[test]
fn etcd_refusals_apply_nothing() {
    let fs = SimFs::new();
    let mut store = Store::new(&fs);
    store.writes(vec![op_put("k", "v")]); // 2
    let duplicate = txn(vec![], vec![put("a", "1"), put("a", "2")], vec![]);
    let in_delete = txn(vec![], vec![], vec![delete("a", "c", false), put("b", "1")]);
    let too_many = txn(
        vec![],
        (0..=TXN_OPS_MAX)
            .map(|i| put(&format!("k{i}"), "v"))
            .collect(),
        vec![],
    );
    let too_many_compares = txn(
        vec![compare("k", "", CompareTarget::Version(1), CompareResult::Equal); TXN_OPS_MAX + 1],
        vec![],
        vec![],
    );
    let absent = PutOp {
        ignore_value: true,
        ..put_op("absent", "")
    }
    .op();
    let not_found = txn(vec![], vec![put("first", "1"), absent], vec![]);
    let reserved = txn(
        vec![],
        vec![TxnOp::Put {
            key: [RESERVED_KEY_PREFIX, b"x"].concat(),
            value: b"x".to_vec(),
            ttl_ms: 0,
            lease: 0,
            prev_kv: false,
            ignore_value: false,
            ignore_lease: false,
        }],
        vec![],
    );
    let answers = store.txns(vec![
        duplicate,
        in_delete,
        too_many,
        too_many_compares,
        not_found,
        reserved,
    ]);
    let reasons: Vec<&str> = answers.iter().map(rejected).collect();
    assert!(reasons[0].starts_with("etcdserver: duplicate key given in txn request"));
    assert!(reasons[1].contains("duplicate key") && reasons[1].contains("failure[1]"));
    assert!(
        reasons[2].contains("too many operations") && reasons[2].contains("TXN_OPS_MAX is 128")
    );
    assert!(
        reasons[3].contains("field `compares` holds 129"),
        "{}",
        reasons[3]
    );
    assert!(
        reasons[4].starts_with("etcdserver: key not found") && reasons[4].contains("success[1]")
    );
    assert!(reasons[5].contains("reserved prefix"), "{}", reasons[5]);
    assert!(answers.iter().all(|a| a.revision == 2));
    assert_eq!(
        store.get("first"),
        None,
        "the op before the refused one did not apply"
    );
    assert_eq!(store.get("a"), None);
    assert_eq!(store.revision(), 2);
}

#[test]
fn ignore_value_and_ignore_lease_keep_what_the_key_has() {
    let fs = SimFs::new();
    let mut store = Store::new(&fs);
    store.grant(42);
    store.grant(9);
    let leased = PutOp {
        lease: 42,
        ..put_op("k", "kept")
    }
    .op();
    store.txn(txn(vec![], vec![leased], vec![])); // 2
    let keep_value = PutOp {
        lease: 9,
        ignore_value: true,
        prev_kv: true,
        ..put_op("k", "")
    }
    .op();
    let answer = store.txn(txn(vec![], vec![keep_value], vec![])); // 3
    let (_, results) = applied(&answer);
    let TxnOpResult::Put {
        prev_kv: Some(prev),
    } = &results[0]
    else {
        panic!("{results:?}");
    };
    assert_eq!(
        (prev.value.as_slice(), prev.lease, prev.mod_revision),
        (&b"kept"[..], 42, 2)
    );
    let k = store.get("k").unwrap();
    assert_eq!(
        (k.value.as_slice(), k.lease, k.version),
        (&b"kept"[..], 9, 2)
    );
    let keep_lease = PutOp {
        ignore_lease: true,
        ..put_op("k", "new")
    }
    .op();
    store.txn(txn(vec![], vec![keep_lease], vec![])); // 4
    let k = store.get("k").unwrap();
    assert_eq!(
        (k.value.as_slice(), k.lease, k.mod_revision),
        (&b"new"[..], 9, 4)
    );
    // A put without ignore_lease sets the lease it carries (0: none).
    store.txn(txn(vec![], vec![put("k", "plain")], vec![]));
    assert_eq!(store.get("k").unwrap().lease, 0);
    let value_given = PutOp {
        ignore_value: true,
        ..put_op("k", "oops")
    }
    .op();
    let answer = store.txn(txn(vec![], vec![value_given], vec![]));
    assert!(rejected(&answer).starts_with("etcdserver: value is provided"));
}

#[test]
fn the_read_budget_refuses_a_transaction_by_its_limit() {
    let fs = SimFs::new();
    let mut store = Store::new(&fs);
    // TXN_READ_KEYS_MAX + 2 keys.
    let many: Vec<Op> = (0..TXN_READ_KEYS_MAX + 2)
        .map(|i| op_put(&format!("n{i:05}"), "v"))
        .collect();
    store.writes(many);
    let count = TxnOp::Range(RangeSpec {
        count_only: true,
        ..RangeSpec::between("n", "o")
    });
    // Counted or visited, the apply charges every key: whether a count
    // walks the keys depends on the member's own key directory, a refusal
    // must not.
    for over in [count.clone(), get("n", "o")] {
        let answer = store.txn(txn(vec![], vec![put("x", "1"), over], vec![]));
        assert!(
            rejected(&answer).contains("TXN_READ_KEYS_MAX"),
            "{answer:?}"
        );
        assert_eq!(store.get("x"), None);
    }
    // Two of them deleted by an earlier transaction of the same entry:
    // exactly TXN_READ_KEYS_MAX left, counted whole (the engine's scan
    // must reach past the keys the entry deleted).
    let answers = store.txns(vec![
        txn(
            vec![],
            vec![delete("n00000", "", false), delete("n00001", "", false)],
            vec![],
        ),
        txn(vec![], vec![count], vec![]),
    ]);
    let counted = range_result(&applied(&answers[1]).1[0]).count;
    assert_eq!(counted, TXN_READ_KEYS_MAX as u64);
    // Bytes: values returned count against TXN_READ_BYTES_MAX.
    let big = vec![b'v'; 1024 * 1024];
    let puts = (0..5)
        .map(|i| Op::Put {
            key: format!("big{i}").into_bytes(),
            value: big.clone(),
            ttl_ms: 0,
        })
        .collect();
    store.writes(puts);
    let answer = store.txn(txn(vec![], vec![get("big", "bih")], vec![]));
    let reason = rejected(&answer);
    assert!(
        reason.contains("TXN_READ_BYTES_MAX") && reason.contains(&TXN_READ_BYTES_MAX.to_string()),
        "{reason}"
    );
    let keys_only = TxnOp::Range(RangeSpec {
        keys_only: true,
        ..RangeSpec::between("big", "bih")
    });
    let answer = store.txn(txn(vec![], vec![keys_only], vec![]));
    assert_eq!(range_result(&applied(&answer).1[0]).kvs.len(), 5);
}

#[test]
fn a_transaction_that_would_overflow_its_entry_is_refused() {
    let fs = SimFs::new();
    let mut store = Store::new(&fs);
    store.writes(vec![op_put("g1", ""), op_put("g2", ""), op_put("g3", "")]);
    // Transactions that fill the entry to three records below what it may
    // hold beside its session records and idle-session evictions ...
    let fill = ENTRY_OPS_MAX - 3 - (1 + kvstate::apply::SESSION_EVICTIONS_PER_ENTRY_MAX);
    let mut txns: Vec<TxnRequest> = (0..fill.div_ceil(TXN_OPS_MAX))
        .map(|t| {
            let ops = (0..TXN_OPS_MAX.min(fill - t * TXN_OPS_MAX))
                .map(|i| put(&format!("h{t}-{i}"), ""))
                .collect();
            txn(vec![], ops, vec![])
        })
        .collect();
    // ... then a range delete of three keys: a fourth record would reach it.
    txns.push(txn(vec![], vec![delete("g", "h", false)], vec![]));
    let answers = store.txns(txns);
    assert!(answers[..answers.len() - 1].iter().all(|a| applied(a).0));
    let last = answers.last().unwrap();
    assert!(rejected(last).contains("ENTRY_OPS_MAX"), "{last:?}");
    assert!(store.get("g1").is_some(), "nothing of it applied");
}

#[test]
fn a_retried_transaction_gets_its_first_answer() {
    let fs = SimFs::new();
    let mut store = Store::new(&fs);
    let session = |sequence| {
        Some(SessionRef {
            client_id: 5,
            sequence,
            lowest_unacked: 1,
            opens: sequence == 1,
        })
    };
    store.writes(vec![op_put("n", "0")]);
    let increment = TxnRequest {
        session: session(1),
        ..txn(
            vec![compare(
                "n",
                "",
                CompareTarget::Value(b"0".to_vec()),
                CompareResult::Equal,
            )],
            vec![put("n", "1"), get("n", "")],
            vec![get("n", "")],
        )
    };
    let first = store.txn(increment.clone());
    assert!(applied(&first).0);
    store.writes(vec![op_put("n", "0")]); // someone resets it
    let retry = store.txn(increment.clone());
    assert_eq!(retry, first, "the first answer, revision and all");
    assert_eq!(store.value("n").as_deref(), Some("0"), "not applied again");
    // A reloaded applier holds the answer too.
    store.applier = Applier::load(&store.engine).unwrap();
    assert_eq!(store.txn(increment), first);
    // An answer over SESSION_ANSWER_BYTES_MAX is not kept: its retry is
    // told the outcome is unknown, and does not apply again.
    store.writes(vec![Op::Put {
        key: b"big".to_vec(),
        value: vec![b'b'; SESSION_ANSWER_BYTES_MAX],
        ttl_ms: 0,
    }]);
    let big_read = TxnRequest {
        session: session(2),
        ..txn(vec![], vec![put("m", "1"), get("big", "")], vec![])
    };
    let first = store.txn(big_read.clone());
    assert_eq!(
        range_result(&applied(&first).1[1]).kvs.len(),
        1,
        "the first reply is whole"
    );
    store.writes(vec![op_put("m", "other")]);
    let retry = store.txn(big_read);
    assert_eq!(retry.outcome, Outcome::SessionExpired);
    assert_eq!(retry.revision, first.revision);
    assert_eq!(
        store.value("m").as_deref(),
        Some("other"),
        "not applied again"
    );
}

#[test]
fn ttls_in_transactions_and_expired_keys_in_their_reads() {
    let fs = SimFs::new();
    let mut store = Store::new(&fs);
    store.time_ms = 1_000;
    let ttl = PutOp {
        ttl_ms: 500,
        ..put_op("t", "v")
    }
    .op();
    store.txn(txn(vec![], vec![ttl, put("p", "v")], vec![])); // 2
    assert_eq!(store.applier.expiring_keys(), 1);
    store.time_ms = 1_499;
    let answer = store.txn(txn(vec![], vec![get("\0", "\0")], vec![]));
    assert_eq!(keys(&range_result(&applied(&answer).1[0]).kvs), "pt");
    // At 1 500 ms the entry first deletes t (revision 3), then the
    // transaction reads: t is absent, and a compare on it sees no key.
    store.time_ms = 1_500;
    let answer = store.txn(txn(
        vec![compare(
            "t",
            "",
            CompareTarget::Version(0),
            CompareResult::Equal,
        )],
        vec![get("\0", "\0")],
        vec![],
    ));
    let (succeeded, results) = applied(&answer);
    assert!(succeeded);
    assert_eq!(keys(&range_result(&results[0]).kvs), "p");
    assert_eq!((answer.revision, store.applier.expiring_keys()), (3, 0));
    // A transaction that overwrites a key with a TTL takes it out of the index.
    let ttl = PutOp {
        ttl_ms: 100,
        ..put_op("u", "v")
    }
    .op();
    store.txn(txn(vec![], vec![ttl], vec![]));
    assert_eq!(store.applier.expiring_keys(), 1);
    store.txn(txn(vec![], vec![delete("u", "", false)], vec![]));
    assert_eq!(store.applier.expiring_keys(), 0);
}

#[test]
fn a_delete_of_everything_keeps_the_reserved_keys() {
    let fs = SimFs::new();
    let mut store = Store::new(&fs);
    let with_session = TxnRequest {
        session: Some(SessionRef {
            client_id: 9,
            sequence: 1,
            lowest_unacked: 1,
            opens: true,
        }),
        ..txn(vec![], vec![put("a", "1"), put("\u{7f}", "2")], vec![])
    };
    store.txn(with_session);
    let past_reserved = vec![0xff, 0xff, b's'];
    store.apply(Command::Writes(vec![Request {
        session: None,
        conditions: Vec::new(),
        ops: vec![Op::Put {
            key: past_reserved.clone(),
            value: b"p".to_vec(),
            ttl_ms: 0,
        }],
    }]));
    let answer = store.txn(txn(vec![], vec![delete("\0", "\0", true)], vec![]));
    let (_, results) = applied(&answer);
    let TxnOpResult::DeleteRange { deleted, prev_kvs } = &results[0] else {
        panic!("{results:?}");
    };
    assert_eq!(*deleted, 3);
    assert_eq!(prev_kvs.last().unwrap().key, past_reserved);
    assert_eq!(Applier::load(&store.engine).unwrap().session_count(), 1);
    let reserved = [RESERVED_KEY_PREFIX, b"session/"].concat();
    let answer = store.txn(txn(
        vec![],
        vec![TxnOp::Range(RangeSpec::between(reserved.clone(), "\0"))],
        vec![],
    ));
    assert!(rejected(&answer).contains("reserved prefix"));
}

/// Transactions are as deterministic as the rest: two replicas applying
/// the same entries write byte-identical files.
#[test]
fn replicas_applying_the_same_transactions_write_identical_files() {
    let grants = [1, 2].map(|id| Proposal {
        time_ms: 0,
        command: grant(id),
    });
    let entries: Vec<Proposal> = (0..300u64)
        .map(|i| {
            let key = |n: u64| format!("k{}", n % 19);
            let compare_value = compare(
                &key(i + 3),
                "",
                CompareTarget::ModRevision(i / 2),
                CompareResult::Greater,
            );
            let mut success = vec![
                PutOp {
                    ttl_ms: i % 4 * 30,
                    lease: i % 3,
                    prev_kv: true,
                    ..put_op(&key(i), &"v".repeat((i % 50) as usize))
                }
                .op(),
                get("k", "l"),
                delete(&key(i + 7), "", true),
            ];
            if i % 5 == 0 {
                success.push(delete("r", "s", true));
            }
            let failure = vec![
                put(&format!("r{}", i % 7), "r"),
                put(&key(i + 2), "f"),
                get(&key(i), "\0"),
            ];
            let session = SessionRef {
                client_id: i % 4,
                sequence: i,
                lowest_unacked: i.saturating_sub(3),
                opens: i < 4,
            };
            Proposal {
                time_ms: i * 9,
                command: Command::Txns(vec![TxnRequest {
                    session: Some(session),
                    compares: vec![compare_value],
                    success,
                    failure,
                }]),
            }
        })
        .collect();
    let entries: Vec<Proposal> = grants.into_iter().chain(entries).collect();
    let run = || {
        let fs = SimFs::new();
        let engine = Engine::open("/sm", options(&fs)).unwrap();
        let mut applier = Applier::default();
        let mut answers = Vec::new();
        for (i, proposal) in entries.iter().enumerate() {
            let response = applier
                .apply(&engine, i as u64 + 1, proposal, Vec::new())
                .unwrap();
            answers.extend(response.answers);
        }
        (
            applier.header(),
            answers,
            engine.sealed_files(),
            engine.active_file(),
        )
    };
    let (header_a, answers_a, sealed_a, active_a) = run();
    let (header_b, answers_b, sealed_b, active_b) = run();
    let succeeded = answers_a
        .iter()
        .filter(|a| {
            matches!(
                a.outcome,
                Outcome::Txn {
                    succeeded: true,
                    ..
                }
            )
        })
        .count();
    assert!(
        succeeded > 30 && succeeded < 270,
        "both branches taken: {succeeded}"
    );
    assert!(header_a.revision > 150, "{header_a:?}");
    assert!(sealed_a.len() >= 4);
    assert_eq!(
        (header_a, answers_a, sealed_a, active_a),
        (header_b, answers_b, sealed_b, active_b)
    );
}

/// The transactions of one entry share a read budget: once their reads and
/// answers pass ENTRY_TXN_READ_BYTES_MAX, the next is refused naming it
/// (and changes nothing), so no entry holds more answers in memory.
#[test]
fn an_entrys_transactions_share_one_read_budget() {
    let fs = SimFs::new();
    let mut store = Store::new(&fs);
    // Four values of just under 1 MiB: one transaction reads them all
    // within its own budget, four fill the entry's.
    let value = "v".repeat(1024 * 1024 - 1024);
    store.writes((0..4).map(|i| op_put(&format!("big{i}"), &value)).collect());
    let read_all = || txn(vec![], vec![get("big", "bih")], vec![]);
    let count = kvstate::txn::ENTRY_TXN_READ_BYTES_MAX / (4 * value.len());
    let answers = store.txns((0..=count).map(|_| read_all()).collect());
    for answer in &answers[..count] {
        assert_eq!(range_result(&applied(answer).1[0]).kvs.len(), 4);
    }
    let refused = rejected(answers.last().unwrap());
    assert!(refused.contains("ENTRY_TXN_READ_BYTES_MAX"), "{refused}");
}
