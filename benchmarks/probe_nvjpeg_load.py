"""Whether the GPU's JPEG decode of a frame depends on the batch it is decoded in, on other
work on the GPU, or on when its output is read: the questions behind an `Observer`'s camera
frames differing from the dataset's item while other processes used the same GPU.

    $ python benchmarks/probe_nvjpeg_load.py --json out.json [--rounds 40] [--load 3]

Frames: six 480x640 JPEGs (smooth gradients with noise, q95, chroma 4:4:4 and 4:2:0; a
camera's frames) and two 16x16 ones (the bundled sample's size). The reference of each frame is its
first decode alone on the idle GPU (``robocache.data.cameras._nvjpeg``: the decoder the
dataset and the observer call). Then, idle and while ``--load`` processes of
:func:`robocache.bench.load.busy_gpu` decode JPEGs and multiply matrices on the same GPU,
``--rounds`` rounds of each mode, every output compared with the reference bit for bit:

- ``alone``: each frame in a call of its own, read at once (``torch.equal`` after the call);
- ``pairs``: frames decoded two by two in one call (the window of a history-2 observation),
  read at once;
- ``pairs_late``: the same, read after 5 ms and a device synchronize (an output still being
  written when the call returns would be right here and wrong in ``pairs``);
- ``pairs_synced``: the caller's stream synchronized before each call (an output written
  into memory that queued work still reads would differ only without it);
- ``cpu``: torchvision's CPU decode against the GPU reference (a different decoder: how far
  apart two decoders are, for scale).

Prints and writes, per mode and load, the mismatching frames over the frames compared, the
largest pixel difference, and the decode call's p50 / p99 microseconds (one frame, two).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch


def frames() -> list[tuple[str, bytes]]:
    """The probe's encoded frames: ``(name, jpeg)``."""
    from robocache.data.cameras import encode

    rng = np.random.default_rng(0)
    y, x = np.mgrid[0:480, 0:640]
    base = np.stack([x * 255 // 639, y * 255 // 479, (x + y) * 255 // 1118], -1)
    out = []
    for i in range(6):
        img = np.clip(base + rng.integers(0, 8 + 8 * i, base.shape), 0, 255).astype(np.uint8)
        img = np.roll(img, 37 * i, axis=1)
        chroma = "444" if i % 2 else "420"
        out.append((f"480x640-{chroma}-{i}", bytes(bytearray(encode(img, "jpeg", 95,
                                                                   chroma)))))
    for i in range(2):
        img = rng.integers(0, 256, (16, 16, 3)).astype(np.uint8)
        out.append((f"16x16-{i}", bytes(bytearray(encode(img, "jpeg", 95)))))
    return out


def decode(decoder, jpegs: list[bytes]) -> list[torch.Tensor]:
    data = [torch.frombuffer(bytearray(j), dtype=torch.uint8) for j in jpegs]
    return decoder(data, mode="RGB", device="cuda")


def run_modes(decoder, jpegs, reference, rounds: int) -> dict:
    """Each mode's mismatches against ``reference`` and the call's latency."""
    out: dict = {}
    n = len(jpegs)
    pairs = [(i, (i + 1) % n) for i in range(n)]
    for mode in ("alone", "pairs", "pairs_late", "pairs_synced"):
        bad, total, worst, lat = 0, 0, 0, []
        for _ in range(rounds):
            for batch in ([(i,) for i in range(n)] if mode == "alone" else pairs):
                if mode == "pairs_synced":
                    torch.cuda.current_stream().synchronize()
                a = time.perf_counter_ns()
                got = decode(decoder, [jpegs[i] for i in batch])
                lat.append((time.perf_counter_ns() - a) / 1e3)
                if mode == "pairs_late":
                    time.sleep(0.005)
                    torch.cuda.synchronize()
                for i, g in zip(batch, got, strict=True):
                    total += 1
                    if not torch.equal(g, reference[i]):
                        bad += 1
                        worst = max(worst, int((g.int() - reference[i].int()).abs().max()))
        out[mode] = {"mismatches": bad, "compared": total, "max_abs_diff": worst,
                     "call_p50_us": float(np.percentile(lat, 50)),
                     "call_p99_us": float(np.percentile(lat, 99))}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json")
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--load", type=int, default=3, help="processes loading the GPU")
    opts = ap.parse_args()
    from robocache.bench.harness import metadata
    from robocache.bench.load import busy_gpu
    from robocache.data.cameras import _nvjpeg

    if not torch.cuda.is_available():
        sys.exit("probe_nvjpeg_load needs a CUDA GPU.")
    decoder = _nvjpeg()
    named = frames()
    names, jpegs = [n for n, _ in named], [j for _, j in named]
    reference = [decode(decoder, [j])[0].clone() for j in jpegs]
    torch.cuda.synchronize()
    result: dict = {"meta": metadata(), "frames": names, "decoder": decoder.__module__,
                    "rounds": opts.rounds, "load_processes": opts.load}
    from torchvision.io import decode_jpeg

    cpu = [decode_jpeg(torch.frombuffer(bytearray(j), dtype=torch.uint8)) for j in jpegs]
    diff = [int((c.int() - r.cpu().int()).abs().max()) for c, r in zip(cpu, reference,
                                                                       strict=True)]
    result["cpu"] = {"mismatches": sum(d > 0 for d in diff), "compared": len(diff),
                     "max_abs_diff": max(diff)}
    print(f"decoder {result['decoder']}; frames {len(names)}; cpu decode vs gpu: "
          f"{result['cpu']['mismatches']}/{len(names)} differ, max {result['cpu']['max_abs_diff']}")
    print(f"{'mode':14s} {'load':>5s} {'mismatch':>12s} {'max diff':>9s} {'call p50':>9s} "
          f"{'p99 us':>9s}", flush=True)

    def measure(load: str) -> None:  # printed and written as each part ends
        result[load] = run_modes(decoder, jpegs, reference, opts.rounds)
        for mode, r in result[load].items():
            print(f"{mode:14s} {load:>5s} {r['mismatches']:>5d}/{r['compared']:<6d} "
                  f"{r['max_abs_diff']:>9d} {r['call_p50_us']:>9.0f} {r['call_p99_us']:>9.0f}",
                  flush=True)
        if opts.json:
            Path(opts.json).write_text(json.dumps(result, indent=1))

    measure("idle")
    with busy_gpu(jpegs[:6], processes=opts.load, seconds=300):
        measure("load")


if __name__ == "__main__":
    main()
