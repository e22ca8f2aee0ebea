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
* ``pchip``: monotone cubic Hermite on the linear segment, slopes as
  ``scipy.interpolate.PchipInterpolator`` (weighted harmonic mean inside, the three-point
  edge formula at the ends; two samples: a line). Needs samples ``seg-1 .. seg+2`` only.
* ``cubic``: natural cubic spline (``scipy.interpolate.CubicSpline(bc_type="natural")``):
  second derivatives M from the tridiagonal system per row, then the cubic on the segment.
* ``slerp``: unit quaternions (wxyz, D = 4): shortest-arc spherical interpolation on the
  linear segment with its weight (the sign of the second sample follows the first).
* ``extrapolate`` extends the end polynomial (pchip, cubic) or end arc (slerp), as SciPy does.
* Time differences are taken in the timestamps' dtype (float64 epoch seconds stay exact) and
  only then converted to the arithmetic dtype (float32, or float64 for float64 data).
"""

from __future__ import annotations

import torch


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
    count: bool = False,
) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor | None]:
    """Interpolate one stream. Batched, already-validated inputs.

    Args:
        data: ``[B, S, D]`` float (None for ``frame_index``).
        times: ``[B, S]`` float32/float64 seconds (rows may be expanded views).
        target: ``[B, T]`` float32/float64 seconds.
        lengths: ``[B]`` int in ``[1, S]`` or None (all S valid).
        method: one of `robocache.ops.align.METHODS`.
        out_of_range: ``clamp``, ``nan`` or ``extrapolate``.
        tolerance_s: ``frame_index`` only: targets whose nearest frame is farther are padded.
        count: find ``cnt`` by comparing every target with every sample (``[B, T, S]``)
            instead of ``searchsorted``: the same counts for targets that are not NaN, as
            elementwise ops and a sum that a compiler fuses with the rest (short rows only:
            an online window).

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
    if count:
        cnt = (t.unsqueeze(1) <= x.unsqueeze(2)).sum(-1)
    else:
        cnt = torch.searchsorted(t.contiguous(), x.contiguous(), right=True)
    nanx = torch.isnan(x)
    i = cnt - 1
    seg = torch.minimum(i.clamp(min=0), (n - 2).clamp(min=0))
    seg1 = torch.minimum(seg + 1, n - 1)
    t0, t1 = t.gather(1, seg), t.gather(1, seg1)
    t_last = t.gather(1, n - 1)
    outside = (cnt == 0) | (x > t_last) | nanx

    aux = None
    if method in ("linear", "pchip", "cubic", "slerp"):
        ct = compute_dtype(data.dtype)
        h = (t1 - t0).to(ct)
        w = torch.where(h > 0, (x - t0).to(ct) / torch.where(h > 0, h, 1), 0)
        if out_of_range == "clamp":
            w = w.clamp(0, 1)
        y0 = _rows(data, seg).to(ct)
        y1 = _rows(data, seg1).to(ct)
        if method == "linear":
            values = (1 - w.unsqueeze(-1)) * y0 + w.unsqueeze(-1) * y1
        elif method == "slerp":
            values = _slerp(y0, y1, w.unsqueeze(-1))
        elif method == "pchip":
            values = _pchip(t, data, n, seg, w, ct)
        else:
            values = _natural_cubic(t, data, n, seg, seg1, w, ct)
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
    """data[b, idx[b, t], :] -> [B, T, D]. One ``index_select`` of the flattened rows: a
    ``gather`` with the index expanded over D took 17x longer on the CPU (6.9 vs 0.41 ms at
    B=64, S=1201, T=601, D=24, one thread; docs/build-profile.md)."""
    B, S, D = data.shape
    flat = idx + torch.arange(B, device=idx.device).unsqueeze(1) * S
    return data.reshape(B * S, D).index_select(0, flat.reshape(-1)).reshape(*idx.shape, D)


def _hermite(y0, y1, d0, d1, h, w):
    """Cubic Hermite on one segment of length h with end slopes d0, d1 at weight w."""
    w, h = w.unsqueeze(-1), h.unsqueeze(-1)
    w2, w3 = w * w, w * w * w
    return ((2 * w3 - 3 * w2 + 1) * y0 + (w3 - 2 * w2 + w) * h * d0
            + (3 * w2 - 2 * w3) * y1 + (w3 - w2) * h * d1)


def pchip_interior_slope(hm, hp, mm, mp):
    """PCHIP slope at a knot between secants mm (interval hm) and mp (interval hp): the
    weighted harmonic mean, 0 where the secants differ in sign or one is flat."""
    w1, w2 = 2 * hp + hm, hp + 2 * hm
    flat = (torch.sign(mm) != torch.sign(mp)) | (mm == 0) | (mp == 0)
    safe_mm, safe_mp = torch.where(flat, 1, mm), torch.where(flat, 1, mp)
    return torch.where(flat, 0, (w1 + w2) / (w1 / safe_mm + w2 / safe_mp))


def pchip_edge_slope(h0, h1, m0, m1):
    """PCHIP end slope from the two secants nearest the end (SciPy's three-point formula)."""
    d = ((2 * h0 + h1) * m0 - h0 * m1) / (h0 + h1)
    d = torch.where(torch.sign(d) != torch.sign(m0), 0, d)
    over = (torch.sign(m0) != torch.sign(m1)) & (d.abs() > 3 * m0.abs())
    return torch.where(over, 3 * m0, d)


def _pchip(t, data, n, seg, w, ct):
    """PCHIP on segment [seg, seg+1] from samples seg-1 .. seg+2 (clamped into the row)."""
    last = n - 1
    p = [torch.minimum((seg + k).clamp(min=0), last) for k in (-1, 0, 1, 2)]
    tp = [t.gather(1, i) for i in p]
    yp = [_rows(data, i).to(ct) for i in p]
    hs = [(tp[k + 1] - tp[k]).to(ct) for k in range(3)]  # intervals (p0,p1) (p1,p2) (p2,p3)
    safe = [torch.where(h > 0, h, 1).unsqueeze(-1) for h in hs]
    ms = [(yp[k + 1] - yp[k]) / safe[k] for k in range(3)]
    hh = [h.unsqueeze(-1) for h in hs]
    d1_edge = pchip_edge_slope(hh[1], hh[2], ms[1], ms[2])
    d1_int = pchip_interior_slope(hh[0], hh[1], ms[0], ms[1])
    d2_edge = pchip_edge_slope(hh[1], hh[0], ms[1], ms[0])
    d2_int = pchip_interior_slope(hh[1], hh[2], ms[1], ms[2])
    at_start = (seg == 0).unsqueeze(-1)
    at_end = (seg + 1 == last).unsqueeze(-1)
    d1 = torch.where(at_start, d1_edge, d1_int)
    d2 = torch.where(at_end, d2_edge, d2_int)
    two = (n == 2).unsqueeze(-1)  # two samples: a line
    d1 = torch.where(two, ms[1], d1)
    d2 = torch.where(two, ms[1], d2)
    return _hermite(yp[1], yp[2], d1, d2, hs[1], w)


def natural_second_derivatives(t, data, n, ct):
    """M [B, S, D] of the natural cubic spline per row (Thomas algorithm; M = 0 at both ends
    and beyond each row's length)."""
    B, S = t.shape
    y = data.to(ct)
    h = (t[:, 1:] - t[:, :-1]).to(ct)
    h = torch.where(h > 0, h, 1)
    m = (y[:, 1:] - y[:, :-1]) / h.unsqueeze(-1)
    M = torch.zeros_like(y)
    cp = torch.zeros(B, S, dtype=ct, device=y.device)
    rp = torch.zeros_like(y)
    n1 = n.reshape(B)
    for i in range(1, S - 1):
        a, c = h[:, i - 1], h[:, i]
        den = 2 * (a + c) - a * cp[:, i - 1]
        cp[:, i] = c / den
        rp[:, i] = (6 * (m[:, i] - m[:, i - 1]) - a[:, None] * rp[:, i - 1]) / den[:, None]
    for i in range(S - 2, 0, -1):
        live = (i <= n1 - 2)[:, None]
        M[:, i] = torch.where(live, rp[:, i] - cp[:, i, None] * M[:, i + 1], 0)
    return M


def _natural_cubic(t, data, n, seg, seg1, w, ct):
    M = natural_second_derivatives(t, data, n, ct)
    y0, y1 = _rows(data, seg).to(ct), _rows(data, seg1).to(ct)
    M0, M1 = _rows(M, seg), _rows(M, seg1)
    h = (t.gather(1, seg1) - t.gather(1, seg)).to(ct).unsqueeze(-1)
    s = w.unsqueeze(-1)
    r = 1 - s
    return r * y0 + s * y1 + h * h / 6 * ((r ** 3 - r) * M0 + (s ** 3 - s) * M1)


def _slerp(q0, q1, w):
    """Shortest-arc slerp of (normalized) wxyz quaternions; w may leave [0, 1]."""
    q0 = q0 / q0.norm(dim=-1, keepdim=True)
    q1 = q1 / q1.norm(dim=-1, keepdim=True)
    q1 = torch.where((q0 * q1).sum(-1, keepdim=True) < 0, -q1, q1)
    omega = 2 * torch.atan2((q1 - q0).norm(dim=-1, keepdim=True),
                            (q1 + q0).norm(dim=-1, keepdim=True))
    so = torch.sin(omega)
    small = so < torch.finfo(q0.dtype).eps ** 0.5
    safe = torch.where(small, 1, so)
    a = torch.where(small, 1 - w, torch.sin((1 - w) * omega) / safe)
    b = torch.where(small, w, torch.sin(w * omega) / safe)
    q = a * q0 + b * q1
    return q / q.norm(dim=-1, keepdim=True)
