//! `kvctl watch KEY [RANGE_END] [--prefix] [--rev N] [--prev-kv] [--count
//! N]`: prints each change as etcdctl watch does (`PUT` or `DELETE`, then
//! with `--prev-kv` the previous key and value, then the key and value),
//! or one JSON object per event with `-o json`. The watch resumes on
//! another member by itself (kvclient's `WatchStream`); the command runs
//! until `--count` events were printed, the stream fails, or it is
//! interrupted.

use std::io::Write;

use kvclient::{EventKind, Watch, WatchEvent};
use serde_json::{Map, Value};
use tokio_stream::StreamExt;

use super::{Context, check_key};
use crate::cli::WatchArgs;
use crate::exit::Failure;
use crate::output::{hex, kv_json};

/// `watch`.
pub async fn run(context: &Context, args: WatchArgs) -> Result<(), Failure> {
    let key = check_key("key", &args.key)?;
    let mut watch = if args.prefix {
        Watch::prefix(key)
    } else if let Some(end) = &args.range_end {
        Watch::range(key, Some(check_key("range_end", end)?))
    } else {
        Watch::key(key)
    };
    watch = watch.start_revision(args.rev);
    if args.prev_kv {
        watch = watch.prev_kv();
    }
    let client = context.client()?;
    let mut stream = client.watch(watch).await.map_err(|err| context.fail(err))?;
    let mut printed = 0;
    while let Some(batch) = stream.next().await {
        let batch = batch.map_err(|err| context.fail(err))?;
        for event in &batch.events {
            print_event(context, event)
                .map_err(|err| Failure::usage(format!("cannot write standard output: {err}")))?;
            printed += 1;
            if args.count != 0 && printed >= args.count {
                return Ok(());
            }
        }
    }
    Ok(())
}

fn kind_name(kind: EventKind) -> &'static str {
    match kind {
        EventKind::Put => "PUT",
        EventKind::Delete => "DELETE",
    }
}

fn print_event(context: &Context, event: &WatchEvent) -> std::io::Result<()> {
    let printer = &context.printer;
    if printer.json() {
        let mut object = Map::new();
        object.insert("type".into(), kind_name(event.kind).into());
        object.insert("kv".into(), kv_json(&event.kv));
        if let Some(prev) = &event.prev_kv {
            object.insert("prev_kv".into(), kv_json(prev));
        }
        printer.print_json(&Value::Object(object));
        return Ok(());
    }
    let mut out = std::io::stdout().lock();
    writeln!(out, "{}", kind_name(event.kind))?;
    let kvs = event.prev_kv.iter().chain(std::iter::once(&event.kv));
    for kv in kvs {
        for bytes in [&kv.key, &kv.value] {
            if printer.hex {
                out.write_all(hex(bytes).as_bytes())?;
            } else {
                out.write_all(bytes)?;
            }
            out.write_all(b"\n")?;
        }
    }
    out.flush()
}
