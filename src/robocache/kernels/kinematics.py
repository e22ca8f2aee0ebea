"""Triton kernels for serial-chain kinematics: FK, geometric Jacobian, and a fused LM IK solve.

The chain arrives as small tensors (see `robocache.reference.kinematics`): ``params [NJ, 16]``
(origin rows, axis) read with uniform scalar loads, and its structure — which path joints move and
which of those are prismatic — as two compile-time bit masks, so fixed joints cost one constant
transform product and no sin/cos, and each robot compiles once per dtype. One lane handles one
configuration and walks the chain, unrolled over the NJ joints, with the pose (12 values), the
joint values and the Jacobian columns held as register tuples: no cross-lane traffic in the walk;
the results leave through shared memory as coalesced tile stores (`_store_rows`).
(The first version kept q and the Jacobian as ``[BLOCK, pow2(DOF)]`` tiles and picked joint
values out with masked row sums: on an H100 its Jacobian took 48 us at N = 256, 2.6x its FK, and
IK 94 us per iteration; see docs/kinematics.md.)

The Jacobian needs the end position before any column is known. Instead of a second pass, each
column keeps ``a = z`` (angular part) and ``w = z x p`` (``-z`` for prismatic joints) while
walking; at the end ``linear = a x p_end - w``, which is ``z x (p_end - p)`` for revolute joints and
``z`` for prismatic ones.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from robocache._plancache import PlanCache
from robocache.kernels._utils import CachedLaunch, cdiv
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


@triton.constexpr_function
def _q_column(movable, j):
    """The q column of path joint j: how many joints before it move."""
    return bin(movable & ((1 << j) - 1)).count("1")


@triton.jit
def _store_tile(row_ptr, vals, mask):
    """Store a power-of-two number of lane vectors ``vals`` at ``row_ptr + 0 ..`` as one
    ``[BLOCK, len(vals)]`` tile (joining the two halves of the tuple at each level keeps the
    values in order)."""
    t = vals
    for _ in tl.static_range(len(vals).bit_length() - 1):
        half = ()
        for i in tl.static_range(len(t) // 2):
            half = half + (tl.join(t[i], t[i + len(t) // 2]),)
        t = half
    cols = tl.arange(0, len(vals))
    tl.store(row_ptr[:, None] + cols[None, :], tl.reshape(t[0], (row_ptr.shape[0], len(vals))),
             mask=mask[:, None])


@triton.jit
def _store_rows(row_ptr, vals, mask):
    """Store ``vals`` (a tuple of W lane vectors) at ``row_ptr + 0 .. W-1`` of each lane's row.

    The values go out as tile stores of the powers of two that sum to W (42 = 32 + 8 + 2): Triton
    moves each tile through shared memory so consecutive lanes write consecutive addresses. One
    store per value writes one word per lane at the row stride instead, a 32-sector warp request
    each. Measured on an H100 at N = 65536 (CUDA graph): Jacobian 54.3 -> 11.6 us, FK 16.3 ->
    6.7 us (the Jacobian from 3.3x to 1.7x its FK).
    """
    for bit in tl.static_range(len(vals).bit_length() - 1, -1, -1):
        if (len(vals) >> bit) & 1:
            chunk = ()
            for i in tl.static_range(1 << bit):  # the higher chunks come first
                chunk = chunk + (vals[((len(vals) >> (bit + 1)) << (bit + 1)) + i],)
            _store_tile(row_ptr + ((len(vals) >> (bit + 1)) << (bit + 1)), chunk, mask)


@triton.jit
def _store_pose(ptr, t00, t01, t02, t03, t10, t11, t12, t13, t20, t21, t22, t23, mask):
    zero = tl.zeros_like(t00)
    _store_rows(ptr, (t00, t01, t02, t03, t10, t11, t12, t13, t20, t21, t22, t23, zero, zero,
                      zero, zero + 1), mask)


@triton.jit
def _walk(q, zero, p_ptr, NJ: tl.constexpr, MOVABLE: tl.constexpr, PRISMATIC: tl.constexpr,
          JAC: tl.constexpr, links_ptr, mask, STORE_LINKS: tl.constexpr):
    """Pose of the end link (12 values, rows 0-2) for joint values ``q`` (a tuple of DOF lane
    vectors); with JAC also the Jacobian as a flat column-major tuple (6 values per joint); with
    STORE_LINKS every link pose is stored at ``links_ptr + 16 j``."""
    one = zero + 1
    t00, t01, t02, t03 = one, zero, zero, zero
    t10, t11, t12, t13 = zero, one, zero, zero
    t20, t21, t22, t23 = zero, zero, one, zero
    ang = ()
    lin = ()
    for j in tl.static_range(NJ):
        b = p_ptr + j * 16
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
        t00, t01, t02, t03 = f00, f01, f02, f03
        t10, t11, t12, t13 = f10, f11, f12, f13
        t20, t21, t22, t23 = f20, f21, f22, f23
        if (MOVABLE >> j) & 1:
            ax = tl.load(b + 12)
            ay = tl.load(b + 13)
            az = tl.load(b + 14)
            zx = f00 * ax + f01 * ay + f02 * az  # world axis
            zy = f10 * ax + f11 * ay + f12 * az
            zz = f20 * ax + f21 * ay + f22 * az
            qj = q[_q_column(MOVABLE, j)]
            if (PRISMATIC >> j) & 1:
                t03 = f03 + qj * zx
                t13 = f13 + qj * zy
                t23 = f23 + qj * zz
                if JAC:
                    ang = ang + (zero, zero, zero)
                    lin = lin + (-zx, -zy, -zz)
            else:
                c = tl.cos(qj)
                s = tl.sin(qj)
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
                t00 = f00 * r00 + f01 * r10 + f02 * r20
                t01 = f00 * r01 + f01 * r11 + f02 * r21
                t02 = f00 * r02 + f01 * r12 + f02 * r22
                t10 = f10 * r00 + f11 * r10 + f12 * r20
                t11 = f10 * r01 + f11 * r11 + f12 * r21
                t12 = f10 * r02 + f11 * r12 + f12 * r22
                t20 = f20 * r00 + f21 * r10 + f22 * r20
                t21 = f20 * r01 + f21 * r11 + f22 * r21
                t22 = f20 * r02 + f21 * r12 + f22 * r22
                if JAC:
                    ang = ang + (zx, zy, zz)
                    lin = lin + (zy * f23 - zz * f13, zz * f03 - zx * f23, zx * f13 - zy * f03)
        if STORE_LINKS:
            _store_pose(links_ptr + j * 16, t00, t01, t02, t03, t10, t11, t12, t13, t20, t21, t22,
                        t23, mask)
    jac = ()
    if JAC:
        for c in tl.static_range(len(ang) // 3):
            ax = ang[3 * c]
            ay = ang[3 * c + 1]
            az = ang[3 * c + 2]
            jac = jac + (ay * t23 - az * t13 - lin[3 * c], az * t03 - ax * t23 - lin[3 * c + 1],
                         ax * t13 - ay * t03 - lin[3 * c + 2], ax, ay, az)
    return t00, t01, t02, t03, t10, t11, t12, t13, t20, t21, t22, t23, jac


@triton.jit
def _load_q(q_ptr, rows, mask, DOF: tl.constexpr):
    q = ()
    for c in tl.static_range(DOF):
        q = q + (tl.load(q_ptr + rows * DOF + c, mask=mask, other=0.0),)
    return q


@triton.jit
def _fk_kernel(q_ptr, p_ptr, out_ptr, N, DOF: tl.constexpr, NJ: tl.constexpr,
               MOVABLE: tl.constexpr, PRISMATIC: tl.constexpr, ALL_LINKS: tl.constexpr,
               BLOCK: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = rows < N
    zero = tl.zeros([BLOCK], dtype=q_ptr.dtype.element_ty)
    q = _load_q(q_ptr, rows, mask, DOF)
    t00, t01, t02, t03, t10, t11, t12, t13, t20, t21, t22, t23, _ = _walk(
        q, zero, p_ptr, NJ, MOVABLE, PRISMATIC, False, out_ptr + rows * (NJ * 16), mask,
        ALL_LINKS)
    if not ALL_LINKS:
        _store_pose(out_ptr + rows * 16, t00, t01, t02, t03, t10, t11, t12, t13, t20, t21, t22,
                    t23, mask)


@triton.jit
def _jacobian_kernel(q_ptr, p_ptr, out_ptr, N, DOF: tl.constexpr, NJ: tl.constexpr,
                     MOVABLE: tl.constexpr, PRISMATIC: tl.constexpr, BLOCK: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = rows < N
    zero = tl.zeros([BLOCK], dtype=q_ptr.dtype.element_ty)
    q = _load_q(q_ptr, rows, mask, DOF)
    _, _, _, _, _, _, _, _, _, _, _, _, jac = _walk(q, zero, p_ptr, NJ, MOVABLE, PRISMATIC, True,
                                                    out_ptr, mask, False)
    rowmajor = ()  # [6, DOF] row-major from the column-major tuple
    for r in tl.static_range(6):
        for c in tl.static_range(DOF):
            rowmajor = rowmajor + (jac[6 * c + r],)
    _store_rows(out_ptr + rows * (6 * DOF), rowmajor, mask)


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
def _select(ok, a, b):
    out = ()
    for i in tl.static_range(len(a)):
        out = out + (tl.where(ok, a[i], b[i]),)
    return out


@triton.jit
def _ik_kernel(tgt_ptr, q0_ptr, lo_ptr, hi_ptr, p_ptr, q_out, perr_out, chord_out,
               P, SEEDS, max_iters, tol_pos, tol_chord, DOF: tl.constexpr, NJ: tl.constexpr,
               MOVABLE: tl.constexpr, PRISMATIC: tl.constexpr, BLOCK: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    rmask = rows < P
    zero = tl.zeros([BLOCK], dtype=q0_ptr.dtype.element_ty)
    q = _load_q(q0_ptr, rows, rmask, DOF)
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
    t00, t01, t02, t03, t10, t11, t12, t13, t20, t21, t22, t23, jac = _walk(
        q, zero, p_ptr, NJ, MOVABLE, PRISMATIC, True, p_ptr, rmask, False)
    e0, e1, e2, e3, e4, e5, cost, perr, chord = _pose_error(
        t00, t01, t02, t03, t10, t11, t12, t13, t20, t21, t22, t23,
        g00, g01, g02, g03, g10, g11, g12, g13, g20, g21, g22, g23)
    lam = zero + _LAMBDA0
    active = rmask & ((perr > tol_pos) | (chord > tol_chord))
    it = 0
    # The loop ends when every lane of the program has converged: no host sync, and a program of
    # easy targets stops early.
    while (it < max_iters) & (tl.max(active.to(tl.int32), axis=0) > 0):
        # A = J J^T + lam I (lower triangle), J column-major: jac[6 c + r]
        a00 = lam
        a10 = zero
        a11 = lam
        a20 = zero
        a21 = zero
        a22 = lam
        a30 = zero
        a31 = zero
        a32 = zero
        a33 = lam
        a40 = zero
        a41 = zero
        a42 = zero
        a43 = zero
        a44 = lam
        a50 = zero
        a51 = zero
        a52 = zero
        a53 = zero
        a54 = zero
        a55 = lam
        for c in tl.static_range(DOF):
            j0 = jac[6 * c]
            j1 = jac[6 * c + 1]
            j2 = jac[6 * c + 2]
            j3 = jac[6 * c + 3]
            j4 = jac[6 * c + 4]
            j5 = jac[6 * c + 5]
            a00 += j0 * j0
            a10 += j1 * j0
            a11 += j1 * j1
            a20 += j2 * j0
            a21 += j2 * j1
            a22 += j2 * j2
            a30 += j3 * j0
            a31 += j3 * j1
            a32 += j3 * j2
            a33 += j3 * j3
            a40 += j4 * j0
            a41 += j4 * j1
            a42 += j4 * j2
            a43 += j4 * j3
            a44 += j4 * j4
            a50 += j5 * j0
            a51 += j5 * j1
            a52 += j5 * j2
            a53 += j5 * j3
            a54 += j5 * j4
            a55 += j5 * j5
        y0, y1, y2, y3, y4, y5 = _solve6(a00, a10, a11, a20, a21, a22, a30, a31, a32, a33,
                                         a40, a41, a42, a43, a44, a50, a51, a52, a53, a54, a55,
                                         e0, e1, e2, e3, e4, e5)
        qn = ()
        for c in tl.static_range(DOF):
            dq = (jac[6 * c] * y0 + jac[6 * c + 1] * y1 + jac[6 * c + 2] * y2
                  + jac[6 * c + 3] * y3 + jac[6 * c + 4] * y4 + jac[6 * c + 5] * y5)
            qn = qn + (tl.minimum(tl.maximum(q[c] + dq, tl.load(lo_ptr + c)),
                                  tl.load(hi_ptr + c)),)
        n00, n01, n02, n03, n10, n11, n12, n13, n20, n21, n22, n23, jac_n = _walk(
            qn, zero, p_ptr, NJ, MOVABLE, PRISMATIC, True, p_ptr, rmask, False)
        f0, f1, f2, f3, f4, f5, cost_n, perr_n, chord_n = _pose_error(
            n00, n01, n02, n03, n10, n11, n12, n13, n20, n21, n22, n23,
            g00, g01, g02, g03, g10, g11, g12, g13, g20, g21, g22, g23)
        ok = active & (cost_n < cost)
        q = _select(ok, qn, q)
        jac = _select(ok, jac_n, jac)
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
    for c in tl.static_range(DOF):
        tl.store(q_out + rows * DOF + c, q[c], mask=rmask)
    tl.store(perr_out + rows, perr, mask=rmask)
    tl.store(chord_out + rows, chord, mask=rmask)


# Configurations per program: 32 lanes in one warp. With the tile stores, on an H100 (CUDA graph,
# N = 256 / 65536): FK 2.8 / 6.7 us and Jacobian 3.8 / 11.6 us, against 2.9 / 6.9 and 4.3 /
# 11.7 us for 128 lanes in 4 warps and 5.7 / 7.2 and 6.6 / 12.5 us for 64 lanes in one warp (more,
# smaller programs spread a small batch over more SMs). IK: one warp of 32 problems, the same
# reasoning (256 targets x 32 seeds = 256 programs).
_BLOCK = 32
_WARPS = 1


# Eager calls relaunch through a CachedLaunch per (kernel, N, q dtype/device, chain structure),
# skipping Triton's argument binding: 11.8 us of host time per FK launch against 14.3 us for
# kernel[grid](...) on the H100 machine's host (a 10-argument kernel leaves little to skip).
_LAUNCHES = PlanCache()


def _launch(kernel, q: torch.Tensor, params: torch.Tensor, out: torch.Tensor, *constexprs):
    """Launch ``kernel(q, params, out, N, DOF, NJ, *constexprs, BLOCK)`` over q's rows."""
    n, dof = q.shape
    key = (id(kernel), n, dof, params.shape[0], q.dtype, q.device, *constexprs)
    launch = _LAUNCHES.get(key)
    if launch is None:
        launch = _LAUNCHES.put(key, CachedLaunch(kernel, (cdiv(n, _BLOCK),), (*constexprs, _BLOCK),
                                                 num_warps=_WARPS))
    launch((q, params, out, n, dof, params.shape[0]), (q, params, out))


def fk_cuda(q: torch.Tensor, params: torch.Tensor, movable: int, prismatic: int,
            all_links: bool = False) -> torch.Tensor:
    """End pose ``[N, 4, 4]`` (or every path link ``[N, NJ, 4, 4]``) for contiguous ``q [N, DOF]``;
    ``params`` in q's dtype, on q's device; ``movable`` / ``prismatic``: bit j set when path joint
    j moves / is prismatic (`robocache.reference.kinematics`)."""
    n = q.shape[0]
    out = q.new_empty((n, params.shape[0], 4, 4) if all_links else (n, 4, 4))
    if n:
        _launch(_fk_kernel, q, params, out, movable, prismatic, all_links)
    return out


def jacobian_cuda(q: torch.Tensor, params: torch.Tensor, movable: int,
                  prismatic: int) -> torch.Tensor:
    """Geometric Jacobian ``[N, 6, DOF]`` (linear rows first, base frame) for ``q [N, DOF]``."""
    out = q.new_empty((q.shape[0], 6, q.shape[1]))
    if q.shape[0]:
        _launch(_jacobian_kernel, q, params, out, movable, prismatic)
    return out


def ik_cuda(target: torch.Tensor, q0: torch.Tensor, lower: torch.Tensor, upper: torch.Tensor,
            params: torch.Tensor, movable: int, prismatic: int, seeds: int, max_iters: int,
            tol_pos: float, tol_half_chord: float):
    """Fused Levenberg-Marquardt IK, one launch for all iterations and all ``P = T * seeds``
    problems (see `robocache.reference.kinematics.ik_reference`, its twin).

    Returns (q [P, DOF], position error [P], half chord [P])."""
    p, dof = q0.shape
    q = torch.empty_like(q0)
    perr = q0.new_empty(p)
    chord = q0.new_empty(p)
    if p:
        _ik_kernel[(cdiv(p, _BLOCK),)](target, q0, lower, upper, params, q, perr, chord, p, seeds,
                                       max_iters, tol_pos, tol_half_chord, DOF=dof,
                                       NJ=params.shape[0], MOVABLE=movable, PRISMATIC=prismatic,
                                       BLOCK=_BLOCK, num_warps=_WARPS)
    return q, perr, chord
