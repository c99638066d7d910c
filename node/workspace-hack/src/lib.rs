//! Feature unification only: this crate has no code. See its Cargo.toml
//! for why it exists and `.ci/product-build` for the check that keeps it
//! exact.
