"""Stage 5, commit: add written Lance files to the cache's tables, and read back what is
committed.
"""

from __future__ import annotations

import datetime as _dt
import re
from pathlib import Path
from typing import Any

import numpy as np

from robocache._optional import require

# Old versions are removed every CLEANUP_COMMITS commits of a table: each version's manifest
# lists every fragment, so keeping them all made the transient disk of a build grow with the
# square of its commits.
CLEANUP_COMMITS = 8
# A build compacts the fragments it wrote below its batch size once a table holds this many
# (time-bounded flushes and the last batch of each run leave such fragments).
COMPACT_FRAGMENTS = 32


def commit(dest: Path, episodes: list[int], written: list[tuple[str, Any, list]]) -> None:
    """Add the fragments of :func:`~robocache.data.build.write.write_episode` or
    :meth:`~robocache.data.build.write.Batch.write` (for ``episodes``) to the cache, one Lance
    ``Append`` commit per table, rows (``data.lance``) last: an episode is cached once its rows
    are. Camera frames committed without their rows (a writer killed between the two commits)
    are dropped by :func:`drop_orphan_frames` before a build resumes, so nothing is ever
    duplicated and the normal path deletes nothing."""
    lance = require("lance", "data", "The Lance cache", "pylance")

    for rel, schema, fragments in written:
        uri = str(dest / rel)
        if not _committed(dest / rel):
            lance.LanceDataset.commit(uri, lance.LanceOperation.Overwrite(schema, fragments))
            continue
        lance.LanceDataset.commit(uri, lance.LanceOperation.Append(fragments),
                                  read_version=lance.dataset(uri).version)


def drop_orphan_frames(dest: Path) -> dict[str, list[int]]:
    """Delete the camera frames of episodes whose rows ``data.lance`` lacks (a writer killed
    between a batch's frames commit and its rows commit left them); one delete per table, only
    when there are any. Returns table path -> the episodes dropped."""
    lance = require("lance", "data", "The Lance cache", "pylance")

    done = _done_episodes(dest / "data.lance")
    dropped = {}
    for uri in sorted((dest / "frames").glob("*.lance")) if (dest / "frames").is_dir() else []:
        if not _committed(uri):
            continue
        have = _done_episodes(uri)
        orphans = sorted(have - done)
        if orphans:
            lance.dataset(str(uri)).delete(f"episode_index IN ({', '.join(map(str, orphans))})")
            dropped[f"frames/{uri.name}"] = orphans
    return dropped


def fragment_ids(uri: Path) -> set[int]:
    """The fragment ids of the Lance dataset at ``uri`` (empty when none is committed)."""
    lance = require("lance", "data", "The Lance cache", "pylance")

    if not _committed(uri):
        return set()
    return {f.fragment_id for f in lance.dataset(str(uri)).get_fragments()}


class Committer:
    """Commits one build's batches (:func:`commit`) and keeps the cache's disk near its data.

    Every :data:`CLEANUP_COMMITS` commits of a table its old versions are removed. The
    fragments this build wrote below an eighth of a batch (``target_rows``, ``target_bytes``)
    are compacted (rewritten as fewer) once a
    table holds :data:`COMPACT_FRAGMENTS` of them, and at :meth:`close`.

    What a reader holding an older version keeps: commits only append, so the data files of
    every version stay in the latest one, and removing an old version removes its manifest
    only (a reader that opened it reads on). Compaction rewrites only fragments committed by
    this build. A reader of a cache being built serves its last complete version
    (:mod:`robocache.data.snapshot`), whose fragments all predate this build: they are never
    rewritten or deleted by it. Such a reader scans the latest version, this build's fragments
    included, and filters their rows out: one whose scan overlaps a compaction of them and
    the removal of old versions can find a file of theirs gone; it then reads the table again
    at the newer version (:func:`robocache.data.served.open_served`).

    Args:
        dest: the cache directory.
        target_rows, target_bytes: the batch's budget; a fragment below an eighth of its rows
            and of its bytes is small (larger ones are left as they are: rewriting them would
            need their size again in transient disk).
    """

    def __init__(self, dest: Path, target_rows: int, target_bytes: int):
        self.dest, self.target_rows, self.target_bytes = dest, target_rows // 8, target_bytes // 8
        self.before: dict[str, set[int]] = {}  # table -> fragment ids when the build began
        self.commits: dict[str, int] = {}

    def __call__(self, episodes: list[int], written: list[tuple[str, Any, list]]) -> None:
        for rel, _, _ in written:
            if rel not in self.before:
                self.before[rel] = fragment_ids(self.dest / rel)
        commit(self.dest, episodes, written)
        for rel, _, _ in written:
            self.commits[rel] = self.commits.get(rel, 0) + 1
            if self.commits[rel] % CLEANUP_COMMITS == 0:
                self.tidy(rel, COMPACT_FRAGMENTS)

    def tidy(self, rel: str, compact_at: int) -> None:
        """Compact this build's small fragments of table ``rel`` (below the batch's rows and
        bytes) into one, once there are ``compact_at`` of them; then remove old versions."""
        lance = require("lance", "data", "The Lance cache", "pylance")

        from robocache.data.build.write import write_files

        uri = self.dest / rel
        ds = lance.dataset(str(uri))
        small = [f for f in ds.get_fragments() if f.fragment_id not in self.before.get(rel, ())
                 and f.metadata.physical_rows < self.target_rows
                 and sum(d.file_size_bytes or 0 for d in f.metadata.files) < self.target_bytes]
        if len(small) >= max(compact_at, 2):
            table = ds.scanner(fragments=small, scan_in_order=True).to_table()
            new = write_files(table, uri)
            group = lance.LanceOperation.RewriteGroup([f.metadata for f in small], new)
            lance.LanceDataset.commit(str(uri), lance.LanceOperation.Rewrite([group], []),
                                      read_version=ds.version)
            ds = lance.dataset(str(uri))
        ds.cleanup_old_versions(older_than=_dt.timedelta(0))

    def close(self) -> None:
        """The end of the build: compact what it left small, remove old versions."""
        for rel in self.commits:
            self.tidy(rel, 2)


# a committed version's manifest (Lance's names: ``<n>.manifest``, n decimal)
_VERSION = re.compile(r"\d+\.manifest")


def _committed(uri: Path) -> bool:
    """Whether a Lance dataset has a version at ``uri``: a ``_versions/<n>.manifest``.
    Uncommitted files may precede one, and a first commit that was killed or ran out of disk
    may leave ``_versions`` without any (or with only its temporary file)."""
    try:
        return any(_VERSION.fullmatch(p.name) for p in (uri / "_versions").iterdir())
    except (FileNotFoundError, NotADirectoryError):
        return False


def _done_episodes(uri: Path) -> set[int]:
    lance = require("lance", "data", "The Lance cache", "pylance")

    if not _committed(uri):
        return set()
    table = lance.dataset(str(uri)).to_table(columns=["episode_index"])
    return set(np.unique(table.column(0).to_numpy()).tolist())
