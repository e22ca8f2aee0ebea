"""Latency of one JPEG decode call onto the GPU, one and two 480x640 q95 frames a call: what an
online camera tick pays for its window's frames, by decoder, and whether each decoder's pixels
equal torchvision's nvJPEG decode (the training dataset's on a GPU).

    $ python benchmarks/probe_jpeg_latency.py --json /tmp/jpeg-latency.json

Decoders (each skipped, with the reason, where missing): torchvision's ``decode_jpeg`` on CUDA
(nvJPEG, what the dataset and the observer use), the library's ``decode_all`` around it (as
a tick calls it), torchvision's CPU decode (libjpeg-turbo) and
simplejpeg's, each copied to the GPU, and nvImageCodec's decoder with each of its backends.
300 calls after 20 warm-up ones, each call synchronized; p50 / p99 microseconds.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).parent))
CALLS, WARM = 300, 20


def _decoders(device: str) -> dict:
    """name -> (decode of a list of JPEG bytes to a list of [3, H, W] uint8 on ``device``, or
    the reason it is missing)."""
    out: dict = {}

    def as_tensor(b: bytes) -> torch.Tensor:
        return torch.frombuffer(bytearray(b), dtype=torch.uint8)

    try:
        import torchvision.io as tio

        out["torchvision-nvjpeg"] = lambda bs: tio.decode_jpeg(
            [as_tensor(b) for b in bs], mode=tio.ImageReadMode.RGB, device=device)
        out["torchvision-cpu+copy"] = lambda bs: [
            tio.decode_jpeg(as_tensor(b), mode=tio.ImageReadMode.RGB).to(device) for b in bs]
    except ImportError as e:
        out["torchvision"] = f"not installed ({e})"
    def decode_all(bs: list[bytes]) -> list[torch.Tensor]:  # the library's, as a tick calls it
        from robocache.data.cameras import decode_all as library
        from robocache.data.frames import EncodedFrames

        data = torch.cat([as_tensor(b) for b in bs])
        offsets = torch.tensor([0, *np.cumsum([len(b) for b in bs])])
        enc = EncodedFrames(data, offsets, (480, 640, 3), "uint8", "jpeg")
        return list(library([(enc, torch.arange(len(bs)))], device)[0])

    out["robocache-decode_all"] = decode_all
    try:
        import simplejpeg

        out["simplejpeg+copy"] = lambda bs: [torch.from_numpy(simplejpeg.decode_jpeg(
            b, colorspace="RGB")).permute(2, 0, 1).to(device) for b in bs]
    except ImportError as e:
        out["simplejpeg+copy"] = f"not installed ({e})"
    try:
        from nvidia import nvimgcodec

        for kind in ("GPU_ONLY", "HYBRID_CPU_GPU", "HW_GPU_ONLY"):
            try:
                dec = nvimgcodec.Decoder(backends=[nvimgcodec.Backend(
                    getattr(nvimgcodec.BackendKind, kind))])
            except Exception as e:  # noqa: BLE001 (a backend this machine lacks)
                out[f"nvimgcodec-{kind}"] = f"{type(e).__name__}: {e}"
                continue
            out[f"nvimgcodec-{kind}"] = lambda bs, dec=dec: [
                torch.as_tensor(im, device=device).permute(2, 0, 1)
                for im in dec.decode([bytes(b) for b in bs])]
    except ImportError as e:
        out["nvimgcodec"] = f"not installed ({e})"
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--device", default="cuda")
    a = ap.parse_args()
    from bench_online import _frame

    from robocache.data.cameras import encode

    frames = [bytes(bytearray(encode(np.roll(_frame(), 37 * i, axis=1), "jpeg", 95)))
              for i in range(2)]
    sync = torch.cuda.synchronize if a.device.startswith("cuda") else (lambda: None)
    rows, reference = [], None
    for name, decode in _decoders(a.device).items():
        if isinstance(decode, str):
            rows.append({"decoder": name, "skipped": decode})
            continue
        row = {"decoder": name}
        try:
            for n in (1, 2):
                us = []
                for _ in range(WARM + CALLS):
                    t0 = time.perf_counter_ns()
                    decode(frames[:n])
                    sync()
                    us.append((time.perf_counter_ns() - t0) / 1e3)
                us = np.asarray(us[WARM:])
                row[f"{n}_frame_p50_us"] = float(np.percentile(us, 50))
                row[f"{n}_frame_p99_us"] = float(np.percentile(us, 99))
            got = torch.stack([o.contiguous() for o in decode(frames)]).int().cpu()
        except Exception as e:  # noqa: BLE001 (a decoder failing here is a result)
            rows.append({"decoder": name, "skipped": f"{type(e).__name__}: {e}"})
            continue
        reference = got if reference is None else reference  # the first: nvJPEG where present
        diff = (got - reference).abs()
        row.update(max_diff_vs_nvjpeg=int(diff.max()),
                   pixels_differing_vs_nvjpeg=float((diff > 0).float().mean()))
        rows.append(row)
    meta = {"device": torch.cuda.get_device_name() if a.device.startswith("cuda") else "cpu",
            "torch": torch.__version__, "date": time.strftime("%Y-%m-%d")}
    if a.json:
        a.json.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    print(f"# {meta}")
    print("decoder                      1 frame p50 / p99 us   2 frames p50 / p99 us   "
          "vs nvJPEG: max diff, pixels differing")
    for r in rows:
        if "skipped" in r:
            print(f"{r['decoder']:28s} skipped: {r['skipped'][:120]}")
        else:
            print(f"{r['decoder']:28s} {r['1_frame_p50_us']:8.0f} / {r['1_frame_p99_us']:6.0f}"
                  f"      {r['2_frame_p50_us']:8.0f} / {r['2_frame_p99_us']:6.0f}       "
                  f"{r['max_diff_vs_nvjpeg']:4d}, {100 * r['pixels_differing_vs_nvjpeg']:.2f} %")


if __name__ == "__main__":
    main()
