"""Host-overhead baselines: replay exactly the Triton launch an op makes, with nothing else."""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any


class _Recorder:
    def __init__(self, kernel):
        self.kernel, self.captured = kernel, None

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.captured = (grid, args, kwargs)
            return self.kernel[grid](*args, **kwargs)
        return launch


def bare_launch(module: ModuleType, kernel_name: str, call: Callable[[], Any]) -> Callable[[], Any]:
    """Run `call` once while recording the launch of ``module.<kernel_name>``; return a
    closure that repeats that launch bare (same grid, arguments, constexprs), the floor an
    op's eager path is compared with."""
    kernel = getattr(module, kernel_name)
    recorder = _Recorder(kernel)
    setattr(module, kernel_name, recorder)
    try:
        call()
    finally:
        setattr(module, kernel_name, kernel)
    if recorder.captured is None:
        raise RuntimeError(f"{module.__name__}.{kernel_name} was not launched by the call")
    grid, args, kwargs = recorder.captured
    return lambda: kernel[grid](*args, **kwargs)
