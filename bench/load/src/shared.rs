//! The state the clients of one run share: settings, channels, the
//! leader guess (followed from NotLeader hints, moved on after failures),
//! the operation count, the deadline and the values.

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use prost::bytes::Bytes;

use crate::config::{LoadConfig, System};
use crate::pool::Pool;
use crate::report::Progress;

/// State the clients share.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) config: LoadConfig,
    pub(crate) pool: Pool,
    /// The leader's client address as last learned (or guessed).
    pub(crate) leader: Mutex<String>,
    /// Operations started, for the count bound.
    pub(crate) started: AtomicU64,
    pub(crate) began: Instant,
    pub(crate) deadline: Instant,
    pub(crate) values: Bytes,
    pub(crate) progress: Arc<Progress>,
    pub(crate) system: System,
    /// One etcd client per channel of the pool (built before the clients start).
    #[cfg(feature = "etcd")]
    pub(crate) etcd: crate::etcd::Clients,
}

impl Shared {
    /// The current leader guess.
    pub(crate) fn leader(&self) -> String {
        self.leader
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn set_leader(&self, addr: String) {
        *self.leader.lock().unwrap_or_else(|p| p.into_inner()) = addr;
    }

    /// Follows a NotLeader hint from `from`. The hint is the leader's
    /// address as the members know it, which the load generator may not be
    /// able to reach (a compose network's `node2:7001` seen from the host):
    /// with several endpoints given and the hint not among them, the next
    /// given endpoint is tried instead (the leader is one of them).
    pub(crate) fn follow_hint(&self, from: &str, hint: String) {
        let endpoints = &self.config.endpoints;
        if endpoints.contains(&hint) || endpoints.len() < 2 {
            self.set_leader(hint);
        } else {
            self.next_leader(from);
        }
    }

    /// Moves the guess to the endpoint after `failed` (if it is still the
    /// guess).
    pub(crate) fn next_leader(&self, failed: &str) {
        let mut leader = self.leader.lock().unwrap_or_else(|p| p.into_inner());
        if *leader == failed {
            let endpoints = &self.config.endpoints;
            let position = endpoints.iter().position(|e| e == failed);
            let next = position.map(|p| (p + 1) % endpoints.len()).unwrap_or(0);
            *leader = endpoints[next].clone();
        }
    }
}
