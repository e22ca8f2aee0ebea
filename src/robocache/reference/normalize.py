"""Pure-PyTorch normalization: per-dimension statistics and the affine map they define.

Statistics are computed in float64. Quantiles of one pass are exact (linear interpolation
between order statistics, numpy's default). For merging, each `Stats` also carries a dyadic
histogram: per dimension the bin width is a power of two ``2**e`` and bin edges sit on integer
multiples of it, so a histogram re-binned to a coarser width (larger ``e``) maps every old bin
into exactly one new bin. Merging is therefore exact on counts and never smears mass; the only
error of a merged quantile is where it falls inside its final bin (see `hist_quantile`).
"""

from __future__ import annotations

import torch

# k = floor(x / 2**e) must fit in int64: keep |x| / 2**e below 2**61.
_INT64_HEADROOM = 61
_MIN_EXPONENT = -1000  # 2**-1000 is a normal float64; used when a dimension is constant at 0
# Samples per block of the statistics' passes on the CPU (moments_histogram): a [24, 2**14]
# float64 block stays in cache through its mean, deviations and bins; for [1M, 24] float32 on
# one thread of the development VM those steps took 188 ms against 421 as whole-array passes
# (float64 copy, mean, std, histogram; benchmarks/results/stats-profile-cpu-2026-11-27.txt).
STATS_BLOCK = 1 << 14


def quantile_ranks(n: int, qs: tuple[float, ...]) -> list[int]:
    """The ranks (0-based, along N of N sorted rows) that the quantiles ``qs`` interpolate
    between (numpy 'linear'), and the extremes 0 and n - 1."""
    ranks = {0, n - 1}
    for q in qs:
        lo = int((n - 1) * q)
        ranks |= {lo, min(lo + 1, n - 1)}
    return sorted(ranks)


def order_statistics(xt: torch.Tensor, ranks: list[int], local: torch.Tensor,
                     counts: torch.Tensor) -> dict[int, torch.Tensor]:
    """Rows ``ranks`` of the samples sorted (rank -> ``[D]`` in the samples' dtype), from their
    histogram: the samples ``xt [D, N]`` (one dimension per row), the bin of each within its
    row ``local [D, N]`` and the counts ``[D, bins]`` (:func:`moments_histogram`). Binning is
    monotonic, so the sample of rank r lies in the bin where the cumulative count passes r:
    only that bin's samples are sorted (once for the ranks that share it). Exact, and one pass
    over the samples per bin instead of a partial sort (``torch.topk`` of each column's 1 %
    ends took 0.58 s of the 2.9 s of [1M, 24] float32 on one CPU thread; benchmarks/results/
    stats-profile-cpu-2026-11-27.txt)."""
    cum = counts.cumsum(1)
    at = torch.tensor(ranks, dtype=cum.dtype, device=cum.device).expand(counts.shape[0], -1)
    j = torch.searchsorted(cum, at.contiguous(), right=True)  # [D, R]: the bin of each rank
    before = torch.where(j > 0, cum.gather(1, (j - 1).clamp_min(0)), 0)
    sizes, within = counts.gather(1, j).t().tolist(), (at - before).t().tolist()
    out, sorted_bins = {}, {}
    for i, r in enumerate(ranks):
        key = tuple(j[:, i].tolist())
        if key not in sorted_bins:
            values = xt[local == j[:, i:i + 1].to(local.dtype)]  # the bin's samples, by row
            sorted_bins[key] = [v.sort().values for v in values.split(sizes[i])]
        out[r] = torch.stack([v[k] for v, k in zip(sorted_bins[key], within[i], strict=True)])
    return out


def quantiles_exact(rows: dict[int, torch.Tensor], n: int,
                    qs: tuple[float, ...]) -> list[torch.Tensor]:
    """Quantiles of N rows in float64, numpy 'linear', from their order statistics ``rows``
    (rank -> ``[D]``, at least :func:`quantile_ranks`)."""
    out = []
    for q in qs:
        h = (n - 1) * q
        lo = int(h)
        hi = min(lo + 1, n - 1)
        a = rows[lo].double()
        b = rows[hi].double()
        out.append(a + (h - lo) * (b - a))
    return out


def fit_exponent(lo: torch.Tensor, hi: torch.Tensor, bins: int,
                 floor: torch.Tensor | None = None) -> torch.Tensor:
    """Smallest int64 exponent e (>= `floor`) whose dyadic grid covers [lo, hi] in `bins` bins."""
    span = (hi - lo).clamp_min(0)
    mag = torch.maximum(lo.abs(), hi.abs())
    e = torch.ceil(torch.log2(span / (bins - 1))).nan_to_num(_MIN_EXPONENT, _MIN_EXPONENT,
                                                             _MIN_EXPONENT)
    e = torch.maximum(e, torch.ceil(torch.log2(mag)).nan_to_num(
        _MIN_EXPONENT, _MIN_EXPONENT, _MIN_EXPONENT) - _INT64_HEADROOM)
    e = e.clamp_min(_MIN_EXPONENT).long()
    if floor is not None:
        e = torch.maximum(e, floor)
    # log2 may round down by one ulp: bump where the grid still needs more than `bins` bins.
    for _ in range(2):
        need = grid_index(hi, e) - grid_index(lo, e) + 1
        e = torch.where(need > bins, e + 1, e)
    return e


def grid_index(x: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
    """floor(x / 2**e) as int64 (exact: scaling by a power of two does not round)."""
    return torch.floor(torch.ldexp(x.double(), -e.double())).long()


def moments_histogram(xt: torch.Tensor, e: torch.Tensor, origin: torch.Tensor, bins: int,
                      *, block: int | None = None
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Mean and population standard deviation (float64 ``[D]``), the bin of each sample within
    its row on the dyadic grid (e, origin) (``[D, N]``, the smallest integer dtype that holds
    ``bins``) and the counts (int64 ``[D, bins]``) of the samples ``xt [D, N]`` (one dimension
    per row, every sample inside the grid).

    The samples go through in blocks of ``block`` columns (default: all at once on CUDA,
    :data:`STATS_BLOCK` on the CPU): each block is converted to float64 once and, while it is
    in the core's cache, gives its mean and squared deviations (merged across blocks with
    Chan's parallel formula) and its bins. Scaling by the power of two ``2**-e`` is exact, as
    in :func:`grid_index`."""
    d, n = xt.shape
    block = n if block is None and xt.is_cuda else block or STATS_BLOCK
    f64 = torch.float64
    scale = torch.ldexp(torch.ones_like(e, dtype=f64), -e.double())[:, None]
    base = torch.arange(d, device=xt.device)[:, None] * bins  # row d's bins are d * bins ...
    shift = (origin[:, None] - base).double()
    local = torch.empty((d, n), dtype=torch.int16 if bins <= 1 << 15 else torch.int64,
                        device=xt.device)
    mean = torch.zeros(d, dtype=f64, device=xt.device)
    m2, counts, seen = torch.zeros_like(mean), torch.zeros(d * bins, dtype=torch.int64,
                                                           device=xt.device), 0
    for a in range(0, n, block):
        xd = xt[:, a:a + block].to(f64, copy=True)
        k = xd.shape[1]
        bm = xd.mean(1)
        delta, total = bm - mean, seen + k
        m2 += (xd - bm[:, None]).square_().sum(1) + delta.square() * (seen * k / total)
        mean += delta * (k / total)
        seen = total
        flat = xd.mul_(scale).floor_().sub_(shift).long()
        counts += torch.bincount(flat.reshape(-1), minlength=d * bins)
        local[:, a:a + block] = flat - base
    return mean, (m2 / n).sqrt(), local, counts.reshape(d, bins)


def rebin(counts: torch.Tensor, e: torch.Tensor, origin: torch.Tensor, new_e: torch.Tensor,
          new_origin: torch.Tensor) -> torch.Tensor:
    """Move dyadic histogram counts [D, bins] to a coarser grid (new_e >= e); exact."""
    d, bins = counts.shape
    k = origin[:, None] + torch.arange(bins, device=counts.device)
    shift = (new_e - e).clamp(0, 63)[:, None]
    idx = (torch.bitwise_right_shift(k, shift) - new_origin[:, None]).clamp(0, bins - 1)
    out = torch.zeros_like(counts)
    return out.scatter_add_(1, idx, counts)


def hist_quantile(counts: torch.Tensor, e: torch.Tensor, origin: torch.Tensor, q: float,
                  lo: torch.Tensor, hi: torch.Tensor) -> torch.Tensor:
    """Quantile q of a dyadic histogram, uniform within bins, clamped to the true [lo, hi].

    The i-th order statistic (0-based) sits at cumulative mass i + 0.5, so rank (n-1)q + 0.5
    matches numpy's 'linear' definition up to the bin the quantile falls in.
    """
    c = counts.double()
    cum = c.cumsum(1)
    n = cum[:, -1:]
    rank = (n - 1) * q + 0.5
    j = torch.searchsorted(cum.contiguous(), rank.contiguous(), right=True).clamp_max(
        c.shape[1] - 1)
    before = torch.where(j > 0, cum.gather(1, (j - 1).clamp_min(0)), torch.zeros_like(rank))
    frac = ((rank - before) / c.gather(1, j).clamp_min(1)).clamp(0, 1)
    value = torch.ldexp((origin[:, None] + j).double() + frac, e[:, None].double())[:, 0]
    return torch.minimum(torch.maximum(value, lo), hi)


def affine_reference(x: torch.Tensor, offset: torch.Tensor, scale: torch.Tensor, clip: bool,
                     inverse: bool) -> torch.Tensor:
    """Forward ``(x - offset) * scale`` (clipped to [-1, 1] when `clip`), or its inverse
    ``x / scale + offset``; per last-dim column, arithmetic in float32 at least."""
    acc = torch.promote_types(x.dtype, torch.float32)
    xf, o, s = x.to(acc), offset.to(acc), scale.to(acc)
    y = xf / s + o if inverse else (xf - o) * s
    if clip and not inverse:
        y = y.clamp(-1.0, 1.0)
    return y.to(x.dtype)
