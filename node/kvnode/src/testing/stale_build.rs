//! The stale-build test fault (`kvnode run --test-stale-build-before-switch`,
//! the fault suite's control for how a snapshot is chosen at start-up).
//!
//! At the first install of a received snapshot in a data directory (marker
//! [`TEST_STALE_BUILD_MARKER`]), the member builds a snapshot on its old
//! engine first — the race of a build that started just after the received
//! snapshot was sealed: a higher counter, a lower last log id — then holds
//! the install before the engine switch for [`TEST_STALE_BUILD_HOLD`], so
//! the suite's next power cut lands in that window while openraft purges
//! the log through the received snapshot. openraft queues every later
//! command behind the install: the member neither appends, votes nor
//! answers meanwhile.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::raft::types::NodeSnapshotMeta;
use crate::snapshot::node_vfs;
use crate::state_machine::StateMachine;

/// How long the stale-build test fault holds an install (the fault suite
/// cuts the power within it).
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
}

impl StaleBuildFault {
    /// A fault that fires at the first install in a data directory.
    pub fn armed() -> StaleBuildFault {
        StaleBuildFault {
            armed: true,
            fired: Arc::default(),
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
        hold_s = TEST_STALE_BUILD_HOLD.as_secs(),
        "TEST FAULT: a snapshot built on the old engine after the received one was \
         sealed; the install (and with it this member's Raft core) is held before the \
         switch"
    );
    tokio::time::sleep(TEST_STALE_BUILD_HOLD).await;
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
