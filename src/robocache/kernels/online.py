"""The online observer's numeric tick in ONE Triton launch: every stream's window aligned onto
the tick's grid instants, padded, normalized and stored, read from the observer's device arena
(the ring buffers) and written to an output arena. Semantics: :class:`robocache.online.
ObservationCore` (its reference, on the CPU and in the tests), for the methods ``linear``,
``previous``, ``nearest`` and ``frame_index``.

One program per stream. The layout of both arenas is fixed when the observer is made, so every
offset, size and dtype is a compile-time constant: the kernel is specialized per observer and
takes three pointers. Per program:

1. The window: the ``cap`` ring slots before ``head`` (at least one), its times in registers
   (``+inf`` past the window's length). ``cnt`` per instant = the window's times at or before
   it (a compare and a sum: windows are short), then the segment, the neighbours' times and the
   last time, as the reference computes them.
2. ``linear``: the float32 weight and ``(1 - w) y0 + w y1`` in float32 with no fused
   multiply-add (the launch disables FP contraction, so the roundings are the reference's),
   rounded half to even for integer streams, cast to the stream's dtype. ``previous`` /
   ``nearest``: the sample's row copied byte for byte (float32 rows go through the float path
   only when normalized). ``frame_index``: the ring slot.
3. Pads (the window's edges, the instants before the first tick, a ``nearest`` sample that is
   final once the horizon is far enough, a ``previous`` sample's age), the affine
   normalization ``(x - offset) * scale`` (clipped for ``min_max``), zero padding.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from robocache.kernels._utils import next_pow2

LINEAR, NEAREST, PREVIOUS, FRAME_INDEX = 0, 1, 2, 3
METHODS = {"linear": LINEAR, "nearest": NEAREST, "previous": PREVIOUS,
           "frame_index": FRAME_INDEX}
# the output dtypes an interpolated stream may have here (others run the reference core)
LINEAR_DTYPES = {torch.float32: tl.float32, torch.float64: tl.float64,
                 torch.float16: tl.float16, torch.bfloat16: tl.bfloat16,
                 torch.int8: tl.int8, torch.int16: tl.int16, torch.int32: tl.int32,
                 torch.int64: tl.int64, torch.uint8: tl.uint8}
MAX_CAP = 1024  # window slots compared with every instant in registers
MAX_ROW_BYTES = 1 << 14


@triton.jit
def _round_half_even(v):
    """torch.round: to the nearest integer, ties to the even one."""
    f = tl.floor(v)
    d = v - f
    odd = f - 2.0 * tl.floor(f * 0.5)
    return tl.where(d > 0.5, f + 1.0, tl.where(d < 0.5, f, f + odd))


@triton.jit
def _stream(arena, out, norm, x, pre, horizon, u, um,
            METHOD: tl.constexpr, EXACT: tl.constexpr, CAP: tl.constexpr,
            BLOCK_C: tl.constexpr, TIMES: tl.constexpr, HEAD: tl.constexpr,
            VALS: tl.constexpr, VSTRIDE: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr,
            ROW_BYTES: tl.constexpr, BLOCK_B: tl.constexpr, OUT_V: tl.constexpr,
            OUT_DT: tl.constexpr, OUT_P: tl.constexpr, OUT_A: tl.constexpr,
            NORM: tl.constexpr, CLIP: tl.constexpr, INTEGER: tl.constexpr, TOL: tl.constexpr,
            ZERO: tl.constexpr):
    f64 = arena.to(tl.pointer_type(tl.float64))
    head = tl.load(arena.to(tl.pointer_type(tl.int64)) + HEAD)
    start = tl.maximum(head - CAP, 0)
    n = head - start
    length = tl.maximum(n, 1)
    c = tl.arange(0, BLOCK_C)
    row = f64 + TIMES + start
    tw = tl.load(row + c, mask=c < length, other=float("inf"))
    cnt = tl.sum((tw[None, :] <= x[:, None]).to(tl.int32), axis=1)
    i = cnt - 1
    seg = tl.minimum(tl.maximum(i, 0), tl.maximum(length - 2, 0))
    seg1 = tl.minimum(seg + 1, length - 1)
    t0 = tl.load(row + seg, mask=um, other=0.0)
    t1 = tl.load(row + seg1, mask=um, other=0.0)
    t_last = tl.load(row + length - 1)
    outside = (cnt == 0) | (x > t_last)
    edge = (n == 0) | pre
    d = tl.arange(0, BLOCK_D)
    m2 = um[:, None] & (d < D)[None, :]
    if METHOD == 0:  # linear
        h = (t1 - t0).to(tl.float32)
        # IEEE division (Triton's `/` is an approximate one on CUDA)
        w = tl.where(h > 0, tl.math.div_rn((x - t0).to(tl.float32), tl.where(h > 0, h, 1.0)),
                     0.0)
        w = tl.minimum(tl.maximum(w, 0.0), 1.0)
        data = arena.to(tl.pointer_type(tl.float32)) + VALS
        y0 = tl.load(data + (start + seg)[:, None] * VSTRIDE + d[None, :], mask=m2, other=0.0)
        y1 = tl.load(data + (start + seg1)[:, None] * VSTRIDE + d[None, :], mask=m2, other=0.0)
        v = (1.0 - w)[:, None] * y0 + w[:, None] * y1
        if INTEGER:
            v = _round_half_even(v)
        v = v.to(OUT_DT)
        pad = outside | edge
    else:
        if METHOD == 2:  # previous: the sample at or before, its age
            idx = tl.minimum(tl.maximum(i, 0), length - 1)
            age = (x - tl.load(row + idx, mask=um, other=0.0)).to(tl.float32)
            tl.store(out.to(tl.pointer_type(tl.float32)) + OUT_A + u, age, mask=um)
            if EXACT:
                pad = edge | (age != 0.0)
            else:
                pad = edge | (age < 0.0)
        else:  # nearest / frame_index: the nearer neighbour, ties to the earlier
            idx = tl.where((t1 - x) < (x - t0), seg1, seg)
            if TOL >= 0.0:
                off = (tl.where(idx == seg1, t1, t0) - x).to(tl.float32)
                outside = ~(tl.abs(off) <= TOL)
            else:  # past the latest sample, it is final once the horizon is as far
                t_first = tl.load(row)
                final = (x > t_last) & (x - t_last <= horizon - x) & (x >= t_first)
                outside = outside & ~final
            pad = outside | edge
        slot = start + idx
        if METHOD == 3:
            tl.store(out.to(tl.pointer_type(tl.int64)) + OUT_V + u, slot.to(tl.int64),
                     mask=um)
        elif NORM < 0:  # the sample's row, byte for byte
            b = tl.arange(0, BLOCK_B)
            mb = um[:, None] & (b < ROW_BYTES)[None, :]
            raw = tl.load(arena + VALS + slot[:, None] * ROW_BYTES + b[None, :], mask=mb,
                          other=0)
            if ZERO:
                raw = tl.where(pre[:, None], 0, raw)
            tl.store(out + OUT_V * (ROW_BYTES // D) + u[:, None] * ROW_BYTES + b[None, :], raw,
                     mask=mb)
        else:
            data = arena.to(tl.pointer_type(tl.float32)) + VALS
            v = tl.load(data + slot[:, None] * VSTRIDE + d[None, :], mask=m2, other=0.0)
    if (METHOD == 0) | ((METHOD != 3) & (NORM >= 0)):
        if NORM >= 0:
            nf = norm + NORM
            o = tl.load(nf + d, mask=d < D, other=0.0)
            s = tl.load(nf + D + d, mask=d < D, other=1.0)
            v = (v - o[None, :]) * s[None, :]
            if CLIP:
                v = tl.minimum(tl.maximum(v, -1.0), 1.0)
        if ZERO:
            v = tl.where(pre[:, None], 0.0, v)
        tl.store(out.to(tl.pointer_type(OUT_DT)) + OUT_V + u[:, None] * D + d[None, :],
                 v.to(OUT_DT), mask=m2)
    tl.store(out + OUT_P + u, pad.to(tl.uint8), mask=um)


@triton.jit
def _observe_kernel(arena, out, norm, TARGET: tl.constexpr, PRE: tl.constexpr,
                    HORIZON: tl.constexpr, U: tl.constexpr, BLOCK_U: tl.constexpr,
                    NUM: tl.constexpr, METHOD: tl.constexpr, EXACT: tl.constexpr,
                    CAP: tl.constexpr, BLOCK_C: tl.constexpr, TIMES: tl.constexpr,
                    HEAD: tl.constexpr, VALS: tl.constexpr, VSTRIDE: tl.constexpr,
                    D: tl.constexpr, BLOCK_D: tl.constexpr, ROW_BYTES: tl.constexpr,
                    BLOCK_B: tl.constexpr, OUT_V: tl.constexpr, OUT_DT: tl.constexpr,
                    OUT_P: tl.constexpr, OUT_A: tl.constexpr, NORM: tl.constexpr,
                    CLIP: tl.constexpr, INTEGER: tl.constexpr, TOL: tl.constexpr,
                    ZERO: tl.constexpr):
    pid = tl.program_id(0)
    f64 = arena.to(tl.pointer_type(tl.float64))
    u = tl.arange(0, BLOCK_U)
    um = u < U
    x = tl.load(f64 + TARGET + u, mask=um, other=0.0)
    pre = tl.load(arena + PRE + u, mask=um, other=0) != 0
    horizon = tl.load(f64 + HORIZON)
    for k in tl.static_range(NUM):
        if pid == k:
            _stream(arena, out, norm, x, pre, horizon, u, um, METHOD[k], EXACT[k], CAP[k],
                    BLOCK_C[k], TIMES[k], HEAD[k], VALS[k], VSTRIDE[k], D[k], BLOCK_D[k],
                    ROW_BYTES[k], BLOCK_B[k], OUT_V[k], OUT_DT[k], OUT_P[k], OUT_A[k],
                    NORM[k], CLIP[k], INTEGER[k], TOL[k], ZERO[k])


@dataclass(frozen=True)
class StreamPlan:
    """One stream of the launch. Offsets count elements of the array's own type from the
    arena's start (``times``/``head``: float64/int64; ``values``: float32 rows for ``linear``
    and normalized streams, else bytes); ``out_*``: the output arena's (value: its dtype,
    pad: bytes, age: float32; -1 when absent); ``norm``: the float32 offset of the stream's
    ``offset`` (then ``scale``) in the normalization buffer, -1 when not normalized."""

    method: str
    exact: bool
    cap: int
    times: int
    head: int
    values: int
    stride: int
    dim: int
    row_bytes: int
    out_value: int
    out_dtype: torch.dtype
    out_pad: int
    out_age: int = -1
    norm: int = -1
    clip: bool = False
    integer: bool = False
    tolerance_s: float | None = None
    zero: bool = False


def launch(arena: torch.Tensor, out: torch.Tensor, norm: torch.Tensor, *, target: int,
           pre: int, horizon: int, instants: int, streams: list[StreamPlan]) -> None:
    """One launch over uint8 ``arena`` and ``out`` (and float32 ``norm``), on their device
    (CPU tensors through ``TRITON_INTERPRET=1``). ``target``/``horizon``: float64 offsets of
    the ``instants`` grid instants and of the tick's time, ``pre``: the byte offset of the
    instants' before-the-first-tick flags."""
    cols = {
        "METHOD": tuple(METHODS[s.method] for s in streams),
        "EXACT": tuple(s.exact for s in streams),
        "CAP": tuple(s.cap for s in streams),
        "BLOCK_C": tuple(next_pow2(s.cap) for s in streams),
        "TIMES": tuple(s.times for s in streams),
        "HEAD": tuple(s.head for s in streams),
        "VALS": tuple(s.values for s in streams),
        "VSTRIDE": tuple(s.stride for s in streams),
        "D": tuple(s.dim for s in streams),
        "BLOCK_D": tuple(next_pow2(s.dim) for s in streams),
        "ROW_BYTES": tuple(s.row_bytes for s in streams),
        "BLOCK_B": tuple(next_pow2(s.row_bytes) for s in streams),
        "OUT_V": tuple(s.out_value for s in streams),
        "OUT_DT": tuple(LINEAR_DTYPES.get(s.out_dtype, tl.float32) for s in streams),
        "OUT_P": tuple(s.out_pad for s in streams),
        "OUT_A": tuple(s.out_age for s in streams),
        "NORM": tuple(s.norm for s in streams),
        "CLIP": tuple(s.clip for s in streams),
        "INTEGER": tuple(s.integer for s in streams),
        "TOL": tuple(-1.0 if s.tolerance_s is None else float(s.tolerance_s)
                     for s in streams),
        "ZERO": tuple(s.zero for s in streams),
    }
    _observe_kernel[(len(streams),)](arena, out, norm, TARGET=target, PRE=pre,
                                     HORIZON=horizon, U=instants,
                                     BLOCK_U=next_pow2(instants), NUM=len(streams),
                                     enable_fp_fusion=False, **cols)


__all__ = ["LINEAR_DTYPES", "MAX_CAP", "MAX_ROW_BYTES", "METHODS", "StreamPlan", "launch"]
