"""Pure-PyTorch interpolation of one stream onto target times: the CPU path of
`robocache.resample` / `robocache.align` and the oracle for the Triton kernel.

Semantics (shared with `kernels/interp.py`), per row b with ``n = lengths[b]`` valid samples:

* ``cnt(x)`` = number of valid source times ``<= x``; the sample *at or before* x is
  ``i = cnt - 1`` (with repeated timestamps this is the last of the equal ones: the later
  sample wins at that instant).
* A target is *outside* when ``x < t[0]``, ``x > t[n-1]`` or x is NaN.
* ``linear``: segment ``seg = clamp(i, 0, n-2)``, weight ``w = (x - t[seg]) / (t[seg+1] -
  t[seg])`` (0 when the interval is empty), ``y = (1-w) y[seg] + w y[seg+1]`` — exact at
  source times. ``clamp`` clamps w to [0, 1] (holds the edges, as ``numpy.interp``);
  ``extrapolate`` keeps it (extends the first/last segment); ``nan`` writes NaN outside.
* ``nearest``: of ``seg`` and ``seg+1`` the closer one, ties to the earlier sample.
* ``previous``: sample ``clamp(i, 0, n-1)`` (zero-order hold); before the first sample,
  ``clamp``/``extrapolate`` hold the first value.
* ``frame_index``: the nearest sample's index; its offset ``t[idx] - x`` in seconds.
* Time differences are taken in the timestamps' dtype (float64 epoch seconds stay exact) and
  only then converted to the arithmetic dtype (float32, or float64 for float64 data).
"""

from __future__ import annotations

import torch

METHODS = ("linear", "nearest", "previous", "frame_index")
OUT_OF_RANGE = ("clamp", "nan", "extrapolate")


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def interp_ref(
    data: torch.Tensor | None,
    times: torch.Tensor,
    target: torch.Tensor,
    lengths: torch.Tensor | None,
    method: str,
    out_of_range: str = "clamp",
    tolerance_s: float | None = None,
) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor | None]:
    """Interpolate one stream. Batched, already-validated inputs.

    Args:
        data: ``[B, S, D]`` float (None for ``frame_index``).
        times: ``[B, S]`` float32/float64 seconds (rows may be expanded views).
        target: ``[B, T]`` float32/float64 seconds.
        lengths: ``[B]`` int in ``[1, S]`` or None (all S valid).
        method: one of `METHODS`.
        out_of_range: one of `OUT_OF_RANGE`.
        tolerance_s: ``frame_index`` only: targets whose nearest frame is farther are padded.

    Returns:
        ``(values, is_pad, aux)``: values ``[B, T, D]`` in data's dtype (``frame_index``:
        int64 ``[B, T]``); is_pad bool ``[B, T]``; aux float32 ``[B, T]`` — age in seconds
        for ``previous``, frame offset for ``frame_index``, else None.
    """
    B, S = times.shape
    tdt = torch.promote_types(times.dtype, target.dtype)
    t = times.to(tdt)
    x = target.to(tdt)
    if lengths is None:
        n = torch.full((B, 1), S, dtype=torch.int64, device=t.device)
    else:
        n = lengths.reshape(B, 1).to(torch.int64)
        t = torch.where(torch.arange(S, device=t.device) < n, t, torch.inf)
    cnt = torch.searchsorted(t.contiguous(), x.contiguous(), right=True)
    nanx = torch.isnan(x)
    i = cnt - 1
    seg = torch.minimum(i.clamp(min=0), (n - 2).clamp(min=0))
    seg1 = torch.minimum(seg + 1, n - 1)
    t0, t1 = t.gather(1, seg), t.gather(1, seg1)
    t_last = t.gather(1, n - 1)
    outside = (cnt == 0) | (x > t_last) | nanx

    aux = None
    if method == "linear":
        ct = compute_dtype(data.dtype)
        h = (t1 - t0).to(ct)
        w = torch.where(h > 0, (x - t0).to(ct) / torch.where(h > 0, h, 1), 0)
        if out_of_range == "clamp":
            w = w.clamp(0, 1)
        y0 = _rows(data, seg).to(ct)
        y1 = _rows(data, seg1).to(ct)
        w = w.unsqueeze(-1)
        values = (1 - w) * y0 + w * y1
    else:
        if method == "previous":
            idx = torch.minimum(i.clamp(min=0), n - 1)
        else:  # nearest, frame_index: ties go to the earlier sample
            idx = torch.where((t1 - x) < (x - t0), seg1, seg)
        t_idx = t.gather(1, idx)
        if method == "frame_index":
            offset = (t_idx - x).to(torch.float32)
            if tolerance_s is not None:
                outside = nanx | ~(offset.abs() <= tolerance_s)
            return idx, outside, offset
        if method == "previous":
            aux = (x - t_idx).to(torch.float32)
        values = _rows(data, idx).to(compute_dtype(data.dtype))

    if out_of_range == "nan":
        values = values.masked_fill(outside.unsqueeze(-1), torch.nan)
    values = values.masked_fill(nanx.unsqueeze(-1), torch.nan)
    return values.to(data.dtype), outside, aux


def _rows(data: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """data[b, idx[b, t], :] -> [B, T, D]."""
    return data.gather(1, idx.unsqueeze(-1).expand(-1, -1, data.shape[-1]))
