"""Numbers kept as they are: float64 streams aligned, summarized and normalized in float64, and
window sizes that cannot fit refused before anything is allocated.

Each case records a row of docs/reliability.md's table (see faultlib).
"""

from __future__ import annotations

from pathlib import Path

import faultlib as fl
import lance
import numpy as np
import pytest
import torch

import robocache
from robocache.data import RobotDataset, RobotLoader
from robocache.data.cache import build
from robocache.data.episode import Episode, Stream, StreamSpec
from robocache.errors import DataError, ShapeError

SPECS = {"observation.state": StreamSpec("observation.state", "numeric", "float64", (3,), 30.0),
         "action": StreamSpec("action", "numeric", "float64", (2,), 25.0)}
EPOCH = 1.7e9  # epoch seconds: float32 would round them to 128 s


class EpochSource:
    """Float64 streams at irregular times on epoch seconds (as ROS 2 bags and robomimic
    hold them), read in memory."""

    format = "memory"

    def __init__(self, path: Path):
        self.path, self.specs = path, SPECS

    def episode_indices(self) -> list[int]:
        return [0, 1, 2]

    def read(self, index: int) -> Episode:
        rng = np.random.default_rng(index)
        t0 = EPOCH + 100.0 * index
        streams = {}
        for k, spec in SPECS.items():
            t = t0 + np.sort(rng.uniform(0, 2, 50))
            t[0], t[-1] = t0, t0 + 2
            streams[k] = Stream(spec, t, rng.normal(5, 3, (50, spec.dim)))
        return Episode(index, streams, {"tasks": ["hold"]})


@pytest.fixture(scope="module")
def resampled(tmp_path_factory) -> tuple[Path, EpochSource]:
    root = tmp_path_factory.mktemp("f64")
    (root / "src").mkdir()
    src = EpochSource(root / "src")
    build(src, root / "cache", rate_hz=50.0, progress=False, device="cpu")
    return root / "cache", src


def test_a_resampled_float64_stream_is_interpolated_in_float64(resampled):
    cache, src = resampled
    table = lance.dataset(str(cache / "data.lance")).to_table()
    worst, representable = 0.0, []
    for e in src.episode_indices():
        rows = table.filter(table.column("episode_index").to_numpy() == e)
        t = rows.column("timestamp").to_numpy()
        ep = src.read(e)
        for k in SPECS:
            got = np.stack(rows.column(k.replace(".", "/")).to_numpy(zero_copy_only=False))
            s = ep.streams[k]
            want = np.stack([np.interp(t, s.times, s.data[:, j])
                             for j in range(s.data.shape[1])], 1)
            worst = max(worst, float(np.abs(got - want).max()))
            representable.append(np.mean(got.astype(np.float32).astype(np.float64) == got))
    ok = worst <= 1e-12 and max(representable) < 0.01
    fl.record("a float64 stream resampled at --rate on epoch-second timestamps",
              f"interpolated in float64: {worst:.1e} from np.interp in float64", lost=not ok)
    assert ok, (worst, representable)


def test_float64_statistics_and_normalization_stay_float64(resampled):
    """min_max normalization of a float64 stream, resident and by workers: in float64, every
    served value in [-1, 1] (the statistics' min and max are the data's exactly)."""
    cache, _ = resampled
    ds = RobotDataset(cache, history=1)
    values = ds[torch.arange(len(ds))]["action"].reshape(len(ds), -1)
    st = ds.stats["action"]
    exact = bool(torch.equal(st.min, values.min(0).values.to(torch.float64))
                 and torch.equal(st.max, values.max(0).values.to(torch.float64)))
    ranges = []
    for workers in (0, 1):
        loader = RobotLoader(ds, 32, device="cpu", num_workers=workers, normalize="min_max",
                             seed=0, drop_last=False)
        got = torch.cat([b["action"] for b in loader])
        assert got.dtype == torch.float64
        ranges.append((float(got.min()), float(got.max())))
    ok = exact and all(lo >= -1 and hi <= 1 for lo, hi in ranges) and \
        all(abs(lo + 1) < 1e-12 and abs(hi - 1) < 1e-12 for lo, hi in ranges)
    fl.record("RobotLoader(normalize='min_max') over float64 streams (resident and workers)",
              f"normalized in float64: {ranges[0][0]:.3f}..{ranges[0][1]:.3f}", lost=not ok)
    assert ok, (exact, ranges)


@pytest.mark.parametrize("kwargs", [{"history": 10**9}, {"horizon": 10**9},
                                    {"history": 2, "horizon": 10**10}])
def test_windows_that_cannot_fit_are_refused_at_once(resampled, kwargs):
    cache, _ = resampled
    import time

    t0 = time.monotonic()
    with pytest.raises(ShapeError, match="pass a smaller `history` / `horizon`"):
        RobotDataset(cache, **kwargs)
    fl.record(f"RobotDataset({', '.join(f'{k}={v:g}' for k, v in kwargs.items())})",
              "refused before allocating, naming history / horizon")
    assert time.monotonic() - t0 < 5


@pytest.mark.parametrize("kwargs,match", [
    ({"history": 10**9}, "pass a smaller `history`"),
    ({"capacity": 10**10}, "pass a smaller `capacity`"),
    ({"lookahead_s": 1e12}, "pass a smaller `capacity`"),
    ({"lookahead_s": float("inf")}, "`lookahead_s` must be a finite number"),
])
def test_observer_sizes_that_cannot_fit_are_refused_at_once(resampled, kwargs, match):
    cache, _ = resampled
    with pytest.raises((ShapeError, DataError), match=match):
        robocache.Observer.from_cache(cache, keys=["observation.state"], **kwargs)
    fl.record(f"Observer.from_cache({', '.join(f'{k}={v:g}' for k, v in kwargs.items())})",
              "refused before allocating, naming the argument")


@pytest.mark.parametrize("normalize", [None, "mean_std"])
def test_the_observer_serves_float64_streams_as_the_cache_does(resampled, normalize):
    """A float64 stream online (interpolated, and normalized, in float64) equals the cache's
    item of every step, bit for bit: what the policy saw in training."""
    from robocache.ops.normalize import Normalizer

    cache, src = resampled
    key = "observation.state"
    ds = RobotDataset(cache, history=2, keys=[key])
    norm = Normalizer(ds.stats, normalize) if normalize else None
    obs = robocache.Observer.from_cache(cache, history=2, keys=[key], normalize=normalize)
    episode = 1
    rows = torch.nonzero(ds.episode_index == episode).flatten().tolist()
    ep = src.read(episode).streams[key]
    obs.reset()
    obs.start(float(ds.timestamp[rows[0]]))
    pushed, compared = 0, 0
    for r in rows[:-1]:  # the last step is clamped to the episode's end
        tick = float(ds.timestamp[r])
        # every message up to the tick and the first one after it (linear needs both sides)
        while pushed < len(ep.times) and (pushed == 0 or ep.times[pushed - 1] <= tick):
            obs.push(key, float(ep.times[pushed]), ep.data[pushed])
            pushed += 1
        got, want = obs.observation(tick), ds[r]
        if norm is not None:
            want = norm(want)
        assert got[key].dtype == torch.float64
        assert torch.equal(got[f"{key}_is_pad"], want[f"{key}_is_pad"]), r
        assert torch.equal(got[key], want[key]), (r, got[key] - want[key])
        compared += 1
    fl.record(f"Observer over a resampled float64 stream (normalize={normalize})",
              f"equal to the cache's item at all {compared} steps, in float64")
