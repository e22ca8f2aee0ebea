"""Synthetic benchmark results (no GPU needed) for the gate and report tests."""

from __future__ import annotations

import numpy as np
import pytest

from robocache.bench import harness


def timing(median_ms: float, noise: float, rng: np.random.Generator, n: int = 60):
    """`n` samples around `median_ms` with relative spread `noise` (lognormal)."""
    return harness.summarize(median_ms * np.exp(rng.normal(0.0, noise, n)))


def results(cases, *, device="NVIDIA H100 80GB HBM3", driver="580.1", copy=3000.0):
    meta = {"date": "2026-11-22T05:00:00+00:00", "device": device, "sm_count": 132,
            "gpu_count": 1, "driver": driver, "cuda_runtime": "13.0", "torch": "2.11.0",
            "triton": "3.6.0", "commit": "abc", "d2d_copy_GBps": copy,
            "ceilings": {
                "d2d_copy_GBps": {"value": copy, "unit": "GB/s", "what": "copy",
                                  "peak": 3350, "pct_peak": 100 * copy / 3350},
                "gemm_bf16_TFLOPs": {"value": 700.0, "unit": "TFLOP/s", "what": "bf16"},
                "gemm_fp32_TFLOPs": {"value": 50.0, "unit": "TFLOP/s", "what": "fp32"}}}
    return {"meta": meta, "cases": cases}


@pytest.fixture
def rng():
    return np.random.default_rng(0)


@pytest.fixture
def report_results(rng):
    """Two families: batch sweeps with alternatives, a FLOP-declaring op, a host-time case."""
    cases = []
    for B in (64, 256, 1024, 4096):
        nbytes = B * 500 * 64 * 2 * 2
        for impl, scale in (("robocache", 1.0), ("torch_eager", 4.0), ("torch_compile", 1.3)):
            t = timing(nbytes / 2.5e12 * 1e3 * scale + 0.004, 0.02, rng)
            cases.append(harness.case("resample", f"B{B}-S500-bf16", impl, t, nbytes=nbytes,
                                      copy_gbps=3000.0, B=B, S=500, dtype="torch.bfloat16"))
    for n in (256, 4096):
        t = timing(0.01 * n / 256, 0.02, rng)
        cases.append(harness.case("kinematics", f"fk-N{n}", "robocache", t, nbytes=n * 64,
                                  flops=n * 4000, copy_gbps=3000.0, batch=n,
                                  dtype="torch.float32"))
        cases.append(harness.case("kinematics", f"fk-N{n}", "pytorch_kinematics",
                                  timing(0.5, 0.05, rng), nbytes=n * 64, flops=n * 4000,
                                  batch=n, dtype="torch.float32"))
    cases.append(harness.case("resample", "launch", "host_robocache_eager",
                              timing(9.0, 0.05, rng), unit="us"))
    doc = results(cases)
    for rec in doc["cases"]:
        harness.roofline(rec, {"d2d_copy_GBps": 3000.0, "gemm_bf16_TFLOPs": 700.0,
                               "gemm_fp32_TFLOPs": 50.0})
    return doc


@pytest.fixture
def make_timing():
    return timing


@pytest.fixture
def make_results():
    return results
