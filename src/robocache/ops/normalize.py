"""Per-dimension statistics (one pass, mergeable) and normalization per key, forward and inverse.

    >>> stats = compute_stats(actions)                  # [N, D] or [..., D]
    >>> stats = merge_stats([compute_stats(c) for c in chunks])   # across chunks / workers
    >>> norm = Normalizer({"action": stats}, modes={"action": "min_max"})
    >>> batch = norm(batch); actions = norm.inverse({"action": pred})["action"]

Every mode is the affine map ``y = (x - offset) * scale`` per dimension:

=========== ============================ ===============================================
mode        offset                       scale
=========== ============================ ===============================================
mean_std    mean                         1 / std   (population std, ddof = 0)
min_max     (min + max) / 2              2 / (max - min)       -> [-1, 1]
quantile    (q01 + q99) / 2              2 / (q99 - q01), then clipped to [-1, 1]
identity    0                            1
=========== ============================ ===============================================

Zero variance: a dimension whose spread (std, max - min or q99 - q01) is below `eps`
(default ``EPS = 1e-6``, in the data's units) keeps scale 1 and is only centred, so a constant
dimension maps to 0 and back exactly instead of dividing by ~0.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from robocache._plancache import PlanCache
from robocache.errors import DataError, ShapeError
from robocache.observability import nvtx
from robocache.ops._checks import FLOAT_DTYPES, check_choice, check_dtype, check_fits, fail
from robocache.ops._dispatch import Op, launches_directly
from robocache.ops._shared import affine, affine_into
from robocache.reference import normalize as ref

MODES = ("mean_std", "min_max", "quantile", "identity")
EPS = 1e-6
DEFAULT_BINS = 1024
_OP = "normalize"


def _derived_cache() -> PlanCache:
    """What `normalize` derives from one `Stats` (a few modes, devices and dtypes)."""
    return PlanCache(64)


@dataclass(frozen=True)
class Stats:
    """Per-dimension statistics of a `[N, D]` sample (float64 tensors `[D]` on the CPU).

    Attributes:
        count: number of rows N reduced.
        mean, std: mean and population standard deviation (ddof = 0).
        min, max: extremes.
        q01, q99: 1st and 99th percentiles. Exact (numpy 'linear') when `exact_quantiles`;
            after a merge, read off the merged dyadic histogram: the error is at most one bin
            width ``2**hist_exponent`` per dimension, which is below ``2 (max - min) / (bins - 1)``,
            plus the gap between the two order statistics the exact quantile interpolates.
        hist_exponent, hist_origin, hist_counts: the dyadic histogram that makes stats mergeable:
            bin j of dimension d covers ``[(origin + j) 2**e, (origin + j + 1) 2**e)``;
            counts are int64 `[D, bins]`.
        exact_quantiles: whether q01/q99 are exact (one pass) or histogram estimates (merged).
        relative: for statistics of relative action chunks, the transform and chunk offsets
            they were computed under (:meth:`robocache.data.relative.KeySpec.tag`); None for
            statistics of the values as stored.

    Treat it as immutable (do not write into its tensors): the normalization parameters derived
    from it are cached on it, per device.
    """

    count: int
    mean: torch.Tensor
    std: torch.Tensor
    min: torch.Tensor
    max: torch.Tensor
    q01: torch.Tensor
    q99: torch.Tensor
    hist_exponent: torch.Tensor
    hist_origin: torch.Tensor
    hist_counts: torch.Tensor
    exact_quantiles: bool = True
    relative: str | None = None
    # (mode, eps, device, arithmetic dtype) -> (offset, scale, clip) on that device: `Stats` is
    # immutable, so what `normalize` derives from it is made once per device, not per call
    _derived: PlanCache = field(default_factory=_derived_cache, init=False,
                                repr=False, compare=False)

    def __getstate__(self) -> dict[str, Any]:  # pickled without the per-device cache
        return {k: v for k, v in self.__dict__.items() if k != "_derived"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, _derived=_derived_cache())

    @property
    def dim(self) -> int:
        return int(self.mean.shape[0])

    @property
    def bins(self) -> int:
        return int(self.hist_counts.shape[1])

    def merge(self, other: Stats) -> Stats:
        """Statistics of the union of both samples (see `merge_stats`)."""
        return merge_stats([self, other])

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (lists of floats/ints); `Stats.from_dict` inverts it exactly."""
        d: dict[str, Any] = {"count": self.count, "exact_quantiles": self.exact_quantiles}
        for k in ("mean", "std", "min", "max", "q01", "q99"):
            d[k] = getattr(self, k).tolist()
        d["histogram"] = {"exponent": self.hist_exponent.tolist(),
                          "origin": self.hist_origin.tolist(),
                          "counts": self.hist_counts.tolist()}
        if self.relative is not None:
            d["relative"] = self.relative
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Stats:
        h = d["histogram"]
        f64 = {k: torch.tensor(d[k], dtype=torch.float64)
               for k in ("mean", "std", "min", "max", "q01", "q99")}
        return cls(count=int(d["count"]), **f64,
                   hist_exponent=torch.tensor(h["exponent"], dtype=torch.int64),
                   hist_origin=torch.tensor(h["origin"], dtype=torch.int64),
                   hist_counts=torch.tensor(h["counts"], dtype=torch.int64),
                   exact_quantiles=bool(d["exact_quantiles"]), relative=d.get("relative"))


@nvtx.annotate("robocache.compute_stats")
def compute_stats(x: torch.Tensor, *, bins: int = DEFAULT_BINS,
                  exact_quantiles: bool = True) -> Stats:
    """Per-dimension statistics of `x` in one call: mean, std, min, max, q01, q99 (+ histogram).

    Args:
        x: `[..., D]` float tensor (any device); all leading dims are samples (N = numel / D).
        bins: histogram bins per dimension kept for merging (>= 2); the merged-quantile error
            bound scales as 2 (max - min) / (bins - 1).
        exact_quantiles: q01/q99 exact (numpy's 'linear' interpolation, one more pass over the
            samples of their bins), or read off the histogram as `merge_stats` reads them
            (for parts to be merged: the merged quantiles are the same either way, and the
            same however the samples were split into parts).

    Returns:
        `Stats` with float64 CPU tensors.

    Raises:
        DTypeError: `x` is not floating point.
        ShapeError: `x` has no last dim or no rows.
        DataError: `x` holds NaN or infinity (checked always: the stats come back to the host
            anyway, so the check adds no extra sync of note).

    Example:
        >>> s = compute_stats(torch.randn(1000, 7))
        >>> s.q99.shape
        torch.Size([7])
    """
    check_dtype("compute_stats", "x", x, FLOAT_DTYPES, "Convert with x.float().")
    if x.dim() < 1 or x.shape[-1] == 0 or x.numel() == 0:
        fail("compute_stats", f"`x` must be [..., D] with D >= 1 and at least one row; got "
             f"shape {list(x.shape)}.")
    if bins < 2:
        fail("compute_stats", f"`bins` must be >= 2; got {bins}.", ValueError)
    x2 = x.reshape(-1, x.shape[-1])
    n, d = x2.shape
    # the histogram counts (and their scatter), a transposed copy to partially sort, a float64 copy
    check_fits("compute_stats", f"`bins` = {bins:,} histogram bins x {d} dims over `x` [{n}, {d}]",
               d * int(bins) * 16 + n * d * (x.element_size() + 24), x.device,
               "lower `bins` (the default is enough for merged quantiles), or pass `x` in parts "
               "and merge_stats them.")
    names = ("mean", "std", "min", "max", "q01", "q99", "hist_exponent", "hist_origin",
             "hist_counts")
    cpu = {k: v.cpu() for k, v in zip(names, _STATS(x2, int(bins), bool(exact_quantiles)),
                                      strict=True)}
    return Stats(count=x2.shape[0], **cpu, exact_quantiles=bool(exact_quantiles))


def _stats_impl(x: torch.Tensor, bins: int, exact: bool
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                           torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """`compute_stats` of validated ``x [N, D]`` on x's device: mean, std, min, max, q01, q99
    (float64 ``[D]``; the quantiles ``exact`` or from the histogram), histogram exponent and
    origin (int64 ``[D]``), counts (int64 ``[D, bins]``). Checks finiteness (the statistics
    come back to the host anyway)."""
    xt = x.t().contiguous()  # one dimension per row: every pass along contiguous memory
    lo, hi = xt.amin(1), xt.amax(1)  # (NaN propagates, infinity stays)
    if not bool(torch.isfinite(lo).all() & torch.isfinite(hi).all()):
        row = int((~torch.isfinite(x)).any(1).nonzero()[0])
        fail("compute_stats", f"`x` holds NaN or infinity (first at flattened row {row}); "
             "drop or repair those samples before computing statistics.", DataError)
    n = x.shape[0]
    lo, hi = lo.double(), hi.double()
    e = ref.fit_exponent(lo, hi, bins)
    origin = ref.grid_index(lo, e)
    mean, std, local, counts = ref.moments_histogram(xt, e, origin, bins)
    if exact:
        ranks = [r for r in ref.quantile_ranks(n, (0.01, 0.99)) if r not in (0, n - 1)]
        rows = {0: lo, n - 1: hi, **ref.order_statistics(xt, ranks, local, counts)}
        q01, q99 = ref.quantiles_exact(rows, n, (0.01, 0.99))
    else:
        q01, q99 = (ref.hist_quantile(counts, e, origin, q, lo, hi) for q in (0.01, 0.99))
    return mean, std, lo, hi, q01, q99, e, origin, counts


def _stats_fake(x, bins, exact):
    d = x.shape[-1]
    f64 = [x.new_empty(d, dtype=torch.float64) for _ in range(6)]
    i64 = [x.new_empty(d, dtype=torch.int64) for _ in range(2)]
    return (*f64, *i64, x.new_empty((d, bins), dtype=torch.int64))


# Partial sort, moments and histogram are PyTorch on every device (no Triton kernel of its own).
_STATS = Op("compute_stats", cpu=_stats_impl, cuda=_stats_impl, fake=_stats_fake)


def merge_stats(parts: Iterable[Stats]) -> Stats:
    """Statistics of the union of several samples (chunks of a dataset, workers).

    count/mean/std/min/max are exact (Chan's parallel variance in float64). q01/q99 come from
    the merged dyadic histogram: every part is re-binned once to the coarsest width that covers
    the union (exact on counts), so the error bound of `Stats` holds however many parts and in
    whichever order they are merged.

    Raises:
        ValueError: no parts.
        ShapeError: parts with different D or different bin counts.

    Example:
        >>> s = merge_stats([compute_stats(a), compute_stats(b)])
    """
    parts = list(parts)
    if not parts:
        fail("merge_stats", "`parts` is empty; pass at least one Stats.", ValueError)
    if len(parts) == 1:
        return parts[0]
    d, bins = parts[0].dim, parts[0].bins
    for i, p in enumerate(parts):
        if p.dim != d or p.bins != bins:
            fail("merge_stats", f"part {i} has D = {p.dim} and {p.bins} bins but part 0 has "
                 f"D = {d} and {bins} bins; merge statistics of the same key computed with the "
                 "same `bins`.")
    n = torch.tensor([float(p.count) for p in parts], dtype=torch.float64)[:, None]
    means = torch.stack([p.mean for p in parts])
    total = n.sum()
    mean = (n * means).sum(0) / total
    m2 = (n * (torch.stack([p.std for p in parts]) ** 2 + (means - mean) ** 2)).sum(0)
    lo = torch.stack([p.min for p in parts]).amin(0)
    hi = torch.stack([p.max for p in parts]).amax(0)
    floor = torch.stack([p.hist_exponent for p in parts]).amax(0)
    e = ref.fit_exponent(lo, hi, bins, floor)
    origin = ref.grid_index(lo, e)
    counts = sum(ref.rebin(p.hist_counts, p.hist_exponent, p.hist_origin, e, origin)
                 for p in parts)
    q01 = ref.hist_quantile(counts, e, origin, 0.01, lo, hi)
    q99 = ref.hist_quantile(counts, e, origin, 0.99, lo, hi)
    tags = {p.relative for p in parts}  # statistics of one transform stay tagged with it
    return Stats(count=int(total), mean=mean, std=(m2 / total).sqrt(), min=lo, max=hi,
                 q01=q01, q99=q99, hist_exponent=e, hist_origin=origin, hist_counts=counts,
                 exact_quantiles=False, relative=tags.pop() if len(tags) == 1 else None)


def affine_params(stats: Stats, mode: str, *, eps: float = EPS) -> tuple[torch.Tensor,
                                                                        torch.Tensor, bool]:
    """(offset [D], scale [D], clip) in float64 for `mode` (see the module docstring)."""
    check_choice(_OP, "mode", mode, MODES)
    if eps < 0:
        fail(_OP, f"`eps` must be >= 0; got {eps}.", ValueError)
    if mode == "identity":
        return torch.zeros(stats.dim, dtype=torch.float64), torch.ones(
            stats.dim, dtype=torch.float64), False
    if mode == "mean_std":
        center, spread = stats.mean, stats.std
    elif mode == "min_max":
        center, spread = (stats.min + stats.max) / 2, (stats.max - stats.min) / 2
    else:
        center, spread = (stats.q01 + stats.q99) / 2, (stats.q99 - stats.q01) / 2
    full = spread if mode == "mean_std" else 2 * spread
    scale = torch.where(full < eps, torch.ones_like(spread), 1 / spread.clamp_min(1e-300))
    return center.clone(), scale, mode == "quantile"


def _params_on(stats: Stats, mode: str, eps: float, device: torch.device,
               dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """`affine_params` on `device` in the arithmetic dtype for `dtype` (float64 for float64,
    else float32), derived once per (stats, mode, eps, device, dtype) and kept on `stats`."""
    acc = torch.float64 if dtype == torch.float64 else torch.float32
    key = (mode, eps, device, acc)
    hit = stats._derived.get(key)
    if hit is None:
        offset, scale, clip = affine_params(stats, mode, eps=eps)
        hit = stats._derived.put(key, (offset.to(device, acc), scale.to(device, acc), clip))
    return hit


def _apply(x: torch.Tensor, offset: torch.Tensor, scale: torch.Tensor, clip: bool,
           inverse: bool, out: torch.Tensor | None, name: str) -> torch.Tensor:
    check_dtype(_OP, name, x, FLOAT_DTYPES, f"Convert with {name}.float().")
    d = offset.shape[0]
    if x.dim() < 1 or x.shape[-1] != d:
        fail(_OP, f"`{name}` must be [..., D] with D = {d} (the statistics' width); got shape "
             f"{list(x.shape)}. Pass the statistics computed for this key.", ShapeError)
    if out is not None and (out.shape != x.shape or out.dtype != x.dtype
                            or out.device != x.device):
        fail(_OP, f"`out` must match `{name}` (shape {list(x.shape)}, {x.dtype}, {x.device}); "
             f"got shape {list(out.shape)}, {out.dtype}, {out.device}.")
    if out is not None and out.is_contiguous() and launches_directly(x):
        return affine_into(x, offset, scale, clip, inverse, out)
    y = affine(x, offset, scale, clip, inverse)
    return y if out is None else out.copy_(y)


@nvtx.annotate("robocache.normalize")
def normalize(x: torch.Tensor, stats: Stats, mode: str = "mean_std", *, inverse: bool = False,
              eps: float = EPS, out: torch.Tensor | None = None) -> torch.Tensor:
    """Normalize `x` with per-dimension `stats` (or undo it with ``inverse=True``).

    Args:
        x: `[..., D]` float16/bfloat16/float32/float64 tensor; D = `stats.dim`.
        stats: `Stats` of this key (from `compute_stats` / `merge_stats`).
        mode: 'mean_std', 'min_max' (to [-1, 1]), 'quantile' (q01..q99 to [-1, 1], clipped) or
            'identity'.
        inverse: map normalized values back to data units (e.g. predicted actions). The
            quantile clip is not invertible: values beyond [q01, q99] come back at the bounds.
        eps: dimensions whose spread is below `eps` are only centred (see the module docstring).
        out: optional output like `x`.

    Returns:
        Tensor like `x` (same shape, dtype, device); arithmetic in float32 (float64 for float64).

    Raises:
        DTypeError: `x` is not floating point.
        ShapeError: the last dim of `x` differs from `stats.dim`, or `out` does not match.
        ValueError: unknown `mode` or negative `eps`.

    Example:
        >>> s = compute_stats(a)
        >>> normalize(a, s, "min_max").amax() <= 1
        tensor(True)
    """
    if not isinstance(x, torch.Tensor):
        fail(_OP, f"`x` must be a torch.Tensor; got {type(x).__name__}.", TypeError)
    offset, scale, clip = _params_on(stats, mode, eps, x.device, x.dtype)
    return _apply(x, offset, scale, clip, inverse, out, "x")


class Normalizer:
    """Normalization per key of a batch dict, forward and inverse, parameters cached per device.

    Args:
        stats: key -> `Stats`.
        modes: one mode for every key, or key -> mode (keys of `stats` missing here use
            'mean_std'); see `normalize`.
        eps: zero-spread threshold (see the module docstring).

    Keys of a batch without stats pass through unchanged; keys with stats missing from a batch
    are skipped (a batch of predicted actions only is fine).

    Raises:
        ValueError: a mode for a key that has no stats, or an unknown mode.
        ShapeError: (at call) a tensor whose last dim differs from its stats.

    Example:
        >>> norm = Normalizer({"action": s}, "min_max")
        >>> norm({"action": a})["action"].shape == a.shape
        True
    """

    def __init__(self, stats: Mapping[str, Stats], modes: str | Mapping[str, str] = "mean_std",
                 *, eps: float = EPS):
        per_key = {k: modes for k in stats} if isinstance(modes, str) else dict(modes)
        unknown = sorted(set(per_key) - set(stats))
        if unknown:
            fail("Normalizer", f"`modes` names keys without statistics: {unknown}; add their "
                 f"Stats to `stats` (have: {sorted(stats)}).", ValueError)
        self.modes = {k: per_key.get(k, "mean_std") for k in stats}
        for k, s in stats.items():  # unknown modes and a negative eps fail here, not at call
            affine_params(s, self.modes[k], eps=eps)
        self.stats, self.eps = dict(stats), eps

    def params(self, key: str, device: torch.device, dtype: torch.dtype):
        """(offset, scale, clip) of `key` on `device` in the arithmetic dtype for `dtype`."""
        return _params_on(self.stats[key], self.modes[key], self.eps, device, dtype)

    def _run(self, batch: Mapping[str, torch.Tensor], inverse: bool) -> dict[str, torch.Tensor]:
        result = dict(batch)
        for key in self.stats.keys() & batch.keys():
            x = batch[key]
            o, s, clip = self.params(key, x.device, x.dtype)
            result[key] = _apply(x, o, s, clip, inverse, None, f"batch[{key!r}]")
        return result

    def __call__(self, batch: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Normalized copy of `batch` (a new dict; input tensors are not modified)."""
        return self._run(batch, False)

    def inverse(self, batch: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Back to data units (e.g. a policy's predicted actions)."""
        return self._run(batch, True)


__all__ = ["EPS", "MODES", "Normalizer", "Stats", "compute_stats", "merge_stats", "normalize",
           "affine_params"]
