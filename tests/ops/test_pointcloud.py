"""depth_to_points / voxelize / depth_to_voxels against a NumPy float64 oracle.

Voxel indices are floor((p - min) / size) computed in float32 by the library and in float64 by
the oracle; where the exact quotient lies within BAND voxel units of an integer the two can
disagree by one voxel (gsplat's boundary band). Such points are excluded from the tight checks
(keys equal, touched voxels equal) and bound the slack of the rest (dropped counts).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from helpers import assert_close, seeded

from robocache.errors import DataError, DeviceError, DTypeError, ShapeError
from robocache.ops import pointcloud as pc

MODES = ("occupancy", "count", "sum", "mean", "max")
FEATURE_MODES = ("sum", "mean", "max")
BAND = 1e-4  # voxel units; float32 error of (p - min) / size is ~1e-6 voxels for |q| <= 100
LO, SIZE, DIMS = (-1.0, -0.5, 0.25), (0.1, 0.15, 0.2), (7, 5, 6)


# ---------------------------------------------------------------- float64 oracles


def np_keys(points, valid, lo, size, dims):
    """Keys (-1 = none), band flags and dropped counts of points [B, N, 3], all float64."""
    p = np.asarray(points, np.float64)
    valid = np.asarray(valid, bool)
    q = (p - np.asarray(lo)) / np.asarray(size)
    with np.errstate(invalid="ignore"):
        i = np.floor(q)
        finite = np.isfinite(q).all(-1)
        inside = valid & finite & ((i >= 0) & (i < np.asarray(dims))).all(-1)
        band = valid & finite & (np.abs(q - np.round(q)) < BAND).any(-1)
    i = np.where(inside[..., None], i, 0).astype(np.int64)
    b = np.arange(p.shape[0])[:, None]
    keys = ((b * dims[0] + i[..., 0]) * dims[1] + i[..., 1]) * dims[2] + i[..., 2]
    return np.where(inside, keys, -1), band, (valid & ~inside).sum(1)


def np_reduce(keys, feats, n_rows, mode):
    """(values, count) per row with np.add.at / np.maximum.at; empty rows hold 0."""
    k = keys.reshape(-1)
    hit = k >= 0
    count = np.zeros(n_rows, np.int64)
    np.add.at(count, k[hit], 1)
    if mode == "occupancy":
        return count > 0, count
    if mode == "count":
        return count, count
    f = np.asarray(feats, np.float64).reshape(k.size, -1)[hit]
    if mode == "max":
        vals = np.full((n_rows, f.shape[1]), -np.inf)
        np.maximum.at(vals, k[hit], f)
        return np.where(count[:, None] > 0, vals, 0.0), count
    vals = np.zeros((n_rows, f.shape[1]))
    np.add.at(vals, k[hit], f)
    if mode == "mean":
        vals = vals / np.maximum(count, 1)[:, None]
    return vals, count


def np_backproject(depth, k, e, scale, min_depth=0.0, max_depth=math.inf):
    """Pinhole model in float64 -> points [B, H*W, 3], valid [B, H*W]."""
    d = np.asarray(depth, np.float64)
    b, h, w = d.shape
    k = np.broadcast_to(np.asarray(k, np.float64).reshape(-1, 3, 3), (b, 3, 3))
    z = d * np.float64(np.float32(scale))
    with np.errstate(invalid="ignore"):
        valid = np.isfinite(z) & (z > 0) & (z >= min_depth) & (z <= max_depth)
    v, u = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
    fx, fy, cx, cy = (k[:, 0, 0, None, None], k[:, 1, 1, None, None], k[:, 0, 2, None, None],
                      k[:, 1, 2, None, None])
    pts = np.stack([(u - cx) * z / fx, (v - cy) * z / fy, z], -1).reshape(b, h * w, 3)
    if e is not None:
        e = np.broadcast_to(np.asarray(e, np.float64).reshape(-1, 4, 4), (b, 4, 4))
        pts = np.einsum("bij,bnj->bni", e[:, :3, :3], pts) + e[:, None, :3, 3]
    return pts, valid.reshape(b, -1)


# ---------------------------------------------------------------- helpers


def random_cloud(rng, b, n, f=3, spread=0.3):
    """Points spread a little beyond the grid (some dropped), features in [-1, 1]."""
    lo, hi = np.asarray(LO), np.asarray(LO) + np.asarray(SIZE) * np.asarray(DIMS)
    pts = rng.uniform(lo - spread, hi + spread, size=(b, n, 3)).astype(np.float32)
    feats = rng.uniform(-1, 1, size=(b, n, f)).astype(np.float32)
    return torch.from_numpy(pts), torch.from_numpy(feats)


def check_dense(grid, count, dropped, points, valid, feats, mode, dims=DIMS, lo=LO, size=SIZE):
    """Tight on voxels no band point can reach; dropped within the band slack."""
    b = points.shape[0]
    keys, band, drop = np_keys(points.numpy(), valid, lo, size, dims)
    n_rows = b * math.prod(dims)
    vals, cnt = np_reduce(np.where(band, -1, keys), feats, n_rows, mode)
    # voxels a band point may have landed in: its oracle voxel and the 26 around it
    q = (points.double().numpy() - np.asarray(lo)) / np.asarray(size)
    touched = np.zeros((b, *dims), bool)
    for bi, ni in zip(*np.nonzero(band), strict=True):
        c = np.floor(q[bi, ni]).astype(int)
        sl = tuple(slice(max(0, c[a] - 1), max(0, c[a] + 2)) for a in range(3))
        touched[(bi, *sl)] = True
    keep = ~touched.reshape(-1)
    flat = grid.detach().cpu().reshape(n_rows, -1).double().numpy()
    exp = np.asarray(vals, np.float64).reshape(n_rows, -1)
    rtol = 1e-5 if mode in ("sum", "mean") else 0.0
    np.testing.assert_allclose(flat[keep], exp[keep], rtol=rtol, atol=rtol)
    if count is not None:
        got = count.detach().cpu().reshape(-1).numpy()
        np.testing.assert_array_equal(got[keep], cnt[keep])
    slack = band.sum(1)
    assert (np.abs(dropped.cpu().numpy() - drop) <= slack).all()
    return band


def kernel_dense(points, feats, mode, lengths=None, mask=None):
    return pc._kernel_dense(points.contiguous(), feats, lengths, mask, LO, SIZE, DIMS, mode)


def valid_of(b, n, lengths=None, mask=None):
    if mask is not None:
        return mask.cpu().numpy()
    if lengths is not None:
        return np.arange(n)[None, :] < lengths.cpu().numpy()[:, None]
    return np.ones((b, n), bool)


# ---------------------------------------------------------------- voxelize


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("b,n", [(1, 1), (3, 37), (2, 250)])
def test_voxelize_reference_vs_numpy(mode, b, n):
    rng = seeded()
    points, feats = random_cloud(rng, b, n)
    f = feats if mode in FEATURE_MODES else None
    out = pc.voxelize(points, features=f, bounds_min=LO, voxel_size=SIZE, grid_size=DIMS,
                      mode=mode)
    assert out.grid.shape == ((b, *DIMS, 3) if f is not None else (b, *DIMS))
    assert out.grid.dtype == {"occupancy": torch.bool, "count": torch.int32}.get(mode,
                                                                                  torch.float32)
    assert (out.count is None) == (mode == "occupancy")
    check_dense(out.grid, out.count, out.dropped, points, np.ones((b, n), bool),
                feats.numpy(), mode)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("padding", ["none", "lengths", "mask"])
def test_voxelize_kernel_vs_numpy(kernel_device, mode, padding):
    rng = seeded()
    b, n = 3, 45
    points, feats = random_cloud(rng, b, n)
    points[0, 3] = float("nan")
    points[1, 5] = float("inf")
    lengths = mask = None
    if padding == "lengths":
        lengths = torch.tensor([n, 0, 17])
    if padding == "mask":
        mask = torch.from_numpy(rng.random((b, n)) < 0.6)
    dev = kernel_device
    f = feats.to(dev) if mode in FEATURE_MODES else None
    grid, count, dropped = kernel_dense(
        points.to(dev), f, mode, None if lengths is None else lengths.to(dev),
        None if mask is None else mask.to(dev))
    check_dense(grid, count, dropped, points, valid_of(b, n, lengths, mask), feats.numpy(), mode)


def test_voxelize_kernel_crosses_blocks_with_long_runs(kernel_device):
    """Sorted clouds (long runs of one voxel) across block boundaries."""
    rng = seeded()
    points, feats = random_cloud(rng, 2, 1100, f=2, spread=0.0)
    order = torch.argsort(points[..., 0], dim=1)
    points = torch.gather(points, 1, order[..., None].expand(-1, -1, 3))
    for mode in ("count", "mean", "max"):
        f = feats.to(kernel_device) if mode != "count" else None
        grid, count, dropped = kernel_dense(points.to(kernel_device), f, mode)
        check_dense(grid, count, dropped, points, np.ones((2, 1100), bool), feats.numpy(), mode)


def test_points_on_voxel_faces_are_exact(kernel_device):
    """Dyadic grid: points exactly on faces and bounds; lower faces inclusive, upper exclusive."""
    lo, size, dims = (-1.0, 0.5, 2.0), (0.25, 0.5, 0.125), (4, 3, 5)
    ks = np.stack(np.meshgrid(*[np.arange(-1, d + 2) for d in dims], indexing="ij"), -1)
    pts = (np.asarray(lo) + ks.reshape(-1, 3) * np.asarray(size)).astype(np.float32)[None]
    points = torch.from_numpy(pts)
    keys, band, drop = np_keys(pts, np.ones(pts.shape[:2], bool), lo, size, dims)
    inside = ((ks.reshape(-1, 3) >= 0) & (ks.reshape(-1, 3) < np.asarray(dims))).all(-1)
    assert (keys[0] >= 0).tolist() == inside.tolist()
    exp, _ = np_reduce(keys, None, math.prod(dims), "count")
    for out in (pc.voxelize(points, bounds_min=lo, voxel_size=size, grid_size=dims, mode="count"),
                pc.VoxelGrid(*pc._kernel_dense(points.to(kernel_device), None, None, None, lo,
                                               size, dims, "count"))):
        np.testing.assert_array_equal(out.grid.cpu().reshape(-1).numpy(), exp)
        assert int(out.dropped[0]) == drop[0] == (~inside).sum()


def test_points_on_non_dyadic_faces_stay_within_band(kernel_device):
    """voxel_size 0.1: face points are not representable; float32 may flip them (the band)."""
    rng = seeded()
    ks = rng.integers(-1, 8, size=(2, 300, 3))
    points = torch.from_numpy((np.asarray(LO) + ks * np.asarray(SIZE)).astype(np.float32))
    points[:, ::2] += torch.from_numpy(rng.uniform(0.01, 0.09, size=(2, 150, 3))).float()
    band = None
    for grid, count, dropped in (
            kernel_dense(points.to(kernel_device), None, "count"),
            pc.voxelize(points, bounds_min=LO, voxel_size=SIZE, grid_size=DIMS, mode="count")):
        band = check_dense(grid, count, dropped, points, np.ones((2, 300), bool), None, "count")
    assert band[:, ::2].sum() == 0 and band[:, 1::2].all()


@pytest.mark.parametrize("mode", MODES)
def test_sparse_vs_numpy(kernel_device, mode):
    rng = seeded()
    b, n = 2, 60
    lengths = torch.tensor([60, 41])
    valid = valid_of(b, n, lengths)
    band = True
    while band:  # ids must match exactly here: redraw the (rare) clouds with band points
        points, feats = random_cloud(rng, b, n)
        band = np_keys(points.numpy(), valid, LO, SIZE, DIMS)[1].any()
    f = feats if mode in FEATURE_MODES else None
    outs = [pc.voxelize(points, features=f, lengths=lengths, bounds_min=LO, voxel_size=SIZE,
                        grid_size=DIMS, mode=mode, sparse=True)]
    keys, dropped = pc._kernel_keys(points.to(kernel_device), lengths.to(kernel_device), None,
                                    LO, SIZE, DIMS)
    outs.append(pc._sparse(keys, dropped, None if f is None else f.to(kernel_device), mode, b, n,
                           DIMS))
    exp_keys, _, drop = np_keys(points.numpy(), valid, LO, SIZE, DIMS)
    uniq, inverse = np.unique(exp_keys[exp_keys >= 0], return_inverse=True)
    vals, cnt = np_reduce(np.searchsorted(uniq, exp_keys) * (exp_keys >= 0) - (exp_keys < 0),
                          feats.numpy(), len(uniq), mode)
    for out in outs:
        m = len(uniq)
        assert out.coords.shape == (min(b * n, b * math.prod(DIMS)), 4)
        assert int(out.num_voxels) == m
        trimmed = out.trim()
        c = trimmed.coords.cpu().numpy().astype(np.int64)
        lin = ((c[:, 0] * DIMS[0] + c[:, 1]) * DIMS[1] + c[:, 2]) * DIMS[2] + c[:, 3]
        np.testing.assert_array_equal(lin, uniq)
        np.testing.assert_array_equal(trimmed.count.cpu().numpy(), cnt)
        p2v = out.point_to_voxel.cpu().numpy()
        np.testing.assert_array_equal(p2v[exp_keys < 0], -1)
        np.testing.assert_array_equal(p2v[exp_keys >= 0], inverse)
        assert (out.coords[m:] == -1).all() and (out.count[m:] == 0).all()
        np.testing.assert_array_equal(out.dropped.cpu().numpy(), drop)
        if mode in FEATURE_MODES:
            assert_close(trimmed.values, vals, torch.float32)
            assert (out.values[m:] == 0).all()
        else:
            assert out.values is None


# ---------------------------------------------------------------- depth


def camera(rng, b, h, w):
    k = np.zeros((b, 3, 3), np.float32)
    k[:, 0, 0] = rng.uniform(0.8, 1.2, b) * w
    k[:, 1, 1] = rng.uniform(0.8, 1.2, b) * w
    k[:, 0, 2] = (w - 1) / 2 + rng.uniform(-1, 1, b)
    k[:, 1, 2] = (h - 1) / 2 + rng.uniform(-1, 1, b)
    k[:, 2, 2] = 1
    a = rng.uniform(-0.5, 0.5, b)
    e = np.tile(np.eye(4, dtype=np.float32), (b, 1, 1))
    e[:, 0, 0], e[:, 0, 2], e[:, 2, 0], e[:, 2, 2] = np.cos(a), np.sin(a), -np.sin(a), np.cos(a)
    e[:, :3, 3] = rng.uniform(-0.3, 0.3, (b, 3))
    return torch.from_numpy(k), torch.from_numpy(e)


def depth_image(rng, b, h, w, dtype):
    """Depth with holes (0), NaN (float), out-of-range values; metres or millimetres."""
    d = rng.uniform(0.3, 2.5, (b, h, w))
    d[rng.random((b, h, w)) < 0.1] = 0
    if dtype == torch.uint16:
        return torch.from_numpy(np.round(d * 1000).astype(np.uint16))
    d[rng.random((b, h, w)) < 0.05] = np.nan
    return torch.from_numpy(d).to(dtype)


@pytest.mark.parametrize("dtype", [torch.uint16, torch.float32, torch.float16])
@pytest.mark.parametrize("with_extrinsics", [False, True])
def test_depth_to_points_vs_pinhole(kernel_device, dtype, with_extrinsics):
    rng = seeded()
    b, h, w = 2, 9, 13
    depth = depth_image(rng, b, h, w, dtype)
    k, e = camera(rng, b, h, w)
    e = e if with_extrinsics else None
    kw = dict(min_depth=0.4005, max_depth=2.2005)  # off the mm grid: range tests are float32
    scale = 0.001 if dtype == torch.uint16 else 1.0
    exp_pts, exp_valid = np_backproject(depth.float().numpy(), k.numpy(),
                                        None if e is None else e.numpy(), scale, **kw)
    rgb = torch.from_numpy(rng.integers(0, 256, (b, h, w, 3), dtype=np.uint8))
    out = pc.depth_to_points(depth, k, extrinsics=e, rgb=rgb, **kw)
    assert torch.equal(out.colors, rgb.reshape(b, h * w, 3))
    dev = kernel_device
    got_k = pc._DEPTH_TO_POINTS.cuda()(depth.to(dev), k.to(dev),
                                       None if e is None else e.to(dev), scale, kw["min_depth"],
                                       kw["max_depth"])
    for points, valid in ((out.points, out.valid), got_k):
        np.testing.assert_array_equal(valid.cpu().numpy(), exp_valid)
        assert points.dtype == torch.float32 and points.shape == (b, h * w, 3)
        assert torch.isnan(points[~valid]).all()
        assert_close(points.cpu()[valid.cpu()], exp_pts[exp_valid], torch.float32, scale=3)


def test_depth_to_points_unbatched_shared_intrinsics():
    rng = seeded()
    depth = depth_image(rng, 1, 6, 5, torch.float32)
    k, _ = camera(rng, 1, 6, 5)
    out = pc.depth_to_points(depth[0], k[0])
    assert out.points.shape == (30, 3) and out.valid.shape == (30,) and out.colors is None
    exp, valid = np_backproject(depth.numpy(), k.numpy(), None, 1.0)
    assert_close(out.points[out.valid], exp[0][valid[0]], torch.float32)


@pytest.mark.parametrize("mode", MODES)
def test_fused_equals_unfused_kernel(kernel_device, mode):
    """One kernel from depth == backproject kernel + voxelize kernel (same float32 ops)."""
    rng = seeded()
    b, h, w = 2, 11, 14
    dev = kernel_device
    depth = depth_image(rng, b, h, w, torch.uint16).to(dev)
    k, e = (t.to(dev) for t in camera(rng, b, h, w))
    rgb = torch.from_numpy(rng.integers(0, 256, (b, h, w, 3), dtype=np.uint8)).to(dev)
    feats = rgb if mode in FEATURE_MODES else None
    lo, size, dims = (-1.5, -1.0, 0.0), (0.3, 0.25, 0.2), (9, 8, 13)
    fused = pc._kernel_depth(depth, k, e, feats, 0.001, 0.0, math.inf, lo, size, dims, mode,
                             False)
    points, valid = pc._DEPTH_TO_POINTS.cuda()(depth, k, e, 0.001, 0.0, math.inf)
    f = None if feats is None else feats.reshape(b, h * w, 3)
    unfused = pc._kernel_dense(points, f, None, valid, lo, size, dims, mode)
    exact = mode in ("occupancy", "count", "max")
    for a, x in zip(fused, unfused, strict=True):
        if a is not None:
            assert torch.equal(a, x) if exact else torch.allclose(a, x, rtol=1e-6, atol=1e-4)
    keys_f, drop_f = pc._kernel_depth(depth, k, e, None, 0.001, 0.0, math.inf, lo, size, dims,
                                      mode, True)
    keys_u, drop_u = pc._kernel_keys(points, None, valid, lo, size, dims)
    assert torch.equal(keys_f, keys_u) and torch.equal(drop_f, drop_u)


@pytest.mark.parametrize("mode", ["count", "mean"])
@pytest.mark.parametrize("sparse", [False, True])
def test_depth_to_voxels_vs_numpy(mode, sparse):
    rng = seeded()
    b, h, w = 2, 12, 10
    depth = depth_image(rng, b, h, w, torch.float32)
    k, e = camera(rng, b, h, w)
    rgb = torch.from_numpy(rng.uniform(0, 1, (b, h, w, 3)).astype(np.float32))
    feats = rgb if mode == "mean" else None
    lo, size, dims = (-1.5, -1.0, 0.0), (0.3, 0.25, 0.2), (9, 8, 13)
    out = pc.depth_to_voxels(depth, k, extrinsics=e, rgb=feats, bounds_min=lo, voxel_size=size,
                             grid_size=dims, mode=mode, sparse=sparse)
    pts, valid = pc.depth_to_points(depth, k, extrinsics=e)[:2]
    ref = pc.voxelize(pts, features=None if feats is None else feats.reshape(b, -1, 3),
                      mask=valid, bounds_min=lo, voxel_size=size, grid_size=dims, mode=mode,
                      sparse=sparse)
    for a, x in zip(out, ref, strict=True):
        assert (a is None and x is None) or torch.equal(a, x)
    if not sparse:
        exp_pts, exp_valid = np_backproject(depth.numpy(), k.numpy(), e.numpy(), 1.0)
        np.testing.assert_array_equal(valid.numpy(), exp_valid)
        check_dense(out.grid, out.count, out.dropped, torch.from_numpy(exp_pts), exp_valid,
                    rgb.reshape(b, -1, 3).numpy(), mode, dims, lo, size)


# ---------------------------------------------------------------- edge cases


def test_depth_to_voxels_unbatched():
    rng = seeded()
    depth = depth_image(rng, 1, 7, 8, torch.uint16)
    k, _ = camera(rng, 1, 7, 8)
    kw = dict(bounds_min=(-1.5, -1.0, 0.0), voxel_size=0.25, grid_size=(12, 8, 11), mode="count")
    one = pc.depth_to_voxels(depth[0], k[0], **kw)
    batched = pc.depth_to_voxels(depth, k, **kw)
    assert one.grid.shape == (12, 8, 11) and one.dropped.shape == ()
    assert torch.equal(one.grid, batched.grid[0]) and torch.equal(one.dropped, batched.dropped[0])
    sp = pc.depth_to_voxels(depth[0], k[0], sparse=True, **kw)
    assert sp.point_to_voxel.shape == (56,) and int(sp.num_voxels) == int(one.grid.gt(0).sum())


@pytest.mark.parametrize("sparse", [False, True])
@pytest.mark.parametrize("shape", [(0, 5), (3, 0)])
def test_empty_clouds_give_empty_grids(kernel_device, sparse, shape):
    points = torch.zeros(*shape, 3)
    feats = torch.zeros(*shape, 2)
    out = pc.voxelize(points, features=feats, bounds_min=0, voxel_size=1, grid_size=(2, 3, 4),
                      mode="mean", sparse=sparse)
    if sparse:
        assert out.coords.shape == (0, 4) and int(out.num_voxels) == 0
        assert out.point_to_voxel.shape == shape
    else:
        assert out.grid.shape == (shape[0], 2, 3, 4, 2) and not out.grid.any()
        assert not out.count.any()
    assert out.dropped.shape == (shape[0],) and not out.dropped.any()
    grid, count, dropped = pc._kernel_dense(points.to(kernel_device), feats.to(kernel_device),
                                            None, None, (0, 0, 0), (1, 1, 1), (2, 3, 4), "mean")
    assert grid.shape == (shape[0], 2, 3, 4, 2) and not grid.any() and not count.any()


def test_nan_and_inf_points_are_dropped_and_counted():
    points = torch.tensor([[0.5, 0.5, 0.5], [float("nan"), 0.5, 0.5], [0.5, float("inf"), 0.5],
                           [-float("inf"), 0.5, 0.5], [5.0, 0.5, 0.5]])
    out = pc.voxelize(points, bounds_min=0, voxel_size=0.5, grid_size=4, mode="count")
    assert out.grid.shape == (4, 4, 4) and int(out.grid.sum()) == 1 and int(out.dropped) == 4
    sp = pc.voxelize(points, bounds_min=0, voxel_size=0.5, grid_size=4, sparse=True)
    assert sp.point_to_voxel.tolist() == [0, -1, -1, -1, -1] and int(sp.dropped) == 4


def test_unbatched_uint8_features_and_max():
    points = torch.tensor([[0.1, 0.1, 0.1], [0.2, 0.2, 0.2], [0.9, 0.1, 0.1]])
    rgb = torch.tensor([[10, 20, 30], [30, 0, 250], [1, 2, 3]], dtype=torch.uint8)
    kw = dict(features=rgb, bounds_min=0, voxel_size=0.5, grid_size=2)
    mean = pc.voxelize(points, mode="mean", **kw)
    mx = pc.voxelize(points, mode="max", **kw)
    assert mean.grid.shape == (2, 2, 2, 3) and mean.grid[0, 0, 0].tolist() == [20, 10, 140]
    assert mx.grid[0, 0, 0].tolist() == [30, 20, 250] and mx.grid[1, 0, 0].tolist() == [1, 2, 3]
    assert mx.grid[1, 1, 1].tolist() == [0, 0, 0] and mean.count.sum() == 3


# ---------------------------------------------------------------- custom ops


@pytest.fixture(scope="module")
def custom_ops(request):
    """Where the three custom ops run: the voxelizers' launchers serve CPU tensors too (through
    the interpreter), so the fake implementations and tracing are checked in CI too."""
    return "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("mode", ["occupancy", "count", "mean", "max"])
def test_custom_ops_fake_and_trace(custom_ops, mode):
    rng = seeded()
    dev = custom_ops
    depth = depth_image(rng, 2, 6, 9, torch.uint16).to(dev)
    k, e = (t.to(dev) for t in camera(rng, 2, 6, 9))
    rgb = torch.from_numpy(rng.integers(0, 256, (2, 6, 9, 3), dtype=np.uint8)).to(dev)
    feats = rgb if mode in FEATURE_MODES else None
    grid = ([-1.5, -1.0, 0.0], [0.3, 0.25, 0.2], [9, 8, 13])
    cam = (depth, k, e)
    checks = [(torch.ops.robocache.voxelize_depth.default,
               (*cam, feats, 0.001, 0.0, math.inf, *grid, mode, False)),
              (torch.ops.robocache.voxelize_depth.default,
               (*cam, None, 0.001, 0.0, math.inf, *grid, "occupancy", True)),
              (torch.ops.robocache.depth_to_points.default, (*cam, 0.001, 0.0, math.inf))]
    points, valid = torch.ops.robocache.depth_to_points(*cam, 0.001, 0.0, math.inf)
    f = None if feats is None else feats.reshape(2, -1, 3)
    checks.append((torch.ops.robocache.voxelize_points.default,
                   (points, f, None, valid, *grid, mode, False)))
    for op, args in checks:
        torch.library.opcheck(op, args, test_utils=("test_schema", "test_faketensor"))

    def fused(d):
        return pc._kernel_depth(d, k, e, feats, 0.001, 0.0, math.inf, *grid, mode, False)

    traced = torch.compile(fused, fullgraph=True, backend="eager")(depth)
    for a, x in zip(traced, fused(depth), strict=True):
        assert (a is None and x is None) or torch.allclose(a.float(), x.float())


# ---------------------------------------------------------------- validation


def _kw(**over):
    kw = dict(bounds_min=0.0, voxel_size=0.5, grid_size=4, mode="occupancy")
    kw.update(over)
    return kw


P3 = torch.zeros(2, 5, 3)


@pytest.mark.parametrize("args,kw,exc,match", [
    ((torch.zeros(5, 2),), _kw(), ShapeError, r"\[B, N, 3\]"),
    ((torch.zeros(5, 3, dtype=torch.int32),), _kw(), DTypeError, "points"),
    ((P3,), _kw(mode="median"), ValueError, "mode"),
    ((P3,), _kw(mode="mean"), ValueError, "features"),
    ((P3,), _kw(features=torch.zeros(2, 5, 1)), ValueError, "does not use features"),
    ((P3,), _kw(mode="sum", features=torch.zeros(2, 4, 1)), ShapeError, "features"),
    ((P3,), _kw(mode="sum", features=torch.zeros(2, 5, 1, dtype=torch.int64)), DTypeError,
     "features"),
    ((P3,), _kw(voxel_size=0.0), ValueError, "voxel_size"),
    ((P3,), _kw(voxel_size=(1.0, float("nan"), 1.0)), ValueError, "voxel_size"),
    ((P3,), _kw(voxel_size=(1.0, 1.0)), ValueError, "voxel_size"),
    ((P3,), _kw(grid_size=(4, 0, 4)), ValueError, "grid_size"),
    ((P3,), _kw(grid_size=2.5), ValueError, "grid_size"),
    ((P3,), _kw(bounds_min=(0.0, float("inf"), 0.0)), ValueError, "bounds_min"),
    ((P3,), _kw(lengths=torch.tensor([1, 2]), mask=torch.ones(2, 5, dtype=torch.bool)),
     ValueError, "not both"),
    ((P3,), _kw(lengths=torch.tensor([1.0, 2.0])), DTypeError, "lengths"),
    ((P3,), _kw(lengths=torch.tensor([1, 2, 3])), ShapeError, "lengths"),
    ((P3,), _kw(lengths=torch.tensor([1, 6])), DataError, r"\[0, 5\]"),
    ((P3,), _kw(mask=torch.ones(2, 5)), DTypeError, "mask"),
    ((P3,), _kw(mask=torch.ones(2, 4, dtype=torch.bool)), ShapeError, "mask"),
    ((P3,), _kw(grid_size=(1 << 20, 1 << 20, 1 << 20)), ShapeError,
     r"needs 2,305,843,009,213,693,952 bytes"),
])
def test_voxelize_validation(args, kw, exc, match):
    with pytest.raises(exc, match=match):
        pc.voxelize(*args, **kw)


def test_voxelize_device_mismatch():
    meta = torch.zeros(2, 5, 1, device="meta")
    with pytest.raises(DeviceError, match="features"):
        pc.voxelize(P3, features=meta, **_kw(mode="sum"))


D = torch.ones(2, 4, 6)
K = torch.eye(3)


@pytest.mark.parametrize("args,kw,exc,match", [
    ((torch.ones(4, 6, 1, 1), K), {}, ShapeError, "depth"),
    ((torch.ones(2, 4, 6, dtype=torch.int32), K), {}, DTypeError, "uint16"),
    ((D, torch.eye(4)), {}, ShapeError, "intrinsics"),
    ((D, torch.eye(3).expand(3, 3, 3)), {}, ShapeError, "intrinsics"),
    ((D, torch.eye(3, dtype=torch.int64)), {}, DTypeError, "intrinsics"),
    ((D, torch.eye(3, device="meta")), {}, DeviceError, "intrinsics"),
    ((D, K), dict(extrinsics=torch.eye(3)), ShapeError, "extrinsics"),
    ((D, K), dict(rgb=torch.ones(2, 4, 5, 3)), ShapeError, "rgb"),
    ((D, K), dict(rgb=torch.ones(2, 4, 6, 3, dtype=torch.int16)), DTypeError, "rgb"),
    ((D, K), dict(depth_scale=0.0), ValueError, "depth_scale"),
    ((D, K), dict(min_depth=2.0, max_depth=1.0), ValueError, "min_depth"),
])
def test_depth_validation(args, kw, exc, match):
    with pytest.raises(exc, match=match):
        pc.depth_to_points(*args, **kw)
    with pytest.raises(exc, match=match):
        pc.depth_to_voxels(*args, **kw, **_kw(mode="mean" if "rgb" in kw else "occupancy"))


def test_depth_to_voxels_mode_needs_rgb():
    with pytest.raises(ValueError, match="rgb"):
        pc.depth_to_voxels(D, K, **_kw(mode="mean"))


# ---------------------------------------------------------------- GPU


def realistic_depth(b):
    """The benchmark's 640x480 room scene (uint16 mm depth with holes, uint8 rgb, intrinsics)."""
    from robocache.cli.bench import load

    return load("pointcloud").scene(b)


GRID = dict(bounds_min=(-2.0, -2.0, 0.0), voxel_size=4.0 / 64, grid_size=64)


@pytest.mark.gpu
@pytest.mark.parametrize("mode", MODES)
def test_gpu_realistic_frame_matches_reference(mode):
    depth, rgb, k = realistic_depth(2)
    feats = rgb if mode in FEATURE_MODES else None
    cpu = pc.depth_to_voxels(depth, k, rgb=feats, mode=mode, **GRID)
    torch.cuda.empty_cache()
    torch.full((64 << 20,), float("nan"), device="cuda")  # poison the allocator's next blocks
    dev = [t.cuda() if t is not None else None for t in (depth, feats, k)]
    gpu = pc.depth_to_voxels(dev[0], dev[2], rgb=dev[1], mode=mode, **GRID)
    again = pc.depth_to_voxels(dev[0], dev[2], rgb=dev[1], mode=mode, **GRID)
    pts, valid, colors = pc.depth_to_points(dev[0], dev[2], rgb=dev[1])
    unfused = pc.voxelize(pts, features=colors, mask=valid, mode=mode, **GRID)
    same = None if cpu.count is None else gpu.count.cpu() == cpu.count
    for c, g, a, un in zip(cpu, gpu, again, unfused, strict=True):
        if c is None:
            continue
        # Fused vs unfused may differ only in the boundary band: the fused kernel never
        # rounds a point to memory, so the compiler may contract its last multiply into the
        # floor's FMA and flip a point lying within an ulp of a voxel face.
        both = same if same is None else same & (gpu.count == unfused.count).cpu()
        if g.is_floating_point() and mode in ("sum", "mean"):  # float addition order differs
            # equal counts can still hide a boundary point traded between two voxels
            close = torch.isclose(g.cpu()[same], c[same], rtol=1e-4, atol=1e-2)
            assert (~close).float().mean() < 1e-5
            torch.testing.assert_close(g, a, rtol=1e-5, atol=1e-3)
            close = torch.isclose(g.cpu()[both], un.cpu()[both], rtol=1e-5, atol=1e-3)
            assert (~close).float().mean() < 1e-5
        else:  # deterministic: bitwise across runs; a band of flips vs CPU and unfused
            assert torch.equal(g, a)
            assert (g != un).float().mean() < 1e-4
            assert (g.cpu() != c).float().mean() < 1e-3


@pytest.mark.gpu
def test_gpu_sparse_and_compile_and_graph():
    depth, rgb, k = realistic_depth(3)
    depth, rgb, k = depth.cuda(), rgb.cuda(), k.cuda()
    sp = pc.depth_to_voxels(depth, k, rgb=rgb, mode="mean", sparse=True, **GRID)
    dense = pc.depth_to_voxels(depth, k, rgb=rgb, mode="mean", **GRID)
    t = sp.trim()
    c = t.coords.long()
    assert torch.equal(dense.count[c[:, 0], c[:, 1], c[:, 2], c[:, 3]], t.count)
    torch.testing.assert_close(dense.grid[c[:, 0], c[:, 1], c[:, 2], c[:, 3]], t.values)
    assert int(dense.count.gt(0).sum()) == int(sp.num_voxels)

    def f(d, r):
        return pc.depth_to_voxels(d, k, rgb=r, mode="mean", **GRID)

    compiled = torch.compile(f, fullgraph=True)(depth, rgb)
    torch.testing.assert_close(compiled.grid, dense.grid)
    assert torch.equal(compiled.count, dense.count)
    pts = pc.depth_to_points(depth, k)
    cs = torch.compile(lambda p, m: pc.voxelize(p, mask=m, sparse=True, **GRID),
                       fullgraph=True)(pts.points, pts.valid)
    assert torch.equal(cs.coords, pc.voxelize(pts.points, mask=pts.valid, sparse=True,
                                              **GRID).coords)
    graph = torch.cuda.CUDAGraph()
    f(depth, rgb)
    with torch.cuda.graph(graph):
        out = f(depth, rgb)
    graph.replay()
    assert torch.equal(out.count, dense.count)
