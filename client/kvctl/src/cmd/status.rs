//! `kvctl status`: every member's status, asked concurrently — the
//! endpoints first, then every member their answers name (up to
//! [`STATUS_MEMBERS_MAX`]) — merged into one row per member: role, term,
//! last log index, applied index and the leader's view of its lag.

use std::collections::BTreeMap;
use std::time::Duration;

use kvclient::kvproto::cluster::v1 as cpb;
use serde_json::{Value, json};

use super::Context;
use crate::exit::{Exit, Failure};
use crate::output::{Printer, Style};

/// Longest wait for one member's status in `status` (a member that does not
/// answer by then is shown as unreachable).
pub const STATUS_MEMBER_TIMEOUT: Duration = Duration::from_secs(3);
/// Most members `status` asks (the endpoints plus members they name).
pub const STATUS_MEMBERS_MAX: usize = 64;

/// Every answer, by the address asked.
type Answers = Vec<(String, Result<cpb::StatusResponse, String>)>;

/// One member's row of `status`.
#[derive(Debug, Default, Clone)]
struct Row {
    address: String,
    /// Its own answer (its self row), if it answered.
    own: Option<cpb::MemberStatus>,
    /// Why it did not answer.
    error: Option<String>,
    /// The leader's view of its lag.
    lag: Option<u64>,
    voter: Option<bool>,
}

/// The merged view: members by id, the leader (0: none known), the cluster.
#[derive(Debug)]
struct View {
    rows: BTreeMap<u64, Row>,
    leader_id: u64,
    cluster_id: u64,
}

fn role_name(role: i32) -> &'static str {
    match cpb::Role::try_from(role) {
        Ok(cpb::Role::Leader) => "leader",
        Ok(cpb::Role::Follower) => "follower",
        Ok(cpb::Role::Candidate) => "candidate",
        Ok(cpb::Role::Learner) => "learner",
        _ => "unknown",
    }
}

/// Asks one member for its status.
async fn member_status(context: &Context, address: &str) -> Result<cpb::StatusResponse, String> {
    let timeout = context.timeout.min(STATUS_MEMBER_TIMEOUT);
    let client = context
        .builder(&[address.to_string()])
        .operation_timeout(timeout)
        .request_timeout(timeout)
        .connect_timeout(timeout)
        .attempts(2)
        .build()
        .map_err(|err| err.to_string())?;
    client.status().await.map_err(|err| err.to_string())
}

/// `kvctl status`.
pub async fn run(context: &Context) -> Result<(), Failure> {
    let answers = ask_all(context).await;
    if answers.iter().all(|(_, r)| r.is_err()) {
        let reasons: Vec<String> = answers
            .iter()
            .map(|(a, r)| format!("{a}: {}", r.as_ref().err().map_or("", String::as_str)))
            .collect();
        return Err(Failure::new(
            Exit::Unavailable,
            format!(
                "cluster unavailable: no member answered (tried {}): {}",
                context.endpoints.join(", "),
                reasons.join("; ")
            ),
        ));
    }
    let view = merge(&answers);
    if context.printer.json() {
        print_json(&context.printer, &view);
    } else {
        print_table(&context.printer, &view);
    }
    Ok(())
}

/// Asks the endpoints, then every member their answers name that was not
/// asked yet, batch by batch, up to [`STATUS_MEMBERS_MAX`] addresses.
async fn ask_all(context: &Context) -> Answers {
    let mut addresses: Vec<String> = Vec::new();
    for endpoint in &context.endpoints {
        if !addresses.contains(endpoint) {
            addresses.push(endpoint.clone());
        }
    }
    let mut answers = Answers::new();
    let mut next = 0;
    while next < addresses.len() && next < STATUS_MEMBERS_MAX {
        // Ask the next batch of not-yet-asked addresses concurrently.
        let batch: Vec<String> = addresses[next..].to_vec();
        next = addresses.len();
        let results = futures_join(context, &batch).await;
        for (address, result) in batch.into_iter().zip(results) {
            if let Ok(response) = &result {
                for m in &response.members {
                    let Some(member) = &m.member else { continue };
                    if !member.client_addr.is_empty() && !addresses.contains(&member.client_addr) {
                        addresses.push(member.client_addr.clone());
                    }
                }
            }
            answers.push((address, result));
        }
    }
    answers
}

/// One row per member from every answer; a member that did not answer
/// itself gets the error of its address (or "not asked").
fn merge(answers: &Answers) -> View {
    let mut rows: BTreeMap<u64, Row> = BTreeMap::new();
    let mut leader_id = 0;
    // Every member of one cluster reports the same id; the first answer's.
    let cluster_id = answers
        .iter()
        .find_map(|(_, r)| r.as_ref().ok()?.header.as_ref().map(|h| h.cluster_id))
        .unwrap_or(0);
    let mut errors_by_address = BTreeMap::new();
    for (address, result) in answers {
        let response = match result {
            Ok(response) => response,
            Err(err) => {
                errors_by_address.insert(address.clone(), err.clone());
                continue;
            }
        };
        let header_leader = response.header.as_ref().map_or(0, |h| h.leader_id);
        for m in &response.members {
            let Some(member) = &m.member else { continue };
            let row = rows.entry(member.id).or_default();
            if row.address.is_empty() {
                row.address = member.client_addr.clone();
            }
            row.voter = Some(member.voter);
            if m.is_self {
                row.own = Some(m.clone());
                row.address = address.clone();
                if m.role == cpb::Role::Leader as i32 {
                    leader_id = member.id;
                }
            }
            if m.lag_entries.is_some() {
                row.lag = m.lag_entries;
            }
        }
        if leader_id == 0 {
            leader_id = header_leader;
        }
    }
    for row in rows.values_mut() {
        if row.own.is_none() {
            row.error = Some(
                errors_by_address
                    .get(&row.address)
                    .cloned()
                    .unwrap_or_else(|| "not asked".into()),
            );
        }
    }
    View {
        rows,
        leader_id,
        cluster_id,
    }
}

fn print_json(printer: &Printer, view: &View) {
    let leader_id = view.leader_id;
    let members: Vec<Value> = view
        .rows
        .iter()
        .map(|(id, row)| {
            let own = row.own.as_ref();
            json!({
                "id": id,
                "address": row.address,
                "reachable": own.is_some(),
                "role": own.map_or("unreachable", |m| role_name(m.role)),
                "voter": row.voter,
                "leader": *id == leader_id,
                "term": own.and_then(|m| m.term),
                "last_log_index": own.and_then(|m| m.last_log_index),
                "applied_index": own.and_then(|m| m.applied_index),
                "lag": row.lag,
                "error": row.error,
            })
        })
        .collect();
    printer.print_json(&json!({
        "cluster_id": format!("{:016x}", view.cluster_id),
        "leader": (leader_id != 0).then_some(leader_id),
        "members": members,
    }));
}

fn print_table(printer: &Printer, view: &View) {
    let leader_id = view.leader_id;
    let field = |v: Option<u64>| v.map_or_else(|| "-".to_string(), |v| v.to_string());
    let table: Vec<Vec<String>> = view
        .rows
        .iter()
        .map(|(id, row)| {
            let own = row.own.as_ref();
            let id_text = if *id == leader_id {
                printer.paint(Style::Good, &format!("{id}*"))
            } else {
                id.to_string()
            };
            let role = own.map_or_else(
                || printer.paint(Style::Bad, "unreachable"),
                |m| {
                    let name = role_name(m.role);
                    if m.role == cpb::Role::Leader as i32 {
                        printer.paint(Style::Good, name)
                    } else {
                        name.to_string()
                    }
                },
            );
            vec![
                id_text,
                row.address.clone(),
                role,
                field(own.and_then(|m| m.term)),
                field(own.and_then(|m| m.last_log_index)),
                field(own.and_then(|m| m.applied_index)),
                field(row.lag),
            ]
        })
        .collect();
    printer.print_table(
        &[
            "id", "address", "role", "term", "last log", "applied", "lag",
        ],
        &table,
    );
    if leader_id == 0 {
        println!("{}", printer.paint(Style::Bad, "no leader known"));
    } else {
        println!("* leader: member {leader_id}");
    }
    println!("cluster {:016x}", view.cluster_id);
    for (id, row) in &view.rows {
        if let Some(error) = &row.error {
            eprintln!("member {id} ({}): {error}", row.address);
        }
    }
}

/// Every address's status, asked concurrently.
async fn futures_join(
    context: &Context,
    addresses: &[String],
) -> Vec<Result<cpb::StatusResponse, String>> {
    let mut set = tokio::task::JoinSet::new();
    for (i, address) in addresses.iter().enumerate() {
        let context = Context {
            endpoints: context.endpoints.clone(),
            timeout: context.timeout,
            printer: context.printer,
            tls: context.tls.clone(),
            token: context.token.clone(),
        };
        let address = address.clone();
        set.spawn(async move { (i, member_status(&context, &address).await) });
    }
    let mut results: Vec<Result<cpb::StatusResponse, String>> =
        vec![Err("no answer".to_string()); addresses.len()];
    while let Some(joined) = set.join_next().await {
        match joined {
            Ok((i, result)) => results[i] = result,
            Err(err) => eprintln!("status task failed: {err}"),
        }
    }
    results
}
