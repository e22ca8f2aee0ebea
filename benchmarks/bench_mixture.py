"""Benchmark a weighted mixture of caches against one cache of the same total size.

    $ robocache bench mixture --json benchmarks/results/mixture.json
    $ python benchmarks/bench_mixture.py --quick        # CPU smoke run

Three caches of different robots, as an Open X-Embodiment mixture: ``arm`` (24-D state, 16-D
action, 50 Hz), ``mobile`` (14-D state, 7-D action, 10 Hz), ``hand`` (8-D state, 7-D action,
20 Hz), sampled with weights 0.5 / 0.3 / 0.2 by :class:`robocache.MixedDataset`; each
normalized with its own stats on the GPU, padded to 24 / 16 dims with ``_dim_mask``,
``source`` per sample. Against it, one cache with the same total number of steps and the
widest shapes (24-D state, 16-D action) served by the same :class:`robocache.RobotLoader`.
Batch 256, observation history 2, action horizon 16, resident on the device (a mixture is
stacked into one packed cache: a batch is one gather). Three comparisons, each against its own
single cache (``ratio_vs_single``: mixture samples/s over single-cache samples/s):

- ``numeric``: state and action only (both replayed from CUDA graphs);
- ``cameras``: plus a 32x32 RGB camera (JPEG, decoded per batch with nvJPEG) on every step of
  the single cache and of every source (``mixture-3``): the same frames per batch, like for
  like;
- ``arm-camera``: the camera on the ``arm`` only (``mixture-3``, as such mixtures are): the
  other sources' rows serve a blank frame, decoded once per batch, so the mixture decodes about
  half the single cache's frames.

Timing: wall clock over ``batches`` batches after warm-up, one device sync at the end, repeated
(as the ``loader`` family).
"""

from __future__ import annotations

import importlib.util
import tempfile
from pathlib import Path

import numpy as np
import torch

from robocache.bench import harness as H
from robocache.bench.standalone import main

FAMILY = "mixture"
HISTORY, HORIZON, BATCH = 2, 16, 256
CAM = (32, 32, 3)
# name: (state dim, action dim, rate Hz, share of the steps, sampling weight)
ROBOTS = {"arm": (24, 16, 50.0, 0.4, 0.5), "mobile": (14, 7, 10.0, 0.35, 0.3),
          "hand": (8, 7, 20.0, 0.25, 0.2)}
NUMERIC = ["observation.state", "action"]
# comparison: (single cache's keys, each source's keys; None: all, with the camera)
CASES = {"numeric": (NUMERIC, [NUMERIC] * 3), "cameras": (None, [None] * 3),
         "arm-camera": (None, [None, NUMERIC, NUMERIC])}
FULL = {"steps": 100_000, "length": 500, "batches": 60, "repeats": 5}
QUICK = {"steps": 3_000, "length": 100, "batches": 4, "repeats": 2}


def _loader_bench():
    """The ``loader`` family's timing helper (benchmarks are files, not a package)."""
    spec = importlib.util.spec_from_file_location(
        "robocache_bench_loader", Path(__file__).with_name("bench_loader.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class _Synthetic:
    """An in-memory source of random-walk episodes (a reader without files)."""

    format = "synthetic"

    def __init__(self, path: Path, state: int, action: int, fps: float, camera: bool,
                 episodes: int, length: int, seed: int):
        from robocache.data.episode import StreamSpec

        self.path, self.fps, self.length, self.seed = path, fps, length, seed
        self.count = episodes
        self.specs = {"observation.state": StreamSpec("observation.state", "numeric", "float32",
                                                      (state,), fps),
                      "action": StreamSpec("action", "numeric", "float32", (action,), fps)}
        if camera:
            self.specs["observation.image"] = StreamSpec("observation.image", "image", "uint8",
                                                         CAM, fps)

    def episode_indices(self) -> list[int]:
        return list(range(self.count))

    def read(self, index: int):
        from robocache.data.episode import Episode, Stream

        rng = np.random.default_rng([self.seed, index])
        t = np.arange(self.length) / self.fps
        streams = {}
        for k, s in self.specs.items():
            data = rng.integers(0, 255, (self.length, *s.shape), np.uint8) if s.kind == "image" \
                else rng.normal(size=(self.length, *s.shape)).cumsum(0).astype(np.float32)
            streams[k] = Stream(s, t, data)
        return Episode(index, streams, {"tasks": ["benchmark"]})


def run(quick: bool = False, copy_gbps: float | None = None) -> list[dict]:
    from robocache.data import MixedDataset, RobotDataset, RobotLoader
    from robocache.data.cache import build

    cfg = QUICK if quick else FULL
    bench = _loader_bench()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    records = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)

        def cache(name, state, action, fps, steps, seed):
            (tmp / f"{name}-src").mkdir()
            src = _Synthetic(tmp / f"{name}-src", state, action, fps, True,
                             max(1, steps // cfg["length"]), cfg["length"], seed)
            build(src, tmp / name, rate_hz=fps, progress=False)
            return lambda keys: RobotDataset(tmp / name, history=HISTORY, horizon=HORIZON,
                                             keys=keys)

        parts = [cache(n, s, a, f, int(cfg["steps"] * share), i)
                 for i, (n, (s, a, f, share, _)) in enumerate(ROBOTS.items())]
        single = cache("single", 24, 16, 50.0, cfg["steps"], 9)
        weights = [w for *_, w in ROBOTS.values()]
        for case, (single_keys, part_keys) in CASES.items():
            mixed = MixedDataset([p(k) for p, k in zip(parts, part_keys, strict=True)],
                                 weights=weights)
            one = single(single_keys)
            name = f"b{BATCH}-h{HISTORY}-H{HORIZON}-{len(one)}steps-{case}"
            single_rate = None
            for impl, data in (("single-cache", one), ("mixture-3", mixed)):
                loader = RobotLoader(data, BATCH, device=device)
                timing, nbytes = bench._measure(bench._robocache_batches(loader),
                                                cfg["batches"], cfg["repeats"], device)
                rate = BATCH / (timing.median_ms * 1e-3)
                single_rate = single_rate or rate
                records.append(H.case(
                    FAMILY, name, impl, timing, nbytes=nbytes, samples_per_s=rate,
                    ratio_vs_single=rate / single_rate, steps=len(data),
                    sources=len(getattr(data, "datasets", [0])),
                    cuda_graph=loader.graphed is not None,
                    note=f"{rate:,.0f} samples/s, {rate / single_rate:.2f}x single"))
                del loader
    return records


if __name__ == "__main__":
    main(run, __doc__)
