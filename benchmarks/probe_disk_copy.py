"""What a copy costs on this disk: the ceiling of an ingest that copies its source's bytes.

    $ python benchmarks/probe_disk_copy.py --dir /tmp --gb 3 --out disk.json

Writes ``--gb`` GB of random bytes to a file in ``--dir`` (64 MB writes, then ``fsync``),
reads it back cold (page cache dropped with ``posix_fadvise``, one thread, 16 MB reads), and
copies it with ``cp`` then ``sync``: MB/s of each. A kept-video ingest writes about the
bytes it reads to the cache, so on one disk it cannot beat the write rate.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import time
from pathlib import Path

import numpy as np


def _drop(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dir", default="/tmp")
    p.add_argument("--gb", type=float, default=3.0)
    p.add_argument("--out", help="JSON file to write")
    args = p.parse_args()
    src, dst = Path(args.dir) / "disk-probe.bin", Path(args.dir) / "disk-probe-copy.bin"
    buf = np.random.default_rng(0).integers(0, 255, 64 << 20, dtype=np.uint8).tobytes()
    chunks = max(1, int(args.gb * 1e9) // len(buf))
    n = chunks * len(buf)
    try:
        t = time.perf_counter()
        with open(src, "wb") as f:
            for _ in range(chunks):
                f.write(buf)
            f.flush()
            os.fsync(f.fileno())
        write = n / (time.perf_counter() - t) / 1e6
        _drop(src)
        t = time.perf_counter()
        with open(src, "rb", buffering=0) as f:
            while f.read(16 << 20):
                pass
        read = n / (time.perf_counter() - t) / 1e6
        _drop(src)
        t = time.perf_counter()
        subprocess.run(["cp", str(src), str(dst)], check=True)
        os.sync()
        copy = n / (time.perf_counter() - t) / 1e6
    finally:
        for path in (src, dst):
            path.unlink(missing_ok=True)
    out = {"bytes": n, "write_fsync_MBps": write, "cold_read_MBps": read, "cp_sync_MBps": copy}
    print(json.dumps(out, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
