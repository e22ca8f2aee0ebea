"""Caches in an object store: built in a local staging directory, then published.

``robocache ingest SRC s3://bucket/cache`` (and ``preprocess``, ``merge``, and
``robocache.cache.build`` with a URI) builds the cache where every guarantee of a build holds
(one writer, resumable after a kill, nothing duplicated or lost): a local staging directory,
``--staging DIR`` (default ``$ROBOCACHE_HOME/staging/<name>-<digest of the URI>``). Then
:func:`publish` copies the files the cache owns to the URI, in an order a reader of the URI
can never see half of: each Lance table's data files first, then its transaction files and
version manifests (a reader lists versions, so a version appears once its files are there),
``stats.json``, and ``manifest.json`` last. A file already in the store with the same size is
not copied again (Lance's data files are immutable and uniquely named), so publishing again
after an interruption, or after extending the cache in the same staging directory, copies only
what is new. The staging directory is kept: extending or resuming the cache later from this
machine starts from it.

A URI that already holds a cache this staging directory did not make (another source, or built
elsewhere) is refused, unless ``overwrite``: then the files that cache owns are deleted from
the store first (its manifest says which), and nothing else under the prefix.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from robocache.data.location import Location, is_uri
from robocache.data.owned import DATA, FRAMES, _cameras
from robocache.errors import DataError

#: The fields of two manifests that must agree for one to extend the other.
IDENTITY = ("format", "source", "rate_hz", "streams")


class Target:
    """Where a build writes: ``dest`` itself when local; for a URI, a staging directory
    (``staging``, default :func:`staging_dir`) published to the URI when the build ends.

    Args:
        dest: a local directory or a URI (``s3://bucket/prefix``...).
        storage_options: the object store's settings (see :mod:`robocache.data.location`).
        staging: the staging directory of a URI ``dest``.

    Raises:
        DataError: ``staging`` given for a local ``dest``, or a bad URI.
    """

    def __init__(self, dest: str | Path, storage_options: dict[str, Any] | None = None,
                 staging: str | Path | None = None):
        self.location = Location(dest, storage_options) if is_uri(dest) else None
        if self.location is None:
            if staging is not None:
                raise DataError(f"`staging` (--staging) is for a cache bound for an object "
                                f"store; DEST {dest} is a local directory, written directly.")
            self.local = Path(dest)
        else:
            self.local = Path(staging) if staging is not None else staging_dir(self.location)

    def prepare(self, overwrite: bool, log: Callable[[str], None] = print) -> None:
        """Before the build: a URI's cache must be one this staging directory continues
        (:func:`check_target`)."""
        if self.location is not None:
            check_target(self.location, self.local, overwrite, log)

    def publish(self, manifest: dict[str, Any]) -> dict[str, Any]:
        """After the build: copy the staged cache to the URI (:func:`publish`); the manifest
        with ``uri``, ``staging`` and ``published`` (files, bytes, skipped) when it did."""
        if self.location is None or manifest.get("status") != "complete":
            return manifest
        done = publish(self.local, self.location)
        return {**manifest, "uri": self.location.uri, "staging": str(self.local),
                "published": done}


def staging_dir(location: Location) -> Path:
    """Where a cache bound for ``location`` is built by default:
    ``$ROBOCACHE_HOME/staging/<name>-<digest of the URI>`` (``ROBOCACHE_HOME`` defaults to
    ``~/.cache/robocache``)."""
    home = Path(os.environ.get("ROBOCACHE_HOME", Path.home() / ".cache" / "robocache"))
    digest = hashlib.sha1(location.uri.encode()).hexdigest()[:12]
    return home / "staging" / f"{location.name or 'cache'}-{digest}"


def _tables(manifest: dict[str, Any]) -> list[str]:
    return [DATA] + [f"{FRAMES}/{name}.lance" for name in _cameras(manifest)]


def _remote_manifest(location: Location) -> dict[str, Any] | None:
    try:
        return json.loads(location.read_text("manifest.json"))
    except FileNotFoundError:
        return None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise DataError(f"{location.child('manifest.json')} is not valid JSON ({e}); pass "
                        "--overwrite to replace that cache.") from e


def check_target(location: Location, staging: Path, overwrite: bool,
                 log: Callable[[str], None] = print) -> None:
    """Before a build bound for ``location``: refuse (or, with ``overwrite``, delete) a cache
    there that the staging directory ``staging`` does not continue.

    Raises:
        DataError: ``location`` holds another cache (one line naming it and the fix).
    """
    remote = _remote_manifest(location)
    if remote is None:
        return
    try:
        local = json.loads((staging / "manifest.json").read_text())
    except (OSError, ValueError):
        local = None
    same = local is not None and all(local.get(k) == remote.get(k) for k in IDENTITY)
    if same and not overwrite:
        return
    if not overwrite:
        where = "no cache" if local is None else "another cache"
        raise DataError(f"{location} holds a RoboCache cache of {remote['source']['path']} "
                        f"that the staging directory {staging} does not continue ({where} "
                        "there): build it again from the machine that staged it (or pass "
                        "--staging with that directory), publish to a new URI, or pass "
                        "--overwrite to replace it.")
    files = [rel for table in ["manifest.json", remote.get("stats_path", "stats.json"),
                               *_tables(remote)]
             for rel in (location.sizes(table) if table.endswith(".lance") else
                         ({table: 0} if location.exists(table) else {}))]
    log(f"overwrite: removing the RoboCache cache at {location} ({len(files)} objects: "
        f"manifest.json, its stats and tables {', '.join(_tables(remote))}); keeping "
        "anything else under the prefix")
    location.delete(["manifest.json", *[f for f in files if f != "manifest.json"]])


def publish(staging: Path, location: Location,
            progress: Callable[[int, int], None] | None = None) -> dict[str, int]:
    """Copy the cache at ``staging`` to ``location`` (see the module docstring).

    Args:
        staging: a complete local cache.
        location: the object store's URI (:class:`~robocache.data.location.Location`).
        progress: called with (bytes copied, bytes to copy) as files are copied.

    Returns:
        ``{"files": copied, "bytes": copied, "skipped": already there}``.

    Raises:
        DataError: the staging cache is not complete, or the store fails.
    """
    manifest = json.loads((staging / "manifest.json").read_text())
    if manifest.get("status") != "complete":
        raise DataError(f"{staging}: the staged cache is not complete; re-run the build to "
                        "finish it before publishing.")
    there: dict[str, int] = {}
    for table in _tables(manifest):
        there.update(location.sizes(table))
    order: list[str] = []
    for table in _tables(manifest):
        root = staging / table
        files = sorted(str(p.relative_to(staging)) for p in root.rglob("*") if p.is_file())
        # data (and blob) files, then transactions, then versions: a version is listed once
        # the files it names are there
        rank = {"_versions": 2, "_transactions": 1}
        order += sorted(files, key=lambda f: rank.get(Path(f).relative_to(table).parts[0], 0))
    order += [manifest.get("stats_path", "stats.json"), "manifest.json"]
    todo = [f for f in order if f in ("manifest.json", manifest.get("stats_path", "stats.json"))
            or there.get(f) != (staging / f).stat().st_size]
    total = sum((staging / f).stat().st_size for f in todo)
    done = 0
    for f in todo:
        location.upload(staging / f, f)
        done += (staging / f).stat().st_size
        if progress is not None:
            progress(done, total)
    return {"files": len(todo), "bytes": done, "skipped": len(order) - len(todo)}
