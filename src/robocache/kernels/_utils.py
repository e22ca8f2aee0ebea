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


__all__ = ["cdiv", "next_pow2", "tile_2d", "triton"]
