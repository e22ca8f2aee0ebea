"""Readers: a dataset on disk → :class:`~robocache.data.episode.Episode` objects.

``open_source(path)`` detects the format; each reader exposes ``specs`` (declared streams),
``episode_indices()`` and ``read(index)``.
"""

from __future__ import annotations

import inspect
import math
from pathlib import Path
from typing import Any

from robocache.data.episode import Source
from robocache.errors import DataError

# name -> (module, class, what the reader recognizes)
FORMATS = {
    "lerobot": ("lerobot", "LeRobotSource", "LeRobot v2.1 / v3.0 directory (meta/info.json)"),
    "zarr-replay": ("zarr_replay", "ZarrReplaySource",
                    "zarr ReplayBuffer (data/<key>, meta/episode_ends; .zarr dir or .zarr.zip)"),
    "robomimic": ("robomimic", "RobomimicSource", "robomimic HDF5 (data/demo_<i>/...; .hdf5)"),
    "rlds": ("rlds", "RldsSource",
             "RLDS / TFDS builder folder (features.json, *.tfrecord-XXXXX-of-YYYYY shards)"),
    "rosbag": ("rosbag", "RosbagSource",
               "ROS bags: a folder of rosbag2 directories (MCAP or sqlite3 .db3), .mcap files "
               "or ROS 1 .bag files, one per episode"),
}


def supported() -> str:
    """One line per supported format, for error messages and ``--help``."""
    return "; ".join(f"{name}: {desc}" for name, (_, _, desc) in FORMATS.items())


def check_fps(fps: float | None, default: float, path: Path) -> tuple[float, str]:
    """The rate that times a source without timestamps and the sentence saying where it came
    from (for the manifest and ``inspect``)."""
    if fps is None:
        return default, f"no timestamps: {default:g} Hz assumed (the default; set it with --fps)"
    if not (isinstance(fps, (int, float)) and math.isfinite(fps) and fps > 0):
        raise DataError(f"`fps` (--fps) must be a finite rate > 0 Hz; got {fps!r} for {path}.")
    return float(fps), f"no timestamps: {float(fps):g} Hz from --fps"


def _module(name: str):
    import importlib

    return importlib.import_module(f"robocache.data.formats.{FORMATS[name][0]}")


def open_source(path: str | Path, format: str | None = None, **options: Any) -> Source:
    """Open a dataset, detecting its format unless ``format`` names one of :data:`FORMATS`.

    Args:
        path: dataset directory or file.
        format: ``"lerobot"``, ``"zarr-replay"``, ``"robomimic"``, ``"rlds"`` or
            ``"rosbag"``; ``None`` detects.
        **options: reader options, e.g. ``fps=10.0`` for sources without timestamps (zarr,
            HDF5, RLDS), ``split="train[:95%]"`` for RLDS, ``missing_chunks="fill"`` for a
            zarr buffer whose writer left out chunks equal to the fill value, ``topics=[...]``,
            ``task_topic="/task"`` for ROS 2 bags (see each reader).

    Returns:
        The reader (``specs``, ``episode_indices()``, ``read(index)``).

    Raises:
        FileNotFoundError: ``path`` does not exist.
        DataError: the format is unknown or unsupported (the message lists the supported ones),
            or an option does not apply to the format.

    Example:
        >>> src = open_source("data/sample/panda_multirate")  # doctest: +SKIP
        >>> src.format, len(src.episode_indices())  # doctest: +SKIP
        ('lerobot-v3.0', 6)
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist.")
    if format is None:
        format = _detect(path)
        if format is None:
            inside = _datasets_inside(path)
            hint = (f"; it holds datasets in subfolders: pass one of "
                    f"{', '.join(f'{p} ({n})' for p, n in inside)}" if inside else
                    f". Supported formats: {supported()}")
            raise DataError(f"{path}: unknown dataset format{hint}.")
    elif format not in FORMATS:
        raise DataError(f"format {format!r} is not supported. Supported formats: {supported()}.")
    reader = getattr(_module(format), FORMATS[format][1])
    for name in options:
        if name not in inspect.signature(reader).parameters:
            takers = [n for n in FORMATS
                      if name in inspect.signature(getattr(_module(n), FORMATS[n][1])).parameters]
            flag = _FLAGS.get(name, "--" + name.replace("_", "-"))
            raise DataError(f"`{name}` ({flag}) is an option of {' and '.join(takers)} "
                            f"sources; {path} is a {format} dataset: drop {flag}.")
    return reader(path, **options)


# the command-line flag of a reader option whose name is not the option's own (repeated flags)
_FLAGS = {"topics": "--topic", "exclude_topics": "--exclude-topic", "tf_chains": "--tf-chain"}


def _detect(path: Path) -> str | None:
    return next((n for n in FORMATS if _module(n).detect(path)), None)


def _datasets_inside(path: Path, depth: int = 2, limit: int = 64) -> list[tuple[Path, str]]:
    """Datasets in the subfolders of ``path`` down to ``depth`` levels (a TFDS data dir holds
    ``name/version`` folders), at most ``limit`` folders looked at per level."""
    if depth == 0 or not path.is_dir():
        return []
    found = []
    for sub in sorted(p for p in path.iterdir() if p.is_dir())[:limit]:
        name = _detect(sub)
        if name == "rlds":  # a TFDS name folder: point at its newest version folder
            sub = _module(name)._version_dir(sub)
        found += [(sub, name)] if name else _datasets_inside(sub, depth - 1, limit)
    return found[:5]
