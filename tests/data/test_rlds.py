"""The RLDS reader against TensorFlow Datasets' own fixtures (tests/fixtures/rlds)."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from robocache.data.formats import open_source, tfrecord
from robocache.data.formats.rlds import RldsSource
from robocache.errors import DataError, MissingDependencyError

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "rlds"
SPLITS = {"png": ("train", "val"), "jpeg": ("train", "val")}


def version(config: str) -> Path:
    return FIXTURES / "toy_rlds" / config / "1.0.0"


def copy(tmp_path: Path, config: str = "jpeg") -> Path:
    dest = tmp_path / "toy_rlds" / config / "1.0.0"
    shutil.copytree(version(config), dest)
    return dest


def decode(data: bytes) -> np.ndarray:
    with Image.open(io.BytesIO(data)) as im:
        return np.asarray(im.convert("RGB"))


def text(a: np.ndarray) -> np.ndarray:
    """TFDS returns Text as bytes."""
    return np.char.decode(a) if a.dtype.kind == "S" else a


@pytest.mark.parametrize("config", ["png", "jpeg"])
def test_every_step_equals_tfds(config):
    expected = np.load(FIXTURES / "decoded" / f"{config}.npz")
    for split in SPLITS[config]:
        src = open_source(FIXTURES / "toy_rlds" / config, split=split, fps=10.0)
        assert isinstance(src, RldsSource) and src.root == version(config)
        n = len({k.split("/")[1] for k in expected.files if k.startswith(f"{split}/")})
        assert src.episode_indices() == list(range(n))
        for i in range(n):
            ep = src.read(i)
            want = {k[len(f"{split}/{i}/"):]: text(expected[k]) for k in expected.files
                    if k.startswith(f"{split}/{i}/")}
            steps = len(want["steps/action"])
            assert ep.meta["tasks"] == sorted(set(want["steps/language_instruction"]))
            assert ep.meta["episode_metadata/file_path"] == str(
                want["episode_metadata/file_path"])
            assert ep.meta["episode_metadata/episode_id"] == int(
                want["episode_metadata/episode_id"])
            for key, value in want.items():
                name = key[len("steps/"):].replace("/", ".")
                if not key.startswith("steps/") or name == "language_instruction" or \
                        key.endswith("#islow"):
                    continue
                stream = ep.streams[name]
                np.testing.assert_array_equal(stream.times, np.arange(steps) / 10.0)
                if stream.spec.kind == "image":  # kept encoded: decoded here to compare
                    assert stream.spec.encoding == config
                    pixels = np.stack([decode(b) for b in stream.data]).astype(np.int16)
                    if config == "png":  # lossless: equal to TFDS's pixels
                        np.testing.assert_array_equal(pixels, value, err_msg=key)
                        continue
                    # JPEG: equal to TensorFlow's decode of the same bytes with the accurate
                    # IDCT; TFDS's default (fast integer IDCT) differs by IDCT rounding only
                    np.testing.assert_array_equal(pixels, want[key + "#islow"], err_msg=key)
                    diff = np.abs(pixels - value)
                    assert diff.max() <= 16 and diff.mean() < 4.0, (key, diff.max())
                else:
                    assert stream.data.dtype == value.dtype, key
                    np.testing.assert_array_equal(stream.data, value, err_msg=key)


def test_splits_slices_and_newest_version(tmp_path):
    root = tmp_path / "toy_rlds" / "jpeg"
    copy(tmp_path)
    (root / "0.9.0").mkdir()  # an older, empty version: never picked
    assert RldsSource(root, fps=5).root.name == "1.0.0"
    count = lambda s: len(RldsSource(root, split=s, fps=5).episode_indices())  # noqa: E731
    assert [count(s) for s in ("train", "val", "train[:50%]", "train[1:]+val", "train[-1:]",
                               "train[:-25%]")] == [4, 2, 2, 5, 1, 3]
    src = RldsSource(root, split="train[2:]+val[:1]", fps=5)
    full = RldsSource(root, split="train", fps=5)
    np.testing.assert_array_equal(src.read(0).streams["action"].data,
                                  full.read(2).streams["action"].data)
    with pytest.raises(DataError, match="'test' is not a split.*splits: \\['train', 'val'\\]"):
        RldsSource(root, split="test", fps=5)


def test_inspect_shows_features_splits_and_rate():
    from robocache.cli.inspect import summarize

    facts = summarize(version("png"), 2, 15.0, "val")
    assert facts["splits"]["train"]["episodes"] == 3 and facts["selected_episodes"] == 2
    assert facts["splits"]["val"]["shards"] == ["toy_rlds-val.tfrecord-00000-of-00001"]
    assert facts["features"]["steps[]"]["observation"]["image"] == "image uint8[16, 12, 3] png"
    assert facts["rate_hz"] == 15.0 and facts["timing"] == "no timestamps: 15 Hz from --fps"
    assert facts["tasks"] and facts["steps_inspected"] > 0


def test_ingest_keeps_encoded_frames_and_tasks(tmp_path):
    import lance

    from robocache.data import RobotDataset
    from robocache.data.cache import build

    m = build(version("jpeg"), tmp_path / "cache", rate_hz=10.0, device="cpu", progress=False,
              source_options={"fps": 10.0, "split": "train"})
    assert m["counts"]["cached"] == 4 and m["source"]["format"] == "rlds split=train"
    assert m["timing"] == "no timestamps: 10 Hz from --fps"
    assert m["streams"]["observation.image"]["encoding"] == "jpeg"
    src = RldsSource(version("jpeg"), fps=10.0)
    frames = lance.dataset(str(tmp_path / "cache/frames/observation.image.lance")).to_table()
    first = [b for b, e in zip(frames.column("encoded").to_pylist(),
                               frames.column("episode_index").to_pylist(), strict=True) if e == 0]
    assert first == list(src.read(0).streams["observation.image"].data)  # byte for byte
    assert [e["task"] for e in m["episodes"]] == [src.read(i).meta["tasks"][0] for i in range(4)]
    ds = RobotDataset(tmp_path / "cache", keys=["observation.image", "action"],
                      image_dtype=torch.uint8)
    np.testing.assert_array_equal(ds[0]["observation.image"][0].permute(1, 2, 0).numpy(),
                                  decode(first[0]))


def _flip(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0x40
    path.write_bytes(bytes(data))


def test_corrupt_and_truncated_records_are_quarantined(tmp_path):
    from robocache.data.cache import build

    root = copy(tmp_path)
    shard0, shard1 = sorted(root.glob("*-train.tfrecord-*"))
    scan = tfrecord.scan(shard0)
    _flip(shard0, scan.offsets[1] + 100)  # data of episode 1
    size = shard1.stat().st_size
    with open(shard1, "r+b") as f:  # cut the last record (episode 3) short
        f.truncate(size - 50)
    src = RldsSource(root, fps=10)
    with pytest.raises(DataError, match="record at byte .* is corrupt \\(data CRC mismatch\\)"):
        src.read(1)
    with pytest.raises(DataError, match="truncated"):
        src.read(3)
    m = build(src, tmp_path / "cache", rate_hz=10.0, device="cpu", progress=False)
    c = m["counts"]
    assert (c["read"], c["cached"], c["quarantined"]) == (4, 2, 2)
    assert [q["index"] for q in m["quarantined"]] == [1, 3]
    assert "CRC" in m["quarantined"][0]["reason"] and "truncated" in m["quarantined"][1]["reason"]


def test_corrupt_length_makes_the_rest_of_a_shard_unreachable(tmp_path):
    root = copy(tmp_path)
    shard0 = sorted(root.glob("*-train.tfrecord-*"))[0]
    scan = tfrecord.scan(shard0)
    _flip(shard0, scan.offsets[1] - 12)  # the length of the second record
    src = RldsSource(root, fps=10)
    src.read(0)
    with pytest.raises(DataError, match="corrupt record length at byte"):
        src.read(1)


def test_bad_input_one_line_errors(tmp_path):
    root = copy(tmp_path)
    features = json.loads((root / "features.json").read_text())
    obs = features["featuresDict"]["features"]["steps"]["sequence"]["feature"][
        "featuresDict"]["features"]["observation"]["featuresDict"]["features"]
    obs["depth"] = {"pythonClassName": "tensorflow_datasets.core.features.video_feature.Video",
                    "video": {}}
    (root / "features.json").write_text(json.dumps(features))
    with pytest.raises(DataError, match="'steps/observation/depth': type Video is not supported"):
        RldsSource(root, fps=10)
    (root / "features.json").unlink()
    with pytest.raises(DataError, match="looks like a TFDS dataset but has no features.json"):
        open_source(root, fps=10)
    unrated = RldsSource(version("png"))  # describes without a rate, reads nothing
    assert unrated.describe()["features"] and unrated.specs
    with pytest.raises(DataError, match="pass fps=<Hz> \\(--fps\\)"):
        unrated.read(0)


def test_sequence_example_and_framing_match_tensorflow():
    path = FIXTURES / "sequence_example.tfrecord"
    expected = json.loads((FIXTURES / "sequence_example.json").read_text())
    scan = tfrecord.scan(path)
    assert scan.error is None and len(scan.offsets) == len(expected)
    with open(path, "rb") as f:
        records = [tfrecord.read_record(f, o, n, path.name)
                   for o, n in zip(scan.offsets, scan.lengths, strict=True)]
    assert b"".join(tfrecord.frame(r) for r in records) == path.read_bytes()
    for record, want in zip(records, expected, strict=True):
        context, lists = tfrecord.parse_sequence_example(record)
        assert context["episode_id"].tolist() == want["context"]["episode_id"]
        assert [b.decode() for b in context["robot"]] == want["context"]["robot"]
        for key, steps in want["feature_lists"].items():
            got = [v.tolist() if isinstance(v, np.ndarray) else [b.decode() for b in v]
                   for v in lists[key]]
            assert got == steps, key


def test_missing_protobuf_names_the_extra(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "google.protobuf", None)
    monkeypatch.setattr(tfrecord, "_CLASSES", None)
    with pytest.raises(MissingDependencyError, match=r"pip install 'robocache\[data\]'"):
        tfrecord.parse_example(b"")
