"""Relative actions in the loader and the statistics of their chunks, against NumPy (and
SciPy's rotations) computed from the cache's rows."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from robocache.data import MixedDataset, RobotDataset, RobotLoader
from robocache.data.cache import build
from robocache.data.episode import Episode, Stream, StreamSpec
from robocache.data.stats import (
    RELATIVE_DIR,
    from_keys,
    order_keys,
    relative_action_stats,
)
from robocache.errors import DataError
from robocache.ops.normalize import Normalizer

H = 6
JOINT = {"action": {"mode": "joint", "state": "observation.state", "absolute_dims": [6]}}
EE = {"action.ee": {"mode": "ee", "state": "observation.ee", "absolute_dims": [6]}}
WIDTHS = {"observation.state": 7, "action": 7, "observation.ee": 7, "action.ee": 7,
          "observation.quat": 8}


class _Source:
    """Episodes of 1 to 40 steps at 10 Hz: joint state and targets (7-D: 6 joints and a
    gripper), end-effector poses (xyz, rotation vector, gripper) and a wxyz-quaternion pose."""

    format = "synthetic"

    def __init__(self, path, episodes: int, seed: int, dtype: str = "float32"):
        self.path, self.count, self.seed, self.dtype = path, episodes, seed, dtype
        self.specs = {k: StreamSpec(k, "numeric", dtype, (d,), 10.0)
                      for k, d in WIDTHS.items()}

    def episode_indices(self):
        return list(range(self.count))

    def read(self, i):
        rng = np.random.default_rng([self.seed, i])
        n = 1 if i == 0 else int(rng.integers(2, 40))  # one episode of a single step
        t = np.arange(n) / 10.0
        data = {k: rng.normal(size=(n, d)).cumsum(0) for k, d in WIDTHS.items()}
        q = rng.normal(size=(n, 4))
        data["observation.quat"][:, 3:7] = q / np.linalg.norm(q, axis=1, keepdims=True)
        data["action"][:, 6] = rng.integers(0, 2, n)  # a gripper: two values, many ties
        streams = {k: Stream(self.specs[k], t, v.astype(self.dtype)) for k, v in data.items()}
        return Episode(i, streams, {"tasks": ["t"]})


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    root = tmp_path_factory.mktemp("relative")
    (root / "src").mkdir()
    build(_Source(root / "src", 24, seed=7), root / "cache", rate_hz=10.0, progress=False,
          device="cpu")
    return root / "cache"


@pytest.fixture
def fresh(cache, tmp_path):
    """A copy of the cache whose relative statistics a test may write."""
    import shutil

    shutil.copytree(cache, tmp_path / "cache")
    return tmp_path / "cache"


def episodes(cache) -> list[dict[str, np.ndarray]]:
    """Each episode's rows per key, read straight from Lance."""
    import lance

    rows = lance.dataset(str(cache / "data.lance")).to_table().to_pylist()
    rows.sort(key=lambda r: (r["episode_index"], r["step"]))
    out: dict[int, dict[str, list]] = {}
    for r in rows:
        ep = out.setdefault(r["episode_index"], {k: [] for k in WIDTHS})
        for k in WIDTHS:
            ep[k].append(r[k.replace(".", "/")])
    return [{k: np.asarray(v, np.float32) for k, v in ep.items()} for _, ep in sorted(
        out.items())]


def joint_chunks(cache, horizon: int = H) -> np.ndarray:
    """NumPy: every (start, offset) inside its episode, actions minus the start's state on the
    six joints, the gripper as stored: ``[values, 7]`` float32, in window order."""
    out = []
    for ep in episodes(cache):
        a, s = ep["action"], ep["observation.state"]
        for t in range(len(a)):
            for k in range(horizon):
                if t + k < len(a):
                    v = a[t + k].copy()
                    v[:6] = v[:6] - s[t, :6]
                    out.append(v)
    return np.stack(out)


def ee_reference(action: np.ndarray, state: np.ndarray) -> np.ndarray:
    """SciPy: ``state^-1 @ pose`` for xyz + rotation-vector poses (float64)."""
    from scipy.spatial.transform import Rotation

    r0 = Rotation.from_rotvec(state[3:6].astype(np.float64))
    r = Rotation.from_rotvec(action[:, 3:6].astype(np.float64))
    out = action.astype(np.float64).copy()
    out[:, :3] = r0.inv().apply(action[:, :3].astype(np.float64) - state[:3])
    out[:, 3:6] = (r0.inv() * r).as_rotvec()
    return out


# --------------------------------------------------------------------------- the reference

def test_joint_chunks_equal_numpy(cache):
    ds = RobotDataset(cache, horizon=H, relative_actions=JOINT)
    batch = ds[torch.arange(len(ds))]
    valid = ~batch["action_is_pad"]
    np.testing.assert_array_equal(batch["action"][valid].numpy(), joint_chunks(cache))
    # gripper: as stored; the state key itself is served unchanged
    plain = RobotDataset(cache, horizon=H)[torch.arange(len(ds))]
    torch.testing.assert_close(batch["action"][..., 6], plain["action"][..., 6], rtol=0, atol=0)
    torch.testing.assert_close(batch["observation.state"], plain["observation.state"])


def test_ee_chunks_equal_scipy(cache):
    pytest.importorskip("scipy")
    ds = RobotDataset(cache, horizon=H, relative_actions=EE)
    eps = episodes(cache)
    starts = np.cumsum([0] + [len(e["action"]) for e in eps])
    for i in torch.randperm(len(ds))[:25].tolist():
        e = int(np.searchsorted(starts, i, side="right") - 1)
        t = i - starts[e]
        a, s = eps[e]["action.ee"], eps[e]["observation.ee"]
        rows = a[np.minimum(np.arange(t, t + H), len(a) - 1)]
        item = ds[i]
        np.testing.assert_allclose(item["action.ee"].double().numpy(), ee_reference(rows, s[t]),
                                   rtol=1e-4, atol=1e-4)


def test_base_frame_against_a_quaternion_state(cache):
    """Base frame: rotation R R0^T, translation p - p0, with the state's pose a quaternion."""
    from robocache.ops import geometry as G

    quat = {"action.ee": {"mode": "base", "state": "observation.quat", "absolute_dims": [6],
                          "state_dims": [0, 1, 2, 3, 4, 5, 6], "state_rotation": "quat"}}
    ds = RobotDataset(cache, horizon=3, relative_actions=quat)
    got = ds[torch.arange(len(ds))]["action.ee"]
    plain = RobotDataset(cache, horizon=3)[torch.arange(len(ds))]
    a, s = plain["action.ee"].double(), plain["observation.quat"][:, -1].double()
    r = G.rotvec_to_matrix(a[..., 3:6]) @ G.quat_to_matrix(s[:, 3:7]).transpose(-1, -2)[:, None]
    torch.testing.assert_close(got[..., :3].double(), a[..., :3] - s[:, None, :3],
                               rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(G.rotvec_to_matrix(got[..., 3:6].double()), r, rtol=1e-4,
                               atol=1e-4)


def test_stats_equal_numpy(fresh):
    ref = joint_chunks(fresh).astype(np.float64)
    stats = relative_action_stats(fresh, JOINT, H, device="cpu")["action"]
    assert stats.count == len(ref) and stats.exact_quantiles
    np.testing.assert_array_equal(stats.q01.numpy(), np.quantile(ref, 0.01, axis=0,
                                                                  method="linear"))
    np.testing.assert_array_equal(stats.q99.numpy(), np.quantile(ref, 0.99, axis=0,
                                                                  method="linear"))
    np.testing.assert_allclose(stats.mean.numpy(), ref.mean(0), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(stats.std.numpy(), ref.std(0), rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(stats.min.numpy(), ref.min(0))
    np.testing.assert_array_equal(stats.max.numpy(), ref.max(0))
    assert int(stats.hist_counts.sum(1)[0]) == len(ref)


@pytest.mark.parametrize("dtype", ["float16", "float64"])
def test_stats_of_other_dtypes_equal_numpy(tmp_path, dtype):
    """float16 values: one 16-bit digit (a second pass for the histogram); float64: four."""
    (tmp_path / "src").mkdir()
    build(_Source(tmp_path / "src", 6, seed=3, dtype=dtype), tmp_path / "cache",
          rate_hz=10.0, progress=False, device="cpu")
    ds = RobotDataset(tmp_path / "cache", horizon=H, relative_actions=JOINT)
    assert ds.layout["action"].dtype == getattr(torch, dtype)
    batch = ds[torch.arange(len(ds))]
    ref = batch["action"][~batch["action_is_pad"]].double().numpy()
    stats = relative_action_stats(ds, device="cpu", store=False)["action"]
    for q, got in ((0.01, stats.q01), (0.99, stats.q99)):
        np.testing.assert_array_equal(got.numpy(), np.quantile(ref, q, axis=0))
    np.testing.assert_allclose(stats.std.numpy(), ref.std(0), rtol=1e-12)


def test_stats_same_for_any_threads_and_chunking(fresh, monkeypatch):
    from robocache.data import stats as S

    one = relative_action_stats(fresh, JOINT, H, device="cpu", threads=1, store=False)["action"]
    monkeypatch.setitem(S.CHUNK_VALUES, "cpu", 7 * H * 5)  # chunks of 5 starts
    sizes = []
    fetch = RobotDataset.fetch
    monkeypatch.setattr(RobotDataset, "fetch", lambda self, idx, frames=None: (
        sizes.append(len(idx)), fetch(self, idx, frames))[1])
    many = relative_action_stats(fresh, JOINT, H, device="cpu", threads=3, store=False)["action"]
    assert max(sizes) == 5 and sum(sizes) == 2 * len(RobotDataset(fresh))  # two passes
    for f in ("mean", "std", "q01", "q99", "hist_counts"):
        torch.testing.assert_close(getattr(many, f), getattr(one, f), rtol=1e-14, atol=0)


def test_stats_of_ee_chunks_equal_numpy_of_served_values(fresh):
    ds = RobotDataset(fresh, horizon=H, relative_actions=EE)
    batch = ds[torch.arange(len(ds))]
    ref = batch["action.ee"][~batch["action.ee_is_pad"]].double().numpy()
    stats = relative_action_stats(ds, device="cpu")["action.ee"]
    for q, got in ((0.01, stats.q01), (0.99, stats.q99)):
        np.testing.assert_array_equal(got.numpy(), np.quantile(ref, q, axis=0))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32,
                                   torch.float64])
def test_order_keys_sort_like_values(dtype):
    x = torch.cat([torch.randn(999, dtype=torch.float64) * 10 ** torch.randint(-8, 8, (999,)),
                   torch.tensor([0.0, -0.0, 1e-40, -1e-40, float("inf"), -float("inf")],
                                dtype=torch.float64)]).to(dtype)
    keys = order_keys(x)
    assert torch.equal(from_keys(keys, dtype).view(torch.uint8), x.view(torch.uint8))
    y = x[torch.argsort(keys, stable=True)].double()
    assert bool((y[1:] >= y[:-1]).all())


# --------------------------------------------------------------------------- serving

def test_item_and_batch_paths_agree(cache):
    ds = RobotDataset(cache, horizon=H, relative_actions={**JOINT, **EE})
    idx = torch.randperm(len(ds))[:17]
    batch = ds[idx]
    for j, i in enumerate(idx.tolist()):
        item = ds[i]
        for k in ("action", "action.ee", "action_is_pad"):
            torch.testing.assert_close(item[k], batch[k][j], rtol=0, atol=0)


def test_stored_stats_normalize_in_the_loader(fresh):
    stats = relative_action_stats(fresh, JOINT, H, device="cpu")["action"]
    assert len(list((fresh / RELATIVE_DIR).glob("*.json"))) == 1
    from robocache.data.owned import owned

    assert fresh / RELATIVE_DIR in owned(fresh)  # --overwrite removes them with the cache
    ds = RobotDataset(fresh, horizon=H, relative_actions=JOINT)
    torch.testing.assert_close(ds.stats["action"].q99, stats.q99, rtol=0, atol=0)
    assert ds.stats["observation.state"] is ds.absolute_stats["observation.state"]
    raw = ds[torch.arange(len(ds))]
    want = (raw["action"] - stats.mean.float()) / stats.std.float()
    for resident in (True, False):
        loader = RobotLoader(ds, batch_size=len(ds), device="cpu", shuffle=False,
                             resident=resident, normalize="mean_std")
        batch = next(iter(loader))
        torch.testing.assert_close(batch["action"], want, rtol=1e-5, atol=1e-5)
        state = ds.absolute_stats["observation.state"]
        torch.testing.assert_close(batch["observation.state"],
                                   (raw["observation.state"] - state.mean.float())
                                   / state.std.float(), rtol=1e-5, atol=1e-5)


def test_worker_processes_serve_the_same_batches(fresh):
    relative_action_stats(fresh, JOINT, H, device="cpu")
    ds = RobotDataset(fresh, horizon=H, relative_actions=JOINT)
    kwargs = {"batch_size": 16, "device": "cpu", "shuffle": False}
    want = next(iter(RobotLoader(ds, resident=False, **kwargs)))
    got = next(iter(RobotLoader(ds, num_workers=1, **kwargs)))
    torch.testing.assert_close(got["action"], want["action"], rtol=0, atol=0)


def test_pickled_dataset_serves_the_same(cache):
    """What a ``spawn`` / ``forkserver`` worker gets: the spec travels, the per-device index
    tensors do not."""
    import pickle

    ds = RobotDataset(cache, horizon=H, relative_actions={**JOINT, **EE})
    ds[0]  # (index tensors made)
    again = pickle.loads(pickle.dumps(ds))
    assert again.relative._index == {}
    for k in ("action", "action.ee"):
        torch.testing.assert_close(again[3][k], ds[3][k], rtol=0, atol=0)


def test_zero_padding_stays_zero(fresh):
    relative_action_stats(fresh, JOINT, H, device="cpu")
    ds = RobotDataset(fresh, horizon=H, relative_actions=JOINT, pad="zero")
    batch = next(iter(RobotLoader(ds, batch_size=len(ds), device="cpu", shuffle=False)))
    pad = batch["action_is_pad"]
    assert bool(pad.any()) and bool((batch["action"][pad] == 0).all())


def test_loader_takes_relative_actions(fresh):
    relative_action_stats(fresh, JOINT, H, device="cpu")
    ds = RobotDataset(fresh, horizon=H)
    loader = RobotLoader(ds, batch_size=8, device="cpu", shuffle=False, normalize=None,
                         relative_actions=JOINT)
    batch = next(iter(loader))
    want = RobotDataset(fresh, horizon=H, relative_actions=JOINT)[torch.arange(8)]
    torch.testing.assert_close(batch["action"], want["action"], rtol=0, atol=0)


def test_mixture_applies_each_source_its_own(cache):
    rel = RobotDataset(cache, horizon=H, relative_actions=JOINT,
                       keys=["observation.state", "action"])
    plain = RobotDataset(cache, horizon=H, keys=["observation.state", "action"])
    mixed = MixedDataset([rel, plain], weights=[1, 1])
    for resident in (True, False):
        loader = RobotLoader(mixed, batch_size=64, device="cpu", normalize=None,
                             resident=resident)
        batch = next(iter(loader))
        for i, d in enumerate((rel, plain)):
            rows = batch["source"] == i
            want = d[batch["index"][rows]]
            torch.testing.assert_close(batch["action"][rows], want["action"], rtol=0, atol=0)


@pytest.mark.gpu
def test_cuda_batches_and_stats_equal_the_cpu(fresh):
    """On the GPU: the same chunks (joint bit for bit, SE(3) within float32), the same exact
    quantiles, and resident batches replayed from CUDA graphs normalized as on the CPU."""
    spec = {**JOINT, **EE}
    cpu = relative_action_stats(fresh, spec, H, device="cpu", store=False)
    gpu = relative_action_stats(fresh, spec, H, device="cuda")
    for k in spec:
        for f in ("q01", "q99", "min", "max"):
            if k == "action":
                torch.testing.assert_close(getattr(gpu[k], f), getattr(cpu[k], f), rtol=0,
                                           atol=0)
        torch.testing.assert_close(gpu[k].mean, cpu[k].mean, rtol=1e-5, atol=1e-6)
    ds = RobotDataset(fresh, horizon=H, relative_actions=spec)
    idx = torch.arange(len(ds))
    want, got = ds[idx], ds.to("cuda")[idx.cuda()]
    torch.testing.assert_close(got["action"].cpu(), want["action"], rtol=0, atol=0)
    torch.testing.assert_close(got["action.ee"].cpu(), want["action.ee"], rtol=1e-5, atol=1e-5)
    ref = next(iter(RobotLoader(ds, batch_size=64, device="cpu", shuffle=False)))
    batch = next(iter(RobotLoader(ds, batch_size=64, device="cuda", shuffle=False)))
    for k in ("action", "action.ee", "observation.state"):
        torch.testing.assert_close(batch[k].cpu(), ref[k], rtol=1e-4, atol=1e-4)


# --------------------------------------------------------------------------- refusals

def test_normalizing_without_relative_stats_is_refused(cache):
    ds = RobotDataset(cache, horizon=H, relative_actions=JOINT)
    assert "action" not in ds.stats
    with pytest.raises(DataError, match=r"robocache stats .* --relative "
                                        r"action=joint:observation.state --absolute-dims "
                                        r"action=6 --horizon 6") as e:
        RobotLoader(ds, batch_size=4, device="cpu")
    assert "\n" not in str(e.value)
    with pytest.raises(DataError, match="holds its absolute statistics"):
        ds.normalized(Normalizer(RobotDataset(cache).stats))
    RobotLoader(ds, batch_size=4, device="cpu", normalize={"observation.state": "mean_std"})


def test_other_spec_or_horizon_is_not_confused(fresh):
    relative_action_stats(fresh, JOINT, H, device="cpu")
    assert "action" in RobotDataset(fresh, horizon=H, relative_actions=JOINT).stats
    other = {"action": {**JOINT["action"], "absolute_dims": [5, 6]}}
    assert "action" not in RobotDataset(fresh, horizon=H, relative_actions=other).stats
    assert "action" not in RobotDataset(fresh, horizon=H + 1, relative_actions=JOINT).stats
    stats = RobotDataset(fresh, horizon=H, relative_actions=JOINT).stats
    with pytest.raises(DataError, match="statistics of other chunks"):
        RobotDataset(fresh, horizon=H, relative_actions=other).normalized(Normalizer(stats))


def test_stats_of_a_rebuilt_cache_are_not_used(fresh):
    relative_action_stats(fresh, JOINT, H, device="cpu")
    manifest = json.loads((fresh / "manifest.json").read_text())
    manifest["created"] = "2000-01-01T00:00:00+00:00"
    (fresh / "manifest.json").write_text(json.dumps(manifest))
    assert "action" not in RobotDataset(fresh, horizon=H, relative_actions=JOINT).stats


BAD = [
    ({"action.nope": {"mode": "joint", "state": "observation.state"}}, "not a served action"),
    ({"observation.state": {"mode": "joint", "state": "action"}}, "not a served action"),
    ({"action": {"mode": "joint", "state": "observation.nope"}}, "`state` must be a served"),
    ({"action": {"mode": "joint"}}, "`state` must be a served"),
    ({"action": {"mode": "delta", "state": "observation.state"}}, "`mode` must be one of"),
    ({"action": {"mode": "joint", "state": "observation.quat"}}, "pass `state_dims`"),
    ({"action": {"mode": "joint", "state": "observation.state", "absolute_dims": [7]}},
     "distinct dimensions"),
    ({"action": {"mode": "joint", "state": "observation.state", "absolute_dims": [1, 1]}},
     "distinct dimensions"),
    ({"action": {"mode": "joint", "state": "observation.state", "absolute_dims": "6"}},
     "list of integer"),
    ({"action": {"mode": "joint", "state": "observation.state",
                 "absolute_dims": list(range(7))}}, "no dimension relative"),
    ({"action": {"mode": "joint", "state": "observation.state", "state_dims": [0, 1]}},
     "relative dimensions but `state_dims`"),
    ({"action": {"mode": "joint", "state": "observation.state", "gripper": [6]}},
     "unknown fields"),
    ({"action": "joint"}, "must be a mapping"),
    ({"action.ee": {"mode": "ee", "state": "observation.ee", "absolute_dims": [5, 6]}},
     "cannot read"),
    ({"action.ee": {"mode": "ee", "state": "observation.ee", "absolute_dims": [6],
                    "rotation": "quat"}}, "needs 7"),
    ({"action.ee": {"mode": "ee", "state": "observation.ee", "absolute_dims": [6],
                    "rotation": "euler_xyy"}}, "'euler_<order>'"),
]


@pytest.mark.parametrize("spec, message", BAD)
def test_bad_input_is_refused(cache, spec, message):
    with pytest.raises(DataError, match=message) as e:
        RobotDataset(cache, horizon=H, relative_actions=spec)
    assert "\n" not in str(e.value) and "relative_actions" in str(e.value)


def test_bad_stats_calls_are_refused(cache):
    with pytest.raises(DataError, match="`horizon` must be"):
        relative_action_stats(cache, JOINT, 0)
    with pytest.raises(DataError, match="pass `relative_actions` and `horizon`"):
        relative_action_stats(cache, JOINT)
    with pytest.raises(DataError, match="relative_actions"):
        relative_action_stats(cache, {"action": {"mode": "joint", "state": "x"}}, H)
    subset = RobotDataset(cache, horizon=H, relative_actions=JOINT, episodes=[1, 2])
    with pytest.raises(DataError, match="statistics of a subset"):
        relative_action_stats(subset, store=True, device="cpu")
    with pytest.raises(DataError, match="needs a horizon|served action key"):
        RobotDataset(cache, relative_actions=JOINT)


# --------------------------------------------------------------------------- the CLI

def test_cli(fresh):
    from robocache.cli import app

    runner = CliRunner()
    res = runner.invoke(app, ["stats", str(fresh), "--relative",
                              "action=joint:observation.state", "--absolute-dims", "action=6",
                              "--horizon", str(H), "--device", "cpu", "--json"])
    assert res.exit_code == 0, res.output
    got = json.loads(res.output)["action"]
    ref = joint_chunks(fresh).astype(np.float64)
    assert got["q01"] == np.quantile(ref, 0.01, axis=0).tolist()
    assert "action" in RobotDataset(fresh, horizon=H, relative_actions=JOINT).stats
    listed = runner.invoke(app, ["stats", str(fresh), "--json"])
    assert listed.exit_code == 0 and json.loads(listed.output)["relative"][0]["current"]
    for args, text in ((["--relative", "action=joint"], "KEY=MODE:STATE"),
                       (["--relative", "action=joint:observation.nope", "--horizon", "3"],
                        "served numeric key"),
                       (["--relative", "action=joint:observation.state"], "--horizon"),
                       (["--absolute-dims", "action=6"], "--relative")):
        res = runner.invoke(app, ["stats", str(fresh), *args])
        assert res.exit_code == 2, res.output
        assert text in res.output and res.output.count("\n") == 1


def test_extra_action_dims_listed_absolute_pair_the_rest_with_the_state_in_order():
    """An 8-D action (7 joints and a gripper) against a 7-D state: the gripper listed in
    ``absolute_dims`` is enough, the joints pair with the state's dimensions in order."""
    from robocache.data.relative import parse

    fields = {"action": (8, True, False), "observation.state": (7, True, False)}
    got = parse({"action": {"mode": "joint", "state": "observation.state",
                            "absolute_dims": [7]}}, fields, ["action"])
    assert got["action"].state_dims == tuple(range(7))
    with pytest.raises(DataError, match="pass `state_dims`"):
        parse({"action": {"mode": "joint", "state": "observation.state"}}, fields, ["action"])
