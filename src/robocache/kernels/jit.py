"""Triton device functions shared by several kernels (and the launch arithmetic that goes with
them): the row tile of the elementwise kernels (`kernels.normalize`, `kernels.augment`), the
sorted-row search and linear weights of the interpolation kernel (`kernels.interp`, reused by
`kernels.pipeline`), and the counter-based Philox parameters, rotations and normals of
augmentation (`kernels.augment`, reused by `kernels.pipeline`).
"""

from __future__ import annotations

import triton
import triton.language as tl

from robocache.reference import augment as _ref

# ---------------------------------------------------------------- tiles

@triton.jit
def row_tile(n_rows, D, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr):
    """This program's [BLOCK_R, BLOCK_D] tile of a contiguous [n_rows, D] array (grid axis 0
    over rows, axis 1 over columns): (rows, cols, column mask, tile mask, flat offsets)."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    cmask = cols < D
    mask = (rows < n_rows)[:, None] & cmask[None, :]
    return rows, cols, cmask, mask, rows[:, None] * D + cols[None, :]


# ---------------------------------------------------------------- sorted-row search


@triton.jit
def to_compute(v, F64: tl.constexpr):
    if F64:
        return v.to(tl.float64)
    else:
        return v.to(tl.float32)


@triton.jit
def minmax(a0, a1, b0, b1):
    return tl.minimum(a0, b0), tl.maximum(a1, b1)


@triton.jit
def count_pair(tlo, thi, xlo, xhi):
    """(#{tlo <= xlo}, #{thi <= xhi}) in one block reduction: both counts (<= FAN < 2^15)
    packed into one int32, halving the reductions' barriers."""
    both = tl.sum((tlo.to(xlo.dtype) <= xlo).to(tl.int32)
                  + ((thi.to(xhi.dtype) <= xhi).to(tl.int32) << 16), axis=0)
    return both & 0xFFFF, both >> 16


@triton.jit
def first_probes(row, sts, n, stride0, FAN: tl.constexpr):
    """The first search level's FAN samples (every stride0-th): their addresses do not depend
    on the targets, so this load is issued together with the targets' load."""
    p = (tl.arange(0, FAN) + 1) * stride0 - 1
    return tl.load(row + p.to(tl.int64) * sts, mask=p < n, other=float("inf"),
                   eviction_policy="evict_last")


@triton.jit
def count_le2(row, sts, n, first, xlo, xhi, n_levels, stride0, FAN: tl.constexpr):
    """(#{j < n : row[j] <= xlo}, same for xhi) for scalars over a sorted row: a FAN-ary
    search. `first` holds the first level's probes (`first_probes`), shared by both; later
    levels load both probe vectors together so they are in flight at once."""
    probes = tl.arange(0, FAN) + 1
    s = stride0
    clo, chi = count_pair(first, first, xlo, xhi)
    lo = clo * s
    hi = chi * s
    for _ in range(1, n_levels):
        s = s // FAN
        plo = lo + probes * s - 1
        phi = hi + probes * s - 1
        tlo = tl.load(row + plo.to(tl.int64) * sts, mask=plo < n, other=float("inf"))
        thi = tl.load(row + phi.to(tl.int64) * sts, mask=phi < n, other=float("inf"))
        clo, chi = count_pair(tlo, thi, xlo, xhi)
        lo += clo * s
        hi += chi * s
    return lo, hi


@triton.jit
def locate(row, sts, n, x, valid, xlo, xhi, n_levels, stride0, ENDS: tl.constexpr,
            BLOCK_T: tl.constexpr, FAN: tl.constexpr):
    """cnt[t] = #{j < n : row[j] <= x[t]} for a block of targets (row sorted, n >= 1).

    The block's search window comes from bounds on its targets. ENDS: the scalars xlo / xhi
    (the block's first and last target, loaded up front); if any valid target lies outside
    them (unsorted targets), the window is the whole row. Otherwise: a min/max reduction,
    which costs more instructions (float64: twice the shuffles) but fewer live registers.
    """
    first = first_probes(row, sts, n, stride0, FAN)
    if ENDS:
        cmin, cmax = count_le2(row, sts, n, first, xlo, xhi, n_levels, stride0, FAN)
        stray = tl.sum((valid & (x == x) & ~((x >= xlo) & (x <= xhi))).to(tl.int32), axis=0)
        cmin = tl.where(stray > 0, 0, cmin)
        cmax = tl.where(stray > 0, n, cmax)
    else:
        ok = valid & (x == x)
        xmin, xmax = tl.reduce((tl.where(ok, x, float("inf")), tl.where(ok, x, float("-inf"))),
                               0, minmax)
        cmin, cmax = count_le2(row, sts, n, first, xmin, xmax, n_levels, stride0, FAN)
    base = tl.maximum(tl.minimum(cmin, cmax) - 1, 0)
    width = cmax - base
    cnt = tl.zeros([BLOCK_T], dtype=tl.int32) + base
    # Branch-free halving: each count lies in [cnt, cnt + size - 1]. A step probes sample
    # cnt + half - 1 (always inside the row, so unmasked) and keeps the half holding the
    # count; `size` is the same for the whole block, so the loop control is scalar.
    size = width + 1
    before = row - sts  # before[probe] is row[probe - 1]
    while size > 1:
        half = size // 2
        probe = cnt + half
        tm = tl.load(before + probe.to(tl.int64) * sts,
                     eviction_policy="evict_last").to(x.dtype)
        cnt = tl.where(tm <= x, probe, cnt)
        size -= half
    return cnt


@triton.jit
def segments(row, sts, n, x, valid, xlo, xhi, n_levels, stride0, ENDS: tl.constexpr,
              BLOCK_T: tl.constexpr, FAN: tl.constexpr):
    """Bracketing samples of each target: (i, seg, seg1, t0, t1, outside).

    i = last sample at or before x (-1 before the first); seg/seg1 = the interpolation
    segment clamped into the row; t0/t1 their times (x's dtype); outside = x < t[0],
    x > t[n-1] or NaN.
    """
    cnt = locate(row, sts, n, x, valid, xlo, xhi, n_levels, stride0, ENDS, BLOCK_T, FAN)
    i = cnt - 1
    seg = tl.minimum(tl.maximum(i, 0), tl.maximum(n - 2, 0))
    seg1 = tl.minimum(seg + 1, n - 1)
    t0 = tl.load(row + seg.to(tl.int64) * sts, mask=valid, other=0.0,
                 eviction_policy="evict_last").to(x.dtype)
    t1 = tl.load(row + seg1.to(tl.int64) * sts, mask=valid, other=0.0,
                 eviction_policy="evict_last").to(x.dtype)
    t_last = tl.load(row + (n - 1).to(tl.int64) * sts).to(x.dtype)
    outside = (cnt == 0) | (x > t_last) | (x != x)
    return i, seg, seg1, t0, t1, outside


@triton.jit
def linear_weight(x, t0, t1, OOR: tl.constexpr, F64: tl.constexpr):
    """w = (x - t0) / (t1 - t0) in the compute dtype (0 on an empty interval)."""
    h = to_compute(t1 - t0, F64)
    w = tl.where(h > 0, to_compute(x - t0, F64) / tl.where(h > 0, h, 1.0), 0.0)
    if OOR == 0:  # comparisons, not min/max: a NaN weight (NaN target) must stay NaN
        w = tl.where(w < 0.0, 0.0, tl.where(w > 1.0, 1.0, w))
    return w


def search_levels(size: int, fan: int) -> tuple[int, int]:
    """(levels, first stride) of a fan-ary search over `size` samples."""
    levels, span = 1, fan
    while span < size:
        levels, span = levels + 1, span * fan
    return levels, span // fan


# ---------------------------------------------------------------- augmentation parameters

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
def slot(u, slots, j: tl.constexpr):
    """Scalar slot j of a vector of per-variant uniforms."""
    return tl.sum(tl.where(slots == j, u, 0.0), axis=0)


@triton.jit
def variant_uniforms(seed, variant):
    """The first 16 parameter uniforms of `variant` (int64): rigid, warp and crop slots."""
    slots = tl.arange(0, 16)
    # tensor-first sums: the interpreter cannot add a tensor to a module-level constexpr
    return tl.rand(seed, slots.to(tl.int64) + variant * PARAM_STRIDE + PARAM_BASE), slots


@triton.jit
def sincos_turns(u):
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
def rigid(u, slots, max_t, max_r):
    """(qw, qx, qy, qz, tx, ty, tz) of a variant: see reference.augment.rigid_from_uniforms."""
    z = 2.0 * slot(u, slots, SLOT_AXIS) - 1.0
    ca, sa = sincos_turns(slot(u, slots, SLOT_AXIS + 1))
    r = tl.sqrt(tl.maximum(1.0 - z * z, 0.0))
    ch, sh = sincos_turns(max_r * slot(u, slots, SLOT_ANGLE) * 0.07957747154594767)  # 1/4pi
    tx = (2.0 * slot(u, slots, SLOT_TRANS) - 1.0) * max_t
    ty = (2.0 * slot(u, slots, SLOT_TRANS + 1) - 1.0) * max_t
    tz = (2.0 * slot(u, slots, SLOT_TRANS + 2) - 1.0) * max_t
    return ch, sh * r * ca, sh * r * sa, sh * z, tx, ty, tz


@triton.jit
def warp(t, u, slots, amp, max_crop, TERMS: tl.constexpr, CROP: tl.constexpr):
    """phi(t) for normalized times t [BLOCK]: see reference.augment.warp_phase."""
    phi = t
    for m in tl.static_range(TERMS):
        a = (2.0 * slot(u, slots, SLOT_WARP + m) - 1.0) * amp
        _, sin = sincos_turns(t * (0.5 * (m + 1)))
        phi += a * sin * (1.0 / (3.141592653589793 * (m + 1)))
    if CROP:
        c0 = slot(u, slots, SLOT_CROP) * max_crop
        c1 = slot(u, slots, SLOT_CROP + 1) * max_crop
        phi = c0 + (1.0 - c0 - c1) * phi
    return phi


@triton.jit
def dropped(seed, variant, p, NS: tl.constexpr):
    """Bool [NS] (NS a power of two, padded): is stream s of `variant` dropped."""
    s = tl.arange(0, NS)
    u = tl.rand(seed, s.to(tl.int64) + variant * PARAM_STRIDE + (PARAM_BASE + SLOT_DROP))
    return u < p


@triton.jit
def quat_rotate(qw, qx, qy, qz, vx, vy, vz):
    """Rotate v by the unit quaternion q: v + w t + u x t with t = 2 u x v."""
    tx = 2.0 * (qy * vz - qz * vy)
    ty = 2.0 * (qz * vx - qx * vz)
    tz = 2.0 * (qx * vy - qy * vx)
    return (vx + qw * tx + (qy * tz - qz * ty), vy + qw * ty + (qz * tx - qx * tz),
            vz + qw * tz + (qx * ty - qy * tx))


@triton.jit
def quat_mul(aw, ax, ay, az, bw, bx, by, bz):
    """Hamilton product a * b (wxyz)."""
    return (aw * bw - ax * bx - ay * by - az * bz, aw * bx + ax * bw + ay * bz - az * by,
            aw * by - ax * bz + ay * bw + az * bx, aw * bz + ax * by - ay * bx + az * bw)


@triton.jit
def box_muller(w0, w1):
    """Two standard normals from two Philox words: see reference.augment.box_muller."""
    u0 = tl.maximum(tl.uint_to_uniform_float(w0), 1.0e-7)
    r = tl.sqrt(-2.0 * tl.log(u0))
    c, s = sincos_turns(tl.uint_to_uniform_float(w1))
    return r * c, r * s


@triton.jit
def normals(seed, rows, d0, D, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr):
    """Standard normals [BLOCK_R, BLOCK_D] at rows (int64 [BLOCK_R]) and columns
    d0 .. d0 + BLOCK_D (d0, BLOCK_D multiples of 4) of an [N, D] array: one Philox call per
    4 columns (see reference.augment.normals). One call per element (`tl.randn`) made noise
    ~45% of the fused kernel's instructions."""
    quads = d0 // 4 + tl.arange(0, BLOCK_D // 4)
    w0, w1, w2, w3 = tl.randint4x(seed, rows[:, None] * ((D + 3) // 4) + quads[None, :])
    n0, n1 = box_muller(w0, w1)
    n2, n3 = box_muller(w2, w3)
    return tl.reshape(tl.join(tl.join(n0, n2), tl.join(n1, n3)), [BLOCK_R, BLOCK_D])
