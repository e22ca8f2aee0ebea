"""Where `robocache.compute_stats` spends its time: each step of its reference on one chunk of
the build's statistics ([1M, 24] float32, one torch thread), then the statistics tail of a
cache (`_compute_stats`) on 1 and on every thread, for each chunk size of ``--rows``: wall
time, the process's user and system CPU time and its page faults (`getrusage`), the sizes
alternated over ``--repeats`` rounds.

    $ python benchmarks/profile_stats.py [--cache path/to/cache] [--rows 1048576,131072]
"""

from __future__ import annotations

import argparse
import json
import resource
import time
from pathlib import Path

import torch

import robocache
import robocache.reference.normalize as ref


def timed(name: str, fn, *args):
    t0 = time.perf_counter()
    out = fn(*args)
    print(f"{name:34s} {(time.perf_counter() - t0) * 1e3:8.1f} ms")
    return out


def steps(x: torch.Tensor, bins: int = 1024) -> None:
    n = x.shape[0]
    xt = timed("transposed copy", lambda: x.t().contiguous())
    lo, hi = timed("min, max", lambda: (xt.amin(1).double(), xt.amax(1).double()))
    e = ref.fit_exponent(lo, hi, bins)
    origin = ref.grid_index(lo, e)
    _, _, local, counts = timed("mean, std and histogram (blocks)", ref.moments_histogram, xt,
                                e, origin, bins)
    ranks = [r for r in ref.quantile_ranks(n, (0.01, 0.99)) if r not in (0, n - 1)]
    timed("order statistics of the 1 %/99 % ranks", ref.order_statistics, xt, ranks, local,
          counts)
    timed("compute_stats, whole", robocache.compute_stats, x)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cache", type=Path, help="a cache whose statistics tail to time")
    ap.add_argument("--rows", default=None,
                    help="chunk sizes (rows) to time the tail with, e.g. 1048576,131072 "
                         "(default: the library's STATS_BATCH_ROWS)")
    ap.add_argument("--repeats", type=int, default=1, help="rounds over the chunk sizes")
    ap.add_argument("--threads", default="1,all",
                    help="thread counts for the tail: numbers and 'all' (the build's own count, "
                         "stats_threads)")
    a = ap.parse_args()
    torch.set_num_threads(1)
    print(f"# [1M, 24] float32, one thread, torch {torch.__version__}")
    steps(torch.randn(1 << 20, 24, generator=torch.Generator().manual_seed(0)))
    if a.cache:
        tail(a.cache, a.rows, a.repeats, a.threads)


def _usage() -> tuple[float, float, float]:
    """User and system seconds and minor page faults of this process."""
    me = resource.getrusage(resource.RUSAGE_SELF)
    return me.ru_utime, me.ru_stime, me.ru_minflt


def tail(cache: Path, rows: str | None, repeats: int, threads: str = "1,all") -> None:
    """The statistics tail of ``cache`` with each chunk size and each of ``threads``."""
    from robocache.data.build import stats as S
    from robocache.data.episode import StreamSpec

    streams = json.loads((cache / "manifest.json").read_text())["streams"]
    specs = {k: StreamSpec(k, s["kind"], s["dtype"], tuple(s["shape"]))
             for k, s in streams.items()}
    dim = max(s.dim for s in specs.values() if s.kind == "numeric")
    sizes = [int(r) for r in rows.split(",")] if rows else [S.STATS_BATCH_ROWS]
    kept = S.STATS_BATCH_ROWS
    print(f"# statistics tail of {cache}: chunk rows, threads, wall, user and system CPU time "
          "and page faults of this process")
    try:
        for _ in range(repeats):
            for size in sizes:
                S.STATS_BATCH_ROWS = size
                counts = {S.stats_threads(dim) if t == "all" else int(t)
                          for t in threads.split(",")}
                for n in sorted(counts):
                    r0, t0 = _usage(), time.perf_counter()
                    S._compute_stats(cache / "data.lance", specs, n)
                    wall, r1 = time.perf_counter() - t0, _usage()
                    user, sys, faults = (b - a for a, b in zip(r0, r1, strict=True))
                    print(f"rows {size:>8d}  threads {n:>3d}  wall {wall:7.3f} s  user "
                          f"{user:7.3f} s  sys {sys:7.3f} s  faults {faults:>9.0f}",
                          flush=True)
    finally:
        S.STATS_BATCH_ROWS = kept


if __name__ == "__main__":
    main()
