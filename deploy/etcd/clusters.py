"""What the etcd scripts under deploy/etcd/ share (compat.py, mirror.py,
clientv3/run.py): their reports, etcdctl, re-running a script inside a
private network namespace, and starting a fresh etcd 3.4 and a fresh
`kvnode local --nodes 3` on loopback, each process appended to the
caller's list so deploy/procs.py stops it by its pid."""

import os
import shutil
import subprocess
import sys

import procs  # deploy/procs.py (the scripts put deploy/ on sys.path first)

HOST = "127.0.0.1"
# `kvnode local`: member i's client port is PORT_BASE + i - 1 and its etcd
# port that + ETCD_PORT_OFFSET (node/kvnode/src/bin/kvnode/local.rs).
PORT_BASE = 7001
ETCD_PORT_OFFSET = 300
# A single-member etcd: (name, client port, peer port).
ETCD_ONE = [("e1", 2379, 2380)]
# A three-member etcd.
ETCD_THREE = [("e1", 2379, 2380), ("e2", 22379, 22380), ("e3", 32379, 32380)]


class Report:
    """A script's lines: `== NAME: ...`, and its two ways to end early:
    exit 1 on a failure, exit 2 (loudly) when a tool is missing."""

    def __init__(self, name):
        self.name = name

    def log(self, message):
        print(f"== {self.name}: {message}", flush=True)

    def fail(self, message):
        print(f"{self.name}: FAILED: {message}", file=sys.stderr, flush=True)
        sys.exit(1)

    def leave(self, work, keep):
        """Removes the work directory, or says where it was kept."""
        if keep:
            self.log(f"work directory kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)

    def missing(self, tool, how):
        print(f"{self.name}: MISSING {tool}: {how}; nothing was tested", file=sys.stderr, flush=True)
        sys.exit(2)


def etcdctl(endpoint, args, stdin=None, timeout=60):
    """etcdctl 3.4 (API v3) against `endpoint`, its output captured."""
    return subprocess.run(
        ["etcdctl", "--endpoints", endpoint, "--command-timeout=20s", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=dict(os.environ, ETCDCTL_API="3"),
    )


def wait_answering(report, name, endpoints, deadline_s):
    """Waits until `endpoints` answer `etcdctl endpoint health`, or fails
    naming `name` after `deadline_s` seconds."""

    def healthy():
        return etcdctl(",".join(endpoints), ["endpoint", "health"], timeout=30).returncode == 0

    if not procs.wait_until(healthy, deadline_s):
        report.fail(f"{name} answering at {','.join(endpoints)} within {deadline_s} s")


def in_namespace(report, script, env_name, argv):
    """Re-runs `script` with `argv` inside a private network namespace
    (`unshare -n`, with `env_name`=1 set so the child knows) and exits
    with its status."""
    for tool, how in (("unshare", "Debian util-linux"), ("ip", "Debian iproute2")):
        if shutil.which(tool) is None:
            report.missing(tool, f"install {how}")
    command = ["unshare", "-n", sys.executable, os.path.abspath(script), *argv]
    sys.exit(subprocess.run(command, env=dict(os.environ, **{env_name: "1"})).returncode)


def start_etcd(work, children, members=ETCD_ONE):
    """A fresh etcd 3.4 of `members` under `work`; its client endpoints."""
    cluster = ",".join(f"{n}=http://{HOST}:{peer}" for n, _, peer in members)
    for name, client, peer in members:
        children.append(subprocess.Popen(
            [
                "etcd", "--name", name, "--data-dir", os.path.join(work, name),
                "--listen-client-urls", f"http://{HOST}:{client}",
                "--advertise-client-urls", f"http://{HOST}:{client}",
                "--listen-peer-urls", f"http://{HOST}:{peer}",
                "--initial-advertise-peer-urls", f"http://{HOST}:{peer}",
                "--initial-cluster", cluster,
                "--initial-cluster-state", "new",
            ],
            stdout=open(os.path.join(work, f"{name}.log"), "w"),
            stderr=subprocess.STDOUT,
        ))
    return [f"{HOST}:{client}" for _, client, _ in members]


def start_raftcask(kvnode, work, children):
    """A fresh `kvnode local --nodes 3` under `work`; its members' etcd
    endpoints, member 1 first."""
    children.append(subprocess.Popen(
        [
            kvnode, "local", "--nodes", "3", "--dir", os.path.join(work, "kv"),
            "--host", HOST, "--port-base", str(PORT_BASE),
        ],
        stdout=open(os.path.join(work, "local.log"), "w"),
        stderr=subprocess.STDOUT,
    ))
    return [f"{HOST}:{PORT_BASE + i + ETCD_PORT_OFFSET}" for i in range(3)]
