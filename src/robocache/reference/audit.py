"""Plain per-episode loops of the audit's checks: the oracle of :mod:`robocache.ops.audit`.

One episode at a time in float64 NumPy, written for reading, not speed. Each function takes
the same packed arguments as its op (rows of all episodes back to back, ``offsets [E + 1]``)
and returns NumPy arrays with the op's meaning.
"""

from __future__ import annotations

import numpy as np


def _runs(mask: np.ndarray) -> int:
    """The longest run of True in ``mask``."""
    best = cur = 0
    for m in mask:
        cur = cur + 1 if m else 0
        best = max(best, cur)
    return best


def stream_checks_ref(values, offsets, pad, lo, hi, jump, still) -> dict[str, np.ndarray]:
    """Per episode (see :func:`robocache.ops.audit.stream_checks`): ``nonfinite``,
    ``out_of_range``, ``jumps``, ``max_step``, ``frozen``, ``span``, ``pad_run``, and per row
    ``still``."""
    x = np.asarray(values, np.float64)
    n, d = x.shape
    offsets = np.asarray(offsets, np.int64)
    pad = np.zeros(n, bool) if pad is None else np.asarray(pad, bool)
    lo, hi, jump, still = (np.asarray(a, np.float64) for a in (lo, hi, jump, still))
    e_count = len(offsets) - 1
    out = {"nonfinite": np.zeros(e_count, np.int64), "out_of_range": np.zeros(e_count, np.int64),
           "jumps": np.zeros(e_count, np.int64), "max_step": np.zeros(e_count),
           "frozen": np.zeros(e_count, np.int64), "span": np.zeros((e_count, d)),
           "pad_run": np.zeros(e_count, np.int64), "still": np.zeros(n, bool)}
    for e in range(e_count):
        a, b = offsets[e], offsets[e + 1]
        ep, p = x[a:b], pad[a:b]
        finite = np.isfinite(ep)
        out["nonfinite"][e] = int((~finite & ~p[:, None]).sum())
        outside = finite & ((ep < lo) | (ep > hi))
        out["out_of_range"][e] = int((outside.any(1) & ~p).sum())
        out["pad_run"][e] = _runs(p)
        usable = finite & ~p[:, None]
        for k in range(d):
            vals = ep[usable[:, k], k]
            out["span"][e, k] = vals.max() - vals.min() if vals.size else 0.0
        frozen, max_step, jumps = [], 0.0, 0
        for t in range(1, b - a):
            ok = not p[t] and not p[t - 1] and finite[t].all() and finite[t - 1].all()
            if not ok:
                frozen.append(False)
                continue
            delta = np.abs(ep[t] - ep[t - 1])
            frozen.append(bool((delta == 0).all()))
            out["still"][a + t] = bool((delta <= still).all())
            scaled = [delta[k] / jump[k] for k in range(d) if np.isfinite(jump[k])]
            if scaled:
                max_step = max(max_step, max(scaled))
                jumps += int(max(scaled) > 1.0)
        out["frozen"][e] = _runs(np.array(frozen, bool))
        out["max_step"][e], out["jumps"][e] = max_step, jumps
    return out


def longest_runs_ref(mask, offsets) -> np.ndarray:
    """Per episode, the longest run of True rows of ``mask``."""
    offsets = np.asarray(offsets, np.int64)
    mask = np.asarray(mask, bool)
    return np.array([_runs(mask[offsets[e]:offsets[e + 1]]) for e in range(len(offsets) - 1)],
                    np.int64)


def timing_checks_ref(times, offsets, period) -> tuple[np.ndarray, np.ndarray]:
    """Per episode: the largest step between timestamps and the standard deviation of the
    steps around ``period``, both in periods (0 for an episode of one row)."""
    t = np.asarray(times, np.float64)
    offsets = np.asarray(offsets, np.int64)
    e_count = len(offsets) - 1
    gap, jitter = np.zeros(e_count), np.zeros(e_count)
    for e in range(e_count):
        dt = np.diff(t[offsets[e]:offsets[e + 1]])
        if dt.size:
            gap[e] = dt.max() / period
            jitter[e] = np.sqrt(np.mean((dt - period) ** 2)) / period
    return gap, jitter


def sample_every_ref(values, offsets, stride: float, points: int):
    """Each episode sampled every ``stride`` rows from its first (``np.interp``), zero where
    past its last row: ``([E, points, D], valid [E, points])``."""
    x = np.asarray(values, np.float64)
    offsets = np.asarray(offsets, np.int64)
    e_count = len(offsets) - 1
    out = np.zeros((e_count, points, x.shape[1]))
    valid = np.zeros((e_count, points), bool)
    for e in range(e_count):
        ep = x[offsets[e]:offsets[e + 1]]
        for k in range(points):
            at = k * stride
            if len(ep) and at <= len(ep) - 1 + 1e-9:
                valid[e, k] = True
                for d in range(x.shape[1]):
                    out[e, k, d] = np.interp(at, np.arange(len(ep)), ep[:, d])
    return out, valid
