"""Per-stream statistics and the per-episode summary of a committed cache: from the rows a
build's writers (worker processes, Ray actors) tallied as they wrote them (:class:`Tally`)
when those are the whole cache, else from a pass over the cache's rows.

A cache's q01/q99 are read off the merged dyadic histogram of its statistics
(``compute_stats(..., exact_quantiles=False)``), never from one exact sort: the histogram's
grid depends only on the whole sample's extremes and its counts merge exactly, so the
quantiles are the same however the rows were split (the chunks of a pass, the workers'
writes, the shards of a distributed build), within one histogram bin of the exact ones.
"""

from __future__ import annotations

import dataclasses
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from robocache._optional import require
from robocache.data.build.config import column_name
from robocache.data.episode import StreamSpec
from robocache.ops.normalize import Stats

# Rows per statistics chunk. Chunks of 2^17 rows, whose arrays glibc serves from the heap
# instead of fresh mappings, cut the tail's system time 5-10x on the development VM and on a
# 64-core node, but the node's wall time grew (6.3 / 5.8 s -> 8.7 / 9.7 s for 60,000 episodes:
# 8x the chunks, each with its Lance read and Arrow calls under the GIL), and chunks in worker
# processes instead of threads were no faster (benchmarks/results/
# stats-tail-h200x4-2026-11-27-7bbef39.txt).
STATS_BATCH_ROWS = 1 << 20


# Bytes a chunk's statistics hold per value at their peak: the values read, their float32
# copy, the kept rows, a transposed copy and each sample's bin (int16); the float64 blocks
# are small (robocache.reference.normalize.STATS_BLOCK).
STATS_BYTES_PER_VALUE = 20


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
    """Per-dimension stats of every numeric stream over its non-padded steps, from a pass over
    the cache's rows in chunks of ``STATS_BATCH_ROWS`` (merged with
    :func:`robocache.merge_stats`, quantiles from the histogram: see the module docstring).
    ``threads`` chunks at once, of every stream (default :func:`stats_threads`), each on one
    torch thread (torch's operations release the GIL), merged in order: the same statistics
    as one chunk after the other."""
    from robocache.data.build.align import one_thread

    lance = require("lance", "data", "The Lance cache", "pylance")
    pc = require("pyarrow.compute", "data", "Arrow tables")

    ds = lance.dataset(str(uri))
    starts = range(0, ds.count_rows(), STATS_BATCH_ROWS)

    def part(col: str, dim: int, start: int):
        batch = ds.to_table(columns=[col, f"{col}_is_pad"], offset=start,
                            limit=STATS_BATCH_ROWS)
        return _stats_of(pc.list_flatten(batch.column(0)).to_numpy(), dim,
                         ~batch.column(1).to_numpy(zero_copy_only=False))

    numeric = {name: spec for name, spec in specs.items() if spec.kind == "numeric"}
    if not numeric:
        return {}
    threads = threads or stats_threads(max(spec.dim for spec in numeric.values()))
    with one_thread("cpu"), ThreadPoolExecutor(threads) as pool:
        futures = {name: [pool.submit(part, column_name(name), spec.dim, start)
                          for start in starts] for name, spec in numeric.items()}
        return _merged({name: [f.result() for f in parts] for name, parts in futures.items()})


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


def _stats_of(values: np.ndarray, dim: int, keep: np.ndarray) -> Stats | None:
    """:func:`robocache.compute_stats` of a stream's values (any shape holding rows of ``dim``)
    at the rows ``keep`` (its steps not padded), in float32, or in float64 for float64 values
    (their min, max and mean exact); None when none is kept."""
    import torch

    import robocache

    if not keep.any():
        return None
    kind = np.float64 if values.dtype == np.float64 else np.float32
    if values.dtype != kind or not values.flags.writeable:  # (Arrow's are read-only)
        values = values.astype(kind)
    values = values.reshape(-1, dim)
    return robocache.compute_stats(torch.from_numpy(values if keep.all() else values[keep]),
                                   exact_quantiles=False)


def _merged(parts: dict[str, list[Stats | None]]) -> dict[str, dict]:
    """``stats.json``: each stream's parts merged in order (None: a part with no kept row)."""
    import robocache

    out = {}
    for name, found in parts.items():
        found = [p for p in found if p is not None]
        if found:
            out[name] = robocache.merge_stats(found).to_dict()
    return out


@dataclasses.dataclass
class Tally:
    """What a build's writers (its worker processes, or ``preprocess``'s Ray actors) wrote,
    write by write (:meth:`of_rows`, where the rows are written; :meth:`add`, once committed):
    each episode's summary (:func:`_episode_summary`'s entry) and each numeric stream's
    statistics of each write, keyed by the write's first episode. When those writes are the
    whole cache (it held no rows when the build began) they stand in for the passes over the
    cache's rows at the end (:meth:`summary`, :meth:`stats`): the same summary, and the same
    statistics up to float64 rounding in mean and std (the parts are not the pass's chunks).
    The writes merge in episode order, whatever order they were committed in."""

    episodes: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    parts: dict[str, list[tuple[int, Stats | None]]] = dataclasses.field(default_factory=dict)

    @classmethod
    def of_rows(cls, rows: list, specs: dict[str, StreamSpec]) -> Tally:
        """The tally of one write of aligned episodes' rows (:class:`~robocache.data.build.
        write.Rows`, one per episode, in order)."""
        episodes = []
        for r in rows:
            if not r.num_rows:
                continue
            ts, task = r.cols["timestamp"], r.cols["task"][0]
            episodes.append({"index": int(r.cols["episode_index"][0]), "rows": r.num_rows,
                             "start_s": float(ts[0]), "duration_s": float(ts[-1] - ts[0]),
                             "task": None if task is None else str(task)})
        parts: dict[str, list[tuple[int, Stats | None]]] = {}
        for name, spec in specs.items():
            if spec.kind == "numeric" and episodes:
                col = column_name(name)
                parts[name] = [(episodes[0]["index"], _stats_of(
                    np.concatenate([r.cols[col] for r in rows]), spec.dim,
                    ~np.concatenate([r.cols[f"{col}_is_pad"] for r in rows])))]
        return cls(episodes, parts)

    def add(self, other: Tally) -> None:
        """Count ``other``'s write."""
        self.episodes += other.episodes
        for name, found in other.parts.items():
            self.parts.setdefault(name, []).extend(found)

    def summary(self) -> list[dict[str, Any]]:
        return sorted(self.episodes, key=lambda e: e["index"])

    def stats(self) -> dict[str, dict]:
        return _merged({name: [p for _, p in sorted(found, key=lambda kp: kp[0])]
                        for name, found in self.parts.items()})
