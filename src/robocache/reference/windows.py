"""Pure-PyTorch window gather: the CPU path of `robocache.windows` and its kernel's oracle.

Row ``r = indices[m]`` lies in episode ``e`` (``offsets[e] <= r < offsets[e+1]``); window
entry k reads row ``r + rel[k]``. Rows outside the episode are padding (``is_pad``) and hold
the episode's edge row (``pad="edge"``) or zeros (``pad="zero"``).
"""

from __future__ import annotations

import torch


def episode_bounds(offsets: torch.Tensor, indices: torch.Tensor,
                   episodes: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(first row, one past the last row) of each index's episode, int64 [M]."""
    off = offsets.to(torch.int64)
    if episodes is None:
        episodes = torch.searchsorted(off, indices.to(torch.int64), right=True) - 1
    e = episodes.to(torch.int64)
    return off[e], off[e + 1]


def windows_ref(data: torch.Tensor, offsets: torch.Tensor, indices: torch.Tensor,
                rel: torch.Tensor, zero_pad: bool,
                episodes: torch.Tensor | None = None,
                bounds: tuple[torch.Tensor, torch.Tensor] | None = None,
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """values ``[M, K, D]`` and is_pad ``[M, K]`` for relative offsets ``rel [K]``
    (``bounds``: the indices' episode bounds when already known)."""
    lo, hi = bounds if bounds is not None else episode_bounds(offsets, indices, episodes)
    rows = indices.to(torch.int64)[:, None] + rel.to(torch.int64)[None, :]
    is_pad = (rows < lo[:, None]) | (rows >= hi[:, None])
    clamped = torch.minimum(torch.maximum(rows, lo[:, None]), hi[:, None] - 1)
    # index_select, not data[clamped]: PyTorch's CPU advanced indexing of a column slice
    # took 2.6 ms for 64 windows of 16 consecutive rows (11 us with index_select; 2-core CPU,
    # torch 2.13), the same values
    values = data.index_select(0, clamped.reshape(-1)).reshape(*clamped.shape, *data.shape[1:])
    if zero_pad:
        values = values.masked_fill(is_pad.unsqueeze(-1), 0)
    return values, is_pad


def key_windows_ref(data: torch.Tensor, offsets: torch.Tensor, indices: torch.Tensor,
                    columns: list[tuple[int, int]], rels: list[list[int]], zero_pad: bool,
                    episodes: torch.Tensor | None = None
                    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per key k: values ``[M, len(rels[k]), width_k]`` of columns ``columns[k] = (first,
    width)`` at row offsets ``rels[k]``, and is_pad ``[M, len(rels[k])]``."""
    bounds = episode_bounds(offsets, indices, episodes)
    return [windows_ref(data[:, c:c + w], offsets, indices, torch.tensor(rel, dtype=torch.int64),
                        zero_pad, bounds=bounds) for (c, w), rel in zip(columns, rels, strict=True)]
