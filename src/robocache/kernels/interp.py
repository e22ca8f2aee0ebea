"""Grouped interpolation kernel: every stream of an `align` call (and the single stream of a
`resample` call) in ONE launch. Semantics: `robocache.reference.interp`.

Design (per program: one stream, one row, a block of BLOCK_T targets, all D columns):

1. Locate. A binary search per target is a chain of log2(S) dependent loads (~7-10 global
   round trips) — it is what made the first, untuned kernel launch- and latency-bound.
   Instead each program first finds where its *block* of targets falls: a
   FAN-ary search (FAN probes loaded as one vector per level; the first level is loaded
   together with the targets, S <= FAN takes that one round trip) for the block's bounds —
   its first and last target for linear streams, its min and max otherwise. Inside that
   window, a branch-free per-target binary search. docs/design.md has the measurements
   behind each choice.
2. Interpolate. Time differences are taken in the timestamp dtype (float64 epoch seconds stay
   exact), then converted to the arithmetic dtype: float32, or float64 for float64 data.
3. Gather rows [BLOCK_T, BLOCK_D] (contiguous along D, so loads are wide) and store.

Per-stream settings (method, out-of-range mode, dtypes, tile) are constexpr tuples, so the
grouped kernel is specialized per stream signature and cached by Triton.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from robocache.kernels._utils import CachedLaunch, cdiv, tile_2d
from robocache.kernels.jit import (
    linear_weight,
    search_levels,
    segments,
    to_compute,
)

# Method and out-of-range codes (constexpr values).
LINEAR, NEAREST, PREVIOUS, FRAME_INDEX, PCHIP, CUBIC, SLERP = 0, 1, 2, 3, 4, 5, 6
METHOD_CODES = {"linear": LINEAR, "nearest": NEAREST, "previous": PREVIOUS,
                "frame_index": FRAME_INDEX, "pchip": PCHIP, "cubic": CUBIC, "slerp": SLERP}
CLAMP, NAN, EXTRAPOLATE = 0, 1, 2
OOR_CODES = {"clamp": CLAMP, "nan": NAN, "extrapolate": EXTRAPOLATE}



@dataclass(frozen=True)
class Tuning:
    """Launch parameters; `benchmarks/tune_interp.py` sweeps them on the GPU.

    Defaults: best geometric mean over the resample benchmark's three bf16 shapes in a
    24-point sweep (2026-11-22, on an H200: benchmarks/results/tune_interp-h200-*.json).
    A 1024-wide first level finds a block's window in one round trip for S <= 1024; inside
    the window a per-target binary search beat counting it in chunks of 32 samples (e.g. 124
    vs 140 us at 4096x500->250x64), so the count was removed.
    """

    fan: int = 1024        # probes per level of the block-extreme search
    elements: int = 4096   # values per [BLOCK_T, BLOCK_D] tile of 2-byte data
    pchip_cols: int = 8    # PCHIP tiles: narrow columns, see _tile_limits
    pchip_elements: int = 512
    num_warps: int = 4


TUNING = Tuning()


@triton.jit
def _sign(v):
    return tl.where(v > 0, 1.0, tl.where(v < 0, -1.0, 0.0))


@triton.jit
def _pchip_interior(hm, hp, mm, mp):
    """PCHIP slope between secants mm (interval hm) and mp (hp): weighted harmonic mean, 0
    where they differ in sign or one is flat (as scipy.interpolate.PchipInterpolator)."""
    w1 = 2.0 * hp + hm
    w2 = hp + 2.0 * hm
    flat = (_sign(mm) != _sign(mp)) | (mm == 0.0) | (mp == 0.0)
    den = w1 / tl.where(flat, 1.0, mm) + w2 / tl.where(flat, 1.0, mp)
    return tl.where(flat, 0.0, (w1 + w2) / den)


@triton.jit
def _pchip_edge(h0, h1, m0, m1):
    """PCHIP end slope from the two secants nearest the end (SciPy's three-point formula)."""
    d = ((2.0 * h0 + h1) * m0 - h0 * m1) / (h0 + h1)
    d = tl.where(_sign(d) != _sign(m0), 0.0, d)
    over = (_sign(m0) != _sign(m1)) & (tl.abs(d) > 3.0 * tl.abs(m0))
    return tl.where(over, 3.0 * m0, d)


@triton.jit
def _atan2_pos(a, b):
    """atan2(a, b) for a, b >= 0 (not both 0): a Cephes-style polynomial on [0, 1] after
    range reduction, then one Newton step (error ~1e-14; libdevice has no interpreter)."""
    r = tl.minimum(a, b) / tl.maximum(a, b)
    big = r > 0.41421356237309503
    rr = tl.where(big, (r - 1.0) / (r + 1.0), r)
    z = rr * rr
    th = ((((8.05374449538e-2 * z - 1.38776856032e-1) * z + 1.99777106478e-1) * z
           - 3.33329491539e-1) * z * rr + rr)
    th = tl.where(big, th + 0.7853981633974483, th)
    th = tl.where(a > b, 1.5707963267948966 - th, th)
    c = tl.cos(th)
    s = tl.sin(th)
    return th + (a * c - b * s) / (a * s + b * c)


@triton.jit
def _slerp(q0, q1, w):
    """Shortest-arc slerp of wxyz quaternion tiles [BLOCK_T, 4] at weights w [BLOCK_T]."""
    q0 = q0 / tl.sqrt(tl.sum(q0 * q0, axis=1))[:, None]
    q1 = q1 / tl.sqrt(tl.sum(q1 * q1, axis=1))[:, None]
    q1 = tl.where((tl.sum(q0 * q1, axis=1) < 0.0)[:, None], -q1, q1)
    dm = q1 - q0
    dp = q1 + q0
    omega = 2.0 * _atan2_pos(tl.sqrt(tl.sum(dm * dm, axis=1)), tl.sqrt(tl.sum(dp * dp, axis=1)))
    so = tl.sin(omega)
    small = so < 1e-6
    safe = tl.where(small, 1.0, so)
    a = tl.where(small, 1.0 - w, tl.sin((1.0 - w) * omega) / safe)
    b = tl.where(small, w, tl.sin(w * omega) / safe)
    q = a[:, None] * q0 + b[:, None] * q1
    return q / tl.sqrt(tl.sum(q * q, axis=1))[:, None]


@triton.jit
def _cubic_sweep(data_row, row, scr, n, D, sds, sdd, sts,
                 CT_F64: tl.constexpr, BLOCK_D: tl.constexpr):
    """Second derivatives M of the natural cubic spline of one row into scr [S, 2D + 1]:
    columns [0, D) the eliminated right-hand sides r', column D the Thomas factors c',
    columns [D + 1, 2D + 1) M. M never overwrites r' in place: the [BLOCK_D] vectors are
    replicated across warps, and an in-place update let one warp read another's result."""
    W = 2 * D + 1
    for d0 in range(0, D, BLOCK_D):
        offs_d = d0 + tl.arange(0, BLOCK_D)
        dm = offs_d < D
        col = offs_d * sdd
        t_prev = tl.load(row)
        t_cur = tl.load(row + tl.minimum(1, n - 1).to(tl.int64) * sts)
        y_prev = to_compute(tl.load(data_row + col, mask=dm, other=0.0), CT_F64)
        y_cur = to_compute(tl.load(data_row + tl.minimum(1, n - 1) * sds + col, mask=dm,
                                    other=0.0), CT_F64)
        cp = to_compute(t_prev - t_prev, CT_F64)
        rp = y_prev * 0.0
        for i in range(1, n - 1):
            t_next = tl.load(row + (i + 1) * sts)
            y_next = to_compute(tl.load(data_row + (i + 1) * sds + col, mask=dm, other=0.0),
                                 CT_F64)
            a = to_compute(t_cur - t_prev, CT_F64)
            c = to_compute(t_next - t_cur, CT_F64)
            a = tl.where(a > 0, a, 1.0)
            c = tl.where(c > 0, c, 1.0)
            den = 2.0 * (a + c) - a * cp
            cp = c / den
            rp = (6.0 * ((y_next - y_cur) / c - (y_cur - y_prev) / a) - a * rp) / den
            tl.store(scr + i * W + offs_d, rp, mask=dm)
            tl.store(scr + i * W + D, cp)
            t_prev = t_cur
            t_cur = t_next
            y_prev = y_cur
            y_cur = y_next
        tl.debug_barrier()
        m_next = rp * 0.0
        tl.store(scr + D + 1 + offs_d, m_next, mask=dm)
        tl.store(scr + (n - 1) * W + D + 1 + offs_d, m_next, mask=dm)
        for j in range(0, n - 2):
            i = n - 2 - j
            m_next = (tl.load(scr + i * W + offs_d, mask=dm, other=0.0)
                      - tl.load(scr + i * W + D) * m_next)
            tl.store(scr + i * W + D + 1 + offs_d, m_next, mask=dm)
    tl.debug_barrier()


@triton.jit
def _target_block(tb, b, tgt, T, sxb, sxt, data_row, row, n, out, pad, aux, scr,
                  D, tol, sds, sdd, sts, sob, sot, sod, n_levels, stride0,
                  METHOD: tl.constexpr, OOR: tl.constexpr, HAS_PAD: tl.constexpr,
                  HAS_TOL: tl.constexpr, TIME_F64: tl.constexpr, CT_F64: tl.constexpr,
                  BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr, D_TILES: tl.constexpr,
                  FAN: tl.constexpr):
    """One block of BLOCK_T targets of row b of one stream: locate, interpolate, store."""
    offs_t = tb * BLOCK_T + tl.arange(0, BLOCK_T)
    valid = offs_t < T
    # Linear streams bound the search by the block's end targets (`locate`); measured on
    # the grouped align kernel, the other methods' paths need the registers more.
    ENDS: tl.constexpr = METHOD == 0
    xlo = to_compute(tl.load(tgt + b * sxb + (tb * BLOCK_T) * sxt), TIME_F64)
    xhi = to_compute(tl.load(tgt + b * sxb + (tl.minimum(tb * BLOCK_T + BLOCK_T, T) - 1) * sxt),
                      TIME_F64)
    x = to_compute(tl.load(tgt + b * sxb + offs_t * sxt, mask=valid, other=float("nan"),
                            eviction_policy="evict_first"), TIME_F64)
    i, seg, seg1, t0, t1, outside = segments(row, sts, n, x, valid, xlo, xhi, n_levels, stride0,
                                              ENDS, BLOCK_T, FAN)
    nanx = x != x
    flat = b * T + offs_t

    if METHOD == 2:  # previous
        idx0 = tl.minimum(tl.maximum(i, 0), n - 1)
        t_idx = tl.load(row + idx0.to(tl.int64) * sts, mask=valid, other=0.0).to(x.dtype)
        tl.store(aux + flat, (x - t_idx).to(tl.float32), mask=valid)
    elif (METHOD == 1) | (METHOD == 3):  # nearest / frame_index: ties to the earlier sample
        idx0 = tl.where((t1 - x) < (x - t0), seg1, seg)
    else:  # linear, pchip, cubic, slerp: interpolate on [seg, seg1]
        w = linear_weight(x, t0, t1, OOR, CT_F64)
        idx0 = seg
        idx1 = seg1
    if METHOD == 4:  # pchip needs the neighbours seg-1 and seg+2 (clamped)
        ip = tl.maximum(seg - 1, 0)
        i3 = tl.minimum(seg + 2, n - 1)
        tp = tl.load(row + ip.to(tl.int64) * sts, mask=valid, other=0.0).to(x.dtype)
        t3 = tl.load(row + i3.to(tl.int64) * sts, mask=valid, other=0.0).to(x.dtype)
        h0 = to_compute(t0 - tp, CT_F64)
        h1 = to_compute(t1 - t0, CT_F64)
        h2 = to_compute(t3 - t1, CT_F64)
        at_start = seg == 0
        at_end = seg1 == n - 1
        two = n == 2
    if METHOD == 5:
        h1 = to_compute(t1 - t0, CT_F64)

    if METHOD == 3:  # frame_index: the index and its offset, no data
        t_idx = tl.where(idx0 == seg1, t1, t0)
        off = (t_idx - x).to(tl.float32)
        if HAS_TOL:
            outside = nanx | (tl.abs(off) > tol) | (off != off)
        tl.store(out + flat, idx0.to(tl.int64), mask=valid)
        tl.store(aux + flat, off, mask=valid)
    else:
        out_row = out + b * sob
        for d0 in range(0, D_TILES * BLOCK_D, BLOCK_D):  # constant trip count: one tile, no loop
            offs_d = d0 + tl.arange(0, BLOCK_D)
            m2 = valid[:, None] & (offs_d < D)[None, :]
            col = offs_d[None, :] * sdd
            y = to_compute(tl.load(data_row + idx0[:, None] * sds + col, mask=m2, other=0.0),
                            CT_F64)
            if (METHOD == 0) | (METHOD == 4) | (METHOD == 5) | (METHOD == 6):
                y1 = to_compute(tl.load(data_row + idx1[:, None] * sds + col, mask=m2,
                                         other=0.0), CT_F64)
            if METHOD == 0:
                ww = w[:, None]  # exact at both ends (w = 0 or 1), one conversion of w
                y = tl.fma(ww, y1, tl.fma(-ww, y, y))
            elif METHOD == 6:
                y = _slerp(y, y1, w)
            elif METHOD == 4:
                yp = to_compute(tl.load(data_row + ip[:, None] * sds + col, mask=m2,
                                         other=0.0), CT_F64)
                y3 = to_compute(tl.load(data_row + i3[:, None] * sds + col, mask=m2,
                                         other=0.0), CT_F64)
                m0 = (y - yp) / tl.where(h0 > 0, h0, 1.0)[:, None]
                m1 = (y1 - y) / tl.where(h1 > 0, h1, 1.0)[:, None]
                m3 = (y3 - y1) / tl.where(h2 > 0, h2, 1.0)[:, None]
                hh0 = h0[:, None]
                hh1 = h1[:, None]
                hh2 = h2[:, None]
                d1 = tl.where(at_start[:, None], _pchip_edge(hh1, hh2, m1, m3),
                              _pchip_interior(hh0, hh1, m0, m1))
                d2 = tl.where(at_end[:, None], _pchip_edge(hh1, hh0, m1, m0),
                              _pchip_interior(hh1, hh2, m1, m3))
                d1 = tl.where(two, m1, d1)
                d2 = tl.where(two, m1, d2)
                s = w[:, None]
                s2 = s * s
                s3 = s2 * s
                y = ((2.0 * s3 - 3.0 * s2 + 1.0) * y + (s3 - 2.0 * s2 + s) * hh1 * d1
                     + (3.0 * s2 - 2.0 * s3) * y1 + (s3 - s2) * hh1 * d2)
            elif METHOD == 5:
                c = D + 1 + offs_d[None, :]
                mm0 = tl.load(scr + idx0[:, None] * (2 * D + 1) + c, mask=m2, other=0.0)
                mm1 = tl.load(scr + idx1[:, None] * (2 * D + 1) + c, mask=m2, other=0.0)
                s = w[:, None]
                r = 1.0 - s
                hh = h1[:, None]
                y = r * y + s * y1 + hh * hh / 6.0 * ((r * r * r - r) * mm0 + (s * s * s - s) * mm1)
            if OOR == 1:
                y = tl.where(outside[:, None], float("nan"), y)
            elif METHOD != 0:  # linear: the NaN weight of a NaN target already propagated
                y = tl.where(nanx[:, None], float("nan"), y)
            tl.store(out_row + offs_t[:, None] * sot + offs_d[None, :] * sod,
                     y.to(out.dtype.element_ty), mask=m2)
    if HAS_PAD:
        tl.store(pad + flat, outside, mask=valid)


@triton.jit
def _stream_tile(pid, tgt, T, sxb, sxt, data, times, lens, out, pad, aux, scr,
                 S, D, tol, sdb, sds, sdd, stb, sts, sob, sot, sod, n_levels, stride0, ntb,
                 METHOD: tl.constexpr, OOR: tl.constexpr, HAS_LEN: tl.constexpr,
                 HAS_PAD: tl.constexpr, HAS_TOL: tl.constexpr, TIME_F64: tl.constexpr,
                 CT_F64: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr,
                 D_TILES: tl.constexpr, FAN: tl.constexpr):
    """Program `pid` of one stream: a block of targets of one row (cubic: a whole row)."""
    b = (pid // ntb).to(tl.int64)
    if HAS_LEN:
        n = tl.load(lens + b).to(tl.int32)
    else:
        n = S + 0
    row = times + b * stb
    data_row = data + b * sdb
    if METHOD == 5:  # cubic: the spline's system couples the whole row
        scr_row = scr + b * S * (2 * D + 1)
        _cubic_sweep(data_row, row, scr_row, n, D, sds, sdd, sts, CT_F64, BLOCK_D)
        for tb in range(0, tl.cdiv(T, BLOCK_T)):
            _target_block(tb, b, tgt, T, sxb, sxt, data_row, row, n, out, pad, aux, scr_row,
                          D, tol, sds, sdd, sts, sob, sot, sod, n_levels, stride0,
                          METHOD, OOR, HAS_PAD, HAS_TOL, TIME_F64, CT_F64, BLOCK_T, BLOCK_D,
                          D_TILES, FAN)
    else:
        _target_block(pid % ntb, b, tgt, T, sxb, sxt, data_row, row, n, out, pad, aux, scr,
                      D, tol, sds, sdd, sts, sob, sot, sod, n_levels, stride0,
                      METHOD, OOR, HAS_PAD, HAS_TOL, TIME_F64, CT_F64, BLOCK_T, BLOCK_D,
                      D_TILES, FAN)


@triton.jit(do_not_specialize=["T", "starts", "S", "D", "tols", "n_levels", "stride0", "ntbs",
                               "pad_offs", "aux_offs"])
def _interp_kernel(tgt, T, sxb, sxt, starts,
                   datas, times, lens, outs, pads, auxs, scrs, S, D, tols,
                   sdb, sds, sdd, stb, sts, sob, sot, sod, n_levels, stride0, ntbs,
                   pad_offs, aux_offs,
                   NUM: tl.constexpr, METHOD: tl.constexpr, OOR: tl.constexpr,
                   HAS_LEN: tl.constexpr, HAS_PAD: tl.constexpr, HAS_TOL: tl.constexpr,
                   TIME_F64: tl.constexpr, CT_F64: tl.constexpr, BLOCK_T: tl.constexpr,
                   BLOCK_D: tl.constexpr, D_TILES: tl.constexpr, FAN: tl.constexpr):
    pid = tl.program_id(0)
    for k in tl.static_range(NUM):
        if (pid >= starts[k]) & (pid < starts[k + 1]):
            _stream_tile(pid - starts[k], tgt, T, sxb, sxt, datas[k], times[k], lens[k],
                         outs[k], pads[k] + pad_offs[k], auxs[k] + aux_offs[k], scrs[k],
                         S[k], D[k], tols[k],
                         sdb[k], sds[k], sdd[k], stb[k], sts[k], sob[k], sot[k], sod[k],
                         n_levels[k], stride0[k], ntbs[k],
                         METHOD[k], OOR[k], HAS_LEN[k], HAS_PAD[k], HAS_TOL[k], TIME_F64[k],
                         CT_F64[k], BLOCK_T[k], BLOCK_D[k], D_TILES[k], FAN)


@dataclass
class StreamLaunch:
    """One stream of a grouped launch: validated tensors on the launch device.

    data ``[B, S, D]`` or ``[S, D]`` (shared by all rows; None for frame_index); times
    ``[B, S]`` or ``[S]``; lengths int ``[B]`` or None; out ``[B, T, D]`` (int64 ``[B, T]``
    contiguous for frame_index); pad bool ``[B, T]`` contiguous or None; aux float32
    ``[B, T]`` contiguous (previous: age, frame_index: offset) or None; scratch (cubic only)
    ``[B, S, 2D + 1]`` contiguous in the arithmetic dtype (see `_cubic_sweep`).
    """

    data: torch.Tensor | None
    times: torch.Tensor
    lengths: torch.Tensor | None
    out: torch.Tensor
    pad: torch.Tensor | None
    aux: torch.Tensor | None
    method: int
    out_of_range: int
    tolerance_s: float | None = None
    scratch: torch.Tensor | None = None
    pad_offset: int = 0  # element offset of this stream's rows in `pad` (stacked masks)
    aux_offset: int = 0


def _strides2(t: torch.Tensor) -> tuple[int, int]:
    """(batch stride, sample stride) of a [B, N] or shared [N] tensor."""
    return (t.stride(0), t.stride(1)) if t.dim() == 2 else (0, t.stride(0))


def _tile_limits(s: StreamLaunch, tu: Tuning) -> dict:
    """tile_2d limits of one stream. `tu.elements` counts 2-byte values; wider data gets the
    same bytes (4-byte tiles of 4096 values held 144 registers, 18 % occupancy). PCHIP holds
    four tiles and their secants live (255 registers at [64, 32]), so it takes narrow
    [64, 8] tiles and loops over D. H100, align offline: 209 -> 133 us (proprio stream alone
    95 -> 49 us). Cubic keeps half-size tiles: its sweep runs once per BLOCK_D columns."""
    if s.method == PCHIP:
        cols, elements = tu.pchip_cols, tu.pchip_elements
    elif s.method == CUBIC:
        cols, elements = 128, tu.elements // 2
    else:
        size = 2 if s.data is None else s.data.element_size()
        cols, elements = 128, tu.elements * 2 // max(size, 2)
    return {"max_cols": cols, "elements": elements, "min_rows": 16, "max_rows": 128}


class InterpPlan:
    """The launch arguments of one grouped call that depend only on metadata (shapes,
    strides, dtypes, modes). Built once per geometry by the ops' caches; `launch` then
    passes only the tensors — the eager path is timed against a bare Triton launch.
    """

    __slots__ = ("grid", "head", "tail", "launcher")

    def __init__(self, streams: list[StreamLaunch], target: torch.Tensor, batch: int,
                 tuning: Tuning | None = None):
        tu = tuning or TUNING
        T = target.shape[-1]
        tgt64 = target.dtype == torch.float64
        starts, rows = [0], []
        for s in streams:
            width = 0 if s.data is None else s.data.shape[-1]
            if s.data is None:
                sd = (0, 0, 0)
            else:
                sd = s.data.stride() if s.data.dim() == 3 else (0, *s.data.stride())
            so = s.out.stride() if s.out.dim() == 3 else (*s.out.stride(), 0)
            bt, bd = tile_2d(T, max(width, 1), **_tile_limits(s, tu))
            ntb = 1 if s.method == CUBIC else cdiv(T, bt)  # cubic: one program per row
            starts.append(starts[-1] + batch * ntb)
            levels, stride0 = search_levels(s.times.shape[-1], tu.fan)
            rows.append((
                s.times.shape[-1], width, float(s.tolerance_s or 0.0), *sd, *_strides2(s.times),
                *so, levels, stride0, ntb, s.pad_offset, s.aux_offset,
                s.method, s.out_of_range, s.lengths is not None, s.pad is not None,
                s.tolerance_s is not None, tgt64 or s.times.dtype == torch.float64,
                s.data is not None and s.data.dtype == torch.float64, bt, bd, cdiv(width, bd),
            ))
        cols = tuple(zip(*rows, strict=True))
        self.grid = (starts[-1],)
        self.head = (T, *_strides2(target), tuple(starts))
        self.tail = (*cols[:16], len(streams), *cols[16:], tu.fan)
        self.launcher = CachedLaunch(_interp_kernel, self.grid, num_warps=tu.num_warps)

    def launch(self, target, datas, times, lens, outs, pads, auxs, scrs) -> None:
        """Launch with per-stream tensor tuples; absent ones (no data, lengths, pad, aux or
        scratch) are passed as `target`, which the kernel never touches for them."""
        if self.grid[0]:
            self.launcher((target, *self.head, datas, times, lens, outs, pads, auxs, scrs,
                           *self.tail), (target, *datas, *times, *lens, *outs, *pads, *auxs, *scrs))


def interp_cuda(streams: list[StreamLaunch], target: torch.Tensor, batch: int) -> None:
    """Plan and launch in one go (tests, one-off calls): `batch` rows of targets ``[B, T]``
    or shared ``[T]``. Writes each stream's out/pad/aux in place."""
    if not streams:
        return
    InterpPlan(streams, target, batch).launch(
        target,
        tuple(target if s.data is None else s.data for s in streams),
        tuple(s.times for s in streams),
        tuple(target if s.lengths is None else s.lengths for s in streams),
        tuple(s.out for s in streams),
        tuple(target if s.pad is None else s.pad for s in streams),
        tuple(target if s.aux is None else s.aux for s in streams),
        tuple(target if s.scratch is None else s.scratch for s in streams),
    )


__all__ = ["TUNING", "InterpPlan", "StreamLaunch", "Tuning", "interp_cuda", "METHOD_CODES",
           "OOR_CODES"]
