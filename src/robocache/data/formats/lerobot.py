"""LeRobot dataset directories, codebase versions v2.1 and v3.0.

Layout read (https://github.com/huggingface/lerobot, ``lerobot/datasets``):

- ``meta/info.json``: ``codebase_version``, ``fps``, ``features`` (dtype, shape per key),
  ``data_path`` / ``video_path`` templates, ``chunks_size``.
- v2.1: ``meta/episodes.jsonl`` (one episode per line), ``meta/tasks.jsonl``, one data parquet
  per episode. v3.0: ``meta/episodes/chunk-*/file-*.parquet`` (which data/video file holds each
  episode and where), ``meta/tasks.parquet``, data parquet files holding many episodes.

Every feature becomes a stream timed by the ``timestamp`` column. Multi-rate extension (what the
bundled sample uses): a feature may declare its own ``"fps"`` in ``info.json`` and be null in the
rows where it has no sample; the stream then holds only its non-null rows. ``dtype: "string"``
features are sparse events (a dataset with no other feature also reads its ``frame_index``
column as a stream, which times its frames). ``dtype: "image"`` features keep their PNG
bytes (never re-encoded; JPEG where the structs hold JPEG; depth maps: LeRobot's uint16 or
float32 TIFF), with the dtype and channels of the stored frames
(read from the first one); camera shapes declared channel-first (``[C, H, W]``, older
datasets) are read as ``[H, W, C]``. LeRobot's language columns (``dtype: "language"``:
``language_persistent``, ``language_events``, lists of message rows per frame, as
``lerobot-annotate`` writes them) are read as string event streams
``language.<style>.<role>`` (:func:`language_columns`), which a cache holds as it holds
``string`` features (the latest message so far, and its age); :class:`robocache.LeRobotDataset`
serves the columns themselves from the data files. A feature of a dtype not known here is left
out, said once in one line, and the rest read.
Video features are referenced by file and timestamp and decoded
only on request (:func:`robocache.data.formats.video.decode_frames`): as RGB, or, for a depth
video (``is_depth_map``), as its 12-bit grey codes (uint16 ``[H, W, 1]``).

LeRobot's Lance layout (``"storage_format": "lance"`` in ``meta/info.json``, as
lerobot-lancedb's converter writes a v3.0 dataset: ``meta/`` beside ``frames.lance``, one row
per frame in ``index`` order with the features' dots written as underscores and vectors as
fixed-size lists, image features as the data files' structs, and ``videos.lance``, each MP4
file's bytes in a blob column by video key, chunk and file) is read the same way: an episode's
rows are taken from the frames table by index, and each MP4 file an episode needs is copied
out of the videos table once, byte for byte, to
``$ROBOCACHE_HOME/lance-videos/<name>-<digest of the path>/v<table version>/`` (default
``ROBOCACHE_HOME``: ``~/.cache/robocache``), where the decoders read it.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import math
import os
import shutil
from pathlib import Path

import numpy as np

from robocache._optional import require
from robocache.data.episode import Episode, Stream, StreamSpec, VideoRef
from robocache.errors import DataError

pa = require("pyarrow", "data", "Reading LeRobot datasets")
pc = require("pyarrow.compute", "data", "Reading LeRobot datasets")
pq = require("pyarrow.parquet", "data", "Reading LeRobot datasets")

# Bookkeeping columns of every LeRobot data file; not streams.
INDEX_COLUMNS = ("timestamp", "frame_index", "episode_index", "index", "task_index")
VERSIONS = ("v2.1", "v3.0")
# LeRobot's Lance layout: its frames and videos tables, and the videos' blob column
LANCE_FRAMES, LANCE_VIDEOS, LANCE_BLOB = "frames.lance", "videos.lance", "video_bytes"


def detect(path: Path) -> bool:
    info = path / "meta" / "info.json"
    return info.is_file()


def _frame_shape(feature: dict) -> tuple[int, ...]:
    """A camera feature's frame shape as ``(H, W, C)``: LeRobot declares ``[H, W, C]`` with
    names ``height, width, channels``; older datasets ``[C, H, W]`` with ``channels`` first."""
    shape = tuple(int(s) for s in feature.get("shape", ()))
    names = [str(n).lower() for n in feature.get("names") or []]
    if len(shape) == 3 and (names[:1] in (["channels"], ["channel"], ["c"]) or (
            not names and shape[0] in (1, 3, 4) and shape[2] not in (1, 3, 4))):
        return (shape[1], shape[2], shape[0])
    return shape


# Pillow modes of a stored image frame -> the decoded sample's dtype and channels: what
# LeRobot's decode gives (uint16 and float32 TIFF depth maps in their native values)
_MODES = {"L": ("uint8", 1), "RGB": ("uint8", 3), "RGBA": ("uint8", 4), "I;16": ("uint16", 1),
          "I;16L": ("uint16", 1), "I;16B": ("uint16", 1), "F": ("float32", 1)}


def _stored_format(data: bytes) -> tuple[str, str, int] | None:
    """A stored image frame's ``(encoding, dtype, channels)``, or None where Pillow does not
    read it or its mode is not one of :data:`_MODES`."""
    Image = require("PIL.Image", "data", "Reading LeRobot image features", "pillow")
    try:
        with Image.open(io.BytesIO(data)) as im:
            mode, kind = im.mode, (im.format or "png").lower()
    except (OSError, ValueError, SyntaxError):
        return None
    if mode not in _MODES:
        return None
    return (kind if kind in ("tiff", "jpeg") else "png"), *_MODES[mode]


# (dataset, feature) pairs of unknown dtype already said, in this process
_SAID: set[tuple[Path, str]] = set()


def _is_depth(feature: dict) -> bool:
    """Whether a camera feature is a depth map (``info``'s ``is_depth_map``, or the legacy
    ``video.is_depth_map`` in ``info`` or ``video_info``), as LeRobot tells."""
    info, video = feature.get("info") or {}, feature.get("video_info") or {}
    return bool(info.get("is_depth_map") or info.get("video.is_depth_map")
                or video.get("video.is_depth_map"))


def _known(dtype) -> bool:
    """Whether a feature ``dtype`` of ``meta/info.json`` is one this reader reads: a camera
    (``image``, ``video``), ``string`` events, or a bool or numeric NumPy dtype."""
    if dtype in ("image", "video", "string"):
        return True
    try:
        return isinstance(dtype, str) and np.dtype(dtype).kind in "biuf"
    except TypeError:
        return False


# LeRobot's language columns: message rows holding from their own time / emitted at their frame
PERSISTENT, EVENTS = "language_persistent", "language_events"


def language_columns(table: pa.Table, names: set[str]) -> dict[str, pa.Array]:
    """The string columns ``language.<style>.<role>`` in ``names`` (null where no message)
    of a data table's rows (in ``index`` order, with ``episode_index`` and ``timestamp``)
    from its LeRobot language columns, as LeRobot's recipes resolve them at each frame:

    - a persistent row (``language_persistent``: every frame of an episode lists all of the
      episode's) is placed at the episode's first frame at or after its own ``timestamp``,
      so that the latest message so far at a frame is LeRobot's ``active_at(t, style=...,
      role=...)`` there (rows of one style and role at one time: the last listed);
    - an event row (``language_events``: the rows emitted at that frame) is placed at its
      frame, as ``emitted_at`` finds it (several of one style and role: the last listed).

    View-dependent rows of different cameras share their style's stream."""
    n = len(table)
    out: dict[str, list] = {name: [None] * n for name in names}
    if not n:
        return {k: pa.array(v, pa.string()) for k, v in out.items()}

    def put(row: int, message: dict) -> None:
        key = f"language.{message.get('style')}.{message.get('role')}"
        if key in out and message.get("content") is not None:
            out[key][row] = str(message["content"])

    times = table.column("timestamp").to_numpy().astype(np.float64)
    episodes = table.column("episode_index").to_numpy()
    if PERSISTENT in table.column_names:
        col = table.column(PERSISTENT)
        starts = np.flatnonzero(np.r_[True, episodes[1:] != episodes[:-1]])
        for lo, hi in zip(starts, np.r_[starts[1:], n], strict=True):
            for message in sorted(col[int(lo)].as_py() or [],
                                  key=lambda m: float(m.get("timestamp") or 0.0)):
                at = lo + int(np.searchsorted(times[lo:hi],
                                              float(message.get("timestamp") or 0.0) - 1e-6))
                if at < hi:
                    put(int(at), message)
    if EVENTS in table.column_names:
        col = table.column(EVENTS)
        lengths = pc.fill_null(pc.list_value_length(col), 0).to_numpy(zero_copy_only=False)
        for row in np.flatnonzero(lengths).tolist():
            for message in col[row].as_py():
                put(row, message)
    return {k: pa.array(v, pa.string()) for k, v in out.items()}


def _language_keys(paths: list[Path]) -> list[str]:
    """The ``language.<style>.<role>`` streams of LeRobot language columns in data files."""
    keys: set[str] = set()
    for path in paths:
        file = pq.ParquetFile(path)
        have = [c for c in (PERSISTENT, EVENTS) if c in file.schema_arrow.names]
        for batch in file.iter_batches(columns=have) if have else ():
            for name in have:
                flat = pc.list_flatten(batch.column(name))
                if len(flat):
                    pairs = pa.Table.from_arrays([flat.field("style"), flat.field("role")],
                                                 ["s", "r"]).group_by(["s", "r"]).aggregate([])
                    keys.update(f"language.{s}.{r}" for s, r in zip(
                        pairs.column("s").to_pylist(), pairs.column("r").to_pylist(),
                        strict=True))
    return sorted(keys)


def _spec(name: str, feature: dict, fps: float,
          stored: tuple[str, str, int] | None = None) -> StreamSpec:
    dtype = feature["dtype"]
    shape = tuple(int(s) for s in feature.get("shape", ()))
    rate = float(feature.get("fps", fps)) if dtype != "string" else feature.get("fps")
    if dtype == "video":
        rate = float(feature.get("info", {}).get("video.fps", rate))
        h, w = _frame_shape(feature)[:2]
        if _is_depth(feature):  # 12-bit quantized depth: the codes, dequantized when served
            return StreamSpec(name, "video", "uint16", (h, w, 1), rate)
        return StreamSpec(name, "video", "uint8", (h, w, 3), rate)  # decoded as RGB
    if dtype == "image":  # PNG (TIFF: depth) bytes in the parquet: kept, decoded when served
        shape = _frame_shape(feature)
        if stored is None:
            return StreamSpec(name, "image", "uint8", shape, rate, encoding="png")
        encoding, sample, channels = stored  # as the frames are stored, whatever is declared
        return StreamSpec(name, "image", sample, (*shape[:2], channels), rate,
                          encoding=encoding)
    if dtype == "string":
        return StreamSpec(name, "event", "str", (), rate)
    kind = "image" if dtype == "uint8" and len(shape) == 3 else "numeric"
    return StreamSpec(name, kind, dtype, shape, rate)


def _read_info(path: Path) -> dict:
    """``meta/info.json``, checked for what every reader needs (an object with a positive
    ``fps`` and a ``features`` object)."""
    try:
        info = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as e:
        raise DataError(f"{path} is not valid JSON ({e}); fix or restore the file.") from e
    if not isinstance(info, dict):
        raise DataError(f"{path} must hold a JSON object; it holds {type(info).__name__}.")
    fps = info.get("fps")
    if isinstance(fps, bool) or not isinstance(fps, (int, float)) or not \
            (math.isfinite(fps) and fps > 0):
        raise DataError(f"{path}: 'fps' must be a finite rate > 0 Hz; got {fps!r}. Set it to the "
                        "rate the dataset was recorded at.")
    if not isinstance(info.get("features"), dict):
        raise DataError(f"{path}: 'features' (stream name -> dtype, shape) is missing or not an "
                        "object; restore it.")
    return info


def _json_line(path: Path, number: int, line: str) -> dict:
    try:
        return json.loads(line)
    except ValueError as e:
        raise DataError(f"{path} line {number} is not valid JSON ({e}); fix or restore the "
                        "file.") from e


def _is_list(t: pa.DataType) -> bool:
    return pa.types.is_list(t) or pa.types.is_fixed_size_list(t) or pa.types.is_large_list(t)


def _leaf_counts(arr: pa.Array) -> np.ndarray:
    """int64 ``[rows]``: the values flattening a (nested) list array gives each row (0 for a
    null row)."""
    counts = pc.list_value_length(arr).fill_null(0).to_numpy(zero_copy_only=False)
    counts = counts.astype(np.int64, copy=False)
    child = arr.flatten()
    if not _is_list(child.type):
        return counts
    inner = np.r_[0, np.cumsum(_leaf_counts(child))]
    ends = np.cumsum(counts)
    return inner[ends] - inner[ends - counts]


def _starts(arr: pa.Array) -> np.ndarray:
    """int ``[rows + 1]``: where each row of a (nested) list array begins among the values
    flattening gives (a null row holds none). The array's own offsets (no copy) when its null
    rows span no values, as parquet's decoder leaves them; else counted."""
    if pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type):
        offsets = arr.offsets.to_numpy()  # this array's rows (a slice's included)
        child = arr.flatten()
        if len(child) == offsets[-1] - offsets[0]:  # null rows span nothing
            if offsets[0]:
                offsets = offsets - offsets[0]
            return _starts(child)[offsets] if _is_list(child.type) else offsets
    return np.r_[0, np.cumsum(_leaf_counts(arr))]


class _Column:
    """One stream's column of a data table, decoded to NumPy once for every episode read
    from it (:meth:`rows`): its validity, and its values flattened (list columns) or its
    non-null strings (events). Image structs (PNG bytes) stay Arrow, sliced per episode."""

    def __init__(self, col: pa.ChunkedArray | pa.Array, spec: StreamSpec):
        self.spec, self.parts = spec, None
        if isinstance(col, pa.ChunkedArray) and col.num_chunks > 1 and spec.kind != "event" \
                and not pa.types.is_struct(col.type):
            # numeric values stay in their record batches (views of them, no combined copy):
            # an episode's rows come from the batches they span
            self.parts = [_Column(chunk, spec) for chunk in col.chunks]
            self.bounds = np.cumsum([0, *(len(chunk) for chunk in col.chunks)])
            return
        arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
        self.arr = arr
        self.valid = arr.is_valid().to_numpy(zero_copy_only=False) if arr.null_count else None
        self.starts = self.values = None
        if spec.kind == "event":  # the non-null strings, by valid row
            kept = arr if self.valid is None else arr.filter(pa.array(self.valid))
            self.values = np.array(kept.to_pylist(), dtype=object)
            self.starts = np.r_[0, np.cumsum(self.valid)] if self.valid is not None else None
            return
        if pa.types.is_struct(arr.type):
            return
        if _is_list(arr.type):  # each row's values: starts[row]:starts[row + 1]
            self.starts = _starts(arr)
            while _is_list(arr.type):
                arr = arr.flatten()
        self.values = arr.to_numpy(zero_copy_only=False)

    def rows(self, lo: int, hi: int) -> tuple[np.ndarray | None, np.ndarray]:
        """Rows ``lo:hi``: their validity (``None``: all valid) and the stream's samples
        ``[S, *shape]`` at the valid ones (object arrays of ``str`` for events, of ``bytes`` for
        PNG images)."""
        if self.parts is not None:
            return self._spanning(lo, hi)
        spec = self.spec
        valid = None if self.valid is None else self.valid[lo:hi]
        if spec.kind == "event":
            return valid, (self.values[lo:hi] if self.starts is None
                           else self.values[self.starts[lo]:self.starts[hi]])
        if self.values is None:  # image structs: {bytes: PNG, path}
            arr = self.arr.slice(lo, hi - lo)
            arr = arr if valid is None else arr.filter(pa.array(valid))
            return valid, np.array(arr.field("bytes").to_pylist(), dtype=object)
        n = hi - lo if valid is None else int(np.count_nonzero(valid))
        if self.starts is not None:
            values = self.values[self.starts[lo]:self.starts[hi]]
        else:
            values = self.values[lo:hi] if valid is None else self.values[lo:hi][valid]
        if values.size != n * spec.dim:
            raise DataError(f"stream {spec.name!r}: {values.size} values in {n} rows do not "
                            f"make samples of shape {spec.shape}.")
        return valid, values.astype(spec.dtype, copy=False).reshape(n, *spec.shape)

    def _spanning(self, lo: int, hi: int) -> tuple[np.ndarray | None, np.ndarray]:
        """:meth:`rows` of a column kept in record batches: each batch's share of ``lo:hi``,
        joined where the rows span more than one."""
        first = max(int(np.searchsorted(self.bounds, lo, side="right")) - 1, 0)
        got, counts = [], []
        for part, a, b in zip(self.parts[first:], self.bounds[first:-1],
                              self.bounds[first + 1:], strict=True):
            got.append(part.rows(min(max(lo, a), b) - a, min(hi, b) - a))
            counts.append(max(min(hi, b) - max(lo, a), 0))
            if b >= hi:
                break
        if len(got) == 1:
            return got[0]
        valid = None if all(v is None for v, _ in got) else np.concatenate(
            [np.ones(k, bool) if v is None else v for (v, _), k in zip(got, counts, strict=True)])
        return valid, np.concatenate([values for _, values in got])


# rows a data file is decoded in at a time: the whole file's decode at once pre-buffers and
# decompresses every column chunk whole, memory a fresh process faults in on its first reads
# (benchmarks/results/parquet-read-cpu-vm-2026-11-27.txt)
READ_BATCH_ROWS = 65536


class _Rows:
    """A data table decoded to NumPy once (timestamps, episode ids, per-row task names, the
    streams' :class:`_Column`), so reading an episode is slicing its rows."""

    def __init__(self, table: pa.Table, specs: dict[str, StreamSpec], tasks: dict[int, str]):
        self.length, self.names = len(table), set(table.column_names)
        self.ids = table.column("episode_index").to_numpy() if "episode_index" in \
            self.names else None
        self.times = table.column("timestamp").to_numpy().astype(np.float64) if \
            "timestamp" in self.names else None
        self.tasks = None
        if "task_index" in self.names and self.length:
            col = table.column("task_index")
            if col.null_count:  # int(NaN) fails each episode with a null, as it reads
                ids, inverse = np.unique(col.to_numpy(), return_inverse=True)
            else:  # hashed, not sorted: 3x faster on a file's 781k rows
                coded = pc.dictionary_encode(col).combine_chunks()
                ids, inverse = coded.dictionary.to_numpy(), coded.indices.to_numpy()
            self.tasks = np.array([tasks.get(int(i), "") for i in ids], dtype=object)[inverse]
        self.columns = {name: _Column(table.column(name), spec) for name, spec in specs.items()
                        if spec.kind != "video" and name in self.names}


class LeRobotSource:
    """A LeRobot v2.1 or v3.0 dataset directory (see the module docstring)."""

    format = "lerobot"

    def __init__(self, path: str | Path, fps: float | None = None):
        self.path = Path(path)
        if fps is not None:
            raise DataError(f"`fps` (--fps) times sources without timestamps; {self.path} is a "
                            "LeRobot dataset, timed by its 'timestamp' column: drop --fps.")
        self.info = _read_info(self.path / "meta" / "info.json")
        self.version = str(self.info.get("codebase_version", ""))
        if self.version not in VERSIONS:
            raise DataError(f"{self.path}: LeRobot codebase_version {self.version!r} is not "
                            f"supported; supported: {', '.join(VERSIONS)}. Convert it with "
                            "LeRobot's conversion scripts.")
        self.lance = self.info.get("storage_format") == "lance"
        if self.lance and self.version != "v3.0":
            raise DataError(f"{self.path}: a Lance-stored LeRobot dataset of codebase_version "
                            f"{self.version!r}; LeRobot's Lance layout is converted from v3.0 "
                            "datasets: convert it again from its v3.0 dataset.")
        if not self.lance and not isinstance(self.info.get("data_path"), str):
            raise DataError(f"{self.path / 'meta' / 'info.json'}: 'data_path' (the data file "
                            "template) is missing; restore it.")
        self.format = f"lerobot-{self.version}" + ("-lance" if self.lance else "")
        self.fps = float(self.info["fps"])
        self.timing = "timestamps from the 'timestamp' column"
        # v3.0 data files read (decoded, episode -> rows in it), the latest last
        self._files: dict[Path, tuple[_Rows, dict[int, int], pa.Table]] = {}
        self._bad_files: dict[Path, str] = {}
        self._columns: list[str] | None = None  # all of them
        self._paths: dict[str, Path] = {}
        self._tables: dict[str, object] = {}  # the Lance layout's tables, opened on first use
        self._videos: dict[tuple[str, int, int], tuple[int, int]] | None = None
        self._language: set[str] = set()  # LeRobot language columns' streams (set below)
        self._episodes = self._read_episodes()
        self._tasks = self._read_tasks()
        self._first_rows = self._file_starts()
        features = self.info["features"]
        # features that are not streams: LeRobot's language columns (lists of message rows per
        # frame, served by robocache.LeRobotDataset from the data files) and dtypes unknown
        # here (said once, the rest of the dataset read)
        self.unread = {k: f.get("dtype") for k, f in features.items() if isinstance(f, dict)
                       and k not in INDEX_COLUMNS and not _known(f.get("dtype"))}
        for k, dtype in self.unread.items():
            if dtype != "language" and (self.path, k) not in _SAID:
                _SAID.add((self.path, k))
                logging.getLogger(__name__).warning(
                    "%s: feature %r has dtype %r, which RoboCache does not read; it is left "
                    "out, the other features are read.", self.path, k, dtype)
        try:
            images = [k for k, f in features.items() if f.get("dtype") == "image"]
            stored = self._stored_formats(images)
            self.specs = {k: _spec(k, f, self.fps, stored.get(k)) for k, f in features.items()
                          if k not in INDEX_COLUMNS and k not in self.unread}
            # LeRobot's language columns as string streams, one per style and role present
            if not self.lance and "language" in self.unread.values():
                self._language = set(_language_keys(list(dict.fromkeys(
                    self._data_path(e) for e in self._episodes))))
                self.specs.update({k: StreamSpec(k, "event", "str", (), None)
                                   for k in sorted(self._language)})
            if all(s.kind == "event" for s in self.specs.values()):
                # only strings (or nothing) to read: the frames timed by their frame_index
                self.specs["frame_index"] = StreamSpec("frame_index", "numeric", "int64", (),
                                                       self.fps)
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise DataError(f"{self.path / 'meta' / 'info.json'}: a feature lacks a valid "
                            f"dtype/shape/fps ({type(e).__name__}: {e}); fix its 'features'.") \
                from e

    def _stored_formats(self, keys: list[str]) -> dict[str, tuple[str, str, int]]:
        """How the image features ``keys`` are stored, from the first frame of each in the
        first data file (LeRobot stores depth maps as uint16 or float32 TIFF, and serves a
        frame with the channels it was stored with, whatever ``shape`` declares); a key not
        found there is read as declared."""
        if not keys or not self._episodes:
            return {}
        try:
            if self.lance:
                lo = int(self._episodes[min(self._episodes)]["dataset_from_index"])
                batches = self._lance_rows(lo, lo + 64, keys).to_batches()
            else:
                file = pq.ParquetFile(self._data_path(min(self._episodes)))
                keys = [k for k in keys if k in file.schema_arrow.names]
                batches = file.iter_batches(batch_size=64, columns=keys)
            out: dict[str, tuple[str, str, int]] = {}
            for batch in batches:
                have = [k for k in keys if k in batch.column_names]
                for k in [k for k in have if k not in out]:
                    col = batch.column(k)
                    first = next((v for v in col.field("bytes").to_pylist() if v), None) \
                        if pa.types.is_struct(col.type) else None
                    if first is not None and (got := _stored_format(first)) is not None:
                        out[k] = got
                if len(out) == len(have):
                    break
            return out
        except (pa.ArrowException, OSError, KeyError, TypeError, ValueError, DataError):
            return {}  # read as declared; a bad file is reported by the episodes in it

    def _read_episodes(self) -> dict[int, dict]:
        meta = self.path / "meta"
        if self.version == "v2.1":
            path = meta / "episodes.jsonl"
            rows = [_json_line(path, n, line)
                    for n, line in enumerate(path.read_text().splitlines(), 1) if line.strip()]
        else:
            files = sorted((meta / "episodes").glob("chunk-*/file-*.parquet"))
            rows = []
            for f in files:
                try:  # LeRobot's per-episode statistics (most of the columns) left unread
                    names = [c for c in pq.read_schema(f).names if not c.startswith("stats/")]
                    rows += pq.read_table(f, columns=names).to_pylist()
                except (pa.ArrowException, OSError) as e:
                    raise DataError(f"{f}: the episode metadata is unreadable ({e}); check that "
                                    "the dataset is complete (copy or download it again).") from e
        try:
            return {int(r["episode_index"]): r for r in rows}
        except (KeyError, TypeError, ValueError) as e:
            raise DataError(f"{meta}: an episode metadata row lacks a valid 'episode_index' "
                            f"({e}); fix the episode metadata.") from e

    def _read_tasks(self) -> dict[int, str]:
        meta = self.path / "meta"
        if self.version == "v2.1":
            path = meta / "tasks.jsonl"
            if not path.exists():
                return {}
            rows = [_json_line(path, n, line)
                    for n, line in enumerate(path.read_text().splitlines(), 1) if line.strip()]
            return {int(r["task_index"]): r["task"] for r in rows}
        path = meta / "tasks.parquet"
        if not path.exists():
            return {}
        table = self._read_file(path)
        names = table.column("__index_level_0__" if "__index_level_0__" in table.column_names
                              else "task").to_pylist()
        return dict(zip(table.column("task_index").to_pylist(), names, strict=True))

    def episode_indices(self) -> list[int]:
        return sorted(self._episodes)

    def select(self, keys) -> None:
        """Read only the streams ``keys`` (and the index columns) from now on."""
        self._columns = ["timestamp", "episode_index", "task_index", *keys]
        self._files.clear()

    def _file_starts(self) -> dict[tuple[int, int], int]:
        """v3.0: the global index of each data file's first row (its first episode's
        ``dataset_from_index``): an episode's rows in its file start at ``from - start``."""
        starts: dict[tuple[int, int], int] = {}
        for ep in self._episodes.values():
            try:
                key = (int(ep["data/chunk_index"]), int(ep["data/file_index"]))
                start = int(ep["dataset_from_index"])
            except (KeyError, TypeError, ValueError):
                continue
            starts[key] = min(start, starts.get(key, start))
        return starts

    def _data_path(self, index: int) -> Path:
        ep = self._episodes[index]
        if self.lance:
            return self._under(LANCE_FRAMES)
        if self.version == "v2.1":
            chunks = int(self.info.get("chunks_size", 1000))
            return self.path / self.info["data_path"].format(episode_chunk=index // chunks,
                                                             episode_index=index)
        return self._under(self.info["data_path"].format(
            chunk_index=int(ep["data/chunk_index"]), file_index=int(ep["data/file_index"])))

    def _under(self, rel: str) -> Path:
        """``self.path / rel``, one Path object per file (v3.0 files hold many episodes, and
        a build asks for each episode's)."""
        got = self._paths.get(rel)
        if got is None:
            got = self._paths[rel] = self.path / rel
        return got

    def locate(self, index: int) -> str:
        """Where episode ``index`` lies: its data file (and, in v3.0, its rows there)."""
        ep = self._episodes[index]
        where = str(self._data_path(index))
        if "dataset_from_index" in ep:
            where += f" rows {ep['dataset_from_index']}:{ep['dataset_to_index']}"
        return where

    def files(self, index: int) -> list[Path]:
        """The files episode ``index`` is read from: its data file and its videos (the
        Lance layout: its frames table, and its videos table where it has video features)."""
        videos = [k for k, s in self.specs.items() if s.kind == "video"]
        if self.lance:
            return [self._data_path(index), *([self._under(LANCE_VIDEOS)] if videos else [])]
        return [self._data_path(index), *(self._video(index, k).path for k in videos)]

    def _lance(self, name: str):
        """The Lance layout's table ``name`` (:data:`LANCE_FRAMES`, :data:`LANCE_VIDEOS`),
        opened once."""
        got = self._tables.get(name)
        if got is None:
            lance = require("lance", "data", "Reading LeRobot's Lance-stored datasets",
                            "pylance")
            try:
                got = self._tables[name] = lance.dataset(str(self.path / name))
            except (OSError, ValueError, RuntimeError) as e:
                raise DataError(f"{self.path / name} is missing or unreadable ({e}); a "
                                "Lance-stored LeRobot dataset holds it beside meta/: copy or "
                                "convert the dataset again.") from e
        return got

    def _lance_rows(self, lo: int, hi: int, columns: list[str] | None = None) -> pa.Table:
        """Rows ``lo:hi`` of the frames table (its row ``i`` is the frame of ``index`` ``i``),
        the ``columns`` it has (all when None), named as ``meta/info.json`` names them."""
        table = self._lance(LANCE_FRAMES)
        names = {k.replace(".", "_"): k for k in [*INDEX_COLUMNS, *self.info["features"]]}
        stored = table.schema.names
        if columns is not None:
            wanted = {k.replace(".", "_") for k in columns}
            stored = [c for c in stored if c in wanted]
        hi = min(hi, table.count_rows())
        try:
            got = table.take(np.arange(lo, max(hi, lo), dtype=np.int64), columns=stored)
        except (OSError, ValueError, RuntimeError) as e:
            raise DataError(f"{self.path / LANCE_FRAMES}: rows {lo}:{hi} are unreadable "
                            f"({e}).") from e
        return got.rename_columns([names.get(c, c) for c in got.column_names])

    def data_table(self, episodes: list[int], columns: list[str] | None = None) -> pa.Table:
        """The rows of ``episodes`` as the dataset stores them (the ``columns`` it has, and
        ``index``; all columns when None), in ``index`` order, named as ``meta/info.json``
        names them: from their data files, or the Lance layout's frames table."""
        if columns is not None:
            columns = list(dict.fromkeys(["index", "episode_index", *columns]))
        if self.lance:
            spans = sorted((int(self._episodes[e]["dataset_from_index"]),
                            int(self._episodes[e]["dataset_to_index"])) for e in set(episodes))
            merged: list[list[int]] = []
            for lo, hi in spans:  # neighbouring episodes read in one take
                if merged and lo <= merged[-1][1]:
                    merged[-1][1] = max(merged[-1][1], hi)
                else:
                    merged.append([lo, hi])
            return pa.concat_tables([self._lance_rows(lo, hi, columns) for lo, hi in merged])
        tables = []
        for path in dict.fromkeys(self._data_path(e) for e in episodes):
            have = set(pq.read_schema(path).names)
            tables.append(pq.read_table(path, columns=None if columns is None else
                                        [c for c in columns if c in have]))
        table = pa.concat_tables(tables, promote_options="default")
        table = table.filter(pc.is_in(table.column("episode_index"), pa.array(
            sorted(set(episodes)), table.schema.field("episode_index").type)))
        return table.take(pc.sort_indices(table, [("index", "ascending")]))

    def _read_file(self, path: Path, columns: list[str] | None = None) -> pa.Table:
        """A data file (its ``columns`` that it has, or all); a file that fails to read fails
        every episode in it with the same reason (without reading it again)."""
        if path in self._bad_files:
            raise DataError(self._bad_files[path])
        language = self._language if columns is None else self._language.intersection(columns)
        try:
            file = pq.ParquetFile(path)
            if columns is not None:
                have = set(file.schema_arrow.names)
                columns = [c for c in dict.fromkeys(
                    [*columns, *((PERSISTENT, EVENTS) if language else ())]) if c in have]
            batches = list(file.iter_batches(batch_size=READ_BATCH_ROWS, columns=columns))
            table = pa.Table.from_batches(batches) if batches else file.read(columns=columns)
            if not language:
                return table
            derived = language_columns(table, language)
            table = table.drop_columns([c for c in (PERSISTENT, EVENTS)
                                        if c in table.column_names])
            for name, col in derived.items():
                table = table.append_column(name, col)
            return table
        except (pa.ArrowException, OSError) as e:
            self._bad_files[path] = f"{path} is unreadable ({type(e).__name__}: {e})"
            raise DataError(self._bad_files[path]) from e

    def _data_rows(self, index: int) -> tuple[_Rows, int, int]:
        """Episode ``index``'s rows: ``(decoded table, lo, hi)``. v3.0: its data file is read
        and decoded once (only the columns :meth:`select` asked for; the last two files read
        stay in memory) and the episode is the slice ``dataset_from_index:dataset_to_index``
        of it, checked against the file's ``episode_index`` column (the slice holds all of the
        file's rows of that episode and no other); a file whose rows are not where its
        metadata says is filtered on ``episode_index`` instead."""
        path = self._data_path(index)
        if self.version == "v2.1":
            rows = _Rows(self._read_file(path, self._columns), self.specs, self._tasks)
            return rows, 0, rows.length
        if self.lance:  # the frames table's rows of the episode, by index
            ep = self._episodes[index]
            lo, hi = int(ep["dataset_from_index"]), int(ep["dataset_to_index"])
            rows = _Rows(self._lance_rows(lo, hi, self._columns), self.specs, self._tasks)
            if rows.length != hi - lo or (rows.ids is not None and (rows.ids != index).any()):
                raise DataError(f"{path}: rows {lo}:{hi} are not all episode {index}'s, as its "
                                "metadata says; convert the dataset again.")
            return rows, 0, rows.length
        cached = self._files.pop(path, None)
        if cached is None:
            table = self._read_file(path, self._columns)
            rows = _Rows(table, self.specs, self._tasks)
            counts = pc.value_counts(table.column("episode_index")).flatten() \
                if rows.ids is not None else [pa.array([]), pa.array([])]
            cached = (rows, dict(zip(counts[0].to_pylist(), counts[1].to_pylist(),
                                     strict=True)), table)
            while len(self._files) >= 2:
                self._files.pop(next(iter(self._files)))
        self._files[path] = cached
        rows, counts, table = cached
        ep = self._episodes[index]
        try:
            key = (int(ep["data/chunk_index"]), int(ep["data/file_index"]))
            lo = int(ep["dataset_from_index"]) - self._first_rows[key]
            n = int(ep["dataset_to_index"]) - int(ep["dataset_from_index"])
        except (KeyError, TypeError, ValueError):
            lo, n = -1, 0
        if lo >= 0 and n > 0 and lo + n <= rows.length and counts.get(index) == n \
                and (rows.ids[lo:lo + n] == index).all():
            return rows, lo, lo + n  # every row of the episode, if they are all its own
        own = _Rows(table.filter(pc.equal(table.column("episode_index"), index)), self.specs,
                    self._tasks)
        return own, 0, own.length

    def video_refs(self, key: str) -> list[tuple[int, VideoRef]]:
        """Every episode's video of camera ``key``: ``(episode, VideoRef)`` (its file and
        where in it the episode starts), from the episode metadata (nothing decoded)."""
        return [(i, self._video(i, key)) for i in self.episode_indices()]

    def _video(self, index: int, key: str) -> VideoRef:
        ep = self._episodes[index]
        chunks = int(self.info.get("chunks_size", 1000))
        if self.version == "v2.1":
            rel = self.info["video_path"].format(episode_chunk=index // chunks, video_key=key,
                                                 episode_index=index)
            return VideoRef(self.path / rel, 0.0)
        chunk, file = int(ep[f"videos/{key}/chunk_index"]), int(ep[f"videos/{key}/file_index"])
        rel = self.info["video_path"].format(video_key=key, chunk_index=chunk, file_index=file)
        path = self._copied_out(key, chunk, file, rel) if self.lance else self._under(rel)
        return VideoRef(path, float(ep.get(f"videos/{key}/from_timestamp", 0.0)))

    def _copied_out(self, key: str, chunk: int, file: int, rel: str) -> Path:
        """The Lance layout: the MP4 file of ``key``, ``chunk``, ``file`` copied out of the
        videos table (see the module docstring), once per file and table version; a copy of
        the table's size is reused."""
        got = self._paths.get(rel)
        if got is not None:
            return got
        table = self._lance(LANCE_VIDEOS)
        if self._videos is None:  # (key, chunk, file) -> (row, size), read once
            t = table.to_table(columns=["video_key", "chunk_index", "file_index", "file_size"])
            self._videos = {(k, int(c), int(f)): (row, int(n)) for row, (k, c, f, n) in
                            enumerate(zip(*(t.column(i).to_pylist() for i in range(4)),
                                          strict=True))}
        found = self._videos.get((key, chunk, file))
        if found is None:
            raise DataError(f"{self.path / LANCE_VIDEOS} holds no video of {key!r} chunk {chunk} "
                            f"file {file}, which the episode metadata names; convert the "
                            "dataset again.")
        home = Path(os.environ.get("ROBOCACHE_HOME", Path.home() / ".cache" / "robocache"))
        digest = hashlib.sha1(str(self.path.resolve()).encode()).hexdigest()[:12]
        out = home / "lance-videos" / f"{self.path.name}-{digest}" / f"v{table.version}" / rel
        row, size = found
        if not (out.is_file() and out.stat().st_size == size):
            out.parent.mkdir(parents=True, exist_ok=True)
            part = out.with_name(f".{out.name}.{os.getpid()}.part")
            with table.take_blobs(LANCE_BLOB, indices=[row])[0] as blob, open(part, "wb") as f:
                shutil.copyfileobj(blob, f, 1 << 22)
            os.replace(part, out)  # whole, even with other processes copying it too
        self._paths[rel] = out
        return out

    def read(self, index: int) -> Episode:
        if index not in self._episodes:
            raise DataError(f"{self.path}: no episode {index} in the episode metadata.")
        rows, lo, hi = self._data_rows(index)
        if rows.times is None:
            raise DataError(f"episode {index}: the data file has no 'timestamp' column.")
        times = rows.times[lo:hi]
        streams: dict[str, Stream] = {}
        for name, spec in self.specs.items():
            if spec.kind == "video":
                streams[name] = Stream(spec, times, None, self._video(index, name))
                continue
            if name not in rows.columns:
                continue  # check_episode reports the missing stream
            valid, data = rows.columns[name].rows(lo, hi)
            streams[name] = Stream(spec, times if valid is None else times[valid], data)
        ep = self._episodes[index]
        tasks = ep.get("tasks") or []
        meta = {"tasks": list(tasks), "length": hi - lo}
        if rows.tasks is not None and hi > lo:
            # LeRobot's task is per frame (task_index), not per episode
            names = rows.tasks[lo:hi]
            meta["frame_tasks"] = (times, names)
            meta["tasks"] = meta["tasks"] or [names[0]]
        return Episode(index, streams, meta)


def _rows(episode: Episode, specs: dict[str, StreamSpec], start: int) -> pa.Table:
    """One episode as LeRobot rows: the union of its streams' timestamps, each stream non-null
    at its own samples (a single-rate episode gives the usual one row per frame)."""
    times = np.unique(np.concatenate([episode.streams[k].times for k in specs]))
    n = len(times)
    cols: dict[str, pa.Array] = {
        "timestamp": pa.array(times.astype(np.float32)),
        "frame_index": pa.array(np.arange(n, dtype=np.int64)),
        "episode_index": pa.array(np.full(n, episode.index, np.int64)),
        "index": pa.array(np.arange(start, start + n, dtype=np.int64)),
        "task_index": pa.array(np.full(n, int(episode.meta.get("task_index", 0)), np.int64)),
    }
    for name, spec in specs.items():
        stream = episode.streams[name]
        rows = np.searchsorted(times, stream.times)
        mask = np.ones(n, bool)
        mask[rows] = False
        if spec.kind == "event":
            values = np.full(n, None, dtype=object)
            values[rows] = stream.data
            cols[name] = pa.array(values.tolist(), pa.string())
            continue
        if not spec.shape:
            flat = np.zeros(n, dtype=spec.dtype)
            flat[rows] = stream.data
            cols[name] = pa.array(flat, mask=mask)
            continue
        # variable-size lists, as LeRobot (HF datasets) writes them; null where no sample
        values = pa.array(np.ascontiguousarray(stream.data).reshape(-1))
        for size in reversed(spec.shape[1:]):
            count = len(values) // size
            values = pa.ListArray.from_arrays(pa.array(np.arange(count + 1, dtype=np.int32)
                                                       * size), values)
        offsets = np.r_[0, np.cumsum(np.where(mask, 0, spec.shape[0]))].astype(np.int32)
        cols[name] = pa.ListArray.from_arrays(pa.array(offsets), values, mask=pa.array(mask))
    return pa.table(cols)


def write_lerobot(path: str | Path, episodes: list[Episode], specs: dict[str, StreamSpec], *,
                  fps: float, version: str = "v3.0", robot_type: str | None = None) -> Path:
    """Write episodes as a LeRobot dataset directory (v2.1 or v3.0; no video features).

    Streams whose ``rate_hz`` differs from ``fps`` (or that are sparse events) are written with
    the multi-rate extension described in the module docstring.

    Args:
        path: output directory (created; existing files are overwritten).
        episodes: episodes to write; ``meta["tasks"]`` (list of str) names their tasks.
        specs: streams to write (numeric, inline image or event).
        fps: the dataset's nominal frame rate in Hz (``info.json["fps"]``).
        version: ``"v2.1"`` or ``"v3.0"``.

    Returns:
        ``path``.
    """
    if version not in VERSIONS:
        raise ValueError(f"`version` must be one of {VERSIONS}; got {version!r}.")
    root = Path(path)
    (root / "meta").mkdir(parents=True, exist_ok=True)
    tasks: dict[str, int] = {}
    for ep in episodes:
        for task in ep.meta.get("tasks", []):
            tasks.setdefault(task, len(tasks))
    features: dict[str, dict] = {
        "timestamp": {"dtype": "float32", "shape": [1], "names": None},
        "frame_index": {"dtype": "int64", "shape": [1], "names": None},
        "episode_index": {"dtype": "int64", "shape": [1], "names": None},
        "index": {"dtype": "int64", "shape": [1], "names": None},
        "task_index": {"dtype": "int64", "shape": [1], "names": None},
    }
    for name, spec in specs.items():
        dtype = "string" if spec.kind == "event" else spec.dtype
        feature = {"dtype": dtype, "shape": list(spec.shape) or [1], "names": None}
        if spec.rate_hz != fps:
            feature["fps"] = spec.rate_hz
        features[name] = feature
    tables, start = [], 0
    for ep in episodes:
        ep.meta["task_index"] = tasks.get((ep.meta.get("tasks") or [""])[0], 0)
        tables.append(_rows(ep, specs, start))
        start += tables[-1].num_rows
    info = {
        "codebase_version": version, "robot_type": robot_type, "fps": fps,
        "total_episodes": len(episodes), "total_frames": start, "total_tasks": len(tasks),
        "chunks_size": 1000, "splits": {"train": f"0:{len(episodes)}"}, "features": features,
    }
    if version == "v2.1":
        info["data_path"] = "data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet"
        info["video_path"] = ("videos/chunk-{episode_chunk:03d}/{video_key}/"
                              "episode_{episode_index:06d}.mp4")
        for ep, table in zip(episodes, tables, strict=True):
            out = root / info["data_path"].format(episode_chunk=ep.index // 1000,
                                                  episode_index=ep.index)
            out.parent.mkdir(parents=True, exist_ok=True)
            pq.write_table(table, out, compression="zstd")
        (root / "meta" / "episodes.jsonl").write_text("".join(
            json.dumps({"episode_index": ep.index, "tasks": ep.meta.get("tasks", []),
                        "length": t.num_rows}) + "\n" for ep, t in zip(episodes, tables,
                                                                      strict=True)))
        (root / "meta" / "tasks.jsonl").write_text("".join(
            json.dumps({"task_index": i, "task": t}) + "\n" for t, i in tasks.items()))
    else:
        info["data_path"] = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
        info["video_path"] = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
        out = root / info["data_path"].format(chunk_index=0, file_index=0)
        out.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.concat_tables(tables), out, compression="zstd")
        bounds = np.cumsum([0] + [t.num_rows for t in tables])
        episodes_table = pa.table({
            "episode_index": [ep.index for ep in episodes],
            "tasks": [ep.meta.get("tasks", []) for ep in episodes],
            "length": [t.num_rows for t in tables],
            "data/chunk_index": [0] * len(episodes), "data/file_index": [0] * len(episodes),
            "dataset_from_index": bounds[:-1].tolist(), "dataset_to_index": bounds[1:].tolist(),
        })
        meta_out = root / "meta" / "episodes" / "chunk-000" / "file-000.parquet"
        meta_out.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(episodes_table, meta_out)
        pq.write_table(pa.table({"task_index": list(tasks.values()), "task": list(tasks)}),
                       root / "meta" / "tasks.parquet")
    (root / "meta" / "info.json").write_text(json.dumps(info, indent=2) + "\n")
    return root
