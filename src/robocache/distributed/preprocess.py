"""``robocache preprocess``: the cache of ``robocache ingest``, built by a Ray Data pipeline.

    $ robocache preprocess data/sample/panda_multirate /tmp/panda.cache --rate 50
    $ robocache preprocess s3-mounted/droid /shared/droid.cache --address auto --num-gpus 8

Stages (one Ray Data dataset of episode indices, streamed in batches):

1. **read** (Ray tasks, one CPU each, as many at once as the cluster has CPUs; each worker
   process runs torch and Arrow on one thread,
   :func:`~robocache.data.build.read.single_core`): the format reader opens the source
   once per worker process and reads a group of consecutive episodes (:func:`read_groups`:
   those of one source file, so a LeRobot v3.0 file is decoded once for all of its
   episodes), checks them and encodes their camera frames
   (:func:`robocache.data.build.read.prepare_episode`).
2. **align + write** (an actor pool: one actor per GPU, or ``actors_per_gpu`` sharing each,
   or CPU actors when there is no GPU): ``ALIGN_EPISODES`` episodes aligned in one launch on
   the actor's device (:func:`~robocache.data.build.align.align_batch`), then tallied and
   written as one set of Lance files, uncommitted (:class:`~robocache.data.build.write.Batch`).
   Ray fuses the read into CPU actors (one operator: each actor reads, aligns and writes), so
   by default there is one CPU actor per CPU.
3. **commit** (the driver, as results stream in): the files of up to ``COMMIT_EPISODES``
   finished episodes in one Lance commit per table
   (:class:`~robocache.data.build.commit.Committer`), so a killed job leaves whole episodes
   only and the next run resumes at episode granularity (files a dead worker wrote, or an
   uncommitted group's, are never committed).

Bad episodes are quarantined with their reason exactly as by ``ingest``; the summary, the
quarantine list, the stats and the rows are the same (the row order inside ``data.lance`` is
the order episodes finished; readers sort by episode and step).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import pickle
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from robocache._optional import require
from robocache.data.build.align import align_batch
from robocache.data.build.config import CacheConfig, validate
from robocache.data.build.read import open_specs, prepare_episode, retain_heap, single_core
from robocache.data.build.run import Progress, _progress, _reason, locked_run
from robocache.data.build.stats import Tally
from robocache.data.build.write import Batch, episode_tables
from robocache.data.publish import Target
from robocache.errors import ClusterError, DataError, DeviceError
from robocache.observability import metrics

# The driver commits finished episodes in groups (a Lance commit costs ~10-20 ms whatever its
# size, so one per episode would cap a job near 60 episodes/s); a killed job loses at most the
# uncommitted group, whole episodes that the next run redoes.
COMMIT_EPISODES = 1024
COMMIT_SECONDS = 10.0
# Episodes per read task: at least READ_EPISODES, and up to FILE_EPISODES while they come
# from one source file (decoded once for them all: a 500-episode LeRobot v3.0 file of
# `bench preprocess` costs 0.3-0.5 s to decode, 10 ms an episode were a task to decode it for
# 32); per actor call ALIGN_EPISODES (aligned in one launch, written as one Lance fragment
# per table).
READ_EPISODES = 32
FILE_EPISODES = 1024
ALIGN_EPISODES = 256


def _ray():
    # the `data` part of Ray needs pandas: the extra has it
    require("ray.data", "ray", "robocache preprocess", "ray[data]")
    return require("ray", "ray", "robocache preprocess", "ray[data]")


def connect(address: str | None) -> None:
    """Join the Ray cluster at ``address`` (``auto``, ``host:port``, ``ray://host:port``), or
    start a local one (``None``); with Ray already initialized in this process, only checks
    that ``address`` answers.

    Raises:
        ClusterError: nothing answers at ``address``.
    """
    ray = _ray()
    if address not in (None, "auto", "local"):
        host, _, port = address.removeprefix("ray://").rpartition(":")
        try:
            socket.create_connection((host or "127.0.0.1", int(port)), timeout=5).close()
        except (OSError, ValueError) as e:
            raise ClusterError(f"no Ray cluster answers at --address {address!r} ({e}); pass "
                               "the head's host:port or ray://host:10001, or --address auto on "
                               "a cluster node, or leave it out to run locally.") from e
    if ray.is_initialized():
        return
    import signal
    import threading
    import warnings

    # A local Ray says its (secure) default of token authentication on every start: noise on
    # a one-line command (a warning that it is off still shows).
    logging.getLogger("ray._private.authentication.authentication_token_setup").addFilter(
        _quiet_auth)
    main = threading.current_thread() is threading.main_thread()
    sigterm = signal.getsignal(signal.SIGTERM) if main else None
    try:
        with warnings.catch_warnings():  # Ray starts its processes (fork + exec), not Lance
            warnings.filterwarnings("ignore", "lance is not fork-safe")
            ray.init(address=address, include_dashboard=False, logging_level="WARNING",
                     log_to_driver=False)
    except ConnectionError as e:
        raise ClusterError(f"no Ray cluster answers at --address {address!r} ({e}); start one "
                           "with `ray start --head` or leave --address out to run "
                           "locally.") from e
    finally:
        if sigterm is not None:
            # Ray's failure signal handler takes SIGTERM over (a 50-line stack, then abort):
            # SIGTERM stops this process as it did before, one line and exit 143 from the CLI
            signal.signal(signal.SIGTERM, sigterm)


#: What Ray's core worker logs (an "E" line on stderr, once per process) when it first creates
#: a restartable actor with a constructor argument in the object store.
RESTART_NOTE = "has constructor arguments in the object store and max_restarts > 0"
_restart_note_spent = False


class _Spender:
    """An actor created only to spend :data:`RESTART_NOTE` (see :func:`_spend_restart_note`)."""

    def __init__(self, arg: Any) -> None:
        pass


def _spend_restart_note(ray) -> None:
    """Spend Ray's once-per-process :data:`RESTART_NOTE` on an actor of ours, fd 2 caught in a
    file for that one call and everything else written there meanwhile written back.

    Ray Data passes every actor pool's actors its data context and transform through the
    object store and makes them restartable, so the first pool of each preprocess printed the
    line (ray-project/ray#57733), whatever the pool's own arguments: a note on Ray's restart
    of such actors (ray-project/ray#53727) that no argument of ours changes (Ray Data holds
    those objects for the pool's lifetime). The other ways were worse: Ray's C++ log level
    (RAY_BACKEND_LOG_LEVEL) hides its real errors and prints a line of its own, and
    ``max_restarts=0`` gives up the actors' restarts."""
    global _restart_note_spent
    import os
    import sys
    import tempfile

    if _restart_note_spent:
        return
    sys.stderr.flush()
    with tempfile.TemporaryFile() as caught:
        saved = os.dup(2)
        try:
            os.dup2(caught.fileno(), 2)
            actor = ray.remote(num_cpus=0, max_restarts=1)(_Spender).remote(ray.put(None))
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        caught.seek(0)
        rest = [line for line in caught.read().decode(errors="replace").splitlines(True)
                if RESTART_NOTE not in line]
    if rest:
        sys.stderr.write("".join(rest))
        sys.stderr.flush()
    ray.kill(actor)
    _restart_note_spent = True


def _quiet_auth(record: logging.LogRecord) -> bool:
    return "Token authentication is enabled" not in record.getMessage()


@functools.lru_cache(maxsize=4)
def _source(path: str, options: str, keys: tuple[str, ...] | None,
            rate_hz: float | str = "native", grid_tolerance_s: float = 1e-4):
    """The opened source and its specs, once per worker process (then set up as a build's
    worker process, :func:`~robocache.data.build.read.retain_heap` and
    :func:`~robocache.data.build.read.single_core`: each Ray task and actor holds one CPU).
    ``rate_hz`` and ``grid_tolerance_s``: the build's, which the driver checked against the
    source."""
    config = CacheConfig(source_options=json.loads(options),
                         keys=list(keys) if keys is not None else None, rate_hz=rate_hz,
                         grid_tolerance_s=grid_tolerance_s)
    retain_heap()
    opened = open_specs(path, config)
    single_core()
    return opened


def _quarantine_row(src, index: int, error: Exception) -> dict[str, Any]:
    """The row of a quarantined episode: the reason, and the exception for the metrics."""
    try:
        payload = pickle.dumps(error)
        pickle.loads(payload)
    except Exception:  # an exception that does not survive pickling: its text does
        payload = pickle.dumps(DataError(f"{type(error).__name__}: {error}"))
    return {"index": index, "payload": payload, "reason": _reason(src, index, error)}


def read_groups(src, indices: list[int], tasks: int = 1) -> list[list[int]]:
    """``indices`` cut into the groups read tasks read: runs of consecutive ones, each of at
    least :data:`READ_EPISODES` and, while they are read from the same first file
    (``src.files``, when the reader tells), up to :data:`FILE_EPISODES`. A file's episodes
    are split over several groups only when there are fewer files than ``tasks`` (then into
    about ``tasks`` groups): each group decodes its file again. On one core, a 500-episode
    data file of ``bench preprocess`` read in groups of 90 cost 3.1-4.0 ms an episode, whole
    0.9-1.2 (benchmarks/profile_read_groups.py,
    benchmarks/results/read-groups-cpu-vm-2026-11-28.txt)."""
    files = getattr(src, "files", None)
    keys = []
    for index in indices:
        try:
            keys.append(files(index)[0] if files is not None else None)
        except Exception:  # unlisted metadata: no file to share
            keys.append(None)
    most = FILE_EPISODES if len(set(keys) - {None}) >= tasks else \
        max(READ_EPISODES, min(FILE_EPISODES, len(indices) // max(tasks, 1)))
    groups: list[list[int]] = []
    key = None
    for index, now in zip(indices, keys, strict=True):
        if groups and len(groups[-1]) < (most if now is not None and now == key
                                         else READ_EPISODES):
            groups[-1].append(index)
        else:
            groups.append([index])
        key = now
    return groups


def _read(batch: dict[str, np.ndarray], *, path: str, options: str, keys,
          config: CacheConfig) -> dict[str, np.ndarray]:
    """Ray task: read, check and encode the frames of groups of consecutive episodes
    (:func:`read_groups`: a source file read once for each); per episode its pickled
    :class:`~robocache.data.build.read.Prepared` (``reason``: why it is quarantined)."""
    src, specs = _source(path, options, keys, config.rate_hz, config.grid_tolerance_s)
    config = dataclasses.replace(config, video_decoder="pyav")  # CPU tasks decode on the CPU
    rows = {"index": [], "payload": [], "reason": []}
    for index in [int(i) for group in batch["indices"] for i in group]:
        p = prepare_episode(src, int(index), specs, config, threads=1)
        if p.error is not None:
            row = _quarantine_row(src, int(index), p.error)
        else:
            row = {"index": int(index), "payload": pickle.dumps(p, protocol=5), "reason": ""}
        for k, v in row.items():
            rows[k].append(v)
    return {"index": np.array(rows["index"], np.int64),
            "payload": np.array(rows["payload"], dtype=object),
            "reason": np.array(rows["reason"], dtype=object)}


class _AlignWrite:
    """Actor: align a batch of episodes at once on this actor's device
    (:func:`~robocache.data.build.align.align_batch`) and write them under ``dest`` as one
    Lance write per table (:class:`~robocache.data.build.write.Batch`), uncommitted, with the
    rows' :class:`~robocache.data.build.stats.Tally` when ``tally`` (a fresh build)."""

    def __init__(self, dest: str, config: CacheConfig, fps: float | None, device: str,
                 path: str, options: str, keys, tally: bool):
        import torch

        self.dest, self.config, self.fps, self.tally = Path(dest), config, fps, tally
        self.src, self.specs = _source(path, options, keys, config.rate_hz,
                                       config.grid_tolerance_s)
        self.device = torch.device(device)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        quarantined, ready = [], []
        for index, payload, reason in zip(batch["index"].tolist(), batch["payload"],
                                          batch["reason"], strict=True):
            if reason:
                quarantined.append({"index": index, "payload": payload, "reason": reason})
            else:
                ready.append(pickle.loads(payload))
        out = Batch(1 << 62, 1 << 62)
        sizes, digests = {}, {}
        aligned = align_batch([p.episode for p in ready], self.specs, self.config,
                              self.device, self.fps)
        for p, cols in zip(ready, aligned, strict=True):
            if isinstance(cols, Exception):
                quarantined.append(_quarantine_row(self.src, p.index, cols))
                continue
            out.add(p.index, episode_tables(p.episode, cols, self.specs, self.config,
                                            p.frames))
            sizes[p.index] = metrics.episode_sizes(p.episode, cols)
            digests[p.index] = p.digest
        indices = list(out.indices)
        tally = Tally.of_rows(out.tables.get("data.lance", []), self.specs) \
            if self.tally else None
        written = out.write(self.dest) if indices else []
        return {"payload": np.array([pickle.dumps((indices, written, tally, sizes, digests,
                                                   quarantined))], dtype=object)}


def _commit_group(run, pending: list[tuple[list[int], list, Tally | None]], advance) -> None:
    """Commit the files of finished actor batches ((episodes, files, their rows' tally or
    None) each) in one Lance commit per table."""
    tables: dict[str, tuple[Any, list]] = {}
    for _, files, _ in pending:
        for rel, schema, fragments in files:
            tables.setdefault(rel, (schema, []))[1].extend(fragments)
    indices = [i for batch, _, _ in pending for i in batch]
    run.cached(indices, [(rel, *t) for rel, t in tables.items()],
               [tally for _, _, tally in pending])
    advance(f"episodes {min(indices)}..{max(indices)}", len(indices))


def _actors(resources: dict[str, float], num_gpus: int | None, workers: int | None,
            actors_per_gpu: int | None) -> tuple[int, int, str, dict[str, Any], int]:
    """The align-and-write actors the cluster's ``resources`` (``ray.cluster_resources()``)
    hold: (GPUs used, actors, their device, each actor's resources, the cluster's CPUs).

    Raises:
        DeviceError: more GPUs than the cluster has, GPU actors that leave no CPU to read, or
            more CPU actors (``workers``) than the cluster has CPUs (each holds one: the
            surplus would never be scheduled, and the job would wait for them forever).
    """
    have = int(resources.get("GPU", 0))
    if num_gpus is None:
        num_gpus = have
    if num_gpus < 0 or num_gpus > have:
        raise DeviceError(f"`num_gpus` (--num-gpus) is {num_gpus} but the Ray cluster has "
                          f"{have} GPU(s); pass --num-gpus between 0 (CPU) and {have}.")
    cpus = max(1, int(resources.get("CPU", 1)))
    if num_gpus:
        per_gpu = actors_per_gpu or 1
        if num_gpus * per_gpu >= cpus:
            most = (cpus - 1) // num_gpus
            raise DeviceError(
                f"{num_gpus} GPU(s) x {per_gpu} actors (--actors-per-gpu) take one CPU each "
                f"and the Ray cluster has {cpus}: no CPU left to read episodes; pass "
                + (f"--actors-per-gpu {most} or fewer." if most else
                   f"--num-gpus {cpus - 1} or fewer." if cpus > 1 else
                   "--num-gpus 0 on a cluster with more CPUs."))
        return num_gpus, num_gpus * per_gpu, "cuda", {"num_gpus": 1 / per_gpu, "num_cpus": 1}, \
            cpus
    if workers is not None and workers > cpus:
        raise DeviceError(f"`workers` (--workers) is {workers} but the Ray cluster has {cpus} "
                          f"CPU(s), one per CPU actor; pass --workers {cpus} or fewer, or leave "
                          "it out for one per CPU.")
    return 0, workers or cpus, "cpu", {"num_cpus": 1}, cpus


def preprocess(source: str | Path, dest: str | Path, config: CacheConfig | None = None, *,
               address: str | None = None, num_gpus: int | None = None,
               workers: int | None = None, actors_per_gpu: int | None = None,
               progress: bool | Progress = True,
               log: Callable[[str], None] | None = None,
               storage_options: dict[str, Any] | None = None, staging: str | Path | None = None,
               **overrides: Any) -> dict[str, Any]:
    """Build the cache of :func:`robocache.data.cache.build` with Ray (see the module docstring).

    Args:
        source: dataset path every Ray worker can read (shared or object-store mount).
        dest: cache directory every Ray worker and this process can write (locked by this
            process for the whole job, as by ``build``); or an object-store URI, as for
            ``build``: the cache is built in ``staging`` (which every Ray worker must then be
            able to write: a shared folder on a cluster of several machines) and published.
        storage_options, staging: as for ``build``.
        config: options, as for ``build``; keyword ``overrides`` replace its fields.
        address: Ray cluster (``auto``, ``host:port``, ``ray://host:port``); ``None`` starts a
            local Ray (or uses the one this process already initialized).
        num_gpus: GPUs whose actors align episodes; ``None``: every GPU of the cluster; 0:
            CPU actors.
        workers: CPU actors when ``num_gpus`` is 0, each reading, aligning and writing
            (default: one per CPU of the cluster).
        actors_per_gpu: actors sharing each GPU (``num_gpus=1/actors_per_gpu`` and one CPU
            each; default 1). More actors write more episodes at once and leave fewer CPUs
            to read (docs/scale-out.md has the measurements).
        progress: show a progress bar on stderr; or a callable ``(description, episodes)``,
            called on the driver as episodes finish (cached ones when their group is
            committed, skipped and quarantined ones singly), instead of the bar.
        log: where notices go, as for ``build``.

    Returns:
        The manifest, as ``build`` returns it (``device`` reads e.g. ``"cuda x2 (ray)"``).

    Raises:
        MissingDependencyError: Ray is not installed.
        ClusterError: nothing answers at ``address``.
        DeviceError: ``num_gpus`` exceeds the GPUs of the cluster, ``workers`` its CPUs, or
            ``workers`` or ``actors_per_gpu`` is below 1 (each refused before ``dest`` is
            created).
        DataError, CacheBusyError, FileNotFoundError: as ``build``.

    Example:
        >>> m = preprocess("data/sample/panda_multirate", "/tmp/panda.cache", rate_hz=50)
        >>> m["counts"]["cached"]  # doctest: +SKIP
        6
    """
    for name, value in (("workers", workers), ("actors_per_gpu", actors_per_gpu)):
        if value is not None and value < 1:
            raise DeviceError(f"`{name}` (--{name.replace('_', '-')}) is {value}; pass a whole "
                              "number of at least 1, or leave it out.")
    # refused before Ray starts: the options (as locked_run checks them again), then the
    # cluster (its address, GPUs and CPUs) before the destination is created or locked
    validate(CacheConfig(**{**dataclasses.asdict(config or CacheConfig()), **overrides}))
    ray = _ray()
    target = Target(dest, storage_options, staging)
    target.prepare(bool(overrides.get("overwrite", (config or CacheConfig()).overwrite)),
                   log or logging.getLogger(__name__).warning)
    connect(address)
    num_gpus, actors, device, per_actor, cpus = _actors(ray.cluster_resources(), num_gpus,
                                                        workers, actors_per_gpu)
    with locked_run(source, target.local, config, log=log, **overrides) as run:
        ray.data.DataContext.get_current().enable_progress_bars = False
        logging.getLogger("ray.data").setLevel(logging.ERROR)  # our bar and summary say it
        todo = run.todo
        where = {"path": str(Path(run.src.path).resolve()), "options":
                 json.dumps(run.config.source_options),
                 "keys": tuple(run.specs) if run.config.keys is not None else None}
        with _progress(progress, len(run.wanted), "preprocess") as advance:
            for index in run.wanted:
                why = run.skip(index)
                if why is not None:
                    run.passed(index, why)
                    advance(f"episode {index} ({why})")
            if todo:
                groups = read_groups(run.src, todo, cpus)
                # no more actors than groups to give them (the others would wait idle, and
                # Ray Data warns of a pool larger than its input)
                pool = min(actors, len(groups))
                _spend_restart_note(ray)
                ds = ray.data.from_items([{"indices": g} for g in groups],
                                         override_num_blocks=min(len(groups), 4000))
                ds = ds.map_batches(_read, batch_size=1, num_cpus=1,
                                    fn_kwargs={**where, "config": run.config})
                ds = ds.map_batches(
                    _AlignWrite, batch_size=ALIGN_EPISODES,
                    compute=ray.data.ActorPoolStrategy(size=pool), **per_actor,
                    fn_constructor_kwargs={"dest": str(run.dest.resolve()),
                                           "config": run.config, "fps": run.fps,
                                           "device": device, **where,
                                           "tally": run.tally is not None})
                pending: list[tuple[list[int], list, Tally | None]] = []
                since = time.perf_counter()
                for row in ds.iter_rows():
                    indices, written, tally, sizes, digests, quarantined = \
                        pickle.loads(row["payload"])
                    for q in quarantined:
                        run.quarantined(q["index"], q["reason"], pickle.loads(q["payload"]))
                        advance(f"episode {q['index']} quarantined")
                    if not indices:
                        continue
                    run.sizes.update(sizes)
                    run.digested(digests)
                    pending.append((indices, written, tally))
                    if sum(len(i) for i, _, _ in pending) >= COMMIT_EPISODES or \
                            time.perf_counter() - since > COMMIT_SECONDS:
                        _commit_group(run, pending, advance)
                        pending, since = [], time.perf_counter()
                if pending:
                    _commit_group(run, pending, advance)
        manifest = run.finish(device=f"{device} x{num_gpus or actors} (ray)")
    return target.publish(manifest)
