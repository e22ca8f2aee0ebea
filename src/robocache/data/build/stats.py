"""Per-stream statistics and the per-episode summary of a committed cache.
"""

from __future__ import annotations

import hashlib
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from robocache._optional import require
from robocache.data.build.config import column_name
from robocache.data.episode import StreamSpec

STATS_BATCH_ROWS = 1 << 20


# Bytes a chunk's statistics hold per value at their peak: the values read and kept, a
# transposed copy, a float64 copy, the int64 bins and a mask (benchmarks/results/
# stats-profile-cpu-2026-11-27.txt).
STATS_BYTES_PER_VALUE = 32


def stats_threads(dim: int) -> int:
    """Chunks whose statistics are computed at once: the cores, as far as the available
    memory holds a ``[STATS_BATCH_ROWS, dim]`` chunk each twice over."""
    from robocache._env import usable_cores

    cores = usable_cores()
    try:
        free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # no sysconf: as many as the cores
        return cores
    return max(1, min(cores, free // (2 * STATS_BATCH_ROWS * dim * STATS_BYTES_PER_VALUE)))


def _chunk_stats(values, pad, dim: int):
    """:func:`robocache.compute_stats` of one chunk's unpadded rows (``values``: the stream's
    list column, ``pad``: its ``_is_pad`` column); ``None`` when every row is padded."""
    import torch

    import robocache

    pc = require("pyarrow.compute", "data", "Arrow tables")
    values = pc.list_flatten(values).to_numpy()
    values = values.astype(np.float32).reshape(-1, dim)  # (writable: Arrow's is not)
    keep = ~pad.to_numpy(zero_copy_only=False)
    if not keep.any():
        return None
    return robocache.compute_stats(torch.from_numpy(values if keep.all() else values[keep]))


def _rows_key(table) -> str:
    """What identifies a chunk's rows: a digest of its ``episode_index`` and ``timestamp``
    columns (a cached step is its episode and time)."""
    h = hashlib.blake2b(digest_size=16)
    for col in ("episode_index", "timestamp"):
        h.update(np.ascontiguousarray(table.column(col).to_numpy()).tobytes())
    return h.hexdigest()


def _numeric(specs: dict[str, StreamSpec]) -> dict[str, StreamSpec]:
    return {name: spec for name, spec in specs.items() if spec.kind == "numeric"}


def _compute_stats(uri: Path, specs: dict[str, StreamSpec], threads: int | None = None,
                   known: dict[int, tuple[str, dict[str, Any]]] | None = None
                   ) -> dict[str, dict]:
    """Per-dimension stats of every numeric stream over its non-padded steps (merged over
    chunks of ``STATS_BATCH_ROWS`` rows in the table's order, see
    :func:`robocache.merge_stats`: the chunks do not depend on how the rows were batched into
    fragments). ``threads`` chunks at once, of every stream (default
    :func:`stats_threads`), each on one torch thread (torch's operations release the GIL),
    merged in order: the same statistics as one chunk after the other. ``known``: chunks
    already computed (start row -> their rows' :func:`_rows_key` and stream -> a future of
    its statistics, see :class:`ChunkStats`), used where the table holds the same rows there."""
    import robocache
    from robocache.data.build.align import one_thread

    lance = require("lance", "data", "The Lance cache", "pylance")

    numeric = _numeric(specs)
    if not numeric:
        return {}
    ds = lance.dataset(str(uri))
    starts = range(0, ds.count_rows(), STATS_BATCH_ROWS)
    known = known or {}

    def part(col: str, dim: int, start: int):
        batch = ds.to_table(columns=[col, f"{col}_is_pad"], offset=start,
                            limit=STATS_BATCH_ROWS)
        return _chunk_stats(batch.column(0), batch.column(1), dim)

    def same(start: int) -> bool:
        rows = ds.to_table(columns=["episode_index", "timestamp"], offset=start,
                           limit=STATS_BATCH_ROWS)
        return rows.num_rows == STATS_BATCH_ROWS and _rows_key(rows) == known[start][0]

    threads = threads or stats_threads(max(spec.dim for spec in numeric.values()))
    with one_thread("cpu"), ThreadPoolExecutor(threads) as pool:
        checks = {start: pool.submit(same, start) for start in starts if start in known}
        reuse = {start for start, check in checks.items() if check.result()}
        futures = {name: [known[start][1][name] if start in reuse else
                          pool.submit(part, column_name(name), spec.dim, start)
                          for start in starts] for name, spec in numeric.items()}
        stats = {}
        for name, parts in futures.items():
            parts = [p for p in (f.result() for f in parts) if p is not None]
            if parts:
                stats[name] = robocache.merge_stats(parts).to_dict()
    return stats


class ChunkStats:
    """:func:`_compute_stats` of a cache, its chunks computed while the build that writes it
    still commits: the main process of a build whose worker processes read, align and write
    the episodes only waits and commits, and the statistics were a serial tail after the
    workers (5-6 s of a 19.5 s build on 64 cores, ``benchmarks/results/
    ingest-node-profile-h200x4-2026-11-27-588efa4.txt``).

    After each commit (:meth:`committed`), every chunk the table now holds whole is read on
    the committing thread (never beside a compaction or a removal of old versions) and its
    statistics computed on a pool of :func:`stats_threads` threads, with at most that many
    chunks read and not yet computed. :meth:`result` then computes what is left (the last
    chunk, chunks whose rows moved) and merges in order: the same statistics as
    :func:`_compute_stats` of the finished table, a chunk reused only where the table still
    holds the same rows at its place (:func:`_rows_key`). Torch's intra-op threads are one
    while it lives (:meth:`close`): the build's main process runs no other torch work then.
    """

    def __init__(self, uri: Path, specs: dict[str, StreamSpec]):
        import torch

        self.uri, self.specs, self.numeric = uri, specs, _numeric(specs)
        self.threads = stats_threads(max((s.dim for s in self.numeric.values()), default=1))
        self.pool = ThreadPoolExecutor(self.threads) if self.numeric else None
        self.known: dict[int, tuple[str, dict[str, Any]]] = {}
        self.next = 0  # the first row of the next chunk to read
        self._torch_threads = torch.get_num_threads()
        torch.set_num_threads(1)

    def committed(self) -> None:
        """Read and start every chunk the committed table holds whole and not started yet."""
        if self.pool is None:
            return
        lance = require("lance", "data", "The Lance cache", "pylance")

        ds = lance.dataset(str(self.uri))
        rows = ds.count_rows()
        cols = [c for name in self.numeric for c in (column_name(name),
                                                     f"{column_name(name)}_is_pad")]
        while self.next + STATS_BATCH_ROWS <= rows:
            table = ds.to_table(columns=["episode_index", "timestamp", *cols],
                                offset=self.next, limit=STATS_BATCH_ROWS)
            self.known[self.next] = (_rows_key(table), {
                name: self.pool.submit(_chunk_stats, table.column(column_name(name)),
                                       table.column(f"{column_name(name)}_is_pad"), spec.dim)
                for name, spec in self.numeric.items()})
            self.next += STATS_BATCH_ROWS
            busy = [f for _, fs in self.known.values() for f in fs.values() if not f.done()]
            if len(busy) > self.threads * len(self.numeric):  # bound the chunks held
                busy[0].result()

    def result(self) -> dict[str, dict]:
        """The statistics of the finished table (see the class docstring)."""
        try:
            return _compute_stats(self.uri, self.specs, self.threads, self.known)
        finally:
            self.close()

    def close(self) -> None:
        """Stop the pool (chunks not started are dropped) and restore torch's threads."""
        import torch

        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)
            self.pool = None
        torch.set_num_threads(self._torch_threads)


def _episode_summary(uri: Path) -> list[dict[str, Any]]:
    """Each cached episode's rows, start, duration and task, in episode order. The rows are
    read in the table's order, which a build keeps (episodes committed in order, steps in
    time order): checked in one pass, and sorted only where it does not hold (a resumed or
    merged cache); the task is read for each episode's first row only (a string per row
    of a large cache was most of this pass)."""
    lance = require("lance", "data", "The Lance cache", "pylance")

    ds = lance.dataset(str(uri))
    table = ds.to_table(columns=["episode_index", "timestamp"])
    ep = table.column("episode_index").to_numpy()
    ts = table.column("timestamp").to_numpy()
    same = ep[1:] == ep[:-1]
    order = None
    if not ((ep[1:] >= ep[:-1]).all() and (ts[1:][same] >= ts[:-1][same]).all()):
        order = np.lexsort((ts, ep))
        ep, ts = ep[order], ts[order]
        same = ep[1:] == ep[:-1]
    starts = np.flatnonzero(np.r_[True, ~same])
    ends = np.r_[starts[1:], len(ep)]
    first = starts if order is None else order[starts]
    tasks = ds.take(first.tolist(), columns=["task"]).column("task").to_pylist() \
        if len(first) else []
    return [{"index": int(ep[a]), "rows": int(b - a), "start_s": float(ts[a]),
             "duration_s": float(ts[b - 1] - ts[a]), "task": task}
            for a, b, task in zip(starts, ends, tasks, strict=True)]
