"""Preprocess benchmark: the cache build with Ray on 1..N GPUs, and where the time goes.

    $ robocache bench preprocess --json benchmarks/results/preprocess.json
    $ python benchmarks/bench_preprocess.py --quick          # CPU, a small dataset

The dataset is generated on the machine: a multi-rate LeRobot v3.0 dataset (FULL: 1000
episodes of 12 s; 100 Hz 24-D state, 50 Hz 16-D action, jittered 30 Hz 7-D pose, a 15 Hz
48x64 RGB camera stored inline, two language events; ``ROBOCACHE_BENCH_EPISODES`` overrides
the episode count). Cases:

- ``raw-read``: every source file read once with no decoding (the I/O ceiling, GB/s).
- ``stage <name>``: one process, a sample of episodes, each per-episode step of the build timed
  alone: read+decode+check (``load_episode``), align (on the GPU), write (Lance files), commit.
  Camera frames are stored as they come (no encoding step exists in this path).
- ``preprocess <g> GPU``: ``robocache preprocess`` on a local Ray with ``g`` GPU actors, for
  g = 1, 2, 4, ... up to every visible GPU (CPU actors with ``--quick`` and no GPU): wall time,
  episodes/s, source frames/s, speedup over one GPU (target >= 1.9x on two) and the source
  bytes/s as a percentage of ``raw-read`` (I/O-bound at >= 80 %).
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from robocache.bench import harness as H
from robocache.bench.standalone import main

FAMILY = "preprocess"
FULL = {"episodes": 1000, "seconds": 12.0, "camera": (48, 64, 3), "sample": 40}
QUICK = {"episodes": 12, "seconds": 2.0, "camera": (8, 8, 3), "sample": 4}
RATES = {"observation.state": 100.0, "action": 50.0, "observation.pose": 30.0,
         "observation.images.cam": 15.0}
DIMS = {"observation.state": 24, "action": 16, "observation.pose": 7}


def make_dataset(root: Path, episodes: int, seconds: float, camera: tuple[int, int, int],
                 seed: int = 0) -> tuple[Path, int]:
    """Write the multi-rate LeRobot dataset; returns (root, source frames over all streams)."""
    from robocache.data.episode import Episode, Stream, StreamSpec
    from robocache.data.formats.lerobot import write_lerobot

    specs = {k: StreamSpec(k, "numeric", "float32", (d,), RATES[k]) for k, d in DIMS.items()}
    cam = "observation.images.cam"
    specs[cam] = StreamSpec(cam, "image", "uint8", camera, RATES[cam])
    specs["language.note"] = StreamSpec("language.note", "event", "str", (), None)
    rng = np.random.default_rng(seed)
    eps, frames = [], 0
    for i in range(episodes):
        streams = {}
        for k, d in DIMS.items():
            t = np.arange(int(seconds * RATES[k]) + 1) / RATES[k]
            if k == "observation.pose":
                t = t + rng.uniform(0, 2e-3, len(t)) + 0.005
            streams[k] = Stream(specs[k], t, rng.normal(size=(len(t), d)).cumsum(0)
                                .astype(np.float32))
        t = np.arange(int(seconds * RATES[cam])) / RATES[cam] + 0.01
        streams[cam] = Stream(specs[cam], t, rng.integers(0, 255, (len(t), *camera), np.uint8))
        streams["language.note"] = Stream(specs["language.note"], np.array([0.5, seconds / 2]),
                                          np.array(["reach", "grasp"], dtype=object))
        frames += sum(len(s) for s in streams.values())
        eps.append(Episode(i, streams, {"tasks": ["benchmark"]}))
    return write_lerobot(root, eps, specs, fps=RATES["observation.state"], version="v3.0"), frames


def raw_read_s(root: Path) -> tuple[float, int]:
    """Seconds to read every file under ``root`` once (no decoding), and the bytes read."""
    files = [p for p in root.rglob("*") if p.is_file()]
    os.sync()
    t0 = time.perf_counter()
    nbytes = 0
    for p in files:
        with open(p, "rb") as f:
            while chunk := f.read(16 << 20):
                nbytes += len(chunk)
    return time.perf_counter() - t0, nbytes


def stage_times(root: Path, dest: Path, sample: int, device: torch.device) -> dict[str, list]:
    """ms per episode of each build step, over ``sample`` episodes, in one process."""
    from robocache.data.cache import (
        CacheConfig,
        align_episode,
        commit,
        load_episode,
        open_specs,
        write_episode,
    )

    config = CacheConfig(rate_hz=50.0)
    src, specs = open_specs(root, config)
    dest.mkdir(parents=True)
    out: dict[str, list] = {"read+decode+check": [], "align": [], "write": [], "commit": []}

    def timed(name, fn):
        t0 = time.perf_counter()
        value = fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        out[name].append((time.perf_counter() - t0) * 1e3)
        return value

    for index in src.episode_indices()[:sample]:
        episode = timed("read+decode+check", lambda i=index: load_episode(src, i, specs))
        cols = timed("align", lambda e=episode: align_episode(e, specs, config, device))
        written = timed("write", lambda e=episode, c=cols: write_episode(dest, e, c, specs))
        timed("commit", lambda i=index, w=written: commit(dest, [i], w))
    return out


def gpu_counts(available: int) -> list[int]:
    counts, g = [], 1
    while g < available:
        counts.append(g)
        g *= 2
    return [*counts, available] if available else [0]


def run(quick: bool = False, copy_gbps: float | None = None) -> list[dict]:
    import ray

    from robocache.distributed import preprocess

    cfg = dict(QUICK if quick else FULL)
    cfg["episodes"] = int(os.environ.get("ROBOCACHE_BENCH_EPISODES", cfg["episodes"]))
    gpus = torch.cuda.device_count()
    device = torch.device("cuda" if gpus else "cpu")
    name = f"{cfg['episodes']}ep-{cfg['seconds']:g}s-cam{'x'.join(map(str, cfg['camera']))}"
    records = []
    with tempfile.TemporaryDirectory(dir=os.environ.get("ROBOCACHE_BENCH_DIR")) as tmp:
        t0 = time.perf_counter()
        root, frames = make_dataset(Path(tmp) / "src", cfg["episodes"], cfg["seconds"],
                                    tuple(cfg["camera"]))
        made_s = time.perf_counter() - t0
        read_s, nbytes = raw_read_s(root)
        raw_gbps = nbytes / read_s / 1e9
        records.append(H.case(FAMILY, name, "raw-read", H.summarize([read_s * 1e3]),
                              nbytes=nbytes, source_bytes=nbytes, generate_s=made_s,
                              note=f"{raw_gbps:.2f} GB/s, {nbytes / 1e9:.2f} GB"))
        for stage, ms in stage_times(root, Path(tmp) / "stages", cfg["sample"], device).items():
            records.append(H.case(FAMILY, name, f"stage {stage}", H.summarize(ms),
                                  per="episode", device=str(device)))
        ray.init(num_cpus=os.cpu_count() if not quick else 2, num_gpus=gpus,
                 include_dashboard=False, logging_level="ERROR", log_to_driver=False)
        try:
            base = None
            for g in gpu_counts(gpus):
                t0 = time.perf_counter()
                m = preprocess(root, Path(tmp) / f"cache-{g}", rate_hz=50.0, num_gpus=g,
                               workers=1 if quick else None, progress=False)
                wall = time.perf_counter() - t0
                eps_s = m["counts"]["cached"] / wall
                base = base or eps_s
                records.append(H.case(
                    FAMILY, name, f"preprocess {g} GPU" if g else "preprocess CPU",
                    H.summarize([wall * 1e3]), nbytes=nbytes, gpus=g, batch=max(g, 1),
                    episodes_per_s=eps_s, frames_per_s=frames / wall, rows=m["counts"]["rows"],
                    speedup=eps_s / base, pct_raw_read=100 * nbytes / wall / 1e9 / raw_gbps,
                    note=f"{eps_s:.1f} ep/s, {frames / wall / 1e3:.0f}k frames/s, "
                         f"x{eps_s / base:.2f}, {100 * nbytes / wall / 1e9 / raw_gbps:.0f}% "
                         "of raw read"))
        finally:
            ray.shutdown()
    return records


if __name__ == "__main__":
    main(run, __doc__)
