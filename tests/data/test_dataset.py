"""RobotDataset windows vs a plain-Python reference; RobotLoader with workers; mixing."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from data_episodes import SPECS, make_episode

from robocache.data import MixedDataset, RobotDataset, RobotLoader
from robocache.data.cache import build
from robocache.data.episode import StreamSpec
from robocache.data.formats.lerobot import write_lerobot
from robocache.errors import DataError


@pytest.fixture
def cache(tmp_path, episodes):
    write_lerobot(tmp_path / "src", episodes, SPECS, fps=25.0)
    build(tmp_path / "src", tmp_path / "cache", rate_hz=20.0, progress=False, device="cpu",
          camera_codec="png")
    return tmp_path / "cache"


def reference_rows(cache):
    """Per episode: steps of state/action/frame index, read straight from Lance."""
    import lance

    table = lance.dataset(str(cache / "data.lance")).to_table().to_pylist()
    table.sort(key=lambda r: (r["episode_index"], r["step"]))
    return table


@pytest.mark.parametrize("history, horizon", [(1, 0), (2, 5), (3, 1), (4, 50)])
def test_windows_match_python_reference(cache, history, horizon):
    ds = RobotDataset(cache, history=history, horizon=horizon,
                      keys=["observation.state", "action", "observation.images.cam"])
    rows = reference_rows(cache)
    assert len(ds) == len(rows)
    idx = torch.randperm(len(ds))[:37]
    batch = ds[idx]
    for b, i in enumerate(idx.tolist()):
        ep = rows[i]["episode_index"]
        lo = min(j for j, r in enumerate(rows) if r["episode_index"] == ep)
        hi = max(j for j, r in enumerate(rows) if r["episode_index"] == ep)
        for k, off in enumerate(range(-(history - 1), 1)):
            j = min(max(i + off, lo), hi)
            np.testing.assert_allclose(batch["observation.state"][b, k].numpy(),
                                       rows[j]["observation/state"], rtol=0, atol=0)
            assert bool(batch["observation.state_is_pad"][b, k]) == (i + off < lo)
            assert bool(batch["observation.images.cam_is_pad"][b, k]) == (
                i + off < lo or rows[j]["observation/images/cam_is_pad"])
        for k in range(horizon):
            j = min(i + k, hi)
            np.testing.assert_allclose(batch["action"][b, k].numpy(), rows[j]["action"])
            assert bool(batch["action_is_pad"][b, k]) == (i + k > hi)
        assert int(batch["episode_index"][b]) == ep
        assert float(batch["timestamp"][b]) == rows[i]["timestamp"]
    if horizon == 0:  # action keys are then served like observations
        assert batch["action"].shape == (37, history, 2)
    assert batch["observation.images.cam"].shape == (37, history, 3, 4, 5)
    assert batch["observation.images.cam"].dtype == torch.float32
    one = ds[int(idx[0])]
    torch.testing.assert_close(one["observation.state"], batch["observation.state"][0])


def test_image_frames_are_the_aligned_source_frames(tmp_path, cache, episodes):
    ds = RobotDataset(cache, keys=["observation.images.cam"], image_dtype=torch.uint8)
    rows = reference_rows(cache)
    by_ep = {e.index: e for e in episodes}
    for i in torch.randperm(len(ds))[:20].tolist():
        r = rows[i]
        item = ds[i]
        if r["observation/images/cam_is_pad"]:
            continue
        want = by_ep[r["episode_index"]].streams["observation.images.cam"].data[
            r["observation/images/cam/frame"]]
        np.testing.assert_array_equal(item["observation.images.cam"][0].numpy(),
                                      want.transpose(2, 0, 1))


@pytest.mark.parametrize("workers", [0, 2])
def test_loader_batches_normalized_and_same_with_workers(cache, workers):
    ds = RobotDataset(cache, history=2, horizon=4, keys=["observation.state", "action"])
    plain = list(RobotLoader(ds, 16, device="cpu", seed=7, normalize=None))
    loader = RobotLoader(ds, 16, device="cpu", seed=7, num_workers=workers,
                         normalize="mean_std")
    assert len(loader) == len(ds) // 16 == len(plain)
    stats = json.loads((cache / "stats.json").read_text())["action"]
    mean, std = torch.tensor(stats["mean"]), torch.tensor(stats["std"])
    seen = []
    for got, raw in zip(loader, plain, strict=True):
        torch.testing.assert_close(got["index"], raw["index"])
        torch.testing.assert_close(got["action"], ((raw["action"].double() - mean) / std).float(),
                                   rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(got["action_is_pad"], raw["action_is_pad"])
        seen.append(got["index"])
    seen = torch.cat(seen)
    assert len(torch.unique(seen)) == len(seen)  # an epoch is a permutation


def test_mixed_caches_weighted_and_padded(tmp_path, rng, cache):
    wide = {**SPECS, "action": StreamSpec("action", "numeric", "float32", (5,), 25.0)}
    eps = [make_episode(i, rng) for i in range(3)]
    for e in eps:
        s = e.streams["action"]
        s.spec = wide["action"]
        s.data = rng.normal(size=(len(s), 5)).astype(np.float32)
    write_lerobot(tmp_path / "src2", eps, wide, fps=25.0)
    build(tmp_path / "src2", tmp_path / "cache2", rate_hz=10.0, progress=False, device="cpu")
    keys = ["observation.state", "action"]
    a = RobotDataset(cache, history=1, horizon=3, keys=keys)
    b = RobotDataset(tmp_path / "cache2", history=1, horizon=3, keys=keys)
    mixed = MixedDataset([a, b], weights=[1.0, 3.0])
    loader = RobotLoader(mixed, 64, device="cpu", normalize=None, seed=1)
    sources = []
    for batch in loader:
        assert batch["action"].shape == (64, 3, 5)
        from_a = batch["source"] == 0
        assert torch.all(batch["action"][from_a][..., 2:] == 0)
        sources.append(batch["source"])
    share_b = torch.cat(sources).float().mean().item()
    assert 0.6 < share_b < 0.9  # expected 0.75
    only_a = RobotLoader(MixedDataset([a, b], weights=[1.0, 0.0]), 32, device="cpu", seed=2)
    assert all(int(x["source"].max()) == 0 for x in only_a)
    with pytest.raises(DataError, match="an action in one dataset"):
        MixedDataset([a, RobotDataset(cache, history=1, horizon=3, keys=keys, action_keys=[])])
    with pytest.raises(DataError, match="weights"):
        MixedDataset([a, b], weights=[1.0, -1.0])


def test_dataset_validation(tmp_path, cache):
    with pytest.raises(FileNotFoundError, match="ingest"):
        RobotDataset(tmp_path / "nowhere")
    with pytest.raises(DataError, match="servable"):
        RobotDataset(cache, keys=["language.note"])
    with pytest.raises(DataError, match="history"):
        RobotDataset(cache, history=0)
    with pytest.raises(DataError, match="action_keys"):
        RobotDataset(cache, keys=["observation.state"], action_keys=["action"], horizon=2)
    with pytest.raises(DataError, match="batch_size"):
        RobotLoader(RobotDataset(cache), 0, device="cpu")
    with pytest.raises(IndexError):
        RobotDataset(cache)[10**6]


@pytest.mark.gpu
@pytest.mark.parametrize("mode", [{"cuda_graph": True}, {"cuda_graph": False},
                                  {"num_workers": 2}])
def test_cuda_loader_matches_cpu(cache, mode):
    ds = RobotDataset(cache, history=2, horizon=4)
    want = list(RobotLoader(ds, 16, device="cpu", seed=3))
    loader = RobotLoader(ds, 16, device="cuda", seed=3, **mode)
    got = []
    for batch in loader:
        # a slow consumer (GPU busy, host runs ahead): later batches must not overwrite this
        # one before the main stream has copied it (graph buffers are reused)
        torch.cuda._sleep(2_000_000)
        got.append({k: v.clone() for k, v in batch.items()})
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        for key in w:
            torch.testing.assert_close(g[key].cpu(), w[key], rtol=1e-5, atol=1e-5)


def test_normalized_copy_equals_normalizing_batches(cache):
    from robocache.ops.normalize import Normalizer

    ds = RobotDataset(cache, history=3, horizon=4)
    norm = Normalizer(ds.stats, "quantile")
    idx = torch.randperm(len(ds))[:29]
    want = norm(ds[idx])
    got = ds.normalized(norm)[idx]
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(ds[idx]["action"], RobotDataset(cache, horizon=4)[idx]["action"])


def test_per_key_delta_timestamps(tmp_path, rng):
    """Per-key offsets in seconds at the native rate: windows equal the cached rows, dtypes
    kept, keys without offsets served at the current step only."""
    from test_native import SPECS as NATIVE_SPECS
    from test_native import episode

    write_lerobot(tmp_path / "src", [episode(i, n, rng) for i, n in enumerate((9, 4, 13))],
                  NATIVE_SPECS, fps=30.0)
    build(tmp_path / "src", tmp_path / "c", progress=False, device="cpu")
    deltas = {"observation.state": [-2 / 30, 0.0], "mode": [-1 / 30, 0.0, 3 / 30]}
    ds = RobotDataset(tmp_path / "c", delta_timestamps=deltas)
    plain = RobotDataset(tmp_path / "c")  # every key at the current step, [1, D]
    batch = ds[torch.arange(len(ds))]
    assert batch["mode"].dtype == torch.int64 and batch["contact"].dtype == torch.bool
    assert batch["observation.state"].shape == (26, 2, 3) and batch["contact"].shape == (26, 2)
    offsets = ds.offsets.tolist()
    for i in range(len(ds)):
        e = max(j for j in range(3) if offsets[j] <= i)
        lo, hi = offsets[e], offsets[e + 1] - 1
        for key, steps in (("observation.state", [-2, 0]), ("mode", [-1, 0, 3])):
            rows = [min(max(i + s, lo), hi) for s in steps]
            want = torch.stack([plain[r][key][0] for r in rows])
            assert torch.equal(batch[key][i], want)
            assert batch[f"{key}_is_pad"][i].tolist() == [not lo <= i + s <= hi for s in steps]
        assert torch.equal(batch["contact"][i], plain[i]["contact"][0])


def test_delta_timestamps_validation(tmp_path, rng):
    from test_native import SPECS as NATIVE_SPECS
    from test_native import episode

    write_lerobot(tmp_path / "src", [episode(0, 9, rng)], NATIVE_SPECS, fps=30.0)
    build(tmp_path / "src", tmp_path / "c", progress=False, device="cpu")
    with pytest.raises(DataError, match=r"'mode'.*0\.05.*0\.0333.*0\.0666"):
        RobotDataset(tmp_path / "c", delta_timestamps={"mode": [0.0, 0.05]})
    with pytest.raises(DataError, match="'nope'.*served keys"):
        RobotDataset(tmp_path / "c", delta_timestamps={"nope": [0.0]})
    with pytest.raises(DataError, match=r"delta_timestamps\['mode'\]` is empty"):
        RobotDataset(tmp_path / "c", delta_timestamps={"mode": []})
    for tol in (0.0, -1e-4):
        with pytest.raises(DataError, match="tolerance_s"):
            RobotDataset(tmp_path / "c", delta_timestamps={"mode": [0.0]}, tolerance_s=tol)
    # within the tolerance: 1/30 written as 0.0333 is one step
    ds = RobotDataset(tmp_path / "c", delta_timestamps={"mode": [0.03333]}, tolerance_s=1e-4)
    assert ds.deltas["mode"] == [1]


def test_key_values_from_an_unaligned_slice():
    # key_windows' CUDA outputs are views of one buffer: an int64 key may start 4 bytes off
    from robocache.data.dataset import _Key
    from robocache.data.served import _words

    v = torch.arange(-3, 3, dtype=torch.int64).reshape(3, 2)
    buf = torch.cat([torch.zeros(3, dtype=torch.int32),
                     torch.from_numpy(_words(v.numpy())).flatten()])
    w = buf[3:].view(3, 4)
    assert w.storage_offset() * 4 % 8
    assert torch.equal(_Key(0, 4, torch.int64, 2, None).values(w), v)
