"""Triton kernel of the per-dimension normalization affine map (forward and inverse)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from robocache._plancache import PlanCache
from robocache.kernels._utils import CachedLaunch, cdiv, rows_of, tile_2d
from robocache.kernels.jit import row_tile


@triton.jit
def _affine_kernel(x_ptr, offset_ptr, scale_ptr, out_ptr, n_rows, D,
                   CLIP: tl.constexpr, INVERSE: tl.constexpr,
                   BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr):
    rows, cols, cmask, mask, offs = row_tile(n_rows, D, BLOCK_R, BLOCK_D)
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    acc = tl.float64 if x.dtype == tl.float64 else tl.float32
    x = x.to(acc)
    o = tl.load(offset_ptr + cols, mask=cmask, other=0.0).to(acc)[None, :]
    s = tl.load(scale_ptr + cols, mask=cmask, other=1.0).to(acc)[None, :]
    if INVERSE:
        y = x / s + o
    else:
        y = (x - o) * s
        if CLIP:
            y = tl.minimum(tl.maximum(y, -1.0), 1.0)
    tl.store(out_ptr + offs, y.to(out_ptr.dtype.element_ty), mask=mask)


# Eager calls relaunch a CachedLaunch per geometry (rows, columns, dtypes, flags, device).
_PLANS = PlanCache(256)


def affine_cuda(x: torch.Tensor, offset: torch.Tensor, scale: torch.Tensor, clip: bool,
                inverse: bool, out: torch.Tensor | None = None) -> torch.Tensor:
    """Apply the affine map to `x [..., D]` (made contiguous) into contiguous `out` like `x`
    (allocated when None); offset and scale ``[D]`` on x's device in the arithmetic dtype."""
    d = offset.shape[0]
    x, out, n = rows_of(x, d, out)
    if n == 0:
        return out
    key = (n, d, x.dtype, out.dtype, offset.dtype, clip, inverse, x.device)
    launch = _PLANS.get(key) or _PLANS.put(key, _affine_plan(n, d, clip, inverse))
    launch((x, offset, scale, out, n, d), (x, offset, scale, out))
    return out


def _affine_plan(n: int, d: int, clip: bool, inverse: bool) -> CachedLaunch:
    block_r, block_d = tile_2d(n, d, max_cols=128, elements=4096)
    return CachedLaunch(_affine_kernel, (cdiv(n, block_r), cdiv(d, block_d)),
                        (clip, inverse, block_r, block_d))
