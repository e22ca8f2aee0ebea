"""Many processes on one cache: the ranks of a job opening one dataset at once, a reader while
another process extends the cache, a LeRobot dataset with quarantined episodes.

Each case records a row of docs/reliability.md's table (see faultlib).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import warnings

import faultlib as fl
import pytest
import torch

from robocache.data import RobotDataset
from robocache.data.cache import build
from robocache.data.lerobot_dataset import LeRobotDataset
from robocache.errors import DataError

# Every rank waits at a file barrier until all have imported, then constructs the dataset;
# the source reads slowly, so the first build outlasts the lock's grace period.
RANK = """
import logging, sys, time
from pathlib import Path
logging.basicConfig(level=logging.INFO, format="%(message)s")
import robocache.data.formats.lerobot as lr
from robocache.data.lerobot_dataset import LeRobotDataset
read = lr.LeRobotSource.read
def slow(self, i):
    time.sleep(0.4)
    return read(self, i)
lr.LeRobotSource.read = slow
barrier, rank, ranks = Path(sys.argv[3]), sys.argv[4], int(sys.argv[5])
(barrier / rank).touch()
while len(list(barrier.iterdir())) < ranks:
    time.sleep(0.01)
ds = LeRobotDataset("x/y", root=sys.argv[1], cache=sys.argv[2])
print("frames", len(ds), "episodes", ds.num_episodes, flush=True)
"""


def test_ranks_build_once_and_the_others_wait(pristine, tmp_path):
    src, clean = pristine["lerobot-v3.0"]
    before = fl.tree_hash(src)
    dest, barrier = tmp_path / "cache", tmp_path / "barrier"
    barrier.mkdir()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    procs = [subprocess.Popen([sys.executable, "-c", RANK, str(src), str(dest), str(barrier),
                               str(r), "3"], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for r in range(3)]
    outs = [p.communicate(timeout=300) for p in procs]
    codes = [p.returncode for p in procs]
    waited = sum("waiting for pid" in err for _, err in outs)
    ok = fl.same_as_clean(dest, clean, range(fl.EPISODES)) and fl.tree_hash(src) == before
    served = {out.strip() for out, _ in outs}
    fl.record("3 processes construct LeRobotDataset on one new cache at once (torchrun ranks)",
              f"one builds, {waited} wait for it (progress logged) and open the finished cache; "
              f"exit codes {codes}", lost=not ok,
              traceback=any("Traceback" in err for _, err in outs))
    assert codes == [0, 0, 0], [err for _, err in outs]
    assert served == {f"frames {fl.EPISODES * fl.STEPS} episodes {fl.EPISODES}"} and ok
    assert waited == 2 and not any("--wait" in err for _, err in outs)


def test_lerobot_episodes_naming_only_good_ones(pristine, tmp_path):
    src = fl.copy_source(pristine["lerobot-v2.1"][0], tmp_path)
    fl.truncate(src / "data" / "chunk-000" / "episode_000002.parquet")
    dest = tmp_path / "cache"
    good = LeRobotDataset("x/y", root=src, cache=dest, episodes=[0, 1, 3])
    with pytest.raises(DataError, match="episode 2.*episode_000002.parquet"):
        LeRobotDataset("x/y", root=src, cache=dest)
    with pytest.raises(DataError, match="episode 2"):
        LeRobotDataset("x/y", root=src, cache=dest, episodes=[2, 3])
    again = LeRobotDataset("x/y", root=src, cache=dest, episodes=[4])  # reused, not rebuilt
    ok = good.num_episodes == 3 and len(good) == 3 * fl.STEPS and \
        sorted(set(good.get_batch(range(len(good)))["episode_index"].tolist())) == [0, 1, 3] \
        and len(again) == fl.STEPS
    fl.record("LeRobotDataset(episodes=[0, 1, 3]) when episode 2 is quarantined",
              "serves the 3 episodes asked for; a request naming episode 2 (or all) raises "
              "DataError naming it and its file", lost=not ok)
    assert ok


def served(dest) -> tuple[list[int], list[str]]:
    """The episodes a RobotDataset opened on ``dest`` serves, and the warnings it gave."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ds = RobotDataset(dest, history=1, horizon=2)
    return sorted(ds.episode_ids.tolist()), [str(w.message) for w in caught]


def test_a_reader_during_an_extension_serves_the_last_complete_version(pristine, tmp_path):
    src, clean = pristine["lerobot-v3.0"]
    dest = tmp_path / "cache"
    build(src, dest, rate_hz=fl.RATE, device="cpu", progress=False, episodes=[0, 1, 2])
    first, _ = served(dest)
    with pytest.raises(DataError, match="being built by pid .* no complete version yet"):
        proc = fl.slow_writer(src, tmp_path / "new", 0.5)  # a first build: nothing to serve
        try:
            while not (tmp_path / "new" / "manifest.json").exists():
                time.sleep(0.02)
            RobotDataset(tmp_path / "new")
        finally:
            proc.kill()
            proc.wait()
    proc = fl.slow_writer(src, dest, 0.5)
    try:
        deadline = time.monotonic() + 60
        while len(fl.load_cache(dest)) < 4:  # the extension has committed an episode
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        during, said = served(dest)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    killed, said_killed = served(dest)
    build(src, dest, rate_hz=fl.RATE, device="cpu", progress=False)
    after, said_after = served(dest)
    ok = first == during == killed == [0, 1, 2] and after == list(range(fl.EPISODES)) and \
        fl.same_as_clean(dest, clean, range(fl.EPISODES))
    fl.record("RobotDataset opened while another process extends the cache (then kill -9 of "
              "it)", "serves the last complete version, warning once naming the live writer "
              "(after the kill: the unfinished extension); a cache never complete yet: "
              "DataError naming its writer", lost=not ok)
    assert ok, (first, during, killed, after)
    assert len(said) == 1 and f"extended by pid {proc.pid}" in said[0], said
    assert len(said_killed) == 1 and "unfinished extension" in said_killed[0]
    assert said_after == []


def test_lerobot_dataset_serves_an_edited_source_as_it_is_now(pristine, tmp_path):
    src = fl.copy_source(pristine["lerobot-v3.0"][0], tmp_path / "s")
    dest = tmp_path / "cache"
    before = LeRobotDataset("x/y", root=src, cache=dest).get_batch(range(fl.STEPS))["action"]
    fl.edit_episode(src, 0)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        after = LeRobotDataset("x/y", root=src, cache=dest).get_batch(range(fl.STEPS))["action"]
    ok = bool((after == before + 1).all())
    fl.record("LeRobotDataset constructed after episode 0 of its source was edited",
              "caches episode 0 again and serves the new values (as LeRobot reads them)",
              lost=not ok)
    assert ok and not [w for w in said if "changed since" in str(w.message)]


def test_a_scan_that_finds_a_compacted_file_gone_reads_the_newer_version(pristine, tmp_path,
                                                                         monkeypatch):
    """A reader's scan overlapping a build's compaction and version cleanup: the file it
    listed is gone; the table is read again at the newer version, with the same rows."""
    import pyarrow as pa

    from robocache.data.location import Location

    _, clean = pristine["lerobot-v3.0"]
    want = RobotDataset(clean, in_memory=True)[list(range(5))]
    real, calls = Location.lance, []

    class Vanished:
        def __init__(self, inner):
            self.inner = inner

        def __getattr__(self, name):
            return getattr(self.inner, name)

        def to_batches(self, **kw):
            raise pa.ArrowInvalid("Not found: data.lance/data/gone.lance")

    def opened(self, rel, *a, **kw):
        calls.append(rel)
        table = real(self, rel, *a, **kw)
        return Vanished(table) if len(calls) == 1 else table

    monkeypatch.setenv("ROBOCACHE_SERVE_DIR", str(tmp_path / "serve2"))
    monkeypatch.setattr(Location, "lance", opened)
    got = RobotDataset(clean)[list(range(5))]
    assert all(torch.equal(got[k], want[k]) for k in want)
    assert calls.count("data.lance") == 2
    monkeypatch.setenv("ROBOCACHE_SERVE_DIR", str(tmp_path / "serve3"))
    monkeypatch.setattr(Location, "lance", lambda self, rel, *a, **k: Vanished(real(self, rel)))
    with pytest.raises(pa.ArrowInvalid, match="Not found"):  # still gone: said, not hidden
        RobotDataset(clean)
