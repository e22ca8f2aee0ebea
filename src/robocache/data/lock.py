"""One writer per cache: an OS-level lock on a file inside the cache directory.

The lock is ``fcntl.flock`` on ``<cache>/.robocache.lock``: the kernel releases it when the
holding process exits, however it exits (``kill -9`` included), so a lock is never stale. The
file's text names the holder (pid, host, start time) for the message a second writer gets.
Processes that only need the finished cache (e.g. every rank of a ``torchrun`` job opening the
same dataset) let the first build it and :func:`wait_for_writer` until it is done.
"""

from __future__ import annotations

import datetime as _dt
import fcntl
import json
import logging
import math
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from robocache.errors import CacheBusyError

LOCK_NAME = ".robocache.lock"
# A second writer retries this long before giving up (without --wait), so a reader that peeks at
# the lock (``holder``) never makes a writer fail.
GRACE_S = 1.0
POLL_S = 0.05


def describe_holder(info: dict[str, Any] | None) -> str:
    """``"pid 12 on host (since ...)"`` for messages."""
    if not info:
        return "another process"
    return f"pid {info.get('pid')} on {info.get('host')} (since {info.get('since')})"


def _read_info(fd: int) -> dict[str, Any] | None:
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        return json.loads(os.read(fd, 4096).decode() or "null")
    except (OSError, ValueError):
        return None


class CacheLock:
    """Exclusive lock of a cache directory for the duration of a ``with`` block.

    Args:
        dest: the cache directory (must exist).
        wait: block until the running writer finishes instead of failing.

    Raises:
        CacheBusyError: (on entry, ``wait=False``) another process holds the lock; the message
            names it (pid, host, start time).
    """

    def __init__(self, dest: str | Path, wait: bool = False):
        self.path = Path(dest) / LOCK_NAME
        self.wait = wait
        self.fd: int | None = None

    def __enter__(self) -> CacheLock:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        deadline = time.monotonic() + GRACE_S
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if self.wait:
                        fcntl.flock(fd, fcntl.LOCK_EX)
                        break
                    if time.monotonic() > deadline:
                        who = describe_holder(_read_info(fd))
                        raise CacheBusyError(
                            f"{self.path.parent} is being written by {who}; let it finish, or "
                            "pass --wait (wait=True) to run after it") from None
                    time.sleep(POLL_S)
            os.ftruncate(fd, 0)
            os.lseek(fd, 0, os.SEEK_SET)
            since = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
            os.write(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                                     "since": since}).encode())
        except BaseException:
            os.close(fd)
            raise
        self.fd = fd
        return self

    def __exit__(self, *exc) -> bool:
        if self.fd is not None:
            os.ftruncate(self.fd, 0)
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None
        return False


def holder(dest: str | Path) -> dict[str, Any] | None:
    """Who is writing the cache at ``dest`` (``{"pid", "host", "since"}``), ``None`` when no one
    is. Takes no lock a writer would wait on for longer than a system call."""
    path = Path(dest) / LOCK_NAME
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return _read_info(fd) or {}
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)



def wait_for_writer(dest: str | Path, timeout_s: float, *,
                    report: Callable[[dict[str, Any], float], None] | None = None,
                    every_s: float = 10.0, fix: str = "") -> None:
    """Block until no process writes the cache at ``dest`` (returns at once when none does).

    Args:
        dest: the cache directory.
        timeout_s: give up after this many seconds (>= 0).
        report: called with the writer (:func:`holder`) and the seconds waited, when the wait
            starts and every ``every_s`` seconds after (progress for the user).
        fix: the sentence a timeout's message ends with (how to wait longer).

    Raises:
        CacheBusyError: the writer still holds the cache after ``timeout_s``; the message names
            it (pid, host, start time).
    """
    t0 = time.monotonic()
    told = -math.inf
    while (info := holder(dest)) is not None:
        waited = time.monotonic() - t0
        if waited > timeout_s:
            raise CacheBusyError(f"{dest} is still being written by {describe_holder(info)} "
                                 f"after {waited:.0f} s of waiting; {fix or 'wait longer'}.")
        if report is not None and waited - told >= every_s:
            report(info, waited)
            told = waited
        time.sleep(min(0.2, every_s))


def build_once(dest: str | Path, build: Callable[[], Any], ready: Callable[[], bool], *,
               timeout_s: float, fix: str = "") -> None:
    """Run ``build()`` (which locks ``dest``), unless another process is already building
    ``dest``: then wait for it (:func:`wait_for_writer`, its progress logged at INFO every 10 s)
    and use its cache when ``ready()``, else build what it left. Many processes opening one
    dataset at once (the ranks of a ``torchrun`` job) so build it once.

    Raises:
        CacheBusyError: the other process is still writing after ``timeout_s`` seconds in all.
    """
    log = logging.getLogger(__name__)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            build()
            return
        except CacheBusyError:
            wait_for_writer(dest, max(0.0, deadline - time.monotonic()), fix=fix, report=lambda
                            info, waited: log.info("waiting for %s to finish building %s "
                                                   "(%.0f s of at most %.0f s)",
                                                   describe_holder(info), dest, waited,
                                                   timeout_s))
        if ready():
            return
