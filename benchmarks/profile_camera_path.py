"""Where a camera frame's CPU time goes at ingest, stage by stage, on one core: the 480x640
videos of ``bench cameras`` (H.264, HEVC, AV1; two cameras' worth of frames, keyframe every 2
frames, CRF 30) decoded by PyAV on one thread, converted to RGB by swscale, JPEG-encoded at
the defaults (libjpeg-turbo through simplejpeg, 4:4:4, q95); the 224x224 store (conversion
and resize in one swscale pass, against the conversion then Pillow's resize); and what the
parent process spends per frame receiving a worker's encoded stream (through the result pipe,
pickled, against the shared-memory file ingest uses).

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
    """ms of CPU per frame of each stage of ``path``'s frames."""
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
        "rgb24+pillow-resize-224": _best(lambda: [np.asarray(Image.fromarray(
            rgb.reformat(f, format="rgb24").to_ndarray()).resize(
            (224, 224), Image.Resampling.BILINEAR)) for f in frames], repeats),
        "swscale-rgb24-resize-224": _best(lambda: [fused.reformat(
            f, format="rgb24", width=224, height=224, interpolation="BILINEAR").to_ndarray()
            for f in frames], repeats),
    }
    return {k: 1e3 * v / n for k, v in out.items()}


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
              "ms_per_frame": {}, "parent_us_per_frame": transport(args.repeats)}
    with tempfile.TemporaryDirectory() as tmp:
        scene = B._frames(np.random.default_rng([1, 0]), 120, (480, 640), 0)
        for codec, (encoder, options) in B.CODECS.items():
            path = Path(tmp) / f"{codec}.mp4"
            write_video(path, scene, B.FPS, encoder, options)
            result["ms_per_frame"][codec] = stages(path, args.repeats)
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
