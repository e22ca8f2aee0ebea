"""robocache.resample against numpy.interp / scipy.interpolate.interp1d (float64 oracles), the
Triton kernel against the reference (interpreter on CPU, real kernel on CUDA), properties,
and every validation rule."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import scipy.interpolate as si
import torch
from helpers import TOL, assert_close, seeded
from hypothesis import given, settings
from hypothesis import strategies as st

import robocache
from robocache.errors import DataError, DeviceError, DTypeError, ShapeError
from robocache.kernels import interp as K

METHODS = ("linear", "nearest", "previous")


def _times(rng, B, S, *, epoch=False):
    """Irregular strictly increasing timestamps [B, S] (float64)."""
    steps = rng.uniform(0.2, 1.8, size=(B, S)) * (1e-3 if epoch else 1.0 / max(S, 1))
    t = np.cumsum(steps, axis=1)
    return t + (1.7e9 if epoch else rng.uniform(-1, 1, size=(B, 1)))


def _oracle(method, t, y, x):
    """numpy/scipy float64 oracle for one row, clamped outside like numpy.interp."""
    if method == "linear":
        return np.stack([np.interp(x, t, y[:, d]) for d in range(y.shape[1])], axis=1)
    if len(t) == 1:
        return np.repeat(y[:1], len(x), axis=0)
    xc = np.clip(x, t[0], t[-1])
    return si.interp1d(t, y, kind=method, axis=0)(xc)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("S,T,D", [(1, 5, 3), (2, 7, 1), (3, 4, 7), (257, 100, 64), (40, 300, 3)])
def test_matches_numpy_scipy(method, S, T, D):
    rng = seeded()
    B = 3
    t = _times(rng, B, S)
    x = rng.uniform(t[:, :1] - 0.3, t[:, -1:] + 0.3, size=(B, T))
    y = rng.standard_normal((B, S, D))
    got = robocache.resample(torch.tensor(y, dtype=torch.float32), torch.tensor(t),
                             torch.tensor(x), method=method)
    for b in range(B):
        assert_close(got[b], _oracle(method, t[b], y[b], x[b]), torch.float32)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_dtypes(dtype):
    rng = seeded()
    t = _times(rng, 2, 50)
    x = rng.uniform(t[:, :1], t[:, -1:], size=(2, 33))
    y = rng.standard_normal((2, 50, 5))
    yq = torch.tensor(y).to(dtype)
    got = robocache.resample(yq, torch.tensor(t), torch.tensor(x))
    assert got.dtype == dtype
    ref = [_oracle("linear", t[b], yq[b].double().numpy(), x[b]) for b in range(2)]
    assert_close(got, np.stack(ref), dtype)


def test_lengths_never_read_nan_padding():
    rng = seeded()
    B, S, D, T = 4, 30, 6, 25
    lengths = np.array([30, 1, 2, 17])
    t = _times(rng, B, S)
    y = rng.standard_normal((B, S, D))
    for b, n in enumerate(lengths):
        t[b, n:] = np.nan
        y[b, n:] = np.nan
    x = rng.uniform(-1.5, 1.5, size=(B, T))
    for method in METHODS:
        got, pad = robocache.resample(torch.tensor(y), torch.tensor(t), torch.tensor(x),
                                      lengths=torch.tensor(lengths), method=method,
                                      return_mask=True)
        assert not torch.isnan(got).any()
        for b, n in enumerate(lengths):
            assert_close(got[b], _oracle(method, t[b, :n], y[b, :n], x[b]), torch.float64)
            outside = (x[b] < t[b, 0]) | (x[b] > t[b, n - 1])
            np.testing.assert_array_equal(pad[b].numpy(), outside)


def test_out_of_range_modes():
    rng = seeded()
    t = np.sort(rng.uniform(0, 1, 20))
    y = rng.standard_normal((20, 3))
    x = np.array([-0.5, t[0], 0.5 * (t[3] + t[4]), t[-1], 1.7])
    tt, yy, xx = torch.tensor(t), torch.tensor(y), torch.tensor(x)
    nan = robocache.resample(yy, tt, xx, out_of_range="nan")
    assert torch.isnan(nan[[0, 4]]).all() and not torch.isnan(nan[1:4]).any()
    ext = robocache.resample(yy, tt, xx, out_of_range="extrapolate")
    lo = y[0] + (x[0] - t[0]) / (t[1] - t[0]) * (y[1] - y[0])
    hi = y[-1] + (x[4] - t[-1]) / (t[-1] - t[-2]) * (y[-1] - y[-2])
    assert_close(ext[0], lo, torch.float64)
    assert_close(ext[4], hi, torch.float64)
    clamp, pad = robocache.resample(yy, tt, xx, return_mask=True)
    assert_close(clamp[0], y[0], torch.float64)
    assert_close(clamp[4], y[-1], torch.float64)
    assert pad.tolist() == [True, False, False, False, True]
    for method in ("nearest", "previous"):  # extrapolate holds the edges for these
        a = robocache.resample(yy, tt, xx, method=method, out_of_range="extrapolate")
        b = robocache.resample(yy, tt, xx, method=method)
        torch.testing.assert_close(a, b)


def test_epoch_float64_millisecond_spacing():
    rng = seeded()
    B, S, T, D = 3, 500, 211, 4
    t = _times(rng, B, S, epoch=True)
    x = rng.uniform(t[:, :1], t[:, -1:], size=(B, T))
    y = np.cumsum(rng.standard_normal((B, S, D)), axis=1) * 0.1
    got = robocache.resample(torch.tensor(y, dtype=torch.float32), torch.tensor(t),
                             torch.tensor(x))
    for b in range(B):
        # the oracle subtracts the origin in float64 itself: float64 epoch times are exact
        ref = _oracle("linear", t[b] - t[b, 0], y[b], x[b] - t[b, 0])
        assert_close(got[b], ref, torch.float32, scale=10)


def test_shared_and_unbatched_shapes():
    rng = seeded()
    t = np.sort(rng.uniform(0, 1, 15))
    x = rng.uniform(0, 1, 8)
    y = rng.standard_normal((2, 15, 3))
    got = robocache.resample(torch.tensor(y), torch.tensor(t), torch.tensor(x))
    assert got.shape == (2, 8, 3)
    one = robocache.resample(torch.tensor(y[1]), torch.tensor(t), torch.tensor(x))
    assert one.shape == (8, 3)
    torch.testing.assert_close(one, got[1])
    assert_close(one, _oracle("linear", t, y[1], x), torch.float64)


def test_repeated_timestamps_later_sample_wins():
    t = torch.tensor([0.0, 1.0, 1.0, 2.0], dtype=torch.float64)
    y = torch.tensor([[0.0], [10.0], [20.0], [30.0]])
    x = torch.tensor([0.5, 1.0, 1.5], dtype=torch.float64)
    assert robocache.resample(y, t, x)[:, 0].tolist() == [5.0, 20.0, 25.0]
    assert robocache.resample(y, t, x, method="previous")[:, 0].tolist() == [0.0, 20.0, 20.0]


@pytest.mark.parametrize("method", ["linear", "nearest", "previous", "frame_index", "pchip",
                                    "slerp"])
def test_reference_count_equals_searchsorted(method):
    """interp_ref(count=True) (every target against every sample) gives what searchsorted
    gives: rows of any length, repeated times, targets on, between and outside the samples."""
    from robocache.reference.interp import interp_ref

    rng = seeded()
    B, S, T = 5, 12, 9
    t = torch.tensor(np.sort(rng.integers(0, 20, (B, S)), axis=1) / 4.0)
    x = torch.tensor(rng.integers(-4, 24, (B, T)) / 4.0 + rng.choice([0.0, 0.1], (B, T)))
    lengths = torch.tensor([1, 2, 5, 12, 7])
    y = None if method == "frame_index" else torch.tensor(rng.standard_normal(
        (B, S, 4)), dtype=torch.float32)
    a = interp_ref(y, t, x, lengths, method, tolerance_s=0.05)
    b = interp_ref(y, t, x, lengths, method, tolerance_s=0.05, count=True)
    for u, v in zip(a, b, strict=True):  # (pchip on repeated times: NaN in both)
        assert (u is None and v is None) or torch.equal(u.isnan(), v.isnan()) and torch.equal(
            u.nan_to_num(), v.nan_to_num())


def test_empty_targets_and_out():
    y = torch.randn(2, 5, 3)
    t = torch.linspace(0, 1, 5)
    assert robocache.resample(y, t, torch.empty(0)).shape == (2, 0, 3)
    out = torch.full((2, 4, 3), float("nan"))
    res = robocache.resample(y, t, torch.linspace(0, 1, 4), out=out)
    assert res is out and not torch.isnan(out).any()


def test_nan_target_gives_nan_and_pad_without_validation():
    y = torch.randn(5, 2)
    t = torch.linspace(0, 1, 5)
    x = torch.tensor([0.5, float("nan")])
    res, pad = robocache.resample(y, t, x, return_mask=True, validate=False)
    assert torch.isnan(res[1]).all() and pad.tolist() == [False, True]


# --- the Triton kernel (interpreter on CPU, compiled on CUDA) against the reference ---------

KERNEL_CASES = [
    # B, S, T, D, data dtype, times dtype, target dtype, shared times, lengths
    (3, 17, 23, 5, torch.float32, torch.float64, torch.float64, False, True),
    (2, 1, 9, 3, torch.bfloat16, torch.float32, torch.float32, True, False),
    (2, 2, 40, 130, torch.float16, torch.float32, torch.float64, False, False),
    (1, 3000, 3, 2, torch.float32, torch.float64, torch.float64, True, False),  # binary search
    (2, 70, 150, 7, torch.float64, torch.float64, torch.float32, False, True),
]


@pytest.mark.parametrize("case", KERNEL_CASES, ids=lambda c: f"B{c[0]}-S{c[1]}-T{c[2]}-D{c[3]}")
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("oor", ("clamp", "nan", "extrapolate"))
def test_kernel_matches_reference(kernel_device, case, method, oor):
    B, S, T, D, ddt, tdt, xdt, shared, with_len = case
    g = torch.Generator().manual_seed(int(seeded().integers(1 << 31)))
    t = torch.sort(torch.rand(1 if shared else B, S, generator=g, dtype=torch.float64), 1).values
    t = (t[0] if shared else t).to(tdt)
    x = (torch.rand(B, T, generator=g, dtype=torch.float64) * 1.4 - 0.2).to(xdt)
    data = torch.randn(B, D, S, generator=g).to(ddt).transpose(1, 2)  # non-contiguous
    lengths = torch.randint(1, S + 1, (B,), generator=g) if with_len else None
    ref, ref_pad = robocache.resample(data, t, x, lengths=lengths, method=method,
                                      out_of_range=oor, return_mask=True)
    dev = kernel_device
    out = torch.full((B, T, D), float("nan"), dtype=ddt, device=dev)
    pad = torch.zeros(B, T, dtype=torch.bool, device=dev)
    K.interp_cuda([K.StreamLaunch(data.to(dev), t.to(dev),
                                  None if lengths is None else lengths.to(dev), out, pad, None,
                                  K.METHOD_CODES[method], K.OOR_CODES[oor])], x.to(dev), B)
    rtol, atol = TOL[ddt]
    if oor == "extrapolate":
        # y0 + w * (y1 - y0) with w in the hundreds past a short last segment: float32 rounding
        # scales with those terms (the output's magnitude), not with a result that cancels to 0
        atol = max(atol, rtol * float(ref.abs().nan_to_num().amax()))
    torch.testing.assert_close(out.cpu(), ref, rtol=rtol, atol=atol, equal_nan=True)
    assert torch.equal(pad.cpu(), ref_pad)


# Search settings beyond the default: multi-level fans (the first level's probes are loaded
# before the targets are known, later levels after).
SEARCH_TUNINGS = {"default": {}, "fan8": {"fan": 8}, "fan4": {"fan": 4}}


@pytest.mark.parametrize("tuning", SEARCH_TUNINGS)
@pytest.mark.parametrize("layout", ("jittered", "clustered", "repeated"))
def test_kernel_sorted_targets_search_paths(kernel_device, layout, tuning, monkeypatch):
    """Sorted, dense targets (the common case) across jittered, clustered and repeated sample
    times: the block-window search and the per-target binary search inside it must agree with
    the reference, repeated timestamps picking the last of equal samples."""
    monkeypatch.setattr(K, "TUNING", dataclasses.replace(K.TUNING, **SEARCH_TUNINGS[tuning]))
    g = torch.Generator().manual_seed(int(seeded().integers(1 << 31)))
    B, S, T, D = 3, 300, 700, 4
    step = 1.0 + 0.3 * (torch.rand(B, S, generator=g, dtype=torch.float64) - 0.5)
    if layout == "clustered":  # the middle half of the samples within 1% of the span
        step[:, S // 4:3 * S // 4] *= 0.01
    t = torch.cumsum(step, 1)
    if layout == "repeated":
        t = torch.repeat_interleave(t[:, ::3], 3, dim=1)[:, :S].contiguous()
    x = torch.linspace(float(t.min()) - 2.0, float(t.max()) + 2.0, T, dtype=torch.float64)
    x = x.expand(B, T).contiguous()
    data = torch.randn(B, S, D, generator=g)
    dev = kernel_device
    for method in METHODS:
        ref = robocache.resample(data, t, x, method=method, validate=False)
        out = torch.full((B, T, D), float("nan"), device=dev)
        K.interp_cuda([K.StreamLaunch(data.to(dev), t.to(dev), None, out, None, None,
                                      K.METHOD_CODES[method], K.OOR_CODES["clamp"])], x.to(dev), B)
        torch.testing.assert_close(out.cpu(), ref, rtol=1e-5, atol=1e-5, msg=method)


@pytest.mark.parametrize("case", ("nan-ends", "reversed", "one-stray"))
def test_kernel_block_end_bounds_fall_back(kernel_device, case):
    """Linear blocks bound their search by their first and last target; blocks where those do
    not bound the rest (NaN ends, descending or one stray target) must still be exact."""
    g = torch.Generator().manual_seed(int(seeded().integers(1 << 31)))
    B, S, T, D = 2, 200, 300, 3
    t = torch.cumsum(torch.rand(B, S, generator=g, dtype=torch.float64) + 0.1, 1)
    x = torch.linspace(float(t.min()) - 1, float(t.max()) + 1, T, dtype=torch.float64)
    x = x.expand(B, T).contiguous()
    if case == "nan-ends":
        x[:, ::7] = float("nan")
    elif case == "reversed":
        x = x.flip(1).contiguous()
    else:
        x[:, 40] = float(t[0, S // 2]) + 0.05  # mid-row, far outside its block
    data = torch.randn(B, S, D, generator=g)
    ref = robocache.resample(data, t, x, validate=False)
    dev = kernel_device
    out = torch.full((B, T, D), float("nan"), device=dev)
    K.interp_cuda([K.StreamLaunch(data.to(dev), t.to(dev), None, out, None, None,
                                  K.METHOD_CODES["linear"], K.OOR_CODES["clamp"])], x.to(dev), B)
    torch.testing.assert_close(out.cpu(), ref, rtol=1e-5, atol=1e-5, equal_nan=True)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("B,S,T,D", [(256, 100, 50, 32), (64, 500, 250, 64), (16, 1000, 2000, 32)])
def test_cuda_public_op_large(dtype, B, S, T, D):
    rng = seeded()
    t = _times(rng, B, S, epoch=True)
    x = rng.uniform(t[:, :1] - 0.01, t[:, -1:] + 0.01, size=(B, T))
    y = torch.randn(B, S, D, dtype=torch.float64)
    args = (y.to(dtype), torch.tensor(t), torch.tensor(x))
    for method in METHODS:
        ref = robocache.resample(*args, method=method)
        got = robocache.resample(*(a.cuda() for a in args), method=method)
        torch.testing.assert_close(got.cpu(), ref, rtol=TOL[dtype][0], atol=TOL[dtype][1])


@pytest.mark.gpu
def test_cuda_graph_capture_and_compile():
    y = torch.randn(8, 40, 6, device="cuda")
    t = torch.sort(torch.rand(8, 40, device="cuda", dtype=torch.float64), 1).values
    x = torch.rand(8, 20, device="cuda", dtype=torch.float64)
    out = torch.empty(8, 20, 6, device="cuda")
    eager = robocache.resample(y, t, x)
    robocache.resample(y, t, x, out=out)  # warm-up (compiles the kernel) before capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        robocache.resample(y, t, x, out=out)
    out.fill_(float("nan"))
    graph.replay()
    torch.testing.assert_close(out, eager)
    compiled = torch.compile(lambda a, b, c: robocache.resample(a, b, c) * 2, fullgraph=True)
    torch.testing.assert_close(compiled(y, t, x), eager * 2)


# --- tracing ---------------------------------------------------------------------------------

def test_custom_op_traces_fullgraph():
    y, t, x = torch.randn(2, 10, 3), torch.linspace(0, 1, 10), torch.rand(2, 4)

    def f(y, t, x):
        out, pad = robocache.resample(y, t, x, return_mask=True)
        return out.sum(-1), pad

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    for a, b in zip(compiled(y, t, x), f(y, t, x), strict=True):
        torch.testing.assert_close(a, b)
    torch.library.opcheck(torch.ops.robocache.resample.default,
                          (y, t.expand(2, -1), x, None, "nearest", "nan", True))


# --- properties ------------------------------------------------------------------------------

@st.composite
def _row(draw):
    S = draw(st.integers(2, 40))
    gaps = draw(st.lists(st.floats(1e-3, 5.0), min_size=S - 1, max_size=S - 1))
    t = np.concatenate([[draw(st.floats(-100, 100))], np.cumsum(gaps)])
    t[1:] += t[0]
    y = np.array(draw(st.lists(st.floats(-1e3, 1e3), min_size=S, max_size=S)))
    return t, y


@settings(max_examples=60, deadline=None)
@given(_row(), st.lists(st.floats(0, 1), min_size=1, max_size=30))
def test_linear_between_neighbours_and_exact_at_samples(row, u):
    t, y = row
    x = t[0] + np.array(u) * (t[-1] - t[0])
    got = robocache.resample(torch.tensor(y)[:, None], torch.tensor(t), torch.tensor(x))[:, 0]
    i = np.clip(np.searchsorted(t, x, side="right") - 1, 0, len(t) - 2)
    lo, hi = np.minimum(y[i], y[i + 1]), np.maximum(y[i], y[i + 1])
    assert np.all(got.numpy() >= lo - 1e-9) and np.all(got.numpy() <= hi + 1e-9)
    at = robocache.resample(torch.tensor(y)[:, None], torch.tensor(t), torch.tensor(t))[:, 0]
    np.testing.assert_array_equal(at.numpy(), y)


@settings(max_examples=60, deadline=None)
@given(_row(), st.lists(st.floats(-0.2, 1.2), min_size=1, max_size=30))
def test_previous_never_uses_a_future_sample(row, u):
    t, _ = row
    x = t[0] + np.array(u) * (t[-1] - t[0])
    ids = np.arange(len(t), dtype=np.float64)
    got = robocache.resample(torch.tensor(ids)[:, None], torch.tensor(t), torch.tensor(x),
                             method="previous")[:, 0].numpy().astype(int)
    inside = x >= t[0]
    assert np.all(t[got[inside]] <= x[inside])
    nxt = np.minimum(got + 1, len(t) - 1)
    assert np.all((t[nxt[inside]] > x[inside]) | (got[inside] == len(t) - 1))


# --- bad input -------------------------------------------------------------------------------

def _good():
    return torch.randn(2, 5, 3), torch.linspace(0, 1, 5), torch.rand(2, 4)


@pytest.mark.parametrize("mutate,exc,match", [
    (lambda y, t, x: (y[0, 0], t, x), ShapeError, r"\[B, S, D\]"),
    (lambda y, t, x: (y.long(), t, x), DTypeError, "data"),
    (lambda y, t, x: (y.to(torch.complex64), t, x), DTypeError, "data"),
    (lambda y, t, x: (y, t.long(), x), DTypeError, "times"),
    (lambda y, t, x: (y, t, x.half()), DTypeError, "target_times"),
    (lambda y, t, x: (y, t[:4], x), ShapeError, "times"),
    (lambda y, t, x: (y, t.expand(3, -1), x), ShapeError, "times"),
    (lambda y, t, x: (y, t, x[:1]), ShapeError, "target_times"),
    (lambda y, t, x: (y[:, :0], t[:0], x), ShapeError, "S == 0"),
    (lambda y, t, x: (y, t.flip(0), x), DataError, "decreases"),
    (lambda y, t, x: (y, torch.tensor([0, 0.1, float("nan"), 0.3, 0.4]), x), DataError, "NaN"),
    (lambda y, t, x: (y, t, x.masked_fill(x > 0.5, float("nan"))), DataError, "NaN"),
    (lambda y, t, x: ([1.0], t, x), TypeError, "data"),
])
def test_bad_input(mutate, exc, match):
    with pytest.raises(exc, match=match):
        robocache.resample(*mutate(*_good()))


@pytest.mark.parametrize("kwargs,exc,match", [
    ({"method": "cubicc"}, ValueError, "method"),
    ({"out_of_range": "wrap"}, ValueError, "out_of_range"),
    ({"lengths": torch.tensor([5])}, ShapeError, "lengths"),
    ({"lengths": torch.tensor([5.0, 1.0])}, DTypeError, "lengths"),
    ({"lengths": torch.tensor([0, 5])}, DataError, r"\[1, S\]"),
    ({"lengths": torch.tensor([6, 5])}, DataError, r"\[1, S\]"),
    ({"out": torch.empty(2, 4, 2)}, ShapeError, "out"),
    ({"out": torch.empty(2, 4, 3, dtype=torch.float64)}, ShapeError, "out"),
])
def test_bad_arguments(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        robocache.resample(*_good(), **kwargs)


def test_device_mismatch_is_named():
    y, t, x = _good()
    meta = torch.empty(2, 4, device="meta")
    with pytest.raises(DeviceError, match="target_times"):
        robocache.resample(y, t, meta)


def test_validation_off_skips_data_checks():
    y, t, x = _good()
    robocache.resample(y, t.flip(0), x, validate=False)  # no sync, no error
