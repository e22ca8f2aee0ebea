"""Per-stream statistics and the per-episode summary of a committed cache.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from robocache._optional import require
from robocache.data.build.config import column_name
from robocache.data.episode import StreamSpec

STATS_BATCH_ROWS = 1 << 20


def _chunks(ds, columns: list[str], rows: int):
    """The dataset's ``columns`` as tables of exactly ``rows`` rows (the last one shorter),
    whatever its fragments: statistics merged over them do not depend on how the rows were
    batched into fragments."""
    pa = require("pyarrow", "data", "Arrow tables")

    parts, have = [], 0
    for batch in ds.to_batches(columns=columns, batch_size=rows):
        parts.append(batch)
        have += batch.num_rows
        while have >= rows:
            table = pa.Table.from_batches(parts)
            yield table.slice(0, rows)
            rest = table.slice(rows)
            parts, have = rest.to_batches(), rest.num_rows
    if have:
        yield pa.Table.from_batches(parts)


def _compute_stats(uri: Path, specs: dict[str, StreamSpec]) -> dict[str, dict]:
    """Per-dimension stats of every numeric stream over its non-padded steps (merged over
    chunks of ``STATS_BATCH_ROWS`` rows in the table's order, see
    :func:`robocache.merge_stats`)."""
    import torch

    import robocache

    lance = require("lance", "data", "The Lance cache", "pylance")
    pc = require("pyarrow.compute", "data", "Arrow tables")

    ds = lance.dataset(str(uri))
    stats = {}
    for name, spec in specs.items():
        if spec.kind != "numeric":
            continue
        col = column_name(name)
        parts = []
        for batch in _chunks(ds, [col, f"{col}_is_pad"], STATS_BATCH_ROWS):
            values = pc.list_flatten(batch.column(0)).to_numpy()
            values = values.astype(np.float32).reshape(-1, spec.dim)
            keep = ~batch.column(1).to_numpy(zero_copy_only=False)
            if keep.any():
                parts.append(robocache.compute_stats(torch.from_numpy(values[keep])))
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
