"""Orchestration: lock and claim the destination, stream the episodes through the stages
(read → align → encode → write → commit), keep the quarantine, finish the manifest.
"""

from __future__ import annotations

import datetime as _dt
import logging
import re
import time
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any

from robocache._forkserver import start_worker_server
from robocache._optional import require
from robocache.data import jpeg, source_identity
from robocache.data.build.align import align_batch, check_rate
from robocache.data.build.commit import (
    Committer,
    _committed,
    _done_episodes,
    drop_orphan_frames,
)
from robocache.data.build.config import (
    SPARSE_FRACTION,
    CacheConfig,
    _device,
    column_name,
    decode_workers,
    default_method,
    sparse,
    validate,
)
from robocache.data.build.encode import _camera_entry, auto_codecs, resumed_codecs
from robocache.data.build.manifest import (
    CACHE_FORMAT,
    _check_dest,
    _claim,
    _write_json,
    read_manifest,
)
from robocache.data.build.read import (
    Prepared,
    decoded_videos,
    native_rate,
    open_specs,
    preparation,
    prepared,
    video_frames,
)
from robocache.data.build.stats import Tally, _compute_stats, _episode_summary
from robocache.data.build.write import Batch, episode_tables
from robocache.data.episode import Source, StreamSpec
from robocache.data.lock import CacheLock
from robocache.data.publish import Target
from robocache.data.snapshot import kept
from robocache.observability import metrics


@contextmanager
def locked_run(source: str | Path | Source, dest: str | Path, config: CacheConfig | None = None,
               *, log: Callable[[str], None] | None = None, **overrides: Any) -> Iterator[Run]:
    """Validate the options, open the source, lock and claim ``dest``: the first half of
    :func:`build`, shared by the drivers that build the same cache another way (Ray). Yields
    the :class:`Run`; the lock is held until the block exits."""
    # every option checked before anything is opened or created (config.validate)
    config = validate(CacheConfig(**{**asdict(config or CacheConfig()), **overrides}))
    native = config.rate_hz == "native"
    device = _device(config.device)
    src, specs = open_specs(source, config)
    config = auto_codecs(src, specs, config, log)
    if not config.overwrite:
        config = resumed_codecs(read_manifest(Path(dest)), specs, config, log)
    if not hasattr(source, "read") and preparation(
            config, len(src.episode_indices()), decoded_videos(specs, config)) != "threads":
        start_worker_server()  # the workers' (or the GPU lanes') fork server
    fps = native_rate(src) if native else None
    if not native:
        check_rate(float(config.rate_hz), specs)
    dest = Path(dest)
    grid = fps or float(config.rate_hz)
    held = [n for n, s in specs.items() if sparse(s, grid) and n not in config.methods]
    if held:
        (log or logging.getLogger(__name__).warning)(
            f"held between their messages (sparse: below {SPARSE_FRACTION:.0%} of the "
            f"{grid:g} Hz grid): {', '.join(held)}; each episode spans its other streams.")
    streams = {name: {"column": column_name(name), "kind": s.kind, "dtype": s.dtype,
                      "shape": list(s.shape), "dim": s.dim, "source_rate_hz": s.rate_hz,
                      "method": config.methods.get(name, default_method(s, grid)),
                      **({"encoding": s.encoding} if s.encoding else {}),
                      **_camera_entry(s, config, name)}
               for name, s in specs.items()}
    if any(s.get("quality") is not None for s in streams.values()):
        jpeg.require_encoder()  # before any episode: a missing encoder quarantines none
    header = {"format": CACHE_FORMAT,
              "source": {"path": str(Path(src.path).resolve()), "format": src.format},
              "rate_hz": fps or float(config.rate_hz), "native": native, "streams": streams,
              "tolerance_s": config.tolerance_s}
    if config.shard is not None:
        header["shard"] = list(config.shard)
    _check_dest(Path(src.path), dest)
    dest.mkdir(parents=True, exist_ok=True)
    with CacheLock(dest, wait=config.wait):
        _check_dest(Path(src.path), dest)  # again: another writer may have changed it
        # the source's identity now; episodes whose source data changed (robocache.data.
        # source_identity): refused, or dropped to be cached again
        stale, retry = source_identity.check(
            src, dest, None if config.overwrite else read_manifest(dest), header,
            _done_episodes(dest / "data.lance"), rebuild=config.rebuild_changed)
        carried = [q for q in _claim(dest, header, config.overwrite,
                                     log or logging.getLogger(__name__).warning)
                   if q["index"] not in retry]
        source_identity.drop(dest, stale)
        yield Run(src, specs, config, device, dest, header, carried,
                  None if hasattr(source, "read") else str(source))


def _reason(src: Source, index: int, e: BaseException) -> str:
    """A quarantine reason: where in the source (file, rows; when the reader can tell) and the
    exception text."""
    try:
        where = src.locate(index) if hasattr(src, "locate") else None
    except Exception:  # locating is a courtesy; the reason stands without it
        where = None
    text = " ".join(f"{type(e).__name__}: {e}".split())  # one line (parquet's span lines)
    text = re.sub(r"np\.(?:float|u?int|bool)\w*\(([^()]*)\)", r"\1", text)  # numpy's repr
    return f"{where}: {text}" if where and where not in str(e) else text


# Episodes aligned together (one robocache.align launch) on the writing thread.
ALIGN_EPISODES = 64
# A batch is committed at the latest this many seconds after its first episode, so a killed
# build loses at most that much work, however slowly the source reads.
COMMIT_SECONDS = 30.0
# What a build reports its progress to instead of a bar: (description, episodes finished).
Progress = Callable[[str, int], None]


class Run:
    """One locked build of ``dest`` (from :func:`locked_run`): the episodes to do and the
    bookkeeping every driver shares (quarantine kept in the manifest as it grows, commits,
    the final manifest).

    Attributes:
        src, specs, config, device, dest, header: the source, streams, options, alignment
            device, cache directory and the manifest fields that identify the cache.
        wanted: the source episodes this build covers (after ``episodes`` and ``shard``).
        done: those already cached; quarantine: index -> entry (carried from earlier runs).
    """

    def __init__(self, src: Source, specs: dict[str, StreamSpec], config: CacheConfig, device,
                 dest: Path, header: dict[str, Any], carried: list[dict[str, Any]],
                 path: str | None = None):
        self.src, self.specs, self.config, self.device = src, specs, config, device
        self.path = path  # the source as a path worker processes can open, when it is one
        self.dest, self.header = dest, header
        self.fps = header["rate_hz"] if header["native"] else None  # align_episode's grid
        wanted = list(dict.fromkeys(config.episodes if config.episodes is not None
                                    else src.episode_indices()))
        if config.shard is not None:
            wanted = wanted[config.shard[0]::config.shard[1]]
        self.wanted = wanted
        self.done = _done_episodes(dest / "data.lance")
        self.quarantine = {int(q["index"]): q for q in carried}
        self.new, self.t0 = 0, time.perf_counter()
        self.obs = metrics.ingest(src, len(wanted))  # metrics and log events per episode
        # NVDEC decodes on the alignment GPU (the first one when alignment runs on the CPU)
        self.gpu = (device.index or 0) if getattr(device, "type", None) == "cuda" else 0
        self.video_frames: dict[str, int] = {}  # frames decoded this run, by decoder
        # episodes are written and committed in batches (many per Lance fragment)
        self.batch = Batch(config.batch_rows, config.batch_bytes)
        self.committer = Committer(dest, config.batch_rows, config.batch_bytes)
        self.sizes: dict[int, dict[str, int]] = {}  # batched episodes' sizes, for the metrics
        self.files: list[tuple[list[int], list, Tally | None]] = []  # by workers, uncommitted
        # the summary and statistics of the rows committed, while they are the whole cache
        # (it held none when the run began and every commit came with its writers' tallies)
        self.tally: Tally | None = None if self.done else Tally()
        self.since = time.perf_counter()
        # frames a killed writer committed without their rows: dropped before anything else
        drop_orphan_frames(dest)

    def skip(self, index: int) -> str | None:
        """Why episode ``index`` is not read again (``"cached"``, ``"quarantined before"``)."""
        if index in self.done:
            return "cached"
        if index in self.quarantine and not self.config.retry_quarantined:
            return "quarantined before"
        return None

    @property
    def todo(self) -> list[int]:
        return [i for i in self.wanted if self.skip(i) is None]

    def passed(self, index: int, why: str) -> None:
        """Episode ``index`` is not read again, for ``why`` (from :meth:`skip`)."""
        if why == "cached":
            self.obs.skipped(index)
        else:
            self.obs.quarantined(index, None)

    def quarantined(self, index: int, reason: str, error: BaseException) -> None:
        self.quarantine[int(index)] = {"index": int(index), "reason": reason}
        self._write_running()
        self.obs.quarantined(index, error)

    def add(self, index: int, tables: list[tuple[str, Any]], sizes: dict[str, int]) -> bool:
        """Add an aligned episode's :func:`~robocache.data.build.write.episode_tables` (and
        its :func:`~robocache.observability.metrics.episode_sizes`) to the batch; write and
        commit the batch when it is full or :data:`COMMIT_SECONDS` old. Returns whether it
        committed."""
        if not self.batch:
            self.since = time.perf_counter()
        self.batch.add(index, tables)
        self.sizes[int(index)] = sizes
        if self.batch.full() or time.perf_counter() - self.since > COMMIT_SECONDS:
            self.flush()
            return True
        return False

    def add_files(self, indices: list[int], written: list[tuple[str, Any, list]],
                  tally: Tally | None) -> None:
        """Add files a worker wrote for episodes ``indices`` (uncommitted) and their rows'
        tally; commit those gathered so far once their rows reach ``batch_rows`` or the first
        is :data:`COMMIT_SECONDS` old."""
        if not self.files:
            self.since = time.perf_counter()
        self.files.append((indices, written, tally))
        rows = sum(f.physical_rows or 0 for _, w, _ in self.files for rel, _, frags in w
                   if rel == "data.lance" for f in frags)
        if rows >= self.config.batch_rows or time.perf_counter() - self.since > COMMIT_SECONDS:
            self.flush()

    def flush(self) -> None:
        """Write the batch's episodes (one Lance write per table) and commit them, and commit
        the files workers wrote."""
        if self.batch:
            indices = list(self.batch.indices)
            self.cached(indices, self.batch.write(self.dest))
        if self.files:
            tables: dict[str, tuple[Any, list]] = {}
            for _, written, _ in self.files:
                for rel, schema, fragments in written:
                    tables.setdefault(rel, (schema, []))[1].extend(fragments)
            indices = [i for batch, _, _ in self.files for i in batch]
            tallies = [tally for _, _, tally in self.files]
            self.files = []
            self.cached(indices, [(rel, *t) for rel, t in tables.items()], tallies)

    def cached(self, indices: list[int], written: list[tuple[str, Any, list]],
               tallies: list[Tally | None] | None = None) -> None:
        """Commit files written for episodes ``indices`` (one Lance commit per table for all
        of them, see :class:`~robocache.data.build.commit.Committer`), with their rows'
        ``tallies`` when the writers made them."""
        self.committer(indices, written)
        if tallies is None or None in tallies:  # rows no tally counts: the end reads them
            self.tally = None
        for tally in tallies if self.tally is not None else ():
            self.tally.add(tally)
        retried = [i for i in indices if self.quarantine.pop(int(i), None) is not None]
        if retried:  # retried and now cached
            self._write_running()
        self.new += len(indices)
        for i in indices:
            sizes = self.sizes.pop(int(i), None)
            if sizes is not None:
                self.obs.cached_sizes(i, sizes)

    def decoded(self, frames: dict[str, int]) -> None:
        """Count a cached episode's video frames (decoder -> frames, see
        :func:`~robocache.data.build.read.video_frames`)."""
        for used, n in frames.items():
            self.video_frames[used] = self.video_frames.get(used, 0) + n

    def digested(self, digests: dict[int, str]) -> None:
        """Keep episodes' digests as read (index -> :attr:`~robocache.data.build.read.
        Prepared.digest`, see :func:`robocache.data.source_identity.episode_digest`) for the
        manifest."""
        self.header.setdefault("episode_digests", {}).update(
            {str(i): d for i, d in digests.items() if d is not None})

    def _write_running(self) -> None:
        _write_json(self.dest / "manifest.json", {**self.header, "status": "building",
                                                  "quarantined": list(self.quarantine.values()),
                                                  **kept(self.dest)})

    def finish(self, device: str | None = None) -> dict[str, Any]:
        """Commit the last batch, compact and tidy the tables, write stats and the complete
        manifest (see :func:`finish`)."""
        self.flush()
        self.committer.close()
        manifest = finish(self.dest, self.header, wanted=self.wanted, done=self.done,
                          quarantine=self.quarantine, new=self.new,
                          device=device or self.device, seconds=time.perf_counter() - self.t0,
                          specs=self.specs, timing=getattr(self.src, "timing", None),
                          episodes=self.tally and self.tally.summary(),
                          stats=self.tally and self.tally.stats(),
                          decode={"workers": decode_workers(self.config),
                                  "video_decoder": self.config.video_decoder,
                                  "video_frames": self.video_frames}, compact=False)
        self.obs.done(manifest)
        return manifest


def finish(dest: Path, header: dict[str, Any], *, wanted: list[int], done: set[int],
           quarantine: dict[int, dict[str, Any]], new: int, device: Any, seconds: float,
           timing: str | None, specs: dict[str, StreamSpec] | None = None,
           episodes: list[dict[str, Any]] | None = None, stats: dict[str, dict] | None = None,
           decode: dict[str, Any] | None = None, compact: bool = True) -> dict[str, Any]:
    """Write ``stats.json`` (computed over the rows for ``specs``, or ``stats`` as given) and
    the complete manifest (its ``episodes`` read from the rows, or as given; ``decode``: how
    this run decoded video, when given); returns the manifest. ``compact``: first compact
    ``data.lance`` whole and remove its old versions
    (for a cache no reader can hold yet, as a merge's; a build tidies its own fragments with
    :class:`~robocache.data.build.commit.Committer` instead)."""
    lance = require("lance", "data", "The Lance cache", "pylance")

    uri = dest / "data.lance"
    if compact and _committed(uri):
        ds = lance.dataset(str(uri))
        if len(ds.get_fragments()) > 1:
            ds.optimize.compact_files()
            ds.cleanup_old_versions(older_than=_dt.timedelta(0))
    if episodes is None:
        episodes = _episode_summary(uri) if _committed(uri) else []
    if stats is None:
        stats = _compute_stats(uri, specs) if _committed(uri) else {}
    _write_json(dest / "stats.json", stats, indent=None)
    cached_ids = {e["index"] for e in episodes}
    manifest = {
        **header,
        "status": "complete",
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "device": str(device),
        "timing": timing,
        "counts": {"read": len(wanted), "cached": sum(i in cached_ids for i in wanted),
                   "quarantined": sum(i in quarantine for i in wanted),
                   "skipped": len(done & set(wanted)), "new": new,
                   "rows": sum(e["rows"] for e in episodes)},
        "episodes": episodes,
        "quarantined": sorted(quarantine.values(), key=lambda q: q["index"]),
        "stats_path": "stats.json",
        "seconds": seconds,
        **({"decode": decode} if decode is not None else {}),
    }
    _write_json(dest / "manifest.json", manifest)
    return manifest


def build(source: str | Path | Source, dest: str | Path, config: CacheConfig | None = None, *,
          progress: bool | Progress = True, log: Callable[[str], None] | None = None,
          storage_options: dict[str, Any] | None = None, staging: str | Path | None = None,
          **overrides: Any) -> dict[str, Any]:
    """Ingest a dataset into a training cache at ``dest`` (see the module docstring).

    Args:
        source: a dataset path (format detected, see :func:`robocache.data.formats.open_source`)
            or an opened source.
        dest: cache directory (created; an existing cache of the same source resumes), or an
            object-store URI (``s3://bucket/prefix``, ``gs://``, ``az://``): the cache is built
            in the local ``staging`` directory, then published there
            (:mod:`robocache.data.publish`).
        storage_options: the object store's settings for a URI ``dest`` (Lance's names;
            credentials otherwise from the standard environment variables).
        staging: where a cache bound for a URI is built (default
            ``$ROBOCACHE_HOME/staging/<name>-<digest>``); kept, so that a later build of the
            same URI resumes or extends it there.
        config: options; keyword ``overrides`` replace its fields (``rate_hz=50.0``...).
        progress: show a rich progress bar on stderr; or a callable
            ``(description, episodes)``, called in this process as episodes finish (cached,
            skipped or quarantined), instead of the bar.
        log: where notices go (what ``overwrite`` removes); default: this module's logger.

    Returns:
        The manifest (also written to ``dest/manifest.json``): ``counts`` (read, cached,
        quarantined, skipped, rows), ``episodes``, ``quarantined`` (index + reason), ``streams``,
        ``stats_path``, ``seconds``; for a URI ``dest`` also ``uri``, ``staging`` and
        ``published`` (files and bytes copied, files already there).

    Raises:
        DataError: unknown format, a requested key the source lacks, a non-positive rate, a bad
            ``shard``, or ``dest`` holds another cache (different source, rate or streams) or
            other files, or a URI ``dest`` holds a cache the staging directory does not
            continue (without ``overwrite``), or the object store fails.
        CacheBusyError: another process is writing ``dest`` (and ``wait`` is off).
        FileNotFoundError: ``source`` does not exist.

    Example:
        >>> m = build("data/sample/panda_multirate", "/tmp/panda.cache", rate_hz=50)
        >>> c = m["counts"]; c["read"] == c["cached"] + c["quarantined"]
        True
    """
    target = Target(dest, storage_options, staging)
    target.prepare(bool(overrides.get("overwrite", (config or CacheConfig()).overwrite)),
                   log or logging.getLogger(__name__).warning)
    with locked_run(source, target.local, config, log=log, **overrides) as run:
        on_cpu = getattr(run.device, "type", None) == "cpu"
        group: list[Prepared] = []  # prepared episodes, in order, aligned together
        with _progress(progress, len(run.wanted)) as advance, closing(prepared(
                run.src, run.todo, run.specs, run.config, gpu=run.gpu, path=run.path,
                fps=run.fps, align=on_cpu, dest=run.dest,
                tally=run.tally is not None)) as ready:
            for index in run.wanted:
                why = run.skip(index)
                if why is not None:
                    run.passed(index, why)
                    advance(f"episode {index} ({why})")
                    continue
                # read, decoded, checked and encoded on a worker thread (or, in a worker
                # process, aligned and made into tables too), in order
                group.append(next(ready))
                if len(group) >= ALIGN_EPISODES:
                    _settle(run, group, advance)
            _settle(run, group, advance)
        manifest = run.finish()
    return target.publish(manifest)


def _settle(run: Run, group: list[Prepared], advance) -> None:
    """Align the episodes of ``group`` not aligned yet in one
    :func:`~robocache.data.build.align.align_batch`, then add each to the run's batch (or
    quarantine it with its reason), in order; empties ``group``."""
    todo = [p for p in group if p.error is None and p.tables is None and not p.written]
    t0 = time.perf_counter()
    for p, out in zip(todo, align_batch([p.episode for p in todo], run.specs, run.config,
                                        run.device, run.fps), strict=True):
        if isinstance(out, Exception):
            p.error = out
        else:
            p.tables = episode_tables(p.episode, out, run.specs, run.config, p.frames)
            p.sizes, p.decoded = metrics.episode_sizes(p.episode, out), video_frames(p.episode)
            p.episode = p.frames = None
    share = (time.perf_counter() - t0) / max(len(todo), 1)
    aligned = {id(p) for p in todo}
    for p in group:
        run.obs.start()
        for stage, seconds in p.seconds.items():
            run.obs.stage(stage, seconds)
        if id(p) in aligned:
            run.obs.stage("align", share)
        if p.error is not None:
            # a reader may fail in any way on a corrupt file (codecs raise their own types):
            # the episode is quarantined with the reason, the rest proceeds
            run.quarantined(p.index, _reason(run.src, p.index, p.error), p.error)
            advance(f"episode {p.index} quarantined")
            continue
        run.decoded(p.decoded)
        run.digested({p.index: p.digest})
        if p.written:  # a worker process wrote it; the chunk's last one carries the files
            run.sizes[p.index] = p.sizes
            if p.files is not None:
                run.add_files(*p.files)
        else:
            run.add(p.index, p.tables, p.sizes)
        advance(f"episode {p.index}")
    group.clear()


class _progress:
    """Context manager yielding ``advance(description, n=1)``: a rich bar when ``enabled`` is
    True, ``enabled`` itself when it is a callable (:data:`Progress`), else nothing."""

    def __init__(self, enabled: bool | Progress, total: int, label: str = "ingest"):
        self.enabled, self.total, self.label, self.bar = enabled, total, label, None

    def __enter__(self):
        if callable(self.enabled):
            return lambda desc, n=1: self.enabled(desc, n)
        if not self.enabled:
            return lambda _desc, n=1: None
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
        )

        self.bar = Progress(TextColumn(self.label), BarColumn(), MofNCompleteColumn(),
                            TimeRemainingColumn(), TextColumn("{task.description}"),
                            transient=False)
        self.bar.start()
        task = self.bar.add_task("", total=self.total)
        return lambda desc, n=1: self.bar.update(task, advance=n, description=desc)

    def __exit__(self, *exc):
        if self.bar is not None:
            self.bar.stop()
        return False
