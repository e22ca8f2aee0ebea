"""RGB-D to point clouds to voxel grids: `depth_to_points`, `voxelize` and the fused
`depth_to_voxels`, batched, without host syncs (semantics: ``reference/pointcloud.py``).

Dense grids come from one Triton kernel that reduces each point into its voxel with relaxed
atomics; the sparse output numbers occupied voxels on the device (torch.sort) into outputs sized
by an upper bound, with the real count as a device scalar: `SparseVoxels.trim` is the one place
that reads it back (the only host sync, and the caller decides when).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import NamedTuple

import torch

from robocache._plancache import PlanCache
from robocache.errors import DataError
from robocache.observability import nvtx
from robocache.ops._checks import (
    FLOAT_DTYPES,
    INDEX_DTYPES,
    check_choice,
    check_device,
    check_dtype,
    check_fits,
    fail,
    wants_validation,
)
from robocache.ops._dispatch import Op, launches_directly
from robocache.reference import pointcloud as ref

__all__ = ["PointCloud", "SparseVoxels", "VoxelGrid", "depth_to_points", "depth_to_voxels",
           "voxelize"]

DEPTH_DTYPES = (torch.uint16, *FLOAT_DTYPES)
FEATURE_DTYPES = (torch.uint8, *FLOAT_DTYPES)


class PointCloud(NamedTuple):
    """Output of `depth_to_points`."""

    points: torch.Tensor  #: [B, H*W, 3] float32 metres; NaN where the pixel is invalid
    valid: torch.Tensor  #: [B, H*W] bool
    colors: torch.Tensor | None  #: [B, H*W, C] the rgb input reshaped (a view), or None


class VoxelGrid(NamedTuple):
    """Dense output of `voxelize` / `depth_to_voxels`."""

    grid: torch.Tensor  #: [B, X, Y, Z] bool (occupancy) / int32 (count); [B, X, Y, Z, F] float32
    count: torch.Tensor | None  #: [B, X, Y, Z] int32 points per voxel; None for occupancy
    dropped: torch.Tensor  #: [B] int32 valid points outside the grid or not finite


class SparseVoxels(NamedTuple):
    """Sparse output: occupied voxels in (batch, x, y, z) order, sized by an upper bound.

    Rows ``>= num_voxels`` are padding (coords -1, count and values 0). ``num_voxels`` stays on
    the device so the op never waits for the GPU; `trim` reads it (one sync) and slices.
    """

    coords: torch.Tensor  #: [M, 4] int32 (batch, x, y, z); M = min(B*N, B*X*Y*Z)
    values: torch.Tensor | None  #: [M, F] float32 for sum/mean/max, else None
    count: torch.Tensor  #: [M] int32 points per voxel
    point_to_voxel: torch.Tensor  #: [B, N] int64 row of each point in coords, -1 if dropped
    num_voxels: torch.Tensor  #: 0-dim int64 on the device: occupied voxels
    dropped: torch.Tensor  #: [B] int32 valid points outside the grid or not finite

    def trim(self) -> SparseVoxels:
        """The same voxels without padding rows (reads `num_voxels`: one host sync)."""
        m = int(self.num_voxels)
        return self._replace(coords=self.coords[:m], count=self.count[:m],
                             values=None if self.values is None else self.values[:m])


# ---------------------------------------------------------------- validation


def _triple(op: str, name: str, value, kind: type) -> tuple:
    """A scalar or a length-3 sequence of host numbers -> a 3-tuple of `kind`."""
    if isinstance(value, torch.Tensor):
        value = value.tolist()
    items = list(value) if isinstance(value, Sequence) or hasattr(value, "__len__") else \
        [value] * 3
    if len(items) != 3:
        fail(op, f"`{name}` must be a number or 3 numbers (x, y, z); got {len(items)} values.",
             ValueError)
    try:
        out = tuple(kind(v) for v in items)
    except (TypeError, ValueError):
        fail(op, f"`{name}` must hold {kind.__name__} values; got {items!r}.", ValueError)
    if kind is int and any(o != v for o, v in zip(out, items, strict=True)):
        fail(op, f"`{name}` must hold whole numbers of voxels; got {items!r}.", ValueError)
    return out


def _grid_spec(op: str, bounds_min, voxel_size, grid_size):
    lo = _triple(op, "bounds_min", bounds_min, float)
    size = _triple(op, "voxel_size", voxel_size, float)
    dims = _triple(op, "grid_size", grid_size, int)
    if not all(map(math.isfinite, lo)):
        fail(op, f"`bounds_min` must be finite; got {lo}.", ValueError)
    if not all(math.isfinite(s) and s > 0 for s in size):
        fail(op, f"`voxel_size` must be positive and finite (metres); got {size}.", ValueError)
    if not all(d > 0 for d in dims):
        fail(op, f"`grid_size` must be positive voxel counts; got {dims}.", ValueError)
    return lo, size, dims


def _check_mode(op: str, mode: str, features: torch.Tensor | None, name: str) -> None:
    _check_mode_of(op, mode, features is None, name)


@functools.lru_cache(maxsize=256)  # a pure function of its arguments; keyed without tensors
def _check_mode_of(op: str, mode: str, no_features: bool, name: str) -> None:
    check_choice(op, "mode", mode, ref.MODES)
    if mode in ref.FEATURE_MODES and no_features:
        fail(op, f"mode {mode!r} reduces features, but `{name}` is None; pass `{name}` "
             "([..., F] per point) or use mode 'occupancy' or 'count'.", ValueError)
    if mode not in ref.FEATURE_MODES and not no_features:
        fail(op, f"mode {mode!r} does not use features, but `{name}` was given; use mode "
             "'sum', 'mean' or 'max' to reduce them, or drop the argument.", ValueError)


def _check_dense_fits(op: str, b: int, dims, f: int, mode: str, device: torch.device) -> None:
    if torch.compiler.is_compiling():  # checked in eager; a traced call would fail to allocate
        return
    nvox = b * dims[0] * dims[1] * dims[2]
    per_voxel = 1 if mode == "occupancy" else 4 * (1 + (f if mode in ref.FEATURE_MODES else 0))
    check_fits(op, f"a dense grid of {b} x {dims[0]} x {dims[1]} x {dims[2]} voxels in mode "
               f"{mode!r}", nvox * per_voxel, device,
               "use sparse=True, a larger voxel_size or a smaller grid_size.")



def _check_points_fit(op: str, shape, device: torch.device) -> None:
    """Points (float32 xyz), valid flags and the reference's pixel grids of ``[B, H, W]``."""
    b, h, w = shape
    check_fits(op, f"the points of {b} x {h} x {w} pixels", b * h * w * (12 + 1 + 16), device,
               "pass smaller `depth` images (downsample them) or fewer per call.")


def _check_camera_matrix(op: str, name: str, m: torch.Tensor, n: int, b: int,
                         device: torch.device) -> None:
    """`m` is a float [n, n] or [B, n, n] (B = b or 1) matrix on `device`."""
    arg = name.split()[0]
    check_device(op, arg, m, device, "depth")
    check_dtype(op, arg, m, FLOAT_DTYPES, "Pass a float matrix.")
    if m.shape[-2:] != (n, n) or m.dim() not in (2, 3) or (
            m.dim() == 3 and m.shape[0] not in (1, b)):
        fail(op, f"`{name}` must be [{n}, {n}] or [B, {n}, {n}] with B = {b}; got shape "
             f"{list(m.shape)}.")

def _check_camera(op: str, depth: torch.Tensor, intrinsics: torch.Tensor,
                  extrinsics: torch.Tensor | None, rgb: torch.Tensor | None, depth_scale,
                  min_depth: float, max_depth: float,
                  validate: bool | None) -> tuple[torch.Tensor, float]:
    """Validate the camera inputs; returns depth as [B, H, W] and the resolved depth scale.
    With validation (default on CPU): fx, fy finite and > 0, cx, cy finite (one sync)."""
    if depth.dim() not in (2, 3):
        fail(op, f"`depth` must be [H, W] or [B, H, W]; got shape {list(depth.shape)}.")
    check_dtype(op, "depth", depth, DEPTH_DTYPES,
                "Pass metres as float or millimetres as uint16 (e.g. depth.to(torch.uint16)).")
    d = depth if depth.dim() == 3 else depth.unsqueeze(0)
    b, h, w = d.shape
    _check_camera_matrix(op, "intrinsics", intrinsics, 3, b, depth.device)
    if wants_validation(validate, intrinsics):
        _check_intrinsic_values(op, intrinsics)
    if extrinsics is not None:
        _check_camera_matrix(op, "extrinsics (camera-to-world)", extrinsics, 4, b, depth.device)
    if rgb is not None:
        check_device(op, "rgb", rgb, depth.device, "depth")
        check_dtype(op, "rgb", rgb, FEATURE_DTYPES, "Pass uint8 or float colours.")
        if rgb.dim() != depth.dim() + 1 or rgb.shape[:-1] != depth.shape:
            fail(op, f"`rgb` must be [*depth.shape, C] = {[*depth.shape, 'C']} (channels "
                 f"last); got shape {list(rgb.shape)}.")
    scale = (0.001 if depth.dtype == torch.uint16 else 1.0) if depth_scale is None \
        else float(depth_scale)
    if not (math.isfinite(scale) and scale > 0):
        fail(op, f"`depth_scale` must be positive and finite (metres per depth unit); got "
             f"{depth_scale!r}.", ValueError)
    if not (min_depth >= 0 and max_depth >= min_depth and not math.isnan(max_depth)):
        fail(op, f"depth range must satisfy 0 <= min_depth <= max_depth (metres); got "
             f"min_depth={min_depth!r}, max_depth={max_depth!r}.", ValueError)
    return d, scale


def _check_intrinsic_values(op: str, intrinsics: torch.Tensor) -> None:
    """fx, fy finite and > 0, cx, cy finite, for every camera (one sync)."""
    k = intrinsics.reshape(-1, 3, 3).double()
    focal, centre = k[:, [0, 1], [0, 1]], k[:, [0, 1], [2, 2]]
    bad = ~(torch.isfinite(focal) & (focal > 0)).all(1) | ~torch.isfinite(centre).all(1)
    if bool(bad.any()):
        i = int(bad.nonzero()[0])
        fail(op, f"`intrinsics` of camera {i} has fx = {float(k[i, 0, 0])!r}, fy = "
             f"{float(k[i, 1, 1])!r}, cx = {float(k[i, 0, 2])!r}, cy = "
             f"{float(k[i, 1, 2])!r}; the focal lengths must be finite and > 0 pixels and "
             "the principal point finite: pass the camera matrix [[fx, 0, cx], [0, fy, cy], "
             "[0, 0, 1]].", DataError)


def _camera_tensors(d, intrinsics, extrinsics):
    k = intrinsics.reshape(-1, 3, 3).contiguous()
    e = None if extrinsics is None else extrinsics.reshape(-1, 4, 4).contiguous()
    return d.contiguous(), k, e


# ---------------------------------------------------------------- registered ops

def _depth_to_points_cpu(depth: torch.Tensor, intrinsics: torch.Tensor,
                         extrinsics: torch.Tensor | None, depth_scale: float, min_depth: float,
                         max_depth: float) -> tuple[torch.Tensor, torch.Tensor]:
    return ref.backproject_ref(depth, intrinsics, extrinsics, depth_scale, min_depth, max_depth)


def _fake_buffer(like: torch.Tensor, b: int, n: int, f: int, grid_size, mode: str,
                 keys: bool) -> torch.Tensor:
    from robocache.kernels.pointcloud import buffer_layout

    dtype, numel, _, _ = buffer_layout(b, n, f, grid_size, mode, keys)
    return like.new_empty(numel, dtype=dtype)


def _depth_to_points_fake(depth, intrinsics, extrinsics, depth_scale, min_depth, max_depth):
    b, h, w = depth.shape
    return (depth.new_empty(b, h * w, 3, dtype=torch.float32),
            depth.new_empty(b, h * w, dtype=torch.bool))


def _voxelize_points_fake(points, features, lengths, mask, bounds_min, voxel_size, grid_size,
                          mode, keys):
    f = 1 if features is None else features.shape[-1]
    return _fake_buffer(points, points.shape[0], points.shape[1], f, grid_size, mode, keys)


def _voxelize_depth_fake(depth, intrinsics, extrinsics, features, depth_scale, min_depth,
                         max_depth, bounds_min, voxel_size, grid_size, mode, keys):
    b, h, w = depth.shape
    f = 1 if features is None else features.shape[-1]
    return _fake_buffer(depth, b, h * w, f, grid_size, mode, keys)


_K = "robocache.kernels.pointcloud:"
_DEPTH_TO_POINTS = Op("depth_to_points", cpu=_depth_to_points_cpu,
                      cuda=_K + "depth_to_points_cuda", fake=_depth_to_points_fake)
# The voxelizers' packed buffers have no reference of the same layout (the CPU path of the
# public ops is the reference's own algorithm): their launchers serve every device.
_VOXELIZE_POINTS = Op(
    "voxelize_points", cpu=None, cuda=_K + "voxelize_cuda", fake=_voxelize_points_fake,
    schema="(Tensor points, Tensor? features, Tensor? lengths, Tensor? mask, float[] bounds_min, "
           "float[] voxel_size, int[] grid_size, str mode, bool keys) -> Tensor")
_VOXELIZE_DEPTH = Op(
    "voxelize_depth", cpu=None, cuda=_K + "depth_to_voxels_cuda", fake=_voxelize_depth_fake,
    schema="(Tensor depth, Tensor intrinsics, Tensor? extrinsics, Tensor? features, "
           "float depth_scale, float min_depth, float max_depth, float[] bounds_min, "
           "float[] voxel_size, int[] grid_size, str mode, bool keys) -> Tensor")


# ---------------------------------------------------------------- dispatch


def _split(buf, b, n, f, dims, mode, keys):
    from robocache.kernels.pointcloud import split_buffer

    return split_buffer(buf, b, n, f, dims, mode, keys)


def _kernel_dense(points, features, lengths, mask, lo, size, dims, mode):
    """Dense grid from the Triton kernel: (grid, count, dropped)."""
    buf = _VOXELIZE_POINTS(points, features, lengths, mask, list(lo), list(size), list(dims),
                           mode, False)
    b, n, _ = points.shape
    return _split(buf, b, n, 1 if features is None else features.shape[-1], dims, mode, False)


def _kernel_keys(points, lengths, mask, lo, size, dims):
    """Per-point keys [B, N] and dropped counts from the Triton kernel."""
    buf = _VOXELIZE_POINTS(points, None, lengths, mask, list(lo), list(size), list(dims),
                           "occupancy", True)
    return _split(buf, points.shape[0], points.shape[1], 1, dims, "occupancy", True)


def _kernel_depth(d, k, e, feats, scale, min_depth, max_depth, lo, size, dims, mode, keys):
    """The fused kernel: (grid, count, dropped), or (keys, dropped) with ``keys``."""
    buf = _VOXELIZE_DEPTH(d, k, e, feats, scale, min_depth, max_depth, list(lo), list(size),
                          list(dims), mode, keys)
    b, h, w = d.shape
    return _split(buf, b, h * w, 1 if feats is None else feats.shape[-1], dims, mode, keys)


def _valid_of(points: torch.Tensor, lengths, mask) -> torch.Tensor:
    b, n, _ = points.shape
    if mask is not None:
        return mask
    if lengths is not None:
        return torch.arange(n, device=points.device) < lengths[:, None]
    return torch.ones(b, n, dtype=torch.bool, device=points.device)


def _sparse(keys, dropped, features, mode, b, n, dims) -> SparseVoxels:
    capacity = min(b * n, b * dims[0] * dims[1] * dims[2])
    coords, values, count, p2v, num = ref.sparse_from_keys(keys, features, mode, dims, capacity)
    return SparseVoxels(coords, values, count, p2v, num, dropped)


def _unbatch(out, batched: bool):
    if batched:
        return out
    if isinstance(out, SparseVoxels):
        return out._replace(point_to_voxel=out.point_to_voxel[0], dropped=out.dropped[0])
    return VoxelGrid(out.grid[0], None if out.count is None else out.count[0], out.dropped[0])


# ---------------------------------------------------------------- public ops


@nvtx.annotate("robocache.depth_to_points")
def depth_to_points(depth: torch.Tensor, intrinsics: torch.Tensor, *,
                    extrinsics: torch.Tensor | None = None, depth_scale: float | None = None,
                    min_depth: float = 0.0, max_depth: float = math.inf,
                    rgb: torch.Tensor | None = None,
                    validate: bool | None = None) -> PointCloud:
    """Backproject depth images to point clouds (pinhole model).

    ``z = depth * depth_scale``, ``x = (u - cx) * z / fx``, ``y = (v - cy) * z / fy`` with u the
    column and v the row of the pixel (skew ignored), then ``R @ p + t`` with the camera-to-world
    extrinsics. A pixel is valid when z is finite, > 0 and within [min_depth, max_depth]; invalid
    pixels give NaN points, so `voxelize` drops them even without the mask.

    Args:
        depth: ``[B, H, W]`` or ``[H, W]``; float metres or uint16 millimetres.
        intrinsics: ``[3, 3]`` or ``[B, 3, 3]`` float (fx, fy, cx, cy in pixels).
        extrinsics: optional camera-to-world ``[4, 4]`` or ``[B, 4, 4]`` float (metres).
        depth_scale: metres per depth unit; default 0.001 for uint16, 1.0 for float.
        min_depth, max_depth: valid range of z in metres.
        rgb: optional ``[B, H, W, C]`` colours, returned as ``colors [B, H*W, C]``.
        validate: check the intrinsics' values (fx, fy finite and > 0; cx, cy finite; one
            sync): default on CPU tensors, on CUDA when ``True`` or ``ROBOCACHE_VALIDATE=1``.

    Returns:
        `PointCloud` (points ``[B, H*W, 3]`` float32, valid ``[B, H*W]`` bool, colors); without
        the batch dimension for ``[H, W]`` input.

    Raises:
        ShapeError, DTypeError, DeviceError: malformed inputs. ValueError: bad scale or range.
        DataError: (when validating) a focal length that is not finite and > 0, or a principal
        point that is not finite.

    Example:
        >>> k = torch.tensor([[500., 0, 320], [0, 500., 240], [0, 0, 1]])
        >>> pc = robocache.depth_to_points(torch.full((2, 480, 640), 1500, dtype=torch.uint16), k)
        >>> pc.points.shape, pc.valid.shape
        (torch.Size([2, 307200, 3]), torch.Size([2, 307200]))
    """
    op = "depth_to_points"
    try:
        key = (_meta(depth), _meta(intrinsics), _meta(extrinsics), _meta(rgb), depth_scale,
               min_depth, max_depth)
        call = _POINT_CALLS.get(key)
    except (AttributeError, TypeError):  # not tensors: the checks name the argument
        key = call = None
    if call is None:
        # metadata checks are a pure function of the key: run once per geometry
        d, scale = _check_camera(op, depth, intrinsics, extrinsics, rgb, depth_scale,
                                 min_depth, max_depth, False)
        _check_points_fit(op, d.shape, d.device)
        call = _PointsCall(d.shape, scale, float(min_depth), float(max_depth))
        if key is not None:
            _POINT_CALLS.put(key, call)
    if wants_validation(validate, intrinsics):
        _check_intrinsic_values(op, intrinsics)
    b = call.shape[0]
    if launches_directly(depth):
        points, valid = call.launch(depth, intrinsics, extrinsics)
    else:
        d, k, e = _camera_tensors(depth if depth.dim() == 3 else depth.unsqueeze(0),
                                  intrinsics, extrinsics)
        points, valid = _DEPTH_TO_POINTS(d, k, e, call.scale, call.min_depth, call.max_depth)
        if depth.dim() == 2:
            points, valid = points[0], valid[0]
    colors = None if rgb is None else rgb.reshape(b, -1, rgb.shape[-1])
    if depth.dim() == 2 and colors is not None:
        colors = colors[0]
    return PointCloud(points, valid, colors)


def _meta(t: torch.Tensor | None) -> tuple | None:
    return None if t is None else (t.shape, t.stride(), t.dtype, t.device)


_POINT_CALLS = PlanCache()


class _PointsCall:
    """A validated `depth_to_points` geometry: depth as ``[B, H, W]``, the resolved scale and
    range and, once launched on CUDA, the backprojection's cached launch."""

    __slots__ = ("shape", "scale", "min_depth", "max_depth", "gather")

    def __init__(self, shape: torch.Size, scale: float, min_depth: float, max_depth: float):
        self.shape, self.scale, self.min_depth, self.max_depth = shape, scale, min_depth, max_depth
        self.gather = None

    def launch(self, depth, intrinsics, extrinsics) -> tuple[torch.Tensor, torch.Tensor]:
        """Points and valid flags of one eager CUDA call, in depth's batching."""
        b, h, w = self.shape
        depth, intrinsics = depth.contiguous(), intrinsics.contiguous()
        extrinsics = None if extrinsics is None else extrinsics.contiguous()
        if self.gather is None:
            from robocache.kernels.pointcloud import points_plan

            self.gather = points_plan(depth, b, h, w, intrinsics, extrinsics)
        lead = (b,) if depth.dim() == 3 else ()
        points = torch.empty(*lead, h * w, 3, dtype=torch.float32, device=depth.device)
        valid = torch.empty(*lead, h * w, dtype=torch.bool, device=depth.device)
        # without extrinsics the kernel is passed the intrinsics, which it never reads as such
        self.gather(depth, intrinsics, intrinsics if extrinsics is None else extrinsics, points,
                    valid, self.scale, self.min_depth, self.max_depth, fresh=True)
        return points, valid


@nvtx.annotate("robocache.voxelize")
def voxelize(points: torch.Tensor, *, features: torch.Tensor | None = None,
             lengths: torch.Tensor | None = None, mask: torch.Tensor | None = None,
             bounds_min, voxel_size, grid_size, mode: str = "occupancy", sparse: bool = False,
             validate: bool | None = None) -> VoxelGrid | SparseVoxels:
    """Reduce batched point clouds into voxel grids (dense, or sparse occupied voxels).

    Voxel of a point: ``floor((p - bounds_min) / voxel_size)`` in float32; the grid covers
    ``[bounds_min, bounds_min + voxel_size * grid_size)``. Valid points (per `lengths`/`mask`)
    outside it, or with NaN/inf coordinates, are dropped and counted in ``dropped``.
    Deterministic: occupancy, count, max and the sparse coords/ids bitwise; sum and mean up to
    the order of float32 additions (atomics).

    Args:
        points: ``[B, N, 3]`` or ``[N, 3]`` float, metres.
        features: ``[B, N, F]`` (``[N, F]``) float or uint8, for modes sum, mean and max.
        lengths: optional int ``[B]``: the first lengths[b] points of cloud b are valid.
        mask: optional bool ``[B, N]`` of valid points (instead of `lengths`).
        bounds_min: grid origin (x, y, z) in metres; a number applies to all axes.
        voxel_size: voxel edge in metres, one number or (x, y, z).
        grid_size: voxels per axis (X, Y, Z), or one int.
        mode: 'occupancy', 'count', 'sum', 'mean' or 'max' (features reduced in float32; empty
            voxels hold 0).
        sparse: return `SparseVoxels` (no dense grid) instead of `VoxelGrid`.
        validate: check `lengths` values (a device sync); default: on CPU, or ROBOCACHE_VALIDATE=1.

    Returns:
        `VoxelGrid`: grid ``[B, X, Y, Z]`` bool (occupancy) / int32 (count) or ``[B, X, Y, Z, F]``
        float32, count ``[B, X, Y, Z]`` int32 (None for occupancy), dropped ``[B]`` int32.
        With ``sparse=True``, `SparseVoxels` (see its fields; sized by an upper bound, the real
        count in ``num_voxels`` on the device, `SparseVoxels.trim` to cut). Unbatched input
        drops B from grid, count, dropped and point_to_voxel. An empty cloud gives an empty grid.

    Raises:
        ShapeError: malformed shapes, or a dense grid larger than the device memory (the message
            gives the bytes). DTypeError, DeviceError: wrong dtype or device. ValueError: bad mode,
            voxel_size, grid_size or bounds. DataError: lengths outside [0, N] (when validating).

    Example:
        >>> pts = torch.rand(4, 1000, 3)
        >>> vox = robocache.voxelize(pts, bounds_min=0.0, voxel_size=0.125, grid_size=8,
        ...                          mode="count")
        >>> vox.grid.shape, int(vox.grid.sum())
        (torch.Size([4, 8, 8, 8]), 4000)
    """
    op = "voxelize"
    lo, size, dims = _grid_spec(op, bounds_min, voxel_size, grid_size)
    _check_mode(op, mode, features, "features")
    if points.dim() not in (2, 3) or points.shape[-1] != 3:
        fail(op, f"`points` must be [B, N, 3] or [N, 3]; got shape {list(points.shape)}.")
    check_dtype(op, "points", points, FLOAT_DTYPES, "Pass float coordinates in metres.")
    batched = points.dim() == 3
    p = points if batched else points.unsqueeze(0)
    b, n, _ = p.shape
    if features is not None:
        check_device(op, "features", features, points.device, "points")
        check_dtype(op, "features", features, FEATURE_DTYPES, "Pass float or uint8 features.")
        if features.dim() != points.dim() or features.shape[:-1] != points.shape[:-1]:
            fail(op, f"`features` must be [*points.shape[:-1], F] = "
                 f"{[*points.shape[:-1], 'F']}; got shape {list(features.shape)}.")
        features = (features if batched else features.unsqueeze(0)).contiguous()
    if lengths is not None and mask is not None:
        fail(op, "pass `lengths` or `mask`, not both.", ValueError)
    if lengths is not None:
        check_dtype(op, "lengths", lengths, INDEX_DTYPES, "Pass integer lengths, e.g. .long().")
        check_device(op, "lengths", lengths, points.device, "points")
        lengths = lengths.reshape(1) if not batched and lengths.dim() == 0 else lengths
        if lengths.shape != (b,):
            fail(op, f"`lengths` must have shape [B] = [{b}]; got {list(lengths.shape)}.")
        if wants_validation(validate, lengths) and b and (
                bool((lengths < 0).any()) or bool((lengths > n).any())):
            fail(op, f"`lengths` must lie in [0, N] = [0, {n}]; got values in "
                 f"[{int(lengths.min())}, {int(lengths.max())}].", DataError)
    if mask is not None:
        check_dtype(op, "mask", mask, (torch.bool,), "Pass a bool mask, e.g. mask.bool().")
        check_device(op, "mask", mask, points.device, "points")
        if mask.shape != points.shape[:-1]:
            fail(op, f"`mask` must have shape {list(points.shape[:-1])} (one flag per point); "
                 f"got {list(mask.shape)}.")
        mask = (mask if batched else mask.unsqueeze(0)).contiguous()
    if not sparse:
        _check_dense_fits(op, b, dims, 1 if features is None else features.shape[-1], mode,
                          points.device)
    p = p.contiguous()
    if p.is_cuda:
        if sparse:
            keys, dropped = _kernel_keys(p, lengths, mask, lo, size, dims)
        else:
            return _unbatch(VoxelGrid(*_kernel_dense(p, features, lengths, mask, lo, size, dims,
                                                     mode)), batched)
    else:
        keys, dropped = ref.voxel_keys_ref(p, _valid_of(p, lengths, mask), lo, size, dims)
        if not sparse:
            grid, count = ref.voxelize_dense_ref(keys, features, mode, dims)
            return _unbatch(VoxelGrid(grid, count, dropped), batched)
    return _unbatch(_sparse(keys, dropped, features, mode, b, n, dims), batched)


@nvtx.annotate("robocache.depth_to_voxels")
def depth_to_voxels(depth: torch.Tensor, intrinsics: torch.Tensor, *,
                    extrinsics: torch.Tensor | None = None, rgb: torch.Tensor | None = None,
                    depth_scale: float | None = None, min_depth: float = 0.0,
                    max_depth: float = math.inf, bounds_min, voxel_size, grid_size,
                    mode: str = "occupancy", sparse: bool = False,
                    validate: bool | None = None) -> VoxelGrid | SparseVoxels:
    """Depth (+ rgb) straight to voxels in one kernel, without materializing the point cloud.

    Equal to ``voxelize(*depth_to_points(...)[:1], features=colors, mask=valid, ...)`` (same
    float32 arithmetic, so the same voxels bitwise for occupancy/count/max); invalid pixels are
    skipped, valid points outside the grid are counted in ``dropped``.

    Args:
        depth, intrinsics, extrinsics, depth_scale, min_depth, max_depth, validate: as
            `depth_to_points`.
        rgb: ``[B, H, W, C]`` uint8 or float per-pixel features (colours) for modes sum, mean,
            max; reduced in float32 in the input's units (uint8 stays 0..255).
        bounds_min, voxel_size, grid_size, mode, sparse: as `voxelize`.

    Returns:
        `VoxelGrid` or `SparseVoxels` as `voxelize` (N = H*W); unbatched for ``[H, W]`` depth.

    Raises:
        As `depth_to_points` and `voxelize`.

    Example:
        >>> k = torch.tensor([[500., 0, 320], [0, 500., 240], [0, 0, 1]])
        >>> depth = torch.full((8, 480, 640), 1500, dtype=torch.uint16)
        >>> rgb = torch.randint(0, 256, (8, 480, 640, 3), dtype=torch.uint8)
        >>> vox = robocache.depth_to_voxels(depth, k, rgb=rgb, bounds_min=(-2, -2, 0),
        ...                                 voxel_size=0.0625, grid_size=64, mode="mean")
        >>> vox.grid.shape, vox.count.shape
        (torch.Size([8, 64, 64, 64, 3]), torch.Size([8, 64, 64, 64]))
    """
    op = "depth_to_voxels"
    lo, size, dims = _grid_spec(op, bounds_min, voxel_size, grid_size)
    _check_mode(op, mode, rgb, "rgb")
    d, scale = _check_camera(op, depth, intrinsics, extrinsics, rgb, depth_scale, min_depth,
                             max_depth, validate)
    b, h, w = d.shape
    _check_points_fit(op, d.shape, d.device)
    feats = None if rgb is None else rgb.reshape(b, h, w, -1).contiguous()
    if not sparse:
        _check_dense_fits(op, b, dims, 1 if feats is None else feats.shape[-1], mode, d.device)
    d, k, e = _camera_tensors(d, intrinsics, extrinsics)
    batched = depth.dim() == 3
    if d.is_cuda:
        out = _kernel_depth(d, k, e, feats, scale, float(min_depth), float(max_depth), lo, size,
                            dims, mode, sparse)
        if not sparse:
            return _unbatch(VoxelGrid(*out), batched)
        keys, dropped = out
    else:
        points, valid = ref.backproject_ref(d, k, e, scale, min_depth, max_depth)
        keys, dropped = ref.voxel_keys_ref(points, valid, lo, size, dims)
        if not sparse:
            grid, count = ref.voxelize_dense_ref(keys, feats, mode, dims)
            return _unbatch(VoxelGrid(grid, count, dropped), batched)
    flat = None if feats is None else feats.reshape(b, h * w, -1)
    return _unbatch(_sparse(keys, dropped, flat, mode, b, h * w, dims), batched)
