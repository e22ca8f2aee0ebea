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
  all-zero frame for the sources that lack the camera.
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
    def cat(parts: list[EncodedFrames], blank: bool = False) -> EncodedFrames:
        """Frames of several caches one after the other (plus one all-zero frame at the end
        when ``blank``, for rows whose source lacks the camera).

        Raises:
            DataError: the parts differ in frame shape, dtype or codec.
        """
        first = check_alike(parts)
        datas = [p.data for p in parts]
        if blank:
            datas.append(_blank(first))
        sizes = torch.tensor([0] + [d.numel() for d in datas]).cumsum(0)
        offsets = [p.offsets[:-1] - p.offsets[0] + sizes[i] for i, p in enumerate(parts)]
        if blank:
            offsets.append(sizes[-2:-1])
        counts = np.cumsum([0] + [len(p) for p in parts])
        wheres = [p.where for p in parts]

        def where(i: int) -> str:
            part = int(np.searchsorted(counts, i, side="right")) - 1
            if part >= len(parts):
                return "the blank frame"
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


def check_alike(parts: list) -> Any:
    """The first of ``parts`` (frame stores), once they agree in frame shape, dtype, codec.

    Raises:
        DataError: they differ.
    """
    first = parts[0]
    if any((p.frame_shape, p.dtype, p.codec) != (first.frame_shape, first.dtype, first.codec)
           for p in parts):
        raise DataError("camera frames differ in shape, dtype or codec between caches "
                        f"({sorted({(p.frame_shape, p.dtype, p.codec) for p in parts})}); "
                        "ingest them with the same --camera-codec and frame size.")
    return first


def _blank(like) -> torch.Tensor:
    """One all-zero frame of ``like``'s shape, dtype and codec, encoded."""
    from robocache.data.cameras import DEFAULT_QUALITY, encode

    zero = np.zeros(like.frame_shape, np.dtype(like.dtype))
    return torch.frombuffer(bytearray(encode(zero, like.codec, DEFAULT_QUALITY)),
                            dtype=torch.uint8)


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

    Raises:
        DataError: the parts differ in frame shape, dtype or codec.
    """

    def __init__(self, parts: list):
        first = check_alike(parts)
        self.parts = parts
        self.frame_shape, self.dtype, self.codec = first.frame_shape, first.dtype, first.codec
        self.base = np.cumsum([0] + [len(p) for p in parts])
        zero = _blank(first)
        self.blank = EncodedFrames(zero, torch.tensor([0, zero.numel()]), self.frame_shape,
                                   self.dtype, self.codec, lambda i: "the blank frame")

    def __len__(self) -> int:
        return int(self.base[-1]) + 1

    def read(self, rows: torch.Tensor) -> tuple[EncodedFrames, torch.Tensor]:
        """Each part's frames of ``rows`` read by that part, stacked (see
        :meth:`LanceFrames.read`)."""
        host = rows.reshape(-1).cpu()
        distinct, inverse = torch.unique(host, return_inverse=True)
        part = np.searchsorted(self.base, distinct.numpy(), side="right") - 1
        encs = [self.blank if p == len(self.parts) else
                self.parts[p].take(distinct[torch.from_numpy(part == p)] - int(self.base[p]))
                for p in np.unique(part).tolist()]
        out = EncodedFrames.cat(encs) if encs else self.blank
        return out, inverse.reshape(rows.shape).to(rows.device)


def stack(parts: list) -> EncodedFrames | StackedFrames:
    """Frame stores one after the other plus a blank frame: in one buffer when they are all
    in memory (:meth:`EncodedFrames.cat`), else read part by part (:class:`StackedFrames`)."""
    if any(p.codec == "video" for p in parts):
        raise DataError("cameras kept as video (--camera-codec video) cannot be mixed with "
                        "other caches yet; ingest the caches of a mixture with --camera-codec "
                        "jpeg or png.")
    if all(isinstance(p, EncodedFrames) for p in parts):
        return EncodedFrames.cat(parts, blank=True)
    return StackedFrames(parts)
