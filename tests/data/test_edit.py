"""robocache edit: deletions without rewriting frames, task renames, splits, statistics again,
each a new version (listed, pinnable); one edit at a time; an edit killed before its commit
leaves the previous version current and readable, and the next edit repairs the tables."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch
from audit_episodes import RATE, SPECS, planted_episodes
from typer.testing import CliRunner

from robocache.cli import app
from robocache.data import RobotDataset
from robocache.data.audit import audit
from robocache.data.cache import build
from robocache.data.edit import Edit, edit, parse_episodes, split_episodes
from robocache.data.formats.lerobot import write_lerobot
from robocache.data.lock import CacheLock
from robocache.errors import CacheBusyError, DataError

KEYS = ["observation.state", "action", "observation.images.cam"]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("edit")
    write_lerobot(root / "src", planted_episodes()[:8], SPECS, fps=RATE)
    build(root / "src", root / "cache", progress=False, device="cpu", camera_codec="png")
    return root / "cache"


@pytest.fixture
def cache(built, tmp_path):
    shutil.copytree(built, tmp_path / "cache")
    return tmp_path / "cache"


def _data_files(cache):
    """Every data file of the frame tables: (size, mtime) by path."""
    return {str(p.relative_to(cache)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in (cache / "frames").rglob("*.lance") if p.parent.name == "data"}


def _items(ds, episodes):
    idx = torch.tensor([i for i in range(len(ds)) if int(ds.episode_index[i]) in episodes])
    return ds[idx]


def test_delete_makes_a_version_without_rewriting_frames(cache):
    before = RobotDataset(cache, history=2, horizon=3, keys=KEYS, image_dtype=torch.uint8)
    frames = _data_files(cache)
    m = edit(cache, Edit(delete=[1, 4]))
    assert m["version"] == 2 and m["counts"]["cached"] == 6
    assert _data_files(cache) == frames  # the frames' data files as written
    after = RobotDataset(cache, history=2, horizon=3, keys=KEYS, image_dtype=torch.uint8)
    assert after.episode_ids.tolist() == [0, 2, 3, 5, 6, 7]
    kept = set(after.episode_ids.tolist())
    want, got = _items(before, kept), after[torch.arange(len(after))]
    for k in want:
        if k != "index":
            assert torch.equal(got[k], want[k]), k
    # the statistics are the rows left's
    stats = json.loads((cache / m["stats_path"]).read_text())
    import lance

    t = lance.dataset(str(cache / "data.lance")).to_table(
        columns=["episode_index", "action", "action_is_pad"])
    assert set(t.column("episode_index").to_pylist()) == kept
    rows = np.stack(t.column("action").to_numpy(zero_copy_only=False))[
        ~t.column("action_is_pad").to_numpy(zero_copy_only=False)]
    assert stats["action"]["count"] == len(rows)
    np.testing.assert_allclose(stats["action"]["mean"], rows.mean(0), rtol=1e-6, atol=1e-7)
    # version 1 is still there, pinned
    old = RobotDataset(cache, history=2, horizon=3, keys=KEYS, image_dtype=torch.uint8,
                       version=1)
    assert old.episode_ids.tolist() == list(range(8)) and len(old) == len(before)
    assert torch.equal(old[torch.arange(len(old))]["action"],
                       before[torch.arange(len(before))]["action"])
    with pytest.raises(DataError, match="no version 5"):
        RobotDataset(cache, version=5)
    report = audit(cache, device="cpu")  # an audit reads the current version
    assert [r["index"] for r in report["episodes"]] == [0, 2, 3, 5, 6, 7]
    assert report["cache_version"] == 2


def test_renames_splits_and_versions(cache):
    edit(cache, Edit(rename_tasks={"pick the cube 1": "pick up the cube"}))
    ds = RobotDataset(cache, keys=["action"])
    assert "pick up the cube" in ds.task_names and "pick the cube 1" not in ds.task_names
    m = json.loads((cache / "manifest.json").read_text())
    assert {e["task"] for e in m["episodes"] if e["index"] in (1, 4)} == \
        {"pick up the cube"}
    m = edit(cache, Edit(split=0.25, seed=3))
    assert m["splits"] == split_episodes(range(8), 0.25, 3)
    assert len(m["splits"]["val"]) == 2
    val = RobotDataset(cache, keys=["action"], split="val")
    train = RobotDataset(cache, keys=["action"], split="train")
    assert sorted(val.episode_ids.tolist() + train.episode_ids.tolist()) == list(range(8))
    m = edit(cache, Edit(delete=[m["splits"]["val"][0]]))
    assert len(m["splits"]["val"]) == 1 and m["version"] == 4
    with pytest.raises(DataError, match="no split 'test'"):
        RobotDataset(cache, split="test")
    runner = CliRunner()
    res = runner.invoke(app, ["inspect", str(cache), "--versions", "--json"])
    assert res.exit_code == 0, res.output
    hist = json.loads(res.output)["versions"]
    assert [v["version"] for v in hist] == [1, 2, 3, 4] and hist[-1]["current"]
    assert [v["episodes"] for v in hist] == [8, 8, 8, 7]
    assert hist[1]["edit"][0]["op"] == "rename_tasks"
    res = runner.invoke(app, ["inspect", str(cache), "--versions"])
    assert "version 4 (current): 7 episodes" in res.output


def test_refusals(cache):
    with pytest.raises(DataError, match="every episode"):
        edit(cache, Edit(keep=[]))
    with pytest.raises(DataError, match=r"\[99\]"):
        edit(cache, Edit(delete=[99]))
    with pytest.raises(DataError, match="nothing to edit"):
        edit(cache, Edit(rename_tasks={"a": "a"}))
    with pytest.raises(DataError, match="validation fraction"):
        edit(cache, Edit(split=1.5))
    with pytest.raises(DataError, match="not both"):
        edit(cache, Edit(delete=[1], keep=[2]))
    with CacheLock(cache), pytest.raises(CacheBusyError, match="being written"):
        edit(cache, Edit(delete=[1]))
    assert not (cache / "versions").exists()  # nothing was changed
    m = edit(cache, Edit(delete=list(range(8)), force=True))
    assert m["counts"]["cached"] == 0
    with pytest.raises(DataError, match="no cached episodes"):
        RobotDataset(cache)
    assert parse_episodes("3, 5,10-12") == [3, 5, 10, 11, 12]
    with pytest.raises(DataError):
        parse_episodes("4-2")


def test_an_edit_killed_before_its_commit_leaves_the_previous_version(cache):
    want = RobotDataset(cache, keys=["action"])
    want_items = want[torch.arange(len(want))]

    def killed():
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        edit(cache, Edit(delete=[2, 3], rename_tasks={"pick the cube 0": "x"}),
             _before_commit=killed)
    ds = RobotDataset(cache, keys=["action"])  # the previous version, as it was
    assert ds.episode_ids.tolist() == list(range(8))
    assert torch.equal(ds[torch.arange(len(ds))]["action"], want_items["action"])
    assert "x" not in ds.task_names
    # a hard kill at the same point (another process), then an edit that repairs the tables
    code = ("import os, sys; from robocache.data.edit import Edit, edit; "
            "edit(sys.argv[1], Edit(delete=[5]), _before_commit=lambda: os._exit(9))")
    proc = subprocess.run([sys.executable, "-c", code, str(cache)],
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert proc.returncode == 9
    assert RobotDataset(cache, keys=["action"]).episode_ids.tolist() == list(range(8))
    notes = []
    m = edit(cache, Edit(delete=[6]), log=notes.append)
    assert any("restored" in n for n in notes)
    ds = RobotDataset(cache, keys=["action"])
    assert ds.episode_ids.tolist() == [0, 1, 2, 3, 4, 5, 7] and m["version"] == 2
    assert "x" not in ds.task_names


def test_cli(cache, tmp_path):
    runner = CliRunner()
    report = tmp_path / "audit.json"
    report.write_text(json.dumps(audit(cache, device="cpu")))
    flagged = sorted(r["index"] for r in json.loads(report.read_text())["episodes"]
                     if "jump" in r["flags"] or "idle" in r["flags"])
    res = runner.invoke(app, ["edit", str(cache), "--drop-flagged", str(report),
                              "--drop-flag", "jump", "--drop-flag", "idle", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["version"] == 2 and out["episodes"] == 8 - len(flagged)
    assert out["edit"]["ops"][0]["episodes"] == flagged
    res = runner.invoke(app, ["edit", str(cache), "--rename-task", "=empty", "--split", "0.5"])
    assert res.exit_code == 0 and "version 3" in res.output, res.output
    for args, words in (["--delete", "1", "--keep", "2"], "pass one of them"), \
            (["--keep", "0-7", "--force", "--delete", "x"], "pass one of them"), \
            (["--delete", "x"], "not an episode index"), \
            (["--rename-task", "nope"], "OLD=NEW"), \
            (["--drop-flag", "jump"], "--drop-flagged"), \
            ([], "nothing to edit"):
        res = runner.invoke(app, ["edit", str(cache), *args])
        assert res.exit_code == 2 and words in res.output, (args, res.output)
        assert res.output.count("\n") == 1
    left = RobotDataset(cache).episode_ids.tolist()
    res = runner.invoke(app, ["edit", str(cache), "--delete", ",".join(map(str, left))])
    assert res.exit_code == 2 and "--force" in res.output
    with CacheLock(cache):
        res = runner.invoke(app, ["edit", str(cache), "--delete", str(left[0])])
    assert res.exit_code == 2 and "being written" in res.output


def test_merge_caches_of_one_schema(cache, tmp_path):
    """A cache of another source with the same streams: its episodes appended, renumbered,
    rows and frames served as in their own cache; another schema or rate refused."""
    other = tmp_path / "other"
    write_lerobot(tmp_path / "src2", planted_episodes(seed=11)[8:11], SPECS, fps=RATE)
    build(tmp_path / "src2", other, progress=False, device="cpu", camera_codec="png")
    m = edit(cache, Edit(delete=[0], merge=[other]))
    assert m["counts"]["cached"] == 7 + 3 and m["version"] == 2
    assert m["edit"]["ops"][1]["episodes"] == {"8": 8, "9": 9, "10": 10}
    ds = RobotDataset(cache, keys=KEYS, image_dtype=torch.uint8)
    ref = RobotDataset(other, keys=KEYS, image_dtype=torch.uint8)
    assert ds.episode_ids.tolist() == list(range(1, 11))
    got = ds[torch.nonzero(ds.episode_index >= 8)[:, 0]]
    want = ref[torch.arange(len(ref))]
    for k in ("observation.state", "action", "observation.images.cam_is_pad"):
        assert torch.equal(got[k], want[k]), k
    shown = ~want["observation.images.cam_is_pad"]
    assert torch.equal(got["observation.images.cam"][shown], want["observation.images.cam"][shown])
    stats = json.loads((cache / m["stats_path"]).read_text())
    assert stats["action"]["count"] == sum(e["rows"] for e in m["episodes"])
    assert len(RobotDataset(cache, version=1).episode_ids) == 8  # the version before
    # another rate, another schema: refused, nothing changed
    write_lerobot(tmp_path / "src3", planted_episodes()[:2], SPECS, fps=RATE)
    build(tmp_path / "src3", tmp_path / "slow", rate_hz=10.0, progress=False, device="cpu",
          camera_codec="png")
    with pytest.raises(DataError, match="one rate"):
        edit(cache, Edit(merge=[tmp_path / "slow"]))
    build(tmp_path / "src3", tmp_path / "fewer", keys=["action"], progress=False, device="cpu")
    with pytest.raises(DataError, match="schema"):
        edit(cache, Edit(merge=[tmp_path / "fewer"]))
    with pytest.raises(DataError, match="being edited"):
        edit(cache, Edit(merge=[cache]))
    res = CliRunner().invoke(app, ["edit", str(cache), "--merge", str(other), "--json"])
    assert res.exit_code == 0 and json.loads(res.output)["episodes"] == 13, res.output


def test_a_second_edit_waits_for_the_first(cache):
    """With wait=True (--wait) an edit runs once the cache's writer is done."""
    import threading
    import time

    held, release = threading.Event(), threading.Event()

    def writer():
        with CacheLock(cache):
            held.set()
            release.wait(30)

    t = threading.Thread(target=writer)
    t.start()
    held.wait(30)
    threading.Timer(0.5, release.set).start()
    start = time.monotonic()
    m = edit(cache, Edit(delete=[7]), wait=True)
    t.join()
    assert time.monotonic() - start >= 0.4 and m["counts"]["cached"] == 7
