"""The sample table of an MP4 file's video track, read from its boxes without demuxing.

Keeping a video camera's packets (:func:`robocache.data.video_store.packet_table`) needs each
packet's bytes, times and keyframe flag. PyAV's demuxer hands them one Python object per
packet, which held the kept-video ingest of 4 H.264 cameras to 12-26 MB/s on an H200 host
(``benchmarks/results/video-nvdec-h200-2026-12-02.json``, ``ingest-video``) where the same
files read at about 900 MB/s; read from the tables below, 792 MB/s
(``ingest-kept-video-h200-2026-12-02.json``, with the build's workers running). An MP4 (ISO
BMFF) file already holds them as tables: ``stsz`` (sizes), ``stsc`` + ``stco``/``co64``
(where each sample lies), ``stts`` (decode times), ``ctts`` (display offsets), ``stss``
(keyframes) and ``elst`` (the edit list FFmpeg shifts the times by). :func:`video_track`
reads those tables with NumPy, so
an episode's packets become one file read and a few array operations.

Only what FFmpeg's own demuxer gives the same answer for is read here: an unfragmented file
whose first video track has at most one edit at normal rate. Anything else (fragmented MP4,
several edits, Matroska...) returns ``None`` and the caller demuxes with PyAV. The caller also
checks the first packets against PyAV's (:func:`robocache.data.video_store.packet_table`), so a
file this reader misreads falls back instead of being stored wrong.
"""

from __future__ import annotations

import functools
import os
import struct
from dataclasses import dataclass

import numpy as np

# containers of the boxes read here (everything else is skipped by its size)
_CONTAINERS = {b"moov", b"trak", b"mdia", b"minf", b"stbl", b"edts"}


@dataclass(frozen=True)
class Track:
    """One video track's samples in decode order (the file's order of ``stsz``).

    Attributes:
        timescale: ticks a second of ``pts`` and ``dts`` (the track's ``mdhd``).
        dts, pts: int64 ``[N]``, decode and display times as FFmpeg's demuxer reports them
            (the edit list's shift applied).
        key: bool ``[N]``, keyframes (``stss``; every sample when the box is absent).
        offset, size: int64 ``[N]``, each sample's byte range in the file.
        keyframes: int64, the indices of the keyframes.
        seek_target: int64 ``[N]``, where FFmpeg's seek looks for a sample: a requested
            time ``t`` (ticks, as a display time) lands on the last keyframe whose
            ``seek_target`` is at most ``t`` (its index's decode times before the edit list,
            against ``t`` less the smallest display time).
    """

    timescale: int
    dts: np.ndarray
    pts: np.ndarray
    key: np.ndarray
    offset: np.ndarray
    size: np.ndarray
    keyframes: np.ndarray
    seek_target: np.ndarray

    def read(self, path, index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The bytes of samples ``index`` (int ``[K]``) read from ``path``: one buffer (uint8)
        and ``[K + 1]`` offsets into it, in ``index``' order. One read of the byte range the
        samples span (the samples of one track lie together in files that hold one track)."""
        off, size = self.offset[index], self.size[index]
        starts = np.r_[0, np.cumsum(size)]
        if not len(index):
            return np.zeros(0, np.uint8), starts
        lo, hi = int(off.min()), int((off + size).max())
        with open(path, "rb") as f:
            f.seek(lo)
            span = np.frombuffer(f.read(hi - lo), np.uint8)
        if len(span) < hi - lo:
            raise OSError(f"{path}: truncated (samples end at byte {hi}, the file at "
                          f"{lo + len(span)})")
        rel = off - lo
        if np.array_equal(rel, starts[:-1]):  # already back to back in this order
            return span, starts
        # gather: byte j of the output is byte rel[s] + (j - starts[s]) of the span
        at = np.repeat(rel - starts[:-1], size) + np.arange(int(starts[-1]))
        return span[at], starts


def _boxes(buf: bytes, start: int, end: int):
    """``(type, payload start, payload end)`` of the boxes in ``buf[start:end]``."""
    at = start
    while at + 8 <= end:
        size, kind = struct.unpack_from(">I4s", buf, at)
        head = 8
        if size == 1:
            size, head = struct.unpack_from(">Q", buf, at + 8)[0], 16
        elif size == 0:
            size = end - at
        if size < head or at + size > end:
            raise ValueError(f"box {kind!r} at {at} overruns its parent")
        yield kind, at + head, at + size
        at += size


def _find(buf: bytes, start: int, end: int, path: list[bytes]) -> list[tuple[int, int]]:
    """Payload ranges of the boxes at ``path`` (box types, outermost first) below
    ``buf[start:end]``."""
    found = []
    for kind, a, b in _boxes(buf, start, end):
        if kind == path[0]:
            found += [(a, b)] if len(path) == 1 else _find(buf, a, b, path[1:])
    return found


def _table(buf: bytes, a: int, fields: int, wide: bool = False) -> np.ndarray:
    """A full box's entry table (version/flags, a count, then ``fields`` big-endian numbers an
    entry: 32-bit, or 64-bit with ``wide``) as int64 ``[count, fields]``."""
    (count,) = struct.unpack_from(">I", buf, a + 4)
    kind = ">u8" if wide else ">u4"
    return np.frombuffer(buf, kind, count * fields, a + 8).astype(np.int64).reshape(
        count, fields)


def _moov(path) -> bytes | None:
    """The ``moov`` box's payload of ``path``, or ``None`` when the file has none or is
    fragmented (``moof`` boxes: samples described outside ``moov``)."""
    moov, fragmented = None, False
    with open(path, "rb") as f:
        total = os.fstat(f.fileno()).st_size
        at = 0
        while at + 8 <= total:
            f.seek(at)
            head = f.read(16)
            if len(head) < 8:
                break
            size, kind = struct.unpack_from(">I4s", head)
            skip = 8
            if size == 1 and len(head) == 16:
                size, skip = struct.unpack_from(">Q", head, 8)[0], 16
            elif size == 0:
                size = total - at
            if size < skip:
                return None
            if kind == b"moov":
                f.seek(at + skip)
                moov = f.read(size - skip)
            elif kind == b"moof":
                fragmented = True
            at += size
    return None if fragmented or moov is None else moov


def _track(moov: bytes) -> Track | None:
    """The first video track of ``moov``, or ``None`` where this reader does not give what
    FFmpeg does (see the module docstring)."""
    for a, b in _find(moov, 0, len(moov), [b"trak"]):
        hdlr = _find(moov, a, b, [b"mdia", b"hdlr"])
        if not hdlr or moov[hdlr[0][0] + 8:hdlr[0][0] + 12] != b"vide":
            continue
        if _find(moov, 0, len(moov), [b"mvex"]):
            return None
        (mdhd,) = _find(moov, a, b, [b"mdia", b"mdhd"])
        version = moov[mdhd[0]]
        timescale = struct.unpack_from(">I", moov, mdhd[0] + (20 if version == 1 else 12))[0]
        stbl = _find(moov, a, b, [b"mdia", b"minf", b"stbl"])
        if not stbl or not timescale:
            return None
        s, e = stbl[0]
        box = {kind: (x, y) for kind, x, y in _boxes(moov, s, e)}
        if b"stsz" not in box or b"stts" not in box or b"stsc" not in box or not (
                b"stco" in box or b"co64" in box):
            return None  # compact sizes (stz2) and the like: PyAV's demuxer reads them
        x = box[b"stsz"][0]
        fixed, count = struct.unpack_from(">II", moov, x + 4)
        size = np.full(count, fixed, np.int64) if fixed else \
            np.frombuffer(moov, ">u4", count, x + 12).astype(np.int64)
        stts = _table(moov, box[b"stts"][0], 2)
        dts = np.r_[0, np.cumsum(np.repeat(stts[:, 1], stts[:, 0]))][:count]
        shift = np.zeros(count, np.int64)
        if b"ctts" in box:  # FFmpeg reads the offsets as signed whatever the box's version
            ctts = _table(moov, box[b"ctts"][0], 2)
            shift = np.repeat(ctts[:, 1].astype(np.uint32).view(np.int32).astype(np.int64),
                              ctts[:, 0])[:count]
            if (shift < 0).any():  # FFmpeg shifts decode times then (dts_shift)
                return None
        if len(dts) != count or len(shift) != count:
            return None
        key = np.ones(count, bool)
        if b"stss" in box:
            key[:] = False
            key[_table(moov, box[b"stss"][0], 1)[:, 0] - 1] = True
        wide = b"co64" in box
        chunks = _table(moov, box[b"co64" if wide else b"stco"][0], 1, wide)[:, 0]
        stsc = _table(moov, box[b"stsc"][0], 3)
        first = stsc[:, 0] - 1  # each run's first chunk (0-based) and samples a chunk
        per_chunk = np.repeat(stsc[:, 1], np.diff(np.r_[first, len(chunks)]))
        if per_chunk.sum() < count:
            return None
        chunk = np.repeat(np.arange(len(chunks)), per_chunk)[:count]
        ends = np.cumsum(size)
        within = ends - size - np.r_[0, ends][np.r_[0, np.cumsum(per_chunk)][chunk]]
        offset = chunks[chunk] + within
        start = 0
        elst = _find(moov, a, b, [b"edts", b"elst"])
        if elst:
            v = moov[elst[0][0]]
            (n,) = struct.unpack_from(">I", moov, elst[0][0] + 4)
            if n > 1:
                return None
            if n == 1:
                fmt = ">Qqhh" if v == 1 else ">Iihh"
                _, start, rate, frac = struct.unpack_from(fmt, moov, elst[0][0] + 8)
                if start < 0 or rate != 1 or frac != 0:
                    return None
        pts = dts + shift - start
        return Track(timescale, dts - start, pts, key, offset, size, np.flatnonzero(key),
                     dts + int(pts.min()) if count else dts)
    return None


@functools.lru_cache(maxsize=64)
def _cached(path: str, size: int, mtime_ns: int) -> Track | None:
    try:
        moov = _moov(path)
        return None if moov is None else _track(moov)
    except (ValueError, struct.error, IndexError):
        return None


def video_track(path) -> Track | None:
    """The first video track's samples of the MP4 file ``path``, or ``None`` where the file is
    not one this reader handles (see the module docstring). Read once a file per process
    (keyed by its path, size and modification time)."""
    path = os.fspath(path)
    try:
        st = os.stat(path)
    except OSError:
        return None
    return _cached(path, st.st_size, st.st_mtime_ns)
