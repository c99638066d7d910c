#!/usr/bin/env python3
"""Migration from etcd (issue 21): `etcdctl make-mirror` copies a running
etcd 3.4 (Debian's etcd-server) into a fresh three-member raftcask
(`kvnode local --nodes 3`, through member 2's etcd port) and keeps
following it. The test writes keys into etcd before the mirror starts
(plain puts, keys attached to a lease, binary-safe values, a key
overwritten several times, a deleted key), starts make-mirror, waits until
raftcask holds exactly etcd's keys and values, then writes, overwrites and
deletes in etcd (including a multi-key transaction and a prefix delete)
while the mirror runs and waits until raftcask matches again. Every wait
has a deadline; make-mirror is stopped by its pid.

What is compared: every key and value (`etcdctl get "" --from-key -w json`,
base64 as etcdctl prints them). Revisions, versions and leases are not:
a mirror writes each key anew at the destination's own revisions, as
into an etcd.

Usage: deploy/etcd/mirror.py [--kvnode PATH] [--keep]
Needs etcd and etcdctl 3.4 (as root: apt-get install -y etcd-server
etcd-client), unshare and ip; exits 2, loudly, when one is missing.
Runs inside a private network namespace (`unshare -n`; it re-executes
itself there). Exit 0: raftcask followed etcd exactly.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.dont_write_bytecode = True  # no __pycache__ under deploy/
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import procs  # noqa: E402  (deploy/procs.py: stop by pid, wait with a deadline)
from clusters import (  # noqa: E402  (deploy/etcd/clusters.py)
    Report, etcdctl, in_namespace, start_etcd, start_raftcask, wait_answering,
)

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
# Bound of every wait (a cluster starting, the mirror catching up).
DEADLINE_S = 90
# Keys written before the mirror starts, and while it runs.
KEYS_BEFORE = 300
KEYS_DURING = 100
IN_NAMESPACE_ENV = "RAFTCASK_ETCD_MIRROR_NETNS"
REPORT = Report("etcd mirror")
log, fail, missing = REPORT.log, REPORT.fail, REPORT.missing


def must(endpoint, args, stdin=None):
    result = etcdctl(endpoint, args, stdin, timeout=DEADLINE_S)
    if result.returncode != 0:
        fail(f"etcdctl {' '.join(args)} at {endpoint}: {result.stderr.strip()}")
    return result.stdout


def contents(endpoint):
    """Every key and value (base64, as etcdctl's JSON has them), or None
    when the endpoint does not answer."""
    result = etcdctl(endpoint, ["get", "", "--from-key", "-w", "json"], timeout=DEADLINE_S)
    if result.returncode != 0:
        return None
    kvs = json.loads(result.stdout).get("kvs", [])
    return {kv["key"]: kv.get("value", "") for kv in kvs}


def wait_equal(what, source, mirror):
    last = {}

    def same():
        want, got = contents(source), contents(mirror)
        last["want"], last["got"] = want, got
        return want is not None and want == got

    if not procs.wait_until(same, DEADLINE_S):
        want, got = last.get("want") or {}, last.get("got") or {}
        only_etcd = sorted(set(want) - set(got))[:5]
        only_raftcask = sorted(set(got) - set(want))[:5]
        differ = sorted(k for k in set(want) & set(got) if want[k] != got[k])[:5]
        fail(
            f"{what}: raftcask does not match etcd within {DEADLINE_S} s "
            f"(etcd {len(want)} keys, raftcask {len(got)}; only in etcd {only_etcd}, "
            f"only in raftcask {only_raftcask}, values differ {differ})"
        )
    log(f"{what}: raftcask holds etcd's {len(last['want'])} keys and values")


def write_before(etcd):
    for i in range(KEYS_BEFORE):
        must(etcd, ["put", f"app/config/{i:04}", f"value {i}"]) if i % 3 else \
            must(etcd, ["put", f"svc/{i:04}", f"endpoint-{i}:80"])
    lease = must(etcd, ["lease", "grant", "600"]).split()[1]
    must(etcd, ["put", "--lease", lease, "svc/leased", "held by a lease"])
    for n in range(5):
        must(etcd, ["put", "overwritten", f"version {n}"])
    must(etcd, ["put", "gone", "x"])
    must(etcd, ["del", "gone"])
    must(etcd, ["put", "binary", "tab\tand \u00e9 and spaces  "])


def write_during(etcd):
    for i in range(KEYS_DURING):
        must(etcd, ["put", f"live/{i:04}", f"written while mirroring {i}"])
    must(etcd, ["put", "overwritten", "after the mirror started"])
    must(etcd, ["del", "--prefix", "svc/00"])
    must(etcd, ["txn"], stdin="\nput txn/a 1\nput txn/b 2\ndel app/config/0001\n\n\n")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kvnode", default=os.path.join(REPO, "target", "debug", "kvnode"))
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    args = parser.parse_args()
    for tool in ("etcd", "etcdctl"):
        if shutil.which(tool) is None:
            missing(tool, "as root: apt-get install -y etcd-server etcd-client (etcd 3.4)")
    if not os.access(args.kvnode, os.X_OK):
        fail(f"no kvnode at {args.kvnode} (cargo build -p kvnode)")
    if os.environ.get(IN_NAMESPACE_ENV) != "1":
        in_namespace(REPORT, __file__, IN_NAMESPACE_ENV, sys.argv[1:])
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)

    work = tempfile.mkdtemp(prefix="raftcask-etcd-mirror-")
    children = []
    try:
        etcd = start_etcd(work, children)[0]
        raftcask = start_raftcask(args.kvnode, work, children)[1]
        for name, endpoint in (("etcd", etcd), ("raftcask", raftcask)):
            wait_answering(REPORT, name, [endpoint], DEADLINE_S)

        write_before(etcd)
        log(f"etcd holds {len(contents(etcd))} keys; starting make-mirror into raftcask")
        mirror_log = open(os.path.join(work, "make-mirror.log"), "w")
        mirror = subprocess.Popen(
            ["etcdctl", "--endpoints", etcd, "make-mirror", raftcask],
            stdout=mirror_log, stderr=subprocess.STDOUT, env=dict(os.environ, ETCDCTL_API="3"),
        )
        children.append(mirror)
        wait_equal("the initial copy", etcd, raftcask)
        write_during(etcd)
        wait_equal("following new writes", etcd, raftcask)
        if mirror.poll() is not None:
            fail(f"make-mirror exited {mirror.returncode}: see {work}/make-mirror.log")
        log("PASSED")
    finally:
        procs.stop_processes(children)
        REPORT.leave(work, args.keep)


if __name__ == "__main__":
    main()
