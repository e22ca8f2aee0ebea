"""Expose the metrics: an HTTP exporter to scrape, a pushgateway for batch jobs.

From a training script::

    from robocache.observability import start_exporter
    start_exporter(9100)                  # http://<host>:9100/metrics while the script runs

From a batch job (``robocache ingest ... --pushgateway URL``, or ``PROMETHEUS_PUSHGATEWAY``)::

    with Pusher("http://pushgateway:9091", job="robocache_ingest"):
        build(...)                        # pushed every 15 s and once more at the end

Neither ever stops the job it observes: a port in use or a pushgateway that does not answer
gives one warning (``robocache`` logger) and the job goes on; only a malformed URL is an error,
raised before the job starts.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import urllib.parse
from collections.abc import Iterator
from typing import Any

import typer

from robocache.errors import DataError
from robocache.observability import logs, metrics

ENV_PUSHGATEWAY = "PROMETHEUS_PUSHGATEWAY"

# The options of every long-running command (``def cmd(..., metrics_port: int =
# METRICS_PORT_OPTION, ...)``), passed on to :func:`observe`.
METRICS_PORT_OPTION = typer.Option(
    None, "--metrics-port", help="Serve Prometheus metrics on this port while the job runs.")
PUSHGATEWAY_OPTION = typer.Option(
    None, "--pushgateway",
    help=f"Push metrics to this Prometheus pushgateway URL (default ${ENV_PUSHGATEWAY}).")
LOG_FORMAT_OPTION = typer.Option(
    None, "--log-format", help="Log events on stderr as 'json' (one object per line) or 'text'.")
PUSH_INTERVAL_S = 15.0
PUSH_TIMEOUT_S = 3.0
FINAL_PUSH_TRIES = 3


def start_exporter(port: int = 9100, addr: str = "0.0.0.0") -> Any:
    """Turn metrics on and serve ``prometheus_client.REGISTRY`` at ``http://addr:port/metrics``
    from a daemon thread of this process (DataLoader workers need nothing more: loader metrics
    are recorded where the batches arrive).

    Returns:
        The HTTP server (``.shutdown()`` stops it; ``.server_port`` is the port, useful with
        ``port=0``), or ``None`` when the port cannot be bound: one warning, the job goes on.

    Raises:
        DataError: ``port`` outside 0-65535.
        MissingDependencyError: ``prometheus-client`` is not installed.
    """
    if not 0 <= int(port) <= 65535:
        raise DataError(f"`--metrics-port` must be a TCP port in 0-65535; got {port}.")
    metrics.enable()
    import prometheus_client as pc

    try:
        server, _thread = pc.start_http_server(int(port), addr)
    except OSError as e:
        logs.event("exporter.unavailable", logging.WARNING, port=port, error=str(e),
                   message=f"warning: metrics are not served: cannot listen on {addr}:{port} "
                           f"({e.strerror or e}); the job continues. Pick a free port with "
                           "--metrics-port.")
        return None
    logs.event("exporter.started", port=server.server_port, addr=addr)
    return server


def check_url(url: str) -> str:
    """``url`` if it is an ``http(s)://host[:port]`` address of a pushgateway.

    Raises:
        DataError: anything else (one line naming the option and the form expected).
    """
    parsed = urllib.parse.urlsplit(url)
    try:
        parsed.port  # noqa: B018 (raises on a port out of range or not a number)
    except ValueError:
        parsed = None
    if parsed is None or parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise DataError(f"`--pushgateway` ({ENV_PUSHGATEWAY}) must be a URL like "
                        f"http://pushgateway:9091; got {url!r}.")
    return url


class Pusher:
    """Push ``prometheus_client.REGISTRY`` to a pushgateway every ``interval_s`` and once at the
    end (also when the job fails), grouped by ``job`` and ``instance`` (host name) and ``rank``.

    Use as a context manager, or :meth:`start` / :meth:`stop`. Each push has a
    ``PUSH_TIMEOUT_S`` timeout; the first failure logs one warning, later ones are counted
    (``failures``) and the final push is tried ``FINAL_PUSH_TRIES`` times. The job never waits
    more than about ``FINAL_PUSH_TRIES * PUSH_TIMEOUT_S`` seconds for a gateway that is down.

    Raises:
        DataError: a malformed ``url``.
    """

    def __init__(self, url: str, job: str, interval_s: float = PUSH_INTERVAL_S,
                 grouping: dict[str, str] | None = None):
        self.url = check_url(url)
        self.job, self.interval_s = job, interval_s
        self.grouping = {"instance": socket.gethostname(), "rank": metrics.rank(),
                         **(grouping or {})}
        self.pushes = self.failures = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def push(self) -> bool:
        """One push now; False (and one warning the first time) when it failed."""
        import prometheus_client as pc

        try:
            pc.push_to_gateway(self.url, self.job, pc.REGISTRY, grouping_key=self.grouping,
                               timeout=PUSH_TIMEOUT_S)
        except Exception as e:  # URLError, HTTPError, timeouts: metrics never stop the job
            self.failures += 1
            if self.failures == 1:
                logs.event("pushgateway.unreachable", logging.WARNING, url=self.url,
                           error=str(e),
                           message=f"warning: cannot push metrics to {self.url} ({e}); the "
                                   "job continues and pushes again later.")
            return False
        self.pushes += 1
        return True

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.push()

    def start(self) -> Pusher:
        metrics.enable()
        self._thread = threading.Thread(target=self._loop, name="robocache-pusher", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> bool:
        """Stop the periodic pushes and push the final values; False when every try failed."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        ok = any(self.push() for _ in range(FINAL_PUSH_TRIES))
        logs.event("pushgateway.final", url=self.url, ok=ok, pushes=self.pushes,
                   failures=self.failures)
        return ok

    def __enter__(self) -> Pusher:
        return self.start()

    def __exit__(self, *exc) -> bool:
        self.stop()
        return False


@contextlib.contextmanager
def observe(job: str, *, metrics_port: int | None = None, pushgateway: str | None = None,
            log_format: str | None = None) -> Iterator[None]:
    """What a long-running command does with ``--metrics-port``, ``--pushgateway`` (default
    ``$PROMETHEUS_PUSHGATEWAY``) and ``--log-format``: serve, push (final push also on failure)
    and log for the duration of the block. A failure inside is re-raised (and logged as an
    ``error`` event when a log format was configured).

        with observe("robocache_preprocess", metrics_port=port, pushgateway=url,
                     log_format=fmt):
            run()

    Raises:
        DataError: a malformed pushgateway URL or port, an unknown log format (before the
            block runs).
    """
    if log_format:
        logs.configure(log_format)
    url = pushgateway or os.environ.get(ENV_PUSHGATEWAY) or None
    pusher = Pusher(url, job) if url else None
    if metrics_port is not None and not 0 <= metrics_port <= 65535:
        raise DataError(f"`--metrics-port` must be a TCP port in 0-65535; got {metrics_port}.")
    server = start_exporter(metrics_port) if metrics_port is not None else None
    if pusher is not None:
        pusher.start()
    try:
        yield
    except Exception as e:
        import typer

        # with --log-format the failure is an event too (the command still prints its line)
        if logs.configured() and not isinstance(e, typer.Exit):
            logs.event("error", logging.ERROR, job=job, error=f"{type(e).__name__}: {e}")
        raise
    finally:
        if pusher is not None:
            pusher.stop()
        if server is not None:
            server.shutdown()
            server.server_close()
