"""How far the camera path's work scales over a node's cores by itself, without the ingest
around it: N independent forked processes, started together, each decoding and encoding
``--tasks`` streams of ``bench cameras``' 480x640 H.264 clip (the worker task of the CPU path:
PyAV on one thread, JPEG 4:4:4 q95), and, for the cores' own limit, each running a fixed
NumPy loop on a cache-resident array. Against one process: the scaling efficiency the
hardware leaves to the ingest (clock, shared caches, memory). Then, in the same run, the
ingest's own camera path (``bench cameras``' ``prepare``: threads that read episodes, worker
processes that decode and encode, 4 episodes of two cameras per worker) with the cores its
main process used (CPU seconds over wall seconds), to tell orchestration from hardware.

    python benchmarks/probe_camera_scaling.py --out /tmp/probe.json [--counts 1,4,16,64]

Prints a table (processes; frames/s per process and efficiency of the independent processes,
of the loop, and of ``prepare``, with its main process's cores) and writes it as JSON.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))


def _camera(task: tuple, tasks: int) -> int:
    from robocache.data.cameras import _pyav_stream

    return sum(len(_pyav_stream(*task, threads=1)[0]) for _ in range(tasks))


def _loop(seconds: float) -> int:
    a = np.random.default_rng(0).random(4096)  # 32 KB: in every core's own cache
    n, end = 0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        for _ in range(100):
            np.sqrt(a, out=a)
            a += 1.0
        n += 100
    return n


def _child(barrier, queue, fn, args) -> None:
    barrier.wait()
    t0 = time.perf_counter()
    work = fn(*args)
    queue.put((work, time.perf_counter() - t0))


def _run(n: int, fn, args) -> float:
    """Work per second per process, the mean of ``n`` processes run at once."""
    ctx = mp.get_context("fork")
    barrier, queue = ctx.Barrier(n), ctx.Queue()
    procs = [ctx.Process(target=_child, args=(barrier, queue, fn, args)) for _ in range(n)]
    for p in procs:
        p.start()
    got = [queue.get() for _ in procs]
    for p in procs:
        p.join()
    return float(np.mean([w / s for w, s in got]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--counts", default=None, help="process counts (default 1, 4, 16, cores)")
    ap.add_argument("--tasks", type=int, default=6, help="streams each process decodes")
    args = ap.parse_args()
    from bench_cameras import CAMS, FPS, make_clips, prepare

    from robocache.data.cameras import FrameFormat

    cores = len(os.sched_getaffinity(0))
    counts = [int(c) for c in args.counts.split(",")] if args.counts else \
        sorted({1, 4, 16, cores})
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        root = make_clips(Path(tmp) / "h264", 4 * max(counts), 120, (480, 640), "h264")
        clip = next(root.rglob(f"{CAMS[0]}/**/*.mp4"))
        task = (clip, 0.0, 119 / FPS, 1e-4, FrameFormat(), None, (480, 640, 3), "probe")
        _camera(task, 1)  # warm: the codecs' first use, the page cache
        for n in counts:
            cam = _run(n, _camera, (task, args.tasks))
            loop = _run(n, _loop, (3.0,))
            main0 = time.process_time()
            frames, seconds, _ = prepare(root, list(range(4 * n)), n)
            rows.append({"processes": n, "frames_per_s_per_process": cam, "loop_per_s": loop,
                         "prepare_frames_per_s_per_worker": frames / seconds / n,
                         "prepare_main_cores": (time.process_time() - main0) / seconds})
    for r in rows:
        r["camera_efficiency"] = r["frames_per_s_per_process"] / rows[0]["frames_per_s_per_process"]
        r["loop_efficiency"] = r["loop_per_s"] / rows[0]["loop_per_s"]
        r["prepare_efficiency"] = r["prepare_frames_per_s_per_worker"] / \
            rows[0]["prepare_frames_per_s_per_worker"]
    rec = {"cores": cores, "commit": os.environ.get("ROBOCACHE_COMMIT"),
           "date": time.strftime("%Y-%m-%d"), "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rec, indent=1))
    print(f"{'processes':>9} {'frames/s each':>14} {'eff':>5} {'loop/s each':>12} {'eff':>5} "
          f"{'prepare/s each':>15} {'eff':>5} {'main cores':>10}")
    for r in rows:
        print(f"{r['processes']:9d} {r['frames_per_s_per_process']:14.1f} "
              f"{100 * r['camera_efficiency']:4.0f}% {r['loop_per_s']:12.0f} "
              f"{100 * r['loop_efficiency']:4.0f}% {r['prepare_frames_per_s_per_worker']:15.1f} "
              f"{100 * r['prepare_efficiency']:4.0f}% {r['prepare_main_cores']:10.2f}")


if __name__ == "__main__":
    main()
