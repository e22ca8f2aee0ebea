"""Where a camera's encoded frames are served from: memory, or the cache's Lance table by row.

Every store has the same interface: ``len(store)`` frames numbered ``0..F-1`` (the served
episodes' frames in (episode, frame) order), their decoded ``frame_shape``, ``dtype`` and
``codec``, and :meth:`read`, which returns the frames a batch asks for as an
:class:`EncodedFrames` in memory plus the batch's rows renumbered into it. The decoders
(:func:`robocache.data.cameras.decode_all`) take that pair.

- :class:`EncodedFrames`: frames in one packed buffer (what a read returns; a small cache may be
  served from memory whole, ``RobotDataset(..., in_memory=True)``).
- :class:`LanceFrames`: the frames stay in ``frames/<camera>.lance`` (local or in an object
  store); a read takes the distinct rows a batch needs from the table version the dataset
  opened (Lance's random access: only those frames' bytes are read).
- :class:`StackedFrames`: several caches' stores one after the other (a mixture), plus one
  all-zero frame for the sources that lack the camera; the caches may keep the camera in
  different codecs (video, JPEG, PNG). A read returns a :class:`StackedRead`: each part's own
  read (JPEG/PNG frames, a video's GOP packets), which the decoders decode each as its own
  store would be, and the blank frame as zeros.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from robocache._optional import require
from robocache.data.location import LANCE, open_version
from robocache.data.reader import READER
from robocache.errors import DataError


class FrameStore:
    """What every store shares: ``len(store)`` frames of ``frame_shape``."""

    frame_shape: tuple[int, ...]

    @property
    def shape(self) -> tuple[int, ...]:
        """``(frames, *frame_shape)``, as the decoded frames would be."""
        return (len(self), *self.frame_shape)

    @property
    def channels(self) -> int:
        return self.frame_shape[2] if len(self.frame_shape) == 3 else 1


@dataclass
class EncodedFrames(FrameStore):
    """One camera's encoded frames, packed: ``data`` uint8 ``[bytes]`` and ``offsets`` int64
    ``[F + 1]`` (frame i is ``data[offsets[i]:offsets[i+1]]``), in (episode, frame) order;
    ``frame_shape`` is a decoded frame's (``[H, W, C]`` or ``[H, W]``); ``where(i)``, when
    given, names frame ``i`` in messages (its camera, episode and step)."""

    data: torch.Tensor
    offsets: torch.Tensor
    frame_shape: tuple[int, ...]
    dtype: str
    codec: str = "jpeg"
    where: Callable[[int], str] | None = None

    def describe(self, i: int) -> str:
        """Frame ``i`` for a message."""
        return self.where(i) if self.where is not None else f"frame {i}"

    @staticmethod
    def cat(parts: list[EncodedFrames]) -> EncodedFrames:
        """Frames of several stores one after the other, in one buffer.

        Raises:
            DataError: the parts differ in frame shape, dtype or codec.
        """
        first = check_alike(parts, codec=True)
        datas = [p.data for p in parts]
        sizes = torch.tensor([0] + [d.numel() for d in datas]).cumsum(0)
        offsets = [p.offsets[:-1] - p.offsets[0] + sizes[i] for i, p in enumerate(parts)]
        counts = np.cumsum([0] + [len(p) for p in parts])
        wheres = [p.where for p in parts]

        def where(i: int) -> str:
            part = int(np.searchsorted(counts, i, side="right")) - 1
            w = wheres[part]
            return w(i - int(counts[part])) if w is not None else f"frame {i}"

        return EncodedFrames(torch.cat(datas), torch.cat([*offsets, sizes[-1:]]),
                             first.frame_shape, first.dtype, first.codec,
                             where if any(w is not None for w in wheres) else None)

    @classmethod
    def from_table(cls, table, shape, dtype: str, codec: str,
                   where: Callable[[int], str] | None = None) -> EncodedFrames:
        """The frames of an Arrow table's ``encoded`` column, in its row order."""
        pa = require("pyarrow", "data", "Arrow tables")

        col = table.column("encoded").combine_chunks().cast(pa.large_binary())
        offsets = np.frombuffer(col.buffers()[1], np.int64)[col.offset:col.offset + len(col) + 1]
        values = col.buffers()[2]
        data = torch.frombuffer(values, dtype=torch.uint8) if values is not None and \
            values.size else torch.zeros(0, dtype=torch.uint8)
        return cls(data, torch.from_numpy(offsets.copy()), tuple(shape), dtype, codec, where)

    def __len__(self) -> int:
        return int(self.offsets.shape[0]) - 1

    @property
    def nbytes(self) -> int:
        return int(self.offsets[-1] - self.offsets[0])

    def slices(self, rows: torch.Tensor) -> list[torch.Tensor]:
        """Frame ``i``'s bytes for each ``i`` of ``rows`` (int ``[F]``), as views of ``data``."""
        rows = rows.cpu()
        off, end = self.offsets[rows].tolist(), self.offsets[rows + 1].tolist()
        return [self.data[a:b] for a, b in zip(off, end, strict=True)]

    def read(self, rows: torch.Tensor) -> tuple[EncodedFrames, torch.Tensor]:
        """The frames ``rows`` (int ``[...]``) need: already in memory, ``(self, rows)``."""
        return self, rows

    def take(self, rows: torch.Tensor) -> EncodedFrames:
        """Frames ``rows`` (int ``[N]``) packed on their own, in that order."""
        parts = self.slices(rows)
        sizes = torch.tensor([0] + [p.numel() for p in parts]).cumsum(0)
        data = torch.cat(parts) if parts else torch.zeros(0, dtype=torch.uint8)
        base = rows.tolist()
        return EncodedFrames(data, sizes, self.frame_shape, self.dtype, self.codec,
                             lambda i: self.describe(base[i]))


def check_alike(parts: list, codec: bool = False) -> Any:
    """The first of ``parts`` (frame stores), once they agree in frame shape and dtype (and
    codec, with ``codec``: frames packed in one buffer decode with one decoder).

    Raises:
        DataError: they differ.
    """
    first = parts[0]
    key = (lambda p: (p.frame_shape, p.dtype, p.codec)) if codec else \
        (lambda p: (p.frame_shape, p.dtype))
    if any(key(p) != key(first) for p in parts):
        what = "shape, dtype or codec" if codec else "shape or dtype"
        raise DataError(f"camera frames differ in {what} between caches "
                        f"({sorted({key(p) for p in parts}, key=str)}); serve a camera role "
                        "from caches ingested at one frame size (--camera-size) and dtype.")
    return first


class LanceFrames(FrameStore):
    """One camera's frames in the cache's ``frames/<camera>.lance``, read as batches ask.

    Args:
        location: the cache (:class:`robocache.data.location.Location`).
        camera: the camera stream's name (in messages).
        version: the table version the dataset opened (served even after the cache is
            extended or compacted; if that version's manifest is gone, the latest is opened
            and the same row addresses read, which exist as long as the rows do).
        served: the served index (:class:`robocache.data.served.Served`) holding the file
            ``addresses``: int64 ``[F]``, frame ``i``'s Lance row address (fragment << 32 |
            row), mapped.
        frame_offsets: int64 ``[E + 1]``, where each served episode's frames start.
        episode_ids: int64 ``[E]``, the served episodes' indices (for messages).
        frame_shape, dtype, codec: as :class:`EncodedFrames`.

    A process opens the table on its first read (after a fork or an unpickling too: Lance's
    handles do not cross processes); pickling carries the served index's folder, and the
    addresses are mapped again where unpickled.
    """

    def __init__(self, location, camera: str, version: int, served, addresses: str,
                 frame_offsets: np.ndarray, episode_ids: np.ndarray,
                 frame_shape: tuple[int, ...], dtype: str, codec: str):
        self.location, self.camera, self.version = location, camera, version
        self.served, self.addresses_file = served, addresses
        self.addresses = served.array(addresses)
        self.frame_offsets, self.episode_ids = frame_offsets, episode_ids
        self.frame_shape, self.dtype, self.codec = tuple(frame_shape), dtype, codec
        self._table: Any = None
        self._pid = -1

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_table": None, "_pid": -1, "addresses": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.addresses = self.served.array(self.addresses_file)

    def __len__(self) -> int:
        return int(self.addresses.shape[0])

    @property
    def rel(self) -> str:
        return f"frames/{self.camera}.lance"

    def describe(self, i: int) -> str:
        """Frame ``i`` as ``camera C, episode E, frame F``."""
        e = int(np.searchsorted(self.frame_offsets, i, side="right")) - 1
        if not 0 <= e < len(self.episode_ids):
            return f"camera {self.camera!r}, frame row {i}"
        return (f"camera {self.camera!r}, episode {int(self.episode_ids[e])}, frame "
                f"{i - int(self.frame_offsets[e])}")

    def table(self):
        """This process's handle of the table at the opened version (threads that race here
        each open one and keep the last: no lock, which a fork could leave held)."""
        if self._pid != os.getpid():
            self._table = open_version(self.location, self.rel, self.version)
            self._pid = os.getpid()
        return self._table

    def read(self, rows: torch.Tensor) -> tuple[EncodedFrames, torch.Tensor]:
        """The distinct frames of ``rows`` (int ``[...]``) read from the table, and ``rows``
        renumbered into them (on ``rows``' device).

        Raises:
            DataError: the table cannot be read (naming the camera, the first frames asked
                for and the store's cause), e.g. the rows' data files are gone (the cache was
                compacted or rebuilt after this dataset opened it: open it again).
        """
        host = rows.reshape(-1).cpu()
        distinct, inverse = torch.unique(host, return_inverse=True)
        enc = self.take(distinct)
        return enc, inverse.reshape(rows.shape).to(rows.device)

    def take(self, frames: torch.Tensor) -> EncodedFrames:
        """Frames ``frames`` (int ``[N]``, on the host) as an :class:`EncodedFrames`, in that
        order."""
        pa = require("pyarrow", "data", "Arrow tables")

        if frames.numel() and (int(frames.min()) < 0 or int(frames.max()) >= len(self)):
            raise DataError(f"camera {self.camera!r}: frame rows outside [0, {len(self)}) "
                            "asked for.")
        base = frames.numpy()
        addresses = self.addresses[base]

        def where(i: int) -> str:
            return self.describe(int(base[i]))

        if not len(addresses):
            return EncodedFrames(torch.zeros(0, dtype=torch.uint8),
                                 torch.zeros(1, dtype=torch.int64), self.frame_shape,
                                 self.dtype, self.codec, where)
        try:
            if LANCE.forked_after_use:  # Lance's runtime did not survive the fork
                offsets, values = READER.take(self.location, self.rel, self.version, addresses)
                return EncodedFrames(torch.frombuffer(bytearray(values), dtype=torch.uint8)
                                     if values else torch.zeros(0, dtype=torch.uint8),
                                     torch.from_numpy(offsets.copy()), self.frame_shape,
                                     self.dtype, self.codec, where)
            table = self.table()
            with LANCE.call():
                table = table._take_rows(pa.array(addresses, pa.uint64()), columns=["encoded"],
                                         ignore_deletions=True)
        except (OSError, ValueError, RuntimeError) as e:
            first = ", ".join(self.describe(int(i)) for i in base[:2])
            if "not found" in str(e).lower() and not self.location.remote:
                raise DataError(f"{self.location.child(self.rel)}: frames ({first}, ...) are "
                                "no longer in the table's files (the cache was compacted or "
                                "rebuilt after this dataset opened it); open it again.") from e
            raise DataError(f"{self.location.error(e, self.rel)} Reading {first}, ...") from e
        if table.num_rows != len(addresses):
            raise DataError(f"{self.location.child(self.rel)}: {len(addresses) - table.num_rows}"
                            f" of the frames asked for are missing ({self.describe(int(base[0]))}"
                            ", ...); the cache changed after this dataset opened it: open it "
                            "again.")
        return EncodedFrames.from_table(table, self.frame_shape, self.dtype, self.codec, where)

    def slices(self, rows: torch.Tensor) -> list[torch.Tensor]:
        """Frame ``i``'s bytes for each ``i`` of ``rows`` (int ``[F]``), read from the table."""
        return self.take(rows.reshape(-1).cpu()).slices(torch.arange(rows.numel()))

    def load(self, chunk: int = 4096) -> EncodedFrames:
        """Every frame read into memory (for ``in_memory=True``), ``chunk`` frames a read."""
        parts = [self.take(torch.arange(a, min(a + chunk, len(self))))
                 for a in range(0, len(self), chunk)]
        if not parts:
            return self.take(torch.zeros(0, dtype=torch.int64))
        out = EncodedFrames.cat(parts)
        out.where = self.describe
        return out


class VideoFrames(LanceFrames):
    """A camera kept as video (:mod:`robocache.data.video_store`): the same table of one row
    per frame, each row a packet; a read takes the packets of every GOP the batch's frames
    are in (each GOP once) and returns them as a
    :class:`~robocache.data.video_store.VideoPackets`, which the decoders decode GOP by GOP.

    Args (beyond :class:`LanceFrames`'): ``configs``, the served index's list of ``[codec,
    extradata hex]``; the served index's ``pts``, ``dts``, ``gop`` and ``config`` files of the
    camera are mapped. In memory (``in_memory=True``) the store stays as it is: its packets
    are read per batch (through the OS page cache), since decoding needs whole GOPs.
    """

    VIDEO = ("pts", "dts", "gop", "config")

    def __init__(self, *args, configs: list, **kw):
        super().__init__(*args, **kw)
        self.configs = [(codec, bytes.fromhex(extra)) for codec, extra in configs]
        self._map_video()

    def _map_video(self) -> None:
        self.video = {k: self.served.array(self.served.camera_file(self.camera, k))
                      for k in self.VIDEO}

    def __getstate__(self) -> dict[str, Any]:
        return {**super().__getstate__(), "video": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self._map_video()

    def read(self, rows: torch.Tensor):
        """The packets of the GOPs holding the distinct frames of ``rows`` (int ``[...]``),
        and ``rows`` renumbered into those frames (on ``rows``' device)."""
        from robocache.data.video_store import VideoPackets

        host = rows.reshape(-1).cpu()
        distinct, inverse = torch.unique(host, return_inverse=True)
        d = distinct.numpy()
        if d.size and (int(d.min()) < 0 or int(d.max()) >= len(self)):
            raise DataError(f"camera {self.camera!r}: frame rows outside [0, {len(self)}) "
                            "asked for.")
        gop = self.video["gop"]
        starts = np.unique(gop[d])
        ends = np.searchsorted(gop, starts, side="right")
        spans = np.concatenate([np.arange(a, b) for a, b in zip(starts, ends, strict=True)]) \
            if len(starts) else np.zeros(0, np.int64)
        enc = self.take(torch.from_numpy(spans))
        episode = np.searchsorted(self.frame_offsets, starts, side="right") - 1
        config = self.video["config"]
        packets = VideoPackets(
            enc.data, enc.offsets.numpy(), np.asarray(self.video["pts"][spans]),
            np.asarray(self.video["dts"][spans]), np.r_[0, np.cumsum(ends - starts)],
            [self.configs[int(config[e])] for e in episode], np.searchsorted(spans, d),
            self.frame_shape, self.dtype, where=lambda i: self.describe(int(d[i])))
        return packets, inverse.reshape(rows.shape).to(rows.device)

    def load(self, chunk: int = 4096) -> VideoFrames:
        """Itself: packets are read per batch (see the class docstring)."""
        return self


class StackedFrames(FrameStore):
    """Several frame stores one after the other, plus one all-zero frame at the end (for
    rows whose source lacks the camera): frame ``i`` of part ``p`` is row ``base[p] + i``.
    The parts may differ in codec (a cache keeping the camera as video beside one keeping
    it as JPEG or PNG, videos of different codecs): :meth:`read` lets each part read its
    own frames.

    Raises:
        DataError: the parts differ in frame shape or dtype.
    """

    def __init__(self, parts: list):
        first = check_alike(parts)
        self.parts = parts
        self.frame_shape, self.dtype = first.frame_shape, first.dtype
        codecs = {p.codec for p in parts}
        self.codec = first.codec if len(codecs) == 1 else "mixed"
        self.base = np.cumsum([0] + [len(p) for p in parts])

    def __len__(self) -> int:
        return int(self.base[-1]) + 1

    def read(self, rows: torch.Tensor) -> tuple[StackedRead, torch.Tensor]:
        """Each part's distinct frames of ``rows`` (int ``[...]``) read by that part (its
        :meth:`LanceFrames.read`: the frames, or a video's GOPs, only those), and ``rows``
        renumbered into them (on ``rows``' device): the parts' frames in order, then the
        blank frame.

        Raises:
            DataError: a row outside ``[0, len(self))``, or a part's read fails.
        """
        host = rows.reshape(-1).cpu()
        distinct, inverse = torch.unique(host, return_inverse=True)
        if distinct.numel() and (int(distinct[0]) < 0 or int(distinct[-1]) >= len(self)):
            raise DataError(f"frame rows outside [0, {len(self)}) asked for.")
        part = np.searchsorted(self.base, distinct.numpy(), side="right") - 1
        pieces = [self.parts[p].read(distinct[torch.from_numpy(part == p)] - int(self.base[p]))
                  for p in np.unique(part[part < len(self.parts)]).tolist()]
        blank = bool(len(part)) and int(part[-1]) == len(self.parts)
        out = StackedRead(pieces, blank, self.frame_shape, self.dtype)
        return out, inverse.reshape(rows.shape).to(rows.device)


class StackedRead(FrameStore):
    """What :meth:`StackedFrames.read` returns: ``pieces``, each part's read ``(frames,
    rows)`` (an :class:`EncodedFrames` or a
    :class:`~robocache.data.video_store.VideoPackets`, and the indices into it of the part's
    frames), one after the other, then the blank frame when ``blank``: frame ``i`` is
    piece ``p``'s ``i - start[p]``-th, the last (with ``blank``) all zeros. The decoders
    (:func:`robocache.data.cameras.decode_all`) decode each piece as its store's reads are
    decoded (a video's GOPs with the other cameras' GOPs, JPEGs in the nvJPEG batch) and the
    blank frame as zeros, never through a decoder."""

    codec = "stacked"

    def __init__(self, pieces: list, blank: bool, frame_shape: tuple[int, ...], dtype: str):
        self.pieces, self.blank = pieces, blank
        self.frame_shape, self.dtype = tuple(frame_shape), dtype
        self.start = np.cumsum([0] + [int(r.numel()) for _, r in pieces])

    def __len__(self) -> int:
        return int(self.start[-1]) + int(self.blank)

    def read(self, rows: torch.Tensor) -> tuple[StackedRead, torch.Tensor]:
        """Already read: ``(self, rows)`` (a batch read ahead)."""
        return self, rows

    def split(self, rows: torch.Tensor) -> tuple[list[tuple[Any, torch.Tensor]], int]:
        """The frames ``rows`` (int ``[N]``, sorted ascending) as each piece's ``(frames,
        rows into it)`` (those with a frame among ``rows``, in order) and the number of
        ``rows`` at the blank frame (the last ones): decoded and concatenated in that order,
        they are the frames of ``rows``."""
        rows = rows.cpu().to(torch.int64)
        at = torch.searchsorted(rows, torch.from_numpy(self.start))
        out = []
        for p, (frames, mine) in enumerate(self.pieces):
            a, b = int(at[p]), int(at[p + 1])
            if b > a:
                out.append((frames, mine[rows[a:b] - int(self.start[p])]))
        return out, rows.numel() - int(at[-1])


def stack(parts: list) -> StackedFrames:
    """Frame stores of several caches one after the other plus a blank frame (see
    :class:`StackedFrames`)."""
    return StackedFrames(parts)
