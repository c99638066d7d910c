//! Redis commands in the replicated state: what a Redis request carries
//! ([`RedisRequest`], a [`crate::command::Command::Redis`] entry), the
//! replies, and how Redis's types are laid out in the engine. The RESP
//! front end only translates: every write — and every command of a
//! MULTI/EXEC block — is applied here, atomically, the same on every
//! replica (never read-modify-write in the front end).

use bitcask::Engine;
use serde::{Deserialize, Serialize};

use crate::command::SessionRef;
use crate::revision::RevisionError;

/// One Redis client request: a single command, or the commands of a
/// MULTI/EXEC block, applied as one atomic unit at one store revision
/// (none if nothing changed). As in Redis, a command that fails at run
/// time (WRONGTYPE, not an integer, ...) answers its error and writes
/// nothing, and the block's other commands still apply; syntax errors are
/// the front end's (Redis's EXECABORT happens before EXEC). A request is
/// refused whole ([`crate::command::Outcome::Rejected`], nothing applied)
/// only when it does not fit the entry's limits, the reason naming the
/// limit.
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
    /// SET key value [NX|XX] [GET] [EX|PX|EXAT|PXAT|KEEPTTL] (Redis 7.0),
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
    /// The read would pass a limit (named in the message).
    #[error("{0}")]
    Limit(String),
    /// [`read`] was given a command that writes.
    #[error("{0} is not a read; it goes through the log")]
    NotARead(&'static str),
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
/// a MULTI/EXEC block. A read of several records (MGET, HGETALL, ...) is
/// one state only if no entry applies meanwhile: kvnode runs it under the
/// change history's read lock (`read_exact`), as it runs a Range.
pub fn read(
    engine: &Engine,
    now_ms: u64,
    command: &RedisCommand,
) -> Result<RedisReply, RedisError> {
    let _ = (engine, now_ms);
    Err(RedisError::NotARead(command.name()))
}

/// What WATCH records for `key`: the `mod_revision` of the string if the
/// key is one, else of the hash's marker, else 0 (absent). EXEC compares
/// it with the same reading at its own point of the log.
pub fn watch_revision(engine: &Engine, key: &[u8], now_ms: u64) -> Result<u64, RedisError> {
    let _ = (engine, key, now_ms);
    Ok(0)
}

/// TYPE / EXISTS: the key's type, `None` if absent.
pub fn key_type(engine: &Engine, key: &[u8], now_ms: u64) -> Result<Option<RedisType>, RedisError> {
    let _ = (engine, key, now_ms);
    Ok(None)
}

/// KEYS / SCAN / RANDOMKEY: up to `limit` keys of every type in byte
/// order, strictly after `after` (from the first if `None`), each with its
/// type. A key that is both a string and a hash (module doc) is listed
/// once, as a string.
pub fn keys_page(
    engine: &Engine,
    now_ms: u64,
    after: Option<&[u8]>,
    limit: usize,
) -> Result<Vec<(Vec<u8>, RedisType)>, RedisError> {
    let _ = (engine, now_ms, after, limit);
    Ok(Vec::new())
}

/// DBSIZE: keys of every type (one keys-only pass over the key directory:
/// no value is read, but it visits every key).
pub fn key_count(engine: &Engine, now_ms: u64) -> Result<u64, RedisError> {
    let _ = (engine, now_ms);
    Ok(0)
}

/// HSCAN / HGETALL in pages: up to `limit` fields of the hash `key` in
/// byte order, strictly after `after`, with their values. Empty if the
/// hash is absent; WRONGTYPE is the caller's ([`key_type`]).
pub fn hash_fields_page(
    engine: &Engine,
    key: &[u8],
    now_ms: u64,
    after: Option<&[u8]>,
    limit: usize,
) -> Result<Vec<(Vec<u8>, Vec<u8>)>, RedisError> {
    let _ = (engine, key, now_ms, after, limit);
    Ok(Vec::new())
}
