"""LeRobot's own training entry point on RoboCache: ACT trained by ``lerobot-train`` on the
LeRobot-written ``tests/fixtures/lerobot/train`` (an AV1 video and a parquet image camera),
the loss of every step equal to LeRobot's own run (benchmarks/lerobot_train_parity.py).

Where LeRobot imports (its 0.6.1 environment) both runs happen here; otherwise the recorded
run (``train_parity.json``) is checked: both backends' losses equal step by step, and every
batch RoboCache serves for the recorded sampler order byte-identical to the batch LeRobot's
DataLoader gave its training loop."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

import robocache

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "lerobot"
RECORDED = json.loads((FIXTURES / "train_parity.json").read_text())
sys.path.insert(0, str(REPO / "benchmarks"))
import lerobot_train_parity as parity  # noqa: E402

#: |loss difference| allowed per step (the recorded runs are equal to the bit)
TOLERANCE = 1e-6


def test_recorded_losses_match():
    ours, theirs = RECORDED["loss"]["robocache"], RECORDED["loss"]["lerobot"]
    assert len(ours) == len(theirs) == RECORDED["settings"]["steps"] >= 200
    assert max(abs(a - b) for a, b in zip(ours, theirs, strict=True)) <= TOLERANCE
    assert theirs[-1] < theirs[0]  # it trains
    assert RECORDED["first_differing_batch"] is None


def test_batches_equal_lerobots(tmp_path):
    """RoboCache's batches for LeRobot's recorded sampler order, built as lerobot-train builds
    its dataset for ACT (action chunk deltas, ``return_uint8=True``), byte for byte."""
    s = RECORDED["settings"]
    fps = json.loads((FIXTURES / "train" / "meta" / "info.json").read_text())["fps"]
    chunk = int(next(a for a in s["policy"] if a.startswith("--policy.chunk_size=")
                     ).split("=")[1])
    ds = robocache.LeRobotDataset("robocache/train", root=FIXTURES / "train",
                                  delta_timestamps={"action": [i / fps for i in range(chunk)]},
                                  return_uint8=True, cache=tmp_path / "cache",
                                  camera_codec="png")
    rel = ds.absolute_to_relative_idx
    digests = RECORDED["digest"]  # key -> one per step
    for step, index in enumerate(RECORDED["index"]):
        rows = index if rel is None else [rel[i] for i in index]
        batch = torch.utils.data.default_collate(ds.__getitems__(rows))
        assert parity.digest(batch) == {k: d[step] for k, d in digests.items()}, step


@pytest.mark.skipif(not importlib.util.find_spec("lerobot"),
                    reason="LeRobot 0.6.1 is not installed (its own environment, Python >= 3.12)")
def test_live_parity():
    result = parity.main(["--steps", "12"])
    assert result["max_abs_loss_diff"] <= TOLERANCE and result["first_differing_batch"] is None


def test_wrapper_arguments():
    from robocache.lerobot_train import split_argv, use_robocache

    opts, rest = split_argv(["--policy.type=act", "--robocache.camera_codec=png", "--steps=3"])
    assert opts == {"camera_codec": "png"} and rest == ["--policy.type=act", "--steps=3"]
    opts, _ = split_argv(["--robocache.camera_chroma=420", "--robocache.camera_quality=90"])
    assert opts == {"camera_chroma": "420", "camera_quality": 90}
    for bad in ("--robocache.codec=png", "--robocache.cache"):
        with pytest.raises(SystemExit, match="--robocache.NAME=VALUE"):
            split_argv([bad])
    with pytest.raises(SystemExit, match="camera_quality must be an integer"):
        split_argv(["--robocache.camera_quality=high"])
    with pytest.raises(TypeError, match="unknown RoboCache options"):
        use_robocache(codec="png")
    if not importlib.util.find_spec("lerobot"):
        with pytest.raises(ImportError, match=r"pip install 'lerobot\[training\]==0.6.1'"):
            use_robocache()
