//! Crash points of a snapshot receive and install, for the snapshot
//! transfer tests: a test arms one [`InstallStep`]; the step stops there as
//! if the member crashed, and every later receive or install fails until
//! the test resets it and opens the directory again.

use std::sync::{Arc, Mutex};

use crate::hooks::InstallStep;

/// Test-only crash points (see [`InstallStep`]); clones share one state.
#[derive(Clone, Debug, Default)]
pub struct InstallFailpoints {
    inner: Arc<FailpointState>,
}

#[derive(Debug, Default)]
struct FailpointState {
    armed: Mutex<Option<InstallStep>>,
    fired: Mutex<Option<InstallStep>>,
}

impl InstallFailpoints {
    /// Arms one crash point (it fires once).
    pub fn arm(&self, step: InstallStep) {
        *self.inner.armed.lock().unwrap_or_else(|p| p.into_inner()) = Some(step);
    }

    /// The step at which this member "crashed", if it did.
    pub fn fired(&self) -> Option<InstallStep> {
        *self.inner.fired.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// True when `step` is armed (it then fires: disarmed, recorded) or a
    /// crash point fired before (the member is "dead").
    pub fn hit(&self, step: InstallStep) -> bool {
        let mut armed = self.inner.armed.lock().unwrap_or_else(|p| p.into_inner());
        let mut fired = self.inner.fired.lock().unwrap_or_else(|p| p.into_inner());
        if *armed == Some(step) {
            *armed = None;
            *fired = Some(step);
            tracing::warn!(?step, "test crash point fired");
        }
        fired.is_some()
    }

    /// Disarms and forgets a fired crash point (before the test opens the
    /// member's directory again).
    pub fn reset(&self) {
        *self.inner.armed.lock().unwrap_or_else(|p| p.into_inner()) = None;
        *self.inner.fired.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }

    /// True once a crash point fired.
    pub fn dead(&self) -> bool {
        self.fired().is_some()
    }
}
