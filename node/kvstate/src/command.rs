//! What a Raft entry carries (the application half of openraft's `D` / `R`
//! types) and the limits on it.
//!
//! A proposal is stamped by the leader with the cluster time and carries one
//! command: a batch of client requests gathered by proposal batching, a tick
//! that only advances time, or a merge naming engine files. Every type here
//! is plain data encoded with the codec module; none of it knows openraft.

use serde::{Deserialize, Serialize};

use crate::lease::{LeaseAnswer, LeaseOp};
use crate::redis::{RedisAnswer, RedisRequest};
use crate::txn::{TxnOpResult, TxnRequest};

/// Operations in one entry at most: versions are `index × 65536 + position`,
/// so the position must fit in 16 bits.
pub const ENTRY_OPS_MAX: usize = 65_535;
/// Every key at or after this prefix is reserved for the node's own
/// bookkeeping (exactly-once sessions) and refused as a user key.
pub const RESERVED_KEY_PREFIX: &[u8] = b"\xff\xffraftcask/";
/// Sessions idle longer than this (cluster time) are evicted: the wire
/// constant `kvproto::SESSION_IDLE_MS` clients size their retries by (kvnode
/// checks at compile time that the two are equal; this crate does not link
/// the protocol). A test build may shorten it per cluster (kvnode's
/// `StateMachineOptions::session_idle_ms`).
pub const SESSION_IDLE_MS_MAX: u64 = 10 * 60 * 1000;
/// Answers kept per session (requests in flight per client, at most).
pub const SESSION_ANSWERS_MAX: usize = 1024;
/// Bytes a transaction's answer may take, encoded, to be kept in its
/// session for a retry (with [`SESSION_ANSWERS_MAX`] answers, a session
/// record stays under 4 MiB of transaction answers). Beyond it the session
/// keeps [`Outcome::SessionExpired`] in its place: the first reply still
/// carries the whole answer; a retry of the same sequence is told its
/// outcome is unknown, and is never applied a second time. Answers to
/// [`Command::Requests`] and [`Command::Writes`] entries are kept whole, as
/// builds before transactions kept them (replicas must write the same bytes).
pub const SESSION_ANSWER_BYTES_MAX: usize = 4 * 1024;

/// One write inside a client request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Op {
    /// Set `key` to `value`; `ttl_ms` 0 = no expiry.
    Put {
        /// The key.
        #[serde(with = "serde_bytes")]
        key: Vec<u8>,
        /// The value.
        #[serde(with = "serde_bytes")]
        value: Vec<u8>,
        /// Time to live in ms of cluster time; 0 = never expires.
        ttl_ms: u64,
    },
    /// Delete `key`.
    Delete {
        /// The key.
        #[serde(with = "serde_bytes")]
        key: Vec<u8>,
    },
    /// Give an existing key a new time to live (keeps its value).
    Expire {
        /// The key.
        #[serde(with = "serde_bytes")]
        key: Vec<u8>,
        /// Time to live in ms; must be > 0.
        ttl_ms: u64,
    },
    /// Remove an existing key's time to live (keeps its value).
    Persist {
        /// The key.
        #[serde(with = "serde_bytes")]
        key: Vec<u8>,
    },
}

impl Op {
    /// The key the op writes.
    pub fn key(&self) -> &[u8] {
        match self {
            Op::Put { key, .. }
            | Op::Delete { key }
            | Op::Expire { key, .. }
            | Op::Persist { key } => key,
        }
    }
}

/// A condition a request needs to hold before any of its ops applies.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Condition {
    /// The key.
    #[serde(with = "serde_bytes")]
    pub key: Vec<u8>,
    /// What the key must be at; 0 = the key must be absent. In a
    /// [`Command::Writes`] entry the key's `mod_revision`; in a
    /// [`Command::Requests`] entry (proposed before revisions existed) its
    /// sequence number (`log index × 65536 + position`).
    pub version: u64,
}

/// Exactly-once bookkeeping a client attaches to a write.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionRef {
    /// The client's random id.
    pub client_id: u64,
    /// This request's sequence number (increasing per client).
    pub sequence: u64,
    /// Every sequence below this was acknowledged to the client: its answer
    /// may be forgotten.
    pub lowest_unacked: u64,
    /// Whether this request may open the session. A request for a session
    /// the state machine does not hold that does not open it is answered
    /// [`Outcome::SessionExpired`] and not applied (DESIGN §3).
    pub opens: bool,
}

/// One client write request: conditions, then ops, all or nothing.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Request {
    /// Exactly-once bookkeeping, if the client uses a session.
    pub session: Option<SessionRef>,
    /// Conditions checked against the state before this request.
    pub conditions: Vec<Condition>,
    /// Ops applied in order when every condition holds.
    pub ops: Vec<Op>,
}

/// What an entry asks the state machine to do. New variants go at the end:
/// entries already in a log keep decoding (bincode numbers the variants).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    /// Client requests gathered into one entry, applied in order, whose
    /// conditions compare sequence numbers: what builds before revisions
    /// proposed. Still applied as they were meant when replayed from a log.
    Requests(Vec<Request>),
    /// Only advances the cluster time (so TTLs expire without writes).
    Tick,
    /// Merge these engine data files (a prefix of the sealed ones).
    Merge {
        /// Data file names, in order.
        inputs: Vec<String>,
    },
    /// Client requests gathered into one entry, applied in order, whose
    /// conditions compare `mod_revision`: what the leader proposes.
    Writes(Vec<Request>),
    /// Only advances the cluster time, like [`Command::Tick`], which builds
    /// before revisions proposed: keys whose TTL ran out are deleted (each
    /// at a revision of its own) and, on a store upgraded from such a build,
    /// the first of these turns revisions on (`apply.rs`, "Entries from
    /// before revisions").
    Advance,
    /// etcd transactions gathered into one entry, applied in order
    /// ([`crate::txn`]); each answered [`Outcome::Txn`] or
    /// [`Outcome::Rejected`].
    Txns(Vec<TxnRequest>),
    /// Moves the change history's window to start at `revision` (etcd's
    /// `Compact`): reads below it are refused as compacted from then on,
    /// and merges let go of what only they needed (`crate::history`).
    /// Answered with one [`Answer`]: [`Outcome::Applied`] with no ops, or
    /// [`Outcome::Rejected`] with etcd's message when `revision` is at or
    /// below the compact revision or above the store revision.
    Compact {
        /// The new oldest revision served.
        revision: u64,
    },
    /// Lease grants, revokes and renewals gathered into one entry, applied
    /// in order ([`crate::lease`]); each answered [`Outcome::Lease`],
    /// [`Outcome::LeaseNotFound`], [`Outcome::LeaseExists`] or
    /// [`Outcome::Rejected`].
    Leases(Vec<LeaseRequest>),
    /// Redis requests gathered into one entry, applied in order
    /// ([`crate::redis`]): each a command or a MULTI/EXEC block, answered
    /// [`Outcome::Redis`], [`Outcome::Rejected`] (a limit, nothing
    /// applied) or [`Outcome::SessionExpired`].
    Redis(Vec<RedisRequest>),
}

/// One lease operation and its exactly-once bookkeeping.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseRequest {
    /// Exactly-once bookkeeping (grants and revokes from clients; none for
    /// the leader's coalesced renewals).
    pub session: Option<SessionRef>,
    /// What to do.
    pub op: LeaseOp,
}

impl Command {
    /// Whether builds before revisions proposed this command: applied as
    /// they applied it until the store has turned revisions on.
    pub fn is_from_before_revisions(&self) -> bool {
        matches!(
            self,
            Command::Requests(_) | Command::Tick | Command::Merge { .. }
        )
    }
}

/// One client write as the leader's batcher queues it: a request or a
/// transaction. An entry carries writes of one kind ([`Command::Writes`]
/// or [`Command::Txns`]). Encoded (kvcodec) in a member's `Forward` to its
/// leader: new variants go at the end.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Write {
    /// Conditions and ops ([`Command::Writes`]).
    Request(Request),
    /// An etcd transaction ([`Command::Txns`]).
    Txn(TxnRequest),
    /// A lease operation ([`Command::Leases`]).
    Lease(LeaseRequest),
    /// A Redis command or MULTI/EXEC block ([`Command::Redis`]).
    Redis(RedisRequest),
}

impl Write {
    /// The records it may write at most, as the batcher counts them to keep
    /// entries appliable: a request's ops; for a transaction, its longer
    /// branch, a range delete counting as many keys as a transaction may
    /// visit ([`crate::txn::TXN_READ_KEYS_MAX`]); for a Redis request, its
    /// commands' bound ([`RedisRequest::records`]: a FLUSHALL counts
    /// [`crate::redis::FLUSH_KEYS_MAX`] keys).
    pub fn ops(&self) -> usize {
        match self {
            Write::Request(request) => request.ops.len(),
            Write::Txn(txn) => {
                let records = |ops: &[crate::txn::TxnOp]| -> usize {
                    ops.iter()
                        .map(|op| match op {
                            crate::txn::TxnOp::DeleteRange { .. } => crate::txn::TXN_READ_KEYS_MAX,
                            crate::txn::TxnOp::Put { .. } => 1,
                            crate::txn::TxnOp::Range(_) => 0,
                        })
                        .sum()
                };
                records(&txn.success).max(records(&txn.failure))
            }
            Write::Lease(lease) => lease.op.records(),
            Write::Redis(redis) => redis.records(),
        }
    }

    /// Its exactly-once bookkeeping.
    pub fn session(&self) -> Option<SessionRef> {
        match self {
            Write::Request(request) => request.session,
            Write::Txn(txn) => txn.session,
            Write::Lease(lease) => lease.session,
            Write::Redis(redis) => redis.session,
        }
    }

    /// Puts `session` on it (a member forwarding a client's write to the
    /// leader makes it exactly once under the member's own session).
    pub fn set_session(&mut self, session: Option<SessionRef>) {
        match self {
            Write::Request(request) => request.session = session,
            Write::Txn(txn) => txn.session = session,
            Write::Lease(lease) => lease.session = session,
            Write::Redis(redis) => redis.session = session,
        }
    }

    /// Whether `other` may share an entry with it (same kind).
    pub fn same_kind(&self, other: &Write) -> bool {
        matches!(
            (self, other),
            (Write::Request(_), Write::Request(_))
                | (Write::Txn(_), Write::Txn(_))
                | (Write::Lease(_), Write::Lease(_))
                | (Write::Redis(_), Write::Redis(_))
        )
    }

    /// Its encoded size in bytes (what it adds to an entry, about).
    pub fn encoded_len(&self) -> usize {
        match self {
            Write::Request(request) => kvcodec::encode(request).len(),
            Write::Txn(txn) => kvcodec::encode(txn).len(),
            Write::Lease(lease) => kvcodec::encode(lease).len(),
            Write::Redis(redis) => kvcodec::encode(redis).len(),
        }
    }

    /// The command of an entry holding `writes`; `None` if they are not
    /// all of one kind (see [`Write::same_kind`]; the batcher never mixes).
    pub fn command(writes: Vec<Write>) -> Option<Command> {
        let mut requests = Vec::new();
        let mut txns = Vec::new();
        let mut leases = Vec::new();
        let mut redis = Vec::new();
        for write in writes {
            match write {
                Write::Request(request) => requests.push(request),
                Write::Txn(txn) => txns.push(txn),
                Write::Lease(lease) => leases.push(lease),
                Write::Redis(request) => redis.push(request),
            }
        }
        match (
            requests.is_empty(),
            txns.is_empty(),
            leases.is_empty(),
            redis.is_empty(),
        ) {
            (_, true, true, true) => Some(Command::Writes(requests)),
            (true, false, true, true) => Some(Command::Txns(txns)),
            (true, true, false, true) => Some(Command::Leases(leases)),
            (true, true, true, false) => Some(Command::Redis(redis)),
            _ => None,
        }
    }
}

impl From<Request> for Write {
    fn from(request: Request) -> Write {
        Write::Request(request)
    }
}

impl From<LeaseRequest> for Write {
    fn from(lease: LeaseRequest) -> Write {
        Write::Lease(lease)
    }
}

impl From<RedisRequest> for Write {
    fn from(request: RedisRequest) -> Write {
        Write::Redis(request)
    }
}

impl From<TxnRequest> for Write {
    fn from(txn: TxnRequest) -> Write {
        Write::Txn(txn)
    }
}

/// The payload of a Raft entry: the leader's cluster time and a command.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Proposal {
    /// Cluster time in ms, stamped by the leader. Stamps may step back by
    /// a little between proposals that reach Raft out of order; apply
    /// takes the max, so the applied time never decreases.
    pub time_ms: u64,
    /// What to do.
    pub command: Command,
}

/// What a log line says of a proposal: its kind, how many requests or
/// inputs, and its time; never keys or values.
impl std::fmt::Display for Proposal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.command {
            Command::Requests(requests) => write!(f, "requests({})", requests.len())?,
            Command::Writes(requests) => write!(f, "writes({})", requests.len())?,
            Command::Txns(txns) => write!(f, "txns({})", txns.len())?,
            Command::Tick => write!(f, "tick")?,
            Command::Advance => write!(f, "advance")?,
            Command::Merge { inputs } => write!(f, "merge({} inputs)", inputs.len())?,
            Command::Compact { revision } => write!(f, "compact({revision})")?,
            Command::Leases(leases) => write!(f, "leases({})", leases.len())?,
            Command::Redis(requests) => write!(f, "redis({})", requests.len())?,
        }
        write!(f, " at {} ms", self.time_ms)
    }
}

/// The outcome of one request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Outcome {
    /// Applied; the sequence number each op wrote, in op order.
    Applied {
        /// One per op: the sequence number of its record (`log index ×
        /// 65536 + position`; the key's `seq`), or 0 for a delete of an
        /// absent key, which writes nothing.
        versions: Vec<u64>,
        /// Per op, whether its key existed (unexpired) just before it, as
        /// Redis and etcd report for deletes.
        existed: Vec<bool>,
    },
    /// Condition `index` did not hold; nothing was applied.
    ConditionFailed {
        /// Which condition failed.
        index: usize,
        /// What the key was at when checked (0 = absent): its
        /// `mod_revision`, or its sequence number for a
        /// [`Command::Requests`] entry.
        current_version: u64,
    },
    /// An `expire` or `persist` named a key that does not exist; nothing applied.
    KeyNotFound {
        /// Which op.
        index: usize,
    },
    /// The request was a retry whose answer was already forgotten: whether
    /// it applied the first time is unknown to the server.
    SessionExpired,
    /// The request was refused before it touched state (reserved key,
    /// too many ops; for a transaction, any [`crate::txn::TxnError`],
    /// whose message starts with etcd's); nothing applied.
    Rejected {
        /// Why.
        reason: String,
    },
    /// A transaction applied one of its branches.
    Txn {
        /// Whether every compare held (the `success` branch applied).
        succeeded: bool,
        /// One per op of the branch that applied, in order.
        results: Vec<TxnOpResult>,
    },
    /// A lease operation applied.
    Lease(LeaseAnswer),
    /// A lease the request names does not exist (a revoke, or a
    /// transaction's put attaching a key); nothing applied. The reason
    /// starts with etcd's message.
    LeaseNotFound {
        /// Why, naming the lease.
        reason: String,
    },
    /// A grant names a lease id in use; nothing applied.
    LeaseExists {
        /// Why, naming the lease.
        reason: String,
    },
    /// A Redis request applied (its replies), or its WATCH failed.
    Redis(RedisAnswer),
}

/// One request's answer: its outcome and the store revision it reflects.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Answer {
    /// What happened.
    pub outcome: Outcome,
    /// The store revision right after the request: the revision it wrote
    /// at if it changed something, else the revision its checks saw. A
    /// retry's answer carries the revision of its first application.
    pub revision: u64,
}

/// The state machine's answer to one entry.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EntryResponse {
    /// One answer per request of a `Requests`, `Writes` or `Txns` entry;
    /// empty otherwise.
    pub answers: Vec<Answer>,
    /// The store revision after the entry.
    pub revision: u64,
}

#[cfg(test)]
mod tests {
    use kvcodec as codec;
    use serde::Serialize;

    use super::*;

    // The same shapes without `serde_bytes`: how entries were encoded before
    // the byte fields were marked (one serde call per byte).
    #[derive(Serialize)]
    enum PlainOp {
        Put {
            key: Vec<u8>,
            value: Vec<u8>,
            ttl_ms: u64,
        },
        Delete {
            key: Vec<u8>,
        },
        Expire {
            key: Vec<u8>,
            ttl_ms: u64,
        },
        Persist {
            key: Vec<u8>,
        },
    }

    #[derive(Serialize)]
    struct PlainCondition {
        key: Vec<u8>,
        version: u64,
    }

    #[derive(Serialize)]
    struct PlainRequest {
        session: Option<SessionRef>,
        conditions: Vec<PlainCondition>,
        ops: Vec<PlainOp>,
    }

    /// bincode numbers enum variants: entries in logs and answers in
    /// session records decode only while every old variant keeps its number.
    #[test]
    fn variants_keep_their_numbers_and_new_ones_come_last() {
        let first_byte = |bytes: Vec<u8>| bytes[0];
        assert_eq!(first_byte(codec::encode(&Command::Requests(Vec::new()))), 0);
        assert_eq!(first_byte(codec::encode(&Command::Tick)), 1);
        assert_eq!(
            first_byte(codec::encode(&Command::Merge { inputs: Vec::new() })),
            2
        );
        assert_eq!(first_byte(codec::encode(&Command::Writes(Vec::new()))), 3);
        assert_eq!(first_byte(codec::encode(&Command::Advance)), 4);
        assert_eq!(
            first_byte(codec::encode(&Command::Compact { revision: 1 })),
            6
        );
        assert_eq!(first_byte(codec::encode(&Command::Txns(Vec::new()))), 5);
        assert_eq!(first_byte(codec::encode(&Command::Leases(Vec::new()))), 7);
        assert_eq!(first_byte(codec::encode(&Command::Redis(Vec::new()))), 8);
        assert_eq!(first_byte(codec::encode(&Outcome::SessionExpired)), 3);
        let rejected = Outcome::Rejected {
            reason: String::new(),
        };
        assert_eq!(first_byte(codec::encode(&rejected)), 4);
        let txn = Outcome::Txn {
            succeeded: true,
            results: Vec::new(),
        };
        assert_eq!(first_byte(codec::encode(&txn)), 5);
        let lease = Outcome::LeaseExists {
            reason: String::new(),
        };
        assert_eq!(first_byte(codec::encode(&lease)), 8);
        let redis = Outcome::Redis(RedisAnswer::WatchFailed);
        assert_eq!(first_byte(codec::encode(&redis)), 9);
        let decoded: Outcome = codec::decode(&codec::encode(&txn)).unwrap();
        assert_eq!(decoded, txn);
    }

    #[test]
    fn byte_fields_encode_exactly_as_before_so_old_logs_still_decode() {
        let long: Vec<u8> = (0..=255u8).cycle().take(70_000).collect();
        let request = Request {
            session: None,
            conditions: vec![Condition {
                key: b"c".to_vec(),
                version: 300,
            }],
            ops: vec![
                Op::Put {
                    key: b"k".to_vec(),
                    value: long.clone(),
                    ttl_ms: 5,
                },
                Op::Delete { key: Vec::new() },
                Op::Expire {
                    key: vec![0xff; 251],
                    ttl_ms: 1,
                },
                Op::Persist { key: b"p".to_vec() },
            ],
        };
        let plain = PlainRequest {
            session: None,
            conditions: vec![PlainCondition {
                key: b"c".to_vec(),
                version: 300,
            }],
            ops: vec![
                PlainOp::Put {
                    key: b"k".to_vec(),
                    value: long,
                    ttl_ms: 5,
                },
                PlainOp::Delete { key: Vec::new() },
                PlainOp::Expire {
                    key: vec![0xff; 251],
                    ttl_ms: 1,
                },
                PlainOp::Persist { key: b"p".to_vec() },
            ],
        };
        let encoded = codec::encode(&request);
        assert_eq!(encoded, codec::encode(&plain));
        let decoded: Request = codec::decode(&encoded).unwrap();
        assert_eq!(decoded, request);
    }
}
