"""One writer per cache: the lock names its holder, dies with it, and ``wait`` queues behind it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from robocache.data.lock import CacheLock, holder
from robocache.errors import CacheBusyError

HOLD = """
import sys, time
from robocache.data.lock import CacheLock
with CacheLock(sys.argv[1]):
    print("locked", flush=True)
    time.sleep(float(sys.argv[2]))
"""


def hold(path, seconds: float) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(path), str(seconds)],
                            stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdout.readline().strip() == "locked"
    return proc


def test_second_writer_fails_naming_the_first_and_kill_frees_the_lock(tmp_path):
    proc = hold(tmp_path, 60)
    try:
        assert holder(tmp_path)["pid"] == proc.pid
        with pytest.raises(CacheBusyError, match=f"pid {proc.pid} on .*--wait"), \
                CacheLock(tmp_path):
            pass
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert holder(tmp_path) is None  # the kernel released it: never a stale lock
    with CacheLock(tmp_path):
        assert holder(tmp_path)["pid"] == os.getpid()


def test_wait_runs_after_the_holder(tmp_path):
    proc = hold(tmp_path, 1.5)
    t0 = time.monotonic()
    with CacheLock(tmp_path, wait=True):  # 1.5 s > the 1 s a writer retries without waiting
        waited = time.monotonic() - t0
        assert holder(tmp_path)["pid"] == os.getpid()
    proc.wait()
    assert 1.0 < waited < 30
