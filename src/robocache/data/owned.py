"""What a cache directory's manifest says the cache owns, so that nothing else is ever deleted.

A cache owns ``manifest.json``, its stats file (and ``relative_stats/``, the statistics of
relative action chunks), the ``data.lance`` table, one
``frames/<stream>.lance`` table per camera stream the manifest lists, and the temporary files of
its atomic JSON writes (``.<name>.tmp``); the lock file (``.robocache.lock``) is held, not
removed. Anything else in the directory (notes, checkpoints, a training run's outputs) is the
user's: ``--overwrite`` leaves it where it is and says so.

A manifest that says episodes were cached while the tables holding them are absent does not
describe the directory it is in (a manifest copied or left behind among other files): such a
directory is neither resumed nor overwritten.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from robocache.errors import DataError

DATA = "data.lance"
FRAMES = "frames"
#: Statistics of relative action chunks (robocache.data.stats.RELATIVE_DIR).
RELATIVE_STATS = "relative_stats"


def _manifest(dest: Path) -> dict[str, Any] | None:
    """The manifest as JSON, ``None`` when unreadable (a truncated one: see ``is_cache``)."""
    try:
        m = json.loads((dest / "manifest.json").read_text())
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    return m if isinstance(m, dict) else None


def _cameras(manifest: dict[str, Any]) -> list[str]:
    return [name for name, s in (manifest.get("streams") or {}).items()
            if isinstance(s, dict) and s.get("kind") in ("image", "video")]


def owned(dest: Path) -> list[Path]:
    """The entries of the cache at ``dest`` that the cache owns and that exist (see the module
    docstring; with an unreadable manifest, every ``frames/*.lance`` table)."""
    m = _manifest(dest)
    stats = (m or {}).get("stats_path") or "stats.json"
    names = ["manifest.json", stats, DATA, RELATIVE_STATS]
    names += [f".{n}.tmp" for n in ("manifest.json", stats)]
    if m is not None:
        names += [f"{FRAMES}/{name}.lance" for name in _cameras(m)]
    elif (dest / FRAMES).is_dir():
        names += [f"{FRAMES}/{p.name}" for p in (dest / FRAMES).iterdir()
                  if p.name.endswith(".lance")]
    inside = dest.resolve()
    # a name that leads out of the directory (``..``, an absolute path) is never the cache's
    return [dest / n for n in dict.fromkeys(names)
            if ((dest / n).exists() or (dest / n).is_symlink())
            and inside in (dest / n).parent.resolve().joinpath((dest / n).name).parents]


def missing_tables(dest: Path) -> list[str]:
    """The tables the manifest at ``dest`` says hold cached episodes but that are absent: the
    last complete build's (of this manifest, or of the one it extends, ``previous``)."""
    m = _manifest(dest)
    if m is None:
        return []
    done = m if m.get("status") == "complete" else m.get("previous") or {}
    if not (done.get("counts") or {}).get("cached"):
        return []
    want = [DATA] + [f"{FRAMES}/{name}.lance" for name in _cameras(m)]
    return [t for t in want if not (dest / t / "_versions").is_dir()]


def check_tables(dest: Path) -> None:
    """Refuse a directory whose manifest names cached episodes but whose tables are absent.

    Raises:
        DataError: naming the missing tables and the fix.
    """
    missing = missing_tables(dest)
    if missing:
        raise DataError(f"DEST {dest} holds a manifest.json of a RoboCache cache with cached "
                        f"episodes but not their tables ({', '.join(missing)}), so it is "
                        "neither resumed nor removed; choose a new or empty destination (or "
                        "move that manifest.json away if it is not this directory's).")


def remove_owned(dest: Path, log: Callable[[str], None], episodes: Any) -> None:
    """Delete what the cache at ``dest`` owns (checked by :func:`check_tables` first), saying
    what goes and what stays (``episodes``: the cached count, for the message)."""
    entries = owned(dest)
    keep = sorted(p.name for p in dest.iterdir() if p.name not in
                  {e.relative_to(dest).parts[0] for e in entries} | {".robocache.lock"})
    log(f"overwrite: removing the RoboCache cache at {dest} (episodes: {episodes}): "
        + ", ".join(str(p.relative_to(dest)) for p in entries)
        + (f"; keeping what is not the cache's: {', '.join(keep)}" if keep else ""))
    for p in entries:
        shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
    frames = dest / FRAMES
    if frames.is_dir() and not any(frames.iterdir()):
        frames.rmdir()
