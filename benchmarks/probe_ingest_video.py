"""Kept-video ingest at size, twice in one process: with and without the workers' start-up.

    $ python benchmarks/probe_ingest_video.py h264 --out benchmarks/results/ingest.json

bench video's LeRobot source (4 cameras 480x640, 12 episodes x 100 frames; ``h264`` or
``av1``) repeated 300 times (:func:`bench_video.replicate`: remuxed, 3-4 GB of video) and
ingested with ``--camera-codec video`` twice in this process, the page cache dropped before
each (:func:`bench_video._ingest`). The first build starts the build's worker processes (a
fork server and one process a core, each importing the library); the second reuses them, as
a long ingest amortizes them. Both against the cold read of the same files (one thread a
file). ``--profile DIR`` keeps each build's cProfile.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def main() -> None:
    from bench_video import FULL, _ingest, evict, replicate, source

    from robocache.bench import harness as H

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("codec", choices=("h264", "av1"))
    p.add_argument("--out", required=True, help="JSON file to write")
    p.add_argument("--profile", help="folder for the builds' cProfiles")
    args = p.parse_args()
    out = {"codec": args.codec, "cores": os.cpu_count()}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        t = time.perf_counter()
        big = replicate(source(tmp / "src", FULL, args.codec), tmp / "big", FULL["copies"])
        out["source_s"] = time.perf_counter() - t
        videos = sorted((big / "videos").rglob("*.mp4"))
        out["bytes"] = sum(v.stat().st_size for v in videos)
        evict(big)
        raw_s, raw_n = H.raw_read_s(videos)
        out["raw_MBps"] = raw_n / raw_s / 1e6
        for run in range(2):
            seconds = _ingest(big, tmp / f"cache{run}", "video", profile=args.profile)
            out[f"ingest{run}_s"] = seconds
            out[f"ingest{run}_MBps"] = out["bytes"] / seconds / 1e6
            shutil.rmtree(tmp / f"cache{run}")
    out["vs_raw"] = [out[f"ingest{r}_MBps"] / out["raw_MBps"] for r in range(2)]
    print(json.dumps(out, indent=1))
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
