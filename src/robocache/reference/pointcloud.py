"""Pure-PyTorch depth backprojection and voxelization: the CPU path of `robocache.depth_to_points`,
`robocache.voxelize` and `robocache.depth_to_voxels`, and the oracle of the Triton kernels.

Semantics (shared with `kernels/pointcloud.py`; all arithmetic in float32):

* Backprojection (pinhole, skew ignored): ``z = d * depth_scale``, ``x = (u - cx) * z * (1/fx)``,
  ``y = (v - cy) * z * (1/fy)`` with u the column and v the row index (reciprocals rounded to
  float32: multiplications are cheaper than divisions on the GPU); a pixel is valid when z is
  finite, ``z > 0`` and ``min_depth <= z <= max_depth``. With extrinsics (camera-to-world
  ``[4, 4]``) the point becomes ``R @ p + t``. Invalid pixels give NaN points.
* Voxel of a point: ``i = floor((p - bounds_min) * r)`` per axis with ``r`` = 1 / voxel_size
  rounded to float32 (exact for power-of-two sizes); the point is inside
  when ``0 <= i < grid_size`` on every axis (the grid covers the half-open box
  ``[min, min + size * dims)``). NaN/inf points are never inside. Valid points (per lengths or
  mask) that are not inside are *dropped* and counted per cloud.
* A voxel key is ``((b * X + i) * Y + j) * Z + k``; -1 marks padding and dropped points.
* Reductions per voxel: occupancy (any point), count, sum / mean / max of float32 features;
  empty voxels hold 0.
"""

from __future__ import annotations

import torch

MODES = ("occupancy", "count", "sum", "mean", "max")
FEATURE_MODES = ("sum", "mean", "max")


def backproject_ref(depth: torch.Tensor, intrinsics: torch.Tensor,
                    extrinsics: torch.Tensor | None, depth_scale: float, min_depth: float,
                    max_depth: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Depth ``[B, H, W]`` -> points ``[B, H*W, 3]`` float32 (NaN if invalid), valid ``[B, H*W]``.

    ``intrinsics`` is ``[B or 1, 3, 3]``, ``extrinsics`` ``[B or 1, 4, 4]`` or None.
    """
    b, h, w = depth.shape
    z = depth.to(torch.float32) * depth_scale
    valid = torch.isfinite(z) & (z > 0) & (z >= min_depth) & (z <= max_depth)
    v, u = torch.meshgrid(torch.arange(h, dtype=torch.float32, device=depth.device),
                          torch.arange(w, dtype=torch.float32, device=depth.device),
                          indexing="ij")
    k = intrinsics.to(torch.float32)
    fx, fy = k[:, 0, 0, None, None], k[:, 1, 1, None, None]
    cx, cy = k[:, 0, 2, None, None], k[:, 1, 2, None, None]
    pts = torch.stack([(u - cx) * z * (1.0 / fx), (v - cy) * z * (1.0 / fy), z], -1)
    pts = pts.reshape(b, h * w, 3)
    if extrinsics is not None:
        e = extrinsics.to(torch.float32)
        pts = pts @ e[:, :3, :3].transpose(1, 2) + e[:, None, :3, 3]
    valid = valid.reshape(b, h * w)
    return torch.where(valid[..., None], pts, float("nan")), valid


def voxel_keys_ref(points: torch.Tensor, valid: torch.Tensor, bounds_min, voxel_size,
                   grid_size) -> tuple[torch.Tensor, torch.Tensor]:
    """Points ``[B, N, 3]``, valid ``[B, N]`` -> keys ``[B, N]`` int64 (-1: none), dropped [B]."""
    gx, gy, gz = grid_size
    p = points.to(torch.float32)
    lo = torch.tensor(bounds_min, dtype=torch.float32, device=p.device)
    inv = torch.tensor([1.0 / s for s in voxel_size], dtype=torch.float32, device=p.device)
    dims = torch.tensor(grid_size, dtype=torch.float32, device=p.device)
    f = torch.floor((p - lo) * inv)
    inside = valid & ((f >= 0) & (f < dims)).all(-1)
    i = torch.where(inside[..., None], f, 0).long()
    batch = torch.arange(p.shape[0], device=p.device)[:, None]
    keys = ((batch * gx + i[..., 0]) * gy + i[..., 1]) * gz + i[..., 2]
    dropped = (valid & ~inside).sum(1, dtype=torch.int32)
    return torch.where(inside, keys, -1), dropped


def reduce_rows(rows: torch.Tensor, n_rows: int, features: torch.Tensor | None,
                mode: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Reduce points into ``n_rows`` output rows; ``rows`` is int64 ``[P]`` with -1 = skip.

    Returns ``(values, count)`` with int32 counts ``[n_rows]``; values are bool for occupancy,
    the counts themselves for count, float32 ``[n_rows, F]`` for sum/mean/max.
    """
    dump = torch.where(rows >= 0, rows, n_rows)  # row n_rows collects the skipped points
    count = torch.zeros(n_rows + 1, dtype=torch.int32, device=rows.device)
    count.index_add_(0, dump, torch.ones_like(dump, dtype=torch.int32))
    count = count[:n_rows]
    if mode == "occupancy":
        return count > 0, count
    if mode == "count":
        return count, count
    f = features.to(torch.float32)
    if mode == "max":
        vals = torch.full((n_rows + 1, f.shape[1]), float("-inf"), device=f.device)
        vals.scatter_reduce_(0, dump[:, None].expand_as(f), f, "amax")
        vals = torch.where(count[:, None] > 0, vals[:n_rows], 0.0)
    else:
        vals = torch.zeros(n_rows + 1, f.shape[1], device=f.device).index_add_(0, dump, f)
        vals = vals[:n_rows]
        if mode == "mean":
            vals = vals / count.clamp(min=1)[:, None]
    return vals, count


def sparse_from_keys(keys: torch.Tensor, features: torch.Tensor | None, mode: str,
                     grid_size, capacity: int):
    """Occupied voxels from point keys, without a host sync (used on every device).

    Sorts the keys (torch.sort), numbers the distinct ones in key order (so voxels come sorted
    by (batch, x, y, z) and ids are deterministic) and reduces the features per voxel.
    ``capacity`` (an upper bound of the voxel count) sizes the outputs; rows past the real
    count hold coords -1 and values 0. Returns ``(coords [capacity, 4] int32, values, count,
    point_to_voxel [B, N] int64, num_voxels int64 0-dim)``.
    """
    b, n = keys.shape
    flat = keys.reshape(-1)
    sentinel = torch.iinfo(torch.int64).max
    sorted_keys, order = torch.sort(torch.where(flat >= 0, flat, sentinel))
    real = sorted_keys != sentinel
    first = torch.ones_like(real)
    first[1:] = sorted_keys[1:] != sorted_keys[:-1]
    ids = torch.where(real, torch.cumsum(first & real, 0) - 1, -1)
    point_to_voxel = torch.empty_like(ids).scatter_(0, order, ids).reshape(b, n)
    num_voxels = (first & real).sum()
    voxel_key = torch.full((capacity + 1,), -1, dtype=torch.int64, device=keys.device)
    voxel_key.scatter_(0, torch.where(real, ids, capacity), torch.where(real, sorted_keys, -1))
    voxel_key = voxel_key[:capacity]
    gx, gy, gz = grid_size
    cols = [voxel_key // (gx * gy * gz), voxel_key // (gy * gz) % gx, voxel_key // gz % gy,
            voxel_key % gz]
    coords = torch.where(voxel_key[:, None] >= 0, torch.stack(cols, 1), -1).to(torch.int32)
    feats = None if features is None else features.reshape(b * n, features.shape[-1])
    values, count = reduce_rows(point_to_voxel.reshape(-1), capacity, feats, mode)
    return coords, (None if mode in ("occupancy", "count") else values), count, \
        point_to_voxel, num_voxels


def voxelize_dense_ref(keys: torch.Tensor, features: torch.Tensor | None, mode: str,
                       grid_size) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Dense grid ``[B, X, Y, Z]`` (or ``[B, X, Y, Z, F]``) and counts from point keys."""
    b = keys.shape[0]
    feats = None if features is None else features.reshape(keys.numel(), features.shape[-1])
    values, count = reduce_rows(keys.reshape(-1), b * grid_size[0] * grid_size[1] * grid_size[2],
                                feats, mode)
    shape = (b, *grid_size)
    grid = values.reshape(*shape, values.shape[-1]) if values.dim() == 2 else values.reshape(shape)
    return grid, (None if mode == "occupancy" else count.reshape(shape))
