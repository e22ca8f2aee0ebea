"""``robocache view``: the saved .rrd, read back with Rerun's own reader, holds every stream of
the episodes asked for, sample by sample at the source's (or the cache's) times."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from data_episodes import SPECS, make_episode
from rrd import assert_times, read_rrd
from typer.testing import CliRunner

from robocache.cli import app
from robocache.data.cache import build, column_name
from robocache.data.formats import open_source
from robocache.data.formats.lerobot import write_lerobot

pytest.importorskip("rerun", reason="rerun-sdk (robocache[view]) is not installed")

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
RATE = 40.0
NUMERIC = [n for n, s in SPECS.items() if s.kind == "numeric"]


def run(*args: str):
    result = CliRunner().invoke(app, ["view", *map(str, args)])
    return result.exit_code, result.output


@pytest.fixture
def lerobot(tmp_path, rng) -> Path:
    episodes = [make_episode(i, rng) for i in range(4)]
    write_lerobot(tmp_path / "src", episodes, SPECS, fps=25.0, version="v3.0")
    return tmp_path / "src"


def check_native(got: dict, src, index: int) -> None:
    """Every native stream of episode ``index``, against the source read independently."""
    ep = src.read(index)
    root = f"episode_{index}/native"
    for name in NUMERIC:
        s = ep.streams[name]
        e = got[f"{root}/{name}"]
        assert_times(e["time"], s.times)
        np.testing.assert_array_equal(e["scalars"], s.data.reshape(len(s), -1))
    cam = ep.streams["observation.images.cam"]
    e = got[f"{root}/observation.images.cam"]
    assert e["images"] == len(cam)
    assert_times(e["time"], cam.times)
    note = ep.streams["language.note"]
    assert got[f"{root}/language.note"]["text"] == list(note.data)
    assert_times(got[f"{root}/language.note"]["time"], note.times)


def check_aligned(got: dict, rows: dict, index: int) -> None:
    """Every aligned column of episode ``index`` against the cache's rows."""
    root = f"episode_{index}/aligned"
    t = rows["timestamp"]
    for name, spec in SPECS.items():
        col = column_name(name)
        pad = got[f"{root}/{name}/is_pad"]
        assert_times(pad["time"], t)
        np.testing.assert_array_equal(pad["step"], np.arange(len(t)))
        np.testing.assert_array_equal(pad["scalars"][:, 0], rows[f"{col}_is_pad"])
        if spec.kind == "numeric":
            e = got[f"{root}/{name}"]
            assert_times(e["time"], t)
            np.testing.assert_array_equal(e["scalars"], np.asarray(rows[col], np.float64))
        elif spec.kind == "event":
            np.testing.assert_allclose(got[f"{root}/{name}/age"]["scalars"][:, 0],
                                       rows[f"{col}/age"], equal_nan=True)
            shown = [v for k, v in enumerate(rows[col]) if v is not None and
                     (k == 0 or v != rows[col][k - 1])]
            assert got[f"{root}/{name}"]["text"] == shown
        else:
            np.testing.assert_array_equal(got[f"{root}/{name}/frame"]["scalars"][:, 0],
                                          rows[f"{col}/frame"])
            np.testing.assert_allclose(got[f"{root}/{name}/offset"]["scalars"][:, 0],
                                       rows[f"{col}/offset"])


def cache_rows(cache: Path, index: int) -> dict:
    import lance

    table = lance.dataset(str(cache / "data.lance")).to_table(filter=f"episode_index = {index}")
    table = table.sort_by("step")
    return {c: (np.stack(table.column(c).to_pylist()) if c in map(column_name, NUMERIC)
                else table.column(c).to_pylist() if table.column(c).type == "string"
                else table.column(c).to_numpy(zero_copy_only=False))
            for c in table.column_names}


def test_source_at_its_own_times_and_aligned_like_ingest(tmp_path, lerobot):
    code, out = run(lerobot, "--episode", 1, "--episode", 3, "--rate", RATE,
                    "--save", tmp_path / "v.rrd")
    assert code == 0, out
    assert "episode 1:" in out and "episode 3:" in out and "saved" in out
    got, static = read_rrd(tmp_path / "v.rrd")
    assert not any(p.startswith(("episode_0/", "episode_2/")) for p in got)
    build(lerobot, tmp_path / "cache", rate_hz=RATE, progress=False, device="cpu")
    src = open_source(lerobot)
    for index in (1, 3):
        check_native(got, src, index)
        check_aligned(got, cache_rows(tmp_path / "cache", index), index)
        info = static[f"episode_{index}/info"]
        assert f"task {index % 2}" in info and "file-000.parquet" in info
        assert "aligned at 40 Hz" in info
    assert "observation.pose" in static["info"] and static["quarantined"].startswith("No ")
    assert not list(tmp_path.glob(".*partial"))


def test_cache_with_quarantine_and_a_moved_source(tmp_path, rng):
    episodes = [make_episode(i, rng) for i in range(3)]
    write_lerobot(tmp_path / "src", episodes, SPECS, fps=25.0, version="v2.1")
    bad = tmp_path / "src/data/chunk-000/episode_000001.parquet"
    pq.write_table(pq.read_table(bad).drop_columns(["observation.pose"]), bad)
    m = build(tmp_path / "src", tmp_path / "cache", rate_hz=RATE, progress=False, device="cpu")
    assert [q["index"] for q in m["quarantined"]] == [1]
    code, out = run(tmp_path / "cache", "--episode", 0, "--episode", 1, "--episode", 2,
                    "--save", tmp_path / "c.rrd")
    assert code == 0, out
    assert "quarantined episode 1:" in out and "observation.pose" in out
    got, static = read_rrd(tmp_path / "c.rrd")
    src = open_source(tmp_path / "src")
    for index in (0, 2):
        rows = cache_rows(tmp_path / "cache", index)
        check_aligned(got, rows, index)
        for name in NUMERIC:  # the source's own samples, read again
            assert_times(got[f"episode_{index}/native/{name}"]["time"],
                         src.read(index).streams[name].times)
        cam = got[f"episode_{index}/native/observation.images.cam"]  # the cache's JPEGs
        assert cam["encoded"] == len(episodes[index].streams["observation.images.cam"])
        assert_times(cam["time"], src.read(index).streams["observation.images.cam"].times)
    assert "episode 1:" in static["quarantined"] and "observation.pose" in \
        static["quarantined"]
    assert "quarantined" in static["episode_1/info"]
    assert not any(p.startswith("episode_1/aligned") for p in got)

    (tmp_path / "src").rename(tmp_path / "moved")
    code, out = run(tmp_path / "cache", "--save", tmp_path / "m.rrd")
    assert code == 0, out
    assert "cannot be opened" in out  # the notice, on stderr
    got, _ = read_rrd(tmp_path / "m.rrd")
    check_aligned(got, cache_rows(tmp_path / "cache", 0), 0)
    assert not any(p.startswith("episode_0/native/observation.") and "images" not in p
                   for p in got)


def test_video_frames_decoded_in_chunks(tmp_path):
    from robocache.data.cameras import decode_video
    from robocache.view.episodes import open_view

    src = FIXTURES / "cameras" / "lerobot_h264"
    view = open_view(src).episode(0)
    name = view.cameras[0]
    chunks = list(view.frames(name, chunk=4))
    assert all(len(t) == len(f) <= 4 for t, f in chunks)
    s = view.native.streams[name]
    frames, t, _ = decode_video(s.video.path, s.video.from_timestamp + s.times[0],
                                s.video.from_timestamp + s.times[-1])
    np.testing.assert_array_equal(np.concatenate([f for _, f in chunks]), frames)
    np.testing.assert_allclose(view.frame_times(name), t - s.video.from_timestamp)
    code, out = run(src, "--save", tmp_path / "v.rrd")
    assert code == 0, out
    got, _ = read_rrd(tmp_path / "v.rrd")
    assert got[f"episode_0/native/{name}"]["images"] == len(frames)
    assert_times(got[f"episode_0/native/{name}"]["time"], t - s.video.from_timestamp)


def test_zarr_and_rlds_sources(tmp_path, rng):
    import zarr

    ends = np.array([5, 12])
    state = rng.normal(size=(12, 3)).astype(np.float32)
    depth = rng.integers(0, 4000, (12, 4, 6), np.uint16)
    root = zarr.open_group(str(tmp_path / "rb.zarr"), mode="w", zarr_format=2)
    root.create_array("data/state", data=state)
    root.create_array("data/depth", data=depth)
    root.create_array("meta/episode_ends", data=ends)
    code, out = run(tmp_path / "rb.zarr", "--fps", 10, "--episode", 1, "--rate", "native",
                    "--save", tmp_path / "z.rrd")
    assert code == 0, out
    got, _ = read_rrd(tmp_path / "z.rrd")
    np.testing.assert_array_equal(got["episode_1/native/state"]["scalars"], state[5:12])
    assert_times(got["episode_1/native/state"]["time"], np.arange(7) / 10.0)
    assert got["episode_1/native/depth"]["depth"] == 7
    assert len(got["episode_1/aligned/state"]["time"]) == 7

    rlds = FIXTURES / "rlds" / "toy_rlds" / "jpeg"  # JPEG frames as the source stores them
    src = open_source(rlds, fps=10.0)
    index = src.episode_indices()[-1]
    code, out = run(rlds, "--fps", 10, "--episode", index, "--save", tmp_path / "r.rrd")
    assert code == 0, out
    got, _ = read_rrd(tmp_path / "r.rrd")
    ep = src.read(index)
    for name, s in ep.streams.items():
        entity = got[f"episode_{index}/native/{name}"]
        assert_times(entity["time"], s.times)
        if s.spec.kind in ("image", "video"):
            assert entity["images"] + entity["depth"] == len(s)


@pytest.mark.parametrize("args, needle", [
    (["--save", "{tmp}/v.png"], "--save must name a .rrd file"),
    (["--save", "{src}/inside.rrd"], "never written"),
    (["--save", "{tmp}/nowhere/v.rrd"], "does not exist"),
    (["--episode", "9", "--save", "{tmp}/v.rrd"], "its episodes are 0, 1, 2, 3"),
    (["--stream", "nope", "--save", "{tmp}/v.rrd"], "`streams` (--stream)"),
    (["--rate", "fast", "--save", "{tmp}/v.rrd"], "must be a rate > 0 Hz"),
    (["--port", "0", "--serve"], "--port"),
])
def test_bad_input_is_one_line_and_leaves_nothing(tmp_path, lerobot, args, needle):
    before = sorted(p for p in tmp_path.rglob("*"))
    code, out = run(lerobot, *[a.format(tmp=tmp_path, src=lerobot) for a in args])
    assert code == 2, out
    assert needle in out and "Traceback" not in out
    assert sorted(p for p in tmp_path.rglob("*")) == before


def test_no_display_and_missing_rerun(tmp_path, lerobot, monkeypatch):
    monkeypatch.delenv("DISPLAY", raising=False)
    monkeypatch.delenv("WAYLAND_DISPLAY", raising=False)
    code, out = run(lerobot)
    assert code == 2 and "no display" in out and "--save" in out
    monkeypatch.setitem(sys.modules, "rerun", None)
    code, out = run(lerobot, "--save", tmp_path / "v.rrd")
    assert code == 2 and "robocache[view]" in out, out
    assert not list(tmp_path.glob("*.rrd")) and not list(tmp_path.glob(".*partial"))


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


@pytest.mark.slow
def test_serve_listens_on_loopback_only_until_interrupted(tmp_path, lerobot):
    psutil = pytest.importorskip("psutil")
    port = _free_port_pair()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    # Ctrl-C as a terminal sends it, whatever this test runner inherited: a runner started in
    # the background of a non-interactive shell ignores SIGINT, and so would the command
    proc = subprocess.Popen([sys.executable, "-m", "robocache.cli", "view", str(lerobot),
                             "--serve", "--port", str(port)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        lines = []
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not any("Ctrl-C" in x for x in lines):
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
        assert any(f"http://127.0.0.1:{port}/?url=" in x for x in lines), lines
        listening = [c.laddr for c in psutil.net_connections("tcp")
                     if c.status == psutil.CONN_LISTEN and c.laddr.port in (port, port + 1)]
        assert sorted(a.port for a in listening) == [port, port + 1]
        assert all(a.ip == "127.0.0.1" for a in listening), listening
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
    time.sleep(0.5)
    assert not [c for c in psutil.net_connections("tcp") if c.status == psutil.CONN_LISTEN
                and c.laddr.port in (port, port + 1)]


def test_a_source_episode_failing_its_checks_is_listed_and_still_shown(tmp_path, rng):
    import pyarrow as pa

    episodes = [make_episode(i, rng) for i in range(2)]
    write_lerobot(tmp_path / "src", episodes, SPECS, fps=25.0, version="v2.1")
    path = tmp_path / "src/data/chunk-000/episode_000001.parquet"
    table = pq.read_table(path)
    ts = table.column("timestamp").to_numpy().copy()
    ts[[2, 5]] = ts[[5, 2]]
    pq.write_table(table.set_column(table.column_names.index("timestamp"), "timestamp",
                                    pa.array(ts)), path)
    code, out = run(tmp_path / "src", "--episode", 1, "--rate", RATE,
                    "--save", tmp_path / "v.rrd")
    assert code == 0, out
    assert "quarantined episode 1:" in out and "decrease" in out
    got, static = read_rrd(tmp_path / "v.rrd")
    assert "decrease" in static["quarantined"] and "quarantined" in static["episode_1/info"]
    # shown anyway, so the defect can be seen: the swapped rows out of order on the timeline
    assert len(got["episode_1/native/action"]["time"]) == len(episodes[1].streams["action"])
    assert not any(p.startswith("episode_1/aligned") for p in got)
