"""Benchmark `robocache.LeRobotDataset` against LeRobot's own `LeRobotDataset` on the same
LeRobot v3.0 dataset with the same `delta_timestamps`, in one run.

    $ robocache bench lerobot --json benchmarks/results/lerobot.json
    $ python benchmarks/bench_lerobot.py --quick        # CPU smoke run

The dataset: 12 episodes x 192 frames at 30 fps, 14-D float32 state and action, an int64
gripper mode and a bool contact flag; ``delta_timestamps = {"observation.state": [-1/30, 0],
"action": [k/30 for k in range(16)]}``. Written by LeRobot's writer when ``lerobot`` imports
(LeRobot 0.6.1 needs Python >= 3.12 and torch < 2.12: run this in its environment), otherwise
by RoboCache's, and then only RoboCache's paths run.

Records (samples/s in ``samples_per_s``; the time is per item or per batch):

- ``robocache-item`` / ``lerobot-item``: ``ds[i]`` in a loop (the compatibility path).
- ``robocache-dataloader-w<N>`` / ``lerobot-dataloader-w<N>``: ``torch.utils.data.DataLoader(
  ds, batch_size=64, shuffle=True, num_workers=N)`` with N = 0 and the machine's cores.
- ``robocache-batch-<device>``: ``ds.get_batch(indices)`` of 256 items, the cache on the device
  (the fast path: on CUDA one `key_windows` launch for every key).

The per-key gather kernel against torch.compile is `robocache bench windows` (its 3-key case).
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

FAMILY = "lerobot"
FPS = 30
DIM = 14
DELTAS = {"observation.state": [-1 / FPS, 0.0], "action": [k / FPS for k in range(16)]}
FULL = {"episodes": 12, "length": 192, "items": 2000, "batches": 20, "repeats": 3}
QUICK = {"episodes": 4, "length": 40, "items": 100, "batches": 3, "repeats": 2}


def has_lerobot() -> bool:
    try:
        import lerobot.datasets.lerobot_dataset  # noqa: F401
    except ImportError:
        return False
    return True


def frames(rng, length):
    return [{"observation.state": rng.normal(size=DIM).astype(np.float32),
             "action": rng.normal(size=DIM).astype(np.float32),
             "observation.gripper_mode": rng.integers(0, 4, 1).astype(np.int64),
             "observation.contact": rng.integers(0, 2, 1).astype(bool)} for _ in range(length)]


def make_dataset(root: Path, episodes: int, length: int, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    if has_lerobot():
        from lerobot.datasets.lerobot_dataset import LeRobotDataset

        feats = {"observation.state": {"dtype": "float32", "shape": (DIM,), "names": None},
                 "action": {"dtype": "float32", "shape": (DIM,), "names": None},
                 "observation.gripper_mode": {"dtype": "int64", "shape": (1,), "names": None},
                 "observation.contact": {"dtype": "bool", "shape": (1,), "names": None}}
        ds = LeRobotDataset.create("bench/lerobot", fps=FPS, features=feats, root=root,
                                   use_videos=False)
        for e in range(episodes):
            for f in frames(rng, length):
                ds.add_frame({**f, "task": f"task {e % 2}"})
            ds.save_episode()
        ds.finalize()
        return root
    from robocache.data.episode import Episode, Stream, StreamSpec
    from robocache.data.formats.lerobot import write_lerobot

    first = frames(rng, 1)[0]
    specs = {k: StreamSpec(k, "numeric", v.dtype.name, v.shape, float(FPS))
             for k, v in first.items()}
    t = np.arange(length) / FPS
    eps = []
    for e in range(episodes):
        fs = frames(rng, length)
        eps.append(Episode(e, {k: Stream(s, t, np.stack([f[k] for f in fs]))
                               for k, s in specs.items()}, {"tasks": [f"task {e % 2}"]}))
    return write_lerobot(root, eps, specs, fps=float(FPS))


def wall(fn, count: int, repeats: int) -> H.Timing:
    """Per-unit wall-clock milliseconds of ``fn()`` doing ``count`` units, repeated."""
    fn()  # warm-up: caches, workers, kernels
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        samples.append((time.perf_counter() - t0) * 1e3 / count)
    return H.summarize(samples)


def run(quick: bool = False, copy_gbps: float | None = None) -> list[dict]:
    import robocache

    cfg = QUICK if quick else FULL
    cores = os.cpu_count() or 1
    workers = (0,) if quick else (0, cores)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        root = make_dataset(Path(tmp) / "data", cfg["episodes"], cfg["length"])
        name = f"E{cfg['episodes']}x{cfg['length']}-state2-action16"
        impls = {"robocache": lambda: robocache.LeRobotDataset(
            "bench/lerobot", root=root, delta_timestamps=DELTAS, cache=Path(tmp) / "cache")}
        if has_lerobot():
            from lerobot.datasets.lerobot_dataset import LeRobotDataset

            impls["lerobot"] = lambda: LeRobotDataset("bench/lerobot", root=root,
                                                      delta_timestamps=DELTAS)

        def rec(impl, timing, per, **extra):
            return H.case(FAMILY, name, impl, timing, samples_per_s=per / timing.median_ms * 1e3,
                          **extra)

        for impl, make in impls.items():
            ds = make()
            n, items = len(ds), cfg["items"]
            order = np.random.default_rng(1).integers(0, n, items).tolist()

            def per_item(ds=ds, order=order):
                for i in order:
                    ds[i]

            rows.append(rec(f"{impl}-item", wall(per_item, items, cfg["repeats"]), 1))
            for w in workers:
                loader = torch.utils.data.DataLoader(ds, batch_size=64, shuffle=True,
                                                     num_workers=w, persistent_workers=w > 0)

                def epoch(loader=loader):
                    for _ in loader:
                        pass

                per = len(loader)
                rows.append(rec(f"{impl}-dataloader-w{w}", wall(epoch, per, cfg["repeats"]), 64,
                                workers=w))
        dev = "cuda" if torch.cuda.is_available() else "cpu"
        ds = robocache.LeRobotDataset("bench/lerobot", root=root, delta_timestamps=DELTAS,
                                      cache=Path(tmp) / "cache", device=dev)
        g = torch.Generator().manual_seed(2)
        batches = [torch.randint(0, len(ds), (256,), generator=g).to(dev)
                   for _ in range(cfg["batches"])]

        def fast():
            for b in batches:
                ds.get_batch(b)

        rows.append(rec(f"robocache-batch-{dev}", wall(fast, len(batches), cfg["repeats"]), 256,
                        batch=256))
    return rows


if __name__ == "__main__":
    main(run, __doc__)
