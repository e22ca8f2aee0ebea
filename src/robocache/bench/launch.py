"""Host-overhead baselines: replay exactly the Triton launch an op makes, with nothing else."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from robocache.kernels._utils import CachedLaunch


def bare_launch(call: Callable[[], Any]) -> Callable[[], Any]:
    """Run `call` once while recording its (first) kernel launch; return a closure repeating
    that launch through Triton's standard ``kernel[grid](*args)`` path (same grid, arguments,
    constexprs): the floor an op's eager path is compared with."""
    captured = []
    original = CachedLaunch.__call__

    def record(self, args, tensors):
        captured.append((self, args))
        return original(self, args, tensors)

    CachedLaunch.__call__ = record
    try:
        call()
    finally:
        CachedLaunch.__call__ = original
    if not captured:
        raise RuntimeError("the call launched no kernel through CachedLaunch")
    launcher, args = captured[0]
    return lambda: launcher.kernel[launcher.grid](*args, **launcher.kwargs)
