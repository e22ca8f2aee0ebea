"""Triton pieces of trajectory augmentation: counter-based parameters and Gaussian noise.

Random numbers are Triton's Philox (``tl.rand`` for parameters, ``tl.randint4x`` for noise)
at the counters of `robocache.reference.augment` (which reproduces them in PyTorch), so the
fused pipeline kernel, the unfused noise kernel and the CPU reference draw the same numbers.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from robocache.kernels._utils import cdiv, tile_2d
from robocache.kernels.jit import normals, row_tile


@triton.jit
def _noise_kernel(x_ptr, std_ptr, out_ptr, seed, n_rows, D,
                  BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr):
    rows, cols, cmask, mask, offs = row_tile(n_rows, D, BLOCK_R, BLOCK_D)
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    std = tl.load(std_ptr + cols, mask=cmask, other=0.0)[None, :]
    y = x + std * normals(seed, rows, tl.program_id(1) * BLOCK_D, D, BLOCK_R, BLOCK_D)
    tl.store(out_ptr + offs, y.to(out_ptr.dtype.element_ty), mask=mask)


def noise_cuda(x: torch.Tensor, std: torch.Tensor, seed: int, out: torch.Tensor) -> torch.Tensor:
    """``out = x + std * normals(seed, N, D)`` for contiguous `x [N, D]`, std float32 [D]."""
    n, d = x.shape
    if n == 0 or d == 0:
        return out
    block_r, block_d = tile_2d(n, max(d, 4), max_cols=128, elements=4096)
    _noise_kernel[(cdiv(n, block_r), cdiv(d, block_d))](x, std, out, seed, n, d,
                                                        BLOCK_R=block_r, BLOCK_D=block_d)
    return out
