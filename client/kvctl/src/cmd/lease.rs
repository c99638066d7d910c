//! `kvctl lease grant | revoke | keepalive | timetolive (ttl) | list`:
//! etcdctl's lease commands and their output, lease ids in hex (`%016x`)
//! in and out (with or without `0x`), or one JSON object per answer with
//! `-o json`.
//!
//! TTLs: etcd's are whole seconds and etcdctl prints them as integers;
//! here they are milliseconds. A granted TTL prints as an integer when it
//! is a whole number of seconds (`TTL(60s)`, etcdctl's text exactly), and
//! with its fraction otherwise (`TTL(2.5s)`), never rounded: a holder must
//! not read a longer TTL than it has. Remaining time prints rounded down
//! to whole seconds, as etcd computes it. JSON has milliseconds.

use std::time::Duration;

use kvclient::{Client, LeaseLoss};
use serde_json::{Map, Value, json};

use super::{Context, consistency};
use crate::cli::{ConsistencyArg, LeaseCommand};
use crate::exit::{Exit, Failure, LEASE_NOT_FOUND};
use crate::output::insert_bytes;

/// A lease id as etcdctl prints it.
pub fn id_text(id: u64) -> String {
    format!("{id:016x}")
}

/// A granted TTL in seconds: an integer when whole, else with its fraction
/// (trailing zeros dropped): `60`, `2.5`, `2.25`, `2.001`.
pub fn seconds_text(ttl: Duration) -> String {
    let ms = ttl.as_millis();
    let (whole, fraction) = (ms / 1000, ms % 1000);
    if fraction == 0 {
        return whole.to_string();
    }
    let fraction = format!("{fraction:03}");
    format!("{whole}.{}", fraction.trim_end_matches('0'))
}

/// `kvctl lease ...`.
pub async fn run(context: &Context, command: LeaseCommand) -> Result<(), Failure> {
    let client = context.client()?;
    match command {
        LeaseCommand::Grant { ttl, id } => grant(context, &client, ttl, id).await,
        LeaseCommand::Revoke { id } => revoke(context, &client, id).await,
        LeaseCommand::Keepalive { id, once: true } => keep_alive_once(context, &client, id).await,
        LeaseCommand::Keepalive { id, once: false } => keep_alive(context, &client, id).await,
        LeaseCommand::Timetolive {
            id,
            keys,
            consistency,
        } => time_to_live(context, &client, id, keys, consistency).await,
        LeaseCommand::List { consistency } => list(context, &client, consistency).await,
    }
}

async fn grant(
    context: &Context,
    client: &Client,
    ttl: Duration,
    id: Option<u64>,
) -> Result<(), Failure> {
    let granted = match id {
        Some(id) => client.lease_grant_with_id(id, ttl).await,
        None => client.lease_grant(ttl).await,
    }
    .map_err(|err| context.fail(err))?;
    let printer = &context.printer;
    if printer.json() {
        printer.print_json(&json!({
            "id": id_text(granted.id),
            "ttl_ms": millis(granted.ttl),
            "revision": granted.revision,
            "applied_index": granted.applied_index,
        }));
    } else {
        println!(
            "lease {} granted with TTL({}s)",
            id_text(granted.id),
            seconds_text(granted.ttl)
        );
    }
    Ok(())
}

async fn revoke(context: &Context, client: &Client, id: u64) -> Result<(), Failure> {
    let revoked = client
        .lease_revoke(id)
        .await
        .map_err(|err| context.fail(err))?;
    let printer = &context.printer;
    if printer.json() {
        printer.print_json(&json!({
            "id": id_text(id),
            "deleted": revoked.deleted,
            "revision": revoked.revision,
            "applied_index": revoked.applied_index,
        }));
    } else {
        println!("lease {} revoked", id_text(id));
    }
    Ok(())
}

fn print_renewal(context: &Context, id: u64, ttl: Duration, revision: u64) {
    let printer = &context.printer;
    if printer.json() {
        printer.print_json(&json!({
            "id": id_text(id),
            "ttl_ms": millis(ttl),
            "revision": revision,
        }));
    } else {
        println!(
            "lease {} keepalived with TTL({})",
            id_text(id),
            seconds_text(ttl)
        );
    }
}

async fn keep_alive_once(context: &Context, client: &Client, id: u64) -> Result<(), Failure> {
    let renewal = client
        .lease_keep_alive_once(id)
        .await
        .map_err(|err| context.fail(err))?;
    print_renewal(context, id, renewal.ttl, renewal.revision);
    Ok(())
}

/// Renews until the lease is lost (or the process is interrupted).
async fn keep_alive(context: &Context, client: &Client, id: u64) -> Result<(), Failure> {
    let mut keeper = client
        .keep_alive(id)
        .await
        .map_err(|err| context.fail(err))?;
    let loss = loop {
        match keeper.renewed().await {
            Ok(renewal) => print_renewal(context, id, renewal.ttl, renewal.revision),
            Err(loss) => break loss,
        }
    };
    let printer = &context.printer;
    match loss {
        LeaseLoss::Gone => {
            if printer.json() {
                printer.print_json(&json!({ "id": id_text(id), "ttl_ms": 0 }));
            } else {
                println!("lease {} expired or revoked.", id_text(id));
            }
            let failure = Failure::new(Exit::NotFound, LEASE_NOT_FOUND);
            Err(if printer.json() {
                failure.json_printed()
            } else {
                failure
            })
        }
        LeaseLoss::Unrenewed { ttl, .. } => Err(Failure::new(
            Exit::Unavailable,
            format!(
                "lease {}: no renewal was acknowledged for a whole TTL ({}s): it may have \
                 expired (tried {})",
                id_text(id),
                seconds_text(ttl),
                context.endpoints.join(", ")
            ),
        )),
        LeaseLoss::Failed { message } => Err(Failure::new(
            Exit::Unavailable,
            format!("lease {}: the keep-alive stopped: {message}", id_text(id)),
        )),
    }
}

async fn time_to_live(
    context: &Context,
    client: &Client,
    id: u64,
    keys: bool,
    read: ConsistencyArg,
) -> Result<(), Failure> {
    let answer = client
        .lease_time_to_live_with(id, keys, Some(consistency(read)))
        .await
        .map_err(|err| context.fail(err))?;
    let printer = &context.printer;
    let Some(ttl) = answer else {
        if printer.json() {
            printer.print_json(&json!({
                "id": id_text(id),
                "found": false,
                "ttl_ms": -1,
                "granted_ttl_ms": 0,
            }));
        } else {
            println!("lease {} already expired", id_text(id));
        }
        let failure = Failure::new(Exit::NotFound, LEASE_NOT_FOUND);
        return Err(if printer.json() {
            failure.json_printed()
        } else {
            failure
        });
    };
    if printer.json() {
        let mut object = Map::new();
        object.insert("id".into(), id_text(id).into());
        object.insert("found".into(), true.into());
        object.insert("granted_ttl_ms".into(), millis(ttl.granted).into());
        object.insert("ttl_ms".into(), millis(ttl.remaining).into());
        if keys {
            let keys: Vec<Value> = ttl
                .keys
                .iter()
                .map(|key| {
                    let mut object = Map::new();
                    insert_bytes(&mut object, "key", key);
                    Value::Object(object)
                })
                .collect();
            object.insert("keys".into(), keys.into());
        }
        object.insert("revision".into(), ttl.revision.into());
        object.insert("applied_index".into(), ttl.applied_index.into());
        printer.print_json(&Value::Object(object));
        return Ok(());
    }
    let mut line = format!(
        "lease {} granted with TTL({}s), remaining({}s)",
        id_text(id),
        seconds_text(ttl.granted),
        ttl.remaining.as_secs()
    );
    if keys {
        let names: Vec<String> = ttl.keys.iter().map(|key| printer.bytes(key)).collect();
        line.push_str(&format!(", attached keys([{}])", names.join(" ")));
    }
    println!("{line}");
    Ok(())
}

async fn list(context: &Context, client: &Client, read: ConsistencyArg) -> Result<(), Failure> {
    let leases = client
        .lease_leases_with(Some(consistency(read)))
        .await
        .map_err(|err| context.fail(err))?;
    let printer = &context.printer;
    if printer.json() {
        let ids: Vec<String> = leases.iter().map(|id| id_text(*id)).collect();
        printer.print_json(&json!({ "count": leases.len(), "leases": ids }));
    } else {
        println!("found {} leases", leases.len());
        for id in leases {
            println!("{}", id_text(id));
        }
    }
    Ok(())
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttls_print_whole_seconds_as_etcdctl_and_fractions_exactly() {
        assert_eq!(seconds_text(Duration::from_secs(60)), "60");
        assert_eq!(seconds_text(Duration::from_millis(2_500)), "2.5");
        assert_eq!(seconds_text(Duration::from_millis(2_250)), "2.25");
        assert_eq!(seconds_text(Duration::from_millis(2_001)), "2.001");
        assert_eq!(seconds_text(Duration::from_millis(999)), "0.999");
        assert_eq!(seconds_text(Duration::ZERO), "0");
    }

    #[test]
    fn ids_print_as_etcdctl_prints_them() {
        assert_eq!(id_text(0x2a), "000000000000002a");
        assert_eq!(id_text(0x694d_7a1c_6f0e_2a05), "694d7a1c6f0e2a05");
    }
}
