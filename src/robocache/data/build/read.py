"""Stage 1, read: open a source, read each episode, check it, decode its videos and encode
its camera frames (as :mod:`robocache.data.build.encode` says, by
:func:`robocache.data.cameras.camera_tables`), on worker threads or processes (see
:func:`prepared`), ahead of the episode being aligned.
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from robocache._forkserver import worker_context
from robocache._optional import require
from robocache.data import source_identity
from robocache.data.build.config import CacheConfig, check_grid_tolerance, decode_workers
from robocache.data.build.encode import camera_codec, frame_format, stored_codec, stored_size
from robocache.data.cameras import (
    CameraWorkers,
    camera_tables,
    decode_videos,
    node_workers,
    nvdec_available,
    worker_pool,
)
from robocache.data.episode import Episode, Source, StreamSpec, check_episode
from robocache.errors import DataError, picklable


def open_specs(source: str | Path | Source, config: CacheConfig) -> tuple[Source, dict]:
    """Open ``source`` (unless already open) and pick the streams ``config.keys`` names; for
    ``rate_hz="native"``, refuse a ``grid_tolerance_s`` not below half the source's frame
    period (:func:`~robocache.data.build.config.check_grid_tolerance`)."""
    from robocache.data.formats import open_source

    src = source if hasattr(source, "read") else open_source(source, **config.source_options)
    if getattr(src, "rate_error", None):  # a source that cannot time its episodes
        raise DataError(src.rate_error)
    fps = getattr(src, "fps", None)
    if config.rate_hz == "native" and isinstance(fps, (int, float)) and fps > 0:
        check_grid_tolerance(config.grid_tolerance_s, float(fps))
    specs = dict(src.specs)
    if config.keys is not None:
        missing = sorted(set(config.keys) - set(specs))
        if missing:
            raise DataError(f"`keys` (--key) names streams the source lacks: {missing}; it "
                            f"has {sorted(specs)}.")
        specs = {k: specs[k] for k in config.keys}
    if hasattr(src, "select"):  # a reader that can read only these columns
        src.select(list(specs))
    return src, specs


def native_rate(src: Source) -> float:
    """The rate a source declares (``fps``), for ``rate_hz="native"``."""
    fps = getattr(src, "fps", None)
    if not isinstance(fps, (int, float)) or not fps > 0:
        raise DataError(f"{src.path}: the source declares no positive fps ({fps!r}); pass an "
                        "explicit rate (rate_hz=HZ, --rate HZ).")
    return float(fps)


def load_episode(src: Source, index: int, specs: dict[str, StreamSpec],
                 video_decoder: str = "pyav", gpu: int = 0,
                 lock: threading.Lock | None = None) -> Episode:
    """Read episode ``index`` (its videos decoded by ``video_decoder``, see
    :func:`robocache.data.cameras.decode_video`) and check it against ``specs`` (a bad episode
    raises). ``lock``: held while the source reads (readers are not all thread-safe)."""
    episode = _read(src, index, lock)
    decode_videos(episode, specs, decoder=video_decoder, gpu=gpu)
    check_episode(episode, specs)
    return episode


def _read(src: Source, index: int, lock: threading.Lock | None) -> Episode:
    """``src.read(index)``, under ``lock`` when given (readers are not all thread-safe), its
    digest as read (:func:`robocache.data.source_identity.episode_digest`) kept in
    ``episode.meta["digest"]``."""
    if lock is None:
        episode = src.read(index)
    else:
        with lock:
            episode = src.read(index)
    episode.meta["digest"] = source_identity.episode_digest(episode)  # as read: see its module
    return episode


@dataclass
class Prepared:
    """One episode made ready off the writing thread (:func:`prepare_episode`): read, its
    videos decoded, checked, its camera frames encoded (``frames``: stream -> Lance table);
    or the ``error`` that quarantines it. ``seconds``: stage -> seconds spent. ``digest``: the
    episode's digest as read (:func:`robocache.data.source_identity.episode_digest`), kept
    when the episode itself is dropped (aligned in a worker process) for the manifest."""

    index: int
    episode: Episode | None = None
    digest: str | None = None
    frames: dict[str, Any] | None = None
    error: Exception | None = None
    seconds: dict[str, float] = field(default_factory=dict)
    # aligned in a worker process (then ``episode`` and ``frames`` are dropped): the episode's
    # tables, its sizes for the metrics and its video frames by decoder
    tables: list[tuple[str, Any]] | None = None
    sizes: dict[str, int] | None = None
    decoded: dict[str, int] | None = None
    # written by the worker process too (uncommitted): the last such episode of a chunk
    # carries the chunk's files and their rows' tally, (episodes, [(table, schema,
    # fragments)], Tally or None)
    written: bool = False
    files: tuple[list[int], list, Any] | None = None


def video_frames(episode: Episode) -> dict[str, int]:
    """An episode's decoded video frames by the decoder that decoded them."""
    out: dict[str, int] = {}
    for name, used in episode.meta.get("video_decoder", {}).items():
        out[used] = out.get(used, 0) + len(episode.streams[name])
    return out


def prepare_episode(src: Source, index: int, specs: dict[str, StreamSpec],
                    config: CacheConfig, *, gpu: int = 0, workers: CameraWorkers | None = None,
                    threads: int = 0, lock: threading.Lock | None = None) -> Prepared:
    """Read, check, decode and encode episode ``index`` (safe on a worker thread: the source
    reads under ``lock``; ``workers``: the :class:`~robocache.data.cameras.CameraWorkers`
    that decode and encode its videos, else this thread with ``threads`` FFmpeg threads, 0:
    FFmpeg's choice; see :func:`~robocache.data.cameras.camera_tables`). What waits to be
    written is the episode's JPEG/PNG bytes, never its decoded pixels. Any failure but
    ``MemoryError`` is returned as ``error`` (the episode is quarantined with it)."""
    t0 = time.perf_counter()
    out = Prepared(index)
    try:
        episode = _read(src, index, lock)
        out.digest = episode.meta["digest"]
        check_episode(episode, specs)  # videos still in their files: their frames next
        t1 = time.perf_counter()
        out.frames = camera_tables(episode, specs, frame_format(config),
                                   {name: stored_size(spec, config)
                                    for name, spec in specs.items()},
                                   decoder=config.video_decoder, gpu=gpu, workers=workers,
                                   threads=threads, codecs=config.camera_codecs)
        out.episode = episode
        out.seconds = {"read": t1 - t0, "encode": time.perf_counter() - t1}
    except MemoryError:
        raise
    except Exception as e:  # a reader or codec may fail in any way on a corrupt file
        out.error = e
    return out


def prepared(src: Source, indices: Iterable[int], specs: dict[str, StreamSpec],
             config: CacheConfig, *, gpu: int = 0, path: str | None = None,
             fps: float | None = None, align: bool = False, dest: Path | None = None,
             tally: bool = False) -> Iterator[Prepared]:
    """:func:`prepare_episode` of each of ``indices``, in their order, ``decode_workers`` at a
    time: at most that many episodes (or chunks of :data:`CHUNK`, in processes) are being
    prepared while the caller handles the one yielded. One of two ways, never both (no
    process pool is started inside the other):

    - In worker processes (:func:`preparation`, :func:`worker_context`; ``path``: the
      source to open in each) when the build is large enough: reading, checking and
      aligning numeric episodes is mostly Python on small arrays, which threads serialize on
      the GIL. Each process prepares its episodes whole, their videos decoded and encoded on
      its own thread (:func:`_prepare_chunk`), and, with ``align`` (alignment on the CPU, at
      rate ``fps`` when native), also aligns each episode and makes its Arrow tables
      (:attr:`Prepared.tables`), written under ``dest`` as uncommitted Lance files when
      given (with ``tally``, each write's :class:`~robocache.data.build.stats.Tally` too),
      so every core does the whole per-episode work and the caller only commits.
    - Otherwise on threads, which read and check the episodes; their videos are decoded and
      encoded in ``decode_workers`` forked camera worker processes
      (:func:`robocache.data.cameras.worker_pool`: each has its own GIL), or on the reading
      thread with one worker or in a daemonic process. With NVDEC (``video_decoder``
      ``"auto"`` or ``"nvdec"``), a large build (:func:`preparation`) sends each video stream
      to a lane process on every GPU (NVDEC, nvJPEG) or, with ``"auto"``, to the worker
      processes, whichever has room first (:meth:`CameraWorkers.submit_stream`; as many
      episodes at once as they take streams, if that is more than ``decode_workers``); a small
      one decodes with NVDEC on the reading threads, on GPU ``gpu`` (its decoders share this
      process's CUDA context)."""
    indices = list(indices)
    videos = decoded_videos(specs, config)
    way = preparation(config, len(indices), videos)
    if path is not None and way == "processes":
        files = getattr(src, "files", None)
        keys = None if files is None else [str(files(i)[0]) for i in indices]
        yield from _in_processes(path, indices, keys, config, fps, align, dest, tally)
        return
    workers = decode_workers(config)
    lock = threading.Lock()
    cameras = None
    if workers > 1 and videos:
        cameras = worker_pool(*node_workers(workers, config.video_decoder)
                              if way == "lanes" else (workers,))
    threads = 0 if workers == 1 else _ffmpeg_threads(workers)  # for videos decoded inline
    if cameras is not None:
        workers = cameras.episodes_at_once(workers)
    pool = ThreadPoolExecutor(workers, thread_name_prefix="robocache-ingest")
    try:
        it = iter(indices)
        pending: deque = deque()

        def submit() -> None:
            for index in it:
                pending.append(pool.submit(prepare_episode, src, index, specs, config,
                                           gpu=gpu, workers=cameras, threads=threads,
                                           lock=lock))
                return

        for _ in range(workers):
            submit()
        while pending:
            result = pending.popleft().result()
            submit()
            yield result
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


# Builds of at least this many episodes prepare them in processes (a process costs a few
# seconds to start: torch and the reader imported, the source opened).
PROCESS_EPISODES = 256
# Episodes per task sent to a worker process (one Lance fragment per table when it writes):
# a quarter of each worker's share of the build, within these bounds (at 64, a fragment of
# 12 s episodes at 50 Hz holds 38k rows: not small enough for the build to compact it).
CHUNK = (64, 256)
# A data file's episodes stay in one task up to this many (a worker reads and decodes the
# whole file for any of them: with files of 500 episodes split over 2-4 tasks, reading took
# more than half of a worker's time, docs/build-profile.md), where the build has enough
# episodes per worker for that.
FILE_EPISODES = 512
_WORKER: dict[str, Any] = {}  # the source a worker process opened, its specs and options


def decoded_videos(specs: dict[str, StreamSpec], config: CacheConfig) -> bool:
    """Whether a build of ``specs`` decodes video: a video stream not kept as video (whose
    packets are copied, no decoder needed)."""
    return any(spec.kind == "video" and stored_codec(
        spec, camera_codec(config, name), stored_size(spec, config)) != "video"
        for name, spec in specs.items())


def preparation(config: CacheConfig, episodes: int, videos: bool) -> str:
    """How :func:`prepared` prepares ``episodes`` episodes (``videos``: whether they hold
    video streams to decode, :func:`decoded_videos`): ``"lanes"`` where NVDEC decodes the
    videos (``"auto"`` or ``"nvdec"``, NVDEC here) and the build is large, ``"processes"``
    (whole episodes, a source path only) where PyAV decodes them or there are none, else
    ``"threads"``. Large: ``config.decode_processes``, or by default at least
    :data:`PROCESS_EPISODES` episodes (and 2 workers or more, for processes): a process costs
    a few seconds to start. Without NVDEC here ``"auto"`` decodes with PyAV."""
    if videos and config.video_decoder != "pyav" and nvdec_available():
        large = config.decode_processes if config.decode_processes is not None else \
            episodes >= PROCESS_EPISODES
        return "lanes" if large else "threads"
    large = config.decode_processes if config.decode_processes is not None else \
        decode_workers(config) > 1 and episodes >= PROCESS_EPISODES
    return "processes" if large else "threads"


def lance_threads() -> None:
    """Size Lance's thread pools (made on its first call in this process) for one build
    worker process of many: one compute thread and two for the files, unless
    ``LANCE_CPU_THREADS`` / ``LANCE_IO_THREADS`` are set. 64 workers with pools the size of
    the machine spent 19 s on a build that one thread each did in 14.5
    (docs/build-profile.md). Not in Ray's actors: one writes a GPU's episodes, and with one
    Lance thread ``preprocess`` fell from 171 to 79 episodes/s a GPU."""
    os.environ.setdefault("LANCE_CPU_THREADS", "1")
    os.environ.setdefault("LANCE_IO_THREADS", "2")


def single_core() -> None:
    """Set this process up as one of a build's worker processes, one core each: torch and
    Arrow on one thread (the episodes run in parallel, one per process, and so do the files:
    Arrow's own threads only contended, 2x the CPU time measured), and the objects alive now
    (modules imported, source opened) moved out of the garbage collector's reach
    (``gc.freeze``): every full collection walked them all, 0.19 ms an episode of
    ``bench preprocess``'s kind (docs/build-profile.md)."""
    import gc

    import torch

    torch.set_num_threads(1)
    require("pyarrow", "data", "Arrow tables").set_cpu_count(1)
    gc.freeze()


# glibc's thresholds in a build worker: blocks this large or smaller come from its heap, and
# freed memory stays there instead of going back to the kernel
HEAP_RETAIN_BYTES = 1 << 30


def retain_heap() -> None:
    """Keep this process's freed memory for reuse (glibc ``mallopt``: no ``mmap`` for blocks
    up to :data:`HEAP_RETAIN_BYTES`, no trimming below it). A build worker allocates and frees
    the same arrays episode after episode; by default glibc returned large blocks to the
    kernel and faulted them in again: a worker's second data file of ``bench preprocess``'s
    kind took 112 minor page faults an episode, 30 with this and the batched file reads
    (``benchmarks/results/worker-heap-cpu-vm-2026-11-27.txt``). No-op where the C library is
    not glibc."""
    import ctypes

    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return
    mallopt(-1, HEAP_RETAIN_BYTES)  # M_TRIM_THRESHOLD
    mallopt(-3, HEAP_RETAIN_BYTES)  # M_MMAP_THRESHOLD


def _open_worker(path: str, config: dict[str, Any], parent: int) -> None:
    from robocache.data.cameras import die_with_parent

    die_with_parent(parent)
    retain_heap()
    lance_threads()  # before any Lance call
    options = CacheConfig(**config)
    src, specs = open_specs(path, options)
    _WORKER.update(src=src, specs=specs, config=options)
    single_core()


def _ffmpeg_threads(workers: int) -> int:
    """FFmpeg threads for a video decoded inline while ``workers`` episodes are prepared at
    once: the cores split between them, as :class:`~robocache.data.cameras.CameraWorkers`
    splits them (one each when there are as many workers as cores, the default)."""
    return max(1, (os.cpu_count() or 1) // workers)


def _prepare_chunk(indices: list[int], fps: float | None, align: bool,
                   dest: Path | None, tally: bool = False) -> list[Prepared]:
    """In a worker process: :func:`prepare_episode` of each of ``indices`` (its videos
    decoded here: no camera worker processes are started in a worker process) and, with
    ``align``, its alignment and tables (the episode itself is then not sent back), written
    under ``dest`` as one set of uncommitted Lance files when given, tallied with ``tally``
    (else the files' tally is None)."""
    from robocache.data.build.align import align_batch
    from robocache.data.build.stats import Tally
    from robocache.data.build.write import Batch, episode_tables
    from robocache.observability import metrics

    src, specs, config = _WORKER["src"], _WORKER["specs"], _WORKER["config"]
    threads = _ffmpeg_threads(decode_workers(config))
    out = [prepare_episode(src, index, specs, config, threads=threads) for index in indices]
    if align:
        todo = [p for p in out if p.error is None]
        t0 = time.perf_counter()
        for p, cols in zip(todo, align_batch([p.episode for p in todo], specs, config, "cpu",
                                             fps), strict=True):
            if isinstance(cols, Exception):  # quarantined with the reason
                p.error = cols
            else:
                p.tables = episode_tables(p.episode, cols, specs, config, p.frames)
                p.sizes = metrics.episode_sizes(p.episode, cols)
                p.decoded = video_frames(p.episode)
            p.episode = p.frames = None
        for p in todo:
            p.seconds["align"] = (time.perf_counter() - t0) / len(todo)
        done = [p for p in todo if p.error is None]
        if dest is not None and done:
            batch = Batch(1 << 62, 1 << 62)
            for p in done:
                batch.add(p.index, p.tables)
                p.tables, p.written = None, True
            rows = Tally.of_rows(batch.tables.get("data.lance", []), specs) if tally else None
            done[-1].files = ([p.index for p in done], batch.write(dest), rows)
    for p in out:
        if p.error is not None:
            p.episode, p.frames, p.error = None, None, picklable(p.error)
    return out


def chunks(indices: list[int], keys: list[str] | None, workers: int) -> list[list[int]]:
    """``indices`` (in order) as the tasks of ``workers`` worker processes: about a quarter
    of each worker's share, within :data:`CHUNK`; ``keys``: each episode's data file, whose
    consecutive episodes stay in one task (a task may grow past the quarter to hold them),
    up to :data:`FILE_EPISODES` and each worker's share (a longer run of one file is cut
    there)."""
    size = min(max(len(indices) // (4 * workers), CHUNK[0]), CHUNK[1])
    whole = max(size, min(FILE_EPISODES, len(indices) // workers))
    runs: list[list[int]] = []  # one file's consecutive episodes, at most ``whole``
    for i, index in enumerate(indices):
        if runs and keys is not None and keys[i] == keys[i - 1] and len(runs[-1]) < whole:
            runs[-1].append(index)
        else:
            runs.append([index])
    out: list[list[int]] = []
    for run in runs:  # short runs gathered into tasks of at most the quarter
        if out and len(out[-1]) + len(run) <= size:
            out[-1] += run
        else:
            out.append(run)
    return out


def _in_processes(path: str, indices: list[int], keys: list[str] | None,
                  config: CacheConfig, fps: float | None, align: bool,
                  dest: Path | None, tally: bool = False) -> Iterator[Prepared]:
    """:func:`prepared` in ``decode_workers`` worker processes (:func:`worker_context`),
    tasks of :func:`chunks`, in order, two per process in flight."""
    from concurrent.futures import ProcessPoolExecutor

    workers = decode_workers(config)
    pool = ProcessPoolExecutor(workers, mp_context=worker_context(),
                               initializer=_open_worker,
                               initargs=(path, asdict(config), os.getpid()))
    try:
        tasks = iter(chunks(indices, keys, workers))
        pending: deque = deque()
        for chunk in itertools.islice(tasks, 2 * workers):
            pending.append(pool.submit(_prepare_chunk, chunk, fps, align, dest, tally))
        while pending:
            done = pending.popleft().result()
            for chunk in itertools.islice(tasks, 1):
                pending.append(pool.submit(_prepare_chunk, chunk, fps, align, dest, tally))
            yield from done
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
