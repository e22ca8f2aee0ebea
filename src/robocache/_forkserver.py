"""The fork server a build's worker processes are forked from, importing nothing heavy itself,
so that a command can start the server before it imports torch and the readers: the server's
own imports (3-4 s of one core on a GPU node, ``benchmarks/results/
ingest-node-profile-h200x4-2026-11-27-588efa4.txt``) then overlap the command's."""

from __future__ import annotations

import os

# Worker processes a build may run per core at most (``decode_workers``): each has its own
# decoder threads and frames in memory, so past a few per core more only adds processes,
# memory and contention (100000 asked for forked until the process limit, then hung).
WORKERS_PER_CORE = 4


def max_workers() -> int:
    """The most worker processes a build may start: :data:`WORKERS_PER_CORE` per core of
    this machine (``os.cpu_count()``, as the default of one per core counts them)."""
    return WORKERS_PER_CORE * (os.cpu_count() or 1)

# what the server imports once for every worker it forks: the build's modules, and what they
# import on first use (Arrow's parquet and dataset readers, which import pandas; the
# alignment ops), which each worker would otherwise import itself
PRELOAD = ["__main__", "robocache.data.build.read", "pyarrow.parquet", "pyarrow.dataset",
           "robocache.ops.align"]


def worker_context():
    """The start method of a build's worker processes: forked from a fork server that has
    imported the build's modules (torch, the readers, Arrow) once, so a worker starts in
    milliseconds instead of importing them itself. 64 spawned workers importing torch at once
    kept 60 cores busy for ~6 s before the first episode (py-spy, docs/build-profile.md). The
    fork server is the process's one (Python starts it on first use): started by other code
    without this preload, it still serves, at the spawned workers' start-up cost. Spawn where
    the platform has no fork server."""
    import multiprocessing

    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    return ctx


def start_worker_server() -> None:
    """Start :func:`worker_context`'s fork server now, in the background (no-op once it
    runs): its imports then overlap the caller's own work instead of preceding the workers."""
    if worker_context().get_start_method() == "forkserver":
        import signal
        from multiprocessing import forkserver, resource_tracker

        # the server imports torch and the readers for seconds before it ignores Ctrl-C: it
        # starts with SIGINT blocked (a Ctrl-C then would print its traceback; the command
        # stops it, and its workers ignore SIGINT too); here a Ctrl-C waits the spawn out. The
        # resource tracker first: starting it unblocks SIGINT (it blocks and unblocks it
        # around its own spawn)
        resource_tracker.ensure_running()
        held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            forkserver.ensure_running()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)
