//! Exactly-once bookkeeping of one client (DESIGN §3), the client half of
//! the session protocol whose server half is the state machine's session
//! table: kvclient keeps one per client, and a member keeps one for the
//! writes it forwards to the leader. A random non-zero
//! client id, a sequence number per new write, and the lowest sequence whose
//! answer has not yet been delivered, which lets the servers forget older
//! answers. Several writes may be outstanding at once.
//!
//! Opening: the state machine creates a session only for a request that
//! says it opens it (`opens`). A write begun before this client had any
//! answer for its id opens the session; once an answer arrived, the session
//! exists, and no later attempt of any write opens it (`opens` is decided
//! per attempt), so a retry that reaches the cluster after the session was
//! evicted is answered SESSION_EXPIRED (outcome unknown) instead of
//! applying a second time, and cannot re-create the session for another
//! write's retry either. After a
//! SESSION_EXPIRED the client moves to a fresh id (a fresh session): the old
//! id's outstanding writes keep the old id, so none of them can open a new
//! session under it.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, PoisonError};

use crate::kv::v1::Session;

/// The session state shared by all calls of one client.
#[derive(Debug)]
pub struct Sessions {
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    /// The current session's id (random, non-zero).
    client_id: u64,
    /// The next new write's sequence (starts at 1).
    next: u64,
    /// Sequences of the current id whose final answer has not been
    /// delivered yet.
    outstanding: BTreeSet<u64>,
    /// Whether an answer for the current id arrived (the session exists).
    confirmed: bool,
}

fn random_client_id() -> u64 {
    loop {
        let id: u64 = rand::random();
        if id != 0 {
            return id;
        }
    }
}

impl Default for Sessions {
    fn default() -> Self {
        Self::new()
    }
}

impl Sessions {
    /// A session with a random non-zero client id.
    pub fn new() -> Self {
        Sessions {
            state: Mutex::new(State {
                client_id: random_client_id(),
                next: 1,
                outstanding: BTreeSet::new(),
                confirmed: false,
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The current client id.
    pub fn client_id(&self) -> u64 {
        self.lock().client_id
    }

    /// Starts a new write: its sequence stays outstanding until the ticket
    /// is dropped (the answer delivered, or the write given up).
    pub fn begin(self: &Arc<Self>) -> Ticket {
        let mut state = self.lock();
        let sequence = state.next;
        state.next += 1;
        state.outstanding.insert(sequence);
        Ticket {
            sessions: Arc::clone(self),
            client_id: state.client_id,
            sequence,
            opens: !state.confirmed,
        }
    }
}

/// One write's sequence, outstanding while the ticket lives.
#[derive(Debug)]
pub struct Ticket {
    sessions: Arc<Sessions>,
    client_id: u64,
    sequence: u64,
    /// Begun before the session was known to exist.
    opens: bool,
}

impl Ticket {
    /// The session to send with this attempt (the lowest unacked sequence is
    /// read afresh each time, so it advances while a write is retried).
    pub fn session(&self) -> Session {
        let state = self.sessions.lock();
        let current = state.client_id == self.client_id;
        let lowest = if current {
            state.outstanding.first().copied().unwrap_or(state.next)
        } else {
            // An abandoned id: its session is gone already.
            self.sequence
        };
        Session {
            client_id: self.client_id,
            sequence: self.sequence,
            lowest_unacked_sequence: lowest.min(self.sequence),
            // Decided per attempt: once any answer confirmed the session,
            // or the id was abandoned, a retry never opens (a late retry
            // must not re-create a session evicted meanwhile, under which
            // another write's retry would apply again).
            opens: self.opens && current && !state.confirmed,
        }
    }

    /// The cluster answered this write with an outcome of the state
    /// machine (not SESSION_EXPIRED): the session exists.
    pub fn answered(&self) {
        let mut state = self.sessions.lock();
        if state.client_id == self.client_id {
            state.confirmed = true;
        }
    }

    /// The cluster answered SESSION_EXPIRED: the session is gone; later
    /// writes use a fresh id that opens a fresh session.
    pub fn session_expired(&self) {
        let mut state = self.sessions.lock();
        if state.client_id == self.client_id {
            *state = State {
                client_id: random_client_id(),
                next: 1,
                outstanding: BTreeSet::new(),
                confirmed: false,
            };
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut state = self.sessions.lock();
        if state.client_id == self.client_id {
            state.outstanding.remove(&self.sequence);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lowest_unacked_follows_outstanding_writes() {
        let sessions = Arc::new(Sessions::new());
        assert_ne!(sessions.client_id(), 0);
        let a = sessions.begin();
        let b = sessions.begin();
        let c = sessions.begin();
        assert_eq!(c.session().sequence, 3);
        assert_eq!(c.session().lowest_unacked_sequence, 1);
        drop(a);
        assert_eq!(c.session().lowest_unacked_sequence, 2);
        drop(b);
        assert_eq!(c.session().lowest_unacked_sequence, 3);
        drop(c);
        let d = sessions.begin();
        assert_eq!(d.session().sequence, 4);
        assert_eq!(d.session().lowest_unacked_sequence, 4);
    }

    #[test]
    fn writes_open_the_session_until_an_answer_arrives() {
        let sessions = Arc::new(Sessions::new());
        let a = sessions.begin();
        let b = sessions.begin();
        assert!(a.session().opens && b.session().opens);
        b.answered();
        let c = sessions.begin();
        assert!(!c.session().opens, "the session exists now");
        assert!(
            !a.session().opens,
            "a retry after the session was confirmed does not open it again"
        );
    }

    #[test]
    fn after_session_expired_a_fresh_id_opens_a_fresh_session() {
        let sessions = Arc::new(Sessions::new());
        let old_id = sessions.client_id();
        let a = sessions.begin();
        a.answered();
        let b = sessions.begin();
        let c = sessions.begin();
        assert!(!b.session().opens);
        b.session_expired();
        let new_id = sessions.client_id();
        assert_ne!(new_id, old_id);
        // The old id's writes keep their id and never open.
        assert_eq!(c.session().client_id, old_id);
        assert!(!c.session().opens);
        let d = sessions.begin();
        assert_eq!((d.session().client_id, d.session().sequence), (new_id, 1));
        assert!(d.session().opens);
        // An old ticket dropping does not touch the new id's bookkeeping.
        drop(c);
        drop(a);
        assert_eq!(d.session().lowest_unacked_sequence, 1);
        // A late answer of an old-id write does not confirm the new session.
        b.answered();
        assert!(sessions.begin().session().opens);
    }
}
