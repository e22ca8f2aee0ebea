"""Triton kernel of NV12 -> RGB with swscale's arithmetic (see :mod:`robocache.reference.yuv`).

One program converts a block of pixels of one frame: it loads the pixels' luma, the chroma
pair of their 2x2 block and the frame's six coefficients, and writes the three planes of
``[N, 3, H, W]``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 1024


@triton.jit
def _nv12_rgb_kernel(src, coeffs, out, H, W, BLOCK: tl.constexpr):
    n = tl.program_id(1)
    p = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    hw = H * W
    inside = p < hw
    row, col = p // W, p % W
    frame = src + n.to(tl.int64) * (hw + hw // 2)
    y = tl.load(frame + p, mask=inside, other=0).to(tl.int32)
    chroma = frame + hw + (row // 2) * W + (col // 2) * 2
    u = (tl.load(chroma, mask=inside, other=128).to(tl.int32) << 3) - 1024
    v = (tl.load(chroma + 1, mask=inside, other=128).to(tl.int32) << 3) - 1024
    c = coeffs + n * 6
    yc, yo = tl.load(c), tl.load(c + 1)
    vr, ub, ug, vg = tl.load(c + 2), tl.load(c + 3), tl.load(c + 4), tl.load(c + 5)
    luma = (((y << 3) - yo) * yc) >> 16
    r = luma + ((v * vr) >> 16)
    g = luma + ((u * ug) >> 16) + ((v * vg) >> 16)
    b = luma + ((u * ub) >> 16)
    dst = out + n.to(tl.int64) * 3 * hw + p
    tl.store(dst, tl.minimum(tl.maximum(r, 0), 255).to(tl.uint8), mask=inside)
    tl.store(dst + hw, tl.minimum(tl.maximum(g, 0), 255).to(tl.uint8), mask=inside)
    tl.store(dst + 2 * hw, tl.minimum(tl.maximum(b, 0), 255).to(tl.uint8), mask=inside)


def nv12_to_rgb(nv12: torch.Tensor, height: int, width: int, coeffs: torch.Tensor
                ) -> torch.Tensor:
    """:func:`robocache.reference.yuv.nv12_to_rgb` on the GPU (contiguous uint8 ``[N,
    H * W * 3 / 2]`` and int32 ``[N, 6]`` on one device)."""
    n = nv12.shape[0]
    out = torch.empty(n, 3, height, width, dtype=torch.uint8, device=nv12.device)
    if n:
        grid = (triton.cdiv(height * width, BLOCK), n)
        _nv12_rgb_kernel[grid](nv12, coeffs.to(torch.int32).contiguous(), out, height, width,
                               BLOCK=BLOCK)
    return out
