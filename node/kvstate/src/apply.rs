//! Applying one Raft entry to the engine, deterministically.
//!
//! Every entry becomes exactly one engine batch (so it survives or vanishes
//! whole), whose first sequence number is `index × 65536` and whose commit
//! record carries the store header (revision, compact revision) and the
//! caller's metadata (log id, cluster time, membership). A user op's
//! sequence number (`seq`) is `index × 65536 + its position among the
//! records the entry wrote`; session bookkeeping records follow the user
//! ops in the same batch.
//!
//! Revisions (`revision.rs`): each request that changes something advances
//! the store revision by one, and every record it writes carries the key's
//! [`KeyMeta`] (tombstones: the delete's revision). A delete of an absent
//! key writes nothing and changes nothing. Before the requests, every key
//! whose TTL ran out by the entry's cluster time is deleted, each at a
//! revision of its own, in (expiry, key) order, found through an in-memory
//! expiry index (never a scan), so the change history shows a delete.
//!
//! Entries from before revisions: a store that has never applied an entry
//! of a build with revisions (its last commit record has no store header)
//! applies [`Command::Requests`], [`Command::Tick`] and [`Command::Merge`]
//! exactly as those builds did: no revision, no key metas (kinds 1/2 on
//! disk), a tombstone for a delete of an absent key, no expiry deletes
//! (expired keys stay hidden until merged away) and session records in
//! their old form. The first entry of any other command ([`Command::Writes`]
//! or [`Command::Advance`], which builds with revisions propose) turns
//! revisions on for good at revision [`FIRST_REVISION`] — a point fixed by
//! the log, so replicas that stopped at different indexes of an old log
//! count the same revisions after the upgrade.
//!
//! Limits per entry: at most [`EXPIRY_DELETES_PER_ENTRY_MAX`] expiry
//! deletes and [`SESSION_EVICTIONS_PER_ENTRY_MAX`] idle-session evictions
//! (the rest go to the next entries, in the same order), and a request is
//! refused when its ops would not fit beside them under [`ENTRY_OPS_MAX`],
//! so no burst of expiring keys or idle sessions makes an entry unappliable.
//!
//! Transactions (`txn.rs`) stage their writes while their ops are
//! evaluated, reading through a view of the entry's earlier writes and
//! their own ([`EntryView`]); only a transaction that is not refused moves
//! its writes into the batch, all at one revision.
//!
//! Nothing here reads a clock, a random number or a hash-map iteration
//! order: the same entry applied to the same state writes the same bytes
//! on every replica.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Bound;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, PoisonError, RwLock};

use bitcask::{Batch, Engine, Op as EngineOp, RecordLocation, StoredKind};
use serde::{Deserialize, Serialize};

use crate::command::{
    Answer, Command, ENTRY_OPS_MAX, EntryResponse, LeaseRequest, Op, Outcome, Proposal,
    RESERVED_KEY_PREFIX, Request, SESSION_ANSWER_BYTES_MAX, SESSION_ANSWERS_MAX,
    SESSION_IDLE_MS_MAX, SessionRef,
};
use crate::history::{History, HistoryLoadError, KeySlot, Version};
use crate::lease::{
    LEASE_EXPIRY_OPS_PER_ENTRY_MAX, LeaseAnswer, LeaseError, LeaseLoadError, LeaseOp, Leases,
};
use crate::range::{self, Budget, KeyBounds, KeyValue, Overlay, Pending, RangeError};
use crate::revision::{
    FIRST_REVISION, KeyMeta, RevisionError, StoreHeader, split_commit_meta_exact, tombstone_meta,
    tombstone_revision, wrap_commit_meta,
};
use crate::txn::{
    ENTRY_TXN_READ_BYTES_MAX, TXN_ENTRY_BATCH_BYTES_MAX, TXN_READ_BYTES_MAX, TXN_READ_KEYS_MAX,
    TxnError, TxnOp, TxnOpResult, TxnPlace, TxnRequest,
};
use kvcodec as codec;

mod redis_entry;

/// Sequence numbers per log index: `seq` is `index × VERSIONS_PER_INDEX + position`.
pub const VERSIONS_PER_INDEX: u64 = 65_536;
/// Keys read per page while loading the expiry index at open.
const LOAD_PAGE_KEYS: usize = 1024;
/// First byte of a session record written since revisions: a bincode value
/// (the older records) starts with a varint, whose first byte is never 0xFF.
const SESSION_RECORD_TAG: u8 = 0xFF;
/// The revision an answer stored before revisions reports when replayed:
/// the same on every replica whenever it loaded the record.
const LEGACY_ANSWER_REVISION: u64 = 0;
/// Keys whose TTL ran out deleted by one entry at most; later entries
/// delete the rest, in the same (expiry, key) order. Until then such a key
/// reads as absent.
pub const EXPIRY_DELETES_PER_ENTRY_MAX: usize = 4_096;
/// Idle sessions evicted by one entry at most; later entries evict the
/// rest, in client-id order.
pub const SESSION_EVICTIONS_PER_ENTRY_MAX: usize = 1_024;

/// Why an entry could not be applied. Any of these stops the node: a replica
/// that cannot apply an entry must not go on answering.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    /// The engine failed (I/O, poisoned, corruption).
    #[error("engine: {0}")]
    Engine(#[from] bitcask::Error),
    /// A stored session record does not decode.
    #[error("session record of client {client_id}: {reason}")]
    Session {
        /// The client.
        client_id: u64,
        /// What is wrong.
        reason: String,
    },
    /// A record's or a commit record's revision metadata does not decode.
    #[error(transparent)]
    Revision(#[from] RevisionError),
    /// The change history could not be rebuilt from the engine's records.
    #[error("change history: {0}")]
    History(#[from] HistoryLoadError),
    /// The leases could not be loaded from the engine's records.
    #[error("leases: {0}")]
    Leases(#[from] LeaseLoadError),
    /// The entry is malformed (more ops than versions allow).
    #[error("entry at index {index} holds {ops} ops; the limit ENTRY_OPS_MAX is {ENTRY_OPS_MAX}")]
    TooManyOps {
        /// Log index.
        index: u64,
        /// Ops it would write.
        ops: usize,
    },
}

/// The exactly-once state of one client, stored in the engine under
/// [`session_key`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionRecord {
    /// Cluster time of the client's last request.
    pub last_active_ms: u64,
    /// Answers to sequences below this were forgotten (count limit).
    pub forgotten_below: u64,
    /// Answers of requests not yet acknowledged to the client.
    pub answers: BTreeMap<u64, Answer>,
}

/// A session record as builds before revisions stored it (answers without
/// a revision); written only while the store applies entries from before
/// revisions (see the module doc).
#[derive(Serialize, Deserialize)]
struct LegacySessionRecord {
    last_active_ms: u64,
    forgotten_below: u64,
    answers: BTreeMap<u64, Outcome>,
}

impl SessionRecord {
    /// The stored form: [`SESSION_RECORD_TAG`], then the record.
    fn encode(&self) -> Vec<u8> {
        let mut bytes = vec![SESSION_RECORD_TAG];
        bytes.extend_from_slice(&codec::encode(self));
        bytes
    }

    /// The stored form builds before revisions wrote (answers lose their
    /// revision, which is [`LEGACY_ANSWER_REVISION`] while the store applies
    /// entries from before revisions).
    fn encode_legacy(&self) -> Vec<u8> {
        codec::encode(&LegacySessionRecord {
            last_active_ms: self.last_active_ms,
            forgotten_below: self.forgotten_below,
            answers: self
                .answers
                .iter()
                .map(|(seq, answer)| (*seq, answer.outcome.clone()))
                .collect(),
        })
    }

    /// Reads a stored record; a record stored before revisions gets
    /// [`LEGACY_ANSWER_REVISION`] for each of its answers.
    fn decode(bytes: &[u8]) -> Result<SessionRecord, codec::CodecError> {
        if let Some(rest) = bytes.strip_prefix(&[SESSION_RECORD_TAG]) {
            return codec::decode(rest);
        }
        let legacy: LegacySessionRecord = codec::decode(bytes)?;
        Ok(SessionRecord {
            last_active_ms: legacy.last_active_ms,
            forgotten_below: legacy.forgotten_below,
            answers: legacy
                .answers
                .into_iter()
                .map(|(seq, outcome)| {
                    let revision = LEGACY_ANSWER_REVISION;
                    (seq, Answer { outcome, revision })
                })
                .collect(),
        })
    }
}

/// The engine key of a client's session record.
pub fn session_key(client_id: u64) -> Vec<u8> {
    let mut key = RESERVED_KEY_PREFIX.to_vec();
    key.extend_from_slice(b"session/");
    key.extend_from_slice(&client_id.to_be_bytes());
    key
}

/// The state of a key as seen while applying an entry: the engine's, or
/// what an earlier op of the same entry left.
#[derive(Clone, Debug)]
enum KeyState {
    Absent,
    Present {
        seq: u64,
        expiry_ms: u64,
        meta: KeyMeta,
        /// `None` until an op needs it: a put or a delete only needs to
        /// know the key exists, so the old value is never read from disk
        /// for them (only expire and persist, which rewrite it, read it;
        /// see [`EntryWrite::value_of`]).
        value: Option<Vec<u8>>,
    },
}

/// How a session keeps an answer for a retry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum AnswerKept {
    /// As it is (the answers of `Requests` and `Writes` entries).
    Whole,
    /// As it is up to [`SESSION_ANSWER_BYTES_MAX`] encoded bytes, else as
    /// [`Outcome::SessionExpired`] (transactions).
    Bounded,
}

/// What a condition compares: sequence numbers in entries proposed before
/// revisions ([`Command::Requests`]), `mod_revision` since ([`Command::Writes`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Compared {
    Seq,
    ModRevision,
}

/// The cluster time an entry applies at: the time it was stamped with, but
/// never below the time already applied. Two proposals in flight are stamped
/// in one order and may reach the log in the other, so the stamps along the
/// log may step back by the time between them (about a millisecond); taking
/// the max keeps cluster time from ever decreasing (ARCHITECTURE.md, "Cluster
/// time").
pub fn entry_time_ms(applied_ms: u64, stamped_ms: u64) -> u64 {
    // NEGATIVE CONTROL (feature nc-old-clock): the stamp as it is.
    if cfg!(feature = "nc-old-clock") {
        return stamped_ms;
    }
    applied_ms.max(stamped_ms)
}

/// Applies entries to one engine; holds the sessions, the store revision
/// and the expiry index in memory (the engine holds all three too, so a
/// restart or a snapshot carries them).
#[derive(Debug)]
pub struct Applier {
    sessions: BTreeMap<u64, SessionRecord>,
    /// Cluster time a session may stay idle before it is evicted.
    session_idle_ms: u64,
    /// The store revision and compact revision after the last entry.
    header: StoreHeader,
    /// Whether revisions are on (see the module doc, "Entries from before
    /// revisions"): the last commit record carries a store header.
    revisions_on: bool,
    /// Every user key with a TTL, by (expiry ms, key).
    expiries: BTreeSet<(u64, Vec<u8>)>,
    /// The leases and their keys ([`crate::lease`]).
    leases: Leases,
    /// Where readers learn the store revision: set to an entry's revision
    /// just before the entry's engine write, so a reader that loads it
    /// after reading the engine gets a revision at or above everything it
    /// read (see [`Applier::with_published_revision`]).
    published: Option<Arc<AtomicU64>>,
    /// The change history's index, shared with readers: extended under its
    /// write lock around each entry's engine write.
    history: Arc<RwLock<History>>,
    /// Reused buffer: where the last batch's records went.
    locations: Vec<RecordLocation>,
    /// The history's slot of each op's key in the entry being written
    /// (kept for its memory, like `locations`).
    history_slots: Vec<Option<KeySlot>>,
    /// Whether the store may hold Redis hash expiry or dead records, the
    /// per-entry housekeeping's work (`redis_entry.rs`): true until a
    /// housekeeping pass finds none. An entry that writes one has it in its
    /// overlay, where the housekeeping looks first.
    hash_records: bool,
}

impl Default for Applier {
    fn default() -> Self {
        Applier {
            sessions: BTreeMap::new(),
            session_idle_ms: SESSION_IDLE_MS_MAX,
            header: StoreHeader::default(),
            revisions_on: false,
            expiries: BTreeSet::new(),
            leases: Leases::default(),
            published: None,
            history: Arc::default(),
            locations: Vec::new(),
            history_slots: Vec::new(),
            hash_records: true,
        }
    }
}

impl Applier {
    /// Loads the store header (from the last commit record), the sessions
    /// and the expiry index from `engine`.
    pub fn load(engine: &Engine) -> Result<Applier, ApplyError> {
        let header = match engine.last_commit_meta() {
            Some(bytes) => split_commit_meta_exact(&bytes)?.0,
            None => None,
        };
        let mut sessions = BTreeMap::new();
        let prefix = [RESERVED_KEY_PREFIX, b"session/"].concat();
        let mut after = None;
        loop {
            let scan = bitcask::Scan {
                after: after.clone(),
                ..bitcask::Scan::prefix(prefix.clone(), LOAD_PAGE_KEYS)
            };
            let page = engine.scan(&scan, 0)?;
            for entry in &page {
                let id_bytes: [u8; 8] =
                    entry.key[prefix.len()..]
                        .try_into()
                        .map_err(|_| ApplyError::Session {
                            client_id: 0,
                            reason: "malformed session key".to_string(),
                        })?;
                let client_id = u64::from_be_bytes(id_bytes);
                let record = SessionRecord::decode(entry.value.as_deref().unwrap_or_default())
                    .map_err(|e| ApplyError::Session {
                        client_id,
                        reason: e.to_string(),
                    })?;
                sessions.insert(client_id, record);
            }
            match page.last() {
                Some(last) if page.len() == LOAD_PAGE_KEYS => after = Some(last.key.clone()),
                _ => break,
            }
        }
        let revisions_on = header.is_some();
        let header = header.unwrap_or_default();
        let history = if revisions_on {
            History::load(engine, header.revision, header.compact_revision)?
        } else {
            History::new(header.revision, header.compact_revision)
        };
        Ok(Applier {
            sessions,
            header,
            revisions_on,
            expiries: load_expiries(engine)?,
            leases: Leases::load(engine)?,
            history: Arc::new(RwLock::new(history)),
            ..Applier::default()
        })
    }

    /// Evicts sessions idle for `ms` of cluster time instead of
    /// [`SESSION_IDLE_MS_MAX`]. Test builds only shorten it (`kvnode run
    /// --test-session-idle-ms`), and every member of a cluster must use the
    /// same value: it decides which entries delete which session records.
    pub fn with_session_idle_ms(mut self, ms: u64) -> Applier {
        self.session_idle_ms = ms;
        self
    }

    /// Publishes the store revision to `gauge`: now, and before each
    /// entry's engine write from now on. A reader that loads the gauge
    /// after its engine read reports a revision at or above the
    /// `mod_revision` of anything it read (at most one entry ahead of it).
    /// A reader that needs the exact revision reads under the history's
    /// read lock instead ([`Applier::history`]; kvnode's `read_exact`).
    pub fn with_published_revision(mut self, gauge: Arc<AtomicU64>) -> Applier {
        gauge.store(self.header.revision, Ordering::SeqCst);
        self.published = Some(gauge);
        self
    }

    /// Shares the change history through `shared`: its contents become
    /// this applier's history (loaded with it), and the applier extends it
    /// from now on. Readers hold its read lock while they read at a past
    /// revision (see [`crate::history`]).
    pub fn with_shared_history(self, shared: Arc<RwLock<History>>) -> Applier {
        let locked = shared.clone();
        let mut contents = locked.write().unwrap_or_else(PoisonError::into_inner);
        self.with_shared_history_locked(shared, &mut contents)
    }

    /// [`Applier::with_shared_history`] for a caller that holds `shared`'s
    /// write lock already (`contents`), to switch it together with
    /// something else (a snapshot install switches the engine with it).
    pub fn with_shared_history_locked(
        mut self,
        shared: Arc<RwLock<History>>,
        contents: &mut History,
    ) -> Applier {
        *contents = std::mem::take(&mut *self.history_mut());
        self.history = shared;
        self
    }

    /// The change history's index (see [`crate::history`]).
    pub fn history(&self) -> Arc<RwLock<History>> {
        self.history.clone()
    }

    fn history_mut(&self) -> std::sync::RwLockWriteGuard<'_, History> {
        self.history.write().unwrap_or_else(PoisonError::into_inner)
    }

    /// Number of live sessions.
    pub fn session_count(&self) -> usize {
        self.sessions.len()
    }

    /// The store revision and compact revision after the last applied entry.
    pub fn header(&self) -> StoreHeader {
        self.header
    }

    /// Keys with a TTL (the expiry index's size).
    pub fn expiring_keys(&self) -> usize {
        self.expiries.len()
    }

    /// The earliest expiry in the expiry index (ms of cluster time): at or
    /// below the cluster time, keys wait for their expiry deletes (more
    /// ran out than [`EXPIRY_DELETES_PER_ENTRY_MAX`] per entry).
    pub fn next_expiry_ms(&self) -> Option<u64> {
        let keys = self.expiries.first().map(|(expiry_ms, _)| *expiry_ms);
        match (keys, self.leases.next_expiry_ms()) {
            (Some(keys), Some(leases)) => Some(keys.min(leases)),
            (keys, leases) => keys.or(leases),
        }
    }

    /// The leases ([`crate::lease`]): what time-to-live and listing
    /// requests read.
    pub fn leases(&self) -> &Leases {
        &self.leases
    }

    /// Applies a new leader's first (blank) entry: every lease counts as
    /// renewed at `now_ms` (the applied cluster time), written with the
    /// entry's commit record (`node_meta`, after the store header) as one
    /// batch at sequence `seq`.
    pub fn apply_leader_start(
        &mut self,
        engine: &Engine,
        seq: u64,
        now_ms: u64,
        node_meta: &[u8],
    ) -> Result<(), ApplyError> {
        let mut batch = Batch::new().seq(seq).meta(self.commit_meta(node_meta));
        if self.revisions_on {
            self.leases.refresh(now_ms);
            self.leases.write_records(&mut batch);
        }
        engine.write_batch(&batch)?;
        Ok(())
    }

    /// The commit record metadata of an entry that changes no key (blank,
    /// membership): the current store header before `node_meta`.
    pub fn commit_meta(&self, node_meta: &[u8]) -> Vec<u8> {
        if self.revisions_on {
            wrap_commit_meta(self.header, node_meta)
        } else {
            node_meta.to_vec()
        }
    }

    /// Whether revisions are on (see the module doc, "Entries from before
    /// revisions").
    pub fn revisions_on(&self) -> bool {
        self.revisions_on
    }

    /// Applies the entry at `index` carrying `proposal`; `meta` (the node's)
    /// goes into the engine batch's commit record after the store header.
    pub fn apply(
        &mut self,
        engine: &Engine,
        index: u64,
        proposal: &Proposal,
        meta: Vec<u8>,
    ) -> Result<EntryResponse, ApplyError> {
        let now_ms = proposal.time_ms;
        let base = index * VERSIONS_PER_INDEX;
        let legacy = !self.revisions_on && proposal.command.is_from_before_revisions();
        if !legacy && !self.revisions_on {
            self.revisions_on = true;
            self.header = StoreHeader {
                revision: FIRST_REVISION,
                ..self.header
            };
        }
        let mut entry = EntryWrite {
            legacy,
            txn_read_bytes_left: ENTRY_TXN_READ_BYTES_MAX,
            engine,
            base,
            now_ms,
            batch: Batch::new().seq(base),
            overlay: BTreeMap::new(),
            touched_sessions: BTreeSet::new(),
            revision: self.header.revision,
            expiries: std::mem::take(&mut self.expiries),
            leases: std::mem::take(&mut self.leases),
            batch_bytes: (0, 0),
            compact_to: None,
            hash_records: self.hash_records,
        };
        let applied = self.apply_commands(&mut entry, proposal);
        // Redis hashes: expired markers and dead hashes' fields, in the
        // room the requests left (`redis_entry.rs`).
        let applied = match applied {
            Ok(answers) if !legacy => entry.redis_cleanup().map(|()| answers),
            other => other,
        };
        let EntryWrite {
            mut batch,
            mut touched_sessions,
            revision,
            expiries,
            leases,
            compact_to,
            hash_records,
            ..
        } = entry;
        self.expiries = expiries;
        self.leases = leases;
        self.hash_records = hash_records;
        let answers = applied?;
        // Leases: the keys this entry attached or detached, then the
        // records of the leases it changed.
        self.leases.note_batch(engine, &batch)?;
        self.leases.write_records(&mut batch);
        // Sessions: evict idle ones, then store the touched ones, in client-id order.
        let evictions_max = if legacy {
            usize::MAX
        } else {
            SESSION_EVICTIONS_PER_ENTRY_MAX
        };
        let idle: Vec<u64> = self
            .sessions
            .iter()
            .filter(|(_, record)| {
                record.last_active_ms.saturating_add(self.session_idle_ms) <= now_ms
            })
            .map(|(client_id, _)| *client_id)
            .take(evictions_max)
            .collect();
        for client_id in idle {
            self.sessions.remove(&client_id);
            touched_sessions.remove(&client_id);
            batch = batch.delete(session_key(client_id));
        }
        for client_id in &touched_sessions {
            let record = &self.sessions[client_id];
            let stored = if legacy {
                record.encode_legacy()
            } else {
                record.encode()
            };
            batch = batch.put(session_key(*client_id), stored);
        }
        if batch.ops.len() > ENTRY_OPS_MAX {
            return Err(ApplyError::TooManyOps {
                index,
                ops: batch.ops.len(),
            });
        }
        let header = StoreHeader {
            revision,
            compact_revision: compact_to.unwrap_or(self.header.compact_revision),
        };
        if legacy {
            batch.meta = meta;
            engine.write_batch(&batch)?;
        } else {
            batch.meta = wrap_commit_meta(header, &meta);
            if let Some(gauge) = &self.published {
                gauge.store(revision, Ordering::SeqCst);
            }
            // Readers at a past revision hold the read lock: they see the
            // engine and the index agree.
            let mut history = self.history.write().unwrap_or_else(PoisonError::into_inner);
            note_bases(engine, &mut history, &batch, &mut self.history_slots)?;
            engine.write_batch_located(&batch, &mut self.locations)?;
            note_written(&mut history, &batch, &self.locations, &self.history_slots)?;
            if let Some(compact_revision) = compact_to {
                history.compact(compact_revision);
            }
            history.set_revision(revision);
        }
        self.header = header;
        Ok(EntryResponse { answers, revision })
    }

    /// Expiry deletes, then the entry's requests.
    fn apply_commands(
        &mut self,
        entry: &mut EntryWrite<'_>,
        proposal: &Proposal,
    ) -> Result<Vec<Answer>, ApplyError> {
        entry.delete_expired()?;
        entry.revoke_expired()?;
        let (requests, compared) = match &proposal.command {
            Command::Requests(requests) => (requests, Compared::Seq),
            Command::Writes(requests) => (requests, Compared::ModRevision),
            Command::Txns(txns) => {
                let mut answers = Vec::with_capacity(txns.len());
                for txn in txns {
                    let answer =
                        self.answer_once(entry, txn.session, AnswerKept::Bounded, |entry| {
                            entry.evaluate_txn(txn)
                        })?;
                    answers.push(answer);
                }
                return Ok(answers);
            }
            Command::Leases(leases) => {
                let mut answers = Vec::with_capacity(leases.len());
                for (position, lease) in leases.iter().enumerate() {
                    let answer =
                        self.answer_once(entry, lease.session, AnswerKept::Bounded, |entry| {
                            entry.evaluate_lease(lease, position as u64)
                        })?;
                    answers.push(answer);
                }
                return Ok(answers);
            }
            Command::Redis(requests) => {
                let mut answers = Vec::with_capacity(requests.len());
                for request in requests {
                    let answer =
                        self.answer_once(entry, request.session, AnswerKept::Bounded, |entry| {
                            entry.evaluate_redis(request)
                        })?;
                    answers.push(answer);
                }
                return Ok(answers);
            }
            Command::Tick | Command::Advance | Command::Merge { .. } => return Ok(Vec::new()),
            Command::Compact { revision } => {
                let outcome = self.compact(entry, *revision);
                return Ok(vec![Answer {
                    outcome,
                    revision: entry.revision,
                }]);
            }
        };
        let mut answers = Vec::with_capacity(requests.len());
        for request in requests {
            let answer = self.answer_once(entry, request.session, AnswerKept::Whole, |entry| {
                entry.evaluate(request, compared)
            })?;
            answers.push(answer);
        }
        Ok(answers)
    }

    /// Checks a compaction to `revision` the way etcd does and, if it
    /// holds, has the entry move the window there.
    fn compact(&self, entry: &mut EntryWrite<'_>, revision: u64) -> Outcome {
        let reason = if revision > entry.revision {
            format!(
                "mvcc: required revision is a future revision: field `revision` is {revision}, \
                 the store revision is {}",
                entry.revision
            )
        } else if revision <= self.header.compact_revision {
            format!(
                "mvcc: required revision has been compacted: field `revision` is {revision}, \
                 the store is compacted at {}",
                self.header.compact_revision
            )
        } else {
            entry.compact_to = Some(revision);
            return Outcome::Applied {
                versions: Vec::new(),
                existed: Vec::new(),
            };
        };
        Outcome::Rejected { reason }
    }

    /// Answers a request exactly once: a retry of a request its session
    /// holds an answer for gets that answer (see [`Applier::replay`]);
    /// anything else is evaluated, and its answer kept in its session as
    /// `kept` says.
    fn answer_once<'e>(
        &mut self,
        entry: &mut EntryWrite<'e>,
        session: Option<SessionRef>,
        kept: AnswerKept,
        evaluate: impl FnOnce(&mut EntryWrite<'e>) -> Result<Outcome, ApplyError>,
    ) -> Result<Answer, ApplyError> {
        // NEGATIVE CONTROL (feature nc-forget-sessions): no look-up of the
        // session's answers, so a retried write applies again.
        if !cfg!(feature = "nc-forget-sessions")
            && let Some(session) = session
            && let Some(answer) = self.replay(session, entry.now_ms, entry.revision)
        {
            // An unknown session stays unknown: nothing to store.
            if self.sessions.contains_key(&session.client_id) {
                entry.touched_sessions.insert(session.client_id);
            }
            return Ok(answer);
        }
        let outcome = evaluate(entry)?;
        let answer = Answer {
            outcome,
            revision: if entry.legacy {
                LEGACY_ANSWER_REVISION
            } else {
                entry.revision
            },
        };
        if let Some(session) = session {
            let stored = match kept {
                AnswerKept::Bounded if codec::encode(&answer).len() > SESSION_ANSWER_BYTES_MAX => {
                    Answer {
                        outcome: Outcome::SessionExpired,
                        revision: answer.revision,
                    }
                }
                AnswerKept::Bounded | AnswerKept::Whole => answer.clone(),
            };
            let record = self.sessions.entry(session.client_id).or_default();
            record.answers.insert(session.sequence, stored);
            while record.answers.len() > SESSION_ANSWERS_MAX {
                let (oldest, _) = record
                    .answers
                    .pop_first()
                    .expect("over the limit, so not empty");
                record.forgotten_below = record.forgotten_below.max(oldest + 1);
            }
            entry.touched_sessions.insert(session.client_id);
        }
        Ok(answer)
    }

    /// For a request already seen: its stored answer, or `SessionExpired`
    /// (at the current `revision`) when that answer was forgotten.
    /// `SessionExpired` too for a session this state machine does not
    /// hold, unless the request opens it (it was evicted, or never existed:
    /// applying the request now could apply a write a second time). `None`
    /// for a new request, whose session now exists.
    fn replay(&mut self, session: SessionRef, now_ms: u64, revision: u64) -> Option<Answer> {
        let revision = if self.revisions_on {
            revision
        } else {
            LEGACY_ANSWER_REVISION
        };
        let expired = Answer {
            outcome: Outcome::SessionExpired,
            revision,
        };
        let record = match self.sessions.entry(session.client_id) {
            std::collections::btree_map::Entry::Occupied(known) => known.into_mut(),
            std::collections::btree_map::Entry::Vacant(unknown) => {
                // NEGATIVE CONTROL (feature nc-unknown-sessions): any request
                // opens a fresh session, so a retry whose session was evicted
                // applies again.
                if !session.opens && !cfg!(feature = "nc-unknown-sessions") {
                    return Some(expired);
                }
                unknown.insert(SessionRecord::default())
            }
        };
        record.last_active_ms = record.last_active_ms.max(now_ms);
        // Answers below the lowest unacknowledged sequence were delivered.
        while record
            .answers
            .first_key_value()
            .is_some_and(|(seq, _)| *seq < session.lowest_unacked)
        {
            record.answers.pop_first();
        }
        record.forgotten_below = record.forgotten_below.max(session.lowest_unacked);
        if let Some(answer) = record.answers.get(&session.sequence) {
            return Some(answer.clone());
        }
        if session.sequence < record.forgotten_below {
            return Some(expired);
        }
        None
    }
}

/// Adds to the history the base of each user key `batch` writes that the
/// history does not hold yet (its live record before the batch), and sets
/// `slots` to each op's key's slot in the history (`None`: a reserved
/// key), for [`note_written`].
fn note_bases(
    engine: &Engine,
    history: &mut History,
    batch: &Batch,
    slots: &mut Vec<Option<KeySlot>>,
) -> Result<(), ApplyError> {
    slots.clear();
    for op in &batch.ops {
        let key = match op {
            EngineOp::Put { key, .. } | EngineOp::Delete { key, .. } => key,
        };
        if key.starts_with(RESERVED_KEY_PREFIX) {
            slots.push(None);
            continue;
        }
        let slot = history.slot(key, || {
            Ok::<_, ApplyError>(match engine.locate(key) {
                Some(record) => {
                    let meta = KeyMeta::decode(&record.meta)?;
                    Some(Version {
                        revision: meta.mod_revision,
                        kind: StoredKind::Put,
                        meta,
                        expiry_ms: record.expiry_ms,
                        location: record.location,
                    })
                }
                None => None,
            })
        })?;
        slots.push(Some(slot));
    }
    Ok(())
}

/// Adds to the history each user record `batch` wrote (at `locations`; its
/// key's slot in `slots`, from [`note_bases`]).
fn note_written(
    history: &mut History,
    batch: &Batch,
    locations: &[RecordLocation],
    slots: &[Option<KeySlot>],
) -> Result<(), ApplyError> {
    for ((op, location), slot) in batch.ops.iter().zip(locations).zip(slots) {
        let (revision, kind, meta, expiry_ms) = match op {
            EngineOp::Put {
                meta, expiry_ms, ..
            } => {
                let meta = KeyMeta::decode(meta)?;
                (meta.mod_revision, StoredKind::Put, meta, *expiry_ms)
            }
            EngineOp::Delete { meta, .. } => {
                let Some(revision) = tombstone_revision(meta)? else {
                    continue;
                };
                (revision, StoredKind::Tombstone, KeyMeta::default(), 0)
            }
        };
        let Some(slot) = *slot else {
            continue; // a reserved key
        };
        history.add(
            slot,
            Version {
                revision,
                kind,
                meta,
                expiry_ms,
                location: *location,
            },
        );
    }
    Ok(())
}

/// Every user key with a TTL in `engine`, by (expiry, key): one keys-only
/// pass over the key directory at open, skipped when no record with a TTL
/// was ever loaded.
fn load_expiries(engine: &Engine) -> Result<BTreeSet<(u64, Vec<u8>)>, ApplyError> {
    let mut expiries = BTreeSet::new();
    if engine.expiry_high_water_ms() == 0 {
        return Ok(expiries);
    }
    let mut after: Option<Vec<u8>> = None;
    loop {
        let scan = bitcask::Scan {
            after: after.clone(),
            keys_only: true,
            ..bitcask::Scan::all(LOAD_PAGE_KEYS)
        };
        // "now" 0: no key counts as expired, so every TTL is seen.
        let page = engine.scan(&scan, 0)?;
        for entry in &page {
            if entry.expiry_ms != 0 && !entry.key.starts_with(RESERVED_KEY_PREFIX) {
                expiries.insert((entry.expiry_ms, entry.key.clone()));
            }
        }
        match page.last() {
            Some(last) if page.len() == LOAD_PAGE_KEYS => after = Some(last.key.clone()),
            _ => break,
        }
    }
    Ok(expiries)
}

/// The engine batch an entry is building, and what its earlier requests did.
struct EntryWrite<'a> {
    engine: &'a Engine,
    /// Applied as builds before revisions did (see the module doc).
    legacy: bool,
    /// Bytes the entry's transactions may still read and return
    /// ([`ENTRY_TXN_READ_BYTES_MAX`]).
    txn_read_bytes_left: usize,
    /// `index × VERSIONS_PER_INDEX`: the batch's first sequence number.
    base: u64,
    /// The entry's cluster time.
    now_ms: u64,
    batch: Batch,
    /// State each key was left in by earlier ops of this entry.
    overlay: BTreeMap<Vec<u8>, KeyState>,
    /// Clients whose session record this entry changes.
    touched_sessions: BTreeSet<u64>,
    /// The store revision so far.
    revision: u64,
    /// The applier's expiry index, kept current as keys are written.
    expiries: BTreeSet<(u64, Vec<u8>)>,
    /// The applier's leases, changed by the entry's lease operations.
    leases: Leases,
    /// (records counted, their bytes): the batch's size so far, counted
    /// as far as a transaction last needed it (see [`EntryWrite::batch_bytes`]).
    batch_bytes: (usize, usize),
    /// Where a [`Command::Compact`] moves the history's window.
    compact_to: Option<u64>,
    /// The applier's `hash_records`, as the housekeeping leaves it.
    hash_records: bool,
}

impl EntryWrite<'_> {
    /// Deletes every key whose TTL ran out by this entry's time, each at a
    /// revision of its own, in (expiry, key) order.
    fn delete_expired(&mut self) -> Result<(), ApplyError> {
        if self.legacy {
            return Ok(());
        }
        let mut deleted = 0;
        while deleted < EXPIRY_DELETES_PER_ENTRY_MAX
            && let Some((expiry_ms, _)) = self.expiries.first()
            && *expiry_ms <= self.now_ms
        {
            let (expiry_ms, key) = self.expiries.pop_first().expect("just seen");
            // The index follows every write, so the key is there at this
            // expiry; checked all the same ("now" 0 counts nothing expired).
            let still = self
                .engine
                .meta(&key, 0)
                .is_some_and(|meta| meta.expiry_ms == expiry_ms);
            if !still || self.overlay.contains_key(&key) {
                continue;
            }
            self.revision += 1;
            deleted += 1;
            self.batch.ops.push(bitcask::Op::Delete {
                key: key.clone(),
                meta: tombstone_meta(self.revision),
            });
            self.overlay.insert(key, KeyState::Absent);
        }
        Ok(())
    }

    /// Revokes every lease whose expiry is at or below this entry's time,
    /// in (expiry, id) order, each deleting its keys at a revision of its
    /// own, as long as their records fit in
    /// [`LEASE_EXPIRY_OPS_PER_ENTRY_MAX`] (the next entries take the rest).
    fn revoke_expired(&mut self) -> Result<(), ApplyError> {
        if self.legacy {
            return Ok(());
        }
        let mut written = 0;
        // A lease over the budget alone still goes (first in its entry):
        // none could block the ones behind it.
        while let Some((id, keys)) = self.leases.first_expired(self.now_ms)
            && (written == 0 || written + keys < LEASE_EXPIRY_OPS_PER_ENTRY_MAX)
        {
            written += self.revoke(id, true)?.unwrap_or(0) as usize + 1;
        }
        Ok(())
    }

    /// Revokes lease `id`: deletes its keys still present at the next
    /// revision (taken only if there is one). `None` if it does not exist.
    fn revoke(&mut self, id: u64, expired: bool) -> Result<Option<u64>, ApplyError> {
        let Ok(keys) = self.leases.revoke(id, expired) else {
            return Ok(None);
        };
        let revision = self.revision + 1;
        let mut deleted = 0;
        for key in keys {
            // Every attached key still in the key directory goes, one whose
            // TTL ran out but whose expiry delete has not come yet too: all
            // at the revoke's revision.
            let expiry_ms = match self.overlay.get(&key) {
                Some(KeyState::Present { expiry_ms, .. }) => *expiry_ms,
                Some(KeyState::Absent) => continue,
                None => match self.engine.meta(&key, 0) {
                    Some(item) => item.expiry_ms,
                    None => continue,
                },
            };
            if expiry_ms != 0 {
                self.expiries.remove(&(expiry_ms, key.clone()));
            }
            self.write_staged(key, KeyState::Absent, revision)?;
            deleted += 1;
        }
        if deleted > 0 {
            self.revision = revision;
        }
        Ok(Some(deleted))
    }

    /// Applies one lease operation (the `position`-th request of the entry).
    fn evaluate_lease(
        &mut self,
        request: &LeaseRequest,
        position: u64,
    ) -> Result<Outcome, ApplyError> {
        let refused = |error: LeaseError| match error {
            LeaseError::NotFound { .. } => Outcome::LeaseNotFound {
                reason: error.to_string(),
            },
            LeaseError::Exists { .. } => Outcome::LeaseExists {
                reason: error.to_string(),
            },
            _ => Outcome::Rejected {
                reason: error.to_string(),
            },
        };
        // Room for what it writes beside the entry's records, its lease
        // and session records and the idle-session evictions.
        let batched = self.batch.ops.len()
            + self.leases.pending_records()
            + self.touched_sessions.len()
            + 1
            + SESSION_EVICTIONS_PER_ENTRY_MAX;
        // A revoke writes its lease's keys (at most LEASE_KEYS_MAX, which
        // `records` counts; the lease's own count, should it be more).
        let records = match &request.op {
            LeaseOp::Revoke { id } => self
                .leases
                .get(*id)
                .map_or(0, |lease| lease.keys + 1)
                .max(request.op.records()),
            op => op.records(),
        };
        if batched + records >= ENTRY_OPS_MAX {
            return Ok(Outcome::Rejected {
                reason: format!("the entry would exceed ENTRY_OPS_MAX ({ENTRY_OPS_MAX}) ops"),
            });
        }
        let answer = match &request.op {
            LeaseOp::Grant { id, ttl_ms } => {
                let index = self.base / VERSIONS_PER_INDEX;
                let at = (self.now_ms, self.revision);
                match self.leases.grant(*id, *ttl_ms, at, index, position) {
                    Ok((id, ttl_ms)) => LeaseAnswer::Granted { id, ttl_ms },
                    Err(error) => return Ok(refused(error)),
                }
            }
            LeaseOp::Revoke { id } => match self.revoke(*id, false)? {
                Some(deleted) => LeaseAnswer::Revoked { deleted },
                None => return Ok(refused(LeaseError::NotFound { id: *id })),
            },
            LeaseOp::Renew { ids } => match self.leases.renew(ids, self.now_ms) {
                Ok(ttls_ms) => LeaseAnswer::Renewed { ttls_ms },
                Err(error) => return Ok(refused(error)),
            },
        };
        Ok(Outcome::Lease(answer))
    }

    fn evaluate(&mut self, request: &Request, compared: Compared) -> Result<Outcome, ApplyError> {
        let (base, now_ms) = (self.base, self.now_ms);
        let reserved = request
            .conditions
            .iter()
            .map(|c| c.key.as_slice())
            .chain(request.ops.iter().map(Op::key))
            .any(|key| key.starts_with(RESERVED_KEY_PREFIX));
        if reserved {
            return Ok(Outcome::Rejected {
                reason: "keys starting with the reserved prefix are refused".to_string(),
            });
        }
        // Room for the request's ops beside what the entry holds, its
        // session records and (since revisions) the idle-session evictions.
        let reserved_ops = if self.legacy {
            0
        } else {
            self.touched_sessions.len()
                + 1
                + SESSION_EVICTIONS_PER_ENTRY_MAX
                + self.leases.pending_records()
        };
        if self.batch.ops.len() + reserved_ops + request.ops.len() >= ENTRY_OPS_MAX {
            return Ok(Outcome::Rejected {
                reason: format!("the entry would exceed ENTRY_OPS_MAX ({ENTRY_OPS_MAX}) ops"),
            });
        }
        for (index, condition) in request.conditions.iter().enumerate() {
            let current_version = match (self.state_of(&condition.key)?, compared) {
                (KeyState::Absent, _) => 0,
                (KeyState::Present { seq, .. }, Compared::Seq) => seq,
                (KeyState::Present { meta, .. }, Compared::ModRevision) => meta.mod_revision,
            };
            if current_version != condition.version {
                return Ok(Outcome::ConditionFailed {
                    index,
                    current_version,
                });
            }
        }
        // Work out every op's effect first: an expire of a missing key
        // fails the whole request before anything is written. The request
        // changes something unless it only deletes absent keys; if it does,
        // it writes at the next revision.
        let revision = self.revision + 1;
        let mut staged: Vec<(Vec<u8>, KeyState)> = Vec::with_capacity(request.ops.len());
        let mut old_expiries: Vec<(u64, Vec<u8>)> = Vec::new();
        let mut versions = Vec::with_capacity(request.ops.len());
        let mut existed = Vec::with_capacity(request.ops.len());
        for (index, op) in request.ops.iter().enumerate() {
            let seq = base + (self.batch.ops.len() + staged.len()) as u64;
            let expiry = |ttl_ms: u64| {
                if ttl_ms == 0 {
                    0
                } else {
                    now_ms.saturating_add(ttl_ms)
                }
            };
            let current = match staged
                .iter()
                .rev()
                .find(|(key, _)| key.as_slice() == op.key())
            {
                Some((_, state)) => state.clone(),
                None => self.state_of(op.key())?,
            };
            existed.push(matches!(current, KeyState::Present { .. }));
            if let KeyState::Present { expiry_ms, .. } = current
                && expiry_ms != 0
            {
                old_expiries.push((expiry_ms, op.key().to_vec()));
            }
            let next = match (op, current) {
                (Op::Put { value, ttl_ms, .. }, current) => KeyState::Present {
                    seq,
                    expiry_ms: expiry(*ttl_ms),
                    meta: match current {
                        KeyState::Present { meta, .. } => meta.modified(revision, 0),
                        KeyState::Absent => KeyMeta::created(revision, 0),
                    },
                    value: Some(value.clone()),
                },
                // Nothing to delete: no record, no revision (builds before
                // revisions wrote a tombstone all the same).
                (Op::Delete { .. }, KeyState::Absent) if !self.legacy => {
                    versions.push(0);
                    continue;
                }
                (Op::Delete { .. }, KeyState::Absent) => KeyState::Absent,
                (Op::Delete { .. }, KeyState::Present { .. }) => KeyState::Absent,
                (Op::Expire { ttl_ms, key }, KeyState::Present { value, meta, .. }) => {
                    KeyState::Present {
                        seq,
                        expiry_ms: expiry((*ttl_ms).max(1)),
                        meta: meta.modified(revision, self.kept_lease(key, meta.lease)),
                        value: Some(self.value_of(key, value)?),
                    }
                }
                (Op::Persist { key }, KeyState::Present { value, meta, .. }) => KeyState::Present {
                    seq,
                    expiry_ms: 0,
                    meta: meta.modified(revision, self.kept_lease(key, meta.lease)),
                    value: Some(self.value_of(key, value)?),
                },
                (Op::Expire { .. } | Op::Persist { .. }, KeyState::Absent) => {
                    return Ok(Outcome::KeyNotFound { index });
                }
            };
            versions.push(seq);
            staged.push((op.key().to_vec(), next));
        }
        if !staged.is_empty() && !self.legacy {
            self.revision = revision;
        }
        for old in old_expiries {
            self.expiries.remove(&old);
        }
        for (key, state) in staged {
            self.write_staged(key, state, revision)?;
        }
        Ok(Outcome::Applied { versions, existed })
    }

    /// Moves one write, worked out while its request was evaluated, into
    /// the batch, the overlay and the expiry index.
    fn write_staged(
        &mut self,
        key: Vec<u8>,
        state: KeyState,
        revision: u64,
    ) -> Result<(), ApplyError> {
        // The value moves into the batch; the overlay remembers only
        // that the key is there (a later expire or persist in this
        // entry finds the value in the batch).
        let remembered = match state {
            KeyState::Absent => {
                self.batch.ops.push(bitcask::Op::Delete {
                    key: key.clone(),
                    meta: if self.legacy {
                        bitcask::RecordMeta::EMPTY
                    } else {
                        tombstone_meta(revision)
                    },
                });
                KeyState::Absent
            }
            KeyState::Present {
                seq,
                expiry_ms,
                meta,
                value,
            } => {
                let value = self.value_of(&key, value)?;
                if expiry_ms != 0 {
                    self.expiries.insert((expiry_ms, key.clone()));
                }
                self.batch.ops.push(bitcask::Op::Put {
                    key: key.clone(),
                    value,
                    expiry_ms,
                    meta: if self.legacy {
                        bitcask::RecordMeta::EMPTY
                    } else {
                        meta.encode()
                    },
                });
                KeyState::Present {
                    seq,
                    expiry_ms,
                    meta,
                    value: None,
                }
            }
        };
        self.overlay.insert(key, remembered);
        Ok(())
    }

    /// The lease a rewrite that keeps a key's lease (expire, persist, a put
    /// with `ignore_lease`) stores: `lease` if the key is attached to it
    /// (or was written by this entry, whose puts checked their lease),
    /// else 0 — an id that is no lease of this key is not carried on
    /// (`crate::lease`, "Attached keys").
    fn kept_lease(&self, key: &[u8], lease: u64) -> u64 {
        if lease == 0 || self.overlay.contains_key(key) || self.leases.is_attached(lease, key) {
            lease
        } else {
            0
        }
    }

    /// Whether `key` counts as attached to `lease` already: attached before
    /// this entry, or written by it (whose puts were counted as they came).
    /// A key whose meta names the lease but that is not attached to it
    /// (stored before leases had a lifecycle) is not: a put on it adds a
    /// key to the lease.
    fn holds(&self, lease: u64, key: &[u8]) -> bool {
        self.overlay.contains_key(key) || self.leases.is_attached(lease, key)
    }

    /// The key's state as earlier ops of this entry left it, else the engine's.
    fn state_of(&self, key: &[u8]) -> Result<KeyState, ApplyError> {
        let now_ms = self.now_ms;
        if let Some(state) = self.overlay.get(key) {
            return Ok(match state {
                KeyState::Present { expiry_ms, .. } if *expiry_ms != 0 && *expiry_ms <= now_ms => {
                    KeyState::Absent
                }
                other => other.clone(),
            });
        }
        Ok(match self.engine.meta(key, now_ms) {
            Some(item) => KeyState::Present {
                seq: item.seq,
                expiry_ms: item.expiry_ms,
                meta: KeyMeta::decode(&item.meta)?,
                value: None,
            },
            None => KeyState::Absent,
        })
    }

    /// The value of a key [`EntryWrite::state_of`] found present: `known`
    /// if an op of this request set it, else the last put of this entry's
    /// batch, else the engine's (one disk read).
    fn value_of(&self, key: &[u8], known: Option<Vec<u8>>) -> Result<Vec<u8>, ApplyError> {
        if let Some(value) = known {
            return Ok(value);
        }
        if self.overlay.contains_key(key) {
            return Ok(self.written_value(key)?);
        }
        // The key directory said present a moment ago and only this apply
        // writes the engine, so a miss here is an inconsistent engine.
        match self.engine.get(key, self.now_ms)? {
            Some(item) => Ok(item.value),
            None => Err(missing_value(key, "the engine").into()),
        }
    }

    /// The value of a key the overlay holds present: an earlier put of
    /// this entry, found at its position in the batch (its `seq` minus the
    /// batch's first), else by a search from the batch's end.
    fn written_value(&self, key: &[u8]) -> Result<Vec<u8>, bitcask::Error> {
        let put_value = |op: &bitcask::Op| match op {
            bitcask::Op::Put { key: k, value, .. } if k.as_slice() == key => Some(value.clone()),
            _ => None,
        };
        let position = match self.overlay.get(key) {
            Some(KeyState::Present { seq, .. }) => seq
                .checked_sub(self.base)
                .and_then(|position| usize::try_from(position).ok()),
            _ => None,
        };
        position
            .and_then(|position| self.batch.ops.get(position))
            .and_then(put_value)
            .or_else(|| self.batch.ops.iter().rev().find_map(put_value))
            .ok_or_else(|| missing_value(key, "the entry's batch"))
    }
}

/// The engine error of a key found present whose value is missing: the
/// key directory, the overlay and the batch disagree.
fn missing_value(key: &[u8], whence: &str) -> bitcask::Error {
    bitcask::Error::Corruption {
        file: String::new(),
        offset: 0,
        reason: format!(
            "key {} is present but its value is not in {whence}",
            range::shown(key)
        ),
    }
}

/// A transaction's writes while its ops are evaluated, before any reaches
/// the entry's batch: in op order, one per key (a key written again keeps
/// its place).
#[derive(Debug, Default)]
struct Staged {
    writes: Vec<(Vec<u8>, KeyState)>,
    /// Key → its place in `writes`.
    index: BTreeMap<Vec<u8>, usize>,
}

impl Staged {
    fn get(&self, key: &[u8]) -> Option<&KeyState> {
        self.index.get(key).map(|&place| &self.writes[place].1)
    }

    /// The place `key`'s record will take among the transaction's.
    fn place(&self, key: &[u8]) -> usize {
        self.index.get(key).copied().unwrap_or(self.writes.len())
    }

    /// Puts staged so far that attach a key to `lease`.
    fn leased(&self, lease: u64) -> usize {
        self.writes
            .iter()
            .filter(
                |(_, state)| matches!(state, KeyState::Present { meta, .. } if meta.lease == lease),
            )
            .count()
    }

    fn stage(&mut self, key: Vec<u8>, state: KeyState) {
        match self.index.get(&key) {
            Some(&place) => self.writes[place].1 = state,
            None => {
                self.index.insert(key.clone(), self.writes.len());
                self.writes.push((key, state));
            }
        }
    }
}

/// What a read inside an entry sees over the engine: the entry's earlier
/// writes, and a transaction's staged ones on top when given.
struct EntryView<'v, 'e> {
    entry: &'v EntryWrite<'e>,
    staged: Option<&'v Staged>,
}

impl EntryView<'_, '_> {
    fn pending(&self, state: &KeyState) -> Pending {
        match state {
            KeyState::Present {
                expiry_ms, meta, ..
            } if *expiry_ms == 0 || *expiry_ms > self.entry.now_ms => Pending::Written(*meta),
            KeyState::Present { .. } | KeyState::Absent => Pending::Deleted,
        }
    }
}

impl Overlay for EntryView<'_, '_> {
    fn changed(&self, start: &[u8], end: &Bound<Vec<u8>>) -> Vec<(Vec<u8>, Pending)> {
        let end = match end {
            Bound::Included(end) => Bound::Included(end.as_slice()),
            Bound::Excluded(end) => Bound::Excluded(end.as_slice()),
            Bound::Unbounded => Bound::Unbounded,
        };
        // BTreeMap::range panics on an empty range: such a range holds nothing.
        let empty = match end {
            Bound::Included(end) => start > end,
            Bound::Excluded(end) => start >= end,
            Bound::Unbounded => false,
        };
        if empty {
            return Vec::new();
        }
        let bounds = (Bound::Included(start), end);
        let mut changed: BTreeMap<&[u8], Pending> = self
            .entry
            .overlay
            .range::<[u8], _>(bounds)
            .map(|(key, state)| (key.as_slice(), self.pending(state)))
            .collect();
        if let Some(staged) = self.staged {
            for (key, &place) in staged.index.range::<[u8], _>(bounds) {
                changed.insert(key.as_slice(), self.pending(&staged.writes[place].1));
            }
        }
        changed
            .into_iter()
            .map(|(key, pending)| (key.to_vec(), pending))
            .collect()
    }

    fn value(&self, key: &[u8]) -> Result<Vec<u8>, bitcask::Error> {
        match self.staged.and_then(|staged| staged.get(key)) {
            Some(KeyState::Present {
                value: Some(value), ..
            }) => Ok(value.clone()),
            Some(_) => Err(missing_value(key, "the transaction's writes")),
            None => self.entry.written_value(key),
        }
    }
}

/// Why a transaction stopped short: refused (its answer says why), or the
/// apply itself failed (the node stops).
#[derive(Debug)]
enum TxnFault {
    Refused(TxnError),
    Failed(ApplyError),
}

impl From<ApplyError> for TxnFault {
    fn from(error: ApplyError) -> Self {
        TxnFault::Failed(error)
    }
}

/// A refused transaction's answer: a lease that does not exist is told
/// apart (etcd answers NOT_FOUND), everything else is `Rejected`.
fn refused_txn(error: TxnError) -> Outcome {
    match error {
        TxnError::LeaseNotFound { .. } => Outcome::LeaseNotFound {
            reason: error.to_string(),
        },
        error => Outcome::Rejected {
            reason: error.to_string(),
        },
    }
}

/// A read of the transaction at `at` failed: the request's fault (a
/// revision, a budget), or the engine's.
fn read_fault(at: TxnPlace, error: RangeError) -> TxnFault {
    match error {
        RangeError::Engine(error) => TxnFault::Failed(ApplyError::Engine(error)),
        RangeError::Revision(error) => TxnFault::Failed(ApplyError::Revision(error)),
        // Nothing but this apply writes the engine: a key that changed
        // under a read is an inconsistent engine.
        RangeError::KeyChanged { key } => {
            TxnFault::Failed(missing_value(&key, "the engine at the sequence read").into())
        }
        source => TxnFault::Refused(TxnError::Read { at, source }),
    }
}

impl EntryWrite<'_> {
    /// Applies one transaction: its answer, or `Rejected` (and nothing
    /// written) if it is refused.
    fn evaluate_txn(&mut self, txn: &TxnRequest) -> Result<Outcome, ApplyError> {
        match self.stage_txn(txn) {
            Ok((succeeded, results, staged, read_bytes)) => match self.write_txn(staged) {
                Ok(()) => {
                    self.txn_read_bytes_left = self.txn_read_bytes_left.saturating_sub(read_bytes);
                    Ok(Outcome::Txn { succeeded, results })
                }
                Err(TxnFault::Refused(error)) => Ok(refused_txn(error)),
                Err(TxnFault::Failed(error)) => Err(error),
            },
            Err(TxnFault::Refused(error)) => Ok(refused_txn(error)),
            Err(TxnFault::Failed(error)) => Err(error),
        }
    }

    /// Checks the transaction, judges its compares and evaluates the ops
    /// of the branch they choose, staging its writes (nothing reaches the
    /// batch yet): whether it succeeded, one result per op, the writes.
    fn stage_txn(
        &self,
        txn: &TxnRequest,
    ) -> Result<(bool, Vec<TxnOpResult>, Staged, usize), TxnFault> {
        txn.check().map_err(TxnFault::Refused)?;
        let (engine, now_ms) = (self.engine, self.now_ms);
        // The store revision before the transaction: what its compares
        // and reads see, and one below the one its writes take.
        let before = self.revision;
        let revision = before + 1;
        // The transaction's own read budget, or what is left of the
        // entry's when that is less.
        let bytes = if self.txn_read_bytes_left < TXN_READ_BYTES_MAX {
            ("ENTRY_TXN_READ_BYTES_MAX", self.txn_read_bytes_left)
        } else {
            ("TXN_READ_BYTES_MAX", TXN_READ_BYTES_MAX)
        };
        let mut budget = Budget::new(("TXN_READ_KEYS_MAX", TXN_READ_KEYS_MAX), bytes);
        let mut succeeded = true;
        for (index, compare) in txn.compares.iter().enumerate() {
            let at = TxnPlace::Compare(index);
            let view = EntryView {
                entry: self,
                staged: None,
            };
            let bounds = KeyBounds::new(&compare.key, &compare.range_end);
            let kvs = range::visit(engine, Some(&view), &bounds, now_ms, &mut budget)
                .and_then(|found| {
                    let with_values = compare.reads_values();
                    range::key_values(engine, Some(&view), found, with_values, now_ms, &mut budget)
                })
                .map_err(|error| read_fault(at, error))?;
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
        let mut staged = Staged::default();
        let mut results = Vec::with_capacity(ops.len());
        for (index, op) in ops.iter().enumerate() {
            let at = TxnPlace::op(succeeded, index);
            let result = match op {
                TxnOp::Range(spec) => {
                    // As etcd: the revision before the transaction reads the
                    // state before it; 0 reads the transaction's writes too.
                    let view = EntryView {
                        entry: self,
                        staged: (spec.revision == 0).then_some(&staged),
                    };
                    let result =
                        range::evaluate(engine, Some(&view), spec, now_ms, before, &mut budget)
                            .map_err(|error| read_fault(at, error))?;
                    TxnOpResult::Range(result)
                }
                TxnOp::DeleteRange {
                    key,
                    range_end,
                    prev_kv,
                } => {
                    let view = EntryView {
                        entry: self,
                        staged: Some(&staged),
                    };
                    let bounds = KeyBounds::new(key, range_end);
                    let found = range::visit(engine, Some(&view), &bounds, now_ms, &mut budget)
                        .map_err(|error| read_fault(at, error))?;
                    let keys: Vec<Vec<u8>> = found.iter().map(|found| found.key.clone()).collect();
                    let prev_kvs = if *prev_kv {
                        range::key_values(engine, Some(&view), found, true, now_ms, &mut budget)
                            .map_err(|error| read_fault(at, error))?
                    } else {
                        Vec::new()
                    };
                    let deleted = keys.len() as u64;
                    for key in keys {
                        staged.stage(key, KeyState::Absent);
                    }
                    TxnOpResult::DeleteRange { deleted, prev_kvs }
                }
                TxnOp::Put {
                    key,
                    value,
                    ttl_ms,
                    lease,
                    prev_kv,
                    ignore_value,
                    ignore_lease,
                } => {
                    let current = match staged.get(key) {
                        Some(state) => state.clone(),
                        None => self.state_of(key)?,
                    };
                    // A key already attached to the lease adds no key to it.
                    let reattached = matches!(
                        &current,
                        KeyState::Present { meta, .. } if meta.lease == *lease
                    ) && self.holds(*lease, key);
                    let (meta, previous) = match current {
                        KeyState::Present {
                            meta, value: known, ..
                        } => {
                            let old_value = if *prev_kv || *ignore_value {
                                self.value_of(key, known)?
                            } else {
                                Vec::new()
                            };
                            // A kept value is read like a returned one
                            // (prev_kv charges it below).
                            if *ignore_value && !*prev_kv {
                                budget
                                    .take_bytes(old_value.len())
                                    .map_err(|error| read_fault(at, error))?;
                            }
                            let lease = if *ignore_lease {
                                self.kept_lease(key, meta.lease)
                            } else {
                                *lease
                            };
                            (meta.modified(revision, lease), Some((meta, old_value)))
                        }
                        KeyState::Absent if *ignore_value || *ignore_lease => {
                            return Err(TxnFault::Refused(TxnError::KeyNotFound {
                                at,
                                key: key.clone(),
                            }));
                        }
                        KeyState::Absent => (KeyMeta::created(revision, *lease), None),
                    };
                    if !*ignore_lease && *lease != 0 {
                        let more = staged.leased(*lease) + usize::from(!reattached);
                        match self.leases.attach_check(*lease, more) {
                            Ok(true) => {}
                            Ok(false) => {
                                return Err(TxnFault::Refused(TxnError::LeaseKeys {
                                    at,
                                    lease: *lease,
                                }));
                            }
                            Err(_) => {
                                return Err(TxnFault::Refused(TxnError::LeaseNotFound {
                                    at,
                                    lease: *lease,
                                }));
                            }
                        }
                    }
                    let (value, prev_kv) = match previous {
                        Some((old_meta, old_value)) => {
                            let prev_kv = if *prev_kv {
                                budget
                                    .take_bytes(old_value.len())
                                    .map_err(|error| read_fault(at, error))?;
                                Some(KeyValue::from_meta(
                                    key.clone(),
                                    old_value.clone(),
                                    &old_meta,
                                ))
                            } else {
                                None
                            };
                            let value = if *ignore_value {
                                old_value
                            } else {
                                value.clone()
                            };
                            (value, prev_kv)
                        }
                        None => (value.clone(), None),
                    };
                    let seq = self.base + (self.batch.ops.len() + staged.place(key)) as u64;
                    let expiry_ms = match ttl_ms {
                        0 => 0,
                        ttl_ms => now_ms.saturating_add(*ttl_ms),
                    };
                    staged.stage(
                        key.clone(),
                        KeyState::Present {
                            seq,
                            expiry_ms,
                            meta,
                            value: Some(value),
                        },
                    );
                    TxnOpResult::Put { prev_kv }
                }
            };
            results.push(result);
        }
        Ok((succeeded, results, staged, budget.bytes_used()))
    }

    /// Moves a transaction's staged writes into the batch at the next store
    /// revision, or refuses them all if the entry cannot hold them. No
    /// writes: nothing happens, the revision stays.
    fn write_txn(&mut self, staged: Staged) -> Result<(), TxnFault> {
        if staged.writes.is_empty() {
            return Ok(());
        }
        let revision = self.revision + 1;
        // Room beside the entry's records, its session records and the
        // idle-session evictions, as for a request.
        let batched = self.batch.ops.len()
            + self.leases.pending_records()
            + self.touched_sessions.len()
            + 1
            + SESSION_EVICTIONS_PER_ENTRY_MAX;
        let writes = staged.writes.len();
        if batched + writes >= ENTRY_OPS_MAX {
            return Err(TxnFault::Refused(TxnError::EntryOps { writes, batched }));
        }
        let bytes: usize = staged
            .writes
            .iter()
            .map(|(key, state)| match state {
                KeyState::Present { meta, value, .. } => bitcask::format::record_size(
                    key.len(),
                    value.as_ref().map_or(0, Vec::len),
                    meta.encode().len(),
                ),
                KeyState::Absent => {
                    bitcask::format::record_size(key.len(), 0, tombstone_meta(revision).len())
                }
            })
            .sum();
        let batched = self.batch_bytes();
        if batched + bytes > TXN_ENTRY_BATCH_BYTES_MAX {
            return Err(TxnFault::Refused(TxnError::EntryBytes { bytes, batched }));
        }
        for (key, state) in staged.writes {
            let before = self.state_of(&key)?;
            if let KeyState::Present { expiry_ms, .. } = before
                && expiry_ms != 0
            {
                self.expiries.remove(&(expiry_ms, key.clone()));
            }
            if let KeyState::Present { meta, .. } = &state
                && meta.lease != 0
                && !(matches!(before, KeyState::Present { meta: old, .. } if old.lease == meta.lease)
                    && self.holds(meta.lease, &key))
            {
                self.leases.attaching(meta.lease, 1);
            }
            self.write_staged(key, state, revision)?;
        }
        self.revision = revision;
        Ok(())
    }

    /// Bytes of the records in the batch so far (counting only the records
    /// added since the last call).
    fn batch_bytes(&mut self) -> usize {
        let (counted, bytes) = &mut self.batch_bytes;
        for op in &self.batch.ops[*counted..] {
            *bytes += match op {
                bitcask::Op::Put {
                    key, value, meta, ..
                } => bitcask::format::record_size(key.len(), value.len(), meta.len()),
                bitcask::Op::Delete { key, meta } => {
                    bitcask::format::record_size(key.len(), 0, meta.len())
                }
            };
        }
        *counted = self.batch.ops.len();
        *bytes
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use bitcask::{Options, SyncPolicy};
    use vfs::sim::SimFs;

    use super::*;
    use crate::command::Condition;
    use crate::revision::split_commit_meta;

    fn engine(fs: &SimFs) -> Engine {
        let opts = Options {
            sync: SyncPolicy::Never,
            auto_merge: None,
            segment_size_bytes: 4096,
            vfs: Arc::new(fs.clone()),
            ..Options::default()
        };
        Engine::open("/sm", opts).unwrap()
    }

    fn put(key: &str, value: &str) -> Op {
        Op::Put {
            key: key.into(),
            value: value.into(),
            ttl_ms: 0,
        }
    }

    fn request(ops: Vec<Op>) -> Request {
        Request {
            session: None,
            conditions: Vec::new(),
            ops,
        }
    }

    fn outcomes(response: &EntryResponse) -> Vec<Outcome> {
        response.answers.iter().map(|a| a.outcome.clone()).collect()
    }

    fn requests(time_ms: u64, requests: Vec<Request>) -> Proposal {
        Proposal {
            time_ms,
            command: Command::Requests(requests),
        }
    }

    #[test]
    fn versions_name_the_entry_and_position_and_later_requests_see_earlier_ones() {
        let fs = SimFs::new();
        let engine = engine(&fs);
        let mut applier = Applier::default();
        let first = request(vec![put("a", "1"), put("a", "2")]);
        // Conditioned on the version the first request gives "a" (position 1).
        let second = Request {
            conditions: vec![Condition {
                key: b"a".to_vec(),
                version: 7 * VERSIONS_PER_INDEX + 1,
            }],
            ..request(vec![put("b", "x")])
        };
        let response = applier
            .apply(
                &engine,
                7,
                &requests(100, vec![first, second]),
                b"meta".to_vec(),
            )
            .unwrap();
        assert_eq!(
            outcomes(&response),
            vec![
                Outcome::Applied {
                    versions: vec![7 * VERSIONS_PER_INDEX, 7 * VERSIONS_PER_INDEX + 1],
                    existed: vec![false, true],
                },
                Outcome::Applied {
                    versions: vec![7 * VERSIONS_PER_INDEX + 2],
                    existed: vec![false]
                },
            ]
        );
        let a = engine.get(b"a", 100).unwrap().unwrap();
        assert_eq!(
            (a.value.as_slice(), a.seq),
            (&b"2"[..], 7 * VERSIONS_PER_INDEX + 1)
        );
        // A store that never applied an entry of a build with revisions
        // applies `Requests` as builds before revisions did: the commit
        // record is the node's meta alone, and no record carries a meta.
        assert_eq!(engine.last_commit_meta().unwrap(), b"meta");
        assert!(a.meta.is_empty());
        assert!(!applier.revisions_on());
    }

    /// More keys running out at once than one entry may delete: the next
    /// entries delete the rest, in order, each key at a revision of its own,
    /// and nothing makes an entry unappliable.
    #[test]
    fn a_burst_of_expiries_spreads_over_entries() {
        let fs = SimFs::new();
        let engine = engine(&fs);
        let mut applier = Applier::default();
        let burst = EXPIRY_DELETES_PER_ENTRY_MAX + 100;
        let ops = (0..burst)
            .map(|i| Op::Put {
                key: format!("k{i:05}").into_bytes(),
                value: b"v".to_vec(),
                ttl_ms: 10,
            })
            .collect();
        let put = applier
            .apply(&engine, 1, &writes(0, vec![request(ops)]), Vec::new())
            .unwrap();
        assert_eq!(put.revision, 2);
        let advance = |time_ms| Proposal {
            time_ms,
            command: Command::Advance,
        };
        let first = applier
            .apply(&engine, 2, &advance(100), Vec::new())
            .unwrap();
        assert_eq!(first.revision, 2 + EXPIRY_DELETES_PER_ENTRY_MAX as u64);
        assert_eq!(applier.expiring_keys(), 100);
        let second = applier
            .apply(&engine, 3, &advance(101), Vec::new())
            .unwrap();
        assert_eq!(second.revision, 2 + burst as u64);
        assert_eq!(applier.expiring_keys(), 0);
        assert!(engine.scan(&bitcask::Scan::all(10), 0).unwrap().is_empty());
    }

    /// An upgrade: replicas that applied different prefixes of an old log
    /// with the old build, then the rest with this one (each after a
    /// restart), count the same revisions and write the same files; the
    /// old entries' deletes of absent keys still write tombstones, and
    /// revisions start at the first entry of a build with revisions.
    #[test]
    fn replicas_upgraded_at_different_indexes_agree() {
        let old_log: Vec<Proposal> = vec![
            requests(10, vec![request(vec![put("a", "1")])]),
            requests(
                20,
                vec![request(vec![
                    Op::Delete {
                        key: b"never".to_vec(),
                    },
                    Op::Put {
                        key: b"t".to_vec(),
                        value: b"ttl".to_vec(),
                        ttl_ms: 5,
                    },
                ])],
            ),
            Proposal {
                time_ms: 40,
                command: Command::Tick,
            },
            requests(50, vec![request(vec![put("b", "2")])]),
        ];
        let new_log: Vec<Proposal> = vec![
            Proposal {
                time_ms: 60,
                command: Command::Advance,
            },
            writes(70, vec![request(vec![put("a", "3")])]),
        ];
        let mut files = Vec::new();
        for upgraded_at in [0, 2, 4] {
            let fs = SimFs::new();
            let engine = engine(&fs);
            let mut applier = Applier::default();
            let mut index = 1;
            for proposal in &old_log[..upgraded_at] {
                applier.apply(&engine, index, proposal, Vec::new()).unwrap();
                index += 1;
            }
            // The restart on the new build.
            let mut applier = Applier::load(&engine).unwrap();
            for proposal in &old_log[upgraded_at..] {
                let response = applier.apply(&engine, index, proposal, Vec::new()).unwrap();
                assert!(response.answers.iter().all(|a| a.revision == 0));
                index += 1;
            }
            assert!(!applier.revisions_on());
            assert_eq!(engine.get(b"never", 60).unwrap(), None);
            // The first entry of the new build turns revisions on at 1 and
            // deletes the expired key at revision 2; the put is revision 3.
            applier
                .apply(&engine, index, &new_log[0], Vec::new())
                .unwrap();
            assert!(applier.revisions_on());
            assert_eq!(applier.header().revision, 2);
            let response = applier
                .apply(&engine, index + 1, &new_log[1], Vec::new())
                .unwrap();
            assert_eq!(response.revision, 3);
            assert_eq!(key_meta(&engine, "a").unwrap().mod_revision, 3);
            files.push((engine.sealed_files(), engine.active_file()));
        }
        assert!(files.windows(2).all(|pair| pair[0] == pair[1]));
    }

    #[test]
    fn a_failed_condition_applies_nothing_of_its_request() {
        let fs = SimFs::new();
        let engine = engine(&fs);
        let mut applier = Applier::default();
        applier
            .apply(
                &engine,
                1,
                &requests(0, vec![request(vec![put("k", "v")])]),
                Vec::new(),
            )
            .unwrap();
        let guarded = Request {
            conditions: vec![Condition {
                key: b"k".to_vec(),
                version: 0,
            }],
            ..request(vec![put("k", "other"), put("j", "x")])
        };
        let response = applier
            .apply(&engine, 2, &requests(0, vec![guarded]), Vec::new())
            .unwrap();
        assert_eq!(
            outcomes(&response),
            vec![Outcome::ConditionFailed {
                index: 0,
                current_version: VERSIONS_PER_INDEX
            }]
        );
        assert_eq!(engine.get(b"k", 0).unwrap().unwrap().value, b"v");
        assert_eq!(engine.get(b"j", 0).unwrap(), None);
        // The entry still committed (as an empty batch with its metadata).
        assert_eq!(engine.last_seq(), 2 * VERSIONS_PER_INDEX);
    }

    #[test]
    fn ttl_expire_and_persist_follow_cluster_time() {
        let fs = SimFs::new();
        let engine = engine(&fs);
        let mut applier = Applier::default();
        let ttl_put = Op::Put {
            key: b"t".to_vec(),
            value: b"v".to_vec(),
            ttl_ms: 1_000,
        };
        applier
            .apply(
                &engine,
                1,
                &requests(5_000, vec![request(vec![ttl_put])]),
                Vec::new(),
            )
            .unwrap();
        assert!(engine.get(b"t", 5_999).unwrap().is_some());
        assert!(engine.get(b"t", 6_000).unwrap().is_none());
        let persist = request(vec![Op::Persist { key: b"t".to_vec() }]);
        let response = applier
            .apply(&engine, 2, &requests(5_500, vec![persist]), Vec::new())
            .unwrap();
        assert!(matches!(outcomes(&response)[0], Outcome::Applied { .. }));
        assert!(
            engine.get(b"t", u64::MAX - 1).unwrap().is_some(),
            "persist removed the TTL"
        );
        // An expired key is absent: expire on it fails and writes nothing.
        let ttl_put = Op::Put {
            key: b"gone".to_vec(),
            value: b"v".to_vec(),
            ttl_ms: 10,
        };
        applier
            .apply(
                &engine,
                3,
                &requests(6_000, vec![request(vec![ttl_put])]),
                Vec::new(),
            )
            .unwrap();
        let expire = request(vec![
            put("other", "1"),
            Op::Expire {
                key: b"gone".to_vec(),
                ttl_ms: 50,
            },
        ]);
        let response = applier
            .apply(&engine, 4, &requests(6_010, vec![expire]), Vec::new())
            .unwrap();
        assert_eq!(outcomes(&response), vec![Outcome::KeyNotFound { index: 1 }]);
        assert_eq!(engine.get(b"other", 6_010).unwrap(), None);
    }

    #[test]
    fn expire_and_persist_keep_the_value_wherever_it_was_set() {
        // A put or delete never reads the old value; expire and persist
        // rewrite it, from the engine, from an earlier request of the same
        // entry (its batch), or from an earlier op of the same request.
        let fs = SimFs::new();
        let engine = engine(&fs);
        let mut applier = Applier::default();
        let expire = |key: &str| Op::Expire {
            key: key.into(),
            ttl_ms: 1_000,
        };
        let persist = |key: &str| Op::Persist { key: key.into() };
        applier
            .apply(
                &engine,
                1,
                &requests(0, vec![request(vec![put("in-engine", "e")])]),
                Vec::new(),
            )
            .unwrap();
        let response = applier
            .apply(
                &engine,
                2,
                &requests(
                    0,
                    vec![
                        request(vec![expire("in-engine"), put("in-batch", "b")]),
                        request(vec![expire("in-batch"), put("same", "s"), persist("same")]),
                        request(vec![put("gone", "g"), Op::Delete { key: "gone".into() }]),
                        request(vec![persist("gone")]),
                    ],
                ),
                Vec::new(),
            )
            .unwrap();
        assert!(matches!(
            &outcomes(&response)[..3],
            [
                Outcome::Applied { .. },
                Outcome::Applied { .. },
                Outcome::Applied { .. }
            ]
        ));
        assert_eq!(outcomes(&response)[3], Outcome::KeyNotFound { index: 0 });
        for (key, value, expiry_ms) in [
            ("in-engine", "e", 1_000),
            ("in-batch", "b", 1_000),
            ("same", "s", 0),
        ] {
            let item = engine.get(key.as_bytes(), 0).unwrap().unwrap();
            assert_eq!(
                (item.value.as_slice(), item.expiry_ms),
                (value.as_bytes(), expiry_ms),
                "{key}"
            );
        }
        assert_eq!(engine.get(b"gone", 0).unwrap(), None);
        let meta = engine.meta(b"in-engine", 0).unwrap();
        assert_eq!((meta.expiry_ms, meta.value_len), (1_000, 1));
        assert_eq!(engine.meta(b"in-engine", 1_000), None, "expired");
    }

    #[test]
    fn a_retried_request_applies_once_and_gets_its_first_answer() {
        let fs = SimFs::new();
        let engine = engine(&fs);
        let mut applier = Applier::default();
        let session = |sequence, lowest_unacked| {
            Some(SessionRef {
                client_id: 42,
                sequence,
                lowest_unacked,
                opens: sequence == 1,
            })
        };
        let write = Request {
            session: session(1, 1),
            ..request(vec![put("k", "first")])
        };
        let first = applier
            .apply(&engine, 1, &requests(0, vec![write.clone()]), Vec::new())
            .unwrap();
        // The same request again (the reply was lost), after another client wrote the key.
        applier
            .apply(
                &engine,
                2,
                &requests(0, vec![request(vec![put("k", "second")])]),
                Vec::new(),
            )
            .unwrap();
        let retry = applier
            .apply(&engine, 3, &requests(0, vec![write]), Vec::new())
            .unwrap();
        assert_eq!(
            retry.answers, first.answers,
            "the retry returns the original answer"
        );
        assert_eq!(
            engine.get(b"k", 0).unwrap().unwrap().value,
            b"second",
            "and does not apply again"
        );
        // Once acknowledged (lowest_unacked moved past it), its answer is forgotten.
        let next = Request {
            session: session(2, 2),
            ..request(vec![put("x", "1")])
        };
        applier
            .apply(&engine, 4, &requests(0, vec![next]), Vec::new())
            .unwrap();
        let late = Request {
            session: session(1, 2),
            ..request(vec![put("k", "first")])
        };
        let response = applier
            .apply(&engine, 5, &requests(0, vec![late]), Vec::new())
            .unwrap();
        assert_eq!(outcomes(&response), vec![Outcome::SessionExpired]);
        // Sessions are in the engine: a reloaded applier knows them.
        let reloaded = Applier::load(&engine).unwrap();
        assert_eq!(reloaded.sessions, applier.sessions);
        // Idle sessions are evicted by cluster time, from memory and engine.
        applier
            .apply(
                &engine,
                6,
                &Proposal {
                    time_ms: SESSION_IDLE_MS_MAX,
                    command: Command::Tick,
                },
                Vec::new(),
            )
            .unwrap();
        assert_eq!(applier.session_count(), 0);
        assert_eq!(Applier::load(&engine).unwrap().session_count(), 0);
    }

    /// A request for a session this state machine does not hold is not
    /// applied unless it opens the session: after an eviction, a retry of a
    /// write that may have applied gets SESSION_EXPIRED (outcome unknown),
    /// never a second application. Fails with `nc-unknown-sessions`.
    #[test]
    fn a_request_for_an_unknown_session_that_does_not_open_it_is_not_applied() {
        let fs = SimFs::new();
        let engine = engine(&fs);
        let mut applier = Applier::default().with_session_idle_ms(1_000);
        let write = |sequence, opens, value: &str| Request {
            session: Some(SessionRef {
                client_id: 7,
                sequence,
                lowest_unacked: sequence,
                opens,
            }),
            ..request(vec![put("counter", value)])
        };
        // Never opened: refused.
        let never = applier
            .apply(
                &engine,
                1,
                &requests(0, vec![write(5, false, "x")]),
                Vec::new(),
            )
            .unwrap();
        assert_eq!(outcomes(&never), vec![Outcome::SessionExpired]);
        assert_eq!(applier.session_count(), 0, "no session was created");
        assert_eq!(engine.get(b"counter", 0).unwrap(), None);
        // Opened, applied; then idle past the window: evicted.
        let first = applier
            .apply(
                &engine,
                2,
                &requests(10, vec![write(1, true, "a")]),
                Vec::new(),
            )
            .unwrap();
        assert!(matches!(outcomes(&first)[0], Outcome::Applied { .. }));
        applier
            .apply(&engine, 3, &requests(2_000, vec![]), Vec::new())
            .unwrap();
        assert_eq!(applier.session_count(), 0, "evicted after 1 s idle");
        // Someone else writes the key; then the client's retry of sequence 2
        // (its reply lost before the eviction) arrives: not applied again.
        applier
            .apply(
                &engine,
                4,
                &requests(2_100, vec![request(vec![put("counter", "other")])]),
                Vec::new(),
            )
            .unwrap();
        let retry = applier
            .apply(
                &engine,
                5,
                &requests(2_200, vec![write(2, false, "a")]),
                Vec::new(),
            )
            .unwrap();
        assert_eq!(outcomes(&retry), vec![Outcome::SessionExpired]);
        assert_eq!(engine.get(b"counter", 0).unwrap().unwrap().value, b"other");
        assert_eq!(applier.session_count(), 0);
        assert_eq!(Applier::load(&engine).unwrap().session_count(), 0);
    }

    /// Cluster time never decreases along the log, even when the leader's
    /// stamps arrive out of order. Fails with `nc-old-clock`.
    #[test]
    fn entry_time_never_steps_back() {
        assert_eq!(entry_time_ms(100, 250), 250);
        assert_eq!(entry_time_ms(250, 249), 250, "a stamp 1 ms behind");
        assert_eq!(entry_time_ms(0, 0), 0);
    }

    #[test]
    fn reserved_keys_are_refused() {
        let fs = SimFs::new();
        let engine = engine(&fs);
        let mut applier = Applier::default();
        let key = [RESERVED_KEY_PREFIX, b"x"].concat();
        let bad = request(vec![Op::Put {
            key: key.clone(),
            value: b"v".to_vec(),
            ttl_ms: 0,
        }]);
        let response = applier
            .apply(&engine, 1, &requests(0, vec![bad]), Vec::new())
            .unwrap();
        assert!(matches!(outcomes(&response)[0], Outcome::Rejected { .. }));
        assert_eq!(engine.get(&key, 0).unwrap(), None);
    }

    #[test]
    fn replicas_applying_the_same_entries_write_identical_files() {
        let entries: Vec<Proposal> = (0..200u64)
            .map(|i| {
                let session = Some(SessionRef {
                    client_id: i % 3,
                    sequence: i,
                    lowest_unacked: i.saturating_sub(2),
                    opens: i < 3,
                });
                let ops = vec![
                    Op::Put {
                        key: format!("k{}", i % 17).into_bytes(),
                        value: vec![i as u8; 40],
                        ttl_ms: i % 5 * 100,
                    },
                    Op::Delete {
                        key: format!("k{}", (i + 5) % 17).into_bytes(),
                    },
                ];
                requests(
                    i * 10,
                    vec![Request {
                        session,
                        conditions: Vec::new(),
                        ops,
                    }],
                )
            })
            .collect();
        let run = || {
            let fs = SimFs::new();
            let engine = engine(&fs);
            let mut applier = Applier::default();
            for (i, proposal) in entries.iter().enumerate() {
                applier
                    .apply(
                        &engine,
                        i as u64 + 1,
                        proposal,
                        (i as u64).to_le_bytes().to_vec(),
                    )
                    .unwrap();
            }
            (engine.sealed_files(), engine.active_file())
        };
        let (sealed_a, active_a) = run();
        let (sealed_b, active_b) = run();
        assert!(sealed_a.len() >= 4, "the workload seals segments");
        assert_eq!(sealed_a, sealed_b);
        assert_eq!(active_a, active_b);
    }

    fn writes(time_ms: u64, requests: Vec<Request>) -> Proposal {
        Proposal {
            time_ms,
            command: Command::Writes(requests),
        }
    }

    fn key_meta(engine: &Engine, key: &str) -> Option<KeyMeta> {
        engine
            .meta(key.as_bytes(), 0)
            .map(|item| KeyMeta::decode(&item.meta).unwrap())
    }

    fn answer_revisions(response: &EntryResponse) -> Vec<u64> {
        response.answers.iter().map(|a| a.revision).collect()
    }

    /// Revisions as etcd counts them: one per request that changes
    /// something; a failed condition, a delete of nothing and a tick leave
    /// the store revision alone.
    #[test]
    fn the_store_revision_advances_once_per_changing_request() {
        let fs = SimFs::new();
        let engine = engine(&fs);
        let mut applier = Applier::default();
        assert_eq!(applier.header().revision, 1, "a fresh store is at 1");
        let delete = |key: &str| Op::Delete { key: key.into() };
        let if_at = |key: &str, revision: u64, ops| Request {
            conditions: vec![Condition {
                key: key.into(),
                version: revision,
            }],
            ..request(ops)
        };
        let response = applier
            .apply(
                &engine,
                1,
                &writes(
                    0,
                    vec![
                        request(vec![put("a", "1"), put("b", "1")]), // 2: two keys, one revision
                        request(vec![put("a", "2")]),                // 3
                        request(vec![delete("nothing")]),            // stays 3
                        if_at("a", 2, vec![put("a", "x")]),          // fails: a is at 3
                        if_at("a", 3, vec![delete("b")]),            // 4
                        request(vec![delete("b"), put("c", "1")]),   // 5: the put changes
                    ],
                ),
                Vec::new(),
            )
            .unwrap();
        assert_eq!(answer_revisions(&response), vec![2, 3, 3, 3, 4, 5]);
        assert_eq!(response.revision, 5);
        assert_eq!(
            outcomes(&response)[3],
            Outcome::ConditionFailed {
                index: 0,
                current_version: 3
            },
            "a Writes condition compares mod_revision"
        );
        assert_eq!(
            key_meta(&engine, "a"),
            Some(KeyMeta {
                create_revision: 2,
                mod_revision: 3,
                version: 2,
                lease: 0
            })
        );
        assert_eq!(key_meta(&engine, "b"), None);
        assert_eq!(key_meta(&engine, "c"), Some(KeyMeta::created(5, 0)));
        let Outcome::Applied { versions, existed } = &outcomes(&response)[2] else {
            panic!("a delete of nothing applies");
        };
        assert_eq!(
            (versions.as_slice(), existed.as_slice()),
            (&[0][..], &[false][..])
        );
        // A tick and a merge change nothing.
        let tick = Proposal {
            time_ms: 10,
            command: Command::Tick,
        };
        assert_eq!(
            applier
                .apply(&engine, 2, &tick, Vec::new())
                .unwrap()
                .revision,
            5
        );
        // Recreated after a delete: created anew, version 1.
        applier
            .apply(
                &engine,
                3,
                &writes(20, vec![request(vec![put("b", "again")])]),
                Vec::new(),
            )
            .unwrap();
        assert_eq!(key_meta(&engine, "b"), Some(KeyMeta::created(6, 0)));
        // The revision is in the commit record: a reloaded applier goes on from it.
        let reloaded = Applier::load(&engine).unwrap();
        assert_eq!(reloaded.header().revision, 6);
        let (header, _) = split_commit_meta(&engine.last_commit_meta().unwrap()).unwrap();
        assert_eq!(header.revision, 6);
        assert_eq!(
            split_commit_meta(&applier.commit_meta(b"node")).unwrap(),
            (header, &b"node"[..])
        );
    }

    /// Expire and persist change the key (a new revision and version); a
    /// delete's tombstone carries the delete's revision.
    #[test]
    fn expire_persist_and_delete_write_at_their_revision() {
        let fs = SimFs::new();
        let engine = engine(&fs);
        let mut applier = Applier::default();
        let ops = vec![
            request(vec![put("k", "v")]),
            request(vec![Op::Expire {
                key: "k".into(),
                ttl_ms: 5_000,
            }]),
            request(vec![Op::Persist { key: "k".into() }]),
        ];
        let response = applier
            .apply(&engine, 1, &writes(0, ops), Vec::new())
            .unwrap();
        assert_eq!(answer_revisions(&response), vec![2, 3, 4]);
        assert_eq!(
            key_meta(&engine, "k"),
            Some(KeyMeta {
                create_revision: 2,
                mod_revision: 4,
                version: 3,
                lease: 0
            })
        );
        applier
            .apply(
                &engine,
                2,
                &writes(0, vec![request(vec![Op::Delete { key: "k".into() }])]),
                Vec::new(),
            )
            .unwrap();
        let tombstone = engine
            .scan(
                &bitcask::Scan {
                    keys_only: true,
                    ..bitcask::Scan::all(10)
                },
                0,
            )
            .unwrap();
        assert!(tombstone.is_empty(), "deleted");
        assert_eq!(applier.header().revision, 5);
    }

    /// A key whose TTL runs out is deleted by the first entry whose
    /// cluster time reaches its expiry, at a revision of its own, found
    /// through the expiry index; the index survives a reload.
    #[test]
    fn expiry_deletes_the_key_at_a_revision_of_its_own() {
        let fs = SimFs::new();
        let engine = engine(&fs);
        let mut applier = Applier::default();
        let ttl_put = |key: &str, ttl_ms| Op::Put {
            key: key.into(),
            value: b"v".to_vec(),
            ttl_ms,
        };
        applier
            .apply(
                &engine,
                1,
                &writes(
                    1_000,
                    vec![request(vec![ttl_put("short", 500), ttl_put("long", 5_000)])],
                ),
                Vec::new(),
            )
            .unwrap();
        assert_eq!((applier.header().revision, applier.expiring_keys()), (2, 2));
        // Overwritten without a TTL: out of the index.
        applier
            .apply(
                &engine,
                2,
                &writes(1_100, vec![request(vec![put("long", "kept")])]),
                Vec::new(),
            )
            .unwrap();
        assert_eq!((applier.header().revision, applier.expiring_keys()), (3, 1));
        let tick = |time_ms| Proposal {
            time_ms,
            command: Command::Tick,
        };
        assert_eq!(
            applier
                .apply(&engine, 3, &tick(1_499), Vec::new())
                .unwrap()
                .revision,
            3
        );
        // A reloaded applier (a restart) knows the TTL from the key directory.
        let mut applier = Applier::load(&engine).unwrap();
        assert_eq!(applier.expiring_keys(), 1);
        // The entry that reaches the expiry deletes first, then applies its
        // requests: a condition that the key is absent holds.
        let if_absent = Request {
            conditions: vec![Condition {
                key: "short".into(),
                version: 0,
            }],
            ..request(vec![put("after", "1")])
        };
        let response = applier
            .apply(&engine, 4, &writes(1_500, vec![if_absent]), Vec::new())
            .unwrap();
        assert_eq!(answer_revisions(&response), vec![5], "the delete took 4");
        assert!(matches!(outcomes(&response)[0], Outcome::Applied { .. }));
        assert_eq!(applier.expiring_keys(), 0);
        assert_eq!(
            engine.meta(b"short", 0),
            None,
            "a tombstone, not a hidden record"
        );
        assert_eq!(key_meta(&engine, "long").unwrap().mod_revision, 3);
    }

    /// Answers stored by a build before revisions still replay.
    #[test]
    fn a_session_record_stored_before_revisions_still_reads() {
        #[derive(Serialize)]
        struct Legacy {
            last_active_ms: u64,
            forgotten_below: u64,
            answers: BTreeMap<u64, Outcome>,
        }
        let legacy = Legacy {
            last_active_ms: 123,
            forgotten_below: 4,
            answers: BTreeMap::from([(5, Outcome::SessionExpired)]),
        };
        let stored = codec::encode(&legacy);
        let record = SessionRecord::decode(&stored).unwrap();
        assert_eq!(record.last_active_ms, 123);
        // The same revision wherever and whenever the record was loaded.
        assert_eq!(
            record.answers[&5],
            Answer {
                outcome: Outcome::SessionExpired,
                revision: LEGACY_ANSWER_REVISION
            }
        );
        let again = SessionRecord::decode(&record.encode()).unwrap();
        assert_eq!(again, record);
        // Before revisions are on, records are stored in the old form, byte
        // for byte.
        assert_eq!(record.encode_legacy(), stored);
    }

    /// Revisions, metas and expiry deletes are as deterministic as the rest.
    #[test]
    fn replicas_with_revisions_and_expiries_write_identical_files() {
        let entries: Vec<Proposal> = (0..300u64)
            .map(|i| {
                let key = |n: u64| format!("k{}", n % 23).into_bytes();
                // Leases: granted, attached to, renewed, expiring.
                let lease = |op| crate::command::LeaseRequest { session: None, op };
                let command = match i % 10 {
                    3 => Some(Command::Leases(vec![lease(LeaseOp::Grant {
                        id: i + 1,
                        ttl_ms: 2_000 + i % 3 * 100,
                    })])),
                    5 => Some(Command::Txns(vec![TxnRequest {
                        session: None,
                        compares: Vec::new(),
                        success: vec![TxnOp::Put {
                            key: key(i),
                            value: vec![i as u8; 10],
                            ttl_ms: 0,
                            lease: i - 1,
                            prev_kv: false,
                            ignore_value: false,
                            ignore_lease: false,
                        }],
                        failure: Vec::new(),
                    }])),
                    // Every other lease is renewed; the others expire.
                    7 if i % 20 == 7 => Some(Command::Leases(vec![lease(LeaseOp::Renew {
                        ids: (0..i).filter(|j| j % 20 == 3).map(|j| j + 1).collect(),
                    })])),
                    _ => None,
                };
                if let Some(command) = command {
                    return Proposal {
                        time_ms: i * 17,
                        command,
                    };
                }
                writes(
                    i * 17,
                    vec![
                        request(vec![Op::Put {
                            key: key(i),
                            value: vec![i as u8; 30],
                            ttl_ms: i % 4 * 40,
                        }]),
                        request(vec![Op::Delete { key: key(i + 9) }]),
                    ],
                )
            })
            .collect();
        let run = || {
            let fs = SimFs::new();
            let engine = engine(&fs);
            let mut applier = Applier::default();
            for (i, proposal) in entries.iter().enumerate() {
                applier
                    .apply(&engine, i as u64 + 1, proposal, Vec::new())
                    .unwrap();
            }
            (
                (applier.header(), applier.leases().revoke_counts()),
                engine.sealed_files(),
                engine.active_file(),
            )
        };
        let (header_a, sealed_a, active_a) = run();
        let (header_b, sealed_b, active_b) = run();
        assert!(header_a.0.revision > 250, "{header_a:?}");
        assert!(header_a.1.0 > 5, "leases expired: {header_a:?}");
        assert!(sealed_a.len() >= 4);
        assert_eq!(
            (header_a, sealed_a, active_a),
            (header_b, sealed_b, active_b)
        );
    }
}
