#!/usr/bin/env python3
"""The clientv3 recipes check: builds deploy/etcd/clientv3/main.go offline
(GOPATH mode, Debian's golang-go and golang-etcd-server-dev, no module
download) and runs it against a fresh three-member etcd 3.4 (Debian's
etcd-server: the program's own checks shown right against the real
thing) and then against a fresh three-member raftcask (`kvnode local
--nodes 3`), each time with its goroutines spread over all three members'
etcd endpoints: concurrency.Mutex, Election and STM under serializable
snapshot, serializable and repeatable-read isolation (main.go says what
each checks).

Everything runs inside a private network namespace (`unshare -n`, loopback
only; the script re-executes itself there), and every process it starts is
stopped by its pid (deploy/procs.py).

Usage: deploy/etcd/clientv3/run.py [--kvnode PATH] [--keep] [-- PROGRAM FLAGS]
Needs go (as root: apt-get install -y golang-go), golang-etcd-server-dev,
etcd and etcdctl 3.4 (etcd-server, etcd-client), unshare and ip; exits 2,
loudly, when one is missing. Exit 0: every check passed on both.
"""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.dont_write_bytecode = True  # no __pycache__ under deploy/
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import procs  # noqa: E402  (deploy/procs.py: stop by pid, wait with a deadline)
from clusters import (  # noqa: E402  (deploy/etcd/clusters.py)
    ETCD_THREE, Report, start_etcd, start_raftcask, wait_answering,
)

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
# Debian's golang-etcd-server-dev puts etcd 3.4's sources here.
GOCODE = "/usr/share/gocode"
CLIENTV3 = os.path.join(GOCODE, "src", "go.etcd.io", "etcd", "clientv3")
# Every wait for a cluster to answer gives up after this many seconds.
DEADLINE_S = 60
# The longest one run of the program may take (its own -deadline is
# given this, and the script stops it a little after).
RUN_DEADLINE_S = 150
# What each run does unless flags after `--` say otherwise: enough
# contention to matter, small enough for CI.
PROGRAM_FLAGS = ["-workers", "8", "-iterations", "30", "-accounts", "10"]
# Set in the re-executed child: it runs inside the private namespace.
IN_NAMESPACE_ENV = "RAFTCASK_CLIENTV3_NETNS"


REPORT = Report("clientv3")
log, fail, missing = REPORT.log, REPORT.fail, REPORT.missing


def check_tools():
    for tool, how in (
        ("go", "as root: apt-get install -y golang-go"),
        ("etcd", "as root: apt-get install -y etcd-server (etcd 3.4)"),
        ("etcdctl", "as root: apt-get install -y etcd-client (etcd 3.4)"),
        ("unshare", "install Debian util-linux"),
        ("ip", "install Debian iproute2"),
    ):
        if shutil.which(tool) is None:
            missing(tool, how)
    if not os.path.isdir(CLIENTV3):
        missing(CLIENTV3, "as root: apt-get install -y golang-etcd-server-dev (etcd 3.4)")


def build(work):
    """Builds the program offline in GOPATH mode; returns its path."""
    binary = os.path.join(work, "clientv3check")
    env = dict(
        os.environ,
        GO111MODULE="off",
        GOPATH=f"{GOCODE}:{os.path.join(work, 'gopath')}",
        GOFLAGS="",
        GOPROXY="off",
        GOCACHE=os.environ.get("GOCACHE") or os.path.join(work, "gocache"),
    )
    started = time.time()
    result = subprocess.run(
        ["go", "build", "-o", binary, "main.go"], cwd=HERE, env=env, capture_output=True, text=True
    )
    if result.returncode != 0:
        fail(f"go build (GOPATH mode against {GOCODE}):\n{result.stdout}{result.stderr}")
    log(f"built {binary} in {time.time() - started:.1f} s")
    return binary


def run_program(name, binary, endpoints, flags):
    """Runs the program against `endpoints`; whether it passed."""
    command = [
        binary, "-endpoints", ",".join(endpoints), "-deadline", f"{RUN_DEADLINE_S}s", *flags,
    ]
    log(f"{name}: {' '.join(command)}")
    started = time.time()
    try:
        result = subprocess.run(command, timeout=RUN_DEADLINE_S + 30)
    except subprocess.TimeoutExpired:
        log(f"{name}: the program outlived its deadline and was stopped")
        return False
    log(f"{name}: exit {result.returncode} after {time.time() - started:.1f} s")
    return result.returncode == 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kvnode", default=os.path.join(REPO, "target", "debug", "kvnode"))
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    parser.add_argument("--binary", help=argparse.SUPPRESS)  # set for the re-executed child
    parser.add_argument("flags", nargs="*", help="the program's flags (after --)")
    args = parser.parse_args()
    check_tools()
    if not os.access(args.kvnode, os.X_OK):
        fail(f"no kvnode at {args.kvnode} (cargo build -p kvnode)")
    flags = args.flags or PROGRAM_FLAGS
    if os.environ.get(IN_NAMESPACE_ENV) != "1":
        # Built before the namespace (the build needs no network either).
        work = tempfile.mkdtemp(prefix="raftcask-clientv3-build-")
        try:
            binary = build(work)
            command = [
                "unshare", "-n", sys.executable, os.path.abspath(__file__),
                "--kvnode", args.kvnode, "--binary", binary,
                *(["--keep"] if args.keep else []), "--", *flags,
            ]
            env = dict(os.environ, **{IN_NAMESPACE_ENV: "1"})
            sys.exit(subprocess.run(command, env=env).returncode)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    work = tempfile.mkdtemp(prefix="raftcask-clientv3-")
    results = {}
    try:
        for name, start in (
            ("etcd 3.4", lambda children: start_etcd(work, children, ETCD_THREE)),
            ("raftcask", lambda children: start_raftcask(args.kvnode, work, children)),
        ):
            children = []
            try:
                endpoints = start(children)
                wait_answering(REPORT, name, endpoints, DEADLINE_S)
                results[name] = run_program(name, args.binary, endpoints, flags)
            finally:
                procs.stop_processes(children)
        for name, passed in results.items():
            log(f"{name}: {'passed' if passed else 'FAILED'}")
        if not all(results.values()):
            fail("a check failed (see above; the logs are in the work directory with --keep)")
        log("PASSED")
    finally:
        REPORT.leave(work, args.keep)


if __name__ == "__main__":
    main()
