"""robocache.align against SciPy per method (PCHIP, natural cubic, Slerp, interp1d,
numpy.interp), frame_index against a brute-force search, the grouped Triton kernel (one
launch for all streams) against the reference, and the validation rules."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.interpolate as si
import torch
from helpers import TOL, assert_close, seeded
from scipy.spatial.transform import Rotation, Slerp

import robocache
from robocache import Stream
from robocache.errors import DataError, DTypeError, ShapeError
from robocache.kernels import interp as K

EPOCH = 1.7e9


def _times(rng, B, S, rate):
    """Irregular increasing float64 epoch timestamps at about `rate` Hz."""
    return EPOCH + np.cumsum(rng.uniform(0.5, 1.5, size=(B, S)) / rate, axis=1)


def _scipy(method, t, y, x):
    """float64 oracle for one row (times made relative: SciPy works in float64 too)."""
    t, x = t - t[0], x - t[0]
    if method == "linear":
        return np.stack([np.interp(x, t, y[:, d]) for d in range(y.shape[1])], 1)
    if len(t) == 1:
        return np.repeat(y[:1], len(x), 0)
    if method == "pchip":
        return si.PchipInterpolator(t, y)(x)
    if method == "cubic":
        return si.CubicSpline(t, y, bc_type="natural")(x)
    if method == "slerp":
        r = Slerp(t, Rotation.from_quat(y, scalar_first=True))(np.clip(x, t[0], t[-1]))
        return r.as_quat(scalar_first=True)
    return si.interp1d(t, y, kind=method, axis=0)(np.clip(x, t[0], t[-1]))


def _quats(rng, B, S):
    return Rotation.random(B * S, random_state=rng).as_quat(scalar_first=True).reshape(B, S, 4)


def _same_rotation(got, ref, tol):
    """Quaternions equal up to sign."""
    dots = np.abs((np.asarray(got, np.float64) * ref).sum(-1))
    np.testing.assert_allclose(dots, 1.0, atol=tol)


@pytest.mark.parametrize("method", ["linear", "nearest", "previous", "pchip", "cubic", "slerp"])
@pytest.mark.parametrize("S", [2, 3, 17])
def test_each_method_matches_scipy(method, S):
    rng = seeded()
    B, T = 3, 40
    t = _times(rng, B, S, 20.0)
    y = _quats(rng, B, S) if method == "slerp" else rng.standard_normal((B, S, 5))
    lengths = np.array([S, max(S - 1, 2) if S > 2 else S, S])
    for b, n in enumerate(lengths):  # NaN padding is never read
        t[b, n:] = np.nan
        y[b, n:] = np.nan
    x = np.sort(rng.uniform(t[:, :1], np.nanmax(t, 1, keepdims=True), size=(B, T)), 1)
    out = robocache.align({"s": Stream(torch.tensor(y), torch.tensor(t), torch.tensor(lengths),
                                       method=method)}, torch.tensor(x))
    got = out.values["s"]
    assert not out.is_pad["s"].any()
    for b, n in enumerate(lengths):
        ref = _scipy(method, t[b, :n], y[b, :n], x[b])
        if method == "slerp":
            _same_rotation(got[b], ref, 1e-9)
        else:
            assert_close(got[b], ref, torch.float64, scale=1e3 if method == "cubic" else 1)


@pytest.mark.parametrize("method", ["pchip", "cubic"])
def test_extrapolate_extends_the_end_polynomial(method):
    rng = seeded()
    t = np.sort(rng.uniform(0, 1, 9))
    y = rng.standard_normal((9, 2))
    x = np.array([t[0] - 0.1, t[-1] + 0.1])
    out = robocache.align({"s": Stream(torch.tensor(y), torch.tensor(t), method=method)},
                          torch.tensor(x), out_of_range="extrapolate")
    oracle = (si.PchipInterpolator(t, y) if method == "pchip"
              else si.CubicSpline(t, y, bc_type="natural"))
    assert_close(out.values["s"], oracle(x), torch.float64)
    assert out.is_pad["s"].tolist() == [True, True]


def test_frame_index_matches_brute_force_with_tolerance():
    rng = seeded()
    B, S, T, tol = 4, 30, 97, 0.012
    t = _times(rng, B, S, 30.0)
    t[1, 10:14] += 0.2  # a gap: targets inside it must be flagged, not snapped
    t[1] = np.sort(t[1])
    x = rng.uniform(t[:, :1] - 0.05, t[:, -1:] + 0.05, size=(B, T))
    out = robocache.align({"cam": Stream(None, torch.tensor(t), method="frame_index",
                                         tolerance_s=tol)}, torch.tensor(x))
    idx, off, pad = out.values["cam"], out.offset["cam"], out.is_pad["cam"]
    assert idx.dtype == torch.int64
    for b in range(B):
        d = np.abs(t[b][None, :] - x[b][:, None])
        best = d.argmin(1)  # first minimum: ties go to the earlier frame
        np.testing.assert_array_equal(idx[b].numpy(), best)
        np.testing.assert_allclose(off[b].numpy(), t[b][best] - x[b], atol=1e-6)
        np.testing.assert_array_equal(pad[b].numpy(), d.min(1) > tol)


def test_outputs_concat_age_and_unbatched():
    rng = seeded()
    S = 12
    t = np.sort(rng.uniform(0, 1, S))
    a = torch.tensor(rng.standard_normal((2, S, 3)), dtype=torch.float32)
    g = torch.tensor(rng.integers(0, 2, (2, S, 1)), dtype=torch.bfloat16)
    x = torch.tensor(np.linspace(t[0], t[-1], 9))
    out = robocache.align({"a": (a, torch.tensor(t)),
                           "g": Stream(g, torch.tensor(t), method="previous")}, x, concat=True)
    assert out.concat.shape == (2, 9, 4) and out.concat.dtype == torch.float32
    torch.testing.assert_close(out.concat[..., :3], out.values["a"])
    age = out.age["g"]
    assert (age >= 0).all()
    used = torch.tensor(np.searchsorted(t, x.numpy(), side="right") - 1)
    torch.testing.assert_close(age, (x - torch.tensor(t)[used]).float().expand(2, -1))
    one = robocache.align({"a": (a[0], torch.tensor(t))}, x)
    torch.testing.assert_close(one.values["a"], out.values["a"][0])


# --- the grouped kernel ------------------------------------------------------------------

def _mixed_streams(rng, B, device="cpu"):
    """Streams like a real robot: each its own rate, width, dtype and lengths."""
    def mk(S, rate, D, dtype, method, **kw):
        t = _times(rng, B, S, rate)
        data = None if D == 0 else torch.tensor(
            _quats(rng, B, S) if method == "slerp" else rng.standard_normal((B, S, D)))
        lens = torch.tensor(rng.integers(max(1, S // 2), S + 1, B)) if kw.pop("ragged", 0) \
            else None
        return Stream(None if data is None else data.to(dtype).to(device),
                      torch.tensor(t).to(device), None if lens is None else lens.to(device),
                      method, **kw)
    return {
        "joints": mk(25, 125.0, 7, torch.float32, "pchip", ragged=1),
        "tactile": mk(67, 333.0, 16, torch.float32, "linear"),
        "camera": mk(6, 30.0, 0, None, "frame_index", tolerance_s=0.02),
        "language": mk(2, 2.0, 9, torch.bfloat16, "previous"),
        "gripper": mk(9, 40.0, 1, torch.float16, "nearest"),
        "orientation": mk(11, 50.0, 4, torch.float64, "slerp"),
        "torque": mk(13, 60.0, 3, torch.float32, "cubic", ragged=1),
    }


class _Counting:
    """Stands in for the Triton kernel object and records each launch."""

    def __init__(self, kernel, launches):
        self.kernel, self.launches = kernel, launches

    def __getitem__(self, grid):
        self.launches.append(grid)
        return self.kernel[grid]


def test_grouped_kernel_matches_reference_in_one_launch(kernel_device, monkeypatch):
    rng = seeded()
    B, T = 3, 21
    streams = _mixed_streams(rng, B)
    x = torch.tensor(np.linspace(EPOCH - 0.01, EPOCH + 0.2, T))
    for oor in ("clamp", "nan", "extrapolate"):
        ref = robocache.align(streams, x, out_of_range=oor)
        launches = []
        kernel = K._interp_kernel
        monkeypatch.setattr(K, "_interp_kernel", _Counting(kernel, launches))
        dev_streams = {k: Stream(None if s.data is None else s.data.to(kernel_device),
                                 s.times.to(kernel_device),
                                 None if s.lengths is None else s.lengths.to(kernel_device),
                                 s.method, s.tolerance_s) for k, s in streams.items()}
        if kernel_device == "cpu":  # the interpreter runs CPU tensors through the kernel
            from robocache.ops import align as A
            specs, _ = A._normalize(dev_streams, None, None, None, x, oor, False)
            got = A._align_cuda(specs, x, A._Plan(specs, x, oor, False), None)
        else:
            got = robocache.align(dev_streams, x.cuda(), out_of_range=oor)
        monkeypatch.setattr(K, "_interp_kernel", kernel)
        assert len(launches) == 1
        for name, s in streams.items():
            dt = torch.float32 if s.data is None else s.data.dtype
            rtol, atol = TOL[dt] if dt != torch.float64 else (1e-9, 1e-9)
            if oor == "extrapolate" and s.method in ("pchip", "cubic"):
                # a cubic evaluated s intervals past the end amplifies rounding ~s^3 (here up
                # to ~12 intervals): 1e3 x the dtype's tolerance
                rtol, atol = rtol * 1e3, atol * 1e3
            if s.method == "slerp":
                v, r = got.values[name].cpu().double(), ref.values[name].double()
                dots = (v * r).sum(-1).abs()
                assert torch.allclose(dots[~torch.isnan(dots)], torch.ones((), dtype=dots.dtype),
                                      atol=1e-6)
                assert torch.equal(torch.isnan(dots), torch.isnan(r).any(-1))
            else:
                torch.testing.assert_close(got.values[name].cpu(), ref.values[name],
                                           rtol=rtol, atol=atol, equal_nan=True)
            assert torch.equal(got.is_pad[name].cpu(), ref.is_pad[name]), name
        for d in (got.age, got.offset):
            for name, v in d.items():
                ref_v = (ref.age if d is got.age else ref.offset)[name]
                torch.testing.assert_close(v.cpu(), ref_v, rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
def test_cuda_align_benchmark_shape_graph_and_compile():
    rng = seeded()
    streams = _mixed_streams(rng, 64, "cuda")
    x = torch.tensor(np.linspace(EPOCH, EPOCH + 0.15, 50)).cuda()
    ref = robocache.align({k: Stream(None if s.data is None else s.data.cpu(), s.times.cpu(),
                                     None if s.lengths is None else s.lengths.cpu(), s.method,
                                     s.tolerance_s) for k, s in streams.items()}, x.cpu())
    got = robocache.align(streams, x)
    for name in streams:
        if streams[name].method != "slerp":
            dt = ref.values[name].dtype
            rtol, atol = TOL.get(dt, (0, 0))
            torch.testing.assert_close(got.values[name].cpu(), ref.values[name], rtol=rtol,
                                       atol=atol)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = robocache.align(streams, x)
    graph.replay()
    torch.testing.assert_close(captured.values["tactile"], got.values["tactile"])
    compiled = torch.compile(lambda tt: robocache.align(streams, tt).values["joints"] * 2,
                             fullgraph=True)
    torch.testing.assert_close(compiled(x), got.values["joints"] * 2)


def test_traces_fullgraph_on_cpu():
    rng = seeded()
    streams = _mixed_streams(rng, 2)
    x = torch.tensor(np.linspace(EPOCH, EPOCH + 0.1, 7))
    f = torch.compile(lambda tt: robocache.align(streams, tt, concat=True).concat,
                      fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(f(x), robocache.align(streams, x, concat=True).concat)


# --- bad input -----------------------------------------------------------------------------

def _two():
    t = torch.linspace(0, 1, 5, dtype=torch.float64)
    return {"a": Stream(torch.randn(2, 5, 3), t), "q": Stream(torch.randn(2, 5, 4), t)}


@pytest.mark.parametrize("mutate,kwargs,exc,match", [
    (lambda s: {}, {}, ValueError, "non-empty"),
    (lambda s: {**s, "b": Stream(torch.randn(3, 5, 3), s["a"].times)}, {}, ShapeError,
     "batch size"),
    (lambda s: {**s, "q": Stream(torch.randn(2, 5, 3), s["a"].times, method="slerp")}, {},
     ShapeError, "quaternions"),
    (lambda s: {**s, "q": Stream(torch.randn(2, 5, 4), s["a"].times, method="slerp")}, {},
     DataError, "norm"),
    (lambda s: s, {"tolerance_s": -1.0}, ValueError, "tolerance_s"),
    (lambda s: {**s, "c": Stream(None, s["a"].times, method="frame_index",
                                 tolerance_s=-0.1)}, {}, ValueError, "tolerance_s"),
    (lambda s: {**s, "c": Stream(None, s["a"].times)}, {}, ValueError, "frame_index"),
    (lambda s: s, {"methods": {"a": "spline"}}, ValueError, "method"),
    (lambda s: s, {"out_of_range": "wrap"}, ValueError, "out_of_range"),
    (lambda s: {"a": Stream(torch.randn(2, 5, 3).int(), s["a"].times)}, {}, DTypeError,
     r"streams\['a'\]\.data"),
    (lambda s: {"a": Stream(s["a"].data, s["a"].times[:4])}, {}, ShapeError, "samples"),
    (lambda s: {"a": Stream(s["a"].data, s["a"].times.flip(0))}, {}, DataError, "decreases"),
    (lambda s: s, {"lengths": {"a": torch.tensor([0, 5])}}, DataError, "lengths"),
    (lambda s: {"a": 3}, {}, TypeError, "Stream"),
])
def test_bad_input(mutate, kwargs, exc, match):
    s = _two()
    s["q"] = Stream(torch.nn.functional.normalize(s["q"].data, dim=-1), s["q"].times,
                    method="slerp")
    with pytest.raises(exc, match=match):
        robocache.align(mutate(s), torch.rand(2, 6, dtype=torch.float64), **kwargs)


def test_unbatched_frame_index_only_eager_and_compiled():
    """No stream with data and 1-D times and target: an unbatched call, eager and traced."""
    t = torch.linspace(0, 1, 7, dtype=torch.float64)
    streams = {"cam": robocache.Stream(None, t + 0.01, method="frame_index", tolerance_s=0.1)}
    out = robocache.align(streams, t)
    assert out.values["cam"].tolist() == list(range(7))
    assert out.offset["cam"].shape == (7,) and out.is_pad["cam"].shape == (7,)
    f = torch.compile(lambda tt: robocache.align(streams, tt).values["cam"], fullgraph=True,
                      backend="eager")
    assert torch.equal(f(t), out.values["cam"])
