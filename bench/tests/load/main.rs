//! kvbench's integration tests: the load core against real clusters.
//! Modules behind a feature compile only with it (`etcd`: needs the `etcd`
//! binary on PATH, Debian `etcd-server`).

#[cfg(feature = "etcd")]
mod etcd;
