"""Load on a GPU from other processes: each decodes a batch of JPEG frames with nvJPEG and
multiplies matrices, in a loop, as other jobs sharing the GPU would (the GPU tests in several
workers, a training job beside a policy). What a test or a probe runs while it checks that a
result does not depend on what else runs on the GPU.

    >>> with busy_gpu(jpegs, processes=3):
    ...     check_something()
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

_WORKER = r"""
import sys, time, torch
try:
    from torchvision.io import decode_jpeg
except ImportError:
    from torchcodec.decoders import decode_jpeg
ready, seconds, paths = sys.argv[1], float(sys.argv[2]), sys.argv[3:]
frames = [torch.frombuffer(bytearray(open(p, "rb").read()), dtype=torch.uint8) for p in paths]
x = torch.randn(1024, 1024, device="cuda")
decode_jpeg(frames, device="cuda")
torch.cuda.synchronize()
open(ready, "w").close()
end = time.monotonic() + seconds
while time.monotonic() < end:
    decode_jpeg(frames, device="cuda")
    x = torch.tanh(x @ x)
torch.cuda.synchronize()
"""


@contextlib.contextmanager
def busy_gpu(frames: list[bytes], processes: int = 3, seconds: float = 300.0,
             start_timeout_s: float = 120.0) -> Iterator[list[subprocess.Popen]]:
    """Run ``processes`` processes that decode ``frames`` (encoded JPEGs, one batch) on the
    current CUDA device and multiply 1024x1024 matrices, in a loop, for at most ``seconds``
    (they end by themselves if this process dies); yields once every one decodes, and stops
    them on exit.

    Raises:
        RuntimeError: a process exited before it was ready (its last output attached) or
            was not ready within ``start_timeout_s``.
    """
    with tempfile.TemporaryDirectory(prefix="robocache-load-") as tmp:
        paths = []
        for i, f in enumerate(frames):
            paths.append(str(Path(tmp) / f"{i}.jpg"))
            Path(paths[-1]).write_bytes(f)
        procs = []
        try:
            for i in range(processes):
                procs.append(subprocess.Popen(
                    [sys.executable, "-c", _WORKER, str(Path(tmp) / f"ready{i}"),
                     str(seconds), *paths], stdout=subprocess.DEVNULL,
                    stderr=subprocess.PIPE))
            deadline = time.monotonic() + start_timeout_s
            for i, p in enumerate(procs):
                while not (Path(tmp) / f"ready{i}").exists():
                    if p.poll() is not None:
                        raise RuntimeError(f"a GPU load process exited with status "
                                           f"{p.returncode} before it was ready: "
                                           f"{p.stderr.read().decode()[-800:]}")
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"a GPU load process was not ready within "
                                           f"{start_timeout_s:g} s.")
                    time.sleep(0.05)
            yield procs
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                p.wait()
                p.stderr.close()
