"""The Lance training cache: ``robocache.cache.build(source, dest, CacheConfig(rate_hz=50))``.

See :mod:`robocache.data.cache` and docs/data.md.
"""

from robocache.data.cache import CacheConfig, build

__all__ = ["CacheConfig", "build"]
