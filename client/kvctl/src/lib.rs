//! # kvctl
//!
//! The raftcask command line (etcdctl-style, DESIGN §5–§6): keys (get,
//! put, del, expire, persist, scan), leases, cluster status, membership, snapshots
//! (trigger, save to an archive file) and a load generator (`bench`), over
//! [`kvclient`] and the kvload load core.
//!
//! ```text
//! kvctl [--endpoints a,b,c | KVCTL_ENDPOINTS] [-o table|json] [--hex] [--timeout 10s]
//!       [--cacert FILE] [--cert FILE --key FILE] [--token T | RAFTCASK_TOKEN] <command>
//! ```
//!
//! TLS: `--cacert` (RAFTCASK_CACERT) turns it on; `--cert`/`--key`
//! (RAFTCASK_CERT, RAFTCASK_KEY) present a client certificate; `--token`
//! (RAFTCASK_TOKEN) sends a bearer token. `kvctl certs` writes a
//! development CA, node certificates and a client certificate.
//!
//! The default endpoint is `127.0.0.1:7001`, what `cargo run -p kvnode`
//! serves.
//!
//! ## Exit codes
//!
//! | code | meaning | from kvclient |
//! |------|---------|---------------|
//! | 0 | ok | |
//! | 1 | key not found (get, del, expire, persist); a lease that does not exist or was lost as expired or revoked | `Ok(None)`, `found = false`, `KeyNotFound`, `LeaseNotFound`, `LeaseLoss::Gone` |
//! | 2 | usage: bad flags, a key or value over its limit, a local file, a call the server does not implement, refused credentials | `InvalidConfig`, `InvalidArgument`, `Unimplemented`, `Tls`, `Rpc` UNAUTHENTICATED / PERMISSION_DENIED |
//! | 3 | cluster unavailable (the endpoints tried are named); a kept lease with no renewal acknowledged for a TTL | `Unavailable`, `Protocol`, other `Rpc` codes, `LeaseLoss::Unrenewed` |
//! | 4 | condition failed; a lease id in use | `VersionMismatch`, `Rpc` FAILED_PRECONDITION, `LeaseAlreadyExists` |
//! | 5 | outcome unknown (applied at most once) | `OutcomeUnknown` |
//!
//! ## Modules
//!
//! - [`cli`]: the grammar (clap) and duration parsing.
//! - [`cmd`]: the commands, one file each, and what they share (the
//!   [`cmd::Context`], key checks):
//!   - [`cmd::get`], [`cmd::put`], [`cmd::del`], [`cmd::expire`] (also
//!     `persist`), [`cmd::scan`]: the key commands;
//!   - [`cmd::lease`]: `lease grant | revoke | keepalive | timetolive |
//!     list` with etcdctl's output (ids in hex), and `put --lease`;
//!   - [`cmd::status`]: every member's status in one table;
//!   - [`cmd::member`]: membership list and changes;
//!   - [`cmd::snapshot`]: `snapshot trigger` and `snapshot save FILE` (a
//!     verified backup archive, the `kvarchive` format);
//!   - [`cmd::certs`]: `kvctl certs` (development CA and certificates,
//!     `kvcerts`) and the TLS settings from `--cacert`, `--cert`, `--key`;
//!   - [`cmd::bench`](mod@cmd::bench): `kvctl bench` on `kvload`, with a progress bar.
//! - [`plot`]: the bench's SVG (latency over time, latency histogram).
//! - [`output`]: tables, JSON, binary-safe bytes, colours.
//! - [`exit`]: exit codes and the error mapping above.
//!
//! ## Limits
//!
//! Keys up to [`cmd::KEY_SIZE_BYTES_MAX`] (the cluster's limit, from
//! kvproto; checked before sending); values up to
//! [`cmd::put::INPUT_VALUE_BYTES_MAX`] read (the cluster's own value limit
//! is checked by the cluster); bench bounds are `kvload`'s.
//!
//! ## Example
//!
//! ```
//! use kvctl::exit::Exit;
//! // No member at this address: exit code 3, naming what was tried.
//! let code = kvctl::run_with(["kvctl", "--endpoints", "127.0.0.1:1", "--timeout", "1s", "get", "k"]);
//! assert_eq!(code, Exit::Unavailable.code());
//! ```

pub mod cli;
pub mod cmd;
pub mod exit;
pub mod output;
pub mod plot;

use clap::Parser as _;

use crate::exit::Failure;
use crate::output::Printer;

/// Worker threads of kvctl's runtime (the bench's clients share them).
const WORKER_THREADS: usize = 2;

/// Parses `args` (the program name first), runs the command, prints its
/// output and any failure; returns the process exit code.
pub fn run_with<I, T>(args: I) -> i32
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let cli = match cli::Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(err) => {
            // clap prints help/version (exit 0) and usage errors (exit 2).
            let _ = err.print();
            return err.exit_code();
        }
    };
    let printer = Printer::new(cli.output, cli.hex);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(WORKER_THREADS)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            let failure = Failure::new(exit::Exit::Unavailable, format!("cannot start: {err}"));
            printer.print_failure(&failure);
            return failure.exit.code();
        }
    };
    match runtime.block_on(cmd::run(cli, printer)) {
        Ok(()) => exit::Exit::Ok.code(),
        Err(failure) => {
            printer.print_failure(&failure);
            failure.exit.code()
        }
    }
}
