"""The source a cache was built from, as it was: so an edited source is never served stale.

At ingest the manifest records every source file's identity (``source_files``: relative path
-> size, modification time in ns and a BLAKE2b digest: of the whole file up to
:data:`WHOLE_BYTES`, of its first and last MiB and its size above), each cached episode's
digest (``episode_digests``: SHA-256 of its streams' timestamps and values as the reader
returned them, video streams by file and offset, its tasks; earlier caches' BLAKE2b digests
are still compared as such) and, for readers that can tell, the files each
episode is read from (``episode_files``).

A re-run of ingest compares: a file whose size changed, or whose modification time changed and
whose digest differs (or covers only its ends), has changed. The cached episodes read from a
changed file, or every cached episode when a changed file belongs to no episode in particular
(metadata), are read again and their digests compared, so a touched file or an appended episode
costs a read and nothing else. Episodes whose data did change are refused with one line naming
them, or rebuilt with ``rebuild_changed`` (``--rebuild-changed``); quarantined episodes read
from a changed file are read again (the file may have been repaired). Opening a cache whose
source is reachable and has changed warns once (files are compared by size and time, and by
digest when those differ).

Caches built before identities were recorded are not checked.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import operator
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from robocache.errors import DataError

WHOLE_BYTES = 8 << 20  # files up to this size are hashed whole
ENDS = 1 << 20  # larger ones: their first and last MiB

_WARNED: set[str] = set()


def _digest(path: Path, size: int) -> tuple[str, bool]:
    """(BLAKE2b hex, whether the whole file was hashed)."""
    h = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as f:
        if size <= WHOLE_BYTES:
            h.update(f.read())
            return h.hexdigest(), True
        h.update(f.read(ENDS))
        f.seek(size - ENDS)
        h.update(f.read(ENDS))
    h.update(str(size).encode())
    return h.hexdigest(), False


def _file_digest(path: Path) -> str:
    """:func:`_digest` of a file, computed once per (path, size, modification time); ``""``
    for a file that cannot be read (the decoder that needs it says why)."""
    try:
        st = path.stat()
        return _cached_digest(str(path), st.st_size, st.st_mtime_ns)
    except OSError:
        return ""


@functools.lru_cache(maxsize=4096)
def _cached_digest(path: str, size: int, mtime_ns: int) -> str:
    return _digest(Path(path), size)[0]


def _files(root: Path) -> list[Path]:
    """The source's files (``root`` itself when a file), hidden ones (``.cache/``...) aside."""
    if root.is_file():
        return [root]
    return sorted(p for p in root.rglob("*") if p.is_file()
                  and not any(part.startswith(".") for part in p.relative_to(root).parts))


def _rel(root: Path, path: Path) -> str:
    return path.name if root.is_file() else path.relative_to(root).as_posix()


def identify(root: Path, known: dict[str, dict] | None = None) -> dict[str, dict]:
    """Every source file's identity (see the module docstring); a file whose size and time
    match ``known`` keeps its recorded digest instead of being read."""
    known = known or {}
    out = {}
    for p in _files(root):
        st = p.stat()
        rel = _rel(root, p)
        old = known.get(rel)
        if old and old["size"] == st.st_size and old["mtime_ns"] == st.st_mtime_ns:
            out[rel] = old
            continue
        digest, whole = _digest(p, st.st_size)
        out[rel] = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "digest": digest,
                    "whole": whole}
    return out


def changed_files(old: dict[str, dict], now: dict[str, dict]) -> list[str]:
    """Files added, removed or changed between two :func:`identify` results."""
    out = []
    for rel in sorted(set(old) | set(now)):
        a, b = old.get(rel), now.get(rel)
        if a is None or b is None or a["size"] != b["size"] or (
                a["mtime_ns"] != b["mtime_ns"] and (a["digest"] != b["digest"] or not b["whole"])):
            out.append(rel)
    return out


# An episode's digest: SHA-256 (128 bits of it, prefixed), hashed by OpenSSL at 1.8 GB/s on
# the 2-core VM against 0.74 for BLAKE2b, which took 0.24 of a 0.51 ms episode read there. A
# digest without the prefix is BLAKE2b-128, as caches before it recorded them.
DIGEST = "sha256"


def episode_digest(episode, algorithm: str = DIGEST) -> str:
    """A digest of an episode as its reader returned it (before video decoding):
    ``"sha256:<32 hex digits>"``, or with ``algorithm="blake2b"`` the unprefixed BLAKE2b-128
    of earlier caches."""
    h = hashlib.blake2b(digest_size=16) if algorithm == "blake2b" else hashlib.sha256()
    for name in sorted(episode.streams):
        s = episode.streams[name]
        h.update(name.encode())
        h.update(_raw(s.times))
        if s.data is not None:
            data = np.asarray(s.data)
            h.update(_dtype_text(data.dtype) + str(data.shape).encode())
            if data.dtype == object:  # strings (events) or encoded frames (bytes)
                for v in data.reshape(-1):
                    h.update(v if isinstance(v, bytes) else repr(v).encode())
            else:
                h.update(_raw(data))
        if getattr(s, "video", None) is not None:  # its frames are the file's: its content
            h.update(f"{s.video.path}@{s.video.from_timestamp!r}".encode())
            h.update(_file_digest(Path(s.video.path)).encode())
    h.update(repr(episode.meta.get("tasks")).encode())
    frames = episode.meta.get("frame_tasks")
    if frames is not None:
        h.update(_raw(frames[0]))
        h.update(_list_repr(frames[1]))
    return h.hexdigest() if algorithm == "blake2b" else f"{algorithm}:{h.hexdigest()[:32]}"


def same_digest(recorded: str | None, episode) -> bool:
    """Whether ``episode`` has the digest a cache ``recorded`` for it (in that digest's
    algorithm: an unprefixed one is an earlier cache's BLAKE2b)."""
    if recorded is None:
        return False
    algorithm = recorded.split(":", 1)[0] if ":" in recorded else "blake2b"
    return recorded == episode_digest(episode, algorithm)


def _list_repr(values) -> bytes:
    """``repr(list(values)).encode()``; when every value is one object (an episode's per-frame
    task names usually are), made from its one repr: 45 instead of 85 µs for an episode of
    1,562 frames (benchmarks/results/digest-task-names-cpu-vm-2026-11-27.txt)."""
    items = list(values)
    if items and all(map(operator.is_, items, itertools.repeat(items[0]))):
        return ("[" + ", ".join([repr(items[0])] * len(items)) + "]").encode()
    return repr(items).encode()


def _raw(a: np.ndarray) -> np.ndarray:
    """An array's bytes as ``tobytes()`` gives them, without the copy (any dtype but object)."""
    return np.ascontiguousarray(a).reshape(-1).view(np.uint8)


@functools.lru_cache(maxsize=64)
def _dtype_text(dtype: np.dtype) -> bytes:
    return str(dtype).encode()


def episode_files(src, indices) -> dict[str, list[str]]:
    """The files each episode is read from, for readers that say (``src.files(index)``)."""
    if not hasattr(src, "files"):
        return {}
    root, out, rels = Path(src.path), {}, {}
    for i in indices:
        try:
            files = [str(p) for p in src.files(i)]
        except Exception:  # unlisted metadata: any changed file is then taken to be its
            continue
        for f in files:  # a file of many episodes made relative once
            if f not in rels:
                rels[f] = _rel(root, Path(f))
        out[str(i)] = sorted(rels[f] for f in files)
    return out


def _suspects(manifest: dict[str, Any], changed: list[str], indices) -> dict[int, str]:
    """Episode -> the changed file it may depend on (every episode for a shared file)."""
    own = manifest.get("episode_files") or {}
    claimed = {f for files in own.values() for f in files}
    shared = [f for f in changed if f not in claimed or not own]
    out = {}
    for i in indices:
        mine = [f for f in own.get(str(i), []) if f in changed]
        if mine or shared:
            out[int(i)] = (mine or shared)[0]
    return out


def check(src, dest: Path, old: dict[str, Any] | None, header: dict[str, Any],
          cached: set[int], *, rebuild: bool) -> tuple[list[int], list[int]]:
    """Compare the source with the one the cache at ``dest`` (manifest ``old``, ``None``
    when new or overwritten; ``cached``: the episodes its tables hold) was built from; record
    the source's identity in ``header``.

    Returns:
        ``(cached episodes to rebuild, quarantined episodes to read again)``.

    Raises:
        DataError: cached episodes changed and ``rebuild`` is off (one line naming them and the
            changed file, with the fix).
    """
    known = (old or {}).get("source_files")
    header["source_files"] = identify(Path(src.path), known)
    header["episode_files"] = episode_files(src, src.episode_indices())
    digests = dict((old or {}).get("episode_digests") or {})
    header["episode_digests"] = digests
    if known is None:
        return [], []
    changed = changed_files(known, header["source_files"])
    if not changed:
        return [], []
    quarantined = [q["index"] for q in old.get("quarantined", [])]
    present = set(src.episode_indices())
    stale = {}
    for i, why in _suspects(old, changed, sorted(cached)).items():
        try:
            same = i in present and same_digest(digests.get(str(i)), src.read(i))
        except Exception:  # an unreadable episode has changed (the rebuild quarantines it)
            same = False
        if not same:
            stale[i] = why
            digests.pop(str(i), None)
    retry = sorted(_suspects(old, changed, quarantined))
    if stale and not rebuild:
        shown = ", ".join(map(str, sorted(stale)[:8])) + (" ..." if len(stale) > 8 else "")
        raise DataError(f"the source changed since {dest} was built: {len(stale)} cached "
                        f"episodes differ ({shown}; e.g. {next(iter(stale.values()))} changed);"
                        " pass --rebuild-changed (rebuild_changed=True) to rebuild them, or "
                        "--overwrite to rebuild the cache.")
    return sorted(stale), retry


def merged(manifests: list[dict[str, Any]]) -> dict[str, Any]:
    """The source identity of shard caches joined into one: their records united when every
    shard saw the same source files, else none (the joined cache is then not checked)."""
    files = [m.get("source_files") for m in manifests]
    if not files[0] or any(f != files[0] for f in files):
        return {}
    return {"source_files": files[0],
            **{key: {k: v for m in manifests for k, v in (m.get(key) or {}).items()}
               for key in ("episode_files", "episode_digests")}}


def drop(dest: Path, indices: list[int]) -> None:
    """Delete episodes ``indices`` from every table of the cache at ``dest`` (with the lock
    held), so the build caches them again; readers then have no complete version to serve until
    it is done (:func:`robocache.data.snapshot.forget`)."""
    import lance

    from robocache.data.snapshot import forget

    if not indices:
        return
    forget(dest)
    where = f"episode_index IN ({', '.join(map(str, indices))})"
    from robocache.data.build.commit import _committed

    for uri in [dest / "data.lance", *sorted((dest / "frames").glob("*.lance"))]:
        if _committed(uri):
            lance.dataset(str(uri)).delete(where)


def changed_since(manifest: dict[str, Any]) -> list[str]:
    """The source files changed since the cache of ``manifest`` was built; none when its
    source is unreachable or its identity was not recorded."""
    known = manifest.get("source_files")
    root = Path(manifest.get("source", {}).get("path", ""))
    if not known or not root.exists():
        return []
    return changed_files(known, identify(root, known))


def warn_if_changed(path: str | Path, manifest: dict[str, Any]) -> None:
    """Warn (once per cache and process) when the source of the cache at ``path`` is
    reachable and has changed since it was built."""
    if str(path) in _WARNED:
        return
    changed = changed_since(manifest)
    if not changed:
        return
    root = manifest["source"]["path"]
    _WARNED.add(str(path))
    eps = sorted(_suspects(manifest, changed, [e["index"] for e in manifest["episodes"]]))
    more = " ..." if len(eps) > 8 else ""
    warnings.warn(f"{path} was built from {root}, which has changed since ({len(changed)} "
                  f"files, e.g. {changed[0]}): episodes {eps[:8]}{more} may be stale; re-run "
                  "`robocache ingest` with --rebuild-changed (LeRobotDataset: "
                  "force_cache_sync=True).", stacklevel=3)
