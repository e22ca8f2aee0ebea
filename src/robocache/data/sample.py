"""The bundled sample dataset: Franka Panda pick-and-place motions at genuinely mixed rates.

    $ python -m robocache.data.sample data/sample/panda_multirate   # regenerate (deterministic)

Each episode follows a smooth joint-space trajectory (closed form, so every stream samples the
same motion at its own times) and records, in LeRobot v3.0 layout with the multi-rate extension:

============================  ==========  ======================================================
stream                        rate        content
============================  ==========  ======================================================
``observation.state``         125 Hz      7 joint angles (rad) + gripper width (m)
``action``                    125 Hz      joint targets 40 ms ahead (rad) + gripper command (m)
``observation.ee_pose``       100 Hz      end-effector position (m) + rot6d, from the Panda
                                          URDF's forward kinematics; 0.3 ms timestamp jitter
``observation.images.top``    30 Hz       16×16 RGB top view (the gripper as a blob), 11 ms late
``language.subtask``          sparse      "reach the cube", "grasp", "place it in the bin", ...
``observation.images.front``  30 Hz       96×128 RGB camera, an AV1 mp4 written as LeRobot
                                          records video (all episodes in one file)
============================  ==========  ======================================================
"""

from __future__ import annotations

import argparse
from importlib.resources import files
from pathlib import Path

import numpy as np

from robocache.data.episode import Episode, Stream, StreamSpec
from robocache.data.formats.lerobot import write_lerobot

DEFAULT_PATH = Path(__file__).resolve().parents[3] / "data" / "sample" / "panda_multirate"
FPS = 125.0
Q_HOME = np.array([0.0, -0.785, 0.0, -2.356, 0.0, 1.571, 0.785])
Q_LOWER = np.array([-2.8973, -1.7628, -2.8973, -3.0718, -2.8973, -0.0175, -2.8973])
Q_UPPER = np.array([2.8973, 1.7628, 2.8973, -0.0698, 2.8973, 3.7525, 2.8973])
SUBTASKS = ("reach the cube", "grasp", "lift and carry", "place it in the bin")

SPECS = {
    "observation.state": StreamSpec("observation.state", "numeric", "float32", (8,), 125.0),
    "action": StreamSpec("action", "numeric", "float32", (8,), 125.0),
    "observation.ee_pose": StreamSpec("observation.ee_pose", "numeric", "float32", (9,), 100.0),
    "observation.images.top": StreamSpec("observation.images.top", "image", "uint8",
                                         (16, 16, 3), 30.0),
    "language.subtask": StreamSpec("language.subtask", "event", "str", (), None),
}


class _Motion:
    """A closed-form pick-and-place motion: q(t) = home + Σ smooth bumps, gripper(t)."""

    def __init__(self, rng: np.random.Generator, duration: float):
        self.duration = duration
        self.amp = rng.uniform(-0.5, 0.5, size=(3, 7))
        self.freq = rng.uniform(0.1, 0.35, size=(3, 1))
        self.phase = rng.uniform(0, 2 * np.pi, size=(3, 7))
        self.grasp_t, self.release_t = duration * rng.uniform(0.3, 0.4), duration * 0.8

    def q(self, t: np.ndarray) -> np.ndarray:
        envelope = np.sin(np.pi * np.clip(t / self.duration, 0, 1))[:, None]  # rest at both ends
        wave = np.sin(2 * np.pi * self.freq[None] * t[:, None, None] + self.phase[None])
        q = Q_HOME + envelope * (self.amp[None] * wave).sum(1)
        return np.clip(q, Q_LOWER, Q_UPPER)

    def gripper(self, t: np.ndarray) -> np.ndarray:
        closing = 1 / (1 + np.exp(-(t - self.grasp_t) * 20))
        opening = 1 / (1 + np.exp(-(t - self.release_t) * 20))
        return 0.04 * (1 - closing + opening)


VIDEO_KEY, VIDEO_FPS, VIDEO_HW = "observation.images.front", 30.0, (96, 128)


def _render(xyz: np.ndarray, width: np.ndarray, hw: tuple[int, int] = (16, 16)) -> np.ndarray:
    """Top view, ``hw`` pixels: red = gripper blob (brighter when lower), green = gripper
    opening, blue = the bin at a fixed spot."""
    gy, gx = ((np.arange(n) + 0.5) / n for n in hw)
    px = xyz[:, 0] / 0.6  # x in [0, 0.6] m -> [0, 1]
    py = (xyz[:, 1] + 0.4) / 0.8  # y in [-0.4, 0.4] m
    blob = np.exp(-(((gy[None, :, None] - px[:, None, None]) ** 2)
                    + ((gx[None, None, :] - py[:, None, None]) ** 2)) / 0.01)
    bin_ = np.exp(-(((gy[:, None] - 0.8) ** 2) + ((gx[None, :] - 0.2) ** 2)) / 0.005)
    img = np.stack([blob * np.clip(1.2 - xyz[:, 2, None, None], 0, 1),
                    np.broadcast_to((width / 0.04)[:, None, None], blob.shape) * 0.5,
                    np.broadcast_to(bin_, blob.shape)], axis=-1)
    return (np.clip(img, 0, 1) * 255).astype(np.uint8)


def _pose(chain, fk, q: np.ndarray) -> np.ndarray:
    """End-effector position (m) + rot6d (first two rotation columns) by forward kinematics."""
    import torch

    m = fk(chain, torch.as_tensor(q, dtype=torch.float32)).numpy()
    return np.concatenate([m[:, :3, 3], m[:, :3, 0], m[:, :3, 1]], 1)


def make_episodes(num_episodes: int = 6, seed: int = 0,
                  urdf: str | Path | None = None) -> list[Episode]:
    """Generate the sample episodes (deterministic for a seed) with ``robocache.kinematics``
    on the Panda URDF (default: the one vendored in ``robocache/assets``)."""
    from robocache.kinematics import Chain, fk

    chain = Chain.from_urdf(urdf or files("robocache") / "assets" / "panda.urdf", "panda_hand")
    rng = np.random.default_rng(seed)
    episodes = []
    for index in range(num_episodes):
        duration = float(rng.uniform(6.0, 9.0))
        motion = _Motion(rng, duration)
        t_joint = np.arange(int(duration * 125) + 1) / 125.0
        t_ee = np.arange(int(duration * 100) + 1) / 100.0 + 0.002 + rng.normal(0, 3e-4, 1)[0]
        t_ee = np.sort(np.clip(t_ee + rng.normal(0, 3e-4, t_ee.shape), 0, duration))
        t_cam = np.arange(int((duration - 0.011) * 30) + 1) / 30.0 + 0.011
        state = np.concatenate([motion.q(t_joint), motion.gripper(t_joint)[:, None]], 1)
        command = np.where(motion.gripper(t_joint + 0.04) < 0.02, 0.0, 0.04)
        action = np.concatenate([motion.q(t_joint + 0.04), command[:, None]], 1)
        ee = _pose(chain, fk, motion.q(t_ee))
        frames = _render(_pose(chain, fk, motion.q(t_cam))[:, :3], motion.gripper(t_cam))
        t_events = np.array([0.0, motion.grasp_t - 0.2, motion.grasp_t + 0.3,
                             motion.release_t - 0.6])
        streams = {
            "observation.state": Stream(SPECS["observation.state"], t_joint,
                                        state.astype(np.float32)),
            "action": Stream(SPECS["action"], t_joint, action.astype(np.float32)),
            "observation.ee_pose": Stream(SPECS["observation.ee_pose"], t_ee,
                                          ee.astype(np.float32)),
            "observation.images.top": Stream(SPECS["observation.images.top"], t_cam, frames),
            "language.subtask": Stream(SPECS["language.subtask"], t_events,
                                       np.array(SUBTASKS, dtype=object)),
        }
        t_video = np.arange(int(duration * VIDEO_FPS) + 1) / VIDEO_FPS
        video = _render(_pose(chain, fk, motion.q(t_video))[:, :3], motion.gripper(t_video),
                        VIDEO_HW)
        episodes.append(Episode(index, streams, {"tasks": ["put the cube in the bin"],
                                                 "video": video}))
    return episodes


def write_sample(path: str | Path = DEFAULT_PATH, num_episodes: int = 6, seed: int = 0) -> Path:
    """Generate and write the sample dataset (LeRobot v3.0 layout) to ``path``; the camera
    video needs PyAV (the ``video`` extra)."""
    from robocache.data.cameras import add_video_feature

    episodes = make_episodes(num_episodes, seed)
    root = write_lerobot(path, episodes, SPECS, fps=FPS, version="v3.0", robot_type="panda")
    add_video_feature(root, VIDEO_KEY, [e.meta["video"] for e in episodes], fps=VIDEO_FPS)
    return root


def sample_path() -> Path:
    """Where the committed sample dataset lives (in a source checkout)."""
    return DEFAULT_PATH


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path", nargs="?", default=str(DEFAULT_PATH))
    parser.add_argument("--episodes", type=int, default=6)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(write_sample(args.path, args.episodes, args.seed))
