"""What a build worker process pays before and in its first tasks, by what it has imported:
the CPU seconds of ``_open_worker`` (the worker's start-up: the source opened) and of its
first two tasks (64 episodes each of one 500-episode data file of ``bench preprocess``'s
numeric kind), in fresh interpreters that import ``robocache.data.build.read`` (what the fork
server preloaded before) and, alternately, also the rest of
:data:`robocache._forkserver.PRELOAD` (what a worker forked from the server now starts with).

    $ python benchmarks/profile_worker_start.py --runs 3 > worker-start.txt
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

WORKER = """
import importlib, os, sys, time
from dataclasses import asdict
import robocache.data.build.read as R
from robocache.data.build.config import CacheConfig
for name in sys.argv[2].split(","):
    if name:
        importlib.import_module(name)
t0 = time.process_time()
R._open_worker(sys.argv[1], asdict(CacheConfig(rate_hz=50.0)), os.getppid())
t1 = time.process_time()
R._prepare_chunk(list(range(64)), 50.0, True, None)
t2 = time.process_time()
R._prepare_chunk(list(range(64, 128)), 50.0, True, None)
t3 = time.process_time()
print(f"start {t1 - t0:.3f} s, first task {t2 - t1:.3f} s, second task {t3 - t2:.3f} s")
"""


def main() -> None:
    import bench_preprocess as B

    from robocache._forkserver import PRELOAD, worker_context

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    worker_context()
    extra = ",".join(m for m in PRELOAD if m not in ("__main__", "robocache.data.build.read"))
    with tempfile.TemporaryDirectory() as tmp:
        root, _ = B.make_dataset(Path(tmp) / "probe", B.PER_FILE, camera=False)
        for run in range(args.runs):
            for label, modules in (("read only", ""), ("the whole preload", extra)):
                out = subprocess.run([sys.executable, "-c", WORKER, str(root), modules],
                                     capture_output=True, text=True, check=True)
                print(f"run {run + 1}, {label:>17}: {out.stdout.strip()}")


if __name__ == "__main__":
    main()
