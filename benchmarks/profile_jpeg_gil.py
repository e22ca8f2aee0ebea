"""How much of a JPEG encoder's time holds the GIL: py-spy samples one thread encoding a 480x640
frame at quality 95 in a loop (``pillow-decode``, ``simplejpeg-decode``: decoding it to an RGB
array, as the serving path's CPU decode does), once for all samples and once (``--gil``) for
the samples where that thread holds the GIL; the ratio of the encoder's samples is the share
of its time other Python threads cannot run. Also each call's mean milliseconds (``ms``: the
loop's calls over its seconds, under py-spy's sampling).

    $ pip install py-spy simplejpeg PyTurboJPEG pillow
    $ python benchmarks/profile_jpeg_gil.py --seconds 6 --out benchmarks/results/jpeg-gil.json

An encoder that holds the GIL serializes every thread of the process on it (Pillow), one that
releases it runs threads side by side (simplejpeg, PyTurboJPEG). ``bench cameras`` measures
the consequence: frames/s with one thread per core against one thread (``thread_scaling``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import io
import json
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ENCODERS = ("pillow", "simplejpeg", "turbojpeg", "pillow-decode", "simplejpeg-decode")


def _encoder(name: str):
    if name == "pillow":
        from PIL import Image

        def pillow(frame):
            buf = io.BytesIO()
            Image.fromarray(frame).save(buf, "JPEG", quality=95, subsampling=0)
            return buf.getvalue()
        return pillow
    if name in ("pillow-decode", "simplejpeg-decode"):
        from PIL import Image

        encoded = {}

        def encoded_once(frame) -> bytes:  # the frame's JPEG bytes (4:2:0), made once
            if not encoded:
                buf = io.BytesIO()
                Image.fromarray(frame).save(buf, "JPEG", quality=95)
                encoded["data"] = buf.getvalue()
            return encoded["data"]

        def pillow_decode(frame):
            with Image.open(io.BytesIO(encoded_once(frame))) as im:
                return np.asarray(im.convert("RGB"))

        def simplejpeg_decode(frame):
            import simplejpeg

            return simplejpeg.decode_jpeg(encoded_once(frame), colorspace="RGB")
        return pillow_decode if name == "pillow-decode" else simplejpeg_decode
    if name == "simplejpeg":
        import simplejpeg

        return lambda frame: simplejpeg.encode_jpeg(frame, 95, "RGB", "444")
    from turbojpeg import TJSAMP_444, TurboJPEG

    tj = TurboJPEG()
    return lambda frame: tj.encode(frame, 95, 0, TJSAMP_444)  # pixel format 0: RGB


def _loop(name: str, seconds: float) -> None:
    """The profiled process: encode a textured frame for ``seconds`` (function ``encode_loop``
    in py-spy's stacks)."""
    rng = np.random.default_rng(0)
    y, x = np.mgrid[0:480, 0:640]
    frame = np.stack([128 + 60 * np.sin(x / 23), 128 + 60 * np.cos(y / 17),
                      100 + 50 * np.sin((x + y) / 31)], -1) + rng.normal(0, 6, (480, 640, 3))
    frame = frame.clip(0, 255).astype(np.uint8)
    encode = _encoder(name)

    def encode_loop():
        t0, calls = time.time(), 0
        while time.time() - t0 < seconds:
            encode(frame)
            calls += 1
        print(f"calls {calls} seconds {time.time() - t0}", flush=True)

    encode_loop()


def _versions() -> dict[str, str | None]:
    from importlib import metadata

    out = {}
    for name in ("pillow", "simplejpeg", "PyTurboJPEG", "py-spy"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def _samples(path: Path) -> int:
    """Samples (py-spy raw format) whose stack passes through ``encode_loop``."""
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if "encode_loop" in stack:
            total += int(count)
    return total


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=6.0)
    p.add_argument("--rate", type=int, default=200, help="py-spy samples per second")
    p.add_argument("--out", help="write the results JSON here")
    p.add_argument("--loop", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.loop:
        _loop(a.loop, a.seconds)
        return
    results = {"meta": {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                        "python": platform.python_version(), "machine": platform.processor(),
                        "seconds": a.seconds, "rate_hz": a.rate, "versions": _versions()},
               "encoders": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for name in ENCODERS:
            counts, ms = {}, []
            for gil in (False, True):
                out = Path(tmp) / f"{name}-{gil}.txt"
                run = subprocess.run(["py-spy", "record", "-r", str(a.rate), "-f", "raw", "-o",
                                      str(out), *(["--gil"] if gil else []), "--",
                                      sys.executable, __file__, "--loop", name, "--seconds",
                                      str(a.seconds)], check=True, capture_output=True,
                                     text=True)
                counts[gil] = _samples(out)
                calls = re.search(r"calls (\d+) seconds ([\d.]+)", run.stdout)
                if calls:
                    ms.append(1e3 * float(calls[2]) / int(calls[1]))
            share = counts[True] / max(counts[False], 1)
            results["encoders"][name] = {"samples": counts[False],
                                         "samples_holding_gil": counts[True],
                                         "gil_held_pct": round(100 * share, 1),
                                         "ms": round(min(ms), 3) if ms else None}
            print(f"{name}: {counts[False]} samples encoding, {counts[True]} holding the GIL "
                  f"({100 * share:.0f}%), {min(ms) if ms else float('nan'):.2f} ms a call")
    if a.out:
        Path(a.out).write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
