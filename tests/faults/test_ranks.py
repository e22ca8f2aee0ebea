"""Many processes on one cache: the ranks of a job opening one dataset at once, a reader while
another process extends the cache, a LeRobot dataset with quarantined episodes.

Each case records a row of docs/reliability.md's table (see faultlib).
"""

from __future__ import annotations

import os
import subprocess
import sys

import faultlib as fl
import pytest

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
