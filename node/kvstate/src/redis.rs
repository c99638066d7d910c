//! Redis commands in the replicated state: what a Redis request carries
//! ([`RedisRequest`], a [`crate::command::Command::Redis`] entry), the
//! replies, and how Redis's types are laid out in the engine. The RESP
//! front end only translates: every write — and every command of a
//! MULTI/EXEC block — is applied here, atomically, the same on every
//! replica (never read-modify-write in the front end). Reads outside a
//! block run the same code against the engine alone ([`read`]).
//!
//! ## Requests
//! A request is one command or a MULTI/EXEC block. Its commands run in
//! order in the entry (`apply/redis_entry.rs`), each seeing the entry's
//! earlier writes and the block's own; their writes are staged and move
//! into the entry's batch together, at **one store revision** (none if
//! nothing changed: reads, SET NX on a present key, DEL of absent keys).
//! As in Redis, a command that fails at run time answers its error
//! ([`RedisReply::Error`], Redis's message) and writes nothing, and the
//! block's other commands still apply. A request is refused whole
//! (`Outcome::Rejected`, nothing applied, the limit named) when its writes
//! would not fit the entry (`ENTRY_OPS_MAX`,
//! [`crate::txn::TXN_ENTRY_BATCH_BYTES_MAX`]) or its reads pass the
//! transactions' budgets ([`crate::txn::TXN_READ_KEYS_MAX`],
//! [`crate::txn::TXN_READ_BYTES_MAX`], the entry's
//! [`crate::txn::ENTRY_TXN_READ_BYTES_MAX`]). **WATCH**: the front end
//! reads [`watch_revision`] for each watched key when WATCH runs; EXEC's
//! request carries them and applies only if each is unchanged, else
//! answers [`RedisAnswer::WatchFailed`]. Any write of the key (a hash:
//! any change of a field, which rewrites its marker), a delete, or a TTL
//! that ran out (as Redis ≥ 6.0.9) changes it. One difference from Redis:
//! a key absent at WATCH that is created and deleted again before EXEC
//! reads absent again, so the block applies (it is still serializable:
//! every watched key is as the client saw it when the block applies).
//!
//! **Time** is the entry's cluster time, which has no epoch: commands
//! carry TTLs relative to it ([`SetExpiry::In`]); the front end converts
//! EXAT / PXAT / EXPIREAT / PEXPIREAT and EXPIRETIME with its wall clock.
//! A string's TTL is its engine record's expiry (the native API's TTL,
//! deleted by the entry's expiry deletes, each at a revision of its own).
//!
//! ## Strings and the native API
//! A Redis string is the user key of the same bytes, value and TTL: the
//! native API, etcd's, watches and the change history see Redis strings,
//! and Redis sees native keys. A Redis write detaches a key from a native
//! lease (as a native put without one does). Hashes live entirely under
//! the reserved prefix, which the native API never shows. A native put of
//! a key that is a Redis hash leaves both; Redis then sees the string
//! (TYPE, GET, WRONGTYPE for hash commands, WATCH), and every command that
//! removes or replaces the key (DEL, SET, MSET, GETDEL, RENAME, FLUSHALL,
//! an EXPIRE in the past) removes both.
//!
//! ## On disk: hashes (reserved keys)
//! Every key below starts with [`RESERVED_KEY_PREFIX`] (11 bytes,
//! `\xff\xffraftcask/`), then a 3-byte tag; integers are big-endian.
//! Each record is an ordinary engine record whose meta is a
//! [`crate::revision::KeyMeta`] (reserved records never enter the change
//! history).
//!
//! | record | key after the prefix | value |
//! |---|---|---|
//! | marker | `hm/` (3) + Redis key (1..=[`HASH_KEY_BYTES_MAX`]) | 17 bytes: [`HASH_MARKER_FORMAT`] (1 byte, 1), id (u64), field count (u64, ≥ 1) |
//! | field | `hf/` (3) + id (u64) + field (0..=[`HASH_FIELD_BYTES_MAX`]) | the field's value (≤ [`STRING_BYTES_MAX`]) |
//! | expiry | `hx/` (3) + expiry ms (u64) + Redis key | the hash's id (u64) |
//! | dead hash | `hd/` (3) + id (u64) | empty |
//!
//! - **The marker** is the hash: TYPE, EXISTS, KEYS / SCAN / DBSIZE
//!   ([`keys_page`], [`key_count`]) list markers beside the user keys;
//!   HLEN reads its count; every change of the hash rewrites it, so its
//!   `mod_revision` is the hash's (WATCH). Its engine expiry is the hash's
//!   TTL: every reader judges it, so the whole hash reads absent at its
//!   expiry. It is written and deleted at the request's revision.
//! - **A field's** record is named by the hash's **id**, not its key: the
//!   id is `log index × 65536 + position` of the entry and place where the
//!   hash was created (the sequence number a record there would have),
//!   unique for the life of the store. So RENAME moves only the marker
//!   (the fields stay), and a hash created again under a key whose old
//!   hash's fields still wait for deletion never sees them.
//! - **An expiry record** exists for each marker with a TTL (written and
//!   deleted with the marker's TTL); they sort by expiry. Hash markers
//!   never enter the applier's in-memory expiry index: expiry records are
//!   files, so a restart rebuilds nothing.
//! - **A dead-hash record** names a deleted hash whose fields are still
//!   stored.
//!
//! ## Deleting a hash
//! DEL, SET over a hash, RENAME onto one, FLUSHALL, and an EXPIRE in the
//! past delete its marker and expiry record and write a dead-hash record:
//! three records, whatever the hash's size — the hash is gone for every
//! reader at that revision. After the requests of **every** entry (so in
//! the room they left, never taking room the batcher promised them), its
//! **housekeeping** writes at most [`CLEANUP_RECORDS_PER_ENTRY_MAX`]
//! records: for each expiry record at or below the entry's time, in
//! expiry order, the marker (if it is still that hash) and the expiry
//! record go and a dead-hash record is written; then, in id order, dead
//! hashes' fields are deleted, and each dead-hash record once its last
//! field is gone. The housekeeping takes no revision (readers already see
//! the hash absent) and is the same on every replica (it reads only the
//! files and the entry). An idle cluster does it with its next entry;
//! [`housekeeping_due`] tells the leader's tick loop one is due.
//!
//! ## Limits
//! - Keys: [`KEY_BYTES_MAX`] (the cluster's key limit); a hash's key
//!   [`HASH_KEY_BYTES_MAX`], a field [`HASH_FIELD_BYTES_MAX`] (their
//!   records' keys must fit the engine's); no empty key (the engine holds
//!   none), no key under the reserved prefix.
//! - Values, and what APPEND / SETRANGE / INCRBYFLOAT build:
//!   [`STRING_BYTES_MAX`], the cluster's value limit, in place of Redis's
//!   512 MB.
//! - FLUSHDB / FLUSHALL: at most [`FLUSH_KEYS_MAX`] keys in its one atomic
//!   step, else refused and nothing deleted.
//! - Reads outside the log: [`READ_BYTES_MAX`] bytes, [`READ_KEYS_MAX`]
//!   fields.

use std::ops::Bound;

use bitcask::Engine;
use serde::{Deserialize, Serialize};

use crate::command::{RESERVED_KEY_PREFIX, SessionRef};
use crate::revision::{KeyMeta, RevisionError};

mod exec;
pub mod long_double;

pub(crate) use exec::{
    Fault, Found, Store, execute, malformed_marker, prefix_end, watched_revision,
};

/// One Redis client request: a single command, or the commands of a
/// MULTI/EXEC block, applied as one atomic unit at one store revision
/// (none if nothing changed). As in Redis, a command that fails at run
/// time (WRONGTYPE, not an integer, ...) answers its error and writes
/// nothing, and the block's other commands still apply; syntax errors are
/// the front end's (Redis's EXECABORT happens before EXEC). A request is
/// refused whole ([`crate::command::Outcome::Rejected`], nothing applied)
/// only when it does not fit the entry's limits, the reason naming the
/// limit (a reason, with no `ERR ` in front: the front end adds Redis's
/// prefix).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RedisRequest {
    /// Exactly-once bookkeeping, if the front end uses a session.
    pub session: Option<SessionRef>,
    /// WATCH conditions: each key with the revision [`watch_revision`]
    /// read for it when WATCH ran (0 = absent). If any key's current
    /// revision differs — it was written, deleted, or its TTL ran out (as
    /// in Redis ≥ 6.0.9) — nothing applies and the answer is
    /// [`RedisAnswer::WatchFailed`] (EXEC's nil).
    pub watched: Vec<(Vec<u8>, u64)>,
    /// The commands, applied in order, each seeing the ones before it.
    pub commands: Vec<RedisCommand>,
}

/// A key and a value (MSET, HSET: a field and its value).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pair {
    /// The key (or the field).
    #[serde(with = "serde_bytes")]
    pub key: Vec<u8>,
    /// The value.
    #[serde(with = "serde_bytes")]
    pub value: Vec<u8>,
}

/// SET's NX / XX.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum SetCondition {
    /// Set whatever the key holds.
    #[default]
    Always,
    /// NX: only if the key does not exist (of any type).
    IfAbsent,
    /// XX: only if the key exists (of any type).
    IfPresent,
}

/// What a string write does to the key's time to live.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum SetExpiry {
    /// No expiry (SET without EX/PX/EXAT/PXAT/KEEPTTL clears any TTL).
    #[default]
    Persist,
    /// KEEPTTL: keep the TTL the key has (none if it is created).
    Keep,
    /// Expire `ms` milliseconds of cluster time after the entry's time.
    /// EX/PX are `seconds × 1000` / `ms`; EXAT/PXAT are converted by the
    /// front end to `unix_ms − its wall clock's unix ms` (cluster time has
    /// no epoch; the front end also makes Redis's "invalid expire time"
    /// checks, which need the wall clock). At or below 0 the key is
    /// written already expired: it is absent afterwards, as in Redis.
    In {
        /// Milliseconds from the entry's cluster time.
        ms: i64,
    },
}

/// GETEX's options.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum GetExExpiry {
    /// No option: GETEX is GET (nothing is written).
    #[default]
    Unchanged,
    /// PERSIST: remove the TTL.
    Persist,
    /// EX/PX/EXAT/PXAT, relative as [`SetExpiry::In`]; at or below 0 the
    /// key is deleted (its value is still returned).
    In {
        /// Milliseconds from the entry's cluster time.
        ms: i64,
    },
}

/// EXPIRE's NX / XX / GT / LT (Redis 7). A key without a TTL counts as an
/// infinite TTL for GT and LT.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum ExpireCondition {
    /// Set the TTL whatever it is.
    #[default]
    Always,
    /// NX: only if the key has no TTL.
    IfNone,
    /// XX: only if the key has a TTL.
    IfSome,
    /// GT: only if the new expiry is later than the current one (never on
    /// a key without a TTL).
    IfGreater,
    /// LT: only if the new expiry is earlier than the current one (always
    /// on a key without a TTL).
    IfLess,
    /// XX and LT together: only if the key has a TTL and the new expiry is
    /// earlier than it. (Last, so the variants before keep their encoded
    /// numbers in logs written before it existed.)
    IfSomeAndLess,
}

/// One Redis command as apply runs it. Keys are Redis keys (a string is
/// the user key of the same bytes, which the native API sees too; a hash
/// lives under the reserved prefix, see the module doc). Every command
/// refuses, as its own error reply: an empty key (the engine holds none),
/// a key under the reserved prefix, and sizes over the limits above, each
/// message naming the limit. Read commands are here so a MULTI/EXEC block
/// can read at its own point of the log; outside a block the front end
/// runs them with [`read`] on a replica.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum RedisCommand {
    // ---- strings ----
    /// GET: the value, nil if absent, WRONGTYPE on a hash.
    Get {
        /// The key.
        #[serde(with = "serde_bytes")]
        key: Vec<u8>,
    },
    /// `SET key value [NX|XX] [GET] [EX|PX|EXAT|PXAT|KEEPTTL]` (Redis 7.0),
    /// and SETEX / PSETEX (an [`SetExpiry::In`] TTL, reply OK) and GETSET
    /// (`get: true`). Without GET it replaces a key of any type (a hash
    /// goes); with GET a hash is WRONGTYPE and nothing is set. Reply: OK,
    /// or nil when NX/XX did not hold; with GET the old value (nil if
    /// none) whether or not it set. The key's lease (native API) is
    /// dropped, as a native put without one does.
    Set {
        /// The key.
        #[serde(with = "serde_bytes")]
        key: Vec<u8>,
        /// The value (at most [`STRING_BYTES_MAX`]).
        #[serde(with = "serde_bytes")]
        value: Vec<u8>,
        /// NX / XX.
        condition: SetCondition,
        /// EX / PX / EXAT / PXAT / KEEPTTL, or none.
        expiry: SetExpiry,
        /// GET: reply the old value.
        get: bool,
    },
    /// SETNX: set if absent (any type); reply 1 if set, else 0.
    SetNx {
        /// The key.
        #[serde(with = "serde_bytes")]
        key: Vec<u8>,
        /// The value.
        #[serde(with = "serde_bytes")]
        value: Vec<u8>,
    },
    /// GETDEL: the value (nil if absent), then the key is deleted;
    /// WRONGTYPE on a hash.
    GetDel {
        /// The key.
        #[serde(with = "serde_bytes")]
        key: Vec<u8>,
    },
    /// GETEX [EX|PX|EXAT|PXAT|PERSIST]: the value (nil if absent), and the
    /// TTL changed as asked; WRONGTYPE on a hash.
    GetEx {
        /// The key.
        #[serde(with = "serde_bytes")]
        key: Vec<u8>,
        /// What to do to the TTL.
        expiry: GetExExpiry,
    },
    /// MGET: one reply per key: the value, or nil when absent or not a
    /// string (as Redis: no WRONGTYPE).
    MGet {
        /// The keys.
        keys: Vec<Vec<u8>>,
    },
    /// MSET: set every pair (a later pair of the same key wins), each
    /// replacing a key of any type and clearing its TTL; reply OK.
    MSet {
        /// The pairs.
        pairs: Vec<Pair>,
    },
    /// MSETNX: set every pair only if none of the keys exists (any type);
    /// reply 1 if set, else 0. All or nothing.
    MSetNx {
        /// The pairs.
        pairs: Vec<Pair>,
    },
    /// INCR (1), DECR (-1), INCRBY n, DECRBY n (the front end sends `-n`,
    /// refusing `i64::MIN` with [`ERR_DECREMENT_OVERFLOW`] as Redis 7
    /// does before looking at the key): the value parsed as Redis's
    /// `string2ll` (decimal, no sign but `-`, no leading zero, no space) —
    /// absent counts as 0 — plus `increment`, stored in decimal, TTL kept.
    /// Reply: the new value; [`ERR_NOT_INTEGER`] or [`ERR_OVERFLOW`].
    IncrBy {
        /// The key.
        #[serde(with = "serde_bytes")]
        key: Vec<u8>,
        /// Added to the value.
        increment: i64,
    },
    /// INCRBYFLOAT: the value and `increment` parsed as Redis's
    /// `string2ld` (C `strtold`: decimal or hex, `inf`, no surrounding
    /// space) in x87 80-bit long double precision, added, stored as Redis
    /// formats it (`%.17Lf`, trailing zeros cut), TTL kept. Reply: the new
    /// value as a bulk string (Redis replies a bulk string in RESP2 and
    /// RESP3 alike); [`ERR_NOT_FLOAT`] or [`ERR_NAN_OR_INFINITY`].
    IncrByFloat {
        /// The key.
        #[serde(with = "serde_bytes")]
        key: Vec<u8>,
        /// The increment, as the client sent it.
        #[serde(with = "serde_bytes")]
        increment: Vec<u8>,
    },
    /// APPEND: the value with `value` appended (created if absent), TTL
    /// kept. Reply: the new length; over [`STRING_BYTES_MAX`] an error
    /// naming it (Redis's "string exceeds maximum allowed size").
    Append {
        /// The key.
        #[serde(with = "serde_bytes")]
        key: Vec<u8>,
        /// What to append.
        #[serde(with = "serde_bytes")]
        value: Vec<u8>,
    },
    /// SETRANGE: `value` written at `offset`, zero bytes padding the gap,
    /// TTL kept (the front end refuses a negative offset with Redis's "ERR
    /// offset is out of range"). An empty `value` writes nothing (reply
    /// the current length; 0 and no key if absent). Reply: the new length;
    /// past [`STRING_BYTES_MAX`] an error naming it (Redis's 512 MB rule).
    SetRange {
        /// The key.
        #[serde(with = "serde_bytes")]
        key: Vec<u8>,
        /// Where to write.
        offset: u64,
        /// What to write.
        #[serde(with = "serde_bytes")]
        value: Vec<u8>,
    },
    /// STRLEN: the value's length, 0 if absent; WRONGTYPE on a hash.
    StrLen {
        /// The key.
        #[serde(with = "serde_bytes")]
        key: Vec<u8>,
    },
    /// GETRANGE: the bytes from `start` to `end` inclusive, negative
    /// counting from the end, as Redis 7 clamps them; "" if absent.
    GetRange {
        /// The key.
        #[serde(with = "serde_bytes")]
        key: Vec<u8>,
        /// First byte.
        start: i64,
        /// Last byte.
        end: i64,
    },
    // ---- keys ----
    /// DEL / UNLINK: delete each key, of any type (a hash with all its
    /// fields, at once as far as any reader sees). Reply: how many
    /// existed (a key named twice counts once).
    Del {
        /// The keys.
        keys: Vec<Vec<u8>>,
    },
    /// EXISTS: how many of the keys exist (a key named twice counts twice).
    Exists {
        /// The keys.
        keys: Vec<Vec<u8>>,
    },
    /// EXPIRE / PEXPIRE / EXPIREAT / PEXPIREAT with NX / XX / GT / LT
    /// (Redis 7), on a key of any type (a hash expires whole): `ms` as
    /// [`SetExpiry::In`]. Reply 0 if the key is absent or the condition
    /// does not hold; else 1, and an expiry at or below the entry's time
    /// deletes the key (as Redis does for a time in the past).
    Expire {
        /// The key.
        #[serde(with = "serde_bytes")]
        key: Vec<u8>,
        /// Milliseconds from the entry's cluster time.
        ms: i64,
        /// NX / XX / GT / LT.
        condition: ExpireCondition,
    },
    /// PERSIST: remove the TTL; reply 1 if there was one, else 0.
    Persist {
        /// The key.
        #[serde(with = "serde_bytes")]
        key: Vec<u8>,
    },
    /// TTL (`milliseconds: false`, rounded to the nearest second as Redis
    /// does) and PTTL: -2 if absent, -1 without a TTL, else what is left
    /// of it in cluster time. EXPIRETIME / PEXPIRETIME are the front
    /// end's: its wall clock's unix time plus PTTL (cluster time has no
    /// epoch).
    Ttl {
        /// The key.
        #[serde(with = "serde_bytes")]
        key: Vec<u8>,
        /// PTTL rather than TTL.
        milliseconds: bool,
    },
    /// TYPE: status `string`, `hash` or `none`.
    Type {
        /// The key.
        #[serde(with = "serde_bytes")]
        key: Vec<u8>,
    },
    /// RENAME (`only_if_absent: false`) and RENAMENX: the key, of any type
    /// and with its TTL, moves to `destination`, replacing whatever was
    /// there (RENAMENX: reply 0 and nothing moves if `destination`
    /// exists). A hash moves with all its fields, in one step whatever its
    /// size. The native lease of a string is dropped. Reply OK (RENAMENX:
    /// 1); [`ERR_NO_SUCH_KEY`] if the key is absent; the same key: OK (0
    /// for RENAMENX) and nothing changes, as Redis 7.
    Rename {
        /// The key.
        #[serde(with = "serde_bytes")]
        source: Vec<u8>,
        /// The new name.
        #[serde(with = "serde_bytes")]
        destination: Vec<u8>,
        /// RENAMENX.
        only_if_absent: bool,
    },
    /// FLUSHDB / FLUSHALL (one database; ASYNC / SYNC make no difference):
    /// every user key and every hash deleted at one revision. At most
    /// [`FLUSH_KEYS_MAX`] keys: beyond, an error naming it and nothing is
    /// deleted (delete in batches: SCAN + DEL). Reply OK.
    FlushAll,
    // ---- hashes ----
    /// HSET (reply: fields added) and HMSET (`reply_ok`: reply OK): each
    /// field set, the hash created if absent; TTL kept; WRONGTYPE on a
    /// string.
    HSet {
        /// The hash.
        #[serde(with = "serde_bytes")]
        key: Vec<u8>,
        /// Fields and values (a later pair of the same field wins).
        pairs: Vec<Pair>,
        /// HMSET's reply.
        reply_ok: bool,
    },
    /// HSETNX: set the field if the hash lacks it; reply 1 if set, else 0.
    HSetNx {
        /// The hash.
        #[serde(with = "serde_bytes")]
        key: Vec<u8>,
        /// The field.
        #[serde(with = "serde_bytes")]
        field: Vec<u8>,
        /// The value.
        #[serde(with = "serde_bytes")]
        value: Vec<u8>,
    },
    /// HDEL: delete the fields; reply how many existed. A hash left with
    /// no field is deleted, as in Redis.
    HDel {
        /// The hash.
        #[serde(with = "serde_bytes")]
        key: Vec<u8>,
        /// The fields.
        fields: Vec<Vec<u8>>,
    },
    /// HINCRBY: the field as [`RedisCommand::IncrBy`] (absent = 0); errors
    /// [`ERR_HASH_NOT_INTEGER`], [`ERR_OVERFLOW`].
    HIncrBy {
        /// The hash.
        #[serde(with = "serde_bytes")]
        key: Vec<u8>,
        /// The field.
        #[serde(with = "serde_bytes")]
        field: Vec<u8>,
        /// Added to the value.
        increment: i64,
    },
    /// HINCRBYFLOAT: the field as [`RedisCommand::IncrByFloat`]; errors
    /// [`ERR_HASH_NOT_FLOAT`] (the field), [`ERR_NOT_FLOAT`] (the
    /// increment), [`ERR_NAN_OR_INFINITY`].
    HIncrByFloat {
        /// The hash.
        #[serde(with = "serde_bytes")]
        key: Vec<u8>,
        /// The field.
        #[serde(with = "serde_bytes")]
        field: Vec<u8>,
        /// The increment, as the client sent it.
        #[serde(with = "serde_bytes")]
        increment: Vec<u8>,
    },
    /// HGET: the field's value, nil if absent.
    HGet {
        /// The hash.
        #[serde(with = "serde_bytes")]
        key: Vec<u8>,
        /// The field.
        #[serde(with = "serde_bytes")]
        field: Vec<u8>,
    },
    /// HMGET: one value (or nil) per field.
    HMGet {
        /// The hash.
        #[serde(with = "serde_bytes")]
        key: Vec<u8>,
        /// The fields.
        fields: Vec<Vec<u8>>,
    },
    /// HLEN: the number of fields, 0 if absent.
    HLen {
        /// The hash.
        #[serde(with = "serde_bytes")]
        key: Vec<u8>,
    },
    /// HGETALL: a map of fields to values in field byte order (RESP2: the
    /// flat array); HKEYS: the fields; HVALS: the values.
    HGetAll {
        /// The hash.
        #[serde(with = "serde_bytes")]
        key: Vec<u8>,
        /// Which part to reply.
        part: HashPart,
    },
    /// HEXISTS: 1 if the hash has the field, else 0.
    HExists {
        /// The hash.
        #[serde(with = "serde_bytes")]
        key: Vec<u8>,
        /// The field.
        #[serde(with = "serde_bytes")]
        field: Vec<u8>,
    },
    /// HSTRLEN: the field's value length, 0 if absent.
    HStrLen {
        /// The hash.
        #[serde(with = "serde_bytes")]
        key: Vec<u8>,
        /// The field.
        #[serde(with = "serde_bytes")]
        field: Vec<u8>,
    },
}

/// What HGETALL, HKEYS and HVALS reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum HashPart {
    /// HGETALL: fields and values.
    All,
    /// HKEYS: fields.
    Fields,
    /// HVALS: values.
    Values,
}

/// One reply, independent of RESP's version (the front end encodes it as
/// RESP2 or RESP3).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum RedisReply {
    /// nil (RESP2 `$-1`, RESP3 `_`).
    Nil,
    /// An integer.
    Integer(i64),
    /// A bulk string.
    Bulk(#[serde(with = "serde_bytes")] Vec<u8>),
    /// A simple string (`OK`, a TYPE's name).
    Status(String),
    /// An array.
    Array(Vec<RedisReply>),
    /// A map (RESP3 `%`; RESP2 flattens it to an array): HGETALL.
    Map(Vec<(RedisReply, RedisReply)>),
    /// A double (RESP3 `,`; RESP2 a bulk string of the text), as Redis
    /// formats it. No command here replies one (INCRBYFLOAT replies a bulk
    /// string, as Redis does); sorted sets will.
    Double(String),
    /// An error, the whole message as Redis writes it after `-` (e.g.
    /// [`ERR_WRONGTYPE`]).
    Error(String),
}

/// What a Redis request did, inside [`crate::command::Outcome::Redis`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum RedisAnswer {
    /// One reply per command, in order.
    Replies(Vec<RedisReply>),
    /// A watched key changed: nothing applied (EXEC answers nil).
    WatchFailed,
}

/// A Redis key's type, as TYPE names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum RedisType {
    /// A string: the user key of the same bytes.
    String,
    /// A hash: a marker and one record per field under the reserved prefix.
    Hash,
}

impl RedisType {
    /// TYPE's reply.
    pub fn name(self) -> &'static str {
        match self {
            RedisType::String => "string",
            RedisType::Hash => "hash",
        }
    }
}

/// Redis's message for a command on a key of the other type.
pub const ERR_WRONGTYPE: &str = "WRONGTYPE Operation against a key holding the wrong kind of value";
/// Redis's message for a value or argument that is not an integer.
pub const ERR_NOT_INTEGER: &str = "ERR value is not an integer or out of range";
/// Redis's message for an increment that would overflow.
pub const ERR_OVERFLOW: &str = "ERR increment or decrement would overflow";
/// Redis 7's message for DECRBY of `i64::MIN` (the front end's check).
pub const ERR_DECREMENT_OVERFLOW: &str = "ERR decrement would overflow";
/// Redis's message for a value or increment that is not a float.
pub const ERR_NOT_FLOAT: &str = "ERR value is not a valid float";
/// Redis's message for a float increment with an infinite or NaN result.
pub const ERR_NAN_OR_INFINITY: &str = "ERR increment would produce NaN or Infinity";
/// Redis's message for HINCRBY on a field that is not an integer.
pub const ERR_HASH_NOT_INTEGER: &str = "ERR hash value is not an integer";
/// Redis's message for HINCRBYFLOAT on a field that is not a float.
pub const ERR_HASH_NOT_FLOAT: &str = "ERR hash value is not a float";
/// Redis's message for RENAME of an absent key.
pub const ERR_NO_SUCH_KEY: &str = "ERR no such key";

/// Bytes a read outside the log ([`read`]) returns at most (values,
/// fields); beyond it the read is refused naming it. Inside a MULTI/EXEC
/// block the transactions' budgets apply instead
/// ([`crate::txn::TXN_READ_BYTES_MAX`] per request,
/// [`crate::txn::ENTRY_TXN_READ_BYTES_MAX`] per entry): every replica
/// holds those answers in memory until the entry is answered.
pub const READ_BYTES_MAX: usize = 32 * 1024 * 1024;
/// Fields an HGETALL / HKEYS / HVALS read outside the log visits at most
/// (inside a block, [`crate::txn::TXN_READ_KEYS_MAX`]); a larger hash is
/// read with HSCAN ([`hash_fields_page`]).
pub const READ_KEYS_MAX: usize = 1_000_000;
/// Records the housekeeping of one entry writes at most: deleting the
/// markers of hashes whose TTL ran out and the fields of deleted hashes
/// (module doc, "Deleting a hash"), only in the room the entry's requests
/// left.
pub const CLEANUP_RECORDS_PER_ENTRY_MAX: usize = 4_096;
/// The format byte leading a hash marker's value.
pub const HASH_MARKER_FORMAT: u8 = 1;
/// Bytes of a hash marker's value: format, id, field count.
pub const HASH_MARKER_BYTES: usize = 1 + 8 + 8;
/// Tag after [`RESERVED_KEY_PREFIX`] of a hash marker: `hm/` + the key.
pub const HASH_MARKER_TAG: &[u8] = b"hm/";
/// Tag of a field record: `hf/` + the hash id (8 bytes) + the field.
pub const HASH_FIELD_TAG: &[u8] = b"hf/";
/// Tag of a hash's expiry record: `hx/` + expiry (8 bytes) + the key.
pub const HASH_EXPIRY_TAG: &[u8] = b"hx/";
/// Tag of a dead hash's record: `hd/` + the hash id (8 bytes).
pub const HASH_DEAD_TAG: &[u8] = b"hd/";
/// Bytes of a hash's key at most: its expiry record's key (the longest,
/// prefix + tag + 8 bytes + key) must fit the engine's key limit.
pub const HASH_KEY_BYTES_MAX: usize =
    bitcask::KEY_SIZE_BYTES_MAX - RESERVED_KEY_PREFIX.len() - HASH_EXPIRY_TAG.len() - 8;
/// Bytes of a hash field at most: its record's key (prefix + tag + id +
/// field) must fit the engine's key limit.
pub const HASH_FIELD_BYTES_MAX: usize =
    bitcask::KEY_SIZE_BYTES_MAX - RESERVED_KEY_PREFIX.len() - HASH_FIELD_TAG.len() - 8;
const _: () = assert!(KEY_BYTES_MAX <= bitcask::KEY_SIZE_BYTES_MAX);
const _: () = assert!(STRING_BYTES_MAX <= bitcask::VALUE_SIZE_BYTES_MAX);

/// The engine key of `key`'s hash marker.
pub fn marker_key(key: &[u8]) -> Vec<u8> {
    [RESERVED_KEY_PREFIX, HASH_MARKER_TAG, key].concat()
}

/// The first bytes of every field record of hash `id`.
pub fn field_prefix(id: u64) -> Vec<u8> {
    [RESERVED_KEY_PREFIX, HASH_FIELD_TAG, &id.to_be_bytes()].concat()
}

/// The engine key of `field` of hash `id`.
pub fn field_key(id: u64, field: &[u8]) -> Vec<u8> {
    [
        RESERVED_KEY_PREFIX,
        HASH_FIELD_TAG,
        &id.to_be_bytes(),
        field,
    ]
    .concat()
}

/// The engine key of the expiry record of hash `key` expiring at `expiry_ms`.
pub fn expiry_key(expiry_ms: u64, key: &[u8]) -> Vec<u8> {
    [
        RESERVED_KEY_PREFIX,
        HASH_EXPIRY_TAG,
        &expiry_ms.to_be_bytes(),
        key,
    ]
    .concat()
}

/// The engine key of dead hash `id`'s record.
pub fn dead_key(id: u64) -> Vec<u8> {
    [RESERVED_KEY_PREFIX, HASH_DEAD_TAG, &id.to_be_bytes()].concat()
}

/// A hash marker's value: which fields are the hash's and how many.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HashHead {
    /// The hash's id: its field records are under [`field_prefix`]`(id)`.
    pub id: u64,
    /// How many fields it has (HLEN); never 0 for a stored marker.
    pub fields: u64,
}

impl HashHead {
    /// The marker's value: [`HASH_MARKER_FORMAT`], id, fields (big-endian).
    pub fn encode(&self) -> Vec<u8> {
        let mut bytes = Vec::with_capacity(HASH_MARKER_BYTES);
        bytes.push(HASH_MARKER_FORMAT);
        bytes.extend_from_slice(&self.id.to_be_bytes());
        bytes.extend_from_slice(&self.fields.to_be_bytes());
        bytes
    }

    /// Reads a marker's value; `None` if it is not one.
    pub fn decode(bytes: &[u8]) -> Option<HashHead> {
        match bytes {
            [HASH_MARKER_FORMAT, rest @ ..] if rest.len() == 16 => Some(HashHead {
                id: u64::from_be_bytes(rest[..8].try_into().ok()?),
                fields: u64::from_be_bytes(rest[8..].try_into().ok()?),
            }),
            _ => None,
        }
    }
}

/// Redis's `string2ll`: a decimal i64 with no `+`, no leading zero (but
/// "0"), no space, at most 20 bytes. What INCR and HINCRBY read a value
/// as, and what the front end parses an integer argument with.
pub fn parse_i64(bytes: &[u8]) -> Option<i64> {
    // LONG_STR_SIZE (21) bytes or more are refused before any digit.
    if bytes.is_empty() || bytes.len() >= 21 {
        return None;
    }
    if bytes == b"0" {
        return Some(0);
    }
    let (negative, digits) = match bytes {
        [b'-', rest @ ..] => (true, rest),
        _ => (false, bytes),
    };
    match digits.first() {
        Some(b'1'..=b'9') => {}
        _ => return None,
    }
    let mut magnitude: u64 = 0;
    for &digit in digits {
        if !digit.is_ascii_digit() {
            return None;
        }
        magnitude = magnitude
            .checked_mul(10)?
            .checked_add(u64::from(digit - b'0'))?;
    }
    if negative {
        // −(2^63) is the one magnitude past i64::MAX that fits.
        0i64.checked_sub_unsigned(magnitude)
    } else {
        i64::try_from(magnitude).ok()
    }
}

/// Bytes of a string value (and of a hash field's value) at most: the
/// cluster's `VALUE_SIZE_BYTES_MAX` (kvproto's; this crate does not link
/// the protocol), in place of Redis's 512 MB `proto-max-bulk-len`.
pub const STRING_BYTES_MAX: usize = 1024 * 1024;
/// Bytes of a key at most: the cluster's `KEY_SIZE_BYTES_MAX`.
pub const KEY_BYTES_MAX: usize = 4 * 1024;
/// Keys FLUSHDB / FLUSHALL deletes at most in its one atomic step (user
/// keys and hashes); beyond it the command is refused whole.
pub const FLUSH_KEYS_MAX: usize = 10_000;

/// Why a Redis read outside the log failed.
#[derive(Debug, thiserror::Error)]
pub enum RedisError {
    /// The engine failed (I/O, poisoned, corruption).
    #[error("engine: {0}")]
    Engine(#[from] bitcask::Error),
    /// A record's revision metadata, or a hash marker, does not decode.
    #[error(transparent)]
    Revision(#[from] RevisionError),
    /// The read would pass a limit (named in the message, which has no
    /// `ERR ` in front: the front end adds Redis's prefix).
    #[error("{0}")]
    Limit(String),
    /// [`read`] was given a command that writes.
    #[error("{0} is not a read; it goes through the log")]
    NotARead(&'static str),
    /// A key changed between two reads of one command: an entry applied
    /// meanwhile (read under kvnode's `read_exact` to keep them out).
    #[error("a key changed while it was read; read again")]
    Changed,
}

impl RedisCommand {
    /// Redis's name of the command (upper case), for messages.
    pub fn name(&self) -> &'static str {
        match self {
            RedisCommand::Get { .. } => "GET",
            RedisCommand::Set { .. } => "SET",
            RedisCommand::SetNx { .. } => "SETNX",
            RedisCommand::GetDel { .. } => "GETDEL",
            RedisCommand::GetEx { .. } => "GETEX",
            RedisCommand::MGet { .. } => "MGET",
            RedisCommand::MSet { .. } => "MSET",
            RedisCommand::MSetNx { .. } => "MSETNX",
            RedisCommand::IncrBy { .. } => "INCRBY",
            RedisCommand::IncrByFloat { .. } => "INCRBYFLOAT",
            RedisCommand::Append { .. } => "APPEND",
            RedisCommand::SetRange { .. } => "SETRANGE",
            RedisCommand::StrLen { .. } => "STRLEN",
            RedisCommand::GetRange { .. } => "GETRANGE",
            RedisCommand::Del { .. } => "DEL",
            RedisCommand::Exists { .. } => "EXISTS",
            RedisCommand::Expire { .. } => "EXPIRE",
            RedisCommand::Persist { .. } => "PERSIST",
            RedisCommand::Ttl { .. } => "TTL",
            RedisCommand::Type { .. } => "TYPE",
            RedisCommand::Rename { .. } => "RENAME",
            RedisCommand::FlushAll => "FLUSHALL",
            RedisCommand::HSet { .. } => "HSET",
            RedisCommand::HSetNx { .. } => "HSETNX",
            RedisCommand::HDel { .. } => "HDEL",
            RedisCommand::HIncrBy { .. } => "HINCRBY",
            RedisCommand::HIncrByFloat { .. } => "HINCRBYFLOAT",
            RedisCommand::HGet { .. } => "HGET",
            RedisCommand::HMGet { .. } => "HMGET",
            RedisCommand::HLen { .. } => "HLEN",
            RedisCommand::HGetAll { .. } => "HGETALL",
            RedisCommand::HExists { .. } => "HEXISTS",
            RedisCommand::HStrLen { .. } => "HSTRLEN",
        }
    }

    /// Whether the command only reads (the front end may run it with
    /// [`read`] outside a MULTI/EXEC block). GETEX without an option
    /// reads too.
    pub fn is_read(&self) -> bool {
        match self {
            RedisCommand::Get { .. }
            | RedisCommand::MGet { .. }
            | RedisCommand::StrLen { .. }
            | RedisCommand::GetRange { .. }
            | RedisCommand::Exists { .. }
            | RedisCommand::Ttl { .. }
            | RedisCommand::Type { .. }
            | RedisCommand::HGet { .. }
            | RedisCommand::HMGet { .. }
            | RedisCommand::HLen { .. }
            | RedisCommand::HGetAll { .. }
            | RedisCommand::HExists { .. }
            | RedisCommand::HStrLen { .. }
            | RedisCommand::GetEx {
                expiry: GetExExpiry::Unchanged,
                ..
            } => true,
            RedisCommand::Set { .. }
            | RedisCommand::SetNx { .. }
            | RedisCommand::GetDel { .. }
            | RedisCommand::GetEx { .. }
            | RedisCommand::MSet { .. }
            | RedisCommand::MSetNx { .. }
            | RedisCommand::IncrBy { .. }
            | RedisCommand::IncrByFloat { .. }
            | RedisCommand::Append { .. }
            | RedisCommand::SetRange { .. }
            | RedisCommand::Del { .. }
            | RedisCommand::Expire { .. }
            | RedisCommand::Persist { .. }
            | RedisCommand::Rename { .. }
            | RedisCommand::FlushAll
            | RedisCommand::HSet { .. }
            | RedisCommand::HSetNx { .. }
            | RedisCommand::HDel { .. }
            | RedisCommand::HIncrBy { .. }
            | RedisCommand::HIncrByFloat { .. } => false,
        }
    }

    /// Engine records the command may write at most (what the batcher
    /// counts, [`crate::command::Write::ops`]): removing a key of any
    /// type takes up to [`KEY_REMOVAL_RECORDS_MAX`] records (a string's
    /// tombstone; a hash's marker tombstone, its expiry record's and the
    /// dead-hash record), since a hash's fields are deleted later, a
    /// bounded number per entry (module doc, "Deleting a hash").
    pub fn records(&self) -> usize {
        const KEY: usize = KEY_REMOVAL_RECORDS_MAX;
        match self {
            RedisCommand::Set { .. } => 1 + KEY,
            RedisCommand::SetNx { .. } => 1,
            RedisCommand::GetDel { .. } => KEY,
            RedisCommand::GetEx { .. } => KEY,
            RedisCommand::MSet { pairs } => pairs.len() * (1 + KEY),
            RedisCommand::MSetNx { pairs } => pairs.len(),
            RedisCommand::IncrBy { .. }
            | RedisCommand::IncrByFloat { .. }
            | RedisCommand::Append { .. }
            | RedisCommand::SetRange { .. } => 1,
            RedisCommand::Del { keys } => keys.len() * KEY,
            RedisCommand::Expire { .. } => KEY,
            RedisCommand::Persist { .. } => 2,
            // The destination removed, the source removed, and the
            // string and the hash marker (with its expiry record) written.
            RedisCommand::Rename { .. } => 2 * KEY + 3,
            RedisCommand::FlushAll => FLUSH_KEYS_MAX * KEY,
            // The fields and the marker.
            RedisCommand::HSet { pairs, .. } => pairs.len() + 1,
            RedisCommand::HSetNx { .. }
            | RedisCommand::HIncrBy { .. }
            | RedisCommand::HIncrByFloat { .. } => 2,
            // The fields, the marker, its expiry record.
            RedisCommand::HDel { fields, .. } => fields.len() + 2,
            RedisCommand::Get { .. }
            | RedisCommand::MGet { .. }
            | RedisCommand::StrLen { .. }
            | RedisCommand::GetRange { .. }
            | RedisCommand::Exists { .. }
            | RedisCommand::Ttl { .. }
            | RedisCommand::Type { .. }
            | RedisCommand::HGet { .. }
            | RedisCommand::HMGet { .. }
            | RedisCommand::HLen { .. }
            | RedisCommand::HGetAll { .. }
            | RedisCommand::HExists { .. }
            | RedisCommand::HStrLen { .. } => 0,
        }
    }
}

impl RedisRequest {
    /// Engine records the request may write at most (the sum of its
    /// commands', [`RedisCommand::records`]).
    pub fn records(&self) -> usize {
        self.commands
            .iter()
            .map(RedisCommand::records)
            .fold(0, usize::saturating_add)
    }
}

/// Records removing one key of any type writes at most: a string's
/// tombstone, and a hash's marker tombstone, expiry-record tombstone and
/// dead-hash record (a key may be both after native writes: module doc).
pub const KEY_REMOVAL_RECORDS_MAX: usize = 4;

/// Runs a read command ([`RedisCommand::is_read`]) against `engine` at
/// cluster time `now_ms`, outside the log, as apply would answer it inside
/// a MULTI/EXEC block: a Redis error (WRONGTYPE, ...) is a reply. A read
/// of several records (MGET, HGETALL, ...) is one state only if no entry
/// applies meanwhile: kvnode runs it under the change history's read lock
/// (`read_exact`), as it runs a Range. At most [`READ_BYTES_MAX`] bytes
/// and [`READ_KEYS_MAX`] fields.
pub fn read(
    engine: &Engine,
    now_ms: u64,
    command: &RedisCommand,
) -> Result<RedisReply, RedisError> {
    if !command.is_read() {
        return Err(RedisError::NotARead(command.name()));
    }
    let mut store = EngineStore::new(engine, now_ms);
    Ok(execute(&mut store, command)?)
}

/// What WATCH records for `key`: the `mod_revision` of the string if the
/// key is one, else of the hash's marker, else 0 (absent). EXEC compares
/// it with the same reading at its own point of the log.
pub fn watch_revision(engine: &Engine, key: &[u8], now_ms: u64) -> Result<u64, RedisError> {
    let mut store = EngineStore::new(engine, now_ms);
    Ok(watched_revision(&mut store, key)?)
}

/// TYPE / EXISTS: the key's type, `None` if absent.
pub fn key_type(engine: &Engine, key: &[u8], now_ms: u64) -> Result<Option<RedisType>, RedisError> {
    let mut store = EngineStore::new(engine, now_ms);
    Ok(exec::type_of(&mut store, key)?)
}

/// KEYS / SCAN / RANDOMKEY: up to `limit` keys of every type in byte
/// order, strictly after `after` (from the first if `None`), each with its
/// type. A key that is both a string and a hash (module doc) is listed
/// once, as a string. Keys only: no value is read.
pub fn keys_page(
    engine: &Engine,
    now_ms: u64,
    after: Option<&[u8]>,
    limit: usize,
) -> Result<Vec<(Vec<u8>, RedisType)>, RedisError> {
    let mut store = EngineStore::new(engine, now_ms);
    let markers = [RESERVED_KEY_PREFIX, HASH_MARKER_TAG].concat();
    let mut strings = store.keys(b"", Some(RESERVED_KEY_PREFIX), after, limit)?;
    if strings.len() < limit
        && let Some(reserved_end) = prefix_end(RESERVED_KEY_PREFIX)
    {
        let left = limit - strings.len();
        strings.extend(store.keys(&reserved_end, None, after, left)?);
    }
    let after_marker = after.map(marker_key);
    let hashes: Vec<Vec<u8>> = store
        .keys(
            &markers,
            prefix_end(&markers).as_deref(),
            after_marker.as_deref(),
            limit,
        )?
        .into_iter()
        .map(|marker| marker[markers.len()..].to_vec())
        .collect();
    let mut merged: std::collections::BTreeMap<Vec<u8>, RedisType> = hashes
        .into_iter()
        .map(|key| (key, RedisType::Hash))
        .collect();
    for key in strings {
        merged.insert(key, RedisType::String);
    }
    Ok(merged.into_iter().take(limit).collect())
}

/// Whether an entry's housekeeping has work at cluster time `now_ms`
/// (module doc, "Deleting a hash"): a hash's TTL ran out or a deleted
/// hash's fields are still stored. Two key-directory look-ups; for the
/// leader's tick loop, which proposes a tick while it holds.
pub fn housekeeping_due(engine: &Engine, now_ms: u64) -> Result<bool, RedisError> {
    let mut store = EngineStore::new(engine, now_ms);
    let deads = [RESERVED_KEY_PREFIX, HASH_DEAD_TAG].concat();
    if !store
        .keys(&deads, prefix_end(&deads).as_deref(), None, 1)?
        .is_empty()
    {
        return Ok(true);
    }
    let expiries = [RESERVED_KEY_PREFIX, HASH_EXPIRY_TAG].concat();
    let first = store.keys(&expiries, prefix_end(&expiries).as_deref(), None, 1)?;
    Ok(first.first().is_some_and(|key| {
        key.get(expiries.len()..expiries.len() + 8)
            .and_then(|bytes| <[u8; 8]>::try_from(bytes).ok())
            .is_some_and(|expiry| u64::from_be_bytes(expiry) <= now_ms)
    }))
}

/// DBSIZE: keys of every type (keys only, page by page: no value is read,
/// but every key is visited).
pub fn key_count(engine: &Engine, now_ms: u64) -> Result<u64, RedisError> {
    const PAGE_KEYS: usize = 4096;
    let mut count = 0u64;
    let mut after: Option<Vec<u8>> = None;
    loop {
        let page = keys_page(engine, now_ms, after.as_deref(), PAGE_KEYS)?;
        count += page.len() as u64;
        match page.last() {
            Some((last, _)) if page.len() == PAGE_KEYS => after = Some(last.clone()),
            _ => return Ok(count),
        }
    }
}

/// Fields of a hash with their values, in field order.
pub type FieldValues = Vec<(Vec<u8>, Vec<u8>)>;

/// HSCAN / HGETALL in pages: up to `limit` fields of the hash `key` in
/// byte order, strictly after `after`, with their values. Empty if the
/// key holds no hash (WRONGTYPE is the caller's: [`key_type`]).
pub fn hash_fields_page(
    engine: &Engine,
    key: &[u8],
    now_ms: u64,
    after: Option<&[u8]>,
    limit: usize,
) -> Result<FieldValues, RedisError> {
    let mut store = EngineStore::new(engine, now_ms);
    let Some(head) = exec::hash_head(&mut store, key)? else {
        return Ok(Vec::new());
    };
    let fields = exec::hash_fields(&mut store, head, after, limit, true)?;
    Ok(fields
        .into_iter()
        .map(|pair| (pair.key, pair.value))
        .collect())
}

impl From<Fault> for RedisError {
    fn from(fault: Fault) -> RedisError {
        match fault {
            Fault::Engine(error) => RedisError::Engine(error),
            Fault::Revision(error) => RedisError::Revision(error),
            Fault::Limit(message) => RedisError::Limit(message),
            Fault::ReadOnly => RedisError::NotARead("a write"),
            Fault::Changed => RedisError::Changed,
        }
    }
}

/// The engine alone as a [`Store`] that only reads: reads outside the log.
struct EngineStore<'e> {
    engine: &'e Engine,
    now_ms: u64,
    keys_left: usize,
    bytes_left: usize,
}

impl<'e> EngineStore<'e> {
    fn new(engine: &'e Engine, now_ms: u64) -> EngineStore<'e> {
        EngineStore {
            engine,
            now_ms,
            keys_left: READ_KEYS_MAX,
            bytes_left: READ_BYTES_MAX,
        }
    }
}

impl Store for EngineStore<'_> {
    fn now_ms(&self) -> u64 {
        self.now_ms
    }

    fn find(&mut self, key: &[u8]) -> Result<Option<Found>, Fault> {
        match self.engine.meta(key, self.now_ms) {
            Some(item) => Ok(Some(Found {
                expiry_ms: item.expiry_ms,
                meta: KeyMeta::decode(&item.meta)?,
            })),
            None => Ok(None),
        }
    }

    fn value(&mut self, key: &[u8]) -> Result<Vec<u8>, Fault> {
        match self.engine.get(key, self.now_ms)? {
            Some(item) => Ok(item.value),
            None => Err(Fault::Changed),
        }
    }

    fn keys(
        &mut self,
        start: &[u8],
        end: Option<&[u8]>,
        after: Option<&[u8]>,
        limit: usize,
    ) -> Result<Vec<Vec<u8>>, Fault> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let scan = bitcask::Scan {
            range: bitcask::KeyRange::Range(
                Bound::Included(start.to_vec()),
                end.map_or(Bound::Unbounded, |end| Bound::Excluded(end.to_vec())),
            ),
            after: after.map(<[u8]>::to_vec),
            limit,
            keys_only: true,
        };
        Ok(self
            .engine
            .scan(&scan, self.now_ms)?
            .into_iter()
            .map(|entry| entry.key)
            .collect())
    }

    fn put(&mut self, _key: Vec<u8>, _value: Vec<u8>, _expiry_ms: u64) -> Result<(), Fault> {
        Err(Fault::ReadOnly)
    }

    fn delete(&mut self, _key: Vec<u8>) -> Result<(), Fault> {
        Err(Fault::ReadOnly)
    }

    fn new_hash_id(&mut self) -> Result<u64, Fault> {
        Err(Fault::ReadOnly)
    }

    fn keys_left(&self) -> usize {
        self.keys_left
    }

    fn charge(&mut self, keys: usize, bytes: usize) -> Result<(), Fault> {
        if keys > self.keys_left {
            return Err(Fault::Limit(format!(
                "the read visits more than READ_KEYS_MAX ({READ_KEYS_MAX}) fields; read \
                 the hash with HSCAN"
            )));
        }
        if bytes > self.bytes_left {
            return Err(Fault::Limit(format!(
                "the read returns more than READ_BYTES_MAX ({READ_BYTES_MAX}) bytes"
            )));
        }
        self.keys_left -= keys;
        self.bytes_left -= bytes;
        Ok(())
    }
}
