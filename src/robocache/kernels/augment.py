"""Triton pieces of trajectory augmentation: counter-based parameters and Gaussian noise.

Random numbers are Triton's Philox (``tl.rand`` for parameters, ``tl.randint4x`` for noise)
at the counters of `robocache.reference.augment` (which reproduces them in PyTorch), so the
fused pipeline kernel, the unfused noise kernel and the CPU reference draw the same numbers.
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
def _sincos_turns(u):
    """(cos, sin) of 2 pi u (u in turns, |u| < 2**29): quarter-turn reduction, then Taylor
    polynomials on [-pi/4, pi/4] (|error| < 3e-8). libdevice's sinf/cosf carry a Payne-Hanek
    path for huge radian arguments: inlined per element it cost the fused kernel ~80 SASS
    instructions and a local-memory array each (sm_90, ptxas -v)."""
    q = tl.floor(4.0 * u + 0.5)
    a = 6.283185307179586 * (u - 0.25 * q)
    a2 = a * a
    s = a + a * a2 * (-1.6666666666666666e-1 + a2 * (8.333333333333333e-3
                                                      + a2 * (-1.984126984126984e-4
                                                              + a2 * 2.755731922398589e-6)))
    c = 1.0 + a2 * (-0.5 + a2 * (4.1666666666666664e-2
                                 + a2 * (-1.388888888888889e-3 + a2 * 2.48015873015873e-5)))
    k = q.to(tl.int32) & 3
    odd = (k & 1) == 1
    cos = tl.where(odd, s, c)
    sin = tl.where(odd, c, s)
    return tl.where((k == 1) | (k == 2), -cos, cos), tl.where(k >= 2, -sin, sin)


@triton.jit
def _rigid(u, slots, max_t, max_r):
    """(qw, qx, qy, qz, tx, ty, tz) of a variant: see reference.augment.rigid_from_uniforms."""
    z = 2.0 * _slot(u, slots, SLOT_AXIS) - 1.0
    ca, sa = _sincos_turns(_slot(u, slots, SLOT_AXIS + 1))
    r = tl.sqrt(tl.maximum(1.0 - z * z, 0.0))
    ch, sh = _sincos_turns(max_r * _slot(u, slots, SLOT_ANGLE) * 0.07957747154594767)  # 1/4pi
    tx = (2.0 * _slot(u, slots, SLOT_TRANS) - 1.0) * max_t
    ty = (2.0 * _slot(u, slots, SLOT_TRANS + 1) - 1.0) * max_t
    tz = (2.0 * _slot(u, slots, SLOT_TRANS + 2) - 1.0) * max_t
    return ch, sh * r * ca, sh * r * sa, sh * z, tx, ty, tz


@triton.jit
def _warp(t, u, slots, amp, max_crop, TERMS: tl.constexpr, CROP: tl.constexpr):
    """phi(t) for normalized times t [BLOCK]: see reference.augment.warp_phase."""
    phi = t
    for m in tl.static_range(TERMS):
        a = (2.0 * _slot(u, slots, SLOT_WARP + m) - 1.0) * amp
        _, sin = _sincos_turns(t * (0.5 * (m + 1)))
        phi += a * sin * (1.0 / (3.141592653589793 * (m + 1)))
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
def _box_muller(w0, w1):
    """Two standard normals from two Philox words: see reference.augment.box_muller."""
    u0 = tl.maximum(tl.uint_to_uniform_float(w0), 1.0e-7)
    r = tl.sqrt(-2.0 * tl.log(u0))
    c, s = _sincos_turns(tl.uint_to_uniform_float(w1))
    return r * c, r * s


@triton.jit
def _normals(seed, rows, d0, D, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr):
    """Standard normals [BLOCK_R, BLOCK_D] at rows (int64 [BLOCK_R]) and columns
    d0 .. d0 + BLOCK_D (d0, BLOCK_D multiples of 4) of an [N, D] array: one Philox call per
    4 columns (see reference.augment.normals). One call per element (`tl.randn`) made noise
    ~45% of the fused kernel's instructions."""
    quads = d0 // 4 + tl.arange(0, BLOCK_D // 4)
    w0, w1, w2, w3 = tl.randint4x(seed, rows[:, None] * ((D + 3) // 4) + quads[None, :])
    n0, n1 = _box_muller(w0, w1)
    n2, n3 = _box_muller(w2, w3)
    return tl.reshape(tl.join(tl.join(n0, n2), tl.join(n1, n3)), [BLOCK_R, BLOCK_D])


@triton.jit
def _noise_kernel(x_ptr, std_ptr, out_ptr, seed, n_rows, D,
                  BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr):
    rows, cols, cmask, mask, offs = row_tile(n_rows, D, BLOCK_R, BLOCK_D)
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    std = tl.load(std_ptr + cols, mask=cmask, other=0.0)[None, :]
    y = x + std * _normals(seed, rows, tl.program_id(1) * BLOCK_D, D, BLOCK_R, BLOCK_D)
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
