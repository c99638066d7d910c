//! # kvbench
//!
//! Load generators and storage benchmarks (being built).
