"""One writer per cache: the lock names its holder and ``wait`` queues behind it (that it dies
with its holder: tests/faults/test_faults.py, kill -9 of a writer)."""

from __future__ import annotations

import os
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


def test_second_writer_fails_naming_the_first_or_waits_for_it(tmp_path):
    proc = hold(tmp_path, 3.0)
    try:
        assert holder(tmp_path)["pid"] == proc.pid
        t0 = time.monotonic()
        with pytest.raises(CacheBusyError, match=f"pid {proc.pid} on .*--wait"), \
                CacheLock(tmp_path):
            pass
        with CacheLock(tmp_path, wait=True):  # blocks until the holder is done
            waited = time.monotonic() - t0
            assert holder(tmp_path)["pid"] == os.getpid()
    finally:
        proc.wait()
    assert holder(tmp_path) is None
    assert waited > 1.0  # the 1 s grace without --wait passed, the lock still held
