"""Readers: round-trips through fixtures written here in every supported format."""

from __future__ import annotations

import json
import re

import h5py
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import zarr
from data_episodes import SPECS, make_episode

from robocache.data.cache import build
from robocache.data.dataset import RobotDataset
from robocache.data.episode import check_episode
from robocache.data.formats import FORMATS, open_source
from robocache.data.formats.lerobot import write_lerobot
from robocache.errors import DataError


def assert_same_episode(got, want, specs):
    for name, spec in specs.items():
        g, w = got.streams[name], want.streams[name]
        # LeRobot stores timestamps as float32 (as LeRobot does)
        np.testing.assert_allclose(g.times, w.times.astype(np.float32), rtol=0, atol=1e-6)
        if spec.kind == "event":
            assert list(g.data) == list(w.data)
        else:
            np.testing.assert_array_equal(g.data, w.data)


@pytest.fixture(params=[None, 2], ids=["batches-default", "batches-of-2-rows"])
def read_batch(request, monkeypatch):
    """The rows a LeRobot data file is decoded in at a time: the default, or 2 (every
    episode's rows then span record batches, each column kept in its batches)."""
    from robocache.data.formats import lerobot

    if request.param is not None:
        monkeypatch.setattr(lerobot, "READ_BATCH_ROWS", request.param)
    return request.param


@pytest.mark.parametrize("version", ["v2.1", "v3.0"])
def test_lerobot_multirate_round_trip(tmp_path, episodes, version, read_batch):
    write_lerobot(tmp_path / "ds", episodes, SPECS, fps=25.0, version=version)
    src = open_source(tmp_path / "ds")
    assert src.format == f"lerobot-{version}"
    assert src.episode_indices() == [0, 1, 2, 3, 4]
    assert src.specs == SPECS
    for ep in episodes:
        got = src.read(ep.index)
        check_episode(got, src.specs)
        assert_same_episode(got, ep, SPECS)
        assert got.meta["tasks"] == ep.meta["tasks"]


@pytest.mark.parametrize("damage", ["none", "shifted", "interleaved"])
def test_lerobot_v30_reads_an_episode_by_its_rows(tmp_path, episodes, damage, read_batch):
    """Each episode is the slice of its data file that the metadata names; where the file's
    rows are not where the metadata says, the file is filtered on episode_index instead, and
    the episodes read the same either way (the selected streams only)."""
    root = write_lerobot(tmp_path / "ds", episodes, SPECS, fps=25.0, version="v3.0")
    meta = next((root / "meta" / "episodes").rglob("*.parquet"))
    data = root / "data" / "chunk-000" / "file-000.parquet"
    if damage == "shifted":  # every range off by one row
        t = pq.read_table(meta)
        for col in ("dataset_from_index", "dataset_to_index"):
            shifted = pa.array(np.asarray(t.column(col)) + 1, t.schema.field(col).type)
            t = t.set_column(t.schema.get_field_index(col), col, shifted)
        pq.write_table(t, meta)
    elif damage == "interleaved":  # the rows of episodes 1 and 2 alternate
        t = pq.read_table(data)
        ep = np.asarray(t.column("episode_index"))
        one, two = np.flatnonzero(ep == 1), np.flatnonzero(ep == 2)
        keys = np.r_[2 * np.arange(len(one)), 2 * np.arange(len(two)) + 1]
        order = np.arange(len(ep))
        order[np.r_[one, two]] = np.r_[one, two][np.argsort(keys, kind="stable")]
        pq.write_table(t.take(order), data)
    src = open_source(root)
    src.select(["observation.state", "language.note"])
    for ep in episodes:
        got = src.read(ep.index)
        assert sorted(got.streams) == ["language.note", "observation.state"]
        for name in got.streams:
            np.testing.assert_array_equal(got.streams[name].times.astype(np.float32),
                                          ep.streams[name].times.astype(np.float32))
            if name == "language.note":
                assert list(got.streams[name].data) == list(ep.streams[name].data)
            else:
                np.testing.assert_array_equal(got.streams[name].data, ep.streams[name].data)


def test_lerobot_v21_standard_layout(tmp_path, rng):
    """A single-rate v2.1 dataset laid out as LeRobot writes it (no robocache writer)."""
    root = tmp_path / "ds"
    (root / "meta").mkdir(parents=True)
    info = {"codebase_version": "v2.1", "fps": 30, "chunks_size": 1000,
            "data_path": "data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet",
            "video_path": "videos/chunk-{episode_chunk:03d}/{video_key}/"
                          "episode_{episode_index:06d}.mp4",
            "features": {
                "observation.state": {"dtype": "float32", "shape": [6], "names": None},
                "action": {"dtype": "float32", "shape": [6], "names": None},
                "next.reward": {"dtype": "float32", "shape": [1], "names": None},
                "observation.images.front": {"dtype": "video", "shape": [48, 64, 3],
                                             "info": {"video.fps": 30}},
                "timestamp": {"dtype": "float32", "shape": [1]},
                "frame_index": {"dtype": "int64", "shape": [1]},
                "episode_index": {"dtype": "int64", "shape": [1]},
                "index": {"dtype": "int64", "shape": [1]},
                "task_index": {"dtype": "int64", "shape": [1]}}}
    (root / "meta" / "info.json").write_text(json.dumps(info))
    lengths = [7, 11]
    (root / "meta" / "episodes.jsonl").write_text("".join(
        json.dumps({"episode_index": i, "tasks": ["stack"], "length": n}) + "\n"
        for i, n in enumerate(lengths)))
    (root / "meta" / "tasks.jsonl").write_text(json.dumps({"task_index": 0, "task": "stack"}))
    states = {}
    for i, n in enumerate(lengths):
        states[i] = rng.normal(size=(n, 6)).astype(np.float32)
        table = pa.table({
            "observation.state": pa.array(list(states[i]), pa.list_(pa.float32())),
            "action": pa.array(list(states[i] * 2), pa.list_(pa.float32())),
            "next.reward": pa.array(rng.normal(size=n).astype(np.float32)),
            "timestamp": pa.array(np.arange(n, dtype=np.float32) / 30),
            "frame_index": pa.array(np.arange(n)), "episode_index": pa.array(np.full(n, i)),
            "index": pa.array(np.arange(n) + sum(lengths[:i])),
            "task_index": pa.array(np.zeros(n, np.int64))})
        out = root / f"data/chunk-000/episode_{i:06d}.parquet"
        out.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, out)
    src = open_source(root)
    assert set(src.specs) == {"observation.state", "action", "next.reward",
                              "observation.images.front"}
    ep = src.read(1)
    check_episode(ep, src.specs)
    np.testing.assert_array_equal(ep.streams["observation.state"].data, states[1])
    assert ep.streams["next.reward"].data.shape == (11, 1)
    video = ep.streams["observation.images.front"]
    assert video.data is None and video.video.path == \
        root / "videos/chunk-000/observation.images.front/episode_000001.mp4"
    np.testing.assert_allclose(video.times, np.arange(11, dtype=np.float32) / 30)


@pytest.mark.parametrize("with_time", [False, True])
def test_zarr_replay_buffer_round_trip(tmp_path, rng, with_time):
    ends = np.array([5, 12, 20])
    state = rng.normal(size=(20, 3)).astype(np.float32)
    image = rng.integers(0, 255, (20, 4, 4, 3), np.uint8)
    root = zarr.open_group(str(tmp_path / "rb.zarr"), mode="w", zarr_format=2)
    root.create_array("data/state", data=state)
    root.create_array("data/img", data=image)
    root.create_array("meta/episode_ends", data=ends)
    times = np.concatenate([np.arange(n) / 7.0 + 100 for n in np.diff(np.r_[0, ends])])
    if with_time:
        root.create_array("data/timestamp", data=times)
    src = open_source(tmp_path / "rb.zarr", fps=10.0)
    assert src.format == "zarr-replay" and src.episode_indices() == [0, 1, 2]
    assert src.specs["img"].kind == "image" and src.specs["state"].shape == (3,)
    ep = src.read(1)
    check_episode(ep, src.specs)
    np.testing.assert_array_equal(ep.streams["state"].data, state[5:12])
    np.testing.assert_array_equal(ep.streams["img"].data, image[5:12])
    want = times[5:12] if with_time else np.arange(7) / 10.0
    np.testing.assert_allclose(ep.streams["state"].times, want)


def test_robomimic_round_trip(tmp_path, rng):
    demos = {}
    with h5py.File(tmp_path / "low_dim.hdf5", "w") as f:
        data = f.create_group("data")
        data.attrs["env_args"] = json.dumps({"env_kwargs": {"control_freq": 15}})
        for i in (0, 1, 10):  # demo_10 sorts after demo_1 numerically
            n = 4 + i
            g = data.create_group(f"demo_{i}")
            demos[i] = {"obs.eef_pos": rng.normal(size=(n, 3)), "actions": rng.normal(size=(n, 7)),
                        "rewards": rng.normal(size=n)}
            g.create_dataset("obs/eef_pos", data=demos[i]["obs.eef_pos"])
            g.create_dataset("actions", data=demos[i]["actions"])
            g.create_dataset("rewards", data=demos[i]["rewards"])
            g.create_dataset("states", data=rng.normal(size=(n, 30)))
            g.attrs["num_samples"] = n
    src = open_source(tmp_path / "low_dim.hdf5")
    assert src.format == "robomimic" and src.episode_indices() == [0, 1, 10]
    assert set(src.specs) == {"obs.eef_pos", "actions", "rewards"}
    ep = src.read(10)
    check_episode(ep, src.specs)
    for name, want in demos[10].items():
        np.testing.assert_array_equal(ep.streams[name].data, want)
    np.testing.assert_allclose(ep.streams["actions"].times, np.arange(14) / 15.0)


def test_unknown_format_lists_supported(tmp_path):
    (tmp_path / "x.txt").write_text("hello")
    with pytest.raises(DataError, match="Supported formats") as e:
        open_source(tmp_path / "x.txt")
    for name in FORMATS:
        assert name in str(e.value)
    with pytest.raises(DataError, match="not supported"):
        open_source(tmp_path / "x.txt", format="petastorm")
    with pytest.raises(FileNotFoundError):
        open_source(tmp_path / "missing")


def test_lerobot_unsupported_version(tmp_path):
    (tmp_path / "meta").mkdir()
    (tmp_path / "meta" / "info.json").write_text(json.dumps(
        {"codebase_version": "v1.6", "fps": 10, "features": {}}))
    with pytest.raises(DataError, match="v2.1, v3.0"):
        open_source(tmp_path)


@pytest.mark.parametrize("defect, reason", [
    ("missing", "is missing"), ("nan_time", "NaN or infinite timestamp"),
    ("decreasing", "decrease"), ("shape", "shape"), ("count", "samples but"),
    ("nan_value", "NaN or infinite values")])
def test_check_episode_reasons(rng, defect, reason):
    ep = make_episode(3, rng)
    s = ep.streams["observation.pose"]
    if defect == "missing":
        del ep.streams["observation.pose"]
    elif defect == "nan_time":
        s.times[2] = np.nan
    elif defect == "decreasing":
        s.times[3] = s.times[1]
        s.times[4] = 0.0
    elif defect == "shape":
        s.data = s.data[:, :3]
    elif defect == "count":
        s.data = s.data[:-1]
    else:
        s.data[1, 1] = np.inf
    with pytest.raises(DataError, match=reason):
        check_episode(ep, SPECS)


def test_lerobot_png_image_feature(tmp_path, rng, read_batch):
    import io

    from PIL import Image

    frames = rng.integers(0, 255, (3, 6, 5, 3), np.uint8)
    pngs = []
    for f in frames:
        buf = io.BytesIO()
        Image.fromarray(f).save(buf, format="PNG")
        pngs.append({"bytes": buf.getvalue(), "path": None})
    root = tmp_path / "ds"
    (root / "meta").mkdir(parents=True)
    (root / "meta" / "info.json").write_text(json.dumps({
        "codebase_version": "v2.1", "fps": 10, "chunks_size": 1000,
        "data_path": "data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet",
        "features": {"observation.image": {"dtype": "image", "shape": [6, 5, 3]},
                     "timestamp": {"dtype": "float32", "shape": [1]}}}))
    (root / "meta" / "episodes.jsonl").write_text(json.dumps({"episode_index": 0, "length": 3}))
    (root / "data/chunk-000").mkdir(parents=True)
    pq.write_table(pa.table({"observation.image": pngs,
                             "timestamp": pa.array(np.arange(3, dtype=np.float32) / 10)}),
                   root / "data/chunk-000/episode_000000.parquet")
    src = open_source(root)
    assert src.specs["observation.image"].encoding == "png"
    kept = src.read(0).streams["observation.image"].data  # the PNG bytes, as they came
    assert list(kept) == [p["bytes"] for p in pngs]
    build(root, tmp_path / "c", rate_hz=10.0, progress=False, device="cpu")
    ds = RobotDataset(tmp_path / "c", image_dtype=torch.uint8)
    got = ds[torch.arange(len(ds))]["observation.image"][:, 0].permute(0, 2, 3, 1)
    np.testing.assert_array_equal(got.numpy(), frames)  # lossless
    # a channel-first declaration ([C, H, W], older datasets) is the same frame shape
    info = json.loads((root / "meta" / "info.json").read_text())
    info["features"]["observation.image"].update(shape=[3, 6, 5],
                                                 names=["channels", "height", "width"])
    (root / "meta" / "info.json").write_text(json.dumps(info))
    assert open_source(root).specs["observation.image"].shape == (6, 5, 3)


@pytest.mark.parametrize(("module", "fmt", "name"), [("zarr", "zarr-replay", "rb.zarr"),
                                                   ("h5py", "robomimic", "low_dim.hdf5")])
def test_reader_without_its_package_names_the_extra(monkeypatch, tmp_path, module, fmt, name):
    import sys

    from robocache.errors import MissingDependencyError

    (tmp_path / name).mkdir()
    monkeypatch.setitem(sys.modules, module, None)
    need = rf"'{module}'.*pip install 'robocache\[data\]'"
    with pytest.raises(MissingDependencyError, match=need):
        open_source(tmp_path / name, format=fmt).episode_indices()


def test_video_decoding_needs_an_extra(monkeypatch, tmp_path):
    import sys

    from robocache.data.episode import VideoRef
    from robocache.data.formats.video import decode_frames
    from robocache.errors import MissingDependencyError

    monkeypatch.setitem(sys.modules, "torchcodec", None)
    monkeypatch.setitem(sys.modules, "torchcodec.decoders", None)
    monkeypatch.setitem(sys.modules, "av", None)
    with pytest.raises(MissingDependencyError, match="pip install"):
        decode_frames(VideoRef(tmp_path / "x.mp4"), np.zeros(2))


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_zarr_missing_chunk_of_an_array_without_fill_value(tmp_path, zarr_format):
    root = tmp_path / "rb.zarr"
    g = zarr.open_group(str(root), mode="w", zarr_format=zarr_format)
    g.create_array("data/state", data=np.ones((60, 3), np.float32), chunks=(20, 3),
                   fill_value=None)
    g.create_array("data/timestamp", data=np.arange(60) / 10.0, chunks=(20,))
    g.create_array("meta/episode_ends", data=np.array([20, 40, 60]))
    files = open_source(root).files
    files(2)[-1].unlink()  # the timestamps of rows 40:60
    files(1)[0].unlink()  # a chunk of the array declaring no fill value (or zarr 3's default)
    src = open_source(root)
    assert src.read(0).streams["state"].data.shape == (20, 3)
    with pytest.raises(DataError, match=r"data/timestamp/\S+ \(rows 40:60\) is missing"):
        src.read(2)
    fill = g["data/state"].metadata.fill_value
    why = "declares no fill value" if fill is None else re.escape(f"fill value {fill.item()!r})")
    with pytest.raises(DataError, match=why):
        src.read(1)
