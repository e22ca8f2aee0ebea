"""Small multi-rate episodes shared by the data tests (importable from any test directory)."""

from __future__ import annotations

import numpy as np

from robocache.data.episode import Episode, Stream, StreamSpec

SPECS = {
    "observation.state": StreamSpec("observation.state", "numeric", "float32", (3,), 25.0),
    "action": StreamSpec("action", "numeric", "float32", (2,), 25.0),
    "observation.pose": StreamSpec("observation.pose", "numeric", "float32", (4,), 20.0),
    "observation.images.cam": StreamSpec("observation.images.cam", "image", "uint8",
                                         (4, 5, 3), 10.0),
    "language.note": StreamSpec("language.note", "event", "str", (), None),
}


def make_episode(index: int, rng: np.random.Generator, duration: float | None = None) -> Episode:
    """Random multi-rate episode: 25 Hz state/action, jittered 20 Hz pose, 10 Hz frames."""
    duration = duration or float(rng.uniform(1.0, 2.0))
    t25 = np.arange(int(duration * 25) + 1) / 25.0
    t20 = np.sort(np.arange(int(duration * 20)) / 20.0 + 0.013 + rng.uniform(0, 4e-3, 1))
    t10 = np.arange(int(duration * 10)) / 10.0 + 0.031
    t_ev = np.sort(rng.uniform(0.2, duration - 0.2, 2))
    streams = {
        "observation.state": Stream(SPECS["observation.state"], t25,
                                    rng.normal(size=(len(t25), 3)).astype(np.float32)),
        "action": Stream(SPECS["action"], t25, rng.normal(size=(len(t25), 2)).astype(np.float32)),
        "observation.pose": Stream(SPECS["observation.pose"], t20,
                                   rng.normal(size=(len(t20), 4)).astype(np.float32)),
        "observation.images.cam": Stream(SPECS["observation.images.cam"], t10,
                                         rng.integers(0, 255, (len(t10), 4, 5, 3), np.uint8)),
        "language.note": Stream(SPECS["language.note"], t_ev,
                                np.array([f"note {index}.{k}" for k in range(2)], dtype=object)),
    }
    return Episode(index, streams, {"tasks": [f"task {index % 2}"]})
