"""A cache's versions: what ``robocache edit`` made of it, each one readable by number.

A cache as built is version 1. Each edit (:mod:`robocache.data.edit`) makes the next: Lance
commits on the cache's tables (deletions, task updates: no frame is rewritten), new statistics,
and a manifest recording the Lance version of every table it reads (``"tables"``), its number
(``"version"``) and the edit (``"edit"``). Version ``n``'s manifest is kept as
``versions/<n>.json`` (its statistics ``versions/<n>.stats.json``; version 1's stay
``stats.json``); ``manifest.json`` is the latest's. A reader opens the tables at the versions
its manifest records, so a version keeps serving what it served after later edits, and
:class:`~robocache.data.dataset.RobotDataset` ``(cache, version=n)`` pins an older one.

Old Lance versions are kept by edits (an ingest that extends the cache removes them: pinning a
version made before is then refused).
"""

from __future__ import annotations

import json
from typing import Any

from robocache.errors import DataError

#: Where the versions' manifests go, inside the cache.
VERSIONS_DIR = "versions"


def number(manifest: dict[str, Any]) -> int:
    """The version a manifest describes (1: as built)."""
    return int(manifest.get("version", 1))


def table_names(manifest: dict[str, Any]) -> list[str]:
    """The Lance tables of a cache: ``data.lance`` and a frame table per camera stream."""
    return ["data.lance"] + [f"frames/{name}.lance" for name, s in manifest["streams"].items()
                             if s["kind"] in ("image", "video")]


def current_tables(location, manifest: dict[str, Any]) -> dict[str, int]:
    """Each table's latest Lance version."""
    out = {}
    for rel in table_names(manifest):
        try:
            out[rel] = int(location.lance(rel).version)
        except FileNotFoundError:  # a camera without frames
            continue
    return out


def pinned(manifest: dict[str, Any], rel: str) -> int | None:
    """The Lance version of table ``rel`` that ``manifest`` reads (None: the latest)."""
    return (manifest.get("tables") or {}).get(rel)


def open_table(location, manifest: dict[str, Any], rel: str):
    """Table ``rel`` at the version ``manifest`` pins (else its latest).

    Raises:
        FileNotFoundError: no such table.
        DataError: the pinned version was removed (an ingest extended the cache since).
    """
    version = pinned(manifest, rel)
    try:
        return location.lance(rel, version)
    except FileNotFoundError:
        if version is None:
            raise
        raise DataError(f"{location}: version {number(manifest)} of the cache reads "
                        f"{rel} at Lance version {version}, which was removed (an ingest "
                        "extended the cache since); open the latest version instead.") from None


def history(location, manifest: dict[str, Any]) -> list[dict[str, Any]]:
    """Every version of the cache up to the current one, oldest first: ``version``,
    ``episodes``, ``rows``, ``created`` (when it was made), ``edit`` (what made it; None for
    the build) and ``current``."""
    now = number(manifest)
    out = []
    for n in range(1, now + 1):
        m = manifest if n == now else _read(location, n)
        if m is None:
            continue
        out.append({"version": n, "episodes": len(m.get("episodes", [])),
                    "rows": int(m.get("counts", {}).get("rows", 0)),
                    "created": (m.get("edit") or {}).get("at", m.get("created")),
                    "edit": (m.get("edit") or {}).get("ops"), "current": n == now,
                    "splits": {k: len(v) for k, v in (m.get("splits") or {}).items()}})
    return out


def _read(location, n: int) -> dict[str, Any] | None:
    try:
        return json.loads(location.read_text(f"{VERSIONS_DIR}/{n}.json"))
    except FileNotFoundError:
        return None
    except ValueError as e:
        raise DataError(f"{location.child(f'{VERSIONS_DIR}/{n}.json')} is not valid JSON "
                        f"({e}).") from e


def manifest_at(location, manifest: dict[str, Any], version: int) -> dict[str, Any]:
    """The manifest of ``version`` of the cache whose current manifest is ``manifest``.

    Raises:
        DataError: no such version (naming the versions there are).
    """
    if isinstance(version, bool) or not isinstance(version, int):
        raise DataError(f"`version` must be a cache version number; got {version!r}.")
    now = number(manifest)
    if version == now:
        return manifest
    found = _read(location, version) if 1 <= version < now else None
    if found is None:
        raise DataError(f"{location} has no version {version}; its versions are 1..{now} "
                        "(`robocache inspect CACHE --versions` lists them).")
    return found
