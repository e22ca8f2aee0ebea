"""Benchmark `robocache.resample` against what a user has: torch eager (searchsorted + gather +
lerp), torch.compile of it, and a numpy.interp loop on the CPU — in one run.

    $ robocache bench resample --json benchmarks/results/resample.json
    $ python benchmarks/bench_resample.py --quick       # CPU-only smoke run

Minimum bytes: data, timestamps and targets read once, the output written once.
"""

from __future__ import annotations

import numpy as np
import torch

import robocache
from robocache.bench import harness as H
from robocache.bench.launch import bare_launch
from robocache.bench.standalone import main

FAMILY = "resample"
# (B, S, T, D, dtype): the three targets plus their float32 twins.
CASES = [
    (256, 100, 50, 32, torch.bfloat16),
    (4096, 500, 250, 64, torch.bfloat16),
    (1024, 1000, 2000, 32, torch.bfloat16),
    (256, 100, 50, 32, torch.float32),
    (4096, 500, 250, 64, torch.float32),
    (1024, 1000, 2000, 32, torch.float32),
]
QUICK_CASES = [(64, 100, 50, 32, torch.float32)]


def torch_resample(data, times, target):
    """What users write today: searchsorted + gather + lerp (clamped like numpy.interp)."""
    S, D = data.shape[1], data.shape[2]
    hi = torch.searchsorted(times, target, right=True).clamp(1, S - 1)
    lo = hi - 1
    t0, t1 = times.gather(1, lo), times.gather(1, hi)
    w = ((target - t0) / (t1 - t0)).clamp(0, 1).to(data.dtype).unsqueeze(-1)
    y0 = data.gather(1, lo.unsqueeze(-1).expand(-1, -1, D))
    y1 = data.gather(1, hi.unsqueeze(-1).expand(-1, -1, D))
    return torch.lerp(y0, y1, w)


def numpy_loop(data, times, target):
    return [[np.interp(target[b], times[b], data[b, :, d]) for d in range(data.shape[2])]
            for b in range(data.shape[0])]


def make_inputs(B, S, T, D, dtype, time_dtype, device, seed=0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    steps = torch.rand(B, S, generator=g, dtype=torch.float64) * 1.6 + 0.2
    times = torch.cumsum(steps, 1) / S + 1.7e9  # irregular, epoch seconds
    span0, span1 = times[:, :1], times[:, -1:]
    target = span0 + (span1 - span0) * torch.linspace(0, 1, T, dtype=torch.float64)
    if time_dtype == torch.float32:  # what float32 users have: per-row relative seconds
        target, times = target - times[:, :1], times - times[:, :1]
    data = torch.randn(B, S, D, generator=g).to(dtype)
    return data.to(device), times.to(time_dtype).to(device), target.to(time_dtype).to(device)


def min_bytes(B, S, T, D, dtype, time_dtype):
    es, ts = torch.empty((), dtype=dtype).element_size(), torch.empty((), dtype=time_dtype
                                                                        ).element_size()
    return B * S * D * es + B * S * ts + B * T * ts + B * T * D * es


def _name(B, S, T, D, dtype, tdt):
    return (f"B{B}-S{S}-T{T}-D{D}-{str(dtype).removeprefix('torch.')}"
            f"-t{str(tdt).removeprefix('torch.float')}")


def _rotated(fn, make, nbytes):
    sets = [make(seed) for seed in range(H.rotation_count(nbytes))]
    return H.rotating([(lambda a=a: fn(*a)) for a in sets])


def run_cuda(case, copy_gbps, time_dtype=torch.float32, alternatives=True):
    B, S, T, D, dtype = case
    name = _name(B, S, T, D, dtype, time_dtype)
    nbytes = min_bytes(B, S, T, D, dtype, time_dtype)
    make = lambda seed: make_inputs(B, S, T, D, dtype, time_dtype, "cuda", seed)  # noqa: E731
    data, times, target = make(0)
    ref = torch_resample(data.double(), times, target)
    err = ((robocache.resample(data, times, target).double() - ref).norm() / ref.norm()).item()
    extra = {"B": B, "S": S, "T": T, "D": D, "dtype": str(dtype), "time_dtype": str(time_dtype)}
    rec = lambda impl, t, **kw: H.case(FAMILY, name, impl, t, nbytes=nbytes,  # noqa: E731
                                       copy_gbps=copy_gbps, **extra, **kw)
    t = H.gpu_time(_rotated(H.with_extra_read(robocache.resample, nbytes), make, nbytes))
    out = [rec("robocache", t, rel_err=err, traj_per_s=B / (t.median_ms * 1e-3))]
    if not alternatives:
        return out
    out.append(rec("torch_eager", H.gpu_time(_rotated(torch_resample, make, nbytes))))
    compiled = torch.compile(torch_resample)
    out.append(rec("torch_compile", H.gpu_time(_rotated(compiled, make, nbytes))))
    if B * S * D <= 256 * 100 * 32:  # the numpy loop takes seconds beyond this
        host = [a.double().cpu().numpy() for a in (data, times, target)]
        out.append(rec("numpy_interp_loop_cpu", H.cpu_time(lambda: numpy_loop(*host), repeats=5)))
        cpu_args = [a.cpu() for a in (data, times, target)]
        out.append(rec("robocache_cpu", H.cpu_time(lambda: robocache.resample(*cpu_args))))
    return out


def launch_extras(case):
    """Graph-replay GPU time per call, and host time per eager call vs a bare Triton launch."""

    B, S, T, D, dtype = case
    name = _name(B, S, T, D, dtype, torch.float32)
    data, times, target = make_inputs(B, S, T, D, dtype, torch.float32, "cuda")
    out = torch.empty(B, T, D, dtype=dtype, device="cuda")
    call = lambda: robocache.resample(data, times, target, out=out)  # noqa: E731
    bare = bare_launch(call)
    op = lambda: torch.ops.robocache.resample(data, times, target, None, "linear",  # noqa: E731
                                              "clamp", False)
    x = torch.randn(1024, device="cuda")
    rec = lambda impl, t, **kw: H.case(FAMILY, name, impl, t, unit="us", **kw)  # noqa: E731
    g = H.graph_time(call, calls=100)
    host = {k: H.host_time_us(f) for k, f in
            (("robocache_eager", call), ("bare_triton_launch", bare),
             ("robocache_custom_op", op), ("torch_x_mul_2", lambda: x * 2))}
    ratio = host["robocache_eager"].median_ms / host["bare_triton_launch"].median_ms
    g_us = H.summarize([v * 1e3 for v in g.samples_ms])
    res = [rec("robocache_graph_replay_gpu", g_us, note="GPU us per call, 100 calls/graph")]
    res += [rec(f"host_{k}", t, note="host us per call") for k, t in host.items()]
    res[1]["ratio_vs_bare_launch"] = ratio
    return res


def run_cpu(case):
    """CPU smoke run: the reference path against torch eager and a numpy.interp loop."""
    B, S, T, D, dtype = case
    data, times, target = make_inputs(B, S, T, D, dtype, torch.float64, "cpu")
    nb = min_bytes(B, S, T, D, dtype, torch.float64)
    name = _name(B, S, T, D, dtype, torch.float64)
    host = [a.double().numpy() for a in (data, times, target)]
    fns = (("robocache_cpu", lambda: robocache.resample(data, times, target)),
           ("torch_eager_cpu", lambda: torch_resample(data, times, target)),
           ("numpy_interp_loop_cpu", lambda: numpy_loop(*host)))
    return [H.case(FAMILY, name, impl, H.cpu_time(fn, repeats=5), nbytes=nb) for impl, fn in fns]


def run(quick: bool = False, copy_gbps: float | None = None) -> list[dict]:
    if quick or not torch.cuda.is_available():
        return [r for case in QUICK_CASES for r in run_cpu(case)]
    res = []
    for case in CASES:
        res += run_cuda(case, copy_gbps)
        if case[1] >= 500:  # float64 epoch timestamps: cost over float32 at the large shapes
            res += run_cuda(case, copy_gbps, torch.float64, alternatives=False)
    res += launch_extras(CASES[0])
    return res


if __name__ == "__main__":
    main(run, __doc__)
