//! Control of the cluster under test: a private network namespace for the
//! run ([`netns`]), the real `kvnode` child processes inside it
//! ([`cluster`]) and the firewall rules that cut links between them
//! ([`firewall`]).
//!
//! The namespace and iptables need root (CI runs as root). Without root
//! (or with `JEPSEN_FORCE_PROXY=1`), `jepsen run` falls back to the
//! userspace peer proxies of [`proxy`]: partitions, kills and pauses only.

pub mod cluster;
pub mod firewall;
pub mod netns;
pub mod proxy;

pub use cluster::{Cluster, ClusterConfig};
pub use firewall::Firewall;
pub use netns::Namespace;

/// Fails with a clear message unless the process runs as root.
pub fn require_root(what: &str) -> anyhow::Result<()> {
    if rustix::process::geteuid().is_root() {
        Ok(())
    } else {
        anyhow::bail!(
            "{what} needs root (a private network namespace and iptables; CI runs as root); \
             the no-root userspace proxy fallback is not built — run as root"
        )
    }
}
