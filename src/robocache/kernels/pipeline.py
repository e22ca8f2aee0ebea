"""The fused per-sample pipeline: time warp + resample -> SE(3) -> normalize -> noise -> dropout
in ONE Triton kernel, no intermediate tensor in device memory.

One program = one variant (b, k) x BLOCKS blocks of BLOCK_T output times x all D columns. It
draws its variant's parameters from Philox (`kernels.augment`), builds its warped target times
in registers, finds them among the row's source times and interpolates with the grouped
interpolation kernel's helpers (`kernels.jit.segments` / `linear_weight`), then applies
the per-element chain and writes `[B, K, T, D]` once. Semantics: `ops.pipeline` and its
unfused composition (`Pipeline(..., fused=False)`), which the tests compare bit-for-bit up to
float rounding.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from robocache._plancache import PlanCache
from robocache.kernels._utils import CachedLaunch, cdiv, int_type, next_pow2
from robocache.kernels.jit import (
    dropped,
    linear_weight,
    normals,
    quat_mul,
    quat_rotate,
    rigid,
    search_levels,
    segments,
    variant_uniforms,
    warp,
)


@triton.jit
def _lerp_col(row, seg, seg1, w, col, sds, valid):
    """Column `col` of the row interpolated at weights w between samples seg and seg1."""
    a = tl.load(row + seg.to(tl.int64) * sds + col, mask=valid, other=0.0).to(tl.float32)
    b = tl.load(row + seg1.to(tl.int64) * sds + col, mask=valid, other=0.0).to(tl.float32)
    return (1.0 - w) * a + w * b


@triton.jit
def _put(y, cols, col, v):
    return tl.where(cols[None, :] == col, v[:, None], y)


@triton.jit(do_not_specialize=["S", "T", "seed"])
def _pipeline_kernel(data, times, lens, out, flags, offset_p, scale_p, std_p, stream_p,
                     S, T, D, K, span, seed, max_t, max_r, warp_amp, max_crop, drop_p,
                     sdb, sds, stb, sts, n_levels, stride0, chunks,
                     SEED_PTR: tl.constexpr, HAS_LEN: tl.constexpr, TIME_F64: tl.constexpr,
                     POS: tl.constexpr, QUAT: tl.constexpr, TERMS: tl.constexpr, CROP: tl.constexpr,
                     NORM: tl.constexpr, CLIP: tl.constexpr, NOISE: tl.constexpr,
                     NS: tl.constexpr, NS_P2: tl.constexpr, BLOCK_T: tl.constexpr,
                     BLOCK_D: tl.constexpr, BLOCKS: tl.constexpr, FAN: tl.constexpr):
    pid = tl.program_id(0)
    variant = (pid // chunks).to(tl.int64)
    first = (pid % chunks) * BLOCKS
    b = variant // K
    if SEED_PTR:  # CUDA-graph replays read a new seed from device memory
        seed = tl.load(seed)
    u, slots = variant_uniforms(seed, variant)
    if POS >= 0 or QUAT >= 0:
        qw, qx, qy, qz, tx, ty, tz = rigid(u, slots, max_t, max_r)
    if NS > 0:
        drop = dropped(seed, variant, drop_p, NS_P2) & (tl.arange(0, NS_P2) < NS)
        if first == 0:
            tl.store(flags + variant * NS + tl.arange(0, NS_P2), drop,
                     mask=tl.arange(0, NS_P2) < NS)
    row = times + b * stb
    t_first = tl.load(row)
    if HAS_LEN:
        n = tl.load(lens + b).to(tl.int32)
    else:
        n = S + 0
    src = data + b * sdb

    for i in tl.static_range(BLOCKS):
        offs_t = (first + i) * BLOCK_T + tl.arange(0, BLOCK_T)
        valid = offs_t < T
        # Warped target times: t_first + span * phi(j / (T - 1)), phi float32, sum in time dtype.
        tn = offs_t.to(tl.float32) / tl.maximum(T - 1, 1).to(tl.float32)
        if TERMS > 0 or CROP:
            tn = warp(tn, u, slots, warp_amp, max_crop, TERMS, CROP)
        if TIME_F64:
            x = t_first.to(tl.float64) + (tn * span).to(tl.float64)
        else:
            x = t_first.to(tl.float32) + tn * span
        _, seg, seg1, t0, t1, _ = segments(row, sts, n, x, valid, x, x, n_levels, stride0, False,
                                            BLOCK_T, FAN)
        w = linear_weight(x, t0, t1, 0, False)
        if POS >= 0:
            px, py, pz = quat_rotate(qw, qx, qy, qz,
                                      _lerp_col(src, seg, seg1, w, POS, sds, valid),
                                      _lerp_col(src, seg, seg1, w, POS + 1, sds, valid),
                                      _lerp_col(src, seg, seg1, w, POS + 2, sds, valid))
            px, py, pz = px + tx, py + ty, pz + tz
        if QUAT >= 0:
            ow, ox, oy, oz = quat_mul(qw, qx, qy, qz,
                                       _lerp_col(src, seg, seg1, w, QUAT, sds, valid),
                                       _lerp_col(src, seg, seg1, w, QUAT + 1, sds, valid),
                                       _lerp_col(src, seg, seg1, w, QUAT + 2, sds, valid),
                                       _lerp_col(src, seg, seg1, w, QUAT + 3, sds, valid))
        out_rows = variant * T + offs_t.to(tl.int64)
        for d0 in range(0, D, BLOCK_D):
            cols = d0 + tl.arange(0, BLOCK_D)
            cmask = cols < D
            m2 = valid[:, None] & cmask[None, :]
            a = tl.load(src + seg.to(tl.int64)[:, None] * sds + cols[None, :], mask=m2,
                        other=0.0).to(tl.float32)
            c = tl.load(src + seg1.to(tl.int64)[:, None] * sds + cols[None, :], mask=m2,
                        other=0.0).to(tl.float32)
            y = (1.0 - w)[:, None] * a + w[:, None] * c
            if POS >= 0:
                y = _put(_put(_put(y, cols, POS, px), cols, POS + 1, py), cols, POS + 2, pz)
            if QUAT >= 0:
                y = _put(_put(y, cols, QUAT, ow), cols, QUAT + 1, ox)
                y = _put(_put(y, cols, QUAT + 2, oy), cols, QUAT + 3, oz)
            if NORM:
                o = tl.load(offset_p + cols, mask=cmask, other=0.0)[None, :]
                s = tl.load(scale_p + cols, mask=cmask, other=1.0)[None, :]
                y = (y - o) * s
                if CLIP:
                    y = tl.minimum(tl.maximum(y, -1.0), 1.0)
            if NOISE:
                std = tl.load(std_p + cols, mask=cmask, other=0.0)[None, :]
                y += std * normals(seed, out_rows, d0, D, BLOCK_T, BLOCK_D)
            if NS > 0:
                sid = tl.load(stream_p + cols, mask=cmask, other=-1)
                hit = (sid[:, None] == tl.arange(0, NS_P2)[None, :]) & drop[None, :]
                y = tl.where((tl.sum(hit.to(tl.int32), axis=1) > 0)[None, :], 0.0, y)
            tl.store(out + out_rows[:, None] * D + cols[None, :], y.to(out.dtype.element_ty),
                     mask=m2)


@dataclass(frozen=True)
class PipelineTuning:
    """Launch parameters of the fused kernel; `benchmarks/bench_pipeline.py --sweep` times
    alternatives on the GPU.

    Defaults: the fastest of the H100 sweep on the benchmark's 256 x 10 case (2026-11-22,
    kernel only): 16 targets x 32 columns in one warp took 238 us; 32 x 32 in 4 warps 490 us,
    in 2 warps 304 us. Small programs of one warp win because the per-target work (warp,
    search, pose) is then not replicated across warps and reductions and layout conversions
    need no barrier across warps. Values per thread set the registers (ptxas, sm_90): 8 ~72,
    16 ~128, 32 hit the 255 limit and spill.
    """

    block_t: int = 16      # targets per block (rows of the [block_t, BLOCK_D] tile)
    blocks: int = 1        # blocks per program (the variant's draws are paid once per program)
    per_thread: int = 16   # tile values per thread: num_warps = tile / (32 * per_thread)
    fan: int = 64          # probes per level of the block-window search (kernels.interp)


TUNING = PipelineTuning()


# Eager calls relaunch a CachedLaunch per launch key (plan, sizes, strides, dtypes, seed kind,
# tuning, device); the key fixes every constexpr and integer argument.
_PLANS = PlanCache(256)


class _PipelineLaunch(CachedLaunch):
    """A cached launch of the fused kernel and its search integers (levels, stride0, chunks)."""

    __slots__ = ("ints",)


def _plan_launch(plan, S: int, T: int, D: int, variants: int, time_dtype: torch.dtype,
                 has_len: bool, seed_ptr: bool, tu: PipelineTuning) -> _PipelineLaunch:
    levels, stride0 = search_levels(S, tu.fan)
    bd = max(min(next_pow2(D), 128), 4)  # the noise draws 4 columns per Philox call
    bt = min(tu.block_t, max(next_pow2(T), 8))
    ntb = cdiv(T, bt)
    chunks = cdiv(ntb, tu.blocks)
    warps = bt * bd // (32 * tu.per_thread)
    if D % 16:
        # Triton proves 16-byte row alignment only for D % 16 == 0; otherwise it lays the tile
        # out one column per lane with whole rows per thread, ~13 registers per row (ptxas,
        # sm_90: D = 30, 16 rows in 1 warp: 255 + spills; in 4 warps: 96). <= 4 rows a thread.
        warps = max(warps, bt // 4)
    warps = min(max(warps, 1), 16)
    launch = _PipelineLaunch(
        _pipeline_kernel, (variants * chunks,),
        (seed_ptr, has_len, time_dtype == torch.float64, plan.pos, plan.quat, plan.terms,
         plan.crop, plan.norm, plan.clip, plan.noise, plan.streams,
         max(next_pow2(plan.streams), 2), bt, bd, tu.blocks, tu.fan), num_warps=warps)
    launch.ints = (levels, stride0, chunks)
    return launch


def pipeline_cuda(plan, data: torch.Tensor, times: torch.Tensor,
                  lengths: torch.Tensor | None, out: torch.Tensor, flags: torch.Tensor,
                  offset: torch.Tensor, scale: torch.Tensor, std: torch.Tensor,
                  stream_of_col: torch.Tensor, k: int, span: float, seed: int | torch.Tensor,
                  max_translation: float, max_rotation: float, warp_amp: float,
                  max_crop: float, drop_p: float,
                  tuning: PipelineTuning | None = None) -> torch.Tensor:
    """Launch the fused kernel of `plan` (the chain's compile-time shape,
    `robocache.ops.pipeline.FusedPlan`): data ``[B, S, D]`` (unit stride along D), times ``[B, S]``,
    out contiguous ``[B, K, T, D]``, flags bool ``[B, K, NS]``; per-column float32 offset,
    scale, std and int32 stream id (-1: none); seed an int or an int64 device scalar."""
    B, S, D = data.shape
    T = out.shape[2]
    if B == 0 or T == 0 or k == 0:
        return out
    seed_ptr = isinstance(seed, torch.Tensor)
    key = (plan, B, S, T, D, k, data.stride(), times.stride(), data.dtype, times.dtype,
           None if lengths is None else lengths.dtype,
           "pointer" if seed_ptr else int_type(seed), tuning, data.device)
    launch = _PLANS.get(key) or _PLANS.put(key, _plan_launch(plan, S, T, D, B * k, times.dtype,
                                                             lengths is not None, seed_ptr,
                                                             tuning or TUNING))
    # absent tensors are passed as `data` (never touched): an empty tensor's null pointer is
    # rejected by the launcher
    lens = data if lengths is None else lengths
    flag_t = flags if plan.streams else data
    tensors = (data, times, lens, out, flag_t, offset, scale, std, stream_of_col)
    launch((*tensors, S, T, D, k, span, seed, max_translation, max_rotation, warp_amp,
            max_crop, drop_p, *data.stride()[:2], *times.stride()[:2], *launch.ints),
           (*tensors, seed) if seed_ptr else tensors)
    return out
