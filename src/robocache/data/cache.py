"""Build a training cache: every episode aligned to one rate, in a Lance dataset.

    $ robocache ingest data/sample/panda_multirate /tmp/panda.cache --rate 50

Layout of a cache directory::

    data.lance/         one row per (episode, step): episode_index, step, timestamp, task,
                        one column per stream (see below) and its `<column>_is_pad` mask
    frames/<col>.lance  camera streams: one row per source frame (episode_index, frame,
                        source_frame, timestamp, encoded: JPEG/PNG bytes; a source's own JPEG/PNG
                        bytes are kept as they came), see :mod:`robocache.data.cameras`
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
  none) and ``<col>/offset`` (t_frame - t_step, seconds). Video frames are decoded once here
  and stored like image frames (JPEG by default, ``camera_codec``).
- event (sparse strings) → ``previous``: the latest event so far (null before the first) and its
  age in seconds (``<col>/age``).

Stream names become column names with ``.`` replaced by ``/`` (Lance reserves ``.``).

Episodes are read, their videos decoded and their camera frames encoded ``decode_workers`` at a
time (threads that read; videos decoded and encoded in as many worker processes, see
:func:`robocache.data.cameras.camera_tables`), ahead of the episode being aligned and written;
they are aligned, written and committed one by one in the source's order, so the cache holds
the same rows and frame bytes whatever the number of workers, and at most
``decode_workers + 1`` episodes' frames are in memory at once (as JPEG/PNG bytes: a video is
encoded as it decodes).

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
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing, contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from robocache._optional import require
from robocache.data import jpeg
from robocache.data.cameras import (
    CODECS,
    DEFAULT_CHROMA,
    DEFAULT_QUALITY,
    VIDEO_DECODERS,
    FrameFormat,
    camera_tables,
    decode_videos,
    frames_table,
    nvdec_available,
    worker_pool,
)
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
        shard: ``(i, n)`` or ``"i/n"``: cache only the episodes at positions ``p`` of the
            wanted list with ``p % n == i`` (see :func:`parse_shard`), so ``n`` independent
            jobs split a dataset; ``robocache merge`` joins their caches.
        camera_codec: how camera frames are stored: ``"jpeg"`` (GPU-decodable) or ``"png"``
            (lossless); uint16 (depth) frames are always PNG.
        camera_quality: JPEG quality (1-100; default 95).
        camera_chroma: JPEG chroma subsampling: ``"444"`` (default: none; within 40 dB PSNR
            of the source's decode on sharp-edged content at quality 95), ``"422"`` or
            ``"420"`` (smaller, blurs colour edges); see docs/cameras.md for bytes against
            PSNR.
        camera_size: ``(height, width)`` (or ``"HEIGHTxWIDTH"``) to store RGB camera frames
            at, resized at ingest (antialiased bilinear), or ``None`` (default) for the
            source's size. Training usually resizes to a fixed input anyway; stored at that
            size, each batch decodes that many fewer pixels. The cache's frames are then no
            longer the source's (not what LeRobot serves); depth frames keep their size.
        decode_workers: episodes read, video-decoded and JPEG-encoded at once (``None``: the
            machine's cores): read on threads, their videos decoded and encoded in as many
            worker processes (none for 1: on the reading thread). The cache is the same
            whatever the number.
        video_decoder: who decodes video streams: ``"pyav"`` (default: the CPU decode
            LeRobot's reader does, so cached frames match LeRobot's within the JPEG
            tolerance), ``"auto"`` (NVDEC through PyNvVideoCodec for H.264/HEVC when a CUDA
            GPU and PyNvVideoCodec are present, else PyAV) or ``"nvdec"`` (NVDEC required;
            AV1, or a video NVDEC fails on, still goes to PyAV, with a warning). Same frames
            and timestamps either way; NVDEC's pixel values differ slightly (its colour
            conversion), see docs/cameras.md.
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
    shard: tuple[int, int] | str | None = None
    camera_codec: str = "jpeg"
    camera_quality: int = DEFAULT_QUALITY
    camera_chroma: str = DEFAULT_CHROMA
    camera_size: tuple[int, int] | str | None = None
    decode_workers: int | None = None
    video_decoder: str = "pyav"


def parse_shard(text: str) -> tuple[int, int]:
    """``"i/n"`` -> ``(i, n)`` with ``0 <= i < n``.

    Raises:
        DataError: anything else (the message shows the form expected).
    """
    i, sep, n = str(text).partition("/")
    if sep and i.strip().isdigit() and n.strip().isdigit() and int(i) < int(n):
        return int(i), int(n)
    raise DataError(f"`shard` (--shard) must be i/n with 0 <= i < n (shard i of n, e.g. 0/4); "
                    f"got {text!r}.")


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
    pa = require("pyarrow", "data", "Arrow tables")

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


def load_episode(src: Source, index: int, specs: dict[str, StreamSpec],
                 video_decoder: str = "pyav", gpu: int = 0,
                 lock: threading.Lock | None = None) -> Episode:
    """Read episode ``index`` (its videos decoded by ``video_decoder``, see
    :func:`robocache.data.cameras.decode_video`) and check it against ``specs`` (a bad episode
    raises). ``lock``: held while the source reads (readers are not all thread-safe)."""
    if lock is None:
        episode = src.read(index)
    else:
        with lock:
            episode = src.read(index)
    decode_videos(episode, specs, decoder=video_decoder, gpu=gpu)
    check_episode(episode, specs)
    return episode


def decode_workers(config: CacheConfig) -> int:
    """The number of episodes :func:`build` prepares at once (``config.decode_workers``, or
    the machine's cores)."""
    return config.decode_workers or os.cpu_count() or 1


@dataclass
class Prepared:
    """One episode made ready off the writing thread (:func:`prepare_episode`): read, its
    videos decoded, checked, its camera frames encoded (``frames``: stream -> Lance table);
    or the ``error`` that quarantines it. ``seconds``: stage -> seconds spent."""

    index: int
    episode: Episode | None = None
    frames: dict[str, Any] | None = None
    error: Exception | None = None
    seconds: dict[str, float] = field(default_factory=dict)


def prepare_episode(src: Source, index: int, specs: dict[str, StreamSpec],
                    config: CacheConfig, *, gpu: int = 0, workers=None,
                    threads: int = 0, lock: threading.Lock | None = None) -> Prepared:
    """Read, check, decode and encode episode ``index`` (safe on a worker thread: the source
    reads under ``lock``; ``workers``: the :class:`~robocache.data.cameras.CameraWorkers`
    that decode and encode its videos, else this thread with ``threads`` FFmpeg threads, see
    :func:`~robocache.data.cameras.camera_tables`). What waits to be written is the
    episode's JPEG/PNG bytes, never its decoded pixels. Any failure but ``MemoryError`` is
    returned as ``error`` (the episode is quarantined with it)."""
    t0 = time.perf_counter()
    out = Prepared(index)
    try:
        if lock is None:
            episode = src.read(index)
        else:
            with lock:
                episode = src.read(index)
        check_episode(episode, specs)  # videos still in their files: their frames next
        t1 = time.perf_counter()
        out.frames = camera_tables(episode, specs, frame_format(config),
                                   {name: stored_size(spec, config)
                                    for name, spec in specs.items()},
                                   decoder=config.video_decoder, gpu=gpu, workers=workers,
                                   threads=threads)
        out.episode = episode
        out.seconds = {"read": t1 - t0, "encode": time.perf_counter() - t1}
    except MemoryError:
        raise
    except Exception as e:  # a reader or codec may fail in any way on a corrupt file
        out.error = e
    return out


def prepared(src: Source, indices: Iterable[int], specs: dict[str, StreamSpec],
             config: CacheConfig, *, gpu: int = 0) -> Iterator[Prepared]:
    """:func:`prepare_episode` of each of ``indices``, in their order, ``decode_workers`` at a
    time: at most that many episodes are being prepared while the caller handles the one
    yielded. Episodes are read on threads; their videos are decoded and encoded in as many
    worker processes (:func:`robocache.data.cameras.worker_pool`), NVDEC's on the threads
    (its decoders share this process's CUDA context)."""
    workers = decode_workers(config)
    lock = threading.Lock()
    videos = any(spec.kind == "video" for spec in specs.values())
    cameras = worker_pool(workers) if workers > 1 and videos else None
    pool = ThreadPoolExecutor(workers, thread_name_prefix="robocache-ingest")
    try:
        it = iter(indices)
        pending: deque = deque()

        def submit() -> None:
            for index in it:
                pending.append(pool.submit(prepare_episode, src, index, specs, config,
                                           gpu=gpu, workers=cameras, lock=lock))
                return

        for _ in range(workers):
            submit()
        while pending:
            result = pending.popleft().result()
            submit()
            yield result
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


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
        "task": step_tasks(episode, t, tol),
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
    pa = require("pyarrow", "data", "Arrow tables")

    arrays = []
    for f in schema:
        v = cols[f.name]
        if pa.types.is_fixed_size_list(f.type):
            arrays.append(pa.FixedSizeListArray.from_arrays(pa.array(v.reshape(-1)),
                                                            f.type.list_size))
        else:
            arrays.append(pa.array(v.tolist() if v.dtype == object else v, f.type))
    return pa.Table.from_arrays(arrays, schema=schema)


def parse_size(size: tuple[int, int] | str) -> tuple[int, int]:
    """``camera_size`` as ``(height, width)``, from a pair or ``"HEIGHTxWIDTH"``."""
    try:
        hw = tuple(int(v) for v in size.lower().split("x")) if isinstance(size, str) \
            else tuple(size)
    except (TypeError, ValueError):
        hw = ()
    if len(hw) != 2 or not all(isinstance(v, int) and v >= 1 for v in hw):
        raise DataError(f"`camera_size` (--camera-size) must be HEIGHTxWIDTH (or (height, "
                        f"width)), two integers >= 1, e.g. 224x224; got {size!r}.")
    return hw


def stored_size(spec: StreamSpec, config: CacheConfig) -> tuple[int, int] | None:
    """The ``(height, width)`` a camera stream's frames are resized to at ingest: the
    ``camera_size`` of ``config`` for RGB uint8 frames, else ``None`` (stored as they come)."""
    if config.camera_size is None or spec.kind not in ("image", "video") or \
            spec.dtype != "uint8" or len(spec.shape) != 3 or spec.shape[2] != 3:
        return None
    return tuple(config.camera_size)


def frame_format(config: CacheConfig) -> FrameFormat:
    """How ``config`` stores camera frames."""
    return FrameFormat(config.camera_codec, config.camera_quality, config.camera_chroma)


def _camera_entry(spec: StreamSpec, config: CacheConfig) -> dict[str, Any]:
    """Manifest fields of a camera stream: how its frames are stored (and at which shape,
    when resized)."""
    if spec.kind not in ("image", "video"):
        return {}
    size = stored_size(spec, config)
    kept = spec.encoding if size is None else None  # a source's own bytes, unless resized
    codec = kept or ("png" if spec.dtype == "uint16" else config.camera_codec)
    encoded = codec == "jpeg" and kept is None
    entry = {"codec": codec, "quality": config.camera_quality if encoded else None}
    if encoded:
        entry["chroma"] = config.camera_chroma
    if size is not None:
        entry.update(shape=[*size, 3], source_shape=list(spec.shape))
    return entry


def write_episode(dest: Path, episode: Episode, cols: dict[str, Any],
                  specs: dict[str, StreamSpec], config: CacheConfig | None = None,
                  frames: dict[str, Any] | None = None) -> list[tuple[str, Any, list]]:
    """Write one aligned episode's Lance data files under ``dest``, uncommitted (invisible
    until :func:`commit` adds them; a writer killed here leaves no rows). Returns
    ``(table path relative to dest, schema, fragments)``: camera frames first (encoded as
    ``config`` says, unless ``frames`` holds their tables already), the aligned rows last. Safe
    to run in parallel processes (each writes its own files)."""
    config = config or CacheConfig()
    frames = frames or {}
    tables = [(f"frames/{name}.lance", frames[name] if name in frames else
               frames_table(episode, name, spec, frame_format(config),
                            stored_size(spec, config)))
              for name, spec in specs.items() if spec.kind in ("image", "video")]
    tables.append(("data.lance", _table(cols, _schema(specs))))
    return [(rel, t.schema, write_files(t, dest / rel)) for rel, t in tables]


def write_files(data, uri: Path) -> list:
    """Lance data files of ``data`` (a table or a record batch reader) for the dataset at
    ``uri``, uncommitted; returns their fragments for :func:`commit`."""
    from lance.fragment import write_fragments

    schema = data.schema
    if not _committed(uri):  # mode "create" (not "append"): Lance warns of no dataset otherwise
        try:
            return write_fragments(data, str(uri), schema, mode="create")
        except OSError:
            if not _committed(uri):  # not the race with the first commit: a real failure
                raise
    return write_fragments(data, str(uri), schema, mode="append")


def commit(dest: Path, episodes: list[int], written: list[tuple[str, Any, list]]) -> None:
    """Add the fragments of :func:`write_episode` (for ``episodes``) to the cache, one Lance
    commit per table, rows last: an episode is cached once its rows are. Image frames a killed
    run left for these episodes are dropped first, so nothing is ever duplicated."""
    lance = require("lance", "data", "The Lance cache", "pylance")

    for rel, schema, fragments in written:
        uri = str(dest / rel)
        if not _committed(dest / rel):
            lance.LanceDataset.commit(uri, lance.LanceOperation.Overwrite(schema, fragments))
            continue
        ds = lance.dataset(uri)
        if rel != "data.lance":
            ds.delete(f"episode_index IN ({', '.join(map(str, episodes))})")
            ds = lance.dataset(uri)
        lance.LanceDataset.commit(uri, lance.LanceOperation.Append(fragments),
                                  read_version=ds.version)


def _committed(uri: Path) -> bool:
    """Whether a Lance dataset has a version at ``uri`` (uncommitted files may precede one)."""
    return (uri / "_versions").is_dir()


def _done_episodes(uri: Path) -> set[int]:
    lance = require("lance", "data", "The Lance cache", "pylance")

    if not _committed(uri):
        return set()
    table = lance.dataset(str(uri)).to_table(columns=["episode_index"])
    return set(np.unique(table.column(0).to_numpy()).tolist())


def _compute_stats(uri: Path, specs: dict[str, StreamSpec]) -> dict[str, dict]:
    """Per-dimension stats of every numeric stream over its non-padded steps (merged over
    batches of ``STATS_BATCH_ROWS`` rows, see :func:`robocache.merge_stats`)."""
    import torch

    import robocache

    lance = require("lance", "data", "The Lance cache", "pylance")

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
    lance = require("lance", "data", "The Lance cache", "pylance")

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


def _tmp(path: Path) -> Path:
    return path.with_name(f".{path.name}.tmp")


def _write_json(path: Path, obj: Any, indent: int | None = 2) -> None:
    """Write ``obj`` as JSON atomically (temporary file, fsync, rename): a reader or a killed
    writer never leaves a truncated file."""
    import os

    tmp = _tmp(path)
    with open(tmp, "w") as f:
        f.write(json.dumps(obj, indent=indent) + "\n")
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
    # the lock and a first manifest a killed writer left half-written are ours, not foreign
    ours = {LOCK_NAME, _tmp(dest / "manifest.json").name}
    if dest.is_dir() and not is_cache(dest) and any(p.name not in ours for p in dest.iterdir()):
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


# the manifest fields that identify a cache's configuration: a resume or merge must match them
IDENTITY = ("format", "source", "rate_hz", "native", "streams")


def _claim(dest: Path, header: dict[str, Any], overwrite: bool, log) -> list[dict[str, Any]]:
    """With ``dest`` locked: remove the old cache (``overwrite``) or check that the cache there
    was built from the same source, rate (native or not) and streams (so a resume never mixes two
    configurations); write the in-progress manifest. Returns the quarantine list carried over."""
    if overwrite and is_cache(dest):
        _remove_cache(dest, log)
    old = read_manifest(dest)
    if old is not None and (dest / "data.lance").exists():
        for key in IDENTITY:
            if old.get(key) != header[key]:
                raise DataError(f"{dest} holds a cache with a different {key} "
                                f"({old.get(key)!r} vs {header[key]!r}); pick a new destination "
                                "or pass overwrite=True (--overwrite).")
    carried = old.get("quarantined", []) if old is not None and \
        all(old.get(k) == header[k] for k in IDENTITY) else []
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


def open_specs(source: str | Path | Source, config: CacheConfig) -> tuple[Source, dict]:
    """Open ``source`` (unless already open) and pick the streams ``config.keys`` names."""
    from robocache.data.formats import open_source

    src = source if hasattr(source, "read") else open_source(source, **config.source_options)
    specs = dict(src.specs)
    if config.keys is not None:
        missing = sorted(set(config.keys) - set(specs))
        if missing:
            raise DataError(f"`keys` (--key) names streams the source lacks: {missing}; it "
                            f"has {sorted(specs)}.")
        specs = {k: specs[k] for k in config.keys}
    return src, specs


@contextmanager
def locked_run(source: str | Path | Source, dest: str | Path, config: CacheConfig | None = None,
               *, log: Callable[[str], None] | None = None, **overrides: Any) -> Iterator[Run]:
    """Validate the options, open the source, lock and claim ``dest``: the first half of
    :func:`build`, shared by the drivers that build the same cache another way (Ray). Yields
    the :class:`Run`; the lock is held until the block exits."""
    config = CacheConfig(**{**asdict(config or CacheConfig()), **overrides})
    native = config.rate_hz == "native"
    if not native and not (isinstance(config.rate_hz, (int, float))
                           and config.rate_hz > 0 and math.isfinite(config.rate_hz)):
        raise DataError(f"`rate_hz` (--rate) must be a finite rate > 0 Hz or 'native'; got "
                        f"{config.rate_hz!r}.")
    if not (config.grid_tolerance_s > 0 and math.isfinite(config.grid_tolerance_s)):
        raise DataError(f"`grid_tolerance_s` (--grid-tolerance) must be > 0 seconds; got "
                        f"{config.grid_tolerance_s!r} (LeRobot's default is 1e-4).")
    if config.decode_workers is not None and not (
            isinstance(config.decode_workers, int) and config.decode_workers >= 1):
        raise DataError(f"`decode_workers` (--decode-workers) must be an integer >= 1 (or "
                        f"unset: the machine's cores); got {config.decode_workers!r}.")
    if config.video_decoder not in VIDEO_DECODERS:
        raise DataError(f"`video_decoder` (--video-decoder) must be one of {VIDEO_DECODERS}; "
                        f"got {config.video_decoder!r}.")
    if config.video_decoder == "nvdec" and not nvdec_available():
        from robocache.errors import DeviceError

        raise DeviceError("`video_decoder` (--video-decoder) is 'nvdec' but NVDEC is not "
                          "available: it needs a CUDA GPU and PyNvVideoCodec (`pip install "
                          "PyNvVideoCodec`); pass auto or pyav to decode on the CPU.")
    if config.camera_codec not in CODECS:
        raise DataError(f"`camera_codec` (--camera-codec) must be one of {CODECS}; got "
                        f"{config.camera_codec!r}.")
    jpeg.check(config.camera_quality, config.camera_chroma)
    if config.camera_size is not None:
        config.camera_size = parse_size(config.camera_size)
    if config.shard is not None:
        config.shard = parse_shard(config.shard if isinstance(config.shard, str)
                                   else "/".join(map(str, config.shard)))
    device = _device(config.device)
    src, specs = open_specs(source, config)
    fps = native_rate(src) if native else None
    dest = Path(dest)
    streams = {name: {"column": column_name(name), "kind": s.kind, "dtype": s.dtype,
                      "shape": list(s.shape), "dim": s.dim, "source_rate_hz": s.rate_hz,
                      "method": config.methods.get(name, default_method(s)),
                      **({"encoding": s.encoding} if s.encoding else {}),
                      **_camera_entry(s, config)}
               for name, s in specs.items()}
    header = {"format": CACHE_FORMAT,
              "source": {"path": str(Path(src.path).resolve()), "format": src.format},
              "rate_hz": fps or float(config.rate_hz), "native": native, "streams": streams}
    if config.shard is not None:
        header["shard"] = list(config.shard)
    _check_dest(Path(src.path), dest)
    dest.mkdir(parents=True, exist_ok=True)
    with CacheLock(dest, wait=config.wait):
        _check_dest(Path(src.path), dest)  # again: another writer may have changed it
        carried = _claim(dest, header, config.overwrite,
                         log or logging.getLogger(__name__).warning)
        yield Run(src, specs, config, device, dest, header, carried)


def _reason(src: Source, index: int, e: BaseException) -> str:
    """A quarantine reason: where in the source (file, rows; when the reader can tell) and the
    exception text."""
    try:
        where = src.locate(index) if hasattr(src, "locate") else None
    except Exception:  # locating is a courtesy; the reason stands without it
        where = None
    text = f"{type(e).__name__}: {e}"
    return f"{where}: {text}" if where and where not in str(e) else text


class Run:
    """One locked build of ``dest`` (from :func:`locked_run`): the episodes to do and the
    bookkeeping every driver shares (quarantine kept in the manifest as it grows, commits,
    the final manifest).

    Attributes:
        src, specs, config, device, dest, header: the source, streams, options, alignment
            device, cache directory and the manifest fields that identify the cache.
        wanted: the source episodes this build covers (after ``episodes`` and ``shard``).
        done: those already cached; quarantine: index -> entry (carried from earlier runs).
    """

    def __init__(self, src: Source, specs: dict[str, StreamSpec], config: CacheConfig, device,
                 dest: Path, header: dict[str, Any], carried: list[dict[str, Any]]):
        self.src, self.specs, self.config, self.device = src, specs, config, device
        self.dest, self.header = dest, header
        self.fps = header["rate_hz"] if header["native"] else None  # align_episode's grid
        wanted = list(dict.fromkeys(config.episodes if config.episodes is not None
                                    else src.episode_indices()))
        if config.shard is not None:
            wanted = wanted[config.shard[0]::config.shard[1]]
        self.wanted = wanted
        self.done = _done_episodes(dest / "data.lance")
        self.quarantine = {int(q["index"]): q for q in carried}
        self.new, self.t0 = 0, time.perf_counter()
        self.obs = metrics.ingest(src, len(wanted))  # metrics and log events per episode
        # NVDEC decodes on the alignment GPU (the first one when alignment runs on the CPU)
        self.gpu = (device.index or 0) if getattr(device, "type", None) == "cuda" else 0
        self.video_frames: dict[str, int] = {}  # frames decoded this run, by decoder

    def skip(self, index: int) -> str | None:
        """Why episode ``index`` is not read again (``"cached"``, ``"quarantined before"``)."""
        if index in self.done:
            return "cached"
        if index in self.quarantine and not self.config.retry_quarantined:
            return "quarantined before"
        return None

    @property
    def todo(self) -> list[int]:
        return [i for i in self.wanted if self.skip(i) is None]

    def passed(self, index: int, why: str) -> None:
        """Episode ``index`` is not read again, for ``why`` (from :meth:`skip`)."""
        if why == "cached":
            self.obs.skipped(index)
        else:
            self.obs.quarantined(index, None)

    def quarantined(self, index: int, reason: str, error: BaseException) -> None:
        self.quarantine[int(index)] = {"index": int(index), "reason": reason}
        self._write_running()
        self.obs.quarantined(index, error)

    def cached(self, written: dict[int, list[tuple[str, Any, list]]]) -> None:
        """Commit the files :func:`write_episode` wrote, for one or several episodes (index ->
        its files): one Lance commit per table for all of them."""
        tables: dict[str, tuple[Any, list]] = {}
        for files in written.values():
            for rel, schema, fragments in files:
                tables.setdefault(rel, (schema, []))[1].extend(fragments)
        commit(self.dest, list(written), [(rel, *t) for rel, t in tables.items()])
        retried = [i for i in written if self.quarantine.pop(int(i), None) is not None]
        if retried:  # retried and now cached
            self._write_running()
        self.new += len(written)

    def decoded(self, episode: Episode) -> None:
        """Count a cached episode's video frames by the decoder that decoded them."""
        for name, used in episode.meta.get("video_decoder", {}).items():
            self.video_frames[used] = self.video_frames.get(used, 0) + len(
                episode.streams[name])

    def _write_running(self) -> None:
        _write_json(self.dest / "manifest.json", {**self.header, "status": "building",
                                                  "quarantined": list(self.quarantine.values())})

    def finish(self, device: str | None = None) -> dict[str, Any]:
        manifest = finish(self.dest, self.header, wanted=self.wanted, done=self.done,
                          quarantine=self.quarantine, new=self.new,
                          device=device or self.device, seconds=time.perf_counter() - self.t0,
                          specs=self.specs, timing=getattr(self.src, "timing", None),
                          decode={"workers": decode_workers(self.config),
                                  "video_decoder": self.config.video_decoder,
                                  "video_frames": self.video_frames})
        self.obs.done(manifest)
        return manifest


def finish(dest: Path, header: dict[str, Any], *, wanted: list[int], done: set[int],
           quarantine: dict[int, dict[str, Any]], new: int, device: Any, seconds: float,
           timing: str | None, specs: dict[str, StreamSpec] | None = None,
           stats: dict[str, dict] | None = None,
           decode: dict[str, Any] | None = None) -> dict[str, Any]:
    """Compact ``data.lance``, write ``stats.json`` (computed over the rows for ``specs``, or
    ``stats`` as given) and the complete manifest (``decode``: how this run decoded video,
    when given); returns the manifest."""
    lance = require("lance", "data", "The Lance cache", "pylance")

    uri = dest / "data.lance"
    if _committed(uri):
        ds = lance.dataset(str(uri))
        if len(ds.get_fragments()) > 1:
            ds.optimize.compact_files()
            ds.cleanup_old_versions(older_than=_dt.timedelta(0))
    episodes = _episode_summary(uri) if _committed(uri) else []
    if stats is None:
        stats = _compute_stats(uri, specs) if _committed(uri) else {}
    _write_json(dest / "stats.json", stats, indent=None)
    cached_ids = {e["index"] for e in episodes}
    manifest = {
        **header,
        "status": "complete",
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "device": str(device),
        "timing": timing,
        "counts": {"read": len(wanted), "cached": sum(i in cached_ids for i in wanted),
                   "quarantined": sum(i in quarantine for i in wanted),
                   "skipped": len(done & set(wanted)), "new": new,
                   "rows": sum(e["rows"] for e in episodes)},
        "episodes": episodes,
        "quarantined": sorted(quarantine.values(), key=lambda q: q["index"]),
        "stats_path": "stats.json",
        "seconds": seconds,
        **({"decode": decode} if decode is not None else {}),
    }
    _write_json(dest / "manifest.json", manifest)
    return manifest


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
        DataError: unknown format, a requested key the source lacks, a non-positive rate, a bad
            ``shard``, or ``dest`` holds another cache (different source, rate or streams) or
            other files.
        CacheBusyError: another process is writing ``dest`` (and ``wait`` is off).
        FileNotFoundError: ``source`` does not exist.

    Example:
        >>> m = build("data/sample/panda_multirate", "/tmp/panda.cache", rate_hz=50)
        >>> c = m["counts"]; c["read"] == c["cached"] + c["quarantined"]
        True
    """
    with locked_run(source, dest, config, log=log, **overrides) as run:
        with _progress(progress, len(run.wanted)) as advance, closing(prepared(
                run.src, run.todo, run.specs, run.config, gpu=run.gpu)) as ready:
            for index in run.wanted:
                why = run.skip(index)
                if why is not None:
                    run.passed(index, why)
                    advance(f"episode {index} ({why})")
                    continue
                # read, decoded, checked and encoded on a worker thread, in order
                p = next(ready)
                run.obs.start()
                for stage, seconds in p.seconds.items():
                    run.obs.stage(stage, seconds)
                try:
                    if p.error is not None:
                        raise p.error
                    cols = align_episode(p.episode, run.specs, run.config, run.device,
                                         run.fps)
                    run.obs.lap("align")
                except MemoryError:
                    raise
                except Exception as e:
                    # a reader may fail in any way on a corrupt file (codecs raise their own
                    # types): the episode is quarantined with the reason, the rest proceeds
                    run.quarantined(index, _reason(run.src, index, e), e)
                    advance(f"episode {index} quarantined")
                    continue
                run.cached({index: write_episode(run.dest, p.episode, cols, run.specs,
                                                 run.config, p.frames)})
                run.decoded(p.episode)
                run.obs.cached(index, p.episode, cols)
                advance(f"episode {index}")
        return run.finish()


def native_rate(src: Source) -> float:
    """The rate a source declares (``fps``), for ``rate_hz="native"``."""
    fps = getattr(src, "fps", None)
    if not isinstance(fps, (int, float)) or not fps > 0:
        raise DataError(f"{src.path}: the source declares no positive fps ({fps!r}); pass an "
                        "explicit rate (rate_hz=HZ, --rate HZ).")
    return float(fps)


class _progress:
    """Context manager yielding ``advance(description, n=1)``; a rich bar when enabled."""

    def __init__(self, enabled: bool, total: int, label: str = "ingest"):
        self.enabled, self.total, self.label, self.bar = enabled, total, label, None

    def __enter__(self):
        if not self.enabled:
            return lambda _desc, n=1: None
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
        )

        self.bar = Progress(TextColumn(self.label), BarColumn(), MofNCompleteColumn(),
                            TimeRemainingColumn(), TextColumn("{task.description}"),
                            transient=False)
        self.bar.start()
        task = self.bar.add_task("", total=self.total)
        return lambda desc, n=1: self.bar.update(task, advance=n, description=desc)

    def __exit__(self, *exc):
        if self.bar is not None:
            self.bar.stop()
        return False
