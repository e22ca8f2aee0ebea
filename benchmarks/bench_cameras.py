"""Benchmark camera serving: JPEG frames from the cache, decoded and transformed on the GPU.

    $ robocache bench cameras --json benchmarks/results/cameras.json
    $ python benchmarks/bench_cameras.py --quick        # CPU smoke run

The dataset is a LeRobot v3.0 directory written here with two 480x640 cameras (H.264 mp4s written
the way LeRobot records video: PyAV, yuv420p, keyframe every 2 frames, CRF 30), state and action
streams (:func:`make_dataset`, shared with ``bench_train_vision``). It is ingested (video decoded,
frames stored as JPEG quality 95) three ways, each timed once: ``ingest`` (PyAV, ``decode_workers``
= the cores: episodes decoded and encoded in parallel), ``ingest-w1`` (PyAV, one episode at a time)
and ``ingest-nvdec`` (NVDEC through PyNvVideoCodec, skipped without it or without a GPU); each
records frames/s over all cores and per core, and cache vs mp4 bytes per frame.

Serving cases, batch 256 samples x 2 cameras x 2 frames (history 2) = 1024 frames a batch:

- ``robocache``: ``RobotDataset(..., image_size=(224, 224), image_transforms=random crop
  (side 0.8-1.0) + colour jitter (brightness, contrast, saturation, hue))`` resident on the GPU,
  ``fetch`` end to end (index gather, one nvJPEG batch decode of both cameras' distinct
  frames, fused transform kernel) -> float32 ``[256, 2, 3, 224, 224]`` per camera; wall
  clock, one sync per batch.
- ``nvjpeg-decode``: ``torchvision.io.decode_jpeg(list, device="cuda")`` alone on the same
  batches' JPEG bytes, each camera's distinct frames in one call, as the dataset decodes them
  (a frame that overlapping windows share is decoded once): the ceiling the end-to-end case
  is held to. Both count the 1024 frames a batch serves.
- ``transform``: the fused kernel alone on 1024 decoded frames (CUDA events).
- ``cpu-loader-w<N>`` / ``robocache-b64``: batch 64. A ``DataLoader`` with N workers doing what
  LeRobot's loader does per sample (PyAV: seek the mp4 to the keyframe before the first
  timestamp, decode to the last, pick the 2 frames, float32 [0, 1]; two cameras), then
  ``.to("cuda")``; against RoboCache at the same batch size.

Peak GPU memory of one ``robocache`` batch is recorded (``peak_MB``).
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from robocache.bench import harness as H
from robocache.bench.standalone import main

FAMILY = "cameras"
CAMS = ("observation.images.left", "observation.images.right")
FPS, HISTORY, OUT = 30.0, 2, (224, 224)
FULL = {"hw": (480, 640), "episodes": 16, "length": 48, "batch": 256, "batches": 20,
        "repeats": 5, "workers": (8, 15), "small_batch": 64}
QUICK = {"hw": (48, 64), "episodes": 3, "length": 12, "batch": 8, "batches": 2,
         "repeats": 2, "workers": (0,), "small_batch": 4}


def _frames(rng: np.random.Generator, n: int, hw: tuple[int, int], cam: int) -> np.ndarray:
    """A textured scene with a moving object: JPEG sizes like a real camera's (sensor noise
    from a bank of 8 fields, cycled: a frame's noise differs from its neighbours')."""
    h, w = hw
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    base = np.stack([128 + 60 * np.sin(x / 23 + cam), 128 + 60 * np.cos(y / 17),
                     100 + 50 * np.sin((x + y) / 31)], -1)
    noise = rng.normal(0, 6, (min(n, 8), h, w, 3)).astype(np.float32)
    out = np.empty((n, h, w, 3), np.uint8)
    for i in range(n):
        img = base + noise[i % len(noise)]
        cy, cx = int(h * (0.2 + 0.6 * i / n)), int(w * (0.7 - 0.5 * i / n))
        img[max(cy - h // 10, 0):cy + h // 10, max(cx - w // 10, 0):cx + w // 10] = (200, 60, 40)
        out[i] = img.clip(0, 255)
    return out


def make_dataset(root: Path, episodes: int, length: int, hw: tuple[int, int],
                 seed: int = 0) -> Path:
    """The LeRobot v3.0 dataset the camera benchmarks read: ``episodes`` episodes of
    ``length`` frames at 30 fps, 6-D ``observation.state`` and ``action``, and two cameras
    (:data:`CAMS`, ``hw`` frames, one H.264 mp4 each, written as LeRobot records video but
    without B-frames, which NVDEC ingest leaves to PyAV, so the NVDEC row decodes on NVDEC; the
    two encoded at once, each episode's frames made as they are encoded)."""
    from robocache.data.cameras import add_video_features
    from robocache.data.episode import Episode, Stream, StreamSpec
    from robocache.data.formats.lerobot import write_lerobot

    rng = np.random.default_rng(seed)
    specs = {k: StreamSpec(k, "numeric", "float32", (6,), FPS)
             for k in ("observation.state", "action")}
    t = np.arange(length) / FPS
    eps = [Episode(i, {k: Stream(s, t, rng.normal(size=(len(t), 6)).astype(np.float32))
                       for k, s in specs.items()}, {"tasks": ["bench"]})
           for i in range(episodes)]
    write_lerobot(root, eps, specs, fps=FPS, version="v3.0")
    add_video_features(root, {key: (_frames(np.random.default_rng([seed, c]), length, hw, c)
                                    for _ in range(episodes))
                              for c, key in enumerate(CAMS)}, codec="libx264",
                       options={"bf": "0"})
    return root


class PerSampleVideo(torch.utils.data.Dataset):
    """LeRobot's per-sample video decoding (PyAV backend) for two cameras, history 2."""

    def __init__(self, root: Path, length: int, episodes: int):
        self.paths = [next((root / "videos" / k).rglob("*.mp4")) for k in CAMS]
        self.length, self.n = length, length * episodes

    def __len__(self) -> int:
        return self.n

    def _decode(self, path: Path, ts: list[float]) -> torch.Tensor:
        import av

        frames, times = [], []
        with av.open(str(path)) as container:
            stream = container.streams.video[0]
            container.seek(round(min(ts) / stream.time_base) - 1, backward=True,
                           any_frame=False, stream=stream)
            for frame in container.decode(stream):
                if frame.pts is None:
                    continue
                t = float(frame.pts * stream.time_base)
                frames.append(torch.from_numpy(frame.to_ndarray(format="rgb24")))
                times.append(t)
                if t >= max(ts) - 1e-4:
                    break
        pick = [int(np.argmin([abs(t - q) for t in times])) for q in ts]
        return torch.stack([frames[i] for i in pick]).permute(0, 3, 1, 2).float() / 255.0

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        ep, step = divmod(i, self.length)
        steps = np.clip([step - 1, step], 0, self.length - 1)
        ts = [(ep * self.length + s) / FPS for s in steps]
        return {k: self._decode(p, ts) for k, p in zip(CAMS, self.paths, strict=True)}


def _wall(fn, batches: int, repeats: int, device) -> H.Timing:
    """Per-batch wall ms over `batches` calls of `fn` (one sync at the end), `repeats` times."""
    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    for _ in range(2):
        fn()
    samples = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        for _ in range(batches):
            fn()
        sync()
        samples.append((time.perf_counter() - t0) * 1e3 / batches)
    return H.summarize(samples)


def ingest_cases(root: Path, tmp: Path, name: str, frames: int) -> list[dict]:
    """Ingest ``root`` (``frames`` video frames) into ``tmp/cache`` (the cache the serving
    cases read) and time it: ``ingest`` (PyAV, ``decode_workers`` = the cores), ``ingest-w1``
    (PyAV, one episode at a time) and ``ingest-nvdec`` (NVDEC; only with a CUDA GPU and
    PyNvVideoCodec), each once, wall clock, with frames/s over all cores and per core."""
    from robocache.data.cache import build
    from robocache.data.cameras import nvdec_available

    cores = os.cpu_count() or 1
    mp4 = sum(p.stat().st_size for p in (root / "videos").rglob("*.mp4"))
    runs = [("ingest", "cache", "pyav", cores), ("ingest-w1", "cache-w1", "pyav", 1)]
    if nvdec_available():
        runs.append(("ingest-nvdec", "cache-nvdec", "nvdec", cores))
    build(root, tmp / "warmup", rate_hz=FPS, progress=False, episodes=[0])  # imports, first calls
    records = []
    for impl, dest, decoder, workers in runs:
        t0 = time.perf_counter()
        manifest = build(root, tmp / dest, rate_hz=FPS, progress=False, decode_workers=workers,
                         video_decoder=decoder)
        seconds = time.perf_counter() - t0
        cache_bytes = sum(p.stat().st_size for p in (tmp / dest / "frames").rglob("*")
                          if p.is_file())
        records.append(H.case(FAMILY, name, impl, H.summarize([seconds * 1e3]), frames=frames,
                              frames_per_s=frames / seconds,
                              frames_per_s_per_core=frames / seconds / cores, cores=cores,
                              decode_workers=workers, video_decoder=decoder,
                              decoded_by=manifest["decode"]["video_frames"],
                              cache_bytes_per_frame=cache_bytes / frames,
                              mp4_bytes_per_frame=mp4 / frames,
                              rows=manifest["counts"]["rows"],
                              note=f"{frames / seconds:,.0f} frames/s, "
                                   f"{frames / seconds / cores:,.1f} per core"))
    return records


def run(quick: bool = False, copy_gbps: float | None = None) -> list[dict]:
    from robocache import ImageTransformsConfig, image_transform, sample_image_transforms
    from robocache.data import RobotDataset

    cfg = QUICK if quick else FULL
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    hw, batch = cfg["hw"], cfg["batch"]
    name = f"{hw[0]}x{hw[1]}-b{batch}-cams2-t{HISTORY}-to{OUT[0]}"
    jitter = ImageTransformsConfig(max_num_transforms=4, crop_scale=(0.8, 1.0), weights={
        "brightness": 1.0, "contrast": 1.0, "saturation": 1.0, "hue": 1.0})
    records = []
    with tempfile.TemporaryDirectory() as tmp:
        root = make_dataset(Path(tmp) / "lerobot", cfg["episodes"], cfg["length"], hw)
        records += ingest_cases(root, Path(tmp), f"{hw[0]}x{hw[1]}-ingest",
                                2 * cfg["episodes"] * cfg["length"])

        ds = RobotDataset(Path(tmp) / "cache", keys=list(CAMS), history=HISTORY,
                          image_size=OUT, image_transforms=jitter).to(device)
        gen = torch.Generator().manual_seed(0)

        def indices(b: int) -> torch.Tensor:
            return torch.randint(0, len(ds), (b,), generator=gen).to(device)

        def record(impl: str, timing: H.Timing, n_frames: int, case: str = name, **extra):
            fps_ = n_frames / (timing.median_ms * 1e-3)
            records.append(H.case(FAMILY, case, impl, timing, frames_per_s=fps_,
                                  samples_per_s=fps_ / (2 * HISTORY), **extra))

        per_batch = batch * 2 * HISTORY
        peak = None
        if device.type == "cuda":
            torch.cuda.synchronize()
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            ds.fetch(indices(batch))
            torch.cuda.synchronize()
            peak = (torch.cuda.max_memory_allocated() - base) / 1e6
        record("robocache", _wall(lambda: ds.fetch(indices(batch)), cfg["batches"],
                                  cfg["repeats"], device), per_batch, peak_MB=peak)

        from robocache.data.cameras import decode

        sets = []  # each step's frame rows, as the packed word matrix holds them
        for _ in range(cfg["batches"]):
            raw = ds.data[torch.randint(0, len(ds), (batch, HISTORY), generator=gen)]
            sets.append({k: ds.layout[k].values(raw[..., ds.layout[k].col:][..., :2])[..., 0]
                         .cpu() for k in CAMS})
        decode_jpeg = None
        if device.type == "cuda":
            from torchvision.io import decode_jpeg
        it = iter(range(1 << 30))

        def decode_only():
            s = sets[next(it) % len(sets)]
            if decode_jpeg is not None:
                decode_jpeg([p for k in CAMS for p in ds.frames[k].slices(s[k].unique())],
                            device=device)
                return
            for k in CAMS:
                decode(ds.frames[k], s[k], device)
        record("nvjpeg-decode" if decode_jpeg else "cpu-decode",
               _wall(decode_only, cfg["batches"], cfg["repeats"], device), per_batch)

        decoded = torch.randint(0, 256, (per_batch, 3, *hw), dtype=torch.uint8, device=device)
        params = sample_image_transforms(per_batch, hw, jitter, seed=0).to(device)
        fn = lambda: image_transform(decoded, OUT, params)
        timing = H.gpu_time(fn) if device.type == "cuda" else H.cpu_time(fn, repeats=3)
        record("transform", timing, per_batch,
               nbytes=per_batch * (hw[0] * hw[1] * 3 + 3 * OUT[0] * OUT[1] * 4))

        small = cfg["small_batch"]
        small_name = f"{hw[0]}x{hw[1]}-b{small}-cams2-t{HISTORY}"
        record("robocache-b64", _wall(lambda: ds.fetch(indices(small)), cfg["batches"],
                                      cfg["repeats"], device), small * 2 * HISTORY, small_name)
        plain = PerSampleVideo(root, cfg["length"], cfg["episodes"])
        for workers in cfg["workers"]:
            loader = torch.utils.data.DataLoader(
                plain, batch_size=small, shuffle=True, drop_last=True, num_workers=workers,
                pin_memory=device.type == "cuda", persistent_workers=workers > 0,
                prefetch_factor=4 if workers else None)
            batches = iter(())

            def cpu_batch(loader=loader):
                nonlocal batches
                b = next(batches, None)
                if b is None:
                    batches = iter(loader)
                    b = next(batches)
                return {k: v.to(device, non_blocking=True) for k, v in b.items()}
            record(f"cpu-loader-w{workers}", _wall(cpu_batch, max(cfg["batches"] // 2, 1),
                                                   cfg["repeats"], device),
                   small * 2 * HISTORY, small_name, workers=workers)
            del loader, batches
    by = {r["impl"]: r for r in records}
    e2e, dec = by["robocache"], by.get("nvjpeg-decode") or by["cpu-decode"]
    e2e["pct_of_decode"] = 100.0 * e2e["frames_per_s"] / dec["frames_per_s"]
    best_cpu = max(r["samples_per_s"] for r in records if r["impl"].startswith("cpu-loader"))
    by["robocache-b64"]["speedup_vs_best_cpu_loader"] = \
        by["robocache-b64"]["samples_per_s"] / best_cpu
    for r in records:
        if "frames_per_s" in r and not r["impl"].startswith("ingest"):
            r["note"] = f"{r['frames_per_s']:,.0f} frames/s"
    e2e["note"] += f", {e2e['pct_of_decode']:.0f}% of decode alone"
    return records


if __name__ == "__main__":
    main(run, __doc__)
