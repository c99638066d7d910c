//! `kvctl expire KEY TTL` and `kvctl persist KEY` (drop the TTL): exit 1
//! if the key is absent.

use std::time::Duration;

use serde_json::{Map, Value};

use super::{Context, check_key};
use crate::exit::{Exit, Failure};
use crate::output::{Style, insert_bytes, millis, ttl_text};

/// `expire` (with a TTL) and `persist` (without).
pub async fn run(context: &Context, key: String, ttl: Option<Duration>) -> Result<(), Failure> {
    let key = check_key("key", &key)?;
    let client = context.client()?;
    let written = match ttl {
        Some(ttl) => client.expire(key.clone(), ttl).await,
        None => client.persist(key.clone()).await,
    }
    .map_err(|err| context.fail(err))?;
    let printer = &context.printer;
    if printer.json() {
        let mut object = Map::new();
        insert_bytes(&mut object, "key", &key);
        object.insert("found".into(), written.is_some().into());
        if let Some(written) = written {
            object.insert("revision".into(), written.revision.into());
            object.insert("seq".into(), written.seq.into());
            object.insert("applied_index".into(), written.applied_index.into());
        }
        object.insert("ttl_ms".into(), millis(ttl));
        printer.print_json(&Value::Object(object));
    }
    let Some(written) = written else {
        return Err(Failure::new(
            Exit::NotFound,
            format!("key not found: {}", printer.bytes(&key)),
        )
        .json_printed());
    };
    if !printer.json() {
        let what = match ttl {
            Some(ttl) => format!("expires in {}", ttl_text(Some(ttl))),
            None => "has no TTL now".to_string(),
        };
        println!(
            "{} {} {what} (revision {})",
            printer.paint(Style::Good, "OK"),
            printer.bytes(&key),
            written.revision
        );
    }
    Ok(())
}
