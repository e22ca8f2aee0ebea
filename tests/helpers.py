"""Shared test utilities: dtype-keyed tolerances and poisoned outputs."""

from __future__ import annotations

import numpy as np
import torch

# (rtol, atol) for results stored in each dtype, against a float64 oracle.
TOL = {
    torch.float64: (1e-10, 1e-10),
    torch.float32: (1e-5, 1e-5),
    torch.float16: (2e-3, 2e-3),
    torch.bfloat16: (1.6e-2, 1.6e-2),
}


def assert_close(actual: torch.Tensor, expected, dtype: torch.dtype | None = None, scale=1.0):
    """Compare with the tolerance of `dtype` (default: actual's), NaNs must match."""
    rtol, atol = TOL[dtype or actual.dtype]
    exp = torch.as_tensor(np.asarray(expected), dtype=torch.float64)
    act = actual.detach().to("cpu", torch.float64)
    torch.testing.assert_close(act, exp, rtol=rtol, atol=atol * scale, equal_nan=True)


_SEED = {"value": 0, "calls": 0}


def use_seed(value: int) -> None:
    """Set the current test's seed (called by the autouse ``seed`` fixture of conftest.py)."""
    _SEED.update(value=value, calls=0)


def seeded(seed: int | None = None) -> np.random.Generator:
    """A generator derived from the test's seed (``--seed``; printed when the test fails): each
    call in a test gives the next independent stream; an explicit ``seed`` overrides."""
    if seed is not None:
        return np.random.default_rng(seed)
    _SEED["calls"] += 1
    return np.random.default_rng([_SEED["value"], _SEED["calls"]])


def assert_quantiles_within_bin(stats: dict, rows: np.ndarray) -> None:
    """A ``stats.json`` entry's q01/q99 against NumPy's exact quantiles of ``rows`` ``[N, D]``:
    read off the histogram, they are within one bin of the sample's neighbouring order
    statistics (the exact quantile interpolates between two of them)."""
    width = 2.0 ** np.asarray(stats["histogram"]["exponent"])
    ordered = np.sort(rows, 0)
    for q in (0.01, 0.99):
        rank = (len(rows) - 1) * q
        lo, hi = ordered[int(np.floor(rank))], ordered[int(np.ceil(rank))]
        got = np.asarray(stats[f"q{round(q * 100):02d}"])
        assert np.all((got >= lo - width - 1e-12) & (got <= hi + width + 1e-12)), (q, got, lo, hi)


def assert_same_stats(a: dict, b: dict) -> None:
    """Two ``stats.json`` dicts: the same streams and counts, mean and std to float64 rounding
    (merged in different parts), the rest (extremes, histogram quantiles) equal."""
    assert a.keys() == b.keys()
    for name in a:
        assert a[name]["count"] == b[name]["count"]
        for k in ("mean", "std"):
            np.testing.assert_allclose(a[name][k], b[name][k], rtol=1e-12, atol=1e-12)
        for k in ("min", "max", "q01", "q99", "histogram", "exact_quantiles"):
            assert a[name][k] == b[name][k], k
