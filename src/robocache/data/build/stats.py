"""Per-stream statistics and the per-episode summary of a committed cache.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from robocache._optional import require
from robocache.data.build.config import column_name
from robocache.data.episode import StreamSpec

# Rows per statistics chunk. Chunks of 2^17 rows, whose arrays glibc serves from the heap
# instead of fresh mappings, cut the tail's system time 5-10x on the development VM and on a
# 64-core node, but the node's wall time grew (6.3 / 5.8 s -> 8.7 / 9.7 s for 60,000 episodes:
# 8x the chunks, each with its Lance read and Arrow calls under the GIL), and chunks in worker
# processes instead of threads were no faster (benchmarks/results/
# stats-tail-h200x4-2026-11-27-7bbef39.txt).
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


def _compute_stats(uri: Path, specs: dict[str, StreamSpec],
                   threads: int | None = None) -> dict[str, dict]:
    """Per-dimension stats of every numeric stream over its non-padded steps (merged over
    chunks of ``STATS_BATCH_ROWS`` rows in the table's order, see
    :func:`robocache.merge_stats`: the chunks do not depend on how the rows were batched into
    fragments). ``threads`` chunks at once, of every stream (default
    :func:`stats_threads`), each on one torch thread (torch's operations release the GIL),
    merged in order: the same statistics as one chunk after the other."""
    import torch

    import robocache
    from robocache.data.build.align import one_thread

    lance = require("lance", "data", "The Lance cache", "pylance")
    pc = require("pyarrow.compute", "data", "Arrow tables")

    ds = lance.dataset(str(uri))
    starts = range(0, ds.count_rows(), STATS_BATCH_ROWS)

    def part(col: str, dim: int, start: int):
        batch = ds.to_table(columns=[col, f"{col}_is_pad"], offset=start,
                            limit=STATS_BATCH_ROWS)
        values = pc.list_flatten(batch.column(0)).to_numpy()
        values = values.astype(np.float32).reshape(-1, dim)  # (writable: Arrow's is not)
        keep = ~batch.column(1).to_numpy(zero_copy_only=False)
        if not keep.any():
            return None
        return robocache.compute_stats(torch.from_numpy(values if keep.all() else values[keep]))

    numeric = {name: spec for name, spec in specs.items() if spec.kind == "numeric"}
    if not numeric:
        return {}
    threads = threads or stats_threads(max(spec.dim for spec in numeric.values()))
    with one_thread("cpu"), ThreadPoolExecutor(threads) as pool:
        futures = {name: [pool.submit(part, column_name(name), spec.dim, start)
                          for start in starts] for name, spec in numeric.items()}
        stats = {}
        for name, parts in futures.items():
            parts = [p for p in (f.result() for f in parts) if p is not None]
            if parts:
                stats[name] = robocache.merge_stats(parts).to_dict()
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
