"""Observability: Prometheus metrics, an exporter and pushgateway, structured logs, NVTX ranges.

    from robocache.observability import start_exporter
    start_exporter(9100)        # robocache_* metrics at :9100/metrics while training runs

Modules: :mod:`~robocache.observability.metrics` (what is measured, free when off),
:mod:`~robocache.observability.exporter` (HTTP exporter, :class:`Pusher`, :func:`observe` for
commands), :mod:`~robocache.observability.logs` (JSON/text events),
:mod:`~robocache.observability.nvtx` (profiler ranges). Nothing heavy is imported until used.
"""

from __future__ import annotations

from typing import Any

_LAZY = {"start_exporter": "exporter", "Pusher": "exporter", "observe": "exporter",
         "enable": "metrics", "disable": "metrics", "set_copy_ceiling": "metrics"}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
