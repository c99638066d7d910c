//! A private network namespace for one run.
//!
//! A holder process (`unshare --net`, which brings `lo` up and then sleeps)
//! creates the namespace; [`Namespace::enter_current_thread`] moves the
//! calling thread into it with `setns`. Network namespaces belong to
//! threads, so the harness runs the whole test on one dedicated thread with
//! a current-thread tokio runtime: every socket it opens and every child it
//! spawns (kvnode, iptables) lives in the namespace, and nothing leaves the
//! machine. The namespace, with its firewall rules, disappears when the
//! last thread and process in it are gone.

use std::fs::File;
use std::io::{BufRead as _, BufReader};
use std::os::fd::AsFd as _;
use std::process::{Child, Command, Stdio};

use anyhow::{Context as _, bail};
use rustix::thread::{LinkNameSpaceType, move_into_link_name_space};

/// How long the holder process sleeps at most (it is killed when the run
/// ends; this only bounds a holder left behind by a crashed harness).
const HOLDER_LIFETIME_SECONDS_MAX: u32 = 6 * 3600;
/// The line the holder prints once `lo` is up in the new namespace.
const HOLDER_READY_LINE: &str = "ready";

/// A private network namespace, kept alive by a holder child process.
#[derive(Debug)]
pub struct Namespace {
    holder: Child,
    ns_file: File,
}

impl Namespace {
    /// Creates the namespace (needs root and the `unshare` and `ip` tools).
    pub fn create() -> anyhow::Result<Self> {
        super::require_root("a private network namespace")?;
        let script = format!(
            "ip link set lo up && echo {HOLDER_READY_LINE} && exec sleep {HOLDER_LIFETIME_SECONDS_MAX}"
        );
        let mut holder = Command::new("unshare")
            .args(["--net", "--", "sh", "-c", &script])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .context("starting `unshare --net` (util-linux) for the private network namespace")?;
        let mut line = String::new();
        let read = holder
            .stdout
            .take()
            .map(|out| BufReader::new(out).read_line(&mut line));
        if line.trim() != HOLDER_READY_LINE {
            let _ = holder.kill();
            let status = holder.wait();
            bail!(
                "the namespace holder (`unshare --net` + `ip link set lo up`) did not get ready: \
                 read {read:?} {line:?}, exit {status:?}"
            );
        }
        let path = format!("/proc/{}/ns/net", holder.id());
        let ns_file = match File::open(&path) {
            Ok(file) => file,
            Err(err) => {
                let _ = holder.kill();
                let _ = holder.wait();
                return Err(err).with_context(|| format!("opening {path}"));
            }
        };
        Ok(Self { holder, ns_file })
    }

    /// Moves the calling thread (and every thread and process it starts
    /// later) into the namespace.
    pub fn enter_current_thread(&self) -> anyhow::Result<()> {
        move_into_link_name_space(self.ns_file.as_fd(), Some(LinkNameSpaceType::Network))
            .context("setns into the private network namespace")
    }
}

impl Drop for Namespace {
    fn drop(&mut self) {
        let _ = self.holder.kill();
        let _ = self.holder.wait();
    }
}
