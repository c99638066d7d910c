//! # jepsen
//!
//! Fault-injection harness, history checkers and reports.
//!
//! This crate is an empty shell in the workspace layout: its work is tracked
//! by issue 7 of the project tracker and has not landed yet. Nothing here is
//! exported, so nothing can depend on it by accident.

// The fault-injection harness (helper "harness"; merge with the checker's
// module list).
pub mod control;
pub mod nemesis;
pub mod run;
pub mod workload;
