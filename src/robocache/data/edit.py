"""Edit a cache without rewriting its frames: each edit is a new version of the cache.

    >>> edit("/data/droid.cache", Edit(delete=[3, 17], rename_tasks={"": "unknown task"}))
    >>> edit("/data/droid.cache", Edit(split=0.05, seed=0))   # train / val by episode

What an edit does to the tables (Lance commits, :mod:`robocache.data.versions`):

- deleting episodes (``delete``, or all but ``keep``) marks their rows deleted in
  ``data.lance`` and every frame table (Lance deletion files; no data file is rewritten, so
  frames stay as written and reading afterwards costs what it did);
- renaming tasks updates the ``task`` of the matching rows of ``data.lance`` (Lance moves
  those rows to new fragments; frame tables are not touched);
- merging caches (``merge``) appends their rows and frames to this cache's tables, their
  episodes renumbered after this cache's last (they must share its rate and schemas);
- a split (``split``: the validation fraction, ``seed``) is recorded in the manifest
  (``"splits": {"train": [...], "val": [...]}``, by episode) and changes no row;
- statistics are computed again after a deletion or a merge (or with ``recompute_stats``),
  from the rows there are, into ``versions/<n>.stats.json``.

Faults. One edit at a time: an edit holds the cache's writer lock (another edit or an ingest
waits with ``wait=True``, else is refused naming the holder). The new version becomes the
cache's current one when ``manifest.json`` is replaced (an atomic rename), last: an edit
killed before leaves the previous version current and readable (its manifest pins the Lance
versions it reads), and the next edit first restores every table to the version the current
manifest pins. Deleting every episode is refused unless ``force``.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from robocache.data import versions as V
from robocache.errors import DataError

#: Episode indices per ``IN (...)`` clause of a deletion.
DELETE_CHUNK = 4096


@dataclass
class Edit:
    """One edit of a cache (any combination; applied in this order).

    Attributes:
        delete: episodes to delete.
        keep: delete every episode but these.
        rename_tasks: task renames, old -> new (every row whose task is ``old``).
        split: record a train / validation split by episode: this fraction of the episodes
            (after the deletions) goes to ``val``, drawn with ``seed``; 0 < split < 1.
        seed: the split's seed.
        recompute_stats: compute the statistics again even without a deletion.
        force: allow deleting every episode.
        merge: other caches (local directories) whose episodes are appended, renumbered
            after this cache's last episode; they must share this cache's rate and table
            schemas (the same streams, dtypes, shapes and camera codecs), whatever their
            sources. Their rows and frames are copied in (they live in another directory);
            this cache's own are not rewritten.
    """

    delete: Sequence[int] | None = None
    keep: Sequence[int] | None = None
    merge: Sequence[str | Path] = ()
    rename_tasks: Mapping[str, str] = field(default_factory=dict)
    split: float | None = None
    seed: int = 0
    recompute_stats: bool = False
    force: bool = False


def parse_episodes(text: str) -> list[int]:
    """``"3,5,10-12"`` as ``[3, 5, 10, 11, 12]``.

    Raises:
        DataError: not a comma-separated list of indices and ``A-B`` ranges.
    """
    out: list[int] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        a, sep, b = part.partition("-")
        try:
            if sep:
                lo, hi = int(a), int(b)
                if hi < lo:
                    raise ValueError
                out.extend(range(lo, hi + 1))
            else:
                out.append(int(a))
        except ValueError:
            raise DataError(f"{part!r} is not an episode index or a range A-B (A <= B); write "
                            "e.g. 3,5,10-20.") from None
    return out


def _sql(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def edit(cache: str | Path, change: Edit, *, wait: bool = False,
         log: Callable[[str], None] | None = None,
         _before_commit: Callable[[], None] | None = None) -> dict[str, Any]:
    """Apply ``change`` to the local cache at ``cache`` as its next version.

    Args:
        cache: a local cache directory.
        change: the edit.
        wait: wait for the cache's current writer instead of failing.
        log: where notices go (e.g. a restore after an interrupted edit).

    Returns:
        The new version's manifest (``version``, ``edit``, ``episodes``, ``counts``,
        ``splits``...), also ``manifest.json``.

    Raises:
        FileNotFoundError: no cache there.
        CacheBusyError: another process writes the cache (``wait=False``).
        DataError: an object-store URI, an unfinished cache, episodes the cache lacks, a
            deletion of every episode without ``force``, a bad split, nothing to do.
    """
    from robocache.data.build.manifest import _write_json
    from robocache.data.location import LANCE, Location, is_uri
    from robocache.data.lock import CacheLock

    if is_uri(cache):
        raise DataError(f"{cache}: edits change a local cache; edit it where it is built, "
                        "then publish it.")
    location = Location(cache)
    path = location.path
    manifest = location.manifest()
    _check(change)
    log = log or (lambda msg: None)
    with CacheLock(path, wait=wait), LANCE.call():
        manifest = location.manifest()  # as of now, under the lock
        if manifest.get("status") != "complete":
            raise DataError(f"{path} is not a complete cache (status "
                            f"{manifest.get('status')!r}); finish its ingest first.")
        rows = {int(e["index"]): e for e in manifest["episodes"]}
        dropped = _dropped(change, rows, path)
        renames = {old: new for old, new in change.rename_tasks.items() if old != new}
        others = [_other(Location(o), manifest, path) for o in change.merge]
        if not (dropped or renames or others or change.split is not None
                or change.recompute_stats):
            raise DataError("nothing to edit: pass episodes to delete or keep, caches to "
                            "merge, task renames, a split or a recomputation of the "
                            "statistics.")
        manifest = _pin(location, manifest, path, log)
        now = V.number(manifest)
        ops: list[dict[str, Any]] = []
        if dropped:
            ids = sorted(dropped)
            for rel in V.table_names(manifest):
                if rel not in manifest["tables"]:
                    continue
                table = location.lance(rel)
                for start in range(0, len(ids), DELETE_CHUNK):
                    chunk = ",".join(str(i) for i in ids[start:start + DELETE_CHUNK])
                    table.delete(f"episode_index IN ({chunk})")
            ops.append({"op": "delete", "episodes": ids})
        added: list[dict[str, Any]] = []
        if others:
            first = max(rows, default=-1) + 1
            for loc, other in others:
                renumber = {int(e["index"]): first + k
                            for k, e in enumerate(sorted(other["episodes"],
                                                         key=lambda e: e["index"]))}
                first += len(renumber)
                for rel in V.table_names(manifest):
                    if rel in manifest["tables"]:
                        _append(location, rel, V.open_table(loc, other, rel), renumber)
                added += [dict(e, index=renumber[int(e["index"])]) for e in other["episodes"]]
                ops.append({"op": "merge", "cache": loc.uri, "version": V.number(other),
                            "episodes": {str(k): v for k, v in renumber.items()}})
        if renames:
            table = location.lance("data.lance")
            for old, new in renames.items():
                table.update({"task": _sql(new)}, where=f"task = {_sql(old)}")
            ops.append({"op": "rename_tasks", "tasks": dict(renames)})
        episodes = [dict(e, task=renames.get(e.get("task"), e.get("task")))
                    for e in [r for i, r in sorted(rows.items()) if i not in dropped] + added]
        stats_path = manifest.get("stats_path", "stats.json")
        if dropped or others or change.recompute_stats:
            from robocache.data.build.stats import _compute_stats
            from robocache.data.episode import StreamSpec

            specs = {n: StreamSpec(n, s["kind"], s["dtype"], tuple(s["shape"]))
                     for n, s in manifest["streams"].items()}
            stats = _compute_stats(path / "data.lance", specs) if episodes else {}
            stats_path = f"{V.VERSIONS_DIR}/{now + 1}.stats.json"
            _write_json(path / stats_path, stats)
            if change.recompute_stats and not (dropped or others):
                ops.append({"op": "recompute_stats"})
        splits = manifest.get("splits")
        if splits:  # deleted episodes leave the split they were in
            splits = {k: [i for i in v if i not in dropped] for k, v in splits.items()}
        if change.split is not None:
            splits = split_episodes([e["index"] for e in episodes], change.split, change.seed)
            ops.append({"op": "split", "val": change.split, "seed": change.seed})
        if splits and added:  # merged episodes join the training side
            splits = {**splits, "train": sorted(splits.get("train", [])
                                                + [e["index"] for e in added])}
        counts = {**manifest["counts"], "cached": len(episodes),
                  "rows": int(sum(e["rows"] for e in episodes))}
        new = {**{k: v for k, v in manifest.items() if k not in ("stats", "splits")},
               "version": now + 1, "tables": V.current_tables(location, manifest),
               "edit": {"at": _now(), "ops": ops}, "episodes": episodes, "counts": counts,
               "stats_path": stats_path, **({"splits": splits} if splits else {})}
        _write_json(path / V.VERSIONS_DIR / f"{now + 1}.json", new, indent=None)
        if _before_commit is not None:  # (tests: a kill just before the commit)
            _before_commit()
        _write_json(path / "manifest.json", new)  # the commit: this version is now current
    return new


#: The stream fields two caches must share to merge (their sources may differ).
SHARED_FIELDS = ("column", "kind", "dtype", "shape", "codec", "quality", "chroma")


def _other(loc, manifest: Mapping[str, Any], path: Path):
    """A cache to merge: its location and current manifest, checked against ``manifest``.

    Raises:
        DataError: not a complete local cache, another rate, other streams or table schemas.
    """
    from robocache.data.location import is_uri

    if is_uri(loc.uri) or loc.path is None:
        raise DataError(f"{loc}: merge local caches.")
    if loc.path == path:
        raise DataError(f"{loc} is the cache being edited; merge another cache.")
    other = loc.manifest()
    if other.get("status") != "complete":
        raise DataError(f"{loc} is not a complete cache; finish its ingest first.")
    if float(other["rate_hz"]) != float(manifest["rate_hz"]):
        raise DataError(f"{loc} is at {other['rate_hz']} Hz and {path} at "
                        f"{manifest['rate_hz']} Hz; merge caches of one rate (ingest with "
                        "--rate).")
    mine = {n: {k: s.get(k) for k in SHARED_FIELDS} for n, s in manifest["streams"].items()}
    theirs = {n: {k: s.get(k) for k in SHARED_FIELDS} for n, s in other["streams"].items()}
    if mine != theirs:
        diff = sorted(n for n in set(mine) | set(theirs) if mine.get(n) != theirs.get(n))
        raise DataError(f"{loc} does not share {path}'s schema (streams differing: {diff}); "
                        "merge caches with the same streams, dtypes, shapes and codecs.")
    for rel in V.table_names(manifest):  # the tables themselves, column by column
        try:
            ours, theirs_table = V.open_table(_loc(path), manifest, rel), loc.lance(rel)
        except FileNotFoundError:
            continue
        if ours.schema != theirs_table.schema:
            raise DataError(f"{loc}: its {rel} has another schema than {path}'s; merge caches "
                            "of one schema.")
    return loc, other


def _loc(path: Path):
    from robocache.data.location import Location

    return Location(path)


def _append(location, rel: str, source, renumber: Mapping[int, int]) -> None:
    """Append the rows of ``source`` (another cache's table ``rel``, same schema) to this
    cache's, their ``episode_index`` renumbered, a batch at a time."""
    import lance
    import pyarrow as pa

    keys = np.array(sorted(renumber), np.int64)
    values = np.array([renumber[int(k)] for k in keys], np.int64)
    schema = source.schema
    at = schema.get_field_index("episode_index")

    def batches():
        for batch in source.to_batches(batch_size=1 << 14):
            pos = np.searchsorted(keys, batch.column(at).to_numpy())
            new = pa.array(values[np.minimum(pos, len(keys) - 1)], pa.int64())
            yield pa.RecordBatch.from_arrays(
                [new if i == at else batch.column(i) for i in range(batch.num_columns)],
                schema=schema)

    lance.write_dataset(pa.RecordBatchReader.from_batches(schema, batches()),
                        location.child(rel), mode="append")


def _check(change: Edit) -> None:
    if change.delete is not None and change.keep is not None:
        raise DataError("pass episodes to delete or episodes to keep, not both.")
    if change.split is not None and not (isinstance(change.split, (int, float))
                                         and 0 < change.split < 1):
        raise DataError(f"`split` is the validation fraction, in (0, 1); got {change.split!r}.")
    bad = [k for k, v in change.rename_tasks.items()
           if not (isinstance(k, str) and isinstance(v, str))]
    if bad:
        raise DataError(f"task renames must map strings to strings; got {bad[:3]}.")


def _dropped(change: Edit, rows: Mapping[int, Any], path: Path) -> set[int]:
    named = change.delete if change.delete is not None else change.keep
    if named is None:
        return set()
    named = {int(e) for e in named}
    missing = sorted(named - set(rows))
    if missing:
        raise DataError(f"episodes {missing[:10]}{'...' if len(missing) > 10 else ''} are not "
                        f"in {path} ({len(rows)} cached); name cached episodes.")
    dropped = named if change.delete is not None else set(rows) - named
    if dropped and dropped == set(rows) and not change.force:
        raise DataError(f"this edit would delete every episode of {path} ({len(rows)}); pass "
                        "--force (force=True) to do so.")
    return dropped


def _pin(location, manifest: dict[str, Any], path: Path, log) -> dict[str, Any]:
    """The current manifest with its tables pinned, saved as its version's file; tables an
    interrupted edit left ahead of the pins restored to them first."""
    from robocache.data.build.manifest import _write_json

    changed = "tables" not in manifest
    if changed:  # the cache as built: version 1, its tables pinned now
        manifest = {**manifest, "version": V.number(manifest),
                    "tables": V.current_tables(location, manifest)}
    for rel, version in manifest["tables"].items():
        latest = location.lance(rel)
        if latest.version != version:  # an edit killed after its table commits
            location.lance(rel, version).restore()
            log(f"{rel}: restored to Lance version {version} (an interrupted edit had "
                f"committed {latest.version})")
            changed = True
    if changed:  # restores made new Lance versions with the pinned rows: pin those
        manifest = {**manifest, "tables": V.current_tables(location, manifest)}
        _write_json(path / "manifest.json", manifest)
    (path / V.VERSIONS_DIR).mkdir(exist_ok=True)
    _write_json(path / V.VERSIONS_DIR / f"{V.number(manifest)}.json", manifest, indent=None)
    return manifest


def split_episodes(episodes: Iterable[int], fraction: float, seed: int) -> dict[str, list[int]]:
    """Episodes split into ``train`` and ``val`` (``round(fraction * n)`` of them, at least
    one when there are two or more), drawn with ``seed``; each list sorted."""
    ids = np.array(sorted(int(e) for e in episodes), np.int64)
    n_val = int(round(fraction * len(ids)))
    if len(ids) >= 2:
        n_val = min(max(n_val, 1), len(ids) - 1)
    order = np.random.default_rng(seed).permutation(len(ids))
    val = np.sort(ids[order[:n_val]])
    train = np.sort(ids[order[n_val:]])
    return {"train": train.tolist(), "val": val.tolist()}


def describe(manifest: Mapping[str, Any]) -> str:
    """One line about the version ``manifest`` is."""
    ops = (manifest.get("edit") or {}).get("ops", [])
    what = "; ".join(_op(o) for o in ops) or "as built"
    return (f"version {V.number(manifest)}: {manifest['counts']['cached']} episodes, "
            f"{manifest['counts']['rows']:,} steps ({what})")


def _op(o: Mapping[str, Any]) -> str:
    if o["op"] == "delete":
        e = o["episodes"]
        return f"deleted {len(e)} episodes ({', '.join(map(str, e[:5]))}" + \
            (", ...)" if len(e) > 5 else ")")
    if o["op"] == "rename_tasks":
        return "renamed tasks " + ", ".join(f"{k!r} -> {v!r}" for k, v in o["tasks"].items())
    if o["op"] == "merge":
        return f"merged {len(o['episodes'])} episodes of {o['cache']} (version {o['version']})"
    if o["op"] == "split":
        return f"split {o['val']:g} of the episodes into val (seed {o['seed']})"
    return "statistics computed again"


__all__ = ["Edit", "describe", "edit", "parse_episodes", "split_episodes"]
