"""``robocache preprocess``: the cache of ``robocache ingest``, built by a Ray Data pipeline.

    $ robocache preprocess data/sample/panda_multirate /tmp/panda.cache --rate 50
    $ robocache preprocess s3-mounted/droid /shared/droid.cache --address auto --num-gpus 8

Stages (one Ray Data dataset of episode indices, streamed):

1. **read** (Ray tasks, one CPU each): the format reader opens the source once per worker
   process, reads and checks one episode (:func:`robocache.data.cache.load_episode`).
2. **align + write** (an actor pool: one actor per GPU with ``num_gpus=1``, or CPU actors when
   there is no GPU): :func:`~robocache.data.cache.align_episode` on the actor's device, then
   :func:`~robocache.data.cache.write_episode` writes the episode's Lance files, uncommitted.
3. **commit** (the driver, as results stream in): :func:`~robocache.data.cache.commit` adds the
   files of up to ``COMMIT_EPISODES`` finished episodes in one Lance commit per table, so a
   killed job leaves whole episodes only and the next run resumes at episode granularity (files
   a dead worker wrote, or an uncommitted group's, are never committed).

Bad episodes are quarantined with their reason exactly as by ``ingest``; the summary, the
quarantine list, the stats and the rows are the same (the row order inside ``data.lance`` is
the order episodes finished; readers sort by episode and step).
"""

from __future__ import annotations

import functools
import json
import logging
import pickle
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from robocache._optional import require
from robocache.data.build.align import align_episode
from robocache.data.build.config import CacheConfig
from robocache.data.build.read import load_episode, open_specs
from robocache.data.build.run import _progress, _reason, locked_run
from robocache.data.build.write import write_episode
from robocache.errors import ClusterError, DataError, DeviceError
from robocache.observability import metrics

# The driver commits finished episodes in groups (a Lance commit costs ~10-20 ms whatever its
# size, so one per episode would cap a job near 60 episodes/s); a killed job loses at most the
# uncommitted group, whole episodes that the next run redoes.
COMMIT_EPISODES = 64
COMMIT_SECONDS = 2.0


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
    try:
        ray.init(address=address, include_dashboard=False, logging_level="WARNING",
                 log_to_driver=False)
    except ConnectionError as e:
        raise ClusterError(f"no Ray cluster answers at --address {address!r} ({e}); start one "
                           "with `ray start --head` or leave --address out to run "
                           "locally.") from e


@functools.lru_cache(maxsize=4)
def _source(path: str, options: str, keys: tuple[str, ...] | None):
    """The opened source and its specs, once per worker process."""
    config = CacheConfig(source_options=json.loads(options),
                         keys=list(keys) if keys is not None else None)
    return open_specs(path, config)


def _quarantine_row(src, index: int, error: Exception) -> dict[str, Any]:
    """The row of a quarantined episode: the reason, and the exception for the metrics."""
    try:
        payload = pickle.dumps(error)
        pickle.loads(payload)
    except Exception:  # an exception that does not survive pickling: its text does
        payload = pickle.dumps(DataError(f"{type(error).__name__}: {error}"))
    return {"index": index, "payload": payload, "reason": _reason(src, index, error)}


def _read(row: dict[str, Any], *, path: str, options: str, keys) -> dict[str, Any]:
    index = int(row["index"])
    src, specs = _source(path, options, keys)
    try:
        episode = load_episode(src, index, specs)
    except MemoryError:
        raise
    except Exception as e:  # quarantined with the reason, as by ingest
        return _quarantine_row(src, index, e)
    return {"index": index, "payload": pickle.dumps(episode, protocol=5), "reason": ""}


class _AlignWrite:
    """Actor: align episodes on this actor's device and write their files under ``dest``."""

    def __init__(self, dest: str, config: CacheConfig, fps: float | None, device: str,
                 path: str, options: str, keys):
        import torch

        self.dest, self.config, self.fps = Path(dest), config, fps
        self.src, self.specs = _source(path, options, keys)
        self.device = torch.device(device)

    def __call__(self, row: dict[str, Any]) -> dict[str, Any]:
        index = int(row["index"])
        if row["reason"]:
            return row
        episode = pickle.loads(row["payload"])
        try:
            cols = align_episode(episode, self.specs, self.config, self.device, self.fps)
        except MemoryError:
            raise
        except Exception as e:
            return _quarantine_row(self.src, index, e)
        written = write_episode(self.dest, episode, cols, self.specs, self.config)
        return {"index": index, "reason": "",
                "payload": pickle.dumps((written, metrics.episode_sizes(episode, cols)))}


def _commit_group(run, pending: dict[int, tuple], advance) -> None:
    """Commit finished episodes (index -> (files, sizes)) in one Lance commit per table."""
    tables: dict[str, tuple[Any, list]] = {}
    for files, _ in pending.values():
        for rel, schema, fragments in files:
            tables.setdefault(rel, (schema, []))[1].extend(fragments)
    run.sizes.update({i: sizes for i, (_, sizes) in pending.items()})
    run.cached(list(pending), [(rel, *t) for rel, t in tables.items()])
    advance(f"episodes {min(pending)}..{max(pending)}", len(pending))


def preprocess(source: str | Path, dest: str | Path, config: CacheConfig | None = None, *,
               address: str | None = None, num_gpus: int | None = None,
               workers: int | None = None, progress: bool = True,
               log: Callable[[str], None] | None = None, **overrides: Any) -> dict[str, Any]:
    """Build the cache of :func:`robocache.data.cache.build` with Ray (see the module docstring).

    Args:
        source: dataset path every Ray worker can read (shared or object-store mount).
        dest: cache directory every Ray worker and this process can write (locked by this
            process for the whole job, as by ``build``).
        config: options, as for ``build``; keyword ``overrides`` replace its fields.
        address: Ray cluster (``auto``, ``host:port``, ``ray://host:port``); ``None`` starts a
            local Ray (or uses the one this process already initialized).
        num_gpus: GPU actors aligning episodes (one GPU each); ``None``: every GPU of the
            cluster; 0: CPU actors.
        workers: CPU actors when ``num_gpus`` is 0 (default: half the cluster's CPUs, the other
            half reading).
        progress: show a progress bar on stderr.
        log: where notices go, as for ``build``.

    Returns:
        The manifest, as ``build`` returns it (``device`` reads e.g. ``"cuda x2 (ray)"``).

    Raises:
        MissingDependencyError: Ray is not installed.
        ClusterError: nothing answers at ``address``.
        DeviceError: ``num_gpus`` exceeds the GPUs of the cluster.
        DataError, CacheBusyError, FileNotFoundError: as ``build``.

    Example:
        >>> m = preprocess("data/sample/panda_multirate", "/tmp/panda.cache", rate_hz=50)
        >>> m["counts"]["cached"]  # doctest: +SKIP
        6
    """
    ray = _ray()
    with locked_run(source, dest, config, log=log, **overrides) as run:
        connect(address)
        resources = ray.cluster_resources()
        have = int(resources.get("GPU", 0))
        if num_gpus is None:
            num_gpus = have
        if num_gpus < 0 or num_gpus > have:
            raise DeviceError(f"`num_gpus` (--num-gpus) is {num_gpus} but the Ray cluster has "
                              f"{have} GPU(s); pass --num-gpus between 0 (CPU) and {have}.")
        if num_gpus:
            actors, device, per_actor = num_gpus, "cuda", {"num_gpus": 1}
        else:
            actors = workers or max(1, int(resources.get("CPU", 2)) // 2)
            device, per_actor = "cpu", {"num_cpus": 1}
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
                ds = ray.data.from_items([{"index": i} for i in todo],
                                         override_num_blocks=min(len(todo), 200))
                ds = ds.map(_read, num_cpus=1, fn_kwargs=where)
                ds = ds.map(_AlignWrite, compute=ray.data.ActorPoolStrategy(size=actors),
                            **per_actor, fn_constructor_kwargs={
                                "dest": str(run.dest.resolve()), "config": run.config,
                                "fps": run.fps, "device": device, **where})
                pending: dict[int, list] = {}
                since = time.perf_counter()
                for row in ds.iter_rows():
                    index = int(row["index"])
                    if row["reason"]:
                        run.quarantined(index, row["reason"], pickle.loads(row["payload"]))
                        advance(f"episode {index} quarantined")
                        continue
                    pending[index] = pickle.loads(row["payload"])
                    if len(pending) >= COMMIT_EPISODES or \
                            time.perf_counter() - since > COMMIT_SECONDS:
                        _commit_group(run, pending, advance)
                        pending, since = {}, time.perf_counter()
                if pending:
                    _commit_group(run, pending, advance)
        return run.finish(device=f"{device} x{actors} (ray)")
