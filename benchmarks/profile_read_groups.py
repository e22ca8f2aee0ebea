"""What splitting a data file over several read groups costs ``robocache preprocess``: CPU
time per episode of the Ray read task (``_read``: read, check, digest, pickle) on one core,
for one 500-episode LeRobot v3.0 data file of ``bench preprocess``'s kind read as groups of
500, 250, 90 and 32 episodes. Each group is read as if by another worker process (the
reader's decoded-file cache emptied first), so each decodes the file again.

    python benchmarks/profile_read_groups.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from preprocess_data import PER_FILE, make_dataset  # noqa: E402


def main() -> None:
    import importlib

    from robocache.data.build.config import CacheConfig

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    pre = importlib.import_module("robocache.distributed.preprocess")
    with tempfile.TemporaryDirectory() as tmp:
        root, _ = make_dataset(Path(tmp) / "src", PER_FILE * (args.repeats + 1))
        config = CacheConfig(rate_hz=50)
        where = {"path": str(root.resolve()), "options": json.dumps(config.source_options),
                 "keys": None}
        src, _ = pre._source(where["path"], where["options"], None)  # the task's own reader

        def per_episode(groups: list[list[int]]) -> float:
            t0 = time.process_time()
            for group in groups:
                src._files.clear()
                pre._read({"indices": np.array([group], dtype=object)}, config=config, **where)
            return (time.process_time() - t0) * 1e3 / sum(map(len, groups))

        per_episode([list(range(PER_FILE))])  # warm: imports, first allocations
        for rep in range(1, args.repeats + 1):
            first = rep * PER_FILE
            for size in (500, 250, 90, 32):
                groups = [list(range(first + i, min(first + PER_FILE, first + i + size)))
                          for i in range(0, PER_FILE, size)]
                print(f"groups of {size:3d}: {per_episode(groups):.2f} ms an episode",
                      flush=True)


if __name__ == "__main__":
    main()
