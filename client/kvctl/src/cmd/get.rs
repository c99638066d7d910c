//! `kvctl get KEY`: the value (raw bytes on a terminal, hex with `--hex`,
//! or JSON), exit 1 if the key is absent. With a range flag (`--prefix`,
//! `--from-key`, `RANGE_END`, `--rev`, `--limit`, `--count-only`,
//! `--keys-only`, `--sort-by`, `--order`) it reads a range in one consistent
//! state and prints it as etcdctl does: each key on a line, then its value
//! on a line; `--count-only` prints the count. An empty range exits 0.

use kvclient::txn::{Keys, Range, SortOrder, SortTarget};
use serde_json::{Map, Value};

use super::{Context, check_key, consistency};
use crate::cli::{GetArgs, OrderArg, SortByArg};
use crate::exit::{Exit, Failure};
use crate::output::{insert_bytes, insert_revisions, kv_json, millis};

/// The keys a range or delete names: KEY alone, a prefix, `[KEY, END)` or
/// every key from KEY on.
pub(crate) fn keys_of(
    key: &str,
    range_end: Option<&str>,
    prefix: bool,
    from_key: bool,
) -> Result<Keys, Failure> {
    let key = check_key("key", key)?;
    Ok(match (range_end, prefix, from_key) {
        (Some(end), _, _) => Keys::between(key, check_key("range_end", end)?),
        (None, true, _) => Keys::prefix(key),
        (None, false, true) => Keys::from_key(key),
        (None, false, false) => Keys::key(key),
    })
}

/// The range `get`'s flags describe.
pub(crate) fn range_of(args: &GetArgs) -> Result<Range, Failure> {
    let keys = keys_of(
        &args.key,
        args.range_end.as_deref(),
        args.prefix,
        args.from_key,
    )?;
    let mut range = Range::new(keys).limit(args.limit).revision(args.rev);
    if args.sort_by.is_some() || args.order.is_some() {
        let target = match args.sort_by.unwrap_or(SortByArg::Key) {
            SortByArg::Key => SortTarget::Key,
            SortByArg::Create => SortTarget::Create,
            SortByArg::Modify => SortTarget::Mod,
            SortByArg::Value => SortTarget::Value,
            SortByArg::Version => SortTarget::Version,
        };
        let order = match args.order {
            None => SortOrder::None,
            Some(OrderArg::Ascend) => SortOrder::Ascend,
            Some(OrderArg::Descend) => SortOrder::Descend,
        };
        range = range.sort(target, order);
    }
    if args.keys_only {
        range = range.keys_only();
    }
    if args.count_only {
        range = range.count_only();
    }
    Ok(range.consistency(consistency(args.consistency)))
}

/// `kvctl get` of a range.
async fn run_range(context: &Context, args: &GetArgs) -> Result<(), Failure> {
    let range = range_of(args)?;
    let client = context.client()?;
    let result = client
        .range(&range)
        .await
        .map_err(|err| context.fail(err))?;
    let printer = &context.printer;
    if printer.json() {
        let mut object = Map::new();
        object.insert("revision".into(), result.revision.into());
        object.insert("applied_index".into(), result.applied_index.into());
        object.insert(
            "kvs".into(),
            Value::Array(result.kvs.iter().map(kv_json).collect()),
        );
        object.insert("more".into(), result.more.into());
        object.insert("count".into(), result.count.into());
        printer.print_json(&Value::Object(object));
    } else if args.count_only {
        println!("{}", result.count);
    } else {
        printer
            .print_kvs(&result.kvs)
            .map_err(|err| Failure::usage(format!("cannot write standard output: {err}")))?;
    }
    Ok(())
}

/// `kvctl get`.
pub async fn run(context: &Context, args: GetArgs) -> Result<(), Failure> {
    if args.is_range() {
        return run_range(context, &args).await;
    }
    let arg = args.consistency;
    let key = check_key("key", &args.key)?;
    let client = context.client()?;
    let entry = client
        .get_with(key.clone(), consistency(arg))
        .await
        .map_err(|err| context.fail(err))?;
    let printer = &context.printer;
    let Some(entry) = entry else {
        if printer.json() {
            let mut object = Map::new();
            insert_bytes(&mut object, "key", &key);
            object.insert("found".into(), Value::Bool(false));
            printer.print_json(&Value::Object(object));
        }
        return Err(Failure::new(
            Exit::NotFound,
            format!("key not found: {}", printer.bytes(&key)),
        )
        .json_printed());
    };
    if printer.json() {
        let mut object = Map::new();
        insert_bytes(&mut object, "key", &key);
        object.insert("found".into(), Value::Bool(true));
        insert_bytes(&mut object, "value", &entry.value);
        insert_revisions(&mut object, &entry.revisions);
        object.insert("seq".into(), entry.seq.into());
        object.insert("ttl_ms".into(), millis(entry.ttl_left));
        object.insert("revision".into(), entry.revision.into());
        object.insert("applied_index".into(), entry.applied_index.into());
        printer.print_json(&Value::Object(object));
    } else if printer.hex {
        println!("{}", printer.bytes(&entry.value));
    } else {
        printer
            .print_raw(&entry.value)
            .map_err(|err| Failure::usage(format!("cannot write standard output: {err}")))?;
    }
    Ok(())
}
