//! `kvctl put KEY VALUE`: the value from the argument, `@FILE` or `-`
//! (standard input), read up to [`INPUT_VALUE_BYTES_MAX`]; optional TTL,
//! `--if-mod-revision` (old name `--if-version`), `--if-absent` and
//! `--lease ID` (sent as a one-op transaction; a missing lease exits 1).

use std::io::Read;

use kvclient::PutOptions;
use prost::bytes::Bytes;
use serde_json::{Map, Value};

use super::{Context, check_key};
use crate::cli::PutArgs;
use crate::exit::Failure;
use crate::output::{Style, insert_bytes, millis};

/// Largest value kvctl reads from an argument, file or standard input: the
/// highest value limit a cluster can be configured with (DESIGN §4: 8 MiB).
/// Not the cluster's limit (`kvproto::VALUE_SIZE_BYTES_MAX`, 1 MiB by
/// default): the cluster checks its own, lower limit and names it.
pub const INPUT_VALUE_BYTES_MAX: usize = 8 * 1024 * 1024;

fn value_too_large(source: &str, length: usize) -> Failure {
    Failure::usage(format!(
        "value ({source}) is {length} bytes or more, over INPUT_VALUE_BYTES_MAX ({INPUT_VALUE_BYTES_MAX} bytes), the most kvctl reads"
    ))
}

/// Reads at most [`INPUT_VALUE_BYTES_MAX`] bytes from `input`.
fn read_bounded(input: impl Read, source: &str) -> Result<Vec<u8>, Failure> {
    let mut bytes = Vec::new();
    input
        .take(INPUT_VALUE_BYTES_MAX as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(|err| Failure::usage(format!("cannot read the value from {source}: {err}")))?;
    if bytes.len() > INPUT_VALUE_BYTES_MAX {
        return Err(value_too_large(source, bytes.len()));
    }
    Ok(bytes)
}

/// The value of `put`: text, `@FILE` or `-` (standard input).
fn value_of(argument: &str) -> Result<Bytes, Failure> {
    let bytes = if argument == "-" {
        read_bounded(std::io::stdin().lock(), "standard input")?
    } else if let Some(path) = argument.strip_prefix('@') {
        let file = std::fs::File::open(path)
            .map_err(|err| Failure::usage(format!("cannot open value file {path:?}: {err}")))?;
        read_bounded(file, path)?
    } else {
        if argument.len() > INPUT_VALUE_BYTES_MAX {
            return Err(value_too_large("argument", argument.len()));
        }
        argument.as_bytes().to_vec()
    };
    Ok(Bytes::from(bytes))
}

/// `kvctl put`.
pub async fn run(context: &Context, args: PutArgs) -> Result<(), Failure> {
    let key = check_key("key", &args.key)?;
    let value = value_of(&args.value)?;
    let mut options = PutOptions::default();
    if let Some(ttl) = args.ttl {
        options = options.ttl(ttl);
    }
    if let Some(revision) = args.if_mod_revision {
        options = options.if_mod_revision(revision);
    }
    if args.if_absent {
        options = options.if_absent();
    }
    if let Some(lease) = args.lease {
        options = options.lease(lease);
    }
    let client = context.client()?;
    let written = client
        .put_with(key.clone(), value.clone(), options)
        .await
        .map_err(|err| context.fail(err))?;
    let printer = &context.printer;
    if printer.json() {
        let mut object = Map::new();
        insert_bytes(&mut object, "key", &key);
        object.insert("revision".into(), written.revision.into());
        object.insert("seq".into(), written.seq.into());
        object.insert("applied_index".into(), written.applied_index.into());
        object.insert("value_bytes".into(), value.len().into());
        object.insert("ttl_ms".into(), millis(args.ttl));
        object.insert(
            "lease".into(),
            args.lease
                .map_or(Value::Null, |id| super::lease::id_text(id).into()),
        );
        printer.print_json(&Value::Object(object));
    } else {
        println!(
            "{} {} revision {} ({} bytes)",
            printer.paint(Style::Good, "OK"),
            printer.bytes(&key),
            written.revision,
            value.len()
        );
    }
    Ok(())
}
