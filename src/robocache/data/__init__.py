"""The data path: formats → episodes → Lance cache → windows → GPU batches.

- :mod:`robocache.data.formats`: readers (LeRobot v2.1/v3.0, zarr ReplayBuffer, robomimic HDF5).
- :mod:`robocache.data.cache`: ``build`` a training cache (aligned, stats, manifest).
- :class:`RobotDataset`, :class:`RobotLoader`, :class:`MixedDataset`: serve it.

The classes load on first use, so that the modules a cache's reader process needs
(:mod:`robocache.data.location`, :mod:`robocache.data.served`) import without torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_LAZY = {"RobotDataset": "robocache.data.dataset", "RobotLoader": "robocache.data.loader",
         "MixedDataset": "robocache.data.loader"}

__all__ = ["RobotDataset", "RobotLoader", "MixedDataset"]

if TYPE_CHECKING:  # pragma: no cover
    from robocache.data.dataset import RobotDataset  # noqa: F401
    from robocache.data.loader import MixedDataset, RobotLoader  # noqa: F401


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'robocache.data' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
