//! The commands: each one calls kvclient and prints its result as a table
//! or one JSON object; every failure becomes a [`Failure`] with its exit
//! code. One file a command; what they share (the [`Context`], key checks)
//! is here.
//!
//! - [`get`]: `get KEY` (linearizable or stale), and ranges as etcdctl
//!   reads them (`--prefix`, `--rev`, `--limit`, `--sort-by`, ...).
//! - [`put`]: `put KEY VALUE` (text, `@FILE` or `-`), TTL and conditions.
//! - [`del`]: `del KEY`, optionally conditional on a mod revision, and
//!   range deletes (`--prefix`, `--prev-kv`).
//! - [`compact`]: `compact REV`, moving the change history's start.
//! - [`watch`]: `watch KEY`, printing changes as etcdctl watch does.
//! - [`txn`]: `txn`, reading etcdctl's transaction format from standard
//!   input.
//! - [`expire`]: `expire KEY TTL` and `persist KEY`.
//! - [`lease`]: `lease grant | revoke | keepalive | timetolive | list`,
//!   etcdctl's output, ids in hex.
//! - [`scan`]: `scan` by prefix or range, paged.
//! - [`status`]: every member's status, asked concurrently, as one table.
//! - [`member`]: `member list | add-learner | promote | remove`.
//! - [`snapshot`]: `snapshot trigger` and `snapshot save FILE` (a verified
//!   archive, `kvarchive`'s format).
//! - [`certs`]: `kvctl certs` (development CA and certificates) and the
//!   TLS settings from `--cacert`, `--cert`, `--key`.
//! - [`bench`](mod@bench): `kvctl bench` on `kvload`, with a progress bar.
//! - [`bench_watch`]: `kvctl bench watch`: put throughput with idle
//!   watchers, and event latency from a put's acknowledgement.
//! - [`bench_lease`]: `kvctl bench lease`: keep-alives per second with
//!   many leases kept alive, their latency, keep-alives per Raft entry.

use std::time::Duration;

use kvclient::{Client, Consistency};
use prost::bytes::Bytes;

use crate::cli::{Cli, Command, ConsistencyArg};
use crate::exit::Failure;
use crate::output::Printer;

pub mod bench;
pub mod bench_lease;
pub mod bench_watch;
pub mod certs;
pub mod compact;
pub mod del;
pub mod expire;
pub mod get;
pub mod lease;
pub mod member;
pub mod put;
pub mod scan;
pub mod snapshot;
pub mod status;
pub mod txn;
pub mod watch;

/// Largest key, in bytes: the cluster's limit (DESIGN §4), checked before
/// sending so the message comes at once.
pub use kvproto::KEY_SIZE_BYTES_MAX;

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

/// Runs one command.
pub async fn run(cli: Cli, printer: Printer) -> Result<(), Failure> {
    if let Command::Certs(args) = &cli.command {
        return certs::run(&printer, args);
    }
    let tls = certs::client_tls(&cli)?;
    let context = Context {
        endpoints: cli.endpoints,
        timeout: cli.timeout,
        printer,
        tls,
        token: cli.token,
    };
    match cli.command {
        Command::Get(args) => get::run(&context, args).await,
        Command::Put(args) => put::run(&context, args).await,
        Command::Del(args) => del::run(&context, args).await,
        Command::Txn => txn::run(&context).await,
        Command::Compact { revision } => compact::run(&context, revision).await,
        Command::Watch(args) => watch::run(&context, args).await,
        Command::Expire { key, ttl } => expire::run(&context, key, Some(ttl)).await,
        Command::Persist { key } => expire::run(&context, key, None).await,
        Command::Scan(args) => scan::run(&context, args).await,
        Command::Status => status::run(&context).await,
        Command::Member(command) => member::run(&context, command).await,
        Command::Snapshot(command) => snapshot::run(&context, command).await,
        Command::Lease(command) => lease::run(&context, command).await,
        Command::Bench(_) if context.tls.is_some() || context.token.is_some() => {
            Err(Failure::usage(
                "bench does not support TLS or a token yet (its load core dials plain TCP); \
                 bench a cluster without them",
            ))
        }
        Command::Bench(args) => bench::run(&context, args).await,
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

pub(crate) fn consistency(arg: ConsistencyArg) -> Consistency {
    match arg {
        ConsistencyArg::Linearizable => Consistency::Linearizable,
        ConsistencyArg::Stale => Consistency::Stale { min_index: 0 },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exit::Exit;

    #[test]
    fn oversized_keys_name_the_limit() {
        let failure = check_key("key", &"k".repeat(KEY_SIZE_BYTES_MAX + 1)).unwrap_err();
        assert_eq!(failure.exit, Exit::Usage);
        assert!(failure.message.contains("KEY_SIZE_BYTES_MAX"), "{failure}");
        assert!(check_key("key", &"k".repeat(KEY_SIZE_BYTES_MAX)).is_ok());
    }
}
