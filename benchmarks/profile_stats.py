"""Where `robocache.compute_stats` spends its time: each step of its reference on one chunk of
the build's statistics ([1M, 24] float32, one torch thread), then the statistics tail of a
cache (`_compute_stats`) on 1 and on every thread.

    $ python benchmarks/profile_stats.py [--cache path/to/cache]
"""

from __future__ import annotations

import argparse
import json
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
    xd = timed("float64 copy", lambda: xt.to(torch.float64, copy=True))
    timed("mean", xd.mean, 1)
    timed("std", lambda: xd.std(1, correction=0))
    lo, hi = timed("min, max", lambda: (xt.amin(1).double(), xt.amax(1).double()))
    e = ref.fit_exponent(lo, hi, bins)
    origin = ref.grid_index(lo, e)
    flat, counts = timed("histogram (bins and counts)", ref.histogram_rows, xd, e, origin, bins)
    ranks = [r for r in ref.quantile_ranks(n, (0.01, 0.99)) if r not in (0, n - 1)]
    timed("order statistics of the 1 %/99 % ranks", ref.order_statistics, xt, ranks, flat,
          counts)
    timed("compute_stats, whole", robocache.compute_stats, x)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cache", type=Path, help="a cache whose statistics tail to time")
    a = ap.parse_args()
    torch.set_num_threads(1)
    print(f"# [1M, 24] float32, one thread, torch {torch.__version__}")
    steps(torch.randn(1 << 20, 24, generator=torch.Generator().manual_seed(0)))
    if a.cache:
        from robocache.data.build.stats import _compute_stats, stats_threads
        from robocache.data.episode import StreamSpec

        streams = json.loads((a.cache / "manifest.json").read_text())["streams"]
        specs = {k: StreamSpec(k, s["kind"], s["dtype"], tuple(s["shape"]))
                 for k, s in streams.items()}
        dim = max(s.dim for s in specs.values() if s.kind == "numeric")
        for threads in sorted({1, stats_threads(dim)}):
            timed(f"statistics tail, {threads} thread(s)", _compute_stats,
                  a.cache / "data.lance", specs, threads)


if __name__ == "__main__":
    main()
