"""Episodes to look at, from a RoboCache cache or from any source the readers open.

A cache holds every stream aligned on one grid (``data.lance``) and its camera frames at
their own times (``frames/<col>.lance``); the numeric streams at their native times are the
source's, read again from the dataset the manifest names when it is still at hand. A source
holds only native streams; given a rate, it is aligned on the fly on the CPU with the very
function a cache build uses (:func:`robocache.data.cache.align_episode`), so what is shown is
what ``robocache ingest --rate`` would store.

Camera frames are never all in memory: :meth:`EpisodeView.frames` decodes and yields them
``chunk`` at a time (video through PyAV, a cache's JPEG/PNG through Pillow). A cache may be in
an object store (``s3://``, ``gs://``, ``az://``: :class:`~robocache.data.location.Location`);
it is read the same way, an episode's rows and a chunk of its frames at a time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from robocache._optional import require
from robocache.data.episode import Episode, Source, Stream, StreamSpec
from robocache.data.location import Location
from robocache.errors import DataError

CHUNK_FRAMES = 32

# (times float64 [n], frames [n, H, W, C] uint8 or [n, H, W] uint16)
FrameChunks = Iterator[tuple[np.ndarray, np.ndarray]]
# (times float64 [n], n JPEG/PNG byte strings)
EncodedChunks = Iterator[tuple[np.ndarray, list[bytes]]]
MEDIA_TYPES = {"jpeg": "image/jpeg", "png": "image/png"}


@dataclass
class EpisodeView:
    """One episode, ready to be shown.

    Attributes:
        index: the episode's index in the source.
        specs: stream name -> spec, for the streams shown.
        native: the source's episode, each stream at its own sample times (video streams
            carry their frame times, not their pixels: see :meth:`frames`); ``None`` when the
            episode is unreadable or the source of a cache is no longer at hand.
        aligned: the aligned rows by column, as a cache stores them (``timestamp`` float64
            ``[T]`` seconds, ``step``, ``task``; per stream its value column(s) and
            ``<col>_is_pad``; see :mod:`robocache.data.cache`); ``None`` without a grid.
        rate_hz: the grid's rate in Hz (``None`` without a grid).
        methods: stream name -> alignment method (``linear``, ``previous``, ``frame_index``...).
        where: the source file (and rows) of the episode.
        tasks: the episode's task strings.
        problem: why the episode is quarantined or fails its checks; ``None`` when it is fine.
    """

    index: int
    specs: dict[str, StreamSpec]
    native: Episode | None
    aligned: dict[str, np.ndarray] | None
    rate_hz: float | None
    methods: dict[str, str]
    where: str
    tasks: list[str]
    problem: str | None = None
    _frames: dict[str, Callable[[int], FrameChunks]] = field(default_factory=dict, repr=False)
    _frame_times: dict[str, Callable[[], np.ndarray]] = field(default_factory=dict, repr=False)
    _encoded: dict[str, tuple[str, Callable[[int], EncodedChunks]]] = field(
        default_factory=dict, repr=False)

    @property
    def cameras(self) -> list[str]:
        """The camera (image/video) streams whose frames are at hand."""
        return [n for n in self.specs if n in self._frames]

    def frame_times(self, name: str) -> np.ndarray:
        """float64 ``[F]`` seconds: when camera ``name``'s frames were taken (nothing decoded)."""
        return self._frame_times[name]()

    def frames(self, name: str, chunk: int = CHUNK_FRAMES) -> FrameChunks:
        """Camera ``name``'s frames, decoded ``chunk`` at a time: yields (times float64 ``[n]``,
        frames uint8 ``[n, H, W, 3]``, or uint16 ``[n, H, W]`` for depth)."""
        return self._frames[name](chunk)

    def media_type(self, name: str) -> str | None:
        """``"image/jpeg"``/``"image/png"`` when camera ``name``'s RGB frames are stored
        encoded (a cache's frames, a source's own JPEG/PNG bytes), else ``None``."""
        return self._encoded[name][0] if name in self._encoded else None

    def encoded(self, name: str, chunk: int = CHUNK_FRAMES) -> EncodedChunks:
        """Camera ``name``'s frames as stored (see :meth:`media_type`), ``chunk`` at a time:
        yields (times float64 ``[n]``, ``n`` byte strings); nothing is decoded."""
        return self._encoded[name][1](chunk)


def _hwc(frames) -> np.ndarray:
    """``[n, C, H, W]`` decoded frames as ``[n, H, W, 3]`` (RGB) or ``[n, H, W]`` (one channel)."""
    out = frames.permute(0, 2, 3, 1).numpy()
    return out[..., 0] if out.shape[-1] == 1 else out


def _decode_encoded(data: list[bytes], shape, dtype: str, codec: str) -> np.ndarray:
    """JPEG/PNG frames decoded on the CPU (Pillow, as a cache's frames are served)."""
    import torch

    from robocache.data.cameras import decode
    from robocache.data.frames import EncodedFrames

    pa = require("pyarrow", "data", "Arrow tables")
    frames = EncodedFrames.from_table(pa.table({"encoded": pa.array(data, pa.binary())}),
                                      shape, dtype, codec)
    return _hwc(decode(frames, torch.arange(len(data))))


def _rgb(shape) -> bool:
    """Whether frames of this shape are RGB ``[H, W, 3]`` (depth is ``[H, W]``/``[H, W, 1]``)."""
    return len(shape) == 3 and shape[-1] == 3


def _source_encoded(episode: Episode, name: str) -> Callable[[int], EncodedChunks]:
    """Chunks of a source camera's own JPEG/PNG bytes, as the reader returned them."""
    s = episode.streams[name]

    def chunks(chunk: int) -> EncodedChunks:
        for a in range(0, len(s), chunk):
            yield s.times[a:a + chunk], [bytes(b) for b in s.data[a:a + chunk]]

    return chunks


def _source_frames(episode: Episode, name: str, spec: StreamSpec) -> Callable[[int], FrameChunks]:
    """Chunks of a source camera: inline frames as stored, encoded bytes decoded, a video
    decoded with PyAV over the episode's span of the file."""
    s = episode.streams[name]

    def inline(chunk: int) -> FrameChunks:
        for a in range(0, len(s), chunk):
            data = s.data[a:a + chunk]
            if spec.encoding is not None:
                data = _decode_encoded([bytes(b) for b in data], spec.shape, spec.dtype,
                                       spec.encoding)
            elif data.ndim == 4 and data.shape[-1] == 1:
                data = data[..., 0]
            yield s.times[a:a + chunk], data

    def video(chunk: int) -> FrameChunks:
        from robocache.data.cameras import video_frames

        start = s.video.from_timestamp
        frames: list[np.ndarray] = []
        times: list[float] = []
        for frame, t in video_frames(s.video.path, start + float(s.times[0]),
                                     start + float(s.times[-1])):
            frames.append(frame)
            times.append(t - start)
            if len(frames) == chunk:
                yield np.asarray(times), np.stack(frames)
                frames, times = [], []
        if frames:
            yield np.asarray(times), np.stack(frames)

    return video if s.data is None and s.video is not None else inline


def _video_times(s: Stream) -> np.ndarray:
    """The episode's frame times in a video stream's file (from the episode start), read
    without decoding: the times ingest aligns a video by (the reader's are the data rows')."""
    from robocache.data.cameras import video_times

    start = s.video.from_timestamp
    return video_times(s.video.path, start + float(s.times[0]),
                       start + float(s.times[-1])) - start


# what to do about an unfinished cache
RESUME = ("re-run the same `robocache ingest` to resume it (or wait for the build that is "
          "writing it)")


@dataclass
class Opened:
    """A cache or a source, opened for viewing (:func:`open_view`).

    Attributes:
        path: what was opened (a local path, or a cache's object-store URI).
        kind: ``"cache"`` or ``"source"``.
        format: the source's format (``lerobot-v3.0``, ``zarr-replay``...).
        source: the source dataset's path.
        specs: the streams shown (all, or those ``streams`` names).
        episodes: the episodes there are to show (a cache's cached and quarantined ones).
        quarantined: ``{"index", "reason"}`` of each quarantined episode (a cache's, from its
            manifest; a source's, as its episodes are read and fail).
        notices: things the person looking should know (a cache's source moved...).
        names: numeric stream -> its dimensions' names, where the source declares them
            (LeRobot's ``names``).
        unfinished: a cache whose build has not completed (interrupted, or running): it
            shows the episodes committed so far.
    """

    path: Path | str
    kind: str
    format: str
    source: str
    specs: dict[str, StreamSpec]
    episodes: list[int]
    quarantined: list[dict[str, Any]]
    notices: list[str]
    names: dict[str, list[str]] = field(default_factory=dict)
    _read: Callable[[int], EpisodeView] = field(repr=False, default=None)
    unfinished: bool = False

    def episode(self, index: int) -> EpisodeView:
        """The view of episode ``index``.

        Raises:
            DataError: there is no such episode (the message lists the ones there are).
        """
        if index not in self.episodes:
            shown = ", ".join(map(str, self.episodes[:20])) + (
                ", ..." if len(self.episodes) > 20 else "")
            if self.unfinished:
                raise DataError(f"`episode` (--episode) {index} is not in {self.path}, an "
                                f"unfinished cache (episodes committed so far: "
                                f"{shown or 'none'}); {RESUME}.")
            raise DataError(f"`episode` (--episode) {index} is not in {self.path}; its episodes "
                            f"are {shown or 'none'}.")
        return self._read(index)


def _select(specs: dict[str, StreamSpec], streams: list[str] | None,
            path: Path | str) -> dict[str, StreamSpec]:
    if not streams:
        return dict(specs)
    missing = [s for s in streams if s not in specs]
    if missing:
        raise DataError(f"`streams` (--stream) {missing} not in {path}; its streams are "
                        f"{sorted(specs)}.")
    return {n: specs[n] for n in specs if n in streams}


def _read_native(src: Source, index: int, specs: dict[str, StreamSpec]
                 ) -> tuple[Episode | None, str | None]:
    """The source's episode and the problem with it (an unreadable one: ``None`` and why;
    one that fails its checks: the episode and why, so the defect can be seen)."""
    from robocache.data.build.run import _reason
    from robocache.data.episode import check_episode

    try:
        episode = src.read(index)
        episode.streams = {n: s for n, s in episode.streams.items() if n in specs}
        for name, s in episode.streams.items():
            if s.data is None and s.video is not None and len(s):
                episode.streams[name] = Stream(s.spec, _video_times(s), None, s.video)
    except MemoryError:
        raise
    except Exception as e:  # readers and demuxers fail in their own ways on a corrupt file
        return None, _reason(src, index, e)
    try:
        check_episode(episode, specs)
    except DataError as e:
        return episode, _reason(src, index, e)
    return episode, None


def _names(src: Source | None, specs: dict[str, StreamSpec]) -> dict[str, list[str]]:
    """Dimension names a source declares (LeRobot ``info.json``: a list, or a one-entry
    mapping such as ``{"motors": [...]}``)."""
    info = getattr(src, "info", None)
    features = info.get("features", {}) if isinstance(info, dict) else {}
    out = {}
    for name in specs:
        names = features.get(name, {}).get("names") if isinstance(features.get(name), dict) \
            else None
        if isinstance(names, dict) and len(names) == 1:
            names = next(iter(names.values()))
        if isinstance(names, list) and names and all(isinstance(n, str) for n in names):
            out[name] = names
    return out


def _where(src: Source | None, index: int, fallback: str) -> str:
    try:
        return src.locate(index) if src is not None and hasattr(src, "locate") else fallback
    except Exception:  # locating is a courtesy
        return fallback


def _tasks(episode: Episode | None) -> list[str]:
    if episode is None:
        return []
    frame_tasks = episode.meta.get("frame_tasks")
    if frame_tasks is not None:
        return list(dict.fromkeys(str(t) for t in frame_tasks[1]))
    return [str(t) for t in episode.meta.get("tasks", [])]


def _open_source(path: Path, options: dict[str, Any], streams: list[str] | None,
                 rate: float | str | None) -> Opened:
    from robocache.data.cache import CacheConfig, align_episode, default_method, native_rate
    from robocache.data.formats import open_source

    src = open_source(path, **options)
    specs = _select(src.specs, streams, path)
    fps = native_rate(src) if rate == "native" else None
    grid = fps if fps is not None else (float(rate) if rate is not None else None)
    quarantined: list[dict[str, Any]] = []

    def read(index: int) -> EpisodeView:
        episode, problem = _read_native(src, index, specs)
        if problem is not None:
            quarantined.append({"index": index, "reason": problem})
        aligned = None
        if grid is not None and problem is None:
            config = CacheConfig(rate_hz="native" if fps is not None else grid, device="cpu")
            aligned = align_episode(episode, specs, config, "cpu", fps)
        view = EpisodeView(index, specs, episode, aligned, grid if aligned else None,
                           {n: default_method(s, grid) for n, s in specs.items()},
                           _where(src, index, str(path)), _tasks(episode), problem)
        if episode is not None:
            for name, spec in specs.items():
                s = episode.streams.get(name)
                if spec.kind in ("image", "video") and s is not None and len(s):
                    view._frames[name] = _source_frames(episode, name, spec)
                    view._frame_times[name] = lambda s=s: s.times
                    if spec.encoding in MEDIA_TYPES and _rgb(spec.shape):
                        view._encoded[name] = (MEDIA_TYPES[spec.encoding],
                                               _source_encoded(episode, name))
        return view

    return Opened(path, "source", src.format, str(path), specs, list(src.episode_indices()),
                  quarantined, [], _names(src, specs), read)


def _column(col, spec: StreamSpec | None = None) -> np.ndarray:
    """A Lance column as NumPy: fixed-size lists ``[T, D]``, strings as objects."""
    pa = require("pyarrow", "data", "Arrow tables")

    col = col.combine_chunks() if hasattr(col, "combine_chunks") else col
    if pa.types.is_fixed_size_list(col.type):
        return col.flatten().to_numpy(zero_copy_only=False).reshape(len(col), -1)
    if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
        return np.array(col.to_pylist(), dtype=object)
    return col.to_numpy(zero_copy_only=False)


def _open_cache(location: Location, shown: Path | str, options: dict[str, Any],
                streams: list[str] | None) -> Opened:
    """The cache at ``location`` (named ``shown``): its manifest and index read now, each
    episode's aligned rows (a filter on ``episode_index``) and frames (``chunk`` at a time)
    when it is shown."""
    from robocache.data.formats import open_source

    pc = require("pyarrow.compute", "data", "Arrow tables", "pyarrow")

    manifest = location.manifest()
    entries = manifest.get("streams", {})
    specs = _select({n: StreamSpec(n, e["kind"], e["dtype"], tuple(e["shape"]),
                                   e.get("source_rate_hz"), e.get("encoding"))
                     for n, e in entries.items()}, streams, shown)
    try:
        data = location.lance("data.lance")
    except FileNotFoundError:  # nothing committed yet
        data = None
    cached_ids: set[int] = set()
    if data is not None:  # its one small column, a batch at a time
        with location.reading("data.lance"):
            for batch in data.to_batches(columns=["episode_index"], batch_size=1 << 16):
                cached_ids.update(np.unique(batch.column(0).to_numpy()).tolist())
    cached = sorted(cached_ids)
    quarantined = list(manifest.get("quarantined", []))
    reasons = {int(q["index"]): q["reason"] for q in quarantined}
    source = manifest.get("source", {}).get("path", "")
    notices = []
    try:
        src = open_source(source, **options)
    except (OSError, DataError) as e:
        src = None
        notices.append(f"the source {source} cannot be opened ({e}); showing the cache's "
                       "aligned streams and camera frames only")
    if manifest.get("status") != "complete":
        notices.append(f"the cache is unfinished ({manifest.get('status')}): showing the "
                       f"{len(cached)} episodes committed so far")

    tables: dict[str, Any] = {}  # each camera's frame table, opened once

    def frames_of(name: str, index: int):
        entry = entries[name]
        shape, codec = tuple(entry["shape"]), entry.get("codec", "jpeg")
        rel = f"frames/{name}.lance"
        if rel not in tables:
            tables[rel] = location.lance(rel)
        ds = tables[rel]
        where = f"episode_index = {index}"

        def times() -> np.ndarray:
            with location.reading(rel):
                t = ds.to_table(columns=["frame", "timestamp"], filter=where)
            order = np.argsort(t.column("frame").to_numpy())
            return t.column("timestamp").to_numpy()[order]

        def stored(chunk: int) -> EncodedChunks:
            with location.reading(rel):
                for batch in ds.to_batches(columns=["timestamp", "encoded"], filter=where,
                                           batch_size=chunk):
                    if batch.num_rows:
                        yield batch.column("timestamp").to_numpy(), \
                            batch.column("encoded").to_pylist()

        def chunks(chunk: int) -> FrameChunks:
            for t, data in stored(chunk):
                yield t, _decode_encoded(data, shape, entry["dtype"], codec)

        encoded = (MEDIA_TYPES[codec], stored) if _rgb(shape) and codec in MEDIA_TYPES \
            else None
        return times, chunks, encoded

    def read(index: int) -> EpisodeView:
        episode, problem = _read_native(src, index, specs) if src is not None else (None, None)
        problem = reasons.get(index, problem)
        aligned = None
        if index in cached_ids:
            with location.reading("data.lance"):
                table = data.to_table(filter=f"episode_index = {index}")
            table = table.take(pc.sort_indices(table.column("step")))
            aligned = {c: _column(table.column(c)) for c in table.column_names}
        tasks = list(dict.fromkeys(str(t) for t in aligned["task"])) if aligned else \
            _tasks(episode)
        view = EpisodeView(index, specs, episode, aligned,
                           float(manifest["rate_hz"]) if aligned else None,
                           {n: entries[n]["method"] for n in specs},
                           _where(src, index, source), tasks, problem)
        for name, spec in specs.items():
            if spec.kind in ("image", "video") and index in cached_ids:
                view._frame_times[name], view._frames[name], encoded = frames_of(name, index)
                if encoded is not None:
                    view._encoded[name] = encoded
            elif spec.kind in ("image", "video") and episode is not None and \
                    len(episode.streams.get(name, ())):
                view._frames[name] = _source_frames(episode, name, spec)
                view._frame_times[name] = lambda s=episode.streams[name]: s.times
        return view

    fmt = manifest.get("source", {}).get("format", "unknown")
    return Opened(shown, "cache", fmt, source, specs, sorted(set(cached) | set(reasons)),
                  quarantined, notices, _names(src, specs), read,
                  unfinished=manifest.get("status") != "complete")


def open_view(path: str | Path, *, streams: list[str] | None = None,
              rate: float | str | None = None,
              storage_options: dict[str, Any] | None = None, **options: Any) -> Opened:
    """Open a cache or a dataset for viewing.

    Args:
        path: a RoboCache cache directory or object-store URI (``s3://BUCKET/PREFIX``,
            ``gs://``, ``az://``), or a dataset any reader opens (format detected).
        streams: the stream names to show (default: all).
        rate: for a source, the rate in Hz to align it to on the fly (or ``"native"``: the
            source's fps), as ``robocache ingest --rate`` would; ``None`` shows native streams
            only. A cache shows its own grid (``rate`` must be ``None``).
        storage_options: object-store settings for a cache at a URI, Lance's key names
            (:mod:`robocache.data.location`); the standard environment variables otherwise.
        **options: reader options (``fps=10.0`` for sources without timestamps, ``split=`` for
            RLDS); for a cache they open its source.

    Returns:
        The :class:`Opened` cache or source.

    Raises:
        FileNotFoundError: ``path`` does not exist (a URI: holds no cache).
        DataError: the format is unknown, a stream in ``streams`` does not exist, ``rate`` is
            not a positive rate, or ``rate`` is given for a cache; the object store failed
            (one line naming the URI and the fix).

    Example:
        >>> v = open_view("data/sample/panda_multirate", rate=50)  # doctest: +SKIP
        >>> ep = v.episode(0); ep.aligned["timestamp"].shape, ep.rate_hz  # doctest: +SKIP
        ((96,), 50.0)
    """
    from robocache.data.cache import is_cache

    remote = isinstance(path, str) and "://" in path  # only a cache lives in an object store
    if not remote:
        path = Path(path)
        if not path.exists():
            raise FileNotFoundError(f"{path} does not exist.")
    if remote or is_cache(path):
        if rate is not None:
            raise DataError(f"`rate` (view --rate, inspect --plot-rate) aligns a source; {path} "
                            "is a cache, shown on its own grid: drop the rate.")
        return _open_cache(Location(path, storage_options), path, options, streams)
    if rate is not None and rate != "native":
        try:
            ok = float(rate) > 0 and np.isfinite(float(rate))
        except (TypeError, ValueError):
            ok = False
        if not ok:
            raise DataError(f"`rate` (view --rate, inspect --plot-rate) must be a rate > 0 Hz "
                            f"or 'native'; got {rate!r}.")
    return _open_source(path, options, streams, rate)
