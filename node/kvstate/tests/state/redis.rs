//! Redis commands applied through `Applier::apply` (`Command::Redis`) and
//! read with `kvstate::redis::read`, checked against what redis-server
//! 7.0 answers (the expected replies were taken from Redis's documented
//! behaviour and checked by hand against a Debian redis-server 7.0.15):
//! strings, counters, TTLs by cluster time, keys, hashes and their layout
//! under the reserved prefix, MULTI/EXEC atomicity, WATCH (an expiry
//! counts), revisions, FLUSHALL and the limits, exactly-once retries,
//! restarts, and byte-identical replicas.

use std::sync::Arc;

use bitcask::{Engine, Options, SyncPolicy};
use kvstate::apply::Applier;
use kvstate::command::{
    Command, ENTRY_OPS_MAX, EntryResponse, Op, Outcome, Proposal, RESERVED_KEY_PREFIX, Request,
    SessionRef, Write,
};
use kvstate::range::{RangeSpec, range};
use kvstate::redis::{
    self, CLEANUP_RECORDS_PER_ENTRY_MAX, ERR_HASH_NOT_FLOAT, ERR_HASH_NOT_INTEGER,
    ERR_NAN_OR_INFINITY, ERR_NO_SUCH_KEY, ERR_NOT_FLOAT, ERR_NOT_INTEGER, ERR_OVERFLOW,
    ERR_WRONGTYPE, ExpireCondition, FLUSH_KEYS_MAX, GetExExpiry, HASH_DEAD_TAG, HASH_EXPIRY_TAG,
    HASH_FIELD_BYTES_MAX, HASH_FIELD_TAG, HASH_MARKER_TAG, HashHead, HashPart, Pair, RedisAnswer,
    RedisCommand, RedisReply, RedisRequest, RedisType, STRING_BYTES_MAX, SetCondition, SetExpiry,
};
use kvstate::txn::TXN_READ_KEYS_MAX;
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

/// One replica: an engine and its applier, applying one entry after
/// another at a cluster time the test moves.
struct Node {
    fs: SimFs,
    engine: Engine,
    applier: Applier,
    index: u64,
    now_ms: u64,
}

impl Node {
    fn new() -> Node {
        let fs = SimFs::new();
        Node {
            engine: Engine::open("/sm", options(&fs)).unwrap(),
            fs,
            applier: Applier::default(),
            index: 0,
            now_ms: 1_000,
        }
    }

    fn apply(&mut self, command: Command) -> EntryResponse {
        self.index += 1;
        let proposal = Proposal {
            time_ms: self.now_ms,
            command,
        };
        self.applier
            .apply(&self.engine, self.index, &proposal, Vec::new())
            .unwrap()
    }

    fn requests(&mut self, requests: Vec<RedisRequest>) -> Vec<Outcome> {
        let response = self.apply(Command::Redis(requests));
        response.answers.into_iter().map(|a| a.outcome).collect()
    }

    /// A MULTI/EXEC block (or one command) with WATCH conditions.
    fn block(&mut self, watched: Vec<(Vec<u8>, u64)>, commands: Vec<RedisCommand>) -> Outcome {
        let request = RedisRequest {
            session: None,
            watched,
            commands,
        };
        self.requests(vec![request]).remove(0)
    }

    fn exec(&mut self, commands: Vec<RedisCommand>) -> Vec<RedisReply> {
        match self.block(Vec::new(), commands) {
            Outcome::Redis(RedisAnswer::Replies(replies)) => replies,
            other => panic!("not replies: {other:?}"),
        }
    }

    fn one(&mut self, command: RedisCommand) -> RedisReply {
        self.exec(vec![command]).remove(0)
    }

    /// A read outside the log, at the applied cluster time.
    fn read(&self, command: RedisCommand) -> RedisReply {
        redis::read(&self.engine, self.now_ms, &command).unwrap()
    }

    /// An entry with no request (the leader's tick).
    fn tick(&mut self) {
        self.apply(Command::Advance);
    }

    fn revision(&self) -> u64 {
        self.applier.header().revision
    }

    /// Reopens the engine from its files and loads a fresh applier.
    fn restart(&mut self) {
        let engine = Engine::open("/sm", options(&self.fs)).unwrap();
        self.applier = Applier::load(&engine).unwrap();
        self.engine = engine;
    }

    /// Live records under the reserved prefix and `tag`, TTLs ignored.
    fn reserved(&self, tag: &[u8]) -> usize {
        let prefix = [RESERVED_KEY_PREFIX, tag].concat();
        let scan = bitcask::Scan {
            keys_only: true,
            ..bitcask::Scan::prefix(prefix, usize::MAX)
        };
        self.engine.scan(&scan, 0).unwrap().len()
    }

    /// Every record the engine holds from the entry at `index`.
    fn records_of_entry(&self, index: u64) -> Vec<bitcask::StoredRecord> {
        self.engine
            .records()
            .unwrap()
            .into_iter()
            .filter(|record| record.seq >> 16 == index)
            .collect()
    }
}

fn b(text: &str) -> Vec<u8> {
    text.as_bytes().to_vec()
}

fn bulk(text: &str) -> RedisReply {
    RedisReply::Bulk(b(text))
}

fn int(value: i64) -> RedisReply {
    RedisReply::Integer(value)
}

fn ok() -> RedisReply {
    RedisReply::Status("OK".to_string())
}

fn err(message: &str) -> RedisReply {
    RedisReply::Error(message.to_string())
}

fn nil() -> RedisReply {
    RedisReply::Nil
}

fn set(key: &str, value: &str) -> RedisCommand {
    RedisCommand::Set {
        key: b(key),
        value: b(value),
        condition: SetCondition::Always,
        expiry: SetExpiry::Persist,
        get: false,
    }
}

fn set_with(
    key: &str,
    value: &str,
    condition: SetCondition,
    expiry: SetExpiry,
    get: bool,
) -> RedisCommand {
    RedisCommand::Set {
        key: b(key),
        value: b(value),
        condition,
        expiry,
        get,
    }
}

fn get(key: &str) -> RedisCommand {
    RedisCommand::Get { key: b(key) }
}

fn incr_by(key: &str, increment: i64) -> RedisCommand {
    RedisCommand::IncrBy {
        key: b(key),
        increment,
    }
}

fn incr_by_float(key: &str, increment: &str) -> RedisCommand {
    RedisCommand::IncrByFloat {
        key: b(key),
        increment: b(increment),
    }
}

fn del(keys: &[&str]) -> RedisCommand {
    RedisCommand::Del {
        keys: keys.iter().map(|key| b(key)).collect(),
    }
}

fn exists(keys: &[&str]) -> RedisCommand {
    RedisCommand::Exists {
        keys: keys.iter().map(|key| b(key)).collect(),
    }
}

fn expire(key: &str, ms: i64, condition: ExpireCondition) -> RedisCommand {
    RedisCommand::Expire {
        key: b(key),
        ms,
        condition,
    }
}

fn ttl(key: &str) -> RedisCommand {
    RedisCommand::Ttl {
        key: b(key),
        milliseconds: false,
    }
}

fn pttl(key: &str) -> RedisCommand {
    RedisCommand::Ttl {
        key: b(key),
        milliseconds: true,
    }
}

fn type_of(key: &str) -> RedisCommand {
    RedisCommand::Type { key: b(key) }
}

fn pairs(pairs: &[(&str, &str)]) -> Vec<Pair> {
    pairs
        .iter()
        .map(|(key, value)| Pair {
            key: b(key),
            value: b(value),
        })
        .collect()
}

fn hset(key: &str, fields: &[(&str, &str)]) -> RedisCommand {
    RedisCommand::HSet {
        key: b(key),
        pairs: pairs(fields),
        reply_ok: false,
    }
}

fn hget(key: &str, field: &str) -> RedisCommand {
    RedisCommand::HGet {
        key: b(key),
        field: b(field),
    }
}

fn hgetall(key: &str) -> RedisCommand {
    RedisCommand::HGetAll {
        key: b(key),
        part: HashPart::All,
    }
}

fn hlen(key: &str) -> RedisCommand {
    RedisCommand::HLen { key: b(key) }
}

fn map(entries: &[(&str, &str)]) -> RedisReply {
    RedisReply::Map(
        entries
            .iter()
            .map(|(field, value)| (bulk(field), bulk(value)))
            .collect(),
    )
}

fn rename(source: &str, destination: &str, only_if_absent: bool) -> RedisCommand {
    RedisCommand::Rename {
        source: b(source),
        destination: b(destination),
        only_if_absent,
    }
}

#[test]
fn strings_answer_as_redis_does() {
    let mut node = Node::new();
    assert_eq!(node.one(get("s")), nil());
    assert_eq!(node.one(set("s", "Hello World")), ok());
    assert_eq!(node.read(get("s")), bulk("Hello World"));
    let getrange = |start, end| RedisCommand::GetRange {
        key: b("s"),
        start,
        end,
    };
    assert_eq!(node.read(getrange(0, 4)), bulk("Hello"));
    assert_eq!(node.read(getrange(-5, -1)), bulk("World"));
    assert_eq!(node.read(getrange(5, 2)), bulk(""));
    assert_eq!(node.read(getrange(-1, -5)), bulk(""));
    assert_eq!(node.read(getrange(0, 100)), bulk("Hello World"));
    assert_eq!(node.read(getrange(-100, 2)), bulk("Hel"));
    assert_eq!(node.read(getrange(i64::MIN, i64::MAX)), bulk("Hello World"));
    let setrange = |key: &str, offset, value: &str| RedisCommand::SetRange {
        key: b(key),
        offset,
        value: b(value),
    };
    assert_eq!(node.one(setrange("s", 6, "Redis")), int(11));
    assert_eq!(node.read(get("s")), bulk("Hello Redis"));
    assert_eq!(node.one(setrange("n", 3, "ab")), int(5));
    assert_eq!(node.read(get("n")), RedisReply::Bulk(b"\0\0\0ab".to_vec()));
    assert_eq!(node.one(setrange("n", 0, "")), int(5));
    assert_eq!(node.one(setrange("none", 5, "")), int(0));
    assert_eq!(
        node.read(exists(&["none"])),
        int(0),
        "an empty SETRANGE creates nothing"
    );
    let append = |key: &str, value: &str| RedisCommand::Append {
        key: b(key),
        value: b(value),
    };
    assert_eq!(node.one(append("s", "!")), int(12));
    assert_eq!(node.one(append("a", "")), int(0));
    assert_eq!(node.read(exists(&["a"])), int(1), "APPEND creates the key");
    assert_eq!(node.read(RedisCommand::StrLen { key: b("s") }), int(12));
    assert_eq!(node.read(RedisCommand::StrLen { key: b("zz") }), int(0));
    // SETNX, GETSET (SET .. GET), GETDEL, MSET, MSETNX, MGET.
    let setnx = |key: &str, value: &str| RedisCommand::SetNx {
        key: b(key),
        value: b(value),
    };
    assert_eq!(node.one(setnx("k", "v")), int(1));
    assert_eq!(node.one(setnx("k", "w")), int(0));
    let getset = set_with("k", "w", SetCondition::Always, SetExpiry::Persist, true);
    assert_eq!(node.one(getset), bulk("v"));
    let getset_absent = set_with("g", "1", SetCondition::Always, SetExpiry::Persist, true);
    assert_eq!(node.one(getset_absent), nil());
    assert_eq!(node.one(RedisCommand::GetDel { key: b("k") }), bulk("w"));
    assert_eq!(node.one(RedisCommand::GetDel { key: b("k") }), nil());
    let mset = RedisCommand::MSet {
        pairs: pairs(&[("m1", "a"), ("m2", "b"), ("m1", "c")]),
    };
    assert_eq!(node.one(mset), ok());
    let mget = RedisCommand::MGet {
        keys: vec![b("m1"), b("m2"), b("m3")],
    };
    assert_eq!(
        node.read(mget),
        RedisReply::Array(vec![bulk("c"), bulk("b"), nil()]),
        "a later pair of the same key wins"
    );
    let msetnx = |list: &[(&str, &str)]| RedisCommand::MSetNx { pairs: pairs(list) };
    assert_eq!(node.one(msetnx(&[("x1", "1"), ("m1", "z")])), int(0));
    assert_eq!(
        node.read(exists(&["x1"])),
        int(0),
        "MSETNX is all or nothing"
    );
    assert_eq!(node.one(msetnx(&[("x1", "1"), ("x2", "2")])), int(1));
    // A write is no read.
    assert!(matches!(
        redis::read(&node.engine, node.now_ms, &del(&["x1"])),
        Err(redis::RedisError::NotARead("DEL"))
    ));
    assert_eq!(
        node.read(exists(&["x1", "x1", "x2"])),
        int(3),
        "EXISTS counts a key each time"
    );
}

#[test]
fn set_options_follow_redis_7() {
    let mut node = Node::new();
    use SetCondition::{Always, IfAbsent, IfPresent};
    assert_eq!(
        node.one(set_with("k", "v", IfPresent, SetExpiry::Persist, false)),
        nil()
    );
    assert_eq!(node.read(exists(&["k"])), int(0));
    assert_eq!(
        node.one(set_with("k", "v", IfAbsent, SetExpiry::Persist, false)),
        ok()
    );
    assert_eq!(
        node.one(set_with("k", "w", IfAbsent, SetExpiry::Persist, false)),
        nil()
    );
    // NX with GET: the old value, and nothing set.
    assert_eq!(
        node.one(set_with("k", "w", IfAbsent, SetExpiry::Persist, true)),
        bulk("v")
    );
    assert_eq!(node.read(get("k")), bulk("v"));
    assert_eq!(
        node.one(set_with("k", "x", IfPresent, SetExpiry::Persist, true)),
        bulk("v")
    );
    assert_eq!(node.read(get("k")), bulk("x"));
    // EX / PX, KEEPTTL, and a plain SET clearing the TTL.
    let px = SetExpiry::In { ms: 1_500 };
    assert_eq!(node.one(set_with("t", "1", Always, px, false)), ok());
    assert_eq!(node.read(pttl("t")), int(1_500));
    assert_eq!(
        node.read(ttl("t")),
        int(2),
        "TTL rounds to the nearest second"
    );
    node.now_ms += 1;
    assert_eq!(node.read(ttl("t")), int(1));
    assert_eq!(
        node.one(set_with("t", "2", Always, SetExpiry::Keep, false)),
        ok()
    );
    assert_eq!(node.read(pttl("t")), int(1_499));
    assert_eq!(node.one(set("t", "3")), ok());
    assert_eq!(node.read(pttl("t")), int(-1));
    assert_eq!(node.read(pttl("nothing")), int(-2));
    // PXAT in the past (the front end sends a relative time <= 0): the key
    // is written already expired, so it is gone; the reply is still OK.
    let past = SetExpiry::In { ms: -5 };
    assert_eq!(node.one(set_with("t", "4", Always, past, false)), ok());
    assert_eq!(node.read(exists(&["t"])), int(0));
    // SET replaces a hash; SET .. GET on a hash is WRONGTYPE and sets nothing.
    assert_eq!(node.one(hset("h", &[("f", "v")])), int(1));
    assert_eq!(
        node.one(set_with("h", "s", Always, SetExpiry::Persist, true)),
        err(ERR_WRONGTYPE)
    );
    assert_eq!(node.read(type_of("h")), RedisReply::Status("hash".into()));
    assert_eq!(node.one(set("h", "s")), ok());
    assert_eq!(node.read(type_of("h")), RedisReply::Status("string".into()));
    assert_eq!(node.read(hget("h", "f")), err(ERR_WRONGTYPE));
    assert_eq!(node.reserved(HASH_MARKER_TAG), 0);
    // GETEX.
    let getex = |expiry| RedisCommand::GetEx {
        key: b("k"),
        expiry,
    };
    assert_eq!(node.one(getex(GetExExpiry::In { ms: 10_000 })), bulk("x"));
    assert_eq!(node.read(ttl("k")), int(10));
    assert_eq!(node.read(getex(GetExExpiry::Unchanged)), bulk("x"));
    assert_eq!(node.one(getex(GetExExpiry::Persist)), bulk("x"));
    assert_eq!(node.read(ttl("k")), int(-1));
    assert_eq!(node.one(getex(GetExExpiry::In { ms: 0 })), bulk("x"));
    assert_eq!(
        node.read(exists(&["k"])),
        int(0),
        "GETEX with a past time deletes"
    );
    assert_eq!(node.one(getex(GetExExpiry::Persist)), nil());
}

#[test]
fn counters_parse_and_overflow_as_redis_does() {
    let mut node = Node::new();
    assert_eq!(node.one(incr_by("c", 1)), int(1));
    assert_eq!(node.one(incr_by("c", -1)), int(0));
    assert_eq!(node.one(incr_by("c", 10)), int(10));
    assert_eq!(node.one(incr_by("c", -20)), int(-10));
    assert_eq!(node.read(get("c")), bulk("-10"));
    for bad in [
        "abc",
        " 1",
        "1 ",
        "01",
        "+1",
        "1.5",
        "-0",
        "",
        "99999999999999999999",
    ] {
        node.one(set("c", bad));
        assert_eq!(node.one(incr_by("c", 1)), err(ERR_NOT_INTEGER), "{bad:?}");
        assert_eq!(node.read(get("c")), bulk(bad), "unchanged");
    }
    node.one(set("c", &i64::MAX.to_string()));
    assert_eq!(node.one(incr_by("c", 1)), err(ERR_OVERFLOW));
    node.one(set("c", &i64::MIN.to_string()));
    assert_eq!(node.one(incr_by("c", -1)), err(ERR_OVERFLOW));
    assert_eq!(node.one(incr_by("c", i64::MAX)), int(-1));
    // A counter keeps its TTL.
    node.one(set_with(
        "t",
        "5",
        SetCondition::Always,
        SetExpiry::In { ms: 9_000 },
        false,
    ));
    assert_eq!(node.one(incr_by("t", 1)), int(6));
    assert_eq!(node.read(pttl("t")), int(9_000));
    assert_eq!(node.one(hset("h", &[("f", "1")])), int(1));
    assert_eq!(node.one(incr_by("h", 1)), err(ERR_WRONGTYPE));
    // INCRBYFLOAT: Redis's long double and its formatting.
    node.one(set("f", "10.50"));
    assert_eq!(node.one(incr_by_float("f", "0.1")), bulk("10.6"));
    assert_eq!(node.one(incr_by_float("f", "-5")), bulk("5.6"));
    node.one(set("f", "5.0e3"));
    assert_eq!(node.one(incr_by_float("f", "2.0e2")), bulk("5200"));
    assert_eq!(node.one(incr_by_float("new", "1e10")), bulk("10000000000"));
    assert_eq!(
        node.one(incr_by_float("new", "0.1")),
        bulk("10000000000.09999999962747097")
    );
    assert_eq!(
        node.one(incr_by_float("f", "inf")),
        err(ERR_NAN_OR_INFINITY)
    );
    assert_eq!(node.one(incr_by_float("f", "nan")), err(ERR_NOT_FLOAT));
    assert_eq!(node.one(incr_by_float("f", "1x")), err(ERR_NOT_FLOAT));
    node.one(set("f", "abc"));
    assert_eq!(node.one(incr_by_float("f", "1")), err(ERR_NOT_FLOAT));
    assert_eq!(node.one(incr_by_float("h", "1")), err(ERR_WRONGTYPE));
    node.one(set_with(
        "f",
        "1",
        SetCondition::Always,
        SetExpiry::In { ms: 7_000 },
        false,
    ));
    assert_eq!(node.one(incr_by_float("f", "0x1p-2")), bulk("1.25"));
    assert_eq!(
        node.read(pttl("f")),
        int(7_000),
        "INCRBYFLOAT keeps the TTL"
    );
}

#[test]
fn expire_conditions_and_times_follow_redis_7() {
    use ExpireCondition::{Always, IfGreater, IfLess, IfNone, IfSome, IfSomeAndLess};
    let mut node = Node::new();
    assert_eq!(node.one(expire("p", 1_000, Always)), int(0), "absent");
    node.one(set("p", "v"));
    assert_eq!(
        node.one(expire("p", 100_000, IfGreater)),
        int(0),
        "no TTL is infinite for GT"
    );
    assert_eq!(node.one(expire("p", 100_000, IfLess)), int(1));
    assert_eq!(node.read(ttl("p")), int(100));
    assert_eq!(node.one(expire("p", 50_000, IfGreater)), int(0));
    assert_eq!(node.one(expire("p", 200_000, IfGreater)), int(1));
    assert_eq!(node.one(expire("p", 10_000, IfNone)), int(0));
    assert_eq!(node.one(expire("p", 10_000, IfSome)), int(1));
    assert_eq!(node.read(ttl("p")), int(10));
    assert_eq!(node.one(expire("p", 20_000, IfLess)), int(0));
    let persist = |key: &str| RedisCommand::Persist { key: b(key) };
    assert_eq!(node.one(persist("p")), int(1));
    assert_eq!(node.one(persist("p")), int(0));
    assert_eq!(node.one(persist("none")), int(0));
    assert_eq!(node.one(expire("p", 10_000, IfSome)), int(0));
    // XX and LT: never on a key without a TTL; earlier only.
    assert_eq!(node.one(expire("p", 10_000, IfSomeAndLess)), int(0));
    assert_eq!(node.one(expire("p", 30_000, Always)), int(1));
    assert_eq!(node.one(expire("p", 40_000, IfSomeAndLess)), int(0));
    assert_eq!(node.one(expire("p", 20_000, IfSomeAndLess)), int(1));
    assert_eq!(node.read(ttl("p")), int(20));
    assert_eq!(node.one(persist("p")), int(1));
    // A time in the past deletes the key, and answers 1.
    assert_eq!(node.one(expire("p", -1, Always)), int(1));
    assert_eq!(node.read(exists(&["p"])), int(0));
    // TTLs run out by cluster time: the key reads absent at once, and the
    // next entry deletes it at a revision of its own.
    node.one(set("q", "v"));
    assert_eq!(node.one(expire("q", 500, Always)), int(1));
    node.now_ms += 499;
    assert_eq!(node.read(get("q")), bulk("v"));
    node.now_ms += 1;
    assert_eq!(node.read(get("q")), nil());
    assert_eq!(node.read(pttl("q")), int(-2));
    let before = node.revision();
    node.tick();
    assert_eq!(node.revision(), before + 1, "the expiry delete");
    assert_eq!(node.engine.meta(b"q", 0), None);
}

#[test]
fn del_exists_type_and_rename_move_every_type() {
    let mut node = Node::new();
    node.exec(vec![
        set("s", "1"),
        hset("h", &[("a", "1"), ("b", "2")]),
        expire("h", 60_000, ExpireCondition::Always),
    ]);
    assert_eq!(node.read(exists(&["s", "h", "x", "s"])), int(3));
    assert_eq!(node.read(type_of("s")), RedisReply::Status("string".into()));
    assert_eq!(node.read(type_of("h")), RedisReply::Status("hash".into()));
    assert_eq!(node.read(type_of("x")), RedisReply::Status("none".into()));
    // RENAME a hash: its fields and TTL go with it.
    assert_eq!(node.one(rename("h", "h2", false)), ok());
    assert_eq!(node.read(hgetall("h2")), map(&[("a", "1"), ("b", "2")]));
    assert_eq!(node.read(ttl("h2")), int(60));
    assert_eq!(node.read(exists(&["h"])), int(0));
    assert_eq!(
        node.reserved(HASH_EXPIRY_TAG),
        1,
        "one expiry record, the new name's"
    );
    // RENAME over an existing key replaces it; RENAMENX does not.
    assert_eq!(node.one(rename("h2", "s", true)), int(0));
    assert_eq!(node.one(rename("h2", "s", false)), ok());
    assert_eq!(node.read(type_of("s")), RedisReply::Status("hash".into()));
    node.one(set_with(
        "t",
        "x",
        SetCondition::Always,
        SetExpiry::In { ms: 5_000 },
        false,
    ));
    assert_eq!(node.one(rename("t", "s", false)), ok());
    assert_eq!(node.read(get("s")), bulk("x"));
    assert_eq!(node.read(pttl("s")), int(5_000));
    assert_eq!(node.reserved(HASH_MARKER_TAG), 0);
    assert_eq!(node.one(rename("s", "s", false)), ok());
    assert_eq!(node.one(rename("s", "s", true)), int(0));
    assert_eq!(node.one(rename("nope", "s", false)), err(ERR_NO_SUCH_KEY));
    assert_eq!(node.one(rename("nope", "s", true)), err(ERR_NO_SUCH_KEY));
    assert_eq!(node.one(rename("s", "u", true)), int(1));
    // DEL counts each key once, whatever its type.
    node.one(hset("h", &[("f", "v")]));
    assert_eq!(node.one(del(&["u", "h", "u", "missing"])), int(2));
    assert_eq!(node.read(exists(&["u", "h"])), int(0));
}

#[test]
fn hashes_answer_as_redis_does() {
    let mut node = Node::new();
    assert_eq!(
        node.one(hset("h", &[("a", "1"), ("b", "2"), ("a", "3")])),
        int(2)
    );
    assert_eq!(node.read(hget("h", "a")), bulk("3"));
    assert_eq!(node.read(hget("h", "zz")), nil());
    assert_eq!(node.read(hget("none", "a")), nil());
    assert_eq!(node.read(hlen("h")), int(2));
    assert_eq!(node.read(hlen("none")), int(0));
    let hmget = RedisCommand::HMGet {
        key: b("h"),
        fields: vec![b("b"), b("x"), b("a")],
    };
    assert_eq!(
        node.read(hmget),
        RedisReply::Array(vec![bulk("2"), nil(), bulk("3")])
    );
    assert_eq!(node.read(hgetall("h")), map(&[("a", "3"), ("b", "2")]));
    assert_eq!(node.read(hgetall("none")), RedisReply::Map(Vec::new()));
    let part = |part| RedisCommand::HGetAll { key: b("h"), part };
    assert_eq!(
        node.read(part(HashPart::Fields)),
        RedisReply::Array(vec![bulk("a"), bulk("b")])
    );
    assert_eq!(
        node.read(part(HashPart::Values)),
        RedisReply::Array(vec![bulk("3"), bulk("2")])
    );
    let hexists = |field: &str| RedisCommand::HExists {
        key: b("h"),
        field: b(field),
    };
    assert_eq!(node.read(hexists("a")), int(1));
    assert_eq!(node.read(hexists("x")), int(0));
    let hstrlen = |field: &str| RedisCommand::HStrLen {
        key: b("h"),
        field: b(field),
    };
    assert_eq!(node.read(hstrlen("a")), int(1));
    assert_eq!(node.read(hstrlen("x")), int(0));
    let hsetnx = |field: &str, value: &str| RedisCommand::HSetNx {
        key: b("h"),
        field: b(field),
        value: b(value),
    };
    assert_eq!(node.one(hsetnx("a", "9")), int(0));
    assert_eq!(node.one(hsetnx("c", "9")), int(1));
    let hmset = RedisCommand::HSet {
        key: b("h"),
        pairs: pairs(&[("d", "4")]),
        reply_ok: true,
    };
    assert_eq!(node.one(hmset), ok());
    assert_eq!(node.read(hlen("h")), int(4));
    let hincrby = |field: &str, increment| RedisCommand::HIncrBy {
        key: b("h"),
        field: b(field),
        increment,
    };
    assert_eq!(node.one(hincrby("a", 10)), int(13));
    assert_eq!(node.one(hincrby("n", -2)), int(-2));
    assert_eq!(node.read(hlen("h")), int(5));
    node.one(hset("h", &[("s", "x1")]));
    assert_eq!(node.one(hincrby("s", 1)), err(ERR_HASH_NOT_INTEGER));
    node.one(hset("h", &[("m", &i64::MAX.to_string())]));
    assert_eq!(node.one(hincrby("m", 1)), err(ERR_OVERFLOW));
    let hincrbyfloat = |field: &str, increment: &str| RedisCommand::HIncrByFloat {
        key: b("h"),
        field: b(field),
        increment: b(increment),
    };
    assert_eq!(node.one(hincrbyfloat("fl", "10.5")), bulk("10.5"));
    assert_eq!(node.one(hincrbyfloat("fl", "0.1")), bulk("10.6"));
    assert_eq!(node.one(hincrbyfloat("s", "1")), err(ERR_HASH_NOT_FLOAT));
    assert_eq!(node.one(hincrbyfloat("fl", "x")), err(ERR_NOT_FLOAT));
    assert_eq!(
        node.one(hincrbyfloat("fl", "inf")),
        err("ERR value is NaN or Infinity")
    );
    // HDEL: how many went; the last field takes the hash with it.
    let hdel = |key: &str, fields: &[&str]| RedisCommand::HDel {
        key: b(key),
        fields: fields.iter().map(|field| b(field)).collect(),
    };
    assert_eq!(node.one(hdel("h", &["a", "a", "zz"])), int(1));
    assert_eq!(node.one(hdel("none", &["a"])), int(0));
    node.one(hset("small", &[("x", "1"), ("y", "2")]));
    assert_eq!(node.one(hdel("small", &["x", "y"])), int(2));
    assert_eq!(node.read(exists(&["small"])), int(0));
    // WRONGTYPE both ways.
    node.one(set("str", "v"));
    for command in [
        hset("str", &[("f", "v")]),
        hget("str", "f"),
        hlen("str"),
        hgetall("str"),
        RedisCommand::HIncrBy {
            key: b("str"),
            field: b("f"),
            increment: 1,
        },
        hdel("str", &["f"]),
    ] {
        assert_eq!(node.one(command.clone()), err(ERR_WRONGTYPE), "{command:?}");
    }
    // Redis checks an HINCRBYFLOAT increment before the key's type.
    let on_string = RedisCommand::HIncrByFloat {
        key: b("str"),
        field: b("f"),
        increment: b("x"),
    };
    assert_eq!(node.one(on_string), err(ERR_NOT_FLOAT));
    for command in [
        get("h"),
        incr_by("h", 1),
        RedisCommand::Append {
            key: b("h"),
            value: b("x"),
        },
    ] {
        assert_eq!(node.one(command.clone()), err(ERR_WRONGTYPE), "{command:?}");
    }
    assert_eq!(
        node.read(RedisCommand::MGet { keys: vec![b("h")] }),
        RedisReply::Array(vec![nil()])
    );
}

/// A hash is a marker (`hm/` + key: format, id, field count) and one
/// record per field (`hf/` + id + field) under the reserved prefix: the
/// native API sees none of it, and the marker's value says how many fields.
#[test]
fn a_hash_is_a_marker_and_one_record_per_field_under_the_reserved_prefix() {
    let mut node = Node::new();
    node.exec(vec![
        hset("h", &[("f1", "a"), ("f2", "b")]),
        set("plain", "p"),
    ]);
    let marker = node
        .engine
        .get(&redis::marker_key(b"h"), 0)
        .unwrap()
        .unwrap();
    let head = HashHead::decode(&marker.value).unwrap();
    assert_eq!(head.fields, 2);
    assert_eq!(marker.value.len(), redis::HASH_MARKER_BYTES);
    assert_eq!(marker.value[0], redis::HASH_MARKER_FORMAT);
    let field = node
        .engine
        .get(&redis::field_key(head.id, b"f2"), 0)
        .unwrap()
        .unwrap();
    assert_eq!(field.value, b"b");
    assert_eq!(node.reserved(HASH_FIELD_TAG), 2);
    // The native API: the string, and nothing of the hash.
    let all = range(
        &node.engine,
        &RangeSpec::between("\0", "\0"),
        node.now_ms,
        node.revision(),
    )
    .unwrap();
    let keys: Vec<&[u8]> = all.kvs.iter().map(|kv| kv.key.as_slice()).collect();
    assert_eq!(keys, [b"plain".as_slice()]);
    // The listing helpers see both types.
    assert_eq!(
        redis::keys_page(&node.engine, node.now_ms, None, 10).unwrap(),
        vec![(b("h"), RedisType::Hash), (b("plain"), RedisType::String)]
    );
    assert_eq!(
        redis::keys_page(&node.engine, node.now_ms, Some(b"h"), 10).unwrap(),
        vec![(b("plain"), RedisType::String)]
    );
    assert_eq!(redis::key_count(&node.engine, node.now_ms).unwrap(), 2);
    assert_eq!(
        redis::key_type(&node.engine, b"h", node.now_ms).unwrap(),
        Some(RedisType::Hash)
    );
    assert_eq!(
        redis::hash_fields_page(&node.engine, b"h", node.now_ms, Some(b"f1"), 10).unwrap(),
        vec![(b("f2"), b("b"))]
    );
    // A Redis string is a native key, and the other way round.
    assert_eq!(node.engine.get(b"plain", 0).unwrap().unwrap().value, b"p");
    node.apply(Command::Writes(vec![Request {
        session: None,
        conditions: Vec::new(),
        ops: vec![Op::Put {
            key: b("native"),
            value: b("n"),
            ttl_ms: 0,
        }],
    }]));
    assert_eq!(node.read(get("native")), bulk("n"));
    // Reserved keys are no Redis keys.
    let reserved = redis::marker_key(b"h");
    let refused = |reply: RedisReply| matches!(reply, RedisReply::Error(message) if message.contains("reserved prefix"));
    assert!(refused(node.read(RedisCommand::Get {
        key: reserved.clone()
    })));
    assert!(refused(node.one(RedisCommand::Del {
        keys: vec![reserved.clone()]
    })));
    let overwrite = RedisCommand::Set {
        key: reserved.clone(),
        value: b("x"),
        condition: SetCondition::Always,
        expiry: SetExpiry::Persist,
        get: false,
    };
    assert!(refused(node.one(overwrite)));
    assert_eq!(node.read(hget("h", "f1")), bulk("a"));
}

/// EXPIRE on a hash expires the whole hash: it reads absent at its
/// expiry, and the entries after it delete its marker, its expiry record
/// and then its fields, a bounded number per entry; a hash written under
/// the same key before that never sees the old fields.
#[test]
fn a_hash_expires_whole_and_its_records_go_by_later_entries() {
    let mut node = Node::new();
    let fields: Vec<(String, String)> = (0..10)
        .map(|i| (format!("f{i}"), format!("v{i}")))
        .collect();
    let fields: Vec<(&str, &str)> = fields
        .iter()
        .map(|(f, v)| (f.as_str(), v.as_str()))
        .collect();
    node.one(hset("h", &fields));
    assert_eq!(
        node.one(expire("h", 2_000, ExpireCondition::Always)),
        int(1)
    );
    assert_eq!(node.read(pttl("h")), int(2_000));
    assert_eq!(node.reserved(HASH_EXPIRY_TAG), 1);
    node.now_ms += 2_000;
    assert_eq!(node.read(exists(&["h"])), int(0));
    assert_eq!(node.read(hget("h", "f1")), nil());
    assert_eq!(node.read(hlen("h")), int(0));
    // Written again before any housekeeping: a fresh hash.
    let before = node.revision();
    assert_eq!(node.one(hset("h", &[("new", "1")])), int(1));
    assert_eq!(node.revision(), before + 1);
    assert_eq!(node.read(hgetall("h")), map(&[("new", "1")]));
    assert_eq!(node.read(ttl("h")), int(-1));
    // That entry's housekeeping already took the old expiry record and
    // the old fields (the new hash's marker stays).
    assert_eq!(node.reserved(HASH_EXPIRY_TAG), 0);
    assert_eq!(node.reserved(HASH_DEAD_TAG), 0);
    assert_eq!(node.reserved(HASH_FIELD_TAG), 1);
    assert_eq!(node.reserved(HASH_MARKER_TAG), 1);
    // An expiry with no write after it: the next entry cleans up.
    node.one(expire("h", 100, ExpireCondition::Always));
    let due = |node: &Node| redis::housekeeping_due(&node.engine, node.now_ms).unwrap();
    node.now_ms += 99;
    assert!(!due(&node));
    node.now_ms += 1;
    assert!(due(&node));
    let before = node.revision();
    node.tick();
    assert!(!due(&node));
    assert_eq!(node.revision(), before, "no revision for the housekeeping");
    for tag in [
        HASH_MARKER_TAG,
        HASH_EXPIRY_TAG,
        HASH_DEAD_TAG,
        HASH_FIELD_TAG,
    ] {
        assert_eq!(node.reserved(tag), 0, "{}", String::from_utf8_lossy(tag));
    }
}

/// DEL of a hash of any size is one step for readers; its fields go
/// over the next entries, at most CLEANUP_RECORDS_PER_ENTRY_MAX records
/// per entry, and only in the room the entry's requests left.
#[test]
fn deleting_a_large_hash_is_immediate_and_its_fields_go_in_bounded_steps() {
    let mut node = Node::new();
    let fields_total = TXN_READ_KEYS_MAX + 100;
    for chunk in 0..(fields_total / 1000 + 1) {
        let fields: Vec<Pair> = (chunk * 1000..((chunk + 1) * 1000).min(fields_total))
            .map(|i| Pair {
                key: format!("f{i:06}").into_bytes(),
                value: b("v"),
            })
            .collect();
        node.one(RedisCommand::HSet {
            key: b("big"),
            pairs: fields,
            reply_ok: false,
        });
    }
    assert_eq!(node.read(hlen("big")), int(fields_total as i64));
    assert_eq!(node.reserved(HASH_FIELD_TAG), fields_total);
    // A block reading past TXN_READ_KEYS_MAX fields is refused, naming it.
    match node.block(Vec::new(), vec![hgetall("big")]) {
        Outcome::Rejected { reason } => assert!(reason.contains("TXN_READ_KEYS_MAX"), "{reason}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(node.one(del(&["big"])), int(1));
    assert_eq!(node.read(exists(&["big"])), int(0));
    let mut left = node.reserved(HASH_FIELD_TAG);
    assert!(
        left >= fields_total - CLEANUP_RECORDS_PER_ENTRY_MAX,
        "{left}"
    );
    let mut entries = 0;
    while left > 0 {
        assert!(redis::housekeeping_due(&node.engine, node.now_ms).unwrap());
        node.tick();
        let now = node.reserved(HASH_FIELD_TAG);
        assert!(
            left - now <= CLEANUP_RECORDS_PER_ENTRY_MAX,
            "{left} -> {now}"
        );
        assert!(now < left, "every entry makes progress");
        left = now;
        entries += 1;
    }
    assert!(entries >= 2);
    assert_eq!(node.reserved(HASH_DEAD_TAG), 0);
    assert!(!redis::housekeeping_due(&node.engine, node.now_ms).unwrap());
}

/// A MULTI/EXEC block applies at one revision, in order, each command
/// seeing the ones before; a command that fails at run time answers its
/// error and the others still apply, as in Redis.
#[test]
fn a_block_applies_atomically_at_one_revision() {
    let mut node = Node::new();
    let before = node.revision();
    let replies = node.exec(vec![
        set("a", "1"),
        incr_by("a", 5),
        get("a"),
        hset("h", &[("f", "x")]),
        incr_by("h", 1),
        hget("h", "f"),
        RedisCommand::Append {
            key: b("a"),
            value: b("0"),
        },
    ]);
    assert_eq!(
        replies,
        vec![
            ok(),
            int(6),
            bulk("6"),
            int(1),
            err(ERR_WRONGTYPE),
            bulk("x"),
            int(2)
        ]
    );
    assert_eq!(node.revision(), before + 1);
    let meta = node.engine.meta(b"a", 0).unwrap();
    let meta = kvstate::revision::KeyMeta::decode(&meta.meta).unwrap();
    assert_eq!(
        (meta.mod_revision, meta.version),
        (before + 1, 1),
        "one change of a"
    );
    // Reads alone, and writes that change nothing, take no revision.
    node.exec(vec![
        get("a"),
        hgetall("h"),
        del(&["nothing"]),
        set_with("a", "z", SetCondition::IfAbsent, SetExpiry::Persist, false),
    ]);
    assert_eq!(node.revision(), before + 1);
    // Several requests in one entry: each its own revision, each seeing
    // the earlier ones.
    let request = |commands| RedisRequest {
        session: None,
        watched: Vec::new(),
        commands,
    };
    let outcomes = node.requests(vec![
        request(vec![incr_by("a", 1)]),
        request(vec![incr_by("a", 1), get("a")]),
    ]);
    assert_eq!(
        outcomes,
        vec![
            Outcome::Redis(RedisAnswer::Replies(vec![int(61)])),
            Outcome::Redis(RedisAnswer::Replies(vec![int(62), bulk("62")])),
        ]
    );
    assert_eq!(node.revision(), before + 3);
}

/// WATCH: a block applies only if every watched key is at the revision
/// the front end read for it; a write, a delete or an expiry in between
/// aborts it whole (Redis ≥ 6.0.9 counts expiry).
#[test]
fn watch_aborts_a_block_whose_keys_changed_or_expired() {
    let mut node = Node::new();
    node.exec(vec![set("k", "1"), hset("h", &[("f", "1")])]);
    let seen = |node: &Node, key: &str| {
        redis::watch_revision(&node.engine, key.as_bytes(), node.now_ms).unwrap()
    };
    let (k, h, absent) = (seen(&node, "k"), seen(&node, "h"), seen(&node, "none"));
    assert!(k > 0 && h > 0);
    assert_eq!(absent, 0);
    let watched = |list: &[(&str, u64)]| {
        list.iter()
            .map(|(key, revision)| (b(key), *revision))
            .collect()
    };
    // Unchanged: applies.
    let outcome = node.block(
        watched(&[("k", k), ("h", h), ("none", 0)]),
        vec![incr_by("k", 1)],
    );
    assert_eq!(outcome, Outcome::Redis(RedisAnswer::Replies(vec![int(2)])));
    // k changed (by that block): the next one with the old revision aborts.
    let before = node.revision();
    let outcome = node.block(
        watched(&[("k", k)]),
        vec![set("k", "lost"), set("other", "lost")],
    );
    assert_eq!(outcome, Outcome::Redis(RedisAnswer::WatchFailed));
    assert_eq!(node.read(get("k")), bulk("2"));
    assert_eq!(node.read(exists(&["other"])), int(0));
    assert_eq!(node.revision(), before, "nothing applied");
    // A hash field's change moves the hash's revision.
    node.one(hset("h", &[("g", "2")]));
    assert_eq!(
        node.block(watched(&[("h", h)]), vec![get("k")]),
        Outcome::Redis(RedisAnswer::WatchFailed)
    );
    // An expiry counts: watched while live, expired by EXEC.
    node.one(expire("k", 1_000, ExpireCondition::Always));
    let k = seen(&node, "k");
    node.now_ms += 1_000;
    assert_eq!(
        node.block(watched(&[("k", k)]), vec![get("k")]),
        Outcome::Redis(RedisAnswer::WatchFailed)
    );
    // A key created meanwhile too.
    assert_eq!(
        node.block(watched(&[("none", 0)]), vec![get("k")]),
        Outcome::Redis(RedisAnswer::Replies(vec![nil()]))
    );
    node.one(set("none", "now"));
    assert_eq!(
        node.block(watched(&[("none", 0)]), vec![get("k")]),
        Outcome::Redis(RedisAnswer::WatchFailed)
    );
    // A counter incremented under WATCH by racing clients: only the
    // first of two blocks that read the same revision applies.
    node.one(set("counter", "0"));
    let read = seen(&node, "counter");
    let block = || RedisRequest {
        session: None,
        watched: watched(&[("counter", read)]),
        commands: vec![incr_by("counter", 1)],
    };
    let outcomes = node.requests(vec![block(), block()]);
    assert_eq!(
        outcomes[0],
        Outcome::Redis(RedisAnswer::Replies(vec![int(1)]))
    );
    assert_eq!(outcomes[1], Outcome::Redis(RedisAnswer::WatchFailed));
}

#[test]
fn flushall_deletes_every_key_and_hash_at_one_revision_or_nothing_past_its_limit() {
    let mut node = Node::new();
    node.exec(vec![
        set("a", "1"),
        set_with(
            "b",
            "2",
            SetCondition::Always,
            SetExpiry::In { ms: 60_000 },
            false,
        ),
        hset("h", &[("f", "v")]),
        expire("h", 60_000, ExpireCondition::Always),
    ]);
    let high = [b"\xff\xffz".as_slice(), b"high"].concat();
    node.one(RedisCommand::Set {
        key: high.clone(),
        value: b("x"),
        condition: SetCondition::Always,
        expiry: SetExpiry::Persist,
        get: false,
    });
    let before = node.revision();
    assert_eq!(node.one(RedisCommand::FlushAll), ok());
    assert_eq!(node.revision(), before + 1);
    assert_eq!(redis::key_count(&node.engine, node.now_ms).unwrap(), 0);
    assert_eq!(
        node.engine.meta(&high, 0),
        None,
        "a user key after the reserved ones goes too"
    );
    assert_eq!(node.applier.expiring_keys(), 0);
    for tag in [
        HASH_MARKER_TAG,
        HASH_EXPIRY_TAG,
        HASH_DEAD_TAG,
        HASH_FIELD_TAG,
    ] {
        assert_eq!(node.reserved(tag), 0, "{}", String::from_utf8_lossy(tag));
    }
    // Past FLUSH_KEYS_MAX keys: refused, naming it, and nothing deleted.
    for chunk in 0..=(FLUSH_KEYS_MAX / 1000) {
        let pairs = (0..1000)
            .map(|i| Pair {
                key: format!("k{chunk}-{i}").into_bytes(),
                value: b("v"),
            })
            .collect();
        node.one(RedisCommand::MSet { pairs });
    }
    let before = node.revision();
    match node.one(RedisCommand::FlushAll) {
        RedisReply::Error(message) => assert!(message.contains("FLUSH_KEYS_MAX"), "{message}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(node.revision(), before);
    assert_eq!(
        redis::key_count(&node.engine, node.now_ms).unwrap(),
        (FLUSH_KEYS_MAX / 1000 + 1) as u64 * 1000
    );
}

#[test]
fn limits_are_refused_with_the_limit_named() {
    let mut node = Node::new();
    let too_big = "x".repeat(STRING_BYTES_MAX + 1);
    let named = |reply: RedisReply, name: &str| match reply {
        RedisReply::Error(message) => assert!(message.contains(name), "{message}"),
        other => panic!("{other:?}"),
    };
    named(node.one(set("k", &too_big)), "VALUE_SIZE_BYTES_MAX");
    node.one(set("k", &"x".repeat(STRING_BYTES_MAX - 1)));
    named(
        node.one(RedisCommand::Append {
            key: b("k"),
            value: b("yy"),
        }),
        "VALUE_SIZE_BYTES_MAX",
    );
    assert_eq!(
        node.one(RedisCommand::Append {
            key: b("k"),
            value: b("y")
        }),
        int(STRING_BYTES_MAX as i64)
    );
    named(
        node.one(RedisCommand::SetRange {
            key: b("r"),
            offset: STRING_BYTES_MAX as u64,
            value: b("y"),
        }),
        "VALUE_SIZE_BYTES_MAX",
    );
    named(
        node.one(RedisCommand::SetRange {
            key: b("r"),
            offset: u64::MAX,
            value: b("y"),
        }),
        "VALUE_SIZE_BYTES_MAX",
    );
    named(node.one(set(&"k".repeat(4097), "v")), "KEY_SIZE_BYTES_MAX");
    named(node.one(set("", "v")), "empty keys");
    named(
        node.one(hset("h", &[(&"f".repeat(HASH_FIELD_BYTES_MAX + 1), "v")])),
        "HASH_FIELD_BYTES_MAX",
    );
    named(
        node.one(hset(
            &"h".repeat(redis::HASH_KEY_BYTES_MAX + 1),
            &[("f", "v")],
        )),
        "HASH_KEY_BYTES_MAX",
    );
    assert_eq!(
        node.one(hset("h", &[(&"f".repeat(HASH_FIELD_BYTES_MAX), "v")])),
        int(1)
    );
    assert_eq!(node.read(exists(&["r", ""])), int(0));
    // A block whose writes would not fit its entry's batch: refused whole.
    let big = "v".repeat(STRING_BYTES_MAX);
    let commands: Vec<RedisCommand> = (0..40).map(|i| set(&format!("big{i}"), &big)).collect();
    let before = node.revision();
    match node.block(Vec::new(), commands) {
        Outcome::Rejected { reason } => {
            assert!(reason.contains("TXN_ENTRY_BATCH_BYTES_MAX"), "{reason}")
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(node.revision(), before);
    assert_eq!(node.read(exists(&["big0"])), int(0));
    // Writing one key again and again counts its one record: 64 appends
    // to a 1 MiB value fit (64 MiB of rewrites, one 1 MiB record).
    node.one(set("grow", &"v".repeat(STRING_BYTES_MAX - 64)));
    let appends: Vec<RedisCommand> = (0..64)
        .map(|_| RedisCommand::Append {
            key: b("grow"),
            value: b("a"),
        })
        .collect();
    let replies = node.exec(appends);
    assert_eq!(replies.last(), Some(&int(STRING_BYTES_MAX as i64)));
    // A block reading more than TXN_READ_BYTES_MAX: refused whole.
    let reads: Vec<RedisCommand> = (0..5).map(|_| get("k")).collect();
    match node.block(Vec::new(), reads) {
        Outcome::Rejected { reason } => assert!(reason.contains("TXN_READ_BYTES_MAX"), "{reason}"),
        other => panic!("{other:?}"),
    }
}

/// The batcher counts a Redis request by `Write::ops`: never fewer
/// records than its entry then writes for it. (The entry's housekeeping
/// comes on top, in the room left: the field and dead-hash tombstones of
/// the hashes the request deleted are not counted; the request's own
/// HDEL tombstones are counted in the last case, where no hash dies.)
#[test]
fn write_ops_bound_the_records_a_request_writes() {
    let mut node = Node::new();
    let hdel = |fields: &[&str]| RedisCommand::HDel {
        key: b("s"),
        fields: fields.iter().map(|field| b(field)).collect(),
    };
    let cases = vec![
        vec![
            set("s", "1"),
            hset("h", &[("a", "1"), ("b", "2")]),
            expire("h", 9_000, ExpireCondition::Always),
        ],
        vec![set("h", "replaces the hash")],
        vec![
            hset("h2", &[("a", "1")]),
            expire("h2", 9_000, ExpireCondition::Always),
            rename("h2", "s", false),
        ],
        vec![
            hset("x", &[("a", "1")]),
            expire("x", 5_000, ExpireCondition::Always),
            expire("x", -1, ExpireCondition::Always),
        ],
        vec![
            set("m", "1"),
            RedisCommand::MSet {
                pairs: pairs(&[("m", "2"), ("n", "3")]),
            },
            del(&["m", "n", "s"]),
        ],
        vec![
            hset("f", &[("a", "1")]),
            set("g", "1"),
            RedisCommand::FlushAll,
        ],
        vec![
            hset("s", &[("a", "1"), ("b", "1"), ("c", "1")]),
            hdel(&["a", "b"]),
        ],
        vec![hdel(&["c"])],
    ];
    let fields = [RESERVED_KEY_PREFIX, HASH_FIELD_TAG].concat();
    let deads = [RESERVED_KEY_PREFIX, HASH_DEAD_TAG].concat();
    let last = cases.len() - 1;
    for (case, commands) in cases.into_iter().enumerate() {
        let request = RedisRequest {
            session: None,
            watched: Vec::new(),
            commands,
        };
        let bound = Write::Redis(request.clone()).ops();
        node.requests(vec![request.clone()]);
        let written = node
            .records_of_entry(node.index)
            .into_iter()
            .filter(|record| {
                let tombstone = record.kind == bitcask::StoredKind::Tombstone;
                let housekeeping = tombstone
                    && (record.key.starts_with(&deads) || record.key.starts_with(&fields));
                case == last || !housekeeping
            })
            .count();
        assert!(
            written <= bound,
            "{request:?}: {written} records, bound {bound}"
        );
        assert!(written > 0, "{request:?} writes");
    }
    let flush = RedisRequest {
        session: None,
        watched: Vec::new(),
        commands: vec![RedisCommand::FlushAll],
    };
    assert!(Write::Redis(flush).ops() < ENTRY_OPS_MAX);
}

#[test]
fn a_retried_request_applies_once_and_gets_its_first_answer() {
    let mut node = Node::new();
    let request = |sequence| RedisRequest {
        session: Some(SessionRef {
            client_id: 7,
            sequence,
            lowest_unacked: 0,
            opens: true,
        }),
        watched: Vec::new(),
        commands: vec![incr_by("c", 1)],
    };
    let first = node.requests(vec![request(1)]);
    let retry = node.requests(vec![request(1)]);
    assert_eq!(first, retry);
    assert_eq!(node.read(get("c")), bulk("1"));
    node.requests(vec![request(2)]);
    assert_eq!(node.read(get("c")), bulk("2"));
}

/// A restart (the files, reloaded) answers the same, and TTL'd hashes
/// still expire and are cleaned up after it.
#[test]
fn a_restart_keeps_strings_hashes_and_their_ttls() {
    let mut node = Node::new();
    node.exec(vec![
        set("s", "v"),
        set_with(
            "t",
            "v",
            SetCondition::Always,
            SetExpiry::In { ms: 3_000 },
            false,
        ),
        hset("h", &[("a", "1"), ("b", "2")]),
        expire("h", 3_000, ExpireCondition::Always),
        hset("p", &[("x", "y")]),
    ]);
    node.one(del(&["p"]));
    let reads = |node: &Node| {
        [
            get("s"),
            pttl("t"),
            hgetall("h"),
            pttl("h"),
            hgetall("p"),
            type_of("h"),
        ]
        .into_iter()
        .map(|command| node.read(command))
        .collect::<Vec<_>>()
    };
    let before = reads(&node);
    let revision = node.revision();
    node.restart();
    assert_eq!(reads(&node), before);
    assert_eq!(node.revision(), revision);
    node.now_ms += 3_000;
    node.tick();
    assert_eq!(node.read(exists(&["t", "h", "s"])), int(1));
    for tag in [
        HASH_MARKER_TAG,
        HASH_EXPIRY_TAG,
        HASH_DEAD_TAG,
        HASH_FIELD_TAG,
    ] {
        assert_eq!(node.reserved(tag), 0, "{}", String::from_utf8_lossy(tag));
    }
    assert_eq!(node.applier.expiring_keys(), 0);
}

/// A replica that restarts between entries and one that never does write
/// byte-identical files for a Redis workload (TTLs on strings and hashes,
/// deletes, renames, blocks, housekeeping): apply keeps nothing in memory
/// that a restart would rebuild differently.
#[test]
fn replicas_applying_the_same_redis_entries_write_identical_files() {
    // A small deterministic generator (no randomness in tests that
    // compare files), over few keys so commands meet each other's keys.
    let mut seed = 0x2545_f491_4f6c_dd1d_u64;
    let mut next = move |below: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % below
    };
    let entries: Vec<(u64, Vec<RedisRequest>)> = (0..400u64)
        .map(|i| {
            let commands = (0..1 + next(3))
                .map(|_| {
                    let key = format!("k{}", next(4));
                    let hash = format!("h{}", next(3));
                    let other = format!("h{}", next(3));
                    let ttl = 100 + next(10) as i64 * 100;
                    match next(12) {
                        0 => set(&key, &"v".repeat(next(40) as usize)),
                        1 | 2 => hset(&hash, &[(&format!("f{}", next(5)), "x"), ("g", "y")]),
                        3 | 4 => expire(&hash, ttl, ExpireCondition::Always),
                        5 => expire(&key, ttl, ExpireCondition::Always),
                        6 => incr_by(&format!("c{}", next(2)), 1),
                        7 => del(&[&hash, &key]),
                        8 => rename(&hash, &other, next(2) == 0),
                        9 => RedisCommand::HDel {
                            key: b(&hash),
                            fields: vec![b("g"), b("f1")],
                        },
                        10 => incr_by_float("fl", "0.1"),
                        _ => hgetall(&hash),
                    }
                })
                .collect();
            let session = (i % 4 == 0).then_some(SessionRef {
                client_id: i % 3,
                sequence: i,
                lowest_unacked: i.saturating_sub(8),
                opens: true,
            });
            let request = RedisRequest {
                session,
                watched: Vec::new(),
                commands,
            };
            (i * 97, vec![request])
        })
        .collect();
    let run = |restart_every: Option<usize>| {
        let mut node = Node::new();
        let mut answers = Vec::new();
        for (i, (time_ms, requests)) in entries.iter().enumerate() {
            node.now_ms = *time_ms;
            answers.push(node.requests(requests.clone()));
            if restart_every.is_some_and(|every| i % every == every - 1) {
                node.restart();
            }
        }
        (
            node.engine.sealed_files(),
            node.engine.active_file(),
            node.applier.header(),
            answers,
        )
    };
    let (sealed_a, active_a, header_a, answers_a) = run(None);
    let (sealed_b, active_b, header_b, answers_b) = run(Some(5));
    assert!(sealed_a.len() >= 4, "the workload seals segments");
    assert_eq!(answers_a, answers_b);
    assert_eq!(header_a, header_b);
    assert_eq!(sealed_a, sealed_b);
    assert_eq!(active_a, active_b);
}
