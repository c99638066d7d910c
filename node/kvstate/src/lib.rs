//! # kvstate
//!
//! The replicated state of a raftcask member, without the machinery that
//! replicates it: what a Raft entry carries and how it is applied to the
//! bitcask engine. No openraft, no tokio, no network — the same entry
//! applied to the same engine state writes the same bytes on every
//! replica, which is what lets followers receive the leader's files as
//! snapshots. kvnode's state machine wraps this crate in openraft's
//! `RaftStateMachine`.
//!
//! ## Modules
//! - [`command`]: what a Raft entry carries — the leader's cluster time and
//!   a command (client requests, transactions, tick, merge, compaction) — the outcome
//!   per request, and the limits on them.
//! - [`revision`]: revisions as etcd counts them: the store revision in
//!   each commit record, each key's create / mod revision, version and
//!   lease in its engine record's meta, and how both are encoded.
//! - [`range`]: etcd's range reads (limit, count, sort, revision filters)
//!   against the engine, outside the log ([`range::range`]), at a past
//!   revision through the change history ([`range::range_at`]) or under an
//!   entry's pending writes.
//! - [`read_txn`]: read-only transactions answered outside the log: the
//!   compares and every range judged at one store revision, ranges at past
//!   revisions through the change history, under one hold of its lock.
//! - [`history`]: the change history's index: which record holds each
//!   key's state at each revision of the window, compaction, what merges
//!   keep, rebuilt from the files at open.
//! - [`watch`]: change events for watchers, read page by page from the
//!   change history (any revision of the window, in revision order, the
//!   same pages on every replica).
//! - [`lease`]: etcd's leases: grant, renew, revoke, expiry by cluster
//!   time, the keys attached to each, and their records.
//! - [`txn`]: etcd's transactions: compares, the ops of two branches, the
//!   checks etcd makes before it applies one, and their results.
//! - [`redis`]: Redis commands (strings, keys, hashes, MULTI/EXEC with
//!   WATCH) as one entry applies them, the replies, the on-disk layout
//!   of hashes, and the reads the RESP front end runs outside the log.
//! - [`apply`]: applying one entry deterministically: one engine batch per
//!   entry, sequence numbers `index × 65536 + position`, a revision per
//!   changing request or transaction, conditions, TTLs deleted by cluster
//!   time through an expiry index, exactly-once sessions.
//!
//! ## Limits
//! - Per entry: [`command::ENTRY_OPS_MAX`] records (65 535).
//! - Per session: [`command::SESSION_ANSWERS_MAX`] answers kept (1024); a
//!   transaction's answer is kept only up to
//!   [`command::SESSION_ANSWER_BYTES_MAX`] (4 KiB), beyond which its retry
//!   is answered `SessionExpired`.
//! - Per transaction: [`txn::TXN_OPS_MAX`] compares and ops per branch
//!   (128, etcd's default); reads of at most [`txn::TXN_READ_KEYS_MAX`]
//!   keys (10 000) and [`txn::TXN_READ_BYTES_MAX`] bytes (4 MiB) in all;
//!   writes that keep the entry's batch under
//!   [`txn::TXN_ENTRY_BATCH_BYTES_MAX`] (32 MiB).
//! - Per watch page: [`watch::WATCH_PAGE_EVENTS_MAX`] events (1000),
//!   [`watch::WATCH_PAGE_BYTES_MAX`] bytes (4 MiB), and
//!   [`watch::WATCH_PAGE_SCAN_RECORDS_MAX`] history records examined
//!   (100 000).
//! - Leases: at most [`lease::LEASES_MAX`] (524 288) at once, each with at
//!   most [`lease::LEASE_KEYS_MAX`] (8191) keys; a TTL between
//!   [`lease::LEASE_TTL_MS_MIN`] (2 s; a shorter one is raised to it) and
//!   [`lease::LEASE_TTL_MS_MAX`]; a renewal names at most
//!   [`lease::LEASE_RENEW_IDS_MAX`] (10 000) leases; expiry revokes write
//!   at most [`lease::LEASE_EXPIRY_OPS_PER_ENTRY_MAX`] records per entry.
//! - Redis: string values and hash fields' values at most
//!   [`redis::STRING_BYTES_MAX`] (1 MiB); FLUSHALL deletes at most
//!   [`redis::FLUSH_KEYS_MAX`] (10 000) keys; each entry's hash
//!   housekeeping writes at most [`redis::CLEANUP_RECORDS_PER_ENTRY_MAX`]
//!   (4096) records.
//! - Per range read outside the log: [`range::RANGE_KEYS_MAX`] keys
//!   visited (100 000) and [`range::RANGE_READ_BYTES_MAX`] bytes (6 MiB);
//!   keys counted past those returned (a `limit` in key order,
//!   `count_only`) come from the key directory's order without a visit,
//!   unless some key may have expired: then at most
//!   [`range::RANGE_COUNT_KEYS_MAX`] (1 000 000) are walked. Per
//!   read-only transaction outside the log the same in all
//!   ([`read_txn::READ_TXN_KEYS_MAX`], [`read_txn::READ_TXN_COUNT_KEYS_MAX`],
//!   [`read_txn::READ_TXN_BYTES_MAX`]).
//!
//! ## Example
//! ```
//! use std::sync::Arc;
//!
//! use bitcask::{Engine, Options, SyncPolicy};
//! use kvstate::apply::Applier;
//! use kvstate::command::{Command, Outcome, Proposal};
//! use kvstate::range::{RangeSpec, range};
//! use kvstate::txn::{Compare, CompareResult, CompareTarget, TxnOp, TxnRequest};
//!
//! let fs = vfs::sim::SimFs::new();
//! let options = Options { sync: SyncPolicy::Never, vfs: Arc::new(fs), ..Options::default() };
//! let engine = Engine::open("/sm", options)?;
//! let mut applier = Applier::default();
//! // Create "k" if it does not exist (its version is 0), else read it.
//! let create = TxnRequest {
//!     session: None,
//!     compares: vec![Compare {
//!         key: b"k".to_vec(),
//!         range_end: Vec::new(),
//!         target: CompareTarget::Version(0),
//!         result: CompareResult::Equal,
//!     }],
//!     success: vec![TxnOp::Put {
//!         key: b"k".to_vec(),
//!         value: b"v".to_vec(),
//!         ttl_ms: 0,
//!         lease: 0,
//!         prev_kv: false,
//!         ignore_value: false,
//!         ignore_lease: false,
//!     }],
//!     failure: vec![TxnOp::Range(RangeSpec::key("k"))],
//! };
//! let entry = Proposal { time_ms: 0, command: Command::Txns(vec![create.clone(), create]) };
//! let response = applier.apply(&engine, 1, &entry, Vec::new())?;
//! let branches: Vec<bool> = response
//!     .answers
//!     .iter()
//!     .map(|answer| matches!(answer.outcome, Outcome::Txn { succeeded: true, .. }))
//!     .collect();
//! assert_eq!(branches, [true, false]); // the second saw the first's put
//! assert_eq!(response.revision, 2); // one write, one revision
//! let read = range(&engine, &RangeSpec::key("k"), 0, applier.header().revision)?;
//! assert_eq!((read.count, read.kvs[0].mod_revision), (1, 2));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod apply;
pub mod command;
pub mod history;
pub mod lease;
pub mod range;
pub mod read_txn;
pub mod redis;
pub mod revision;
pub mod txn;
pub mod watch;
