//! Proposal batching: concurrent client requests gathered into one Raft
//! entry.
//!
//! openraft (0.9 and 0.10) makes every `client_write` an entry of its own, so one request per entry would pay one log fsync per request.
//! The batcher queues requests, and a single task takes everything queued
//! (up to the caps below) as one entry, proposes it, and while that entry is
//! in flight gathers the next one — up to [`PROPOSALS_IN_FLIGHT_MAX`]
//! entries at a time. Each caller gets the outcome of its own request.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use tokio::sync::{Semaphore, mpsc, oneshot};

use kvstate::apply::{EXPIRY_DELETES_PER_ENTRY_MAX, SESSION_EVICTIONS_PER_ENTRY_MAX};
use kvstate::command::{Answer, ENTRY_OPS_MAX, Write};
use kvstate::lease::LEASE_EXPIRY_OPS_PER_ENTRY_MAX;

/// Requests in one entry at most.
pub const ENTRY_REQUESTS_MAX: usize = 1024;
/// User ops in one entry at most: below [`ENTRY_OPS_MAX`], leaving room for
/// the session records the same entry writes (one per request at most), the
/// idle sessions it may evict, the expired keys it may delete and the
/// expired leases it may revoke (kvstate's per-entry caps), so apply never
/// refuses a request the batcher let in.
pub const ENTRY_USER_OPS_MAX: usize = ENTRY_OPS_MAX
    - ENTRY_REQUESTS_MAX
    - 1
    - SESSION_EVICTIONS_PER_ENTRY_MAX
    - EXPIRY_DELETES_PER_ENTRY_MAX
    - LEASE_EXPIRY_OPS_PER_ENTRY_MAX;
/// Encoded bytes of one entry at most (DESIGN §4: one Raft entry ≤ 4 MiB).
pub const ENTRY_SIZE_BYTES_MAX: usize = 4 * 1024 * 1024;
/// Entries proposed and not yet answered at once. Two let one entry
/// replicate while the next is appended; more only make entries smaller
/// (more fsyncs and AppendEntries per put). Measured with 64 clients
/// (BENCHMARKS.md): on openraft 0.9, 2 beat 4 by 10 % on 256 B puts and 8
/// lost 19 %; on 0.10, 4 gained nothing beyond the noise.
pub const PROPOSALS_IN_FLIGHT_MAX: usize = 2;
/// Requests waiting for a batch at most; further submits wait for room.
pub const QUEUE_REQUESTS_MAX: usize = 16 * 1024;

/// Why a request got no outcome.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ProposeError {
    /// The request alone is larger than an entry may be.
    #[error("request is {len} bytes encoded; the limit ENTRY_SIZE_BYTES_MAX is {max} bytes")]
    TooLarge {
        /// Encoded size of the request.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The request alone has more ops than an entry may hold.
    #[error("request has {ops} ops; the limit ENTRY_USER_OPS_MAX is {max}")]
    TooManyOps {
        /// Ops in the request.
        ops: usize,
        /// The limit.
        max: usize,
    },
    /// The entry was not committed: it definitely did not apply (for
    /// example this node is not the leader).
    #[error("not applied: {0}")]
    NotApplied(String),
    /// The entry may or may not have applied (for example leadership was
    /// lost after it was appended).
    #[error("outcome unknown: {0}")]
    Unknown(String),
    /// The batcher stopped.
    #[error("the node is shutting down")]
    Stopped,
}

/// What proposes one entry: given the writes (all of one kind), returns
/// one answer per write, in order.
pub type ProposeFn = Arc<
    dyn Fn(Vec<Write>) -> Pin<Box<dyn Future<Output = Result<Vec<Answer>, ProposeError>> + Send>>
        + Send
        + Sync,
>;

/// Called once per proposed entry with its number of user ops (the node
/// feeds it to its metrics).
pub type ProposalObserver = Arc<dyn Fn(usize) + Send + Sync>;

struct Pending {
    request: Write,
    size_bytes: usize,
    reply: oneshot::Sender<Result<Answer, ProposeError>>,
}

/// The handle callers submit requests through; cheap to clone.
#[derive(Clone, Debug)]
pub struct Batcher {
    queue: mpsc::Sender<Pending>,
}

impl std::fmt::Debug for Pending {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pending")
            .field("size_bytes", &self.size_bytes)
            .finish_non_exhaustive()
    }
}

impl Batcher {
    /// Starts the batching task on the current tokio runtime.
    pub fn spawn(propose: ProposeFn) -> Batcher {
        Batcher::spawn_observed(propose, None)
    }

    /// [`Batcher::spawn`], calling `observer` once per proposed entry.
    pub fn spawn_observed(propose: ProposeFn, observer: Option<ProposalObserver>) -> Batcher {
        let (queue, incoming) = mpsc::channel(QUEUE_REQUESTS_MAX);
        tokio::spawn(run(incoming, propose, observer));
        Batcher { queue }
    }

    /// Submits one request or transaction and waits for its answer.
    pub async fn submit(&self, request: impl Into<Write>) -> Result<Answer, ProposeError> {
        let request = request.into();
        let size_bytes = request.encoded_len();
        if size_bytes > ENTRY_SIZE_BYTES_MAX {
            return Err(ProposeError::TooLarge {
                len: size_bytes,
                max: ENTRY_SIZE_BYTES_MAX,
            });
        }
        // A transaction's count is an upper bound (range deletes count as
        // many keys as one may visit); apply refuses one that does not fit,
        // so only a request is refused here.
        if matches!(request, Write::Request(_)) && request.ops() > ENTRY_USER_OPS_MAX {
            return Err(ProposeError::TooManyOps {
                ops: request.ops(),
                max: ENTRY_USER_OPS_MAX,
            });
        }
        let (reply, answer) = oneshot::channel();
        self.queue
            .send(Pending {
                request,
                size_bytes,
                reply,
            })
            .await
            .map_err(|_| ProposeError::Stopped)?;
        answer.await.map_err(|_| ProposeError::Stopped)?
    }
}

/// What a write counts toward an entry's [`ENTRY_USER_OPS_MAX`]: its
/// records at most, and never more than a whole entry (a transaction whose
/// bound is larger goes in an entry of its own).
fn weight(write: &Write) -> usize {
    write.ops().min(ENTRY_USER_OPS_MAX)
}

async fn run(
    mut incoming: mpsc::Receiver<Pending>,
    propose: ProposeFn,
    observer: Option<ProposalObserver>,
) {
    let in_flight = Arc::new(Semaphore::new(PROPOSALS_IN_FLIGHT_MAX));
    let mut carried: Option<Pending> = None;
    loop {
        // Wait for room in the pipeline first: requests keep queueing (and
        // so batch up) while every slot is busy.
        let Ok(permit) = in_flight.clone().acquire_owned().await else {
            return;
        };
        // A request whose caller is gone (its call cancelled or timed out
        // while it queued) is never proposed: nobody would learn its
        // outcome, and a retry of it may be on its way already. So a queue
        // that built up behind a stuck pipeline (a leader cut off from its
        // majority) cannot apply writes long after their clients gave up.
        let first = loop {
            let next = match carried.take() {
                Some(first) => first,
                None => match incoming.recv().await {
                    Some(first) => first,
                    None => return,
                },
            };
            if !next.reply.is_closed() {
                break next;
            }
        };
        let mut bytes = first.size_bytes;
        let mut ops = weight(&first.request);
        let mut batch = vec![first];
        while batch.len() < ENTRY_REQUESTS_MAX {
            let Ok(next) = incoming.try_recv() else { break };
            if next.reply.is_closed() {
                continue;
            }
            // An entry holds one kind: a transaction after requests (or
            // the other way round) starts the next entry.
            if bytes + next.size_bytes > ENTRY_SIZE_BYTES_MAX
                || ops + weight(&next.request) > ENTRY_USER_OPS_MAX
                || !next.request.same_kind(&batch[0].request)
            {
                carried = Some(next);
                break;
            }
            bytes += next.size_bytes;
            ops += weight(&next.request);
            batch.push(next);
        }
        if let Some(observe) = &observer {
            observe(ops);
        }
        let propose = propose.clone();
        tokio::spawn(async move {
            let (requests, replies): (Vec<Write>, Vec<_>) = batch
                .into_iter()
                .map(|pending| (pending.request, pending.reply))
                .unzip();
            let count = requests.len();
            match propose(requests).await {
                Ok(outcomes) if outcomes.len() == count => {
                    for (reply, outcome) in replies.into_iter().zip(outcomes) {
                        let _ = reply.send(Ok(outcome));
                    }
                }
                Ok(outcomes) => {
                    let error = ProposeError::Unknown(format!(
                        "the state machine answered {} outcomes for {count} requests",
                        outcomes.len()
                    ));
                    for reply in replies {
                        let _ = reply.send(Err(error.clone()));
                    }
                }
                Err(error) => {
                    for reply in replies {
                        let _ = reply.send(Err(error.clone()));
                    }
                }
            }
            drop(permit);
        });
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::time::Duration;

    use super::*;
    use kvstate::command::{Op, Outcome, Request};
    use kvstate::txn::{TxnOp, TxnRequest};

    /// An applied answer whose sequence numbers name the request.
    fn answer(versions: Vec<u64>) -> Answer {
        Answer {
            outcome: Outcome::Applied {
                existed: vec![false; versions.len()],
                versions,
            },
            revision: 1,
        }
    }

    fn request(id: u64, ops: usize, value_len: usize) -> Request {
        Request {
            session: None,
            conditions: Vec::new(),
            ops: (0..ops)
                .map(|i| Op::Put {
                    key: format!("{id}/{i}").into_bytes(),
                    value: vec![0; value_len],
                    ttl_ms: 0,
                })
                .collect(),
        }
    }

    /// The id a test request was made with (its first key's prefix).
    fn id_of(request: &Request) -> u64 {
        String::from_utf8_lossy(request.ops[0].key())
            .split('/')
            .next()
            .unwrap()
            .parse()
            .unwrap()
    }

    /// A proposer that records each entry's requests and answers each with
    /// a version naming the request (its first key), after a delay like a
    /// log fsync.
    fn recording(entries: Arc<Mutex<Vec<Vec<Request>>>>, fail: bool, delay_ms: u64) -> ProposeFn {
        Arc::new(move |writes: Vec<Write>| {
            let entries = entries.clone();
            // A transaction is recorded as a request of its puts' keys.
            let requests: Vec<Request> = writes
                .into_iter()
                .map(|write| match write {
                    Write::Request(request) => request,
                    Write::Txn(txn) => Request {
                        session: None,
                        conditions: Vec::new(),
                        ops: txn
                            .success
                            .into_iter()
                            .map(|op| match op {
                                TxnOp::Put { key, value, .. } => Op::Put {
                                    key,
                                    value,
                                    ttl_ms: 0,
                                },
                                other => panic!("test transactions only put: {other:?}"),
                            })
                            .collect(),
                    },
                    Write::Lease(lease) => panic!("these tests propose no lease: {lease:?}"),
                    Write::Redis(redis) => {
                        panic!("these tests propose no Redis request: {redis:?}")
                    }
                })
                .collect();
            Box::pin(async move {
                tokio::time::sleep(Duration::from_millis(delay_ms)).await;
                let outcomes = requests.iter().map(|r| answer(vec![id_of(r)])).collect();
                entries.lock().unwrap().push(requests);
                if fail {
                    Err(ProposeError::NotApplied("not the leader".to_string()))
                } else {
                    Ok(outcomes)
                }
            })
        })
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_requests_share_entries_and_each_gets_its_own_outcome() {
        let entries = Arc::new(Mutex::new(Vec::new()));
        let batcher = Batcher::spawn(recording(entries.clone(), false, 2));
        const REQUESTS: u64 = 400;
        let tasks: Vec<_> = (0..REQUESTS)
            .map(|id| {
                let batcher = batcher.clone();
                tokio::spawn(async move { (id, batcher.submit(request(id, 1, 16)).await) })
            })
            .collect();
        for task in tasks {
            let (id, outcome) = task.await.unwrap();
            assert_eq!(outcome.unwrap(), answer(vec![id]));
        }
        let entries = entries.lock().unwrap();
        let proposed: usize = entries.iter().map(Vec::len).sum();
        assert_eq!(
            proposed as u64, REQUESTS,
            "every request proposed exactly once"
        );
        assert!(
            entries.len() < (REQUESTS / 4) as usize,
            "{} entries for {REQUESTS} requests: no batching",
            entries.len()
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn entries_respect_the_byte_and_op_caps() {
        let entries = Arc::new(Mutex::new(Vec::new()));
        // A slow log: the pipeline fills, the rest queue up, and the next
        // entry could take all of them if the caps were not applied.
        let batcher = Batcher::spawn(recording(entries.clone(), false, 50));
        // 40 requests of ~300 KiB: at most 13 fit in 4 MiB.
        let tasks: Vec<_> = (0..40u64)
            .map(|id| {
                let batcher = batcher.clone();
                tokio::spawn(async move { batcher.submit(request(id, 1, 300 * 1024)).await })
            })
            .collect();
        for task in tasks {
            task.await.unwrap().unwrap();
        }
        let entries = entries.lock().unwrap().clone();
        assert!(
            entries.iter().any(|entry| entry.len() > 1),
            "no entry held several requests"
        );
        for entry in &entries {
            let bytes: usize = entry.iter().map(|r| crate::codec::encode(r).len()).sum();
            assert!(bytes <= ENTRY_SIZE_BYTES_MAX, "entry of {bytes} bytes");
            let ops: usize = entry.iter().map(|r| r.ops.len()).sum();
            assert!(ops <= ENTRY_USER_OPS_MAX);
        }
        let too_big = batcher.submit(request(1, 1, ENTRY_SIZE_BYTES_MAX)).await;
        assert!(
            matches!(too_big, Err(ProposeError::TooLarge { .. })),
            "{too_big:?}"
        );
        let too_many = batcher.submit(request(1, ENTRY_USER_OPS_MAX + 1, 0)).await;
        assert!(
            matches!(too_many, Err(ProposeError::TooManyOps { .. })),
            "{too_many:?}"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_request_whose_caller_gave_up_while_queued_is_never_proposed() {
        let proposed: Arc<Mutex<Vec<u64>>> = Arc::new(Mutex::new(Vec::new()));
        let gate = Arc::new(Semaphore::new(0));
        let propose: ProposeFn = {
            let (proposed, gate) = (proposed.clone(), gate.clone());
            Arc::new(move |writes: Vec<Write>| {
                let (proposed, gate) = (proposed.clone(), gate.clone());
                Box::pin(async move {
                    let ids: Vec<u64> = writes
                        .iter()
                        .map(|write| match write {
                            Write::Request(request) => id_of(request),
                            Write::Txn(_) | Write::Lease(_) | Write::Redis(_) => {
                                panic!("this test proposes requests")
                            }
                        })
                        .collect();
                    proposed.lock().unwrap().extend(&ids);
                    // A stuck pipeline (a leader without its majority).
                    gate.acquire().await.unwrap().forget();
                    Ok(ids.iter().map(|&id| answer(vec![id])).collect())
                })
            })
        };
        let batcher = Batcher::spawn(propose);
        let wait_proposed = |count: usize| {
            let proposed = proposed.clone();
            async move {
                let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
                while proposed.lock().unwrap().len() < count {
                    assert!(tokio::time::Instant::now() < deadline, "not proposed");
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }
        };
        // Fill every pipeline slot, one entry each.
        let mut blockers = Vec::new();
        for id in 0..PROPOSALS_IN_FLIGHT_MAX as u64 {
            let batcher = batcher.clone();
            blockers.push(tokio::spawn(async move {
                batcher.submit(request(id, 1, 1)).await
            }));
            wait_proposed(id as usize + 1).await;
        }
        // Callers that give up while their requests queue.
        for id in 100..110 {
            let gave_up =
                tokio::time::timeout(Duration::from_millis(50), batcher.submit(request(id, 1, 1)))
                    .await;
            assert!(gave_up.is_err(), "answered through a stuck pipeline");
        }
        let live = {
            let batcher = batcher.clone();
            tokio::spawn(async move { batcher.submit(request(200, 1, 1)).await })
        };
        gate.add_permits(1000);
        assert!(live.await.unwrap().is_ok());
        for blocker in blockers {
            assert!(blocker.await.unwrap().is_ok());
        }
        let proposed = proposed.lock().unwrap().clone();
        assert!(proposed.contains(&200), "{proposed:?}");
        assert!(
            proposed.iter().all(|id| !(100..110).contains(id)),
            "abandoned requests were proposed: {proposed:?}"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_failed_proposal_fails_every_request_in_it() {
        let entries = Arc::new(Mutex::new(Vec::new()));
        let batcher = Batcher::spawn(recording(entries, true, 2));
        let outcome = batcher.submit(request(7, 1, 1)).await;
        assert_eq!(
            outcome,
            Err(ProposeError::NotApplied("not the leader".to_string()))
        );
    }

    /// A transaction never shares an entry with plain requests: an entry's
    /// command holds one kind.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn transactions_and_requests_go_in_entries_of_their_own_kind() {
        let kinds = Arc::new(Mutex::new(Vec::new()));
        let seen = kinds.clone();
        let propose: ProposeFn = Arc::new(move |writes: Vec<Write>| {
            let seen = seen.clone();
            Box::pin(async move {
                tokio::time::sleep(Duration::from_millis(5)).await;
                let command = Write::command(writes.clone()).expect("one kind per entry");
                seen.lock()
                    .unwrap()
                    .push(matches!(command, kvstate::command::Command::Txns(_)));
                Ok(writes.iter().map(|_| answer(vec![0])).collect())
            })
        });
        let batcher = Batcher::spawn(propose);
        let tasks: Vec<_> = (0..200u64)
            .map(|id| {
                let batcher = batcher.clone();
                tokio::spawn(async move {
                    if id % 3 == 0 {
                        let txn = TxnRequest {
                            session: None,
                            compares: Vec::new(),
                            success: vec![TxnOp::Put {
                                key: format!("{id}/0").into_bytes(),
                                value: Vec::new(),
                                ttl_ms: 0,
                                lease: 0,
                                prev_kv: false,
                                ignore_value: false,
                                ignore_lease: false,
                            }],
                            failure: Vec::new(),
                        };
                        batcher.submit(txn).await
                    } else {
                        batcher.submit(request(id, 1, 8)).await
                    }
                })
            })
            .collect();
        for task in tasks {
            task.await.unwrap().unwrap();
        }
        let kinds = kinds.lock().unwrap();
        assert!(kinds.iter().any(|txns| *txns) && kinds.iter().any(|txns| !*txns));
    }
}
