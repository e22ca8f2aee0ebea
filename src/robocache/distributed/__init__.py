"""Scale-out: the cache build as a Ray Data pipeline, and merging shard caches.

``preprocess`` needs the ``ray`` extra (``pip install 'robocache[ray]'``); ``merge`` does not.
"""

from __future__ import annotations

from robocache.distributed.merge import merge
from robocache.distributed.preprocess import preprocess

__all__ = ["merge", "preprocess"]
