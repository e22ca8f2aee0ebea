"""robocache.online: replaying recorded episodes message by message in log order gives, at
every grid step, the offline cache's item (bit-exact for previous/nearest/native streams and
cameras; interpolated streams bit-exact on the CPU, where both run the reference, within one
float32 ulp on a GPU, whose arithmetic may round differently); errors; export."""

from __future__ import annotations

import dataclasses
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import robocache
from robocache.data.cache import build, load_episode
from robocache.data.formats import open_source
from robocache.errors import DataError
from robocache.online import Observer

pytest.importorskip("lance")

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "data" / "sample" / "panda_multirate"
TINY = ROOT / "tests" / "fixtures" / "lerobot" / "tiny"
SAMPLE_KEYS = ["observation.state", "observation.ee_pose", "observation.images.top"]
TINY_KEYS = ["observation.state", "observation.gripper_mode", "observation.counts",
             "observation.contact", "observation.image"]


def log(source: Path, cache_path: Path, index: int, keys: list[str]):
    """Every message of episode ``index`` of the served streams, in log (time) order: numeric
    samples as the source holds them, camera frames as the encoded bytes the cache stores."""
    import lance

    src = open_source(source)
    # only the served streams are read (a video the observer does not serve is not decoded)
    episode = load_episode(src, index, {k: s for k, s in src.specs.items() if k in keys})
    msgs = []
    for name in keys:
        spec = src.specs[name]
        if spec.kind == "numeric":
            s = episode.streams[name]
            msgs += [(float(t), name, v) for t, v in zip(s.times, s.data, strict=True)]
        else:
            table = lance.dataset(str(cache_path / "frames" / f"{name}.lance")).to_table()
            rows = table.filter(table.column("episode_index").to_numpy() == index)
            rows = rows.sort_by("frame")
            msgs += [(float(t), name, bytes(b)) for t, b in
                     zip(rows.column("timestamp").to_pylist(),
                         rows.column("encoded").to_pylist(), strict=True)]
    order = sorted(range(len(msgs)), key=lambda i: msgs[i][0])  # stable: ties keep stream order
    return [msgs[i] for i in order]


def within_ulp(a: torch.Tensor, b: torch.Tensor) -> bool:
    a, b = a.cpu().numpy(), b.cpu().numpy()
    return bool(np.all(np.abs(a - b) <= np.spacing(np.abs(b).astype(b.dtype))))


def replay(observer: Observer, dataset, source: Path, episode: int, interpolated=(),
           normalizer=None, tolerance_s: float = 1e-4) -> int:
    """Push the episode's messages in log order; emit each grid step once the log has passed
    it and the observer says it is final (or the log ended); compare with the cache's item.
    Returns the number of steps compared."""
    rows = torch.nonzero(dataset.episode_index == episode).flatten().tolist()
    ticks = [float(dataset.timestamp[i]) for i in rows]
    observer.reset()
    observer.start(ticks[0])
    compared = 0

    def emit(k: int) -> None:
        nonlocal compared
        o = observer.observation(ticks[k])
        item = dataset[rows[k]]
        if normalizer is not None:
            item = normalizer(item)
        if float(o["timestamp"]) != ticks[k]:  # only the last step may be clamped to the end
            assert k == len(ticks) - 1, (k, float(o["timestamp"]), ticks[k])
            return
        assert int(o["index"]) == k
        for key in observer.keys:
            a, b = o[key].cpu(), item[key].cpu()
            pa, pb = o[f"{key}_is_pad"].cpu(), item[f"{key}_is_pad"].cpu()
            if ticks[k] > ends[key] and observer.streams[key].method != "previous":
                # the recording stopped: the cache pads what is past its last message, live
                # the latest one stays the nearest (the horizon says none nearer can come)
                continue
            assert torch.equal(pa, pb), (k, key, pa, pb)
            assert a.shape == b.shape and a.dtype == b.dtype, (key, a.shape, b.shape)
            if observer.streams[key].kind == "camera":
                assert torch.equal(a[~pa], b[~pb]), (k, key)
            elif key in interpolated and observer.device.type == "cuda":
                assert within_ulp(a, b), (k, key, (a - b).abs().max())
            else:
                assert torch.equal(a, b), (k, key, a, b)
        compared += 1

    messages = log(source, dataset.path, episode, observer.keys)
    ends = {name: t for t, name, _ in messages}
    k = 0
    for t, name, value in messages:
        while k < len(ticks) and t > ticks[k] + tolerance_s and observer.ready(ticks[k]):
            emit(k)
            k += 1
        observer.push(name, t, value)
    while k < len(ticks):
        emit(k)
        k += 1
    return compared


@pytest.fixture(scope="module")
def sample_caches(tmp_path_factory):
    """The bundled sample at 50 Hz, twice: default methods (linear), and state nearest /
    end-effector pose previous (snapped samples)."""
    root = tmp_path_factory.mktemp("online")
    keys = SAMPLE_KEYS + ["action"]
    build(SAMPLE, root / "linear", rate_hz=50.0, progress=False, device="cpu", episodes=[0, 3],
          keys=keys)
    build(SAMPLE, root / "hold", rate_hz=50.0, progress=False, device="cpu", episodes=[1],
          keys=keys, methods={"observation.state": "nearest",
                              "observation.ee_pose": "previous"})
    return root


@pytest.mark.parametrize("episode", [0, 3])
def test_sample_replay_matches_cache_linear(sample_caches, episode):
    ds = robocache.RobotDataset(sample_caches / "linear", history=2, keys=SAMPLE_KEYS)
    obs = Observer.from_cache(sample_caches / "linear", history=2)
    n = replay(obs, ds, SAMPLE, episode, interpolated=("observation.state",
                                                       "observation.ee_pose"))
    assert n >= int((ds.episode_index == episode).sum()) - 1


def test_sample_replay_matches_cache_hold_and_nearest(sample_caches):
    ds = robocache.RobotDataset(sample_caches / "hold", history=3, keys=SAMPLE_KEYS)
    obs = Observer.from_cache(sample_caches / "hold", history=3)
    assert replay(obs, ds, SAMPLE, 1) > 100
    o = obs.observation(float(ds.timestamp[-1]))
    assert o["observation.ee_pose_age"].shape == (3,) and (o["observation.ee_pose_age"] >= 0).all()


def test_normalized_per_key_offsets_and_zero_pad(sample_caches):
    """delta_timestamps (a squeezed key, a gap) and zero padding, normalized as the loader
    normalizes (the packed cache normalized once, then windows)."""
    from robocache.ops.normalize import Normalizer

    kw = dict(keys=SAMPLE_KEYS[:2], pad="zero",
              delta_timestamps={"observation.state": [-0.06, -0.02, 0.0]})
    ds = robocache.RobotDataset(sample_caches / "linear", **kw)
    ds = ds.normalized(Normalizer(ds.stats, "min_max"))
    obs = Observer.from_cache(sample_caches / "linear", normalize="min_max", **kw)
    assert replay(obs, ds, SAMPLE, 0, interpolated=SAMPLE_KEYS[:2]) > 100
    o = obs.observation(float(ds.timestamp[5]))
    assert o["observation.state"].shape == (3, 8) and o["observation.ee_pose"].shape == (9,)


def test_lerobot_fixture_native_replay_matches_cache(tmp_path):
    """LeRobot's own writer made the fixture (tests/fixtures/lerobot/make_fixtures.py): int64,
    int32, bool streams and PNG images, cached at the native fps (every frame exact)."""
    build(TINY, tmp_path / "c", progress=False, device="cpu")
    ds = robocache.RobotDataset(tmp_path / "c", history=2, keys=TINY_KEYS)
    obs = Observer.from_cache(tmp_path / "c", history=2)
    assert {s.method for s in obs.streams.values()} == {"previous", "frame_index"}
    total = sum(replay(obs, ds, TINY, int(e)) for e in ds.episode_ids)
    assert total == len(ds)


def test_staleness_is_padded_and_flagged(sample_caches):
    obs = Observer.from_cache(sample_caches / "hold", history=2, keys=SAMPLE_KEYS[:2],
                              stale_s=0.05)
    obs.push("observation.state", 0.0, np.zeros(8))
    obs.push("observation.ee_pose", 0.0, np.ones(9))
    o = obs.observation(0.0)
    assert not o["observation.ee_pose_is_pad"][-1] and o["observation.ee_pose_is_pad"][0]
    o = obs.observation(0.04)  # nearest stream: no message at or after 0.04 s
    # at 0.02 s the message at 0 is final (a newer one comes at 0.04 s or later), not at 0.04 s
    assert o["observation.state_is_pad"].tolist() == [False, True]
    assert o["observation.ee_pose_age"][-1] == pytest.approx(0.04)
    assert not o["observation.ee_pose_is_pad"][-1]
    o = obs.observation(0.1)  # the held pose is older than stale_s
    assert o["observation.ee_pose_is_pad"][-1]
    assert not obs.ready(0.1)
    obs.push("observation.state", 0.12, np.zeros(8))
    assert obs.ready(0.1)


def test_late_messages_inserted_in_order(sample_caches):
    obs = Observer.from_cache(sample_caches / "linear", keys=SAMPLE_KEYS[:1], late_s=0.01)
    obs.start(0.0)
    obs.push("observation.state", 0.0, np.zeros(8))
    obs.push("observation.state", 0.04, np.full(8, 4.0))
    obs.push("observation.state", 0.035, np.full(8, 3.0))  # late, within late_s
    o = obs.observation(0.02)
    assert torch.allclose(o["observation.state"], torch.full((1, 8), 3.0 * 0.02 / 0.035))


def test_values_as_tensors_and_camera_arrays(sample_caches):
    """Messages may be torch tensors; a camera may send decoded uint8 [H, W, 3] frames."""
    obs = Observer.from_cache(sample_caches / "linear", keys=SAMPLE_KEYS)
    frame = np.arange(16 * 16 * 3, dtype=np.uint8).reshape(16, 16, 3)
    obs.push("observation.state", 0.0, torch.ones(8))
    obs.push("observation.ee_pose", 0.0, torch.zeros(9, dtype=torch.float64))
    obs.push("observation.images.top", 0.0, frame)
    o = obs.observation(0.0)
    assert o["observation.state"].tolist() == [[1.0] * 8]
    assert torch.equal(o["observation.images.top"][0],
                       torch.from_numpy(frame).permute(2, 0, 1).float() / 255)


@pytest.mark.parametrize("cache, key", [("linear", "observation.state"),
                                        ("hold", "observation.ee_pose")])
def test_push_many_equals_pushes(sample_caches, cache, key):
    """Batches of every size, ticks between them, the rings wrapping many times: the same
    observations as the messages pushed one by one."""
    rng = np.random.default_rng(0)
    n = 600
    times = np.cumsum(rng.uniform(0.001, 0.006, n))
    times[::7] = np.round(times[::7] * 50) / 50  # some samples on grid instants
    times = np.maximum.accumulate(times)
    values = rng.normal(size=(n, 8 if key == "observation.state" else 9))
    one, many = (Observer.from_cache(sample_caches / cache, history=3, keys=[key])
                 for _ in range(2))
    at = 0
    while at < n:
        hi = min(at + int(rng.integers(1, 30)), n)  # (past a ring: one by one)
        for t, v in zip(times[at:hi], values[at:hi], strict=True):
            one.push(key, t, v)
        many.push_many(key, times[at:hi], values[at:hi])
        a, b = one.observation(times[hi - 1]), many.observation(times[hi - 1])
        assert all(torch.equal(a[k], b[k]) for k in a if isinstance(a[k], torch.Tensor)), at
        at = hi


def test_huge_finite_values_are_accepted(sample_caches):
    """Finite values whose squares overflow (the finiteness check's fast path) still pass;
    NaN among them still fails."""
    obs = Observer.from_cache(sample_caches / "linear", history=2, keys=SAMPLE_KEYS[:1])
    big = np.full(8, 3e38, np.float32)
    obs.push("observation.state", 0.0, big)
    obs.push_many("observation.state", [0.01, 0.02], np.stack([big, -big]))
    with pytest.raises(DataError, match="NaN or infinite"):
        obs.push_many("observation.state", [0.04, 0.05],
                      np.stack([big, np.r_[big[:7], np.float32("nan")]]))
    # float64 values past float32's range (the ring's) are refused, not stored as inf
    with pytest.raises(DataError, match="past float32's range"):
        obs.push("observation.state", 0.06, np.full(8, 1e300))
    with pytest.raises(DataError, match="past float32's range"):
        obs.push_many("observation.state", [0.06, 0.07], np.full((2, 8), -1e39))
    obs.push_many("observation.state", [0.06, 0.07], np.full((2, 8), 1e38))  # float64, fits


def test_future_message_refused_and_the_stream_goes_on(sample_caches):
    """A message far ahead of the observer's clock (its latest message or tick) is refused
    instead of making every later message of its stream "go backwards"; the ticks advance the
    clock, so a loop that was idle takes messages again."""
    obs = Observer.from_cache(sample_caches / "linear", keys=SAMPLE_KEYS[:1], future_s=5.0)
    obs.push("observation.state", 0.0, np.zeros(8, np.float32))
    with pytest.raises(DataError, match="more than future_s = 5 s after the observer's clock"):
        obs.push("observation.state", 1e6, np.ones(8, np.float32))
    obs.push("observation.state", 0.02, np.ones(8, np.float32))
    assert obs.observation(0.02)["observation.state"][-1].tolist() == [1.0] * 8
    obs.observation(100.0)  # an idle robot: the ticks went on
    obs.push("observation.state", 104.0, np.ones(8, np.float32))
    obs.reset()  # a new episode: any clock
    obs.push("observation.state", 1e6, np.ones(8, np.float32))


@pytest.fixture(scope="module")
def typed_cache(tmp_path_factory):
    """float64 streams (linear and held), int32 and bool streams at 100 Hz, cached at 50 Hz."""
    from robocache.data.episode import Episode, Stream, StreamSpec
    from robocache.data.formats.lerobot import write_lerobot

    root = tmp_path_factory.mktemp("typed")
    rng = np.random.default_rng(0)
    kinds = {"observation.x64": "float64", "observation.h64": "float64",
             "observation.i32": "int32", "observation.flag": "bool"}
    eps = []
    for e in range(2):
        t = np.arange(60) / 100.0
        eps.append(Episode(e, {n: Stream(StreamSpec(n, "numeric", dt, (3,), 100.0), t,
                                         rng.normal(size=(60, 3)).astype(dt) if dt != "bool"
                                         else rng.random((60, 3)) > 0.5)
                               for n, dt in kinds.items()}, {"tasks": ["x"]}))
    write_lerobot(root / "src", eps, {n: s.spec for n, s in eps[0].streams.items()}, fps=100.0)
    build(root / "src", root / "c", rate_hz=50.0, progress=False, device="cpu",
          methods={"observation.h64": "previous"})
    return root / "c"


def test_value_range_is_the_stores(typed_cache):
    """float64 streams take float64's range (1e308 is a value there); integer and bool
    streams take values they hold exactly and refuse the others, naming the value."""
    obs = Observer.from_cache(typed_cache)
    for key in ("observation.x64", "observation.h64"):
        obs.push(key, 0.0, np.full(3, 1e308))
        obs.push_many(key, [0.01, 0.02], np.full((2, 3), -1e308))
    obs.push("observation.i32", 0.0, [1, -2, 3])
    obs.push("observation.i32", 0.01, np.array([4.0, 5.0, 6.0]))
    obs.push("observation.flag", 0.0, [1, 0, True])
    o = obs.observation(0.01)
    assert o["observation.i32"][-1].tolist() == [4, 5, 6]
    assert o["observation.flag"][-1].tolist() == [True, False, True]
    assert o["observation.h64"][-1].tolist() == [-1e308] * 3
    for key, value, bad in (("observation.i32", [1.5, 0, 0], "1.5"),
                            ("observation.i32", [3e9, 0, 0], "3000000000.0"),
                            ("observation.flag", [2, 0, 1], "2")):
        with pytest.raises(DataError, match=f"holds {bad}, which the stream's"):
            obs.push(key, 0.03, value)
    with pytest.raises(DataError, match="holds 1.5"):
        obs.push_many("observation.i32", [0.03, 0.04], [[0, 0, 0], [1.5, 0, 0]])


def test_core_tick_leaves_the_thread_count(typed_cache):
    """A tick the host tick does not cover (float64 interpolation) runs the core on one
    intra-op thread and gives the caller's thread count back."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        obs = Observer.from_cache(typed_cache, keys=["observation.x64"])
        obs.push("observation.x64", 0.0, np.ones(3))
        assert obs.observation(0.0)["observation.x64"].dtype == torch.float64
        assert obs._host_tick is None and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_snap_instants_is_ingests_rule():
    """The online snap of a tick's few samples equals ingest's (snap_times) on the grid
    around them: samples on instants, half-way between, before the first, far off."""
    from robocache.data.cache import snap_times
    from robocache.online import snap_instants

    rng = np.random.default_rng(3)
    for rate, t0 in ((50.0, 0.0), (30.0, 1.2345), (15.0, 1e5 + 0.1)):
        k = rng.integers(0, 400, 200).astype(np.float64)
        x = np.concatenate([t0 + k / rate,                       # on instants
                            t0 + (k + 0.5) / rate,               # ties
                            t0 + k / rate + rng.normal(0, 2e-4, 200),
                            t0 + rng.uniform(-1, 30, 200)])      # before t0, anywhere
        for tol in (1e-4, 0.0, 0.05):
            for chunk in np.array_split(x, 40):
                lo = max(math.floor((chunk.min() - t0) * rate) - 1, 0)
                hi = max(math.ceil((chunk.max() - t0) * rate) + 1, lo + 1)
                grid = t0 + np.arange(lo, hi + 1, dtype=np.float64) / rate
                want = snap_times(chunk, grid, tol)
                got, close = snap_instants(chunk.tolist(), t0, rate, tol)
                np.testing.assert_array_equal(np.array(got), want)
                assert close == bool(np.isin(want, grid).all())


def _jpeg(h: int, w: int, codec: str = "jpeg") -> bytes:
    from robocache.data.cameras import encode

    return bytes(bytearray(encode(np.full((h, w, 3), 7, np.uint8), codec, 90)))


@pytest.mark.parametrize("call, match", [
    (lambda o: o.push("nope", 0.0, np.zeros(8)), "unknown stream 'nope'"),
    (lambda o: o.push("observation.state", float("nan"), np.zeros(8)), "stream "
     "'observation.state': message time nan is not finite"),
    (lambda o: o.push("observation.state", 1.0, np.full(8, np.nan)), "NaN or infinite"),
    (lambda o: o.push("observation.state", 1.0, np.r_[np.zeros(7, np.float32), np.inf]
                      .astype(np.float32)), "NaN or infinite"),
    (lambda o: o.push("observation.state", 1.0, np.zeros(3)), "expected 8"),
    (lambda o: (o.push("observation.state", 1.0, np.zeros(8)),
                o.push("observation.state", 0.5, np.zeros(8))), "time went backwards"),
    (lambda o: o.push_many("observation.state", [1.0, 0.5], np.zeros((2, 8))),
     "time went backwards"),
    (lambda o: o.push_many("observation.state", [0.1, np.nan, 0.3], np.zeros((3, 8))),
     "NaN or infinite"),
    (lambda o: o.push_many("observation.state", [0.1, np.inf, 0.3], np.zeros((3, 8))),
     "NaN or infinite"),
    (lambda o: o.push_many("observation.state", [0.1, 0.2], np.r_[np.zeros(15), np.inf]
                           .astype(np.float32).reshape(2, 8)), "NaN or infinite"),
    (lambda o: o.push("observation.images.top", 1.0, 3), "camera frame must be"),
    (lambda o: o.observation(float("nan")), "`t` must be a finite time"),
    (lambda o: (o.observation(1.0), o.observation(0.5)), "before the first tick"),
    # strict at push: what used to fail later (or pass silently) fails here, naming the stream
    (lambda o: o.push("observation.state", "1.0", np.zeros(8)), "'observation.state': a time "
     "must be a number"),
    (lambda o: o.push("observation.state", None, np.zeros(8)), "a time must be a number"),
    (lambda o: o.push("observation.state", 1.0, np.ones(8, complex)), "is complex"),
    (lambda o: o.push("observation.state", 1.0, ["a"] * 8), "is not numeric"),
    (lambda o: o.push("observation.state", 1.0, [[1.0] * 7, [1.0]]), "not an array of numbers"),
    (lambda o: o.push("observation.state", 1.0, None), "is not numeric"),
    (lambda o: o.push_many("observation.state", [0.1, 0.2], np.ones((2, 8), complex)),
     "must be real numbers"),
    (lambda o: o.push_many("observation.state", [0.1, 0.2, 0.3], np.zeros((2, 8))),
     "3 messages need 3 x 8 values"),
    (lambda o: o.push_many("observation.state", ["a", "b"], np.zeros((2, 8))),
     "`times` must be numbers"),
    (lambda o: (o.push("observation.state", 1.0, np.zeros(8)),
                o.push("observation.ee_pose", 1e6, np.zeros(9))), "more than future_s = 10 s"),
    (lambda o: (o.observation(1.0), o.push_many("observation.state", [1.0, 20.0],
                                                np.zeros((2, 8)))), "more than future_s"),
    (lambda o: o.push("observation.images.top", 1.0, b"garbage"), "not a JPEG or PNG image"),
    (lambda o: o.push("observation.images.top", 1.0, _jpeg(16, 16)[:-40]), "truncated JPEG"),
    (lambda o: o.push("observation.images.top", 1.0, _jpeg(32, 16)),
     "is a 32x16 JPEG image; this camera's frames are 16x16 JPEG"),
    (lambda o: o.push("observation.images.top", 1.0, _jpeg(16, 16, "png")),
     "16x16 PNG image; this camera's frames are 16x16 JPEG"),
    (lambda o: o.push("observation.images.top", 1.0, np.zeros((8, 8, 3), np.uint8)),
     r"uint8 array of shape \[8, 8, 3\]"),
    (lambda o: o.push("observation.images.top", 1.0, torch.zeros(16, 16, 3)),
     "float32 array of shape"),
])
def test_errors_name_the_stream(sample_caches, call, match):
    obs = Observer.from_cache(sample_caches / "linear", keys=SAMPLE_KEYS)
    with pytest.raises(DataError, match=match) as e:
        call(obs)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("kw, match", [
    (dict(keys=["action"]), "are actions"),
    (dict(keys=["nope"]), "not servable"),
    (dict(delta_timestamps={"observation.state": [0.02]}), "cannot be observed online"),
    (dict(history=0), "`history` must be"),
    (dict(capacity=1), "`capacity` of stream"),
    (dict(pad="wrap"), "`pad` must be"),
    (dict(package="core.pt2", device="cuda"), "`package` is for CPU observers"
     if torch.cuda.is_available() else "no CUDA GPU is usable here"),
    (dict(device="gpu"), "`device` must be 'cpu', 'cuda'"),
    (dict(device="cuda:99"), "this machine has" if torch.cuda.is_available() else "no CUDA GPU"),
    (dict(image_size=(224,)), "`image_size` must be None or"),
    (dict(image_dtype=np.float32), "`image_dtype` must be a torch dtype"),
    (dict(late_s=-1.0), "`late_s` must be a finite number of seconds >= 0"),
    (dict(stale_s="1"), "`stale_s` must be"),
    (dict(tolerance_s=float("nan")), "`tolerance_s` must be"),
    (dict(future_s=0), "`future_s` must be"),
    (dict(compile="yes"), "`compile` must be True or False"),
    (dict(keys="observation.state"), r"pass \['observation.state'\]"),
    (dict(normalize="bogus"), "`mode` must be one of"),
    (dict(delta_steps={"observation.state": [-0.5]}), "one integer offset each"),
    (dict(delta_timestamps={"observation.state": ["a"]}), "`delta_timestamps` must map"),
])
def test_from_cache_validation(sample_caches, kw, match):
    with pytest.raises(DataError, match=match):
        Observer.from_cache(sample_caches / "linear", **kw)


def test_from_cache_missing(tmp_path):
    with pytest.raises(FileNotFoundError, match="robocache ingest"):
        Observer.from_cache(tmp_path)


@pytest.mark.parametrize("cache", ["linear", "hold"])
def test_core_traces_as_one_graph(sample_caches, cache):
    """torch.compile(fullgraph=True) traces the core (no graph break: plain constants, torch
    dtypes), and the traced core gives the eager core's outputs. The core holds no NumPy
    object (torch 2.11's dynamo cannot hash a NumPy dtype; 2.13's can)."""
    obs = Observer.from_cache(sample_caches / cache, history=2, normalize="mean_std")

    def numpy_objects(x):
        if isinstance(x, (np.generic, np.dtype, np.ndarray)):
            return [x]
        if isinstance(x, dict):
            x = list(x.keys()) + list(x.values())
        elif dataclasses.is_dataclass(x):
            x = [getattr(x, f.name) for f in dataclasses.fields(x)]
        elif not isinstance(x, (list, tuple)):
            return []
        return [o for v in x for o in numpy_objects(v)]

    assert numpy_objects({k: v for k, v in vars(obs.core).items()
                          if not k.startswith("_")}) == []
    for i in range(40):
        obs.push("observation.state", i * 0.008, np.full(8, i, np.float32))
        obs.push("observation.ee_pose", i * 0.01, np.full(9, -i, np.float32))
    obs.observation(0.1)
    inputs = obs.example_inputs()
    torch._dynamo.reset()
    traced = torch.compile(obs.core, fullgraph=True, dynamic=False, backend="eager")
    for a, b in zip(traced(*inputs), obs.core(*inputs), strict=True):
        assert a.dtype == b.dtype and torch.equal(a, b)


def _tick_case(case: str, sample_caches: Path, tmp_path: Path):
    """An observer and the messages of one replayed episode for the fast ticks' tests (the
    fused kernel, the CPU host tick), and how often to tick: linear, nearest, previous
    (native: exact) streams of float, integer and bool dtypes, cameras' frame slots (with a
    tolerance), normalized and zero-padded."""
    source, keys, kw, episode = SAMPLE, SAMPLE_KEYS, {"history": 3}, 0
    if case in ("native", "integer"):  # integer: int64 / int32 counts interpolated
        build(TINY, tmp_path / "c", progress=False, device="cpu", **(
            {"rate_hz": 7.0, "methods": {"observation.counts": "linear",
                                         "observation.gripper_mode": "linear"}}
            if case == "integer" else {}))
        cache, source, keys, episode = tmp_path / "c", TINY, TINY_KEYS, 0
    else:
        cache = sample_caches / ("hold" if case in ("hold", "normalized") else "linear")
        episode = 1 if case in ("hold", "normalized") else 0
    if case == "normalized":
        kw = {"normalize": "min_max", "pad": "zero", "keys": SAMPLE_KEYS[:2],
              "delta_timestamps": {"observation.state": [-0.06, -0.02, 0.0]}}
        keys = SAMPLE_KEYS[:2]
    if case == "tolerance":
        kw["camera_tolerance_s"] = 0.01
    obs = Observer.from_cache(cache, **kw)
    messages = log(source, cache, episode, keys)
    obs.start(messages[0][0])
    return obs, messages, 1 if case in ("native", "integer") else 7


def _ticks(obs: Observer, messages, every: int):
    """Push the messages, and every ``every`` messages tick: yields the core's outputs of
    each tick (the reference the fast ticks are compared with)."""
    for i, (t, name, value) in enumerate(messages):
        obs.push(name, t, value)
        if i % every or t < obs.t0:
            continue
        obs.observation(t)
        yield i, obs.core(*obs.example_inputs())


@pytest.mark.parametrize("case", ["linear", "hold", "normalized", "native", "integer",
                                  "tolerance"])
def test_fused_kernel_matches_core(sample_caches, tmp_path, kernel_device, case):
    """The GPU tick's one Triton launch (the interpreter on the CPU) gives the reference core's
    outputs bit for bit (interpolated values within one float32 ulp on a GPU), tick after
    tick of a replayed episode (the cases of :func:`_tick_case`)."""
    obs, messages, every = _tick_case(case, sample_caches, tmp_path)
    run, outputs = obs.fused(kernel_device)
    arena = torch.zeros_like(obs._host_buf, device=kernel_device)
    compared = 0
    for i, want in _ticks(obs, messages, every):
        arena.copy_(obs._host_buf)
        run(arena)
        for a, b in zip(want, outputs, strict=True):
            # (a GPU's float32 division may round otherwise than the CPU's)
            assert a.dtype == b.dtype and (torch.equal(a, b.cpu()) or (
                kernel_device == "cuda" and a.is_floating_point() and within_ulp(b, a))), \
                (i, a, b)
        compared += 1
    assert compared > 20


@pytest.mark.parametrize("case", ["linear", "hold", "normalized", "native", "tolerance"])
def test_host_tick_matches_core(sample_caches, tmp_path, case):
    """The CPU tick without torch operators (Python floats rounded as float32, a few NumPy
    calls) gives the reference core's outputs bit for bit, tick after tick; the observer uses
    it by default where it covers the streams (integer interpolation runs the core)."""
    from robocache.online import _HostTick

    obs, messages, every = _tick_case(case, sample_caches, tmp_path)
    assert _HostTick.covers(obs)
    compared = 0
    for i, want in _ticks(obs, messages, every):
        assert obs._host_tick is not None
        for name, a, b in zip(obs.core.outputs, want, obs._static_out, strict=True):
            assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b), \
                (i, name, a, b)
        compared += 1
    assert compared > 20
    obs, _, _ = _tick_case("integer", sample_caches, tmp_path / "int")
    assert not _HostTick.covers(obs)


def test_top_level_export():
    assert robocache.Observer is Observer and "Observer" in dir(robocache)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("compiled", [False, True])
def test_cuda_graph_replay_matches_cache(sample_caches, compiled):
    """On the GPU the tick is one captured CUDA graph (of the torch.compile'd core with
    ``compile``); nvJPEG decodes the frames, as the dataset does on the GPU."""
    ds = robocache.RobotDataset(sample_caches / "linear", history=2, keys=SAMPLE_KEYS).to("cuda")
    obs = Observer.from_cache(sample_caches / "linear", history=2, device="cuda",
                              compile=compiled)
    assert replay(obs, ds, SAMPLE, 0, interpolated=SAMPLE_KEYS[:2]) > 100
    assert obs._graph is not None
    ds = robocache.RobotDataset(sample_caches / "hold", history=2, keys=SAMPLE_KEYS).to("cuda")
    obs = Observer.from_cache(sample_caches / "hold", history=2, device="cuda",
                              compile=compiled)
    assert replay(obs, ds, SAMPLE, 1) > 100


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_graph_replay_matches_cache_under_gpu_load(sample_caches):
    """The observation stays the dataset's item, camera frames bit for bit, while three other
    processes decode JPEGs with nvJPEG and multiply matrices on the same GPU (what the GPU
    tests running in three workers do to each other)."""
    from robocache.bench.load import busy_gpu
    from robocache.data.cameras import encode

    rng = np.random.default_rng(0)
    y, x = np.mgrid[0:480, 0:640]
    base = np.stack([x * 255 // 639, y * 255 // 479, (x + y) * 255 // 1118], -1)
    jpegs = [bytes(bytearray(encode(np.clip(base + rng.integers(0, 24, base.shape), 0, 255)
                                    .astype(np.uint8), "jpeg", 95))) for _ in range(8)]
    with busy_gpu(jpegs, processes=3, seconds=300):
        ds = robocache.RobotDataset(sample_caches / "linear", history=2,
                                    keys=SAMPLE_KEYS).to("cuda")
        obs = Observer.from_cache(sample_caches / "linear", history=2, device="cuda")
        assert replay(obs, ds, SAMPLE, 0, interpolated=SAMPLE_KEYS[:2]) > 100
        assert replay(obs, ds, SAMPLE, 3, interpolated=SAMPLE_KEYS[:2]) > 100


_FRESH = """
import sys, torch
assert "robocache" not in sys.modules
model = torch._inductor.aoti_load_package(sys.argv[1])
inputs, expected = torch.load(sys.argv[2])
out = model(*inputs)
assert len(out) == len(expected)
for a, b in zip(out, expected):
    assert a.dtype == b.dtype and torch.equal(a, b), (a, b)
assert "robocache" not in sys.modules
print("ok")
"""


@pytest.mark.slow
def test_aoti_package_runs_without_robocache(sample_caches, tmp_path):
    """The core exports with torch.export, compiles to an AOTInductor package (CPU, gcc) and
    gives the eager core's outputs in a fresh process that never imports robocache."""
    obs = Observer.from_cache(sample_caches / "hold", history=2, keys=SAMPLE_KEYS[:2],
                              normalize="mean_std")
    for i in range(40):
        obs.push("observation.state", i * 0.008, np.full(8, i, np.float32))
        obs.push("observation.ee_pose", i * 0.01, np.full(9, -i, np.float32))
    obs.observation(0.1)
    inputs = obs.example_inputs()
    expected = obs.core(*inputs)
    package = obs.save_package(tmp_path / "core.pt2")
    torch.save(([x.clone() for x in inputs], expected), tmp_path / "io.pt")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    run = subprocess.run([sys.executable, "-c", _FRESH, package, str(tmp_path / "io.pt")],
                         capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr[-2000:]
    # the same package as this process's core: every tick as the eager observer's
    fast = Observer.from_cache(sample_caches / "hold", history=2, keys=SAMPLE_KEYS[:2],
                               normalize="mean_std", package=package)
    for o in (obs, fast):
        o.reset()
        o.start(0.0)
        for i in range(40):
            o.push("observation.state", i * 0.008, np.full(8, i, np.float32))
            o.push("observation.ee_pose", i * 0.01, np.full(9, -i, np.float32))
    for t in (0.0, 0.1, 0.2, 0.3):
        a, b = obs.observation(t), fast.observation(t)
        assert all(torch.equal(a[k], b[k]) for k in a), t
