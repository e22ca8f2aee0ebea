"""Fixtures for the view tests."""

from __future__ import annotations

import numpy as np
import pytest


@pytest.fixture
def rng(seed):
    """NumPy generator from the test's seed (tests/conftest.py; ``--seed`` replays)."""
    return np.random.default_rng(seed)
