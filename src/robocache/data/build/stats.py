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

STATS_BATCH_ROWS = 1 << 20


# Chunks whose statistics are computed at once (threads: torch's operations release the GIL),
# each holding its [STATS_BATCH_ROWS, D] values about four times over.
STATS_THREADS = 8


def _compute_stats(uri: Path, specs: dict[str, StreamSpec],
                   threads: int | None = None) -> dict[str, dict]:
    """Per-dimension stats of every numeric stream over its non-padded steps (merged over
    chunks of ``STATS_BATCH_ROWS`` rows in the table's order, see
    :func:`robocache.merge_stats`: the chunks do not depend on how the rows were batched into
    fragments). ``threads`` chunks at once (default: the cores, at most
    :data:`STATS_THREADS`), each on one torch thread, merged in order: the same statistics as
    one chunk after the other."""
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
        values = values.astype(np.float32).reshape(-1, dim)
        keep = ~batch.column(1).to_numpy(zero_copy_only=False)
        return robocache.compute_stats(torch.from_numpy(values[keep])) if keep.any() else None

    threads = threads or min(os.cpu_count() or 1, STATS_THREADS)
    stats = {}
    with one_thread("cpu"), ThreadPoolExecutor(threads) as pool:
        for name, spec in specs.items():
            if spec.kind != "numeric":
                continue
            parts = [f.result() for f in [pool.submit(part, column_name(name), spec.dim, start)
                                          for start in starts]]
            parts = [p for p in parts if p is not None]
            if parts:
                stats[name] = robocache.merge_stats(parts).to_dict()
    return stats


def _episode_summary(uri: Path) -> list[dict[str, Any]]:
    lance = require("lance", "data", "The Lance cache", "pylance")

    table = lance.dataset(str(uri)).to_table(columns=["episode_index", "timestamp", "task"])
    ep = table.column("episode_index").to_numpy()
    ts = table.column("timestamp").to_numpy()
    order = np.lexsort((ts, ep))
    ep, ts = ep[order], ts[order]
    starts = np.flatnonzero(np.r_[True, ep[1:] != ep[:-1]])
    ends = np.r_[starts[1:], len(ep)]
    tasks = table.column("task").take(order[starts]).to_pylist()  # one per episode
    return [{"index": int(ep[a]), "rows": int(b - a), "start_s": float(ts[a]),
             "duration_s": float(ts[b - 1] - ts[a]), "task": task}
            for a, b, task in zip(starts, ends, tasks, strict=True)]
