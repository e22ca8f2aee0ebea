"""A LeRobot policy (ACT) driven at 50 Hz by `robocache.Observer`: the observation LeRobot's
dataset served in training, built online from the robot's messages.

    $ python examples/online_lerobot_policy.py --cache /tmp/robocache-online-example.cache

Needs LeRobot (0.6.1; Python >= 3.12) and a 50 Hz cache of the bundled sample (made by
``python examples/online_policy_loop.py`` or ``robocache ingest data/sample/panda_multirate
CACHE --rate 50``). The observer serves what ``LeRobotDataset`` items hold for the policy's
inputs (``delta_timestamps={}``: the current step, no window dimension) in raw units: LeRobot's
own pre-processor adds the batch dimension and normalizes with the statistics given to it (the
cache's here), its post-processor maps the action back. The ACT policy is untrained (random
weights, no pretrained backbone); load a trained one with ``ACTPolicy.from_pretrained``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch
from lerobot.configs.types import FeatureType, PolicyFeature
from lerobot.policies.act.configuration_act import ACTConfig
from lerobot.policies.act.modeling_act import ACTPolicy
from lerobot.policies.act.processor_act import make_act_pre_post_processors

import robocache

KEYS = ["observation.state", "observation.images.top"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cache", type=Path, default=Path("/tmp/robocache-online-example.cache"))
    p.add_argument("--ticks", type=int, default=50)
    a = p.parse_args()
    manifest = json.loads((a.cache / "manifest.json").read_text())
    stats = json.loads((a.cache / manifest["stats_path"]).read_text())
    streams = manifest["streams"]
    h, w, c = streams[KEYS[1]]["shape"]
    config = ACTConfig(
        input_features={KEYS[0]: PolicyFeature(FeatureType.STATE, tuple(streams[KEYS[0]]["shape"])),
                        KEYS[1]: PolicyFeature(FeatureType.VISUAL, (c, h, w))},
        output_features={"action": PolicyFeature(FeatureType.ACTION,
                                                 tuple(streams["action"]["shape"]))},
        pretrained_backbone_weights=None, device="cpu")
    policy = ACTPolicy(config).eval()
    # the cache's statistics; camera statistics as LeRobot's image defaults (ImageNet)
    dataset_stats = {k: {m: torch.tensor(stats[k][m], dtype=torch.float32)
                         for m in ("mean", "std", "min", "max")}
                     for k in (KEYS[0], "action")}
    dataset_stats[KEYS[1]] = {"mean": torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1),
                              "std": torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1)}
    pre, post = make_act_pre_post_processors(config, dataset_stats=dataset_stats)

    obs = robocache.Observer.from_cache(a.cache, keys=KEYS, delta_timestamps={},
                                        task="pick the cube")
    # a stand-in robot: smooth joint readings at 125 Hz and a 30 Hz camera, in log order
    rng = np.random.default_rng(0)
    frame = rng.integers(0, 255, (h, w, c), np.uint8)
    end = a.ticks / 50 + 0.1
    log = sorted([(j / 125, KEYS[0], np.sin(np.arange(8) + j / 125).astype(np.float32))
                  for j in range(int(end * 125))] +
                 [(j / 30, KEYS[1], frame) for j in range(int(end * 30))], key=lambda m: m[0])
    at = 0
    obs.start(0.0)
    for k in range(a.ticks):
        now = k / 50 + 0.012  # serve step k once the 125 Hz joints have passed it
        while log[at][0] <= now:
            obs.push(log[at][1], log[at][0], log[at][2])
            at += 1
        o = obs.observation(now)
        batch = {k: o[k] for k in KEYS}
        batch["task"] = o["task"]
        with torch.no_grad():
            action = post(policy.select_action(pre(batch)))
        if k % 10 == 0:
            print(f"step {int(o['index'])}: action {action.shape}, first {action[0, :3].tolist()}"
                  f", padded: {[k for k in KEYS if o[f'{k}_is_pad']]}")


if __name__ == "__main__":
    main()
