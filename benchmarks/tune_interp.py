"""Sweep the interpolation kernel's launch parameters (`robocache.kernels.interp.Tuning`) on
the GPU over the resample benchmark's bf16 shapes and print the best per shape and overall.

    $ python benchmarks/tune_interp.py --json tune.json

The chosen default is recorded in `Tuning` with the measured reason.
"""

from __future__ import annotations

import argparse
import itertools
import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_resample as BR  # noqa: E402

import robocache  # noqa: E402
from robocache.bench import harness as H  # noqa: E402
from robocache.kernels import interp as K  # noqa: E402
from robocache.ops import resample as R  # noqa: E402

SHAPES = [(256, 100, 50, 32, torch.bfloat16), (4096, 500, 250, 64, torch.bfloat16),
          (1024, 1000, 2000, 32, torch.bfloat16)]
# Second sweep (the first, over elements 1024-4096 x warps 2/4 x a window count off/1024 wide
# x fan 64/1024, chose fan 1024 without the count, since removed): 8 warps hold the same tile
# in 64 instead of 80 registers (ptxas), the occupancy limit ncu reported.
GRID = {"elements": (4096, 8192), "num_warps": (4, 8), "fan": (1024,)}


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--json")
    a = p.parse_args()
    inputs = {s: BR.make_inputs(*s, torch.float32, "cuda") for s in SHAPES}
    rows = []
    for values in itertools.product(*GRID.values()):
        tuning = K.Tuning(**dict(zip(GRID, values, strict=True)))
        K.TUNING = tuning
        R._PLANS.clear()
        times = []
        for args in inputs.values():
            t = H.gpu_time(lambda args=args: robocache.resample(*args), rep_ms=60)
            times.append(t.median_ms * 1e3)
        rows.append({"tuning": tuning.__dict__, "us": times})
        print(tuning, " ".join(f"{v:8.2f}" for v in times), flush=True)
    best = min(rows, key=lambda r: math.prod(r["us"]))
    print("best (geometric mean over shapes):", best)
    for i, shape in enumerate(SHAPES):
        print("best for", shape[:4], min(rows, key=lambda r, i=i: r["us"][i]))
    if a.json:
        H.write_json(a.json, {"meta": H.metadata(), "shapes": [s[:4] for s in SHAPES],
                              "rows": rows, "best": best})


if __name__ == "__main__":
    main()
