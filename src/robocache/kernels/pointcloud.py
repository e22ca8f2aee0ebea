"""Triton kernels for depth backprojection and voxelization (semantics: reference/pointcloud.py).

One program handles BLOCK consecutive points (or pixels, row-major) of one cloud. Points from a
depth image arrive in pixel order, so neighbours mostly land in the same voxel (a 6 cm voxel at
1 m covers ~40x40 pixels), and the atomics of one warp to one address mostly hit L2 together.
Merging runs of equal keys by a segmented scan before the atomics was measured and dropped: at
256 points per program the scans cost what the saved atomics gain (H100, 640x480 -> 64^3 mean,
CUDA graph, 8 frames: 96.9 us without vs 102.3 us with;
benchmarks/results/pointcloud-h100-2026-11-22.json).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from robocache._plancache import PlanCache
from robocache.kernels._utils import CachedLaunch, cdiv, next_pow2

MODE_IDS = {"occupancy": 0, "count": 1, "sum": 2, "mean": 3, "max": 4}
FLT_MAX = 3.4028234663852886e38


@triton.jit
def _voxel_key(x, y, z, ok, lo_x, lo_y, lo_z, iv_x, iv_y, iv_z, gx, gy, gz):
    """Key within the cloud's grid (int64, -1 when not inside) and whether ok points are inside.

    Multiplies by the float32 reciprocal of the voxel size (iv_*): IEEE divisions (div_rn) here
    and in the backprojection made the occupancy kernel ALU-bound (42 us for 8 frames on H100).
    """
    ix = tl.floor((x - lo_x) * iv_x)
    iy = tl.floor((y - lo_y) * iv_y)
    iz = tl.floor((z - lo_z) * iv_z)
    inside = ok & (ix >= 0) & (ix < gx) & (iy >= 0) & (iy < gy) & (iz >= 0) & (iz < gz)
    ix = tl.where(inside, ix, 0).to(tl.int64)
    iy = tl.where(inside, iy, 0).to(tl.int64)
    iz = tl.where(inside, iz, 0).to(tl.int64)
    return tl.where(inside, (ix * gy + iy) * gz + iz, -1), inside


@triton.jit
def _point_at(pts_ptr, mask_ptr, b, offs, n, n_valid, HAS_MASK: tl.constexpr):
    ok = (offs >= 0) & (offs < n_valid)
    row = b.to(tl.int64) * n + offs
    if HAS_MASK:
        ok = ok & (tl.load(mask_ptr + row, mask=ok, other=0) != 0)
    x = tl.load(pts_ptr + row * 3, mask=ok, other=0.0).to(tl.float32)
    y = tl.load(pts_ptr + row * 3 + 1, mask=ok, other=0.0).to(tl.float32)
    z = tl.load(pts_ptr + row * 3 + 2, mask=ok, other=0.0).to(tl.float32)
    return x, y, z, ok


@triton.jit
def _pixel_at(depth_ptr, k_ptr, e_ptr, b, offs, hw, w, scale, min_z, max_z,
              K_STRIDE: tl.constexpr, E_STRIDE: tl.constexpr, HAS_EXT: tl.constexpr):
    """Backproject pixels `offs` (row-major) of image b; max_z is finite, so inf is invalid."""
    ok = (offs >= 0) & (offs < hw)
    d = tl.load(depth_ptr + b.to(tl.int64) * hw + offs, mask=ok, other=0).to(tl.float32)
    z = d * scale
    ok = ok & (z > 0) & (z >= min_z) & (z <= max_z)
    k = k_ptr + b * K_STRIDE
    fx, fy = tl.load(k).to(tl.float32), tl.load(k + 4).to(tl.float32)
    cx, cy = tl.load(k + 2).to(tl.float32), tl.load(k + 5).to(tl.float32)
    u = (offs % w).to(tl.float32)
    v = (offs // w).to(tl.float32)
    x = (u - cx) * z * tl.math.div_rn(1.0, fx)
    y = (v - cy) * z * tl.math.div_rn(1.0, fy)
    if HAS_EXT:
        e = e_ptr + b * E_STRIDE
        wx = (tl.load(e).to(tl.float32) * x + tl.load(e + 1).to(tl.float32) * y
              + tl.load(e + 2).to(tl.float32) * z + tl.load(e + 3).to(tl.float32))
        wy = (tl.load(e + 4).to(tl.float32) * x + tl.load(e + 5).to(tl.float32) * y
              + tl.load(e + 6).to(tl.float32) * z + tl.load(e + 7).to(tl.float32))
        wz = (tl.load(e + 8).to(tl.float32) * x + tl.load(e + 9).to(tl.float32) * y
              + tl.load(e + 10).to(tl.float32) * z + tl.load(e + 11).to(tl.float32))
        x, y, z = wx, wy, wz
    return x, y, z, ok


@triton.jit
def _emit(key, ok, b, offs, n, feat_ptr, f, buf_ptr, off_cnt, off_drop, nvox,
          MODE: tl.constexpr, KEYS: tl.constexpr, BLOCK: tl.constexpr, FP: tl.constexpr):
    """Count dropped points, then write keys (sparse path) or reduce into the dense grid.

    `buf_ptr` is the launcher's one buffer (`buffer_layout`): keys, occupancy flags or values
    at offset 0, int32 counts at `off_cnt` and dropped counts at `off_drop` (its elements).
    """
    hit = key >= 0
    drop_ptr = (buf_ptr + off_drop).to(tl.pointer_type(tl.int32), bitcast=True)
    cnt_ptr = (buf_ptr + off_cnt).to(tl.pointer_type(tl.int32), bitcast=True)
    tl.atomic_add(drop_ptr + b, tl.sum((ok & ~hit).to(tl.int32), 0), sem="relaxed")
    row = b.to(tl.int64) * n + offs
    if KEYS:
        tl.store(buf_ptr + row, tl.where(hit, b * nvox + key, -1), mask=offs < n)
    else:
        vox = b * nvox + tl.where(hit, key, 0)
        if MODE == 0:
            tl.store(buf_ptr + vox, tl.full([BLOCK], 1, tl.uint8), mask=hit)
        else:
            tl.atomic_add(cnt_ptr + vox, hit.to(tl.int32), mask=hit, sem="relaxed")
        if MODE >= 2:
            cols = tl.arange(0, FP)[None, :]
            m = hit[:, None] & (cols < f)
            vals = tl.load(feat_ptr + row[:, None] * f + cols, mask=m, other=0).to(tl.float32)
            dst = buf_ptr + vox[:, None] * f + cols
            if MODE == 4:
                tl.atomic_max(dst, vals, mask=m, sem="relaxed")
            else:
                tl.atomic_add(dst, vals, mask=m, sem="relaxed")


@triton.jit
def _voxelize_kernel(pts_ptr, feat_ptr, len_ptr, mask_ptr, buf_ptr, off_cnt, off_drop, n, f,
                     lo_x, lo_y, lo_z, iv_x, iv_y, iv_z, gx, gy, gz,
                     HAS_LEN: tl.constexpr, HAS_MASK: tl.constexpr, MODE: tl.constexpr,
                     KEYS: tl.constexpr, BLOCK: tl.constexpr, FP: tl.constexpr):
    b = tl.program_id(1)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    n_valid = tl.minimum(tl.load(len_ptr + b).to(tl.int32), n) if HAS_LEN else n
    x, y, z, ok = _point_at(pts_ptr, mask_ptr, b, offs, n, n_valid, HAS_MASK)
    key, _ = _voxel_key(x, y, z, ok, lo_x, lo_y, lo_z, iv_x, iv_y, iv_z, gx, gy, gz)
    _emit(key, ok, b, offs, n, feat_ptr, f, buf_ptr, off_cnt, off_drop,
          gx.to(tl.int64) * gy * gz, MODE, KEYS, BLOCK, FP)


@triton.jit
def _depth_voxelize_kernel(depth_ptr, k_ptr, e_ptr, feat_ptr, buf_ptr, off_cnt, off_drop, hw,
                           w, f, scale, min_z, max_z, lo_x, lo_y, lo_z,
                           iv_x, iv_y, iv_z, gx, gy, gz, K_STRIDE: tl.constexpr,
                           E_STRIDE: tl.constexpr, HAS_EXT: tl.constexpr, MODE: tl.constexpr,
                           KEYS: tl.constexpr, BLOCK: tl.constexpr, FP: tl.constexpr):
    b = tl.program_id(1)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x, y, z, ok = _pixel_at(depth_ptr, k_ptr, e_ptr, b, offs, hw, w, scale, min_z, max_z,
                            K_STRIDE, E_STRIDE, HAS_EXT)
    key, _ = _voxel_key(x, y, z, ok, lo_x, lo_y, lo_z, iv_x, iv_y, iv_z, gx, gy, gz)
    _emit(key, ok, b, offs, hw, feat_ptr, f, buf_ptr, off_cnt, off_drop,
          gx.to(tl.int64) * gy * gz, MODE, KEYS, BLOCK, FP)


@triton.jit
def _depth_to_points_kernel(depth_ptr, k_ptr, e_ptr, pts_ptr, valid_ptr, hw, w, scale, min_z,
                            max_z, K_STRIDE: tl.constexpr, E_STRIDE: tl.constexpr,
                            HAS_EXT: tl.constexpr, BLOCK: tl.constexpr):
    b = tl.program_id(1)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x, y, z, ok = _pixel_at(depth_ptr, k_ptr, e_ptr, b, offs, hw, w, scale, min_z, max_z,
                            K_STRIDE, E_STRIDE, HAS_EXT)
    row = b.to(tl.int64) * hw + offs
    inb = offs < hw
    nan = float("nan")
    tl.store(pts_ptr + row * 3, tl.where(ok, x, nan), mask=inb)
    tl.store(pts_ptr + row * 3 + 1, tl.where(ok, y, nan), mask=inb)
    tl.store(pts_ptr + row * 3 + 2, tl.where(ok, z, nan), mask=inb)
    tl.store(valid_ptr + row, ok.to(tl.uint8), mask=inb)


@triton.jit
def _finalize_kernel(val_ptr, off_cnt, nvox, f, MODE: tl.constexpr, BLOCK: tl.constexpr,
                     FP: tl.constexpr):
    """mean: sum / count; max: empty voxels (still -inf) become 0. In place."""
    cnt_ptr = (val_ptr + off_cnt).to(tl.pointer_type(tl.int32), bitcast=True)
    rows = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    cols = tl.arange(0, FP)
    m = (rows < nvox)[:, None] & (cols[None, :] < f)
    cnt = tl.load(cnt_ptr + rows, mask=rows < nvox, other=0)
    ptr = val_ptr + rows[:, None] * f + cols[None, :]
    vals = tl.load(ptr, mask=m, other=0.0)
    if MODE == 3:
        vals = vals / tl.maximum(cnt, 1).to(tl.float32)[:, None]
    else:
        vals = tl.where(cnt[:, None] > 0, vals, 0.0)
    tl.store(ptr, vals, mask=m)


# Points per program (at most; small clouds get a smaller block instead of mostly-masked
# programs). H100, 640x480 uint16 depth + rgb -> 64^3 mean, CUDA graph, 8 frames: block
# 128 / 256 / 512 / 1024 -> 101.5 / 96.9 / 97.5 / 109.4 us
# (benchmarks/results/pointcloud-h100-2026-11-22.json; docs/pointcloud.md).
MAX_BLOCK = 256


def _block(n: int) -> int:
    return min(MAX_BLOCK, max(16, next_pow2(n)))


def _grid_args(bounds_min, voxel_size, grid_size) -> list:
    return [*map(float, bounds_min), *(1.0 / float(s) for s in voxel_size),
            *map(int, grid_size)]


def _camera_args(intrinsics: torch.Tensor, extrinsics: torch.Tensor | None, b: int):
    """Flattened camera tensors and their per-image strides (0 when shared by the batch)."""
    k = intrinsics.reshape(-1, 9)
    e = k if extrinsics is None else extrinsics.reshape(-1, 16)
    k_stride = 9 if k.shape[0] == b and b > 1 else 0
    e_stride = 16 if e.shape[0] == b and b > 1 and extrinsics is not None else 0
    return k, e, k_stride, e_stride


def buffer_layout(b: int, n: int, f: int, grid_size, mode: str, keys: bool):
    """(dtype, numel, off_cnt, off_drop) of the one buffer a launcher returns (`split_buffer`).

    keys: int64 ``[B*N]`` keys, then the int32 dropped counts. occupancy: uint8 ``[B*X*Y*Z]``
    flags, padding to 4 bytes, dropped. Otherwise float32 ``[B*X*Y*Z*F]`` values (F = 0 for
    count), int32 ``[B*X*Y*Z]`` counts (as float32 bits), dropped. One allocation and one memset
    clear everything, and the kernels derive every pointer from the buffer: each extra zeros()
    or view costs host time (a zeros() is ~12 us on the H100 host).
    """
    nvox = b * grid_size[0] * grid_size[1] * grid_size[2]
    if keys:
        return torch.int64, b * n + cdiv(b, 2), 0, b * n
    if mode == "occupancy":
        pad = cdiv(nvox, 4) * 4
        return torch.uint8, pad + 4 * b, 0, pad
    nval = nvox * f if mode in ("sum", "mean", "max") else 0
    return torch.float32, nval + nvox + b, nval, nval + nvox


def split_buffer(buf: torch.Tensor, b: int, n: int, f: int, grid_size, mode: str, keys: bool):
    """Views of a launcher's buffer: (keys [B, N], dropped) or (values, count, dropped)."""
    _, _, off_cnt, off_drop = buffer_layout(b, n, f, grid_size, mode, keys)
    dropped = buf[off_drop:].view(torch.int32)[:b]
    if keys:
        return buf[:off_drop].view(b, n), dropped
    shape = (b, *grid_size)
    if mode == "occupancy":
        return buf[:math.prod(shape)].view(torch.bool).view(shape), None, dropped
    count = buf[off_cnt:off_drop].view(torch.int32).view(shape)
    vals = buf[:off_cnt].view(*shape, f) if mode in ("sum", "mean", "max") else count
    return vals, count, dropped


def _buffer(b: int, n: int, f: int, grid_size, mode: str, keys: bool, device):
    """The launcher's buffer, zeroed where the kernels accumulate, and its two offsets."""
    dtype, numel, off_cnt, off_drop = buffer_layout(b, n, f, grid_size, mode, keys)
    if keys:
        buf = torch.empty(numel, dtype=dtype, device=device)
        buf[off_drop:].zero_()
    else:
        buf = torch.zeros(numel, dtype=dtype, device=device)
        if mode == "max":
            buf[:off_cnt].fill_(float("-inf"))
    return buf, off_cnt, off_drop


def _finalize(buf: torch.Tensor, off_cnt: int, off_drop: int, f: int, mode: str) -> None:
    nvox = off_drop - off_cnt
    if mode in ("mean", "max") and nvox:
        block = 256
        _finalize_kernel[(cdiv(nvox, block),)](buf, off_cnt, nvox, f, MODE=MODE_IDS[mode],
                                               BLOCK=block, FP=next_pow2(f))


def voxelize_cuda(points: torch.Tensor, features: torch.Tensor | None,
                  lengths: torch.Tensor | None, mask: torch.Tensor | None, bounds_min,
                  voxel_size, grid_size, mode: str, keys: bool) -> torch.Tensor:
    """Points ``[B, N, 3]`` (contiguous) -> the buffer of `buffer_layout` (grid or keys)."""
    b, n, _ = points.shape
    f = features.shape[-1] if features is not None else 1
    buf, off_cnt, off_drop = _buffer(b, n, f, grid_size, mode, keys, points.device)
    if b and n:
        block = _block(n)
        _voxelize_kernel[(cdiv(n, block), b)](
            points, features if features is not None else points,
            lengths if lengths is not None else buf, mask if mask is not None else buf, buf,
            off_cnt, off_drop, n, f, *_grid_args(bounds_min, voxel_size, grid_size),
            HAS_LEN=lengths is not None, HAS_MASK=mask is not None, MODE=MODE_IDS[mode],
            KEYS=keys, BLOCK=block, FP=next_pow2(f), num_warps=4)
    if not keys:
        _finalize(buf, off_cnt, off_drop, f, mode)
    return buf


def depth_to_voxels_cuda(depth: torch.Tensor, intrinsics: torch.Tensor,
                         extrinsics: torch.Tensor | None, features: torch.Tensor | None,
                         depth_scale: float, min_depth: float, max_depth: float, bounds_min,
                         voxel_size, grid_size, mode: str, keys: bool) -> torch.Tensor:
    """Depth ``[B, H, W]`` (+ features ``[B, H, W, F]``) straight into the grid (or keys);
    returns what `voxelize_cuda` returns, without materializing the points."""
    b, h, w = depth.shape
    f = features.shape[-1] if features is not None else 1
    buf, off_cnt, off_drop = _buffer(b, h * w, f, grid_size, mode, keys, depth.device)
    k, e, k_stride, e_stride = _camera_args(intrinsics, extrinsics, b)
    if b and h * w:
        block = _block(h * w)
        _depth_voxelize_kernel[(cdiv(h * w, block), b)](
            depth, k, e, features if features is not None else depth, buf, off_cnt, off_drop,
            h * w, w, f, depth_scale, min_depth, min(max_depth, FLT_MAX),
            *_grid_args(bounds_min, voxel_size, grid_size), K_STRIDE=k_stride,
            E_STRIDE=e_stride, HAS_EXT=extrinsics is not None, MODE=MODE_IDS[mode], KEYS=keys,
            BLOCK=block, FP=next_pow2(f), num_warps=4)
    if not keys:
        _finalize(buf, off_cnt, off_drop, f, mode)
    return buf


class PointsLaunch:
    """The backprojection of one geometry (batch, image size, camera layout), its launch
    cached: call it with contiguous depth and camera tensors (any shape holding ``[B*H*W]``,
    ``[9]`` / ``[B*9]`` and ``[16]`` / ``[B*16]`` values) and outputs of ``B*H*W`` points."""

    __slots__ = ("launch", "ints")

    def __init__(self, b: int, h: int, w: int, k_stride: int, e_stride: int, has_ext: bool):
        block = 512
        self.launch = CachedLaunch(_depth_to_points_kernel, (cdiv(h * w, block), b),
                                   (k_stride, e_stride, has_ext, block)) if b and h * w else None
        self.ints = (h * w, w)

    def __call__(self, depth, k, e, points, valid, depth_scale: float, min_depth: float,
                 max_depth: float, *, fresh: bool = False) -> None:
        """``fresh``: the outputs come from the allocator (16-byte aligned), so only the
        inputs' alignment is checked."""
        if self.launch is None:
            return
        flags = valid.view(torch.uint8)
        self.launch((depth, k, e, points, flags, *self.ints, depth_scale, min_depth,
                     min(max_depth, FLT_MAX)), (depth, k, e) if fresh else
                    (depth, k, e, points, flags))


def points_plan(depth: torch.Tensor, b: int, h: int, w: int, intrinsics: torch.Tensor,
                extrinsics: torch.Tensor | None) -> PointsLaunch:
    """The `PointsLaunch` of a geometry (`_camera_args` strides), made once per key."""
    k_stride = 9 if intrinsics.numel() == 9 * b and b > 1 else 0
    e_stride = 16 if extrinsics is not None and extrinsics.numel() == 16 * b and b > 1 else 0
    key = (b, h, w, k_stride, e_stride, depth.dtype, intrinsics.dtype,
           None if extrinsics is None else extrinsics.dtype, depth.device)
    return _POINT_PLANS.get(key) or _POINT_PLANS.put(key, PointsLaunch(
        b, h, w, k_stride, e_stride, extrinsics is not None))


# Eager calls relaunch a CachedLaunch per (batch, image size, camera layout, dtypes, device).
_POINT_PLANS = PlanCache(256)


def depth_to_points_cuda(depth: torch.Tensor, intrinsics: torch.Tensor,
                         extrinsics: torch.Tensor | None, depth_scale: float, min_depth: float,
                         max_depth: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Depth ``[B, H, W]`` -> points ``[B, H*W, 3]`` float32 (NaN if invalid), valid ``[B, H*W]``.
    """
    b, h, w = depth.shape
    points = torch.empty(b, h * w, 3, dtype=torch.float32, device=depth.device)
    valid = torch.empty(b, h * w, dtype=torch.bool, device=depth.device)
    k, e, _, _ = _camera_args(intrinsics, extrinsics, b)
    points_plan(depth, b, h, w, k, None if extrinsics is None else e)(
        depth, k, e, points, valid, depth_scale, min_depth, max_depth)
    return points, valid
