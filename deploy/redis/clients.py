#!/usr/bin/env python3
"""A Redis client nobody here wrote (PyPI `redis`, redis-py 5) against
raftcask's Redis port: pipelines, RESP3, MULTI/EXEC, and WATCH races
between several clients. Run by deploy/redis/compat.py with a virtual
environment holding redis-py; by hand:

    python3 -m venv target/redis-py && target/redis-py/bin/pip install 'redis>=5,<6'
    target/redis-py/bin/python deploy/redis/clients.py HOST PORT

PORT is the leader's Redis port (writes go there). Exit 0: every check
held; an assertion names the one that did not.
"""

import os
import sys
import threading

import redis

# WATCH race: clients and increments each (the counter must end at the product).
RACE_CLIENTS = 8
RACE_INCREMENTS = 25
# Commands in the plain pipeline.
PIPELINE_COMMANDS = 600


def check(condition, message):
    if not condition:
        raise AssertionError(message)


def main():
    host, port = sys.argv[1], int(sys.argv[2])
    r = redis.Redis(host=host, port=port, decode_responses=True)
    # Every key of this run under one prefix: nothing else is touched.
    k = f"clients-{os.getpid()}:"

    # A pipeline without a transaction: many commands in flight on one
    # connection, answered in order.
    pipe = r.pipeline(transaction=False)
    for i in range(PIPELINE_COMMANDS // 3):
        pipe.set(f"{k}p:{i}", i)
        pipe.incr(f"{k}count")
        pipe.get(f"{k}p:{i}")
    results = pipe.execute()
    for i in range(PIPELINE_COMMANDS // 3):
        check(results[3 * i] is True, f"pipeline SET {i}: {results[3 * i]!r}")
        check(results[3 * i + 1] == i + 1, f"pipeline INCR {i}: {results[3 * i + 1]!r}")
        check(results[3 * i + 2] == str(i), f"pipeline GET {i}: {results[3 * i + 2]!r}")
    scanned = set(r.scan_iter(match=f"{k}p:*", count=50))
    check(len(scanned) == PIPELINE_COMMANDS // 3, f"SCAN found {len(scanned)} keys")

    # RESP3 (redis-py sends HELLO 3 when it connects).
    r3 = redis.Redis(host=host, port=port, protocol=3, decode_responses=True)
    r3.hset(f"{k}h", mapping={"a": "1", "b": "2"})
    check(r3.hgetall(f"{k}h") == {"a": "1", "b": "2"}, "RESP3 HGETALL")
    check(r3.get(f"{k}missing") is None, "RESP3 GET of a missing key")
    check(str(r3.client_info().get("resp")) == "3", f"CLIENT INFO: {r3.client_info()!r}")
    check(r3.incrbyfloat(f"{k}f", 1.5) == 1.5, "RESP3 INCRBYFLOAT")

    # MULTI/EXEC through redis-py's transactional pipeline.
    pipe = r.pipeline(transaction=True)
    pipe.set(f"{k}t", "1").incr(f"{k}t").get(f"{k}t")
    check(pipe.execute() == [True, 2, "2"], "MULTI/EXEC pipeline")

    # A watched key another client changes: EXEC fails (WatchError).
    other = redis.Redis(host=host, port=port, decode_responses=True)
    with r.pipeline() as pipe:
        pipe.watch(f"{k}w")
        other.set(f"{k}w", "theirs")
        pipe.multi()
        pipe.set(f"{k}w", "mine")
        try:
            pipe.execute()
            check(False, "EXEC applied although the watched key changed")
        except redis.WatchError:
            pass
    check(r.get(f"{k}w") == "theirs", "the aborted block wrote nothing")

    # A counter incremented under WATCH by several clients at once ends
    # exactly right (redis-py's transaction() retries on WatchError).
    r.set(f"{k}counter", 0)
    retries = [0]
    lock = threading.Lock()

    def add(pipe):
        value = int(pipe.get(f"{k}counter"))
        pipe.multi()
        pipe.set(f"{k}counter", value + 1)

    def worker():
        client = redis.Redis(host=host, port=port, decode_responses=True)
        for _ in range(RACE_INCREMENTS):
            attempts = [0]

            def counted(pipe):
                attempts[0] += 1
                add(pipe)

            client.transaction(counted, f"{k}counter")
            with lock:
                retries[0] += attempts[0] - 1

    threads = [threading.Thread(target=worker) for _ in range(RACE_CLIENTS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    final = int(r.get(f"{k}counter"))
    check(final == RACE_CLIENTS * RACE_INCREMENTS,
          f"counter {final}, expected {RACE_CLIENTS * RACE_INCREMENTS}")
    print(f"redis-py {redis.__version__}: pipeline of {PIPELINE_COMMANDS}, RESP3, MULTI/EXEC, "
          f"WATCH abort, {RACE_CLIENTS} clients x {RACE_INCREMENTS} WATCH increments = {final} "
          f"({retries[0]} retried transactions): ok")


if __name__ == "__main__":
    main()
