"""Launch helpers shared by the Triton kernels."""

from __future__ import annotations

import torch
import triton
from triton.runtime import driver


def next_pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def tile_2d(rows: int, cols: int, *, max_cols: int, elements: int, min_rows: int = 16,
            max_rows: int = 256) -> tuple[int, int]:
    """Pick a (BLOCK_ROWS, BLOCK_COLS) power-of-two tile holding about `elements` values.

    Columns (the contiguous feature axis) get up to `max_cols` so loads stay wide and
    coalesced; rows fill the rest, bounded by the problem so small problems do not launch
    mostly-masked programs.
    """
    block_cols = min(next_pow2(cols), max_cols)
    block_rows = max(min_rows, min(max_rows, elements // block_cols, next_pow2(rows)))
    if block_rows * block_cols > 1 << 16:
        raise ValueError(f"tile {block_rows}x{block_cols} exceeds the 65536-element limit")
    return block_rows, block_cols


def rows_of(x: torch.Tensor, d: int, out: torch.Tensor | None
            ) -> tuple[torch.Tensor, torch.Tensor, int]:
    """For a row-wise kernel over `x [..., D]` seen as ``[N, D]``: x made contiguous, `out`
    (contiguous like x; allocated when None) and N (0: nothing to launch)."""
    if out is None:
        out = torch.empty_like(x, memory_format=torch.contiguous_format)
    return x.contiguous(), out, out.numel() // d if d else 0


def int_type(v: int) -> int:
    """Which integer type Triton passes `v` as (i32, u32, i64, u64 -> 0..3): a cached launch
    whose integer argument varies in value (a seed, ``do_not_specialize``) keys on it."""
    return (v >= 1 << 31) + (v >= 1 << 32) + (v >= 1 << 63) if v >= 0 else int(v < -(1 << 31)) * 2


__all__ = ["VERIFIED_TRITON", "CachedLaunch", "cdiv", "fast_launch_supported", "int_type",
           "next_pow2", "rows_of", "tile_2d", "triton"]


# Triton releases whose ``CompiledKernel.run`` signature `_launch_compiled` was written and
# measured against (the CI and the GPU image pin Triton 3.6); any other release launches every
# call through ``kernel[grid](...)``.
VERIFIED_TRITON = ((3, 6),)


def fast_launch_supported(version: str) -> bool:
    """Whether Triton `version` (e.g. ``"3.6.0"``) is one `CachedLaunch` may bypass binding on."""
    parts = version.split(".")
    try:
        major_minor = (int(parts[0]), int(parts[1]))
    except (IndexError, ValueError):
        return False
    return major_minor in VERIFIED_TRITON


_FAST_LAUNCH = fast_launch_supported(triton.__version__)
if _FAST_LAUNCH:  # `triton.knobs` (launch hooks) exists on the verified releases only
    from triton import knobs


class CachedLaunch:
    """Relaunch one Triton kernel signature without Triton's per-call argument binding.

    ``kernel[grid](*args)`` re-derives the specialization of every argument on every call:
    for the grouped interpolation kernel (~30 arguments per stream) that is 25-60 us of host
    time on the H100 host, the dominant cost of a launch-bound op. Within one launch plan the
    arguments differ between calls only in tensor addresses, and the one property of an
    address Triton specializes on is 16-byte alignment. So after a launch with every tensor
    aligned, this keeps the compiled kernel and calls it directly while that still holds;
    otherwise (or under TRITON_INTERPRET, where nothing is compiled, or on a Triton release
    outside `VERIFIED_TRITON`) it launches the normal way. Constexprs and integers must be
    fixed for the plan that owns this object: a launcher keeps one per launch key (a
    `robocache._plancache.PlanCache`) that determines the grid and every non-tensor argument.

    Args:
        kernel: the ``@triton.jit`` function.
        grid: the launch grid.
        consts: values of the kernel's trailing parameters (its constexprs, in signature
            order), appended to the arguments of every call.
        options: launch options such as ``num_warps``.
    """

    __slots__ = ("kernel", "grid", "grid3", "consts", "options", "compiled", "direct")
    # Decided once, at import, from the installed Triton's version.
    enabled = _FAST_LAUNCH

    def __init__(self, kernel, grid: tuple[int, ...], consts: tuple = (), **options):
        self.kernel, self.grid, self.consts, self.options = kernel, grid, consts, options
        self.grid3 = (*grid, 1, 1)[:3]
        self.compiled = self.direct = None

    def __call__(self, args: tuple, tensors: tuple) -> None:
        """Launch with `args` (the kernel's leading parameters, in order; `consts` follow);
        `tensors` lists every tensor among them (for the alignment check)."""
        aligned = True
        for t in tensors:
            if t.data_ptr() & 15:
                aligned = False
                break
        compiled = self.compiled
        if self.consts:
            args = args + self.consts
        if aligned and compiled is not None:
            _launch_compiled(compiled, self.grid3, args, self.direct)
            return
        result = self.kernel[self.grid](*args, **self.options)
        if aligned and CachedLaunch.enabled and hasattr(result, "packed_metadata"):
            self.compiled, self.direct = result, _direct_launcher(result)


def _direct_launcher(compiled) -> tuple | None:
    """``(launch, cooperative grid, PDL)`` of a compiled kernel's Triton 3.6 CUDA launcher
    when the kernel needs no global or profile scratch: then ``compiled.run(...)`` only
    forwards to the compiled ``launch`` with those flags and two null scratch pointers, and a
    cached launch calls it directly. None (other launchers, or scratch to allocate per
    launch): go through ``run``."""
    try:
        run = compiled.run
        if run.global_scratch_size == 0 and run.profile_scratch_size == 0:
            return run.launch, run.launch_cooperative_grid, run.launch_pdl
    except AttributeError:
        pass
    return None


_RAW_STREAM = getattr(torch._C, "_cuda_getCurrentRawStream", None)
_DEVICE = getattr(torch._C, "_cuda_getDevice", None)


def _current_stream() -> int:
    """The current device's current CUDA stream, as Triton's driver finds it for a launch
    (``torch.cuda.current_device()``, then torch's raw stream of that device) without
    ``current_device``'s lazy-initialization check: a compiled kernel exists, so CUDA is up."""
    if _RAW_STREAM is None or _DEVICE is None:  # builds without these bindings
        drv = driver.active
        return drv.get_current_stream(drv.get_current_device())
    return _RAW_STREAM(_DEVICE())


def _launch_compiled(compiled, grid: tuple[int, int, int], args: tuple,
                     direct: tuple | None = None) -> None:
    """What ``JITFunction.run`` does after binding, for an already-compiled kernel. The launch
    metadata exists for Triton's launch hooks; while no hook is attached (empty hook chains,
    as without a profiler) the launcher passes None to them, which they never read. `direct`:
    `_direct_launcher` of the compiled kernel's launcher."""
    stream = _current_stream()
    hooks = knobs.runtime
    enter, leave = hooks.launch_enter_hook, hooks.launch_exit_hook
    meta = compiled.launch_metadata(grid, stream, *args) \
        if getattr(enter, "calls", enter) or getattr(leave, "calls", leave) else None
    if direct is None:
        compiled.run(grid[0], grid[1], grid[2], stream, compiled.function,
                     compiled.packed_metadata, meta, enter, leave, *args)
    else:
        launch, cooperative, pdl = direct
        launch(grid[0], grid[1], grid[2], stream, compiled.function, cooperative, pdl, None,
               None, compiled.packed_metadata, meta, enter, leave, *args)
