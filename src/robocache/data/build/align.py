"""Stage 2, align: one checked episode onto the cache's time grid (see
:mod:`robocache.data.build`), as Lance columns.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

from robocache.data.build.config import CacheConfig, column_name, default_method, sparse
from robocache.data.episode import Episode, StreamSpec
from robocache.errors import DataError


def _timed(specs: dict[str, StreamSpec], rate_hz: float) -> list[str]:
    """The streams whose common span is an episode's: the numeric ones that are not sparse
    (:func:`~robocache.data.build.config.sparse`), else every numeric one, else every one
    that is not an event."""
    numeric = [n for n, s in specs.items() if s.kind == "numeric"]
    return [n for n in numeric if not sparse(specs[n], rate_hz)] or numeric or \
        [n for n, s in specs.items() if s.kind != "event"]


def native_streams(specs: dict[str, StreamSpec], rate_hz: float) -> list[str]:
    """The numeric/image streams sampled at ``rate_hz`` (stored frame by frame at that rate)."""
    return [n for n, s in specs.items() if s.kind in ("numeric", "image")
            and s.rate_hz is not None and abs(s.rate_hz - rate_hz) <= 1e-9 * rate_hz]


def _grid_steps(episode: Episode, name: str, t0: float, rate_hz: float,
                tolerance_s: float) -> np.ndarray:
    """int64 ``[S]`` step of each sample of a native stream on ``t0 + k / rate_hz``.

    Raises:
        DataError: a sample off the grid by more than ``tolerance_s``, or two on one step.
    """
    times = episode.streams[name].times
    k = np.rint((times - t0) * rate_hz).astype(np.int64)
    off = times - (t0 + k / rate_hz)
    bad = np.flatnonzero(np.abs(off) > tolerance_s)
    if bad.size:
        r = int(bad[0])
        raise DataError(f"episode {episode.index}: stream {name!r} row {r} (t = "
                        f"{float(times[r])!r} s) is {off[r]:+.3e} s off the 1/{rate_hz:g} s "
                        f"grid (tolerance_s = {tolerance_s:g}); {bad.size} rows are off it. Fix "
                        "the timestamps or ingest at an explicit rate (--rate HZ) to resample.")
    dup = np.flatnonzero(np.diff(k) == 0)
    if dup.size:
        r = int(dup[0]) + 1
        raise DataError(f"episode {episode.index}: stream {name!r} rows {r - 1} and {r} fall on "
                        f"the same 1/{rate_hz:g} s grid step {int(k[r])}.")
    return k


# An episode's grid is refused when its aligned columns would need more than this; a rate is
# refused when one second of an episode would, or when its step is longer than 1 / MIN_RATE_HZ.
MAX_GRID_BYTES = 2 << 30
MIN_RATE_HZ = 1e-3


def step_bytes(specs: dict[str, StreamSpec]) -> int:
    """Bytes one grid step takes in the aligned columns, at least: the episode, step, time and
    task columns, and per stream its values (4 bytes a value or more) or a frame/event index,
    and its pad flag."""
    return 32 + sum(1 + (max(np.dtype(s.dtype).itemsize, 4) * s.dim if s.kind == "numeric"
                         else 8) for s in specs.values())


def check_rate(rate_hz: float, specs: dict[str, StreamSpec]) -> None:
    """Refuse a rate whose grid is useless (a step longer than 1 / MIN_RATE_HZ) or whose one
    second of an episode needs more than MAX_GRID_BYTES of aligned columns."""
    fastest = max((s.rate_hz for s in specs.values() if s.rate_hz), default=None)
    streams = f" (the source's fastest stream runs at {fastest:g} Hz)" if fastest else ""
    if rate_hz < MIN_RATE_HZ:
        raise DataError(f"`rate_hz` (--rate) is {rate_hz:g} Hz: one step every {1 / rate_hz:g} s "
                        f"would make every episode one step; pass at least {MIN_RATE_HZ:g} "
                        f"Hz{streams}.")
    need = rate_hz * step_bytes(specs)
    if need > MAX_GRID_BYTES:
        raise DataError(f"`rate_hz` (--rate) is {rate_hz:g} Hz: one second of an episode would be "
                        f"{rate_hz:.3g} steps, {need / 2**30:.3g} GiB of aligned columns "
                        f"({step_bytes(specs)} bytes a step; the bound is "
                        f"{MAX_GRID_BYTES / 2**30:g} GiB an episode); pass a lower rate{streams}.")


def _check_grid(episode: Episode, specs: dict[str, StreamSpec], steps: int,
                rate_hz: float) -> None:
    need = steps * step_bytes(specs)
    if need > MAX_GRID_BYTES:
        raise DataError(f"episode {episode.index}: {episode.end - episode.start:.6g} s at "
                        f"{rate_hz:g} Hz is {steps:,} steps, {need / 2**30:.3g} GiB of aligned "
                        f"columns (the bound is {MAX_GRID_BYTES / 2**30:g} GiB an episode); "
                        "ingest at a lower rate (--rate).")


def target_times(episode: Episode, specs: dict[str, StreamSpec], rate_hz: float,
                 tolerance_s: float = 1e-4, native: bool = False) -> np.ndarray:
    """float64 ``[T]`` seconds: the episode's grid at ``rate_hz`` (see the module docstring).

    ``native``: ``rate_hz`` is the source's fps, and the grid is ``t0 + k / rate_hz`` over the
    frames of the streams at that rate; otherwise (or without such streams) the span every
    numeric stream covers, its end included within ``tolerance_s``.
    """
    native = native_streams(specs, rate_hz) if native else []
    if native:
        t0 = min(float(episode.streams[n].times[0]) for n in native)
        steps = max(int(_grid_steps(episode, n, t0, rate_hz, tolerance_s)[-1]) for n in native)
        _check_grid(episode, specs, steps + 1, rate_hz)
        return t0 + np.arange(steps + 1, dtype=np.float64) / rate_hz
    timed = _timed(specs, rate_hz)
    if not timed:
        raise DataError(f"episode {episode.index}: no timed (non-event) stream to align.")
    start = max(float(episode.streams[n].times[0]) for n in timed)
    end = min(float(episode.streams[n].times[-1]) for n in timed)
    if end < start:
        raise DataError(f"episode {episode.index}: the streams do not overlap in time "
                        f"(latest start {start:.6f} s > earliest end {end:.6f} s).")
    steps = int(math.floor((end - start + tolerance_s) * rate_hz)) + 1
    _check_grid(episode, specs, steps, rate_hz)
    # clamping keeps a last step within the tolerance past the end inside every stream
    return np.minimum(start + np.arange(steps, dtype=np.float64) / rate_hz, end)


def snap_times(times: np.ndarray, t: np.ndarray, tolerance_s: float,
               all_or_none: bool = False) -> np.ndarray:
    """``times`` with every sample within ``tolerance_s`` of a grid instant of ``t`` (float64,
    sorted) moved exactly onto it, so ``previous``/``nearest`` there return that sample.
    ``all_or_none``: move them only when every sample is that close (a stream on the grid)."""
    return snap_many([times], [t], tolerance_s, all_or_none)[0]


def snap_many(times: list[np.ndarray], grids: list[np.ndarray], tolerance_s: float,
              all_or_none: bool = False) -> list[np.ndarray]:
    """:func:`snap_times` of many streams at once (``times[b]`` onto ``grids[b]``): one
    batched search and one pass of array operations for them all, each row's result the one
    :func:`snap_times` gives it alone (the same float64 operations per sample)."""
    import torch

    out = list(times)
    rows = [b for b, (x, t) in enumerate(zip(times, grids, strict=True)) if len(x) and len(t)]
    if not rows:
        return out
    if len(rows) == 1:  # one stream (an online message): NumPy's search, no padded rows
        b = rows[0]
        moved, close = _nearest(times[b], *_around(times[b], grids[b]), tolerance_s)
        if close.all() or not all_or_none:
            out[b] = moved
        return out
    nx = np.array([len(times[b]) for b in rows])
    nt = np.array([len(grids[b]) for b in rows])
    x = np.zeros((len(rows), int(nx.max())))
    g = np.full((len(rows), int(nt.max()) + 1), np.inf)  # sorted rows: +inf past each grid
    for r, b in enumerate(rows):
        x[r, :nx[r]] = times[b]
        g[r, :nt[r]] = grids[b]
    j = torch.searchsorted(torch.from_numpy(g), torch.from_numpy(x)).numpy()
    j = np.clip(j, 1, np.maximum(nt - 1, 1)[:, None])
    lo = np.take_along_axis(g, j - 1, 1)
    hi = np.where((nt > 1)[:, None], np.take_along_axis(g, j, 1), lo)
    moved, close = _nearest(x, lo, hi, tolerance_s)
    whole = (close | (np.arange(x.shape[1]) >= nx[:, None])).all(1)
    for r, b in enumerate(rows):
        if whole[r] or not all_or_none:
            out[b] = moved[r, :nx[r]]
    return out


def _around(x: np.ndarray, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The instants of the sorted grid ``t`` (non-empty) on each side of each sample ``x``:
    ``(lo, hi)``, clamped to the grid's ends (both its one instant for a grid of one)."""
    j = np.clip(np.searchsorted(t, x), 1, max(len(t) - 1, 1))
    lo = t[j - 1]
    return lo, (t[j] if len(t) > 1 else lo)


def _nearest(x: np.ndarray, lo: np.ndarray, hi: np.ndarray, tolerance_s: float
             ) -> tuple[np.ndarray, np.ndarray]:
    """The snapping rule on samples ``x`` between grid instants ``lo`` and ``hi``: the nearer
    instant (ties to ``lo``), taken where within ``tolerance_s``; returns the moved samples and
    where they moved."""
    near = np.where(np.abs(x - lo) <= np.abs(hi - x), lo, hi)
    close = np.abs(x - near) <= tolerance_s
    return np.where(close, near, x), close


def _place(values: np.ndarray, k: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Samples at grid steps ``k`` as ``[n, ...]`` rows (steps without a sample hold the
    previous one, the first one before it) and the mask of those padded steps."""
    src = np.full(n, -1, np.int64)
    src[k] = np.arange(len(k))
    pad = src < 0
    src = np.maximum.accumulate(src)
    return values[np.where(src < 0, 0, src)], pad


def step_tasks(episode: Episode, t: np.ndarray, tolerance_s: float) -> np.ndarray:
    """The task string at each step ``t``: the task of the latest frame at or before it (within
    ``tolerance_s``) when the source has one per frame (LeRobot's ``task_index``), else the
    episode's first task."""
    frames = episode.meta.get("frame_tasks")
    if frames is None:
        return np.full(len(t), (episode.meta.get("tasks") or [""])[0], dtype=object)
    times, names = frames
    i = np.searchsorted(times, np.asarray(t) + tolerance_s, side="right") - 1
    return names[np.clip(i, 0, len(names) - 1)]


@contextmanager
def one_thread(device):
    """Torch's intra-op threads set to one while CPU work on one episode runs (restored
    after): an episode's tensors are small, and waking the pool cost more than the work
    (torch.searchsorted of 600 in 1200 float64: 5.7 ms with 2 threads on a busy 2-core host,
    0.015 ms with one; docs/build-profile.md). Episodes run in parallel instead."""
    import torch

    if getattr(device, "type", device) != "cpu" or torch.get_num_threads() == 1:
        yield
        return
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def align_episode(episode: Episode, specs: dict[str, StreamSpec], config: CacheConfig,
                  device, fps: float | None = None) -> dict[str, Any]:
    """Align one (checked) episode to ``config.rate_hz`` (``fps``, the source's rate, when
    ``"native"``); returns the Lance columns as arrays (see :func:`align_batch`).

    Raises:
        DataError: the episode's streams do not overlap, or a native stream is off its grid.
    """
    out = align_batch([episode], specs, config, device, fps)[0]
    if isinstance(out, Exception):
        raise out
    return out


def align_batch(episodes: list[Episode], specs: dict[str, StreamSpec], config: CacheConfig,
                device, fps: float | None = None) -> list[dict[str, Any] | Exception]:
    """Align many (checked) episodes at once: one :func:`robocache.align` launch for all of
    them (each stream padded to the longest episode, with lengths), so the per-call cost of
    the op is shared (on the GPU: one launch per batch instead of one per episode; on the
    CPU, with torch's intra-op threads at one, see :func:`one_thread`). Each episode's rows
    are those :func:`align_episode` gives it alone (every row of the op is computed from its
    own samples).

    Returns:
        Per episode, in order: its Lance columns as arrays, or the exception that
        quarantines it (an episode whose grid fails, or that fails alone when the batch
        fails).
    """
    is_native = config.rate_hz == "native"
    rate = float(fps if is_native else config.rate_hz)
    native = set(native_streams(specs, rate)) if is_native else set()
    out: list[dict[str, Any] | Exception] = []
    plans: list[_Plan | Exception] = []
    with one_thread(device):
        grids = []
        for episode in episodes:
            try:
                grids.append(target_times(episode, specs, rate, config.grid_tolerance_s,
                                          native=is_native))
            except MemoryError:
                raise
            except Exception as e:  # quarantined with the reason
                grids.append(e)
        snapped = _snapped(episodes, grids, specs, config, native, rate)
        for i, episode in enumerate(episodes):
            if isinstance(grids[i], Exception):
                plans.append(grids[i])
                continue
            try:
                plans.append(_plan(episode, grids[i], {n: v[i] for n, v in snapped.items()},
                                   specs, config, rate, native))
            except MemoryError:
                raise
            except Exception as e:  # quarantined with the reason
                plans.append(e)
        ok = [i for i, p in enumerate(plans) if not isinstance(p, Exception)]
        try:
            aligned = dict(zip(ok, _align(episodes, [plans[i] for i in ok], ok, specs,
                                          config, device), strict=True))
        except MemoryError:
            raise
        except Exception:  # find the episode that fails: each alone
            aligned = {}
            for i in ok:
                try:
                    aligned[i] = _align(episodes, [plans[i]], [i], specs, config, device)[0]
                except MemoryError:
                    raise
                except Exception as e:
                    plans[i] = e
        for i, episode in enumerate(episodes):
            plan = plans[i]
            out.append(plan if isinstance(plan, Exception) else
                       _columns(episode, plan, aligned[i], specs, config))
    return out


@dataclass
class _Plan:
    """One episode's grid ``t``, its native streams placed exactly (``exact``: name ->
    (values, pad)), and per other stream the op's input: (method, snapped times, data or
    ``None``); event streams without events are absent."""

    t: np.ndarray
    exact: dict[str, tuple[np.ndarray, np.ndarray]]
    inputs: dict[str, tuple[str, np.ndarray, np.ndarray | None]]


def _exact(name: str, spec: StreamSpec, method: str, native: set[str]) -> bool:
    """Whether a stream's samples are placed on the grid exactly (a native numeric stream, or
    a native stream held by ``previous``) instead of aligned by the op."""
    return name in native and method != "frame_index" and (spec.kind == "numeric"
                                                           or method == "previous")


def _snapped(episodes: list[Episode], grids: list, specs: dict[str, StreamSpec],
             config: CacheConfig, native: set[str], rate: float
             ) -> dict[str, dict[int, np.ndarray]]:
    """Per stream aligned by the op, its times in each episode with a grid (``grids[i]``, an
    exception for the others) snapped onto it (:func:`snap_many`, one call per stream):
    stream -> episode position -> times."""
    rows = [i for i, g in enumerate(grids) if not isinstance(g, Exception)]
    out = {}
    for name, spec in specs.items():
        method = config.methods.get(name, default_method(spec, rate))
        if _exact(name, spec, method, native):
            continue
        # numeric previous/nearest streams snap every sample near an instant; the others only
        # when the whole stream is on the grid (moving one jittered sample would bend an
        # interpolated curve by tol x slope, or shift an event's or frame's age/offset)
        out[name] = dict(zip(rows, snap_many(
            [episodes[i].streams[name].times for i in rows], [grids[i] for i in rows],
            config.grid_tolerance_s, all_or_none=not (
                spec.kind == "numeric" and method in ("previous", "nearest"))), strict=True))
    return out


def _plan(episode: Episode, t: np.ndarray, snapped: dict[str, np.ndarray],
          specs: dict[str, StreamSpec], config: CacheConfig, rate: float,
          native: set[str]) -> _Plan:
    """One episode's plan on its grid ``t``, its streams' times ``snapped`` (:func:`_snapped`)."""
    tol = config.grid_tolerance_s
    n = len(t)
    exact, inputs = {}, {}
    for name, spec in specs.items():
        s = episode.streams[name]
        method = config.methods.get(name, default_method(spec, rate))
        if _exact(name, spec, method, native):
            k = _grid_steps(episode, name, float(t[0]), rate, tol)
            exact[name] = _place(s.data.reshape(len(s), -1) if spec.kind == "numeric"
                                 else np.arange(len(s)), k, n)
            continue
        if spec.kind == "event":
            if len(s):
                inputs[name] = ("previous", snapped[name],
                                np.arange(len(s), dtype=np.float32)[:, None])
        elif spec.kind == "numeric" and method in ("previous", "nearest"):
            # align sample ids and gather: the values stay bit-exact in their own dtype
            inputs[name] = (method, snapped[name], np.arange(len(s), dtype=np.float64)[:, None])
        elif spec.kind == "numeric":  # float64 interpolated in float64, the rest in float32
            inputs[name] = (method, snapped[name], np.asarray(
                s.data.reshape(len(s), -1),
                np.float64 if np.dtype(spec.dtype) == np.float64 else np.float32))
        else:
            if config.rate_hz == "native" and spec.rate_hz is not None and \
                    abs(spec.rate_hz - rate) <= 1e-9 * rate:
                _check_frames(episode, name, snapped[name], t, tol)
            inputs[name] = ("frame_index", snapped[name], None)
    return _Plan(t, exact, inputs)


def _check_frames(episode: Episode, name: str, times: np.ndarray, t: np.ndarray,
                  tolerance_s: float) -> None:
    """A camera at the grid's own rate has a frame within ``tolerance_s`` of every step, as
    LeRobot's decoder asks of each frame it serves (the nearest frame, within its
    ``tolerance_s``): a missing frame, a variable frame rate or a timestamp jump would
    otherwise serve a neighbour's frame at a step.

    Raises:
        DataError: naming the episode, camera, step and the nearest frame.
    """
    if not len(times):
        return
    lo, hi = _around(t, times)  # the steps are the samples here, the frames the instants
    _, close = _nearest(t, lo, hi, tolerance_s)
    far = np.flatnonzero(~close)
    if far.size:
        k = int(far[0])
        nearest = lo if abs(t[k] - lo[k]) <= abs(hi[k] - t[k]) else hi
        raise DataError(f"episode {episode.index}: camera {name!r} has no frame within "
                        f"{tolerance_s:g} s of step {k} (t = {float(t[k]):.4f} s; the nearest "
                        f"is at {float(nearest[k]):.4f} s; {far.size} of {len(t)} steps have "
                        "none): a missing frame, a variable frame rate or a timestamp jump, which "
                        "LeRobot's decoder refuses too. Fix the video, or ingest at an explicit "
                        "rate (--rate HZ), where each step serves the latest frame shown.")


def _padded(rows: list[np.ndarray], width: int) -> np.ndarray:
    """``rows`` (each ``[n_b, ...]``, n_b >= 1) as ``[B, width, ...]``, each padded with its
    last row (times stay non-decreasing; the op never reads past a row's length)."""
    out = np.empty((len(rows), width, *rows[0].shape[1:]), rows[0].dtype)
    for b, r in enumerate(rows):
        out[b, :len(r)] = r
        out[b, len(r):] = r[-1]
    return out


def _align(episodes: list[Episode], plans: list[_Plan], which: list[int],
           specs: dict[str, StreamSpec], config: CacheConfig, device) -> list[dict]:
    """One :func:`robocache.align` call for ``plans`` (episodes ``which``); per episode,
    stream -> (values ``[n, D]``, is_pad ``[n]``, age or offset ``[n]`` or ``None``)."""
    import torch

    import robocache

    if not plans:
        return []
    names = [n for n in specs if any(n in p.inputs for p in plans)]
    if not names:
        return [{} for _ in plans]
    far = max(float(p.t[-1]) for p in plans) + 1.0
    streams = {}
    for name in names:
        method = next(p.inputs[name][0] for p in plans if name in p.inputs)
        times, data = [], []
        for p in plans:
            # an episode without this (event) stream: a sample after every step, ignored
            _, ts, d = p.inputs.get(name, (method, np.array([far]), None))
            times.append(ts)
            data.append(d)
        width = max(len(ts) for ts in times)
        lengths = torch.as_tensor([len(ts) for ts in times], device=device)
        values = None
        if method != "frame_index":
            dim = next(d.shape[1] for d in data if d is not None)
            dtype = next(d.dtype for d in data if d is not None)
            values = torch.from_numpy(_padded([d if d is not None else np.zeros((1, dim), dtype)
                                               for d in data], width)).to(device)
        streams[name] = robocache.Stream(
            values, torch.from_numpy(_padded(times, width)).to(device), lengths, method,
            None if specs[name].kind == "event" else config.tolerance_s)
    target = torch.from_numpy(_padded([p.t for p in plans], max(len(p.t) for p in plans)))
    res = robocache.align(streams, target.to(device))
    host = {name: (res.values[name].cpu().numpy(), res.is_pad[name].cpu().numpy(),
                   res.age[name].cpu().numpy() if name in res.age else
                   res.offset[name].cpu().numpy() if name in res.offset else None)
            for name in names}
    out = []
    for b, p in enumerate(plans):
        n = len(p.t)
        out.append({name: (v[b, :n].reshape(n, -1), pad[b, :n],
                           None if aux is None else aux[b, :n])
                    for name, (v, pad, aux) in host.items() if name in p.inputs})
    return out


def _columns(episode: Episode, plan: _Plan, aligned: dict, specs: dict[str, StreamSpec],
             config: CacheConfig) -> dict[str, Any]:
    """One episode's Lance columns from its plan and its rows of the op's outputs."""
    t, n = plan.t, len(plan.t)
    cols: dict[str, Any] = {
        "episode_index": np.full(n, episode.index, np.int64),
        "step": np.arange(n, dtype=np.int64),
        "timestamp": t,
        "task": step_tasks(episode, t, config.grid_tolerance_s),
    }
    for name, spec in specs.items():
        col = column_name(name)
        if name in plan.exact:
            values, pad = plan.exact[name]
            if spec.kind == "numeric":
                cols[col] = values
            else:
                cols[f"{col}/frame"] = values
                cols[f"{col}/offset"] = np.zeros(n, np.float32)
            cols[f"{col}_is_pad"] = pad
            continue
        if name not in aligned:  # an event stream without events in this episode
            cols[col] = np.full(n, None, dtype=object)
            cols[f"{col}/age"] = np.full(n, np.nan, np.float32)
            cols[f"{col}_is_pad"] = np.ones(n, bool)
            continue
        values, pad, aux = aligned[name]
        if spec.kind == "numeric":
            method = plan.inputs[name][0]
            cols[col] = _numeric_column(episode.streams[name].data, values, method, spec)
            if method == "previous":  # held after its last sample, as an event (and online)
                pad = t < plan.inputs[name][1][0]  # its first sample, snapped onto the grid
        elif spec.kind == "event":
            # an event holds until the next one: only steps before the first are padding (its
            # time snapped onto the grid: a float32 time just after its step is at the step)
            pad = t < plan.inputs[name][1][0]
            events = episode.streams[name].data
            ids = values[:, 0].round().astype(np.int64)
            cols[col] = np.where(pad, None, events[ids.clip(0, len(events) - 1)])
            cols[f"{col}/age"] = aux.astype(np.float32, copy=False)
        else:
            cols[f"{col}/frame"] = np.where(pad, -1, values[:, 0].astype(np.int64))
            cols[f"{col}/offset"] = aux.astype(np.float32, copy=False)
        cols[f"{col}_is_pad"] = pad.astype(bool, copy=False)
    return cols


def _numeric_column(data: np.ndarray, values: np.ndarray, method: str,
                    spec: StreamSpec) -> np.ndarray:
    """A numeric stream's aligned rows ``[T, D]`` in its own dtype: ``previous``/``nearest``
    gather the aligned sample ids from ``data``; interpolated values round back to the dtype."""
    dtype = np.dtype(spec.dtype)
    if method in ("previous", "nearest"):
        ids = np.rint(values[:, 0]).astype(np.int64).clip(0, len(data) - 1)
        return data.reshape(len(data), -1)[ids]
    if dtype.kind in "biu":
        values = np.rint(values)
    return values.astype(dtype, copy=False)
