//! `kvctl compact REV`: moves the start of the change history's window to
//! `REV` (etcd's compact); prints `compacted revision REV` as etcdctl does.

use serde_json::{Map, Value};

use super::Context;
use crate::exit::Failure;

/// `compact`.
pub async fn run(context: &Context, revision: u64) -> Result<(), Failure> {
    let client = context.client()?;
    let store_revision = client
        .compact(revision)
        .await
        .map_err(|err| context.fail(err))?;
    let printer = &context.printer;
    if printer.json() {
        let mut object = Map::new();
        object.insert("compact_revision".into(), revision.into());
        object.insert("revision".into(), store_revision.into());
        printer.print_json(&Value::Object(object));
    } else {
        println!("compacted revision {revision}");
    }
    Ok(())
}
