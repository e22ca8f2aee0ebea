"""A build worker's CPU time and page faults per data file, for two versions of the source
tree: a fresh worker process (``_open_worker``, as the build starts one) prepares two
500-episode data files of ``bench preprocess``'s numeric kind, one task each (read, check,
align, tables; no write), with ``getrusage`` around each task. The versions alternate,
``--runs`` processes each.

    $ git worktree add /tmp/before <commit>
    $ python benchmarks/profile_worker_files.py --a /tmp/before/src --b src --runs 6
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

WORKER = """
import json, os, resource, sys
from dataclasses import asdict
import robocache.data.build.read as R
from robocache.data.build.config import CacheConfig
R._open_worker(sys.argv[1], asdict(CacheConfig(rate_hz=50.0)), os.getppid())
out = []
for part in (range(0, 500), range(500, 1000)):
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    R._prepare_chunk(list(part), 50.0, True, None)
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    out.append([r1.ru_utime - r0.ru_utime, r1.ru_stime - r0.ru_stime, r1.ru_minflt - r0.ru_minflt])
print(json.dumps(out))
"""


def main() -> None:
    import bench_preprocess as B

    from robocache._forkserver import worker_context

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--a", required=True, help="the first version's src folder")
    ap.add_argument("--b", required=True, help="the second version's src folder")
    ap.add_argument("--runs", type=int, default=6)
    args = ap.parse_args()
    worker_context()
    with tempfile.TemporaryDirectory() as tmp:
        root, _ = B.make_dataset(Path(tmp) / "probe", 2 * B.PER_FILE, camera=False)
        res: dict[str, list] = {"a": [], "b": []}
        for _ in range(args.runs):
            for name in res:
                env = {**os.environ, "PYTHONPATH": str(Path(getattr(args, name)).resolve())}
                out = subprocess.run([sys.executable, "-c", WORKER, str(root)], env=env,
                                     capture_output=True, text=True, check=True)
                res[name].append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(f"# a: {args.a}, b: {args.b}; {args.runs} processes each, alternating; medians")
    for name, runs in res.items():
        for k in range(2):
            user = [r[k][0] * 1e3 for r in runs]
            system = [r[k][1] * 1e3 for r in runs]
            total = statistics.median(u + s for u, s in zip(user, system, strict=True))
            print(f"{name} file {k + 1}: user {statistics.median(user):.0f} ms, system "
                  f"{statistics.median(system):.0f} ms, minor faults "
                  f"{statistics.median(r[k][2] for r in runs):.0f}; {total / 500:.3f} ms an "
                  "episode")


if __name__ == "__main__":
    main()
