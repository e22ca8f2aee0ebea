"""``robocache inspect``, ``view`` and ``export`` on a cache in an object store (a real
S3-protocol server: moto's server mode on 127.0.0.1) give what they give on the same cache
on disk; a missing bucket or prefix is one line and exit 2; export holds one episode's frames
at a time, not the whole frame table."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from data_episodes import SPECS, make_episode
from typer.testing import CliRunner

from robocache.cli import app
from robocache.data.cache import build
from robocache.data.formats.lerobot import write_lerobot
from robocache.data.location import Location
from robocache.data.publish import publish

ROOT = Path(__file__).resolve().parents[2]
CAMERA = "observation.images.cam"


def cli(*args, env: dict[str, str] | None = None):
    result = CliRunner().invoke(app, [str(a) for a in args], env=env)
    return result.exit_code, result.stdout, result.stderr


def options(server) -> list[str]:
    """The server's storage options as ``--storage-option KEY=VALUE`` flags."""
    return [x for k, v in server.options().items() for x in ("--storage-option", f"{k}={v}")]


@pytest.fixture(scope="module")
def caches(s3_server, tmp_path_factory):
    """A cache of four multi-rate episodes (numeric streams, JPEG camera frames, events) on
    disk, and the same cache published to ``s3://BUCKET/c``."""
    root = tmp_path_factory.mktemp("remote")
    rng = np.random.default_rng(7)
    write_lerobot(root / "src", [make_episode(i, rng) for i in range(4)], SPECS, fps=25.0,
                  version="v3.0")
    build(root / "src", root / "cache", rate_hz=40.0, progress=False, device="cpu")
    uri = f"s3://{s3_server.bucket()}/c"
    publish(root / "cache", Location(uri, s3_server.options()))
    return root / "cache", uri


def inspected(*args, env: dict[str, str] | None = None) -> dict:
    """``inspect --json``'s facts, all but the cache's name."""
    code, out, err = cli("inspect", *args, "--json", env=env)
    assert code == 0, err
    facts = json.loads(out)
    facts.pop("cache")
    return facts


def test_inspect_a_remote_cache_as_the_local_one(caches, s3_server):
    local, uri = caches
    facts = inspected(local)
    assert facts["status"] == "complete" and facts["cameras"][CAMERA]["frames"] > 0
    assert inspected(uri, *options(s3_server)) == facts


def test_inspect_takes_credentials_from_the_environment(caches, s3_server):
    local, uri = caches
    o = s3_server.options()
    env = {"AWS_ACCESS_KEY_ID": o["aws_access_key_id"],
           "AWS_SECRET_ACCESS_KEY": o["aws_secret_access_key"],
           "AWS_REGION": o["aws_region"], "AWS_ENDPOINT_URL": o["aws_endpoint"]}
    assert inspected(uri, env=env) == inspected(local)


def test_inspect_an_unfinished_remote_cache_names_no_writer(caches, s3_server, tmp_path):
    """An object store has no lock file: the writer is unknown (None), the episodes committed
    so far are counted from the table, as on disk."""
    local, _ = caches
    uri = f"s3://{s3_server.bucket()}/u"
    location = Location(uri, s3_server.options())
    publish(local, location)
    manifest = json.loads((local / "manifest.json").read_text())
    manifest["status"] = "building"
    location.write_bytes("manifest.json", json.dumps(manifest).encode())
    copy = tmp_path / "u"
    shutil.copytree(local, copy)
    (copy / "manifest.json").write_text(json.dumps(manifest))
    facts = inspected(uri, *options(s3_server))
    assert facts["status"] == "building" and facts["writer"] is None
    assert facts["episodes_cached"] == 4
    assert facts == inspected(copy)


def _rrd():
    spec = importlib.util.spec_from_file_location("view_rrd", ROOT / "tests" / "view" / "rrd.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.read_rrd


def test_view_a_remote_cache_as_the_local_one(caches, s3_server, tmp_path):
    pytest.importorskip("rerun", reason="rerun-sdk (robocache[view]) is not installed")
    read_rrd = _rrd()
    local, uri = caches
    picked = ["--episode", 0, "--episode", 3]
    code, out, err = cli("view", local, *picked, "--save", tmp_path / "local.rrd")
    assert code == 0, err
    code, remote_out, err = cli("view", uri, *picked, "--save", tmp_path / "remote.rrd",
                                *options(s3_server))
    assert code == 0, err
    assert remote_out.replace("remote.rrd", "local.rrd") == out
    want, want_static = read_rrd(tmp_path / "local.rrd")
    got, static = read_rrd(tmp_path / "remote.rrd")
    assert sorted(got) == sorted(want)
    assert f"episode_3/aligned/{CAMERA}/frame" in got
    assert got[f"episode_0/native/{CAMERA}"]["encoded"] > 0  # the cache's frames, read
    for path, w in want.items():
        for k, v in w.items():
            if isinstance(v, np.ndarray):
                np.testing.assert_array_equal(got[path][k], v, err_msg=f"{path} {k}")
            else:
                assert got[path][k] == v, (path, k)
    assert static.pop("info").replace(uri, str(local)) == want_static.pop("info")
    assert static == want_static


def test_export_a_remote_cache_as_the_local_one(caches, s3_server, tmp_path):
    pytest.importorskip("pandas", reason="writing LeRobot datasets needs pandas")
    import pyarrow.parquet as pq

    local, uri = caches
    code, out, err = cli("export", local, tmp_path / "local", "--cameras", "image", "--json")
    assert code == 0, err
    code, remote_out, err = cli("export", uri, tmp_path / "remote", "--cameras", "image",
                                "--json", *options(s3_server))
    assert code == 0, err
    summary = json.loads(remote_out)
    assert summary["features"][CAMERA] == "image" and summary["episodes"] == 4
    assert {**summary, "out": None} == {**json.loads(out), "out": None}
    files = sorted(str(p.relative_to(tmp_path / "local"))
                   for p in (tmp_path / "local").rglob("*") if p.is_file())
    assert files == sorted(str(p.relative_to(tmp_path / "remote"))
                           for p in (tmp_path / "remote").rglob("*") if p.is_file())
    assert "data/chunk-000/file-000.parquet" in files
    for rel in files:
        a, b = tmp_path / "local" / rel, tmp_path / "remote" / rel
        if rel.endswith(".parquet"):
            assert pq.read_table(b).equals(pq.read_table(a)), rel
        else:
            assert b.read_bytes() == a.read_bytes(), rel


COMMANDS = {"inspect": ["--json"], "view": ["--save", "{tmp}/v.rrd"],
            "export": ["{tmp}/out"]}


@pytest.mark.parametrize("missing", ["bucket", "prefix"])
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_missing_bucket_or_prefix_is_one_line(caches, s3_server, tmp_path, command, missing):
    if command == "view":
        pytest.importorskip("rerun", reason="rerun-sdk (robocache[view]) is not installed")
    _, uri = caches
    bucket = uri.split("/")[2]
    where = "s3://rc-no-such-bucket/c" if missing == "bucket" else f"s3://{bucket}/nothing"
    args = [a.format(tmp=tmp_path) for a in COMMANDS[command]]
    code, out, err = cli(command, where, *args, *options(s3_server))
    assert code == 2, (out, err)
    assert err.count("\n") == 1 and err.startswith("error: ") and where in err, err
    assert ("does not exist" if missing == "bucket" else "not a RoboCache cache") in err, err
    assert "damaged" not in err and "Traceback" not in out + err
    assert list(tmp_path.iterdir()) == []  # nothing written


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_bad_storage_option_is_one_line(caches, tmp_path, command):
    if command == "view":
        pytest.importorskip("rerun", reason="rerun-sdk (robocache[view]) is not installed")
    _, uri = caches
    args = [a.format(tmp=tmp_path) for a in COMMANDS[command]]
    code, _, err = cli(command, uri, *args, "--storage-option", "aws_region")
    assert code == 2 and err.count("\n") == 1 and "KEY=VALUE" in err, err


# The export's memory, measured in a child process: its resident set sampled every 2 ms
# while it runs (the kernel's high-water mark misses peaks freed before it is read), minus
# what it held before, with glibc's arenas capped so that freed memory is reused rather than
# kept per thread. Measured on a 300 MB frame table (2 cores): about 100 MB, of which about
# 60 MB is Lance's runtime (the same on a cache of tiny frames); the former whole-table read
# took 830 MB.
MEASURE = """
import os, sys, threading
import lance, pandas, PIL.Image, pyarrow.parquet  # noqa: loaded before the baseline
import robocache.data.cameras
from robocache.data.export import export_lerobot

page = os.sysconf("SC_PAGE_SIZE")

def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * page

peak, done = [0], threading.Event()

def watch():
    while not done.wait(0.002):
        peak[0] = max(peak[0], rss())

base = rss()
watcher = threading.Thread(target=watch)
watcher.start()
export_lerobot(sys.argv[1], sys.argv[2], cameras="image")
done.set()
watcher.join()
print(peak[0] - base)
"""


@pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="reads /proc (Linux)")
def test_export_holds_one_episode_of_frames_not_the_table(tmp_path):
    """50 episodes of 6 frames, each frame padded to 1 MB (bytes after the JPEG's end, which
    a decoder ignores): a 300 MB frame table. Export's peak memory stays under half of it."""
    pytest.importorskip("pandas", reason="writing LeRobot datasets needs pandas")
    import lance
    import pyarrow as pa

    rng = np.random.default_rng(3)
    write_lerobot(tmp_path / "src", [make_episode(i, rng, duration=0.6) for i in range(50)],
                  SPECS, fps=25.0, version="v3.0")
    cache = tmp_path / "cache"
    build(tmp_path / "src", cache, rate_hz=20.0, progress=False, device="cpu")
    uri = str(cache / "frames" / f"{CAMERA}.lance")
    table = lance.dataset(uri).to_table()
    pad = 1 << 20

    def padded():
        for batch in table.to_batches(max_chunksize=8):
            cols = [pa.array([v + rng.bytes(pad) for v in batch.column(n).to_pylist()],
                             batch.schema.field(n).type) if n == "encoded" else batch.column(n)
                    for n in batch.schema.names]
            yield pa.RecordBatch.from_arrays(cols, schema=batch.schema)

    lance.write_dataset(pa.RecordBatchReader.from_batches(table.schema, padded()), uri,
                        mode="overwrite")
    total = table.num_rows * pad
    assert total >= 250e6
    try:
        run = subprocess.run([sys.executable, "-c", MEASURE, str(cache), str(tmp_path / "out")],
                             capture_output=True, text=True, timeout=120,
                             env={**os.environ, "MALLOC_ARENA_MAX": "2",
                                  "PYTHONPATH": str(ROOT / "src")})
        assert run.returncode == 0, run.stderr[-2000:]
        grew = int(run.stdout.split()[-1])
        assert grew < total / 2, f"export grew by {grew / 1e6:.0f} MB over a " \
                                 f"{total / 1e6:.0f} MB frame table"
        assert (tmp_path / "out" / "data" / "chunk-000" / "file-000.parquet").exists()
    finally:
        shutil.rmtree(cache, ignore_errors=True)
