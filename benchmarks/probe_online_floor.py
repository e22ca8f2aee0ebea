"""The floor under an online tick on a GPU, from Python, on this machine: what a tick of
``bench online`` (numeric case) cannot go below, beside the observer's own tick, in one run.

    python benchmarks/probe_online_floor.py --out /tmp/floor.json [--ticks 10000]

Cases, microseconds per tick (p50 / p99 / max over ``--ticks`` after 200 warm-up ticks):

- ``synchronize``: ``torch.cuda.synchronize()`` alone (nothing queued).
- ``graph``: a CUDA graph of one 4 KB pinned-to-device copy and one elementwise kernel:
  ``np.copyto`` into the pinned stage, replay, synchronize. The observer's launch path with
  the least GPU work.
- ``handwritten``: bench_online's hand-written alternative (latest message per topic, NumPy
  normalization), on the host, as ``bench online`` measures it.
- ``handwritten-to-gpu``: the same, its four arrays then copied to the GPU and synchronized:
  the alternative doing what a GPU policy needs.
- ``observer``: ``Observer`` with ``compile=True``, one ``push_many`` per stream and tick
  (``bench online``'s ``robocache-compiled-push_many`` row).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).parent))
import bench_online as B  # noqa: E402


def _loop(fn, ticks: int) -> list[float]:
    out = []
    for _ in range(ticks + 200):
        t0 = time.perf_counter_ns()
        fn()
        out.append((time.perf_counter_ns() - t0) / 1e3)
    return out[200:]


def _graph_tick():
    host = torch.zeros(1024, dtype=torch.float32)
    stage, dev = host.clone().pin_memory(), host.to("cuda")
    stage_np, host_np = stage.numpy(), host.numpy()
    out = torch.empty_like(dev)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.mul(dev, 2.0, out=out)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        dev.copy_(stage, non_blocking=True)
        torch.mul(dev, 2.0, out=out)

    def tick():
        np.copyto(stage_np, host_np)
        graph.replay()
        torch.cuda.synchronize()
    return tick


class _HandwrittenToGpu(B.Handwritten):
    def observation(self, t: float) -> dict[str, torch.Tensor]:
        out = {k: torch.from_numpy(v).to("cuda", non_blocking=True)
               for k, v in super().observation(t).items()}
        torch.cuda.synchronize()
        return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--ticks", type=int, default=10_000)
    args = ap.parse_args()
    from robocache.ops.normalize import Stats

    torch.set_num_threads(1)
    rows = {"synchronize": _loop(torch.cuda.synchronize, args.ticks),
            "graph": _loop(_graph_tick(), args.ticks)}
    with tempfile.TemporaryDirectory() as tmp:
        cache = B.make_cache(Path(tmp) / "numeric")
        log = B.message_log(args.ticks + 200, np.random.default_rng(1))
        stats = {k: Stats.from_dict(v)
                 for k, v in json.loads((cache / "stats.json").read_text()).items()}
        none = (lambda: None)
        rows["handwritten"] = B.per_tick_us(B.Handwritten(stats), log, none)[0][200:]
        rows["handwritten-to-gpu"] = B.per_tick_us(_HandwrittenToGpu(stats), log, none)[0][200:]
        rows["observer"] = B.per_tick_us(B._observer(cache, "cuda", True), B.batched(log),
                                         torch.cuda.synchronize, True)[0][200:]
    table = {k: {"p50_us": float(np.percentile(v, 50)), "p99_us": float(np.percentile(v, 99)),
                 "max_us": float(np.max(v)), "ticks": len(v)} for k, v in rows.items()}
    rec = {"device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d"),
           "torch": torch.__version__, "rows": table}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rec, indent=1))
    print(f"{rec['device']}, torch {torch.__version__}")
    print(f"{'case':20s} {'p50 us':>8} {'p99 us':>8} {'max us':>8}")
    for k, r in table.items():
        print(f"{k:20s} {r['p50_us']:8.1f} {r['p99_us']:8.1f} {r['max_us']:8.1f}")


if __name__ == "__main__":
    main()
