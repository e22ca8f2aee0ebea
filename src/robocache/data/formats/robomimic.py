"""robomimic HDF5 files: ``data/demo_<i>/{obs/<key>, actions, rewards, dones, ...}``.

Datasets are sampled at the environment's control frequency: ``fps`` when given, else
``data.attrs["env_args"]["env_kwargs"]["control_freq"]`` when present (robosuite: 20 Hz), else
20 Hz assumed (stated in ``timing``, shown by the manifest and ``inspect``). Streams are
named ``obs.<key>`` and by their dataset name for the rest.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np

from robocache._optional import require
from robocache.data.cameras import is_camera
from robocache.data.episode import Episode, Stream, StreamSpec
from robocache.data.formats import check_fps
from robocache.errors import DataError

SKIP = ("states",)  # simulator state vectors: replay data, not a training stream


def detect(path: Path) -> bool:
    return path.is_file() and path.suffix in (".hdf5", ".h5")


def _control_freq(data, path: Path) -> float | None:
    """robosuite's ``env_args.env_kwargs.control_freq`` (Hz), ``None`` when absent."""
    env_args = data.attrs.get("env_args")
    if env_args is None:
        return None
    try:
        freq = json.loads(env_args).get("env_kwargs", {}).get("control_freq")
    except (ValueError, AttributeError) as e:
        raise DataError(f"{path}: data.attrs['env_args'] is not a JSON object ({e}); fix it, or "
                        "pass --fps to time the episodes.") from e
    return float(freq) if freq else None


def _demo_number(name: str) -> int:
    m = re.fullmatch(r"demo_(\d+)", name)
    return int(m.group(1)) if m else -1


class RobomimicSource:
    """A robomimic HDF5 file (see the module docstring)."""

    format = "robomimic"

    def __init__(self, path: str | Path, fps: float | None = None):
        h5py = require("h5py", "data", "Reading robomimic HDF5 files")
        self.path = Path(path)
        try:
            self.file = h5py.File(self.path, "r")
        except OSError as e:
            raise DataError(f"{self.path} is not a readable HDF5 file ({e}); check that it is "
                            "complete (copy or export it again).") from e
        if "data" not in self.file:
            raise DataError(f"{self.path}: a robomimic file has a 'data' group; found "
                            f"{sorted(self.file.keys())}.")
        data = self.file["data"]
        self.fps, self.timing = check_fps(fps, 20.0, self.path)
        if fps is None and _control_freq(data, self.path):
            self.fps = _control_freq(data, self.path)
            self.timing = f"no timestamps: {self.fps:g} Hz from env_args control_freq"
        self.demos = sorted((k for k in data if _demo_number(k) >= 0), key=_demo_number)
        if not self.demos:
            raise DataError(f"{self.path}: no 'data/demo_<i>' groups.")
        first = data[self.demos[0]]
        self.specs: dict[str, StreamSpec] = {}
        for name, ds in self._datasets(first).items():
            shape = tuple(int(s) for s in ds.shape[1:])
            dtype = np.dtype(ds.dtype)
            kind = "image" if is_camera(dtype, shape) else "numeric"
            self.specs[name] = StreamSpec(name, kind, dtype.name, shape, self.fps)

    @staticmethod
    def _datasets(demo) -> dict:
        out = {}
        for key, item in demo.items():
            if key in SKIP:
                continue
            if key in ("obs", "next_obs"):
                if key == "obs":
                    out.update({f"obs.{k}": v for k, v in item.items()})
                continue
            out[key] = item
        return out

    def episode_indices(self) -> list[int]:
        return [_demo_number(d) for d in self.demos]

    def locate(self, index: int) -> str:
        """Where episode ``index`` lies: the file and its group."""
        return f"{self.path} data/demo_{index}"

    def read(self, index: int) -> Episode:
        demo = self.file["data"].get(f"demo_{index}")
        if demo is None:
            raise DataError(f"episode {index}: no group data/demo_{index}.")
        found = self._datasets(demo)
        streams = {}
        for name, spec in self.specs.items():
            if name not in found:
                continue
            data = np.asarray(found[name][()])
            streams[name] = Stream(spec, np.arange(len(data), dtype=np.float64) / self.fps, data)
        return Episode(index, streams, {"length": int(demo.attrs.get("num_samples", 0))})
