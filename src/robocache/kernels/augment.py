"""Triton pieces of trajectory augmentation: counter-based parameters and Gaussian noise.

Random numbers are ``tl.rand`` / ``tl.randn`` of (seed, offset) with the offsets of
`robocache.reference.augment` (which reproduces them in PyTorch), so the fused pipeline
kernel, the unfused noise kernel and the CPU reference draw the same numbers.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from robocache.kernels._utils import cdiv, row_tile, tile_2d
from robocache.reference import augment as _ref

# Offsets and slots of the reference, as compile-time constants of the kernels.
PARAM_BASE = tl.constexpr(_ref.PARAM_BASE)
PARAM_STRIDE = tl.constexpr(_ref.PARAM_STRIDE)
SLOT_AXIS = tl.constexpr(_ref.SLOT_AXIS)
SLOT_ANGLE = tl.constexpr(_ref.SLOT_ANGLE)
SLOT_TRANS = tl.constexpr(_ref.SLOT_TRANS)
SLOT_WARP = tl.constexpr(_ref.SLOT_WARP)
SLOT_CROP = tl.constexpr(_ref.SLOT_CROP)
SLOT_DROP = tl.constexpr(_ref.SLOT_DROP)


@triton.jit
def _slot(u, slots, j: tl.constexpr):
    """Scalar slot j of a vector of per-variant uniforms."""
    return tl.sum(tl.where(slots == j, u, 0.0), axis=0)


@triton.jit
def _variant_uniforms(seed, variant):
    """The first 16 parameter uniforms of `variant` (int64): rigid, warp and crop slots."""
    slots = tl.arange(0, 16)
    # tensor-first sums: the interpreter cannot add a tensor to a module-level constexpr
    return tl.rand(seed, slots.to(tl.int64) + variant * PARAM_STRIDE + PARAM_BASE), slots


@triton.jit
def _rigid(u, slots, max_t, max_r):
    """(qw, qx, qy, qz, tx, ty, tz) of a variant: see reference.augment.rigid_from_uniforms."""
    z = 2.0 * _slot(u, slots, SLOT_AXIS) - 1.0
    az = 6.283185307179586 * _slot(u, slots, SLOT_AXIS + 1)
    r = tl.sqrt(tl.maximum(1.0 - z * z, 0.0))
    half = 0.5 * max_r * _slot(u, slots, SLOT_ANGLE)
    s = tl.sin(half)
    tx = (2.0 * _slot(u, slots, SLOT_TRANS) - 1.0) * max_t
    ty = (2.0 * _slot(u, slots, SLOT_TRANS + 1) - 1.0) * max_t
    tz = (2.0 * _slot(u, slots, SLOT_TRANS + 2) - 1.0) * max_t
    return tl.cos(half), s * r * tl.cos(az), s * r * tl.sin(az), s * z, tx, ty, tz


@triton.jit
def _warp(t, u, slots, amp, max_crop, TERMS: tl.constexpr, CROP: tl.constexpr):
    """phi(t) for normalized times t [BLOCK]: see reference.augment.warp_phase."""
    phi = t
    for m in tl.static_range(TERMS):
        a = (2.0 * _slot(u, slots, SLOT_WARP + m) - 1.0) * amp
        w = 3.141592653589793 * (m + 1)
        phi += a * tl.sin(t * w) / w
    if CROP:
        c0 = _slot(u, slots, SLOT_CROP) * max_crop
        c1 = _slot(u, slots, SLOT_CROP + 1) * max_crop
        phi = c0 + (1.0 - c0 - c1) * phi
    return phi


@triton.jit
def _dropped(seed, variant, p, NS: tl.constexpr):
    """Bool [NS] (NS a power of two, padded): is stream s of `variant` dropped."""
    s = tl.arange(0, NS)
    u = tl.rand(seed, s.to(tl.int64) + variant * PARAM_STRIDE + (PARAM_BASE + SLOT_DROP))
    return u < p


@triton.jit
def _quat_rotate(qw, qx, qy, qz, vx, vy, vz):
    """Rotate v by the unit quaternion q: v + w t + u x t with t = 2 u x v."""
    tx = 2.0 * (qy * vz - qz * vy)
    ty = 2.0 * (qz * vx - qx * vz)
    tz = 2.0 * (qx * vy - qy * vx)
    return (vx + qw * tx + (qy * tz - qz * ty), vy + qw * ty + (qz * tx - qx * tz),
            vz + qw * tz + (qx * ty - qy * tx))


@triton.jit
def _quat_mul(aw, ax, ay, az, bw, bx, by, bz):
    """Hamilton product a * b (wxyz)."""
    return (aw * bw - ax * bx - ay * by - az * bz, aw * bx + ax * bw + ay * bz - az * by,
            aw * by - ax * bz + ay * bw + az * bx, aw * bz + ax * by - ay * bx + az * bw)


@triton.jit
def _noise_kernel(x_ptr, std_ptr, out_ptr, seed, n_rows, D,
                  BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr):
    rows, cols, cmask, mask, offs = row_tile(n_rows, D, BLOCK_R, BLOCK_D)
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    std = tl.load(std_ptr + cols, mask=cmask, other=0.0)[None, :]
    y = x + std * tl.randn(seed, offs)
    tl.store(out_ptr + offs, y.to(out_ptr.dtype.element_ty), mask=mask)


def noise_cuda(x: torch.Tensor, std: torch.Tensor, seed: int, out: torch.Tensor) -> torch.Tensor:
    """``out = x + std * randn(seed, flat index)`` for contiguous `x [N, D]`, std float32 [D]."""
    n, d = x.shape
    if n == 0 or d == 0:
        return out
    block_r, block_d = tile_2d(n, d, max_cols=128, elements=4096)
    _noise_kernel[(cdiv(n, block_r), cdiv(d, block_d))](x, std, out, seed, n, d,
                                                        BLOCK_R=block_r, BLOCK_D=block_d)
    return out
