#!/usr/bin/env python3
"""The etcdctl differential test (issue 21): plays one etcdctl 3.4 session
(Debian's etcd-client) against a fresh three-member etcd 3.4 (Debian's
etcd-server) and against a fresh three-member raftcask (`kvnode local
--nodes 3`), each through its member 2 (which may be a follower), and
compares every command's output, error and exit code.

Both stores start fresh, so both number their revisions alike (the first
put is revision 2): revisions are compared as they are. The only
normalisations are the ones etcd's own output forces on a comparison of
two clusters: member and cluster ids, lease ids (each replaced by its
order of appearance), raft terms and indexes, database sizes, server
versions (the server release in `GET /version` too), URLs and ports, the
remaining seconds of a lease (a timing), the leader flag of `endpoint
status` (which member answers), client log lines, `check perf` down to
what its report lines judge (throughput, slowest request, stddev: a load
check whose figures, verdicts and exit code depend on the machine's load;
both reports are logged), and `member list` and the
`--cluster` commands, compared as the set of their line shapes. Any other
difference fails.

Everything runs inside a private network namespace (`unshare -n`, loopback
only; the script re-executes itself there), and every process it starts is
stopped by its pid.

Usage: deploy/etcd/compat.py [--kvnode PATH] [--keep]
Needs etcd and etcdctl 3.4 (as root: apt-get install -y etcd-server
etcd-client), unshare and ip; exits 2, loudly, when one is missing.
Exit 0: no difference.
"""

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request

sys.dont_write_bytecode = True  # no __pycache__ under deploy/
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import procs  # noqa: E402  (deploy/procs.py: stop by pid, wait with a deadline)
from clusters import (  # noqa: E402  (deploy/etcd/clusters.py)
    ETCD_THREE, Report, etcdctl, in_namespace, start_etcd, start_raftcask, wait_answering,
)

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
# Every wait below gives up after this many seconds.
DEADLINE_S = 60
# The deadline of `etcdctl check perf` (its load runs for 60 s).
CHECK_PERF_S = 240
# How long a bounded `etcdctl watch` runs before it is stopped.
WATCH_S = 4
# Set in the re-executed child: it runs inside the private namespace.
IN_NAMESPACE_ENV = "RAFTCASK_ETCD_COMPAT_NETNS"

# The session: (label, etcdctl arguments, stdin). `{lease}` is the id the
# last `lease grant` printed on that system; `{compact}` the revision the
# session compacts at.
SESSION = [
    ("put", ["put", "k1", "v1"], None),
    ("put", ["put", "k2", "v2"], None),
    ("put", ["put", "k3", "v3"], None),
    ("put", ["put", "other", "x"], None),
    ("put overwrite", ["put", "k1", "v1b"], None),
    ("get", ["get", "k1"], None),
    ("get json", ["get", "k1", "-w", "json"], None),
    ("get missing", ["get", "nothing"], None),
    ("get prefix", ["get", "k", "--prefix"], None),
    ("get prefix limit", ["get", "k", "--prefix", "--limit", "2"], None),
    ("get prefix limit json", ["get", "k", "--prefix", "--limit", "2", "-w", "json"], None),
    ("get sort", ["get", "k", "--prefix", "--sort-by", "MODIFY", "--order", "DESCEND"], None),
    ("get sort value", ["get", "k", "--prefix", "--sort-by", "VALUE", "--order", "ASCEND"], None),
    ("get keys-only", ["get", "k", "--prefix", "--keys-only"], None),
    ("get rev", ["get", "k1", "--rev", "2"], None),
    ("get from key", ["get", "k2", "--from-key"], None),
    ("get serializable", ["get", "k1", "--consistency", "s"], None),
    ("get future rev", ["get", "k1", "--rev", "1000"], None),
    ("del prev-kv", ["del", "k2", "--prev-kv"], None),
    ("del missing", ["del", "k2"], None),
    ("put prev-kv", ["put", "k3", "v3b", "--prev-kv"], None),
    (
        "txn success",
        ["txn"],
        'value("k1") = "v1b"\nversion("k1") = "2"\ncreate("k1") = "2"\nmod("k1") > "2"\n\n'
        "put k4 v4\nget k1\n\nput k5 v5\n\n",
    ),
    (
        "txn failure",
        ["txn"],
        'value("k1") = "nope"\n\nput k6 v6\n\nget k4\ndel k3\n\n',
    ),
    ("txn json", ["txn", "-w", "json"], 'value("k4") = "v4"\n\nget k4\n\n\n'),
    ("watch from rev", ["watch", "k", "--prefix", "--rev", "2"], "WATCH"),
    ("watch prev-kv", ["watch", "k1", "--rev", "6", "--prev-kv"], "WATCH"),
    ("lease grant", ["lease", "grant", "30"], None),
    ("put lease", ["put", "lk", "lv", "--lease={lease}"], None),
    ("lease keep-alive once", ["lease", "keep-alive", "--once", "{lease}"], None),
    ("lease timetolive", ["lease", "timetolive", "{lease}", "--keys"], None),
    ("lease list", ["lease", "list"], None),
    ("get lease key json", ["get", "lk", "-w", "json"], None),
    ("lease revoke", ["lease", "revoke", "{lease}"], None),
    ("get revoked key", ["get", "lk"], None),
    ("lease timetolive revoked", ["lease", "timetolive", "{lease}"], None),
    ("lease revoke again", ["lease", "revoke", "{lease}"], None),
    ("put before compaction", ["put", "k7", "v7"], None),
    ("compaction", ["compaction", "{compact}"], None),
    ("get compacted rev", ["get", "k1", "--rev", "2"], None),
    ("get at compact rev", ["get", "k", "--prefix", "--rev", "{compact}"], None),
    ("compaction again", ["compaction", "3"], None),
    ("watch compacted", ["watch", "k", "--prefix", "--rev", "2"], "WATCH"),
    ("watch from compact rev", ["watch", "k", "--prefix", "--rev", "{compact}"], "WATCH"),
    ("del prefix", ["del", "k", "--prefix", "--prev-kv"], None),
    ("get all", ["get", "", "--prefix"], None),
    ("member list", ["member", "list"], None),
    ("endpoint status", ["endpoint", "status"], None),
    ("endpoint health", ["endpoint", "health"], None),
    ("alarm list", ["alarm", "list"], None),
    # etcdctl's lock (clientv3's concurrency.Mutex): takes the lock, runs
    # the command, releases it; nothing of it is left afterwards.
    ("lock exec", ["lock", "mylock", "echo", "held"], None),
    ("lock released", ["get", "mylock", "--prefix", "--keys-only"], None),
    # etcdctl's elect (clientv3's Election): a campaign that wins and holds
    # office while `elect -l` observes the leader's proposal, then resigns
    # when stopped; nothing of it is left afterwards.
    ("elect and observe", ["myelection", "p1"], "ELECT"),
    ("elect resigned", ["get", "myelection", "--prefix", "--keys-only"], None),
    ("defrag", ["defrag"], None),
    ("get after defrag", ["get", "", "--prefix", "-w", "json"], None),
    # Endpoints written as URLs (`http://host:port`), the usual way. The
    # `--cluster` commands dial every member's URL from MemberList as a
    # gRPC passthrough target, so clientv3 sends the whole URL as the
    # HTTP/2 :authority (raftcask before its :authority repair reset those
    # streams with PROTOCOL_ERROR). Raftcask has three members, the
    # reference one: compared as the set of line shapes.
    ("get via a URL endpoint", ["get", "", "--prefix", "--keys-only"], "URL"),
    ("put via a URL endpoint", ["put", "url", "u"], "URL"),
    ("endpoint health --cluster", ["endpoint", "health", "--cluster"], None),
    ("endpoint status --cluster", ["endpoint", "status", "--cluster"], None),
    ("del via a URL endpoint", ["del", "url"], "URL"),
    # Plain HTTP GETs on the client (etcd) port, not etcdctl: status and body.
    ("http version", ["/version"], "HTTP"),
    ("http health", ["/health"], "HTTP"),
    # etcdctl's own load check, last (its ~9000 puts at a fixed rate would
    # make later revisions differ by timing): it must run to its end with
    # the same report lines. Its figures and PASS/FAIL verdicts depend on
    # the machine's load, so they are normalised (and logged).
    ("check perf", ["check", "perf"], None),
]


REPORT = Report("etcd compat")
log, fail, missing = REPORT.log, REPORT.fail, REPORT.missing


def watch(endpoint, args):
    """A bounded watch: what it printed in WATCH_S seconds."""
    env = dict(os.environ, ETCDCTL_API="3")
    child = subprocess.Popen(
        ["etcdctl", "--endpoints", endpoint, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        out, err = child.communicate(timeout=WATCH_S)
    except subprocess.TimeoutExpired:
        child.send_signal(signal.SIGTERM)
        out, err = child.communicate()
        return out, err, "stopped"
    return out, err, str(child.returncode)


def elect(endpoint, name, proposal):
    """A campaign for `name` in the background; once its key is there, a
    bounded `elect -l` (what it printed in WATCH_S seconds); then the
    campaign stopped (it resigns). Both outputs, the listener's first."""
    env = dict(os.environ, ETCDCTL_API="3")
    campaign = subprocess.Popen(
        ["etcdctl", "--endpoints", endpoint, "elect", name, proposal],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        won = procs.wait_until(
            lambda: etcdctl(endpoint, ["get", name, "--prefix", "--keys-only"]).stdout.strip(),
            DEADLINE_S,
        )
        listened = watch(endpoint, ["elect", "-l", name]) if won else ("", "no leader key", "")
    finally:
        campaign.send_signal(signal.SIGTERM)
        out, err = campaign.communicate(timeout=DEADLINE_S)
    return (
        f"{listened[0]}\n-- campaign --\n{out}",
        f"{listened[1]}\n-- campaign --\n{err}",
        f"{listened[2]}/{campaign.returncode}",
    )


def http_get(endpoint, path):
    """One HTTP/1.1 GET: the body, no error text, the status code."""
    try:
        with urllib.request.urlopen(f"http://{endpoint}{path}", timeout=DEADLINE_S) as answer:
            return answer.read().decode(), "", str(answer.status)
    except urllib.error.HTTPError as err:
        return err.read().decode(), "", str(err.code)


LEASE_ID = re.compile(r"\b[0-9a-f]{16}\b")
# The report lines of `etcdctl check perf`, and what each judges.
VERDICT = re.compile(r"PASS|FAIL")
PERF_TOPIC = re.compile(r"Throughput|Slowest request|Stddev")


class Normaliser:
    """The named normalisations (see the module doc), with lease ids
    numbered in order of appearance on each system."""

    def __init__(self):
        self.leases = {}

    def lease(self, match):
        text = match.group(0)
        if text not in self.leases:
            self.leases[text] = f"<lease{len(self.leases) + 1}>"
        return self.leases[text]

    def json_text(self, text, label):
        try:
            value = json.loads(text)
        except ValueError:
            return text
        def walk(node):
            if isinstance(node, dict):
                out = {}
                for key, item in node.items():
                    if key in ("cluster_id", "member_id", "raft_term", "ID", "id"):
                        out[key] = "<id>"
                    elif key == "lease" and item:
                        out[key] = self.lease_number(item)
                    else:
                        out[key] = walk(item)
                return out
            if isinstance(node, list):
                return [walk(item) for item in node]
            return node
        return json.dumps(walk(value), sort_keys=True)

    def lease_number(self, number):
        return self.lease(re.match(r".*", format(int(number), "016x")))

    def text(self, label, text):
        lines = [
            line for line in text.splitlines()
            # clientv3's own log lines (retries, timestamps).
            if not line.startswith('{"level"')
        ]
        text = "\n".join(lines)
        if label == "check perf":
            # The report lines only (not the progress bar), as the set of
            # what they judge: a failed check words its line otherwise
            # ("Slowest request took too long: ...", no PASS/FAIL prefix),
            # so only the topics and the closing verdict are compared.
            topics = set()
            for line in text.splitlines():
                topic = PERF_TOPIC.search(line)
                if topic:
                    topics.add(topic.group(0))
                elif VERDICT.fullmatch(line.strip()):
                    topics.add("<verdict>")
            return "\n".join(sorted(topics))
        if label == "http version":
            # The server's own release (etcd: 3.4.x); the cluster version
            # is compared as it is.
            return re.sub(r'"etcdserver":"[^"]*"', '"etcdserver":"<version>"', text)
        if text.startswith("{"):
            return self.json_text(text, label)
        if label == "member list":
            shapes = set()
            for line in text.splitlines():
                fields = [f.strip() for f in line.split(",")]
                if len(fields) == 6:
                    fields[0] = "<id>"
                    fields[2] = "<name>"
                    fields[3] = re.sub(r"\d+", "<n>", fields[3])
                    fields[4] = re.sub(r"\d+", "<n>", fields[4])
                shapes.add(", ".join(fields))
            return "\n".join(sorted(shapes))
        if label.endswith("--cluster"):
            # One line per member: the set of their normalised shapes.
            base = label.removesuffix(" --cluster")
            return "\n".join(sorted({self.text(base, line) for line in text.splitlines()}))
        if label in ("endpoint status", "endpoint health", "defrag"):
            text = re.sub(r"127\.0\.0\.1:\d+", "<endpoint>", text)
            text = re.sub(r"took = [0-9.]+[µmn]?s", "took = <t>", text)
            fields = [f.strip() for f in text.split(",")]
            if label == "endpoint status" and len(fields) >= 9:
                # endpoint, id, version, db size, is leader, is learner,
                # raft term, raft index, raft applied index, errors
                fields[1] = "<id>"
                fields[2] = "<version>"
                fields[3] = "<size>"
                fields[4] = "<leader?>"
                fields[6] = "<term>"
                fields[7] = "<index>"
                fields[8] = "<applied>"
            return ", ".join(fields)
        # Lease ids (not member ids: etcd's are 16 hex digits too, and the
        # branches above replace them).
        text = LEASE_ID.sub(self.lease, text)
        return re.sub(r"remaining\(\d+s\)", "remaining(<s>s)", text)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kvnode", default=os.path.join(REPO, "target", "debug", "kvnode"))
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    parser.add_argument("--show", action="store_true", help="print every normalised answer")
    args = parser.parse_args()
    for tool in ("etcd", "etcdctl"):
        if shutil.which(tool) is None:
            missing(tool, "as root: apt-get install -y etcd-server etcd-client (etcd 3.4)")
    if not os.access(args.kvnode, os.X_OK):
        fail(f"no kvnode at {args.kvnode} (cargo build -p kvnode)")
    if os.environ.get(IN_NAMESPACE_ENV) != "1":
        in_namespace(REPORT, __file__, IN_NAMESPACE_ENV, sys.argv[1:])
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    version = subprocess.run(["etcd", "--version"], capture_output=True, text=True).stdout
    log(f"reference: {version.splitlines()[0] if version else 'etcd'}")

    work = tempfile.mkdtemp(prefix="raftcask-etcd-compat-")
    children = []
    try:
        # Member 2 of each, which may be a follower.
        reference = start_etcd(work, children, ETCD_THREE)[1]
        # Member 2, which may be a follower.
        raftcask = start_raftcask(args.kvnode, work, children)[1]
        for name, endpoint in (("etcd", reference), ("raftcask", raftcask)):
            wait_answering(REPORT, name, [endpoint], DEADLINE_S)
        results = {
            name: play_with_compaction(endpoint)
            for name, endpoint in (("etcd", reference), ("raftcask", raftcask))
        }
        if args.show:
            for row in results["raftcask"]:
                print(f"--- {row[0]}: etcdctl {row[1]} (exit {row[4]})\n{row[2]}\n{row[3]}")
        differences = []
        for (a, b) in zip(results["etcd"], results["raftcask"]):
            if a != b:
                differences.append((a, b))
        for a, b in differences:
            print(f"--- {a[0]}: etcdctl {a[1]}", flush=True)
            for what, x, y in (("stdout", a[2], b[2]), ("stderr", a[3], b[3]), ("exit", a[4], b[4])):
                if x != y:
                    print(f"  {what} etcd:     {x!r}\n  {what} raftcask: {y!r}", flush=True)
        log(f"{len(SESSION)} commands compared; {len(differences)} difference(s)")
        if differences:
            fail(f"{len(differences)} difference(s) from etcd")
        log("PASSED")
    finally:
        procs.stop_processes(children)
        REPORT.leave(work, args.keep)


def play_with_compaction(endpoint):
    """Plays the session; the compaction revision is the store revision
    right after "put before compaction", read on the same system (so it
    is compared too: `get json` headers carry it)."""
    split = next(i for i, (label, _, _) in enumerate(SESSION) if label == "compaction")
    first = play_part(endpoint, SESSION[:split], None, Normaliser(), {})
    done = etcdctl(endpoint, ["get", "k1", "-w", "json"])
    revision = json.loads(done.stdout)["header"]["revision"]
    second = play_part(endpoint, SESSION[split:], revision, first[1], first[2])
    results = first[0] + second[0]
    results.append(("compaction revision", "", str(revision), "", "0"))
    return results


def play_part(endpoint, part, compact_revision, normaliser, state):
    results = []
    for label, args, stdin in part:
        args = [
            arg.replace("{lease}", state.get("lease") or "0").replace(
                "{compact}", str(compact_revision)
            )
            for arg in args
        ]
        if stdin == "WATCH":
            out, err, code = watch(endpoint, args)
        elif stdin == "HTTP":
            out, err, code = http_get(endpoint, args[0])
        elif stdin == "ELECT":
            out, err, code = elect(endpoint, args[0], args[1])
        elif stdin == "URL":
            done = etcdctl(f"http://{endpoint}", args)
            out, err, code = done.stdout, done.stderr, str(done.returncode)
        else:
            timeout = CHECK_PERF_S if label == "check perf" else DEADLINE_S
            done = etcdctl(endpoint, args, stdin, timeout=timeout)
            out, err, code = done.stdout, done.stderr, str(done.returncode)
        if label == "check perf":
            # A failed check's lines may go to stderr: both are read.
            out, err = f"{out}\n{err}", ""
            log(f"check perf on {endpoint}: exit {code}; "
                + "; ".join(line.strip() for line in out.splitlines()
                            if PERF_TOPIC.search(line) or VERDICT.fullmatch(line.strip())))
            code = "<exit>"
        if label == "lease grant":
            found = LEASE_ID.search(out)
            state["lease"] = found.group(0) if found else None
        results.append((
            label,
            " ".join(a for a in args if not LEASE_ID.fullmatch(a) and "--lease=" not in a),
            normaliser.text(label, out.strip()),
            normaliser.text(label, err.strip()),
            code,
        ))
    return results, normaliser, state


if __name__ == "__main__":
    main()
