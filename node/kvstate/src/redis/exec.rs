//! What each Redis command does, over a [`Store`]: the entry being
//! applied (writes staged for the request, `apply/redis_entry.rs`) or the
//! engine alone (reads outside the log, [`super::read`]). One
//! implementation of each command's semantics for both.

use crate::command::RESERVED_KEY_PREFIX;
use crate::revision::{KeyMeta, RevisionError};

use super::long_double::{LongDouble, NotFinite};
use super::{
    ERR_HASH_NOT_FLOAT, ERR_HASH_NOT_INTEGER, ERR_NAN_OR_INFINITY, ERR_NO_SUCH_KEY, ERR_NOT_FLOAT,
    ERR_NOT_INTEGER, ERR_OVERFLOW, ERR_WRONGTYPE, ExpireCondition, FLUSH_KEYS_MAX, GetExExpiry,
    HASH_FIELD_BYTES_MAX, HASH_KEY_BYTES_MAX, HASH_MARKER_TAG, HashHead, HashPart, KEY_BYTES_MAX,
    Pair, RedisCommand, RedisReply, STRING_BYTES_MAX, SetCondition, SetExpiry, dead_key,
    expiry_key, field_key, field_prefix, marker_key, parse_i64,
};

/// A key the store holds (its TTL judged at the store's time).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Found {
    /// Expiry in ms of cluster time; 0 = none.
    pub expiry_ms: u64,
    /// Its revisions.
    pub meta: KeyMeta,
}

/// Why a command could not be run (as opposed to a Redis error reply).
#[derive(Debug)]
pub(crate) enum Fault {
    /// The engine failed, or holds something that does not decode.
    Engine(bitcask::Error),
    /// A record's revision metadata does not decode.
    Revision(RevisionError),
    /// A limit of the request or the read (named in the message): the
    /// whole request is refused.
    Limit(String),
    /// A write asked of a store that only reads.
    ReadOnly,
    /// A key changed between two reads of one command (only outside the
    /// log, when no lock keeps entries from applying meanwhile).
    Changed,
}

impl From<bitcask::Error> for Fault {
    fn from(error: bitcask::Error) -> Fault {
        Fault::Engine(error)
    }
}

impl From<RevisionError> for Fault {
    fn from(error: RevisionError) -> Fault {
        Fault::Revision(error)
    }
}

/// What commands read and write through.
pub(crate) trait Store {
    /// The cluster time TTLs are judged at.
    fn now_ms(&self) -> u64;
    /// The key, if present (a TTL that ran out by now: absent).
    fn find(&mut self, key: &[u8]) -> Result<Option<Found>, Fault>;
    /// The value of a key [`Store::find`] found.
    fn value(&mut self, key: &[u8]) -> Result<Vec<u8>, Fault>;
    /// Present keys at or after `start`, before `end` (`None`: no end),
    /// strictly after `after`, in order, at most `limit`.
    fn keys(
        &mut self,
        start: &[u8],
        end: Option<&[u8]>,
        after: Option<&[u8]>,
        limit: usize,
    ) -> Result<Vec<Vec<u8>>, Fault>;
    /// Writes `key` (its revisions follow from whether it is present).
    fn put(&mut self, key: Vec<u8>, value: Vec<u8>, expiry_ms: u64) -> Result<(), Fault>;
    /// Deletes a present `key`.
    fn delete(&mut self, key: Vec<u8>) -> Result<(), Fault>;
    /// An id no hash ever had.
    fn new_hash_id(&mut self) -> Result<u64, Fault>;
    /// Keys a read may still visit.
    fn keys_left(&self) -> usize;
    /// Counts `keys` visited and `bytes` read against the budget.
    fn charge(&mut self, keys: usize, bytes: usize) -> Result<(), Fault>;
}

/// A key's Redis type and what the store holds of it. A key that is both
/// a string and a hash (a native put beside a Redis hash) is the string.
enum Kind {
    Absent,
    String(Found),
    Hash(HashHead, Found),
}

/// The reply of a command refused for its input.
type Refused = RedisReply;

fn error(message: impl Into<String>) -> RedisReply {
    RedisReply::Error(message.into())
}

fn ok() -> RedisReply {
    RedisReply::Status("OK".to_string())
}

fn integer(value: usize) -> RedisReply {
    RedisReply::Integer(i64::try_from(value).unwrap_or(i64::MAX))
}

/// A key a command may read: not under the reserved prefix (an empty or
/// over-long key is merely absent).
fn check_read_key(key: &[u8]) -> Result<(), Refused> {
    if key.starts_with(RESERVED_KEY_PREFIX) {
        return Err(error(
            "ERR keys starting with the reserved prefix \\xff\\xffraftcask/ are refused",
        ));
    }
    Ok(())
}

/// A key a command may write: not empty, not reserved, within
/// [`KEY_BYTES_MAX`].
fn check_key(key: &[u8]) -> Result<(), Refused> {
    check_read_key(key)?;
    if key.is_empty() {
        return Err(error(
            "ERR empty keys are refused: the store holds no empty key",
        ));
    }
    if key.len() > KEY_BYTES_MAX {
        return Err(error(format!(
            "ERR the key is {} bytes; the limit KEY_SIZE_BYTES_MAX is {KEY_BYTES_MAX} bytes",
            key.len()
        )));
    }
    Ok(())
}

/// A key a hash may be written under: [`check_key`], and within
/// [`HASH_KEY_BYTES_MAX`].
fn check_hash_key(key: &[u8]) -> Result<(), Refused> {
    check_key(key)?;
    if key.len() > HASH_KEY_BYTES_MAX {
        return Err(error(format!(
            "ERR a hash's key is {} bytes; the limit HASH_KEY_BYTES_MAX is {HASH_KEY_BYTES_MAX} bytes",
            key.len()
        )));
    }
    Ok(())
}

fn check_field(field: &[u8]) -> Result<(), Refused> {
    if field.len() > HASH_FIELD_BYTES_MAX {
        return Err(error(format!(
            "ERR the hash field is {} bytes; the limit HASH_FIELD_BYTES_MAX is \
             {HASH_FIELD_BYTES_MAX} bytes",
            field.len()
        )));
    }
    Ok(())
}

fn check_value(value: &[u8]) -> Result<(), Refused> {
    if value.len() > STRING_BYTES_MAX {
        return Err(too_long(value.len() as u64));
    }
    Ok(())
}

/// Redis's "string exceeds maximum allowed size", naming the cluster's limit.
fn too_long(length: u64) -> RedisReply {
    error(format!(
        "ERR string exceeds maximum allowed size: {length} bytes; the limit \
         VALUE_SIZE_BYTES_MAX is {STRING_BYTES_MAX} bytes"
    ))
}

/// The expiry `ms` from now; `None` if that is not after now (the key is
/// written already expired).
fn deadline(now_ms: u64, ms: i64) -> Option<u64> {
    u64::try_from(ms)
        .ok()
        .filter(|ms| *ms > 0)
        .map(|ms| now_ms.saturating_add(ms))
}

/// The first key after every key that starts with `prefix`; `None` if
/// there is none (all 0xFF).
pub(crate) fn prefix_end(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xFF {
            end.push(last + 1);
            return Some(end);
        }
    }
    None
}

/// The hash under `key`, if present.
fn hash<S: Store>(store: &mut S, key: &[u8]) -> Result<Option<(HashHead, Found)>, Fault> {
    if key.len() > HASH_KEY_BYTES_MAX {
        return Ok(None);
    }
    let marker = marker_key(key);
    let Some(found) = store.find(&marker)? else {
        return Ok(None);
    };
    let value = store.value(&marker)?;
    let head = HashHead::decode(&value).ok_or_else(|| malformed_marker(key, &value))?;
    Ok(Some((head, found)))
}

pub(crate) fn malformed_marker(key: &[u8], value: &[u8]) -> Fault {
    Fault::Engine(bitcask::Error::Corruption {
        file: String::new(),
        offset: 0,
        reason: format!(
            "the hash marker of key {} holds {value:02x?}, not a marker",
            crate::range::shown(key)
        ),
    })
}

fn kind<S: Store>(store: &mut S, key: &[u8]) -> Result<Kind, Fault> {
    if let Some(found) = store.find(key)? {
        return Ok(Kind::String(found));
    }
    Ok(match hash(store, key)? {
        Some((head, found)) => Kind::Hash(head, found),
        None => Kind::Absent,
    })
}

/// Deletes the hash under `key`: its marker and expiry record now; its
/// fields by the housekeeping of this and later entries (a dead-hash
/// record names them).
fn remove_hash<S: Store>(
    store: &mut S,
    key: &[u8],
    head: HashHead,
    found: Found,
) -> Result<(), Fault> {
    store.delete(marker_key(key))?;
    if found.expiry_ms != 0 {
        store.delete(expiry_key(found.expiry_ms, key))?;
    }
    if head.fields > 0 {
        store.put(dead_key(head.id), Vec::new(), 0)?;
    }
    Ok(())
}

/// Deletes whatever `key` is (a string, a hash, or both); whether
/// anything was there.
fn remove_key<S: Store>(store: &mut S, key: &[u8]) -> Result<bool, Fault> {
    let mut existed = false;
    if store.find(key)?.is_some() {
        store.delete(key.to_vec())?;
        existed = true;
    }
    if let Some((head, found)) = hash(store, key)? {
        remove_hash(store, key, head, found)?;
        existed = true;
    }
    Ok(existed)
}

/// Writes the string `key` = `value` expiring at `expiry_ms` (0 = never;
/// `None` = already expired: the key ends absent), replacing a hash.
fn replace_with_string<S: Store>(
    store: &mut S,
    key: &[u8],
    value: Vec<u8>,
    expiry_ms: Option<u64>,
) -> Result<(), Fault> {
    if let Some((head, found)) = hash(store, key)? {
        remove_hash(store, key, head, found)?;
    }
    match expiry_ms {
        Some(expiry_ms) => store.put(key.to_vec(), value, expiry_ms),
        None => {
            if store.find(key)?.is_some() {
                store.delete(key.to_vec())?;
            }
            Ok(())
        }
    }
}

/// Writes a hash's marker; keeps its expiry record in step when its
/// expiry moves from `old_expiry_ms` to `expiry_ms` (0 = none).
fn write_head<S: Store>(
    store: &mut S,
    key: &[u8],
    head: HashHead,
    old_expiry_ms: u64,
    expiry_ms: u64,
) -> Result<(), Fault> {
    store.put(marker_key(key), head.encode(), expiry_ms)?;
    if old_expiry_ms != expiry_ms {
        if old_expiry_ms != 0 {
            store.delete(expiry_key(old_expiry_ms, key))?;
        }
        if expiry_ms != 0 {
            store.put(
                expiry_key(expiry_ms, key),
                head.id.to_be_bytes().to_vec(),
                0,
            )?;
        }
    }
    Ok(())
}

/// A string's value and its charge to the read budget.
fn read_value<S: Store>(store: &mut S, key: &[u8]) -> Result<Vec<u8>, Fault> {
    let value = store.value(key)?;
    store.charge(0, value.len())?;
    Ok(value)
}

/// Runs one command: its reply (a Redis error reply included), or a fault.
pub(crate) fn execute<S: Store>(
    store: &mut S,
    command: &RedisCommand,
) -> Result<RedisReply, Fault> {
    match run(store, command) {
        Ok(reply) => Ok(reply),
        Err(Outcome::Refused(reply)) => Ok(reply),
        Err(Outcome::Fault(fault)) => Err(fault),
    }
}

/// Why a command stopped early.
enum Outcome {
    /// Its reply is this error.
    Refused(RedisReply),
    /// The store failed.
    Fault(Fault),
}

impl From<Fault> for Outcome {
    fn from(fault: Fault) -> Outcome {
        Outcome::Fault(fault)
    }
}

impl From<RedisReply> for Outcome {
    fn from(reply: RedisReply) -> Outcome {
        Outcome::Refused(reply)
    }
}

fn wrongtype() -> Outcome {
    Outcome::Refused(error(ERR_WRONGTYPE))
}

fn run<S: Store>(store: &mut S, command: &RedisCommand) -> Result<RedisReply, Outcome> {
    let now_ms = store.now_ms();
    Ok(match command {
        RedisCommand::Get { key } => {
            check_read_key(key)?;
            match kind(store, key)? {
                Kind::Absent => RedisReply::Nil,
                Kind::String(_) => RedisReply::Bulk(read_value(store, key)?),
                Kind::Hash(..) => return Err(wrongtype()),
            }
        }
        RedisCommand::Set {
            key,
            value,
            condition,
            expiry,
            get,
        } => {
            check_key(key)?;
            check_value(value)?;
            let current = kind(store, key)?;
            let old = match (&current, get) {
                (Kind::Hash(..), true) => return Err(wrongtype()),
                (Kind::String(_), true) => RedisReply::Bulk(read_value(store, key)?),
                _ => RedisReply::Nil,
            };
            let exists = !matches!(current, Kind::Absent);
            let holds = match condition {
                SetCondition::Always => true,
                SetCondition::IfAbsent => !exists,
                SetCondition::IfPresent => exists,
            };
            if !holds {
                return Ok(if *get { old } else { RedisReply::Nil });
            }
            let expiry_ms = match expiry {
                SetExpiry::Persist => Some(0),
                SetExpiry::Keep => Some(match current {
                    Kind::String(found) | Kind::Hash(_, found) => found.expiry_ms,
                    Kind::Absent => 0,
                }),
                SetExpiry::In { ms } => deadline(now_ms, *ms),
            };
            replace_with_string(store, key, value.clone(), expiry_ms)?;
            if *get { old } else { ok() }
        }
        RedisCommand::SetNx { key, value } => {
            check_key(key)?;
            check_value(value)?;
            match kind(store, key)? {
                Kind::Absent => {
                    store.put(key.clone(), value.clone(), 0)?;
                    RedisReply::Integer(1)
                }
                _ => RedisReply::Integer(0),
            }
        }
        RedisCommand::GetDel { key } => {
            check_key(key)?;
            match kind(store, key)? {
                Kind::Absent => RedisReply::Nil,
                Kind::Hash(..) => return Err(wrongtype()),
                Kind::String(_) => {
                    let value = read_value(store, key)?;
                    remove_key(store, key)?;
                    RedisReply::Bulk(value)
                }
            }
        }
        RedisCommand::GetEx { key, expiry } => {
            if matches!(expiry, GetExExpiry::Unchanged) {
                check_read_key(key)?;
            } else {
                check_key(key)?;
            }
            match kind(store, key)? {
                Kind::Absent => RedisReply::Nil,
                Kind::Hash(..) => return Err(wrongtype()),
                Kind::String(found) => {
                    let value = read_value(store, key)?;
                    match expiry {
                        GetExExpiry::Unchanged => {}
                        GetExExpiry::Persist => {
                            if found.expiry_ms != 0 {
                                store.put(key.clone(), value.clone(), 0)?;
                            }
                        }
                        GetExExpiry::In { ms } => match deadline(now_ms, *ms) {
                            Some(expiry_ms) => store.put(key.clone(), value.clone(), expiry_ms)?,
                            None => {
                                remove_key(store, key)?;
                            }
                        },
                    }
                    RedisReply::Bulk(value)
                }
            }
        }
        RedisCommand::MGet { keys } => {
            let mut replies = Vec::with_capacity(keys.len());
            for key in keys {
                check_read_key(key)?;
                replies.push(match store.find(key)? {
                    Some(_) => RedisReply::Bulk(read_value(store, key)?),
                    None => RedisReply::Nil,
                });
            }
            RedisReply::Array(replies)
        }
        RedisCommand::MSet { pairs } => {
            check_pairs(pairs)?;
            for pair in pairs {
                replace_with_string(store, &pair.key, pair.value.clone(), Some(0))?;
            }
            ok()
        }
        RedisCommand::MSetNx { pairs } => {
            check_pairs(pairs)?;
            for pair in pairs {
                if !matches!(kind(store, &pair.key)?, Kind::Absent) {
                    return Ok(RedisReply::Integer(0));
                }
            }
            for pair in pairs {
                store.put(pair.key.clone(), pair.value.clone(), 0)?;
            }
            RedisReply::Integer(1)
        }
        RedisCommand::IncrBy { key, increment } => {
            check_key(key)?;
            let (current, expiry_ms) = match kind(store, key)? {
                Kind::Absent => (0, 0),
                Kind::Hash(..) => return Err(wrongtype()),
                Kind::String(found) => {
                    let value = store.value(key)?;
                    (
                        parse_i64(&value).ok_or_else(|| error(ERR_NOT_INTEGER))?,
                        found.expiry_ms,
                    )
                }
            };
            let next = current
                .checked_add(*increment)
                .ok_or_else(|| error(ERR_OVERFLOW))?;
            store.put(key.clone(), next.to_string().into_bytes(), expiry_ms)?;
            RedisReply::Integer(next)
        }
        RedisCommand::IncrByFloat { key, increment } => {
            check_key(key)?;
            let (current, expiry_ms) = match kind(store, key)? {
                Kind::Absent => (Float::Finite(LongDouble::ZERO), 0),
                Kind::Hash(..) => return Err(wrongtype()),
                Kind::String(found) => {
                    let value = store.value(key)?;
                    (parse_float(&value, ERR_NOT_FLOAT)?, found.expiry_ms)
                }
            };
            let increment = parse_float(increment, ERR_NOT_FLOAT)?;
            let text = sum_text(current, increment)?;
            store.put(key.clone(), text.clone().into_bytes(), expiry_ms)?;
            RedisReply::Bulk(text.into_bytes())
        }
        RedisCommand::Append { key, value } => {
            check_key(key)?;
            let (mut current, expiry_ms) = match kind(store, key)? {
                Kind::Absent => (Vec::new(), 0),
                Kind::Hash(..) => return Err(wrongtype()),
                Kind::String(found) => (store.value(key)?, found.expiry_ms),
            };
            let length = current.len() as u64 + value.len() as u64;
            if length > STRING_BYTES_MAX as u64 {
                return Err(too_long(length).into());
            }
            current.extend_from_slice(value);
            store.put(key.clone(), current, expiry_ms)?;
            integer(length as usize)
        }
        RedisCommand::SetRange { key, offset, value } => {
            check_key(key)?;
            let (current, expiry_ms) = match kind(store, key)? {
                Kind::Absent => (None, 0),
                Kind::Hash(..) => return Err(wrongtype()),
                Kind::String(found) => (Some(store.value(key)?), found.expiry_ms),
            };
            if value.is_empty() {
                return Ok(integer(current.map_or(0, |current| current.len())));
            }
            let end = offset.saturating_add(value.len() as u64);
            if end > STRING_BYTES_MAX as u64 {
                return Err(too_long(end).into());
            }
            let (offset, end) = (*offset as usize, end as usize);
            let mut current = current.unwrap_or_default();
            if current.len() < end {
                current.resize(end, 0);
            }
            current[offset..end].copy_from_slice(value);
            let length = current.len();
            store.put(key.clone(), current, expiry_ms)?;
            integer(length)
        }
        RedisCommand::StrLen { key } => {
            check_read_key(key)?;
            match kind(store, key)? {
                Kind::Absent => RedisReply::Integer(0),
                Kind::Hash(..) => return Err(wrongtype()),
                Kind::String(_) => integer(store.value(key)?.len()),
            }
        }
        RedisCommand::GetRange { key, start, end } => {
            check_read_key(key)?;
            let value = match kind(store, key)? {
                Kind::Absent => Vec::new(),
                Kind::Hash(..) => return Err(wrongtype()),
                Kind::String(_) => store.value(key)?,
            };
            let range = get_range(value.len(), *start, *end);
            let bytes = range.map_or_else(Vec::new, |(from, to)| value[from..=to].to_vec());
            store.charge(0, bytes.len())?;
            RedisReply::Bulk(bytes)
        }
        RedisCommand::Del { keys } => {
            for key in keys {
                check_read_key(key)?;
            }
            let mut removed = 0;
            for key in keys {
                if !key.is_empty() && key.len() <= KEY_BYTES_MAX && remove_key(store, key)? {
                    removed += 1;
                }
            }
            integer(removed)
        }
        RedisCommand::Exists { keys } => {
            let mut found = 0;
            for key in keys {
                check_read_key(key)?;
                if !matches!(kind(store, key)?, Kind::Absent) {
                    found += 1;
                }
            }
            integer(found)
        }
        RedisCommand::Expire { key, ms, condition } => {
            check_key(key)?;
            let current = kind(store, key)?;
            let current_expiry_ms = match &current {
                Kind::Absent => return Ok(RedisReply::Integer(0)),
                Kind::String(found) | Kind::Hash(_, found) => found.expiry_ms,
            };
            // The new expiry may be before the clock's start: compare wide.
            let new = i128::from(now_ms) + i128::from(*ms);
            let holds = match condition {
                ExpireCondition::Always => true,
                ExpireCondition::IfNone => current_expiry_ms == 0,
                ExpireCondition::IfSome => current_expiry_ms != 0,
                ExpireCondition::IfGreater => {
                    current_expiry_ms != 0 && new > i128::from(current_expiry_ms)
                }
                ExpireCondition::IfLess => {
                    current_expiry_ms == 0 || new < i128::from(current_expiry_ms)
                }
                ExpireCondition::IfSomeAndLess => {
                    current_expiry_ms != 0 && new < i128::from(current_expiry_ms)
                }
            };
            if !holds {
                return Ok(RedisReply::Integer(0));
            }
            match (deadline(now_ms, *ms), current) {
                (None, _) => {
                    remove_key(store, key)?;
                }
                (Some(expiry_ms), Kind::String(_)) => {
                    let value = store.value(key)?;
                    store.put(key.clone(), value, expiry_ms)?;
                }
                (Some(expiry_ms), Kind::Hash(head, found)) => {
                    write_head(store, key, head, found.expiry_ms, expiry_ms)?;
                }
                (Some(_), Kind::Absent) => return Ok(RedisReply::Integer(0)),
            }
            RedisReply::Integer(1)
        }
        RedisCommand::Persist { key } => {
            check_key(key)?;
            match kind(store, key)? {
                Kind::String(found) if found.expiry_ms != 0 => {
                    let value = store.value(key)?;
                    store.put(key.clone(), value, 0)?;
                    RedisReply::Integer(1)
                }
                Kind::Hash(head, found) if found.expiry_ms != 0 => {
                    write_head(store, key, head, found.expiry_ms, 0)?;
                    RedisReply::Integer(1)
                }
                _ => RedisReply::Integer(0),
            }
        }
        RedisCommand::Ttl { key, milliseconds } => {
            check_read_key(key)?;
            match kind(store, key)? {
                Kind::Absent => RedisReply::Integer(-2),
                Kind::String(found) | Kind::Hash(_, found) if found.expiry_ms == 0 => {
                    RedisReply::Integer(-1)
                }
                Kind::String(found) | Kind::Hash(_, found) => {
                    let left_ms = found.expiry_ms.saturating_sub(now_ms);
                    let left = if *milliseconds {
                        left_ms
                    } else {
                        // Redis rounds TTL to the nearest second.
                        left_ms.saturating_add(500) / 1000
                    };
                    RedisReply::Integer(i64::try_from(left).unwrap_or(i64::MAX))
                }
            }
        }
        RedisCommand::Type { key } => {
            check_read_key(key)?;
            RedisReply::Status(
                match kind(store, key)? {
                    Kind::Absent => "none",
                    Kind::String(_) => "string",
                    Kind::Hash(..) => "hash",
                }
                .to_string(),
            )
        }
        RedisCommand::Rename {
            source,
            destination,
            only_if_absent,
        } => rename(store, source, destination, *only_if_absent)?,
        RedisCommand::FlushAll => flush(store)?,
        RedisCommand::HSet {
            key,
            pairs,
            reply_ok,
        } => {
            check_hash_key(key)?;
            for pair in pairs {
                check_field(&pair.key)?;
                check_value(&pair.value)?;
            }
            let (mut head, expiry_ms) = writable_hash(store, key)?;
            let mut added = 0;
            for pair in pairs {
                let field = field_key(head.id, &pair.key);
                if store.find(&field)?.is_none() {
                    added += 1;
                }
                store.put(field, pair.value.clone(), 0)?;
            }
            head.fields += added;
            if !pairs.is_empty() {
                write_head(store, key, head, expiry_ms, expiry_ms)?;
            }
            if *reply_ok {
                ok()
            } else {
                integer(added as usize)
            }
        }
        RedisCommand::HSetNx { key, field, value } => {
            check_hash_key(key)?;
            check_field(field)?;
            check_value(value)?;
            let (mut head, expiry_ms) = writable_hash(store, key)?;
            let field = field_key(head.id, field);
            if store.find(&field)?.is_some() {
                return Ok(RedisReply::Integer(0));
            }
            store.put(field, value.clone(), 0)?;
            head.fields += 1;
            write_head(store, key, head, expiry_ms, expiry_ms)?;
            RedisReply::Integer(1)
        }
        RedisCommand::HDel { key, fields } => {
            check_key(key)?;
            let (mut head, found) = match kind(store, key)? {
                Kind::Absent => return Ok(RedisReply::Integer(0)),
                Kind::String(_) => return Err(wrongtype()),
                Kind::Hash(head, found) => (head, found),
            };
            let mut deleted = 0;
            for field in fields {
                if field.len() > HASH_FIELD_BYTES_MAX {
                    continue;
                }
                let field = field_key(head.id, field);
                if store.find(&field)?.is_some() {
                    store.delete(field)?;
                    deleted += 1;
                }
            }
            if deleted > 0 {
                head.fields = head.fields.saturating_sub(deleted);
                if head.fields == 0 {
                    // The last field went: so does the hash, as in Redis.
                    remove_hash(store, key, head, found)?;
                } else {
                    write_head(store, key, head, found.expiry_ms, found.expiry_ms)?;
                }
            }
            integer(deleted as usize)
        }
        RedisCommand::HIncrBy {
            key,
            field,
            increment,
        } => {
            check_hash_key(key)?;
            check_field(field)?;
            let (mut head, expiry_ms) = writable_hash(store, key)?;
            let field = field_key(head.id, field);
            let current = match store.find(&field)? {
                Some(_) => {
                    let value = store.value(&field)?;
                    Some(parse_i64(&value).ok_or_else(|| error(ERR_HASH_NOT_INTEGER))?)
                }
                None => None,
            };
            let next = current
                .unwrap_or(0)
                .checked_add(*increment)
                .ok_or_else(|| error(ERR_OVERFLOW))?;
            store.put(field, next.to_string().into_bytes(), 0)?;
            if current.is_none() {
                head.fields += 1;
            }
            write_head(store, key, head, expiry_ms, expiry_ms)?;
            RedisReply::Integer(next)
        }
        RedisCommand::HIncrByFloat {
            key,
            field,
            increment,
        } => {
            // Redis reads the increment before it looks at the key.
            let increment = parse_float(increment, ERR_NOT_FLOAT)?;
            if increment.is_infinite() {
                return Err(error("ERR value is NaN or Infinity").into());
            }
            check_hash_key(key)?;
            check_field(field)?;
            let (mut head, expiry_ms) = writable_hash(store, key)?;
            let field = field_key(head.id, field);
            let current = match store.find(&field)? {
                Some(_) => {
                    let value = store.value(&field)?;
                    Some(parse_float(&value, ERR_HASH_NOT_FLOAT)?)
                }
                None => None,
            };
            let text = sum_text(
                current.unwrap_or(Float::Finite(LongDouble::ZERO)),
                increment,
            )?;
            store.put(field, text.clone().into_bytes(), 0)?;
            if current.is_none() {
                head.fields += 1;
            }
            write_head(store, key, head, expiry_ms, expiry_ms)?;
            RedisReply::Bulk(text.into_bytes())
        }
        RedisCommand::HGet { key, field } => {
            check_read_key(key)?;
            match readable_hash(store, key)? {
                Some(head) => {
                    hash_value(store, head, field)?.map_or(RedisReply::Nil, RedisReply::Bulk)
                }
                None => RedisReply::Nil,
            }
        }
        RedisCommand::HMGet { key, fields } => {
            check_read_key(key)?;
            let head = readable_hash(store, key)?;
            let mut replies = Vec::with_capacity(fields.len());
            for field in fields {
                replies.push(match head {
                    Some(head) => {
                        hash_value(store, head, field)?.map_or(RedisReply::Nil, RedisReply::Bulk)
                    }
                    None => RedisReply::Nil,
                });
            }
            RedisReply::Array(replies)
        }
        RedisCommand::HLen { key } => {
            check_read_key(key)?;
            let fields = readable_hash(store, key)?.map_or(0, |head| head.fields);
            RedisReply::Integer(i64::try_from(fields).unwrap_or(i64::MAX))
        }
        RedisCommand::HGetAll { key, part } => {
            check_read_key(key)?;
            let Some(head) = readable_hash(store, key)? else {
                return Ok(match part {
                    HashPart::All => RedisReply::Map(Vec::new()),
                    HashPart::Fields | HashPart::Values => RedisReply::Array(Vec::new()),
                });
            };
            let fields = hash_fields(store, head, None, usize::MAX, *part != HashPart::Fields)?;
            match part {
                HashPart::All => RedisReply::Map(
                    fields
                        .into_iter()
                        .map(|pair| (RedisReply::Bulk(pair.key), RedisReply::Bulk(pair.value)))
                        .collect(),
                ),
                HashPart::Fields => RedisReply::Array(
                    fields
                        .into_iter()
                        .map(|pair| RedisReply::Bulk(pair.key))
                        .collect(),
                ),
                HashPart::Values => RedisReply::Array(
                    fields
                        .into_iter()
                        .map(|pair| RedisReply::Bulk(pair.value))
                        .collect(),
                ),
            }
        }
        RedisCommand::HExists { key, field } => {
            check_read_key(key)?;
            let exists = match readable_hash(store, key)? {
                Some(head) if field.len() <= HASH_FIELD_BYTES_MAX => {
                    store.find(&field_key(head.id, field))?.is_some()
                }
                _ => false,
            };
            RedisReply::Integer(i64::from(exists))
        }
        RedisCommand::HStrLen { key, field } => {
            check_read_key(key)?;
            let length = match readable_hash(store, key)? {
                Some(head) if field.len() <= HASH_FIELD_BYTES_MAX => {
                    let field = field_key(head.id, field);
                    match store.find(&field)? {
                        Some(_) => store.value(&field)?.len(),
                        None => 0,
                    }
                }
                _ => 0,
            };
            integer(length)
        }
    })
}

fn check_pairs(pairs: &[Pair]) -> Result<(), Refused> {
    for pair in pairs {
        check_key(&pair.key)?;
        check_value(&pair.value)?;
    }
    Ok(())
}

/// A parsed float, or `inf` (which Redis accepts as an increment and
/// refuses as a result).
#[derive(Clone, Copy)]
enum Float {
    Finite(LongDouble),
    Infinite,
}

impl Float {
    fn is_infinite(self) -> bool {
        matches!(self, Float::Infinite)
    }
}

fn parse_float(bytes: &[u8], message: &str) -> Result<Float, Outcome> {
    match LongDouble::parse(bytes) {
        Some(Ok(value)) => Ok(Float::Finite(value)),
        Some(Err(NotFinite::Infinite)) => Ok(Float::Infinite),
        Some(Err(NotFinite::NaN)) | None => Err(error(message).into()),
    }
}

/// The sum as Redis stores it, or Redis's NaN-or-infinity error.
fn sum_text(current: Float, increment: Float) -> Result<String, Outcome> {
    match (current, increment) {
        (Float::Finite(current), Float::Finite(increment)) => match current.plus(increment) {
            Ok(sum) => Ok(sum.format()),
            Err(_) => Err(error(ERR_NAN_OR_INFINITY).into()),
        },
        _ => Err(error(ERR_NAN_OR_INFINITY).into()),
    }
}

/// The hash a hash write works on: the one under `key` (and its expiry),
/// or a new empty one; WRONGTYPE on a string.
fn writable_hash<S: Store>(store: &mut S, key: &[u8]) -> Result<(HashHead, u64), Outcome> {
    match kind(store, key)? {
        Kind::String(_) => Err(wrongtype()),
        Kind::Hash(head, found) => Ok((head, found.expiry_ms)),
        Kind::Absent => Ok((
            HashHead {
                id: store.new_hash_id()?,
                fields: 0,
            },
            0,
        )),
    }
}

/// The hash a hash read reads: `None` if absent; WRONGTYPE on a string.
fn readable_hash<S: Store>(store: &mut S, key: &[u8]) -> Result<Option<HashHead>, Outcome> {
    match kind(store, key)? {
        Kind::String(_) => Err(wrongtype()),
        Kind::Hash(head, _) => Ok(Some(head)),
        Kind::Absent => Ok(None),
    }
}

/// A field's value, charged to the read budget.
fn hash_value<S: Store>(
    store: &mut S,
    head: HashHead,
    field: &[u8],
) -> Result<Option<Vec<u8>>, Fault> {
    if field.len() > HASH_FIELD_BYTES_MAX {
        return Ok(None);
    }
    let key = field_key(head.id, field);
    if store.find(&key)?.is_none() {
        return Ok(None);
    }
    read_value(store, &key).map(Some)
}

/// Fields of a hash in byte order strictly after `after`, at most `limit`
/// (and what the read budget allows: beyond it, a fault naming it), with
/// their values if `with_values` (else empty values).
pub(crate) fn hash_fields<S: Store>(
    store: &mut S,
    head: HashHead,
    after: Option<&[u8]>,
    limit: usize,
    with_values: bool,
) -> Result<Vec<Pair>, Fault> {
    let prefix = field_prefix(head.id);
    let end = prefix_end(&prefix);
    let after = after.map(|field| [prefix.as_slice(), field].concat());
    let budget = store.keys_left();
    let keys = store.keys(
        &prefix,
        end.as_deref(),
        after.as_deref(),
        limit.min(budget.saturating_add(1)),
    )?;
    store.charge(keys.len(), 0)?;
    let mut fields = Vec::with_capacity(keys.len());
    for key in keys {
        let field = key[prefix.len()..].to_vec();
        store.charge(0, field.len())?;
        let value = if with_values {
            read_value(store, &key)?
        } else {
            Vec::new()
        };
        fields.push(Pair { key: field, value });
    }
    Ok(fields)
}

/// GETRANGE's clamping (Redis 7 `getrangeCommand`): the inclusive byte
/// range, or `None` for an empty reply.
fn get_range(length: usize, start: i64, end: i64) -> Option<(usize, usize)> {
    if start < 0 && end < 0 && start > end {
        return None;
    }
    let length = i64::try_from(length).ok()?;
    let start = if start < 0 {
        length.saturating_add(start)
    } else {
        start
    }
    .max(0);
    let mut end = if end < 0 {
        length.saturating_add(end)
    } else {
        end
    }
    .max(0);
    if end >= length {
        end = length - 1;
    }
    if start > end || length == 0 {
        return None;
    }
    Some((start as usize, end as usize))
}

fn rename<S: Store>(
    store: &mut S,
    source: &[u8],
    destination: &[u8],
    only_if_absent: bool,
) -> Result<RedisReply, Outcome> {
    check_key(source)?;
    check_key(destination)?;
    let moved = kind(store, source)?;
    if matches!(moved, Kind::Absent) {
        return Err(error(ERR_NO_SUCH_KEY).into());
    }
    let done = if only_if_absent {
        RedisReply::Integer(1)
    } else {
        ok()
    };
    if source == destination {
        return Ok(if only_if_absent {
            RedisReply::Integer(0)
        } else {
            ok()
        });
    }
    if matches!(moved, Kind::Hash(..)) {
        check_hash_key(destination)?;
    }
    if only_if_absent && !matches!(kind(store, destination)?, Kind::Absent) {
        return Ok(RedisReply::Integer(0));
    }
    match moved {
        Kind::String(found) => {
            let value = store.value(source)?;
            remove_key(store, destination)?;
            remove_key(store, source)?;
            store.put(destination.to_vec(), value, found.expiry_ms)?;
        }
        Kind::Hash(head, found) => {
            remove_key(store, destination)?;
            // The marker moves; the fields stay where they are (under the
            // hash's id), whatever their number.
            store.delete(marker_key(source))?;
            if found.expiry_ms != 0 {
                store.delete(expiry_key(found.expiry_ms, source))?;
            }
            write_head(store, destination, head, 0, found.expiry_ms)?;
        }
        Kind::Absent => return Err(error(ERR_NO_SUCH_KEY).into()),
    }
    Ok(done)
}

/// FLUSHDB / FLUSHALL: every user key and every hash, or nothing if they
/// are more than [`FLUSH_KEYS_MAX`].
fn flush<S: Store>(store: &mut S) -> Result<RedisReply, Outcome> {
    let markers = [RESERVED_KEY_PREFIX, HASH_MARKER_TAG].concat();
    let markers_end = prefix_end(&markers);
    let reserved_end = prefix_end(RESERVED_KEY_PREFIX);
    let over = FLUSH_KEYS_MAX + 1;
    let mut strings = store.keys(b"", Some(RESERVED_KEY_PREFIX), None, over)?;
    if let Some(reserved_end) = &reserved_end {
        let left = over.saturating_sub(strings.len());
        strings.extend(store.keys(reserved_end, None, None, left)?);
    }
    let left = over.saturating_sub(strings.len());
    let hashes = store.keys(&markers, markers_end.as_deref(), None, left)?;
    if strings.len() + hashes.len() > FLUSH_KEYS_MAX {
        return Err(error(format!(
            "ERR FLUSHDB would delete more than FLUSH_KEYS_MAX ({FLUSH_KEYS_MAX}) keys in its one \
             atomic step; nothing was deleted (delete in batches: SCAN and DEL)"
        ))
        .into());
    }
    for key in strings {
        store.delete(key)?;
    }
    for marker in hashes {
        let key = &marker[markers.len()..];
        if let Some((head, found)) = hash(store, key)? {
            remove_hash(store, key, head, found)?;
        }
    }
    Ok(ok())
}

/// What WATCH records for `key` and EXEC compares: the `mod_revision` of
/// the string, else of the hash's marker, else 0.
pub(crate) fn watched_revision<S: Store>(store: &mut S, key: &[u8]) -> Result<u64, Fault> {
    if let Some(found) = store.find(key)? {
        return Ok(found.meta.mod_revision);
    }
    if key.len() <= HASH_KEY_BYTES_MAX
        && let Some(found) = store.find(&marker_key(key))?
    {
        return Ok(found.meta.mod_revision);
    }
    Ok(0)
}

/// The key's Redis type, `None` if absent.
pub(crate) fn type_of<S: Store>(
    store: &mut S,
    key: &[u8],
) -> Result<Option<super::RedisType>, Fault> {
    if key.len() > HASH_KEY_BYTES_MAX {
        return Ok(store.find(key)?.map(|_| super::RedisType::String));
    }
    Ok(match kind(store, key)? {
        Kind::Absent => None,
        Kind::String(_) => Some(super::RedisType::String),
        Kind::Hash(..) => Some(super::RedisType::Hash),
    })
}

/// The hash under `key` (for a listing of its fields): `None` if absent
/// or not a hash.
pub(crate) fn hash_head<S: Store>(store: &mut S, key: &[u8]) -> Result<Option<HashHead>, Fault> {
    Ok(match kind(store, key)? {
        Kind::Hash(head, _) => Some(head),
        Kind::Absent | Kind::String(_) => None,
    })
}
