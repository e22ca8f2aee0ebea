"""diffusion-policy / UMI zarr ReplayBuffers: ``data/<key>`` arrays packed over all episodes,
``meta/episode_ends`` (exclusive end row of each episode).

Timestamps come from ``data/timestamp`` when present, else from ``fps`` (the rate the buffer
was recorded at; diffusion policy's Push-T uses 10 Hz). ``.zarr`` directories and ``.zarr.zip``
files are both read through the zarr library.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from robocache.data.episode import Episode, Stream, StreamSpec
from robocache.errors import DataError

TIME_KEY = "timestamp"


def _open(path: Path):
    import zarr

    if path.suffix == ".zip":
        return zarr.open_group(zarr.storage.ZipStore(path, mode="r"), mode="r")
    return zarr.open_group(str(path), mode="r")


def detect(path: Path) -> bool:
    if path.is_file():
        return path.name.endswith(".zarr.zip")
    return (path / "meta" / "episode_ends").exists()


class ZarrReplaySource:
    """A zarr ReplayBuffer (see the module docstring); ``fps`` times buffers without timestamps."""

    format = "zarr-replay"

    def __init__(self, path: str | Path, fps: float = 10.0):
        self.path = Path(path)
        self.root = _open(self.path)
        try:
            self.ends = np.asarray(self.root["meta"]["episode_ends"][:], dtype=np.int64)
            self.data = self.root["data"]
        except KeyError as e:
            raise DataError(f"{self.path}: a ReplayBuffer needs 'data/<key>' arrays and "
                            f"'meta/episode_ends'; missing {e}.") from e
        self.fps = float(fps)
        self.specs: dict[str, StreamSpec] = {}
        for key in sorted(self.data.array_keys()):
            if key == TIME_KEY:
                continue
            arr = self.data[key]
            shape = tuple(int(s) for s in arr.shape[1:])
            dtype = np.dtype(arr.dtype)
            kind = "image" if dtype == np.uint8 and len(shape) == 3 else "numeric"
            self.specs[key] = StreamSpec(key, kind, dtype.name, shape, self.fps)
        self.has_time = TIME_KEY in set(self.data.array_keys())

    def episode_indices(self) -> list[int]:
        return list(range(len(self.ends)))

    def read(self, index: int) -> Episode:
        start = int(self.ends[index - 1]) if index > 0 else 0
        stop = int(self.ends[index])
        if stop < start:
            raise DataError(f"episode {index}: meta/episode_ends decreases ({start} > {stop}).")
        if self.has_time:
            times = np.asarray(self.data[TIME_KEY][start:stop], np.float64).reshape(-1)
        else:
            times = np.arange(stop - start, dtype=np.float64) / self.fps
        streams = {}
        for name, spec in self.specs.items():
            data = np.asarray(self.data[name][start:stop])
            streams[name] = Stream(spec, times[: len(data)], data)
        return Episode(index, streams, {"length": stop - start})
