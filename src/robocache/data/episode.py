"""The in-memory model every reader produces: episodes of named streams.

A stream has its own timestamps (float64 seconds, explicit in the source or derived from its
fps), dtype and per-sample shape. Readers return :class:`Episode` objects one at a time so a
malformed episode can be quarantined while the rest of a dataset proceeds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

import numpy as np

from robocache.errors import DataError

StreamKind = Literal["numeric", "image", "video", "event"]


@dataclass(frozen=True)
class StreamSpec:
    """What a source declares for one stream (before any episode is read).

    Attributes:
        name: stream name as in the source (e.g. ``"observation.state"``).
        kind: ``"numeric"`` (vectors), ``"image"`` (frames stored inline), ``"video"`` (frames in
            a video file, referenced by timestamp) or ``"event"`` (sparse strings).
        dtype: NumPy dtype name of one sample (``"float32"``, ``"uint8"``, ``"str"``).
        shape: shape of one sample, e.g. ``(7,)`` or ``(3, 16, 16)``.
        rate_hz: nominal sampling rate in Hz, ``None`` for irregular/sparse streams.
        encoding: image streams whose frames stay compressed: ``"jpeg"`` or ``"png"``; the
            stream's data is then an object array of ``bytes`` ``[S]`` (``shape`` is the
            decoded frame's).
        quaternion: a numeric ``[4]`` stream of unit quaternions ``wxyz`` (a ROS message's
            orientation): aligned by ``slerp`` unless another method is asked for, so that
            a resampled rotation stays a unit quaternion.
    """

    name: str
    kind: StreamKind
    dtype: str
    shape: tuple[int, ...]
    rate_hz: float | None = None
    encoding: str | None = None
    quaternion: bool = False

    @property
    def dim(self) -> int:
        """Flattened size of one sample."""
        return math.prod(self.shape)


@dataclass(frozen=True)
class VideoRef:
    """Frames of a video stream: the file and the offset of this episode inside it (seconds)."""

    path: Path
    from_timestamp: float = 0.0


@dataclass
class Stream:
    """One stream of one episode.

    Attributes:
        spec: the declared spec.
        times: float64 ``[S]`` seconds, non-decreasing.
        data: ``[S, *spec.shape]`` array (object array of ``str`` for events); ``None`` for video
            streams, whose frames stay in ``video`` until decoded.
        video: where the frames of a video stream are.
    """

    spec: StreamSpec
    times: np.ndarray
    data: np.ndarray | None
    video: VideoRef | None = None

    def __len__(self) -> int:
        return int(self.times.shape[0])


@dataclass
class Episode:
    """An episode: streams keyed by name, plus metadata (task strings, source length)."""

    index: int
    streams: dict[str, Stream]
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def start(self) -> float:
        return min(float(s.times[0]) for s in self.streams.values() if len(s))

    @property
    def end(self) -> float:
        return max(float(s.times[-1]) for s in self.streams.values() if len(s))


class Source(Protocol):
    """A dataset on disk, opened by a reader in :mod:`robocache.data.formats`."""

    format: str
    path: Path
    specs: dict[str, StreamSpec]

    def episode_indices(self) -> list[int]: ...

    def read(self, index: int) -> Episode:
        """Read one episode; raises :class:`~robocache.errors.DataError` (or an I/O error) when
        it cannot."""
        ...


def check_episode(episode: Episode, specs: dict[str, StreamSpec]) -> None:
    """Validate an episode against the declared specs.

    Raises:
        DataError: a declared stream is missing or empty, a stream's timestamps are NaN/infinite
            or decrease, or its data has the wrong number of samples or sample shape. The message
            is the quarantine reason.
    """
    for name, spec in specs.items():
        stream = episode.streams.get(name)
        if stream is None:
            raise DataError(f"episode {episode.index}: stream {name!r} is missing.")
        t = stream.times
        if spec.kind != "event" and len(t) == 0:
            raise DataError(f"episode {episode.index}: stream {name!r} has no samples.")
        if not np.all(np.isfinite(t)):
            bad = int(np.flatnonzero(~np.isfinite(t))[0])
            raise DataError(f"episode {episode.index}: stream {name!r} has a NaN or infinite "
                            f"timestamp at sample {bad}.")
        steps = np.diff(t)
        if np.any(steps < 0):
            bad = int(np.flatnonzero(steps < 0)[0])
            raise DataError(f"episode {episode.index}: stream {name!r} timestamps decrease at "
                            f"sample {bad} ({float(t[bad])!r} > {float(t[bad + 1])!r}).")
        if stream.data is None:
            continue
        if stream.data.shape[0] != len(t):
            raise DataError(f"episode {episode.index}: stream {name!r} has {stream.data.shape[0]} "
                            f"samples but {len(t)} timestamps.")
        if spec.encoding is not None:
            if stream.data.ndim != 1 or not all(isinstance(b, bytes) and b
                                                for b in stream.data):
                raise DataError(f"episode {episode.index}: stream {name!r} must hold one "
                                f"non-empty {spec.encoding} byte string per sample.")
        elif spec.kind != "event" and tuple(stream.data.shape[1:]) != spec.shape:
            raise DataError(f"episode {episode.index}: stream {name!r} samples have shape "
                            f"{tuple(stream.data.shape[1:])}, expected {spec.shape}.")
        if spec.kind == "numeric" and not np.all(np.isfinite(stream.data)):
            raise DataError(f"episode {episode.index}: stream {name!r} has NaN or infinite "
                            "values.")
