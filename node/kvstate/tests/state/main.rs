//! Integration tests of kvstate's deterministic apply and reads: one
//! binary, one module per scenario. Each module opens with what it proves
//! and how.

mod history;
mod range;
mod redis;
mod txn;
mod txn_model;
