//! Read-only transactions evaluated outside the log, as etcd serves them
//! (a `TxnRequest` whose branches hold only ranges never reaches Raft in
//! etcd: it is answered from the member's store, after the read index when
//! linearizable).
//!
//! [`read_txn`] judges the compares and reads the chosen branch's ranges at
//! one store revision `R`, all under one hold of the change history's read
//! lock, so no entry applies in between and every part sees the same
//! state: the compares and the ranges with `revision` 0 (or `R`) read the
//! engine as it is at `R`, and a range with a past `revision` reads it
//! through the change history, as [`crate::range::range_at`] does. A
//! `revision` above `R` is etcd's future-revision error, one below the
//! history's window its compacted error.

use std::sync::{Arc, PoisonError, RwLock};

use bitcask::Engine;

use crate::history::History;
use crate::range::{
    self, Budget, HISTORY_READ_WAIT_MAX, KeyBounds, RANGE_READ_BYTES_MAX, RangeError, RangeResult,
    RangeSpec,
};
use crate::txn::{TxnOp, TxnPlace, TxnRequest};

/// Keys one read-only transaction may visit in all, compares and ranges
/// together: the limit of a single range read outside the log
/// ([`range::RANGE_KEYS_MAX`]), since the transaction holds the history's
/// read lock (and so holds back the apply) as long as one such read.
pub const READ_TXN_KEYS_MAX: usize = range::RANGE_KEYS_MAX;
/// Keys one read-only transaction may count in all past those it visits
/// (ranges with a limit or `count_only`): the limit of a single range read
/// outside the log ([`range::RANGE_COUNT_KEYS_MAX`]), for the same reason.
pub const READ_TXN_COUNT_KEYS_MAX: usize = range::RANGE_COUNT_KEYS_MAX;
/// Bytes one read-only transaction may visit or return in all (keys
/// visited, values compared, values returned): the limit of a single range
/// read outside the log ([`RANGE_READ_BYTES_MAX`]), below the node's
/// largest client message, so an answer that passes it fits one.
pub const READ_TXN_BYTES_MAX: usize = RANGE_READ_BYTES_MAX;
/// The first wait before a read-only transaction whose records a merge
/// moved starts over; doubled each time up to [`READ_TXN_RETRY_WAIT_MAX`].
const READ_TXN_RETRY_WAIT: std::time::Duration = std::time::Duration::from_millis(1);
/// The longest single wait before a read-only transaction starts over.
const READ_TXN_RETRY_WAIT_MAX: std::time::Duration = std::time::Duration::from_millis(100);

/// What a read-only transaction answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReadTxnAnswer {
    /// The store revision everything was judged and read at.
    pub revision: u64,
    /// Whether every compare held (the `success` branch was read).
    pub succeeded: bool,
    /// One result per range of the branch read, in order.
    pub ranges: Vec<RangeResult>,
}

/// Why a read-only transaction was refused: where, and the read's error.
#[derive(Debug, thiserror::Error)]
#[error("{error} (at {at})")]
pub struct ReadTxnError {
    /// The compare or op that failed.
    pub at: TxnPlace,
    /// Why.
    pub error: RangeError,
}

impl TxnRequest {
    /// Whether every op of both branches is a range: such a transaction
    /// writes nothing and may be answered outside the log ([`read_txn`]).
    pub fn is_read_only(&self) -> bool {
        self.success
            .iter()
            .chain(&self.failure)
            .all(|op| matches!(op, TxnOp::Range(_)))
    }

    /// Whether every compare and every op of both branches names one key
    /// (no `range_end`) and every op is a range: such a transaction visits
    /// at most one key per compare and op, so [`try_read_txn`] may answer
    /// it on the caller's thread.
    pub fn reads_single_keys(&self) -> bool {
        self.compares
            .iter()
            .all(|compare| compare.range_end.is_empty())
            && self
                .success
                .iter()
                .chain(&self.failure)
                .all(|op| matches!(op, TxnOp::Range(spec) if spec.range_end.is_empty()))
    }
}

/// Evaluates the read-only transaction `txn` (see
/// [`TxnRequest::is_read_only`]; a write op is refused) at the store
/// revision the history holds now, at cluster time `now_ms`, within
/// [`READ_TXN_KEYS_MAX`] and [`READ_TXN_BYTES_MAX`]. `engine` gives the
/// engine the history describes: it is called under the history's read
/// lock, which a snapshot install takes to switch both. A merge that moved
/// a record read through the history makes it start over (at a possibly
/// later revision), for at most [`HISTORY_READ_WAIT_MAX`]. Blocking: the
/// apply waits for it.
pub fn read_txn(
    engine: impl Fn() -> Arc<Engine>,
    history: &RwLock<History>,
    txn: &TxnRequest,
    now_ms: u64,
) -> Result<ReadTxnAnswer, ReadTxnError> {
    let mut wait = READ_TXN_RETRY_WAIT;
    let deadline = std::time::Instant::now() + HISTORY_READ_WAIT_MAX;
    loop {
        let attempt = {
            let history = history.read().unwrap_or_else(PoisonError::into_inner);
            let engine = engine();
            evaluate(&engine, &history, txn, now_ms)
        };
        match attempt {
            Err(ReadTxnError {
                error: RangeError::Engine(bitcask::Error::LocationGone { .. }),
                ..
            }) if std::time::Instant::now() < deadline => {
                std::thread::sleep(wait);
                wait = (wait * 2).min(READ_TXN_RETRY_WAIT_MAX);
            }
            Err(ReadTxnError {
                at,
                error: RangeError::Engine(bitcask::Error::LocationGone { .. }),
            }) => {
                let revision = history
                    .read()
                    .unwrap_or_else(PoisonError::into_inner)
                    .revision();
                return Err(ReadTxnError {
                    at,
                    error: RangeError::HistoryUnstable { revision },
                });
            }
            other => return other,
        }
    }
}

/// One attempt of [`read_txn`] if the history's read lock is free now (no
/// entry is applying or waiting to), on the caller's thread: what an async
/// handler tries for a transaction of single keys
/// ([`TxnRequest::reads_single_keys`]) before it moves the transaction to
/// a blocking thread. `None`: the lock was taken, or a merge moved a
/// record the attempt read (which [`read_txn`] waits out); nothing was
/// answered.
pub fn try_read_txn(
    engine: impl Fn() -> Arc<Engine>,
    history: &RwLock<History>,
    txn: &TxnRequest,
    now_ms: u64,
) -> Option<Result<ReadTxnAnswer, ReadTxnError>> {
    let history = history.try_read().ok()?;
    let engine = engine();
    match evaluate(&engine, &history, txn, now_ms) {
        Err(ReadTxnError {
            error: RangeError::Engine(bitcask::Error::LocationGone { .. }),
            ..
        }) => None,
        answer => Some(answer),
    }
}

/// One attempt of [`read_txn`], under the history's read lock.
fn evaluate(
    engine: &Engine,
    history: &History,
    txn: &TxnRequest,
    now_ms: u64,
) -> Result<ReadTxnAnswer, ReadTxnError> {
    let revision = history.revision();
    let mut budget = Budget::new(
        ("READ_TXN_KEYS_MAX", READ_TXN_KEYS_MAX),
        ("READ_TXN_BYTES_MAX", READ_TXN_BYTES_MAX),
    )
    .counting(("READ_TXN_COUNT_KEYS_MAX", READ_TXN_COUNT_KEYS_MAX));
    let mut succeeded = true;
    for (index, compare) in txn.compares.iter().enumerate() {
        let bounds = KeyBounds::new(&compare.key, &compare.range_end);
        let kvs = range::visit(engine, None, &bounds, now_ms, &mut budget)
            .and_then(|found| {
                range::key_values(
                    engine,
                    None,
                    found,
                    compare.reads_values(),
                    now_ms,
                    &mut budget,
                )
            })
            .map_err(|error| ReadTxnError {
                at: TxnPlace::Compare(index),
                error,
            })?;
        if !compare.holds(&kvs) {
            succeeded = false;
            break;
        }
    }
    let ops = if succeeded {
        &txn.success
    } else {
        &txn.failure
    };
    let mut ranges = Vec::with_capacity(ops.len());
    for (index, op) in ops.iter().enumerate() {
        let at = TxnPlace::op(succeeded, index);
        let TxnOp::Range(spec) = op else {
            return Err(ReadTxnError {
                at,
                error: RangeError::NotARead,
            });
        };
        let result = read_at(engine, history, spec, now_ms, revision, &mut budget)
            .map_err(|error| ReadTxnError { at, error })?;
        ranges.push(result);
    }
    Ok(ReadTxnAnswer {
        revision,
        succeeded,
        ranges,
    })
}

/// One range at its own `revision` (0: the store revision `current`).
fn read_at(
    engine: &Engine,
    history: &History,
    spec: &RangeSpec,
    now_ms: u64,
    current: u64,
    budget: &mut Budget,
) -> Result<RangeResult, RangeError> {
    let at_current = RangeSpec {
        revision: 0,
        ..spec.clone()
    };
    if spec.revision == 0 || spec.revision == current {
        return range::evaluate(engine, None, &at_current, now_ms, 0, budget);
    }
    history.check(spec.revision)?;
    // Below the store revision TTLs are not judged ("now" 0), as
    // `range_at` reads.
    let overlay = history.overlay(engine, spec.revision, 0);
    range::evaluate(engine, Some(&overlay), &at_current, 0, 0, budget)
}
