#!/usr/bin/env python3
"""raftcask's Redis port beside redis-server, side by side on this machine
(issue 22's performance section; a benchmark, never a timed test).

Starts one redis-server with `appendonly yes, appendfsync always` (every
write fsynced before its reply, as raftcask's log is on a majority) and a
three-member raftcask (`kvnode local --nodes 3`), then runs redis-benchmark
(50 clients, 256 B values, random keys) for SET and GET at `-P 1` and
`-P 16`, and INCR, HSET, MSET at `-P 16`, against redis-server, raftcask's
leader and a raftcask follower (which forwards writes to the leader),
alternating, ROUNDS times, and prints a markdown table of the median
requests per second with the ratios raftcask / redis-server. Every process it starts is stopped by
its pid.

Usage: deploy/redis/bench.py [--kvnode PATH] [--requests N] [--rounds R]
(build first: cargo build --release -p kvnode; default kvnode:
target/release/kvnode). Needs redis-server and redis-tools.
"""

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compat  # noqa: E402  (the process and port helpers)

# redis-benchmark's concurrent clients and value size (the setup).
CLIENTS = 50
VALUE_BYTES = 256
# Key space of the random keys.
KEYSPACE = 100000
CELLS = [
    ("set", 1), ("get", 1), ("set", 16), ("get", 16),
    ("incr", 16), ("hset", 16), ("mset", 16),
]


def rate(port, test, pipeline, requests):
    result = subprocess.run(
        [
            "redis-benchmark", "-h", compat.HOST, "-p", str(port), "-t", test,
            "-n", str(requests), "-c", str(CLIENTS), "-P", str(pipeline),
            "-d", str(VALUE_BYTES), "-r", str(KEYSPACE), "-q",
        ],
        capture_output=True,
        timeout=900,
    )
    out = result.stdout.decode(errors="replace").replace("\r", "\n")
    for line in out.splitlines():
        if "requests per second" in line:
            return float(line.split(":")[1].split()[0])
    compat.fail(f"redis-benchmark -t {test} -P {pipeline} on port {port}: {out[-2000:]}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kvnode", default=os.path.join(compat.REPO, "target", "release", "kvnode"))
    parser.add_argument("--requests", type=int, default=100000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    for tool in ("redis-server", "redis-benchmark", "redis-cli"):
        if shutil.which(tool) is None:
            print(f"redis bench: MISSING {tool} (apt-get install -y redis-server redis-tools)",
                  file=sys.stderr)
            sys.exit(2)
    work = tempfile.mkdtemp(prefix="raftcask-redis-bench-")
    children = []
    try:
        offsets = [0, 1, 2, 100, 101, 102, 200, 201, 202, 400, 401, 402]
        base = compat.free_port_base(offsets)
        redis_port = compat.free_port_base([0], avoid={base + o for o in offsets})
        children.append(subprocess.Popen(
            [
                "redis-server", "--bind", compat.HOST, "--port", str(redis_port),
                "--appendonly", "yes", "--appendfsync", "always", "--save", "",
                "--dir", work, "--daemonize", "no",
            ],
            stdout=open(os.path.join(work, "redis-server.log"), "w"), stderr=subprocess.STDOUT,
        ))
        children.append(subprocess.Popen(
            [
                args.kvnode, "local", "--nodes", "3", "--dir", os.path.join(work, "kv"),
                "--host", compat.HOST, "--port-base", str(base),
            ],
            stdout=open(os.path.join(work, "local.log"), "w"), stderr=subprocess.STDOUT,
        ))
        compat.wait_for("redis-server", lambda: compat.cli(redis_port, "PING").stdout.strip() == b"PONG")
        leader = []

        def find_leader():
            for i in range(3):
                info = compat.cli(base + 400 + i, "INFO", "replication").stdout.decode()
                if "role:master" in info:
                    leader[:] = [base + 400 + i]
                    return True
            return False

        compat.wait_for("a raftcask leader", find_leader)
        follower = next(base + 400 + i for i in range(3) if base + 400 + i != leader[0])
        version = subprocess.run(["redis-server", "--version"], capture_output=True, text=True)
        print(f"redis-benchmark -c {CLIENTS} -d {VALUE_BYTES} -r {KEYSPACE} -n {args.requests}, "
              f"median of {args.rounds} rounds, systems alternating; "
              f"{version.stdout.split()[2]}, appendfsync always; raftcask {args.kvnode}, 3 members")
        results = {cell: ([], [], []) for cell in CELLS}
        for _ in range(args.rounds):
            for cell in CELLS:
                test, pipeline = cell
                for column, port in enumerate((redis_port, leader[0], follower)):
                    results[cell][column].append(rate(port, test, pipeline, args.requests))
        print()
        print("| command | -P | redis-server (req/s) | raftcask leader (req/s) | leader / redis "
              "| raftcask follower (req/s) | follower / redis |")
        print("| --- | --- | --- | --- | --- | --- | --- |")
        for cell in CELLS:
            test, pipeline = cell
            redis, on_leader, on_follower = (statistics.median(r) for r in results[cell])
            print(f"| {test.upper()} | {pipeline} | {redis:,.0f} | {on_leader:,.0f} | "
                  f"{on_leader / redis:.2f} | {on_follower:,.0f} | {on_follower / redis:.2f} |")
    finally:
        compat.procs.stop_processes(children)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
