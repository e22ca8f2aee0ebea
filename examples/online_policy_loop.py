"""A 50 Hz control loop that feeds a plain PyTorch policy the observation it was trained on,
built online by `robocache.Observer` from the robot's messages.

    $ python examples/online_policy_loop.py                  # CPU, or the GPU when there is one
    $ python examples/online_policy_loop.py --compile        # the tick's core torch.compile'd

The "robot" is the bundled sample's episode 0 replayed message by message in log order
(joints and actions at 125 Hz, end-effector pose at 100 Hz, a 30 Hz camera as JPEG bytes). The
observer comes from the 50 Hz cache training used (built here on first run), so the loop gets
the training windows: 2 history steps of state and pose normalized with the cache's statistics,
``_is_pad`` masks, the camera frame served as in evaluation. The policy (an untrained MLP here;
load your trained weights instead) predicts a normalized action, mapped back to robot units
with the same statistics.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

import robocache
from robocache.ops.normalize import Normalizer

ROOT = Path(__file__).resolve().parents[1] / "data" / "sample" / "panda_multirate"
KEYS = ["observation.state", "observation.ee_pose", "observation.images.top"]


class Policy(nn.Module):
    """Two steps of (state, pose, camera) -> one normalized action."""

    def __init__(self, state: int, pose: int, action: int, hidden: int = 128):
        super().__init__()
        self.vision = nn.Sequential(nn.Conv2d(3, 8, 3, stride=2), nn.ReLU(),
                                    nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.head = nn.Sequential(nn.Linear(2 * (state + pose + 8), hidden), nn.ReLU(),
                                  nn.Linear(hidden, action))

    def forward(self, obs: dict) -> torch.Tensor:
        cam = self.vision(obs["observation.images.top"])              # [2, 8]
        x = torch.cat([obs["observation.state"], obs["observation.ee_pose"], cam], -1)
        return self.head(x.flatten())


def robot_messages(cache: Path, index: int = 0):
    """The episode's messages in log order: (time, stream, value)."""
    import lance

    from robocache.data.cache import load_episode
    from robocache.data.formats import open_source

    src = open_source(ROOT)
    ep = load_episode(src, index, {k: src.specs[k] for k in KEYS[:2]})
    msgs = [(float(t), k, v) for k in KEYS[:2]
            for t, v in zip(ep.streams[k].times, ep.streams[k].data, strict=True)]
    # the camera sends JPEG frames; here, the ones the cache stores for this episode
    table = lance.dataset(str(cache / "frames" / f"{KEYS[2]}.lance")).to_table()
    table = table.filter(table.column("episode_index").to_numpy() == index).sort_by("frame")
    msgs += [(float(t), KEYS[2], b) for t, b in zip(table.column("timestamp").to_pylist(),
                                                    table.column("encoded").to_pylist(),
                                                    strict=True)]
    return sorted(msgs, key=lambda m: m[0])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cache", type=Path, default=Path("/tmp/robocache-online-example.cache"))
    p.add_argument("--compile", action="store_true", help="torch.compile the tick's core")
    a = p.parse_args()
    if not (a.cache / "manifest.json").exists():
        robocache.cache.build(ROOT, a.cache, rate_hz=50.0, progress=False, episodes=[0, 1])
    device = "cuda" if torch.cuda.is_available() else "cpu"
    obs = robocache.Observer.from_cache(a.cache, history=2, keys=KEYS, normalize="mean_std",
                                        device=device, compile=a.compile)
    stats = robocache.RobotDataset(a.cache, keys=["action"]).stats
    actions = Normalizer({"action": stats["action"]}, "mean_std")
    policy = Policy(8, 9, 8).to(device).eval()

    messages, at = robot_messages(a.cache), 0
    t0 = messages[0][0] + 0.1  # once every stream has started
    obs.start(t0)
    lag = 0.012  # serve the step every stream has passed (the 100 Hz pose: 10 ms)
    tick_us = []
    for k in range(200):
        now = t0 + k / 50 + lag
        while at < len(messages) and messages[at][0] <= now:  # what arrived since last tick
            obs.push(messages[at][1], messages[at][0], messages[at][2])
            at += 1
        start = time.perf_counter()
        o = obs.observation(now)
        with torch.no_grad():
            action = actions.inverse({"action": policy(o)})["action"]
        if device == "cuda":
            torch.cuda.synchronize()
        tick_us.append((time.perf_counter() - start) * 1e6)
        if k % 50 == 0:
            stale = [key for key in KEYS if o[f"{key}_is_pad"][-1]]
            print(f"step {int(o['index'])}: action[:3] = {action[:3].tolist()}, "
                  f"stale: {stale or 'none'}")
    print(f"observation + policy per tick: p50 {np.percentile(tick_us, 50):.0f} us, "
          f"p99 {np.percentile(tick_us, 99):.0f} us ({device})")


if __name__ == "__main__":
    main()
