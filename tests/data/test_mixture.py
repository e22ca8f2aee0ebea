"""Weighted mixtures of caches: sampling frequencies, per-source stats, masks, ranks, resume."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from robocache.data import MixedDataset, RobotDataset, RobotLoader
from robocache.data.cache import build
from robocache.data.episode import Episode, Stream, StreamSpec
from robocache.data.formats.lerobot import write_lerobot
from robocache.data.loader import _Sampler
from robocache.errors import DataError

# name: (state dim, action dim, rate Hz, camera)
ROBOTS = {"arm": (3, 2, 10.0, True), "mobile": (6, 4, 5.0, False), "hand": (2, 7, 20.0, False)}
CAM = (4, 5, 3)


def robot_episodes(state: int, action: int, fps: float, camera: bool, seed: int):
    rng = np.random.default_rng(seed)
    specs = {"observation.state": StreamSpec("observation.state", "numeric", "float32",
                                             (state,), fps),
             "action": StreamSpec("action", "numeric", "float32", (action,), fps)}
    if camera:
        specs["observation.images.cam"] = StreamSpec("observation.images.cam", "image", "uint8",
                                                     CAM, fps)
    eps = []
    for i in range(3):
        n = int(rng.integers(8, 14))
        t = np.arange(n) / fps
        data = {"observation.state": rng.normal(3.0 * seed, 1 + seed, (n, state)),
                "action": rng.normal(-seed, 0.5, (n, action)),
                "observation.images.cam": rng.integers(0, 255, (n, *CAM))}
        eps.append(Episode(i, {k: Stream(s, t, data[k].astype(s.dtype)) for k, s in specs.items()},
                           {"tasks": ["move"]}))
    return eps, specs


@pytest.fixture(scope="module")
def caches(tmp_path_factory):
    root = tmp_path_factory.mktemp("mixture")
    out = {}
    for seed, (name, (state, action, fps, camera)) in enumerate(ROBOTS.items()):
        eps, specs = robot_episodes(state, action, fps, camera, seed)
        write_lerobot(root / f"{name}-src", eps, specs, fps=fps)
        # PNG frames: CUDA and CPU batches then decode to the same pixels (JPEG decoders
        # differ by a level)
        build(root / f"{name}-src", root / name, rate_hz=fps, progress=False, device="cpu",
              camera_codec="png")
        out[name] = root / name
    return out


def datasets(caches, **kw):
    return [RobotDataset(c, history=2, horizon=3, **kw) for c in caches.values()]


def test_sampling_frequencies_match_weights(caches):
    from scipy.stats import chisquare

    weights = [1.0, 2.0, 5.0]
    mixed = MixedDataset(datasets(caches), weights=weights)
    assert mixed.names == list(ROBOTS)
    sampler = _Sampler(mixed, 256, True, True, seed=4)
    counts = np.zeros(3)
    for b in range(40):
        for i, idx in sampler.mixed_batch(b):
            counts[i] += len(idx)
            assert int(idx.max()) < len(mixed.datasets[i])
    expected = np.array(weights) / sum(weights) * counts.sum()
    assert chisquare(counts, expected).pvalue > 1e-3
    sizes = np.array([len(d) for d in mixed.datasets], float)
    tempered = MixedDataset(mixed.datasets, temperature=0.5).weights.numpy()
    np.testing.assert_allclose(tempered, sizes ** 0.5 / (sizes ** 0.5).sum())
    np.testing.assert_allclose(MixedDataset(mixed.datasets, temperature=0).weights.numpy(),
                               [1 / 3] * 3)


def test_each_source_normalized_with_its_own_stats_and_masked(caches):
    raw = datasets(caches)
    mixed = MixedDataset(raw, weights=[1.0, 1.0, 1.0])
    loader = RobotLoader(mixed, 48, device="cpu", seed=1)
    seen = set()
    for batch in loader:
        assert batch["observation.state"].shape == (48, 2, 6)
        assert batch["action"].shape == (48, 3, 7)
        assert batch["observation.images.cam"].shape == (48, 2, CAM[2], CAM[0], CAM[1])
        for i, d in enumerate(raw):
            rows = batch["source"] == i
            if not rows.any():
                continue
            seen.add(i)
            want = d.fetch(batch["index"][rows])
            for key in ("observation.state", "action"):
                width = d.describe()["dims"][key]
                st = d.stats[key]
                norm = ((want[key] - st.mean) / st.std.clamp_min(1e-8)).float()
                torch.testing.assert_close(batch[key][rows][..., :width], norm, atol=1e-4,
                                           rtol=1e-4)
                assert torch.all(batch[key][rows][..., width:] == 0)
                mask = batch[f"{key}_dim_mask"][rows]
                assert mask[:, :width].all() and not mask[:, width:].any()
            cam = batch["observation.images.cam"][rows]
            if "observation.images.cam" in d.keys:
                torch.testing.assert_close(cam, want["observation.images.cam"])
            else:  # a camera this robot lacks: zeros, padded
                assert not cam.any() and batch["observation.images.cam_is_pad"][rows].all()
    assert seen == {0, 1, 2}


def test_resume_and_ranks(caches):
    mixed = MixedDataset(datasets(caches), weights=[1.0, 2.0, 3.0])

    def run(loader, batches):
        out = []
        while len(out) < batches:
            for batch in loader:
                out.append((batch.get("source", torch.zeros(0)).clone(), batch["index"].clone()))
                if len(out) == batches:
                    break
        return out

    for data in (mixed, mixed.datasets[1]):
        full = run(RobotLoader(data, 8, device="cpu", seed=9, normalize=None), 7)
        first = RobotLoader(data, 8, device="cpu", seed=9, normalize=None)
        head = run(first, 4)
        state = first.state_dict()
        again = RobotLoader(data, 8, device="cpu", seed=9, normalize=None)
        again.load_state_dict(state)
        tail = run(again, 3)
        for (s1, i1), (s2, i2) in zip(full, head + tail, strict=True):
            assert torch.equal(s1, s2) and torch.equal(i1, i2)
        with pytest.raises(DataError, match="seed=9"):
            RobotLoader(data, 8, device="cpu", seed=1).load_state_dict(state)
    # ranks: disjoint shares of one sequence
    one = mixed.datasets[0]
    epoch = [torch.cat([b["index"] for b in RobotLoader(one, 4, device="cpu", seed=3,
                                                        rank=r, world_size=2)])
             for r in range(2)]
    assert not set(epoch[0].tolist()) & set(epoch[1].tolist())
    whole = _Sampler(mixed, 16, True, True, seed=5).mixed_batch(0)
    parts = [_Sampler(mixed, 8, True, True, seed=5, rank=r, world_size=2).mixed_batch(0)
             for r in range(2)]
    count = lambda p: sorted((i, len(x)) for i, x in p)  # noqa: E731
    merged = {}
    for p in parts:
        for i, x in p:
            merged[i] = merged.get(i, 0) + len(x)
    assert sorted(merged.items()) == count(whole)


@pytest.mark.parametrize("weights,match", [([1.0, -1.0, 1.0], "non-negative"),
                                           ([0.0, 0.0, 0.0], "positive sum"),
                                           ([1.0, 1.0], "must be 3"),
                                           ([1.0, float("nan"), 1.0], "finite")])
def test_bad_weights(caches, weights, match):
    with pytest.raises(DataError, match=match):
        MixedDataset(datasets(caches), weights=weights)


def test_bad_mixtures(caches):
    ds = datasets(caches)
    with pytest.raises(DataError, match="temperature"):
        MixedDataset(ds, temperature=-1.0)
    with pytest.raises(DataError, match="same `history`"):
        MixedDataset([ds[0], RobotDataset(caches["hand"], history=1, horizon=3)])
    with pytest.raises(DataError, match="`rank`"):
        RobotLoader(ds[0], 4, device="cpu", rank=2, world_size=2)


def _assert_same_batches(got, want):
    assert len(got) == len(want) > 0
    for g, w in zip(got, want, strict=True):
        assert sorted(g) == sorted(w)
        for key in w:
            torch.testing.assert_close(g[key].cpu(), w[key], rtol=1e-5, atol=1e-5)


def test_packed_and_merged_paths_agree(caches):
    """Resident (sources stacked into one packed cache) == workers-style (per-source gather,
    then merge)."""
    mixed = MixedDataset(datasets(caches), weights=[2.0, 1.0, 1.0])
    want = list(RobotLoader(mixed, 32, device="cpu", seed=6, resident=False))
    _assert_same_batches(list(RobotLoader(mixed, 32, device="cpu", seed=6)), want)


@pytest.mark.gpu
@pytest.mark.parametrize("mode", [{"cuda_graph": True}, {"cuda_graph": False},
                                  {"num_workers": 2}])
def test_cuda_mixture_matches_cpu(caches, mode):
    mixed = MixedDataset(datasets(caches), weights=[2.0, 1.0, 1.0])
    want = list(RobotLoader(mixed, 32, device="cpu", seed=6))
    got = []
    for batch in RobotLoader(mixed, 32, device="cuda", seed=6, **mode):
        torch.cuda._sleep(2_000_000)  # a slow consumer: graph buffers must not be reused early
        got.append({k: v.clone() for k, v in batch.items()})
    _assert_same_batches(got, want)
