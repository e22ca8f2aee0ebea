"""Benchmark `robocache.align` on a multi-rate robot: proprioception 32-D @ 125 Hz (pchip),
tactile 64-D @ 333 Hz (linear), a 30 Hz camera (frame_index), language embeddings 512-D bf16
at irregular ~2 Hz (previous), all to 50 Hz, float64 epoch timestamps.

    $ robocache bench align --json benchmarks/results/align.json

Cases: (a) a training batch of B = 256 one-second windows; (b) offline, B = 256 whole 10 s
episodes. Alternatives in the same run: one torch-eager resample per stream (the pure-PyTorch
reference, on the GPU), torch.compile of that per-stream loop, and a CPU SciPy loop.
Minimum bytes: every stream's samples and timestamps read once, targets read once, outputs
(values, masks, ages/offsets) written once.
"""

from __future__ import annotations

import numpy as np
import scipy.interpolate as si
import torch

import robocache
from robocache import Stream
from robocache.bench import harness as H
from robocache.bench.launch import bare_launch
from robocache.bench.standalone import main
from robocache.reference.interp import interp_ref

FAMILY = "align"
EPOCH = 1.7e9
RATE = 50.0


def make_streams(B: int, seconds: float, device: str, seed: int = 0):
    g = np.random.default_rng(seed)

    def clock(rate, n):
        jitter = g.uniform(-0.1, 0.1, size=(B, n)) / rate  # irregular, still increasing
        return torch.tensor(EPOCH + np.arange(n) / rate + jitter, device=device)

    def rand(*shape, dtype=torch.float32):
        return torch.tensor(g.standard_normal(shape), dtype=dtype, device=device)

    S = {"proprio": int(125 * seconds), "tactile": int(333 * seconds),
         "camera": int(30 * seconds), "language": int(2 * seconds) + 1}
    lang_t = np.sort(g.uniform(0, seconds, size=(B, S["language"])), 1)
    lang_t[:, 0] = 0.0
    streams = {
        "proprio": Stream(rand(B, S["proprio"], 32), clock(125, S["proprio"]), method="pchip"),
        "tactile": Stream(rand(B, S["tactile"], 64), clock(333, S["tactile"])),
        "camera": Stream(None, clock(30, S["camera"]), method="frame_index", tolerance_s=0.02),
        "language": Stream(rand(B, S["language"], 512, dtype=torch.bfloat16),
                           torch.tensor(EPOCH + lang_t, device=device), method="previous"),
    }
    target = torch.tensor(EPOCH + np.arange(int(RATE * seconds)) / RATE, device=device)
    return streams, target


def min_bytes(streams, target, B) -> int:
    T = target.shape[-1]
    n = target.numel() * target.element_size()
    for s in streams.values():
        n += s.times.numel() * s.times.element_size()
        if s.data is None:
            n += B * T * (8 + 4)  # frame index + offset
        else:
            n += s.data.numel() * s.data.element_size() + B * T * s.data.shape[-1] * \
                s.data.element_size()
        n += B * T  # pad mask
        if s.method == "previous":
            n += B * T * 4  # age
    return n


def torch_loop(streams, target):
    """One eager PyTorch resample per stream (the pure-PyTorch implementation)."""
    B = next(iter(streams.values())).times.shape[0]
    x = target.expand(B, -1)
    return [interp_ref(s.data, s.times, x, None, s.method, "clamp", s.tolerance_s)
            for s in streams.values()]


def scipy_loop(host):
    """What a CPU data pipeline does per episode with SciPy/NumPy."""
    streams, x = host
    out = []
    for b in range(streams["proprio"][0].shape[0]):
        xb = x - EPOCH
        y, t = streams["proprio"]
        out.append(si.PchipInterpolator(t[b] - EPOCH, y[b])(np.clip(xb, t[b, 0] - EPOCH,
                                                                   t[b, -1] - EPOCH)))
        y, t = streams["tactile"]
        out.append(np.stack([np.interp(xb, t[b] - EPOCH, y[b, :, d])
                             for d in range(y.shape[2])], 1))
        _, t = streams["camera"]
        out.append(np.abs((t[b] - EPOCH)[None] - xb[:, None]).argmin(1))
        y, t = streams["language"]
        out.append(y[b][np.clip(np.searchsorted(t[b] - EPOCH, xb, "right") - 1, 0, None)])
    return out


def run_case(label, B, seconds, copy_gbps, extras):
    streams, target = make_streams(B, seconds, "cuda")
    nbytes = min_bytes(streams, target, B)
    name = f"{label}-B{B}-{seconds:g}s-4streams"
    rec = lambda impl, t, **kw: H.case(FAMILY, name, impl, t, nbytes=nbytes,  # noqa: E731
                                       copy_gbps=copy_gbps, B=B, seconds=seconds, **kw)
    call = lambda: robocache.align(streams, target)  # noqa: E731
    ref = torch_loop(streams, target)
    got = call()
    err = max(float((got.values[k].double() - r[0].double()).norm() /
                     r[0].double().norm().clamp(min=1e-30))
              for k, r in zip(streams, ref, strict=True) if streams[k].data is not None)
    out = [rec("robocache", H.gpu_time(call), rel_err=err)]
    out.append(rec("torch_eager_per_stream", H.gpu_time(lambda: torch_loop(streams, target))))
    compiled = torch.compile(torch_loop)
    out.append(rec("torch_compile_per_stream", H.gpu_time(lambda: compiled(streams, target))))
    if extras:

        g = H.graph_time(call, calls=20)
        out.append(rec("robocache_graph_replay", g, note="GPU time per call, 20 calls/graph"))
        host = H.host_time_us(call, calls=500)
        bare = H.host_time_us(bare_launch(call), calls=500)
        us = lambda t, **kw: H.case(FAMILY, name, "host_" + kw.pop("impl"), t,  # noqa: E731
                                    unit="us", **kw)
        out.append(us(host, impl="robocache_eager", note="host us per call",
                      ratio_vs_bare_launch=host.median_ms / bare.median_ms))
        out.append(us(bare, impl="bare_triton_launch", note="host us per call"))
        host_streams = {k: (None if s.data is None else s.data.float().cpu().numpy(),
                            s.times.cpu().numpy()) for k, s in streams.items()}
        args = (host_streams, target.cpu().numpy())
        out.append(rec("scipy_loop_cpu", H.cpu_time(lambda: scipy_loop(args), repeats=3)))
    return out


def run(quick: bool = False, copy_gbps: float | None = None) -> list[dict]:
    if quick or not torch.cuda.is_available():
        streams, target = make_streams(8, 1.0, "cpu")
        nb = min_bytes(streams, target, 8)
        return [H.case(FAMILY, "quick-B8-1s-4streams", "robocache_cpu",
                       H.cpu_time(lambda: robocache.align(streams, target), repeats=5),
                       nbytes=nb)]
    return (run_case("batch", 256, 1.0, copy_gbps, extras=True)
            + run_case("offline", 256, 10.0, copy_gbps, extras=False))


if __name__ == "__main__":
    main(run, __doc__)
