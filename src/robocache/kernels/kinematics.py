"""Triton kernels for serial-chain kinematics: FK, geometric Jacobian, and a fused LM IK solve.

The chain arrives as two small tensors (see `robocache.reference.kinematics`): ``params [NJ, 16]``
(origin rows, axis, prismatic flag) and ``qcol [NJ]`` (q column, -1 for fixed joints). One program
handles BLOCK configurations, one per lane, and walks the chain with the pose held as 12 register
values per lane; the walk is unrolled over the NJ joints (NJ is a compile-time constant, so each
robot compiles once per dtype). Joint parameters are uniform scalar loads.

The Jacobian needs the end position before any column is known. Instead of a second pass, each
column keeps ``a = z`` (angular part) and ``w = z x p`` (``-z`` for prismatic joints) while
walking; at the end ``linear = a x p_end - w``, which is ``z x (p_end - p)`` for revolute joints and
``z`` for prismatic ones: one pass, columns held as ``[BLOCK, DP]`` tiles.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from robocache.kernels._utils import cdiv, next_pow2
from robocache.reference.kinematics import (
    COS_HALF_FLOOR,
    LM_DOWN,
    LM_LAMBDA0,
    LM_LAMBDA_MAX,
    LM_LAMBDA_MIN,
    LM_UP,
)

# Triton reads module globals only as constexprs.
_COS_HALF_FLOOR = tl.constexpr(COS_HALF_FLOOR)
_LAMBDA0 = tl.constexpr(LM_LAMBDA0)
_LAMBDA_MIN = tl.constexpr(LM_LAMBDA_MIN)
_LAMBDA_MAX = tl.constexpr(LM_LAMBDA_MAX)
_DOWN = tl.constexpr(LM_DOWN)
_UP = tl.constexpr(LM_UP)


@triton.jit
def _joint(p_ptr, J: tl.constexpr, t00, t01, t02, t03, t10, t11, t12, t13, t20, t21, t22, t23, qj):
    """Apply path joint J to the pose t (rows 0-2): returns the child pose, the joint's world
    axis z, its world origin p and its prismatic flag."""
    b = p_ptr + J * 16
    o00 = tl.load(b + 0)
    o01 = tl.load(b + 1)
    o02 = tl.load(b + 2)
    o03 = tl.load(b + 3)
    o10 = tl.load(b + 4)
    o11 = tl.load(b + 5)
    o12 = tl.load(b + 6)
    o13 = tl.load(b + 7)
    o20 = tl.load(b + 8)
    o21 = tl.load(b + 9)
    o22 = tl.load(b + 10)
    o23 = tl.load(b + 11)
    ax = tl.load(b + 12)
    ay = tl.load(b + 13)
    az = tl.load(b + 14)
    pri = tl.load(b + 15)
    # joint frame f = t @ origin
    f00 = t00 * o00 + t01 * o10 + t02 * o20
    f01 = t00 * o01 + t01 * o11 + t02 * o21
    f02 = t00 * o02 + t01 * o12 + t02 * o22
    f03 = t00 * o03 + t01 * o13 + t02 * o23 + t03
    f10 = t10 * o00 + t11 * o10 + t12 * o20
    f11 = t10 * o01 + t11 * o11 + t12 * o21
    f12 = t10 * o02 + t11 * o12 + t12 * o22
    f13 = t10 * o03 + t11 * o13 + t12 * o23 + t13
    f20 = t20 * o00 + t21 * o10 + t22 * o20
    f21 = t20 * o01 + t21 * o11 + t22 * o21
    f22 = t20 * o02 + t21 * o12 + t22 * o22
    f23 = t20 * o03 + t21 * o13 + t22 * o23 + t23
    # motion: Rodrigues rotation by th about the axis, translation d along it (one is zero)
    th = qj * (1 - pri)
    d = qj * pri
    c = tl.cos(th)
    s = tl.sin(th)
    v = 1 - c
    r00 = v * ax * ax + c
    r01 = v * ax * ay - s * az
    r02 = v * ax * az + s * ay
    r10 = v * ax * ay + s * az
    r11 = v * ay * ay + c
    r12 = v * ay * az - s * ax
    r20 = v * ax * az - s * ay
    r21 = v * ay * az + s * ax
    r22 = v * az * az + c
    zx = f00 * ax + f01 * ay + f02 * az
    zy = f10 * ax + f11 * ay + f12 * az
    zz = f20 * ax + f21 * ay + f22 * az
    return (f00 * r00 + f01 * r10 + f02 * r20, f00 * r01 + f01 * r11 + f02 * r21,
            f00 * r02 + f01 * r12 + f02 * r22, f03 + d * zx,
            f10 * r00 + f11 * r10 + f12 * r20, f10 * r01 + f11 * r11 + f12 * r21,
            f10 * r02 + f11 * r12 + f12 * r22, f13 + d * zy,
            f20 * r00 + f21 * r10 + f22 * r20, f20 * r01 + f21 * r11 + f22 * r21,
            f20 * r02 + f21 * r12 + f22 * r22, f23 + d * zz,
            zx, zy, zz, f03, f13, f23, pri)


@triton.jit
def _store_pose(ptr, t00, t01, t02, t03, t10, t11, t12, t13, t20, t21, t22, t23, mask):
    zero = tl.zeros_like(t00)
    tl.store(ptr + 0, t00, mask=mask)
    tl.store(ptr + 1, t01, mask=mask)
    tl.store(ptr + 2, t02, mask=mask)
    tl.store(ptr + 3, t03, mask=mask)
    tl.store(ptr + 4, t10, mask=mask)
    tl.store(ptr + 5, t11, mask=mask)
    tl.store(ptr + 6, t12, mask=mask)
    tl.store(ptr + 7, t13, mask=mask)
    tl.store(ptr + 8, t20, mask=mask)
    tl.store(ptr + 9, t21, mask=mask)
    tl.store(ptr + 10, t22, mask=mask)
    tl.store(ptr + 11, t23, mask=mask)
    tl.store(ptr + 12, zero, mask=mask)
    tl.store(ptr + 13, zero, mask=mask)
    tl.store(ptr + 14, zero, mask=mask)
    tl.store(ptr + 15, zero + 1, mask=mask)


@triton.jit
def _fk_kernel(q_ptr, p_ptr, c_ptr, out_ptr, N, DOF: tl.constexpr, NJ: tl.constexpr,
               ALL_LINKS: tl.constexpr, BLOCK: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = rows < N
    zero = tl.zeros([BLOCK], dtype=q_ptr.dtype.element_ty)
    one = zero + 1
    t00, t01, t02, t03 = one, zero, zero, zero
    t10, t11, t12, t13 = zero, one, zero, zero
    t20, t21, t22, t23 = zero, zero, one, zero
    for j in tl.static_range(NJ):
        col = tl.load(c_ptr + j)
        qj = tl.load(q_ptr + rows * DOF + col, mask=mask & (col >= 0), other=0.0)
        t00, t01, t02, t03, t10, t11, t12, t13, t20, t21, t22, t23, _, _, _, _, _, _, _ = _joint(
            p_ptr, j, t00, t01, t02, t03, t10, t11, t12, t13, t20, t21, t22, t23, qj)
        if ALL_LINKS:
            _store_pose(out_ptr + (rows * NJ + j) * 16,
                        t00, t01, t02, t03, t10, t11, t12, t13, t20, t21, t22, t23, mask)
    if not ALL_LINKS:
        _store_pose(out_ptr + rows * 16,
                    t00, t01, t02, t03, t10, t11, t12, t13, t20, t21, t22, t23, mask)


@triton.jit
def _fk_jacobian(q, cols, p_ptr, c_ptr, NJ: tl.constexpr, BLOCK: tl.constexpr):
    """End pose (12 [BLOCK] values) and Jacobian rows (6 [BLOCK, DP] tiles) for q [BLOCK, DP]."""
    zero = tl.zeros([BLOCK], dtype=q.dtype)
    one = zero + 1
    t00, t01, t02, t03 = one, zero, zero, zero
    t10, t11, t12, t13 = zero, one, zero, zero
    t20, t21, t22, t23 = zero, zero, one, zero
    a_x = tl.zeros_like(q)
    a_y = a_x
    a_z = a_x
    w_x = a_x
    w_y = a_x
    w_z = a_x
    for j in tl.static_range(NJ):
        col = tl.load(c_ptr + j)
        sel = (cols == col)[None, :]
        qj = tl.sum(tl.where(sel, q, 0.0), axis=1)
        t00, t01, t02, t03, t10, t11, t12, t13, t20, t21, t22, t23, zx, zy, zz, px, py, pz, pri = \
            _joint(p_ptr, j, t00, t01, t02, t03, t10, t11, t12, t13, t20, t21, t22, t23, qj)
        rev = 1 - pri
        a_x = tl.where(sel, (rev * zx)[:, None], a_x)
        a_y = tl.where(sel, (rev * zy)[:, None], a_y)
        a_z = tl.where(sel, (rev * zz)[:, None], a_z)
        w_x = tl.where(sel, (rev * (zy * pz - zz * py) - pri * zx)[:, None], w_x)
        w_y = tl.where(sel, (rev * (zz * px - zx * pz) - pri * zy)[:, None], w_y)
        w_z = tl.where(sel, (rev * (zx * py - zy * px) - pri * zz)[:, None], w_z)
    l_x = a_y * t23[:, None] - a_z * t13[:, None] - w_x
    l_y = a_z * t03[:, None] - a_x * t23[:, None] - w_y
    l_z = a_x * t13[:, None] - a_y * t03[:, None] - w_z
    return (t00, t01, t02, t03, t10, t11, t12, t13, t20, t21, t22, t23,
            l_x, l_y, l_z, a_x, a_y, a_z)


@triton.jit
def _jacobian_kernel(q_ptr, p_ptr, c_ptr, out_ptr, N, DOF: tl.constexpr, DP: tl.constexpr,
                     NJ: tl.constexpr, BLOCK: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    cols = tl.arange(0, DP)
    mask = (rows < N)[:, None] & (cols < DOF)[None, :]
    q = tl.load(q_ptr + rows[:, None] * DOF + cols[None, :], mask=mask, other=0.0)
    _, _, _, _, _, _, _, _, _, _, _, _, l_x, l_y, l_z, a_x, a_y, a_z = _fk_jacobian(
        q, cols, p_ptr, c_ptr, NJ, BLOCK)
    out = out_ptr + rows[:, None] * (6 * DOF) + cols[None, :]
    tl.store(out, l_x, mask=mask)
    tl.store(out + DOF, l_y, mask=mask)
    tl.store(out + 2 * DOF, l_z, mask=mask)
    tl.store(out + 3 * DOF, a_x, mask=mask)
    tl.store(out + 4 * DOF, a_y, mask=mask)
    tl.store(out + 5 * DOF, a_z, mask=mask)


@triton.jit
def _pose_error(t00, t01, t02, t03, t10, t11, t12, t13, t20, t21, t22, t23,
                g00, g01, g02, g03, g10, g11, g12, g13, g20, g21, g22, g23):
    """`robocache.reference.kinematics.pose_error` for one pose per lane: e (6), cost, position
    error, half chord."""
    e0 = g03 - t03
    e1 = g13 - t13
    e2 = g23 - t23
    # rotation target @ pose^T: its skew part is sin(theta) * axis
    vx = 0.5 * ((g20 * t10 + g21 * t11 + g22 * t12) - (g10 * t20 + g11 * t21 + g12 * t22))
    vy = 0.5 * ((g00 * t20 + g01 * t21 + g02 * t22) - (g20 * t00 + g21 * t01 + g22 * t02))
    vz = 0.5 * ((g10 * t00 + g11 * t01 + g12 * t02) - (g00 * t10 + g01 * t11 + g02 * t12))
    tr = (g00 * t00 + g01 * t01 + g02 * t02 + g10 * t10 + g11 * t11 + g12 * t12
          + g20 * t20 + g21 * t21 + g22 * t22)
    inv_cos_half = 1 / tl.sqrt(tl.maximum(0.25 * (tr + 1), _COS_HALF_FLOOR))
    e3 = vx * inv_cos_half
    e4 = vy * inv_cos_half
    e5 = vz * inv_cos_half
    d00 = g00 - t00
    d01 = g01 - t01
    d02 = g02 - t02
    d10 = g10 - t10
    d11 = g11 - t11
    d12 = g12 - t12
    d20 = g20 - t20
    d21 = g21 - t21
    d22 = g22 - t22
    chord2 = (d00 * d00 + d01 * d01 + d02 * d02 + d10 * d10 + d11 * d11 + d12 * d12
              + d20 * d20 + d21 * d21 + d22 * d22)
    pos2 = e0 * e0 + e1 * e1 + e2 * e2
    cost = pos2 + e3 * e3 + e4 * e4 + e5 * e5
    return e0, e1, e2, e3, e4, e5, cost, tl.sqrt(pos2), tl.sqrt(chord2 * 0.125)


@triton.jit
def _solve6(a00, a10, a11, a20, a21, a22, a30, a31, a32, a33, a40, a41, a42, a43, a44,
            a50, a51, a52, a53, a54, a55, e0, e1, e2, e3, e4, e5):
    """y = A^-1 e for a symmetric positive definite 6x6 A per lane (Cholesky, lower triangle)."""
    l00 = tl.sqrt(a00)
    l10 = a10 / l00
    l20 = a20 / l00
    l30 = a30 / l00
    l40 = a40 / l00
    l50 = a50 / l00
    l11 = tl.sqrt(a11 - l10 * l10)
    l21 = (a21 - l20 * l10) / l11
    l31 = (a31 - l30 * l10) / l11
    l41 = (a41 - l40 * l10) / l11
    l51 = (a51 - l50 * l10) / l11
    l22 = tl.sqrt(a22 - l20 * l20 - l21 * l21)
    l32 = (a32 - l30 * l20 - l31 * l21) / l22
    l42 = (a42 - l40 * l20 - l41 * l21) / l22
    l52 = (a52 - l50 * l20 - l51 * l21) / l22
    l33 = tl.sqrt(a33 - l30 * l30 - l31 * l31 - l32 * l32)
    l43 = (a43 - l40 * l30 - l41 * l31 - l42 * l32) / l33
    l53 = (a53 - l50 * l30 - l51 * l31 - l52 * l32) / l33
    l44 = tl.sqrt(a44 - l40 * l40 - l41 * l41 - l42 * l42 - l43 * l43)
    l54 = (a54 - l50 * l40 - l51 * l41 - l52 * l42 - l53 * l43) / l44
    l55 = tl.sqrt(a55 - l50 * l50 - l51 * l51 - l52 * l52 - l53 * l53 - l54 * l54)
    z0 = e0 / l00
    z1 = (e1 - l10 * z0) / l11
    z2 = (e2 - l20 * z0 - l21 * z1) / l22
    z3 = (e3 - l30 * z0 - l31 * z1 - l32 * z2) / l33
    z4 = (e4 - l40 * z0 - l41 * z1 - l42 * z2 - l43 * z3) / l44
    z5 = (e5 - l50 * z0 - l51 * z1 - l52 * z2 - l53 * z3 - l54 * z4) / l55
    y5 = z5 / l55
    y4 = (z4 - l54 * y5) / l44
    y3 = (z3 - l43 * y4 - l53 * y5) / l33
    y2 = (z2 - l32 * y3 - l42 * y4 - l52 * y5) / l22
    y1 = (z1 - l21 * y2 - l31 * y3 - l41 * y4 - l51 * y5) / l11
    y0 = (z0 - l10 * y1 - l20 * y2 - l30 * y3 - l40 * y4 - l50 * y5) / l00
    return y0, y1, y2, y3, y4, y5


@triton.jit
def _dot(a, b):
    return tl.sum(a * b, axis=1)


@triton.jit
def _ik_kernel(tgt_ptr, q0_ptr, lo_ptr, hi_ptr, p_ptr, c_ptr, q_out, perr_out, chord_out,
               P, SEEDS, max_iters, tol_pos, tol_chord,
               DOF: tl.constexpr, DP: tl.constexpr, NJ: tl.constexpr, BLOCK: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    cols = tl.arange(0, DP)
    rmask = rows < P
    cmask = cols < DOF
    mask = rmask[:, None] & cmask[None, :]
    q = tl.load(q0_ptr + rows[:, None] * DOF + cols[None, :], mask=mask, other=0.0)
    lo = tl.load(lo_ptr + cols, mask=cmask, other=0.0)[None, :]
    hi = tl.load(hi_ptr + cols, mask=cmask, other=0.0)[None, :]
    g = tgt_ptr + (rows // SEEDS) * 16
    g00 = tl.load(g + 0, mask=rmask, other=1.0)
    g01 = tl.load(g + 1, mask=rmask, other=0.0)
    g02 = tl.load(g + 2, mask=rmask, other=0.0)
    g03 = tl.load(g + 3, mask=rmask, other=0.0)
    g10 = tl.load(g + 4, mask=rmask, other=0.0)
    g11 = tl.load(g + 5, mask=rmask, other=1.0)
    g12 = tl.load(g + 6, mask=rmask, other=0.0)
    g13 = tl.load(g + 7, mask=rmask, other=0.0)
    g20 = tl.load(g + 8, mask=rmask, other=0.0)
    g21 = tl.load(g + 9, mask=rmask, other=0.0)
    g22 = tl.load(g + 10, mask=rmask, other=1.0)
    g23 = tl.load(g + 11, mask=rmask, other=0.0)
    t00, t01, t02, t03, t10, t11, t12, t13, t20, t21, t22, t23, j0, j1, j2, j3, j4, j5 = \
        _fk_jacobian(q, cols, p_ptr, c_ptr, NJ, BLOCK)
    e0, e1, e2, e3, e4, e5, cost, perr, chord = _pose_error(
        t00, t01, t02, t03, t10, t11, t12, t13, t20, t21, t22, t23,
        g00, g01, g02, g03, g10, g11, g12, g13, g20, g21, g22, g23)
    lam = tl.full([BLOCK], _LAMBDA0, q.dtype)
    active = rmask & ((perr > tol_pos) | (chord > tol_chord))
    it = 0
    # The loop ends when every lane of the program has converged: no host sync, and a program of
    # easy targets stops early.
    while (it < max_iters) & (tl.max(active.to(tl.int32), axis=0) > 0):
        y0, y1, y2, y3, y4, y5 = _solve6(
            _dot(j0, j0) + lam, _dot(j1, j0), _dot(j1, j1) + lam,
            _dot(j2, j0), _dot(j2, j1), _dot(j2, j2) + lam,
            _dot(j3, j0), _dot(j3, j1), _dot(j3, j2), _dot(j3, j3) + lam,
            _dot(j4, j0), _dot(j4, j1), _dot(j4, j2), _dot(j4, j3), _dot(j4, j4) + lam,
            _dot(j5, j0), _dot(j5, j1), _dot(j5, j2), _dot(j5, j3), _dot(j5, j4),
            _dot(j5, j5) + lam, e0, e1, e2, e3, e4, e5)
        dq = (j0 * y0[:, None] + j1 * y1[:, None] + j2 * y2[:, None] + j3 * y3[:, None]
              + j4 * y4[:, None] + j5 * y5[:, None])
        qn = tl.minimum(tl.maximum(q + dq, lo), hi)
        n00, n01, n02, n03, n10, n11, n12, n13, n20, n21, n22, n23, k0, k1, k2, k3, k4, k5 = \
            _fk_jacobian(qn, cols, p_ptr, c_ptr, NJ, BLOCK)
        f0, f1, f2, f3, f4, f5, cost_n, perr_n, chord_n = _pose_error(
            n00, n01, n02, n03, n10, n11, n12, n13, n20, n21, n22, n23,
            g00, g01, g02, g03, g10, g11, g12, g13, g20, g21, g22, g23)
        ok = active & (cost_n < cost)
        okc = ok[:, None]
        q = tl.where(okc, qn, q)
        j0 = tl.where(okc, k0, j0)
        j1 = tl.where(okc, k1, j1)
        j2 = tl.where(okc, k2, j2)
        j3 = tl.where(okc, k3, j3)
        j4 = tl.where(okc, k4, j4)
        j5 = tl.where(okc, k5, j5)
        e0 = tl.where(ok, f0, e0)
        e1 = tl.where(ok, f1, e1)
        e2 = tl.where(ok, f2, e2)
        e3 = tl.where(ok, f3, e3)
        e4 = tl.where(ok, f4, e4)
        e5 = tl.where(ok, f5, e5)
        cost = tl.where(ok, cost_n, cost)
        perr = tl.where(ok, perr_n, perr)
        chord = tl.where(ok, chord_n, chord)
        lam = tl.minimum(tl.maximum(tl.where(ok, lam * _DOWN, lam * _UP), _LAMBDA_MIN),
                         _LAMBDA_MAX)
        active = rmask & ((perr > tol_pos) | (chord > tol_chord))
        it += 1
    tl.store(q_out + rows[:, None] * DOF + cols[None, :], q, mask=mask)
    tl.store(perr_out + rows, perr, mask=rmask)
    tl.store(chord_out + rows, chord, mask=rmask)


# Configurations per program. FK/Jacobian: TODO measured on H100.
_FK_BLOCK = 128
_FK_WARPS = 4
_IK_BLOCK = 32
_IK_WARPS = 1


def fk_cuda(q: torch.Tensor, params: torch.Tensor, qcol: torch.Tensor,
            all_links: bool = False) -> torch.Tensor:
    """End pose ``[N, 4, 4]`` (or every path link ``[N, NJ, 4, 4]``) for contiguous ``q [N, DOF]``;
    ``params`` in q's dtype, on q's device."""
    n, dof = q.shape
    nj = qcol.shape[0]
    out = q.new_empty((n, nj, 4, 4) if all_links else (n, 4, 4))
    if n:
        _fk_kernel[(cdiv(n, _FK_BLOCK),)](q, params, qcol, out, n, DOF=dof, NJ=nj,
                                          ALL_LINKS=all_links, BLOCK=_FK_BLOCK,
                                          num_warps=_FK_WARPS)
    return out


def jacobian_cuda(q: torch.Tensor, params: torch.Tensor, qcol: torch.Tensor) -> torch.Tensor:
    """Geometric Jacobian ``[N, 6, DOF]`` (linear rows first, base frame) for ``q [N, DOF]``."""
    n, dof = q.shape
    out = q.new_empty((n, 6, dof))
    if n:
        _jacobian_kernel[(cdiv(n, _FK_BLOCK),)](q, params, qcol, out, n, DOF=dof,
                                                DP=next_pow2(dof), NJ=qcol.shape[0],
                                                BLOCK=_FK_BLOCK, num_warps=_FK_WARPS)
    return out


def ik_cuda(target: torch.Tensor, q0: torch.Tensor, lower: torch.Tensor, upper: torch.Tensor,
            params: torch.Tensor, qcol: torch.Tensor, seeds: int, max_iters: int,
            tol_pos: float, tol_half_chord: float):
    """Fused Levenberg-Marquardt IK, one launch for all iterations and all ``P = T * seeds``
    problems (see `robocache.reference.kinematics.ik_reference`, its twin).

    Returns (q [P, DOF], position error [P], half chord [P])."""
    p, dof = q0.shape
    q = torch.empty_like(q0)
    perr = q0.new_empty(p)
    chord = q0.new_empty(p)
    if p:
        _ik_kernel[(cdiv(p, _IK_BLOCK),)](target, q0, lower, upper, params, qcol, q, perr, chord,
                                          p, seeds, max_iters, tol_pos, tol_half_chord,
                                          DOF=dof, DP=next_pow2(dof), NJ=qcol.shape[0],
                                          BLOCK=_IK_BLOCK, num_warps=_IK_WARPS)
    return q, perr, chord
