"""Triton kernels for depth backprojection and voxelization (semantics: reference/pointcloud.py).

One program handles BLOCK consecutive points (or pixels, row-major) of one cloud. Points from a
depth image arrive in pixel order, so neighbours mostly land in the same voxel (a 6 cm voxel at
1 m covers ~40x40 pixels): before the atomics, each program merges runs of consecutive points
with the same voxel key by a segmented scan, and only the last point of a run issues the
atomic. The run test recomputes the neighbours' keys (offset -1 / +1; the loads hit L1).
"""

from __future__ import annotations

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
def _voxel_key(x, y, z, ok, lo_x, lo_y, lo_z, vs_x, vs_y, vs_z, gx, gy, gz):
    """Key within the cloud's grid (int64, -1 when not inside) and whether ok points are inside."""
    ix = tl.floor(tl.math.div_rn(x - lo_x, vs_x))
    iy = tl.floor(tl.math.div_rn(y - lo_y, vs_y))
    iz = tl.floor(tl.math.div_rn(z - lo_z, vs_z))
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
    x = tl.math.div_rn((u - cx) * z, fx)
    y = tl.math.div_rn((v - cy) * z, fy)
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
def _emit(key, key_prev, key_next, ok, b, offs, n, feat_ptr, f, key_out_ptr, occ_ptr, cnt_ptr,
          val_ptr, drop_ptr, gx, gy, gz, MODE: tl.constexpr, KEYS: tl.constexpr,
          BLOCK: tl.constexpr, FP: tl.constexpr):
    """Count dropped points, then write keys (sparse path) or reduce into the dense grid."""
    hit = key >= 0
    tl.atomic_add(drop_ptr + b, tl.sum((ok & ~hit).to(tl.int32), 0), sem="relaxed")
    nvox = gx.to(tl.int64) * gy * gz
    row = b.to(tl.int64) * n + offs
    if KEYS:
        tl.store(key_out_ptr + row, tl.where(hit, b * nvox + key, -1), mask=offs < n)
    else:
        lane = tl.arange(0, BLOCK)
        start = (key != key_prev) | (lane == 0)
        emit = hit & ((key != key_next) | (lane == BLOCK - 1))
        vox = b * nvox + tl.where(hit, key, 0)
        if MODE == 0:
            tl.store(occ_ptr + vox, tl.full([BLOCK], 1, tl.uint8), mask=emit)
        else:
            _, run = tl.associative_scan((start, hit.to(tl.int32)), 0, _seg_add)
            tl.atomic_add(cnt_ptr + vox, run, mask=emit, sem="relaxed")
        if MODE >= 2:
            cols = tl.arange(0, FP)
            fmask = hit[:, None] & (cols[None, :] < f)
            vals = tl.load(feat_ptr + row[:, None] * f + cols[None, :], mask=fmask,
                           other=0).to(tl.float32)
            start2 = tl.broadcast_to(start[:, None], (BLOCK, FP))
            dst = val_ptr + vox[:, None] * f + cols[None, :]
            emit2 = emit[:, None] & (cols[None, :] < f)
            if MODE == 4:
                _, red = tl.associative_scan((start2, vals), 0, _seg_max)
                tl.atomic_max(dst, red, mask=emit2, sem="relaxed")
            else:
                _, red = tl.associative_scan((start2, vals), 0, _seg_add)
                tl.atomic_add(dst, red, mask=emit2, sem="relaxed")


@triton.jit
def _voxelize_kernel(pts_ptr, feat_ptr, len_ptr, mask_ptr, key_out_ptr, occ_ptr, cnt_ptr,
                     val_ptr, drop_ptr, n, f, lo_x, lo_y, lo_z, vs_x, vs_y, vs_z, gx, gy, gz,
                     HAS_LEN: tl.constexpr, HAS_MASK: tl.constexpr, MODE: tl.constexpr,
                     KEYS: tl.constexpr, BLOCK: tl.constexpr, FP: tl.constexpr):
    b = tl.program_id(1)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    n_valid = tl.minimum(tl.load(len_ptr + b).to(tl.int32), n) if HAS_LEN else n
    x, y, z, ok = _point_at(pts_ptr, mask_ptr, b, offs, n, n_valid, HAS_MASK)
    key, _ = _voxel_key(x, y, z, ok, lo_x, lo_y, lo_z, vs_x, vs_y, vs_z, gx, gy, gz)
    key_prev = key
    key_next = key
    if not KEYS:
        x, y, z, okp = _point_at(pts_ptr, mask_ptr, b, offs - 1, n, n_valid, HAS_MASK)
        key_prev, _ = _voxel_key(x, y, z, okp, lo_x, lo_y, lo_z, vs_x, vs_y, vs_z, gx, gy, gz)
        x, y, z, okn = _point_at(pts_ptr, mask_ptr, b, offs + 1, n, n_valid, HAS_MASK)
        key_next, _ = _voxel_key(x, y, z, okn, lo_x, lo_y, lo_z, vs_x, vs_y, vs_z, gx, gy, gz)
    _emit(key, key_prev, key_next, ok, b, offs, n, feat_ptr, f, key_out_ptr, occ_ptr, cnt_ptr,
          val_ptr, drop_ptr, gx, gy, gz, MODE, KEYS, BLOCK, FP)


@triton.jit
def _depth_voxelize_kernel(depth_ptr, k_ptr, e_ptr, feat_ptr, key_out_ptr, occ_ptr, cnt_ptr,
                           val_ptr, drop_ptr, hw, w, f, scale, min_z, max_z, lo_x, lo_y, lo_z,
                           vs_x, vs_y, vs_z, gx, gy, gz, K_STRIDE: tl.constexpr,
                           E_STRIDE: tl.constexpr, HAS_EXT: tl.constexpr, MODE: tl.constexpr,
                           KEYS: tl.constexpr, BLOCK: tl.constexpr, FP: tl.constexpr):
    b = tl.program_id(1)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x, y, z, ok = _pixel_at(depth_ptr, k_ptr, e_ptr, b, offs, hw, w, scale, min_z, max_z,
                            K_STRIDE, E_STRIDE, HAS_EXT)
    key, _ = _voxel_key(x, y, z, ok, lo_x, lo_y, lo_z, vs_x, vs_y, vs_z, gx, gy, gz)
    key_prev = key
    key_next = key
    if not KEYS:
        x, y, z, okp = _pixel_at(depth_ptr, k_ptr, e_ptr, b, offs - 1, hw, w, scale, min_z,
                                 max_z, K_STRIDE, E_STRIDE, HAS_EXT)
        key_prev, _ = _voxel_key(x, y, z, okp, lo_x, lo_y, lo_z, vs_x, vs_y, vs_z, gx, gy, gz)
        x, y, z, okn = _pixel_at(depth_ptr, k_ptr, e_ptr, b, offs + 1, hw, w, scale, min_z,
                                 max_z, K_STRIDE, E_STRIDE, HAS_EXT)
        key_next, _ = _voxel_key(x, y, z, okn, lo_x, lo_y, lo_z, vs_x, vs_y, vs_z, gx, gy, gz)
    _emit(key, key_prev, key_next, ok, b, offs, hw, feat_ptr, f, key_out_ptr, occ_ptr, cnt_ptr,
          val_ptr, drop_ptr, gx, gy, gz, MODE, KEYS, BLOCK, FP)


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
def _finalize_kernel(cnt_ptr, val_ptr, nvox, f, MODE: tl.constexpr, BLOCK: tl.constexpr,
                     FP: tl.constexpr):
    """mean: sum / count; max: empty voxels (still -inf) become 0. In place."""
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


# Up to 1024 points per program, 4 warps: the run merge wants long runs inside one program
# (a 640-pixel image row); small clouds get a smaller block instead of mostly-masked programs.
MAX_BLOCK = 1024


def _block(n: int) -> int:
    return min(MAX_BLOCK, max(16, next_pow2(n)))


def _grid_args(bounds_min, voxel_size, grid_size) -> list:
    return [*map(float, bounds_min), *map(float, voxel_size), *map(int, grid_size)]


def _camera_args(intrinsics: torch.Tensor, extrinsics: torch.Tensor | None, b: int):
    """Flattened camera tensors and their per-image strides (0 when shared by the batch)."""
    k = intrinsics.reshape(-1, 9)
    e = k if extrinsics is None else extrinsics.reshape(-1, 16)
    k_stride = 9 if k.shape[0] == b and b > 1 else 0
    e_stride = 16 if e.shape[0] == b and b > 1 and extrinsics is not None else 0
    return k, e, k_stride, e_stride


def _outputs(b: int, n: int, f: int, grid_size, mode: str, keys: bool, device):
    """(keys, occupancy, count, values, buffer, dropped) buffers; unused ones alias `dropped`.

    The dense count and value grids share one zeroed buffer (counts as int32 bits after the
    float32 values), so one memset clears both.
    """
    dropped = torch.zeros(b, dtype=torch.int32, device=device)
    nvox = b * grid_size[0] * grid_size[1] * grid_size[2]
    if keys:
        return torch.empty(b, n, dtype=torch.int64, device=device), dropped, dropped, dropped, \
            None, dropped
    if mode == "occupancy":
        occ = torch.zeros(nvox, dtype=torch.uint8, device=device)
        return dropped, occ, dropped, dropped, occ, dropped
    nval = nvox * f if mode in ("sum", "mean", "max") else 0
    buf = torch.zeros(nval + nvox, dtype=torch.float32, device=device)
    vals = buf[:nval]
    if mode == "max":
        vals.fill_(float("-inf"))
    return dropped, dropped, buf[nval:].view(torch.int32), vals, buf, dropped


def _finalize(cnt: torch.Tensor, vals: torch.Tensor, f: int, mode: str) -> None:
    if mode in ("mean", "max") and cnt.numel():
        block = 256
        _finalize_kernel[(cdiv(cnt.numel(), block),)](cnt, vals, cnt.numel(), f,
                                                      MODE=MODE_IDS[mode], BLOCK=block,
                                                      FP=next_pow2(f))


def voxelize_cuda(points: torch.Tensor, features: torch.Tensor | None,
                  lengths: torch.Tensor | None, mask: torch.Tensor | None, bounds_min,
                  voxel_size, grid_size, mode: str, keys: bool):
    """Points ``[B, N, 3]`` (contiguous) -> ``(buffer or keys [B, N], dropped [B] int32)``.

    Dense buffer layout: occupancy -> uint8 ``[B*X*Y*Z]``; otherwise float32 ``[B*X*Y*Z*F]``
    values followed by ``[B*X*Y*Z]`` int32 counts (F = 0 for count).
    """
    b, n, _ = points.shape
    f = features.shape[-1] if features is not None else 1
    key_out, occ, cnt, vals, buf, dropped = _outputs(b, n, f, grid_size, mode, keys,
                                                     points.device)
    if b and n:
        block = _block(n)
        _voxelize_kernel[(cdiv(n, block), b)](
            points, features if features is not None else points,
            lengths if lengths is not None else dropped, mask if mask is not None else dropped,
            key_out, occ, cnt, vals, dropped, n, f, *_grid_args(bounds_min, voxel_size, grid_size),
            HAS_LEN=lengths is not None, HAS_MASK=mask is not None, MODE=MODE_IDS[mode],
            KEYS=keys, BLOCK=block, FP=next_pow2(f), num_warps=4)
    if keys:
        return key_out, dropped
    _finalize(cnt, vals, f, mode)
    return buf, dropped


def depth_to_voxels_cuda(depth: torch.Tensor, intrinsics: torch.Tensor,
                         extrinsics: torch.Tensor | None, features: torch.Tensor | None,
                         depth_scale: float, min_depth: float, max_depth: float, bounds_min,
                         voxel_size, grid_size, mode: str, keys: bool):
    """Depth ``[B, H, W]`` (+ features ``[B, H, W, F]``) straight into the grid (or keys);
    returns what `voxelize_cuda` returns, without materializing the points."""
    b, h, w = depth.shape
    f = features.shape[-1] if features is not None else 1
    key_out, occ, cnt, vals, buf, dropped = _outputs(b, h * w, f, grid_size, mode, keys,
                                                     depth.device)
    k, e, k_stride, e_stride = _camera_args(intrinsics, extrinsics, b)
    if b and h * w:
        block = _block(h * w)
        _depth_voxelize_kernel[(cdiv(h * w, block), b)](
            depth, k, e, features if features is not None else depth, key_out, occ, cnt, vals,
            dropped, h * w, w, f, depth_scale, min_depth, min(max_depth, FLT_MAX),
            *_grid_args(bounds_min, voxel_size, grid_size), K_STRIDE=k_stride,
            E_STRIDE=e_stride, HAS_EXT=extrinsics is not None, MODE=MODE_IDS[mode], KEYS=keys,
            BLOCK=block, FP=next_pow2(f), num_warps=4)
    if keys:
        return key_out, dropped
    _finalize(cnt, vals, f, mode)
    return buf, dropped


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
