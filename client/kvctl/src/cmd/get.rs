//! `kvctl get KEY`: the value (raw bytes on a terminal, hex with `--hex`,
//! or JSON), exit 1 if the key is absent.

use serde_json::{Map, Value};

use super::{Context, check_key, consistency};
use crate::cli::ConsistencyArg;
use crate::exit::{Exit, Failure};
use crate::output::{insert_bytes, insert_revisions, millis};

/// `kvctl get`.
pub async fn run(context: &Context, key: String, arg: ConsistencyArg) -> Result<(), Failure> {
    let key = check_key("key", &key)?;
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
