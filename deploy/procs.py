"""Process helpers shared by the differential scripts under deploy/
(deploy/redis/compat.py and bench.py, deploy/etcd/compat.py): stopping
only the processes a script started, by pid, and waiting on a condition
with a deadline."""

import signal
import subprocess
import time

# How long a stopped process gets after SIGTERM before SIGKILL.
STOP_WAIT_S = 20
# Pause between two checks of a condition.
POLL_S = 0.2


def stop_processes(processes):
    """Stops the processes a script started, newest first, each by its
    pid: SIGTERM, then SIGKILL after STOP_WAIT_S."""
    for child in reversed(list(processes)):
        if child.poll() is None:
            child.send_signal(signal.SIGTERM)
            try:
                child.wait(timeout=STOP_WAIT_S)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()


def wait_until(check, deadline_s):
    """Whether `check()` turned true within `deadline_s` seconds."""
    started = time.time()
    while time.time() - started < deadline_s:
        if check():
            return True
        time.sleep(POLL_S)
    return False
