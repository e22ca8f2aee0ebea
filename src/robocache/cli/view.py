"""``robocache view``: look at episodes in Rerun, native streams beside the aligned grid.

    $ robocache view data/sample/panda_multirate --episode 0 --rate 50
    $ robocache view /tmp/panda.cache --episode 2 --save panda.rrd
    $ robocache view /tmp/panda.cache --serve --port 9090
    $ robocache view s3://robot-data/panda.cache --save panda.rrd \\
          --storage-option aws_region=us-west-2

For a cache: its aligned grid, its camera frames, and its source's streams at their own times
when the source is still at hand. For a source (LeRobot, zarr, robomimic, RLDS, whatever
``open_source`` reads): its streams at their own times, and with ``--rate`` the grid an ingest
at that rate would build. ``--save`` writes an ``.rrd`` without a display; ``--serve`` hosts
the web viewer on this machine's loopback interface only (127.0.0.1); with neither, the native
Rerun viewer opens. A cache may be in an object store (``s3://``, ``gs://``, ``az://``;
credentials from the standard environment variables or ``--storage-option KEY=VALUE``): its
episodes' rows and frames are read as they are shown. Entities and layout: docs/view.md.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from urllib.parse import quote

import typer

from robocache._optional import require
from robocache.cli._errors import (
    VERBOSE_OPTION_HELP,
    CommandError,
    cache_argument,
    cli_errors,
    storage_option_flag,
    storage_options,
)

LOOPBACK = "127.0.0.1"
SERVER_START_S = 60.0


def _check_save(save: Path, path: Path | str) -> None:
    if save.suffix != ".rrd":
        raise CommandError(f"--save must name a .rrd file; got {save}",
                           "pass e.g. --save episode.rrd")
    if isinstance(path, Path) and save.resolve().is_relative_to(path.resolve()):
        raise CommandError(f"--save {save} lies inside {path}, which is never written",
                           "save the recording elsewhere")
    if not save.parent.is_dir():
        raise CommandError(f"--save {save}: the folder {save.parent} does not exist",
                           "create it or choose another")


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((LOOPBACK, port))
        except OSError:
            return False
    return True


def _start_server(port: int) -> tuple[subprocess.Popen, str]:
    """Start Rerun's web viewer on ``port`` and its data server on ``port + 1``, both bound
    to the loopback interface; returns the process and the data server's address."""
    for p in (port, port + 1):
        if not _port_free(p):
            raise CommandError(f"--port {port}: port {p} on {LOOPBACK} is in use (the viewer "
                               f"takes {port} and {port + 1})", "pass another --port")
    # what the server says goes to a file (a pipe nobody reads would fill and stall it),
    # read back only when it fails to start
    with tempfile.TemporaryFile() as log:
        # its own session: the launcher and the server binary it starts stop together
        proc = subprocess.Popen(
            [sys.executable, "-m", "rerun_cli", "--serve-web", "--bind", LOOPBACK, "--port",
             str(port + 1), "--web-viewer-port", str(port)],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
        deadline = time.monotonic() + SERVER_START_S
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                log.seek(0)
                err = log.read().decode(errors="replace").strip().splitlines()
                why = err[-1] if err else f"exit {proc.returncode}"
                raise CommandError(f"the Rerun server did not start ({why})",
                                   "check that rerun-sdk is installed and --port is free")
            if not _port_free(port + 1) and not _port_free(port):
                return proc, f"rerun+http://{LOOPBACK}:{port + 1}/proxy"
            time.sleep(0.2)
    _stop(proc)
    raise CommandError(f"the Rerun server did not listen on {LOOPBACK}:{port} within "
                       f"{SERVER_START_S:.0f} s", "pass another --port")


def _stop(proc: subprocess.Popen) -> None:
    """Stop the server started by :func:`_start_server`: its process group (the ``rerun_cli``
    launcher and the server binary), SIGTERM then SIGKILL."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=10)
            break
        except subprocess.TimeoutExpired:
            continue


def _interrupt(signum, frame):
    raise KeyboardInterrupt()


def view(
    path: str = typer.Argument(..., help="A RoboCache cache (a directory, or s3://BUCKET/PREFIX, "
                               "gs://, az://), or a dataset (LeRobot, zarr, robomimic, "
                               "RLDS...)."),
    episode: list[int] = typer.Option(None, "--episode", help="Episode to show; repeat for "
                                      "several (default: the first)."),
    stream: list[str] = typer.Option(None, "--stream", help="Stream to show; repeat for "
                                     "several (default: all)."),
    save: Path = typer.Option(None, "--save", help="Write the recording to this .rrd file "
                              "(no display needed)."),
    serve: bool = typer.Option(False, "--serve", help="Serve the web viewer on 127.0.0.1 "
                               "(this machine only) until Ctrl-C or SIGTERM (kill), which stop "
                               "the server."),
    port: int = typer.Option(9090, "--port", min=1, max=65534,
                             help="--serve: the web viewer's port (its data server takes the "
                             "next one)."),
    rate: str = typer.Option(None, "--rate", help="A source only: also align it to this rate "
                             "(Hz, or 'native') on the CPU, as ingest would."),
    fps: float = typer.Option(None, help="Rate of sources without timestamps (zarr, HDF5, "
                              "RLDS)."),
    split: str = typer.Option(None, help="RLDS split: train, val, train[:95%], train[:10]+val."),
    storage_option: list[str] = storage_option_flag(),
    verbose: bool = typer.Option(False, "--verbose", help=VERBOSE_OPTION_HELP),
):
    """Show episodes in Rerun: every stream at its own times and, for a cache (or with
    --rate), as aligned on the grid; cameras, events, _is_pad, hold age, quarantined episodes.

    Exit codes: 0 success (--serve: stopped by Ctrl-C, SIGTERM or SIGHUP, the server with it);
    2 bad usage or input (one line on stderr: the problem and the fix);
    1 internal error (--verbose shows the traceback).
    """
    from robocache.cli.ingest import source_options

    partial = proc = None
    # --serve: SIGTERM (`kill PID`) and SIGHUP (the terminal closed) stop the server as Ctrl-C
    # does; their default would end this process alone and leave the server, in a session of
    # its own, holding both ports (while a command body runs, cli_errors has SIGTERM)
    held = {sig: signal.signal(sig, _interrupt) for sig in (signal.SIGTERM, signal.SIGHUP)} \
        if serve and threading.current_thread() is threading.main_thread() else {}
    try:
        with cli_errors(verbose):
            rr = require("rerun", "view", "Viewing episodes in Rerun", "rerun-sdk")
            from robocache.view.episodes import RESUME, open_view
            from robocache.view.record import entity, record

            path = cache_argument(path)
            options = storage_options(storage_option)
            if save is not None:
                _check_save(save, path)
            if save is None and not serve and sys.platform.startswith("linux") and not (
                    os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")):
                raise CommandError("no display to open the Rerun viewer on",
                                   "pass --save FILE.rrd or --serve")
            opened = open_view(path, streams=stream or None, rate=rate,
                               storage_options=options, **source_options(fps=fps, split=split))
            indices = list(dict.fromkeys(episode)) if episode else opened.episodes[:1]
            if not indices and opened.unfinished:
                raise CommandError(f"{path} is an unfinished cache: its ingest stopped (or is "
                                   "still running) before any episode was committed", RESUME)
            if not indices:
                raise CommandError(f"{path} has no episode to show",
                                   "ingest or fix the dataset")
            for i in indices:
                if i not in opened.episodes:
                    opened.episode(i)  # raises, naming the episodes there are
            rec = rr.RecordingStream("robocache")
            sinks = []
            if save is not None:
                partial = save.with_name(f".{save.name}.{os.getpid()}.partial")
                sinks.append(rr.FileSink(str(partial)))
            if serve:
                proc, uri = _start_server(port)
                sinks.append(rr.GrpcSink(uri))
            if sinks:
                rec.set_sinks(*sinks)
            else:
                rec.spawn()
            for line in opened.notices:
                typer.echo(f"note: {line}", err=True)
            sent = record(rec, opened, indices)
            rec.flush()
            rec.disconnect()
            if partial is not None:
                os.replace(partial, save)
                partial = None
        cameras = [n for n, s in opened.specs.items() if s.kind in ("image", "video")]
        for index, entities in sent.items():
            frames = sum(entities.get(entity(f"episode_{index}", "native", c), 0)
                         for c in cameras)
            typer.echo(f"episode {index}: {len(entities)} entities, {frames} camera frames")
        for q in opened.quarantined:
            typer.echo(f"quarantined episode {q['index']}: {q['reason']}")
        if save is not None:
            typer.echo(f"saved {save} ({save.stat().st_size / 1e6:.1f} MB)")
        if proc is not None:
            data = quote(f"rerun+http://{LOOPBACK}:{port + 1}/proxy", safe="")
            typer.echo(f"Rerun web viewer: http://{LOOPBACK}:{port}/?url={data}\n(this machine "
                       f"only; from another, forward both ports: ssh -L {port}:{LOOPBACK}:"
                       f"{port} -L {port + 1}:{LOOPBACK}:{port + 1} HOST). Ctrl-C stops it.")
            proc.wait()
    except KeyboardInterrupt:
        pass
    finally:
        if partial is not None:
            partial.unlink(missing_ok=True)
        if proc is not None:
            _stop(proc)
        for sig, handler in held.items():
            signal.signal(sig, handler)
