"""How fast one core of this machine is, beside what one core builds: a calibration, then the
one-core build stages of ``bench preprocess`` (``stage_cpu``), in one process.

    $ taskset -c 1 python benchmarks/probe_core_speed.py            # one core, 3 passes
    $ python benchmarks/probe_core_speed.py --passes 2

The calibration, CPU time: a 3-million-step Python loop (the interpreter), the sum of an 8 MB
float64 array and a copy of it (one core's memory traffic past its own caches). Then the
stages' CPU ms per episode on one 500-episode data file of the benchmark's numeric kind (see
``bench_preprocess.py``; its target: a total of 2 ms or less). The stages' totals of two
machines compare as their calibrations do where the build's code is not what differs.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_preprocess as B  # noqa: E402


def calibration() -> dict[str, float]:
    """CPU ms of the three reference loops (see the module docstring)."""
    t = time.process_time()
    s = 0
    for i in range(3_000_000):
        s += i
    python = time.process_time() - t
    a = np.random.default_rng(0).random(1 << 20)
    b = np.empty_like(a)
    t = time.process_time()
    for _ in range(200):
        a.sum()
    total = time.process_time() - t
    t = time.process_time()
    for _ in range(200):
        np.copyto(b, a)
    copy = time.process_time() - t
    return {"python-loop": python * 1e3, "numpy-sum-8MB": total / 200 * 1e3,
            "copy-8MB": copy / 200 * 1e3}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--passes", type=int, default=3, help="passes over the data file")
    passes = ap.parse_args().passes
    print("calib " + "  ".join(f"{k} {v:.3f} ms" for k, v in calibration().items()),
          flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        root, _ = B.make_dataset(Path(tmp) / "probe", B.PER_FILE)
        for r in range(passes):
            ms = B.stage_cpu(root, Path(tmp) / f"s{r}", list(range(B.PER_FILE)))
            print(" ".join(f"{k} {v:.3f}" for k, v in ms.items()),
                  f"total {sum(ms.values()):.3f}", flush=True)


if __name__ == "__main__":
    main()
