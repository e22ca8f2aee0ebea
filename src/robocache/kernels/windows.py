"""Window gather kernel: history/horizon chunks of packed episodes with pad masks.

One program gathers BLOCK_M windows. It finds each window's episode once (a vectorized
binary search over the episode offsets, or the episode ids when given), then copies its K
rows, K unrolled so every row's load is in flight before the first store: the copy is
latency-bound otherwise (a runtime loop issues one [BLOCK_M, D] load per round trip).
`windows` stores values streaming (`.cs`): each output row is written once and never read
back, and keeping it out of L2 leaves L2 to the source rows that overlapping windows share
(H100, M = 65536 x 18 rows x 32-D: 101.9 vs 110.1 us in one run). `key_windows` stores
streaming too and loads its source rows evict-last (see `KeyWindowsLaunch`).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from robocache._plancache import PlanCache
from robocache.kernels._utils import CachedLaunch, next_pow2


@triton.jit
def _store_pads(pad, rel, r, first, last, offs_m, mm, K_START: tl.constexpr, K: tl.constexpr,
                KP: tl.constexpr):
    if K > 0:
        ks = tl.arange(0, KP)
        mk = ks < K
        row = r[:, None] + tl.load(rel + K_START + ks, mask=mk, other=0)[None, :]
        is_pad = (row < first[:, None]) | (row > last[:, None])
        tl.store(pad + offs_m[:, None] * K + ks[None, :], is_pad, mask=mm[:, None] & mk[None, :])


@triton.jit
def _window_rows(offsets, indices, episodes, M, n_episodes, search_steps,
                 HAS_EPISODES: tl.constexpr, BLOCK_M: tl.constexpr, block):
    """Window block `block`'s windows (offsets, in-range mask), each one's current row and
    its episode's first and last rows (int64 [BLOCK_M])."""
    offs_m = block.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    mm = offs_m < M
    r = tl.load(indices + offs_m, mask=mm, other=0).to(tl.int64)
    if HAS_EPISODES:
        e = tl.load(episodes + offs_m, mask=mm, other=0).to(tl.int64)
    else:  # e = last episode whose first row <= r
        lo = tl.zeros([BLOCK_M], dtype=tl.int64)
        hi = tl.zeros([BLOCK_M], dtype=tl.int64) + (n_episodes - 1)
        for _ in range(search_steps):
            mid = (lo + hi + 1) // 2
            start = tl.load(offsets + mid, mask=mm & (lo < hi), other=0).to(tl.int64)
            go = start <= r
            lo = tl.where((lo < hi) & go, mid, lo)
            hi = tl.where((lo < hi) & ~go, mid - 1, hi)
        e = lo
    first = tl.load(offsets + e, mask=mm, other=0).to(tl.int64)
    last = tl.load(offsets + e + 1, mask=mm, other=1).to(tl.int64) - 1
    return offs_m, mm, r, first, last


@triton.jit
def _windows_kernel(data, offsets, indices, episodes, rel, out0, out1, pad0, pad1,
                    M, n_episodes, search_steps, sdr, sdd, D: tl.constexpr,
                    K0: tl.constexpr, K1: tl.constexpr, HAS_EPISODES: tl.constexpr,
                    ZERO_PAD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr,
                    KP0: tl.constexpr, KP1: tl.constexpr):
    offs_m, mm, r, first, last = _window_rows(offsets, indices, episodes, M, n_episodes,
                                              search_steps, HAS_EPISODES, BLOCK_M,
                                              tl.program_id(0))
    for k in tl.static_range(K0 + K1):
        row = r + tl.load(rel + k)
        is_pad = (row < first) | (row > last)
        src = tl.minimum(tl.maximum(row, first), last)
        for d0 in tl.static_range(0, D, BLOCK_D):
            offs_d = d0 + tl.arange(0, BLOCK_D)
            m2 = mm[:, None] & (offs_d < D)[None, :]
            v = tl.load(data + src[:, None] * sdr + offs_d[None, :] * sdd, mask=m2, other=0)
            if ZERO_PAD:
                v = tl.where(is_pad[:, None], tl.zeros_like(v), v)
            if k < K0:
                tl.store(out0 + (offs_m[:, None] * K0 + k) * D + offs_d[None, :], v, mask=m2,
                         cache_modifier=".cs")
            else:
                tl.store(out1 + (offs_m[:, None] * K1 + (k - K0)) * D + offs_d[None, :], v,
                         mask=m2, cache_modifier=".cs")
    # Masks as [BLOCK_M, K] tiles, one store each: per-k stores were K byte-strided writes.
    _store_pads(pad0, rel, r, first, last, offs_m, mm, 0, K0, KP0)
    _store_pads(pad1, rel, r, first, last, offs_m, mm, K0, K1, KP1)


class _GatherLaunch:
    """A window gather of one geometry, its launch cached (`launch`, None when there is
    nothing to gather) with its integer arguments (`ints`): call it with data, episode
    offsets, indices, episodes (or None) and the kernel's remaining tensors. Index tensors
    are made contiguous (the kernel reads them as dense 1-D arrays). ``fresh``: those
    remaining tensors come from the allocator (16-byte aligned), so only the inputs'
    alignment is checked."""

    __slots__ = ("launch", "ints")

    def __call__(self, data, offsets, indices, episodes, *buffers, fresh: bool = False
                 ) -> None:
        if self.launch is None:
            return
        offsets, indices = offsets.contiguous(), indices.contiguous()
        ep = indices if episodes is None else episodes.contiguous()
        inputs = (data, offsets, indices, ep)
        self.launch((*inputs, *buffers, *self.ints), inputs if fresh else (*inputs, *buffers))


class WindowsLaunch(_GatherLaunch):
    """The gather of one geometry (window count, data shape and strides, episode count, row
    offsets, pad mode, device); called with ``(data, offsets, indices, episodes, rel, out0,
    out1, pad0, pad1)``."""

    __slots__ = ()

    def __init__(self, data: torch.Tensor, n_episodes: int, M: int, K: int, split: int,
                 has_episodes: bool, zero_pad: bool):
        D = data.shape[1]
        block_d = min(next_pow2(max(D, 1)), 128)
        # 16 windows x K rows per program: every row load in flight at ~4 values per thread.
        block_m = 16
        self.launch = CachedLaunch(
            _windows_kernel, (triton.cdiv(M, block_m),),
            (D, split, K - split, has_episodes, zero_pad, block_m, block_d,
             next_pow2(max(split, 1)), next_pow2(max(K - split, 1))), num_warps=4) if M else None
        self.ints = (M, n_episodes, max(n_episodes, 1).bit_length(), *data.stride())


# Eager calls of the launchers keep one plan per launch key: everything that fixes the grid,
# the constexprs and the integer arguments (sizes, episode count, strides, dtype, device).
_PLANS = PlanCache(256)


def windows_plan(data: torch.Tensor, n_episodes: int, M: int, K: int, split: int,
                 has_episodes: bool, zero_pad: bool) -> WindowsLaunch:
    """The `WindowsLaunch` of a geometry, made once per launch key."""
    key = ("windows", M, data.shape[1], K, split, n_episodes, data.stride(), data.dtype,
           has_episodes, zero_pad, data.device)
    return _PLANS.get(key) or _PLANS.put(key, WindowsLaunch(data, n_episodes, M, K, split,
                                                            has_episodes, zero_pad))


def windows_cuda(data: torch.Tensor, offsets: torch.Tensor, indices: torch.Tensor,
                 episodes: torch.Tensor | None, rel: torch.Tensor, split: int,
                 out0: torch.Tensor, out1: torch.Tensor, pad0: torch.Tensor,
                 pad1: torch.Tensor, zero_pad: bool) -> None:
    """Gather windows of `data [total, D]`: entries ``rel[:split]`` into out0/pad0
    (``[M, split, D]`` / ``[M, split]``), the rest into out1/pad1; outputs contiguous."""
    windows_plan(data, offsets.shape[0] - 1, indices.shape[0], rel.shape[0], split,
                 episodes is not None, zero_pad)(data, offsets, indices, episodes, rel, out0,
                                                 out1, pad0, pad1)


@triton.jit
def _key_windows_kernel(data, offsets, indices, episodes, table, out, pad, M, P, Q,
                        n_episodes, search_steps, sdr, sdd, HAS_EPISODES: tl.constexpr,
                        ZERO_PAD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_P: tl.constexpr,
                        CHUNKS: tl.constexpr, BLOCK_Q: tl.constexpr, ALIGN: tl.constexpr):
    # One program: BLOCK_M windows, all their values in CHUNKS x BLOCK_P positions (unrolled,
    # so every chunk's load is in flight before the first store). A window's values are P
    # positions, key by key; int32 `table` columns per position p: row offset, data column,
    # key's value base, key's run length n = L * W, position q in that run: value (m, p) goes
    # to out[base * M + m * n + q], so a key's block of windows is one contiguous run and
    # every tile's stores are coalesced. Then Q pad entries (row offset, key's pad base, L,
    # index i): flag (m, j) goes to pad[pbase * M + m * L + i]. ALIGN: every key's column and
    # width is a multiple of it (data rows too), so aligned groups of ALIGN positions are one
    # contiguous run in data and in out: 16-byte loads and stores.
    offs_m, mm, r, first, last = _window_rows(offsets, indices, episodes, M, n_episodes,
                                              search_steps, HAS_EPISODES, BLOCK_M,
                                              tl.program_id(0))
    for c in tl.static_range(CHUNKS):
        p = c * BLOCK_P + tl.arange(0, BLOCK_P)
        mp = p < P
        rel = tl.load(table + p, mask=mp, other=0)
        col = tl.load(table + P + p, mask=mp, other=0)
        dst = tl.load(table + 2 * P + p, mask=mp, other=0).to(tl.int64) * M + \
            tl.load(table + 4 * P + p, mask=mp, other=0)
        n = tl.load(table + 3 * P + p, mask=mp, other=0)
        row = r[:, None] + rel[None, :]
        src = tl.minimum(tl.maximum(row, first[:, None]), last[:, None]) * sdr + \
            col[None, :] * sdd
        dst = dst[None, :] + offs_m[:, None] * n[None, :]
        if ALIGN > 1:
            src = tl.max_contiguous(tl.multiple_of(src, [1, ALIGN]), [1, ALIGN])
            dst = tl.max_contiguous(tl.multiple_of(dst, [1, ALIGN]), [1, ALIGN])
        m2 = mm[:, None] & mp[None, :]
        v = tl.load(data + src, mask=m2, other=0, eviction_policy="evict_last")
        if ZERO_PAD:
            v = tl.where((row < first[:, None]) | (row > last[:, None]), tl.zeros_like(v), v)
        tl.store(out + dst, v, mask=m2, cache_modifier=".cs")
    t = table + 5 * P
    j = tl.arange(0, BLOCK_Q)
    mj = j < Q
    prow = r[:, None] + tl.load(t + j, mask=mj, other=0)[None, :]
    pdst = tl.load(t + Q + j, mask=mj, other=0).to(tl.int64) * M + \
        tl.load(t + 3 * Q + j, mask=mj, other=0)
    pdst = pdst[None, :] + offs_m[:, None] * tl.load(t + 2 * Q + j, mask=mj, other=0)[None, :]
    tl.store(pad + pdst, (prow < first[:, None]) | (prow > last[:, None]),
             mask=mm[:, None] & mj[None, :])


class KeyWindowsLaunch(_GatherLaunch):
    """The per-key gather of one geometry (window count, value positions and pad entries per
    window, alignment, data strides, episode count, pad mode, tile, device); called with
    ``(data, offsets, indices, episodes, table, out, pad)``."""

    __slots__ = ()

    def __init__(self, data: torch.Tensor, n_episodes: int, M: int, n_values: int, n_pads: int,
                 align: int, has_episodes: bool, zero_pad: bool, block_m: int | None = None,
                 block_p: int | None = None, num_warps: int = 4):
        # One chunk of up to 1024 positions, ~4K values per program, 4 warps. H100, M = 65536
        # windows of 624 fp32 values (3 keys, `bench windows`), two runs: 4 windows x 1024
        # positions, 4 warps: 0.1223 / 0.1219 ms (90.3 % of copy); 8 x 1024, 8 warps: 0.1222 /
        # 0.1242 ms; chunks of 64-256 positions unrolled: 0.125-0.141 ms (more programs per
        # window but more registers a thread: 32 x 128 positions needs 112 and ran at 0.1555 ms).
        # Also measured and not adopted (three runs each): int32 element offsets, 0.1220-0.1228
        # vs 0.1212-0.1213 ms with int64 (pointers are 64-bit: every offset is widened anyway);
        # evict-first source loads, 0.134 ms; a power-of-two chunk plus a smaller tail chunk
        # (512 + 128 positions): 0.125-0.127 ms. Stores: plain (write-back) 0.1197-0.1203 ms,
        # streaming (`.cs`, as `windows` stores) 0.1224 ms, `.cg` 0.1201-0.1208, `.wt` 0.1205,
        # three runs each in one process: on that H100 the plain store won.
        # Another H100 and day, three interleaved rounds against a 1 GiB copy (3004 GB/s):
        # this tile 0.1232-0.1238 ms (88.5-88.9 %); a packed table (row offset and column in
        # one word, the destination base precomputed per M: 3 loads a position, not 5)
        # 0.1230-0.1237 ms; that with 8 windows and 8 warps 0.1238-0.1244 ms; one flat block
        # of 13 windows x 624 positions (8112 of 8192 lanes busy) 0.1360-0.1365 ms.
        # A third H100, rounds in shuffled order: with plain loads and stores, every tile and
        # store modifier tried fell into one of two modes from round to round, 0.1200-0.1208 or
        # 0.1232-0.1244 ms (88.0-91.4 % of copy), plain stores in the slow one 4 of 6 rounds and
        # 3 of 3 in an earlier run. Source loads marked evict-last with streaming stores, which
        # keep the rows that overlapping windows share in L2 ahead of the output, stayed fast in
        # all 15 rounds of three runs: 0.1199-0.1208 ms (90.7-91.4 %). That is the kernel's choice.
        block_p = block_p or min(1024, next_pow2(max(n_values, 16)))
        block_m = block_m or max(4, min(128, 4096 // block_p))
        vec = 1
        if data.stride(1) == 1:  # widest 16-byte vector dividing the columns, widths, row stride
            vec = max(1, 16 // data.element_size())
            while vec > 1 and (align % vec or data.stride(0) % vec):
                vec //= 2
        self.launch = CachedLaunch(
            _key_windows_kernel, (triton.cdiv(M, block_m),),
            (has_episodes, zero_pad, block_m, block_p, triton.cdiv(n_values, block_p),
             next_pow2(n_pads), vec), num_warps=num_warps) if M and n_values else None
        self.ints = (M, n_values, n_pads, n_episodes, max(n_episodes, 1).bit_length(),
                     *data.stride())


def key_windows_cuda(data: torch.Tensor, offsets: torch.Tensor, indices: torch.Tensor,
                     episodes: torch.Tensor | None, table: torch.Tensor, n_values: int,
                     n_pads: int, align: int, out: torch.Tensor, pad: torch.Tensor,
                     zero_pad: bool, block_m: int | None = None,
                     block_p: int | None = None, num_warps: int = 4) -> None:
    """Gather per-key windows of `data [total, C]` into the flat `out` / `pad` buffers in one
    launch: `table` (int32, see the kernel) lists each window's `n_values` value positions and
    `n_pads` pad entries; `align` divides every key's first column and width."""
    key_windows_plan(data, offsets.shape[0] - 1, indices.shape[0], n_values, n_pads, align,
                     episodes is not None, zero_pad, block_m, block_p, num_warps)(
        data, offsets, indices, episodes, table, out, pad)


def key_windows_plan(data: torch.Tensor, n_episodes: int, M: int, n_values: int, n_pads: int,
                     align: int, has_episodes: bool, zero_pad: bool, block_m: int | None = None,
                     block_p: int | None = None, num_warps: int = 4) -> KeyWindowsLaunch:
    """The `KeyWindowsLaunch` of a geometry, made once per launch key."""
    key = ("key_windows", M, n_values, n_pads, align, n_episodes, data.stride(), data.dtype,
           has_episodes, zero_pad, block_m, block_p, num_warps, data.device)
    return _PLANS.get(key) or _PLANS.put(key, KeyWindowsLaunch(
        data, n_episodes, M, n_values, n_pads, align, has_episodes, zero_pad, block_m, block_p,
        num_warps))
