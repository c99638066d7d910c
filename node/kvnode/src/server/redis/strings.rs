//! String commands: GET, SET (NX, XX, GET, EX, PX, EXAT, PXAT, KEEPTTL),
//! SETNX, SETEX, PSETEX, GETSET, GETDEL, GETEX, MGET, MSET, MSETNX, INCR,
//! DECR, INCRBY, DECRBY, INCRBYFLOAT, APPEND, STRLEN, GETRANGE, SETRANGE.
//!
//! Each becomes one `kvstate::redis::RedisCommand`; the arguments are
//! checked here with Redis's own messages (syntax, integers, expire
//! times), everything that depends on the stored value (WRONGTYPE, not an
//! integer, overflow) is the state machine's. EXAT and PXAT become a TTL
//! from this member's wall clock: cluster time has no epoch.

use kvstate::redis::{GetExExpiry, Pair, RedisCommand, SetCondition, SetExpiry};

use super::resp::Reply;
use super::{Parsed, integer, syntax_error, unix_time_ms};

/// The time unit of an expire argument.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Unit {
    Seconds,
    Milliseconds,
}

/// Redis's message for an expire time it refuses (`command` lowercase).
pub(crate) fn invalid_expire(command: &str) -> Reply {
    Reply::err(format!("invalid expire time in '{command}' command"))
}

/// A relative TTL in ms from an EX/PX/EXAT/PXAT argument, as Redis's
/// `getExpireMillisecondsOrReply` checks it (`absolute`: EXAT/PXAT, made
/// relative to this member's wall clock).
pub(crate) fn expire_ms(
    argument: &[u8],
    unit: Unit,
    absolute: bool,
    command: &str,
) -> Result<i64, Reply> {
    let value = integer(argument)?;
    if value <= 0 || (unit == Unit::Seconds && value > i64::MAX / 1000) {
        return Err(invalid_expire(command));
    }
    let ms = match unit {
        Unit::Seconds => value * 1000,
        Unit::Milliseconds => value,
    };
    if absolute {
        Ok(ms.saturating_sub(unix_time_ms()))
    } else {
        // Redis adds its clock and refuses an overflow.
        if ms > i64::MAX - unix_time_ms() {
            return Err(invalid_expire(command));
        }
        Ok(ms)
    }
}

/// The options after SET's value or GETEX's key (Redis's
/// `parseExtendedStringArgumentsOrReply`).
struct Extended {
    condition: SetCondition,
    get: bool,
    keep_ttl: bool,
    persist: bool,
    /// (option index: 0 EX, 1 PX, 2 EXAT, 3 PXAT; its argument)
    expire: Option<(usize, Vec<u8>)>,
}

fn extended(options: &[Vec<u8>], is_set: bool) -> Result<Extended, Reply> {
    let mut parsed = Extended {
        condition: SetCondition::Always,
        get: false,
        keep_ttl: false,
        persist: false,
        expire: None,
    };
    let mut i = 0;
    while i < options.len() {
        let option = options[i].to_ascii_uppercase();
        let has_next = i + 1 < options.len();
        let expire_kind = parsed.expire.as_ref().map(|(kind, _)| *kind);
        let other_expire = |kind: usize| expire_kind.is_some_and(|k| k != kind);
        match option.as_slice() {
            b"NX" if is_set && parsed.condition != SetCondition::IfPresent => {
                parsed.condition = SetCondition::IfAbsent;
            }
            b"XX" if is_set && parsed.condition != SetCondition::IfAbsent => {
                parsed.condition = SetCondition::IfPresent;
            }
            b"GET" if is_set => parsed.get = true,
            b"KEEPTTL" if is_set && !parsed.persist && expire_kind.is_none() => {
                parsed.keep_ttl = true;
            }
            b"PERSIST" if !is_set && expire_kind.is_none() && !parsed.keep_ttl => {
                parsed.persist = true;
            }
            b"EX" | b"PX" | b"EXAT" | b"PXAT" => {
                let kind = match option.as_slice() {
                    b"EX" => 0,
                    b"PX" => 1,
                    b"EXAT" => 2,
                    _ => 3,
                };
                if parsed.keep_ttl || parsed.persist || other_expire(kind) || !has_next {
                    return Err(syntax_error());
                }
                parsed.expire = Some((kind, options[i + 1].clone()));
                i += 1;
            }
            _ => return Err(syntax_error()),
        }
        i += 1;
    }
    Ok(parsed)
}

/// The relative TTL of a parsed EX/PX/EXAT/PXAT.
fn extended_ms(expire: &(usize, Vec<u8>), command: &str) -> Result<i64, Reply> {
    let (kind, argument) = expire;
    let unit = if kind % 2 == 0 {
        Unit::Seconds
    } else {
        Unit::Milliseconds
    };
    expire_ms(argument, unit, *kind >= 2, command)
}

fn pairs(args: &[Vec<u8>], command: &str) -> Result<Vec<Pair>, Reply> {
    if !args.len().is_multiple_of(2) || args.is_empty() {
        return Err(Reply::err(format!(
            "wrong number of arguments for '{command}' command"
        )));
    }
    Ok(args
        .chunks(2)
        .map(|pair| Pair {
            key: pair[0].clone(),
            value: pair[1].clone(),
        })
        .collect())
}

/// The command `name` (lowercase) of this family with its arguments (the
/// name excluded; the arity already checked); `None` if it is not a
/// string command.
pub(crate) fn parse(name: &str, args: &[Vec<u8>]) -> Option<Result<Parsed, Reply>> {
    let key = || args[0].clone();
    let command = |command: RedisCommand| Ok(Parsed::Command(command));
    Some(match name {
        "get" => command(RedisCommand::Get { key: key() }),
        "set" => (|| {
            let options = extended(&args[2..], true)?;
            let expiry = match (&options.expire, options.keep_ttl) {
                (Some(expire), _) => SetExpiry::In {
                    ms: extended_ms(expire, "set")?,
                },
                (None, true) => SetExpiry::Keep,
                (None, false) => SetExpiry::Persist,
            };
            command(RedisCommand::Set {
                key: key(),
                value: args[1].clone(),
                condition: options.condition,
                expiry,
                get: options.get,
            })
        })(),
        "setnx" => command(RedisCommand::SetNx {
            key: key(),
            value: args[1].clone(),
        }),
        "setex" | "psetex" => (|| {
            let unit = if name == "setex" {
                Unit::Seconds
            } else {
                Unit::Milliseconds
            };
            let ms = expire_ms(&args[1], unit, false, name)?;
            command(RedisCommand::Set {
                key: key(),
                value: args[2].clone(),
                condition: SetCondition::Always,
                expiry: SetExpiry::In { ms },
                get: false,
            })
        })(),
        "getset" => command(RedisCommand::Set {
            key: key(),
            value: args[1].clone(),
            condition: SetCondition::Always,
            expiry: SetExpiry::Persist,
            get: true,
        }),
        "getdel" => command(RedisCommand::GetDel { key: key() }),
        "getex" => (|| {
            let options = extended(&args[1..], false)?;
            let expiry = match (&options.expire, options.persist) {
                (Some(expire), _) => GetExExpiry::In {
                    ms: extended_ms(expire, "getex")?,
                },
                (None, true) => GetExExpiry::Persist,
                (None, false) => GetExExpiry::Unchanged,
            };
            command(RedisCommand::GetEx { key: key(), expiry })
        })(),
        "mget" => command(RedisCommand::MGet {
            keys: args.to_vec(),
        }),
        "mset" => pairs(args, "mset").and_then(|pairs| command(RedisCommand::MSet { pairs })),
        "msetnx" => pairs(args, "msetnx").and_then(|pairs| command(RedisCommand::MSetNx { pairs })),
        "incr" => command(RedisCommand::IncrBy {
            key: key(),
            increment: 1,
        }),
        "decr" => command(RedisCommand::IncrBy {
            key: key(),
            increment: -1,
        }),
        "incrby" => integer(&args[1]).and_then(|increment| {
            command(RedisCommand::IncrBy {
                key: key(),
                increment,
            })
        }),
        "decrby" => integer(&args[1]).and_then(|decrement| match decrement.checked_neg() {
            Some(increment) => command(RedisCommand::IncrBy {
                key: key(),
                increment,
            }),
            None => Err(Reply::Error(
                kvstate::redis::ERR_DECREMENT_OVERFLOW.to_string(),
            )),
        }),
        "incrbyfloat" => command(RedisCommand::IncrByFloat {
            key: key(),
            increment: args[1].clone(),
        }),
        "append" => command(RedisCommand::Append {
            key: key(),
            value: args[1].clone(),
        }),
        "strlen" => command(RedisCommand::StrLen { key: key() }),
        "getrange" => (|| {
            let start = integer(&args[1])?;
            let end = integer(&args[2])?;
            command(RedisCommand::GetRange {
                key: key(),
                start,
                end,
            })
        })(),
        "setrange" => integer(&args[1]).and_then(|offset| {
            if offset < 0 {
                return Err(Reply::err("offset is out of range"));
            }
            command(RedisCommand::SetRange {
                key: key(),
                offset: offset as u64,
                value: args[2].clone(),
            })
        }),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(items: &[&str]) -> Vec<Vec<u8>> {
        items.iter().map(|s| s.as_bytes().to_vec()).collect()
    }

    fn command(name: &str, items: &[&str]) -> Result<RedisCommand, Reply> {
        match parse(name, &args(items)).unwrap()? {
            Parsed::Command(command) => Ok(command),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn set_options_follow_redis() {
        assert_eq!(
            command("set", &["k", "v", "nx", "get", "px", "1500"]).unwrap(),
            RedisCommand::Set {
                key: b"k".to_vec(),
                value: b"v".to_vec(),
                condition: SetCondition::IfAbsent,
                expiry: SetExpiry::In { ms: 1500 },
                get: true,
            }
        );
        assert_eq!(
            command("set", &["k", "v", "KEEPTTL"]).unwrap(),
            RedisCommand::Set {
                key: b"k".to_vec(),
                value: b"v".to_vec(),
                condition: SetCondition::Always,
                expiry: SetExpiry::Keep,
                get: false,
            }
        );
        for bad in [
            &["k", "v", "nx", "xx"][..],
            &["k", "v", "ex", "1", "px", "1"],
            &["k", "v", "keepttl", "ex", "1"],
            &["k", "v", "ex"],
            &["k", "v", "persist"],
            &["k", "v", "foo"],
        ] {
            assert_eq!(command("set", bad), Err(syntax_error()), "{bad:?}");
        }
        assert_eq!(
            command("set", &["k", "v", "ex", "0"]),
            Err(Reply::err("invalid expire time in 'set' command"))
        );
        assert_eq!(
            command("set", &["k", "v", "ex", "x"]),
            Err(Reply::err("value is not an integer or out of range"))
        );
        assert_eq!(
            command("setex", &["k", "-1", "v"]),
            Err(Reply::err("invalid expire time in 'setex' command"))
        );
        // EXAT in the past is a TTL at or below 0: the key ends absent.
        match command("set", &["k", "v", "exat", "1"]).unwrap() {
            RedisCommand::Set {
                expiry: SetExpiry::In { ms },
                ..
            } => assert!(ms < 0),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn counters_and_ranges_check_their_numbers() {
        assert_eq!(
            command("decrby", &["k", "5"]).unwrap(),
            RedisCommand::IncrBy {
                key: b"k".to_vec(),
                increment: -5
            }
        );
        assert_eq!(
            command("decrby", &["k", "-9223372036854775808"]),
            Err(Reply::err("decrement would overflow"))
        );
        assert_eq!(
            command("setrange", &["k", "-1", "v"]),
            Err(Reply::err("offset is out of range"))
        );
        assert_eq!(
            command("mset", &["a", "1", "b"]),
            Err(Reply::err("wrong number of arguments for 'mset' command"))
        );
        assert_eq!(
            command("getex", &["k", "persist"]).unwrap(),
            RedisCommand::GetEx {
                key: b"k".to_vec(),
                expiry: GetExExpiry::Persist
            }
        );
        assert_eq!(command("getex", &["k", "nx"]), Err(syntax_error()));
    }
}
