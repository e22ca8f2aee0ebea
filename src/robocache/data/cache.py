"""Build a training cache: every episode aligned to one rate, in a Lance dataset.

    $ robocache ingest data/sample/panda_multirate /tmp/panda.cache --rate 50

Layout of a cache directory::

    data.lance/         one row per (episode, step): episode_index, step, timestamp, task,
                        one column per stream (see below) and its `<column>_is_pad` mask
    frames/<col>.lance  image streams: one row per source frame (episode_index, frame, pixels;
                        or ``encoded`` bytes as the source stored them, for JPEG/PNG sources)
    stats.json          per-dimension mean, std, min, max, q01, q99 of every numeric stream
    manifest.json       source, rate, streams, episodes, quarantined episodes with reasons

Target times. At the source's own rate (``rate_hz="native"``, the default) the grid is the
source's frames: every sample of a stream at that rate lies within ``grid_tolerance_s`` of
``t0 + k / fps`` (``t0``: the episode's first such sample) and is stored at step ``k``
bit-exactly, in its own dtype; the step count comes from the frames, never from a float product.
A sample off that grid by more than the tolerance quarantines the episode, naming the stream,
the row and the offset. At any other rate the grid runs from the latest start to the earliest
end of the episode's numeric streams (continuous streams interpolate, never extrapolate), the
last instant included when the end lies within ``grid_tolerance_s`` of it. Either way, a source
timestamp within ``grid_tolerance_s`` of a grid instant is snapped onto it before alignment, so
``previous`` and ``nearest`` at that instant return that sample, never its neighbour. Per kind:

- numeric → ``method`` (default ``linear``; ``previous`` for integer/bool data) ``[D]`` in the
  stream's own dtype (``previous``/``nearest`` copy samples; interpolation rounds back to it).
- image / video → ``frame_index``: the source frame shown at each step (``<col>/frame``, -1 when
  none) and ``<col>/offset`` (t_frame - t_step, seconds). Video frames stay in their files.
- event (sparse strings) → ``previous``: the latest event so far (null before the first) and its
  age in seconds (``<col>/age``).

Stream names become column names with ``.`` replaced by ``/`` (Lance reserves ``.``).

Idempotent per episode: each episode is one Lance commit, so a killed run leaves whole episodes
only; re-running skips the episodes already in ``data.lance`` (resume) and re-checks the rest. A
malformed episode is quarantined with its reason and listed in the manifest; ``read = cached +
quarantined`` always holds.
"""

from __future__ import annotations

import datetime as _dt
import json
import logging
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from robocache.data.episode import Episode, Source, StreamSpec, check_episode
from robocache.data.lock import LOCK_NAME, CacheLock
from robocache.errors import DataError
from robocache.observability import metrics

CACHE_FORMAT = "robocache-cache/1"
STATS_BATCH_ROWS = 1 << 20


@dataclass
class CacheConfig:
    """Options of :func:`build` (CLI flags of ``robocache ingest`` map onto these).

    Attributes:
        rate_hz: target rate in Hz of every stream in the cache, or ``"native"``: the source's
            declared fps, every frame stored exactly (see the module docstring).
        device: where alignment runs: ``"cuda"``, ``"cpu"`` or ``None`` (CUDA when available).
        keys: streams to cache (default: all the source declares).
        methods: stream -> alignment method overriding the defaults (see the module docstring).
        tolerance_s: steps farther than this from any source sample are padded (``None``: off).
        grid_tolerance_s: seconds within which a timestamp counts as on the ``1 / rate`` grid
            (LeRobot's ``tolerance_s``); > 0.
        episodes: source episode indices to ingest (default: all).
        source_options: reader options, e.g. ``{"fps": 10.0}`` for a ReplayBuffer.
        overwrite: delete the cache at the destination instead of resuming it (only a directory
            recognised as a RoboCache cache is ever deleted).
        retry_quarantined: read again the episodes an earlier run quarantined (by default a
            resume leaves them quarantined).
        wait: when another process is writing the destination, wait for it to finish instead
            of failing with :class:`~robocache.errors.CacheBusyError`.
    """

    rate_hz: float | str = "native"
    device: str | None = None
    keys: list[str] | None = None
    methods: dict[str, str] = field(default_factory=dict)
    tolerance_s: float | None = None
    grid_tolerance_s: float = 1e-4
    episodes: list[int] | None = None
    source_options: dict[str, Any] = field(default_factory=dict)
    overwrite: bool = False
    retry_quarantined: bool = False
    wait: bool = False


def column_name(stream: str) -> str:
    """The Lance column of a stream (Lance reserves ``.`` for struct fields)."""
    return stream.replace(".", "/")


def default_method(spec: StreamSpec) -> str:
    if spec.kind in ("image", "video"):
        return "frame_index"
    if spec.kind == "event":
        return "previous"
    return "previous" if np.dtype(spec.dtype).kind in "biu" else "linear"


def _schema(specs: dict[str, StreamSpec]):
    import pyarrow as pa

    fields = [pa.field("episode_index", pa.int64()), pa.field("step", pa.int64()),
              pa.field("timestamp", pa.float64()), pa.field("task", pa.string())]
    for name, spec in specs.items():
        col = column_name(name)
        if spec.kind == "numeric":
            fields.append(pa.field(col, pa.list_(pa.from_numpy_dtype(np.dtype(spec.dtype)),
                                                 spec.dim)))
        elif spec.kind == "event":
            fields += [pa.field(col, pa.string()), pa.field(f"{col}/age", pa.float32())]
        else:
            fields += [pa.field(f"{col}/frame", pa.int64()),
                       pa.field(f"{col}/offset", pa.float32())]
        fields.append(pa.field(f"{col}_is_pad", pa.bool_()))
    return pa.schema(fields)


def _timed(specs: dict[str, StreamSpec]) -> list[str]:
    timed = [n for n, s in specs.items() if s.kind == "numeric"] or \
            [n for n, s in specs.items() if s.kind != "event"]
    return timed


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
        raise DataError(f"episode {episode.index}: stream {name!r} row {r} (t = {times[r]!r} s) "
                        f"is {off[r]:+.3e} s off the 1/{rate_hz:g} s grid (tolerance_s = "
                        f"{tolerance_s:g}); {bad.size} rows are off it. Fix the timestamps or "
                        "ingest at an explicit rate (--rate HZ) to resample.")
    dup = np.flatnonzero(np.diff(k) == 0)
    if dup.size:
        r = int(dup[0]) + 1
        raise DataError(f"episode {episode.index}: stream {name!r} rows {r - 1} and {r} fall on "
                        f"the same 1/{rate_hz:g} s grid step {int(k[r])}.")
    return k


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
        return t0 + np.arange(steps + 1, dtype=np.float64) / rate_hz
    timed = _timed(specs)
    if not timed:
        raise DataError(f"episode {episode.index}: no timed (non-event) stream to align.")
    start = max(float(episode.streams[n].times[0]) for n in timed)
    end = min(float(episode.streams[n].times[-1]) for n in timed)
    if end < start:
        raise DataError(f"episode {episode.index}: the streams do not overlap in time "
                        f"(latest start {start:.6f} s > earliest end {end:.6f} s).")
    steps = int(math.floor((end - start + tolerance_s) * rate_hz)) + 1
    # clamping keeps a last step within the tolerance past the end inside every stream
    return np.minimum(start + np.arange(steps, dtype=np.float64) / rate_hz, end)


def snap_times(times: np.ndarray, t: np.ndarray, tolerance_s: float,
               all_or_none: bool = False) -> np.ndarray:
    """``times`` with every sample within ``tolerance_s`` of a grid instant of ``t`` (float64,
    sorted) moved exactly onto it, so ``previous``/``nearest`` there return that sample.
    ``all_or_none``: move them only when every sample is that close (a stream on the grid)."""
    if len(t) == 0 or len(times) == 0:
        return times
    j = np.clip(np.searchsorted(t, times), 1, max(len(t) - 1, 1))
    lo = t[j - 1] if len(t) > 1 else t[:1].repeat(len(times))
    hi = t[j] if len(t) > 1 else lo
    near = np.where(np.abs(times - lo) <= np.abs(hi - times), lo, hi)
    close = np.abs(times - near) <= tolerance_s
    if all_or_none and not close.all():
        return times
    return np.where(close, near, times)


def _place(values: np.ndarray, k: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Samples at grid steps ``k`` as ``[n, ...]`` rows (steps without a sample hold the
    previous one, the first one before it) and the mask of those padded steps."""
    src = np.full(n, -1, np.int64)
    src[k] = np.arange(len(k))
    pad = src < 0
    src = np.maximum.accumulate(src)
    return values[np.where(src < 0, 0, src)], pad


def align_episode(episode: Episode, specs: dict[str, StreamSpec], config: CacheConfig,
                  device, fps: float | None = None) -> dict[str, Any]:
    """Align one (checked) episode to ``config.rate_hz`` (``fps``, the source's rate, when
    ``"native"``); returns the Lance columns as arrays."""
    import torch

    import robocache

    is_native = config.rate_hz == "native"
    rate, tol = float(fps if is_native else config.rate_hz), config.grid_tolerance_s
    t = target_times(episode, specs, rate, tol, native=is_native)
    n = len(t)
    native = set(native_streams(specs, rate)) if is_native else set()
    streams, events, exact = {}, {}, {}
    for name, spec in specs.items():
        s = episode.streams[name]
        method = config.methods.get(name, default_method(spec))
        if name in native and method != "frame_index" and (spec.kind == "numeric"
                                                           or method == "previous"):
            k = _grid_steps(episode, name, float(t[0]), rate, tol)
            exact[name] = _place(s.data.reshape(len(s), -1) if spec.kind == "numeric"
                                 else np.arange(len(s)), k, n)
            continue
        # numeric previous/nearest streams snap every sample near an instant; the others only
        # when the whole stream is on the grid (moving one jittered sample would bend an
        # interpolated curve by tol x slope, or shift an event's or frame's age/offset)
        snapped = snap_times(s.times, t, tol, all_or_none=not (
            spec.kind == "numeric" and method in ("previous", "nearest")))
        times = torch.as_tensor(snapped, dtype=torch.float64, device=device)
        if spec.kind == "event":
            if len(s) == 0:
                continue
            ids = torch.arange(len(s), dtype=torch.float32, device=device)[:, None]
            streams[name] = robocache.Stream(ids, times, method="previous")
            events[name] = s.data
        elif spec.kind == "numeric" and method in ("previous", "nearest"):
            # align sample ids and gather: the values stay bit-exact in their own dtype
            ids = torch.arange(len(s), dtype=torch.float64, device=device)[:, None]
            streams[name] = robocache.Stream(ids, times, method=method,
                                             tolerance_s=config.tolerance_s)
        elif spec.kind == "numeric":
            data = torch.from_numpy(np.array(s.data.reshape(len(s), -1), np.float32)).to(device)
            streams[name] = robocache.Stream(data, times, method=method,
                                             tolerance_s=config.tolerance_s)
        else:
            streams[name] = robocache.Stream(None, times, method="frame_index",
                                             tolerance_s=config.tolerance_s)
    out = robocache.align(streams, torch.as_tensor(t, device=device)) if streams else None
    cols: dict[str, Any] = {
        "episode_index": np.full(n, episode.index, np.int64),
        "step": np.arange(n, dtype=np.int64),
        "timestamp": t,
        "task": np.full(n, (episode.meta.get("tasks") or [""])[0], dtype=object),
    }
    for name, spec in specs.items():
        col = column_name(name)
        if name in exact:
            values, pad = exact[name]
            if spec.kind == "numeric":
                cols[col] = values
            else:
                cols[f"{col}/frame"] = values
                cols[f"{col}/offset"] = np.zeros(n, np.float32)
            cols[f"{col}_is_pad"] = pad
            continue
        if name not in streams:  # an event stream without events in this episode
            cols[col] = np.full(n, None, dtype=object)
            cols[f"{col}/age"] = np.full(n, np.nan, np.float32)
            cols[f"{col}_is_pad"] = np.ones(n, bool)
            continue
        pad = out.is_pad[name].reshape(n).cpu().numpy()
        values = out.values[name].reshape(n, -1).cpu().numpy()
        if spec.kind == "numeric":
            cols[col] = _numeric_column(episode.streams[name].data, values,
                                        streams[name].method, spec)
        elif spec.kind == "event":
            # an event holds until the next one: only steps before the first are padding
            pad = t < episode.streams[name].times[0]
            ids = values[:, 0].round().astype(np.int64)
            cols[col] = np.where(pad, None, events[name][ids.clip(0, len(events[name]) - 1)])
            cols[f"{col}/age"] = out.age[name].reshape(n).cpu().numpy().astype(np.float32)
        else:
            cols[f"{col}/frame"] = np.where(pad, -1, values[:, 0].astype(np.int64))
            cols[f"{col}/offset"] = out.offset[name].reshape(n).cpu().numpy().astype(np.float32)
        cols[f"{col}_is_pad"] = pad.astype(bool)
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
    return values.astype(dtype)


def _table(cols: dict[str, Any], schema):
    import pyarrow as pa

    arrays = []
    for f in schema:
        v = cols[f.name]
        if pa.types.is_fixed_size_list(f.type):
            arrays.append(pa.FixedSizeListArray.from_arrays(pa.array(v.reshape(-1)),
                                                            f.type.list_size))
        else:
            arrays.append(pa.array(v.tolist() if v.dtype == object else v, f.type))
    return pa.Table.from_arrays(arrays, schema=schema)


def _frames_table(episode: Episode, name: str, spec: StreamSpec):
    import pyarrow as pa

    s = episode.streams[name]
    n = len(s)
    if spec.encoding is not None:  # compressed frames are kept as they came: no re-encode
        pixels = pa.array(s.data.tolist(), pa.binary())
    else:
        pixels = pa.FixedSizeListArray.from_arrays(pa.array(s.data.reshape(-1)), spec.dim)
    return pa.table({"episode_index": np.full(n, episode.index, np.int64),
                     "frame": np.arange(n, dtype=np.int64), "timestamp": s.times,
                     "encoded" if spec.encoding is not None else "pixels": pixels})


def _done_episodes(uri: Path) -> set[int]:
    import lance

    if not uri.exists():
        return set()
    table = lance.dataset(str(uri)).to_table(columns=["episode_index"])
    return set(np.unique(table.column(0).to_numpy()).tolist())


def _compute_stats(uri: Path, specs: dict[str, StreamSpec]) -> dict[str, dict]:
    """Per-dimension stats of every numeric stream over its non-padded steps (merged over
    batches of ``STATS_BATCH_ROWS`` rows, see :func:`robocache.merge_stats`)."""
    import lance
    import torch

    import robocache

    ds = lance.dataset(str(uri))
    stats = {}
    for name, spec in specs.items():
        if spec.kind != "numeric":
            continue
        col = column_name(name)
        parts = []
        for batch in ds.to_batches(columns=[col, f"{col}_is_pad"],
                                   batch_size=STATS_BATCH_ROWS):
            values = batch.column(0).flatten().to_numpy(zero_copy_only=False)
            values = values.astype(np.float32).reshape(-1, spec.dim)
            keep = ~batch.column(1).to_numpy(zero_copy_only=False)
            if keep.any():
                parts.append(robocache.compute_stats(torch.from_numpy(values[keep])))
        if parts:
            stats[name] = robocache.merge_stats(parts).to_dict()
    return stats


def _episode_summary(uri: Path) -> list[dict[str, Any]]:
    import lance

    table = lance.dataset(str(uri)).to_table(columns=["episode_index", "timestamp", "task"])
    ep = table.column("episode_index").to_numpy()
    ts = table.column("timestamp").to_numpy()
    tasks = table.column("task").to_pylist()
    order = np.lexsort((ts, ep))
    ep, ts = ep[order], ts[order]
    starts = np.flatnonzero(np.r_[True, ep[1:] != ep[:-1]])
    ends = np.r_[starts[1:], len(ep)]
    return [{"index": int(ep[a]), "rows": int(b - a), "start_s": float(ts[a]),
             "duration_s": float(ts[b - 1] - ts[a]), "task": tasks[order[a]]}
            for a, b in zip(starts, ends, strict=True)]


def _write_json(path: Path, obj: Any) -> None:
    """Write ``obj`` as JSON atomically (temporary file, fsync, rename): a reader or a killed
    writer never leaves a truncated file."""
    import os

    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as f:
        f.write(json.dumps(obj, indent=2) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_manifest(dest: Path) -> dict[str, Any] | None:
    """The manifest of the cache at ``dest``; ``None`` when there is none.

    Raises:
        DataError: ``manifest.json`` exists but is not valid JSON (truncated or corrupted).
    """
    path = dest / "manifest.json"
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as e:
        raise DataError(f"{path} is unreadable ({e}); if this is a RoboCache cache, rebuild it "
                        "with --overwrite (overwrite=True).") from e


def is_cache(dest: Path) -> bool:
    """Whether ``dest`` is a RoboCache cache: a directory whose ``manifest.json`` declares the
    cache format (recognised in the raw text too, so a truncated manifest still counts)."""
    path = dest / "manifest.json"
    if not path.is_file():
        return False
    text = path.read_text(errors="replace")
    try:
        return json.loads(text).get("format") == CACHE_FORMAT
    except (ValueError, AttributeError):
        return f'"format": "{CACHE_FORMAT}"' in text


def _check_dest(source: Path, dest: Path) -> None:
    """Refuse a destination that would write into the source or over files that are not a
    cache (nothing outside a cache is ever deleted or written)."""
    src, out = source.resolve(), dest.resolve()
    if out == src or src in out.parents:
        raise DataError(f"DEST {dest} is inside the source dataset {source}, which is never "
                        "written; choose a destination outside the source.")
    if out in src.parents:
        raise DataError(f"the source {source} lies inside DEST {dest}; choose a destination "
                        "that does not contain the source.")
    if dest.exists() and not dest.is_dir():
        raise DataError(f"DEST {dest} is a file, not a directory; choose a new or empty "
                        "directory for the cache.")
    if dest.is_dir() and not is_cache(dest) and \
            any(p.name != LOCK_NAME for p in dest.iterdir()):
        raise DataError(f"DEST {dest} is not empty and is not a RoboCache cache (no manifest.json "
                        "of one), so it is neither resumed nor removed (--overwrite removes only "
                        "caches); choose a new or empty destination.")


def _remove_cache(dest: Path, log) -> None:
    """Delete the cache at ``dest`` (checked by :func:`_check_dest`), keeping the held lock file;
    says what it removes."""
    import shutil

    try:
        cached = (read_manifest(dest) or {}).get("counts", {}).get("cached", "unfinished")
    except DataError:
        cached = "unreadable manifest"
    entries = sorted(p for p in dest.iterdir() if p.name != LOCK_NAME)
    log(f"overwrite: removing the RoboCache cache at {dest} (episodes: {cached}): "
        + ", ".join(p.name for p in entries))
    for p in entries:
        shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()


def _claim(dest: Path, header: dict[str, Any], overwrite: bool, log) -> list[dict[str, Any]]:
    """With ``dest`` locked: remove the old cache (``overwrite``) or check that the cache there
    was built from the same source, rate and streams (so a resume never mixes two
    configurations); write the in-progress manifest. Returns the quarantine list carried over."""
    if overwrite and is_cache(dest):
        _remove_cache(dest, log)
    old = read_manifest(dest)
    if old is not None and (dest / "data.lance").exists():
        for key in ("source", "rate_hz", "streams"):
            if old.get(key) != header[key]:
                raise DataError(f"{dest} holds a cache with a different {key} "
                                f"({old.get(key)!r} vs {header[key]!r}); pick a new destination "
                                "or pass overwrite=True (--overwrite).")
    carried = old.get("quarantined", []) if old is not None and \
        all(old.get(k) == header[k] for k in ("source", "rate_hz", "streams")) else []
    _write_json(dest / "manifest.json", {**header, "status": "building", "quarantined": carried})
    return carried


def _device(name: str | None):
    import torch

    from robocache.errors import DeviceError

    if name is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError as e:
        raise DeviceError(f"`device` (--device) {name!r} is not a device; pass cuda or cpu.") \
            from e
    if device.type == "cuda" and not torch.cuda.is_available():
        raise DeviceError(f"`device` (--device) is {name!r} but no CUDA device is available; "
                          "pass cpu (or leave it unset).")
    if device.type not in ("cuda", "cpu"):
        raise DeviceError(f"`device` (--device) {name!r} is not supported; pass cuda or cpu.")
    return device


def build(source: str | Path | Source, dest: str | Path, config: CacheConfig | None = None, *,
          progress: bool = True, log: Callable[[str], None] | None = None,
          **overrides: Any) -> dict[str, Any]:
    """Ingest a dataset into a training cache at ``dest`` (see the module docstring).

    Args:
        source: a dataset path (format detected, see :func:`robocache.data.formats.open_source`)
            or an opened source.
        dest: cache directory (created; an existing cache of the same source resumes).
        config: options; keyword ``overrides`` replace its fields (``rate_hz=50.0``...).
        progress: show a rich progress bar on stderr.
        log: where notices go (what ``overwrite`` removes); default: this module's logger.

    Returns:
        The manifest (also written to ``dest/manifest.json``): ``counts`` (read, cached,
        quarantined, skipped, rows), ``episodes``, ``quarantined`` (index + reason), ``streams``,
        ``stats_path``, ``seconds``.

    Raises:
        DataError: unknown format, a requested key the source lacks, a non-positive rate, or
            ``dest`` holds another cache (different source, rate or streams) or other files.
        CacheBusyError: another process is writing ``dest`` (and ``wait`` is off).
        FileNotFoundError: ``source`` does not exist.

    Example:
        >>> m = build("data/sample/panda_multirate", "/tmp/panda.cache", rate_hz=50)
        >>> c = m["counts"]; c["read"] == c["cached"] + c["quarantined"]
        True
    """

    from robocache.data.formats import open_source

    config = CacheConfig(**{**asdict(config or CacheConfig()), **overrides})
    native = config.rate_hz == "native"
    if not native and not (isinstance(config.rate_hz, (int, float))
                           and config.rate_hz > 0 and math.isfinite(config.rate_hz)):
        raise DataError(f"`rate_hz` (--rate) must be a finite rate > 0 Hz or 'native'; got "
                        f"{config.rate_hz!r}.")
    if not (config.grid_tolerance_s > 0 and math.isfinite(config.grid_tolerance_s)):
        raise DataError(f"`grid_tolerance_s` (--grid-tolerance) must be > 0 seconds; got "
                        f"{config.grid_tolerance_s!r} (LeRobot's default is 1e-4).")
    device = _device(config.device)
    src = source if hasattr(source, "read") else open_source(source, **config.source_options)
    fps = native_rate(src) if native else None
    specs = dict(src.specs)
    if config.keys is not None:
        missing = sorted(set(config.keys) - set(specs))
        if missing:
            raise DataError(f"`keys` (--key) names streams the source lacks: {missing}; it "
                            f"has {sorted(specs)}.")
        specs = {k: specs[k] for k in config.keys}
    dest = Path(dest)
    streams = {name: {"column": column_name(name), "kind": s.kind, "dtype": s.dtype,
                      "shape": list(s.shape), "dim": s.dim, "source_rate_hz": s.rate_hz,
                      "method": config.methods.get(name, default_method(s)),
                      **({"encoding": s.encoding} if s.encoding else {})}
               for name, s in specs.items()}
    header = {"format": CACHE_FORMAT,
              "source": {"path": str(Path(src.path).resolve()), "format": src.format},
              "rate_hz": fps or float(config.rate_hz), "native": native, "streams": streams}
    _check_dest(Path(src.path), dest)
    dest.mkdir(parents=True, exist_ok=True)
    with CacheLock(dest, wait=config.wait):
        _check_dest(Path(src.path), dest)  # again: another writer may have changed it
        return _build_locked(src, dest, specs, header, config, device, progress,
                             log or logging.getLogger(__name__).warning)


def _reason(src: Source, index: int, e: BaseException) -> str:
    """A quarantine reason: where in the source (file, rows; when the reader can tell) and the
    exception text."""
    try:
        where = src.locate(index) if hasattr(src, "locate") else None
    except Exception:  # locating is a courtesy; the reason stands without it
        where = None
    text = f"{type(e).__name__}: {e}"
    return f"{where}: {text}" if where and where not in str(e) else text


def _build_locked(src: Source, dest: Path, specs: dict[str, StreamSpec], header: dict[str, Any],
                  config: CacheConfig, device, progress: bool, log) -> dict[str, Any]:
    """:func:`build` once ``dest`` is locked: every read and write of the cache happens here."""
    import lance

    carried = _claim(dest, header, config.overwrite, log)
    fps = header["rate_hz"] if header["native"] else None
    uri = dest / "data.lance"
    schema = _schema(specs)
    done = _done_episodes(uri)
    wanted = list(dict.fromkeys(config.episodes if config.episodes is not None
                                else src.episode_indices()))
    quarantine = {int(q["index"]): q for q in carried}
    running = {**header, "status": "building"}
    obs = metrics.ingest(src.path, len(wanted))
    t0 = time.perf_counter()
    cached_now = 0
    with _progress(progress, len(wanted)) as advance:
        for index in wanted:
            if index in done:
                obs.skipped(index)
                advance(f"episode {index} (cached)")
                continue
            if index in quarantine and not config.retry_quarantined:
                obs.quarantined(index, None)
                advance(f"episode {index} (quarantined before)")
                continue
            obs.start()
            try:
                # a reader may fail in any way on a corrupt file (codecs raise their own types):
                # the episode is quarantined with the reason, the rest proceeds
                episode = src.read(index)
                obs.lap("read")
                check_episode(episode, specs)
                cols = align_episode(episode, specs, config, device, fps)
                obs.lap("align")
            except MemoryError:
                raise
            except Exception as e:
                quarantine[int(index)] = {"index": int(index), "reason": _reason(src, index, e)}
                _write_json(dest / "manifest.json",
                            {**running, "quarantined": list(quarantine.values())})
                obs.quarantined(index, e)
                advance(f"episode {index} quarantined")
                continue
            for name, spec in specs.items():
                if spec.kind == "image":
                    furi = dest / "frames" / f"{name}.lance"
                    if furi.exists():  # drop frames a killed run left for this episode
                        lance.dataset(str(furi)).delete(f"episode_index = {index}")
                    lance.write_dataset(_frames_table(episode, name, spec), str(furi),
                                        mode="append" if furi.exists() else "create")
            lance.write_dataset(_table(cols, schema), str(uri),
                                mode="append" if uri.exists() else "create")
            if quarantine.pop(int(index), None) is not None:  # retried and now cached
                _write_json(dest / "manifest.json",
                            {**running, "quarantined": list(quarantine.values())})
            cached_now += 1
            obs.cached(index, episode, cols)
            advance(f"episode {index}")
    if uri.exists():
        ds = lance.dataset(str(uri))
        if len(ds.get_fragments()) > 1:
            ds.optimize.compact_files()
            ds.cleanup_old_versions(older_than=_dt.timedelta(0))
    episodes = _episode_summary(uri) if uri.exists() else []
    stats = _compute_stats(uri, specs) if uri.exists() else {}
    _write_json(dest / "stats.json", stats)
    cached_ids = {e["index"] for e in episodes}
    manifest = {
        **header,
        "status": "complete",
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "device": str(device),
        "timing": getattr(src, "timing", None),
        "counts": {"read": len(wanted), "cached": sum(i in cached_ids for i in wanted),
                   "quarantined": sum(i in quarantine for i in wanted),
                   "skipped": len(done & set(wanted)), "new": cached_now,
                   "rows": sum(e["rows"] for e in episodes)},
        "episodes": episodes,
        "quarantined": sorted(quarantine.values(), key=lambda q: q["index"]),
        "stats_path": "stats.json",
        "seconds": time.perf_counter() - t0,
    }
    _write_json(dest / "manifest.json", manifest)
    obs.done(manifest)
    return manifest


def native_rate(src: Source) -> float:
    """The rate a source declares (``fps``), for ``rate_hz="native"``."""
    fps = getattr(src, "fps", None)
    if not isinstance(fps, (int, float)) or not fps > 0:
        raise DataError(f"{src.path}: the source declares no positive fps ({fps!r}); pass an "
                        "explicit rate (rate_hz=HZ, --rate HZ).")
    return float(fps)


class _progress:
    """Context manager yielding ``advance(description)``; a rich bar when enabled."""

    def __init__(self, enabled: bool, total: int):
        self.enabled, self.total, self.bar = enabled, total, None

    def __enter__(self):
        if not self.enabled:
            return lambda _desc: None
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
        )

        self.bar = Progress(TextColumn("ingest"), BarColumn(), MofNCompleteColumn(),
                            TimeRemainingColumn(), TextColumn("{task.description}"),
                            transient=False)
        self.bar.start()
        task = self.bar.add_task("", total=self.total)
        return lambda desc: self.bar.update(task, advance=1, description=desc)

    def __exit__(self, *exc):
        if self.bar is not None:
            self.bar.stop()
        return False
