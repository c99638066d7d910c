//! Exactly-once bookkeeping of one client (DESIGN §3): a random non-zero
//! client id, a sequence number per new write, and the lowest sequence whose
//! answer has not yet been delivered, which lets the servers forget older
//! answers. Several writes may be outstanding at once.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, PoisonError};

use kvproto::kv::v1::Session;

/// The session state shared by all calls of one client.
#[derive(Debug)]
pub(crate) struct Sessions {
    client_id: u64,
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    /// The next new write's sequence (starts at 1).
    next: u64,
    /// Sequences whose final answer has not been delivered yet.
    outstanding: BTreeSet<u64>,
}

impl Sessions {
    /// A session with a random non-zero client id.
    pub(crate) fn new() -> Self {
        let client_id = loop {
            let id: u64 = rand::random();
            if id != 0 {
                break id;
            }
        };
        Sessions {
            client_id,
            state: Mutex::new(State {
                next: 1,
                outstanding: BTreeSet::new(),
            }),
        }
    }

    /// The client id.
    pub(crate) fn client_id(&self) -> u64 {
        self.client_id
    }

    /// Starts a new write: its sequence stays outstanding until the ticket
    /// is dropped (the answer delivered, or the write given up).
    pub(crate) fn begin(self: &Arc<Self>) -> Ticket {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let sequence = state.next;
        state.next += 1;
        state.outstanding.insert(sequence);
        Ticket {
            sessions: Arc::clone(self),
            sequence,
        }
    }

    fn session(&self, sequence: u64) -> Session {
        let state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let lowest = state.outstanding.first().copied().unwrap_or(state.next);
        Session {
            client_id: self.client_id,
            sequence,
            lowest_unacked_sequence: lowest.min(sequence),
        }
    }
}

/// One write's sequence, outstanding while the ticket lives.
#[derive(Debug)]
pub(crate) struct Ticket {
    sessions: Arc<Sessions>,
    sequence: u64,
}

impl Ticket {
    /// The session to send with this attempt (the lowest unacked sequence is
    /// read afresh each time, so it advances while a write is retried).
    pub(crate) fn session(&self) -> Session {
        self.sessions.session(self.sequence)
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut state = self
            .sessions
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        state.outstanding.remove(&self.sequence);
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
}
