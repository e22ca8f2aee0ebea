"""Bytes of a LeRobot dataset's RoboCache cache against the dataset's own, per camera option.

    # a dataset LeRobot's writer makes now (12 episodes of 200 frames, a 192x256 AV1 video
    # camera and a 48x64 PNG image camera; LeRobot 0.6.1's environment), or --root DIR
    HF_HUB_OFFLINE=1 python benchmarks/lerobot_cache_size.py --write-dataset 12,200,192,256 \\
        --json benchmarks/results/lerobot_cache_size-2026-11-27.json

For each option (JPEG q95 4:4:4, the default; PNG; JPEG 4:2:0 at q95, q90 and q80) the cache is
built at the native rate and measured by part: each camera's frames table, the rows table
(numbers, masks, tasks), the statistics and manifest. The video camera's stored frames are
compared with LeRobot's decode of the source video (PyAV, every frame): PSNR in dB, min and mean
over frames (99 for identical frames).
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

#: name -> build options
OPTIONS = {"jpeg q95 444": {}, "png": {"camera_codec": "png"},
           "jpeg q95 420": {"camera_chroma": "420"},
           "jpeg q90 420": {"camera_chroma": "420", "camera_quality": 90},
           "jpeg q80 420": {"camera_chroma": "420", "camera_quality": 80}}


def du(path: Path) -> int:
    """Bytes of the files under ``path``."""
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())


def psnr(stored: list[bytes], decoded: list[np.ndarray]) -> list[float]:
    """PSNR (dB) of each stored frame against LeRobot's decode of the same step."""
    from PIL import Image

    out = []
    for b, ref in zip(stored, decoded, strict=True):
        mse = np.mean((np.asarray(Image.open(io.BytesIO(b)).convert("RGB"), np.float64)
                       - ref) ** 2)
        out.append(99.0 if mse == 0 else float(10 * np.log10(255 ** 2 / mse)))
    return out


def measure(root: Path, work: Path) -> dict:
    import av
    import lance

    from robocache.data.cache import build

    video = sorted((root / "videos").glob("*/*/*.mp4"))[0]
    camera = video.parent.parent.name
    with av.open(str(video)) as f:
        decoded = [fr.to_ndarray(format="rgb24") for fr in f.decode(video=0)]
    out = {"source": {"total": du(root), "videos": du(root / "videos"),
                      "data": du(root / "data"), "meta": du(root / "meta")},
           "video_camera": camera, "video_frames": len(decoded),
           "video_shape": list(decoded[0].shape), "caches": {}}
    for name, options in OPTIONS.items():
        dest = work / name.replace(" ", "-")
        t0 = time.perf_counter()
        build(root, dest, rate_hz="native", progress=False, **options)
        seconds = time.perf_counter() - t0
        parts = {f"frames {p.stem}": du(p) for p in sorted((dest / "frames").iterdir())}
        table = lance.dataset(str(dest / "frames" / f"{camera}.lance")).to_table(
            columns=["episode_index", "frame", "encoded"]).sort_by(
            [("episode_index", "ascending"), ("frame", "ascending")])
        stored = table.column("encoded").to_pylist()
        db = psnr(stored, decoded)
        out["caches"][name] = {
            "total": du(dest), **parts, "rows": du(dest / "data.lance"),
            "stats_and_manifest": (dest / "stats.json").stat().st_size
            + (dest / "manifest.json").stat().st_size,
            "video_bytes_per_frame": sum(map(len, stored)) / len(stored),
            "psnr_min_db": min(db), "psnr_mean_db": float(np.mean(db)),
            "build_s": seconds}
        print(name, json.dumps(out["caches"][name]), flush=True)
    return out


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--root", type=Path, help="a LeRobot v3.0 dataset with a video camera")
    p.add_argument("--write-dataset", metavar="EPISODES,LENGTH,HEIGHT,WIDTH",
                   help="instead of --root: write one with LeRobot's writer (a video camera of "
                   "HEIGHTxWIDTH and a 48x64 image camera)")
    p.add_argument("--json", type=Path, help="write the results here")
    a = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        root = a.root
        if a.write_dataset:
            sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "fixtures"
                                   / "lerobot"))
            from make_fixtures import write_train_dataset

            n, length, h, w = (int(x) for x in a.write_dataset.split(","))
            root = Path(tmp) / "train"
            write_train_dataset(root, (length,) * n, (h, w), (48, 64))
        if root is None:
            p.error("give --root or --write-dataset")
        result = measure(root, Path(tmp))
    result["dataset"] = a.write_dataset or str(root)
    result["date"] = time.strftime("%Y-%m-%d")
    if a.json:
        a.json.write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
