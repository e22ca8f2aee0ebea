"""The one path from a public op to its implementation (`docs/design.md`, "Dispatch").

Every public op validates its arguments (host-side metadata checks, cached per geometry where
the op is launch-bound), then calls an `Op`: one registered ``torch.library.custom_op`` named
``robocache::<name>`` with a fake (meta) implementation, a CPU implementation (the PyTorch
reference) and a CUDA implementation (the Triton launcher).

- Eager: `Op.__call__` goes straight to the implementation for the device of its first
  argument: one Python call, no dispatcher (host time of an eager call is the product on the
  launch-bound sizes; ``benchmarks/bench_dispatch.py`` measures it against a bare launch).
- Traced (``torch.compile``): the call goes through the registered op, so the graph holds one
  opaque node whose output shapes come from the fake implementation.

The CUDA implementation is named by ``"module:function"`` and imported on the first CUDA call:
CPU-only processes never import Triton. An op whose kernel has no reference of the same output
layout (the voxelizers' packed buffers) passes ``cpu=None``: its launcher serves every device,
and CPU tensors reach it only under ``TRITON_INTERPRET=1`` (how the CPU test suite checks the
registration); the public function sends CPU tensors to the reference instead.

The cached-launch fast path of the Triton launchers (`robocache.kernels._utils.CachedLaunch`)
lives with the launchers, below this layer: kernels import nothing from ops.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

import torch

__all__ = ["OPS", "Op", "launches_directly"]

#: Every registered op by name (the opcheck tests walk it).
OPS: dict[str, Op] = {}


def launches_directly(t: torch.Tensor) -> bool:
    """Whether an op called on `t` launches its cached CUDA plan itself: an eager call on CUDA.

    The plan-cached ops (resample, align, key_windows) look their launch plan up by metadata
    key while validating; an eager CUDA call launches that plan through the same helper their
    op's CUDA implementation calls, without looking it up twice. Every other call (CPU,
    traced) goes through their `Op`.
    """
    return t.is_cuda and not torch.compiler.is_compiling()


class Op:
    """A registered robocache op and its eager fast path.

    Args:
        name: the op is ``torch.ops.robocache.<name>``.
        cpu: the CPU implementation; its type annotations give the op's schema. ``None``: the
            CUDA implementation serves every device (see the module docstring).
        cuda: the CUDA implementation, ``"module:function"`` (imported on first use) or a
            callable with the same signature as the schema.
        fake: output metadata from input metadata (``register_fake``).
        schema: explicit schema, for ops without a CPU implementation to infer it from.
    """

    __slots__ = ("name", "op", "cpu", "_cuda", "_cuda_ref")

    def __init__(self, name: str, *, cpu: Callable | None, cuda: str | Callable,
                 fake: Callable, schema: str | None = None):
        self.name = name
        self._cuda_ref = cuda
        self._cuda = None if isinstance(cuda, str) else cuda
        self.cpu = cpu if cpu is not None else self._call_cuda
        if schema is None:
            if cpu is None:
                raise ValueError(f"op {name!r} without a CPU implementation needs a schema")
            schema = torch.library.infer_schema(cpu, mutates_args=())
        self.op = torch.library.custom_op(f"robocache::{name}", self.cpu, mutates_args=(),
                                          schema=schema)
        if cpu is not None:
            self.op.register_kernel("cuda", self._call_cuda)
        self.op.register_fake(fake)
        OPS[name] = self

    def __call__(self, *args):
        if torch.compiler.is_compiling():
            return self.op(*args)
        if args[0].is_cuda:
            return (self._cuda or self.cuda())(*args)
        return self.cpu(*args)

    def cuda(self) -> Callable:
        """The CUDA implementation (imported on first use)."""
        if self._cuda is None:
            module, _, attr = self._cuda_ref.partition(":")
            self._cuda = getattr(importlib.import_module(module), attr)
        return self._cuda

    def _call_cuda(self, *args):
        return (self._cuda or self.cuda())(*args)
