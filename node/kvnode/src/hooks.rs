//! The seams test builds plug into, and nothing else.
//!
//! With the `testing` feature (kvnode's own tests, the fault suite's
//! `testing` build) these are the real switches of [`crate::testing`]:
//! lost write replies, cut peer links, a corrupted snapshot chunk
//! ([`Faults`]) and crash points of a snapshot install
//! ([`InstallFailpoints`]). Without it (every release and plain build) they
//! are zero-sized stand-ins whose checks are constant `false`, so the
//! product carries no fault code and the compiler removes the checks.

/// A point in receiving and installing a snapshot where a test can make the
/// member "crash": the step stops there, leaving the disk as a crash would
/// (no clean-up), and every later receive or install on this member fails,
/// until the test drops the node and opens its directory again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InstallStep {
    /// While staging: after the first received chunk was written.
    Staging,
    /// After the snapshot became a complete `snap-<n>` and openraft was told
    /// (so it may have purged the log it covers), before the engine switch.
    BeforeSwitch,
    /// After `CURRENT` names the new engine, before the old engine directory
    /// and old snapshots are deleted.
    AfterSwitch,
}

#[cfg(feature = "testing")]
pub use crate::testing::failpoints::InstallFailpoints;
#[cfg(feature = "testing")]
pub use crate::testing::faults::Faults;

#[cfg(not(feature = "testing"))]
pub use off::{Faults, InstallFailpoints};

/// The stand-ins of a build without `testing`: same checks, always off.
#[cfg(not(feature = "testing"))]
mod off {
    use super::InstallStep;

    /// No fault switches in this build: every check says "no fault".
    #[derive(Clone, Debug, Default)]
    pub struct Faults {
        _none: (),
    }

    impl Faults {
        /// Never: replies are always sent.
        #[inline(always)]
        pub fn drop_write_replies(&self) -> bool {
            false
        }

        /// Never: no peer link is cut.
        #[inline(always)]
        pub fn is_cut(&self, _peer: u64) -> bool {
            false
        }

        /// Never: snapshot chunks go out as read.
        #[inline(always)]
        pub fn take_snapshot_chunk_corruption(&self) -> Option<bool> {
            None
        }
    }

    /// No crash points in this build.
    #[derive(Clone, Debug, Default)]
    pub struct InstallFailpoints {
        _none: (),
    }

    impl InstallFailpoints {
        /// Never: no step is armed.
        #[inline(always)]
        pub fn hit(&self, _step: InstallStep) -> bool {
            false
        }

        /// Never: the member never "crashed".
        #[inline(always)]
        pub fn dead(&self) -> bool {
            false
        }
    }
}
