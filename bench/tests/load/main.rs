//! kvbench's integration tests: the load core (kvload, as `kvbench::load`)
//! against real clusters. `raftcask`: an in-process cluster. Modules behind
//! a feature compile only with it (`etcd`: needs the `etcd` binary on PATH,
//! Debian `etcd-server`).

mod raftcask;

#[cfg(feature = "etcd")]
mod etcd;
