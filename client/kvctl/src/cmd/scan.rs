//! `kvctl scan`: by `--prefix`, by `--from`/`--to` or everything, in pages
//! of [`SCAN_PAGE_ENTRIES`], up to `--limit` entries; `--keys-only`.

use kvclient::Scan;
use prost::bytes::Bytes;
use serde_json::{Map, Value, json};
use tokio_stream::StreamExt as _;

use super::{Context, check_key, consistency};
use crate::cli::ScanArgs;
use crate::exit::Failure;
use crate::output::{insert_bytes, insert_revisions, millis, ttl_text};

/// Scan page size kvctl asks for.
pub const SCAN_PAGE_ENTRIES: u32 = 1000;

/// `kvctl scan`.
pub async fn run(context: &Context, args: ScanArgs) -> Result<(), Failure> {
    let mut spec = match (&args.prefix, &args.from, &args.to) {
        (Some(prefix), _, _) => Scan::prefix(check_key("--prefix", prefix)?),
        (None, None, None) => Scan::all(),
        (None, from, to) => {
            let from = match from {
                Some(from) => check_key("--from", from)?,
                None => Bytes::new(),
            };
            let to = to.as_deref().map(|to| check_key("--to", to)).transpose()?;
            Scan::range(from, to)
        }
    };
    let limit = args.limit.unwrap_or(u64::MAX);
    let page = u32::try_from(limit).map_or(SCAN_PAGE_ENTRIES, |l| l.clamp(1, SCAN_PAGE_ENTRIES));
    spec = spec
        .page_size(page)
        .consistency(consistency(args.consistency));
    if args.keys_only {
        spec = spec.keys_only();
    }
    let client = context.client()?;
    let mut stream = client.scan(spec);
    let mut entries = Vec::new();
    while (entries.len() as u64) < limit {
        match stream.next().await {
            Some(Ok(entry)) => entries.push(entry),
            Some(Err(err)) => return Err(context.fail(err)),
            None => break,
        }
    }
    let printer = &context.printer;
    if printer.json() {
        let list: Vec<Value> = entries
            .iter()
            .map(|e| {
                let mut object = Map::new();
                insert_bytes(&mut object, "key", &e.key);
                if !args.keys_only {
                    insert_bytes(&mut object, "value", &e.value);
                }
                insert_revisions(&mut object, &e.revisions);
                object.insert("seq".into(), e.seq.into());
                object.insert("ttl_ms".into(), millis(e.ttl_left));
                Value::Object(object)
            })
            .collect();
        printer.print_json(&json!({ "count": list.len(), "entries": list }));
        return Ok(());
    }
    let mut headers = vec!["key", "mod_rev", "version", "ttl"];
    if !args.keys_only {
        headers.push("value");
    }
    let rows: Vec<Vec<String>> = entries
        .iter()
        .map(|e| {
            let mut row = vec![
                printer.bytes(&e.key),
                e.revisions.mod_revision.to_string(),
                e.revisions.version.to_string(),
                ttl_text(e.ttl_left),
            ];
            if !args.keys_only {
                row.push(printer.bytes(&e.value));
            }
            row
        })
        .collect();
    printer.print_table(&headers, &rows);
    eprintln!("{} key(s)", rows.len());
    Ok(())
}
