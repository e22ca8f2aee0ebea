"""A worker process that runs many tasks at once on its own threads: a camera ingest's GPU lane.

Camera ingest on a node with GPUs decodes video with NVDEC and encodes the frames with nvJPEG
in one :class:`Lane` per GPU (:class:`robocache.data.cameras.CameraWorkers`), beside the CPU
worker processes. One process per GPU, not one per stream: a stream's NVDEC decoder and the
nvJPEG encoder live in the process's CUDA context, and four processes on one GPU made 41 % of
one process's frames (docs/cameras.md); its streams run on the process's threads instead
(sampled with py-spy, they spend most of their time waiting in the NVDEC and nvJPEG calls).
Each is a process of its own, not threads of the build's, so that its Python between those
calls waits on no other lane's GIL nor on the build's reading threads.

The process is forked from the build's fork server (:func:`robocache._forkserver.worker_context`),
which has imported torch but never touched CUDA, and is killed when the process that started
it dies. Tasks and results travel through two one-way pipes; a task's exception comes back as
itself where it pickles (else as a :class:`~robocache.errors.DataError` with its text).
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool

from robocache.errors import picklable


class Lane:
    """One worker process running up to ``threads`` tasks at once, on CUDA device ``gpu``
    (``None``: no device is selected), after ``initializer()`` (picklable; e.g. the imports
    its tasks need, so that the first task does not pay for them). :meth:`start` starts it;
    :meth:`submit` returns a :class:`~concurrent.futures.Future`. A process that dies fails
    every task in flight with :class:`~concurrent.futures.process.BrokenProcessPool`, and
    every later one: a lane is not restarted (its caller moves the work elsewhere)."""

    def __init__(self, threads: int, gpu: int | None = None, initializer=None):
        if threads < 1:
            raise ValueError(f"`threads` must be at least 1; got {threads}.")
        self.threads, self.gpu, self.initializer = threads, gpu, initializer
        self._pending: dict[int, Future] = {}
        self._keys = itertools.count()
        self._lock = threading.Lock()  # the pending tasks, the task pipe
        self._proc = self._tasks = self._results = self._collector = None
        self._ready = Future()
        self.error: BaseException | None = None  # why the lane is broken, once it is

    def start(self) -> Lane:
        """Start the process (without waiting for it: see :meth:`wait_ready`)."""
        from robocache._forkserver import worker_context

        ctx = worker_context()
        tasks_in, self._tasks = ctx.Pipe(duplex=False)
        self._results, results_out = ctx.Pipe(duplex=False)
        self._proc = ctx.Process(target=_serve, daemon=True,
                                 args=(tasks_in, results_out, self.threads, self.gpu,
                                       self.initializer, os.getpid()),
                                 name=f"robocache-lane-{self.gpu}")
        self._proc.start()
        tasks_in.close()
        results_out.close()
        self._collector = threading.Thread(target=self._collect, daemon=True,
                                           name=f"robocache-lane-{self.gpu}-results")
        self._collector.start()
        return self

    def wait_ready(self, timeout: float | None = None) -> None:
        """Block until the process is ready for tasks (its device selected); raises why it is
        not (:class:`BrokenProcessPool`, or the error its start-up raised)."""
        self._ready.result(timeout)

    @property
    def alive(self) -> bool:
        return self.error is None

    def submit(self, fn, *args) -> Future:
        """Run ``fn(*args)`` (both picklable) on one of the process's threads."""
        future: Future = Future()
        with self._lock:
            if self.error is not None:
                future.set_exception(self.error)
                return future
            key = next(self._keys)
            self._pending[key] = future
            try:
                self._tasks.send((key, fn, args))
            except OSError as e:
                del self._pending[key]
                future.set_exception(BrokenProcessPool(f"the lane's process is gone ({e})"))
        return future

    def _collect(self) -> None:
        """The results thread: each result to its future, in the order they come; once the
        process has ended, every task still in flight fails."""
        from multiprocessing.connection import wait

        try:
            while True:
                wait([self._results, self._proc.sentinel])
                try:  # readable, or the process ended: what it sent before comes first
                    key, ok, value = self._results.recv()
                except (EOFError, OSError):
                    break
                if key == "ready":
                    (self._ready.set_result if ok else self._ready.set_exception)(value)
                    continue
                with self._lock:
                    future = self._pending.pop(key)
                (future.set_result if ok else future.set_exception)(value)
        finally:
            self._proc.join()  # here only: a fork server's child's exit code is read once
            code = self._proc.exitcode
            with self._lock:
                self.error = BrokenProcessPool(
                    f"the lane's process (GPU {self.gpu}) ended with exit code {code}")
                pending, self._pending = list(self._pending.values()), {}
            if not self._ready.done():
                self._ready.set_exception(self.error)
            for future in pending:
                future.set_exception(self.error)

    def close(self, timeout: float = 60.0) -> None:
        """Let the tasks in flight finish, then stop the process (killed after ``timeout``
        seconds)."""
        if self._proc is None:
            return
        with self._lock, contextlib.suppress(OSError):
            self._tasks.send(None)
        self._collector.join(timeout)  # it sees the process end
        if self._collector.is_alive():
            self._proc.kill()
            self._collector.join()
        with self._lock:
            self._tasks.close()


def _serve(tasks, results, threads: int, gpu: int | None, initializer, parent: int) -> None:
    """The lane process: select ``gpu``, call ``initializer``, then run each task that comes
    on ``threads`` threads, sending back ``(key, ok, result or exception)``; ends when the
    task pipe closes or brings ``None``, once the tasks in flight are done."""
    from robocache.data.cameras import die_with_parent

    die_with_parent(parent)
    lock = threading.Lock()

    def send(message) -> None:
        with lock:
            results.send(message)

    def reply(key: int, future: Future) -> None:
        try:
            send((key, True, future.result()))
        except BaseException as e:
            send((key, False, picklable(e)))

    try:
        if gpu is not None:
            import torch

            torch.cuda.set_device(gpu)
        if initializer is not None:
            initializer()
    except BaseException as e:
        send(("ready", False, picklable(e)))
        return
    send(("ready", True, os.getpid()))
    with ThreadPoolExecutor(threads, thread_name_prefix="robocache-lane") as pool:
        while True:
            try:
                message = tasks.recv()
            except (EOFError, OSError):
                break
            if message is None:
                break
            key, fn, args = message
            pool.submit(fn, *args).add_done_callback(functools.partial(reply, key))
