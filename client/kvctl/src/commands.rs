//! The commands' work: each one calls kvclient and prints its result as a
//! table or one JSON object; every failure becomes a [`Failure`] with its
//! exit code. `bench` lives in [`crate::bench`].

use std::collections::BTreeMap;
use std::io::Read;
use std::path::Path;
use std::time::Duration;

use kvclient::kvproto::cluster::v1 as cpb;
use kvclient::{Client, Consistency, PutOptions, Scan};
use prost::bytes::Bytes;
use serde_json::{Map, Value, json};
use tokio_stream::StreamExt as _;

use crate::cli::{Cli, Command, ConsistencyArg, MemberCommand, PutArgs, ScanArgs, SnapshotCommand};
use crate::exit::{Exit, Failure};
use crate::output::{Printer, Style, insert_bytes, millis, ttl_text};
use kvnode::snapshot::backup::{ArchiveWriter, verify_archive};

/// Largest key, in bytes: the cluster's limit (DESIGN §4), checked before
/// sending so the message comes at once.
pub use kvproto::KEY_SIZE_BYTES_MAX;
/// Largest value kvctl reads from an argument, file or standard input: the
/// highest value limit a cluster can be configured with (DESIGN §4: 8 MiB);
/// the cluster's own, lower limit is checked by the cluster.
pub const VALUE_SIZE_BYTES_MAX: usize = 8 * 1024 * 1024;
/// Longest wait for one member's status in `status` (a member that does not
/// answer by then is shown as unreachable).
pub const STATUS_MEMBER_TIMEOUT: Duration = Duration::from_secs(3);
/// Most members `status` asks (the endpoints plus members they name).
pub const STATUS_MEMBERS_MAX: usize = 64;
/// Scan page size kvctl asks for.
pub const SCAN_PAGE_ENTRIES: u32 = 1000;

/// What a command needs besides its arguments.
#[derive(Debug)]
pub struct Context {
    /// The parsed command line.
    pub endpoints: Vec<String>,
    /// How long a command may take.
    pub timeout: Duration,
    /// How to print.
    pub printer: Printer,
    /// TLS settings (`--cacert`, `--cert`, `--key`).
    pub tls: Option<kvclient::ClientTls>,
    /// Bearer token (`--token`).
    pub token: Option<String>,
}

impl Context {
    /// A client builder for `endpoints` with the TLS settings and token.
    pub fn builder(&self, endpoints: &[String]) -> kvclient::ClientBuilder {
        let mut builder = Client::builder(endpoints.iter().cloned());
        if let Some(tls) = &self.tls {
            builder = builder.tls(tls.clone());
        }
        if let Some(token) = &self.token {
            builder = builder.token(token.clone());
        }
        builder
    }

    /// A client for `endpoints` with the command's timeout.
    pub fn client_for(&self, endpoints: &[String], timeout: Duration) -> Result<Client, Failure> {
        self.builder(endpoints)
            .operation_timeout(timeout)
            .request_timeout(timeout.min(kvclient::builder::REQUEST_TIMEOUT_DEFAULT))
            .connect_timeout(timeout.min(kvclient::builder::CONNECT_TIMEOUT_DEFAULT))
            .build()
            .map_err(|err| self.fail(err))
    }

    /// A client for every endpoint.
    pub fn client(&self) -> Result<Client, Failure> {
        self.client_for(&self.endpoints, self.timeout)
    }

    /// A kvclient error as a failure naming the endpoints.
    pub fn fail(&self, err: kvclient::Error) -> Failure {
        Failure::from_client(err, &self.endpoints)
    }
}

/// Runs one command (not `bench`).
pub async fn run(cli: Cli, printer: Printer) -> Result<(), Failure> {
    if let Command::Certs(args) = &cli.command {
        return crate::certs::run(&printer, args);
    }
    let tls = crate::certs::client_tls(&cli)?;
    let context = Context {
        endpoints: cli.endpoints,
        timeout: cli.timeout,
        printer,
        tls,
        token: cli.token,
    };
    match cli.command {
        Command::Get { key, consistency } => get(&context, key, consistency).await,
        Command::Put(args) => put(&context, args).await,
        Command::Del { key, if_version } => del(&context, key, if_version).await,
        Command::Expire { key, ttl } => expire(&context, key, Some(ttl)).await,
        Command::Persist { key } => expire(&context, key, None).await,
        Command::Scan(args) => scan(&context, args).await,
        Command::Status => status(&context).await,
        Command::Member(command) => member(&context, command).await,
        Command::Snapshot(command) => snapshot(&context, command).await,
        Command::Bench(_) if context.tls.is_some() || context.token.is_some() => {
            Err(Failure::usage(
                "bench does not support TLS or a token yet (its load core dials plain TCP); \
                 bench a cluster without them",
            ))
        }
        Command::Bench(args) => crate::bench::run(&context, args).await,
        Command::Certs(_) => Ok(()),
    }
}

/// Checks a key from the command line against [`KEY_SIZE_BYTES_MAX`].
pub fn check_key(field: &str, key: &str) -> Result<Bytes, Failure> {
    if key.len() > KEY_SIZE_BYTES_MAX {
        return Err(Failure::usage(format!(
            "{field} is {} bytes, over KEY_SIZE_BYTES_MAX ({KEY_SIZE_BYTES_MAX} bytes)",
            key.len()
        )));
    }
    Ok(Bytes::copy_from_slice(key.as_bytes()))
}

fn consistency(arg: ConsistencyArg) -> Consistency {
    match arg {
        ConsistencyArg::Linearizable => Consistency::Linearizable,
        ConsistencyArg::Stale => Consistency::Stale { min_index: 0 },
    }
}

fn value_too_large(source: &str, length: usize) -> Failure {
    Failure::usage(format!(
        "value ({source}) is {length} bytes or more, over VALUE_SIZE_BYTES_MAX ({VALUE_SIZE_BYTES_MAX} bytes)"
    ))
}

/// Reads at most [`VALUE_SIZE_BYTES_MAX`] bytes from `input`.
fn read_bounded(input: impl Read, source: &str) -> Result<Vec<u8>, Failure> {
    let mut bytes = Vec::new();
    input
        .take(VALUE_SIZE_BYTES_MAX as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(|err| Failure::usage(format!("cannot read the value from {source}: {err}")))?;
    if bytes.len() > VALUE_SIZE_BYTES_MAX {
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
        if argument.len() > VALUE_SIZE_BYTES_MAX {
            return Err(value_too_large("argument", argument.len()));
        }
        argument.as_bytes().to_vec()
    };
    Ok(Bytes::from(bytes))
}

async fn get(context: &Context, key: String, arg: ConsistencyArg) -> Result<(), Failure> {
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
        object.insert("version".into(), entry.version.into());
        object.insert("ttl_ms".into(), millis(entry.ttl_left));
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

async fn put(context: &Context, args: PutArgs) -> Result<(), Failure> {
    let key = check_key("key", &args.key)?;
    let value = value_of(&args.value)?;
    let mut options = PutOptions::default();
    if let Some(ttl) = args.ttl {
        options = options.ttl(ttl);
    }
    if let Some(version) = args.if_version {
        options = options.if_version(version);
    }
    if args.if_absent {
        options = options.if_absent();
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
        object.insert("version".into(), written.version.into());
        object.insert("applied_index".into(), written.applied_index.into());
        object.insert("value_bytes".into(), value.len().into());
        object.insert("ttl_ms".into(), millis(args.ttl));
        printer.print_json(&Value::Object(object));
    } else {
        println!(
            "{} {} version {} ({} bytes)",
            printer.paint(Style::Good, "OK"),
            printer.bytes(&key),
            written.version,
            value.len()
        );
    }
    Ok(())
}

async fn del(context: &Context, key: String, if_version: Option<u64>) -> Result<(), Failure> {
    let key = check_key("key", &key)?;
    let client = context.client()?;
    let removed = match if_version {
        Some(version) => client.delete_if_version(key.clone(), version).await,
        None => client.delete(key.clone()).await,
    }
    .map_err(|err| context.fail(err))?;
    let printer = &context.printer;
    if printer.json() {
        let mut object = Map::new();
        insert_bytes(&mut object, "key", &key);
        object.insert("deleted".into(), removed.found.into());
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

/// `expire` (with a TTL) and `persist` (without).
async fn expire(context: &Context, key: String, ttl: Option<Duration>) -> Result<(), Failure> {
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
            object.insert("version".into(), written.version.into());
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
            "{} {} {what} (version {})",
            printer.paint(Style::Good, "OK"),
            printer.bytes(&key),
            written.version
        );
    }
    Ok(())
}

async fn scan(context: &Context, args: ScanArgs) -> Result<(), Failure> {
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
                object.insert("version".into(), e.version.into());
                object.insert("ttl_ms".into(), millis(e.ttl_left));
                Value::Object(object)
            })
            .collect();
        printer.print_json(&json!({ "count": list.len(), "entries": list }));
        return Ok(());
    }
    let mut headers = vec!["key", "version", "ttl"];
    if !args.keys_only {
        headers.push("value");
    }
    let rows: Vec<Vec<String>> = entries
        .iter()
        .map(|e| {
            let mut row = vec![
                printer.bytes(&e.key),
                e.version.to_string(),
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

async fn status(context: &Context) -> Result<(), Failure> {
    let mut addresses: Vec<String> = Vec::new();
    for endpoint in &context.endpoints {
        if !addresses.contains(endpoint) {
            addresses.push(endpoint.clone());
        }
    }
    // Members by id, and every answer by the address asked.
    let mut rows: BTreeMap<u64, Row> = BTreeMap::new();
    let mut answers: Vec<(String, Result<cpb::StatusResponse, String>)> = Vec::new();
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
    let mut leader_id = 0;
    // Every member of one cluster reports the same id; the first answer's.
    let cluster_id = answers
        .iter()
        .find_map(|(_, r)| r.as_ref().ok()?.header.as_ref().map(|h| h.cluster_id))
        .unwrap_or(0);
    let mut errors_by_address = BTreeMap::new();
    for (address, result) in &answers {
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
    let printer = &context.printer;
    let field = |v: Option<u64>| v.map_or_else(|| "-".to_string(), |v| v.to_string());
    if printer.json() {
        let members: Vec<Value> = rows
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
            "cluster_id": format!("{cluster_id:016x}"),
            "leader": (leader_id != 0).then_some(leader_id),
            "members": members,
        }));
        return Ok(());
    }
    let table: Vec<Vec<String>> = rows
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
    println!("cluster {cluster_id:016x}");
    for (id, row) in &rows {
        if let Some(error) = &row.error {
            eprintln!("member {id} ({}): {error}", row.address);
        }
    }
    Ok(())
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

fn members_output(printer: &Printer, members: &[cpb::Member]) {
    if printer.json() {
        let list: Vec<Value> = members
            .iter()
            .map(|m| {
                json!({
                    "id": m.id,
                    "client_addr": m.client_addr,
                    "peer_addr": m.peer_addr,
                    "voter": m.voter,
                })
            })
            .collect();
        printer.print_json(&json!({ "members": list }));
        return;
    }
    let rows: Vec<Vec<String>> = members
        .iter()
        .map(|m| {
            vec![
                m.id.to_string(),
                m.client_addr.clone(),
                m.peer_addr.clone(),
                if m.voter { "voter" } else { "learner" }.to_string(),
            ]
        })
        .collect();
    printer.print_table(&["id", "client address", "peer address", "kind"], &rows);
}

async fn member(context: &Context, command: MemberCommand) -> Result<(), Failure> {
    let client = context.client()?;
    let removed = match command {
        MemberCommand::Remove { id } => Some(id),
        _ => None,
    };
    let members = match command {
        MemberCommand::List => client.members().await,
        MemberCommand::AddLearner {
            id,
            client_addr,
            peer_addr,
            wait,
        } => client.add_learner(id, &client_addr, &peer_addr, wait).await,
        MemberCommand::Promote { id } => client.promote(id).await,
        MemberCommand::Remove { id } => client.remove_member(id).await,
    }
    .map_err(|err| context.fail(err))?;
    members_output(&context.printer, &members);
    if let Some(id) = removed {
        // The removed member keeps running (and, if it missed its removal,
        // keeps asking for votes) until someone stops it.
        eprintln!("member {id} is out of the cluster; stop its process now");
    }
    Ok(())
}

async fn snapshot(context: &Context, command: SnapshotCommand) -> Result<(), Failure> {
    let client = context.client()?;
    let printer = &context.printer;
    match command {
        SnapshotCommand::Trigger { purge_log } => {
            let built = client
                .trigger_snapshot(purge_log)
                .await
                .map_err(|err| context.fail(err))?;
            let member = built.header.as_ref().map_or(0, |h| h.member_id);
            if printer.json() {
                printer.print_json(&json!({
                    "member": member,
                    "snapshot_id": built.snapshot_id,
                    "last_log_index": built.last_log_index,
                    "last_log_term": built.last_log_term,
                    "purged_log": purge_log,
                }));
            } else {
                println!(
                    "{} member {member} built snapshot {} (last log index {}, term {})",
                    printer.paint(Style::Good, "OK"),
                    built.snapshot_id,
                    built.last_log_index,
                    built.last_log_term
                );
            }
            Ok(())
        }
        SnapshotCommand::Save { file, latest } => {
            let stream = client
                .save_snapshot(!latest)
                .await
                .map_err(|err| context.fail(err))?;
            let header =
                save_stream(stream, &file)
                    .await
                    .map_err(|failure| match failure.exit {
                        Exit::Usage => failure,
                        _ => Failure::new(
                            failure.exit,
                            format!("{failure} (tried {})", context.endpoints.join(", ")),
                        ),
                    })?;
            if printer.json() {
                printer.print_json(&json!({
                    "file": file.display().to_string(),
                    "snapshot_id": header.snapshot_id,
                    "last_log_index": header.last_log_index,
                    "last_log_term": header.last_log_term,
                    "files": header.files,
                    "data_bytes": header.data_bytes,
                }));
            } else {
                println!(
                    "{} saved snapshot {} (last log index {}, term {}): {} files, {} bytes, to {}",
                    printer.paint(Style::Good, "OK"),
                    header.snapshot_id,
                    header.last_log_index,
                    header.last_log_term,
                    header.files,
                    header.data_bytes,
                    file.display()
                );
            }
            Ok(())
        }
    }
}

/// Removes a partial archive unless disarmed.
struct PartialFile<'a> {
    path: &'a Path,
    armed: bool,
}

impl Drop for PartialFile<'_> {
    fn drop(&mut self) {
        if self.armed {
            let _ = std::fs::remove_file(self.path);
        }
    }
}

/// What `snapshot save` wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Saved {
    /// The snapshot's id.
    pub snapshot_id: String,
    /// Last log index the snapshot covers.
    pub last_log_index: u64,
    /// Its term.
    pub last_log_term: u64,
    /// Files in the archive.
    pub files: usize,
    /// Bytes of file contents in the archive.
    pub data_bytes: u64,
}

/// Writes a SaveSnapshot stream into the archive `file` (through
/// `FILE.partial`, verified, then renamed), with a progress bar on a
/// terminal.
pub async fn save_stream(
    mut stream: impl tokio_stream::Stream<Item = kvclient::Result<cpb::SaveSnapshotResponse>> + Unpin,
    file: &Path,
) -> Result<Saved, Failure> {
    use cpb::save_snapshot_response::Part;
    let local = |what: &str, err: &dyn std::fmt::Display| {
        Failure::usage(format!("{what} {}: {err}", file.display()))
    };
    let remote = |err: kvclient::Error| Failure::from_client(err, &[]);
    let manifest = match stream.next().await {
        Some(Ok(cpb::SaveSnapshotResponse {
            part: Some(Part::Manifest(manifest)),
        })) => manifest,
        Some(Ok(other)) => {
            return Err(Failure::new(
                Exit::Unavailable,
                format!("the snapshot stream did not start with its manifest: {other:?}"),
            ));
        }
        Some(Err(err)) => return Err(remote(err)),
        None => {
            return Err(Failure::new(
                Exit::Unavailable,
                "the snapshot stream ended before its manifest",
            ));
        }
    };
    let partial_path = {
        let mut name = file.as_os_str().to_owned();
        name.push(".partial");
        std::path::PathBuf::from(name)
    };
    let out = std::fs::File::create(&partial_path).map_err(|err| local("cannot create", &err))?;
    let mut guard = PartialFile {
        path: &partial_path,
        armed: true,
    };
    // The writer decodes the manifest and checks every chunk against it.
    let mut writer =
        ArchiveWriter::new(std::io::BufWriter::new(out), &manifest.encoded).map_err(|err| {
            Failure::new(
                Exit::Unavailable,
                format!("the snapshot stream's manifest is not valid: {err}"),
            )
        })?;
    let saved = Saved {
        snapshot_id: manifest.snapshot_id.clone(),
        last_log_index: manifest.last_log_index,
        last_log_term: manifest.last_log_term,
        files: writer.manifest().files.len(),
        data_bytes: writer.file_bytes_total(),
    };
    let bar = crate::bench::progress_bar(saved.data_bytes, true);
    bar.set_message(format!("snapshot {}", saved.snapshot_id));
    while let Some(item) = stream.next().await {
        match item.map_err(remote)?.part {
            Some(Part::Chunk(chunk)) => {
                writer
                    .write_chunk(&chunk.file_name, chunk.offset_bytes, &chunk.data)
                    .map_err(|err| {
                        Failure::new(
                            Exit::Unavailable,
                            format!("the snapshot stream is inconsistent: {err}"),
                        )
                    })?;
                bar.inc(chunk.data.len() as u64);
            }
            Some(Part::Manifest(_)) => {
                return Err(Failure::new(
                    Exit::Unavailable,
                    "the snapshot stream sent a second manifest",
                ));
            }
            None => {
                return Err(Failure::new(
                    Exit::Unavailable,
                    "the snapshot stream sent an empty message",
                ));
            }
        }
    }
    let out = writer.finish().map_err(|err| {
        Failure::new(
            Exit::Unavailable,
            format!("the snapshot stream ended early: {err}"),
        )
    })?;
    bar.finish_and_clear();
    let out = out
        .into_inner()
        .map_err(|err| local("cannot write", &err.into_error()))?;
    out.sync_all().map_err(|err| local("cannot sync", &err))?;
    drop(out);
    // Read it back: the file on disk must be a valid archive.
    verify_archive(&partial_path).map_err(|err| local("verification failed for", &err))?;
    std::fs::rename(&partial_path, file).map_err(|err| local("cannot rename to", &err))?;
    guard.armed = false;
    Ok(saved)
}

#[cfg(test)]
mod tests {
    use super::*;
    use cpb::save_snapshot_response::Part;

    fn manifest(files: &[(&str, &[u8])]) -> cpb::SaveSnapshotResponse {
        use kvnode::snapshot::{KIND_SEALED, Manifest, ManifestFile};
        let real = Manifest {
            snapshot_id: "2-9-x".into(),
            cluster_id: 7,
            last_log_id: None,
            membership: Default::default(),
            files: files
                .iter()
                .map(|(name, bytes)| ManifestFile {
                    kind: KIND_SEALED,
                    name: name.to_string(),
                    len: bytes.len() as u64,
                    crc: crc32fast::hash(bytes),
                })
                .collect(),
        };
        cpb::SaveSnapshotResponse {
            part: Some(Part::Manifest(cpb::SnapshotManifest {
                header: None,
                snapshot_id: "2-9-x".into(),
                last_log_index: 9,
                last_log_term: 2,
                files: files
                    .iter()
                    .map(|(name, bytes)| cpb::SnapshotFile {
                        name: name.to_string(),
                        length_bytes: bytes.len() as u64,
                        crc32: crc32fast::hash(bytes),
                    })
                    .collect(),
                encoded: Bytes::from(real.encode()),
            })),
        }
    }

    fn chunk(name: &str, offset: u64, data: &'static [u8]) -> cpb::SaveSnapshotResponse {
        cpb::SaveSnapshotResponse {
            part: Some(Part::Chunk(cpb::SnapshotChunk {
                file_name: name.into(),
                offset_bytes: offset,
                data: Bytes::from_static(data),
            })),
        }
    }

    #[tokio::test]
    async fn a_stream_becomes_a_verified_archive() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("snap.rcs");
        let items = vec![
            Ok(manifest(&[("a.data", b"hello world"), ("b.hint", b"")])),
            Ok(chunk("a.data", 0, b"hello ")),
            Ok(chunk("a.data", 6, b"world")),
        ];
        let saved = save_stream(tokio_stream::iter(items), &path).await.unwrap();
        assert_eq!((saved.files, saved.data_bytes), (2, 11));
        let read = verify_archive(&path).unwrap();
        assert_eq!(read.manifest.files.len(), 2);
        assert_eq!(read.file_bytes, 11);
        assert!(!dir.path().join("snap.rcs.partial").exists());
    }

    #[tokio::test]
    async fn a_short_stream_leaves_no_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("snap.rcs");
        let items = vec![
            Ok(manifest(&[("a.data", b"hello world")])),
            Ok(chunk("a.data", 0, b"hello ")),
        ];
        let failure = save_stream(tokio_stream::iter(items), &path)
            .await
            .unwrap_err();
        assert_eq!(failure.exit, Exit::Unavailable);
        assert!(failure.message.contains("ended"), "{failure}");
        assert!(!path.exists());
        assert!(!dir.path().join("snap.rcs.partial").exists());
    }

    #[test]
    fn oversized_keys_name_the_limit() {
        let failure = check_key("key", &"k".repeat(KEY_SIZE_BYTES_MAX + 1)).unwrap_err();
        assert_eq!(failure.exit, Exit::Usage);
        assert!(failure.message.contains("KEY_SIZE_BYTES_MAX"), "{failure}");
        assert!(check_key("key", &"k".repeat(KEY_SIZE_BYTES_MAX)).is_ok());
    }
}
