//! Applying one Raft entry to the engine, deterministically.
//!
//! Every entry becomes exactly one engine batch (so it survives or vanishes
//! whole), whose first sequence number is `index × 65536` and whose commit
//! record carries the caller's metadata (log id, cluster time, membership).
//! A user op's version is `index × 65536 + its position among the ops the
//! entry applied`, which is the sequence number the engine gives its record;
//! session bookkeeping records follow the user ops in the same batch.
//!
//! Nothing here reads a clock, a random number or a hash-map iteration
//! order: the same entry applied to the same state writes the same bytes
//! on every replica.

use std::collections::{BTreeMap, BTreeSet};

use bitcask::{Batch, Engine};
use serde::{Deserialize, Serialize};

use crate::command::{
    Command, ENTRY_OPS_MAX, EntryResponse, Op, Outcome, Proposal, RESERVED_KEY_PREFIX, Request,
    SESSION_ANSWERS_MAX, SESSION_IDLE_MS_MAX, SessionRef,
};
use kvcodec as codec;

/// Sequence numbers per log index: versions are `index × VERSIONS_PER_INDEX + position`.
pub const VERSIONS_PER_INDEX: u64 = 65_536;

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
    pub answers: BTreeMap<u64, Outcome>,
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
        version: u64,
        expiry_ms: u64,
        /// `None` until an op needs it: a put or a delete only needs to
        /// know the key exists, so the old value is never read from disk
        /// for them (only expire and persist, which rewrite it, read it;
        /// see [`EntryWrite::value_of`]).
        value: Option<Vec<u8>>,
    },
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

/// Applies entries to one engine; holds the sessions in memory (they are
/// also in the engine, so a restart or a snapshot carries them).
#[derive(Debug)]
pub struct Applier {
    sessions: BTreeMap<u64, SessionRecord>,
    /// Cluster time a session may stay idle before it is evicted.
    session_idle_ms: u64,
}

impl Default for Applier {
    fn default() -> Self {
        Applier {
            sessions: BTreeMap::new(),
            session_idle_ms: SESSION_IDLE_MS_MAX,
        }
    }
}

impl Applier {
    /// Loads the sessions stored in `engine`.
    pub fn load(engine: &Engine) -> Result<Applier, ApplyError> {
        let mut sessions = BTreeMap::new();
        let prefix = [RESERVED_KEY_PREFIX, b"session/"].concat();
        let mut after = None;
        loop {
            let scan = bitcask::Scan {
                after: after.clone(),
                ..bitcask::Scan::prefix(prefix.clone(), 1024)
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
                let record: SessionRecord =
                    codec::decode(entry.value.as_deref().unwrap_or_default()).map_err(|e| {
                        ApplyError::Session {
                            client_id,
                            reason: e.to_string(),
                        }
                    })?;
                sessions.insert(client_id, record);
            }
            match page.last() {
                Some(last) if page.len() == 1024 => after = Some(last.key.clone()),
                _ => break,
            }
        }
        Ok(Applier {
            sessions,
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

    /// Number of live sessions.
    pub fn session_count(&self) -> usize {
        self.sessions.len()
    }

    /// Applies the entry at `index` carrying `proposal`; `meta` goes into the
    /// engine batch's commit record.
    pub fn apply(
        &mut self,
        engine: &Engine,
        index: u64,
        proposal: &Proposal,
        meta: Vec<u8>,
    ) -> Result<EntryResponse, ApplyError> {
        let now_ms = proposal.time_ms;
        let base = index * VERSIONS_PER_INDEX;
        let mut entry = EntryWrite {
            engine,
            base,
            now_ms,
            batch: Batch::new().seq(base).meta(meta),
            overlay: BTreeMap::new(),
            touched_sessions: BTreeSet::new(),
        };
        let mut response = EntryResponse::default();
        if let Command::Requests(requests) = &proposal.command {
            for request in requests {
                let outcome = self.apply_request(&mut entry, request)?;
                response.outcomes.push(outcome);
            }
        }
        let EntryWrite {
            mut batch,
            mut touched_sessions,
            ..
        } = entry;
        // Sessions: evict idle ones, then store the touched ones, in client-id order.
        let idle: Vec<u64> = self
            .sessions
            .iter()
            .filter(|(_, record)| {
                record.last_active_ms.saturating_add(self.session_idle_ms) <= now_ms
            })
            .map(|(client_id, _)| *client_id)
            .collect();
        for client_id in idle {
            self.sessions.remove(&client_id);
            touched_sessions.remove(&client_id);
            batch = batch.delete(session_key(client_id));
        }
        for client_id in &touched_sessions {
            let record = &self.sessions[client_id];
            batch = batch.put(session_key(*client_id), codec::encode(record));
        }
        if batch.ops.len() > ENTRY_OPS_MAX {
            return Err(ApplyError::TooManyOps {
                index,
                ops: batch.ops.len(),
            });
        }
        engine.write_batch(&batch)?;
        Ok(response)
    }

    fn apply_request(
        &mut self,
        entry: &mut EntryWrite<'_>,
        request: &Request,
    ) -> Result<Outcome, ApplyError> {
        // NEGATIVE CONTROL (feature nc-forget-sessions): no look-up of the
        // session's answers, so a retried write applies again.
        if !cfg!(feature = "nc-forget-sessions")
            && let Some(session) = request.session
            && let Some(answer) = self.replay(session, entry.now_ms)
        {
            // An unknown session stays unknown: nothing to store.
            if self.sessions.contains_key(&session.client_id) {
                entry.touched_sessions.insert(session.client_id);
            }
            return Ok(answer);
        }
        let outcome = self.evaluate(entry, request)?;
        if let Some(session) = request.session {
            let record = self.sessions.entry(session.client_id).or_default();
            record.answers.insert(session.sequence, outcome.clone());
            while record.answers.len() > SESSION_ANSWERS_MAX {
                let (oldest, _) = record
                    .answers
                    .pop_first()
                    .expect("over the limit, so not empty");
                record.forgotten_below = record.forgotten_below.max(oldest + 1);
            }
            entry.touched_sessions.insert(session.client_id);
        }
        Ok(outcome)
    }

    /// For a request already seen: its stored answer, or `SessionExpired`
    /// when that answer was forgotten. `SessionExpired` too for a session
    /// this state machine does not hold, unless the request opens it (it was
    /// evicted, or never existed: applying the request now could apply a
    /// write a second time). `None` for a new request, whose session now
    /// exists.
    fn replay(&mut self, session: SessionRef, now_ms: u64) -> Option<Outcome> {
        let record = match self.sessions.entry(session.client_id) {
            std::collections::btree_map::Entry::Occupied(known) => known.into_mut(),
            std::collections::btree_map::Entry::Vacant(unknown) => {
                // NEGATIVE CONTROL (feature nc-unknown-sessions): any request
                // opens a fresh session, so a retry whose session was evicted
                // applies again.
                if !session.opens && !cfg!(feature = "nc-unknown-sessions") {
                    return Some(Outcome::SessionExpired);
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
            return Some(Outcome::SessionExpired);
        }
        None
    }

    fn evaluate(
        &self,
        entry: &mut EntryWrite<'_>,
        request: &Request,
    ) -> Result<Outcome, ApplyError> {
        let (base, now_ms) = (entry.base, entry.now_ms);
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
        if entry.batch.ops.len() + request.ops.len() >= ENTRY_OPS_MAX {
            return Ok(Outcome::Rejected {
                reason: format!("the entry would exceed ENTRY_OPS_MAX ({ENTRY_OPS_MAX}) ops"),
            });
        }
        for (index, condition) in request.conditions.iter().enumerate() {
            let current_version = match entry.state_of(&condition.key)? {
                KeyState::Absent => 0,
                KeyState::Present { version, .. } => version,
            };
            if current_version != condition.version {
                return Ok(Outcome::ConditionFailed {
                    index,
                    current_version,
                });
            }
        }
        // Work out every op's effect first: an expire of a missing key
        // fails the whole request before anything is written.
        let mut staged: Vec<(Vec<u8>, KeyState)> = Vec::with_capacity(request.ops.len());
        let mut versions = Vec::with_capacity(request.ops.len());
        let mut existed = Vec::with_capacity(request.ops.len());
        for (index, op) in request.ops.iter().enumerate() {
            let version = base + (entry.batch.ops.len() + index) as u64;
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
                None => entry.state_of(op.key())?,
            };
            existed.push(matches!(current, KeyState::Present { .. }));
            let next = match (op, current) {
                (Op::Put { value, ttl_ms, .. }, _) => KeyState::Present {
                    version,
                    expiry_ms: expiry(*ttl_ms),
                    value: Some(value.clone()),
                },
                (Op::Delete { .. }, _) => KeyState::Absent,
                (Op::Expire { ttl_ms, key }, KeyState::Present { value, .. }) => {
                    KeyState::Present {
                        version,
                        expiry_ms: expiry((*ttl_ms).max(1)),
                        value: Some(entry.value_of(key, value)?),
                    }
                }
                (Op::Persist { key }, KeyState::Present { value, .. }) => KeyState::Present {
                    version,
                    expiry_ms: 0,
                    value: Some(entry.value_of(key, value)?),
                },
                (Op::Expire { .. } | Op::Persist { .. }, KeyState::Absent) => {
                    return Ok(Outcome::KeyNotFound { index });
                }
            };
            versions.push(version);
            staged.push((op.key().to_vec(), next));
        }
        for (key, state) in staged {
            // The value moves into the batch; the overlay remembers only
            // that the key is there (a later expire or persist in this
            // entry finds the value in the batch).
            let remembered = match state {
                KeyState::Absent => {
                    entry
                        .batch
                        .ops
                        .push(bitcask::Op::Delete { key: key.clone() });
                    KeyState::Absent
                }
                KeyState::Present {
                    version,
                    expiry_ms,
                    value,
                } => {
                    let value = entry.value_of(&key, value)?;
                    entry.batch.ops.push(bitcask::Op::Put {
                        key: key.clone(),
                        value,
                        expiry_ms,
                    });
                    KeyState::Present {
                        version,
                        expiry_ms,
                        value: None,
                    }
                }
            };
            entry.overlay.insert(key, remembered);
        }
        Ok(Outcome::Applied { versions, existed })
    }
}

/// The engine batch an entry is building, and what its earlier requests did.
struct EntryWrite<'a> {
    engine: &'a Engine,
    /// `index × VERSIONS_PER_INDEX`: the batch's first sequence number.
    base: u64,
    /// The entry's cluster time.
    now_ms: u64,
    batch: Batch,
    /// State each key was left in by earlier ops of this entry.
    overlay: BTreeMap<Vec<u8>, KeyState>,
    /// Clients whose session record this entry changes.
    touched_sessions: BTreeSet<u64>,
}

impl EntryWrite<'_> {
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
            Some(meta) => KeyState::Present {
                version: meta.seq,
                expiry_ms: meta.expiry_ms,
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
        let missing = |whence: &str| {
            ApplyError::Engine(bitcask::Error::Corruption {
                file: String::new(),
                offset: 0,
                reason: format!(
                    "key {:?} is present but its value is not in {whence}",
                    String::from_utf8_lossy(key)
                ),
            })
        };
        if self.overlay.contains_key(key) {
            // Present in the overlay means an earlier put of this entry.
            return self
                .batch
                .ops
                .iter()
                .rev()
                .find_map(|op| match op {
                    bitcask::Op::Put { key: k, value, .. } if k.as_slice() == key => {
                        Some(value.clone())
                    }
                    _ => None,
                })
                .ok_or_else(|| missing("the entry's batch"));
        }
        // The key directory said present a moment ago and only this apply
        // writes the engine, so a miss here is an inconsistent engine.
        match self.engine.get(key, self.now_ms)? {
            Some(item) => Ok(item.value),
            None => Err(missing("the engine")),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use bitcask::{Options, SyncPolicy};
    use vfs::sim::SimFs;

    use super::*;
    use crate::command::Condition;

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
            response.outcomes,
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
        assert_eq!(engine.last_commit_meta().unwrap(), b"meta");
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
            response.outcomes,
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
        assert!(matches!(response.outcomes[0], Outcome::Applied { .. }));
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
        assert_eq!(response.outcomes, vec![Outcome::KeyNotFound { index: 1 }]);
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
            &response.outcomes[..3],
            [
                Outcome::Applied { .. },
                Outcome::Applied { .. },
                Outcome::Applied { .. }
            ]
        ));
        assert_eq!(response.outcomes[3], Outcome::KeyNotFound { index: 0 });
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
        assert_eq!(retry, first, "the retry returns the original version");
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
        assert_eq!(response.outcomes, vec![Outcome::SessionExpired]);
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
        assert_eq!(never.outcomes, vec![Outcome::SessionExpired]);
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
        assert!(matches!(first.outcomes[0], Outcome::Applied { .. }));
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
        assert_eq!(retry.outcomes, vec![Outcome::SessionExpired]);
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
        assert!(matches!(response.outcomes[0], Outcome::Rejected { .. }));
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
}
