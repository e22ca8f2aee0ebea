"""robocache.normalize: statistics vs numpy/torch.quantile, merging, affine maps, kernel."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from helpers import TOL, assert_close, seeded

from robocache.errors import DataError, DTypeError, ShapeError
from robocache.kernels.normalize import affine_cuda
from robocache.ops.normalize import (
    EPS,
    Normalizer,
    Stats,
    affine_params,
    compute_stats,
    merge_stats,
    normalize,
)


def _data(rng, n, d, dtype=np.float64):
    scales = rng.uniform(0.01, 50, size=d)
    x = rng.standard_normal((n, d)) * scales + rng.uniform(-100, 100, size=d)
    return x.astype(dtype)


def _bound(s: Stats, x: np.ndarray, q: float) -> np.ndarray:
    """Documented merged-quantile bound: one bin + the order-statistic gap around the rank."""
    srt = np.sort(x, axis=0)
    h = (len(x) - 1) * q
    lo, hi = max(int(h) - 1, 0), min(int(h) + 2, len(x) - 1)
    return np.ldexp(1.0, s.hist_exponent.numpy()) + (srt[hi] - srt[lo])


@pytest.mark.parametrize("n,d", [(1, 1), (2, 3), (97, 7), (1000, 32)])
def test_one_pass_stats_equal_numpy(n, d):
    rng = seeded()
    x = _data(rng, n, d)
    s = compute_stats(torch.from_numpy(x))
    assert s.count == n and s.exact_quantiles
    assert_close(s.mean, x.mean(0))
    assert_close(s.std, x.std(0))
    assert_close(s.min, x.min(0))
    assert_close(s.max, x.max(0))
    assert_close(s.q01, np.quantile(x, 0.01, axis=0))
    assert_close(s.q99, np.quantile(x, 0.99, axis=0))
    tq = torch.quantile(torch.from_numpy(x), torch.tensor([0.01, 0.99], dtype=torch.float64),
                        dim=0)
    assert_close(s.q01, tq[0])
    assert_close(s.q99, tq[1])
    assert s.hist_counts.sum(1).tolist() == [n] * d


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_quantiles_exact_on_ties_constants_and_wide_ranges(dtype):
    """The order statistics come from the histogram's bins: exact (numpy's quantiles, bit for
    bit) where many samples share a bin or a value, a column is constant, or the range spans
    many decades; the input is left as it was."""
    rng = seeded()
    n = 20_001
    x = np.stack([rng.integers(0, 3, n).astype(dtype),             # three values, many ties
                  np.full(n, 0.25, dtype),                          # constant
                  np.zeros(n, dtype),                               # constant zero
                  (rng.normal(size=n) * 10.0 ** rng.integers(-30, 30, n)).astype(dtype),
                  rng.normal(size=n).astype(dtype)], axis=1)
    t = torch.from_numpy(x.copy())
    s = compute_stats(t)
    assert torch.equal(t, torch.from_numpy(x))
    for q, got in ((0.01, s.q01), (0.99, s.q99)):
        assert got.tolist() == np.quantile(x.astype(np.float64), q, axis=0).tolist()
    assert s.min.tolist() == x.min(0).astype(np.float64).tolist()
    assert s.max.tolist() == x.max(0).astype(np.float64).tolist()


def test_stats_of_batched_float32_and_bf16():
    rng = seeded()
    x = torch.from_numpy(_data(rng, 5 * 13, 4, np.float32)).reshape(5, 13, 4)
    s = compute_stats(x)
    flat = x.reshape(-1, 4).double().numpy()
    assert_close(s.mean, flat.mean(0))
    assert_close(s.q99, np.quantile(flat, 0.99, axis=0))
    xb = x.bfloat16()
    sb = compute_stats(xb)
    assert_close(sb.max, xb.reshape(-1, 4).double().amax(0))


@pytest.mark.parametrize("chunks", [2, 7, 31])
def test_merged_stats_equal_one_pass(chunks):
    rng = seeded()
    x = _data(rng, 3001, 6)
    one = compute_stats(torch.from_numpy(x))
    parts = [compute_stats(torch.from_numpy(c)) for c in np.array_split(x, chunks)]
    merged = merge_stats(parts)
    assert merged.count == one.count and not merged.exact_quantiles
    assert_close(merged.mean, one.mean)
    assert_close(merged.std, one.std)
    assert torch.equal(merged.min, one.min) and torch.equal(merged.max, one.max)
    for q, name in ((0.01, "q01"), (0.99, "q99")):
        err = (getattr(merged, name) - getattr(one, name)).abs().numpy()
        assert (err <= _bound(merged, x, q)).all(), (err, _bound(merged, x, q))
    # Sequential pairwise merging in another order gives the same histogram: re-binning is exact.
    seq = parts[-1]
    for p in reversed(parts[:-1]):
        seq = seq.merge(p)
    assert torch.equal(seq.hist_counts, merged.hist_counts)
    assert torch.equal(seq.q01, merged.q01)
    assert merged.hist_counts.sum(1).tolist() == [3001] * 6


def test_histogram_quantiles_do_not_depend_on_the_split():
    rng = seeded()
    x = _data(rng, 4000, 5)
    x[:, 2] = np.round(x[:, 2])  # ties
    one = compute_stats(torch.from_numpy(x), exact_quantiles=False)
    assert not one.exact_quantiles
    exact = compute_stats(torch.from_numpy(x))
    assert torch.equal(one.hist_counts, exact.hist_counts) and torch.equal(one.mean, exact.mean)
    for q, name in ((0.01, "q01"), (0.99, "q99")):
        err = (getattr(one, name) - getattr(exact, name)).abs().numpy()
        assert (err <= _bound(one, x, q)).all()
    for cuts in ([1], [1000, 1001, 3999], list(range(0, 4000, 333))[1:]):
        merged = merge_stats([compute_stats(torch.from_numpy(c), exact_quantiles=False)
                              for c in np.split(x, cuts)])
        assert torch.equal(merged.q01, one.q01) and torch.equal(merged.q99, one.q99)
        assert torch.equal(merged.hist_counts, one.hist_counts)


def test_moments_across_cpu_blocks_match_numpy(monkeypatch):
    import robocache.reference.normalize as ref

    rng = seeded()
    x = _data(rng, 1000, 3) * 1e3 + 1e6  # far from 0: a one-pass variance would lose digits
    monkeypatch.setattr(ref, "STATS_BLOCK", 64)  # 16 blocks, the last one short
    s = compute_stats(torch.from_numpy(x))
    np.testing.assert_allclose(s.mean.numpy(), x.mean(0), rtol=1e-14)
    np.testing.assert_allclose(s.std.numpy(), x.std(0), rtol=1e-10)
    np.testing.assert_array_equal(s.q01.numpy(), np.quantile(x, 0.01, axis=0))
    assert s.hist_counts.sum(1).tolist() == [1000] * 3


def test_merge_shifted_ranges_and_constant_dims():
    rng = seeded()
    a = rng.uniform(0, 1e-3, (200, 2))
    b = rng.uniform(1e3, 2e3, (300, 2))
    a[:, 1] = 4.0
    b[:, 1] = 4.0
    x = np.concatenate([a, b])
    merged = merge_stats([compute_stats(torch.from_numpy(a)), compute_stats(torch.from_numpy(b))])
    assert (np.abs(merged.q99.numpy() - np.quantile(x, 0.99, axis=0))
            <= _bound(merged, x, 0.99)).all()
    assert merged.q01[1] == 4.0 and merged.std[1] == 0.0


def test_stats_json_roundtrip():
    s = merge_stats([compute_stats(torch.randn(50, 3)), compute_stats(torch.randn(20, 3) + 1)])
    back = Stats.from_dict(json.loads(json.dumps(s.to_dict())))
    for k in ("mean", "std", "min", "max", "q01", "q99", "hist_counts", "hist_exponent"):
        assert torch.equal(getattr(back, k), getattr(s, k)), k
    assert back.count == s.count and back.exact_quantiles == s.exact_quantiles


@pytest.mark.parametrize("mode", ["mean_std", "min_max", "quantile", "identity"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.float64])
def test_normalize_modes_against_float64_formula(mode, dtype):
    rng = seeded()
    x = _data(rng, 57, 5) / 50
    s = compute_stats(torch.from_numpy(x))
    xt = torch.from_numpy(x).to(dtype)
    y = normalize(xt, s, mode)
    xd = xt.double().numpy()
    if mode == "mean_std":
        exp = (xd - x.mean(0)) / x.std(0)
    elif mode == "min_max":
        exp = (xd - x.min(0)) / (x.max(0) - x.min(0)) * 2 - 1
    elif mode == "quantile":
        q1, q9 = np.quantile(x, [0.01, 0.99], axis=0)
        exp = np.clip((xd - q1) / (q9 - q1) * 2 - 1, -1, 1)
    else:
        exp = xd
    assert y.dtype == dtype and y.shape == xt.shape
    assert_close(y, exp, scale=10)
    if mode != "quantile":
        assert_close(normalize(y, s, mode, inverse=True), xd, scale=200)
    if mode == "min_max":
        # the input's rounding to `dtype` (stats are float64) moves the ends: by up to
        # 2 * rounding / range, plus a few output ulps
        slack = 2 * np.abs(xd - x).max(0) / (x.max(0) - x.min(0)) + 8 * torch.finfo(dtype).eps
        yf = y.float().numpy()
        assert np.all(yf.min(0) >= -1 - slack) and np.all(yf.max(0) <= 1 + slack)


def test_zero_variance_is_centred_not_divided():
    x = torch.full((10, 2), 3.0)
    x[:, 1] = torch.arange(10.0)
    s = compute_stats(x)
    for mode in ("mean_std", "min_max", "quantile"):
        y = normalize(x, s, mode)
        assert torch.equal(y[:, 0], torch.zeros(10)), mode
        assert torch.isfinite(y).all()
        assert torch.equal(normalize(y, s, mode, inverse=True)[:, 0], x[:, 0])
    o, sc, _ = affine_params(s, "mean_std", eps=EPS)
    assert sc[0] == 1.0 and o[0] == 3.0


def test_normalizer_per_key_forward_inverse():
    rng = seeded()
    a, st = torch.from_numpy(_data(rng, 40, 7)), torch.from_numpy(_data(rng, 40, 3))
    stats = {"action": compute_stats(a), "state": compute_stats(st)}
    norm = Normalizer(stats, {"action": "min_max", "state": "mean_std"})
    batch = {"action": a, "state": st, "other": torch.ones(2)}
    out = norm(batch)
    assert out["other"] is batch["other"] and batch["action"] is a
    assert_close(out["action"], normalize(a, stats["action"], "min_max"))
    assert_close(out["state"], normalize(st, stats["state"], "mean_std"))
    back = norm.inverse({"action": out["action"]})
    assert_close(back["action"], a.numpy())


def test_normalize_out_poisoned():
    x = torch.randn(9, 4)
    s = compute_stats(x)
    out = torch.full_like(x, float("nan"))
    res = normalize(x, s, "mean_std", out=out)
    assert res is out
    assert_close(out, normalize(x, s, "mean_std"))


@pytest.mark.parametrize("shape", [(1, 1), (33, 5), (130, 129)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("mode,inverse", [("quantile", False), ("mean_std", True)])
def test_affine_kernel_matches_reference(kernel_device, shape, dtype, mode, inverse):
    x = (torch.randn(shape, dtype=torch.float64) * 3).to(dtype)
    s = compute_stats(x)
    acc = torch.float64 if dtype == torch.float64 else torch.float32
    o, sc, clip = affine_params(s, mode)
    xd = x.to(kernel_device)
    out = torch.full_like(xd, float("nan"))
    affine_cuda(xd, o.to(kernel_device, acc), sc.to(kernel_device, acc), clip, inverse, out)
    exp = x.double().numpy()
    exp = exp / sc.numpy() + o.numpy() if inverse else np.clip(
        (exp - o.numpy()) * sc.numpy(), -1, 1)
    rtol, atol = TOL[dtype]
    torch.testing.assert_close(out.cpu().double(), torch.from_numpy(exp), rtol=rtol,
                               atol=atol * 10)


def test_affine_custom_op_registration(kernel_device):
    x = torch.randn(7, 5, device=kernel_device)
    o, sc, clip = affine_params(compute_stats(x), "quantile")
    args = (x, o.float().to(kernel_device), sc.float().to(kernel_device), clip, False)
    torch.library.opcheck(torch.ops.robocache.normalize_affine, args)


@pytest.mark.gpu
def test_normalize_cuda_and_compile():
    x = torch.randn(1000, 32, device="cuda")
    s = compute_stats(x)
    norm = Normalizer({"a": s}, "quantile")
    y = norm({"a": x})["a"]
    assert_close(y, normalize(x.cpu(), s, "quantile"))
    f = torch.compile(lambda t: normalize(t, s, "quantile"), fullgraph=True)
    assert_close(f(x), y.cpu())


def test_compute_stats_rejects_bad_input():
    with pytest.raises(DTypeError, match="`x` must have dtype"):
        compute_stats(torch.arange(6).reshape(3, 2))
    with pytest.raises(ShapeError, match="at least one row"):
        compute_stats(torch.empty(0, 3))
    with pytest.raises(ValueError, match="`bins` must be >= 2"):
        compute_stats(torch.randn(4, 2), bins=1)
    bad = torch.randn(5, 2)
    bad[3, 1] = float("nan")
    with pytest.raises(DataError, match="row 3"):
        compute_stats(bad)


def test_merge_rejects_mismatched_parts():
    with pytest.raises(ValueError, match="empty"):
        merge_stats([])
    with pytest.raises(ShapeError, match="part 1 has D = 3"):
        merge_stats([compute_stats(torch.randn(4, 2)), compute_stats(torch.randn(4, 3))])
    with pytest.raises(ShapeError, match="bins"):
        merge_stats([compute_stats(torch.randn(4, 2)),
                     compute_stats(torch.randn(4, 2), bins=64)])


def test_normalize_rejects_bad_input():
    s = compute_stats(torch.randn(8, 3))
    with pytest.raises(ShapeError, match=r"D = 3 \(the statistics' width\)"):
        normalize(torch.randn(8, 4), s)
    with pytest.raises(ValueError, match="`mode` must be one of"):
        normalize(torch.randn(8, 3), s, "zscore")
    with pytest.raises(ValueError, match="`eps` must be >= 0"):
        normalize(torch.randn(8, 3), s, eps=-1.0)
    with pytest.raises(DTypeError):
        normalize(torch.ones(8, 3, dtype=torch.int32), s)
    with pytest.raises(ShapeError, match="`out` must match"):
        normalize(torch.randn(8, 3), s, out=torch.empty(8, 3, dtype=torch.float64))
    norm = Normalizer({"a": s})
    with pytest.raises(ShapeError, match=r"batch\['a'\]"):
        norm({"a": torch.randn(2, 5)})
    with pytest.raises(ValueError, match="without statistics"):
        Normalizer({"a": s}, {"b": "min_max"})


def test_parameters_are_derived_once_per_device_and_not_pickled():
    """`normalize` keeps what it derives from a Stats on it (per mode, eps, device, dtype):
    a second call reuses the same parameter tensors; a pickled Stats travels without them."""
    import pickle

    s = compute_stats(torch.randn(200, 4))
    x = torch.randn(8, 4)
    first = normalize(x, s, "min_max")
    cached = dict(s._derived)
    assert len(cached) == 1
    torch.testing.assert_close(normalize(x, s, "min_max"), first, rtol=0, atol=0)
    assert all(a is b for a, b in zip(next(iter(s._derived.values())),
                                      next(iter(cached.values())), strict=True))
    normalize(x.double(), s, "min_max")
    normalize(x, s, "quantile", eps=1e-3)
    assert len(s._derived) == 3
    copy = pickle.loads(pickle.dumps(s))
    assert len(copy._derived) == 0 and torch.equal(copy.q99, s.q99)
    torch.testing.assert_close(normalize(x, copy, "min_max"), first, rtol=0, atol=0)
    with pytest.raises(ValueError, match="mode"):
        normalize(x, s, "minmax")
