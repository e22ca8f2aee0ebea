"""Triton kernels for depth backprojection and voxelization (semantics: reference/pointcloud.py).

One program handles BLOCK consecutive points (or pixels, row-major) of one cloud. Points from a
depth image arrive in pixel order, so neighbours mostly land in the same voxel (a 6 cm voxel at
1 m covers ~40x40 pixels). Optionally (MERGE_RUNS, off by default: measured no gain at block
256) each program merges runs of consecutive points with the same voxel key by a segmented scan
before the atomics, and only the last point of a run issues the atomic; the run test recomputes
the neighbours' keys (offset -1 / +1; the loads hit L1).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from robocache.kernels._utils import cdiv, next_pow2

MODE_IDS = {"occupancy": 0, "count": 1, "sum": 2, "mean": 3, "max": 4}
FLT_MAX = 3.4028234663852886e38


@triton.jit
def _seg_add(f1, a1, f2, a2):
    # segmented sum: a set flag starts a new run
    return f1 | f2, tl.where(f2, a2, a1 + a2)


@triton.jit
def _seg_max(f1, a1, f2, a2):
    return f1 | f2, tl.where(f2, a2, tl.maximum(a1, a2))


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
def _emit(key, key_prev, key_next, ok, b, offs, n, feat_ptr, f, buf_ptr, off_cnt, off_drop,
          nvox, MODE: tl.constexpr, KEYS: tl.constexpr, MERGE: tl.constexpr,
          BLOCK: tl.constexpr, FP: tl.constexpr):
    """Count dropped points, then write keys (sparse path) or reduce into the dense grid.

    `buf_ptr` is the launcher's one buffer (`buffer_layout`): keys, occupancy flags or values
    at offset 0, int32 counts at `off_cnt` and dropped counts at `off_drop` (its elements).

    With MERGE, a run of equal keys issues one atomic from its last point, carrying the run's
    segmented-scan reduction. For sum/mean the count rides in feature column f (exact in float32
    up to 2^24 points), so one scan serves both.
    """
    hit = key >= 0
    drop_ptr = (buf_ptr + off_drop).to(tl.pointer_type(tl.int32), bitcast=True)
    cnt_ptr = (buf_ptr + off_cnt).to(tl.pointer_type(tl.int32), bitcast=True)
    tl.atomic_add(drop_ptr + b, tl.sum((ok & ~hit).to(tl.int32), 0), sem="relaxed")
    row = b.to(tl.int64) * n + offs
    if KEYS:
        tl.store(buf_ptr + row, tl.where(hit, b * nvox + key, -1), mask=offs < n)
    else:
        lane = tl.arange(0, BLOCK)
        if MERGE:
            start = (key != key_prev) | (lane == 0)
            emit = hit & ((key != key_next) | (lane == BLOCK - 1))
        else:
            start = lane >= 0
            emit = hit
        vox = b * nvox + tl.where(hit, key, 0)
        if MODE == 0:
            tl.store(buf_ptr + vox, tl.full([BLOCK], 1, tl.uint8), mask=emit)
        elif MODE == 1 or MODE == 4:
            run = hit.to(tl.int32)
            if MERGE:
                _, run = tl.associative_scan((start, run), 0, _seg_add)
            tl.atomic_add(cnt_ptr + vox, run, mask=emit, sem="relaxed")
        if MODE >= 2:
            cols = tl.arange(0, FP)[None, :]
            vals = tl.load(feat_ptr + row[:, None] * f + cols, mask=hit[:, None] & (cols < f),
                           other=0).to(tl.float32)
            start2 = tl.broadcast_to(start[:, None], (BLOCK, FP))
            dst = buf_ptr + vox[:, None] * f + cols
            emit2 = emit[:, None] & (cols < f)
            if MODE == 4:
                if MERGE:
                    _, vals = tl.associative_scan((start2, vals), 0, _seg_max)
                tl.atomic_max(dst, vals, mask=emit2, sem="relaxed")
            else:
                vals = tl.where(cols == f, hit[:, None].to(tl.float32), vals)
                if MERGE:
                    _, vals = tl.associative_scan((start2, vals), 0, _seg_add)
                tl.atomic_add(dst, vals, mask=emit2, sem="relaxed")
                run = tl.sum(tl.where(cols == f, vals, 0.0), 1).to(tl.int32)
                tl.atomic_add(cnt_ptr + vox, run, mask=emit, sem="relaxed")


@triton.jit
def _voxelize_kernel(pts_ptr, feat_ptr, len_ptr, mask_ptr, buf_ptr, off_cnt, off_drop, n, f,
                     lo_x, lo_y, lo_z, iv_x, iv_y, iv_z, gx, gy, gz,
                     HAS_LEN: tl.constexpr, HAS_MASK: tl.constexpr, MODE: tl.constexpr,
                     KEYS: tl.constexpr, MERGE: tl.constexpr, BLOCK: tl.constexpr,
                     FP: tl.constexpr):
    b = tl.program_id(1)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    n_valid = tl.minimum(tl.load(len_ptr + b).to(tl.int32), n) if HAS_LEN else n
    x, y, z, ok = _point_at(pts_ptr, mask_ptr, b, offs, n, n_valid, HAS_MASK)
    key, _ = _voxel_key(x, y, z, ok, lo_x, lo_y, lo_z, iv_x, iv_y, iv_z, gx, gy, gz)
    key_prev = key
    key_next = key
    if MERGE and not KEYS:
        x, y, z, okp = _point_at(pts_ptr, mask_ptr, b, offs - 1, n, n_valid, HAS_MASK)
        key_prev, _ = _voxel_key(x, y, z, okp, lo_x, lo_y, lo_z, iv_x, iv_y, iv_z, gx, gy, gz)
        x, y, z, okn = _point_at(pts_ptr, mask_ptr, b, offs + 1, n, n_valid, HAS_MASK)
        key_next, _ = _voxel_key(x, y, z, okn, lo_x, lo_y, lo_z, iv_x, iv_y, iv_z, gx, gy, gz)
    _emit(key, key_prev, key_next, ok, b, offs, n, feat_ptr, f, buf_ptr, off_cnt, off_drop,
          gx.to(tl.int64) * gy * gz, MODE, KEYS, MERGE, BLOCK, FP)


@triton.jit
def _depth_voxelize_kernel(depth_ptr, k_ptr, e_ptr, feat_ptr, buf_ptr, off_cnt, off_drop, hw,
                           w, f, scale, min_z, max_z, lo_x, lo_y, lo_z,
                           iv_x, iv_y, iv_z, gx, gy, gz, K_STRIDE: tl.constexpr,
                           E_STRIDE: tl.constexpr, HAS_EXT: tl.constexpr, MODE: tl.constexpr,
                           KEYS: tl.constexpr, MERGE: tl.constexpr, BLOCK: tl.constexpr,
                           FP: tl.constexpr):
    b = tl.program_id(1)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x, y, z, ok = _pixel_at(depth_ptr, k_ptr, e_ptr, b, offs, hw, w, scale, min_z, max_z,
                            K_STRIDE, E_STRIDE, HAS_EXT)
    key, _ = _voxel_key(x, y, z, ok, lo_x, lo_y, lo_z, iv_x, iv_y, iv_z, gx, gy, gz)
    key_prev = key
    key_next = key
    if MERGE and not KEYS:
        x, y, z, okp = _pixel_at(depth_ptr, k_ptr, e_ptr, b, offs - 1, hw, w, scale, min_z,
                                 max_z, K_STRIDE, E_STRIDE, HAS_EXT)
        key_prev, _ = _voxel_key(x, y, z, okp, lo_x, lo_y, lo_z, iv_x, iv_y, iv_z, gx, gy, gz)
        x, y, z, okn = _pixel_at(depth_ptr, k_ptr, e_ptr, b, offs + 1, hw, w, scale, min_z,
                                 max_z, K_STRIDE, E_STRIDE, HAS_EXT)
        key_next, _ = _voxel_key(x, y, z, okn, lo_x, lo_y, lo_z, iv_x, iv_y, iv_z, gx, gy, gz)
    _emit(key, key_prev, key_next, ok, b, offs, hw, feat_ptr, f, buf_ptr, off_cnt, off_drop,
          gx.to(tl.int64) * gy * gz, MODE, KEYS, MERGE, BLOCK, FP)


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
# programs). H100, 640x480 uint16 depth + rgb -> 64^3 mean, before the reciprocal change: 1024
# -> 53 us/frame, 256 -> 26 us (the scans cost more than the longer runs save). See
# docs/pointcloud.md for the current sweep.
MAX_BLOCK = 256
# Merge runs of equal voxels before the atomics (see the module docstring). Off: at block 256
# the scans cost what the saved atomics gain (H100, 640x480 -> 64^3 mean, CUDA graph, commit
# 1627fb2: B=8 96.9 us without vs 102.4 us with; B=1 17.8 vs 17.9 us).
MERGE_RUNS = False


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


def _feature_cols(f: int, mode: str) -> int:
    """Columns a program loads: sum/mean add the count column f."""
    return next_pow2(f + 1 if mode in ("sum", "mean") else f)


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
            KEYS=keys, MERGE=MERGE_RUNS, BLOCK=block, FP=_feature_cols(f, mode), num_warps=4)
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
            MERGE=MERGE_RUNS, BLOCK=block, FP=_feature_cols(f, mode), num_warps=4)
    if not keys:
        _finalize(buf, off_cnt, off_drop, f, mode)
    return buf


def depth_to_points_cuda(depth: torch.Tensor, intrinsics: torch.Tensor,
                         extrinsics: torch.Tensor | None, depth_scale: float, min_depth: float,
                         max_depth: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Depth ``[B, H, W]`` -> points ``[B, H*W, 3]`` float32 (NaN if invalid), valid ``[B, H*W]``.
    """
    b, h, w = depth.shape
    points = torch.empty(b, h * w, 3, dtype=torch.float32, device=depth.device)
    valid = torch.empty(b, h * w, dtype=torch.bool, device=depth.device)
    k, e, k_stride, e_stride = _camera_args(intrinsics, extrinsics, b)
    if b and h * w:
        block = 512
        _depth_to_points_kernel[(cdiv(h * w, block), b)](
            depth, k, e, points, valid.view(torch.uint8), h * w, w, depth_scale, min_depth,
            min(max_depth, FLT_MAX), K_STRIDE=k_stride, E_STRIDE=e_stride,
            HAS_EXT=extrinsics is not None, BLOCK=block)
    return points, valid
