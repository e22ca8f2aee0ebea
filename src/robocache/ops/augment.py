"""Trajectory augmentation, parameters sampled separately from their application.

    >>> rig = sample_rigid((B, K), max_translation=0.05, max_rotation=0.3, seed=7)
    >>> pos, quat = rigid_transform(rig, positions=pos, quaternions=quat)   # [B, K, T, 3|4]
    >>> warp = sample_time_warp((B,), strength=0.5, seed=7)
    >>> y = time_warp(x, times, warp)                                       # [B, S, D]
    >>> y = add_noise(y, std=[0.01] * D, seed=7)

Reproducibility: every random number is counter-based Philox of ``(seed, index)`` (see
`robocache.reference.augment`): the same seed gives bitwise the same output on the same
device, and variant i of a batch gets the same parameters whatever the batch size. CPU and
CUDA draw the same integers; float results agree to rounding. `seed` is an int in
``[0, 2**63)`` or a `torch.Generator` (one int is drawn from it).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from robocache.errors import DataError, ShapeError
from robocache.observability import nvtx
from robocache.ops import _shared
from robocache.ops._checks import (
    FLOAT_DTYPES,
    check_choice,
    check_dtype,
    check_nonneg,
    check_streams,
    fail,
    wants_validation,
)
from robocache.ops._dispatch import launches_directly
from robocache.ops._shared import Seed
from robocache.reference import augment as ref

__all__ = ["RigidParams", "WarpParams", "variants", "sample_rigid", "rigid_transform",
           "sample_time_warp", "warp_phase", "time_warp", "add_noise", "smooth",
           "sample_dropout", "drop_streams"]

def variants(x: torch.Tensor, k: int) -> torch.Tensor:
    """K views of each trajectory: ``[B, ...] -> [B, K, ...]`` (an expand, no copy).

    Raises:
        ValueError: ``k < 1``.
    """
    if not isinstance(k, int) or k < 1:
        fail("variants", f"`k` (variants per trajectory) must be an int >= 1; got {k!r}.",
             ValueError)
    return x.unsqueeze(1).expand(x.shape[0], k, *x.shape[1:])


def _count(shape: Sequence[int]) -> int:
    return math.prod(shape)


@dataclass(frozen=True)
class RigidParams:
    """Random rigid transforms: `rotation` unit wxyz ``[..., 4]``, `translation` metres
    ``[..., 3]`` (float32)."""

    rotation: torch.Tensor
    translation: torch.Tensor


def sample_rigid(shape: Sequence[int], *, max_translation: float, max_rotation: float,
                 seed: Seed, device: torch.device | str | None = None) -> RigidParams:
    """Sample SE(3) transforms: axis uniform on the sphere, angle uniform in
    ``[0, max_rotation]`` radians, translation uniform in ``[-max_translation, max_translation]^3``
    metres; element i (row-major over `shape`) uses Philox slots of variant i.

    Raises:
        ValueError: negative bounds or a bad seed.

    Example:
        >>> sample_rigid((4, 10), max_translation=0.05, max_rotation=0.3, seed=0).rotation.shape
        torch.Size([4, 10, 4])
    """
    check_nonneg("sample_rigid", "max_translation", max_translation)
    check_nonneg("sample_rigid", "max_rotation", max_rotation)
    u = ref.param_uniforms(_shared.as_seed("sample_rigid", seed), _count(shape), 0, ref.SLOT_CROP,
                           device)
    q, t = ref.rigid_from_uniforms(u, max_translation, max_rotation)
    return RigidParams(q.reshape(*shape, 4), t.reshape(*shape, 3))


@nvtx.annotate("robocache.augment.rigid_transform")
def rigid_transform(params: RigidParams, *, positions: torch.Tensor | None = None,
                    quaternions: torch.Tensor | None = None,
                    points: torch.Tensor | None = None) -> tuple[torch.Tensor | None, ...]:
    """Apply one rigid transform per leading index to poses and point clouds, consistently.

    Args:
        params: `RigidParams` with leading dims ``L`` (e.g. ``[B, K]``).
        positions: ``[*L, T, 3]`` end-effector positions (metres) -> ``R p + t``.
        quaternions: ``[*L, T, 4]`` wxyz orientations -> ``r * q`` (norm preserved).
        points: ``[*L, N, 3]`` point cloud -> ``R p + t``.

    Returns:
        (positions, quaternions, points), None where not given; dtypes kept.

    Raises:
        ShapeError: a tensor whose leading dims or last dim do not fit.
    """
    from robocache.ops.geometry import quat_apply, quat_multiply

    lead = tuple(params.rotation.shape[:-1])
    results = []
    for name, x, width in (("positions", positions, 3), ("quaternions", quaternions, 4),
                           ("points", points, 3)):
        if x is None:
            results.append(None)
            continue
        check_dtype("rigid_transform", name, x, FLOAT_DTYPES, f"Convert with {name}.float().")
        if x.dim() != len(lead) + 2 or tuple(x.shape[:len(lead)]) != lead or x.shape[-1] != width:
            fail("rigid_transform", f"`{name}` must have shape [{', '.join(map(str, lead))}, "
                 f"N, {width}] (the params' leading dims, then samples, then {width}); got "
                 f"{list(x.shape)}.", ShapeError)
        r = params.rotation.to(x.device, torch.float32).unsqueeze(-2)
        xf = x.float()
        if width == 4:
            y = quat_multiply(r, xf)
        else:
            y = quat_apply(r, xf) + params.translation.to(x.device, torch.float32).unsqueeze(-2)
        results.append(y.to(x.dtype))
    return tuple(results)


@dataclass(frozen=True)
class WarpParams:
    """Smooth monotone time maps: sine-series `coeffs` ``[..., M]`` and `crop` ``[..., 2]``
    (fractions cut at the start and end; zero keeps the endpoints). See `warp_phase`."""

    coeffs: torch.Tensor
    crop: torch.Tensor


def sample_time_warp(shape: Sequence[int], *, strength: float, terms: int = 3,
                     keep_endpoints: bool = True, max_crop: float = 0.0, seed: Seed,
                     device: torch.device | str | None = None) -> WarpParams:
    """Sample time maps ``phi(u) = u + sum_m a_m sin(pi m u) / (pi m)`` with
    ``sum |a_m| <= strength < 1`` (so ``phi' >= 1 - strength > 0``: strictly increasing).

    Args:
        shape: leading dims of the maps (e.g. ``[B]`` or ``[B, K]``).
        strength: in [0, 1); the largest relative speed change.
        terms: sine terms M (1..8); more terms, wigglier maps.
        keep_endpoints: phi(0) = 0 and phi(1) = 1. If False, crops (start, end) are each drawn
            uniformly in ``[0, max_crop]`` and the map covers ``[c0, 1 - c1]``.
        max_crop: in [0, 0.5).

    Raises:
        ValueError: parameters out of range.
    """
    op = "sample_time_warp"
    check_nonneg(op, "strength", strength, 1.0)
    check_nonneg(op, "max_crop", max_crop, 0.5)
    if not 1 <= terms <= ref.MAX_WARP_TERMS:
        fail(op, f"`terms` must be in [1, {ref.MAX_WARP_TERMS}]; got {terms}.", ValueError)
    u = ref.param_uniforms(_shared.as_seed(op, seed), _count(shape), 0, ref.SLOT_CROP + 2, device)
    coeffs, crop = ref.warp_from_uniforms(u, strength, terms, 0.0 if keep_endpoints else max_crop)
    return WarpParams(coeffs.reshape(*shape, terms), crop.reshape(*shape, 2))


def warp_phase(u: torch.Tensor, params: WarpParams) -> torch.Tensor:
    """Evaluate the time maps at normalized times ``u [*L, T]`` in [0, 1] -> ``[*L, T]``."""
    return ref.warp_phase(u.float(), params.coeffs.to(u.device), params.crop.to(u.device))


@nvtx.annotate("robocache.augment.time_warp")
def time_warp(data: torch.Tensor, times: torch.Tensor, params: WarpParams | None = None, *,
              time_map: torch.Tensor | None = None, lengths: torch.Tensor | None = None,
              validate: bool | None = None) -> torch.Tensor:
    """Re-time trajectories with a monotone time map, through `robocache.resample` (linear).

    Output sample j keeps its timestamp ``times[b, j]`` and takes the value the trajectory had
    at ``t_first + span * phi((times[b, j] - t_first) / span)`` (span = the row's duration), or
    at ``time_map[b, j]`` when a user map is given.

    Args:
        data: ``[B, S, D]`` float samples.
        times: ``[B, S]`` (or ``[S]``) float32/float64 seconds, non-decreasing.
        params: `WarpParams` with leading dims ``[B]`` (from `sample_time_warp`).
        time_map: instead of params, source times ``[B, T]`` to read at; must be
            non-decreasing (checked when validating: by default on CPU).
        lengths: int ``[B]`` valid samples per row.

    Returns:
        ``[B, S, D]`` (``[B, T, D]`` with a time_map) in data's dtype.

    Raises:
        ValueError: neither or both of params / time_map.
        ShapeError: data not ``[B, S, D]``, times, params or lengths not matching it.
        DataError: (when validating) a decreasing time_map.
    """
    from robocache.ops.resample import resample

    op = "time_warp"
    if (params is None) == (time_map is None):
        fail(op, "pass exactly one of `params` (sampled warps) and `time_map` (your own "
             "target times).", ValueError)
    for name, t in (("data", data), ("times", times)):
        if not isinstance(t, torch.Tensor):
            fail(op, f"`{name}` must be a torch.Tensor; got {type(t).__name__}.", TypeError)
    if data.dim() != 3:
        fail(op, f"`data` must be [B, S, D]; got shape {list(data.shape)}.")
    B, S, _ = data.shape
    if times.shape not in ((B, S), (S,)):
        fail(op, f"`times` must be [B, S] = [{B}, {S}] or [S]; got {list(times.shape)}.")
    if params is not None and (params.coeffs.shape[:-1] != (B,) or
                               params.crop.shape != (B, 2)):
        fail(op, f"`params` must hold one warp per row (coeffs [B, M], crop [B, 2] with B = "
             f"{B}); got coeffs {list(params.coeffs.shape)}, crop {list(params.crop.shape)}. "
             "Sample them with sample_time_warp((B,), ...).")
    if lengths is not None and (not isinstance(lengths, torch.Tensor) or
                                lengths.shape != (B,)):
        fail(op, f"`lengths` must be an integer tensor [B] = [{B}]; got "
             f"{getattr(lengths, 'shape', type(lengths).__name__)}.")
    if time_map is None:
        t = times if times.dim() == 2 else times.expand(data.shape[0], -1)
        last = t[:, -1] if lengths is None else t.gather(1, (lengths.long() - 1)[:, None])[:, 0]
        first = t[:, :1]
        span = (last[:, None] - first).clamp_min(torch.finfo(t.dtype).tiny)
        u = ((t - first) / span).float().clamp(0, 1)
        time_map = first + span * warp_phase(u, params).to(t.dtype)
    elif wants_validation(validate, time_map):
        tm = time_map if time_map.dim() == 2 else time_map[None]
        steps = tm[:, 1:] < tm[:, :-1]
        if bool(steps.any()):
            row, col = (int(v) for v in steps.nonzero()[0])
            fail(op, f"`time_map` decreases at row {row}, between samples {col} and {col + 1}; "
                 "a time map must be monotone (non-decreasing): sort it or sample one with "
                 "sample_time_warp.", DataError)
    return resample(data, times, time_map, lengths=lengths, validate=validate)


@nvtx.annotate("robocache.augment.add_noise")
def add_noise(x: torch.Tensor, std: float | Sequence[float] | torch.Tensor, *, seed: Seed,
              out: torch.Tensor | None = None) -> torch.Tensor:
    """``x + std * N(0, 1)`` per element; element (r, c) of the ``[N, D]`` view draws normal
    c % 4 of Philox (seed, r * ceil(D / 4) + c // 4) (`robocache.reference.augment.normals`).

    Args:
        x: ``[..., D]`` float tensor (made contiguous).
        std: scalar or per-dimension ``[D]`` standard deviations, >= 0 (x's units).
        seed: int or torch.Generator.
        out: optional output like `x`.

    Returns:
        Tensor like `x`. CUDA: one Triton kernel; CPU: the PyTorch reference (same numbers).

    Raises:
        ValueError: a negative std. ShapeError: std of the wrong length.

    Example:
        >>> add_noise(torch.zeros(2, 3), 0.1, seed=0).shape
        torch.Size([2, 3])
    """
    op = "add_noise"
    check_dtype(op, "x", x, FLOAT_DTYPES, "Convert with x.float().")
    d = x.shape[-1] if x.dim() else 1
    std_d = _shared.noise_std_on(op, std, d, x.device)
    seed = _shared.as_seed(op, seed)
    if out is not None and out.is_contiguous() and launches_directly(x):
        return _shared.noise_into(x, std_d, seed, out)
    y = _shared.add_noise(x, std_d, seed)
    return y if out is None else out.copy_(y)


@nvtx.annotate("robocache.augment.smooth")
def smooth(x: torch.Tensor, *, method: str = "gaussian", sigma: float = 1.0,
           window: int | None = None, polyorder: int = 2, dim: int = -2) -> torch.Tensor:
    """Smooth along time (deterministic; edges extended with the edge value, 'nearest').

    Args:
        x: float tensor, time along `dim` (default -2 of ``[..., T, D]``).
        method: 'gaussian' (``scipy.ndimage.gaussian_filter1d(mode='nearest')``, taps out to
            4 sigma) or 'savgol' (``scipy.signal.savgol_filter(mode='nearest')``).
        sigma: Gaussian width in samples (> 0).
        window: Savitzky-Golay window (odd, > polyorder).
        polyorder: Savitzky-Golay polynomial order.
        dim: the time dimension.

    Returns:
        Tensor like `x` (a 1-D convolution with PyTorch on any device).

    Raises:
        ValueError: bad method, sigma, window or polyorder. ShapeError: `dim` out of range.
        DTypeError: x not floating point.
    """
    op = "smooth"
    check_choice(op, "method", method, ("gaussian", "savgol"))
    if not isinstance(x, torch.Tensor):
        fail(op, f"`x` must be a torch.Tensor; got {type(x).__name__}.", TypeError)
    check_dtype(op, "x", x, FLOAT_DTYPES, "Convert with x.float().")
    if not isinstance(dim, int) or not -x.dim() <= dim < max(x.dim(), 1):
        fail(op, f"`dim` (the time dimension) must index one of x's {x.dim()} dimensions; got "
             f"{dim!r} for shape {list(x.shape)}.")
    if method == "gaussian":
        if not sigma > 0:
            fail(op, f"`sigma` must be > 0 samples; got {sigma!r}.", ValueError)
        taps = ref.gaussian_taps(sigma, int(4.0 * sigma + 0.5))
    else:
        if window is None or window % 2 == 0 or window <= polyorder or polyorder < 0:
            fail(op, f"`window` must be odd and > polyorder >= 0; got window={window!r}, "
                 f"polyorder={polyorder!r}.", ValueError)
        taps = ref.savgol_taps(window, polyorder)
    if x.numel() == 0:  # no step (or no column) to smooth
        return x.clone()
    return ref.smooth_reference(x, taps, dim)


def sample_dropout(shape: Sequence[int], streams: int, p: float, *, seed: Seed,
                   device: torch.device | str | None = None) -> torch.Tensor:
    """Bool ``[*shape, streams]``: stream s of element i is dropped with probability p."""
    op = "sample_dropout"
    if not 0 <= p <= 1:
        fail(op, f"`p` must be in [0, 1]; got {p!r}.", ValueError)
    if not 0 <= streams <= ref.MAX_STREAMS:
        fail(op, f"`streams` must be in [0, {ref.MAX_STREAMS}]; got {streams}.", ValueError)
    u = ref.param_uniforms(_shared.as_seed(op, seed), _count(shape), ref.SLOT_DROP, streams, device)
    return (u < p).reshape(*shape, streams)


@nvtx.annotate("robocache.augment.drop_streams")
def drop_streams(x: torch.Tensor, streams: Sequence[tuple[int, int]],
                 dropped: torch.Tensor) -> torch.Tensor:
    """Zero the columns ``[start, stop)`` of each dropped stream.

    Args:
        x: ``[*L, T, D]``.
        streams: column ranges per stream.
        dropped: bool ``[*L, len(streams)]`` (e.g. from `sample_dropout`); keep it as the flag.

    Returns:
        A new tensor like `x`.
    """
    check_streams("drop_streams", streams, x.shape[-1])
    col = _shared.stream_of_column(streams, x.shape[-1]).to(x.device)
    if dropped.shape != (*x.shape[:-2], len(streams)):
        fail("drop_streams", f"`dropped` must have shape {[*x.shape[:-2], len(streams)]}; got "
             f"{list(dropped.shape)}.", ShapeError)
    return _shared.zero_streams(x, col, dropped)
