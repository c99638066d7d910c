//! `kvctl txn`: a transaction read from standard input in etcdctl's
//! non-interactive format, so scripts written for `etcdctl txn` carry over:
//!
//! ```text
//! mod("lock") = "0"
//! value("cfg/mode") != "frozen"
//!
//! put lock "me"
//! get cfg/ --prefix
//!
//! get lock
//! ```
//!
//! Compares (`TARGET("KEY") OP "VALUE"`, target `value`/`val`,
//! `version`/`ver`, `create`/`c`, `mod`/`m` or `lease`, op `=`, `!=`, `<` or
//! `>`, key and value in Go's double-quoted or backquoted form), a blank
//! line, the ops run when every compare holds, a blank line, the ops run
//! otherwise. An op is `put KEY VALUE [--prev-kv] [--lease=HEX]
//! [--ignore-value] [--ignore-lease]`, `get KEY [RANGE_END] [--prefix]
//! [--from-key] [--limit=N] [--rev=N] [--keys-only] [--count-only]
//! [--sort-by=T] [--order=O]` or `del KEY [RANGE_END] [--prefix]
//! [--from-key] [--prev-kv]`; words may be quoted as in the compares.
//! Prints `SUCCESS` or `FAILURE`, then for each op of the branch that ran a
//! blank line and its result as etcdctl prints it: `OK` for a put, the
//! number deleted (then the deleted keys and values) for a del, each key and
//! value on its own line for a get.

use std::io::Read;

use kvclient::txn::{
    Compare, CompareOp, DeleteRange, Keys, Range, SortOrder, SortTarget, Txn, TxnOp, TxnResult,
};
use kvproto::kv::v1 as pb;
use serde_json::{Map, Value};

use super::Context;
use super::get::keys_of;
use crate::exit::Failure;
use crate::output::kv_json;

/// Bytes of standard input `txn` reads at most.
pub const TXN_INPUT_BYTES_MAX: usize = 16 * 1024 * 1024;

/// `kvctl txn`.
pub async fn run(context: &Context) -> Result<(), Failure> {
    let mut input = Vec::new();
    std::io::stdin()
        .take(TXN_INPUT_BYTES_MAX as u64 + 1)
        .read_to_end(&mut input)
        .map_err(|err| Failure::usage(format!("cannot read standard input: {err}")))?;
    if input.len() > TXN_INPUT_BYTES_MAX {
        return Err(Failure::usage(format!(
            "standard input is over TXN_INPUT_BYTES_MAX ({TXN_INPUT_BYTES_MAX} bytes)"
        )));
    }
    let text =
        String::from_utf8(input).map_err(|_| Failure::usage("standard input is not UTF-8 text"))?;
    let txn = parse(&text)?;
    let client = context.client()?;
    let response = client.txn(&txn).await.map_err(|err| context.fail(err))?;
    let printer = &context.printer;
    if printer.json() {
        let mut object = Map::new();
        object.insert("succeeded".into(), response.succeeded.into());
        object.insert("revision".into(), response.revision.into());
        object.insert("applied_index".into(), response.applied_index.into());
        let results = response.results.iter().map(result_json).collect();
        object.insert("responses".into(), Value::Array(results));
        printer.print_json(&Value::Object(object));
        return Ok(());
    }
    println!(
        "{}",
        if response.succeeded {
            "SUCCESS"
        } else {
            "FAILURE"
        }
    );
    let write =
        |err: std::io::Error| Failure::usage(format!("cannot write standard output: {err}"));
    for result in &response.results {
        println!();
        match result {
            TxnResult::Put { .. } => println!("OK"),
            TxnResult::DeleteRange(deleted) => {
                println!("{}", deleted.deleted);
                printer.print_kvs(&deleted.prev_kvs).map_err(write)?;
            }
            TxnResult::Range(range) => printer.print_kvs(&range.kvs).map_err(write)?,
        }
    }
    Ok(())
}

fn result_json(result: &TxnResult) -> Value {
    let mut object = Map::new();
    match result {
        TxnResult::Put { prev_kv } => {
            object.insert("op".into(), "put".into());
            object.insert(
                "prev_kv".into(),
                prev_kv.as_ref().map_or(Value::Null, kv_json),
            );
        }
        TxnResult::DeleteRange(deleted) => {
            object.insert("op".into(), "del".into());
            object.insert("deleted".into(), deleted.deleted.into());
            let prev = deleted.prev_kvs.iter().map(kv_json).collect();
            object.insert("prev_kvs".into(), Value::Array(prev));
        }
        TxnResult::Range(range) => {
            object.insert("op".into(), "get".into());
            object.insert(
                "kvs".into(),
                Value::Array(range.kvs.iter().map(kv_json).collect()),
            );
            object.insert("more".into(), range.more.into());
            object.insert("count".into(), range.count.into());
        }
    }
    Value::Object(object)
}

/// Parses etcdctl's transaction format (see the module doc).
pub fn parse(text: &str) -> Result<Txn, Failure> {
    let mut sections: [Vec<(usize, &str)>; 3] = Default::default();
    let mut section = 0;
    for (number, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() {
            section += 1;
            if section > 2 {
                if text.lines().skip(number).all(|l| l.trim().is_empty()) {
                    break;
                }
                return Err(Failure::usage(format!(
                    "line {}: a transaction has three sections (compares, success ops, failure \
                     ops) separated by blank lines; this is a fourth",
                    number + 1
                )));
            }
            continue;
        }
        sections[section].push((number + 1, line));
    }
    let [compares, success, failure] = sections;
    let compares = compares
        .into_iter()
        .map(|(number, line)| parse_compare(line).map_err(|why| at(number, line, why)))
        .collect::<Result<Vec<_>, _>>()?;
    let ops = |lines: Vec<(usize, &str)>| {
        lines
            .into_iter()
            .map(|(number, line)| parse_op(line).map_err(|why| at(number, line, why)))
            .collect::<Result<Vec<_>, _>>()
    };
    Ok(Txn::new()
        .when(compares)
        .and_then(ops(success)?)
        .or_else(ops(failure)?))
}

fn at(number: usize, line: &str, why: String) -> Failure {
    Failure::usage(format!("line {number}: {why}: {line}"))
}

/// `TARGET("KEY") OP "VALUE"`.
fn parse_compare(line: &str) -> Result<Compare, String> {
    let Some((target, rest)) = line.split_once('(') else {
        return Err("malformed comparison (expected TARGET(\"KEY\") OP \"VALUE\")".into());
    };
    let (key, rest) = take_quoted(rest.trim_start())?;
    let rest = rest
        .strip_prefix(')')
        .ok_or("malformed comparison: `)` expected after the key")?;
    let rest = rest.trim_start();
    let (op, rest) = rest
        .split_once(char::is_whitespace)
        .ok_or("malformed comparison: no value")?;
    let (value, rest) = take_quoted(rest.trim_start())?;
    if !rest.trim().is_empty() {
        return Err(format!(
            "malformed comparison: `{}` after the value",
            rest.trim()
        ));
    }
    let number = |what: &str| {
        let text = String::from_utf8_lossy(&value);
        text.parse::<u64>()
            .map_err(|_| format!("{what} compares numbers; `{text}` is not one"))
    };
    let compare = match target.trim() {
        "value" | "val" => apply_op(Compare::value(key), op, value.into())?,
        "version" | "ver" => apply_op(Compare::version(key), op, number("version")?)?,
        "create" | "c" => apply_op(Compare::create_revision(key), op, number("create")?)?,
        "mod" | "m" => apply_op(Compare::mod_revision(key), op, number("mod")?)?,
        "lease" => {
            let text = String::from_utf8_lossy(&value);
            let lease = u64::from_str_radix(&text, 16)
                .map_err(|_| format!("lease compares a hex lease id; `{text}` is not one"))?;
            apply_op(Compare::lease(key), op, lease)?
        }
        other => {
            return Err(format!(
                "unknown compare target `{other}` (value, version, create, mod or lease)"
            ));
        }
    };
    Ok(compare)
}

fn apply_op<T>(on: kvclient::txn::CompareOn<T>, op: &str, value: T) -> Result<Compare, String> {
    let op = match op {
        "=" | "==" => CompareOp::Equal,
        "!=" => CompareOp::NotEqual,
        "<" => CompareOp::Less,
        ">" => CompareOp::Greater,
        other => {
            return Err(format!(
                "unknown compare operator `{other}` (=, !=, < or >)"
            ));
        }
    };
    Ok(on.op(op, value))
}

/// A Go-quoted string at the start of `text` (`"..."` with escapes, or a
/// backquoted raw string), and the rest.
fn take_quoted(text: &str) -> Result<(Vec<u8>, &str), String> {
    if let Some(rest) = text.strip_prefix('`') {
        let end = rest.find('`').ok_or("unterminated backquoted string")?;
        return Ok((rest.as_bytes()[..end].to_vec(), &rest[end + 1..]));
    }
    let rest = text
        .strip_prefix('"')
        .ok_or("a key or value must be quoted (\"...\")")?;
    let mut out = Vec::new();
    let mut chars = rest.char_indices();
    while let Some((i, c)) = chars.next() {
        match c {
            '"' => return Ok((out, &rest[i + 1..])),
            '\\' => {
                let (_, escaped) = chars.next().ok_or("unterminated string")?;
                match escaped {
                    'n' => out.push(b'\n'),
                    't' => out.push(b'\t'),
                    'r' => out.push(b'\r'),
                    '0' => out.push(0),
                    '\\' => out.push(b'\\'),
                    '"' => out.push(b'"'),
                    '\'' => out.push(b'\''),
                    'x' => {
                        let hex: String = (0..2)
                            .filter_map(|_| chars.next().map(|(_, c)| c))
                            .collect();
                        let byte = u8::from_str_radix(&hex, 16)
                            .map_err(|_| format!("bad escape \\x{hex}"))?;
                        out.push(byte);
                    }
                    other => return Err(format!("unknown escape \\{other}")),
                }
            }
            c => {
                let mut buf = [0u8; 4];
                out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
            }
        }
    }
    Err("unterminated string".into())
}

/// The words of an op line: whitespace-separated, each plain or quoted.
fn words(line: &str) -> Result<Vec<Vec<u8>>, String> {
    let mut words = Vec::new();
    let mut rest = line.trim_start();
    while !rest.is_empty() {
        if rest.starts_with('"') || rest.starts_with('`') {
            let (word, after) = take_quoted(rest)?;
            words.push(word);
            rest = after.trim_start();
        } else if let Some(inner) = rest.strip_prefix('\'') {
            let end = inner.find('\'').ok_or("unterminated single-quoted word")?;
            words.push(inner.as_bytes()[..end].to_vec());
            rest = inner[end + 1..].trim_start();
        } else {
            let end = rest.find(char::is_whitespace).unwrap_or(rest.len());
            words.push(rest.as_bytes()[..end].to_vec());
            rest = rest[end..].trim_start();
        }
    }
    Ok(words)
}

/// Flags (`--name` or `--name=value` / `--name value` for those taking a
/// value) and positional words of an op.
struct OpArgs {
    positional: Vec<Vec<u8>>,
    flags: Vec<(String, Option<String>)>,
}

fn op_args(words: &[Vec<u8>], valued: &[&str]) -> Result<OpArgs, String> {
    let mut args = OpArgs {
        positional: Vec::new(),
        flags: Vec::new(),
    };
    let mut iter = words.iter();
    while let Some(word) = iter.next() {
        let Some(flag) = word.strip_prefix(b"--") else {
            args.positional.push(word.clone());
            continue;
        };
        let flag = String::from_utf8_lossy(flag).to_string();
        let (name, value) = match flag.split_once('=') {
            Some((name, value)) => (name.to_string(), Some(value.to_string())),
            None if valued.contains(&flag.as_str()) => {
                let value = iter.next().ok_or(format!("--{flag} needs a value"))?;
                (flag, Some(String::from_utf8_lossy(value).to_string()))
            }
            None => (flag, None),
        };
        args.flags.push((name, value));
    }
    Ok(args)
}

fn number_flag(name: &str, value: &Option<String>) -> Result<u64, String> {
    let text = value.as_deref().ok_or(format!("--{name} needs a value"))?;
    text.parse()
        .map_err(|_| format!("--{name}: `{text}` is not a number"))
}

fn parse_op(line: &str) -> Result<TxnOp, String> {
    let words = words(line)?;
    let Some((command, rest)) = words.split_first() else {
        return Err("empty op".into());
    };
    let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).to_string();
    match command.as_slice() {
        b"put" => {
            let args = op_args(rest, &["lease"])?;
            let [key, value] = args.positional.as_slice() else {
                return Err("put takes KEY VALUE".into());
            };
            let mut put = pb::TxnPut {
                key: key.clone().into(),
                value: value.clone().into(),
                ..Default::default()
            };
            for (name, value) in &args.flags {
                match name.as_str() {
                    "prev-kv" => put.prev_kv = true,
                    "ignore-value" => put.ignore_value = true,
                    "ignore-lease" => put.ignore_lease = true,
                    "lease" => {
                        let text = value.as_deref().unwrap_or_default();
                        put.lease = u64::from_str_radix(text, 16)
                            .map_err(|_| format!("--lease: `{text}` is not a hex lease id"))?;
                    }
                    other => return Err(format!("put has no flag --{other}")),
                }
            }
            Ok(TxnOp::Put(put))
        }
        b"get" => {
            let args = op_args(rest, &["limit", "rev", "sort-by", "order"])?;
            let (prefix, from_key) = (has(&args, "prefix"), has(&args, "from-key"));
            let keys = positional_keys(&args, prefix, from_key, "get")?;
            let mut range = Range::new(keys);
            let (mut target, mut order) = (None, None);
            for (name, value) in &args.flags {
                match name.as_str() {
                    "prefix" | "from-key" => {}
                    "limit" => range = range.limit(number_flag(name, value)?),
                    "rev" => range = range.revision(number_flag(name, value)?),
                    "keys-only" => range = range.keys_only(),
                    "count-only" => range = range.count_only(),
                    "sort-by" => {
                        target = Some(match value.as_deref().map(str::to_uppercase).as_deref() {
                            Some("KEY") => SortTarget::Key,
                            Some("CREATE") => SortTarget::Create,
                            Some("MODIFY") => SortTarget::Mod,
                            Some("VALUE") => SortTarget::Value,
                            Some("VERSION") => SortTarget::Version,
                            _ => {
                                return Err(
                                    "--sort-by takes KEY, CREATE, MODIFY, VALUE or VERSION".into(),
                                );
                            }
                        })
                    }
                    "order" => {
                        order = Some(match value.as_deref().map(str::to_uppercase).as_deref() {
                            Some("ASCEND") => SortOrder::Ascend,
                            Some("DESCEND") => SortOrder::Descend,
                            _ => return Err("--order takes ASCEND or DESCEND".into()),
                        })
                    }
                    other => return Err(format!("get has no flag --{other}")),
                }
            }
            if target.is_some() || order.is_some() {
                range = range.sort(
                    target.unwrap_or(SortTarget::Key),
                    order.unwrap_or(SortOrder::None),
                );
            }
            Ok(TxnOp::range(range))
        }
        b"del" | b"delete" => {
            let args = op_args(rest, &[])?;
            let (prefix, from_key) = (has(&args, "prefix"), has(&args, "from-key"));
            let keys = positional_keys(&args, prefix, from_key, "del")?;
            let mut delete = DeleteRange::new(keys);
            for (name, _) in &args.flags {
                match name.as_str() {
                    "prefix" | "from-key" => {}
                    "prev-kv" => delete = delete.prev_kv(),
                    other => return Err(format!("del has no flag --{other}")),
                }
            }
            Ok(TxnOp::delete(delete))
        }
        other => Err(format!("unknown op `{}` (put, get or del)", text(other))),
    }
}

fn has(args: &OpArgs, flag: &str) -> bool {
    args.flags.iter().any(|(name, _)| name == flag)
}

fn positional_keys(args: &OpArgs, prefix: bool, from_key: bool, op: &str) -> Result<Keys, String> {
    let text = |bytes: &Vec<u8>| String::from_utf8_lossy(bytes).to_string();
    match args.positional.as_slice() {
        [key] => keys_of(&text(key), None, prefix, from_key),
        [key, end] if !prefix && !from_key => keys_of(&text(key), Some(&text(end)), false, false),
        _ => return Err(format!("{op} takes KEY [RANGE_END]")),
    }
    .map_err(|failure| failure.message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn etcdctls_example_parses() {
        let txn = parse(
            "mod(\"key1\") > \"0\"\n\nput key1 \"overwrote-key1\"\n\nput key1 \"created-key1\"\nput key2 \"some extra key\"\n",
        )
        .unwrap();
        let expected = Txn::new()
            .when([Compare::mod_revision("key1").gt(0)])
            .and_then([TxnOp::put("key1", "overwrote-key1")])
            .or_else([
                TxnOp::put("key1", "created-key1"),
                TxnOp::put("key2", "some extra key"),
            ]);
        assert_eq!(txn, expected);
    }

    #[test]
    fn every_target_operator_and_op_form_parses() {
        let txn = parse(concat!(
            "value(\"a\") = \"x\\ty\"\n",
            "val(`b`) != `raw\\n`\n",
            "version(\"c\") < \"3\"\n",
            "create(\"d\") = \"0\"\n",
            "lease(\"e\") = \"ff\"\n",
            "\n",
            "get cfg/ --prefix --limit=2 --sort-by=MODIFY --order DESCEND\n",
            "del a z --prev-kv\n",
            "\n",
            "put 'quoted key' v --prev-kv --lease=1a\n",
        ))
        .unwrap();
        let expected = Txn::new()
            .when([
                Compare::value("a").eq(&b"x\ty"[..]),
                Compare::value("b").ne(&b"raw\\n"[..]),
                Compare::version("c").lt(3),
                Compare::create_revision("d").eq(0),
                Compare::lease("e").eq(255),
            ])
            .and_then([
                TxnOp::range(
                    Range::new(Keys::prefix("cfg/"))
                        .limit(2)
                        .sort(SortTarget::Mod, SortOrder::Descend),
                ),
                TxnOp::delete(DeleteRange::new(Keys::between("a", "z")).prev_kv()),
            ])
            .or_else([TxnOp::put_with("quoted key", "v", 0, 0x1a, true)]);
        assert_eq!(txn, expected);
    }

    #[test]
    fn bad_lines_are_refused_with_their_number() {
        for (text, named) in [
            ("bogus(\"a\") = \"1\"\n", "line 1: unknown compare target"),
            ("mod(\"a\") ~ \"1\"\n", "line 1: unknown compare operator"),
            ("mod(\"a\") = \"x\"\n", "line 1: mod compares numbers"),
            ("mod(a) = \"1\"\n", "line 1: a key or value must be quoted"),
            ("\nfrob a\n", "line 2: unknown op"),
            ("\nput a\n", "line 2: put takes KEY VALUE"),
            ("\n\nget a --bogus\n", "line 3: get has no flag --bogus"),
            (
                "\n\n\n\nput a b\n",
                "line 3: a transaction has three sections",
            ),
        ] {
            let failure = parse(text).unwrap_err();
            assert!(
                failure.message.starts_with(named),
                "{text:?}: {}",
                failure.message
            );
        }
    }

    #[test]
    fn trailing_blank_lines_and_empty_sections_are_fine() {
        assert_eq!(parse("\n\n\n\n").unwrap(), Txn::new());
        assert_eq!(
            parse("\nput a b\n").unwrap(),
            Txn::new().and_then([TxnOp::put("a", "b")])
        );
    }
}
