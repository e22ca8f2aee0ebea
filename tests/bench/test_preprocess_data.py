"""bench preprocess's dataset generator writes what the LeRobot reader reads as intended."""

import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import preprocess_data as D  # noqa: E402

from robocache.data.episode import check_episode  # noqa: E402
from robocache.data.formats import open_source  # noqa: E402


def test_generated_episodes_have_their_streams_at_their_rates(tmp_path, monkeypatch):
    monkeypatch.setattr(D, "PER_FILE", 3)  # several data files
    root, samples = D.make_dataset(tmp_path / "ds", 7, seconds=2.0, camera=True, workers=1)
    src = open_source(root)
    assert src.format == "lerobot-v3.0" and src.episode_indices() == list(range(7))
    total = 0
    for i in range(7):
        ep = src.read(i)
        check_episode(ep, src.specs)
        for name, (dim, hz) in {**D.STREAMS, "observation.images.cam":
                                (D.CAMERA, D.CAMERA_HZ)}.items():
            s = ep.streams[name]
            assert len(s) == (int(2.0 * hz) + 1 if name in D.STREAMS else int(2.0 * hz))
            step = np.diff(s.times)
            jitter = 1.1e-3 if name == "observation.pose" else 1e-6
            np.testing.assert_allclose(step, 1 / hz, atol=jitter)
            assert s.data.shape[1:] == ((dim,) if name in D.STREAMS else D.CAMERA)
        assert list(ep.streams["language.note"].data) == ["reach", "grasp"]
        total += sum(len(s) for s in ep.streams.values())
    assert total == samples
    assert "file-001.parquet" in src.locate(4)  # episodes 3-5
