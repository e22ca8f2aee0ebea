"""Where a tick of `robocache.Observer` spends its time (the numeric case of bench_online.py,
one intra-op thread).

    $ python benchmarks/profile_online.py                          # CPU, eager core
    $ python benchmarks/profile_online.py --device cuda [--compile] # GPU: also the graph alone
    $ python benchmarks/profile_online.py ... --many                # push_many per stream
    $ python benchmarks/profile_online.py ... --cprofile            # + Python functions
    $ python benchmarks/profile_online.py --camera --device cuda    # the camera case

Prints, over 1,200 ticks after 200 warm-up ticks, p50 / p99 microseconds of the pushes of a
tick, of the observation, and inside it of the snapping of new samples onto the grid
(``snap``), of the core (on a GPU one CUDA graph replay holding the arena's copy; on the
CPU the host tick where it covers the streams) and of
``serve`` (the views of the core's outputs, which a GPU tick makes once); the rest of the
observation is the host work a GPU tick keeps. Then the torch operators of one core call
(views, and the others: one kernel each in a CUDA graph) and of a
tick's pushes. On a GPU it also prints the captured graph's own time (CUDA events around
replays of it alone) and the kernels one replay launches (torch.profiler). ``--cprofile``:
then the same ticks again under cProfile, the Python functions and builtins by their own time
per tick (the profiler's own cost included: it ranks them, the timings above measure).

``--camera``: the camera case (a 480x640 JPEG camera at 30 Hz served at 224x224, history 2):
p50 / p99 of the pushes, the observation and, on the ticks whose window changed, its decode
and serve (``decode_serve``), inside it the decode of the window's frames (``decode_all``)
and the resize and cast (``serve``); then the decode of two frames and of one frame alone,
and the torch operators of one decoding tick by their own CPU time (torch.profiler).
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
    ap.add_argument("--camera", action="store_true", help="the camera case instead")
    ap.add_argument("--cprofile", action="store_true", help="also the numeric ticks under "
                    "cProfile: the Python functions by their own time")
    opts = ap.parse_args()
    torch.set_num_threads(1)
    cuda = opts.device.startswith("cuda")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    if opts.camera:
        camera(opts.device, sync)
        return
    with tempfile.TemporaryDirectory() as tmp:
        obs = B._observer(B.make_cache(Path(tmp) / "numeric"), opts.device, opts.compile)
        log = B.message_log(1400, np.random.default_rng(1))
        push = obs.push_many if opts.many else obs.push
        if opts.many:
            log = B.batched(log)
        B.per_tick_us(obs, log[:200], sync, opts.many)
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
        if obs._host_tick is not None:  # the CPU tick without torch operators, in its place
            obs._host_tick = timed("core", obs._host_tick)
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
        if opts.cprofile:
            functions(obs, log, 200, push, sync)


def functions(obs, log, first, push, sync) -> None:
    """The ticks of ``log[first:]`` again, a whole log later (their times shifted by the log's
    length), under cProfile: the 15 Python functions and builtins taking most of their own
    time, per tick."""
    import cProfile
    import pstats

    later, ticks = len(log), log[first:]
    prof = cProfile.Profile()
    prof.enable()
    for k, msgs in enumerate(ticks, first + later):
        for name, t, v in msgs:
            push(name, t + later / B.RATE, v)
        obs.observation(k / B.RATE + B.LAG_S)
        sync()
    prof.disable()
    print(f"cProfile, own time per tick over {len(ticks)} ticks (the profiler's cost included):")
    stats = pstats.Stats(prof).stats
    rows = sorted(stats.items(), key=lambda kv: -kv[1][2])[:15]
    for (path, line, fn), (_, calls, own, _, _) in rows:
        where = f"{Path(path).name}:{line}({fn})" if line else fn
        print(f"  {own / len(ticks) * 1e6:7.2f} us  {calls / len(ticks):5.1f} calls  {where}")


def _report(times: dict[str, list[float]]) -> None:
    for key, x in times.items():
        if x:
            p50, p99 = np.percentile(x, 50), np.percentile(x, 99)
            print(f"{key:24s} p50 {p50:7.1f} us  p99 {p99:7.1f} us  ({len(x)} calls)")


def camera(device: str, sync, ticks: int = 1200, warm: int = 200) -> None:
    """The camera case's tick, its parts timed (see the module docstring)."""
    import robocache.data.cameras as C

    times: dict[str, list[float]] = {k: [] for k in (
        "push", "observation", "decode_serve", "decode_all", "serve")}

    def timed(name, f):
        def call(*args, **kwargs):
            a = time.perf_counter_ns()
            out = f(*args, **kwargs)
            if name != "decode_serve":
                sync()  # (the GPU's share of it, where it queued work)
            times[name].append((time.perf_counter_ns() - a) / 1e3)
            return out
        return call

    with tempfile.TemporaryDirectory() as tmp:
        obs = B.camera_observer(B.make_cache(Path(tmp) / "camera", cameras=True), device)
        log = B.camera_log(warm + ticks)
        B.per_tick_us(obs, log[:warm], sync)
        decode_all, serve = C.decode_all, C.serve
        C.decode_all, C.serve = timed("decode_all", decode_all), timed("serve", serve)
        obs._decode_serve = timed("decode_serve", obs._decode_serve)
        try:
            for k, msgs in enumerate(log[warm:], warm):
                a = time.perf_counter_ns()
                for name, t, v in msgs:
                    obs.push(name, t, v)
                b = time.perf_counter_ns()
                obs.observation(k / B.RATE + B.LAG_S)
                sync()
                times["push"].append((b - a) / 1e3)
                times["observation"].append((time.perf_counter_ns() - b) / 1e3)
        finally:
            C.decode_all, C.serve = decode_all, serve
        _report(times)
        frames = [torch.frombuffer(bytearray(m[2]), dtype=torch.uint8)
                  for m in sum(log[warm:warm + 4], [])][:2]
        alone: dict[str, list[float]] = {"decode 2 frames alone": [],
                                         "decode 1 frame alone": []}
        for _ in range(300):
            for key, batch in zip(alone, (frames, frames[:1]), strict=True):
                a = time.perf_counter_ns()
                C.decode_all([(C.EncodedFrames(torch.cat(batch), torch.tensor(
                    [0, *np.cumsum([len(f) for f in batch])]), (480, 640, 3), "uint8", "jpeg"),
                    torch.arange(len(batch)))], device)
                sync()
                alone[key].append((time.perf_counter_ns() - a) / 1e3)
        _report(alone)
        activities = [torch.profiler.ProfilerActivity.CPU] + (
            [torch.profiler.ProfilerActivity.CUDA] if device.startswith("cuda") else [])
        k = next(k for k in range(warm + ticks, warm + ticks + 10) if log[k % len(log)])
        with torch.profiler.profile(activities=activities) as prof:
            for name, t, v in log[k % len(log)]:
                obs.push(name, t + (warm + ticks) / B.RATE, v)
            obs.observation((k + 2 * (warm + ticks)) / B.RATE + B.LAG_S)
            sync()
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))


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
