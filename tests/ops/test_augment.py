"""robocache.augment: Philox parameters and noise, SE(3), time warps, smoothing, dropout."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.ndimage
import scipy.signal
import torch
import triton
import triton.language as tl
from helpers import assert_close, seeded
from scipy.spatial.transform import Rotation

from robocache.errors import DataError, ShapeError
from robocache.kernels.augment import noise_cuda
from robocache.kernels.jit import sincos_turns
from robocache.ops.augment import (
    add_noise,
    drop_streams,
    rigid_transform,
    sample_dropout,
    sample_rigid,
    sample_time_warp,
    smooth,
    time_warp,
    variants,
    warp_phase,
)
from robocache.reference import augment as ref


def _seed(rng) -> int:
    return int(rng.integers(0, 2**62))


@pytest.mark.parametrize("shape", [(1, 1), (37, 5), (64, 130)])
def test_noise_kernel_equals_reference(kernel_device, shape):
    rng = seeded()
    s = _seed(rng)
    x = torch.randn(shape)
    std = torch.rand(shape[1])
    out = torch.full(shape, float("nan"), device=kernel_device)
    noise_cuda(x.to(kernel_device), std.to(kernel_device), s, out)
    assert_close(out, add_noise(x, std, seed=s), scale=5)


def test_noise_kernel_takes_seeds_of_every_integer_width(kernel_device):
    """Triton passes a seed as int32, uint32 or int64 by value: one cached launch per width,
    each drawing what the reference draws."""
    x = torch.randn(9, 6)
    std = torch.full((6,), 0.5)
    for s in (0, 1, 16, 2**31 - 1, 2**31 + 3, 2**32 + 5, 2**62 + 7, 3):
        out = torch.full_like(x, float("nan"), device=kernel_device)
        noise_cuda(x.to(kernel_device), std.to(kernel_device), s, out)
        assert_close(out, add_noise(x, std, seed=s), scale=5)


@triton.jit
def _sincos_probe(u_ptr, c_ptr, s_ptr, N: tl.constexpr):
    i = tl.arange(0, N)
    c, s = sincos_turns(tl.load(u_ptr + i))
    tl.store(c_ptr + i, c)
    tl.store(s_ptr + i, s)


def test_sincos_turns_matches_numpy(kernel_device):
    rng = seeded()
    u = np.concatenate([rng.uniform(0, 1, 200), rng.uniform(-40, 40, 39),
                        np.arange(-8, 9) / 8]).astype(np.float32)
    ut = torch.from_numpy(u).to(kernel_device)
    c, s = torch.empty_like(ut), torch.empty_like(ut)
    _sincos_probe[(1,)](ut, c, s, N=u.size)
    th = 2 * np.pi * u.astype(np.float64)
    # float32 turns: the argument itself carries |u| * 2**-24 turns of rounding
    np.testing.assert_allclose(c.cpu().numpy(), np.cos(th), atol=2e-7 + 4e-7 * np.abs(u).max())
    np.testing.assert_allclose(s.cpu().numpy(), np.sin(th), atol=2e-7 + 4e-7 * np.abs(u).max())


def test_normals_follow_philox_counters():
    """Element (r, c) of the noise stream is Box-Muller lane c % 4 of the Philox words at
    counter r * ceil(D / 4) + c // 4 (independent recomputation with numpy float64)."""
    rng = seeded()
    s, rows, d = _seed(rng), 7, 10
    z = ref.normals(s, rows, d).double().numpy()
    q = -(-d // 4)
    words = [w.numpy() for w in ref.philox(s, torch.arange(rows * q).view(rows, q))]
    u = [np.where(w >= 2**31, 2**32 - 1 - w, w) * 4.6566127342e-10 for w in words]
    r0 = np.sqrt(-2 * np.log(np.maximum(u[0], 1e-7)))
    r2 = np.sqrt(-2 * np.log(np.maximum(u[2], 1e-7)))
    lanes = [r0 * np.cos(2 * np.pi * u[1]), r0 * np.sin(2 * np.pi * u[1]),
             r2 * np.cos(2 * np.pi * u[3]), r2 * np.sin(2 * np.pi * u[3])]
    exp = np.stack(lanes, -1).reshape(rows, 4 * q)[:, :d]
    np.testing.assert_allclose(z, exp, rtol=1e-5, atol=1e-5)


def test_noise_statistics_and_zero_std():
    rng = seeded()
    x = torch.zeros(20000, 3)
    std = torch.tensor([0.0, 0.5, 2.0])
    y = add_noise(x, std, seed=_seed(rng))
    assert torch.equal(y[:, 0], x[:, 0])
    np.testing.assert_allclose(y[:, 1:].std(0).numpy(), [0.5, 2.0], rtol=0.05)
    np.testing.assert_allclose(y[:, 1:].mean(0).numpy(), [0, 0], atol=0.05)


def test_reproducible_same_seed_bitwise_different_seeds_differ():
    rng = seeded()
    s = _seed(rng)
    x = torch.randn(6, 11, 4)
    assert torch.equal(add_noise(x, 0.3, seed=s), add_noise(x, 0.3, seed=s))
    assert not torch.equal(add_noise(x, 0.3, seed=s), add_noise(x, 0.3, seed=s + 1))
    a = sample_rigid((5, 3), max_translation=0.1, max_rotation=1.0, seed=s)
    b = sample_rigid((2, 3), max_translation=0.1, max_rotation=1.0, seed=s)
    assert torch.equal(a.rotation[:2], b.rotation) and torch.equal(a.translation[:2],
                                                                      b.translation)
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    assert torch.equal(sample_dropout((4,), 3, 0.5, seed=g1), sample_dropout((4,), 3, 0.5, seed=g2))


def test_rigid_transform_matches_scipy_and_preserves_geometry():
    rng = seeded()
    p = sample_rigid((4,), max_translation=0.2, max_rotation=np.pi, seed=_seed(rng))
    q = p.rotation.double().numpy()
    np.testing.assert_allclose(np.linalg.norm(q, axis=-1), 1, atol=1e-6)
    angle = 2 * np.arccos(np.clip(np.abs(q[:, 0]), 0, 1))
    assert (angle <= np.pi + 1e-5).all()
    pts = torch.randn(4, 50, 3)
    pos = torch.randn(4, 7, 3)
    quat = torch.nn.functional.normalize(torch.randn(4, 7, 4), dim=-1)
    pos2, quat2, pts2 = rigid_transform(p, positions=pos, quaternions=quat, points=pts)
    for b in range(4):
        r = Rotation.from_quat(q[b][[1, 2, 3, 0]])
        t = p.translation[b].double().numpy()
        assert_close(pts2[b], r.apply(pts[b].double().numpy()) + t, scale=10)
        assert_close(pos2[b], r.apply(pos[b].double().numpy()) + t, scale=10)
        composed = (r * Rotation.from_quat(quat[b].double().numpy()[:, [1, 2, 3, 0]])).as_quat()
        exp = composed[:, [3, 0, 1, 2]] * np.sign(composed[:, 3:] * quat2[b, :, :1].numpy())
        assert_close(quat2[b], exp, scale=10)
    d0 = torch.cdist(pts.double(), pts.double())
    d1 = torch.cdist(pts2.double(), pts2.double())
    assert_close(d1, d0.numpy(), torch.float32, scale=20)
    assert_close(quat2.norm(dim=-1), quat.norm(dim=-1).numpy(), scale=5)


@pytest.mark.parametrize("keep", [True, False])
def test_time_warps_monotone_and_endpoints(keep):
    rng = seeded()
    w = sample_time_warp((50,), strength=0.9, terms=5, keep_endpoints=keep, max_crop=0.2,
                         seed=_seed(rng))
    u = torch.linspace(0, 1, 401).expand(50, 401)
    phi = warp_phase(u, w)
    assert (phi.diff(dim=-1) > 0).all()
    if keep:
        assert_close(phi[:, 0], np.zeros(50))
        assert_close(phi[:, -1], np.ones(50))
    else:
        assert (phi[:, 0] >= 0).all() and (phi[:, 0] <= 0.2 + 1e-6).all()
        assert (phi[:, -1] <= 1).all() and (phi[:, -1] >= 0.8 - 1e-6).all()
        assert (phi[:, 0] > 0).any()


def test_time_warp_resamples_at_warped_times():
    rng = seeded()
    B, S, D = 3, 29, 4
    times = torch.from_numpy(np.sort(rng.uniform(0, 3, (B, S)), 1)) + 1.7e9
    data = torch.randn(B, S, D)
    w = sample_time_warp((B,), strength=0.5, seed=_seed(rng))
    y = time_warp(data, times, w)
    t = times.numpy()
    u = (t - t[:, :1]) / (t[:, -1:] - t[:, :1])
    phi = warp_phase(torch.from_numpy(u).float(), w).double().numpy()
    target = t[:, :1] + (t[:, -1:] - t[:, :1]) * phi
    for b in range(B):
        for d in range(D):
            exp = np.interp(target[b], t[b], data[b, :, d].double().numpy())
            np.testing.assert_allclose(y[b, :, d].numpy(), exp, atol=1e-4)
    user = times + 0.01
    assert_close(time_warp(data, times, time_map=user), time_warp(data, times, time_map=user))


@pytest.mark.parametrize("sigma", [0.7, 2.0])
def test_gaussian_smoothing_matches_scipy(sigma):
    x = torch.randn(3, 40, 5, dtype=torch.float64)
    y = smooth(x, method="gaussian", sigma=sigma)
    exp = scipy.ndimage.gaussian_filter1d(x.numpy(), sigma, axis=1, mode="nearest", truncate=4.0)
    assert_close(y, exp)


@pytest.mark.parametrize("window,order", [(5, 2), (11, 3), (7, 0)])
def test_savgol_matches_scipy(window, order):
    np.testing.assert_allclose(ref.savgol_taps(window, order).numpy(),
                               scipy.signal.savgol_coeffs(window, order), atol=1e-12)
    x = torch.randn(2, 31, 3, dtype=torch.float64)
    y = smooth(x, method="savgol", window=window, polyorder=order)
    exp = scipy.signal.savgol_filter(x.numpy(), window, order, axis=1, mode="nearest")
    assert_close(y, exp)
    xt = x.transpose(1, 2).float()
    assert_close(smooth(xt, method="savgol", window=window, polyorder=order, dim=-1),
                 exp.transpose(0, 2, 1), scale=10)


@pytest.mark.gpu
@pytest.mark.parametrize("method", ["gaussian", "savgol"])
def test_smoothing_on_cuda_matches_cpu(method):
    x = torch.randn(3, 40, 5, dtype=torch.float64)
    kw = {"sigma": 1.5} if method == "gaussian" else {"window": 7, "polyorder": 2}
    y = smooth(x.cuda(), method=method, **kw)
    assert y.is_cuda
    assert_close(y.cpu(), smooth(x, method=method, **kw))


def test_dropout_zeroes_exactly_the_flagged_streams():
    rng = seeded()
    x = torch.randn(6, 4, 9) + 5
    streams = ((0, 3), (3, 7), (8, 9))
    dropped = sample_dropout((6,), 3, 0.5, seed=_seed(rng))
    y = drop_streams(x, streams, dropped)
    for b in range(6):
        for s, (a, e) in enumerate(streams):
            assert bool((y[b, :, a:e] == 0).all()) == bool(dropped[b, s])
        assert torch.equal(y[b, :, 7], x[b, :, 7])
    assert not sample_dropout((8,), 2, 0.0, seed=1).any()
    assert sample_dropout((8,), 2, 1.0, seed=1).all()


def test_variants_expand_without_copy():
    x = torch.randn(3, 5, 2)
    v = variants(x, 4)
    assert v.shape == (3, 4, 5, 2) and v.data_ptr() == x.data_ptr()


def test_bad_input():
    x = torch.randn(4, 6, 3)
    with pytest.raises(ValueError, match="`std` must be finite and >= 0"):
        add_noise(x, -0.1, seed=0)
    with pytest.raises(ShapeError, match="D = 3 entries"):
        add_noise(x, [0.1, 0.2], seed=0)
    with pytest.raises(ValueError, match="`seed` must be an int"):
        add_noise(x, 0.1, seed=-1)
    with pytest.raises(ValueError, match="`k` .* must be an int >= 1"):
        variants(x, 0)
    with pytest.raises(ValueError, match="`strength` must be"):
        sample_time_warp((2,), strength=1.0, seed=0)
    with pytest.raises(ValueError, match="`max_rotation` must be >= 0"):
        sample_rigid((2,), max_translation=0.0, max_rotation=-1.0, seed=0)
    times = torch.linspace(0, 1, 6, dtype=torch.float64)
    with pytest.raises(DataError, match="`time_map` decreases at row 0"):
        time_warp(x, times, time_map=torch.tensor([0.0, 0.5, 0.4, 0.6], dtype=torch.float64))
    with pytest.raises(ValueError, match="exactly one of"):
        time_warp(x, times)
    with pytest.raises(ValueError, match="`window` must be odd"):
        smooth(x, method="savgol", window=4)
    with pytest.raises(ValueError, match="`sigma` must be > 0"):
        smooth(x, sigma=0.0)
    with pytest.raises(ShapeError, match="stream 0"):
        drop_streams(x, ((2, 5),), torch.zeros(4, 1, dtype=torch.bool))
    with pytest.raises(ShapeError, match="`positions` must have shape"):
        rigid_transform(sample_rigid((4,), max_translation=0.0, max_rotation=0.1, seed=0),
                        positions=torch.randn(3, 5, 3))


def test_noise_std_given_as_numbers_is_validated_and_copied_once():
    from robocache.ops import _shared

    a = _shared.noise_std_on("add_noise", [0.1, 0.2, 0.3], 3, torch.device("cpu"))
    assert _shared.noise_std_on("add_noise", (0.1, 0.2, 0.3), 3, torch.device("cpu")) is a
    assert _shared.noise_std_on("add_noise", 0.5, 3, torch.device("cpu")).tolist() == [0.5] * 3
    t = torch.tensor([0.1, 0.2, 0.3])
    assert _shared.noise_std_on("add_noise", t, 3, torch.device("cpu")) is not a
    for _ in range(2):  # a bad value is never cached: it fails on every call
        with pytest.raises(ValueError, match="finite and >= 0"):
            add_noise(torch.zeros(2, 3), [0.1, -1.0, 0.1], seed=0)
