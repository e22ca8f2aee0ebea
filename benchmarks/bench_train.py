"""Training-loop benchmark: a small transformer policy fed by RoboCache vs by a CPU DataLoader.

    $ robocache bench train --json benchmarks/results/train.json
    $ python benchmarks/bench_train.py --quick

The policy (ACT-like: observation tokens + learned action queries through a pre-norm
transformer encoder, d 256, 6 layers, bf16 autocast on CUDA, AdamW) trains on batches of 256
windows (history 2 of 24-D state, horizon 16 of 16-D actions, masked MSE) from the dataset of
``bench_loader``. On CUDA the whole step is replayed from a CUDA graph (what a throughput-minded
user does; eager, this small model is bound by kernel launches on the host, whatever feeds it).

Reported per feeder: step time (wall, per step) and the GPU busy fraction, two ways:
``busy`` = the time CUDA events bracketing each step (input copy + fwd/bwd/AdamW) on the
training stream spend inside steps, over the span of all steps (gaps = the GPU waiting for
data or for the host); ``busy_ideal`` = step time with batches already on the GPU
(``model-only``) / step time with the feeder. Target: busy >= 95 % with RoboCache.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import torch

from robocache.bench import harness as H
from robocache.bench.standalone import main

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench_loader, when run by the CLI
import bench_loader as L  # noqa: E402

FAMILY = "train"
FULL = {"episodes": 200, "length": 500, "steps": 100, "repeats": 3, "workers": 8,
        "d_model": 256, "layers": 6}
QUICK = {"episodes": 8, "length": 120, "steps": 3, "repeats": 1, "workers": 0,
         "d_model": 64, "layers": 1}


class Policy(torch.nn.Module):
    """Observation tokens + ``horizon`` learned queries -> transformer encoder -> actions."""

    def __init__(self, obs_dim: int, act_dim: int, history: int, horizon: int, d: int,
                 layers: int):
        super().__init__()
        self.history = history
        self.obs_in = torch.nn.Linear(obs_dim, d)
        self.queries = torch.nn.Parameter(torch.randn(horizon, d) * 0.02)
        self.pos = torch.nn.Parameter(torch.zeros(history + horizon, d))
        layer = torch.nn.TransformerEncoderLayer(d, 8, 4 * d, batch_first=True, norm_first=True,
                                                 dropout=0.0)
        self.encoder = torch.nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.out = torch.nn.Linear(d, act_dim)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        q = self.queries.expand(obs.shape[0], -1, -1)
        x = torch.cat([self.obs_in(obs), q], 1) + self.pos
        return self.out(self.encoder(x)[:, self.history:])


def run(quick: bool = False, copy_gbps: float | None = None) -> list[dict]:
    from robocache.data import RobotDataset, RobotLoader
    from robocache.data.cache import build
    from robocache.ops.normalize import Normalizer

    cfg = QUICK if quick else FULL
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    cuda = device.type == "cuda"
    torch.manual_seed(0)
    model = Policy(L.OBS_DIM, L.ACT_DIM, L.HISTORY, L.HORIZON, cfg["d_model"],
                   cfg["layers"]).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, capturable=cuda)
    keys = ("observation.state", "action", "action_is_pad")

    def train_step(batch):
        with torch.autocast(device.type, torch.bfloat16, enabled=cuda, cache_enabled=False):
            pred = model(batch["observation.state"])
        err = (pred.float() - batch["action"]) ** 2
        loss = (err * (~batch["action_is_pad"])[..., None]).mean()
        loss.backward()
        opt.step()

    def sync():
        if cuda:
            torch.cuda.synchronize(device)

    def make_step(example):
        """Eager step on CPU; on CUDA the whole step (fwd, bwd, AdamW) replayed from a CUDA
        graph fed through static input buffers, so the GPU is not starved by kernel launches
        and any idle time left is the feeder's."""
        if not cuda:
            def eager(batch):
                opt.zero_grad(set_to_none=True)
                train_step(batch)
            return eager
        static = {k: example[k].clone() for k in keys}
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            for _ in range(3):
                opt.zero_grad(set_to_none=True)
                train_step(static)
        torch.cuda.current_stream(device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        opt.zero_grad(set_to_none=True)
        with torch.cuda.graph(graph):
            train_step(static)

        def replay(batch):
            for k in keys:
                static[k].copy_(batch[k], non_blocking=True)
            graph.replay()
        return replay

    def measure(step, batches):
        for _ in range(5):
            step(next(batches))
        samples = []
        for _ in range(cfg["repeats"]):
            sync()
            t0 = time.perf_counter()
            for _ in range(cfg["steps"]):
                step(next(batches))
            sync()
            samples.append((time.perf_counter() - t0) * 1e3 / cfg["steps"])
        busy = None
        if cuda:  # events bracket each step on the training stream: gaps are GPU idle time
            marks = []
            for _ in range(cfg["steps"]):
                batch = next(batches)
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(
                    enable_timing=True)
                start.record()
                step(batch)
                end.record()
                marks.append((start, end))
            sync()
            spent = sum(s.elapsed_time(e) for s, e in marks)
            busy = spent / marks[0][0].elapsed_time(marks[-1][1])
        return H.summarize(samples), busy

    name = f"policy-d{cfg['d_model']}x{cfg['layers']}-b{L.BATCH}"
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = L.make_dataset(Path(tmp) / "lerobot", cfg["episodes"], cfg["length"])
        build(root, Path(tmp) / "cache", rate_hz=L.FPS, progress=False)
        ds = RobotDataset(Path(tmp) / "cache", history=L.HISTORY, horizon=L.HORIZON)
        loader = RobotLoader(ds, L.BATCH, device=device)
        fixed = {k: v.clone() for k, v in next(iter(loader)).items()}
        step = make_step(fixed)
        results["model-only"] = measure(step, iter(lambda: fixed, None))
        results["robocache-resident" if cuda else "robocache"] = measure(
            step, L._robocache_batches(loader))
        normalizer = Normalizer(ds.stats)
        w = cfg["workers"]
        results[f"torch-dataloader-w{w}"] = measure(
            step, L._plain_batches(L.ParquetWindows(root), w, device, normalizer))
    ideal = results["model-only"][0].median_ms
    records = []
    for impl, (timing, busy) in results.items():
        records.append(H.case(FAMILY, name, impl, timing, step_ms=timing.median_ms,
                              busy=busy, busy_ideal=ideal / timing.median_ms,
                              note=(f"busy {100 * busy:.1f}%, " if busy else "")
                              + f"{100 * ideal / timing.median_ms:.0f}% of model-only"))
    return records


if __name__ == "__main__":
    main(run, __doc__)
