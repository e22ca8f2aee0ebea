"""Per-stream statistics and the per-episode summary of a committed cache.
"""

from __future__ import annotations

import functools
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from robocache._optional import require
from robocache.data.build.config import column_name
from robocache.data.episode import StreamSpec

# Rows per statistics chunk. A [2^17, 24] chunk's largest array (its float64 copy) is 25 MB,
# under glibc's 32 MB ceiling for serving an allocation from the heap, so the memory a thread
# frees after one chunk serves its next instead of being mapped and zeroed anew, as chunks of
# 2^20 rows were: for a 1.8M-row cache of three streams (24, 16 and 7 values) on one thread,
# system time 0.92-1.52 -> 0.10-0.23 s, page faults 0.41-0.51M -> 0.03-0.11M, wall 2.4-3.3
# -> 1.9-2.1 s (benchmarks/results/stats-chunks-cpu-2026-11-27.txt).
STATS_BATCH_ROWS = 1 << 17


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


def _chunk_stats(uri: str, version: int, col: str, dim: int, start: int, rows: int):
    """:func:`robocache.compute_stats` of the unpadded rows of one chunk of a stream (its
    column ``col`` of width ``dim``, ``rows`` rows from ``start`` of the table at ``uri``,
    version ``version``); ``None`` when every row is padded."""
    import torch

    import robocache

    pc = require("pyarrow.compute", "data", "Arrow tables")
    batch = _dataset(uri, version).to_table(columns=[col, f"{col}_is_pad"], offset=start,
                                            limit=rows)
    values = pc.list_flatten(batch.column(0)).to_numpy()
    values = values.astype(np.float32).reshape(-1, dim)  # (writable: Arrow's is not)
    keep = ~batch.column(1).to_numpy(zero_copy_only=False)
    if not keep.any():
        return None
    return robocache.compute_stats(torch.from_numpy(values if keep.all() else values[keep]))


@functools.lru_cache(maxsize=4)
def _dataset(uri: str, version: int):
    """The Lance table at ``uri`` as of ``version``, opened once per process."""
    return require("lance", "data", "The Lance cache", "pylance").dataset(uri, version=version)


def _stats_worker(parent: int) -> None:
    """Start-up of a statistics worker process (see :func:`_compute_stats`)."""
    import torch

    from robocache.data.build.read import lance_threads
    from robocache.data.cameras import die_with_parent

    die_with_parent(parent)
    lance_threads()
    torch.set_num_threads(1)


def _compute_stats(uri: Path, specs: dict[str, StreamSpec], threads: int | None = None, *,
                   processes: bool = False) -> dict[str, dict]:
    """Per-dimension stats of every numeric stream over its non-padded steps (merged over
    chunks of ``STATS_BATCH_ROWS`` rows in the table's order, see
    :func:`robocache.merge_stats`: the chunks do not depend on how the rows were batched into
    fragments). ``threads`` chunks at once, of every stream, widest first (default
    :func:`stats_threads`), merged in order: the same statistics as one chunk after the other.
    On threads, each on one torch thread (torch's operations release the GIL); with
    ``processes``, in worker processes forked from the build's fork server
    (:func:`~robocache._forkserver.worker_context`): a build that used worker processes
    has it running, and the threads of one process held ~17 of 64 cores busy, the GIL between
    their array calls (``benchmarks/results/
    ingest-node-profile-h200x4-2026-11-27-2df6b5c.txt``)."""
    from concurrent.futures import ProcessPoolExecutor

    import robocache
    from robocache._forkserver import worker_context
    from robocache.data.build.align import one_thread

    lance = require("lance", "data", "The Lance cache", "pylance")

    numeric = {name: spec for name, spec in specs.items() if spec.kind == "numeric"}
    if not numeric:
        return {}
    ds = lance.dataset(str(uri))
    starts = range(0, ds.count_rows(), STATS_BATCH_ROWS)
    jobs = sorted(((name, spec.dim, start) for name, spec in numeric.items()
                   for start in starts), key=lambda job: -job[1])
    threads = max(1, min(threads or stats_threads(max(spec.dim for spec in numeric.values())),
                         len(jobs)))
    if processes:
        pool = ProcessPoolExecutor(threads, mp_context=worker_context(),
                                   initializer=_stats_worker, initargs=(os.getpid(),))
    else:
        pool = ThreadPoolExecutor(threads)
    try:
        with one_thread("cpu"), pool:
            futures = {job: pool.submit(_chunk_stats, str(uri), ds.version,
                                        column_name(job[0]), job[1], job[2],
                                        STATS_BATCH_ROWS) for job in jobs}
            stats = {}
            for name, spec in numeric.items():
                parts = [p for p in (futures[name, spec.dim, start].result()
                                     for start in starts) if p is not None]
                if parts:
                    stats[name] = robocache.merge_stats(parts).to_dict()
    finally:
        _dataset.cache_clear()  # (this process's; a worker process's ends with it)
    return stats


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
