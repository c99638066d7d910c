//! # jepsen
//!
//! raftcask's fault suite (DESIGN §7): the harness that runs real `kvnode`
//! members in a private network namespace, drives them through kvclient and
//! injects faults (`jepsen run`), and the history checkers (`jepsen check`).
//!
//! ## Modules
//!
//! - [`history`]: [`history::Event`] (one JSON line: invoke / ok / fail /
//!   info with process, times, key, value, version and index), pairing into
//!   [`history::Operation`]s, the JSON-lines reader and writer.
//! - [`formats`]: readers of Jepsen log lines (jepsen-etcd `.log`) and EDN
//!   operation maps (kv `.txt`), the Jepsen log export, format detection.
//! - [`model`]: the sequential specifications — cas-register, kv, and
//!   raftcask's versioned register.
//! - [`linearizability`]: per-key Wing–Gong search with Lowe's memoization,
//!   keys in parallel, a step budget, shortest failing prefix.
//! - [`index_checks`]: stale read, phantom value, duplicate apply, index
//!   behind version (histories with versions and indexes).
//! - [`revision_checks`]: revision regression, read ahead of its header,
//!   duplicate revision, revision order, mod_revision mismatch (histories
//!   with store revisions; skipped without).
//! - [`set`]: every acknowledged add present at the end, nothing unexpected.
//! - [`lost_writes`]: acknowledged writes missing from a final healed read.
//! - [`check`]: the checkers a model calls for, one verdict, the exit code.
//! - [`simulate`]: a seeded simulator of a correct concurrent register
//!   (test histories).
//! - [`control`]: the private network namespace, the `kvnode` members in it
//!   (127.0.0.(10+i)), the iptables firewall inside it; without root, the
//!   userspace peer proxies.
//! - [`nemesis`]: faults with start/stop records — partitions (leader,
//!   half, one-way, bridge, ring), packet loss, SIGKILL + restart,
//!   SIGSTOP/SIGCONT, wall-clock jumps (libfaketime), power loss on a
//!   lazy-disk kvnode build (`nemesis::power`), membership changes (add
//!   learner, promote, remove), the seeded `combined` mix; a power cut
//!   checks each victim's saved vote across it (`nemesis::vote`).
//! - [`durability`]: what a run checks outside the history — saved votes
//!   a power cut took back, members that did not come back after the heal
//!   (exited, or never applied the run's highest answered index); any one
//!   makes the verdict `not-durable`.
//! - [`workload`]: the `register`, `set`, `ttl`, `exactly-once`, `watch`,
//!   `lease`, `redis-register` (the register workload through the
//!   members' Redis ports) and `etcd-register` (the same through their
//!   etcd v3 ports) workloads and their operation records (JSON lines),
//!   well-formedness.
//! - [`report`]: the summary table (ops, faults, anomalies by kind, lost
//!   writes) and `latency.svg` (every operation, fault windows shaded).
//! - [`ttl_check`]: the `ttl` workload's checker — early expiry (by more
//!   than the cluster-time tick) and resurrection after an observed expiry.
//! - [`lease_check`]: the `lease` workload's checker — no lease expires
//!   before its TTL after its last acknowledged keep-alive was sent, none
//!   outlives TTL + bound once nothing renews it, a revoke or expiry
//!   removes all of a lease's keys at once (one read, one revision).
//! - [`watch_check`]: the `watch` workload's checker — watchers' events in
//!   order, without duplicate or gap, agreeing with each other, with the
//!   writes' acknowledged revisions and with the linearizable reads.
//! - [`run`]: `jepsen run`: one bounded scenario, its history, summary and
//!   the "did enough" minimums (those two in `run::outcome`).
//! - [`suite`]: `jepsen suite` (fixed scenario list) and `jepsen controls`
//!   (negative-control kvnode builds that the checker must catch); the
//!   lists themselves are in `suite::scenarios`.
//! - [`verdict`]: a run's records as the checkers' history, and the
//!   workload's checker (register: linearizability + version checks;
//!   redis-register: linearizability by value; etcd-register: by value
//!   plus the revision checks; set).
//!
//! The binary `jepsen check --model cas-register|kv|register|set FILE` runs
//! [`check::check`] (exit 0 valid, 1 not, 2 error or undecided).
//!
//! ## Limits
//!
//! [`linearizability::STEP_BUDGET_DEFAULT`] search steps per key (then the
//! key is "unknown", never "linearizable"), [`linearizability::CACHE_ENTRIES_MAX`]
//! memo entries per key, [`history::LINE_BYTES_MAX`] per JSON line.
//!
//! ## Example
//!
//! ```
//! use jepsen::check::{check, ModelName};
//! use jepsen::formats::read_jepsen_log;
//! use jepsen::linearizability::{Settings, Verdict};
//!
//! let log = "INFO  jepsen.util - 0\t:invoke\t:write\t1\n\
//!            INFO  jepsen.util - 0\t:ok\t:write\t1\n\
//!            INFO  jepsen.util - 1\t:invoke\t:read\tnil\n\
//!            INFO  jepsen.util - 1\t:ok\t:read\tnil\n";
//! let events = read_jepsen_log(log).unwrap();
//! let report = check(ModelName::CasRegister, &events, Settings::default()).unwrap();
//! // The read started after the write finished, yet saw nothing.
//! assert_eq!(report.verdict, Verdict::NotLinearizable);
//! ```

pub mod check;
pub mod control;
pub mod durability;
pub mod exactly_once;
pub mod formats;
pub mod history;
pub mod index_checks;
pub mod lease_check;
pub mod linearizability;
pub mod lost_writes;
pub mod model;
pub mod nemesis;
pub mod report;
pub mod revision_checks;
pub mod run;
pub mod set;
pub mod simulate;
pub mod suite;
pub mod ttl_check;
pub mod verdict;
pub mod watch_check;
pub mod workload;

/// The errors of reading and checking a history.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Reading or writing a file failed.
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
    /// A line of a history could not be parsed.
    #[error("line {line}: {reason}")]
    Parse {
        /// 1-based line number (0 when writing).
        line: usize,
        /// What was wrong.
        reason: String,
    },
    /// Events that do not pair into operations.
    #[error("event {position}: {reason}")]
    Pairing {
        /// 0-based event position.
        position: usize,
        /// What was wrong.
        reason: String,
    },
    /// An operation the model cannot take.
    #[error("operation {operation}: {reason}")]
    Model {
        /// The operation's id.
        operation: usize,
        /// What was wrong.
        reason: String,
    },
}
