"""Internals shared by the public op modules: the registered ops behind `normalize` and
`add_noise` (also the unfused `Pipeline` chain) and the augmentation helpers `Pipeline` reuses.

Nothing here validates: callers have checked shapes, dtypes and devices.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from robocache._plancache import PlanCache
from robocache.errors import ShapeError
from robocache.ops._checks import fail
from robocache.ops._dispatch import Op
from robocache.reference import augment as augment_ref
from robocache.reference import normalize as normalize_ref

Seed = int | torch.Generator


def as_seed(op: str, seed: Seed) -> int:
    """An int seed in [0, 2**63) from an int or a torch.Generator."""
    if isinstance(seed, torch.Generator):
        return int(torch.randint(0, 2**62, (1,), generator=seed))
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63:
        fail(op, f"`seed` must be an int in [0, 2**63) or a torch.Generator; got {seed!r}.",
             ValueError)
    return seed


# ---------------------------------------------------------------- normalize: the affine map

def _affine_cpu(x: torch.Tensor, offset: torch.Tensor, scale: torch.Tensor, clip: bool,
                inverse: bool) -> torch.Tensor:
    return normalize_ref.affine_reference(x, offset, scale, clip, inverse)


def _affine_fake(x, offset, scale, clip, inverse):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


#: ``(x - offset) * scale`` (clipped to [-1, 1] with ``clip``), or its inverse, per column of
#: ``x [..., D]``; offset and scale ``[D]`` on x's device in the arithmetic dtype.
affine = Op("normalize_affine", cpu=_affine_cpu,
            cuda="robocache.kernels.normalize:affine_cuda", fake=_affine_fake)


def affine_into(x: torch.Tensor, offset: torch.Tensor, scale: torch.Tensor, clip: bool,
                inverse: bool, out: torch.Tensor) -> torch.Tensor:
    """The CUDA launch of `affine` into a contiguous `out` like `x` (an eager ``out=``)."""
    return affine.cuda()(x, offset, scale, clip, inverse, out)


# ---------------------------------------------------------------- augment: noise

def _noise_cpu(x: torch.Tensor, std: torch.Tensor, seed: int) -> torch.Tensor:
    d = x.shape[-1] if x.dim() else 1
    xc = x.contiguous()
    z = augment_ref.normals(seed, xc.numel() // max(d, 1), d).view(xc.shape)
    return (xc.float() + std * z).to(x.dtype)


def _noise_fake(x, std, seed):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


#: ``x + std * N(0, 1)`` (`robocache.add_noise` after validation): std float32 ``[D]`` on x's
#: device, seed an int (no copy, no sync: safe inside CUDA-graph capture).
add_noise = Op("add_noise", cpu=_noise_cpu, cuda="robocache.kernels.augment:noise_cuda",
               fake=_noise_fake)


def noise_into(x: torch.Tensor, std: torch.Tensor, seed: int,
               out: torch.Tensor) -> torch.Tensor:
    """The CUDA launch of `add_noise` into a contiguous `out` like `x` (an eager ``out=``)."""
    return add_noise.cuda()(x, std, seed, out)


_STD_ON_DEVICE = PlanCache(256)


def noise_std_on(op: str, std, d: int, device: torch.device) -> torch.Tensor:
    """`noise_std_vector` on `device`. A std given as numbers is validated and copied once per
    (values, D, device); a tensor std is data, read on every call."""
    if isinstance(std, torch.Tensor):
        return noise_std_vector(op, std, d).to(device)
    try:
        key = (tuple(std) if isinstance(std, Sequence) else std, d, device)
        hit = _STD_ON_DEVICE.get(key)
    except TypeError:  # unhashable entries: no caching (validation names the problem)
        return noise_std_vector(op, std, d).to(device)
    if hit is None:
        hit = _STD_ON_DEVICE.put(key, noise_std_vector(op, std, d).to(device))
    return hit


def noise_std_vector(op: str, std, d: int) -> torch.Tensor:
    """Validated per-dimension std as float32 ``[d]`` (CPU)."""
    if isinstance(std, torch.Tensor):
        sd = std.detach().to("cpu", torch.float32).flatten()
        # a tensor's values are data: checked eagerly, not while tracing
        bad = not torch.compiler.is_compiling() and (
            bool((sd < 0).any()) or not bool(torch.isfinite(sd).all()))
    else:
        values = [float(v) for v in (std if isinstance(std, Sequence) else [std])]
        bad = not all(math.isfinite(v) and v >= 0 for v in values)
        sd = torch.tensor(values, dtype=torch.float32)
    if sd.numel() == 1:
        sd = sd.expand(d).clone()
    if sd.numel() != d:
        fail(op, f"`std` must be a scalar or have D = {d} entries; got {sd.numel()}.",
             ShapeError)
    if bad:
        fail(op, f"`std` must be finite and >= 0 (noise scales); got {sd.tolist()}.", ValueError)
    return sd


# ---------------------------------------------------------------- augment: stream dropout

def zero_streams(x: torch.Tensor, col: torch.Tensor, dropped: torch.Tensor) -> torch.Tensor:
    """`drop_streams` after validation, with the column -> stream map on x's device."""
    padded = torch.cat([dropped, dropped.new_zeros(*dropped.shape[:-1], 1)], -1)
    zero = padded[..., col]  # [*L, D]; column -1 reads the appended False
    return x.masked_fill(zero.unsqueeze(-2), 0)


def stream_of_column(streams: Sequence[tuple[int, int]], d: int) -> torch.Tensor:
    """int32 ``[d]``: the stream each column belongs to (-1: none; later streams win)."""
    col = torch.full((d,), -1, dtype=torch.int32)
    for s, (a, b) in enumerate(streams):
        col[a:b] = s
    return col
