"""``robocache merge``: join shard caches into one cache.

    $ robocache ingest SRC /shared/part-0 --shard 0/2     # job 0
    $ robocache ingest SRC /shared/part-1 --shard 1/2     # job 1, anywhere
    $ robocache merge /shared/part-0 /shared/part-1 /shared/robot.cache

Each shard cache (``ingest`` or ``preprocess`` with ``--shard i/n``) must be complete and built
from the same source, rate and streams; together they must be shards ``0..n-1`` of one ``n``.
Rows and image frames are copied shard by shard, each shard's files added in one Lance commit
per table (rows last), so a killed merge resumes by shard with nothing duplicated. Statistics
are merged from the shards' ``stats.json`` with :func:`robocache.merge_stats`: count, mean, std,
min and max exactly; q01/q99 from the merged histograms (within one histogram bin). The
quarantine lists are joined; counts reconcile as for ``ingest``.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from robocache._optional import require
from robocache.data import source_identity
from robocache.data.build.commit import _done_episodes, commit, drop_orphan_frames
from robocache.data.build.manifest import IDENTITY, _check_dest, _claim, is_cache
from robocache.data.build.run import _progress, finish
from robocache.data.build.write import write_files
from robocache.data.lock import CacheLock
from robocache.data.publish import Target
from robocache.errors import DataError


def _manifests(shards: list[Path]) -> list[dict[str, Any]]:
    out = []
    for shard in shards:
        if not is_cache(shard):
            raise DataError(f"{shard} is not a RoboCache cache (no manifest.json of one); pass "
                            "the shard cache directories, then the destination.")
        m = json.loads((shard / "manifest.json").read_text())
        if m.get("status") != "complete":
            raise DataError(f"{shard} is an unfinished cache (status {m.get('status')!r}); re-run "
                            "its job (it resumes) before merging.")
        out.append(m)
    first = out[0]
    for shard, m in zip(shards[1:], out[1:], strict=True):
        for key in IDENTITY:
            if m.get(key) != first.get(key):
                raise DataError(f"{shard} has a different {key} than {shards[0]} "
                                f"({m.get(key)!r} vs {first.get(key)!r}); merge shards of one "
                                "build configuration.")
    specs = [m.get("shard") for m in out]
    if any(s is not None for s in specs):
        n = {s[1] for s in specs if s is not None}
        got = sorted(s[0] for s in specs if s is not None)
        if None in specs or len(n) != 1 or got != list(range(next(iter(n)))):
            want = next(iter(n)) if len(n) == 1 else "one n"
            raise DataError(f"the shards given are {[s and '/'.join(map(str, s)) for s in specs]}"
                            f"; pass every shard i/{want} exactly once (i = 0..n-1).")
    seen: dict[int, Path] = {}
    for shard, m in zip(shards, out, strict=True):
        for e in m["episodes"]:
            if e["index"] in seen:
                raise DataError(f"episode {e['index']} is in both {seen[e['index']]} and "
                                f"{shard}; merge disjoint shards.")
            seen[e["index"]] = shard
    return out


def _merged_stats(shards: list[Path]) -> dict[str, dict]:
    from robocache.ops.normalize import Stats, merge_stats

    parts: dict[str, list[Stats]] = {}
    for shard in shards:
        for name, d in json.loads((shard / "stats.json").read_text()).items():
            parts.setdefault(name, []).append(Stats.from_dict(d))
    return {name: merge_stats(p).to_dict() for name, p in parts.items()}


def merge(shards: list[str | Path], dest: str | Path, *, overwrite: bool = False,
          wait: bool = False, progress: bool = True,
          log: Callable[[str], None] | None = None,
          storage_options: dict[str, Any] | None = None,
          staging: str | Path | None = None) -> dict[str, Any]:
    """Join shard caches into one cache at ``dest`` (see the module docstring).

    Args:
        shards: the shard cache directories (any order).
        dest: the merged cache directory (created, or resumed when it holds a merge of the
            same configuration), or an object-store URI: merged in ``staging``, then
            published, as :func:`robocache.data.cache.build` does.
        overwrite: delete an existing cache at ``dest`` first.
        wait: when another process is writing ``dest``, wait for it instead of failing.
        progress: show a progress bar on stderr.
        log: where notices go (what ``overwrite`` removes).
        storage_options, staging: as for ``build``.

    Returns:
        The merged cache's manifest (as ``build`` returns it).

    Raises:
        DataError: no shards, a shard that is not a complete cache, shards of different
            configurations, a missing or repeated shard ``i/n``, an episode in two shards, or
            ``dest`` holding another cache.
        CacheBusyError: another process is writing ``dest`` (and ``wait`` is off).

    Example:
        >>> m = merge(["/tmp/part-0", "/tmp/part-1"], "/tmp/all.cache")  # doctest: +SKIP
    """
    shards = [Path(s) for s in shards]
    if not shards:
        raise DataError("`shards` is empty; pass the shard cache directories, then the "
                        "destination.")
    manifests = _manifests(shards)
    header = {k: manifests[0].get(k) for k in IDENTITY}
    header.update(source_identity.merged(manifests))
    log = log or logging.getLogger(__name__).warning
    target = Target(dest, storage_options, staging)
    target.prepare(overwrite, log)
    dest = target.local
    for shard in shards:  # the shards are sources: never written
        _check_dest(shard, dest)
    dest.mkdir(parents=True, exist_ok=True)
    with CacheLock(dest, wait=wait):
        _check_dest(shards[0], dest)  # again: another writer may have changed it
        _claim(dest, header, overwrite, log)
        manifest = _merge_locked(shards, manifests, dest, header, progress)
    return target.publish(manifest)


def _merge_locked(shards: list[Path], manifests: list[dict[str, Any]], dest: Path,
                  header: dict[str, Any], progress: bool) -> dict[str, Any]:
    lance = require("lance", "data", "The Lance cache", "pylance")

    drop_orphan_frames(dest)  # frames a killed merge committed without their rows
    done = _done_episodes(dest / "data.lance")
    tables = ["data.lance"] + [f"frames/{name}.lance" for name, s in header["streams"].items()
                               if s["kind"] in ("image", "video")]
    t0 = time.perf_counter()
    new = 0
    with _progress(progress, len(shards), "merge") as advance:
        for shard, m in zip(shards, manifests, strict=True):
            episodes = [e["index"] for e in m["episodes"]]
            if not episodes or set(episodes) <= done:
                advance(f"{shard} (merged)")
                continue
            written = []
            for rel in sorted(tables, key=lambda r: r == "data.lance"):  # rows last
                ds = lance.dataset(str(shard / rel))
                written.append((rel, ds.schema, write_files(ds.scanner().to_reader(),
                                                            dest / rel)))
            commit(dest, episodes, written)
            new += len(episodes)
            advance(str(shard))
    quarantine = {q["index"]: q for m in manifests for q in m["quarantined"]}
    wanted = sorted({e["index"] for m in manifests for e in m["episodes"]} | set(quarantine))
    return finish(dest, header, wanted=wanted, done=done, quarantine=quarantine, new=new,
                  device=f"merge of {len(shards)} shards", seconds=time.perf_counter() - t0,
                  timing=manifests[0].get("timing"), stats=_merged_stats(shards))
