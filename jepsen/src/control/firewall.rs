//! Firewall rules between members, with iptables inside the run's private
//! network namespace.
//!
//! Members listen on distinct loopback addresses (127.0.0.10+i) and bind
//! their outgoing peer connections to them, while clients connect from
//! 127.0.0.1; so a rule `-s A -d B -j DROP` in the INPUT chain cuts every
//! packet member A sends member B (requests and replies alike) and never
//! touches client traffic. Rules are appended to INPUT and healed by
//! flushing it; the namespace is private, so no other rule lives there.

use std::net::Ipv4Addr;
use std::process::Command;

use anyhow::{Context as _, bail};

use super::cluster::node_ip;

/// The chain the rules go into.
const CHAIN: &str = "INPUT";

/// iptables inside the current network namespace, or (no root) the
/// userspace peer proxies of [`super::proxy`].
#[derive(Debug)]
pub struct Firewall {
    proxies: Option<super::proxy::ProxyNet>,
}

impl Firewall {
    /// Checks that iptables works here (root, the tool installed) and starts
    /// from an empty chain.
    pub fn new() -> anyhow::Result<Self> {
        let firewall = Self { proxies: None };
        firewall
            .heal()
            .context("iptables does not work here (needs root and Debian's `iptables` package)")?;
        Ok(firewall)
    }

    /// Cuts links through userspace proxies instead of iptables (no root).
    pub fn with_proxies(proxies: super::proxy::ProxyNet) -> Self {
        Self {
            proxies: Some(proxies),
        }
    }

    /// Drops every packet member `from` sends member `to` (one direction;
    /// with proxies: every connection `from` opens to `to`).
    pub fn cut(&self, from: u64, to: u64) -> anyhow::Result<()> {
        if let Some(proxies) = &self.proxies {
            proxies.cut(from, to);
            return Ok(());
        }
        self.append(node_ip(from), node_ip(to), &[])
    }

    /// Drops packets member `from` sends member `to` with this probability.
    pub fn lossy(&self, from: u64, to: u64, probability: f64) -> anyhow::Result<()> {
        if self.proxies.is_some() {
            bail!("packet loss needs iptables (root); the userspace proxies cannot drop packets");
        }
        let probability = format!("{probability:.3}");
        self.append(
            node_ip(from),
            node_ip(to),
            &[
                "-m",
                "statistic",
                "--mode",
                "random",
                "--probability",
                &probability,
            ],
        )
    }

    /// Removes every rule.
    pub fn heal(&self) -> anyhow::Result<()> {
        if let Some(proxies) = &self.proxies {
            proxies.heal();
            return Ok(());
        }
        iptables(&["-F", CHAIN])
    }

    fn append(&self, from: Ipv4Addr, to: Ipv4Addr, matches: &[&str]) -> anyhow::Result<()> {
        let (from, to) = (from.to_string(), to.to_string());
        let mut args = vec!["-A", CHAIN, "-s", &from, "-d", &to];
        args.extend_from_slice(matches);
        args.extend_from_slice(&["-j", "DROP"]);
        iptables(&args)
    }
}

/// Runs `iptables -w ARGS` and fails with its stderr unless it succeeds.
fn iptables(args: &[&str]) -> anyhow::Result<()> {
    let output = Command::new("iptables")
        .arg("-w")
        .args(args)
        .output()
        .context("running iptables (Debian package `iptables`)")?;
    if !output.status.success() {
        bail!(
            "iptables {args:?} failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(())
}
