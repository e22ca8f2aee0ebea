"""Where a tick of `robocache.Observer` spends its time (the numeric case of bench_online.py,
one intra-op thread).

    $ python benchmarks/profile_online.py                          # CPU, eager core
    $ python benchmarks/profile_online.py --device cuda [--compile] # GPU: also the graph alone
    $ python benchmarks/profile_online.py ... --many                # push_many per stream

Prints, over 1,200 ticks after 200 warm-up ticks, p50 / p99 microseconds of the pushes of a
tick, of the observation, and inside it of the snapping of new samples onto the grid
(``snap``), of the core (on a GPU one CUDA graph replay holding the arena's copy) and of
``serve`` (the views of the core's outputs, which a GPU tick makes once); the rest of the
observation is the host work a GPU tick keeps. Then the torch operators of one core call
(views, and the others: one kernel each in a CUDA graph) and of a
tick's pushes. On a GPU it also prints the captured graph's own time (CUDA events around
replays of it alone) and the kernels one replay launches (torch.profiler).
"""

from __future__ import annotations

import collections
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).parent))
import bench_online as B  # noqa: E402


class _Ops(TorchDispatchMode):
    """Counts the operators dispatched inside it: ``views`` and ``other``."""

    def __init__(self):
        super().__init__()
        self.count = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count["views" if func.is_view else "other"] += 1
        return func(*args, **(kwargs or {}))


def main() -> None:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--many", action="store_true", help="one push_many per stream and tick "
                    "(the bench's push_many rows) instead of a push per message")
    a = ap.parse_args()
    torch.set_num_threads(1)
    cuda = a.device.startswith("cuda")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    with tempfile.TemporaryDirectory() as tmp:
        obs = B._observer(B.make_cache(Path(tmp) / "numeric"), a.device, a.compile)
        log = B.message_log(1400, np.random.default_rng(1))
        push = obs.push_many if a.many else obs.push
        if a.many:
            log = B.batched(log)
        B.per_tick_us(obs, log[:200], sync, a.many)
        times: dict[str, list[float]] = {"push": [], "observation": [], "snap": [],
                                         "core": [], "serve": []}

        def timed(name, f):
            def call(*args):
                a = time.perf_counter_ns()
                out = f(*args)
                times[name].append((time.perf_counter_ns() - a) / 1e3)
                return out
            return call

        obs._run, obs._serve = timed("core", obs._run), timed("serve", obs._serve)
        obs._snap = timed("snap", obs._snap)
        for k, msgs in enumerate(log[200:], 200):
            a = time.perf_counter_ns()
            for name, t, v in msgs:
                push(name, t, v)
            b = time.perf_counter_ns()
            obs.observation(k / B.RATE + B.LAG_S)
            sync()
            times["push"].append((b - a) / 1e3)
            times["observation"].append((time.perf_counter_ns() - b) / 1e3)
        times["observation minus core"] = list(np.subtract(times["observation"],
                                                           times["core"]))
        for key, x in times.items():
            if not x:  # (a GPU tick serves the graph's outputs viewed once: no serve calls)
                continue
            p50, p99 = np.percentile(x, 50), np.percentile(x, 99)
            print(f"{key:24s} p50 {p50:7.1f} us  p99 {p99:7.1f} us")
        if cuda:
            graph_only(obs)
        with _Ops() as core:
            obs.core(*obs.example_inputs())
        with _Ops() as pushes:
            for name, t, v in log[-1]:
                push(name, t + 1.0, v)
        print(f"core operators: {core.count['views']} views, {core.count['other']} others; "
              f"torch operators in {len(log[-1])} pushes: {sum(pushes.count.values())}")


def graph_only(obs) -> None:
    """The captured graph alone: GPU microseconds a replay takes, and its kernels."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(50):
        obs._graph.replay()
    start.record()
    for _ in range(1000):
        obs._graph.replay()
    end.record()
    end.synchronize()
    print(f"graph replay alone: {start.elapsed_time(end):.1f} us per replay (GPU, back to back)")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        obs._graph.replay()
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    print(f"kernels in one replay: {len(kernels)}, GPU busy "
          f"{sum(e.device_time for e in kernels):.1f} us")


if __name__ == "__main__":
    main()
