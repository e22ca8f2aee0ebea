"""Where a camera frame's CPU time goes at ingest, stage by stage, on one core: the 480x640
videos of ``bench cameras`` (H.264, HEVC, AV1; two cameras' worth of frames, keyframe every 2
frames, CRF 30) decoded by PyAV on one thread, converted to RGB by swscale, JPEG-encoded at
the defaults (libjpeg-turbo through simplejpeg, 4:4:4, q95); the 224x224 store (conversion
and resize in one swscale pass, against the conversion then Pillow's resize); and what the
parent process spends per frame receiving a worker's encoded stream (through the result pipe,
pickled, against the shared-memory file ingest uses); what encoding from the decoded YUV
planes instead of RGB would cost in fidelity on the committed sharp-edged LeRobot fixture;
the worker pool's start and close; and cProfile shares (own time) of a worker's task and of
the RLDS pass-through.

    $ python benchmarks/profile_camera_path.py --out benchmarks/results/cameras-profile.json

Times are CPU seconds of this process (``time.process_time``), the best of ``--repeats``
runs: the development VM is shared, and the best run is the one least disturbed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def _best(fn, repeats: int) -> float:
    """The least CPU seconds of ``repeats`` calls of ``fn``."""
    best = float("inf")
    for _ in range(repeats):
        t0 = time.process_time()
        fn()
        best = min(best, time.process_time() - t0)
    return best


def stages(path: Path, repeats: int) -> dict[str, float]:
    """ms of CPU per frame of each stage of ``path``'s frames, and the PSNR between the 224x224
    frames of the two resizes."""
    import av
    import simplejpeg
    from av.video.reformatter import VideoReformatter
    from PIL import Image

    def decoded():
        with av.open(str(path)) as container:
            stream = container.streams.video[0]
            stream.codec_context.thread_count = 1
            return list(container.decode(stream))

    frames = decoded()
    n = len(frames)
    rgb = VideoReformatter()
    arrays = [rgb.reformat(f, format="rgb24").to_ndarray() for f in frames]
    fused = VideoReformatter()
    out = {
        "decode": _best(decoded, repeats),
        "rgb24": _best(lambda: [rgb.reformat(f, format="rgb24").to_ndarray() for f in frames],
                       repeats),
        "jpeg-444-q95": _best(lambda: [simplejpeg.encode_jpeg(a, 95, "RGB", "444")
                                       for a in arrays], repeats),
        "jpeg-444-q95-fastdct": _best(lambda: [simplejpeg.encode_jpeg(
            a, 95, "RGB", "444", fastdct=True) for a in arrays], repeats),
        "rgb24+pillow-resize-224": _best(lambda: [np.asarray(Image.fromarray(
            rgb.reformat(f, format="rgb24").to_ndarray()).resize(
            (224, 224), Image.Resampling.BILINEAR)) for f in frames], repeats),
        "swscale-rgb24-resize-224": _best(lambda: [fused.reformat(
            f, format="rgb24", width=224, height=224, interpolation="BILINEAR").to_ndarray()
            for f in frames], repeats),
    }
    out = {k: 1e3 * v / n for k, v in out.items()}
    pillow = np.stack([np.asarray(Image.fromarray(a).resize((224, 224),
                                                          Image.Resampling.BILINEAR))
                       for a in arrays]).astype(np.float64)
    swscale = np.stack([fused.reformat(f, format="rgb24", width=224, height=224,
                                       interpolation="BILINEAR").to_ndarray() for f in frames])
    out["swscale-vs-pillow-224-psnr_dB"] = float(
        10 * np.log10(255.0 ** 2 / np.mean((swscale - pillow) ** 2)))
    return out


def yuv_fidelity() -> dict[str, dict[str, float]]:
    """PSNR (mean, worst frame) against LeRobot's decode of the committed sharp-edged fixture
    of JPEG q95 encoded from RGB (4:4:4, what ingest stores) and, skipping the RGB
    conversion, from the decoded YUV planes: the source's own 4:2:0 chroma, and 4:4:4 (chroma
    repeated); the planes moved from video range to JPEG's full range first."""
    import io

    import av
    import simplejpeg
    from PIL import Image

    fixtures = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "cameras"
    want = np.load(fixtures / "sharp_frames.npz")["lerobot"].astype(np.float64)
    video = next((fixtures / "lerobot_sharp_av1" / "videos").rglob("*.mp4"))
    luma = np.clip(np.round((np.arange(256) - 16) * 255 / 219), 0, 255).astype(np.uint8)
    chroma = np.clip(np.round((np.arange(256) - 128) * 255 / 224 + 128), 0, 255).astype(np.uint8)

    def psnr(data: bytes, ref: np.ndarray) -> float:
        got = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"), np.float64)
        return float(10 * np.log10(255.0 ** 2 / np.mean((got - ref) ** 2)))

    out: dict[str, list[float]] = {"rgb-444": [], "yuv-420-source": [], "yuv-444": []}
    with av.open(str(video)) as container:
        for frame, ref in zip(container.decode(container.streams.video[0]), want,
                              strict=True):
            h, w = frame.height, frame.width
            planes = frame.to_ndarray()  # yuv420p: Y rows, then U and V
            y = luma[planes[:h]]
            u, v = (chroma[p.reshape(h // 2, w // 2)] for p in
                    (planes[h:h + h // 4], planes[h + h // 4:]))
            full = [np.repeat(np.repeat(c, 2, 0), 2, 1) for c in (u, v)]
            out["rgb-444"].append(psnr(simplejpeg.encode_jpeg(
                frame.to_ndarray(format="rgb24"), 95, "RGB", "444"), ref))
            out["yuv-420-source"].append(psnr(simplejpeg.encode_jpeg_yuv_planes(y, u, v, 95),
                                              ref))
            out["yuv-444"].append(psnr(simplejpeg.encode_jpeg_yuv_planes(y, *full, 95), ref))
    return {k: {"mean_dB": float(np.mean(v)), "min_dB": float(np.min(v))}
            for k, v in out.items()}


def _shares(profile, top: int = 6) -> dict[str, float]:
    """The ``top`` functions of a cProfile run by their own time, as shares of the total."""
    import pstats

    stats = pstats.Stats(profile).stats
    total = sum(row[2] for row in stats.values())
    rows = sorted(stats.items(), key=lambda kv: -kv[1][2])[:top]
    return {f"{Path(file).name}:{line}({name})": round(row[2] / total, 3)
            for (file, line, name), row in rows}


def task_profile(path: Path) -> dict[str, float]:
    """cProfile of a camera worker's task (decode and encode a stream at the defaults), three
    times over ``path``."""
    import cProfile

    from robocache.data.cameras import FrameFormat, _pyav_stream

    task = (path, 0.0, 119 / 30, 1e-4, FrameFormat(), None, (480, 640, 3), "profile")
    _pyav_stream(*task, threads=1)
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(3):
        _pyav_stream(*task, threads=1)
    profile.disable()
    return _shares(profile)


def rlds_profile(tmp: Path) -> dict[str, float]:
    """cProfile of the RLDS pass-through (``bench cameras``' ``rlds`` section, one process)
    over 64 episodes of two 256x256 JPEG cameras."""
    import cProfile

    import bench_cameras as B
    import bench_rlds as R

    from robocache.data.formats.rlds import RldsSource

    root = R.write_dataset(tmp / "rlds", 64, 100, 256, 8, distinct=16)
    src = RldsSource(root, split="train", fps=B.FPS)
    B._rlds_pass_through(src, list(range(64)))
    profile = cProfile.Profile()
    profile.enable()
    B._rlds_pass_through(src, list(range(64)))
    profile.disable()
    return _shares(profile)


def pool_costs(repeats: int) -> dict[str, float]:
    """ms to start (fork, first task) and to close a camera worker pool of 1, 2 and 8
    processes: the fixed cost of a build's pool."""
    from robocache.data.cameras import CameraWorkers

    out = {}
    for n in (1, 2, 8):
        start = close = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            workers = CameraWorkers(n, threads=1).start()
            t1 = time.perf_counter()
            workers.close()
            start, close = min(start, t1 - t0), min(close, time.perf_counter() - t1)
        out[f"start-{n}"], out[f"close-{n}"] = 1e3 * start, 1e3 * close
    return out


def _pipe_task(threads: int = 1):
    from robocache.data import cameras

    return cameras._pack(_FRAMES), None, None


def _shm_task(threads: int = 1):
    from robocache.data import cameras

    return cameras._ship(_FRAMES), None, None


_FRAMES = [os.urandom(88_000) for _ in range(120)]  # a 120-frame stream, 88 KB a frame


def transport(repeats: int) -> dict[str, float]:
    """us of the parent's CPU per 88 KB frame to receive a worker's stream of 120 frames."""
    from robocache.data import cameras

    workers = cameras.CameraWorkers(1, threads=1).start()
    out = {}
    try:
        for name, task in (("pipe", _pipe_task), ("shared-memory", _shm_task)):
            def receive(task=task):
                for handle in [workers.submit(task) for _ in range(20)]:
                    cameras._received(workers.result(handle)[0])
            receive()
            out[name] = 1e6 * _best(receive, repeats) / (20 * len(_FRAMES))
    finally:
        workers.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).parent))
    import bench_cameras as B

    from robocache.bench.harness import metadata
    from robocache.data.cameras import write_video

    result = {"meta": {**metadata(), "libraries": B.libraries(), "repeats": args.repeats},
              "ms_per_frame": {}, "parent_us_per_frame": transport(args.repeats),
              "yuv_fidelity": yuv_fidelity(), "pool_ms": pool_costs(args.repeats)}
    with tempfile.TemporaryDirectory() as tmp:
        scene = B._frames(np.random.default_rng([1, 0]), 120, (480, 640), 0)
        for codec, (encoder, options) in B.CODECS.items():
            path = Path(tmp) / f"{codec}.mp4"
            write_video(path, scene, B.FPS, encoder, options)
            result["ms_per_frame"][codec] = stages(path, args.repeats)
            if codec == "h264":
                result["worker_task_cprofile_share"] = task_profile(path)
        result["rlds_pass_through_cprofile_share"] = rlds_profile(Path(tmp))
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
