"""robocache.LeRobotDataset's LeRobot 0.6.1 API beyond items: the metadata (episodes as a
table, info attributes, helpers), LeRobot's sampler, spawn DataLoader workers, pickling,
torch.save, image transforms, slices, the batch path's epochs, the Hub snapshot layout and
MultiLeRobotDataset, on the LeRobot-written fixtures (tests/fixtures/lerobot/make_fixtures.py).
Behaviours are LeRobot's as read in its 0.6.1 sources and checked live where it imports."""

from __future__ import annotations

import importlib.util
import io
import json
import pickle
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

import robocache
from robocache.data.lerobot_meta import LeRobotDatasetMetadata, find_root

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "lerobot"
META = json.loads((FIXTURES / "meta.json").read_text())
D = 1 / META["fps"]


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("lerobot_api") / "cache"


def tiny(cache, **kw) -> robocache.LeRobotDataset:
    return robocache.LeRobotDataset("robocache/tiny", root=FIXTURES / "tiny", cache=cache, **kw)


def test_meta_as_lerobot_0_6_1():
    m = robocache.LeRobotDatasetMetadata("robocache/tiny", root=str(FIXTURES / "tiny"))
    assert m.info.fps == m.info["fps"] == m.fps == META["fps"]
    assert m.info.total_episodes == len(META["lengths"]) and m.revision == "v3.0"
    lengths = list(META["lengths"])
    starts = np.r_[0, np.cumsum(lengths)[:-1]].tolist()
    assert m.episodes["dataset_from_index"] == starts
    assert m.episodes["dataset_to_index"] == np.cumsum(lengths).tolist()
    assert len(m.episodes) == m.episodes.num_rows == len(lengths)
    assert m.episodes[2]["length"] == lengths[2] and m.episodes[2]["episode_index"] == 2
    assert [e["episode_index"] for e in m.episodes] == list(range(len(lengths)))
    assert m.shapes["observation.state"] == (5,) and "observation.state" in m.names
    assert m.chunks_size == 1000 and m.depth_keys == []
    assert m.camera_keys == ["observation.image"]
    assert m.get_task_index(META["tasks"][1]) == 1 and m.get_task_index("nope") is None
    assert m.filter_episodes(lambda e: e["length"] > 8) == [1, 3]
    assert m.filter_episodes(lambda e: e["length"] > 8, candidates=[0, 1]) == [1]
    assert m.get_data_file_path(3) == Path("data/chunk-000/file-000.parquet")
    with pytest.raises(IndexError, match="out of range"):
        m.get_data_file_path(4)
    with pytest.raises(KeyError, match="no column"):
        m.episodes["nope"]


def test_camera_keys_in_feature_order(tmp_path):
    root = Path(shutil.copytree(FIXTURES / "tiny", tmp_path / "tiny"))
    info = json.loads((root / "meta" / "info.json").read_text())
    feats = info["features"]
    info["features"] = {"observation.image": feats.pop("observation.image"),
                        "observation.other": {"dtype": "video", "shape": [6, 8, 3],
                                              "names": None, "info": {"is_depth_map": True}},
                        **feats}
    (root / "meta" / "info.json").write_text(json.dumps(info))
    m = LeRobotDatasetMetadata("x", root)
    assert m.camera_keys == ["observation.image", "observation.other"]
    assert m.depth_keys == ["observation.other"]


def test_lerobot_sampler_runs(cache):
    """lerobot-train's sampler: EpisodeAwareSampler(meta.episodes[...], episodes,
    absolute_to_relative_idx); LeRobot's own class where it imports, else the same contract."""
    ds = tiny(cache, episodes=[3, 1])
    rel = ds.absolute_to_relative_idx
    m = ds.meta.episodes
    absolute = [i for e in (1, 3) for i in range(m[e]["dataset_from_index"],
                                                 m[e]["dataset_to_index"])]
    assert rel == {a: r for r, a in enumerate(absolute)}
    assert [int(ds[r]["index"]) for r in rel.values()] == list(rel)
    assert tiny(cache).absolute_to_relative_idx is None
    if importlib.util.find_spec("lerobot"):
        from lerobot.datasets import EpisodeAwareSampler

        s = EpisodeAwareSampler(m["dataset_from_index"], m["dataset_to_index"],
                                episode_indices_to_use=ds.episodes, shuffle=True,
                                absolute_to_relative_idx=rel)
        assert sorted(s) == list(range(len(ds)))


def test_spawn_workers_and_pickle(cache):
    ds = tiny(cache, delta_timestamps={"action": [0.0, D]})
    assert len(ds) == sum(META["lengths"])
    assert len(pickle.dumps(ds)) < 64_000  # settings only: each worker opens the cache
    want = torch.utils.data.default_collate([ds[i] for i in range(len(ds))])
    loader = torch.utils.data.DataLoader(ds, batch_size=len(ds), num_workers=2,
                                         multiprocessing_context="spawn")
    got = [b for b in loader]
    assert len(got) == 1 and set(got[0]) == set(want)
    for k, v in want.items():
        assert got[0][k] == v if k == "task" else torch.equal(got[0][k], v), k


def test_items_save_and_slice(cache):
    ds = tiny(cache, delta_timestamps={"observation.state": [-D, 0.0]})
    buf = io.BytesIO()
    torch.save(ds[4], buf)
    buf.seek(0)
    back = torch.load(buf)
    assert all(torch.equal(back[k], v) for k, v in ds[4].items() if k != "task")
    item = ds.__getitems__([1, 4, 6])[1]  # a DataLoader's item: its own frames
    frame = item["observation.image"]
    assert frame.untyped_storage().nbytes() == frame.numel() * frame.element_size()
    assert len(pickle.dumps(item)) < 2 * len(pickle.dumps(ds[4]))
    buf = io.BytesIO()
    torch.save(item, buf)
    buf.seek(0)
    back = torch.load(buf)
    assert all(torch.equal(back[k], v) for k, v in ds[4].items() if k != "task")
    sliced = ds[2:5]
    assert [int(it["index"]) for it in sliced] == [2, 3, 4]
    assert [int(it["index"]) for it in ds[-2:]] == [len(ds) - 2, len(ds) - 1]
    assert int(ds[torch.tensor(3)]["index"]) == 3
    with pytest.raises(TypeError, match="index with an int or a slice"):
        ds[[1, 2]]


def test_image_transforms_as_lerobot(cache):
    """LeRobot calls image_transforms per item on [C, H, W] (or [K, C, H, W] with deltas);
    the batch path draws per sample."""
    shapes = []

    def record(x):
        shapes.append(tuple(x.shape))
        return x + torch.rand(())  # a random draw per call

    ds = tiny(cache, image_transforms=record)
    assert shapes == [] and ds[0]["observation.image"].shape == (3, 6, 8)
    assert shapes == [(3, 6, 8)]
    batch = ds.get_batch(torch.arange(8))
    offsets = (batch["observation.image"] - tiny(cache).get_batch(torch.arange(8))[
        "observation.image"]).flatten(1)[:, 0]
    assert len(set(offsets.tolist())) == 8  # one draw per sample
    ds.set_image_transforms(None)
    assert torch.equal(ds[0]["observation.image"], tiny(cache)[0]["observation.image"])
    ds.set_image_transforms(record)
    ds.clear_image_transforms()
    assert ds.image_transforms is None
    windowed = tiny(cache, image_transforms=record,
                    delta_timestamps={"observation.image": [-D, 0.0]})
    shapes.clear()
    windowed[1]
    assert shapes == [(2, 3, 6, 8)]
    with pytest.raises(TypeError, match="callable"):
        ds.set_image_transforms(3)


def test_delta_timestamps_set_after_construction(cache):
    """As LeRobot's (its reader is made on the first item): windows set on the dataset are
    served from the next item on, checked as the constructor checks them."""
    ds = tiny(cache)
    ds[0]
    ds.delta_timestamps = {"observation.state": [-D, 0.0]}
    want = tiny(cache, delta_timestamps={"observation.state": [-D, 0.0]})
    for i in (0, 3):
        assert torch.equal(ds[i]["observation.state"], want[i]["observation.state"])
        assert torch.equal(ds[i]["observation.state_is_pad"], want[i]["observation.state_is_pad"])
    with pytest.raises(robocache.errors.DataError, match="empty"):
        ds.delta_timestamps = {"action": []}
    ds.delta_timestamps = None
    assert "observation.state_is_pad" not in ds[0] and ds[0]["observation.state"].shape == (5,)


@pytest.mark.skipif(not importlib.util.find_spec("pandas"), reason="meta.tasks needs pandas")
def test_meta_tasks_settable():
    """LeRobot's dataset tools set ``meta.tasks`` to a new table after rewriting the tasks."""
    import pandas as pd

    m = robocache.LeRobotDatasetMetadata("robocache/tiny", root=FIXTURES / "tiny")
    m.tasks = pd.DataFrame({"task_index": [1, 0]}, index=pd.Index(["b", "a"], name="task"))
    assert m.task_names == ["a", "b"] and m.get_task_index("b") == 1
    assert m.tasks.loc["b"].task_index == 1


def test_info_to_dict_for_lerobots_writer():
    m = robocache.LeRobotDatasetMetadata("robocache/tiny", root=FIXTURES / "tiny")
    d = m.info.to_dict()
    assert d["features"]["observation.state"]["shape"] == [5] and d is not m.info
    assert json.loads(json.dumps(d)) == d


def test_batches_epochs(cache):
    ds = tiny(cache)
    n = len(ds)
    first = [b["index"] for b in ds.batches(8, seed=5)]
    second = [b["index"] for b in ds.batches(8, seed=5)]
    assert sum(len(i) for i in first) == n  # the last, smaller batch is kept by default
    assert len(first[-1]) == n % 8
    assert not torch.equal(torch.cat(first), torch.cat(second))  # reshuffled per epoch
    assert sorted(torch.cat(second).tolist()) == list(range(n))
    replay = tiny(cache)
    assert torch.equal(torch.cat([b["index"] for b in replay.batches(8, seed=5)]),
                       torch.cat(first))
    assert sum(len(b["index"]) for b in ds.batches(8, drop_last=True)) == n - n % 8


def test_constructor_arguments(cache, tmp_path, monkeypatch):
    from robocache.data import lerobot_dataset

    monkeypatch.setattr(lerobot_dataset, "_SAID", set())
    ds = tiny(cache, episode_filter=lambda e: e["length"] < 8)
    assert ds.episodes == [0, 2] and len(ds) == 7 + 5 and ds.num_episodes == 2
    with pytest.raises(ValueError, match="The episode filter did not match any episode"):
        tiny(cache, episode_filter=lambda e: False)
    u8 = tiny(cache, return_uint8=True)  # image (parquet) features stay float32, as LeRobot
    assert u8[0]["observation.image"].dtype == torch.float32
    with pytest.raises(robocache.errors.DataError, match="depth_output_unit"):
        tiny(cache, depth_output_unit="cm")
    with pytest.raises(robocache.errors.DataError, match="camera_chroma"):
        tiny(cache, camera_chroma="411")
    with pytest.raises(robocache.errors.DataError, match=r"`camera_codec` must be one of "
                       r"'auto', 'jpeg', 'png', 'video'; got 'h264'"):
        tiny(cache, camera_codec="h264")
    small = lerobot_dataset.default_cache_dir(FIXTURES / "tiny", "jpeg", 90, "420")
    assert small.name.endswith("-q90-420") and small.parent == lerobot_dataset.default_cache_dir(
        FIXTURES / "tiny").parent
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        tiny(cache, video_backend="video_reader", token="hf_x")
        tiny(cache, video_backend="video_reader", download_videos=False)
    texts = [str(w.message) for w in said]
    assert sum("video_backend" in t for t in texts) == 1  # said once per process
    assert sum("downloads nothing" in t for t in texts) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tiny(cache, video_backend="pyav")  # what the cache decodes with: nothing to say
        tiny(cache, video_backend="torchcodec")  # lerobot-train's default: the same frames


def test_root_from_hub_snapshot(tmp_path, monkeypatch):
    """root=None: $HF_LEROBOT_HOME/<repo_id>, else LeRobot 0.6.1's Hub snapshot cache."""
    home = tmp_path / "home"
    repo = home / "hub" / "datasets--robocache--tiny"
    shutil.copytree(FIXTURES / "tiny", repo / "snapshots" / "abc123")
    (repo / "refs").mkdir()
    (repo / "refs" / "v3.0").write_text("abc123")
    monkeypatch.setenv("HF_LEROBOT_HOME", str(home))
    assert find_root("robocache/tiny") == repo / "snapshots" / "abc123"
    ds = robocache.LeRobotDataset("robocache/tiny", cache=tmp_path / "c")
    assert ds.root == repo / "snapshots" / "abc123" and len(ds) == sum(META["lengths"])
    shutil.copytree(FIXTURES / "tiny", home / "robocache" / "tiny")
    assert find_root("robocache/tiny") == home / "robocache" / "tiny"
    # a legacy Hub mirror (its download metadata inside): the snapshot first, as LeRobot
    (home / "robocache" / "tiny" / ".cache" / "huggingface" / "download").mkdir(parents=True)
    assert find_root("robocache/tiny") == repo / "snapshots" / "abc123"
    shutil.rmtree(repo)
    assert find_root("robocache/tiny") == home / "robocache" / "tiny"  # nothing else here
    with pytest.raises(FileNotFoundError, match="no local copy of 'robocache/other'"):
        find_root("robocache/other")


def test_only_asked_episodes_are_cached(tmp_path, capsys):
    ds = robocache.LeRobotDataset("robocache/tiny", root=FIXTURES / "tiny", episodes=[2],
                                  cache=tmp_path / "c")
    said = capsys.readouterr().err.splitlines()  # a first use that builds says so, once
    assert len(said) == 1 and said[0].startswith("robocache: cached 1 episodes of "), said
    cached = json.loads((tmp_path / "c" / "manifest.json").read_text())["episodes"]
    assert [e["index"] for e in cached] == [2] and len(ds) == META["lengths"][2]
    more = robocache.LeRobotDataset("robocache/tiny", root=FIXTURES / "tiny",
                                    episodes=[0, 2], cache=tmp_path / "c")
    cached = json.loads((tmp_path / "c" / "manifest.json").read_text())["episodes"]
    assert [e["index"] for e in cached] == [0, 2] and len(more) == 7 + 5
    assert "robocache: cached 1 episodes of " in capsys.readouterr().err
    robocache.LeRobotDataset("robocache/tiny", root=FIXTURES / "tiny", episodes=[0],
                             cache=tmp_path / "c")
    assert capsys.readouterr().err == ""  # nothing built, nothing said


@pytest.mark.skipif(not importlib.util.find_spec("datasets"),
                    reason="hf_dataset needs `datasets` (pip install 'robocache[lerobot]')")
def test_hf_dataset_rows(cache):
    ds = tiny(cache, episodes=[1])
    assert len(ds.hf_dataset) == len(ds)
    row = ds.get_raw_item(2)
    assert int(row["index"]) == int(ds[2]["index"])
    assert torch.equal(row["observation.state"], ds[2]["observation.state"])
    assert ds.select_columns("action").column_names == ["action"]


def test_multi_dataset(cache, tmp_path, monkeypatch):
    monkeypatch.setenv("ROBOCACHE_HOME", str(tmp_path / "caches"))
    root = tmp_path / "many"
    for name in ("a", "b"):
        shutil.copytree(FIXTURES / "tiny", root / name)
    multi = robocache.MultiLeRobotDataset(["a", "b"], root=root)
    n = sum(META["lengths"])
    assert len(multi) == 2 * n and multi.repo_id_to_index == {"a": 0, "b": 1}
    assert int(multi[n + 1]["dataset_index"]) == 1
    assert torch.equal(multi[n + 1]["observation.state"], tiny(cache)[1]["observation.state"])
    assert multi.image_transforms is None
    half = lambda x: x[..., ::2, ::2]  # noqa: E731
    multi.set_image_transforms(half)  # LeRobot's: every dataset's, the same callable
    assert all(d.image_transforms is half for d in multi._datasets)
    assert multi[n + 1]["observation.image"].shape == (3, 3, 4)
    multi.clear_image_transforms()
    assert multi.image_transforms is None and multi[0]["observation.image"].shape == (3, 6, 8)
    with pytest.raises(TypeError, match="callable"):
        multi.set_image_transforms(3)


def test_recording_calls_on_a_read_dataset(cache):
    """LeRobot's recording calls on a dataset opened for reading raise LeRobot's error."""
    ds = tiny(cache)
    assert ds.writer is None and not ds.has_pending_frames()
    ds.finalize()  # nothing to flush
    for call in (lambda: ds.add_frame({"task": "x"}), ds.save_episode, ds.clear_episode_buffer):
        with pytest.raises(RuntimeError, match="on a read-only dataset"):
            call()


def test_default_cache_dir_names_each_camera_codec():
    """JPEG and PNG caches keep the names they had when JPEG was the default; "auto" (the
    default now) and "video" have their own; JPEG options other than the default are named
    wherever frames may be JPEG."""
    from robocache.data.lerobot_dataset import default_cache_dir

    base = default_cache_dir(FIXTURES / "tiny", "jpeg").name
    assert base.startswith("tiny-") and "-" not in base[len("tiny-"):]
    names = {codec: default_cache_dir(FIXTURES / "tiny", codec).name
             for codec in ("auto", "png", "video")}
    assert names == {c: f"{base}-{c}" for c in ("auto", "png", "video")}
    assert default_cache_dir(FIXTURES / "tiny").name == names["auto"]
    assert default_cache_dir(FIXTURES / "tiny", "auto", 90, "420").name == f"{base}-auto-q90-420"
    assert default_cache_dir(FIXTURES / "tiny", "png", 90, "420").name == f"{base}-png"


def test_default_keeps_videos_as_video(tmp_path):
    """The default cache of a dataset with video features keeps the videos' packets (as
    "video" does), serving the same items as a JPEG one's keys and shapes."""
    ds = robocache.LeRobotDataset("robocache/train", root=FIXTURES / "train", episodes=[0],
                                  cache=tmp_path / "c")
    assert ds.camera_codec == "auto"
    top = json.loads((tmp_path / "c" / "manifest.json").read_text())["streams"][
        "observation.images.top"]
    assert top["codec"] == "video"
    video = robocache.LeRobotDataset("robocache/train", root=FIXTURES / "train", episodes=[0],
                                     cache=tmp_path / "v", camera_codec="video")
    assert torch.equal(ds[0]["observation.images.top"], video[0]["observation.images.top"])
    assert ds[0]["observation.images.top"].shape == (3, 48, 64)


@pytest.mark.skipif(not importlib.util.find_spec("simplejpeg"),
                    reason="JPEG frames need simplejpeg (pip install 'robocache[data]')")
def test_camera_quality_and_chroma_reach_the_cache(tmp_path):
    """The smallest cache's options are the build's: video frames stored as asked."""
    ds = robocache.LeRobotDataset("robocache/train", root=FIXTURES / "train", episodes=[0],
                                  cache=tmp_path / "c", camera_codec="jpeg", camera_quality=80,
                                  camera_chroma="420")
    top = json.loads((tmp_path / "c" / "manifest.json").read_text())["streams"][
        "observation.images.top"]
    assert (top["codec"], top["quality"], top["chroma"]) == ("jpeg", 80, "420")
    assert ds[0]["observation.images.top"].shape == (3, 48, 64)


@pytest.mark.skipif(importlib.util.find_spec("lerobot") is not None,
                    reason="LeRobot is installed: test_record_through_lerobot runs")
def test_record_without_lerobot_says_so(tmp_path):
    with pytest.raises(ImportError, match=r"create\(\) records through LeRobot's own writer"):
        robocache.LeRobotDataset.create("x/y", fps=10, features={}, root=tmp_path / "x")
    with pytest.raises(ImportError, match=r"resume\(\) records"):
        robocache.LeRobotDataset.resume("x/y", root=tmp_path / "x")


def test_record_through_lerobot(tmp_path):
    """Where LeRobot imports: a dataset recorded through this class (LeRobot's writer), read
    while recording as LeRobot's, then served after finalize() with LeRobot's own items."""
    pytest.importorskip("lerobot.datasets.lerobot_dataset")
    from lerobot.datasets.lerobot_dataset import LeRobotDataset as Theirs

    features = {"observation.state": {"dtype": "float32", "shape": (3,), "names": None},
                "observation.image": {"dtype": "image", "shape": (6, 8, 3),
                                      "names": ["height", "width", "channels"]}}
    rng = np.random.default_rng(3)
    ds = robocache.LeRobotDataset.create("robocache/rec", fps=10, features=features,
                                         root=tmp_path / "rec", use_videos=False)
    assert ds.writer is not None and ds.num_frames == 0
    # the instance attributes of a dataset opened for reading, as LeRobot's own classes
    assert set(vars(ds)) == set(vars(robocache.LeRobotDataset(
        "robocache/tiny", root=FIXTURES / "tiny", cache=tmp_path / "tiny")))
    for e, n in enumerate((4, 3)):
        for _ in range(n):
            ds.add_frame({"observation.state": rng.normal(size=3).astype(np.float32),
                          "observation.image": rng.integers(0, 256, (6, 8, 3), np.uint8),
                          "task": f"task {e}"})
        assert ds.has_pending_frames()
        ds.save_episode()
    assert ds.meta.total_episodes == 2 and ds.num_frames == 7
    with pytest.raises(RuntimeError, match="being recorded"):
        ds[0]
    ds.finalize()
    assert ds.writer is None and len(ds) == 7 and ds.num_episodes == 2
    theirs = Theirs("robocache/rec", root=tmp_path / "rec")
    for i in range(len(ds)):
        ours, want = ds[i], theirs[i]
        assert set(ours) == set(want)
        for k, v in want.items():
            assert ours[k] == v if k == "task" else torch.equal(ours[k], v), (i, k)
    more = robocache.LeRobotDataset.resume("robocache/rec", root=tmp_path / "rec")
    more.add_frame({"observation.state": np.zeros(3, np.float32),
                    "observation.image": np.zeros((6, 8, 3), np.uint8), "task": "task 0"})
    more.save_episode()
    more.finalize()
    assert len(more) == 8 and int(more[7]["episode_index"]) == 2


def test_missing_files_fetched_through_lerobot(tmp_path, monkeypatch):
    """Where LeRobot imports: data files missing on disk are fetched by LeRobot as on its own
    first read (its Hub download, stood in for here by putting the file back), then served."""
    pytest.importorskip("lerobot.datasets.lerobot_dataset")
    from lerobot.datasets import lerobot_dataset as theirs

    root = Path(shutil.copytree(FIXTURES / "tiny", tmp_path / "tiny"))
    data = next((root / "data").glob("*/*.parquet"))
    kept = data.rename(tmp_path / "kept.parquet")
    fetched = []

    def download(repo_id, **kw):
        fetched.append((repo_id, kw["local_dir"]))
        shutil.copy(kept, data)
        return str(kw["local_dir"])

    monkeypatch.setattr(theirs, "snapshot_download", download)
    monkeypatch.setattr(theirs, "get_safe_version", lambda repo_id, version, **_: version)
    ds = robocache.LeRobotDataset("robocache/tiny", root=root, cache=tmp_path / "c")
    assert fetched == [("robocache/tiny", root)] and len(ds) == sum(META["lengths"])
    assert torch.equal(ds[5]["observation.state"], tiny(tmp_path / "c2")[5]["observation.state"])
