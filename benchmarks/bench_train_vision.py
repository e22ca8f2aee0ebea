"""Vision training-loop benchmark: a ResNet-18 policy on two cameras, fed by RoboCache's GPU path
vs by a CPU DataLoader decoding video per sample.

    $ robocache bench train_vision --json benchmarks/results/train_vision.json
    $ python benchmarks/bench_train_vision.py --episodes 120 --seconds 20 --json out.json
    $ python benchmarks/bench_train_vision.py --quick          # CPU smoke run (tiny model)

Dataset: ``bench_cameras.make_dataset`` (LeRobot v3.0, two 480x640 H.264 cameras, 6-D state and
action at 30 fps; ``episodes`` x ``length`` frames), ingested once with the frames decoded
into JPEG q95 (``camera_codec="jpeg"``; the default keeps the videos as video, measured by
``bench video``). Policy: ``torchvision.models.resnet18(weights=None)`` shared by both cameras
and both history frames (4 images a sample) -> 512-D features each, concatenated with the
2-step state -> MLP (512, 512) -> an action chunk of ``horizon`` steps; masked MSE, AdamW
(fused on CUDA), bf16 autocast, channels-last. Batch 64.

Feeds, each trained on for ``seconds`` (at least ``min_steps`` steps) after ``warmup`` steps:

- ``model-only``: one batch already on the GPU, reused: the step time with a free feed.
- ``robocache``: ``RobotDataset(..., image_size=(224, 224), image_transforms=random crop (side
  0.8-1.0) + colour jitter)`` behind ``RobotLoader`` resident on the GPU (index gather, nvJPEG
  decode, fused transform, normalization: all on the GPU).
- ``cpu-loader-w<N>``: ``bench_cameras.PerSampleVideo`` (LeRobot's per-sample PyAV decode: seek,
  decode to the frame, float32 [0, 1] frames, two cameras, history 2) plus state/action windows,
  in a ``DataLoader`` with N workers (8 and 15, at most the machine's cores), pinned,
  prefetch 4; on the GPU the 480x640 frames are resized to 224x224 (bilinear) before the step.
  No crop or jitter: the CPU loader is spared that work.

Reported per feed: steps/s and samples/s (wall clock over the timed steps, one sync at the end);
``gpu_busy`` = the GPU time of the training steps (CUDA events bracketing forward, backward and
AdamW on the training stream) / the wall time: the fraction of time the GPU spent training;
``nvml_util_pct`` = NVML's utilization sampled every 50 ms over the same window (any kernel
counts, the feed's own decode and transform kernels included, in the driver's 1/6-1 s periods:
coarse, and never lower than ``gpu_busy``'s truth); ``busy_ideal`` = model-only step time /
this feed's step time.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from robocache.bench import harness as H
from robocache.bench.standalone import main

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench_cameras, when run by the CLI
import bench_cameras as C  # noqa: E402

FAMILY = "train_vision"
STATE, ACTION = "observation.state", "action"
FULL = {"hw": (480, 640), "episodes": 200, "length": 30, "batch": 64, "horizon": 8,
        "size": (224, 224), "seconds": 30.0, "min_steps": 20, "warmup": 10,
        "workers": (8, 15), "model": "resnet18"}
QUICK = {"hw": (48, 64), "episodes": 3, "length": 12, "batch": 4, "horizon": 4,
         "size": (32, 32), "seconds": 0.0, "min_steps": 2, "warmup": 1, "workers": (0,),
         "model": "tiny"}
OPTIONS = {"episodes": (int, "episodes in the dataset (default 200; quick 3)"),
           "length": (int, "frames per episode at 30 fps (default 30)"),
           "seconds": (float, "seconds of training timed per feed (default 30)"),
           "min_steps": (int, "steps timed per feed at least (default 20)"),
           "workers": (str, "CPU DataLoader worker counts, comma-separated (default 8,15)"),
           "camera_size": (str, "store the cache's frames at HEIGHTxWIDTH (ingest's "
                                "--camera-size; default: the source's 480x640)")}


def _backbone(kind: str) -> tuple[torch.nn.Module, int]:
    """A per-image feature extractor and its feature size: ResNet-18 (torchvision, random
    weights) or, for smoke runs, a one-layer conv net."""
    if kind == "tiny":
        return torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, stride=2), torch.nn.ReLU(),
                                   torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten()), 8
    from torchvision.models import resnet18

    net = resnet18(weights=None)
    net.fc = torch.nn.Identity()
    return net, 512


class VisionPolicy(torch.nn.Module):
    """Images ``[B, N, 3, h, w]`` (N = cameras x history, one shared backbone) + state
    ``[B, T, D]`` -> action chunk ``[B, horizon, A]``."""

    def __init__(self, kind: str, images: int, state_dim: int, act_dim: int, horizon: int,
                 hidden: int = 512):
        super().__init__()
        self.backbone, feat = _backbone(kind)
        self.horizon, self.act_dim = horizon, act_dim
        self.register_buffer("mean", torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1))
        self.register_buffer("std", torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1))
        self.head = torch.nn.Sequential(
            torch.nn.Linear(images * feat + state_dim, hidden), torch.nn.GELU(),
            torch.nn.Linear(hidden, hidden), torch.nn.GELU(),
            torch.nn.Linear(hidden, horizon * act_dim))

    def forward(self, images: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        b = images.shape[0]
        x = ((images.flatten(0, 1) - self.mean) / self.std).contiguous(
            memory_format=torch.channels_last)
        feats = self.backbone(x).reshape(b, -1)
        out = self.head(torch.cat([feats, state.reshape(b, -1).to(feats.dtype)], 1))
        return out.reshape(b, self.horizon, self.act_dim)


class TrainSamples(C.PerSampleVideo):
    """``PerSampleVideo``'s two cameras (history 2, float32 [0, 1], full size) plus the
    sample's state (history 2) and action chunk (``horizon`` steps, padded past the episode's
    end, ``action_is_pad``), read once from the LeRobot parquet."""

    def __init__(self, root: Path, length: int, episodes: int, horizon: int):
        import pyarrow.parquet as pq

        super().__init__(root, length, episodes)
        table = pq.read_table(next((root / "data").rglob("*.parquet")), columns=[STATE, ACTION])
        self.state = np.stack(table.column(STATE).to_numpy(zero_copy_only=False))
        self.action = np.stack(table.column(ACTION).to_numpy(zero_copy_only=False))
        self.horizon = horizon

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        out = super().__getitem__(i)
        ep, step = divmod(i, self.length)
        base = ep * self.length
        hist = np.clip([step - 1, step], 0, self.length - 1)
        ahead = step + np.arange(self.horizon)
        out[STATE] = torch.from_numpy(self.state[base + hist].astype(np.float32))
        out[ACTION] = torch.from_numpy(
            self.action[base + np.minimum(ahead, self.length - 1)].astype(np.float32))
        out[f"{ACTION}_is_pad"] = torch.from_numpy(ahead >= self.length)
        return out


def transforms():
    """The robocache feed's camera augmentation: random crop (side 0.8-1.0) + colour jitter."""
    from robocache import ImageTransformsConfig

    return ImageTransformsConfig(max_num_transforms=4, crop_scale=(0.8, 1.0), weights={
        "brightness": 1.0, "contrast": 1.0, "saturation": 1.0, "hue": 1.0})


def versions() -> dict[str, str | None]:
    out = {}
    for name in ("torchvision", "av", "PyNvVideoCodec"):
        try:
            out[name] = __import__(name).__version__
        except Exception:  # not installed, or broken against this torch
            out[name] = None
    return out


def run(quick: bool = False, copy_gbps: float | None = None, **options) -> list[dict]:
    from robocache.bench.nvml import UtilizationSampler
    from robocache.data import RobotDataset, RobotLoader
    from robocache.data.cache import build

    cfg = dict(QUICK if quick else FULL)
    if isinstance(options.get("workers"), str):
        options["workers"] = tuple(int(w) for w in options["workers"].split(","))
    cfg.update(options)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    cuda = device.type == "cuda"
    cores = os.cpu_count() or 1
    workers = sorted({min(w, cores) for w in cfg["workers"]})
    size, batch, horizon = tuple(cfg["size"]), cfg["batch"], cfg["horizon"]
    torch.manual_seed(0)
    model = VisionPolicy(cfg["model"], len(C.CAMS) * C.HISTORY, C.HISTORY * 6, 6,
                         horizon).to(device).to(memory_format=torch.channels_last)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=cuda)

    def sync():
        if cuda:
            torch.cuda.synchronize(device)

    def train_step(images, state, action, pad):
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device.type, torch.bfloat16, enabled=cuda):
            pred = model(images, state)
        err = (pred.float() - action) ** 2
        loss = (err * (~pad)[..., None]).mean()
        loss.backward()
        opt.step()

    def robocache_inputs(b):
        return torch.cat([b[k] for k in C.CAMS], 1), b[STATE], b[ACTION], b[f"{ACTION}_is_pad"]

    def cpu_inputs(b):
        b = {k: v.to(device, non_blocking=True) for k, v in b.items()}
        frames = torch.cat([b[k] for k in C.CAMS], 1)  # [B, 4, 3, H, W] float32
        small = torch.nn.functional.interpolate(frames.flatten(0, 1), size=size,
                                                mode="bilinear", align_corners=False)
        return small.unflatten(0, frames.shape[:2]), b[STATE], b[ACTION], b[f"{ACTION}_is_pad"]

    def measure(batches, to_inputs, seconds):
        """Train on ``warmup`` batches, then for ``seconds`` (``min_steps`` at least): wall
        time, steps, the steps' GPU time (CUDA events around each step) and NVML samples."""
        for _ in range(cfg["warmup"]):
            train_step(*to_inputs(next(batches)))
        sync()
        marks, steps = [], 0
        props = torch.cuda.get_device_properties(device) if cuda else None
        bus = getattr(props, "pci_bus_id", None)
        with UtilizationSampler(pci_bus_id=bus) as nv:
            t0 = time.perf_counter()
            while steps < cfg["min_steps"] or time.perf_counter() - t0 < seconds:
                inputs = to_inputs(next(batches))  # the host waits here for the feed
                if cuda:
                    start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
                    start.record()
                    train_step(*inputs)
                    end.record()
                    marks.append((start, end))
                else:
                    train_step(*inputs)
                steps += 1
            sync()
            wall = time.perf_counter() - t0
        busy = sum(s.elapsed_time(e) for s, e in marks) / 1e3 / wall if cuda else None
        util = nv.summary() if cuda else {"error": "no CUDA device"}
        return wall, steps, busy, util

    results: dict[str, tuple] = {}
    jitter = transforms()
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        root = C.make_dataset(Path(tmp) / "lerobot", cfg["episodes"], cfg["length"], cfg["hw"])
        write_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        manifest = build(root, Path(tmp) / "cache", rate_hz=C.FPS, progress=False,
                         camera_size=cfg.get("camera_size"), camera_codec="jpeg")
        ingest_s = time.perf_counter() - t0
        ds = RobotDataset(Path(tmp) / "cache", keys=[*C.CAMS, STATE, ACTION],
                          action_keys=[ACTION], history=C.HISTORY, horizon=horizon,
                          image_size=size, image_transforms=jitter)
        loader = RobotLoader(ds, batch, device=device, normalize=None)

        def robocache_batches():
            while True:
                yield from loader

        fixed = robocache_inputs(next(robocache_batches()))
        fixed = tuple(x.clone() for x in fixed)
        results["model-only"] = measure(iter(lambda: {}, None), lambda _: fixed,
                                        cfg["seconds"] / 3)
        results["robocache"] = measure(robocache_batches(), robocache_inputs, cfg["seconds"])
        plain = TrainSamples(root, cfg["length"], cfg["episodes"], horizon)
        for w in workers:
            dl = torch.utils.data.DataLoader(
                plain, batch_size=batch, shuffle=True, drop_last=True, num_workers=w,
                pin_memory=cuda, persistent_workers=w > 0, prefetch_factor=4 if w else None)

            def cpu_batches(dl=dl):
                while True:
                    yield from dl

            results[f"cpu-loader-w{w}"] = measure(cpu_batches(), cpu_inputs, cfg["seconds"])
            del dl
    ideal = results["model-only"][0] / results["model-only"][1]
    stored = f"-stored{cfg['camera_size']}" if cfg.get("camera_size") else ""
    name = (f"{cfg['model']}-{cfg['hw'][0]}x{cfg['hw'][1]}{stored}-to{size[0]}-b{batch}-cams2"
            f"-t2-e{cfg['episodes']}")
    vers = versions()
    records = []
    for impl, (wall, steps, busy, util) in results.items():
        step_s = wall / steps
        note = f"{steps / wall:.2f} steps/s, {batch * steps / wall:,.0f} samples/s"
        if busy is not None:
            note += f", GPU busy {100 * busy:.0f}%"
        if "mean_pct" in util:
            note += f" (NVML {util['mean_pct']:.0f}%)"
        records.append(H.case(
            FAMILY, name, impl, H.summarize([step_s * 1e3]), steps=steps, wall_s=wall,
            steps_per_s=steps / wall, samples_per_s=batch * steps / wall, gpu_busy=busy,
            nvml_util_pct=util.get("mean_pct"), nvml=util, busy_ideal=ideal / step_s,
            batch=batch, image_size=list(size), episodes=cfg["episodes"],
            length=cfg["length"], frames=2 * cfg["episodes"] * cfg["length"],
            dataset_write_s=write_s, ingest_s=ingest_s,
            ingest_decoded_by=manifest["decode"]["video_frames"], model=cfg["model"],
            workers=int(impl.rsplit("w", 1)[1]) if impl.startswith("cpu-loader") else None,
            versions=vers, note=note))
    return records


if __name__ == "__main__":
    main(run, __doc__, OPTIONS)
