"""The audit's per-episode checks over packed episodes, vectorised in torch.

    >>> c = stream_checks(state, offsets, pad, lo=lo, hi=hi, jump=bound, still=tol)
    >>> c.jumps            # [E] steps whose change exceeds ``jump`` in some dimension
    >>> idle = longest_runs(c.still & other.still, offsets)   # [E] rows
    >>> sig, valid = sample_every(state, offsets, stride=7.5, points=64)  # [E, 64, D]

Rows of all episodes sit back to back (``[N, D]``) with ``offsets [E + 1]`` (as
FlashAttention's ``cu_seqlens``); every result is per episode (``[E]``) or per row (``[N]``).
Each function runs where its inputs live — a handful of elementwise operations, a cumulative
sum and segment reductions (``scatter_reduce``), no loop over episodes — so a batch of
thousands of episodes costs a few launches on a GPU and a few passes over memory on the CPU.
:mod:`robocache.reference.audit` holds the per-episode loops they are tested against.

Arithmetic is in float32 for 16- and 32-bit floats and float64 for float64 (timestamps are
always float64). A step ``t`` of an episode is *comparable* when ``t`` is not the episode's
first row, neither row ``t`` nor ``t - 1`` is padded and both are finite in every dimension;
only comparable steps count as jumps, frozen or still.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from robocache.ops import _checks as C

_OP = "audit"


class StreamChecks(NamedTuple):
    """What :func:`stream_checks` measures, per episode ``[E]`` unless said.

    Attributes:
        nonfinite: NaN / inf values in unpadded rows (values, not rows).
        out_of_range: unpadded rows with a finite value outside ``[lo, hi]`` in some dimension.
        jumps: comparable steps whose change exceeds ``jump`` in some dimension.
        max_step: the largest change of a comparable step in units of ``jump`` (max over
            dimensions of ``|x[t] - x[t-1]| / jump``; 0 when there is none).
        frozen: the longest run of consecutive comparable steps that repeat the previous row
            exactly (every dimension), in steps.
        span: ``[E, D]`` max - min of each dimension's finite unpadded values (0 when none).
        pad_run: the longest run of padded rows.
        still: ``[N]`` bool, per row: a comparable step whose change is within ``still`` in
            every dimension.
    """

    nonfinite: torch.Tensor
    out_of_range: torch.Tensor
    jumps: torch.Tensor
    max_step: torch.Tensor
    frozen: torch.Tensor
    span: torch.Tensor
    pad_run: torch.Tensor
    still: torch.Tensor


def _check_offsets(offsets: torch.Tensor, rows: int, device: torch.device) -> None:
    if offsets.dim() != 1 or offsets.numel() < 1:
        C.fail(_OP, f"`offsets` must be int64 [E + 1]; got shape {tuple(offsets.shape)}.")
    if offsets.dtype not in (torch.int32, torch.int64):
        C.fail(_OP, f"`offsets` must be an integer tensor; got {offsets.dtype}.")
    C.check_device(_OP, "offsets", offsets, device, "the rows")
    if offsets.device.type == "cpu" and (int(offsets[0]) != 0 or int(offsets[-1]) != rows
                                         or bool((offsets[1:] < offsets[:-1]).any())):
        C.fail(_OP, f"`offsets` must rise from 0 to the {rows} rows; got "
                    f"{offsets[:3].tolist()}...{offsets[-3:].tolist()}.")


def segments(offsets: torch.Tensor, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(episode of each row ``[N]`` int64, whether each row is its episode's first ``[N]``)."""
    off = offsets.to(torch.int64)
    counts = off[1:] - off[:-1]
    episode = torch.repeat_interleave(torch.arange(len(counts), device=off.device), counts,
                                      output_size=rows)
    first = torch.zeros(rows, dtype=torch.bool, device=off.device)
    starts = off[:-1][counts > 0]
    first[starts] = True
    return episode, first


def longest_runs(mask: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """The longest run of consecutive True rows of each episode.

    Args:
        mask: bool ``[N]``, rows of all episodes back to back.
        offsets: int ``[E + 1]``, ``[0, ..., N]``.

    Returns:
        int64 ``[E]`` (0 for an episode without a True row), on ``mask``'s device.

    Raises:
        ShapeError, DeviceError: a mask that is not bool ``[N]``, offsets not ``[0 .. N]``
            (checked on the CPU), or on another device.

    Example:
        >>> longest_runs(torch.tensor([1, 1, 0, 1, 1, 1], dtype=torch.bool),
        ...              torch.tensor([0, 4, 6]))
        tensor([2, 2])
    """
    if mask.dim() != 1 or mask.dtype != torch.bool:
        C.fail(_OP, f"`mask` must be bool [N]; got {mask.dtype} {tuple(mask.shape)}.")
    _check_offsets(offsets, mask.shape[0], mask.device)
    episode, first = segments(offsets, mask.shape[0])
    return _longest(mask, episode, first, offsets.numel() - 1)


def _longest(mask, episode, first, count: int) -> torch.Tensor:
    out = torch.zeros(count, dtype=torch.int64, device=mask.device)
    if not mask.numel():
        return out
    prev = torch.cat([mask.new_zeros(1), mask[:-1]])
    starts = mask & (~prev | first)  # a run starts after a False row or at an episode's start
    run = torch.cumsum(starts.to(torch.int64), 0) - 1
    lengths = torch.zeros(int(starts.sum()), dtype=torch.int64, device=mask.device)
    if not lengths.numel():
        return out
    lengths.index_add_(0, run[mask], torch.ones_like(run[mask]))
    return out.scatter_reduce_(0, episode[starts], lengths, "amax")


def stream_checks(values: torch.Tensor, offsets: torch.Tensor, pad: torch.Tensor | None, *,
                  lo: torch.Tensor, hi: torch.Tensor, jump: torch.Tensor,
                  still: torch.Tensor) -> StreamChecks:
    """Measure one stream of packed episodes: non-finite values, values out of range, jumps,
    frozen runs, per-dimension span, padded runs, and which steps are still.

    Args:
        values: ``[N, D]`` float rows of all episodes back to back.
        offsets: int ``[E + 1]``, ``[0, ..., N]``: episode e holds rows
            ``offsets[e] : offsets[e+1]``.
        pad: bool ``[N]`` (the stream had no sample at that row) or None.
        lo, hi: ``[D]`` the range a value must lie in (the stream's units).
        jump: ``[D]`` the largest change of one step that is not a jump (``inf``: the
            dimension is never a jump).
        still: ``[D]`` the largest change of one step that counts as still.

    Returns:
        :class:`StreamChecks`, on ``values``' device.

    Raises:
        ShapeError, DTypeError, DeviceError: bad shapes, a non-float ``values``, a pad that
            is not bool ``[N]``, inputs on different devices.

    Example:
        >>> x = torch.tensor([[0.0], [0.0], [5.0], [float("nan")]])
        >>> c = stream_checks(x, torch.tensor([0, 4]), None, lo=torch.tensor([-1.0]),
        ...                   hi=torch.tensor([1.0]), jump=torch.tensor([1.0]),
        ...                   still=torch.tensor([0.1]))
        >>> c.nonfinite, c.out_of_range, c.jumps, c.frozen
        (tensor([1]), tensor([1]), tensor([1]), tensor([1]))
    """
    if values.dim() != 2:
        C.fail(_OP, f"`values` must be [N, D]; got shape {tuple(values.shape)}.")
    C.check_dtype(_OP, "values", values, C.FLOAT_DTYPES, "cast the stream to float32.")
    n, d = values.shape
    device = values.device
    _check_offsets(offsets, n, device)
    if pad is not None and (pad.shape != (n,) or pad.dtype != torch.bool):
        C.fail(_OP, f"`pad` must be bool [{n}]; got {pad.dtype} {tuple(pad.shape)}.")
    work = torch.float64 if values.dtype == torch.float64 else torch.float32
    bounds = []
    for name, t in (("lo", lo), ("hi", hi), ("jump", jump), ("still", still)):
        t = torch.as_tensor(t)
        if t.shape != (d,):
            C.fail(_OP, f"`{name}` must be [{d}] (one per dimension); got {tuple(t.shape)}.")
        bounds.append(t.to(device, work))
    lo, hi, jump, still = bounds
    count = offsets.numel() - 1
    episode, first = segments(offsets, n)
    x = values.to(work)
    pad = torch.zeros(n, dtype=torch.bool, device=device) if pad is None else pad
    finite = torch.isfinite(x)
    live = ~pad
    zeros = torch.zeros(count, dtype=torch.int64, device=device)

    nonfinite = zeros.index_add(0, episode, ((~finite) & live[:, None]).sum(1))
    outside = (finite & ((x < lo) | (x > hi))).any(1) & live
    out_of_range = zeros.index_add(0, episode, outside.to(torch.int64))

    usable = finite & live[:, None]
    big = torch.finfo(work).max
    top = torch.full((count, d), -big, dtype=work, device=device).scatter_reduce_(
        0, episode[:, None].expand(n, d), torch.where(usable, x, -big), "amax")
    bottom = torch.full((count, d), big, dtype=work, device=device).scatter_reduce_(
        0, episode[:, None].expand(n, d), torch.where(usable, x, big), "amin")
    span = torch.where(top >= bottom, top - bottom, torch.zeros_like(top))

    # step t against t - 1 (row 0 has none; an episode's first row is not comparable)
    row_ok = live & finite.all(1)
    comparable = row_ok & torch.cat([row_ok.new_zeros(1), row_ok[:-1]]) & ~first
    delta = torch.zeros_like(x)
    if n > 1:
        delta[1:] = (x[1:] - x[:-1]).abs()
    delta = torch.where(comparable[:, None], delta, torch.zeros_like(delta))
    scaled = torch.where(torch.isfinite(jump), delta / jump, torch.zeros_like(delta))
    step = scaled.amax(1) if d else torch.zeros(n, dtype=work, device=device)
    max_step = torch.zeros(count, dtype=work, device=device).scatter_reduce_(
        0, episode, step, "amax")
    jumps = zeros.index_add(0, episode, (comparable & (step > 1.0)).to(torch.int64))
    repeated = comparable & (delta == 0).all(1)
    still_rows = comparable & (delta <= still).all(1)
    return StreamChecks(nonfinite, out_of_range, jumps, max_step,
                        _longest(repeated, episode, first, count), span,
                        _longest(pad, episode, first, count), still_rows)


def timing_checks(times: torch.Tensor, offsets: torch.Tensor,
                  period: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Each episode's largest step between timestamps and its jitter, in periods.

    Args:
        times: float64 ``[N]`` seconds, rows of all episodes back to back.
        offsets: int ``[E + 1]``.
        period: the nominal step, seconds (``1 / rate``), > 0.

    Returns:
        (gap, jitter): float64 ``[E]``: the largest ``t[i+1] - t[i]`` and the root mean
        square of ``t[i+1] - t[i] - period``, both divided by ``period`` (0 for an episode
        of one row).

    Raises:
        ShapeError, DTypeError: times not float64 ``[N]``, bad offsets, period <= 0.

    Example:
        >>> timing_checks(torch.tensor([0.0, 0.1, 0.3], dtype=torch.float64),
        ...               torch.tensor([0, 3]), 0.1)[0]
        tensor([2.], dtype=torch.float64)
    """
    if times.dim() != 1 or times.dtype != torch.float64:
        C.fail(_OP, f"`times` must be float64 [N] seconds; got {times.dtype} "
                    f"{tuple(times.shape)}.")
    if not period > 0:
        C.fail(_OP, f"`period` must be > 0 seconds; got {period!r}.")
    n = times.shape[0]
    _check_offsets(offsets, n, times.device)
    count = offsets.numel() - 1
    episode, first = segments(offsets, n)
    dt = torch.zeros_like(times)
    if n > 1:
        dt[1:] = times[1:] - times[:-1]
    has = ~first
    gap = torch.zeros(count, dtype=torch.float64, device=times.device).scatter_reduce_(
        0, episode[has], dt[has], "amax", include_self=False)  # (one row: 0)
    sq = torch.where(has, (dt - period) ** 2, torch.zeros_like(dt))
    total = torch.zeros(count, dtype=torch.float64, device=times.device).index_add_(
        0, episode, sq)
    steps = torch.zeros(count, dtype=torch.float64, device=times.device).index_add_(
        0, episode, has.to(torch.float64))
    jitter = torch.sqrt(total / steps.clamp(min=1))
    return gap / period, jitter / period


def sample_every(values: torch.Tensor, offsets: torch.Tensor, stride: float,
                 points: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each episode sampled every ``stride`` rows from its first, linearly interpolated
    between rows: a signature on a common time axis (an episode cut short shares the start of
    its original's).

    Args:
        values: ``[N, D]`` float rows of all episodes back to back.
        offsets: int ``[E + 1]``.
        stride: rows between samples (e.g. ``rate_hz * 0.5`` for one every half second), > 0.
        points: samples per episode, >= 1.

    Returns:
        (samples ``[E, points, D]`` in float32, float64 for float64 values, zero where not
        valid; valid bool ``[E, points]``: sample k lies within the episode, ``k * stride <=
        rows - 1``).

    Raises:
        ShapeError, DTypeError: bad shapes or dtype, stride <= 0, points < 1.

    Example:
        >>> x, ok = sample_every(torch.arange(5.0)[:, None], torch.tensor([0, 5]), 1.5, 4)
        >>> x[0, :, 0], ok[0]
        (tensor([0.0000, 1.5000, 3.0000, 0.0000]), tensor([ True,  True,  True, False]))
    """
    if values.dim() != 2:
        C.fail(_OP, f"`values` must be [N, D]; got shape {tuple(values.shape)}.")
    C.check_dtype(_OP, "values", values, C.FLOAT_DTYPES, "cast the stream to float32.")
    if not (isinstance(stride, (int, float)) and stride > 0):
        C.fail(_OP, f"`stride` must be > 0 rows; got {stride!r}.")
    if not (isinstance(points, int) and points >= 1):
        C.fail(_OP, f"`points` must be an integer >= 1; got {points!r}.")
    _check_offsets(offsets, values.shape[0], values.device)
    work = torch.float64 if values.dtype == torch.float64 else torch.float32
    off = offsets.to(torch.int64)
    start, length = off[:-1], off[1:] - off[:-1]
    at = torch.arange(points, dtype=torch.float64, device=values.device) * float(stride)
    valid = at[None, :] <= (length - 1).to(torch.float64)[:, None] + 1e-9  # [E, P]
    last = (length - 1).clamp(min=0)[:, None]
    lower = torch.minimum(at.floor().to(torch.int64)[None, :], last)
    upper = torch.minimum(lower + 1, last)
    w = (at[None, :] - lower).clamp(0, 1).to(work)[..., None]
    n = values.shape[0]
    if n == 0:
        return (torch.zeros(len(length), points, values.shape[1], dtype=work,
                            device=values.device), valid)
    x = values.to(work)
    a = x[(start[:, None] + lower).clamp(max=n - 1)]
    b = x[(start[:, None] + upper).clamp(max=n - 1)]
    out = torch.where(w == 0, a, a + (b - a) * w)
    return torch.where(valid[..., None], out, torch.zeros_like(out)), valid
