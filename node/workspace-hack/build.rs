//! Empty: present so that cargo resolves this crate's build-dependencies
//! (syn's features for the host build of proc-macros; see Cargo.toml).
fn main() {}
