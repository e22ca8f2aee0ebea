"""Stops from outside: SIGTERM to a job's process group (a scheduler's stop), Ctrl-C in a
terminal (SIGINT to the foreground group), `kill PID`. Each is one line and exit 143 / 130 from
the command, whatever its worker processes, Ray or the Rerun server it started were doing; a
stopped ``view --serve`` takes its server with it."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import faultlib as fl
import pytest

from robocache.data.lock import holder

SAMPLE = Path(__file__).resolve().parents[2] / "data" / "sample" / "panda_multirate"
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}


# Ctrl-C as a terminal sends it, whatever this runner inherited (a runner in the background of
# a non-interactive shell ignores SIGINT, and so would the child): Python's own handler first
CTRL_C = "import signal\nsignal.signal(signal.SIGINT, signal.default_int_handler)\n"


def _forked_children(pid: int) -> list[int]:
    """The processes ``pid`` forked without exec (its worker processes: the same command
    line), from /proc."""
    mine = Path(f"/proc/{pid}/cmdline").read_bytes()
    out = []
    for d in Path("/proc").iterdir():
        try:
            if d.name.isdigit() and int((d / "stat").read_text().rsplit(")", 1)[1].split()[1]) \
                    == pid and (d / "cmdline").read_bytes() == mine:
                out.append(int(d.name))
        except (OSError, ValueError, IndexError):
            continue
    return out


def _group_alive(pgid: int) -> list[int]:
    """The live processes (not zombies) of process group ``pgid``."""
    out = []
    for d in Path("/proc").iterdir():
        try:
            fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
            if d.name.isdigit() and int(fields[3]) == pgid and fields[0] != "Z":
                out.append(int(d.name))
        except (OSError, ValueError, IndexError):
            continue
    return out


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads worker processes from /proc")
@pytest.mark.parametrize("sig, code, said", [(signal.SIGTERM, 143, "terminated; re-run"),
                                             (signal.SIGINT, 130, "interrupted; re-run")],
                         ids=["SIGTERM", "SIGINT"])
def test_a_stop_of_a_video_ingest_and_its_workers_is_one_line(tmp_path, sig, code, said):
    """The signal reaches the command and its camera worker processes at once (a process
    group); the workers used to print a traceback each (the command's handler, inherited)."""
    dest = tmp_path / "cache"
    args = ["ingest", SAMPLE, dest, "--rate", "50", "--device", "cpu", "--no-progress",
            "--decode-workers", "2", "--camera-codec", "jpeg"]  # its video decoded by workers
    proc = subprocess.Popen([sys.executable, "-c", CTRL_C + fl.SLOW_CLI, *map(str, args)],
                            env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while len(_forked_children(proc.pid)) < 2:  # the camera workers are up
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
            time.sleep(0.02)
        os.killpg(proc.pid, sig)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    stopped = fl.Result(proc.returncode, out, err)
    deadline = time.monotonic() + 10
    while _group_alive(proc.pid) and time.monotonic() < deadline:  # PDEATHSIG, then gone
        time.sleep(0.05)
    left = _group_alive(proc.pid)
    fl.record(f"{signal.Signals(sig).name} to the process group of a video ingest (camera "
              "worker processes running)", f"one line, exit {stopped.code}; the workers end "
              "quietly, the lock is released", lost=holder(dest) is not None,
              traceback=stopped.traceback)
    assert stopped.code == code and stopped.one_line and said in err, err
    assert not left and holder(dest) is None


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads worker processes from /proc")
def test_ctrl_c_of_a_demo_serving_with_workers_is_one_line(tmp_path):
    """Ctrl-C while `robocache demo` serves through DataLoader worker processes: one line and
    exit 130, the workers quiet (42 lines and a traceback per worker before)."""
    dest = tmp_path / "demo"
    args = ["demo", "--dest", dest, "--device", "cpu", "--workers", "2", "--batches", "100000"]
    proc = subprocess.Popen([sys.executable, "-c", CTRL_C + fl.RUNNER, "-1", *map(str, args)],
                            env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        # the cache is built (its manifest says complete), then the loader's workers are up
        while not ((dest / "cache" / "manifest.json").exists() and
                   '"complete"' in (dest / "cache" / "manifest.json").read_text() and
                   len(_forked_children(proc.pid)) >= 2):
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    stopped = fl.Result(proc.returncode, out, err)
    fl.record("Ctrl-C of `demo` serving with --workers 2", f"one line, exit {stopped.code}; "
              "the workers end quietly", traceback=stopped.traceback)
    assert stopped.code == 130 and stopped.one_line and "interrupted" in err, err


RAY_DRIVER = """
import sys, time
import typer
from robocache.cli._errors import cli_errors
from robocache.distributed.preprocess import connect
try:
    with cli_errors():
        connect(None)
        print("ready", flush=True)
        time.sleep(120)
except typer.Exit as e:
    sys.exit(e.exit_code)
"""


def test_sigterm_once_ray_runs_is_one_line():
    """`robocache preprocess` joined (or started) Ray: Ray's failure signal handler took
    SIGTERM over and printed a 54-line stack before aborting; now the command's handler has
    it back (one line, exit 143)."""
    pytest.importorskip("ray")
    proc = subprocess.Popen([sys.executable, "-c", RAY_DRIVER], env=ENV, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    try:
        assert proc.stdout.readline().strip() == "ready", proc.stderr.read()
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    stopped = fl.Result(proc.returncode, out, err)
    fl.record("SIGTERM to preprocess once Ray runs", f"one line, exit {stopped.code} (Ray's "
              "signal handler printed a stack and aborted)", traceback=stopped.traceback)
    assert stopped.code == 143 and stopped.one_line and "terminated" in err, err


def _free_port_pair() -> int:
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port < 65534:
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port + 1))
                except OSError:
                    continue
            return port
    pytest.skip("no two free consecutive ports")


def _listening(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def test_kill_of_view_serve_stops_its_server(pristine):
    """`kill PID` of `robocache view --serve`: the Rerun server it started in a session of its
    own stops too and both ports are free again (it stayed, holding them)."""
    pytest.importorskip("rerun")
    port = _free_port_pair()
    proc = subprocess.Popen([sys.executable, "-m", "robocache.cli", "view",
                             str(pristine["lerobot-v3.0"][1]), "--serve", "--port", str(port)],
                            env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        lines = []
        while not any("Ctrl-C" in x for x in lines):
            line = proc.stdout.readline()
            assert line, (lines, proc.stderr.read())
            lines.append(line)
        assert _listening(port) and _listening(port + 1)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    deadline = time.monotonic() + 10
    while (_listening(port) or _listening(port + 1)) and time.monotonic() < deadline:
        time.sleep(0.1)
    held = [p for p in (port, port + 1) if _listening(p)]
    fl.record("`kill PID` (SIGTERM) of view --serve", f"the server stops with it, both ports "
              f"free, exit {proc.returncode}", traceback="Traceback" in err)
    assert proc.returncode == 0 and not err and not held, (err, held)
