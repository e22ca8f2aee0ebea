"""Where the node's camera path spends its CPU: the 480x640 H.264 clips of ``bench cameras``
prepared as a large ingest prepares them (``bench_cameras.prepare`` with ``lanes``) with each
``--decoders`` setting, and, from ``/proc``, the CPU seconds of each part over the run: this
process (the reading threads, the results), the GPU lanes (one process per GPU: NVDEC, nvJPEG)
and the CPU worker processes (PyAV, libjpeg-turbo); with ``--py-spy``, py-spy's native samples
of the first lane (its busiest frames).

    $ python benchmarks/profile_camera_lanes.py --decoders nvdec,auto --py-spy --out /tmp/lanes

Needs a CUDA GPU, PyNvVideoCodec and PyAV (py-spy on ``PATH`` for ``--py-spy``). Writes
``lanes.json`` and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))


def _groups(me: int) -> dict[str, list[int]]:
    """This process's descendants by part: ``lanes`` (the fork server's children),
    ``workers`` (this process's other children, the resource tracker aside: it uses none)."""
    from multiprocessing import forkserver

    from profile_ingest_node import _tree

    tree = _tree(me)
    server = getattr(forkserver._forkserver, "_forkserver_pid", None)
    return {"main": [me], "lanes": [p for p, parent in tree.items() if parent == server],
            "workers": [p for p, parent in tree.items() if parent == me and p != server]}


def _watch(stop: threading.Event, seen: dict[int, tuple[float, float]],
           groups: dict[str, set[int]]) -> None:
    """Every 0.2 s until ``stop``: each process's CPU seconds so far, and its part."""
    from profile_ingest_node import _cpu_s

    while not stop.is_set():
        for part, pids in _groups(os.getpid()).items():
            for p in pids:
                c = _cpu_s(p)
                if c is not None:
                    seen[p] = c
                    groups.setdefault(part, set()).add(p)
        stop.wait(0.2)


# seconds after the lanes start before py-spy samples one (the first encode imports torchvision)
SPY_DELAY_S = 12.0


def run(decoder: str, root: Path, rounds: int, spy: Path | None, lane_cores: int) -> dict:
    import bench_cameras as B
    from profile_ingest_node import _cpu_s, _spy, top_frames

    from robocache.data import cameras
    from robocache.data.formats import open_source

    cameras.LANE_CORES = lane_cores
    name = f"{decoder}-{lane_cores}" if decoder == "auto" else decoder
    indices = list(open_source(root).episode_indices()) * rounds
    cores = os.cpu_count() or 1
    before: dict[int, tuple[float, float]] = {}
    seen: dict[int, tuple[float, float]] = {}
    groups: dict[str, set[int]] = {}
    stop = threading.Event()
    spies = []

    def start_watch() -> None:  # once the lanes and workers run: their start-up not counted
        for pids in _groups(os.getpid()).values():
            for p in pids:
                if (c := _cpu_s(p)) is not None:
                    before[p] = c
        threading.Thread(target=_watch, args=(stop, seen, groups), daemon=True).start()
        lanes = _groups(os.getpid())["lanes"]
        if spy is not None and lanes:  # once the lane's first tasks imported what they use
            threading.Timer(SPY_DELAY_S, lambda: spies.append(_spy(
                lanes[0], spy / f"spy-lane-{name}.txt", 8, idle=False, native=True))).start()

    start = cameras.CameraWorkers.start

    def started(self):
        out = start(self)
        start_watch()
        return out

    cameras.CameraWorkers.start = started
    try:
        frames, seconds, by = B.prepare(root, indices, cores, decoder, lanes=True)
    finally:
        cameras.CameraWorkers.start = start
        stop.set()
    time.sleep(0.5)
    for p in spies:
        p.wait()
    cpu = {part: round(sum(sum(seen[p]) - sum(before.get(p, (0.0, 0.0))) for p in pids), 1)
           for part, pids in groups.items()}
    out = {"decoder": decoder, "lane_cores": lane_cores, "frames": frames,
           "seconds": round(seconds, 2),
           "frames_per_s": round(frames / seconds), "decoded_by": by, "cpu_s": cpu,
           "cores_busy": {k: round(v / seconds, 1) for k, v in cpu.items()},
           "processes": {k: len(v) for k, v in groups.items()}}
    if spies:
        out["lane_top_frames"] = top_frames(spy / f"spy-lane-{name}.txt", 16)
    return out


def main() -> None:
    import bench_cameras as B

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--decoders", default="nvdec,auto")
    ap.add_argument("--lane-cores", default="2", help="auto's cores left to each lane, "
                    "comma-separated: one auto run each")
    ap.add_argument("--episodes", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--py-spy", action="store_true")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        root = B.make_clips(Path(tmp) / "h264", args.episodes, 120, (480, 640), "h264")
        recs = [run(d, root, args.rounds, args.out if args.py_spy else None, int(c))
                for d in map(str.strip, args.decoders.split(","))
                for c in (args.lane_cores.split(",") if d == "auto" else ["2"])]
    (args.out / "lanes.json").write_text(json.dumps(recs, indent=1))
    for r in recs:
        print(f"{r['decoder']:>6} ({r['lane_cores']}): {r['frames_per_s']:,} frames/s "
              f"{r['decoded_by']}; cores busy {r['cores_busy']} (processes {r['processes']})")
        for line in r.get("lane_top_frames", []):
            print("   ", line)


if __name__ == "__main__":
    main()
