"""The few exception types RoboCache users catch.

Every message is a complete sentence that names the argument, what was expected, what came,
and how to fix it.
"""

from __future__ import annotations

__all__ = [
    "RoboCacheError",
    "ShapeError",
    "DTypeError",
    "DeviceError",
    "DataError",
    "URDFError",
    "CacheBusyError",
    "MissingDependencyError",
    "ClusterError",
]


class RoboCacheError(Exception):
    """Base class of every error RoboCache raises on purpose."""


class ShapeError(RoboCacheError, ValueError):
    """A tensor has the wrong number of dimensions or sizes that disagree."""


class DTypeError(RoboCacheError, TypeError):
    """A tensor has a dtype the operation does not accept."""


class DeviceError(RoboCacheError, ValueError):
    """Tensors that must share a device do not, or a device-only feature was asked of the CPU."""


class DataError(RoboCacheError, ValueError):
    """Values are invalid: NaN or decreasing timestamps, lengths out of range, bad episodes."""


class URDFError(DataError):
    """A robot description that cannot be turned into a kinematic chain."""


class CacheBusyError(RoboCacheError, RuntimeError):
    """Another process is writing the cache (one writer per cache; the message names it)."""


class MissingDependencyError(RoboCacheError, ImportError):
    """An optional extra is needed; the message gives the pip command that installs it."""

    def __init__(self, package: str, extra: str, feature: str):
        super().__init__(
            f"{feature} needs the optional package '{package}', which is not installed. "
            f"Install it with: pip install 'robocache[{extra}]'"
        )
        self.package, self.extra, self.feature = package, extra, feature

    def __reduce__(self):  # raised in a worker process, it reaches the parent whole
        return type(self), (self.package, self.extra, self.feature)


class ClusterError(RoboCacheError, ConnectionError):
    """A compute cluster (Ray) does not answer at the address given."""


def picklable(e: BaseException) -> BaseException:
    """``e`` where it survives pickling (to be raised in another process), else a
    :class:`DataError` carrying its type and text."""
    import pickle

    try:
        pickle.loads(pickle.dumps(e))
        return e
    except Exception:
        return DataError(f"{type(e).__name__}: {e}")
