"""Whether a JPEG's nvJPEG decode depends on the batch it is decoded in, and one call's latency:
torchvision's ``decode_jpeg`` on CUDA (what the dataset and the online observer call).

    $ python benchmarks/probe_nvjpeg_batch.py --json /tmp/nvjpeg-batch.json

Frames: a smooth 480x640 gradient, the same with sharp lines and a noise patch, and that shifted;
each encoded by Pillow at q95 with 4:4:4 and 4:2:0 chroma. Each frame is decoded alone and in
every batch of two with each frame (either position) and in a batch of three; the JSON records
the largest pixel difference from the decode alone per frame (``max_any``: 0 when the decode
never depends on the batch). Then p50 / p99 microseconds of one synchronized call of one and
of two frames, 300 calls after 20 warm-up ones.
"""

from __future__ import annotations

import argparse
import io
import json
import time
from pathlib import Path

import numpy as np
import torch


def frames() -> dict[str, torch.Tensor]:
    """name -> JPEG bytes as a uint8 tensor."""
    from PIL import Image

    rng = np.random.default_rng(0)
    y, x = np.mgrid[0:480, 0:640]
    smooth = np.stack([(x * 255 // 639), (y * 255 // 479), ((x + y) * 255 // 1118)],
                      -1).astype(np.uint8)
    sharp = smooth.copy()
    sharp[::8] = 255
    sharp[:, ::13] = 0
    sharp[100:300, 100:400] = rng.integers(0, 256, (200, 300, 3), dtype=np.uint8)
    out = {}
    for name, img in (("smooth", smooth), ("sharp", sharp), ("sharp2", np.roll(sharp, 37, 1))):
        for sub, chroma in ((0, "444"), (2, "420")):
            buf = io.BytesIO()
            Image.fromarray(img).save(buf, "JPEG", quality=95, subsampling=sub)
            out[f"{name}-{chroma}"] = torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8)
    return out


def main() -> None:
    from torchvision.io import decode_jpeg

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path, required=True)
    a = ap.parse_args()
    import torchvision

    enc, dev = frames(), "cuda"
    keys = list(enc)
    out: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                 "torchvision": torchvision.__version__, "date": time.strftime("%Y-%m-%d"),
                 "cases": [], "latency": []}

    def diff(a: torch.Tensor, b: torch.Tensor) -> int:
        return int((a.int() - b.int()).abs().max())

    for a_ in keys:
        alone = decode_jpeg([enc[a_]], device=dev)[0]
        row: dict = {"frame": a_}
        for b in keys:
            row[f"[{a_},{b}]"] = diff(decode_jpeg([enc[a_], enc[b]], device=dev)[0], alone)
            row[f"[{b},{a_}]"] = diff(decode_jpeg([enc[b], enc[a_]], device=dev)[1], alone)
        row["[first,it,last]"] = diff(decode_jpeg([enc[keys[0]], enc[a_], enc[keys[-1]]],
                                                  device=dev)[1], alone)
        row["max_any"] = max(v for k, v in row.items() if k.startswith("["))
        out["cases"].append(row)
        print(f"{a_:12s} largest difference from its decode alone: {row['max_any']}")
    for chroma in ("444", "420"):
        batch = [enc[f"smooth-{chroma}"], enc[f"sharp-{chroma}"]]
        for n in (1, 2):
            ts = []
            for _ in range(320):
                torch.cuda.synchronize()
                t0 = time.perf_counter_ns()
                decode_jpeg(batch[:n], device=dev)
                torch.cuda.synchronize()
                ts.append((time.perf_counter_ns() - t0) / 1e3)
            r = {"chroma": chroma, "frames": n, "p50_us": float(np.percentile(ts[20:], 50)),
                 "p99_us": float(np.percentile(ts[20:], 99))}
            out["latency"].append(r)
            print(r)
    a.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
