"""Bytes against PSNR of each way to store raw camera frames (a camera whose source holds
pixels: zarr, robomimic, ROS 2 ``Image``), on textured moving 480x640 scenes: H.264 4:2:0 at
several CRFs (what ``--camera-codec video`` encodes raw frames to, CRF 18, a keyframe every 2
frames: NVDEC decodes it), lossless H.264 in RGB (``libx264rgb``, QP 0: decoded on the CPU),
JPEG q95 4:4:4 (the default) and PNG (lossless).

    $ python benchmarks/probe_raw_video.py --json benchmarks/results/raw-video-codecs.json

PSNR is of the decoded frames against the source pixels (RGB), per frame: the minimum and the
mean; encode rate on one thread.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
FRAMES = 60


def _psnr(a: np.ndarray, b: np.ndarray) -> float:
    err = ((a.astype(np.float64) - b) ** 2).mean()
    return float("inf") if err == 0 else float(10 * np.log10(255 ** 2 / err))


def _scenes(n: int) -> np.ndarray:
    from bench_serve import jpeg_pool
    from PIL import Image

    pool = [np.asarray(Image.open(io.BytesIO(p)).convert("RGB")) for p in
            jpeg_pool(n, (480, 640))]
    return np.stack([np.roll(pool[i % len(pool)], 3 * i, axis=1) for i in range(n)])


def _video(frames: np.ndarray, codec: str, options: dict, pix_fmt: str) -> tuple[int, list]:
    import av

    fd, path = tempfile.mkstemp(suffix=".mp4")
    os.close(fd)
    try:
        with av.open(path, "w") as out:
            s = out.add_stream(codec, 30, options={"g": "2", **options})
            s.pix_fmt, s.height, s.width = pix_fmt, *frames.shape[1:3]
            for f in frames:
                out.mux(s.encode(av.VideoFrame.from_ndarray(f, format="rgb24")))
            out.mux(s.encode())
        with av.open(path) as c:
            got = [f.to_ndarray(format="rgb24") for f in c.decode(video=0)]
        return os.path.getsize(path), got
    finally:
        os.unlink(path)


def run() -> dict:
    from PIL import Image

    from robocache.data.cameras import encode
    from robocache.data.video_store import RAW_OPTIONS

    frames = _scenes(FRAMES)
    rows = []
    ways = [(f"h264 yuv420p crf {crf}", "libx264", {**RAW_OPTIONS, "crf": str(crf)}, "yuv420p")
            for crf in (30, 23, 18, 12)]
    ways.append(("h264 rgb lossless (qp 0)", "libx264rgb", {"qp": "0", "preset": "veryfast"},
                 "rgb24"))
    for name, codec, options, fmt in ways:
        t0 = time.perf_counter()
        size, got = _video(frames, codec, options, fmt)
        seconds = time.perf_counter() - t0
        ps = [_psnr(a, b) for a, b in zip(got, frames, strict=True)]
        rows.append({"storage": name, "kB_per_frame": size / FRAMES / 1e3,
                     "psnr_min_dB": min(ps), "psnr_mean_dB": float(np.mean(ps)),
                     "encode_and_decode_frames_per_s": FRAMES / seconds})
    for name, codec in (("jpeg q95 4:4:4", "jpeg"), ("png", "png")):
        t0 = time.perf_counter()
        data = [encode(f, codec, 95, "444") for f in frames]
        seconds = time.perf_counter() - t0
        ps = [_psnr(np.asarray(Image.open(io.BytesIO(b)).convert("RGB")), f)
              for b, f in zip(data, frames, strict=True)]
        rows.append({"storage": name, "kB_per_frame": float(np.mean([len(b) for b in data]))
                     / 1e3, "psnr_min_dB": min(ps), "psnr_mean_dB": float(np.mean(ps)),
                     "encode_frames_per_s": FRAMES / seconds})
    import platform

    import av

    return {"meta": {"date": time.strftime("%Y-%m-%d"), "machine": platform.processor() or
                     platform.machine(), "cores": os.cpu_count(), "av": av.__version__,
                     "frames": FRAMES, "size": [480, 640]}, "rows": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="write the results here")
    doc = run()
    a = ap.parse_args()
    for r in doc["rows"]:
        print(f"{r['storage']:26s} {r['kB_per_frame']:7.1f} kB/frame  min "
              f"{r['psnr_min_dB']:5.1f} dB  mean {r['psnr_mean_dB']:5.1f} dB")
    if a.json:
        Path(a.json).write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
