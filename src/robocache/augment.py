"""Trajectory augmentation: ``robocache.augment.sample_rigid`` / ``rigid_transform``,
``add_noise``, ``sample_time_warp`` / ``time_warp``, ``smooth``, ``sample_dropout`` /
``drop_streams`` (parameters sampled separately from applying them, so a batch replays).

See :mod:`robocache.ops.augment` and docs/pipeline.md.
"""

from robocache.ops.augment import *  # noqa: F403
from robocache.ops.augment import __all__  # noqa: F401
