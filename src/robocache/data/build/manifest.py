"""The cache's manifest: its identity, atomic JSON writes, and the destination checks,
claim and removal that keep a build from writing anything it did not make.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from robocache.data.lock import LOCK_NAME
from robocache.data.owned import check_tables, remove_owned
from robocache.data.snapshot import last_complete
from robocache.errors import DataError

CACHE_FORMAT = "robocache-cache/1"


def _tmp(path: Path) -> Path:
    return path.with_name(f".{path.name}.tmp")


# A top-level field holding more entries than this is written on one line
LONG_FIELD = 64


def _dumps(obj: Any, indent: int | None) -> str:
    """``obj`` as JSON text, indented by ``indent`` except for the top-level fields of a
    mapping that hold more than :data:`LONG_FIELD` entries (a manifest's per-episode
    records), each on one line: indenting runs the json module's Python encoder, 3x slower
    than its C one on a 60,000-episode manifest
    (``benchmarks/results/manifest-json-cpu-2026-11-27.txt``)."""
    if indent is None or not isinstance(obj, dict) or not obj:
        return json.dumps(obj, indent=indent)
    pad = " " * indent
    fields = [f"{pad}{json.dumps(str(k))}: " + (
        json.dumps(v) if isinstance(v, (list, dict)) and len(v) > LONG_FIELD else
        json.dumps(v, indent=indent).replace("\n", "\n" + pad)) for k, v in obj.items()]
    return "{\n" + ",\n".join(fields) + "\n}"


def _write_json(path: Path, obj: Any, indent: int | None = 2) -> None:
    """Write ``obj`` as JSON (:func:`_dumps`) atomically (temporary file, fsync, rename): a
    reader or a killed writer never leaves a truncated file."""
    import os

    tmp = _tmp(path)
    with open(tmp, "w") as f:
        f.write(_dumps(obj, indent) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_manifest(dest: Path) -> dict[str, Any] | None:
    """The manifest of the cache at ``dest``; ``None`` when there is none.

    Raises:
        DataError: ``manifest.json`` exists but is not valid JSON (truncated or corrupted).
    """
    path = dest / "manifest.json"
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as e:
        raise DataError(f"{path} is unreadable ({e}); if this is a RoboCache cache, rebuild it "
                        "with --overwrite (overwrite=True).") from e


def is_cache(dest: Path) -> bool:
    """Whether ``dest`` is a RoboCache cache: a directory whose ``manifest.json`` declares the
    cache format (recognised in the raw text too, so a truncated manifest still counts)."""
    path = dest / "manifest.json"
    if not path.is_file():
        return False
    text = path.read_text(errors="replace")
    try:
        return json.loads(text).get("format") == CACHE_FORMAT
    except (ValueError, AttributeError):
        return f'"format": "{CACHE_FORMAT}"' in text


def _check_dest(source: Path, dest: Path) -> None:
    """Refuse a destination that would write into the source or over files that are not a
    cache (nothing outside a cache is ever deleted or written)."""
    src, out = source.resolve(), dest.resolve()
    if out == src or src in out.parents:
        raise DataError(f"DEST {dest} is inside the source dataset {source}, which is never "
                        "written; choose a destination outside the source.")
    if out in src.parents:
        raise DataError(f"the source {source} lies inside DEST {dest}; choose a destination "
                        "that does not contain the source.")
    if dest.exists() and not dest.is_dir():
        raise DataError(f"DEST {dest} is a file, not a directory; choose a new or empty "
                        "directory for the cache.")
    # the lock and a first manifest a killed writer left half-written are ours, not foreign
    ours = {LOCK_NAME, _tmp(dest / "manifest.json").name}
    if dest.is_dir() and not is_cache(dest) and any(p.name not in ours for p in dest.iterdir()):
        raise DataError(f"DEST {dest} is not empty and is not a RoboCache cache (no manifest.json "
                        "of one), so it is neither resumed nor removed (--overwrite removes only "
                        "caches); choose a new or empty destination.")
    if dest.is_dir() and is_cache(dest):
        check_tables(dest)


def _remove_cache(dest: Path, log) -> None:
    """Delete the cache at ``dest`` (checked by :func:`_check_dest`): only what its manifest
    says it owns (:func:`robocache.data.owned.owned`), keeping the held lock file; says what it
    removes and what it keeps."""
    try:
        cached = (read_manifest(dest) or {}).get("counts", {}).get("cached", "unfinished")
    except DataError:
        cached = "unreadable manifest"
    remove_owned(dest, log, cached)


# the manifest fields that identify a cache's configuration: a resume or merge must match them
IDENTITY = ("format", "source", "rate_hz", "native", "streams", "tolerance_s")


def _claim(dest: Path, header: dict[str, Any], overwrite: bool, log) -> list[dict[str, Any]]:
    """With ``dest`` locked: remove the old cache (``overwrite``) or check that the cache there
    was built from the same source, rate (native or not) and streams (so a resume never mixes two
    configurations); write the in-progress manifest. Returns the quarantine list carried over."""
    if overwrite and is_cache(dest):
        _remove_cache(dest, log)
    old = read_manifest(dest)
    if old is not None and (dest / "data.lance").exists():
        for key in IDENTITY:
            if old.get(key) != header[key]:
                raise DataError(f"{dest} holds a cache with a different {key} "
                                f"({old.get(key)!r} vs {header[key]!r}); pick a new destination "
                                "or pass overwrite=True (--overwrite).")
    same = old is not None and all(old.get(k) == header[k] for k in IDENTITY)
    carried = old.get("quarantined", []) if same else []
    # readers serve the last complete version meanwhile (robocache.data.snapshot)
    _write_json(dest / "manifest.json", {**header, "status": "building", "quarantined": carried,
                                         **last_complete(dest, old if same else None)})
    return carried
