"""Host-overhead baselines: replay exactly the Triton launch an op makes, with nothing else."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from triton.runtime.jit import JITFunction

from robocache.kernels._utils import CachedLaunch


def bare_launch(call: Callable[[], Any]) -> Callable[[], Any]:
    """Run `call` once while recording its first kernel launch; return a closure repeating
    that launch through Triton's standard ``kernel[grid](*args)`` path (same grid, arguments,
    constexprs): the floor an op's eager path is compared with.

    Launches through `CachedLaunch` (which may skip Triton's binding once compiled) and plain
    ``kernel[grid](...)`` launches are both recorded; an op that launches several kernels is
    compared with its first.
    """
    cached, plain = [], []
    original_cached, original_run = CachedLaunch.__call__, JITFunction.run

    def record_cached(self, args, tensors):
        cached.append((self.kernel, self.grid, args + self.consts, self.options))
        return original_cached(self, args, tensors)

    def record_run(self, *args, grid, warmup, **kwargs):
        plain.append((self, grid, args, kwargs))
        return original_run(self, *args, grid=grid, warmup=warmup, **kwargs)

    CachedLaunch.__call__, JITFunction.run = record_cached, record_run
    try:
        call()
    finally:
        CachedLaunch.__call__, JITFunction.run = original_cached, original_run
    if not (cached or plain):
        raise RuntimeError("the call launched no Triton kernel")
    kernel, grid, args, kwargs = (cached or plain)[0]
    return lambda: kernel[grid](*args, **kwargs)
