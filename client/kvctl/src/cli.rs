//! The command line's grammar (clap derive): global options, every command
//! and its flags, and the parsers of durations and consistency names.

use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

/// Environment variable with the CA bundle file (`--cacert`).
pub const CACERT_ENV: &str = "RAFTCASK_CACERT";
/// Environment variable with the client certificate file (`--cert`).
pub const CERT_ENV: &str = "RAFTCASK_CERT";
/// Environment variable with the client key file (`--key`).
pub const KEY_ENV: &str = "RAFTCASK_KEY";
/// Environment variable with the bearer token (`--token`).
pub const TOKEN_ENV: &str = "RAFTCASK_TOKEN";

/// The single-node default endpoint: what `cargo run -p kvnode` serves.
pub const ENDPOINTS_DEFAULT: &str = "127.0.0.1:7001";
/// Environment variable with the endpoints (comma-separated).
pub const ENDPOINTS_ENV: &str = "KVCTL_ENDPOINTS";
/// Longest duration accepted by any duration flag (TTLs, timeouts, bench).
pub const DURATION_ARG_MAX: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

/// The long help text's tail: the exit codes scripts rely on.
const AFTER_LONG_HELP: &str = "\
Exit codes (DESIGN §6):
  0  ok
  1  key not found (get, del, expire, persist of a missing key), or a lease
     that does not exist (lease revoke, keepalive, timetolive; put --lease),
     or a kept lease the cluster says expired or was revoked
  2  usage: bad flags or arguments, a key or value over its limit (the
     message names the field and the limit), a local file that cannot be
     read or written, a call the server does not implement (UNIMPLEMENTED),
     or refused credentials: a failed TLS handshake (untrusted or refused
     certificate), UNAUTHENTICATED (missing or wrong --token) or
     PERMISSION_DENIED
  3  cluster unavailable: no member answered in time (the message lists the
     endpoints tried), the server failed the call, or `lease keepalive` had
     no renewal acknowledged for a whole TTL (the lease may have expired)
  4  condition failed: --if-mod-revision (--if-version) / --if-absent did not hold, the
     cluster refused a membership change's precondition, or a lease id is in use
  5  outcome unknown: the write was sent and may or may not have applied
     (it applied at most once); read the key to find out

Keys are taken from arguments as UTF-8 bytes. Values: VALUE, @FILE (the
file's bytes) or - (standard input). Output is binary-safe: `get` writes the
value's bytes as they are (a newline is added only on a terminal); tables
escape non-printable bytes as \\xNN; --hex prints keys and values in hex;
JSON carries them as base64 (`key_base64`, `value_base64`) plus a `key` /
`value` string when they are UTF-8.";

/// kvctl: the raftcask command line.
#[derive(Debug, Parser)]
#[command(
    name = "kvctl",
    version,
    about = "Command line of raftcask: keys, cluster status, membership, snapshots, load.",
    after_long_help = AFTER_LONG_HELP
)]
pub struct Cli {
    /// Client addresses of members, comma-separated (any member will do;
    /// kvctl finds the leader).
    #[arg(
        long,
        global = true,
        env = ENDPOINTS_ENV,
        value_delimiter = ',',
        default_value = ENDPOINTS_DEFAULT
    )]
    pub endpoints: Vec<String>,
    /// Output format.
    #[arg(short = 'o', long, global = true, value_enum, default_value = "table")]
    pub output: Format,
    /// Print keys and values as hex (table output).
    #[arg(long, global = true)]
    pub hex: bool,
    /// How long one command may take, retries included (`10s`, `500ms`).
    #[arg(long, global = true, default_value = "10s", value_parser = parse_duration)]
    pub timeout: Duration,
    /// CA bundle (PEM) that verifies the members' certificates; turns TLS
    /// on (endpoints may be written https://host:port).
    #[arg(long, global = true, env = CACERT_ENV, value_name = "FILE")]
    pub cacert: Option<std::path::PathBuf>,
    /// Client certificate (PEM), for clusters started with
    /// --client-cert-auth; needs --key and --cacert.
    #[arg(long, global = true, env = CERT_ENV, value_name = "FILE", requires_all = ["client_key", "cacert"])]
    pub cert: Option<std::path::PathBuf>,
    /// The private key (PEM) of --cert.
    #[arg(long = "key", id = "client_key", global = true, env = KEY_ENV, value_name = "FILE", requires = "cert")]
    pub client_key: Option<std::path::PathBuf>,
    /// Bearer token for clusters started with --auth-token-file (prefer the
    /// variable: a flag shows in the process list).
    #[arg(long, global = true, env = TOKEN_ENV, hide_env_values = true)]
    pub token: Option<String>,
    /// The command.
    #[command(subcommand)]
    pub command: Command,
}

/// Output formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// Human-readable text and tables.
    Table,
    /// One JSON object per command on standard output.
    Json,
}

/// Read consistency names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ConsistencyArg {
    /// Sees every write acknowledged before the read (the default).
    Linearizable,
    /// A member's local state, possibly behind.
    Stale,
}

/// The commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Print a key's value (exit 1 if absent), or with a range flag the keys
    /// of a range as etcdctl prints them (a key line, then a value line).
    Get(GetArgs),
    /// Write a key.
    Put(PutArgs),
    /// Delete a key (exit 1 if it was absent), or with a range flag every
    /// key of a range at one revision, printing how many (as etcdctl).
    Del(DelArgs),
    /// Run a transaction read from standard input in etcdctl's format:
    /// compares, a blank line, the ops if they all hold, a blank line, the
    /// ops otherwise. Prints SUCCESS or FAILURE, then each op's result.
    Txn,
    /// Move the start of the change history to REV (etcd's compact): reads
    /// at a revision below it are refused from then on.
    Compact {
        /// The new oldest revision served (above the current compact
        /// revision, at most the store revision).
        revision: u64,
    },
    /// Print the changes of a key, a prefix or a range as they happen, as
    /// etcdctl watch does: PUT or DELETE, then the key and value (with
    /// --prev-kv, the previous key and value before them). Resumes on
    /// another member by itself; exits after --count events, or with an
    /// error (exit 2) once its start revision was compacted.
    Watch(WatchArgs),
    /// Give an existing key a time to live (exit 1 if absent).
    Expire {
        /// The key.
        key: String,
        /// Time to live (`10s`, `500ms`, `2m`, `1h`).
        #[arg(value_parser = parse_duration)]
        ttl: Duration,
    },
    /// Remove an existing key's time to live (exit 1 if absent).
    Persist {
        /// The key.
        key: String,
    },
    /// List keys in order.
    Scan(ScanArgs),
    /// Every member's role, term, log and applied index and lag (asks
    /// every member).
    Status,
    /// Cluster membership.
    #[command(subcommand)]
    Member(MemberCommand),
    /// Snapshots.
    #[command(subcommand)]
    Snapshot(SnapshotCommand),
    /// Leases, as etcdctl has them: grant, keepalive, timetolive (ttl),
    /// list, revoke; attach keys with `put --lease ID`. Lease ids are hex,
    /// with or without 0x.
    #[command(subcommand)]
    Lease(LeaseCommand),
    /// Load a cluster and report throughput and latency percentiles.
    Bench(BenchArgs),
    /// Generate a development CA, node certificates and a client
    /// certificate (PEM files) for a TLS cluster.
    Certs(CertsArgs),
}

/// `certs` flags.
#[derive(Debug, Args)]
pub struct CertsArgs {
    /// Directory the files go to (created if missing).
    #[arg(long, default_value = "./certs")]
    pub out: std::path::PathBuf,
    /// A node certificate: NAME=HOST[,HOST...] (DNS names or IP addresses
    /// the member is reached at). Repeat for each member; writes
    /// NAME.pem and NAME-key.pem.
    #[arg(long = "node", value_name = "NAME=HOSTS", required = true)]
    pub nodes: Vec<String>,
    /// Name of the client certificate (client.pem, client-key.pem by
    /// default); valid for client authentication only.
    #[arg(long, default_value = "client")]
    pub client: String,
    /// Overwrite files that exist.
    #[arg(long)]
    pub force: bool,
}

/// `put` flags.
#[derive(Debug, Args)]
pub struct PutArgs {
    /// The key.
    pub key: String,
    /// The value: text, @FILE for a file's bytes, or - for standard input.
    pub value: String,
    /// Time to live (`10s`, `500ms`, `2m`, `1h`).
    #[arg(long, value_parser = parse_duration)]
    pub ttl: Option<Duration>,
    /// Only if the key's mod_revision is N (0 = absent); else exit 4.
    /// `--if-version` is the same flag under its old name.
    #[arg(
        long,
        value_name = "N",
        conflicts_with = "if_absent",
        visible_alias = "if-version"
    )]
    pub if_mod_revision: Option<u64>,
    /// Only if the key is absent; else exit 4.
    #[arg(long)]
    pub if_absent: bool,
    /// Attach the key to this lease (hex id, as `lease grant` prints it):
    /// the key is deleted when the lease is revoked or expires. A lease
    /// that does not exist exits 1.
    #[arg(long, value_name = "ID", value_parser = parse_lease_id)]
    pub lease: Option<u64>,
}

/// `lease` subcommands (etcdctl's, and its output).
#[derive(Debug, Subcommand)]
pub enum LeaseCommand {
    /// Grant a lease of time to live TTL.
    ///
    /// Prints `lease <ID> granted with TTL(<n>s)`. TTL is seconds (`60`) or a duration (`1500ms`, `1m`);
    /// the cluster raises a TTL under 2 s to 2 s, as etcd raises one under
    /// its minimum. A TTL that is not a whole number of seconds prints with
    /// its fraction: `TTL(2.5s)`.
    Grant {
        /// Time to live (`60`, `60s`, `1500ms`, `1m`, `1h`).
        #[arg(value_parser = parse_duration)]
        ttl: Duration,
        /// Grant this id (hex) instead of one the cluster picks; an id in
        /// use exits 4.
        #[arg(long, value_name = "ID", value_parser = parse_lease_id)]
        id: Option<u64>,
    },
    /// Revoke a lease and delete its keys.
    ///
    /// Deletes it and every key attached to it at one revision. Prints `lease <ID> revoked`; a lease that does not exist
    /// exits 1 (`Error: etcdserver: requested lease not found`).
    Revoke {
        /// The lease (hex).
        #[arg(value_parser = parse_lease_id)]
        id: u64,
    },
    /// Keep a lease alive until it is lost.
    ///
    /// Renews it every third of its TTL, printing
    /// `lease <ID> keepalived with TTL(<n>)` per renewal, until it is lost:
    /// `lease <ID> expired or revoked.` and exit 1 when the cluster says it
    /// is gone, exit 3 when no renewal was acknowledged for a whole TTL (it
    /// may have expired). Follows the leader. Interrupting it stops the
    /// renewals without revoking the lease.
    #[command(visible_alias = "keep-alive")]
    Keepalive {
        /// The lease (hex).
        #[arg(value_parser = parse_lease_id)]
        id: u64,
        /// Renew once and exit.
        #[arg(long)]
        once: bool,
    },
    /// A lease's granted and remaining time to live.
    ///
    /// Prints `lease <ID> granted with TTL(<n>s), remaining(<m>s)`
    /// (remaining rounded down to whole seconds, as etcd computes it; `-o
    /// json` has milliseconds), with --keys `, attached keys([k1 k2])`. A lease
    /// that does not exist prints `lease <ID> already expired` and exits 1.
    #[command(visible_alias = "ttl")]
    Timetolive {
        /// The lease (hex).
        #[arg(value_parser = parse_lease_id)]
        id: u64,
        /// Also list the keys attached to it.
        #[arg(long)]
        keys: bool,
        /// Read consistency.
        #[arg(long, value_enum, default_value = "linearizable")]
        consistency: ConsistencyArg,
    },
    /// List every lease: `found <N> leases`, then one id per line.
    List {
        /// Read consistency.
        #[arg(long, value_enum, default_value = "linearizable")]
        consistency: ConsistencyArg,
    },
}

/// `watch` flags: etcdctl's.
#[derive(Debug, Args)]
pub struct WatchArgs {
    /// The key (with --prefix the prefix, with RANGE_END the first key).
    pub key: String,
    /// Watch `[KEY, RANGE_END)`.
    #[arg(conflicts_with = "prefix")]
    pub range_end: Option<String>,
    /// Every key starting with KEY.
    #[arg(long)]
    pub prefix: bool,
    /// Events from store revision N on (0 = after the current one).
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub rev: u64,
    /// Print each event's previous key and value too.
    #[arg(long)]
    pub prev_kv: bool,
    /// Exit after N events (0 = never).
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub count: u64,
}

/// `get` flags: etcdctl's.
#[derive(Debug, Args)]
pub struct GetArgs {
    /// The key (with --prefix the prefix, with --from-key or RANGE_END the
    /// first key).
    pub key: String,
    /// Read `[KEY, RANGE_END)`.
    #[arg(conflicts_with_all = ["prefix", "from_key"])]
    pub range_end: Option<String>,
    /// Read consistency.
    #[arg(long, value_enum, default_value = "linearizable")]
    pub consistency: ConsistencyArg,
    /// Every key starting with KEY.
    #[arg(long, conflicts_with = "from_key")]
    pub prefix: bool,
    /// Every key at or after KEY.
    #[arg(long)]
    pub from_key: bool,
    /// Read at store revision N (0 = the current one).
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub rev: u64,
    /// Keys returned at most (0 = no limit).
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub limit: u64,
    /// Print only how many keys the range holds.
    #[arg(long)]
    pub count_only: bool,
    /// Print keys without values.
    #[arg(long)]
    pub keys_only: bool,
    /// Sort by this (etcdctl's names; ascending unless --order).
    #[arg(long, value_enum, ignore_case = true)]
    pub sort_by: Option<SortByArg>,
    /// Sort order.
    #[arg(long, value_enum, ignore_case = true)]
    pub order: Option<OrderArg>,
}

impl GetArgs {
    /// Whether any flag asks for a range read rather than one key's value.
    pub fn is_range(&self) -> bool {
        self.range_end.is_some()
            || self.prefix
            || self.from_key
            || self.rev != 0
            || self.limit != 0
            || self.count_only
            || self.keys_only
            || self.sort_by.is_some()
            || self.order.is_some()
    }
}

/// What `get --sort-by` sorts by (etcdctl's names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
#[value(rename_all = "UPPER")]
pub enum SortByArg {
    /// The key.
    Key,
    /// The key's create revision.
    Create,
    /// The key's mod revision.
    Modify,
    /// The value.
    Value,
    /// The key's version.
    Version,
}

/// `get --order`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
#[value(rename_all = "UPPER")]
pub enum OrderArg {
    /// Ascending.
    Ascend,
    /// Descending.
    Descend,
}

/// `del` flags.
#[derive(Debug, Args)]
pub struct DelArgs {
    /// The key (with --prefix the prefix, with --from-key or RANGE_END the
    /// first key).
    pub key: String,
    /// Delete `[KEY, RANGE_END)`.
    #[arg(conflicts_with_all = ["prefix", "from_key", "if_mod_revision"])]
    pub range_end: Option<String>,
    /// Only if the key's mod_revision is N (0 = absent); else exit 4.
    /// `--if-version` is the same flag under its old name.
    #[arg(long, value_name = "N", visible_alias = "if-version")]
    pub if_mod_revision: Option<u64>,
    /// Every key starting with KEY.
    #[arg(long, conflicts_with_all = ["from_key", "if_mod_revision"])]
    pub prefix: bool,
    /// Every key at or after KEY.
    #[arg(long, conflicts_with = "if_mod_revision")]
    pub from_key: bool,
    /// Print the deleted keys and values too.
    #[arg(long, conflicts_with = "if_mod_revision")]
    pub prev_kv: bool,
}

impl DelArgs {
    /// Whether any flag asks for a range delete.
    pub fn is_range(&self) -> bool {
        self.range_end.is_some() || self.prefix || self.from_key || self.prev_kv
    }
}

/// `scan` flags.
#[derive(Debug, Args)]
pub struct ScanArgs {
    /// Keys starting with P.
    #[arg(long, value_name = "P", conflicts_with_all = ["from", "to"])]
    pub prefix: Option<String>,
    /// Keys from A (inclusive).
    #[arg(long, value_name = "A")]
    pub from: Option<String>,
    /// Keys before B (exclusive).
    #[arg(long, value_name = "B")]
    pub to: Option<String>,
    /// At most N keys.
    #[arg(long, value_name = "N")]
    pub limit: Option<u64>,
    /// Keys and metadata only.
    #[arg(long)]
    pub keys_only: bool,
    /// Read consistency of every page.
    #[arg(long, value_enum, default_value = "linearizable")]
    pub consistency: ConsistencyArg,
}

/// `member` subcommands.
#[derive(Debug, Subcommand)]
pub enum MemberCommand {
    /// List voters and learners.
    List,
    /// Add a non-voting member.
    AddLearner {
        /// The new member's id.
        id: u64,
        /// Its client address (`host:port`).
        #[arg(long)]
        client_addr: String,
        /// Its peer address (`host:port`).
        #[arg(long)]
        peer_addr: String,
        /// Answer only once it has caught up.
        #[arg(long)]
        wait: bool,
    },
    /// Turn a learner into a voter.
    Promote {
        /// The learner's id.
        id: u64,
    },
    /// Remove a member.
    Remove {
        /// The member's id.
        id: u64,
    },
    /// Hand leadership to another voter (as `etcdctl move-leader`).
    MoveLeader {
        /// The voter to lead.
        id: u64,
    },
}

/// `snapshot` subcommands.
#[derive(Debug, Subcommand)]
pub enum SnapshotCommand {
    /// Make a member build a snapshot now.
    Trigger {
        /// Also purge its log up to the snapshot.
        #[arg(long)]
        purge_log: bool,
    },
    /// Stream a member's snapshot into one archive file (the format of
    /// `kvnode::snapshot::backup`, which `kvnode restore` reads).
    Save {
        /// The archive to write (written to FILE.partial, renamed when
        /// complete and verified).
        file: std::path::PathBuf,
        /// Send the member's latest snapshot instead of building a new one.
        #[arg(long)]
        latest: bool,
    },
}

/// Bench workloads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum BenchOp {
    /// Puts only.
    Put,
    /// Gets only.
    Get,
    /// Gets and puts (see --read-percent).
    Mixed,
    /// Watches under put load: put throughput with no watcher and with
    /// --idle-watchers watchers of keys nobody writes, then the latency
    /// from each put's acknowledgement to its event at --watchers watchers
    /// of the written keys (see `cmd/bench_watch.rs`).
    Watch,
    /// Leases kept alive: grants --leases leases, then renews each one
    /// every --renew-every over --clients keep-alive streams to the leader
    /// (0: as fast as answers come), and reports keep-alives per second,
    /// their latency and keep-alives per Raft entry; revokes them at the
    /// end (see `cmd/bench_lease.rs`).
    Lease,
}

/// `bench` flags.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// put, get or mixed.
    #[arg(value_enum)]
    pub op: BenchOp,
    /// Concurrent clients (one operation in flight each).
    #[arg(long, default_value_t = 16)]
    pub clients: usize,
    /// gRPC connections per endpoint, shared by the clients.
    #[arg(long, default_value_t = 4)]
    pub conns: usize,
    /// Stop after this many operations (default: 1,000,000 with --duration,
    /// else 10,000)...
    #[arg(long)]
    pub total: Option<u64>,
    /// ...or after this long, whichever comes first (default: 60s with
    /// --total, else 10m).
    #[arg(long, value_parser = parse_duration)]
    pub duration: Option<Duration>,
    /// Key length in bytes.
    #[arg(long, default_value_t = 16)]
    pub key_size: usize,
    /// Value length in bytes.
    #[arg(long, default_value_t = 256)]
    pub value_size: usize,
    /// Keys drawn uniformly from this many.
    #[arg(long, default_value_t = 100_000)]
    pub key_space: u64,
    /// Percent of gets in `mixed`.
    #[arg(long, default_value_t = 50)]
    pub read_percent: u8,
    /// Read consistency.
    #[arg(long, value_enum, default_value = "linearizable")]
    pub consistency: ConsistencyArg,
    /// Seed of keys and values.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Write an SVG with latency over time and a latency histogram.
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<std::path::PathBuf>,
    /// `watch`: watchers of the written keys (spread over the endpoints),
    /// whose event latency is measured.
    #[arg(long, default_value_t = 16)]
    pub watchers: usize,
    /// `watch`: watchers of keys nobody writes, open during the second put
    /// phase (throughput compared with the first, which has none).
    #[arg(long, default_value_t = 1000)]
    pub idle_watchers: usize,
    /// `lease`: leases kept alive.
    #[arg(long, default_value_t = 10_000)]
    pub leases: usize,
    /// `lease`: their time to live (long enough to outlast the grants).
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    pub lease_ttl: Duration,
    /// `lease`: how often each lease is renewed (0: as fast as answers come,
    /// a window of renewals in flight per stream).
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    pub renew_every: Duration,
}

/// Parses a lease id as etcdctl prints it: hex, with or without `0x`, in
/// `1..=LEASE_ID_MAX` (an etcd lease id is a positive int64).
pub fn parse_lease_id(text: &str) -> Result<u64, String> {
    let digits = text
        .trim()
        .strip_prefix("0x")
        .or_else(|| text.trim().strip_prefix("0X"))
        .unwrap_or(text.trim());
    let id = u64::from_str_radix(digits, 16)
        .map_err(|_| format!("{text:?}: a lease id is hex digits (as `lease grant` prints it)"))?;
    if id == 0 || id > kvproto::LEASE_ID_MAX {
        return Err(format!(
            "{text:?}: a lease id is in 1..={:x} (LEASE_ID_MAX)",
            kvproto::LEASE_ID_MAX
        ));
    }
    Ok(id)
}

/// Parses `10s`, `500ms`, `2m`, `1h`, `1d` (a bare number is seconds).
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: u64 = number
        .parse()
        .map_err(|_| format!("{text:?}: expected a whole number and a unit (ms, s, m, h, d)"))?;
    let seconds = |factor: u64| Duration::from_secs(number.saturating_mul(factor));
    let duration = match unit {
        "ms" => Duration::from_millis(number),
        "" | "s" => seconds(1),
        "m" => seconds(60),
        "h" => seconds(3600),
        "d" => seconds(86_400),
        _ => return Err(format!("{text:?}: the unit must be ms, s, m, h or d")),
    };
    if duration > DURATION_ARG_MAX {
        return Err(format!(
            "{text:?} is over DURATION_ARG_MAX ({} days)",
            DURATION_ARG_MAX.as_secs() / 86_400
        ));
    }
    Ok(duration)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_grammar_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn lease_ids_are_hex_with_or_without_0x() {
        assert_eq!(
            parse_lease_id("694d7a1c6f0e2a05"),
            Ok(0x694d_7a1c_6f0e_2a05)
        );
        assert_eq!(parse_lease_id("0x2A"), Ok(0x2a));
        assert_eq!(parse_lease_id("10"), Ok(16), "always hex, as etcdctl");
        assert_eq!(parse_lease_id("7fffffffffffffff"), Ok(i64::MAX as u64));
        assert!(
            parse_lease_id("8000000000000000")
                .unwrap_err()
                .contains("LEASE_ID_MAX")
        );
        assert!(parse_lease_id("0").is_err());
        assert!(parse_lease_id("lease").is_err());
        assert!(parse_lease_id("").is_err());
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_duration("7"), Ok(Duration::from_secs(7)));
        assert!(parse_duration("1w").is_err());
        assert!(parse_duration("s").is_err());
        assert!(
            parse_duration("99999d")
                .unwrap_err()
                .contains("DURATION_ARG_MAX")
        );
    }
}
