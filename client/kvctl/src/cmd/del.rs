//! `kvctl del KEY [--if-mod-revision N]`: exit 1 if nothing was deleted.
//! With a range flag (`--prefix`, `--from-key`, `RANGE_END`, `--prev-kv`)
//! it deletes every key of the range at one revision and prints how many,
//! then with `--prev-kv` each deleted key and value, as etcdctl does (exit
//! 0 even when the range was empty).

use kvclient::txn::DeleteRange;
use serde_json::{Map, Value};

use super::get::keys_of;
use super::{Context, check_key};
use crate::cli::DelArgs;
use crate::exit::{Exit, Failure};
use crate::output::{Style, insert_bytes, kv_json};

/// `kvctl del` of a range.
async fn run_range(context: &Context, args: &DelArgs) -> Result<(), Failure> {
    let keys = keys_of(
        &args.key,
        args.range_end.as_deref(),
        args.prefix,
        args.from_key,
    )?;
    let mut delete = DeleteRange::new(keys);
    if args.prev_kv {
        delete = delete.prev_kv();
    }
    let client = context.client()?;
    let deleted = client
        .delete_range(&delete)
        .await
        .map_err(|err| context.fail(err))?;
    let printer = &context.printer;
    if printer.json() {
        let mut object = Map::new();
        object.insert("deleted".into(), deleted.deleted.into());
        object.insert(
            "prev_kvs".into(),
            Value::Array(deleted.prev_kvs.iter().map(kv_json).collect()),
        );
        object.insert("revision".into(), deleted.revision.into());
        object.insert("applied_index".into(), deleted.applied_index.into());
        printer.print_json(&Value::Object(object));
    } else {
        println!("{}", deleted.deleted);
        printer
            .print_kvs(&deleted.prev_kvs)
            .map_err(|err| Failure::usage(format!("cannot write standard output: {err}")))?;
    }
    Ok(())
}

/// `kvctl del`.
pub async fn run(context: &Context, args: DelArgs) -> Result<(), Failure> {
    if args.is_range() {
        return run_range(context, &args).await;
    }
    let if_mod_revision = args.if_mod_revision;
    let key = check_key("key", &args.key)?;
    let client = context.client()?;
    let removed = match if_mod_revision {
        Some(revision) => client.delete_if_mod_revision(key.clone(), revision).await,
        None => client.delete(key.clone()).await,
    }
    .map_err(|err| context.fail(err))?;
    let printer = &context.printer;
    if printer.json() {
        let mut object = Map::new();
        insert_bytes(&mut object, "key", &key);
        object.insert("deleted".into(), removed.found.into());
        object.insert("revision".into(), removed.revision.into());
        object.insert("applied_index".into(), removed.applied_index.into());
        printer.print_json(&Value::Object(object));
    }
    if !removed.found {
        return Err(Failure::new(
            Exit::NotFound,
            format!("key not found: {} (nothing deleted)", printer.bytes(&key)),
        )
        .json_printed());
    }
    if !printer.json() {
        println!(
            "{} deleted {}",
            printer.paint(Style::Good, "OK"),
            printer.bytes(&key)
        );
    }
    Ok(())
}
