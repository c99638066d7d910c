//! Which caught-up watches a change concerns ([`WatchHub`]).
//!
//! Without it, every applied batch of entries would wake every watch task
//! of the member, each to read a page of nothing: with a thousand idle
//! watches, thousands of task wake-ups per batch on the apply's heels. The
//! hub is one task per member instead: after each applied batch it lists
//! the keys the new revisions changed (from the change history's record
//! order, no values read) and wakes only the registered watches whose keys
//! contain one of them.
//!
//! It only decides *when* a watch reads; what a watch sends is still read
//! from the history by the watch itself, so a missed wake-up would delay
//! events, never lose or reorder them, and the protocol below rules it
//! out: a watch caught up at cursor `c` arms its registration with `c`
//! under the registry's lock; if the hub has already examined revision `c`
//! (its `processed` is at or above it), arming says so and the watch reads
//! again instead of waiting; otherwise the hub's next examination, which
//! covers `c`, takes the lock after the arming and sees it.
//!
//! When the hub cannot list the changes cheaply (more than
//! [`HUB_SCAN_RECORDS_MAX`] records, or the history was replaced by an
//! install or compacted past what it examined), it wakes every watch.
//!
//! When no watch is armed (none open, or none caught up yet), the hub lists
//! nothing: it only moves `processed` to the revision it was told of, under
//! the registry's lock. A watch that arms after that with a cursor at or
//! below it reads again (its own read of the history sees the changes); one
//! with a cursor above it waits for the next examination, which starts
//! there.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use kvstate::history::History;
use kvstate::watch::WatchSpec;
use tokio::sync::{Notify, watch};

use crate::state_machine::StateMachine;

/// Most history records the hub lists for one wake-up; beyond it, every
/// watch is woken (and reads its own page).
pub const HUB_SCAN_RECORDS_MAX: usize = 4096;

/// The member's registry of caught-up watches and the task that wakes
/// them.
#[derive(Debug)]
pub(crate) struct WatchHub {
    registry: Mutex<Registry>,
    ids: AtomicU64,
}

#[derive(Debug, Default)]
struct Registry {
    /// Every revision up to this one has been examined (and the watches
    /// it concerned woken).
    processed: u64,
    watches: HashMap<u64, Registered>,
}

#[derive(Debug)]
struct Registered {
    spec: Arc<WatchSpec>,
    /// The watch's cursor when it armed: changes below it are not its.
    from: u64,
    wake: Arc<Notify>,
}

/// What the new revisions changed.
enum Changes {
    /// These keys, sorted, each once.
    Keys(Vec<Vec<u8>>),
    /// Too many to list, or the history was replaced: wake everyone.
    Everything,
}

impl WatchHub {
    /// Starts the hub of `state_machine`; its task ends when `shutdown`
    /// turns true or the state machine stops sending applied revisions.
    pub(crate) fn start(
        state_machine: StateMachine,
        shutdown: Option<watch::Receiver<bool>>,
    ) -> Arc<WatchHub> {
        // Subscribed before `processed` is read: a revision applied in
        // between is a change the first loop sees.
        let applied = state_machine.subscribe_applied();
        let processed = read_history(&state_machine, History::revision);
        let hub = Arc::new(WatchHub {
            registry: Mutex::new(Registry {
                processed,
                watches: HashMap::new(),
            }),
            ids: AtomicU64::new(0),
        });
        tokio::spawn(hub.clone().run(state_machine, applied, shutdown));
        hub
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Registry> {
        self.registry.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Registers a watch of `spec` (not armed yet); it leaves the registry
    /// when the returned registration drops.
    pub(crate) fn register(self: &Arc<Self>, spec: Arc<WatchSpec>) -> Registration {
        let id = self.ids.fetch_add(1, Ordering::Relaxed);
        let wake = Arc::new(Notify::new());
        self.lock().watches.insert(
            id,
            Registered {
                spec,
                from: u64::MAX,
                wake: wake.clone(),
            },
        );
        Registration {
            hub: self.clone(),
            id,
            wake,
        }
    }

    async fn run(
        self: Arc<Self>,
        state_machine: StateMachine,
        mut applied: watch::Receiver<u64>,
        shutdown: Option<watch::Receiver<bool>>,
    ) {
        let stop = crate::server::watch::stopped(shutdown);
        tokio::pin!(stop);
        loop {
            tokio::select! {
                changed = applied.changed() => {
                    if changed.is_err() {
                        break;
                    }
                }
                () = &mut stop => break,
            }
            // What the history holds now (sent after each applied batch).
            let revision = *applied.borrow_and_update();
            let processed = {
                let mut registry = self.lock();
                if registry.watches.values().all(|w| w.from == u64::MAX) {
                    // No watch waits: nothing to list (see the module doc).
                    registry.processed = registry.processed.max(revision);
                    continue;
                }
                registry.processed
            };
            let sm = state_machine.clone();
            let listed = match try_changes_after(&state_machine, processed) {
                Some(listed) => listed,
                None => tokio::task::spawn_blocking(move || {
                    read_history(&sm, |history| changes_after(history, processed))
                })
                .await
                .unwrap_or((Changes::Everything, processed)),
            };
            self.wake(listed);
        }
        // The member stops: its watch streams end too (they watch the same
        // signal). Whatever waits reads once more meanwhile.
        for registered in self.lock().watches.values() {
            registered.wake.notify_one();
        }
    }

    /// Wakes the armed watches `changes` concern; records what was examined.
    /// One binary search of the sorted keys per watch: a watch's keys are
    /// one interval, so it is concerned iff the first key at or after its
    /// start is inside it. (Revisions below a watch's `from` may wake it
    /// needlessly; a spurious wake-up costs one page read.)
    fn wake(&self, (changes, through): (Changes, u64)) {
        let mut registry = self.lock();
        for registered in registry.watches.values() {
            if registered.from == u64::MAX {
                continue; // not waiting
            }
            let concerned = match &changes {
                Changes::Everything => true,
                Changes::Keys(keys) => {
                    let first =
                        keys.partition_point(|key| key.as_slice() < registered.spec.bounds.start());
                    keys.get(first)
                        .is_some_and(|key| registered.spec.matches(key))
                }
            };
            if concerned {
                registered.wake.notify_one();
            }
        }
        registry.processed = registry.processed.max(through);
    }
}

/// `read` under the history's read lock.
fn read_history<T>(state_machine: &StateMachine, read: impl FnOnce(&History) -> T) -> T {
    let history = state_machine
        .history()
        .read()
        .unwrap_or_else(PoisonError::into_inner);
    read(&history)
}

/// [`changes_after`] if the history's lock is free now.
fn try_changes_after(state_machine: &StateMachine, processed: u64) -> Option<(Changes, u64)> {
    let history = state_machine.history().try_read().ok()?;
    Some(changes_after(&history, processed))
}

/// The changes after revision `processed`, and the revision they reach.
fn changes_after(history: &History, processed: u64) -> (Changes, u64) {
    let through = history.revision();
    if history.compact_revision() > processed || through < processed {
        return (Changes::Everything, through);
    }
    let mut keys = Vec::new();
    for (_, key) in history.records_from(processed + 1) {
        if keys.len() >= HUB_SCAN_RECORDS_MAX {
            return (Changes::Everything, through);
        }
        keys.push(key.to_vec());
    }
    keys.sort_unstable();
    keys.dedup();
    (Changes::Keys(keys), through)
}

/// One watch's place in the hub.
#[derive(Debug)]
pub(crate) struct Registration {
    hub: Arc<WatchHub>,
    id: u64,
    wake: Arc<Notify>,
}

impl Registration {
    /// Arms the watch at cursor `from` (every event below it sent): `true`
    /// if it may now wait for [`Registration::woken`]; `false` if the hub
    /// already examined `from` (read again first).
    pub(crate) fn arm(&self, from: u64) -> bool {
        let mut registry = self.hub.lock();
        let processed = registry.processed;
        if let Some(registered) = registry.watches.get_mut(&self.id) {
            registered.from = from;
        }
        processed < from
    }

    /// Resolves once a change the watch may care about was applied (or
    /// the hub stopped).
    pub(crate) async fn woken(&self) {
        self.wake.notified().await;
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.hub.lock().watches.remove(&self.id);
    }
}
