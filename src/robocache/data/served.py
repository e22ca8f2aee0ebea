"""What the processes of one machine share to serve a cache: its index and numeric columns.

Serving a cache needs, for every served step, the words of its numeric keys, its episode,
step, timestamp and task, and, for every camera, where each frame is in the cache's frame
table. :func:`open_served` writes these once per machine into a folder of ``.npy`` files (the
*served index*) and memory-maps them: every DataLoader worker and every rank on the machine
maps the same files, so what they hold is one copy in the OS page cache (shared, and given
back to the OS under memory pressure), never a private copy each. Camera frames are not
copied: they are read from the cache per batch (:class:`robocache.data.frames.LanceFrames`).

The folder is ``$ROBOCACHE_SERVE_DIR`` (default ``$ROBOCACHE_HOME/serve``, else
``~/.cache/robocache/serve``) / a digest of what it serves: the cache's URI, its build
(``created``), the versions of its Lance tables, the keys and the episodes. A cache extended
or compacted later gets a new folder; a dataset keeps the one it opened (and so serves the
version it opened). Making one streams the cache's numeric columns once, in batches (memory
bounded by the batch, whatever the cache's size); the first process on the machine makes it
under a lock, the others wait and map it. The folders are RoboCache's own: any that no
process has open can be deleted at any time (the next open makes it again); making a new one
removes the same cache's folders that no process has opened for a week.

Files of a folder: ``data.npy`` (int32 ``[rows, words]``: every key's values as raw
little-endian words, then one 0/1 alignment-pad column per key that has padded steps),
``episode_index.npy``, ``step.npy``, ``task_id.npy`` (int64 ``[rows]``), ``timestamp.npy``
(float64 ``[rows]``), ``offsets.npy`` (int64 ``[S + 1]``: where each segment starts; a segment
is an episode, or with keep ranges one kept range of an episode: windows never cross one) and
``episode_ids.npy`` (int64 ``[E]``: the served episodes, each with at least one kept step), per
camera ``frames-<i>-addresses.npy`` (int64 ``[F]``: each served frame's Lance row
address) and ``frames-<i>-offsets.npy`` (int64 ``[E + 1]``), for a camera kept as video also
``frames-<i>-pts.npy``, ``-dts.npy``, ``-gop.npy`` (int64 ``[F]``) and ``-config.npy`` (int32
``[E]``, into ``meta.json``'s ``video`` list of codecs and configurations), and ``meta.json``
(the layout, task names, table versions; written last, with the folder renamed into place).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import shutil
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from robocache._optional import require
from robocache.errors import DataError

#: The served index's layout version (part of every folder's digest).
FORMAT = 2
#: Rows per batch of the streaming scans that make a served index.
SCAN_ROWS = 1 << 16
# A build extending the cache compacts the small fragments it wrote and removes old versions as
# it goes; a scan that overlaps that can find one of those files gone. The rows are all still
# there, rewritten into the newer version, so the tables are opened again at their newest
# version, at most this many times in all. Any other error is raised as is.
ATTEMPTS = 3
# A served index no process has opened for this long is removed when another index of the
# same cache is made (a week: a job that pauses a weekend still finds its own).
PRUNE_AFTER_S = 7 * 24 * 3600.0


def serve_dir() -> Path:
    """Where served indexes go: ``$ROBOCACHE_SERVE_DIR``, else ``$ROBOCACHE_HOME/serve``, else
    ``~/.cache/robocache/serve``."""
    if os.environ.get("ROBOCACHE_SERVE_DIR"):
        return Path(os.environ["ROBOCACHE_SERVE_DIR"])
    home = os.environ.get("ROBOCACHE_HOME")
    return (Path(home) if home else Path.home() / ".cache" / "robocache") / "serve"


@dataclass(frozen=True)
class Column:
    """A served key's cache columns: ``values`` (a fixed-size list column, or a camera's
    ``<col>/frame`` int64 column) and ``pad`` (its ``_is_pad`` bool column); ``camera`` is
    the camera stream's name (its frame table), or None."""

    key: str
    values: str
    pad: str
    camera: str | None


def _map(path: Path) -> np.ndarray:
    """The ``.npy`` file at ``path``, memory-mapped copy-on-write (pages are the page
    cache's, shared by every process mapping it, until a process writes one)."""
    return np.load(path, mmap_mode="c")


class Served:
    """A served index, mapped (see the module docstring).

    Attributes:
        path: its folder.
        meta: ``meta.json``: ``layout`` (key -> [first word, words, dtype, dim, pad word or
            None]), ``task_names``, ``data_version``, ``frames`` (camera -> its table
            ``version``), ``rows``.
    """

    def __init__(self, path: Path):
        self.path = path
        self.meta = json.loads((path / "meta.json").read_text())

    def array(self, name: str) -> np.ndarray:
        """File ``name`` (without ``.npy``), mapped."""
        return _map(self.path / f"{name}.npy")

    def camera_file(self, camera: str, what: str) -> str:
        return f"frames-{self.meta['cameras'].index(camera)}-{what}"


def open_served(location, manifest: dict[str, Any], columns: Sequence[Column],
                episodes: Sequence[int] | None,
                ranges: Mapping[int, Sequence[tuple[int, int]]] | None = None) -> Served:
    """The served index of ``columns`` over ``episodes`` (None: every cached episode) of the
    cache at ``location`` whose manifest is ``manifest``: mapped if this machine has it, else
    made (once for every process asking at once). A scan that finds a file of the tables gone
    (a writer's compaction) starts again at the tables' newer versions.

    ``ranges`` keeps only these steps of the episodes it names (episode -> sorted,
    non-overlapping half-open ``(start, stop)`` step ranges; the others whole): each kept range
    is a segment of its own (``offsets.npy``), so a window stops at a cut and is padded there;
    an episode left without a kept step is not served.

    Raises:
        DataError: the serve folder cannot be written (naming it and
            ``ROBOCACHE_SERVE_DIR``), the disk is full, or the cache's rows are not each
            episode's steps ``0..n-1`` once each (naming the episode).
    """
    from robocache.data.location import LANCE
    from robocache.data.reader import READER

    if ranges is not None:
        ranges = {int(e): [(int(a), int(b)) for a, b in r] for e, r in ranges.items()}
    if LANCE.forked_after_use:  # Lance's runtime did not survive the fork
        return Served(Path(READER.open_served(location, manifest, columns, episodes, ranges)))
    for attempt in range(ATTEMPTS):
        try:
            with LANCE.call():  # a fork waits for the scans to end
                return _open(location, manifest, columns, episodes, ranges)
        except (OSError, ValueError) as e:  # pyarrow's ArrowInvalid is a ValueError
            if attempt == ATTEMPTS - 1 or isinstance(e, DataError) or \
                    "not found" not in str(e).lower():
                raise
    raise AssertionError("unreachable")


def _open(location, manifest: dict[str, Any], columns: Sequence[Column],
          episodes: Sequence[int] | None,
          ranges: dict[int, list[tuple[int, int]]] | None = None) -> Served:
    """One attempt of :func:`open_served`, at the tables' latest versions."""
    from robocache.data.versions import open_table

    # at the Lance versions the manifest pins (an edited cache), else the latest
    tables = {"data": open_table(location, manifest, "data.lance")}
    cameras = sorted({c.camera for c in columns if c.camera is not None})
    for cam in cameras:
        tables[cam] = open_table(location, manifest, f"frames/{cam}.lance")
    ident = {"format": FORMAT, "uri": location.uri, "created": manifest.get("created"),
             "versions": {k: t.version for k, t in tables.items()},
             "columns": [[c.key, c.values, c.pad, c.camera] for c in columns],
             "episodes": None if episodes is None else sorted(map(int, episodes))}
    if ranges is not None:  # (absent otherwise: the folders of unfiltered caches keep their name)
        ident["ranges"] = sorted([e, [list(r) for r in rs]] for e, rs in ranges.items())
    digest = hashlib.sha1(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:20]
    root = serve_dir()
    final = root / f"{location.name or 'cache'}-{digest}"
    if (final / "meta.json").exists():
        return _used(final)
    try:
        root.mkdir(parents=True, exist_ok=True)
        lock = os.open(root / f".{final.name}.lock", os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        raise _serve_dir_error(root, e) from e
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one maker per machine; the others wait, then map
        if (final / "meta.json").exists():
            return _used(final)
        for stale in root.glob(f".{final.name}.tmp-*"):  # a maker killed before its rename
            shutil.rmtree(stale, ignore_errors=True)
        _prune(root, location.name or "cache")
        tmp = root / f".{final.name}.tmp-{os.getpid()}"
        try:
            tmp.mkdir()
            _make(tmp, tables, columns, cameras, episodes, ident, ranges)
            os.rename(tmp, final)
        except BaseException as e:
            shutil.rmtree(tmp, ignore_errors=True)
            if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG,
                                                       errno.EROFS, errno.EACCES):
                raise _serve_dir_error(root, e) from e
            raise
    finally:
        os.close(lock)
    return _used(final)


def _used(folder: Path) -> Served:
    """``folder``'s served index, its ``meta.json`` touched: the last time a process opened it
    (what :func:`_prune` goes by)."""
    with contextlib.suppress(OSError):  # a read-only serve folder: nothing is pruned there
        os.utime(folder / "meta.json")
    return Served(folder)


def _prune(root: Path, name: str) -> None:
    """Remove the served indexes of caches named ``name`` that no process has opened for
    :data:`PRUNE_AFTER_S` (older versions of the cache, other keys or episodes), so that the
    serve folder does not grow with every version served; a process still mapping one keeps
    its mappings (the files go when the last one closes)."""
    cutoff = time.time() - PRUNE_AFTER_S
    for folder in root.glob(f"{name}-*"):
        meta = folder / "meta.json"
        try:
            if folder.is_dir() and meta.stat().st_mtime < cutoff:
                shutil.rmtree(folder, ignore_errors=True)
        except OSError:
            continue


def _serve_dir_error(root: Path, e: OSError) -> DataError:
    why = "the disk is full" if e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG) else \
        f"it cannot be written ({e.strerror})"
    return DataError(f"{root}: the served index of the cache (its numeric columns, shared by "
                     f"this machine's processes) cannot be made there: {why}; free space there "
                     "or set ROBOCACHE_SERVE_DIR to a writable local folder with room.")


def _segments(ids: np.ndarray, counts: dict[int, int],
              ranges: dict[int, list[tuple[int, int]]] | None):
    """The kept segments of the episodes ``ids`` (each ``counts[e]`` steps): arrays of each
    segment's episode position in ``ids``, first step and one past its last step, in (episode,
    step) order; every episode whole when ``ranges`` is None."""
    pos, start, stop = [], [], []
    for i, e in enumerate(ids.tolist()):
        n = counts[e]
        for a, b in (ranges.get(e, [(0, n)]) if ranges is not None else [(0, n)]):
            a, b = max(0, a), min(n, b)
            if b > a:
                pos.append(i)
                start.append(a)
                stop.append(b)
    return (np.array(pos, np.int64), np.array(start, np.int64), np.array(stop, np.int64))


def _make(dest: Path, tables: dict[str, Any], columns: Sequence[Column], cameras: list[str],
          episodes: Sequence[int] | None, ident: dict[str, Any],
          ranges: dict[int, list[tuple[int, int]]] | None = None) -> None:
    """Write a served index into the empty folder ``dest`` (see the module docstring)."""
    pa = require("pyarrow", "data", "Arrow tables")
    pc = require("pyarrow.compute", "data", "Arrow tables")

    data = tables["data"]
    wanted = None if episodes is None else np.unique(np.asarray(episodes, np.int64))
    # pass 1, small columns: each episode's steps, which keys have padded steps
    counts: dict[int, int] = {}
    padded = {c.key: False for c in columns}
    pads = sorted({c.pad for c in columns})
    for batch in data.to_batches(columns=["episode_index", *pads], batch_size=SCAN_ROWS):
        ep = batch.column(0).to_numpy()
        keep = _keep(ep, wanted)
        for e, n in zip(*np.unique(ep[keep], return_counts=True), strict=True):
            counts[int(e)] = counts.get(int(e), 0) + int(n)
        for c in columns:
            if not padded[c.key]:
                pad = batch.column(c.pad).to_numpy(zero_copy_only=False)[keep]
                padded[c.key] = bool(pad.any())
    all_ids = np.array(sorted(counts), np.int64)
    seg_pos, seg_start, seg_stop = _segments(all_ids, counts, ranges)
    ids = all_ids[np.unique(seg_pos)]  # the episodes with a kept step
    # each episode's full step count (rows are checked against it), and its kept segments
    full = np.array([counts[int(e)] for e in ids], np.int64)
    seg_pos = np.searchsorted(ids, all_ids[seg_pos])
    offsets = np.r_[0, np.cumsum(seg_stop - seg_start)].astype(np.int64)
    rows = int(offsets[-1])
    # a row (episode position p, step k) lies in the last segment starting at or before it
    key_scale = int(full.max()) + 1 if len(full) else 1
    seg_key = seg_pos * key_scale + seg_start
    # the word layout: each key's values, then a pad column per key with padded steps
    schema = data.schema
    layout, at = {}, 0
    for c in columns:
        field = schema.field(c.values)
        if c.camera is not None:
            dtype, dim = np.dtype(np.int64), 1
        else:
            dtype = np.dtype(field.type.value_type.to_pandas_dtype())
            dim = field.type.list_size
        words = -(-dim * dtype.itemsize // 4)
        layout[c.key] = [at, words, dtype.name, dim, None]
        at += words
    for c in columns:
        if padded[c.key]:
            layout[c.key][4] = at
            at += 1
    width = at
    # every camera's frames: each served frame's row address, in (episode, frame) order
    frame_base, video = {}, {}
    for i, cam in enumerate(cameras):
        frame_base[cam], configs = _frames(dest, i, cam, tables[cam], ids)
        if configs is not None:
            video[cam] = configs
    out = {name: _allocate(dest / f"{name}.npy", dtype, shape)
           for name, dtype, shape in [("data", np.int32, (rows, width)),
                                      ("episode_index", np.int64, (rows,)),
                                      ("step", np.int64, (rows,)),
                                      ("task_id", np.int64, (rows,)),
                                      ("timestamp", np.float64, (rows,))]}
    seen = np.zeros(rows, np.uint8)
    tasks: dict[str, int] = {}
    value_cols = list(dict.fromkeys([c.values for c in columns] + pads))
    for batch in data.to_batches(columns=["episode_index", "step", "timestamp", "task",
                                          *value_cols], batch_size=SCAN_ROWS):
        ep = batch.column(0).to_numpy()
        keep = _keep(ep, wanted)
        if not keep.any():
            continue
        ep, step = ep[keep], batch.column(1).to_numpy()[keep]
        pos = np.searchsorted(ids, ep)
        served = (pos < len(ids)) & (ids[np.minimum(pos, max(len(ids) - 1, 0))] == ep) \
            if len(ids) else np.zeros(len(ep), bool)
        n = full[np.minimum(pos, max(len(ids) - 1, 0))] if len(ids) else np.zeros(len(ep), int)
        if (served & ((step < 0) | (step >= n))).any():
            bad = int(ep[served & ((step < 0) | (step >= n))][0])
            raise _rows_error(bad)
        seg = np.searchsorted(seg_key, pos * key_scale + step, side="right") - 1
        segc = np.maximum(seg, 0)
        kept = served & (seg >= 0) & (seg_pos[segc] == pos) & (step < seg_stop[segc])
        if not kept.all():  # steps outside the kept ranges (or episodes without any)
            if not kept.any():
                continue
            chosen = np.flatnonzero(keep)[kept]
            keep = np.zeros(len(keep), bool)
            keep[chosen] = True
            ep, step, pos, segc = ep[kept], step[kept], pos[kept], segc[kept]
        dest_rows = offsets[segc] + step - seg_start[segc]
        seen[dest_rows] = 1
        out["episode_index"][dest_rows] = ep
        out["step"][dest_rows] = step
        out["timestamp"][dest_rows] = batch.column(2).to_numpy()[keep]
        task = pc.fill_null(batch.column(3), "").filter(pa.array(keep)).dictionary_encode()
        lut = np.array([tasks.setdefault(t, len(tasks)) for t in
                        task.dictionary.to_pylist()] or [0], np.int64)
        out["task_id"][dest_rows] = lut[task.indices.to_numpy(zero_copy_only=False)]
        for c in columns:
            first, words, _, dim, pad_col = layout[c.key]
            col = batch.column(c.values).filter(pa.array(keep))
            pad = batch.column(c.pad).to_numpy(zero_copy_only=False)[keep]
            if c.camera is not None:
                frame = col.to_numpy(zero_copy_only=False).astype(np.int64)
                base = frame_base[c.camera]
                outside = ~pad & ((frame < 0) | (frame >= base[pos + 1] - base[pos]))
                if outside.any():
                    raise DataError(f"camera {c.camera!r}: episode {int(ep[outside][0])} "
                                    "names frames its frame table lacks (a damaged cache); "
                                    "rebuild it with `robocache ingest SOURCE DEST "
                                    "--overwrite`.")
                values = np.where(pad, 0, base[pos] + np.maximum(frame, 0))
                values = values.astype(np.int64)[:, None]
            else:
                values = col.flatten().to_numpy(zero_copy_only=False).reshape(len(ep), dim)
            out["data"][dest_rows, first:first + words] = _words(values)
            if pad_col is not None:
                out["data"][dest_rows, pad_col] = pad
    # as many rows as places, each in its episode's range: a row twice leaves a place unseen
    if not seen.all():
        at_row = int(np.flatnonzero(seen == 0)[0])
        raise _rows_error(int(ids[np.searchsorted(offsets, at_row, side="right") - 1]))
    for arr in out.values():
        arr.flush()
    np.save(dest / "offsets.npy", offsets)
    np.save(dest / "episode_ids.npy", ids)
    meta = {**ident, "rows": rows, "layout": layout, "task_names": list(tasks),
            "cameras": cameras, "video": video}
    (dest / "meta.json").write_text(json.dumps(meta))


def _allocate(path: Path, dtype, shape: tuple[int, ...]) -> np.ndarray:
    """A new ``.npy`` file of ``shape``, its blocks allocated on disk, mapped for writing: a
    disk too full for it fails here with ``ENOSPC``, not later as a ``SIGBUS`` in a write to
    the mapping."""
    arr = np.lib.format.open_memmap(path, "w+", dtype, shape)
    with open(path, "r+b") as f:
        os.posix_fallocate(f.fileno(), 0, os.fstat(f.fileno()).st_size)
    return arr


def _keep(ep: np.ndarray, wanted: np.ndarray | None) -> np.ndarray:
    return np.ones(len(ep), bool) if wanted is None else np.isin(ep, wanted)


def _rows_error(episode: int) -> DataError:
    return DataError(f"episode {episode} of the cache does not hold its steps 0..n-1 once "
                     "each (rows duplicated or missing: a damaged cache); rebuild it with "
                     "`robocache ingest SOURCE DEST --overwrite`.")


def _frames(dest: Path, i: int, camera: str, table, ids: np.ndarray
            ) -> tuple[np.ndarray, list | None]:
    """Write camera ``i``'s frame addresses and per-episode frame offsets for the served
    episodes ``ids``, and for a camera kept as video (:mod:`robocache.data.video_store`) each
    frame's ``pts``, ``dts`` and ``gop`` (its GOP's first frame, a served frame number) and
    each episode's ``config`` (int32 ``[E]``, an index into the returned list of ``[codec,
    extradata hex]``). Returns the offsets (int64 ``[E + 1]``) and that list (None: not
    video)."""
    counts = np.zeros(len(ids), np.int64)
    for batch in table.to_batches(columns=["episode_index"], batch_size=SCAN_ROWS):
        ep = batch.column(0).to_numpy()
        pos = np.searchsorted(ids, ep)
        hit = (pos < len(ids)) & (ids[np.minimum(pos, len(ids) - 1)] == ep) if len(ids) else \
            np.zeros(len(ep), bool)
        np.add.at(counts, pos[hit], 1)
    offsets = np.r_[0, np.cumsum(counts)].astype(np.int64)
    total = int(offsets[-1])
    addresses = _allocate(dest / f"frames-{i}-addresses.npy", np.int64, (total,))
    seen = np.zeros(total, np.uint8)
    is_video = "gop" in table.schema.names
    extra = ["pts", "dts", "gop", "codec", "extradata"] if is_video else []
    if is_video:
        video = {k: _allocate(dest / f"frames-{i}-{k}.npy", np.int64, (total,))
                 for k in ("pts", "dts", "gop")}
        config = np.full(len(ids), -1, np.int32)
        configs: dict[tuple[str, str], int] = {}
    scan = table.scanner(columns=["episode_index", "frame", *extra], with_row_address=True,
                         batch_size=SCAN_ROWS)
    for batch in scan.to_batches():
        ep = batch.column(0).to_numpy()
        pos = np.searchsorted(ids, ep)
        hit = (pos < len(ids)) & (ids[np.minimum(pos, len(ids) - 1)] == ep) if len(ids) else \
            np.zeros(len(ep), bool)
        if not hit.any():
            continue
        pos, frame = pos[hit], batch.column(1).to_numpy()[hit]
        n = counts[pos]
        if ((frame < 0) | (frame >= n)).any():
            bad = int(ids[pos[(frame < 0) | (frame >= n)][0]])
            raise DataError(f"camera {camera!r}: episode {bad}'s frames are not 0..n-1 once "
                            "each (a damaged cache); rebuild it with `robocache ingest SOURCE "
                            "DEST --overwrite`.")
        rows = offsets[pos] + frame
        seen[rows] = 1
        addresses[rows] = batch.column("_rowaddr").to_numpy()[hit].astype(np.int64)
        if is_video:
            for k in ("pts", "dts"):
                video[k][rows] = batch.column(k).to_numpy()[hit]
            video["gop"][rows] = offsets[pos] + batch.column("gop").to_numpy()[hit]
            # each episode's codec and configuration, on its first row
            codec = batch.column("codec").to_pylist()
            extradata = batch.column("extradata").to_pylist()
            for j, at in enumerate(np.flatnonzero(hit).tolist()):
                if codec[at] is not None:
                    key = (codec[at], (extradata[at] or b"").hex())
                    config[pos[j]] = configs.setdefault(key, len(configs))
    if not seen.all():  # as in the rows: a frame twice leaves a place unseen
        at_row = int(np.flatnonzero(seen == 0)[0])
        bad = int(ids[np.searchsorted(offsets, at_row, side="right") - 1])
        raise DataError(f"camera {camera!r}: episode {bad}'s frames are not 0..n-1 once each "
                        "(a damaged cache); rebuild it with `robocache ingest SOURCE DEST "
                        "--overwrite`.")
    addresses.flush()
    np.save(dest / f"frames-{i}-offsets.npy", offsets)
    if not is_video:
        return offsets, None
    if (config < 0).any():
        bad = int(ids[np.flatnonzero(config < 0)[0]])
        raise DataError(f"camera {camera!r}: episode {bad}'s video packets come without their "
                        "codec (a damaged cache); rebuild it with `robocache ingest SOURCE "
                        "DEST --overwrite`.")
    for arr in video.values():
        arr.flush()
    np.save(dest / f"frames-{i}-config.npy", config)
    return offsets, [list(k) for k in configs]


def _words(values: np.ndarray) -> np.ndarray:
    """``[n, ...]`` values of any dtype as int32 words ``[n, ceil(bytes / 4)]``."""
    raw = np.ascontiguousarray(values).reshape(len(values), -1).view(np.uint8)
    extra = -raw.shape[1] % 4
    if extra:
        raw = np.concatenate([raw, np.zeros((len(raw), extra), np.uint8)], 1)
    return np.ascontiguousarray(raw).view(np.int32)

