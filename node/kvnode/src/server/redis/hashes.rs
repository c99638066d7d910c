//! Hash commands: HSET, HMSET, HSETNX, HGET, HMGET, HDEL, HEXISTS, HLEN,
//! HGETALL, HKEYS, HVALS, HINCRBY, HINCRBYFLOAT, HSCAN, HSTRLEN.
//!
//! Each but HSCAN becomes one `kvstate::redis::RedisCommand` (a hash is
//! stored as one record per field under the reserved prefix, atomic per
//! command: `kvstate::redis`). HSCAN pages the fields itself, with
//! cursors the member remembers ([`super::RedisFrontEnd::remember_cursor`]).

use bitcask::Engine;
use kvstate::redis::{HashPart, Pair, RedisCommand, RedisType};

use super::keys::{ScanArgs, scan_args};
use super::resp::Reply;
use super::{Parsed, RedisFrontEnd, integer, read_error};

/// Fields of a hash HSCAN answers whole, whatever COUNT says, from cursor
/// 0 (Redis's `hash-max-listpack-entries`: a small hash is one listpack,
/// which Redis scans in one call).
pub const HSCAN_WHOLE_FIELDS_MAX: usize = 128;

/// The command `name` (lowercase) of this family with its arguments (the
/// name excluded; the arity already checked); `None` if it is not a hash
/// command.
pub(crate) fn parse(name: &str, args: &[Vec<u8>]) -> Option<Result<Parsed, Reply>> {
    let key = || args[0].clone();
    let command = |command: RedisCommand| Ok(Parsed::Command(command));
    Some(match name {
        "hset" | "hmset" => {
            let fields = &args[1..];
            if !fields.len().is_multiple_of(2) {
                Err(Reply::err(format!(
                    "wrong number of arguments for '{name}' command"
                )))
            } else {
                command(RedisCommand::HSet {
                    key: key(),
                    pairs: fields
                        .chunks(2)
                        .map(|pair| Pair {
                            key: pair[0].clone(),
                            value: pair[1].clone(),
                        })
                        .collect(),
                    reply_ok: name == "hmset",
                })
            }
        }
        "hsetnx" => command(RedisCommand::HSetNx {
            key: key(),
            field: args[1].clone(),
            value: args[2].clone(),
        }),
        "hget" => command(RedisCommand::HGet {
            key: key(),
            field: args[1].clone(),
        }),
        "hmget" => command(RedisCommand::HMGet {
            key: key(),
            fields: args[1..].to_vec(),
        }),
        "hdel" => command(RedisCommand::HDel {
            key: key(),
            fields: args[1..].to_vec(),
        }),
        "hexists" => command(RedisCommand::HExists {
            key: key(),
            field: args[1].clone(),
        }),
        "hlen" => command(RedisCommand::HLen { key: key() }),
        "hgetall" | "hkeys" | "hvals" => command(RedisCommand::HGetAll {
            key: key(),
            part: match name {
                "hgetall" => HashPart::All,
                "hkeys" => HashPart::Fields,
                _ => HashPart::Values,
            },
        }),
        "hincrby" => integer(&args[2]).and_then(|increment| {
            command(RedisCommand::HIncrBy {
                key: key(),
                field: args[1].clone(),
                increment,
            })
        }),
        "hincrbyfloat" => command(RedisCommand::HIncrByFloat {
            key: key(),
            field: args[1].clone(),
            increment: args[2].clone(),
        }),
        "hstrlen" => command(RedisCommand::HStrLen {
            key: key(),
            field: args[1].clone(),
        }),
        "hscan" => scan_args(&args[1..], false).map(|scan| Parsed::HScan { key: key(), scan }),
        _ => return None,
    })
}

/// HSCAN: a page of the hash's fields and values after the cursor's
/// field (a blocking read: run it off the async workers).
pub(crate) fn hscan(
    front_end: &RedisFrontEnd,
    engine: &Engine,
    now_ms: u64,
    key: &[u8],
    scan: &ScanArgs,
) -> Reply {
    match kvstate::redis::key_type(engine, key, now_ms) {
        Err(err) => return read_error(err),
        Ok(Some(RedisType::String)) => {
            return Reply::Error(kvstate::redis::ERR_WRONGTYPE.to_string());
        }
        Ok(_) => {}
    }
    let after = match scan.cursor {
        0 => None,
        cursor => match front_end.cursor(cursor) {
            Some(after) => Some(after),
            None => return Reply::err("invalid cursor"),
        },
    };
    // From cursor 0 a small hash is answered whole, as Redis answers a
    // listpack-encoded one.
    let limit = if after.is_none() {
        scan.count.max(HSCAN_WHOLE_FIELDS_MAX)
    } else {
        scan.count
    };
    let page =
        match kvstate::redis::hash_fields_page(engine, key, now_ms, after.as_deref(), limit + 1) {
            Ok(page) => page,
            Err(err) => return read_error(err),
        };
    let (visited, more) = if after.is_none() && page.len() <= HSCAN_WHOLE_FIELDS_MAX {
        (&page[..], false)
    } else if page.len() > scan.count {
        (&page[..scan.count], true)
    } else {
        (&page[..], false)
    };
    let cursor = match (more, visited.last()) {
        (true, Some((last, _))) => front_end.remember_cursor(last.clone()),
        _ => 0,
    };
    let mut items = Vec::new();
    for (field, value) in visited {
        if scan.matches(field) {
            items.push(Reply::Bulk(field.clone()));
            items.push(Reply::Bulk(value.clone()));
        }
    }
    Reply::Array(vec![Reply::text(cursor.to_string()), Reply::Array(items)])
}
