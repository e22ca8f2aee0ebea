"""Where a served camera batch spends its time beyond nvJPEG's decode (bench_cameras.py's
``serve`` case: a LeRobot v3.0 dataset with two 480x640 H.264 cameras, batches of 256 samples
x 2 cameras x 2 frames -> 224x224 float32 with random crop + colour jitter).

    $ python benchmarks/profile_serve.py [--batches 20] [--out profile.txt]

Prints the wall clock of a ``fetch`` against the same frames' decode alone (as the benchmark
measures both), then torch.profiler's operators of ``--batches`` fetches, sorted by host time
and by GPU time: what the end-to-end path adds to the decode (the rows' trip to the host, the
distinct frames, stacking and gathering decoded frames, the transform kernel).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import bench_cameras as B  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batches", type=int, default=20)
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    from robocache import ImageTransformsConfig
    from robocache.data import RobotDataset
    from robocache.data.cache import build

    cfg, device = B.FULL, torch.device("cuda")
    jitter = ImageTransformsConfig(max_num_transforms=4, crop_scale=(0.8, 1.0), weights={
        "brightness": 1.0, "contrast": 1.0, "saturation": 1.0, "hue": 1.0})
    lines = []
    with tempfile.TemporaryDirectory() as tmp:
        root = B.make_dataset(Path(tmp) / "lerobot", cfg["episodes"], cfg["length"], cfg["hw"])
        build(root, Path(tmp) / "cache", rate_hz=B.FPS, progress=False)
        ds = RobotDataset(Path(tmp) / "cache", keys=list(B.CAMS), history=B.HISTORY,
                          image_size=B.OUT, image_transforms=jitter).to(device)
        gen = torch.Generator().manual_seed(0)
        batches = [torch.randint(0, len(ds), (cfg["batch"],), generator=gen).to(device)
                   for _ in range(a.batches)]
        from torchvision.io import decode_jpeg

        rows = []
        for _ in batches:  # a batch's worth of distinct frames per camera, for decode alone
            raw = ds.data[torch.randint(0, len(ds), (cfg["batch"], B.HISTORY), generator=gen)]
            rows.append({k: ds.layout[k].values(raw[..., ds.layout[k].col:][..., :2])[..., 0]
                         .cpu().unique() for k in B.CAMS})

        def wall(fn) -> float:
            for i in range(3):
                fn(i)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for i in range(a.batches):
                fn(i)
            torch.cuda.synchronize()
            return (time.perf_counter() - t0) / a.batches * 1e3

        fetch_ms = wall(lambda i: ds.fetch(batches[i]))
        decode_ms = wall(lambda i: decode_jpeg(
            [p for k in B.CAMS for p in ds.frames[k].slices(rows[i][k])], device=device))
        frames = cfg["batch"] * 2 * B.HISTORY
        lines.append(f"{torch.cuda.get_device_name()}: fetch {fetch_ms:.2f} ms "
                     f"({frames / fetch_ms * 1e3:,.0f} frames/s), decode alone "
                     f"{decode_ms:.2f} ms ({frames / decode_ms * 1e3:,.0f} frames/s): "
                     f"{100 * decode_ms / fetch_ms:.0f} %")
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                torch.profiler.ProfilerActivity.CUDA]) as prof:
            for idx in batches:
                ds.fetch(idx)
            torch.cuda.synchronize()
        avg = prof.key_averages()
        lines.append(avg.table(sort_by="self_cpu_time_total", row_limit=25))
        lines.append(avg.table(sort_by="self_device_time_total", row_limit=15))
    text = "\n".join(lines)
    print(text)
    if a.out:
        a.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
