"""robocache.LeRobotDataset on what LeRobot 0.6.1's own dataset tests exercise beyond the main
fixtures: items equal to LeRobot's (values bit for bit, dtypes, shapes, masks, tasks) on small
datasets recorded by LeRobot's writer, with LeRobot's items stored beside them
(tests/fixtures/lerobot/compat/make_compat.py); LeRobot itself is not needed."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from test_lerobot import assert_same_items

import robocache

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "lerobot" / "compat"
META = json.loads((FIXTURES / "meta.json").read_text())
CASES = [(name, case) for name, cases in META["datasets"].items() for case in cases]


@pytest.fixture(scope="module")
def caches(tmp_path_factory):
    return tmp_path_factory.mktemp("lerobot_compat")


def open_case(caches: Path, name: str, case: str, **kw) -> robocache.LeRobotDataset:
    settings = {k: v for k, v in META["datasets"][name][case].items()
                if k not in ("keys", "depth_stats")}
    # video frames stored losslessly: the frames LeRobot decodes, bit for bit
    return robocache.LeRobotDataset(f"robocache/{name}", root=FIXTURES / name,
                                    cache=caches / name, camera_codec="png", **settings, **kw)


class _Without:
    """A dataset's items and batches without ``keys``."""

    def __init__(self, ds, keys):
        self.ds, self.keys = ds, set(keys)

    def __len__(self):
        return len(self.ds)

    def __getitem__(self, i):
        return {k: v for k, v in self.ds[i].items() if k not in self.keys}

    def get_batch(self, indices):
        return {k: v for k, v in self.ds.get_batch(indices).items() if k not in self.keys}


def assert_items(ours: robocache.LeRobotDataset, want: dict[str, np.ndarray]) -> None:
    """:func:`assert_same_items`, the language columns (stored as JSON) compared as such,
    in the items and in a batch (a list per key)."""
    language = [k for k, f in ours.meta.features.items() if f["dtype"] == "language"]
    batch = ours.get_batch(torch.arange(len(ours)))
    for k in language:
        got = [json.dumps(ours[i][k]) for i in range(len(ours))]
        assert got == want.pop(k).tolist() == [json.dumps(v) for v in batch[k]], k
    assert_same_items(_Without(ours, language), want)


@pytest.mark.parametrize(("name", "case"), CASES, ids=[f"{n}-{c}" for n, c in CASES])
def test_items_equal_lerobot(caches, name, case):
    ours = open_case(caches, name, case)
    assert_items(ours, dict(np.load(FIXTURES / f"items_{name}_{case}.npz")))


@pytest.mark.parametrize("case", sorted(META["datasets"]["depth"]))
def test_depth_as_lerobot(caches, case):
    """Depth images (uint16 millimetres, float32 metres, stored as TIFF) in the unit asked
    for, their statistics rescaled to it, the image transform not applied to them."""
    seen = []
    ours = open_case(caches, "depth", case, image_transforms=lambda x: seen.append(x) or x)
    item = ours[0]
    unit = ours.depth_output_unit
    for key in ours.meta.depth_keys:
        assert item[key].dtype == torch.float32 and item[key].shape[-3:] == (1, 4, 6)
        want = META["datasets"]["depth"][case]["depth_stats"][key]
        for stat, value in want.items():
            assert np.allclose(ours.meta.stats[key][stat], value, rtol=1e-12), (key, stat)
    assert len(seen) == 1  # the RGB camera only
    metres = item["observation.images.depth_m"] if unit == "m" else \
        item["observation.images.depth_m"] / 1000
    assert float(metres.min()) >= 0.05 and float(metres.max()) <= 9


def test_one_offset_video_window_as_lerobot(caches):
    """A video key's window of one offset is the frame itself, ``[C, H, W]``, in the item and
    in what ``image_transforms`` is given (its ``_is_pad`` stays ``[1]``); an image key's
    stays ``[1, C, H, W]``, as LeRobot's."""
    shapes = []
    ours = open_case(caches, "video", "one_offset",
                     image_transforms=lambda x: shapes.append(tuple(x.shape)) or x)
    item = ours[3]
    assert item["observation.images.front"].shape == (3, 32, 48)
    assert item["observation.images.front_is_pad"].shape == (1,)
    assert item["observation.images.wrist"].shape == (1, 3, 6, 8)
    assert sorted(shapes) == [(1, 3, 6, 8), (3, 32, 48)]
    assert ours.get_batch([0, 1])["observation.images.front"].shape == (2, 3, 32, 48)


def test_unknown_feature_dtype_is_left_out(caches, tmp_path, caplog):
    """A feature of a dtype RoboCache does not know: one line naming it and its dtype, the
    other features served."""
    import shutil

    root = Path(shutil.copytree(FIXTURES / "channels", tmp_path / "unknown"))
    info = json.loads((root / "meta" / "info.json").read_text())
    info["features"]["observation.audio"] = {"dtype": "audio", "shape": [1], "names": None}
    (root / "meta" / "info.json").write_text(json.dumps(info))
    with caplog.at_level("WARNING"):
        ours = robocache.LeRobotDataset("robocache/unknown", root=root, cache=tmp_path / "c")
    said = [r.getMessage() for r in caplog.records if "observation.audio" in r.getMessage()]
    assert len(said) == 1 and "'audio'" in said[0]
    assert "observation.audio" not in ours[0] and ours[0]["observation.state"].shape == (2,)


RAW = sorted(p.stem[len("raw_"):] for p in FIXTURES.glob("raw_*.npz"))


@pytest.mark.skipif(not importlib.util.find_spec("datasets"),
                    reason="hf_dataset needs `datasets` (pip install 'robocache[lerobot]')")
@pytest.mark.parametrize("name", RAW)
def test_raw_rows_equal_lerobot(caches, name):
    """``get_raw_item`` / ``hf_dataset`` rows as LeRobot's: images float32 ``[C, H, W]``
    (depth maps in their stored values), scalars as 0-d tensors, language rows as stored."""
    want = dict(np.load(FIXTURES / f"raw_{name}.npz"))
    ours = open_case(caches, name, next(iter(META["datasets"][name])))
    rows = [ours.get_raw_item(i) for i in range(len(ours))]
    assert set(rows[0]) == set(want)
    for k, w in want.items():
        if w.dtype.kind == "U":
            got = [r[k] if isinstance(r[k], str) else json.dumps(r[k]) for r in rows]
            assert got == w.tolist(), k
            continue
        got = torch.stack([r[k] for r in rows]).numpy()
        assert got.dtype == w.dtype and got.shape == w.shape, (k, got.dtype, got.shape)
        assert np.array_equal(got.view(np.uint8), w.view(np.uint8)), k


def test_tasks_replaced_after_the_data_files(tmp_path):
    """As LeRobot's ``modify_tasks``: the data files' ``task_index`` rewritten, then
    ``meta.tasks`` replaced; the next item serves the new tasks (the changed episodes cached
    again)."""
    import shutil

    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    root = Path(shutil.copytree(FIXTURES / "channels", tmp_path / "tasks"))
    ours = robocache.LeRobotDataset("robocache/tasks", root=root, cache=tmp_path / "cache")
    first = ours[0]
    assert (first["task"], int(first["task_index"])) == ("reach the shelf", 0)
    for path in (root / "data").rglob("*.parquet"):
        table = pq.read_table(path)
        i = table.schema.get_field_index("task_index")
        table = table.set_column(i, "task_index", pc.multiply(table.column(i), 0).cast(
            table.schema.field(i).type).fill_null(0))
        pq.write_table(table, path)
    ours.meta.tasks = ours.meta.tasks  # every frame's task is now task 0
    assert {ours[i]["task"] for i in range(len(ours))} == {"reach the shelf"}
    assert {int(ours[i]["task_index"]) for i in range(len(ours))} == {0}
