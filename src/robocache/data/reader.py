"""Lance calls of a process forked after Lance ran in it: made by a reader process instead.

Lance's runtime does not survive a fork. A child forked from a process that has made Lance
calls can hang or crash in its own (measured on the 2-core machine, DataLoader ``fork`` workers
reading camera frames after the parent had read some: one worker blocked forever in
``_take_rows``; another aborted in it, ``tcache_thread_shutdown(): unaligned tcache chunk
detected``, within 8 epochs of 4 workers). Such a child (:data:`robocache.data.location.LANCE`
knows: it records whether the process made Lance calls before a fork) makes its serving calls
through a reader process it starts itself with ``subprocess`` (a fresh interpreter, never a
fork, importing neither torch nor the caller's modules): frame reads (:meth:`Reader.take`) and
the opening of a served index (:meth:`Reader.open_served`). Requests and frames cross a pipe.
``spawn`` and ``forkserver`` children, and children of processes that never called Lance, call
Lance themselves.

The reader exits when its parent does (its input pipe closes).
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import threading
from typing import Any

import numpy as np

_LEN = struct.Struct("<Q")


def _send(stream, header: dict[str, Any], payload: bytes | memoryview = b"") -> None:
    data = json.dumps(header).encode()
    stream.write(_LEN.pack(len(data)) + data + _LEN.pack(len(payload)))
    stream.write(payload)
    stream.flush()


def _exact(stream, n: int) -> bytes:
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = stream.readinto(view[got:])
        if not k:
            raise EOFError("the other end closed the pipe")
        got += k
    return bytes(buf)


def _receive(stream) -> tuple[dict[str, Any], bytes]:
    header = json.loads(_exact(stream, _LEN.unpack(_exact(stream, 8))[0]))
    return header, _exact(stream, _LEN.unpack(_exact(stream, 8))[0])


class Reader:
    """This process's reader process, started on first use (once per process: a forked
    child starts its own); calls from several threads take turns."""

    def __init__(self):
        self.proc: subprocess.Popen | None = None
        self.pid = -1
        self.lock = threading.Lock()

    def _started(self) -> subprocess.Popen:
        if self.pid != os.getpid() or self.proc is None or self.proc.poll() is not None:
            self.lock = threading.Lock()  # a lock inherited through a fork may be held
            env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
            self.proc = subprocess.Popen(
                [sys.executable, "-c", "from robocache.data.reader import _serve; _serve()"],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
            self.pid = os.getpid()
        return self.proc

    def call(self, op: str, header: dict[str, Any], payload: bytes = b""
             ) -> tuple[dict[str, Any], bytes]:
        """Run ``op`` in the reader; its answer, or its error raised here (same type)."""
        from robocache.errors import DataError

        proc = self._started()
        with self.lock:
            try:
                _send(proc.stdin, {**header, "op": op}, payload)
                answer, data = _receive(proc.stdout)
            except (OSError, EOFError) as e:
                proc.kill()
                raise DataError(f"the Lance reader process of this forked process exited "
                                f"({e}); the next read starts a new one.") from e
        if not answer.get("ok"):
            kind = {"FileNotFoundError": FileNotFoundError, "DataError": DataError,
                    "ValueError": ValueError}.get(answer["type"], OSError)
            raise kind(answer["message"])
        return answer, data

    def take(self, location, rel: str, version: int, addresses: np.ndarray
             ) -> tuple[np.ndarray, bytes]:
        """Column ``encoded`` of the rows at ``addresses`` (uint64) of table ``rel`` at
        ``version``: ``(offsets int64 [n + 1], values)``."""
        answer, data = self.call("take", {"where": location.uri, "options": location.options,
                                          "rel": rel, "version": version,
                                          "n": len(addresses)},
                                 np.ascontiguousarray(addresses, np.uint64).tobytes())
        cut = 8 * (answer["n"] + 1)
        return np.frombuffer(data[:cut], np.int64), data[cut:]

    def open_served(self, location, manifest: dict[str, Any], columns, episodes,
                    ranges=None) -> str:
        """:func:`robocache.data.served.open_served` in the reader: the folder's path."""
        answer, _ = self.call("open_served", {
            "where": location.uri, "options": location.options, "manifest": manifest,
            "columns": [[c.key, c.values, c.pad, c.camera] for c in columns],
            "episodes": None if episodes is None else [int(e) for e in episodes],
            "ranges": None if ranges is None else [[int(e), [list(r) for r in rs]]
                                                   for e, rs in ranges.items()]})
        return answer["path"]


#: The reader of this process (used only in a process forked after Lance ran).
READER = Reader()


def _serve() -> None:
    """The reader process: answer requests on stdin until it closes."""
    inp, out = sys.stdin.buffer, os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # anything printed goes to stderr, never into the answers
    with out:
        _answer(inp, out)


def _answer(inp, out) -> None:
    """Answer the requests on ``inp`` until it closes (see :func:`_serve`)."""
    import pyarrow as pa

    from robocache.data.location import Location, open_version
    from robocache.data.served import Column, open_served

    tables: dict[tuple, Any] = {}
    while True:
        try:
            header, payload = _receive(inp)
        except EOFError:
            return
        try:
            location = Location(header["where"], header["options"])
            if header["op"] == "take":
                key = (header["where"], header["rel"], header["version"])
                if key not in tables:
                    tables[key] = open_version(location, header["rel"], header["version"])
                addresses = np.frombuffer(payload, np.uint64)
                col = tables[key]._take_rows(pa.array(addresses), columns=["encoded"],
                                             ignore_deletions=True).column(0)
                col = col.combine_chunks().cast(pa.large_binary())
                offsets = np.frombuffer(col.buffers()[1], np.int64)[
                    col.offset:col.offset + len(col) + 1]
                values = col.buffers()[2]
                body = memoryview(values)[offsets[0]:offsets[-1]] if values is not None \
                    else b""
                _send(out, {"ok": True, "n": len(col)},
                      (offsets - offsets[0]).tobytes() + bytes(body))
            elif header["op"] == "open_served":
                ranges = header.get("ranges")
                served = open_served(location, header["manifest"],
                                     [Column(*c) for c in header["columns"]],
                                     header["episodes"],
                                     None if ranges is None else dict(ranges))
                _send(out, {"ok": True, "path": str(served.path)})
            else:
                raise ValueError(f"unknown request {header['op']!r}")
        except Exception as e:  # answered, never fatal: the caller raises it
            _send(out, {"ok": False, "type": type(e).__name__, "message": str(e)})

