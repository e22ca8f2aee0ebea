"""Episodes with one planted defect each, and the audit flags each must raise (shared by the
audit, filter and edit tests)."""

from __future__ import annotations

import copy

import numpy as np

from robocache.data.episode import Episode, Stream, StreamSpec

RATE = 25.0
SPECS = {
    "observation.state": StreamSpec("observation.state", "numeric", "float32", (3,), RATE),
    "action": StreamSpec("action", "numeric", "float32", (2,), RATE),
    "observation.gripper": StreamSpec("observation.gripper", "numeric", "float32", (1,), RATE),
    "observation.images.cam": StreamSpec("observation.images.cam", "image", "uint8",
                                         (4, 5, 3), 10.0),
}

#: episode -> the flags it must carry (exactly); the others are clean
PLANTED = {
    0: {"near_duplicate"}, 3: {"jump"}, 4: {"frozen"}, 5: {"idle"},
    6: {"duplicate", "near_duplicate"}, 7: {"near_duplicate"}, 8: {"gripper_unused"},
    9: {"short"}, 10: {"task_empty"}, 11: {"task_unknown"}, 12: {"out_of_range"},
    13: {"stream_gap"}, 14: {"stream_gap"}, 1: {"camera_black"}, 2: {"camera_constant"},
    15: {"camera_duplicate"},
}
EPISODES = 16


def _clean(index: int, rng: np.random.Generator, seconds: float = 6.0) -> Episode:
    t = np.arange(int(seconds * RATE) + 1) / RATE
    phase = 0.7 * index
    freq = 0.25 + 0.02 * index
    state = np.stack([np.sin(2 * np.pi * freq * t + phase + k) for k in range(3)], 1)
    action = np.stack([np.cos(2 * np.pi * freq * t + phase + k) for k in range(2)], 1)
    grip = (0.5 - 0.5 * np.cos(2 * np.pi * t / seconds))[:, None]
    tc = np.arange(int(seconds * 10)) / 10.0 + 0.01
    frames = rng.integers(0, 255, (len(tc), 4, 5, 3), np.uint8)
    streams = {
        "observation.state": Stream(SPECS["observation.state"], t, state.astype(np.float32)),
        "action": Stream(SPECS["action"], t, action.astype(np.float32)),
        "observation.gripper": Stream(SPECS["observation.gripper"], t, grip.astype(np.float32)),
        "observation.images.cam": Stream(SPECS["observation.images.cam"], tc, frames),
    }
    return Episode(index, streams, {"tasks": [f"pick the cube {index % 3}"]})


def _with(ep: Episode, name: str, times=None, data=None) -> None:
    s = ep.streams[name]
    ep.streams[name] = Stream(s.spec, s.times if times is None else times,
                              s.data if data is None else data)


def planted_episodes(seed: int = 7) -> list[Episode]:
    """:data:`EPISODES` episodes at 25 Hz, 6 s each, with the defects of :data:`PLANTED`."""
    rng = np.random.default_rng(seed)
    eps = [_clean(i, rng) for i in range(EPISODES)]
    st = lambda i: eps[i].streams["observation.state"].data.copy()  # noqa: E731
    x = st(3)
    x[70:74, 1] -= 1.5 * np.sign(x[70, 1])  # 1.5 (3/4 of the range) away and back, a step each
    _with(eps[3], "observation.state", data=x)
    x = st(4)
    x[40:] = np.concatenate([np.repeat(x[40:41], 40, 0), x[40:-40]])  # paused 1.6 s
    _with(eps[4], "observation.state", data=x)
    for name in ("observation.state", "action"):  # paused 4.2 s, wobbling below the tolerance
        x = eps[5].streams[name].data.copy()
        x[20:] = np.concatenate([np.repeat(x[20:21], 105, 0), x[20:-105]])
        x[20:125] += rng.uniform(-1e-5, 1e-5, x[20:125].shape)
        _with(eps[5], name, data=x.astype(np.float32))
    eps[6] = copy.deepcopy(eps[0])
    eps[6].index = 6
    eps[7] = copy.deepcopy(eps[0])
    eps[7].index = 7
    for name in ("observation.state", "action"):
        x = eps[7].streams[name].data
        _with(eps[7], name, data=(x + rng.normal(0, 1e-3, x.shape)).astype(np.float32))
    g = eps[8].streams["observation.gripper"].data
    _with(eps[8], "observation.gripper", data=(g * 0.02).astype(np.float32))
    eps[9] = _clean(9, rng, seconds=0.4)
    eps[10].meta["tasks"] = [""]
    eps[11].meta["tasks"] = ["unknown"]
    x = st(12)
    bump = np.concatenate([np.linspace(0, 3.2, 9), np.linspace(3.2, 0, 9)[1:]])
    x[60:60 + len(bump), 2] += bump  # up to about 4: beyond q99 + half the range
    _with(eps[12], "observation.state", data=x)
    s = eps[13].streams["observation.state"]  # 0.6 s without a state sample
    keep = (s.times < 2.0) | (s.times > 2.6)
    _with(eps[13], "observation.state", times=s.times[keep], data=s.data[keep])
    s = eps[14].streams["observation.images.cam"]  # 1 s without a frame
    keep = (s.times < 2.0) | (s.times > 3.0)
    _with(eps[14], "observation.images.cam", times=s.times[keep], data=s.data[keep])
    s = eps[1].streams["observation.images.cam"]  # 1 s of black frames
    x = s.data.copy()
    x[20:30] = 0
    _with(eps[1], "observation.images.cam", data=x)
    s = eps[2].streams["observation.images.cam"]  # 1 s of a uniform grey
    x = s.data.copy()
    x[30:40] = 128
    _with(eps[2], "observation.images.cam", data=x)
    s = eps[15].streams["observation.images.cam"]  # one frame shown for 1.5 s
    x = s.data.copy()
    x[10:25] = x[10]
    _with(eps[15], "observation.images.cam", data=x)
    return eps
