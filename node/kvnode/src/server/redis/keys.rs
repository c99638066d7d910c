//! Key commands: DEL, UNLINK, EXISTS, EXPIRE, PEXPIRE, EXPIREAT,
//! PEXPIREAT (NX, XX, GT, LT), TTL, PTTL, EXPIRETIME, PEXPIRETIME,
//! PERSIST, TYPE, RENAME, RENAMENX, KEYS, SCAN, DBSIZE, RANDOMKEY,
//! FLUSHDB, FLUSHALL.
//!
//! Single-key commands become one `kvstate::redis::RedisCommand`. The
//! listing reads (KEYS, SCAN, DBSIZE, RANDOMKEY) page through
//! `kvstate::redis::keys_page` here, each page read while no entry
//! applies; SCAN's cursor is a decimal u64 naming the key its next page
//! starts after, remembered by this member (a cursor from another member,
//! or one forgotten after [`super::SCAN_CURSORS_MAX`] newer ones, is
//! answered `-ERR invalid cursor`). EXPIRETIME is PTTL plus this member's
//! wall clock (cluster time has no epoch).

use bitcask::Engine;
use kvstate::redis::{ExpireCondition, RedisCommand, RedisReply};

use super::glob;
use super::resp::Reply;
use super::strings::invalid_expire;
use super::{Parsed, RedisFrontEnd, integer, read_error, syntax_error, unix_time_ms};
use crate::state_machine::StateMachine;

/// Keys KEYS answers at most; beyond, an error asking for SCAN (Redis has
/// no bound; here one reply stays bounded in memory).
pub const KEYS_REPLY_MAX: usize = 100_000;
/// Keys one listing page reads (KEYS, DBSIZE's neighbours): each page is
/// read while no entry applies, so it stays short.
pub const KEYS_PAGE_MAX: usize = 1000;
/// SCAN's and HSCAN's COUNT when none is given (Redis's).
pub const SCAN_COUNT_DEFAULT: usize = 10;
/// Keys (or fields) one SCAN / HSCAN call visits at most, whatever COUNT
/// asks (COUNT is a hint in Redis too).
pub const SCAN_COUNT_MAX: usize = 10_000;

/// SCAN's and HSCAN's arguments after the key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScanArgs {
    /// 0 = from the start.
    pub cursor: u64,
    /// MATCH's pattern (`None`: every key, also for a lone `*`).
    pub pattern: Option<Vec<u8>>,
    /// Keys to visit (COUNT).
    pub count: usize,
    /// TYPE's name (SCAN only), lowercase.
    pub type_name: Option<String>,
}

impl ScanArgs {
    /// Whether `key` passes MATCH.
    pub fn matches(&self, key: &[u8]) -> bool {
        self.pattern
            .as_ref()
            .is_none_or(|pattern| glob::matches(pattern, key))
    }
}

/// A pattern, `None` for a lone `*` (Redis lists everything then, without
/// matching: its matcher needs a byte for `*`).
fn pattern_of(pattern: &[u8]) -> Option<Vec<u8>> {
    (pattern != b"*").then(|| pattern.to_vec())
}

/// The cursor and options of SCAN (`with_type`) or HSCAN, as Redis's
/// `scanGenericCommand` reads them.
pub(crate) fn scan_args(args: &[Vec<u8>], with_type: bool) -> Result<ScanArgs, Reply> {
    let cursor_text = &args[0];
    let cursor = if cursor_text.is_empty() {
        0
    } else {
        std::str::from_utf8(cursor_text)
            .ok()
            .filter(|text| text.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|text| text.parse::<u64>().ok())
            .ok_or_else(|| Reply::err("invalid cursor"))?
    };
    let mut scan = ScanArgs {
        cursor,
        pattern: None,
        count: SCAN_COUNT_DEFAULT,
        type_name: None,
    };
    let mut i = 1;
    while i < args.len() {
        let option = args[i].to_ascii_lowercase();
        let has_value = i + 1 < args.len();
        match option.as_slice() {
            b"count" if has_value => {
                let count = integer(&args[i + 1])?;
                if count < 1 {
                    return Err(syntax_error());
                }
                scan.count = (count as u64).min(SCAN_COUNT_MAX as u64) as usize;
            }
            b"match" if has_value => scan.pattern = pattern_of(&args[i + 1]),
            b"type" if with_type && has_value => {
                scan.type_name = Some(String::from_utf8_lossy(&args[i + 1]).to_ascii_lowercase());
            }
            _ => return Err(syntax_error()),
        }
        i += 2;
    }
    Ok(scan)
}

/// EXPIRE's NX / XX / GT / LT, as Redis 7 checks them (before the time).
fn expire_condition(options: &[Vec<u8>]) -> Result<ExpireCondition, Reply> {
    let (mut nx, mut xx, mut gt, mut lt) = (false, false, false, false);
    for option in options {
        match option.to_ascii_uppercase().as_slice() {
            b"NX" => nx = true,
            b"XX" => xx = true,
            b"GT" => gt = true,
            b"LT" => lt = true,
            _ => {
                return Err(Reply::err(format!(
                    "Unsupported option {}",
                    String::from_utf8_lossy(option)
                )));
            }
        }
    }
    if nx && (xx || gt || lt) {
        return Err(Reply::err(
            "NX and XX, GT or LT options at the same time are not compatible",
        ));
    }
    if gt && lt {
        return Err(Reply::err(
            "GT and LT options at the same time are not compatible",
        ));
    }
    Ok(match (nx, xx, gt, lt) {
        (true, ..) => ExpireCondition::IfNone,
        // GT never holds for a key without a TTL, so XX adds nothing.
        (_, _, true, _) => ExpireCondition::IfGreater,
        // LT holds for a key without a TTL and XX does not: both.
        (_, true, _, true) => ExpireCondition::IfSomeAndLess,
        (_, _, _, true) => ExpireCondition::IfLess,
        (_, true, ..) => ExpireCondition::IfSome,
        _ => ExpireCondition::Always,
    })
}

/// The command `name` (lowercase) of this family with its arguments (the
/// name excluded; the arity already checked); `None` if it is not a key
/// command.
pub(crate) fn parse(name: &str, args: &[Vec<u8>]) -> Option<Result<Parsed, Reply>> {
    let key = || args[0].clone();
    let command = |command: RedisCommand| Ok(Parsed::Command(command));
    Some(match name {
        "del" | "unlink" => command(RedisCommand::Del {
            keys: args.to_vec(),
        }),
        "exists" => command(RedisCommand::Exists {
            keys: args.to_vec(),
        }),
        "expire" | "pexpire" | "expireat" | "pexpireat" => (|| {
            let condition = expire_condition(&args[2..])?;
            let when = integer(&args[1])?;
            let seconds = matches!(name, "expire" | "expireat");
            let when_ms = if seconds {
                if !(i64::MIN / 1000..=i64::MAX / 1000).contains(&when) {
                    return Err(invalid_expire(name));
                }
                when * 1000
            } else {
                when
            };
            let ms = if name.ends_with("at") {
                // An absolute unix time: relative to this member's wall
                // clock (a time in the past deletes the key).
                when_ms.saturating_sub(unix_time_ms())
            } else {
                if when_ms > i64::MAX - unix_time_ms() {
                    return Err(invalid_expire(name));
                }
                when_ms
            };
            command(RedisCommand::Expire {
                key: key(),
                ms,
                condition,
            })
        })(),
        "ttl" | "pttl" => command(RedisCommand::Ttl {
            key: key(),
            milliseconds: name == "pttl",
        }),
        "expiretime" | "pexpiretime" => Ok(Parsed::ExpireTime {
            key: key(),
            milliseconds: name == "pexpiretime",
        }),
        "persist" => command(RedisCommand::Persist { key: key() }),
        "type" => command(RedisCommand::Type { key: key() }),
        "rename" | "renamenx" => command(RedisCommand::Rename {
            source: key(),
            destination: args[1].clone(),
            only_if_absent: name == "renamenx",
        }),
        "keys" => Ok(Parsed::Keys {
            pattern: pattern_of(&args[0]),
        }),
        "scan" => scan_args(args, true).map(Parsed::Scan),
        "dbsize" => Ok(Parsed::DbSize),
        "randomkey" => Ok(Parsed::RandomKey),
        "flushdb" | "flushall" => match args {
            [] => command(RedisCommand::FlushAll),
            [mode] if mode.eq_ignore_ascii_case(b"async") || mode.eq_ignore_ascii_case(b"sync") => {
                command(RedisCommand::FlushAll)
            }
            _ => Err(syntax_error()),
        },
        _ => return None,
    })
}

/// EXPIRETIME / PEXPIRETIME from a PTTL reply: -2 and -1 pass through;
/// otherwise this member's unix time plus what is left (seconds rounded to
/// the nearest: the TTL was set from a wall clock too, and cluster time
/// advances in steps).
pub(crate) fn expire_time(pttl: RedisReply, milliseconds: bool) -> Reply {
    match pttl {
        RedisReply::Integer(left) if left >= 0 => {
            let at_ms = unix_time_ms().saturating_add(left);
            Reply::Integer(if milliseconds {
                at_ms
            } else {
                (at_ms + 500) / 1000
            })
        }
        other => super::reply_of(other),
    }
}

/// One page of keys after `after`, read while no entry applies.
fn keys_page(
    state_machine: &StateMachine,
    now_ms: u64,
    after: Option<&[u8]>,
    limit: usize,
) -> Result<Vec<(Vec<u8>, kvstate::redis::RedisType)>, Reply> {
    let (page, _) =
        state_machine.read_exact(|engine| kvstate::redis::keys_page(engine, now_ms, after, limit));
    page.map_err(read_error)
}

/// KEYS: every key matching `pattern` (blocking: run it off the async
/// workers).
pub(crate) fn keys(state_machine: &StateMachine, now_ms: u64, pattern: Option<&[u8]>) -> Reply {
    let mut found = Vec::new();
    let mut after: Option<Vec<u8>> = None;
    loop {
        let page = match keys_page(state_machine, now_ms, after.as_deref(), KEYS_PAGE_MAX) {
            Ok(page) => page,
            Err(reply) => return reply,
        };
        let done = page.len() < KEYS_PAGE_MAX;
        after = page.last().map(|(key, _)| key.clone());
        for (key, _) in page {
            if pattern.is_none_or(|pattern| glob::matches(pattern, &key)) {
                if found.len() == KEYS_REPLY_MAX {
                    return Reply::err(format!(
                        "KEYS matched more than KEYS_REPLY_MAX ({KEYS_REPLY_MAX}) keys; use SCAN"
                    ));
                }
                found.push(Reply::Bulk(key));
            }
        }
        if done {
            return Reply::Array(found);
        }
    }
}

/// SCAN: one page of keys after the cursor's key.
pub(crate) fn scan(
    front_end: &RedisFrontEnd,
    state_machine: &StateMachine,
    now_ms: u64,
    scan: &ScanArgs,
) -> Reply {
    let after = match scan.cursor {
        0 => None,
        cursor => match front_end.cursor(cursor) {
            Some(after) => Some(after),
            None => return Reply::err("invalid cursor"),
        },
    };
    let page = match keys_page(state_machine, now_ms, after.as_deref(), scan.count + 1) {
        Ok(page) => page,
        Err(reply) => return reply,
    };
    let more = page.len() > scan.count;
    let visited = &page[..page.len().min(scan.count)];
    let cursor = match (more, visited.last()) {
        (true, Some((last, _))) => front_end.remember_cursor(last.clone()),
        _ => 0,
    };
    let keys = visited
        .iter()
        .filter(|(key, kind)| {
            scan.matches(key)
                && scan
                    .type_name
                    .as_deref()
                    .is_none_or(|name| name == kind.name())
        })
        .map(|(key, _)| Reply::Bulk(key.clone()))
        .collect();
    Reply::Array(vec![Reply::text(cursor.to_string()), Reply::Array(keys)])
}

/// DBSIZE.
pub(crate) fn dbsize(engine: &Engine, now_ms: u64) -> Reply {
    match kvstate::redis::key_count(engine, now_ms) {
        Ok(count) => Reply::Integer(count as i64),
        Err(err) => read_error(err),
    }
}

/// RANDOMKEY: the first key after a random point (wrapping to the first
/// key), nil when there is none.
pub(crate) fn random_key(state_machine: &StateMachine, now_ms: u64) -> Reply {
    let start = random_bytes();
    for after in [Some(&start[..]), None] {
        match keys_page(state_machine, now_ms, after, 1) {
            Ok(page) => {
                if let Some((key, _)) = page.into_iter().next() {
                    return Reply::Bulk(key);
                }
            }
            Err(reply) => return reply,
        }
    }
    Reply::Nil
}

/// Eight bytes no caller can predict.
fn random_bytes() -> [u8; 8] {
    use std::hash::{BuildHasher as _, Hasher as _};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u64(unix_time_ms() as u64);
    hasher.finish().to_be_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(items: &[&str]) -> Vec<Vec<u8>> {
        items.iter().map(|s| s.as_bytes().to_vec()).collect()
    }

    #[test]
    fn scan_options_follow_redis() {
        let scan = scan_args(
            &args(&["0", "MATCH", "a*", "COUNT", "5", "TYPE", "Hash"]),
            true,
        )
        .unwrap();
        assert_eq!(
            scan,
            ScanArgs {
                cursor: 0,
                pattern: Some(b"a*".to_vec()),
                count: 5,
                type_name: Some("hash".into()),
            }
        );
        assert_eq!(
            scan_args(&args(&["0", "match", "*"]), true)
                .unwrap()
                .pattern,
            None
        );
        assert_eq!(
            scan_args(&args(&["0", "count", "0"]), true),
            Err(syntax_error())
        );
        assert_eq!(
            scan_args(&args(&["x"]), true),
            Err(Reply::err("invalid cursor"))
        );
        assert_eq!(
            scan_args(&args(&["0", "type", "hash"]), false),
            Err(syntax_error())
        );
        assert_eq!(scan_args(&args(&["0", "count"]), true), Err(syntax_error()));
    }

    #[test]
    fn expire_options_follow_redis() {
        assert_eq!(
            expire_condition(&args(&["nx", "xx"])),
            Err(Reply::err(
                "NX and XX, GT or LT options at the same time are not compatible"
            ))
        );
        assert_eq!(
            expire_condition(&args(&["gt", "lt"])),
            Err(Reply::err(
                "GT and LT options at the same time are not compatible"
            ))
        );
        assert_eq!(
            expire_condition(&args(&["foo"])),
            Err(Reply::err("Unsupported option foo"))
        );
        assert_eq!(
            expire_condition(&args(&["xx", "gt"])),
            Ok(ExpireCondition::IfGreater)
        );
        assert_eq!(expire_condition(&[]), Ok(ExpireCondition::Always));
        match parse("expire", &args(&["k", "9223372036854775807"])).unwrap() {
            Err(reply) => assert_eq!(reply, Reply::err("invalid expire time in 'expire' command")),
            Ok(other) => panic!("{other:?}"),
        }
    }
}
