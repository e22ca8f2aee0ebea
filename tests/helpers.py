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


def seeded(seed: int | None = None) -> np.random.Generator:
    """A fresh generator per test: a new seed each run unless one is given (printed on failure)."""
    return np.random.default_rng(seed)
