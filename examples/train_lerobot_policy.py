"""Train a small action-chunking policy the way LeRobot's training loop consumes a dataset
(a batch dict in, a loss out), through `robocache.LeRobotDataset` on the bundled sample.

    $ python examples/train_lerobot_policy.py                 # LeRobot's loop: DataLoader
    $ python examples/train_lerobot_policy.py --fast          # whole batches where the cache is

The only change from a LeRobot script is the import. The policy reads ``observation.state``
(the previous and the current step), predicts a 16-step ``action`` chunk, normalizes with
``dataset.meta.stats`` and masks the padded actions with ``action_is_pad``, as LeRobot's
ACT and diffusion policies do.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from torch import nn

from robocache import LeRobotDataset  # was: from lerobot.datasets.lerobot_dataset import ...

ROOT = Path(__file__).resolve().parents[1] / "data" / "sample" / "panda_multirate"
HORIZON = 16


class ChunkPolicy(nn.Module):
    """MLP from two normalized states to a normalized action chunk; ``forward`` -> loss."""

    def __init__(self, stats: dict, state_dim: int, action_dim: int, hidden: int = 256):
        super().__init__()
        for key, name in (("observation.state", "state"), ("action", "action")):
            self.register_buffer(f"{name}_mean", torch.as_tensor(stats[key]["mean"]).float())
            self.register_buffer(f"{name}_std", torch.as_tensor(stats[key]["std"]).float() + 1e-8)
        self.net = nn.Sequential(nn.Linear(2 * state_dim, hidden), nn.ReLU(),
                                 nn.Linear(hidden, hidden), nn.ReLU(),
                                 nn.Linear(hidden, HORIZON * action_dim))
        self.action_dim = action_dim

    def forward(self, batch: dict) -> torch.Tensor:
        state = (batch["observation.state"] - self.state_mean) / self.state_std  # [B, 2, S]
        target = (batch["action"] - self.action_mean) / self.action_std         # [B, 16, A]
        pred = self.net(state.flatten(1)).view(-1, HORIZON, self.action_dim)
        err = (pred - target).abs().mean(-1)                                     # [B, 16]
        keep = ~batch["action_is_pad"]
        return (err * keep).sum() / keep.sum().clamp(min=1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--fast", action="store_true", help="batch path: whole batches gathered "
                   "where the cache lives (the GPU when there is one)")
    a = p.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    fps = 125  # the sample's meta/info.json fps
    delta_timestamps = {"observation.state": [-1 / fps, 0.0],
                        "action": [k / fps for k in range(HORIZON)]}
    dataset = LeRobotDataset("robocache/panda_multirate", root=ROOT,
                             delta_timestamps=delta_timestamps,
                             device=device if a.fast else "cpu")
    feats = dataset.meta.features
    policy = ChunkPolicy(dataset.meta.stats, feats["observation.state"]["shape"][0],
                         feats["action"]["shape"][0]).to(device)
    opt = torch.optim.AdamW(policy.parameters(), lr=1e-3)

    def batches():
        while True:
            if a.fast:
                yield from dataset.batches(a.batch_size)
            else:
                yield from torch.utils.data.DataLoader(dataset, batch_size=a.batch_size,
                                                       shuffle=True, drop_last=True)

    t0, stream = time.perf_counter(), batches()
    for step in range(1, a.steps + 1):
        batch = {k: v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v
                 for k, v in next(stream).items()}
        loss = policy(batch)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step == 1 or step % 50 == 0:
            print(f"step {step:4d}  loss {loss.item():.4f}  task {batch['task'][0]!r}")
    rate = a.steps * a.batch_size / (time.perf_counter() - t0)
    print(f"{a.steps} steps of {a.batch_size} in {'batch' if a.fast else 'DataLoader'} mode: "
          f"{rate:,.0f} samples/s on {device}")


if __name__ == "__main__":
    main()
