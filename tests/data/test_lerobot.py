"""robocache.LeRobotDataset against LeRobot 0.6.1 itself: every item of every setting equal to
LeRobot's (values bit for bit, dtypes, shapes, masks, tasks), from fixtures that LeRobot wrote
(tests/fixtures/lerobot/make_fixtures.py); and against a live LeRobot when importable."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from test_native import with_fps

import robocache
from robocache.errors import DataError

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "lerobot"
META = json.loads((FIXTURES / "meta.json").read_text())
D = 1 / META["fps"]


# float32 values that come out of ``exp`` (a logarithmic depth video's codes in metres: exp of
# the code, less the shift): the vector maths of the machine rounds exp, so LeRobot's own values
# differ by a unit or two in exp's last place from one CPU to another (seen: a fixture recorded
# on one machine against an AMD EPYC's, up to 4.8e-7 m); compared within 4e-6 m (2 units of a
# float32 at 16, above any depth plus shift stored), everything else bit for bit. A depth
# code's step is 0.3 mm or more.
EXP_ATOL = {"observation.images.depth": 4e-6}


def assert_same_items(ours: robocache.LeRobotDataset, want: dict[str, np.ndarray]) -> None:
    """Every item of ours equals LeRobot's (stacked per key in ``want``; bit for bit but for
    :data:`EXP_ATOL`); the batch path too."""
    items = [ours[i] for i in range(len(ours))]
    assert len(items) == len(want["index"])
    assert set(items[0]) == set(want)
    batch = ours.get_batch(torch.arange(len(ours)))
    for k, w in want.items():
        if w.dtype.kind == "U":
            assert [it[k] for it in items] == w.tolist() == batch[k], k
            continue
        got = torch.stack([it[k] for it in items]).numpy()
        assert got.dtype == w.dtype and got.shape == w.shape, (k, got.dtype, got.shape)
        if k in EXP_ATOL and w.dtype == np.float32:
            np.testing.assert_allclose(got, w, rtol=0, atol=EXP_ATOL[k], err_msg=k)
        else:
            bits = [np.ascontiguousarray(a).view(np.uint8) for a in (got, w)]
            assert np.array_equal(*bits), k  # bit for bit
        assert np.array_equal(batch[k].numpy(), got), k


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("lerobot") / "cache"


@pytest.mark.parametrize("name", sorted(META["cases"]))
def test_items_equal_lerobot(cache, name):
    case = META["cases"][name]
    ours = robocache.LeRobotDataset("robocache/tiny", root=FIXTURES / "tiny", cache=cache,
                                    delta_timestamps=case["delta_timestamps"],
                                    episodes=case.get("episodes"))
    assert_same_items(ours, dict(np.load(FIXTURES / f"items_{name}.npz")))


def test_meta_as_lerobot(cache):
    ds = robocache.LeRobotDataset("robocache/tiny", root=FIXTURES / "tiny", cache=cache)
    m = ds.meta
    assert m.fps == ds.fps == META["fps"]
    assert m.total_frames == sum(META["lengths"]) and m.total_episodes == len(META["lengths"])
    assert m.features["observation.state"]["shape"] == (5,)
    assert set(m.stats["action"]) >= {"mean", "std", "min", "max", "q01", "q99"}
    assert m.stats["action"]["q99"].shape == (3,)
    assert [e["length"] for e in m.episodes] == list(META["lengths"])
    assert m.camera_keys == ["observation.image"] and m.video_keys == []
    if importlib.util.find_spec("pandas"):
        assert m.tasks.loc[META["tasks"][1]].task_index == 1


def test_bad_input(tmp_path, cache):
    def make(**kw):
        kw.setdefault("cache", cache)
        return robocache.LeRobotDataset("robocache/tiny", root=FIXTURES / "tiny", **kw)

    with pytest.raises(DataError, match=r"'action'.*0\.05 s.*0\.0333.*0\.0666"):
        make(delta_timestamps={"action": [0.0, 0.05]})
    unknown = make(delta_timestamps={"observation.nope": [0.0]})  # as LeRobot: at the item
    with pytest.raises(KeyError, match="'observation.nope'"):
        unknown[0]
    with pytest.raises(KeyError, match="'observation.nope'"):
        unknown.get_batch([0, 1])
    with pytest.raises(DataError, match="empty"):
        make(delta_timestamps={"action": []})
    with pytest.raises(DataError, match="tolerance_s = 0"):  # as LeRobot: exact offsets only
        make(delta_timestamps={"action": [0.0, 0.01]}, tolerance_s=0.0)
    assert len(make(delta_timestamps={"action": [0.0, D]}, tolerance_s=0.0)) == 33
    for fps in (None, 0):
        root = with_fps(FIXTURES / "tiny", tmp_path / f"fps{fps}", fps)
        with pytest.raises(DataError, match="meta/info.json"):
            robocache.LeRobotDataset("x", root=root, cache=tmp_path / f"c{fps}")
    with pytest.raises(FileNotFoundError, match="meta/info.json"):
        robocache.LeRobotDataset("x", root=tmp_path / "nowhere")


def test_against_live_lerobot(tmp_path):
    """Runs where LeRobot 0.6.1 is installed (its own venv): a dataset written by LeRobot's
    writer now, every setting compared with LeRobot's own items."""
    pytest.importorskip("lerobot.datasets.lerobot_dataset")
    sys.path.insert(0, str(FIXTURES))
    import make_fixtures

    root = tmp_path / "tiny"
    make_fixtures.write_dataset(root)
    for name, case in make_fixtures.CASES.items():
        ours = robocache.LeRobotDataset("robocache/tiny", root=root, cache=tmp_path / "cache",
                                        **case)
        assert_same_items(ours, make_fixtures.lerobot_items(root, case)), name


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(META["cases"]))
def test_cuda_batches_equal_lerobot(cache, name):
    """The fast path: the cache on the GPU, one key_windows launch per batch."""
    case = META["cases"][name]
    ours = robocache.LeRobotDataset("robocache/tiny", root=FIXTURES / "tiny", cache=cache,
                                    delta_timestamps=case["delta_timestamps"],
                                    episodes=case.get("episodes"), device="cuda")
    batch = ours.get_batch(torch.arange(len(ours)))
    for k, w in np.load(FIXTURES / f"items_{name}.npz").items():
        got = batch[k] if w.dtype.kind == "U" else batch[k].cpu().numpy()
        assert np.array_equal(np.asarray(got), w) and np.asarray(got).dtype == w.dtype, k


def test_task_follows_the_frame(tmp_path):
    """LeRobot's task is per frame (``task_index``): an episode whose task changes mid-way
    serves each frame's own task, as LeRobot's ``meta.tasks.iloc[task_index]``."""
    import shutil

    import pyarrow as pa
    import pyarrow.parquet as pq

    root = Path(shutil.copytree(FIXTURES / "tiny", tmp_path / "tiny"))
    path = next((root / "data").glob("*/*.parquet"))
    table = pq.read_table(path)
    episode = table.column("episode_index").to_numpy()
    frame = table.column("frame_index").to_numpy()
    task_index = table.column("task_index").to_numpy().copy()
    switch = (episode == 1) & (frame >= 6)
    task_index[switch] = 1 - task_index[switch]
    pq.write_table(table.set_column(table.column_names.index("task_index"), "task_index",
                                    pa.array(task_index)), path)
    names = pq.read_table(root / "meta" / "tasks.parquet").column("task").to_pylist()
    ours = robocache.LeRobotDataset("robocache/tiny", root=root, cache=tmp_path / "cache")
    items = [ours[i] for i in range(len(ours))]
    assert [int(it["task_index"]) for it in items] == task_index.tolist()
    assert [it["task"] for it in items] == [names[i] for i in task_index]
    assert ours.get_batch(torch.arange(len(ours)))["task"] == [names[i] for i in task_index]
