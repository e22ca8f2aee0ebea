"""Benchmark ``robocache view --save`` on camera episodes: time, and peak memory against the
size of the episode's decoded frames, for a short and a long episode.

    $ robocache bench view --json benchmarks/results/view.json
    $ python benchmarks/bench_view.py --quick

The dataset: one LeRobot v3.0 episode at ``fps`` — a 7-D state and an H.264 camera of
``height`` x ``width`` (moving gradients) — and the cache ingested from it at the same rate;
4 s and 2 min long (``--quick``: 1 s and 4 s, smaller frames). Each case runs ``robocache view
EPISODE --save`` in a fresh process and records its wall time, its peak resident memory
(``ru_maxrss`` of the child), the camera's decoded bytes (frames x H x W x 3) and the ``.rrd``
size. Frames are logged a chunk at a time, so the peak of the long episode should stay near the
short one's; a viewer that held the episode's frames would need at least their decoded bytes.

Cases: ``source`` (the video decoded with PyAV) and ``cache`` (the cache's JPEG frames, sent as
stored; the source's numeric streams read beside them).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from robocache.bench import harness as H
from robocache.bench.standalone import main

FAMILY = "view"
# a short and a long episode of the same streams: the peak should not follow the length
FULL = {"seconds": (4.0, 120.0), "fps": 30.0, "height": 240, "width": 320}
QUICK = {"seconds": (1.0, 4.0), "fps": 30.0, "height": 48, "width": 64}
CHUNK = 300  # frames synthesised at a time while writing the video


def write_dataset(root: Path, seconds: float, fps: float, height: int, width: int) -> int:
    """The one-episode dataset (see the module docstring); returns its frame count. The
    frames go to the encoder from a file-backed array, never all in memory."""
    from robocache.data.cameras import add_video_feature
    from robocache.data.episode import Episode, Stream, StreamSpec
    from robocache.data.formats.lerobot import write_lerobot

    n = int(seconds * fps)
    t = np.arange(n) / fps
    spec = StreamSpec("observation.state", "numeric", "float32", (7,), fps)
    state = np.stack([np.sin(2 * np.pi * (0.2 + 0.1 * k) * t) for k in range(7)], 1)
    write_lerobot(root, [Episode(0, {spec.name: Stream(spec, t, state.astype(np.float32))},
                                 {"tasks": ["move"]})], {spec.name: spec}, fps=fps)
    frames = np.lib.format.open_memmap(root.parent / "frames.npy", "w+", np.uint8,
                                       (n, height, width, 3))
    y, x = np.mgrid[0:height, 0:width]
    for a in range(0, n, CHUNK):
        k = np.arange(a, min(n, a + CHUNK))[:, None, None]
        frames[a:a + len(k)] = np.stack([(x + 3 * k) % 256, (y + 2 * k) % 256,
                                         (x + y + k) % 256], -1)
    frames.flush()
    add_video_feature(root, "observation.images.front", [frames], fps=fps, codec="libx264")
    del frames
    (root.parent / "frames.npy").unlink()
    return n


def _view(path: Path, out: Path) -> tuple[float, int]:
    """Wall seconds and peak RSS (bytes) of ``robocache view path --save out``, alone in a
    fresh process (each case is the only child of its own measuring process)."""
    code = ("import resource, subprocess, sys, time\n"
            "t0 = time.perf_counter()\n"
            "subprocess.run([sys.executable, '-m', 'robocache.cli', 'view', sys.argv[1],"
            " '--save', sys.argv[2]], check=True, stdout=subprocess.DEVNULL)\n"
            "print(time.perf_counter() - t0,"
            " resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n")
    done = subprocess.run([sys.executable, "-c", code, str(path), str(out)], check=True,
                          capture_output=True, text=True, env=os.environ)
    seconds, kib = done.stdout.split()
    return float(seconds), int(kib) * 1024


def run(quick: bool = False, copy_gbps: float | None = None) -> list[dict]:
    from robocache.data.cache import build

    cfg = QUICK if quick else FULL
    records = []
    for seconds in cfg["seconds"]:
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp) / "src"
            frames = write_dataset(root, seconds, cfg["fps"], cfg["height"], cfg["width"])
            build(root, Path(tmp) / "cache", rate_hz=cfg["fps"], device="cpu",
                  progress=False, decode_workers=1)
            decoded = frames * cfg["height"] * cfg["width"] * 3
            name = f"{seconds:g}s-{cfg['fps']:g}Hz-{cfg['height']}x{cfg['width']}"
            for impl, path in (("source", root), ("cache", Path(tmp) / "cache")):
                rrd = Path(tmp) / f"{impl}.rrd"
                wall, peak = _view(path, rrd)
                records.append(H.case(
                    FAMILY, name, impl, H.summarize([wall * 1e3]), frames=frames,
                    decoded_bytes=decoded, peak_rss_bytes=peak, rrd_bytes=rrd.stat().st_size,
                    frames_per_s=frames / wall,
                    note=f"peak RSS {peak / 1e6:,.0f} MB for {decoded / 1e6:,.0f} MB of "
                         f"decoded frames; {frames / wall:,.0f} frames/s; .rrd "
                         f"{rrd.stat().st_size / 1e6:,.0f} MB"))
    return records


if __name__ == "__main__":
    main(run, __doc__)
