"""Does this GPU's NVDEC decode AV1? PyNvVideoCodec's own demuxer and decoder on an AV1 MP4.

    $ python benchmarks/probe_av1_nvdec.py --out av1-probe.json

Encodes 30 frames of noise at 480x640 with SVT-AV1 (PyAV; a keyframe every 2 frames, as
LeRobot records), then asks PyNvVideoCodec to decode the file through its own FFmpeg demuxer
(``CreateDemuxer`` + ``CreateDecoder``) and through ``SimpleDecoder``: frames decoded or the
error each gives. It rules out RoboCache's own packet feed (``robocache.data.nvdec_packets``)
as the reason AV1 is decoded on the CPU.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np


def _said(e: Exception) -> str:
    return f"{type(e).__name__}: {' '.join(str(e).split())[:300]}"


def main() -> None:
    import av
    import PyNvVideoCodec as nvc

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", help="JSON file to write")
    args = p.parse_args()
    out: dict = {"pynvvideocodec": getattr(nvc, "__version__", "?")}
    with tempfile.TemporaryDirectory() as tmp:
        path = str(Path(tmp) / "av1.mp4")
        rng = np.random.default_rng(0)
        with av.open(path, "w") as c:
            s = c.add_stream("libsvtav1", rate=30, options={"g": "2", "crf": "30",
                                                            "preset": "12"})
            s.width, s.height, s.pix_fmt = 640, 480, "yuv420p"
            for _ in range(30):
                frame = rng.integers(0, 255, (480, 640, 3), dtype=np.uint8)
                c.mux(s.encode(av.VideoFrame.from_ndarray(frame, "rgb24")))
            c.mux(s.encode())
        try:
            demuxer = nvc.CreateDemuxer(filename=path)
            decoder = nvc.CreateDecoder(gpuid=0, codec=demuxer.GetNvCodecId(), cudacontext=0,
                                        cudastream=0, usedevicememory=True)
            out["own_demuxer_frames"] = sum(len(decoder.Decode(pkt)) for pkt in demuxer)
        except Exception as e:  # noqa: BLE001 - what NVDEC answers is the result
            out["own_demuxer"] = _said(e)
        try:
            simple = nvc.SimpleDecoder(path, gpu_id=0)
            out["simple_decoder_frames"] = len(simple)
            out["simple_decoder_first"] = str(type(simple[0]))
        except Exception as e:  # noqa: BLE001
            out["simple_decoder"] = _said(e)
    print(json.dumps(out, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
