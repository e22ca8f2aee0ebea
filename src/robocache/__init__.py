"""RoboCache: a GPU data engine for robot-learning training.

Public ops are imported lazily so that ``import robocache`` (and ``robocache info``) stays
cheap: torch and Triton load on first use of an op.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# name -> module that defines it
_LAZY = {
    "resample": "robocache.ops.resample",
    "align": "robocache.ops.align",
    "Stream": "robocache.ops.align",
    "Aligned": "robocache.ops.align",
    "windows": "robocache.ops.windows",
    "Windows": "robocache.ops.windows",
    "key_windows": "robocache.ops.windows",
    "normalize": "robocache.ops.normalize",
    "compute_stats": "robocache.ops.normalize",
    "merge_stats": "robocache.ops.normalize",
    "Stats": "robocache.ops.normalize",
    "Normalizer": "robocache.ops.normalize",
    "Pipeline": "robocache.ops.pipeline",
    "depth_to_points": "robocache.ops.pointcloud",
    "voxelize": "robocache.ops.pointcloud",
    "depth_to_voxels": "robocache.ops.pointcloud",
    "image_transform": "robocache.ops.image",
    "sample_image_transforms": "robocache.ops.image",
    "ImageTransformsConfig": "robocache.ops.image",
    "ImageTransformParams": "robocache.ops.image",
    "RobotDataset": "robocache.data.dataset",
    "RobotLoader": "robocache.data.loader",
    "MixedDataset": "robocache.data.loader",
    "EpochSampler": "robocache.data.sampler",
    "LeRobotDataset": "robocache.data.lerobot_dataset",
    "Observer": "robocache.online",
    "LeRobotDatasetMetadata": "robocache.data.lerobot_meta",
    "MultiLeRobotDataset": "robocache.data.lerobot_dataset",
}

# submodules loaded on first attribute access (robocache.kinematics.fk, robocache.geometry...)
_SUBMODULES = ("kinematics", "geometry", "augment", "cache", "online")

__all__ = ["__version__", *_LAZY, *_SUBMODULES]

if TYPE_CHECKING:  # pragma: no cover
    from robocache.ops.pointcloud import depth_to_points, depth_to_voxels, voxelize  # noqa: F401
    from robocache.ops.resample import resample  # noqa: F401


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(f"robocache.{name}")
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'robocache' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
