"""``robocache export`` around faults: the partial folder a killed export left, the episodes a
cache quarantined, and what the export says (LeRobot's codec names, no encoder banners)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import faultlib as fl
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

pytest.importorskip("av", reason="video export needs PyAV")
pytest.importorskip("pandas", reason="writing LeRobot datasets needs pandas")

BAD = 2  # the episode whose timestamps decrease: quarantined at ingest


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    """A cache of the 4x4-camera source with episode :data:`BAD` quarantined (two of its
    timestamps swapped in the source)."""
    root = tmp_path_factory.mktemp("export")
    src = fl.write_camera_source(root / "src")
    path = src / "data" / "chunk-000" / "file-000.parquet"
    table = pq.read_table(path)
    ts = table.column("timestamp").to_numpy().copy()
    rows = np.flatnonzero(table.column("episode_index").to_numpy() == BAD)
    ts[[rows[2], rows[5]]] = ts[[rows[5], rows[2]]]
    col = table.column_names.index("timestamp")
    pq.write_table(table.set_column(col, "timestamp",
                                    pa.array(ts, table.schema.field(col).type)), path)
    r = fl.cli("ingest", src, root / "cache", "--rate", fl.RATE, "--device", "cpu",
               "--no-progress")
    assert r.code == 3, r.stderr
    return root / "cache"


def export_process(*args: str) -> fl.Result:
    """``robocache export`` in a process of its own: SVT-AV1 writes to the process's stderr
    (file descriptor 2) from the library, at a log level read once per process."""
    p = subprocess.run([sys.executable, "-m", "robocache.cli", "export", *map(str, args)],
                       capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    return fl.Result(p.returncode, p.stdout, p.stderr)


@pytest.mark.parametrize("vcodec, name", [("libsvtav1", "av1"), ("libx264", "h264")])
def test_export_says_what_it_left_out_in_lerobots_names_and_nothing_else(cache, tmp_path,
                                                                         vcodec, name):
    """The quarantined episode is named (it was dropped without a word), ``info.json`` says
    LeRobot's codec name (it said ``svtav1``), and the encoder prints nothing (SVT-AV1: 24 to
    48 lines per export)."""
    out = tmp_path / "out"
    r = export_process(cache, out, "--vcodec", vcodec) if vcodec == "libsvtav1" else \
        fl.cli("export", cache, out, "--vcodec", vcodec)
    info = json.loads((out / "meta" / "info.json").read_text())
    codecs = {f["info"]["video.codec"] for f in info["features"].values() if "info" in f}
    said = [x for x in r.stdout.splitlines() if "quarantined" in x]
    fl.record(f"export (--vcodec {vcodec}) of a cache with a quarantined episode",
              f"exit {r.code}; one line names the quarantined episode ({BAD}) it leaves out; "
              f"info.json's codec {sorted(codecs)}; no encoder log", traceback=r.traceback)
    assert r.code == 0 and r.stderr == "", r.stderr[-2000:]
    assert said == [f"not exported: 1 quarantined episode of the cache ({BAD}; a quarantined "
                    "episode has no rows, `robocache inspect CACHE` says why)"], r.stdout
    assert codecs == {name} and info["total_episodes"] == fl.EPISODES - 1


def test_the_partial_folder_of_a_killed_export_goes_at_the_next(cache, tmp_path):
    """A killed export leaves ``.OUT.partial-PID``; the next export to OUT removes it when
    that process is gone and it is RoboCache's, and only then."""
    out = tmp_path / "out"
    dead, gone = (subprocess.Popen([sys.executable, "-c", "pass"]) for _ in range(2))
    dead.wait()  # pids no process has now
    gone.wait()
    stale = tmp_path / f".out.partial-{dead.pid}"
    (stale / "data" / "chunk-000").mkdir(parents=True)
    (stale / "data" / "chunk-000" / "file-000.parquet").write_bytes(b"PAR1 half")
    (stale / ".robocache-export.json").write_text(json.dumps({"host": socket.gethostname(),
                                                              "pid": dead.pid}))
    old = tmp_path / f".out.partial-{gone.pid}"  # one of an older export: no mark
    (old / "meta").mkdir(parents=True)
    live = tmp_path / f".out.partial-{os.getppid()}"  # a running export's (this runner's)
    (live / "data").mkdir(parents=True)
    (live / ".robocache-export.json").write_text(json.dumps({"host": socket.gethostname(),
                                                             "pid": os.getppid()}))
    mine = tmp_path / f".out.partial-{dead.pid}0"  # the user's own, under that name
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    r = fl.cli("export", cache, out, "--cameras", "image")
    left = sorted(p.name for p in tmp_path.iterdir())
    fl.record("export after one to the same OUT was killed (its .OUT.partial-PID left)",
              f"removed (said on stderr) when its process is gone, exit {r.code}; a live "
              "export's and a folder RoboCache did not make are kept",
              lost=not (mine / "notes.txt").exists(), traceback=r.traceback)
    assert r.code == 0, r.stderr
    assert left == sorted(["out", live.name, mine.name]), left
    assert sorted(r.stderr.splitlines()) == sorted(
        f"note: removed {p}, left by an export to {out} that was killed" for p in (stale, old))
    assert not (out / ".robocache-export.json").exists()
