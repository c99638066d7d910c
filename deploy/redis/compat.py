#!/usr/bin/env python3
"""The redis-cli differential test (issue 22): drives redis-cli through the
sessions of compat-commands.txt against a real redis-server (Debian's
redis-server 7) and against the leader of a three-member raftcask
(`kvnode local --nodes 3`), and compares every reply. Only the
normalisations the file's marks name are applied (timings, ids, server
versions, the INFO body, the order of unordered replies); any other
difference fails. Then deploy/redis/clients.py runs redis-py 5 (PyPI
`redis`, installed in a virtual environment under target/redis-py) against
the cluster — pipelines, RESP3, MULTI/EXEC, WATCH races between clients —
and redis-benchmark runs `-t set,get,incr,mset,hset` at `-P 1` and `-P 16`
against it and must report no error.

Usage: deploy/redis/compat.py [--kvnode PATH] [--keep]
Needs redis-server, redis-cli and redis-benchmark (Debian: redis-server,
redis-tools); exits 2, loudly, when one is missing. Every process it starts
is stopped by its pid. Exit 0: no difference and no benchmark error.
"""

import argparse
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import procs  # noqa: E402  (deploy/procs.py: stop by pid, wait with a deadline)

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
# Every wait below gives up after this many seconds.
DEADLINE_S = 60
# Requests per redis-benchmark test (each of -P 1 and -P 16).
BENCH_REQUESTS = 20000
# redis-benchmark's concurrent clients.
BENCH_CLIENTS = 50
HOST = "127.0.0.1"


def log(message):
    print(f"== redis compat: {message}", flush=True)


def fail(message):
    print(f"redis compat: FAILED: {message}", file=sys.stderr, flush=True)
    sys.exit(1)


def free_port_base(count_offsets, avoid=()):
    """A port base whose ports base+o are all free right now, below the
    kernel's ephemeral range (32768 and up): a port from that range may be
    taken by a member's outgoing connection before the member binds it."""
    seed = os.getpid() * 7919
    for attempt in range(500):
        base = 20000 + (seed + attempt * 104729) % 12000
        if any(base + offset in avoid for offset in count_offsets):
            continue
        sockets = []
        try:
            for offset in count_offsets:
                s = socket.socket()
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                s.bind((HOST, base + offset))
                sockets.append(s)
            return base
        except OSError:
            continue
        finally:
            for s in sockets:
                s.close()
    fail("no free port base")


def cli(port, *args, stdin=None):
    return subprocess.run(
        ["redis-cli", "-h", HOST, "-p", str(port), "--no-raw", *args],
        input=stdin,
        capture_output=True,
        timeout=DEADLINE_S,
    )


def wait_for(what, check):
    if not procs.wait_until(check, DEADLINE_S):
        fail(f"{what} within {DEADLINE_S} s")


def parse_sessions(path):
    sessions = []
    for raw in open(path, encoding="utf-8"):
        line = raw.rstrip("\n")
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if line.startswith("--- "):
            sessions.append((line[4:].strip(), []))
            continue
        mark = None
        if line.startswith("@"):
            mark, line = line.split(" ", 1)
            mark = mark[1:]
            if mark not in ("timing", "id", "hello", "sorted", "pairs", "scan", "scanpairs", "skip"):
                fail(f"unknown mark @{mark} in {path}")
        sessions[-1][1].append((mark, line))
    return sessions


MARKER = "raftcask-compat-marker"


def run_session(port, commands):
    """Feeds the session to one redis-cli; returns one output per command
    (commands inside MULTI ... EXEC share the output of their block)."""
    lines = []
    in_multi = False
    groups = []  # per group: [(mark, command)], its output comes after its marker
    for mark, command in commands:
        word = command.split(" ", 1)[0].upper()
        if not in_multi:
            lines.append(f"ECHO {MARKER}{len(groups)}")
            groups.append([])
        groups[-1].append((mark, command))
        lines.append(command)
        if word == "MULTI":
            in_multi = True
        elif word in ("EXEC", "DISCARD") and in_multi:
            in_multi = False
    result = cli(port, stdin=("\n".join(lines) + "\n").encode())
    text = result.stdout.decode("utf-8", errors="replace")
    outputs = [""] * len(groups)
    current = None
    for line in text.splitlines():
        match = re.fullmatch(rf'"{MARKER}(\d+)"', line)
        if match:
            current = int(match.group(1))
            continue
        if current is None:
            outputs.append(f"<output before any marker: {line}>")
            continue
        outputs[current] += line + "\n"
    return groups, outputs


def elements(output):
    """The element lines of a redis-cli array output, without numbering."""
    return [re.sub(r"^(\s*\d+\) )+\s*", "", line) for line in output.splitlines()]


def normalise(mark, output):
    if mark is None:
        return output
    if mark == "skip":
        return "<not compared>\n"
    if mark == "timing":
        return re.sub(r"\(integer\) \d+", "(integer) <time>", output)
    if mark == "id":
        return re.sub(r"\(integer\) \d+", "(integer) <id>", output)
    if mark == "hello":
        lines = output.splitlines()
        out = []
        mask_next = False
        for line in lines:
            if mask_next:
                line = re.sub(r"(\d+\) )?.*", r"\1<masked>", line, count=1)
                mask_next = False
            elif re.search(r'"(version|id)" => ', line):
                line = re.sub(r"=> .*", "=> <masked>", line)
            elif re.fullmatch(r'\s*\d+\) "(version|id)"', line):
                mask_next = True
            out.append(line)
        return "\n".join(out) + "\n"
    if mark == "sorted":
        return "\n".join(sorted(elements(output))) + "\n"
    if mark == "pairs":
        items = elements(output)
        pairs = sorted(zip(items[0::2], items[1::2]))
        return "\n".join(f"{a} {b}" for a, b in pairs) + "\n"
    if mark in ("scan", "scanpairs"):
        lines = output.splitlines()
        if not lines:
            return output
        cursor = lines[0]
        items = elements("\n".join(lines[1:]))
        if mark == "scan":
            rest = sorted(items)
        else:
            rest = [f"{a} {b}" for a, b in sorted(zip(items[0::2], items[1::2]))]
        return "\n".join([cursor] + rest) + "\n"
    return output


def compare(sessions, redis_port, raftcask_port):
    compared = normalised = skipped = 0
    differences = []
    for name, commands in sessions:
        groups_r, out_r = run_session(redis_port, commands)
        _, out_k = run_session(raftcask_port, commands)
        if len(out_r) != len(out_k):
            differences.append(f"[{name}] different numbers of replies: {len(out_r)} vs {len(out_k)}")
            continue
        for group, expected, got in zip(groups_r, out_r, out_k):
            marks = {mark for mark, _ in group if mark}
            mark = next(iter(marks)) if len(marks) == 1 and len(group) == 1 else None
            if len(group) > 1 and marks:
                # A MULTI block's marks apply to its whole output.
                mark = next(iter(marks))
            compared += len(group)
            if mark == "skip":
                skipped += len(group)
            elif mark:
                normalised += len(group)
            if normalise(mark, expected) != normalise(mark, got):
                shown = "\n      ".join(command for _, command in group)
                differences.append(
                    f"[{name}] {shown}\n    redis-server:\n      "
                    + expected.rstrip("\n").replace("\n", "\n      ")
                    + "\n    raftcask:\n      "
                    + got.rstrip("\n").replace("\n", "\n      ")
                )
    return compared, normalised, skipped, differences


# redis-py, the Python client clients.py drives (PyPI `redis`).
REDIS_PY = "redis>=5,<6"
REDIS_PY_VENV = os.path.join(REPO, "target", "redis-py")


def python_clients(port):
    """deploy/redis/clients.py under redis-py, installed on first use."""
    python = os.path.join(REDIS_PY_VENV, "bin", "python")
    have = os.access(python, os.X_OK) and subprocess.run(
        [python, "-c", "import redis"], capture_output=True).returncode == 0
    if not have:
        log(f"installing {REDIS_PY} into {REDIS_PY_VENV}")
        made = subprocess.run([sys.executable, "-m", "venv", REDIS_PY_VENV], capture_output=True)
        installed = made.returncode == 0 and subprocess.run(
            [python, "-m", "pip", "install", "-q", REDIS_PY], capture_output=True).returncode == 0
        if not installed:
            print(
                f"redis compat: MISSING redis-py: could not make {REDIS_PY_VENV} with {REDIS_PY} "
                "(python3-venv and PyPI are needed); the Python client test did not run",
                file=sys.stderr,
            )
            sys.exit(2)
    result = subprocess.run(
        [python, os.path.join(HERE, "clients.py"), HOST, str(port)],
        capture_output=True, text=True, timeout=600,
    )
    if result.returncode != 0:
        fail(f"deploy/redis/clients.py:\n{result.stdout}{result.stderr}")
    log(result.stdout.strip())


def benchmark(port):
    for pipeline in (1, 16):
        result = subprocess.run(
            [
                "redis-benchmark", "-h", HOST, "-p", str(port), "-t", "set,get,incr,mset,hset",
                "-n", str(BENCH_REQUESTS), "-c", str(BENCH_CLIENTS), "-P", str(pipeline),
                "-d", "256", "-r", "10000", "-q",
            ],
            capture_output=True,
            timeout=600,
        )
        out = (result.stdout + result.stderr).decode("utf-8", errors="replace")
        summary = [l for l in out.replace("\r", "\n").splitlines() if "requests per second" in l]
        log(f"redis-benchmark -P {pipeline}:")
        for line in summary:
            print(f"   {line.strip()}", flush=True)
        # redis-benchmark 7 stops at the first error reply ("Error from
        # server: ..."), so a run with all five summaries had none.
        errors = [l for l in out.splitlines() if "error" in l.lower()]
        if result.returncode != 0 or errors or len(summary) != 5:
            fail(f"redis-benchmark -P {pipeline} (exit {result.returncode}):\n{out[-3000:]}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kvnode", default=os.path.join(REPO, "target", "debug", "kvnode"))
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    parser.add_argument("--no-bench", action="store_true", help="skip redis-benchmark")
    args = parser.parse_args()
    for tool in ("redis-server", "redis-cli", "redis-benchmark"):
        if shutil.which(tool) is None:
            print(
                f"redis compat: MISSING {tool}: install Debian's redis-server and redis-tools "
                "(apt-get install -y redis-server redis-tools); nothing was tested",
                file=sys.stderr,
            )
            sys.exit(2)
    if not os.access(args.kvnode, os.X_OK):
        fail(f"no kvnode at {args.kvnode} (cargo build -p kvnode)")
    version = subprocess.run(["redis-server", "--version"], capture_output=True, text=True).stdout
    log(f"reference: {version.strip()}")

    work = tempfile.mkdtemp(prefix="raftcask-redis-compat-")
    children = []

    def stop_all():
        procs.stop_processes(child for _, child in children)

    try:
        offsets = [0, 1, 2, 100, 101, 102, 200, 201, 202, 400, 401, 402]
        base = free_port_base(offsets)
        redis_port = free_port_base([0], avoid={base + offset for offset in offsets})
        children.append((
            "redis-server",
            subprocess.Popen(
                [
                    "redis-server", "--bind", HOST, "--port", str(redis_port),
                    "--databases", "1", "--appendonly", "yes", "--appendfsync", "always",
                    "--save", "", "--dir", work, "--daemonize", "no",
                ],
                stdout=open(os.path.join(work, "redis-server.log"), "w"),
                stderr=subprocess.STDOUT,
            ),
        ))
        children.append((
            "kvnode local",
            subprocess.Popen(
                [
                    args.kvnode, "local", "--nodes", "3", "--dir", os.path.join(work, "kv"),
                    "--host", HOST, "--port-base", str(base),
                ],
                stdout=open(os.path.join(work, "local.log"), "w"),
                stderr=subprocess.STDOUT,
            ),
        ))
        wait_for("redis-server answering", lambda: cli(redis_port, "PING").stdout.strip() == b"PONG")
        leader_port = []

        def find_leader():
            for i in range(3):
                port = base + 400 + i
                try:
                    info = cli(port, "INFO", "replication").stdout.decode()
                except subprocess.TimeoutExpired:
                    continue
                if "role:master" in info:
                    leader_port[:] = [port]
                    return True
            return False

        wait_for("a raftcask leader", find_leader)
        log(f"redis-server on {HOST}:{redis_port}; raftcask leader's Redis port {HOST}:{leader_port[0]}")
        sessions = parse_sessions(os.path.join(HERE, "compat-commands.txt"))
        compared, normalised, skipped, differences = compare(sessions, redis_port, leader_port[0])
        for difference in differences:
            print(difference, flush=True)
        log(
            f"{compared} commands in {len(sessions)} sessions compared: {compared - normalised - skipped} "
            f"exactly, {normalised} after a named normalisation, {skipped} not compared "
            f"(INFO, TIME, WAIT); {len(differences)} difference(s)"
        )
        if differences:
            fail(f"{len(differences)} difference(s) from redis-server")
        python_clients(leader_port[0])
        if not args.no_bench:
            benchmark(leader_port[0])
            dbsize = cli(leader_port[0], "DBSIZE").stdout.decode().strip()
            log(f"after the benchmarks the cluster holds {dbsize} keys")
            if not dbsize.startswith("(integer) ") or int(dbsize.split()[1]) == 0:
                fail("the benchmarks left no key")
        log("PASSED")
    finally:
        stop_all()
        if args.keep:
            log(f"work directory kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
