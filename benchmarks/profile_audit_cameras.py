"""Where the audit's camera checks spend their time on a cache of JPEG frames (bench_audit's
``cameras`` case at a smaller size: bench video's 4 textured 480x640 cameras, H.264 decoded
into JPEG q95 by the ingest).

    $ python benchmarks/profile_audit_cameras.py [--episodes 2] [--length 40] [--out P.txt]

Prints the wall clock of a whole audit, of the camera checks alone
(``robocache.data.audit._pixels``) and of the same frames read and decoded the way serving
does (``_take`` then ``decode_all`` in batches, without the checks), then cProfile's functions
of one ``_pixels`` call by their own time and by their cumulative time: what the checks add
to reading and decoding (the frame index scans, the row reads, the numeric checks, the
sequencing of the cameras).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--episodes", type=int, default=2)
    ap.add_argument("--length", type=int, default=40)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    import numpy as np
    from bench_video import CAMS, source

    import robocache.data.audit as A
    from robocache.data import snapshot
    from robocache.data.cache import build
    from robocache.data.location import LANCE, Location

    cfg = {"hw": (480, 640), "episodes": a.episodes, "length": a.length}
    dev = torch.device(a.device)
    lines = [f"# audit camera checks, JPEG cache: {len(CAMS)} cameras 480x640, "
             f"{a.episodes} episodes x {a.length} frames, device {dev}, load average "
             f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores at the start"]
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        cache = tmp / "cache"
        build(source(tmp / "src", cfg, "h264"), cache, rate_hz="native", progress=False,
              device=str(dev), camera_codec="jpeg")
        A.audit(cache, device=dev)  # the frames into the page cache, the decoders started
        location = Location(cache)
        manifest = snapshot.servable(location, location.manifest())
        cameras = {k: s for k, s in manifest["streams"].items()
                   if s["kind"] in ("image", "video")}
        assert len(cameras) == len(CAMS), manifest["streams"]
        expected = A._episode_rows(manifest)
        frames = len(CAMS) * a.episodes * a.length

        def pixels():
            with LANCE.call():
                return A._pixels(location, manifest, cameras, expected, A.AuditConfig(), dev)

        def decode_only():  # the same batches read and decoded, nothing checked
            ids = np.array(sorted(expected), np.int64)
            with LANCE.call():
                for _ in A._decoded(location, manifest, cameras, ids, dev, []):
                    pass

        def timed(fn) -> float:
            best = float("inf")
            for _ in range(3):
                t0 = time.perf_counter()
                fn()
                if dev.type == "cuda":
                    torch.cuda.synchronize()
                best = min(best, time.perf_counter() - t0)
            return best

        whole = timed(lambda: A.audit(cache, device=dev))
        checks = timed(pixels)
        decode = timed(decode_only)
        for what, s in (("whole audit", whole), ("camera checks (_pixels)", checks),
                        ("read + decode only", decode)):
            lines.append(f"{what:26s} {s * 1e3:8.1f} ms  {frames / s:9,.0f} frames/s "
                         "(best of 3)")
        numeric = timed(lambda: A.audit(cache, A.AuditConfig(cameras=False), device=dev))
        lines.append(f"{'audit without cameras':26s} {numeric * 1e3:8.1f} ms (best of 3)")
        # cProfile sees the calling thread only: _pixels' own work (the checks, waiting for
        # the decoded batches), then the reads and decodes on this thread
        for what, fn, keys in (("_pixels", pixels, ("tottime", "cumulative")),
                               ("read + decode only", decode_only, ("tottime",)),
                               ("audit without cameras",
                                lambda: A.audit(cache, A.AuditConfig(cameras=False), device=dev),
                                ("cumulative",))):
            prof = cProfile.Profile()
            prof.enable()
            fn()
            prof.disable()
            for key in keys:
                text = io.StringIO()
                pstats.Stats(prof, stream=text).sort_stats(key).print_stats(25)
                lines.append(f"\n## {what} by {key}\n" + text.getvalue())
    out = "\n".join(lines)
    print(out)
    if a.out:
        a.out.write_text(out)


if __name__ == "__main__":
    main()
