"""The fork server a build's worker processes are forked from, importing nothing heavy itself,
so that a command can start the server before it imports torch and the readers: the server's
own imports (3-4 s of one core on a GPU node, ``benchmarks/results/
ingest-node-profile-h200x4-2026-11-27-588efa4.txt``) then overlap the command's."""

from __future__ import annotations

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
        from multiprocessing import forkserver

        forkserver.ensure_running()
