"""Fault injection on the data path: bad destinations, concurrent writers, corrupt and truncated
files of every format, a full disk, a read-only destination, bad options.

Each case checks that nothing was lost (the source's bytes are unchanged; the cache holds each
episode once, equal to a clean build) and that the CLI failed, if at all, with one line and its
documented exit code; it records a row of docs/reliability.md's table (see faultlib).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import faultlib as fl
import numpy as np
import pytest
import torch
import zarr

ALL = range(fl.EPISODES)
TIMELESS = ("--fps", str(fl.FPS))  # zarr and robomimic sources


def ingest(src, dest, *extra):
    fps = TIMELESS if src.name.endswith((".zarr", ".hdf5")) else ()
    return fl.cli("ingest", src, dest, "--rate", fl.RATE, "--device", "cpu", "--no-progress",
                  *fps, *extra)


def quarantined(dest) -> dict[int, str]:
    m = json.loads((dest / "manifest.json").read_text())
    c = m["counts"]
    assert c["read"] == c["cached"] + c["quarantined"], c
    return {q["index"]: q["reason"] for q in m["quarantined"]}


def failed_cleanly(r: fl.Result, code: int) -> bool:
    return r.code == code and r.one_line and not r.traceback


# --- the destination ----------------------------------------------------------------------

@pytest.mark.parametrize("kind", fl.FORMATS)
def test_source_as_dest_is_refused(pristine, tmp_path, kind):
    src = fl.copy_source(pristine[kind][0], tmp_path)
    before = fl.tree_hash(src)
    r = ingest(src, src, "--overwrite")
    lost = fl.tree_hash(src) != before
    fl.record(f"DEST is the source ({kind}), with --overwrite", f"refused, exit {r.code}",
              lost=lost, traceback=r.traceback)
    assert failed_cleanly(r, 2) and "inside the source" in r.stderr and not lost


def test_dest_inside_source_is_refused(pristine, tmp_path):
    src = fl.copy_source(pristine["lerobot-v3.0"][0], tmp_path)
    before = fl.tree_hash(src)
    r = ingest(src, src / "cache")
    lost = fl.tree_hash(src) != before
    fl.record("DEST inside the source", f"refused, exit {r.code}", lost=lost,
              traceback=r.traceback)
    assert failed_cleanly(r, 2) and not (src / "cache").exists() and not lost


def test_overwrite_never_deletes_a_directory_that_is_not_a_cache(pristine, tmp_path):
    dest = tmp_path / "mine"
    (dest / "sub").mkdir(parents=True)
    (dest / "notes.txt").write_text("keep me")
    (dest / "sub" / "data.bin").write_bytes(b"\0" * 100)
    before = fl.tree_hash(dest)
    r = ingest(pristine["lerobot-v3.0"][0], dest, "--overwrite")
    lost = fl.tree_hash(dest) != before
    fl.record("--overwrite on a directory that is not a cache",
              f"refused naming the path, nothing deleted, exit {r.code}", lost=lost,
              traceback=r.traceback)
    assert failed_cleanly(r, 2) and str(dest) in r.stderr and not lost


def test_overwrite_replaces_a_cache_and_says_what_it_removes(pristine, tmp_path):
    src, clean = pristine["lerobot-v2.1"]
    dest = tmp_path / "cache"
    assert ingest(src, dest, "--key", "state").code == 0
    r = ingest(src, dest, "--overwrite")
    ok = fl.same_as_clean(dest, clean, ALL)
    fl.record("--overwrite on a RoboCache cache", f"removed (listed on stderr), rebuilt, exit "
              f"{r.code}", lost=not ok, traceback=r.traceback)
    assert r.code == 0 and "removing the RoboCache cache" in r.stderr and ok


def test_overwrite_keeps_what_the_cache_does_not_own(pristine, tmp_path):
    src, clean = pristine["lerobot-v3.0"]
    dest = tmp_path / "cache"
    assert ingest(src, dest, "--key", "state").code == 0
    (dest / "my_notes.txt").write_text("keep me")
    (dest / "checkpoints").mkdir()
    (dest / "checkpoints" / "step_100.pt").write_bytes(b"\1" * 64)
    mine = {p: fl.tree_hash(dest / p) for p in ("my_notes.txt", "checkpoints")}
    r = ingest(src, dest, "--overwrite")
    kept = all(fl.tree_hash(dest / p) == h for p, h in mine.items())
    ok = kept and fl.same_as_clean(dest, clean, ALL)
    fl.record("--overwrite on a cache that also holds my_notes.txt and checkpoints/",
              f"removes only what the manifest says the cache owns (listed, and what it keeps), "
              f"rebuilds, exit {r.code}", lost=not ok, traceback=r.traceback)
    assert r.code == 0 and ok and "keeping what is not the cache's: checkpoints, my_notes.txt" \
        in r.stderr


def test_a_stray_manifest_without_tables_is_not_a_cache(pristine, tmp_path):
    src, clean = pristine["lerobot-v3.0"]
    dest = tmp_path / "experiment"
    (dest / "runs" / "0").mkdir(parents=True)
    (dest / "experiment.yaml").write_text("lr: 1e-4\n")
    (dest / "runs" / "0" / "log.txt").write_text("epoch 1\n")
    (dest / "manifest.json").write_bytes((clean / "manifest.json").read_bytes())
    before = fl.tree_hash(dest)
    results = [ingest(src, dest, "--overwrite"), ingest(src, dest)]
    lost = fl.tree_hash(dest) != before
    fl.record("--overwrite (or a resume) on a dir with experiment.yaml, runs/ and a stray "
              "manifest.json of a cache but no Lance tables",
              f"refused naming the missing tables, nothing deleted, exit {results[0].code}",
              lost=lost, traceback=any(r.traceback for r in results))
    assert all(failed_cleanly(r, 2) and "data.lance" in r.stderr for r in results)
    assert not lost


def test_dest_is_a_file(pristine, tmp_path):
    dest = tmp_path / "file"
    dest.write_text("x")
    r = ingest(pristine["zarr"][0], dest)
    lost = dest.read_text() != "x"
    fl.record("DEST is a file", f"refused, exit {r.code}", lost=lost, traceback=r.traceback)
    assert failed_cleanly(r, 2) and "is a file" in r.stderr and not lost


def make_read_only(path) -> None:
    """chmod 555, and for root (who ignores permission bits) the immutable attribute."""
    os.chmod(path, 0o555)
    if os.geteuid() == 0 and subprocess.run(["chattr", "+i", str(path)],
                                            capture_output=True).returncode != 0:
        pytest.skip("running as root on a file system without chattr +i")


def test_read_only_dest(pristine, tmp_path):
    src = pristine["lerobot-v3.0"][0]
    before = fl.tree_hash(src)
    dest = tmp_path / "ro"
    dest.mkdir()
    make_read_only(dest)
    try:
        r = ingest(src, dest)
    finally:
        subprocess.run(["chattr", "-i", str(dest)], capture_output=True)
        os.chmod(dest, 0o755)
    lost = fl.tree_hash(src) != before or any(dest.iterdir())
    fl.record("read-only DEST", f"refused, exit {r.code}", lost=lost, traceback=r.traceback)
    assert failed_cleanly(r, 2) and str(dest) in r.stderr and not lost


# --- writers: one at a time; kill -9; resume ------------------------------------------------

def test_second_writer_then_kill_then_resume(pristine, tmp_path):
    src, clean = pristine["lerobot-v3.0"]
    before = fl.tree_hash(src)
    dest = tmp_path / "cache"
    proc = fl.slow_writer(src, dest, 0.5)
    try:
        second = ingest(src, dest)
        busy = fl.cli("inspect", dest)
        deadline = time.monotonic() + 60
        while fl.lance_version(dest / "data.lance") < 2:
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.02)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    killed = fl.cli("inspect", dest)
    resumed = ingest(src, dest, "--wait")
    ok = fl.same_as_clean(dest, clean, ALL) and fl.tree_hash(src) == before
    fl.record("a second writer on the same DEST", "fails at once naming the first (pid, host), "
              f"exit {second.code}; inspect says who is building", lost=not ok,
              traceback=second.traceback or busy.traceback)
    fl.record("kill -9 mid-ingest, then inspect and re-run", "inspect says unfinished with the "
              f"episodes so far (exit {killed.code}); re-run resumes, exit {resumed.code}",
              lost=not ok, traceback=killed.traceback or resumed.traceback)
    assert failed_cleanly(second, 2) and f"pid {proc.pid}" in second.stderr
    assert busy.code == 0 and f"being built by pid {proc.pid}" in busy.stdout
    assert killed.code == 0 and "unfinished" in killed.stdout and "cached so far" in killed.stdout
    assert resumed.code == 0 and ok


# Kill points of a batched build: the build writes and commits episodes in batches of 3.
KILL_BUILD = """
import os, signal, sys
import robocache.data.build.commit as C
import robocache.data.build.read as R
import robocache.data.build.write as W
from robocache.data.cache import build
from robocache.data.formats import open_source
src, dest, point, rate = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
processes = point == "in worker processes, after the first commit"
src = src if processes else open_source(src)  # a path: workers open it
add, commit, calls = W.Batch.add, C.commit, []
def die():  # the build's worker processes named in DEST.workers first
    me = str(os.getpid())
    kids = [d for d in os.listdir("/proc") if d.isdigit() and os.path.exists(f"/proc/{d}/stat")
            and open(f"/proc/{d}/stat").read().rsplit(")", 1)[1].split()[1] == me] \
        if os.path.isdir("/proc") else []
    open(dest + ".workers", "w").write(" ".join(kids))
    os.kill(os.getpid(), signal.SIGKILL)
def adding(batch, i, tables):  # episodes 0-2 committed, 3 in the batch
    if point == "inside a batch" and i == 4:
        die()
    add(batch, i, tables)
def committing(dest, episodes, written):
    calls.append(episodes)
    if len(calls) == 1 and point == "before the first commit":
        die()
    if len(calls) == 2 and point == "between a batch's write and its commit":
        die()
    if len(calls) == 2 and point == "between its frames commit and its rows commit":
        commit(dest, episodes, [w for w in written if w[0] != "data.lance"])
        die()
    commit(dest, episodes, written)
    if processes:  # chunks of 2 episodes are being prepared and written by the workers
        die()
W.Batch.add, C.commit, R.CHUNK, R.FILE_EPISODES = adding, committing, (2, 256), 2  # 3 chunks of 2
build(src, dest, rate_hz=rate, progress=False, device="cpu", decode_workers=2,
      decode_processes=processes, batch_rows=3 * STEPS)
""".replace("STEPS", str(fl.STEPS))
KILL_POINTS = ("inside a batch", "between a batch's write and its commit",
               "between its frames commit and its rows commit",
               "in worker processes, after the first commit")


def _alive(pid: str) -> bool:
    """Whether a process runs (a zombie, dead and not yet reaped, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.parametrize("point", KILL_POINTS)
def test_kill_inside_a_batch_then_resume(tmp_path, point):
    src = fl.write_camera_source(tmp_path / "src")
    before = fl.tree_hash(src)
    clean, dest = tmp_path / "clean", tmp_path / "cache"
    assert ingest(src, clean).code == 0
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    killed = subprocess.run([sys.executable, "-c", KILL_BUILD, str(src), str(dest), point,
                             str(fl.RATE)], env=env, timeout=120)
    partial = sorted(fl.load_cache(dest)) if (dest / "data.lance").exists() else []
    resumed = ingest(src, dest)
    m = json.loads((dest / "manifest.json").read_text())
    c = m["counts"]
    ok = fl.same_as_clean(dest, clean, ALL) and fl.same_frames(dest, clean) and \
        fl.tree_hash(src) == before and c["read"] == c["cached"] + c["quarantined"] and \
        c["skipped"] == len(partial) and c["new"] == fl.EPISODES - len(partial)
    fl.record(f"kill -9 {point} (episodes written and committed 3 at a time), then re-run",
              f"episodes committed before the kill kept ({len(partial)}), the rest redone; "
              f"each episode and camera frame once, exit {resumed.code}", lost=not ok,
              traceback=resumed.traceback)
    assert killed.returncode == -signal.SIGKILL
    if "processes" in point and Path("/proc").is_dir():  # no worker outlives the killed build
        workers = Path(f"{dest}.workers").read_text().split()
        assert workers
        deadline = time.monotonic() + 10
        while any(_alive(w) for w in workers) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(_alive(w) for w in workers), workers
    first = [0, 1, 2, 3] if "processes" in point else [0, 1, 2]
    assert partial == first and resumed.code == 0 and ok


@pytest.mark.parametrize("versions", ["absent", "empty"])
def test_killed_in_the_first_batch_then_inspect_view_and_resume(tmp_path, versions):
    """Killed (or out of disk, Ctrl-C) before its first commit, a build leaves tables with
    data files and no ``_versions`` (or, killed inside Lance's commit, an empty one): inspect
    and view say the cache is unfinished and to re-run the ingest, which resumes."""
    src = fl.write_camera_source(tmp_path / "src")
    clean, dest = tmp_path / "clean", tmp_path / "cache"
    assert ingest(src, clean).code == 0
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    killed = subprocess.run([sys.executable, "-c", KILL_BUILD, str(src), str(dest),
                             "before the first commit", str(fl.RATE)], env=env, timeout=120)
    tables = [dest / "data.lance", *(dest / "frames").glob("*.lance")]
    assert killed.returncode == -signal.SIGKILL and all(list(t.rglob("*.lance")) for t in tables)
    assert not any((t / "_versions").exists() for t in tables)
    if versions == "empty":
        for t in tables:
            (t / "_versions").mkdir()
    seen = fl.cli("inspect", dest)
    shown = fl.cli("view", dest, "--save", tmp_path / "v.rrd")
    plotted = fl.cli("inspect", dest, "--plot", tmp_path / "p.png")
    resumed = ingest(src, dest)
    ok = fl.same_as_clean(dest, clean, ALL) and fl.same_frames(dest, clean)
    fl.record(f"kill -9 before the first commit (tables with data files, `_versions` "
              f"{versions}), then inspect, view and re-run",
              f"inspect says unfinished, re-run the ingest (exit {seen.code}); view and "
              f"inspect --plot say so in one line (exit {shown.code}, {plotted.code}); re-run "
              f"resumes, exit {resumed.code}", lost=not ok,
              traceback=seen.traceback or shown.traceback or plotted.traceback
              or resumed.traceback)
    assert seen.code == 0 and not seen.traceback
    assert "unfinished" in seen.stdout and "re-run the same ingest" in seen.stdout
    for r in (shown, plotted):
        assert failed_cleanly(r, 2), r.stderr
        assert "unfinished cache" in r.stderr and "re-run the same `robocache ingest`" in r.stderr
    assert not (tmp_path / "v.rrd").exists() and not (tmp_path / "p.png").exists()
    assert resumed.code == 0 and ok


def test_disk_full_then_resume(pristine, tmp_path):
    src, clean = pristine["lerobot-v2.1"]
    dest = tmp_path / "cache"
    # bytes per file: the first episodes fit, the compacted data file does not
    full = fl.cli_process("ingest", src, dest, "--device", "cpu", "--rate", fl.RATE,
                          "--no-progress", fsize=4096)
    r = ingest(src, dest)
    ok = fl.same_as_clean(dest, clean, ALL)
    fl.record("disk full while writing (file-size limit)",
              f"stops with one line, exit {full.code}; re-run resumes, exit {r.code}",
              lost=not ok, traceback=full.traceback or r.traceback)
    assert failed_cleanly(full, 2) and "re-run to resume" in full.stderr, full.stderr
    assert ".rs:" not in full.stderr  # no source location of the Rust library below
    assert r.code == 0 and ok


def test_truncated_manifest(pristine, tmp_path):
    src, clean = pristine["lerobot-v3.0"]
    dest = tmp_path / "cache"
    assert ingest(src, dest).code == 0
    text = (dest / "manifest.json").read_text()
    (dest / "manifest.json").write_text(text[: len(text) // 2])
    seen = fl.cli("inspect", dest)
    resumed = ingest(src, dest)
    rebuilt = ingest(src, dest, "--overwrite")
    ok = fl.same_as_clean(dest, clean, ALL)
    fl.record("truncated manifest.json", f"inspect and resume refuse with the fix (exit "
              f"{seen.code}, {resumed.code}); --overwrite rebuilds, exit {rebuilt.code}",
              lost=not ok, traceback=seen.traceback or resumed.traceback)
    assert failed_cleanly(seen, 2) and failed_cleanly(resumed, 2) and "--overwrite" in seen.stderr
    assert rebuilt.code == 0 and ok


# --- an edited source ------------------------------------------------------------------------

def test_an_edited_source_is_refused_or_rebuilt_and_warned_of(pristine, tmp_path):
    import warnings

    from robocache.data import RobotDataset
    from robocache.data.cache import build

    src = fl.copy_source(pristine["lerobot-v3.0"][0], tmp_path / "s")
    dest = tmp_path / "cache"
    assert ingest(src, dest).code == 0
    before = fl.load_cache(dest)
    os.utime(src / "meta" / "info.json")  # touched, not changed: nothing to do
    touched = ingest(src, dest)
    fl.edit_episode(src, 0)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        RobotDataset(dest)
        RobotDataset(dest)
    refused = ingest(src, dest)
    kept = all(fl.load_cache(dest)[i].equals(before[i]) for i in ALL)
    rebuilt = ingest(src, dest, "--rebuild-changed")
    build(src, tmp_path / "fresh", rate_hz=fl.RATE, device="cpu", progress=False)
    ok = kept and fl.same_as_clean(dest, tmp_path / "fresh", ALL) and \
        not fl.load_cache(dest)[0].equals(before[0]) and \
        all(fl.load_cache(dest)[i].equals(before[i]) for i in ALL if i)
    stale = [str(w.message) for w in said if "changed since" in str(w.message)]
    fl.record("the source edited after caching (episode 0 of a LeRobot v3.0 data file)",
              "opening the cache warns once naming the file (its episodes may be stale); a "
              f"re-run refuses naming episode 0 "
              f"(exit {refused.code}, cache unchanged); --rebuild-changed rebuilds only it (exit "
              f"{rebuilt.code}); a touched file alone changes nothing (exit {touched.code})",
              lost=not ok, traceback=refused.traceback or rebuilt.traceback)
    assert touched.code == 0 and "1 cached episodes differ" not in touched.stderr
    assert failed_cleanly(refused, 2) and "episodes differ (0;" in refused.stderr and \
        "--rebuild-changed" in refused.stderr, refused.stderr
    assert rebuilt.code == 0 and ok
    # (without reading the source, every episode of the changed file may be stale)
    assert len(stale) == 1 and "file-000.parquet): episodes [0, 1" in stale[0], stale


def test_an_edited_zarr_chunk_names_its_episode(pristine, tmp_path):
    from robocache.data.cache import build

    src = fl.copy_source(pristine["zarr"][0], tmp_path / "s")
    dest = tmp_path / "cache"
    assert ingest(src, dest).code == 0
    zarr.open_group(str(src), mode="r+")["data"]["state"][120:150] = 7.0  # episode 4's chunk
    refused = ingest(src, dest)
    rebuilt = ingest(src, dest, "--rebuild-changed")
    build(src, tmp_path / "fresh", rate_hz=fl.RATE, device="cpu", progress=False,
          source_options={"fps": fl.FPS})
    ok = fl.same_as_clean(dest, tmp_path / "fresh", ALL)
    fl.record("zarr: one episode's chunk rewritten after caching", "a re-run refuses naming "
              f"that episode and chunk (exit {refused.code}); --rebuild-changed rebuilds it "
              f"(exit {rebuilt.code})", lost=not ok,
              traceback=refused.traceback or rebuilt.traceback)
    assert failed_cleanly(refused, 2) and "differ (4; e.g. data/state/4.0 changed)" in \
        refused.stderr, refused.stderr
    assert rebuilt.code == 0 and ok


# --- corrupt and truncated files ------------------------------------------------------------

def test_truncated_parquet_v30(pristine, tmp_path):
    src = fl.copy_source(pristine["lerobot-v3.0"][0], tmp_path)
    fl.truncate(src / "data" / "chunk-000" / "file-000.parquet")
    before = fl.tree_hash(src)
    seen = fl.cli("inspect", src)
    r = ingest(src, tmp_path / "cache")
    reasons = quarantined(tmp_path / "cache")
    ok = fl.tree_hash(src) == before and sorted(reasons) == list(ALL) and \
        all("file-000.parquet" in v and "rows" in v for v in reasons.values())
    fl.record("LeRobot v3.0: truncated data parquet (all episodes in it)",
              f"each episode quarantined with file, rows and error; nothing cached, exit {r.code};"
              f" inspect lists them, exit {seen.code}", lost=not ok,
              traceback=r.traceback or seen.traceback)
    assert r.code == 4 and seen.code == 0 and "unreadable" in seen.stdout and ok


def test_truncated_parquet_v21(pristine, tmp_path):
    src, clean = pristine["lerobot-v2.1"]
    src = fl.copy_source(src, tmp_path)
    fl.truncate(src / "data" / "chunk-000" / "episode_000002.parquet")
    r = ingest(src, tmp_path / "cache")
    reasons = quarantined(tmp_path / "cache")
    ok = list(reasons) == [2] and "episode_000002.parquet" in reasons[2] and \
        fl.same_as_clean(tmp_path / "cache", clean, [0, 1, 3, 4, 5])
    fl.record("LeRobot v2.1: one truncated episode parquet",
              f"that episode quarantined (file, error), the rest cached, exit {r.code}",
              lost=not ok, traceback=r.traceback)
    assert r.code == 3 and ok


def test_corrupt_zarr_chunk_then_retry(pristine, tmp_path):
    src, clean = pristine["zarr"]
    src = fl.copy_source(src, tmp_path)
    chunk = src / "data" / "action" / "2.0"
    good = chunk.read_bytes()
    chunk.write_bytes(b"\xff" * len(good))
    dest = tmp_path / "cache"
    r = ingest(src, dest)
    reasons = quarantined(dest)
    partial = list(reasons) == [2] and "rows 60:90" in reasons[2] and \
        fl.same_as_clean(dest, clean, [0, 1, 3, 4, 5])
    again = ingest(src, dest)  # still quarantined, not retried
    chunk.write_bytes(good)
    retried = ingest(src, dest, "--retry-quarantined")
    ok = partial and again.code == 3 and fl.same_as_clean(dest, clean, ALL)
    fl.record("zarr: one corrupt chunk", f"its episode quarantined (rows, error), the rest cached,"
              f" exit {r.code}; after repair --retry-quarantined caches it, exit {retried.code}",
              lost=not ok, traceback=r.traceback or retried.traceback)
    assert r.code == 3 and retried.code == 0 and ok


def test_missing_zarr_chunk(pristine, tmp_path):
    from robocache.data.cache import build

    src, clean = pristine["zarr"]
    src = fl.copy_source(src, tmp_path)
    (src / "data" / "action" / "3.0").unlink()
    r = ingest(src, tmp_path / "cache")
    reasons = quarantined(tmp_path / "cache")
    ok = list(reasons) == [3] and "data/action/3.0" in reasons[3] and \
        "rows 90:120" in reasons[3] and fl.same_as_clean(tmp_path / "cache", clean, [0, 1, 2, 4, 5])
    # a writer that left out all-fill chunks on purpose: read as zarr does, when asked
    filled = build(src, tmp_path / "filled", rate_hz=fl.RATE, device="cpu", progress=False,
                   source_options={"fps": fl.FPS, "missing_chunks": "fill"})
    zeros = fl.load_cache(tmp_path / "filled")[3].column("action").to_pylist()
    fl.record("zarr: one missing chunk", f"its episode quarantined (chunk, rows), the rest cached, "
              f"exit {r.code}; read as the fill value only with missing_chunks='fill'",
              lost=not ok, traceback=r.traceback)
    assert r.code == 3 and ok
    assert filled["counts"]["cached"] == fl.EPISODES and all(v == [0, 0] for v in zeros)


@pytest.mark.parametrize("ends, bad, code", [
    ([30, 60, 45, 120, 150, 180], [2, 3], 3),  # decreasing: empty, then overlapping
    ([30, 60, 90, 120, 150, 200], [5], 3),  # past the data
    ([30, 60, 90, 120, 150, 170], None, 2),  # short of the data: rows of no episode
], ids=["decreasing", "past-the-data", "short-of-the-data"])
def test_zarr_episode_ends(pristine, tmp_path, ends, bad, code):
    src, clean = pristine["zarr"]
    src = fl.copy_source(src, tmp_path)
    meta = zarr.open_group(str(src), mode="r+")["meta"]
    del meta["episode_ends"]
    meta.create_array("episode_ends", data=np.array(ends))
    r = ingest(src, tmp_path / "cache")
    if bad is None:
        ok = not (tmp_path / "cache").exists() and failed_cleanly(r, 2)
        what = "refused: rows would belong to no episode"
    else:
        reasons = quarantined(tmp_path / "cache")
        ok = sorted(reasons) == bad and fl.same_as_clean(
            tmp_path / "cache", clean, [i for i in ALL if i not in bad])
        what = "the affected episodes quarantined with the reason, the rest cached"
    fl.record(f"zarr: meta/episode_ends {ends}", f"{what}, exit {r.code}", lost=not ok,
              traceback=r.traceback)
    assert r.code == code and ok


def test_corrupt_hdf5_chunk(pristine, tmp_path):
    import h5py

    src, clean = pristine["robomimic"]
    src = fl.copy_source(src, tmp_path)
    with h5py.File(src, "r") as f:
        info = f["data/demo_2/actions"].id.get_chunk_info(0)
    with open(src, "r+b") as f:
        f.seek(info.byte_offset)
        f.write(b"\xff" * info.size)
    r = ingest(src, tmp_path / "cache")
    reasons = quarantined(tmp_path / "cache")
    ok = list(reasons) == [2] and "demo_2" in reasons[2] and \
        fl.same_as_clean(tmp_path / "cache", clean, [0, 1, 3, 4, 5])
    fl.record("robomimic HDF5: one corrupt chunk", f"its episode quarantined (group, error), the "
              f"rest cached, exit {r.code}", lost=not ok, traceback=r.traceback)
    assert r.code == 3 and ok


@pytest.mark.parametrize("damage", ["junk", "truncated"])
def test_unreadable_hdf5(pristine, tmp_path, damage):
    src = fl.copy_source(pristine["robomimic"][0], tmp_path)
    if damage == "junk":
        src.write_bytes(b"this is not an HDF5 file" * 10)
    else:
        fl.truncate(src, 0.3)
    r = ingest(src, tmp_path / "cache")
    fl.record(f"robomimic HDF5: {damage} file", f"one line, exit {r.code}",
              traceback=r.traceback)
    assert failed_cleanly(r, 2) and "HDF5" in r.stderr


INFOS = {"malformed JSON": "{not json", "no fps": json.dumps({"codebase_version": "v3.0"}),
         "fps 0": "fps0"}


@pytest.mark.parametrize("what", INFOS)
def test_bad_info_json(pristine, tmp_path, what):
    info = INFOS[what]
    src = fl.copy_source(pristine["lerobot-v3.0"][0], tmp_path)
    path = src / "meta" / "info.json"
    if info == "fps0":
        info = json.dumps({**json.loads(path.read_text()), "fps": 0})
    path.write_text(info)
    results = [ingest(src, tmp_path / "cache"), fl.cli("inspect", src)]
    fl.record(f"LeRobot meta/info.json: {what}", "ingest and inspect: one line naming "
              f"meta/info.json, exit {results[0].code}",
              traceback=any(r.traceback for r in results))
    for r in results:
        assert failed_cleanly(r, 2) and "meta/info.json" in r.stderr


def test_bad_episode_metadata_line(pristine, tmp_path):
    src = fl.copy_source(pristine["lerobot-v2.1"][0], tmp_path)
    with open(src / "meta" / "episodes.jsonl", "a") as f:
        f.write("{truncated\n")
    r = ingest(src, tmp_path / "cache")
    fl.record("LeRobot v2.1: a malformed episodes.jsonl line", f"one line naming the file and "
              f"line, exit {r.code}", traceback=r.traceback)
    assert failed_cleanly(r, 2) and "episodes.jsonl line 7" in r.stderr


# --- options --------------------------------------------------------------------------------

OPTIONS = [
    ("--rate inf", ("--rate", "inf"), "--rate"),
    ("--rate 0", ("--rate", "0"), "--rate"),
    ("--fps 0 on a source without timestamps", ("--fps", "0"), "--fps"),
    ("--device cuda without CUDA", ("--device", "cuda"), "--device"),
    ("--device tpu", ("--device", "tpu"), "--device"),
    ("--key naming a missing stream", ("--key", "nope"), "--key"),
]


@pytest.mark.parametrize("what, args, named", OPTIONS, ids=[o[0] for o in OPTIONS])
def test_bad_options(pristine, tmp_path, what, args, named):
    if "cuda" in args and torch.cuda.is_available():
        pytest.skip("CUDA is available")
    src = pristine["zarr"][0]
    dest = tmp_path / "cache"
    r = fl.cli("ingest", src, dest, "--no-progress", "--device", "cpu", *args)
    after = ingest(src, dest)  # a refused run leaves nothing that refuses the next one
    fl.record(what, f"one line naming {named}, exit {r.code}; nothing left behind",
              lost=after.code != 0, traceback=r.traceback)
    assert failed_cleanly(r, 2) and named in r.stderr and after.code == 0


def test_missing_source_and_lerobot_fps(pristine, tmp_path):
    missing = ingest(tmp_path / "nope", tmp_path / "cache")
    fps = fl.cli("ingest", pristine["lerobot-v3.0"][0], tmp_path / "c", "--fps", "10")
    fl.record("SOURCE missing", f"one line, exit {missing.code}", traceback=missing.traceback)
    fl.record("--fps on a timestamped LeRobot dataset", f"one line, exit {fps.code}",
              traceback=fps.traceback)
    assert failed_cleanly(missing, 2) and failed_cleanly(fps, 2)


def test_timing_assumed_is_stated(pristine, tmp_path):
    src = pristine["zarr"][0]
    r = fl.cli("ingest", src, tmp_path / "cache", "--device", "cpu", "--no-progress")
    seen = fl.cli("inspect", src)
    m = json.loads((tmp_path / "cache" / "manifest.json").read_text())
    fl.record("zarr without timestamps, no --fps", "10 Hz assumed, stated in the summary, the "
              f"manifest and inspect, exit {r.code}", traceback=r.traceback)
    assert r.code == 0 and "10 Hz assumed" in m["timing"]
    assert "10 Hz assumed" in r.stdout and "10 Hz assumed" in seen.stdout
