"""Benchmark the statistics of relative action chunks over a whole cache.

    $ robocache bench relative_stats --json benchmarks/results/relative_stats.json
    $ python benchmarks/bench_relative_stats.py --quick            # CPU-sized
    $ python benchmarks/bench_relative_stats.py --frames 400000    # any size

A synthetic stand-in cache (written straight as a Lance table beside a manifest, no camera):
``frames`` steps (default 3.8M; ``--quick`` 200,000) in episodes of 150-450 steps at 15 Hz,
a 7-D joint state (6 joints and a gripper) and a 7-D action (targets of the same, a random
walk; the gripper opens and closes). Cases, each the wall time of
:func:`robocache.data.stats.relative_action_stats` with ``store=False`` on the device at hand
(CUDA when available; ``robocache_cpu`` on the CPU's cores):

- ``joint``: 50-step chunks of the action relative to the current joint state (the gripper
  absolute): ``frames x 50 x 7`` values (1.33e9 for 3.8M frames; padded steps past an
  episode's end left out) for the target of 10 minutes on one node. ``first`` includes opening
  the cache (making the machine's served index of its two keys), ``timing`` is the median of
  the repeats after it.
- ``ee``: the same chunks as SE(3) poses (xyz + rotation vector) relative to the current pose
  in the end-effector frame.
- ``numpy`` (sizes whose chunks fit in memory, at most 2e8 values): the alternative a user
  writes, every relative chunk materialized (one gather) then ``np.mean`` / ``np.std`` /
  ``np.quantile`` per dimension.

Each case records whether its q01/q99 equal ``np.quantile(..., method="linear")`` of the
chunks (``equal_numpy``): over the whole cache where ``numpy`` ran, else over the chunks of
its first 200 episodes (their statistics computed the same way, on a dataset of those
episodes).
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from robocache.bench import harness as H
from robocache.bench.standalone import main

FAMILY = "relative_stats"
FULL, QUICK = 3_800_000, 200_000
HORIZON, RATE, DIM = 50, 15.0, 7
SPECS = {"joint": {"action": {"mode": "joint", "state": "observation.state",
                              "absolute_dims": [6]}},
         "ee": {"action": {"mode": "ee", "state": "observation.state", "absolute_dims": [6],
                           "rotation": "rotvec"}}}
NUMPY_MAX_VALUES = 200_000_000
SAMPLE_EPISODES = 200


def write_cache(root: Path, frames: int, seed: int = 0) -> int:
    """The synthetic cache at ``root`` (see the module docstring); returns its episodes."""
    import lance
    import pyarrow as pa

    rng = np.random.default_rng(seed)
    lengths = []
    while sum(lengths) < frames:
        lengths.append(int(rng.integers(150, 451)))
    lengths[-1] -= sum(lengths) - frames
    if lengths[-1] < 1:
        lengths.pop()
    schema = pa.schema([("episode_index", pa.int64()), ("step", pa.int64()),
                        ("timestamp", pa.float64()), ("task", pa.string()),
                        ("observation/state", pa.list_(pa.float32(), DIM)),
                        ("observation/state_is_pad", pa.bool_()),
                        ("action", pa.list_(pa.float32(), DIM)), ("action_is_pad", pa.bool_())])

    def batches():
        for first in range(0, len(lengths), 1000):
            part = lengths[first:first + 1000]
            n = sum(part)
            ep = np.repeat(np.arange(first, first + len(part)), part)
            step = np.concatenate([np.arange(k) for k in part])
            state = rng.normal(0, 0.02, (n, DIM)).astype(np.float32).cumsum(0)
            state[:, 6] = (np.sin(step / 40.0) > 0).astype(np.float32)  # the gripper
            action = np.roll(state, -3, axis=0) + rng.normal(0, 0.005, (n, DIM)).astype(
                np.float32)
            action[:, 6] = state[:, 6]
            yield pa.record_batch([
                pa.array(ep), pa.array(step), pa.array(step / RATE),
                pa.array(["move the arm"] * n),
                pa.FixedSizeListArray.from_arrays(pa.array(state.reshape(-1)), DIM),
                pa.array(np.zeros(n, bool)),
                pa.FixedSizeListArray.from_arrays(pa.array(action.reshape(-1)), DIM),
                pa.array(np.zeros(n, bool))], schema=schema)

    root.mkdir(parents=True, exist_ok=True)
    lance.write_dataset(pa.RecordBatchReader.from_batches(schema, batches()),
                        str(root / "data.lance"), max_rows_per_file=1 << 22)
    (root / "stats.json").write_text("{}")
    streams = {name: {"column": col, "kind": "numeric", "dtype": "float32", "shape": [DIM],
                      "dim": DIM, "source_rate_hz": RATE, "method": "linear"}
               for name, col in (("observation.state", "observation/state"),
                                 ("action", "action"))}
    manifest = {"format": "robocache-cache/1", "source": {"path": "synthetic", "format": "none"},
                "rate_hz": RATE, "native": True, "streams": streams, "status": "complete",
                "created": "synthetic", "counts": {"cached": len(lengths), "rows": frames},
                "episodes": [{"index": e, "rows": n, "task": "move the arm"}
                             for e, n in enumerate(lengths)],
                "quarantined": [], "stats_path": "stats.json"}
    (root / "manifest.json").write_text(json.dumps(manifest))
    return len(lengths)


def _chunks(dataset, device: str = "cpu") -> np.ndarray:
    """Every valid relative chunk value of ``dataset``'s action as the loader serves it on
    ``device`` (SE(3) chunks computed on a GPU differ from the CPU's in float32's last bits),
    float64 ``[values, 7]``: the alternative's materialized array."""
    idx = torch.arange(len(dataset))
    batch = (dataset if device == "cpu" else dataset.to(device))[idx.to(device)]
    return batch["action"][~batch["action_is_pad"]].double().cpu().numpy()


def _equal(stats, values: np.ndarray) -> bool:
    return bool(np.array_equal(stats.q01.numpy(), np.quantile(values, 0.01, axis=0))
                and np.array_equal(stats.q99.numpy(), np.quantile(values, 0.99, axis=0)))


def run(quick: bool = False, copy_gbps: float | None = None, frames: int | None = None,
        repeats: int = 2, report=None) -> list[dict]:
    from robocache.data import RobotDataset
    from robocache.data.stats import relative_action_stats

    frames = frames or (QUICK if quick else FULL)
    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    impl = "robocache" if cuda else "robocache_cpu"
    out: list[dict] = []

    def done(rec: dict) -> None:
        out.append(rec)
        if report is not None:
            report(rec)

    with tempfile.TemporaryDirectory() as tmp:
        cache = Path(tmp) / "cache"
        t0 = time.perf_counter()
        episodes = write_cache(cache, frames)
        written = time.perf_counter() - t0
        values = frames * HORIZON * DIM
        for name, spec in SPECS.items():
            t0 = time.perf_counter()
            stats = relative_action_stats(cache, spec, HORIZON, device=device, store=False)
            first = time.perf_counter() - t0
            samples = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                stats = relative_action_stats(cache, spec, HORIZON, device=device, store=False)
                if cuda:
                    torch.cuda.synchronize()
                samples.append((time.perf_counter() - t0) * 1e3)
            whole = stats["action"].count * DIM <= NUMPY_MAX_VALUES
            rec = H.case(FAMILY, f"{name}-frames{frames}-H{HORIZON}-D{DIM}", impl,
                         H.summarize(samples), frames=frames, episodes=episodes,
                         horizon=HORIZON, dim=DIM, values=values,
                         counted=stats["action"].count * DIM, first_s=first,
                         write_cache_s=written, device=device)
            if whole:
                chunks = _chunks(RobotDataset(cache, horizon=HORIZON, relative_actions=spec),
                                 device)
                t0 = time.perf_counter()
                ref = (chunks.mean(0), chunks.std(0), np.quantile(chunks, [0.01, 0.99], axis=0))
                alt = time.perf_counter() - t0
                rec["equal_numpy"] = _equal(stats["action"], chunks)
                rec["equal_numpy_over"] = "whole cache"
                rec["max_abs_mean_diff"] = float(np.abs(ref[0] - stats["action"].mean.numpy())
                                                 .max())
                done(rec)
                if name == "joint":
                    done(H.case(FAMILY, rec["name"], "numpy", H.summarize([alt * 1e3]),
                                frames=frames, values=values, note="np.mean/std/quantile "
                                "of the materialized chunks (the gather not counted)"))
                continue
            sample = RobotDataset(cache, horizon=HORIZON, relative_actions=spec,
                                  episodes=list(range(SAMPLE_EPISODES)))
            part = relative_action_stats(sample, device=device, store=False)["action"]
            rec["equal_numpy"] = _equal(part, _chunks(sample, device))
            rec["equal_numpy_over"] = f"first {SAMPLE_EPISODES} episodes"
            done(rec)
    return out


if __name__ == "__main__":
    main(run, __doc__, {"frames": (int, "cache size in frames (default 3.8M; --quick "
                                          "200,000)"),
                        "repeats": (int, "timed repeats after the first run (default 2)")})
