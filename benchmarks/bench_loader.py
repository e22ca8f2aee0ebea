"""Benchmark RoboCache's loader against a plain PyTorch DataLoader over the same LeRobot files.

    $ robocache bench loader --json benchmarks/results/loader.json
    $ python benchmarks/bench_loader.py --quick        # CPU smoke run

Both serve the same samples: batch 256, observation history 2 (``observation.state``, 24-D),
action horizon 16 (``action``, 16-D), edge padding with ``_is_pad`` masks, normalized (mean/std)
on the GPU, delivered as CUDA tensors. The dataset is a LeRobot v3.0 directory written here.

- ``robocache-resident``: ``RobotLoader`` with the packed cache on the GPU (``robocache ingest``
  at the dataset's own rate, then ``robocache.windows`` gathers on the device), each batch's
  gather replayed from a CUDA graph; ``-eager``: the same ops launched one by one.
- ``robocache-workers<N>``: ``RobotLoader`` gathering in N DataLoader workers, pinned copies.
- ``<first robocache impl>+metrics-off`` / ``+metrics-on``: the same loader with
  :mod:`robocache.observability.metrics` off and on, measured alternately (``METRICS`` batches
  per sample) so the record ``metrics_overhead_pct`` compares them within one run.
- ``torch-dataloader-w<N>``: what a user writes without RoboCache (LeRobot's delta_timestamps
  logic): a map-style Dataset over the parquet columns computing each window's clamped indices
  and pad masks per item, ``DataLoader(batch_size=256, shuffle, num_workers=N, pin_memory)``,
  then ``.to("cuda", non_blocking=True)`` and the same normalization.

LeRobotDataset itself is run when ``lerobot`` imports (it did not on the benchmark machine).
Timing: wall clock over ``BATCHES`` batches after warm-up, one device sync at the end, repeated;
the record's time is per batch, ``GBps`` is batch bytes delivered per second.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from robocache.bench import harness as H
from robocache.bench.standalone import main

FAMILY = "loader"
HISTORY, HORIZON, BATCH = 2, 16, 256
OBS_DIM, ACT_DIM, FPS = 24, 16, 50.0
FULL = {"episodes": 200, "length": 500, "batches": 60, "repeats": 5, "workers": (4, 8, 15),
        "metrics_batches": 2000, "metrics_repeats": 9}
QUICK = {"episodes": 8, "length": 120, "batches": 4, "repeats": 2, "workers": (0,),
         "metrics_batches": 4, "metrics_repeats": 2}


def make_dataset(root: Path, episodes: int, length: int, seed: int = 0) -> Path:
    """A single-rate LeRobot v3.0 dataset with 24-D state and 16-D action (random walks)."""
    from robocache.data.episode import Episode, Stream, StreamSpec
    from robocache.data.formats.lerobot import write_lerobot

    specs = {"observation.state": StreamSpec("observation.state", "numeric", "float32",
                                             (OBS_DIM,), FPS),
             "action": StreamSpec("action", "numeric", "float32", (ACT_DIM,), FPS)}
    rng = np.random.default_rng(seed)
    t = np.arange(length) / FPS
    eps = [Episode(i, {k: Stream(s, t, rng.normal(size=(length, s.dim)).cumsum(0)
                                 .astype(np.float32)) for k, s in specs.items()},
                   {"tasks": ["benchmark"]}) for i in range(episodes)]
    return write_lerobot(root, eps, specs, fps=FPS, version="v3.0")


class ParquetWindows(torch.utils.data.Dataset):
    """The plain baseline: LeRobot-style windows computed per item from the parquet columns."""

    def __init__(self, root: Path):
        import pyarrow.parquet as pq

        table = pq.read_table(sorted((root / "data").glob("*/*.parquet")))
        self.state = np.stack(table.column("observation.state").to_numpy(zero_copy_only=False))
        self.action = np.stack(table.column("action").to_numpy(zero_copy_only=False))
        ep = table.column("episode_index").to_numpy()
        starts = np.flatnonzero(np.r_[True, ep[1:] != ep[:-1]])
        ends = np.r_[starts[1:], len(ep)] - 1
        self.lo = np.repeat(starts, ends - starts + 1)
        self.hi = np.repeat(ends, ends - starts + 1)
        self.obs_off, self.act_off = np.arange(-(HISTORY - 1), 1), np.arange(HORIZON)

    def __len__(self) -> int:
        return len(self.lo)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        lo, hi = self.lo[i], self.hi[i]
        obs, act = i + self.obs_off, i + self.act_off
        return {"observation.state": torch.from_numpy(self.state[np.clip(obs, lo, hi)]),
                "observation.state_is_pad": torch.from_numpy(obs < lo),
                "action": torch.from_numpy(self.action[np.clip(act, lo, hi)]),
                "action_is_pad": torch.from_numpy(act > hi)}


def _plain_batches(dataset, workers: int, device, normalizer):
    loader = torch.utils.data.DataLoader(
        dataset, batch_size=BATCH, shuffle=True, drop_last=True, num_workers=workers,
        pin_memory=device.type == "cuda", persistent_workers=workers > 0,
        prefetch_factor=4 if workers else None)

    def gen():
        while True:
            for batch in loader:
                batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
                yield normalizer(batch)
    return gen()


def _robocache_batches(loader):
    def gen():
        while True:
            yield from loader
    return gen()


def _measure(batches, n: int, repeats: int, device) -> tuple[H.Timing, int]:
    """Per-batch wall ms (mean over `n` batches, one sync at the end), `repeats` samples."""
    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    batch = None
    for _ in range(3):
        batch = next(batches)
    nbytes = sum(v.numel() * v.element_size() for v in batch.values()
                 if isinstance(v, torch.Tensor))  # a mixture's prompts: strings too
    samples = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        for _ in range(n):
            batch = next(batches)
        sync()
        samples.append((time.perf_counter() - t0) * 1e3 / n)
    return H.summarize(samples), nbytes


def _metrics_overhead(loader, cfg, device) -> dict[bool, H.Timing]:
    """Per-batch ms of ``loader`` with metrics off and on, alternating samples."""
    from robocache.observability import metrics

    samples: dict[bool, list[float]] = {False: [], True: []}
    try:
        for _ in range(cfg["metrics_repeats"]):
            for on in (False, True):
                metrics.enable() if on else metrics.disable()
                timing, _ = _measure(_robocache_batches(loader), cfg["metrics_batches"], 1,
                                     device)
                samples[on].append(timing.median_ms)
    finally:
        metrics.disable()
    return {on: H.summarize(v) for on, v in samples.items()}


def run(quick: bool = False, copy_gbps: float | None = None) -> list[dict]:
    from robocache.data import RobotDataset, RobotLoader
    from robocache.data.cache import build
    from robocache.ops.normalize import Normalizer

    cfg = QUICK if quick else FULL
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    name = f"b{BATCH}-h{HISTORY}-H{HORIZON}-D{OBS_DIM + ACT_DIM}"
    records = []
    with tempfile.TemporaryDirectory() as tmp:
        root = make_dataset(Path(tmp) / "lerobot", cfg["episodes"], cfg["length"])
        t0 = time.perf_counter()
        manifest = build(root, Path(tmp) / "cache", rate_hz=FPS, progress=False)
        ingest_s = time.perf_counter() - t0
        rows = manifest["counts"]["rows"]

        def record(impl, timing, nbytes, **extra):
            records.append(H.case(FAMILY, name, impl, timing, nbytes=nbytes,
                                  samples_per_s=BATCH / (timing.median_ms * 1e-3),
                                  MB_per_s=nbytes / (timing.median_ms * 1e-3) / 1e6,
                                  rows=rows, **extra))

        if device.type == "cuda":
            runs = [("robocache-resident", 0, True), ("robocache-resident-eager", 0, False)]
        else:
            runs = [("robocache-w0", 0, False)]
        runs += [(f"robocache-workers{w}", w, False) for w in cfg["workers"][1:2]]
        ds = RobotDataset(Path(tmp) / "cache", history=HISTORY, horizon=HORIZON)
        for impl, workers, graph in runs:
            loader = RobotLoader(ds, BATCH, device=device, num_workers=workers, cuda_graph=graph)
            timing, nbytes = _measure(_robocache_batches(loader), cfg["batches"],
                                      cfg["repeats"], device)
            record(impl, timing, nbytes, workers=workers, ingest_s=ingest_s)
            if impl == runs[0][0]:
                both = _metrics_overhead(loader, cfg, device)
                pct = (both[True].median_ms / both[False].median_ms - 1) * 100
                for on, t in both.items():
                    record(f"{impl}+metrics-{'on' if on else 'off'}", t, nbytes,
                           workers=workers, metrics_overhead_pct=pct)
            del loader
        plain = ParquetWindows(root)
        normalizer = Normalizer(RobotDataset(Path(tmp) / "cache").stats)
        for workers in cfg["workers"]:
            batches = _plain_batches(plain, workers, device, normalizer)
            timing, nbytes = _measure(batches, cfg["batches"], cfg["repeats"], device)
            record(f"torch-dataloader-w{workers}", timing, nbytes, workers=workers)
            del batches
    best_plain = max(r["samples_per_s"] for r in records if r["impl"].startswith("torch"))
    for r in records:
        r["speedup_vs_best_plain"] = r["samples_per_s"] / best_plain
        r["note"] = f"{r['samples_per_s']:,.0f} samples/s, ×{r['speedup_vs_best_plain']:.1f}"
        if "metrics_overhead_pct" in r:
            r["note"] += f", metrics on {r['metrics_overhead_pct']:+.1f}%"
    return records


if __name__ == "__main__":
    main(run, __doc__)
