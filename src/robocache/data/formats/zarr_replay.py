"""diffusion-policy / UMI zarr ReplayBuffers: ``data/<key>`` arrays packed over all episodes,
``meta/episode_ends`` (exclusive end row of each episode).

Timestamps come from ``data/timestamp`` when present, else from ``fps`` (the rate the buffer
was recorded at; default 10 Hz, as diffusion policy's Push-T; the assumption is stated in
``timing``, which the manifest and ``inspect`` show). ``meta/episode_ends`` is validated: the
episodes whose ranges are empty, decreasing, overlapping or past the data are quarantined with
that reason, and rows after the last end (belonging to no episode) are an error. ``.zarr``
directories and ``.zarr.zip`` files are both read through the zarr library.

Missing chunks. zarr reads a chunk that is not in the store as the array's fill value, so a
deleted or never-copied chunk would become rows of zeros. Before an episode is read, every chunk
its rows need, of every ``data/<key>`` array (timestamps included), is looked up in the store;
a missing one quarantines the episode, naming the chunk and its rows. One case is ambiguous: a
zarr writer with ``write_empty_chunks=False`` (zarr-python 3's default) does not store a chunk
whose values all equal the fill value, so its absence is by design. An array whose metadata
declares no fill value (``"fill_value": null``) cannot have elided a chunk: a missing chunk is
always damage. When the writer elided chunks on purpose, ``missing_chunks="fill"`` (reader
option) reads them as the fill value, as zarr does; the default, ``"quarantine"``, never turns
an absent chunk into data silently.

Damaged chunks. A chunk whose bytes were overwritten decodes into garbage when its codec keeps
no checksum (Blosc's does not): values of any size, NaN and infinities among them, anywhere in
the chunk. A float array's chunks are therefore read whole and checked: a chunk holding a NaN or
an infinity quarantines every episode it holds rows of, naming it, not only the episodes whose
own rows show the damage (the episodes that share its boundary rows would otherwise be cached
with the garbage). Integer and image arrays cannot show damage this way; a checksum codec
(numcodecs' CRC32 or Fletcher32) makes any damaged chunk a read error.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np

from robocache._optional import require
from robocache.data.cameras import is_camera
from robocache.data.episode import Episode, Stream, StreamSpec
from robocache.data.formats import check_fps
from robocache.errors import DataError, MissingDependencyError

TIME_KEY = "timestamp"
MISSING_CHUNKS = ("quarantine", "fill")


def _open(path: Path):
    zarr = require("zarr", "data", "Reading zarr ReplayBuffers")
    if path.suffix == ".zip":
        return zarr.open_group(zarr.storage.ZipStore(path, mode="r"), mode="r")
    return zarr.open_group(str(path), mode="r")


def detect(path: Path) -> bool:
    if path.is_file():
        return path.name.endswith(".zarr.zip")
    return (path / "meta" / "episode_ends").exists()


def episode_ranges(ends: np.ndarray, rows: int) -> list[tuple[int, int, str | None]]:
    """``(start, stop, problem)`` of each episode from ``meta/episode_ends``; ``problem`` (the
    quarantine reason) is set when the range is empty, decreasing, overlaps an earlier episode or
    runs past the ``rows`` of data."""
    out, reach = [], 0  # reach: the furthest row an earlier episode claimed
    for i, stop in enumerate(int(e) for e in ends):
        start = int(ends[i - 1]) if i else 0
        problem = None
        if stop <= start:
            problem = (f"meta/episode_ends does not increase at episode {i} ({start} then "
                       f"{stop}): the episode has no rows")
        elif start < reach:
            problem = (f"rows {start}:{stop} overlap an earlier episode (which ends at row "
                       f"{reach}): meta/episode_ends decreases before episode {i}")
        elif stop > rows:
            problem = f"rows {start}:{stop} run past the data ({rows} rows)"
        out.append((start, stop, problem))
        reach = max(reach, stop)
    return out


def _stored_keys(arr) -> set[str]:
    """The keys the store holds under an array (its chunks and metadata)."""
    prefix, store = f"{arr.path}/", arr.store
    if hasattr(store, "list_prefix"):  # zarr 3: an asynchronous store
        from zarr.core.sync import sync

        async def listed() -> set[str]:
            return {k async for k in store.list_prefix(prefix)}

        return sync(listed())
    return {k for k in store if k.startswith(prefix)}  # zarr 2: a mapping


class ZarrReplaySource:
    """A zarr ReplayBuffer (see the module docstring); ``fps`` times buffers without timestamps.

    Raises:
        DataError: the buffer lacks ``data`` or ``meta/episode_ends``, they cannot be read, the
            data arrays differ in length, rows follow the last episode end, or ``fps`` is not a
            finite rate > 0.
    """

    format = "zarr-replay"

    def __init__(self, path: str | Path, fps: float | None = None,
                 missing_chunks: str = "quarantine"):
        if missing_chunks not in MISSING_CHUNKS:
            raise DataError(f"`missing_chunks` must be one of {MISSING_CHUNKS}; got "
                            f"{missing_chunks!r}.")
        self.path = Path(path)
        self.missing_chunks = missing_chunks
        self._stored: dict[str, set[str]] = {}  # array -> the chunk keys its store holds
        try:
            self.root = _open(self.path)
            self.ends = np.asarray(self.root["meta"]["episode_ends"][:]).reshape(-1)
            self.data = self.root["data"]
        except KeyError as e:
            raise DataError(f"{self.path}: a ReplayBuffer needs 'data/<key>' arrays and "
                            f"'meta/episode_ends'; missing {e}.") from e
        except MissingDependencyError:  # zarr itself is missing: not damaged data
            raise
        except Exception as e:  # zarr/numcodecs raise their own types on damaged metadata
            raise DataError(f"{self.path}: cannot read the ReplayBuffer's meta/episode_ends "
                            f"({type(e).__name__}: {e}); check that the dataset is complete.") \
                from e
        if self.ends.dtype.kind not in "iu":
            raise DataError(f"{self.path}: meta/episode_ends must hold integers (exclusive end "
                            f"rows); it holds {self.ends.dtype}.")
        self.ends = self.ends.astype(np.int64)
        self.has_time = TIME_KEY in set(self.data.array_keys())
        self.fps, self.timing = check_fps(fps, 10.0, self.path)  # the nominal rate
        if self.has_time:
            self.timing = f"timestamps from data/{TIME_KEY}"
        lengths = {k: int(self.data[k].shape[0]) for k in self.data.array_keys()}
        if len(set(lengths.values())) > 1:
            raise DataError(f"{self.path}: the data arrays have different lengths {lengths}; "
                            "every data/<key> needs one row per step.")
        rows = next(iter(lengths.values()), 0)
        last = int(self.ends.max()) if len(self.ends) else 0
        if last < rows:
            raise DataError(f"{self.path}: meta/episode_ends ends at row {last} but the data has "
                            f"{rows} rows, so {rows - last} rows belong to no episode; fix "
                            "meta/episode_ends (its last entry is the number of rows).")
        self.ranges = episode_ranges(self.ends, rows)
        self.specs: dict[str, StreamSpec] = {}
        for key in sorted(self.data.array_keys()):
            if key == TIME_KEY:
                continue
            arr = self.data[key]
            shape = tuple(int(s) for s in arr.shape[1:])
            dtype = np.dtype(arr.dtype)
            kind = "image" if is_camera(dtype, shape) else "numeric"
            self.specs[key] = StreamSpec(key, kind, dtype.name, shape, self.fps)

    def episode_indices(self) -> list[int]:
        return list(range(len(self.ends)))

    def locate(self, index: int) -> str:
        """Where episode ``index`` lies: the buffer and its rows."""
        start, stop, _ = self.ranges[index]
        return f"{self.path} rows {start}:{stop}"

    def read(self, index: int) -> Episode:
        if not 0 <= index < len(self.ranges):
            raise DataError(f"{self.path}: no episode {index} (it has {len(self.ranges)}).")
        start, stop, problem = self.ranges[index]
        if problem:
            raise DataError(f"episode {index}: {problem}.")
        if self.missing_chunks == "quarantine":
            for key in sorted(self.data.array_keys()):
                self._check_chunks(key, start, stop)
        if self.has_time:
            times = np.asarray(self._rows(TIME_KEY, start, stop), np.float64).reshape(-1)
        else:
            times = np.arange(stop - start, dtype=np.float64) / self.fps
        streams = {}
        for name, spec in self.specs.items():
            streams[name] = Stream(spec, times, self._rows(name, start, stop))
        return Episode(index, streams, {"length": stop - start})

    def _rows(self, key: str, start: int, stop: int) -> np.ndarray:
        """Rows ``start:stop`` of ``data/<key>``. A float array's chunks are read whole and
        must hold finite values only: a chunk whose bytes were damaged decodes (Blosc keeps no
        checksum) into garbage that is often non-finite somewhere, but not always in the
        rows an episode reads; judged by its whole chunk, every episode that chunk feeds is
        quarantined, not only the ones whose own rows show it.

        Raises:
            DataError: a chunk with a NaN or infinite value (naming it and its rows).
        """
        arr = self.data[key]
        if np.dtype(arr.dtype).kind != "f":
            return self._read(key, start, stop)
        rows = arr.chunks[0]
        a, b = start // rows * rows, min(-(-stop // rows) * rows, int(arr.shape[0]))
        block = self._read(key, a, b)
        finite = np.isfinite(block.reshape(len(block), -1)).all(axis=1)
        if not finite.all():
            bad = a + int(np.flatnonzero(~finite)[0])
            c = bad // rows * rows
            chunk = next(k for k, first in self._chunks(key, c, c + 1))
            raise DataError(f"chunk {chunk} (rows {c}:{min(c + rows, int(arr.shape[0]))}) "
                            f"holds NaN or infinite values (row {bad}): its bytes are damaged, "
                            "or an episode there holds them; every episode it holds is "
                            "quarantined (restore the chunk from a good copy).")
        return block[start - a:stop - a]

    def _read(self, key: str, start: int, stop: int) -> np.ndarray:
        """Rows ``start:stop`` of ``data/<key>``; a chunk that does not decode is named.

        Raises:
            DataError: naming the first chunk that does not decode and the codec's error.
        """
        arr = self.data[key]
        try:
            return np.asarray(arr[start:stop])
        except Exception as e:  # the codecs raise their own types on damaged bytes
            rows = arr.chunks[0]
            for chunk, first in self._chunks(key, start, stop):
                try:
                    arr[first:first + 1]
                except Exception:  # this one: named
                    raise DataError(f"chunk {chunk} (rows {first}:"
                                    f"{min(first + rows, int(arr.shape[0]))}) cannot be decoded "
                                    f"({type(e).__name__}: {e}); restore it from a good copy."
                                    ) from e
            raise

    def files(self, index: int) -> list[Path]:
        """The chunk files episode ``index`` is read from (a ``.zarr`` directory; a
        ``.zarr.zip`` is one file, which every episode is read from)."""
        if self.path.is_file():
            return [self.path]
        start, stop, problem = self.ranges[index]
        if problem:
            return []
        return [self.path / chunk for key in sorted(self.data.array_keys())
                for chunk, _ in self._chunks(key, start, stop)]

    def _chunks(self, key: str, start: int, stop: int):
        """``(store key, first row)`` of every chunk of ``data/<key>`` holding rows
        ``start:stop``."""
        arr = self.data[key]
        rows = arr.chunks[0]
        grid = [range(start // rows, (stop - 1) // rows + 1),
                *(range(n) for n in arr.cdata_shape[1:])]
        meta = getattr(arr, "metadata", None)
        for coords in itertools.product(*grid):
            if hasattr(meta, "encode_chunk_key"):  # zarr 3
                yield f"{arr.path}/{meta.encode_chunk_key(coords)}", coords[0] * rows
            else:  # zarr 2
                yield arr._chunk_key(coords), coords[0] * rows

    def _check_chunks(self, key: str, start: int, stop: int) -> None:
        """Raise when a chunk of ``data/<key>`` holding rows ``start:stop`` is not stored."""
        arr = self.data[key]
        if key not in self._stored:
            self._stored[key] = _stored_keys(arr)
        rows = arr.chunks[0]
        for chunk, a in self._chunks(key, start, stop):
            if chunk not in self._stored[key]:
                meta = getattr(arr, "metadata", None)
                fill = meta.fill_value if hasattr(meta, "fill_value") else arr.fill_value
                fill = fill.item() if hasattr(fill, "item") else fill  # NumPy scalar: plain
                why = ("the array declares no fill value, so it was never elided" if fill is None
                       else f"zarr would read it as the fill value {fill!r}")
                raise DataError(
                    f"chunk {chunk} (rows {a}:{min(a + rows, arr.shape[0])}) is missing from "
                    f"the store ({why}); restore it, or, if its writer left out chunks equal "
                    "to the fill value on purpose (write_empty_chunks=False), read with "
                    "source_options={'missing_chunks': 'fill'}.")
