#!/usr/bin/env python3
"""fsync-modes.py: what one log append and its fdatasync cost on this disk,
by how the file's space was made (node/kvnode/BENCHMARKS.md, "The write
path's cost per operation"). A benchmark, never a timed test.

Writes COUNT records of SIZE random bytes one after another into a fresh
file in DIR, each followed by fdatasync (as the Raft log's writer does per
group of entries), in three modes, alternating, ROUNDS times:
  append     the file grows with every write (what raftlog does today:
             each fdatasync also commits the new size and block allocation
             to the filesystem's journal);
  fallocate  the space is reserved first with posix_fallocate (ext4 marks
             the extents unwritten: the first write to each still changes
             metadata);
  prezeroed  the file is written with zeros and fsynced first, then the
             records overwrite it (fdatasync flushes only data).
Prints a markdown table: wall time and this process's CPU time (user +
system, which includes the kernel's work for the fdatasync) per append.
Removes its files. Bounded: COUNT x ROUNDS x 3 appends.

Usage: deploy/bench/fsync-modes.py DIR [--count N] [--size BYTES] [--rounds R]
"""

import argparse
import os
import resource
import statistics
import time

MODES = ["append", "fallocate", "prezeroed"]
# Room past the records, so the last write is inside the prepared space.
SLACK_BYTES = 1 << 20


def run(directory, mode, count, size):
    path = os.path.join(directory, f"fsync-modes-{mode}.seg")
    if os.path.exists(path):
        os.unlink(path)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        space = count * size + SLACK_BYTES
        if mode == "fallocate":
            os.posix_fallocate(fd, 0, space)
            os.fsync(fd)
        elif mode == "prezeroed":
            zeros = b"\0" * (1 << 20)
            for offset in range(0, space, len(zeros)):
                os.pwrite(fd, zeros, offset)
            os.fsync(fd)
        dir_fd = os.open(directory, os.O_RDONLY)
        os.fsync(dir_fd)
        os.close(dir_fd)
        record = os.urandom(size)
        before = resource.getrusage(resource.RUSAGE_SELF)
        start = time.perf_counter()
        for i in range(count):
            os.pwrite(fd, record, i * size)
            os.fdatasync(fd)
        wall = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_SELF)
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        return 1e6 * wall / count, 1e6 * cpu / count
    finally:
        os.close(fd)
        os.unlink(path)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dir", help="a directory on the disk to measure")
    parser.add_argument("--count", type=int, default=3000, help="appends per mode and round")
    parser.add_argument("--size", type=int, default=8192, help="bytes per append")
    parser.add_argument("--rounds", type=int, default=3, help="rounds (the table shows medians)")
    args = parser.parse_args()
    results = {mode: [] for mode in MODES}
    for _ in range(args.rounds):
        for mode in MODES:
            results[mode].append(run(args.dir, mode, args.count, args.size))
    print(f"{args.count} appends of {args.size} B each, one fdatasync after each, "
          f"{args.rounds} rounds (median; min-max)")
    print()
    print("| mode | wall us/append | CPU us/append | wall / append's |")
    print("| --- | --- | --- | --- |")
    base = statistics.median(w for w, _ in results["append"])
    for mode in MODES:
        walls = [w for w, _ in results[mode]]
        cpus = [c for _, c in results[mode]]
        print(f"| {mode} | {statistics.median(walls):.0f} ({min(walls):.0f}-{max(walls):.0f}) "
              f"| {statistics.median(cpus):.1f} ({min(cpus):.1f}-{max(cpus):.1f}) "
              f"| {statistics.median(walls) / base:.2f} |")


if __name__ == "__main__":
    main()
