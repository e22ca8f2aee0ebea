"""Benchmark `robocache.Observer`: the training-time observation built at every control tick,
against the hand-written alternative, in one run.

    $ robocache bench online --json benchmarks/results/online.json
    $ taskset -c 0 python benchmarks/bench_online.py --json out.json   # one CPU core
    $ python benchmarks/bench_online.py --quick                        # smoke run

Numeric case: 4 streams into a 50 Hz policy with 2 history steps (``history=2``,
``normalize="mean_std"``): joints 7-D at 500 Hz, end-effector pose 7-D at 100 Hz (both
linear), tactile 16-D at 333 Hz (linear, off the grid), gripper 1-D events at irregular times
(``previous``, with its age). Per tick: push every message that came since the last tick, one
``push`` per message (the ``push_many`` rows: one call per stream with that tick's messages
of it), then ``observation(now)`` (now = the step + 5 ms, so every interpolated stream has a
message past the step); on a GPU the tick ends with a synchronize (the observation is ready
to read). On a GPU the core runs eager and compiled (``-compiled``: ``compile=True``); on the
CPU the tick is the host tick either way (no torch operator). And the smallest tick: one 7-D
stream at 30 Hz into a 30 Hz policy, history 2, one message a tick. Per-tick microseconds
over ``ticks`` ticks after 200 warm-up ticks, p50 / p99 / max: wall clock (``p99_us``...)
and the thread's CPU time (``cpu_p99_us``...: what the tick costs a core of its own; on a
shared machine the wall clock also counts time other processes held the core;
``load_average_1min`` records how busy the machine was); ``p99_over_handwritten`` /
``p50_over_handwritten``: against the hand-written row of the same case and run.

The alternative (``handwritten``): a dict holding the latest message per topic, updated per
message, and at the tick the last two ticks' latest values stacked and normalized with NumPy
(``(x - mean) / std``) — what robot glue code does (no alignment, no pad masks, no ages).

Camera case: one 480x640 JPEG camera at 30 Hz, served at 224x224 float32 (``image_size``) with
2 history steps: push the JPEG bytes, then the observation (nvJPEG on a GPU, libjpeg-turbo on
the CPU).

Targets: numeric p99 <= 1.5x the hand-written p99 of the same run (both cases, on a GPU and on
one CPU core); camera p99 <= 1 ms on one H200.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from robocache.bench import harness as H
from robocache.bench.standalone import main

FAMILY = "online"
RATE = 50.0
STREAMS = {"observation.joints": (7, 500.0), "observation.pose": (7, 100.0),
           "observation.tactile": (16, 1000.0 / 3), "observation.gripper": (1, None)}
LAG_S = 0.005  # the step is served once every interpolated stream has passed it
ONE = {"observation.state": (7, 30.0)}  # the smallest tick: one stream, one message a tick
FULL = {"ticks": 10_000, "camera_ticks_cpu": 300}
QUICK = {"ticks": 500, "camera_ticks_cpu": 30}


def _times(rate: float | None, duration: float, rng) -> np.ndarray:
    if rate is None:  # gripper events: every 0.2-1.5 s
        return np.cumsum(rng.uniform(0.2, 1.5, int(duration / 0.2) + 1))
    return np.arange(int(duration * rate) + 1) / rate + (0.0011 if rate == 1000 / 3 else 0.0)


def _episode(index: int, duration: float, rng, cameras: bool = False, numeric=STREAMS):
    from robocache.data.episode import Episode, Stream, StreamSpec

    streams = {}
    for name, (dim, rate) in numeric.items():
        # events at irregular times, declared at their mean rate (LeRobot features need one)
        spec = StreamSpec(name, "numeric", "float32", (dim,), rate or 1.0)
        t = _times(rate, duration, rng)
        t = t[t <= duration]
        streams[name] = Stream(spec, t, rng.normal(size=(len(t), dim)).astype(np.float32))
    if cameras:
        spec = StreamSpec("observation.images.cam", "image", "uint8", (480, 640, 3), 30.0)
        t = np.arange(int(duration * 30)) / 30
        frame = _frame()
        streams[spec.name] = Stream(spec, t, np.repeat(frame[None], len(t), 0))
    return Episode(index, streams, {"tasks": ["pick"]})


def _frame() -> np.ndarray:
    """A smooth 480x640 RGB test frame (JPEG-compresses like a camera image, not like noise)."""
    y, x = np.mgrid[0:480, 0:640]
    return np.stack([(x * 255 // 639), (y * 255 // 479), ((x + y) * 255 // 1118)],
                    -1).astype(np.uint8)


def make_cache(root: Path, cameras: bool = False, numeric=STREAMS, rate: float = RATE
               ) -> Path:
    """A 2-episode source of the streams, written as LeRobot (multi-rate) and cached at
    ``rate`` (the cache supplies the observer's rate, methods and statistics)."""
    from robocache.data.cache import build
    from robocache.data.formats.lerobot import write_lerobot

    rng = np.random.default_rng(0)
    eps = [_episode(i, 1.0 if cameras else 4.0, rng, cameras, numeric) for i in range(2)]
    specs = {n: s.spec for n, s in eps[0].streams.items()}
    write_lerobot(root / "src", eps, specs, fps=500.0)
    build(root / "src", root / "cache", rate_hz=rate, progress=False, device="cpu",
          methods={"observation.gripper": "previous"} if "observation.gripper" in numeric
          else {})
    return root / "cache"


def message_log(ticks: int, rng, numeric=STREAMS, rate: float = RATE
                ) -> list[list[tuple[str, float, np.ndarray]]]:
    """Per tick, the messages that arrive since the last one (log order)."""
    duration = (ticks + 2) / rate
    msgs = []
    for name, (dim, rate_hz) in numeric.items():
        t = _times(rate_hz, duration, rng)
        values = rng.normal(size=(len(t), dim)).astype(np.float32)
        msgs += [(float(a), name, v) for a, v in zip(t, values, strict=True)]
    msgs.sort(key=lambda m: m[0])
    per_tick: list[list] = [[] for _ in range(ticks)]
    at = 0
    for k in range(ticks):
        now = k / rate + LAG_S
        while at < len(msgs) and msgs[at][0] <= now:
            t, name, v = msgs[at]
            per_tick[k].append((name, t, v))
            at += 1
    return per_tick


class Handwritten:
    """Latest message per topic, the last two ticks stacked, NumPy normalization."""

    def __init__(self, stats: dict):
        self.mean = {k: np.asarray(s.mean, np.float32) for k, s in stats.items()}
        self.std = {k: np.asarray(s.std, np.float32) for k, s in stats.items()}
        self.latest: dict[str, np.ndarray] = {}
        self.prev: dict[str, np.ndarray] = {}

    def push(self, name: str, t: float, value: np.ndarray) -> None:
        self.latest[name] = value

    def observation(self, t: float) -> dict[str, np.ndarray]:
        out = {}
        for k, v in self.latest.items():
            prev = self.prev.get(k, v)
            out[k] = (np.stack([prev, v]) - self.mean[k]) / self.std[k]
            self.prev[k] = v
        return out


def batched(log) -> list[list[tuple[str, np.ndarray, np.ndarray]]]:
    """The log with each tick's messages of a stream as one batch (times ``[N]``, values
    ``[N, D]``: as a driver's buffer of one topic holds them), for ``push_many``."""
    out = []
    for msgs in log:
        by: dict[str, list] = {}
        for name, t, v in msgs:
            by.setdefault(name, []).append((t, v))
        out.append([(name, np.array([t for t, _ in m]), np.stack([v for _, v in m]))
                    for name, m in by.items()])
    return out


def per_tick_us(impl, log, sync, many: bool = False, rate: float = RATE
                ) -> tuple[list[float], list[float]]:
    """Microseconds of each tick (its pushes, then the observation): wall clock, and this
    thread's CPU time (what the tick costs a core of its own: on a shared machine the wall
    clock also counts the time other processes held the core). ``many``: ``log`` is
    :func:`batched`, one ``push_many`` per stream and tick."""
    wall, cpu = [], []
    push = impl.push_many if many else impl.push
    for k, msgs in enumerate(log):
        t0, c0 = time.perf_counter_ns(), time.thread_time_ns()
        for name, t, v in msgs:
            push(name, t, v)
        impl.observation(k / rate + LAG_S)
        sync()
        cpu.append((time.thread_time_ns() - c0) / 1e3)
        wall.append((time.perf_counter_ns() - t0) / 1e3)
    return wall, cpu


def record(name: str, impl: str, samples: tuple[list[float], list[float]], device: str,
           **extra) -> dict:
    wall, cpu = samples
    skip = 200 if len(wall) > 400 else len(wall) // 4  # warm-up ticks (compilation, caches)
    s, c = np.asarray(wall[skip:]), np.asarray(cpu[skip:])
    timing = H.summarize(s.tolist())
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    return H.case(FAMILY, name, impl, timing, unit="us", device=device, ticks=len(s),
                  load_average_1min=load, p50_us=float(np.percentile(s, 50)),
                  p99_us=float(np.percentile(s, 99)), max_us=float(s.max()),
                  cpu_p50_us=float(np.percentile(c, 50)), cpu_p99_us=float(np.percentile(c, 99)),
                  cpu_max_us=float(c.max()), threads=torch.get_num_threads(), **extra)


def _observer(cache: Path, device: str, compiled: bool):
    import robocache

    obs = robocache.Observer.from_cache(cache, history=2, normalize="mean_std", device=device,
                                        compile=compiled)
    obs.start(0.0)
    return obs


def run(quick: bool = False, copy_gbps: float | None = None, devices: str | None = None,
        ticks: int | None = None, report=None) -> list[dict]:
    """The cases, each handed to ``report`` as it finishes (printed and saved at once, so a
    run stopped at a time limit keeps them); ``ticks``: per numeric row, instead of the
    default 10,000 (``--quick``: 500)."""
    import json

    from robocache.ops.normalize import Stats

    cfg = QUICK if quick else FULL
    if hasattr(os, "sched_getaffinity"):  # `taskset -c 0`: one intra-op thread, not one per core
        torch.set_num_threads(len(os.sched_getaffinity(0)))
    ticks = (ticks or cfg["ticks"]) + 200
    devices = (devices.split(",") if devices else
               ["cpu"] + (["cuda"] if torch.cuda.is_available() else []))
    rows: list[dict] = []
    report = report or (lambda row: None)
    with tempfile.TemporaryDirectory() as tmp:
        for case, numeric, rate in (("4 streams (500/100/333 Hz + events) -> 50 Hz, history 2",
                                     STREAMS, RATE),
                                    ("1 stream (7-D at 30 Hz) -> 30 Hz, history 2", ONE, 30.0)):
            cache = make_cache(Path(tmp) / f"numeric{len(numeric)}", numeric=numeric, rate=rate)
            log = message_log(ticks, np.random.default_rng(1), numeric, rate)
            msgs = sum(len(m) for m in log) / ticks
            stats = json.loads((cache / "stats.json").read_text())
            hand = Handwritten({k: Stats.from_dict(v) for k, v in stats.items()})
            glue = record(case, "handwritten", per_tick_us(hand, log, lambda: None, rate=rate),
                          "cpu", messages_per_tick=msgs)
            rows.append(glue)
            report(glue)
            for dev in devices:
                sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
                # on a GPU: the core eager and compiled (its first, warm-up tick compiles);
                # on the CPU the tick is the same either way (the host tick, or the core)
                variants = ((False, False), (True, False), (True, True)) if dev == "cuda" \
                    else ((False, False), (False, True))
                for compiled, many in variants:
                    samples = per_tick_us(_observer(cache, dev, compiled),
                                          batched(log) if many else log, sync, many, rate)
                    impl = "robocache" + "-compiled" * compiled + "-push_many" * many
                    row = record(case, impl, samples, dev, messages_per_tick=msgs)
                    row["p99_over_handwritten"] = row["p99_us"] / glue["p99_us"]
                    row["p50_over_handwritten"] = row["p50_us"] / glue["p50_us"]
                    rows.append(row)
                    report(row)

        cam = make_cache(Path(tmp) / "camera", cameras=True)
        for dev in devices:
            n = cfg["ticks"] + 200 if dev == "cuda" else cfg["camera_ticks_cpu"]
            sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
            obs = camera_observer(cam, dev)
            rows.append(record("camera 480x640 JPEG 30 Hz -> 224x224 float32, history 2",
                               "robocache", per_tick_us(obs, camera_log(n), sync), dev))
            report(rows[-1])
    return rows


def camera_observer(cache: Path, device: str):
    """The camera case's observer: history 2, served at 224x224, started at t = 0."""
    import robocache

    obs = robocache.Observer.from_cache(cache, history=2, keys=["observation.images.cam"],
                                        image_size=(224, 224), device=device)
    obs.start(0.0)
    return obs


def camera_log(ticks: int) -> list[list[tuple[str, float, bytes]]]:
    """Per tick, the 30 Hz camera's JPEG messages that arrive since the last one. Frames as
    a camera driver hands them: a new bytes object each (four in turn; the observer reuses a
    window's served frames only for the very same objects)."""
    from robocache.data.cameras import encode

    jpegs = [bytes(bytearray(encode(_frame(), "jpeg", 95))) for _ in range(4)]
    return [[("observation.images.cam", t / 30, jpegs[t % 4]) for t in range(
        int(np.ceil((k - 1) / RATE * 30 + LAG_S * 30)) if k else 0,
        int(np.floor(k / RATE * 30 + LAG_S * 30)) + 1)] for k in range(ticks)]


if __name__ == "__main__":
    main(run, __doc__, {"devices": (str, "comma-separated devices to measure on (default: cpu "
                                         "and cuda where present)"),
                        "ticks": (int, "ticks per numeric row (default 10,000)")})
