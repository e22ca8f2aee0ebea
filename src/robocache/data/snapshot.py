"""Readers of a cache that another process is extending: the last complete version.

A build that resumes or extends a complete cache keeps that cache's manifest, with its stats
inline, as ``previous`` in the in-progress manifest (until the build completes). Rows are only
ever added to a cache's tables (Lance commits of batches of episodes; compaction rewrites
files, never rows), so the latest tables hold every row of that version unchanged: a reader
that filters them to ``previous``'s episodes serves exactly the last complete cache, whether
the writer is still running, has just finished, or was killed (a scan that overlaps the
writer's compaction: :func:`robocache.data.served.open_served` reads it again at the newer
version).
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

from robocache.data.lock import describe_holder, holder
from robocache.errors import DataError

_WARNED: set[tuple[str, str]] = set()


def last_complete(dest: Path, old: dict[str, Any] | None) -> dict[str, Any]:
    """``{"previous": ...}`` for the in-progress manifest of a build of ``dest`` whose
    manifest was ``old``: ``old`` itself when complete (stats inline), the ``previous`` an
    interrupted build kept, or nothing."""
    if old is None:
        return {}
    if old.get("status") != "complete":
        return {"previous": old["previous"]} if old.get("previous") else {}
    try:
        stats = json.loads((dest / old.get("stats_path", "stats.json")).read_text())
    except (OSError, ValueError):  # a damaged cache: nothing complete to serve meanwhile
        return {}
    # what identifies the source is the in-progress manifest's own business
    return {"previous": {**{k: v for k, v in old.items() if k not in (
        "source_files", "episode_files", "episode_digests")}, "stats": stats}}


def kept(dest: Path) -> dict[str, Any]:
    """The ``previous`` field of the in-progress manifest at ``dest`` (to rewrite it)."""
    try:
        m = json.loads((dest / "manifest.json").read_text())
    except (OSError, ValueError):
        return {}
    return {"previous": m["previous"]} if m.get("previous") else {}


def forget(dest: Path) -> None:
    """Drop ``previous`` from the in-progress manifest at ``dest``: the build is about to
    change rows of that version (episodes cached again), so there is none to serve."""
    from robocache.data.build.manifest import _write_json

    m = json.loads((dest / "manifest.json").read_text())
    if m.pop("previous", None) is not None:
        _write_json(dest / "manifest.json", m)


def servable(location, manifest: dict[str, Any]) -> dict[str, Any]:
    """The manifest a reader of the cache at ``location`` (a
    :class:`~robocache.data.location.Location`) serves: ``manifest`` when complete; while a
    build is unfinished, the last complete version it keeps (warning once per cache and
    writer, naming the live writer when there is one: a local cache's lock tells).

    Raises:
        DataError: the build is unfinished and the cache was never complete: naming the live
            writer (wait for it), or saying that the build was interrupted (resume it).
    """
    if manifest.get("status") == "complete":
        return manifest
    path = location.path if location.path is not None else location.uri
    writer = holder(location.path) if location.path is not None else None
    previous = manifest.get("previous")
    who = None if writer is None else describe_holder(writer)
    if previous is None:
        if who is not None:
            raise DataError(f"{path} is being built by {who} and has no complete version yet; "
                            "wait for it to finish (`robocache ingest ... --wait` waits, "
                            "as LeRobotDataset does) and open it then.")
        raise DataError(f"{path}: the cache build did not finish; re-run `robocache "
                        "ingest` with the same arguments to resume it.")
    key = (str(path), who or "")
    if key not in _WARNED:
        _WARNED.add(key)
        doing = (f"is being extended by {who}" if who is not None else
                 "holds an unfinished extension (re-run `robocache ingest` with the same "
                 "arguments to finish it)")
        warnings.warn(f"{path} {doing}: serving its last complete version "
                      f"({previous['counts']['cached']} episodes, {previous['created']}); "
                      "open it again once the build is done for the new episodes.",
                      stacklevel=3)
    return previous
