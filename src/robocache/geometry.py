"""Rotations, rigid transforms and relative actions: ``robocache.geometry.quat_to_matrix`` etc.

Quaternions are wxyz everywhere; see :mod:`robocache.ops.geometry` for every convention.
"""

from robocache.ops.geometry import *  # noqa: F403
from robocache.ops.geometry import __all__  # noqa: F401
