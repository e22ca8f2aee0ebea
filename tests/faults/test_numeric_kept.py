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


class CommandSource:
    """A dense 50 Hz state and a gripper command sent 4 times an episode (sparse)."""

    format = "memory"
    specs = {"observation.state": StreamSpec("observation.state", "numeric", "float32", (3,),
                                             50.0),
             "gripper.command": StreamSpec("gripper.command", "numeric", "float64", (1,),
                                           0.3)}

    def __init__(self, path: Path):
        self.path = path

    def episode_indices(self) -> list[int]:
        return [0, 1]

    def read(self, index: int) -> Episode:
        rng = np.random.default_rng(index)
        t = 10.0 * index + np.arange(500) / 50.0
        cmd_t = 10.0 * index + np.array([1.3, 3.7, 6.1, 8.5])  # the first one after the start
        return Episode(index, {
            "observation.state": Stream(self.specs["observation.state"], t,
                                        rng.normal(size=(len(t), 3)).astype(np.float32)),
            "gripper.command": Stream(self.specs["gripper.command"], cmd_t,
                                      rng.uniform(0, 1, (4, 1)))}, {"tasks": ["grip"]})


def test_a_sparse_command_is_held_and_spans_nothing(tmp_path):
    """A command sent a few times an episode: held between its messages (padded before the
    first), the episode as long as its dense streams (it was cut to the command's first-to-last
    message, and the command interpolated), said in one line; the Observer serves the same."""
    (tmp_path / "src").mkdir()
    src = CommandSource(tmp_path / "src")
    said = []
    m = build(src, tmp_path / "c", rate_hz=50.0, progress=False, device="cpu", log=said.append)
    assert m["streams"]["gripper.command"]["method"] == "previous"
    assert len(said) == 1 and "gripper.command" in said[0] and "held" in said[0]
    ds = RobotDataset(tmp_path / "c", history=1, keys=["observation.state", "gripper.command"])
    ok_rows = all(e["rows"] == 500 for e in m["episodes"])
    values_ok = True
    for episode in (0, 1):
        rows = torch.nonzero(ds.episode_index == episode).flatten()
        item = ds[rows]
        cmd = src.read(episode).streams["gripper.command"]
        t = ds.timestamp[rows].numpy()
        k = np.searchsorted(cmd.times, t, side="right") - 1
        pad = item["gripper.command_is_pad"][:, 0].numpy()
        got = item["gripper.command"][:, 0, 0].numpy()
        values_ok &= bool(np.array_equal(pad, k < 0)) and bool(
            np.array_equal(got[k >= 0], cmd.data[k[k >= 0], 0]))
    obs = robocache.Observer.from_cache(tmp_path / "c", history=2,
                                        keys=["observation.state", "gripper.command"])
    episode = src.read(1)
    rows = torch.nonzero(ds.episode_index == 1).flatten().tolist()
    messages = sorted((float(tm), name, v) for name, s in episode.streams.items()
                      for tm, v in zip(s.times, s.data, strict=True))
    obs.reset()
    obs.start(float(ds.timestamp[rows[0]]))
    full = RobotDataset(tmp_path / "c", history=2, keys=["observation.state",
                                                         "gripper.command"])
    pushed, agree = 0, True
    for r in rows[:-1]:
        tick = float(ds.timestamp[r])
        while pushed < len(messages) and (messages[pushed][0] <= tick + 0.03):
            tm, name, v = messages[pushed]
            obs.push(name, tm, v)
            pushed += 1
        got, want = obs.observation(tick), full[r]
        pad = want["gripper.command_is_pad"]
        # the padded steps' values are not the same: the cache knows the first message's
        # value there, online it may not have come yet
        agree &= bool(torch.equal(got["gripper.command_is_pad"], pad)) and bool(
            torch.equal(got["gripper.command"][~pad], want["gripper.command"][~pad]))
    ok = ok_rows and values_ok and agree
    fl.record("a command sent 4 times an episode beside a 50 Hz state, --rate 50",
              "held between its messages, the episode as long as the state, the Observer "
              "the same, said in one line", lost=not ok)
    assert ok, (ok_rows, values_ok, agree)
