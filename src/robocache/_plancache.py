"""The bounded cache behind the ops' metadata-keyed launch plans (`docs/design.md`)."""

from __future__ import annotations

from typing import Any


class PlanCache(dict):
    """Plans keyed by tensor metadata. A process sees few geometries; one that keeps changing
    them must not grow the cache without bound, so it empties when it reaches `limit`."""

    def __init__(self, limit: int = 1024):
        super().__init__()
        self.limit = limit

    def put(self, key: Any, plan: Any) -> Any:
        if len(self) >= self.limit:
            self.clear()
        self[key] = plan
        return plan
