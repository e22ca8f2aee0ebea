"""Fixtures for the data tests: small datasets in every supported format, written here."""

from __future__ import annotations

import numpy as np
import pytest
from data_episodes import make_episode


@pytest.fixture
def rng(seed):
    """NumPy generator from the test's seed (tests/conftest.py; ``--seed`` replays)."""
    return np.random.default_rng(seed)


@pytest.fixture
def episodes(rng):
    return [make_episode(i, rng) for i in range(5)]
