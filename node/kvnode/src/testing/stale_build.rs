//! The stale-build test fault (`kvnode run --test-stale-build-before-switch`,
//! the fault suite's control for how a snapshot is chosen at start-up).
//!
//! At the first install of a received snapshot in a data directory (marker
//! [`TEST_STALE_BUILD_MARKER`]), the member builds a snapshot on its old
//! engine first — the race of a build that started just after the received
//! snapshot was sealed: a higher counter, a lower last log id — then lets
//! the install go on, and holds the member's next apply for
//! [`TEST_STALE_BUILD_HOLD`]. openraft 0.10 purges the log through the
//! received snapshot once the install is done, while the held apply keeps
//! the state machine from building newer snapshots (which would prune the
//! stale one), so the suite's next power cut (5 s after the heal) finds the
//! purged log beside the stale build. (openraft 0.9 purged while the
//! install was still running, so the fault held the install itself; under
//! 0.10 that kept the log whole, and without any hold the member's next
//! snapshots pruned the stale build before the cut: both hid the control.)

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::raft::types::NodeSnapshotMeta;
use crate::snapshot::node_vfs;
use crate::state_machine::StateMachine;

/// How long the stale-build test fault holds the apply that follows the
/// install (the fault suite cuts the power within it).
pub const TEST_STALE_BUILD_HOLD: Duration = Duration::from_secs(20);
/// The marker, in the state directory, that the stale-build test fault
/// fired there (it fires once per data directory).
pub const TEST_STALE_BUILD_MARKER: &str = "TEST-STALE-BUILD-FIRED";

/// The switch: off by default; clones share whether it fired in this
/// process.
#[derive(Clone, Debug, Default)]
pub struct StaleBuildFault {
    armed: bool,
    fired: Arc<AtomicBool>,
    /// Set by the install it fired at; taken by the next apply.
    hold_next_apply: Arc<AtomicBool>,
}

impl StaleBuildFault {
    /// A fault that fires at the first install in a data directory.
    pub fn armed() -> StaleBuildFault {
        StaleBuildFault {
            armed: true,
            fired: Arc::default(),
            hold_next_apply: Arc::default(),
        }
    }
}

/// Runs the fault before `sm` installs the snapshot `meta`, when armed and
/// not fired yet in this process or this data directory.
pub async fn before_install(sm: &StateMachine, meta: &NodeSnapshotMeta) {
    let fault = &sm.options().stale_build;
    if !fault.armed || fault.fired.swap(true, Ordering::SeqCst) || !claim(sm) {
        return;
    }
    let builder = sm.clone();
    let built = tokio::task::spawn_blocking(move || builder.build()).await;
    let built = built.map(|b| b.map(|s| s.meta.last_log_id));
    tracing::warn!(
        ?built,
        received = ?meta.last_log_id,
        "TEST FAULT: a snapshot built on the old engine after the received one was \
         sealed (a higher counter, a lower last log id); the install goes on, the next \
         apply is held"
    );
    fault.hold_next_apply.store(true, Ordering::SeqCst);
}

/// Holds the first apply after the install the fault fired at, for
/// [`TEST_STALE_BUILD_HOLD`] (openraft purges the log meanwhile).
pub async fn before_apply(sm: &StateMachine) {
    if sm
        .options()
        .stale_build
        .hold_next_apply
        .swap(false, Ordering::SeqCst)
    {
        tracing::warn!(
            hold_s = TEST_STALE_BUILD_HOLD.as_secs(),
            "TEST FAULT: the apply after the install is held"
        );
        tokio::time::sleep(TEST_STALE_BUILD_HOLD).await;
    }
}

/// True the first time for this data directory: writes the marker
/// (fsynced, its directory fsynced, so a power cut keeps it).
fn claim(sm: &StateMachine) -> bool {
    let marker = sm.dir().join(TEST_STALE_BUILD_MARKER);
    let vfs = node_vfs();
    if vfs.file_exists(&marker) {
        return false;
    }
    let written = vfs
        .create(&marker)
        .and_then(|file| file.sync())
        .and_then(|()| vfs.sync_dir(sm.dir()));
    if let Err(err) = written {
        tracing::warn!(error = %err, "TEST FAULT not fired: cannot write its marker");
        return false;
    }
    true
}
