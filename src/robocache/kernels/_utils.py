"""Launch helpers shared by the Triton kernels."""

from __future__ import annotations

import triton


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


__all__ = ["VERIFIED_TRITON", "CachedLaunch", "cdiv", "fast_launch_supported", "next_pow2",
           "tile_2d", "triton"]


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
    fixed for the plan that owns this object.
    """

    __slots__ = ("kernel", "grid", "kwargs", "compiled")
    # Decided once, at import, from the installed Triton's version.
    enabled = fast_launch_supported(triton.__version__)

    def __init__(self, kernel, grid: tuple[int, ...], **kwargs):
        self.kernel, self.grid, self.kwargs, self.compiled = kernel, grid, kwargs, None

    def __call__(self, args: tuple, tensors: tuple) -> None:
        """Launch with `args` (every kernel parameter, in order); `tensors` lists every
        tensor among them (for the alignment check)."""
        aligned = True
        for t in tensors:
            if t.data_ptr() & 15:
                aligned = False
                break
        compiled = self.compiled
        if aligned and compiled is not None:
            _launch_compiled(compiled, self.grid, args)
            return
        result = self.kernel[self.grid](*args, **self.kwargs)
        if aligned and CachedLaunch.enabled and hasattr(result, "packed_metadata"):
            self.compiled = result


def _launch_compiled(compiled, grid: tuple[int, ...], args: tuple) -> None:
    """What ``JITFunction.run`` does after binding, for an already-compiled kernel."""
    from triton import knobs
    from triton.runtime import driver

    drv = driver.active
    stream = drv.get_current_stream(drv.get_current_device())
    compiled.run(grid[0], grid[1] if len(grid) > 1 else 1, grid[2] if len(grid) > 2 else 1,
                 stream, compiled.function, compiled.packed_metadata,
                 compiled.launch_metadata(grid, stream, *args),
                 knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook, *args)
