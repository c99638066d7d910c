//! `kvctl del KEY [--if-mod-revision N]`: exit 1 if nothing was deleted.

use serde_json::{Map, Value};

use super::{Context, check_key};
use crate::exit::{Exit, Failure};
use crate::output::{Style, insert_bytes};

/// `kvctl del`.
pub async fn run(
    context: &Context,
    key: String,
    if_mod_revision: Option<u64>,
) -> Result<(), Failure> {
    let key = check_key("key", &key)?;
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
