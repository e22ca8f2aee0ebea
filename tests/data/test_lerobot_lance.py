"""robocache.LeRobotDataset and ingest on LeRobot's Lance-stored datasets (``"storage_format":
"lance"``, written by lerobot-lancedb 0.3.1's converter from datasets LeRobot 0.6.1 recorded):
items equal to the peers' own (lerobot-lancedb's ``LanceDBDataset`` for the video layout;
LeRobot's ``LeRobotDataset`` on the converted parquet dataset for the image layout, which
``LanceDBDataset`` refuses), stored beside the datasets by
tests/fixtures/lerobot/lance/make_lance.py; neither peer is needed."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from test_lerobot import assert_same_items

import robocache
from robocache.errors import DataError

pytest.importorskip("lance")

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "lerobot" / "lance"
META = json.loads((FIXTURES / "meta.json").read_text())
CASES = [(name, case) for name, cases in META["datasets"].items() for case in cases
         if isinstance(cases[case], dict)]


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    """ROBOCACHE_HOME for the module (where the videos are copied out of their table)."""
    return tmp_path_factory.mktemp("lerobot_lance")


@pytest.fixture(autouse=True)
def _home(home, monkeypatch):
    monkeypatch.setenv("ROBOCACHE_HOME", str(home))


def open_case(home: Path, name: str, case: str, **kw) -> robocache.LeRobotDataset:
    settings = {k: v for k, v in META["datasets"][name][case].items() if k != "keys"}
    # video frames stored losslessly: the frames the peer decodes, bit for bit
    return robocache.LeRobotDataset(f"robocache/{name}", root=FIXTURES / name,
                                    cache=home / f"cache-{name}", camera_codec="png",
                                    **settings, **kw)


@pytest.mark.parametrize(("name", "case"), CASES, ids=[f"{n}-{c}" for n, c in CASES])
def test_items_equal_the_peers(home, name, case):
    ours = open_case(home, name, case)
    assert_same_items(ours, dict(np.load(FIXTURES / f"items_{name}_{case}.npz")))


def test_read_as_a_source(home):
    """Ingest reads the Lance layout as any LeRobot dataset: its format named, each MP4 file
    copied out of the videos table once, byte for byte."""
    import lance

    from robocache.data.formats import open_source

    src = open_source(FIXTURES / "video")
    assert src.format == "lerobot-v3.0-lance"
    ref = src.read(2).streams["observation.images.front"].video
    assert ref.from_timestamp > 0  # the episodes share the file
    table = lance.dataset(str(FIXTURES / "video" / "videos.lance"))
    keys = table.to_table(columns=["video_key"]).column("video_key").to_pylist()
    with table.take_blobs("video_bytes", indices=[keys.index("observation.images.front")])[0] \
            as blob:
        assert ref.path.read_bytes() == blob.read()
    assert ref.path.is_relative_to(home)
    stamp = ref.path.stat().st_mtime_ns
    again = open_source(FIXTURES / "video").read(0).streams["observation.images.front"].video
    assert again.path == ref.path and ref.path.stat().st_mtime_ns == stamp


def test_raw_rows_of_the_image_layout(home):
    """``get_raw_item`` reads the frames table's rows: the JPEG frames decoded as LeRobot
    decodes them (the items' frames without windows)."""
    pytest.importorskip("datasets")
    want = np.load(FIXTURES / "items_jpeg_none.npz")
    ours = open_case(home, "jpeg", "none")
    for i in (0, 7, 16):
        row = ours.get_raw_item(i)
        assert int(row["index"]) == int(want["index"][i])
        assert np.array_equal(row["observation.images.top"].numpy(),
                              want["observation.images.top"][i])


def test_missing_frames_table(home, tmp_path):
    """A Lance-stored dataset without its frames table: a DataError naming it."""
    import shutil

    root = Path(shutil.copytree(FIXTURES / "jpeg", tmp_path / "jpeg"))
    shutil.rmtree(root / "frames.lance")
    with pytest.raises(DataError, match="frames.lance"):
        robocache.LeRobotDataset("robocache/jpeg", root=root, cache=tmp_path / "cache")
