"""Benchmark `robocache.Pipeline`: 256 trajectories x 10 variants of (resample to 50 Hz ->
SE(3) + time warp -> normalize -> noise), 10 s episodes at ~100 Hz, 32-D — fused vs unfused,
eager vs CUDA-graph replay, against torch eager and torch.compile of the same chain, in one run.

    $ robocache bench pipeline --json benchmarks/results/pipeline.json
    $ python benchmarks/bench_pipeline.py --quick       # CPU smoke run (reference path)
    $ python benchmarks/bench_pipeline.py --sweep       # fused kernel: tunings and ablations

Minimum bytes: data and float64 timestamps read once, the [B, K, T, D] output written once.
"""

from __future__ import annotations

import argparse
import dataclasses
import math

import torch

from robocache.bench import harness as H
from robocache.kernels.pipeline import TUNING, PipelineTuning, pipeline_cuda
from robocache.ops.normalize import compute_stats
from robocache.ops.pipeline import Augment, Normalize, Pipeline, Resample

FAMILY = "pipeline"
RATE, DURATION, SRC_RATE, D, K = 50.0, 10.0, 100.0, 32, 10


def make_inputs(B: int, device, dtype=torch.float32, seed: int = 0):
    """Irregular ~100 Hz timestamps (float64 epoch seconds) over 10 s; poses in columns 0..6."""
    g = torch.Generator().manual_seed(seed)
    S = int(DURATION * SRC_RATE) + 1
    steps = (torch.rand(B, S, generator=g, dtype=torch.float64) * 0.4 + 0.8) / SRC_RATE
    times = 1.7e9 + torch.cumsum(steps, 1) * (DURATION / steps.sum(1, keepdim=True))
    data = torch.randn(B, S, D, generator=g)
    data[..., 3:7] = torch.nn.functional.normalize(data[..., 3:7], dim=-1)
    return data.to(device, dtype), times.to(device)


def make_pipeline(stats, num: int, k: int = K) -> Pipeline:
    return Pipeline([Resample(RATE, num), Normalize(stats, "mean_std"),
                     Augment(k=k, position=0, orientation=3, max_translation=0.05,
                             max_rotation=0.3, noise_std=0.02, time_warp=0.3)])


def torch_chain(pipe: Pipeline, params: dict, data, times, offset, scale, std):
    """What a user writes today: the same chain in plain PyTorch (warped targets,
    searchsorted + gather + lerp, quaternion algebra, affine, randn)."""
    B, S, Dd = data.shape
    k, T, span = pipe.augment.k, pipe.resample.num, pipe.span
    u = torch.arange(T, device=data.device, dtype=torch.float32) / (T - 1)
    m = torch.arange(1, params["warp_coeffs"].shape[-1] + 1, device=data.device) * math.pi
    phi = u + (params["warp_coeffs"][..., None, :] * torch.sin(u[:, None] * m) / m).sum(-1)
    target = (times[:, :1, None] + (phi * span).double()).reshape(B, k * T)
    hi = torch.searchsorted(times, target, right=True).clamp(1, S - 1)
    t0, t1 = times.gather(1, hi - 1), times.gather(1, hi)
    w = ((target - t0) / (t1 - t0)).clamp(0, 1).float().unsqueeze(-1)
    y0 = data.gather(1, (hi - 1).unsqueeze(-1).expand(-1, -1, Dd)).float()
    y1 = data.gather(1, hi.unsqueeze(-1).expand(-1, -1, Dd)).float()
    y = torch.lerp(y0, y1, w).view(B, k, T, Dd)
    r, t = params["rotation"][:, :, None], params["translation"][:, :, None]
    rw, rv = r[..., :1], r[..., 1:]
    p = y[..., 0:3]
    c = 2 * torch.linalg.cross(rv.expand_as(p), p, dim=-1)
    p = p + rw * c + torch.linalg.cross(rv.expand_as(c), c, dim=-1) + t
    q = y[..., 3:7]
    qw, qv = q[..., :1], q[..., 1:]
    q = torch.cat([rw * qw - (rv * qv).sum(-1, keepdim=True),
                   rw * qv + qw * rv + torch.linalg.cross(rv.expand_as(qv), qv, dim=-1)], -1)
    y = torch.cat([p, q, y[..., 7:]], -1)
    y = (y - offset) * scale + std * torch.randn_like(y)
    return y.to(data.dtype)


def _measure(out: list, name: str, impl: str, fn, **kw) -> None:
    """Append one case; a failure becomes a record with its error (the run goes on)."""
    try:
        out.append(H.case(FAMILY, name, impl, fn(), **kw))
    except Exception as err:  # noqa: BLE001 - report, don't lose the other cases
        out.append({"family": FAMILY, "name": name, "impl": impl, "error": repr(err)[:500],
                    "median_ms": float("nan"), "q25_ms": float("nan"), "q75_ms": float("nan")})


def _cases_gpu(copy_gbps):
    dev = torch.device("cuda")
    out: list[dict] = []
    data, times = make_inputs(256, dev)
    B, S, _ = data.shape
    T = int(DURATION * RATE)
    stats = compute_stats(data)
    pipe = make_pipeline(stats, T)
    params = pipe.sample(B, 1, dev)
    offset, scale, std, _ = pipe._params(dev, D)
    big = "256x10_10s_50Hz_32D"
    kw = dict(nbytes=data.numel() * 4 + times.numel() * 8 + B * K * T * D * 4,
              copy_gbps=copy_gbps, B=B, K=K, S=S, T=T, D=D, dtype="float32")

    def chain():
        return torch_chain(pipe, params, data, times, offset, scale, std)

    compiled = torch.compile(torch_chain, fullgraph=True)

    def compiled_chain():
        return compiled(pipe, params, data, times, offset, scale, std)

    for impl, fn in (("robocache fused (eager)", lambda: pipe(data, times, seed=1)),
                     ("robocache unfused ops (eager)",
                      lambda: pipe(data, times, seed=1, fused=False)),
                     ("torch eager", chain), ("torch.compile", compiled_chain)):
        _measure(out, big, impl, lambda fn=fn: H.gpu_time(fn), **kw)
    _measure(out, big, "robocache fused (graph replay)",
             lambda: H.graph_time(lambda: pipe(data, times, seed=1), calls=20), **kw)

    # Launch-bound regime: B = 8, wall time per back-to-back call on the host clock (us).
    d8, t8 = data[:8].clone(), times[:8].clone()
    p8 = make_pipeline(stats, T)
    small, kw8 = "8x10_10s_50Hz_32D", dict(unit="us", B=8, K=K, S=S, T=T, D=D)
    _measure(out, small, "robocache fused eager",
             lambda: H.host_time_us(lambda: p8(d8, t8, seed=1), calls=500), **kw8)
    _measure(out, small, "robocache unfused eager",
             lambda: H.host_time_us(lambda: p8(d8, t8, seed=1, fused=False), calls=100), **kw8)
    _measure(out, small, "torch eager", lambda: H.host_time_us(
        lambda: torch_chain(p8, p8.sample(8, 1, dev), d8, t8, offset, scale, std),
        calls=100), **kw8)
    # GPU time per call inside one graph of back-to-back calls (before p8 holds its own graphs).
    _measure(out, small, "robocache unfused graph replay (GPU time)",
             lambda: H.graph_time(lambda: p8(d8, t8, seed=1, fused=False), calls=10),
             B=8, K=K, S=S, T=T, D=D)
    _measure(out, small, "robocache fused graph replay (GPU time)",
             lambda: H.graph_time(lambda: p8(d8, t8, seed=1), calls=20), B=8, K=K, S=S, T=T,
             D=D)
    p8.capture(d8, t8)
    _measure(out, small, "robocache fused graph (copy-in + replay)",
             lambda: H.host_time_us(lambda: p8(d8, t8, seed=1), calls=500), **kw8)
    _measure(out, small, "robocache fused graph replay only (static inputs)",
             lambda: H.host_time_us(next(iter(p8._graphs.values())).graph.replay, calls=500),
             **kw8)
    return out


def _cases_cpu():
    data, times = make_inputs(4, "cpu")
    pipe = make_pipeline(compute_stats(data), 100, k=2)
    t = H.cpu_time(lambda: pipe(data, times, seed=1), repeats=5)
    return [H.case(FAMILY, "4x2_10s_50Hz_32D_T100", "robocache reference (cpu)", t,
                   B=4, K=2, T=100, D=D)]


# Fused-kernel tunings timed by --sweep: (block_t, blocks, per_thread, fan); with D = 32 the
# warps are block_t / per_thread. The first H100 sweep (block_t 16-128 x 1-16 warps x blocks
# 1-4 x fan 32/64/1024 x window count off/256 wide, commit 8a8d809) found one-warp programs
# of 16 targets fastest, without the count (since removed); this one explores around them.
SWEEP = [(16, 1, 16, 64), (8, 1, 8, 64), (16, 1, 8, 64), (32, 1, 32, 64), (32, 1, 16, 64),
         (16, 2, 16, 64), (16, 4, 16, 64), (16, 1, 16, 1024), (16, 1, 16, 32)]
# Stages switched off (FusedPlan fields) at the default tuning: what each one costs.
ABLATIONS = {"no noise": dict(noise=False), "no SE(3)": dict(pos=-1, quat=-1),
             "no time warp": dict(terms=0), "no normalize": dict(norm=False),
             "resample only": dict(pos=-1, quat=-1, terms=0, norm=False, noise=False)}


def sweep(copy_gbps: float | None = None) -> list[dict]:
    """Kernel-only GPU time of the fused kernel on the 256 x 10 case for each SWEEP tuning
    (with its max |difference| from the default tuning's output: all must be 0) and for each
    ablation of the chain."""
    dev = torch.device("cuda")
    data, times = make_inputs(256, dev)
    B, S, _ = data.shape
    T = int(DURATION * RATE)
    pipe = make_pipeline(compute_stats(data), T)
    offset, scale, std, col = pipe._params(dev, D)
    out = torch.empty(B, K, T, D, device=dev)
    flags = torch.empty(B, K, 0, dtype=torch.bool, device=dev)
    kw = dict(nbytes=data.numel() * 4 + times.numel() * 8 + out.numel() * 4,
              copy_gbps=copy_gbps, B=B, K=K, S=S, T=T, D=D, dtype="float32")

    def launch(plan, tuning):
        return pipeline_cuda(plan, data, times, None, out, flags, offset, scale, std, col, K,
                             pipe.span, 1, *pipe._scalars, tuning=tuning)

    ref = launch(pipe.plan, TUNING).clone()
    recs = []
    for bt, blocks, per_thread, fan in SWEEP:
        tu = PipelineTuning(block_t=bt, blocks=blocks, per_thread=per_thread, fan=fan)
        label = f"fused kernel bt={bt} blocks={blocks} per_thread={per_thread} fan={fan}"
        _measure(recs, "256x10_10s_50Hz_32D sweep", label,
                 lambda tu=tu: H.gpu_time(lambda: launch(pipe.plan, tu), rep_ms=50), **kw)
        recs[-1]["max_abs_diff"] = float((out - ref).abs().max())
        print(f"{label}: {recs[-1]['median_ms'] * 1e3:.1f} us, max |diff| "
              f"{recs[-1]['max_abs_diff']:.2g}", flush=True)
    for name, change in ABLATIONS.items():
        plan = dataclasses.replace(pipe.plan, **change)
        _measure(recs, "256x10_10s_50Hz_32D ablation", f"fused kernel, {name}",
                 lambda plan=plan: H.gpu_time(lambda: launch(plan, TUNING), rep_ms=50), **kw)
        print(f"{name}: {recs[-1]['median_ms'] * 1e3:.1f} us", flush=True)
    return recs


def run(quick: bool = False, copy_gbps: float | None = None) -> list[dict]:
    if quick or not H.cuda_ready():
        return _cases_cpu()
    return _cases_gpu(copy_gbps)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--json")
    a = ap.parse_args()
    res = {"meta": H.metadata(), "cases": sweep() if a.sweep else run(quick=a.quick)}
    H.print_table(res)
    if a.json:
        H.write_json(a.json, res)
