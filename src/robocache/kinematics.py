"""Robot kinematics on the GPU: ``robocache.kinematics.Chain``, ``fk``, ``jacobian``, ``ik``.

See :mod:`robocache.ops.kinematics` and docs/kinematics.md.
"""

from robocache.ops.kinematics import *  # noqa: F403
from robocache.ops.kinematics import __all__  # noqa: F401
