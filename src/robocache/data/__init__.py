"""The data path: formats → episodes → Lance cache → windows → GPU batches.

- :mod:`robocache.data.formats`: readers (LeRobot v2.1/v3.0, zarr ReplayBuffer, robomimic HDF5).
- :mod:`robocache.data.cache`: ``build`` a training cache (aligned, stats, manifest).
- :class:`RobotDataset`, :class:`RobotLoader`, :class:`MixedDataset`: serve it.
"""

from __future__ import annotations

from robocache.data.dataset import RobotDataset
from robocache.data.loader import MixedDataset, RobotLoader

__all__ = ["RobotDataset", "RobotLoader", "MixedDataset"]
